"""`builtin:general`: prompts of ten kinds beyond code, for regeneration (prepare.regenerate).

Drafters serve chat assistants, RAG, summarization, math tutoring and translation, not only code,
and a drafter learns the target's behaviour only on the kinds of prompt it is trained on. Every row
holds user turns only (each assistant turn holds `regenerate.PENDING`: the target writes it), and
a `category`: writing, roleplay, reasoning, math, extraction, summarization, knowledge, rag,
translation or code. A quarter of the rows carry a follow-up turn (shorten, rewrite, explain,
continue, translate) that the target answers after its own first answer.

Prompts are templates filled with seeded fillers, written for this project: no benchmark text
(MT-Bench, Spec-Bench, GSM8K, Alpaca, ShareGPT) and no HumanEval task. Math problems draw their
numbers from the seed; puzzles, records, orders and events are generated; the long texts that
summarization, extraction and RAG prompts hand over are docstrings of standard-library modules
(parsed with `ast`, nothing imported), which every machine has. The held-out evaluation suite
(data/suite.py) uses other templates, fillers, modules and seed. The same version and Python
minor version always write the same file: $DRAFTSMITH_CACHE/corpus/general-py<version>-v1.jsonl.
"""

from __future__ import annotations

import ast
import functools
import random
import re
import sysconfig
from pathlib import Path

from draftsmith.data.regenerate import PENDING

VERSION = "v1"
SEED = 0
MULTI_TURN_SHARE = 0.25
CATEGORIES = ("writing", "roleplay", "reasoning", "math", "extraction", "summarization", "knowledge", "rag",
              "translation", "code")
# Modules whose docstrings are the long texts of the training prompts (the suite reads others).
MODULES = ("argparse", "configparser", "statistics", "socketserver", "shelve", "fileinput", "timeit", "heapq", "copy",
           "plistlib", "uuid", "sched", "random", "typing", "inspect", "difflib", "doctest", "cmd", "_threading_local",
           "pickle", "string", "tempfile", "subprocess", "smtplib", "ftplib", "optparse", "pprint", "codeop",
           "rlcompleter", "pyclbr", "tokenize", "mimetypes", "ast", "os", "io", "site", "socket", "_pydecimal",
           "__future__", "fractions", "dataclasses", "functools", "collections/__init__", "json/__init__",
           "logging/__init__", "unittest/case", "email/message", "http/client", "urllib/parse", "asyncio/locks")


def general_conversations(count: int = 4096, seed: int = SEED):
    """Up to `count` rows with distinct first turns, categories in turn, as conversations awaiting the target."""
    return prompt_rows(TEMPLATES, FILLERS, FOLLOW_UPS, MODULES, count, seed, "general")


def prompt_rows(templates: dict, fillers: dict, follow_ups: dict, modules, count: int, seed: int, prefix: str,
                multi_turn_share: float = MULTI_TURN_SHARE):
    """Rows {"id", "category", "source", "messages"} from `templates[category]`, the categories in turn, an equal
    share each; shared by the training corpus and the suite, which pass their own templates, fillers, modules and seed."""
    rng = random.Random(seed)
    passages, snippets = stdlib_texts(modules)
    categories = [c for c in CATEGORIES if c in templates]
    quota = {c: -(-count // len(categories)) for c in categories}
    seen: set[str] = set()
    attempts = 0
    while len(seen) < count and attempts < count * 20:
        category = categories[attempts % len(categories)]
        attempts += 1
        if not quota[category]:
            continue
        index = rng.randrange(len(templates[category]))
        values = Fields(rng, fillers, passages, snippets)
        prompt = templates[category][index].format_map(values)
        if prompt in seen:
            continue
        seen.add(prompt)
        quota[category] -= 1
        turns = [prompt]
        if rng.random() < multi_turn_share:
            turns.append(rng.choice(follow_ups[category] + follow_ups["any"]).format_map(values))
        yield {"id": f"{prefix}-{len(seen) - 1}", "category": category, "source": f"{prefix}/{category}/{index}",
               "messages": awaiting_target(turns)}


def awaiting_target(turns: list[str]) -> list[dict[str, str]]:
    """User turns, each followed by an assistant turn that the target writes (prepare.regenerate)."""
    return [message for turn in turns
            for message in ({"role": "user", "content": turn}, {"role": "assistant", "content": PENDING})]


# --------------------------------------------------------------------------- fillers
class Fields(dict):
    """The values of a template's fields, drawn when the template first names them: a choice from a filler list,
    or a group of generated values (numbers, records, puzzles, texts). Drawing only what is named keeps it fast."""

    def __init__(self, rng: random.Random, fillers: dict, passages, snippets):
        super().__init__()
        self.rng, self.fillers, self.passages, self.snippets = rng, fillers, passages, snippets
        self.generated = False

    def __missing__(self, key: str):
        if key in self.fillers:
            self[key] = self.rng.choice(self.fillers[key])
        elif key == "Subject":
            self[key] = self["subject"][:1].upper() + self["subject"][1:]
        elif key == "sentences":
            self[key] = self.rng.choice(("two", "three", "four", "five"))
        elif key in ("function", "snippet"):
            self["function"], self["snippet"] = self.rng.choice(self.snippets)
        elif key in ("title", "passage", "documents"):
            self["title"], self["passage"] = self.rng.choice(self.passages)
            self["documents"] = _documents(self.rng, self.passages, self["title"], self["passage"])
        elif not self.generated:
            self.generated = True
            for group in (_numbers, _records, _puzzles):
                self.update(group(self.rng, self.fillers))
        if key not in self:
            raise KeyError(f"no filler or generated value named {key!r}")
        return self[key]


def _numbers(rng: random.Random, fillers: dict) -> dict:
    """Seeded numbers for math problems, drawn so that every problem has a sensible answer."""
    count, price = rng.randint(3, 14), rng.choice((0.75, 1.25, 2.5, 3.2, 4.8, 6, 7.5, 12))
    hours, speed = rng.randint(2, 6), rng.randint(12, 90)
    pump_a, pump_b = rng.sample(range(2, 13), 2)
    low = rng.randint(10, 80)
    scores = [rng.randint(55, 98) for _ in range(rng.randint(3, 6))]
    return {"a": rng.randint(2, 40), "b": rng.randint(2, 40), "c": rng.randint(41, 99), "d": rng.randint(1, 9),
            "count": count, "price": f"{price:.2f}", "bill": (int(count * price) // 20 + 1) * 20,
            "hours": hours, "speed": speed, "speed2": speed + rng.choice((-8, -5, 5, 10)), "minutes": rng.randint(15, 95),
            "percent": rng.choice((5, 10, 12, 15, 20, 25, 30, 35, 40)), "tax": rng.choice((5, 7, 8, 10, 19, 21)),
            "pump_a": pump_a, "pump_b": pump_b, "ratio1": rng.randint(1, 5), "ratio2": rng.randint(2, 7),
            "grams": rng.choice((150, 200, 250, 300, 450, 600, 750)), "length_m": rng.randint(8, 40),
            "width_m": rng.randint(4, 20), "path_m": rng.choice((0.5, 1, 1.5, 2)), "principal": rng.randint(5, 80) * 100,
            "rate": rng.choice((1.5, 2, 2.5, 3, 4, 5, 6)), "years": rng.randint(2, 15), "people": rng.randint(3, 9),
            "total": rng.randint(40, 400), "low": low, "high": low + rng.randint(30, 200), "k": rng.randint(3, 13),
            "red": rng.randint(2, 9), "green": rng.randint(2, 9), "blue": rng.randint(1, 8),
            "scores": ", ".join(map(str, scores)), "goal": min(99, round(sum(scores) / len(scores)) + rng.randint(2, 6)),
            "clock": f"{rng.randint(6, 20)}:{rng.choice(('00', '15', '20', '30', '45', '50'))}",
            "numerator": rng.randint(1, 4), "denominator": rng.randint(5, 9), "liters": rng.randint(20, 900)}


def _records(rng: random.Random, fillers: dict) -> dict:
    """Generated prose about people, orders and an event, for extraction, summarization and RAG prompts."""
    people = rng.sample(fillers["first_name"], rng.randint(3, 5))
    notes = [f"{name} {rng.choice(fillers['surname'])}, {rng.choice(fillers['job'])} from {rng.choice(fillers['city'])}, "
             f"{rng.choice(fillers['record_verb'])} {rng.choice(fillers['project'])}" for name in people]
    orders = [f"{rng.randint(1, 12)} x {item} at {rng.randint(1, 90)}.{rng.choice(('00', '50', '99'))} each"
              for item in rng.sample(fillers["item"], rng.randint(3, 5))]
    day = f"{rng.choice(fillers['month'])} {rng.randint(1, 28)}"
    event = (f"The {rng.choice(fillers['project']).removeprefix('the ')} group meets on {day} at {rng.randint(1, 11)} "
             f"{rng.choice(('am', 'pm'))} in {rng.choice(fillers['place'])}, {rng.choice(fillers['city'])}. "
             f"{people[0]} will host; bring {rng.choice(fillers['item'])}.")
    companies = [f"{rng.choice(fillers['company'])} {suffix} was founded in {rng.randint(1950, 2022)} in "
                 f"{rng.choice(fillers['city'])}, employs {rng.randint(4, 5000)} people and makes "
                 f"{rng.choice(fillers['item'])}s."
                 for suffix in rng.sample(("Ltd", "and Sons", "Works", "Labs", "Co-op", "Group", "Studio"), 3)]
    return {"people_notes": "; ".join(notes) + ".", "orders": "; ".join(orders) + ".", "event": event,
            "companies": " ".join(companies), "person": people[0], "company_name": companies[0].split(" was ")[0]}


def _puzzles(rng: random.Random, fillers: dict) -> dict:
    """An ordering puzzle (neighbour comparisons, shuffled), a number sequence and a calendar shift."""
    names = rng.sample(fillers["first_name"], rng.randint(3, 5))
    adjective, superlative = rng.choice((("taller", "tallest"), ("older", "oldest"), ("faster", "fastest"),
                                         ("heavier", "heaviest"), ("richer", "richest")))
    facts = [f"{a} is {adjective} than {b}." for a, b in zip(names, names[1:])]
    rng.shuffle(facts)
    start, step = rng.randint(1, 9), rng.randint(2, 7)
    rule = rng.choice(("add", "double", "square", "alternate", "sum"))
    if rule == "add":
        terms = [start + step * i for i in range(5)]
    elif rule == "double":
        terms = [start * 2 ** i + (step if i % 2 else 0) for i in range(5)]
    elif rule == "square":
        terms = [(i + start) ** 2 - step for i in range(5)]
    elif rule == "alternate":
        terms = [start + (step if i % 2 else -1) * i for i in range(6)]
    else:
        terms = [start, step]
        while len(terms) < 6:
            terms.append(terms[-1] + terms[-2])
    word = rng.choice(fillers["long_word"])
    return {"facts": " ".join(facts), "superlative": superlative, "sequence": ", ".join(map(str, terms)),
            "weekday": rng.choice(("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")),
            "days": rng.randint(3, 400), "word": word, "letter": rng.choice(sorted(set(word))),
            "word_list": ", ".join(rng.sample(fillers["long_word"], 5))}


def _documents(rng: random.Random, passages, title: str, passage: str) -> str:
    """Two to four numbered passages, one of them `passage`, for RAG prompts."""
    chosen = [(title, passage)] + rng.sample(passages, rng.randint(1, 3))
    rng.shuffle(chosen)
    return "\n\n".join(f"[{i}] ({name}) {text}" for i, (name, text) in enumerate(chosen, start=1))


# --------------------------------------------------------------------------- standard-library text
@functools.lru_cache(maxsize=2)
def stdlib_texts(modules, low: int = 300, high: int = 1400) -> tuple[list, list]:
    """From the standard-library sources of `modules` (parsed, not imported; modules a Python lacks are skipped):
    (title, text) passages of 300-1400 characters cut from module, class and function docstrings at paragraph
    ends, and (name, source) of the public top-level functions of 4-25 lines."""
    root = Path(sysconfig.get_paths()["stdlib"])
    passages, snippets = [], []
    for module in modules:
        file = root / f"{module}.py"
        if not file.is_file():
            continue
        name = module.removesuffix("/__init__").replace("/", ".")
        source = file.read_text(encoding="utf-8")
        tree = ast.parse(source)
        classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
        nodes = [tree] + [n for n in tree.body + [m for c in classes for m in c.body]
                          if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
        for node in nodes:
            docstring = ast.get_docstring(node) or ""
            text = ""
            for paragraph in re.split(r"\n\s*\n", docstring if len(docstring) >= low else ""):
                if text and len(text) + len(paragraph) > high:
                    passages.append((name if node is tree else f"{name}.{node.name}", text))
                    text = ""
                text = f"{text}\n\n{paragraph}".strip() if len(paragraph) <= high else text
            if len(text) >= low:
                passages.append((name if node is tree else f"{name}.{node.name}", text))
        lines = source.splitlines()
        snippets += [(f"{name}.{node.name}", "\n".join(lines[node.lineno - 1:node.end_lineno])) for node in tree.body
                     if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
                     and 4 <= node.end_lineno - node.lineno + 1 <= 25]
    return passages, snippets


# --------------------------------------------------------------------------- templates and fillers (training only)
TEMPLATES = {
    "writing": (
        "Write an email to {recipient} {email_purpose}. Keep it {tone}.",
        "Draft a {tone} email to {recipient} {email_purpose}.",
        "Write a {length} story about {character} who {story_event}, set in {setting}.",
        "Write a {length} blog post about {topic} for {audience}.",
        "Write a social media post announcing {announcement}. Make it {tone}.",
        "Write a poem about {topic} in the form of {poem_form}.",
        "Write a product description for {product}, aimed at {audience}.",
        "Write a {length} speech for {occasion}.",
        "Write a cover letter for a job as {job} at {company_kind}.",
        "Write a letter of complaint to {recipient} about {complaint}. Keep it {tone}.",
        "Write the opening paragraph of a novel set in {setting}, in which {character} {story_event}.",
        "Write a {length} newsletter item for {audience} about {announcement}.",
    ),
    "roleplay": (
        "You are {persona}. {scene} Stay in character and tell me what happens next.",
        "Pretend to be {persona} and greet a visitor who {visitor}.",
        "Write a dialogue between {persona} and {persona2} about {topic}.",
        "Let's play a game: you are {persona} and I am {user_role}. {scene} What do you say to me first?",
        "Act as {coach} and help me prepare for {preparation}. Ask me your first question.",
        "Write a scene in which {persona} tries to convince {persona2} to {persuade}.",
        "Imagine you are {persona}. Describe a typical day in your life.",
        "Speaking as {persona}, give me advice about {advice_topic}.",
        "You are {coach}. I have just told you that I {visitor}. Respond in character.",
    ),
    "reasoning": (
        "{facts} Who is the {superlative}? Explain your reasoning step by step.",
        "What is the next number in the sequence {sequence}? Work out the rule step by step.",
        "If today is {weekday}, what day of the week will it be in {days} days? Think it through step by step.",
        "How many times does the letter '{letter}' appear in the word '{word}'? Go through it letter by letter.",
        "Sort these words alphabetically and explain how you decided each position: {word_list}.",
        "All {class_a} are {class_b}, and some {class_b} are {class_c}. Does it follow that some {class_a} are "
        "{class_c}? Explain carefully.",
        "{facts} Put everyone in order from the {superlative} down, and show how the order follows from the facts.",
        "I have {count} boxes and {people} labels, and every label must go on a different box. In how many ways can I "
        "do it? Reason step by step.",
        "A {puzzle_item} costs {a} coins more than a {puzzle_item2}, and together they cost {c} coins. What does each "
        "cost? Check your answer at the end.",
        "Is this argument valid? \"{argument}\" Explain which step, if any, fails.",
    ),
    "math": (
        "{person} buys {count} {item}s at ${price} each and pays with a ${bill} bill. How much change does {person} "
        "get? {show_work}",
        "A cyclist rides at {speed} km/h for {hours} hours and then at {speed2} km/h for {minutes} minutes. How far "
        "does she ride in total? {show_work}",
        "A jacket costs ${c}. It is discounted by {percent}% and then a {tax}% sales tax is added. What is the final "
        "price? {show_work}",
        "One pump fills a tank in {pump_a} hours and another fills it in {pump_b} hours. How long do they take "
        "working together? {show_work}",
        "A recipe uses flour and sugar in the ratio {ratio1}:{ratio2}. With {grams} grams of flour, how much sugar "
        "is needed? {show_work}",
        "A rectangular garden is {length_m} m long and {width_m} m wide, with a path {path_m} m wide around it. What "
        "is the area of the path? {show_work}",
        "You deposit ${principal} at {rate}% interest, compounded yearly. How much is in the account after {years} "
        "years? {show_work}",
        "{people} friends share a restaurant bill of ${total} and add a {percent}% tip. How much does each pay? "
        "{show_work}",
        "Solve for x: {a}x + {b} = {d}x + {c}. {show_work}",
        "What is the sum of all multiples of {k} between {low} and {high}? {show_work}",
        "A bag holds {red} red, {green} green and {blue} blue marbles. Two are drawn without putting the first back. "
        "What is the probability that both are red? {show_work}",
        "A student scored {scores} on her tests so far. What must she score on the next test to bring her average to "
        "{goal}? {show_work}",
        "A train leaves at {clock} and the trip takes {minutes} minutes longer than {hours} hours. When does it "
        "arrive? {show_work}",
        "{person} ate {numerator}/{denominator} of a cake and gave a third of the rest away. What fraction of the cake "
        "is left? {show_work}",
        "A tank holds {liters} liters and drains at {d} liters per minute. How long until it is {percent}% full? "
        "{show_work}",
    ),
    "extraction": (
        "Here are notes from a team meeting: {people_notes} Extract every person as a JSON list of objects with "
        "the keys name, job, city and project.",
        "Turn these orders into a markdown table with the columns item, quantity, unit price and line total: {orders}",
        "Read this announcement and return JSON with the keys date, time, place, city, host and what_to_bring: {event}",
        "From the following text, list every Python name (modules, classes, functions, parameters) it mentions as a "
        "JSON array of strings:\n\n{passage}",
        "Pick out the key terms of this passage and give a one-line definition of each, as a two-column table:"
        "\n\n{passage}",
        "Extract the companies from this text as CSV with the header name,founded,city,employees,product: {companies}",
        "Here is a list of orders: {orders} Return a JSON object mapping each item to its quantity, and add a key "
        "\"total\" with the cost of the whole list.",
        "Read the notes below and return YAML with one entry per person, giving their surname and city only."
        "\n\nNotes: {people_notes}",
    ),
    "summarization": (
        "Summarize the following text in {sentences} sentences:\n\n{passage}",
        "Give a short TL;DR of this documentation for {audience}:\n\n{passage}",
        "Write a bullet-point summary of the main points of this text:\n\n{passage}",
        "Here is part of the documentation of `{title}`. Explain in plain words what it is for:\n\n{passage}",
        "Summarize these meeting notes in {sentences} sentences: {people_notes} {event}",
        "Condense this text into a single paragraph that keeps every technical detail:\n\n{passage}",
        "Write a headline and a one-sentence summary for this text:\n\n{passage}",
        "Summarize what these company descriptions have in common and how they differ: {companies}",
    ),
    "knowledge": (
        "Explain {concept} in simple terms.",
        "Explain {concept} in {sentences} sentences, as if to {audience}.",
        "What is the difference between {pair}?",
        "What is the difference between {pair}? Keep the answer useful for {audience}.",
        "How does {mechanism} work? Explain it for {audience}.",
        "Give a brief history of {history} in {sentences} paragraphs.",
        "Write a short quiz of {sentences} questions, with answers, about {concept}.",
        "What are the advantages and disadvantages of {tradeoff} for {audience}?",
        "How does {mechanism} work?",
        "Give a brief history of {history}.",
        "What are the advantages and disadvantages of {tradeoff}?",
        "Why {why}?",
        "Explain {concept} to {audience}.",
        "What should a beginner know about {concept}?",
        "Describe how {mechanism} works, step by step.",
        "What are common misconceptions about {concept}?",
    ),
    "rag": (
        "Answer using only the documents below, and cite the document number. What does `{title}` do?\n\n{documents}",
        "Documents:\n\n{documents}\n\nQuestion: which document describes `{title}`, and what does it say about it?",
        "Read the passages and answer from them alone; say so if they do not contain the answer.\n\n{documents}"
        "\n\nQuestion: what are the main rules or limits mentioned for `{title}`?",
        "Context: {companies}\n\nUsing only the context, answer: where was {company_name} founded, and what does it "
        "make?",
        "Context: {people_notes}\n\nBased only on this context, what does {person} do and where are they from?",
        "Here are some search results:\n\n{documents}\n\nWrite a short answer to \"how is `{title}` used?\" with "
        "citations like [1].",
    ),
    "translation": (
        "Translate into {language}: \"{Subject} {action} {when}.\"",
        "How would you say \"{Subject} {action} {when}\" in {language}?",
        "Translate this message into {language}, keeping it {tone}: \"Hi, {subject} {action} {when}. Could you "
        "let me know if that works for you?\"",
        "Translate the following sentence into English and explain any idiom in it: \"{foreign}\"",
        "Translate this into {language} and then back into English: \"{Subject} {action} {when}.\"",
        "Give a {language} translation of this notice: \"Please note that {subject} {action} {when}.\"",
        "Translate into English, word by word first and then naturally: \"{foreign}\"",
    ),
    "code": (
        "Write a {language_code} function that {code_task}.",
        "Explain what this Python function does, line by line:\n\n```python\n{snippet}\n```",
        "Write a SQL query that {sql_task}. The table is {table}.",
        "Write a shell command that {shell_task}.",
        "Rewrite this Python function in {language_code}:\n\n```python\n{snippet}\n```",
        "Write unit tests with pytest for this function (`{function}`):\n\n```python\n{snippet}\n```",
        "Add type hints and a docstring to this function:\n\n```python\n{snippet}\n```",
        "In {language_code}, how would I {code_task_short}? Show a short example.",
        "Review this code and suggest improvements:\n\n```python\n{snippet}\n```",
    ),
}
FOLLOW_UPS = {
    "any": ("Make it shorter.", "Now rewrite it in a more formal tone.", "Can you explain that more simply?",
            "Continue from where you stopped.", "Translate your answer into {language}.", "Summarize your answer in one "
            "sentence.", "Give me two other versions.", "What would you change to make it better?"),
    "writing": ("Make it funnier.", "Write a subject line or title for it.", "Now make it half as long."),
    "roleplay": ("Stay in character and answer my reply: \"I am not sure I believe you.\"", "What happens next?"),
    "reasoning": ("How would the answer change if one of the facts were false?", "Check your answer another way."),
    "math": ("Check your answer by working backwards.", "Now explain it to a ten-year-old.",
             "Solve it again with {a} instead."),
    "extraction": ("Now give the same data as a markdown table.", "Sort the entries by name."),
    "summarization": ("Now in one sentence.", "Which detail did you leave out, and why?"),
    "knowledge": ("Give a concrete example.", "What is a good book or topic to read next?"),
    "rag": ("Quote the sentence that supports your answer.", "What else do the documents say about it?"),
    "translation": ("Now make it more casual.", "Translate it into {language2} too."),
    "code": ("Add comments to the code.", "Now write tests for it.", "What is the time complexity?"),
}
FILLERS = {
    "recipient": ("my landlord", "a new colleague", "the school principal", "our team", "a supplier", "my neighbour",
                  "a former professor", "the city council", "a customer", "my manager", "the hotel staff",
                  "a conference organizer", "the local library", "an old friend", "the building committee"),
    "email_purpose": ("asking to move a meeting to next week", "thanking them for their help with the move",
                      "requesting a refund for a late delivery", "introducing myself as the new project lead",
                      "inviting them to a summer picnic", "asking for a letter of recommendation",
                      "reporting a broken heater", "following up on an unanswered invoice",
                      "declining an invitation politely", "proposing a new weekly schedule",
                      "apologizing for a missed call", "asking for feedback on a draft",
                      "announcing that I am leaving the company", "asking to borrow a projector",
                      "confirming the details of a booking", "suggesting a shared car pool"),
    "tone": ("friendly", "formal", "brief", "warm but professional", "cheerful", "firm but polite", "casual"),
    "length": ("short", "300-word", "two-paragraph", "five-paragraph", "very short", "detailed"),
    "character": ("a retired lighthouse keeper", "a shy robot", "a baker who cannot smell", "a lost cat",
                  "a young cartographer", "a night-shift nurse", "a chess prodigy", "a stubborn goat",
                  "a time-travelling plumber", "an apprentice beekeeper", "a lonely astronaut", "two rival gardeners",
                  "a forgetful wizard", "a bus driver", "a teenage inventor", "an old ferry captain"),
    "story_event": ("finds a map hidden in a library book", "has to deliver a message before sunrise",
                    "wakes up able to understand birds", "loses the only key to the town hall",
                    "enters a baking contest by mistake", "discovers a door that was not there yesterday",
                    "must teach a dragon to read", "receives letters from the future", "gets stuck in a lift",
                    "tries to win back an old friend", "starts a band with strangers", "plants a tree that sings"),
    "setting": ("a floating market", "a village in the mountains", "a space station", "a rainy harbor town",
                "a desert oasis", "an underground city", "a 1920s train", "a research base in Antarctica",
                "a busy hospital", "a small island", "a forest of glass trees", "a school for inventors"),
    "topic": ("working from home", "learning a second language", "urban gardening", "saving money on groceries",
              "the joy of cycling", "keeping a journal", "slow travel", "cooking for one", "night skies",
              "board games", "repairing old furniture", "sleep", "public libraries", "walking meetings",
              "moving to a new city", "composting", "learning to draw", "volunteering", "rainy days", "tea"),
    "audience": ("beginners", "busy parents", "retirees", "high-school students", "small business owners",
                 "software engineers", "first-time travellers", "nurses", "college freshmen", "pet owners"),
    "announcement": ("the opening of a new bakery", "a charity run next month", "our app's new dark mode",
                     "a free coding workshop", "the winners of a photo contest", "a change in opening hours",
                     "a community clean-up day", "a new podcast episode", "a book club for teenagers"),
    "poem_form": ("a sonnet", "a haiku sequence", "a limerick", "free verse", "a ballad", "rhyming couplets"),
    "product": ("a solar-powered lamp", "a reusable notebook", "noise-cancelling earbuds", "a folding bicycle",
                "a smart plant pot", "a wool blanket", "a travel kettle", "a standing desk", "a kids' science kit"),
    "occasion": ("a friend's wedding", "a retirement party", "the first day of school", "a team's product launch",
                 "a graduation", "a library's 100th anniversary", "a farewell dinner"),
    "company_kind": ("a small design studio", "a hospital", "a renewable-energy startup", "a public library",
                     "a logistics company", "a video game studio", "a family bakery"),
    "complaint": ("a parcel that arrived broken", "noise from the building site at night", "a double charge on my card",
                  "a cancelled train with no refund", "a faulty washing machine", "rude service at the counter"),
    "persona": ("a medieval blacksmith", "a pirate captain", "a tour guide in ancient Rome", "a detective in 1930s "
                "London", "a friendly librarian", "a space station commander", "a grumpy wizard", "a museum robot",
                "a chef at a busy diner", "a mountain guide", "a fortune teller", "a ship's cat"),
    "persona2": ("a curious child", "a tax inspector", "a travelling merchant", "a nervous tourist", "a rival chef",
                 "an alien visitor", "a retired general", "a street musician"),
    "scene": ("A storm has just knocked out the lights.", "A stranger walks in with a sealed letter.",
              "The market is about to close for the night.", "Your ship has sailed into thick fog.",
              "Someone has stolen the town's only bell.", "It is the first snow of the year."),
    "visitor": ("is lost and looking for the train station", "wants to learn your trade", "has brought bad news",
                "is late for an important appointment", "claims to be your long-lost cousin"),
    "user_role": ("a new apprentice", "a customer with a complaint", "a traveller", "a reporter", "a suspect"),
    "coach": ("a job interview coach", "a debate coach", "a language tutor", "a fitness trainer", "a public speaking coach"),
    "preparation": ("a job interview at a bank", "my driving test", "a speech at a wedding", "a chemistry exam",
                    "a salary negotiation", "my first marathon"),
    "persuade": ("lend them a boat", "join an expedition", "give up a secret recipe", "vote for a new mayor"),
    "advice_topic": ("starting a new job", "dealing with a noisy neighbour", "learning patience", "saving for a trip"),
    "class_a": ("glorbs", "mintels", "zappers", "wobbles"), "class_b": ("plinks", "frobs", "quells", "dimmers"),
    "class_c": ("blue things", "tall things", "fast things", "loud things"),
    "puzzle_item": ("notebook", "kite", "lamp", "scarf"), "puzzle_item2": ("pen", "string", "bulb", "glove"),
    "argument": ("Every cat I have met likes fish, so all cats like fish.",
                 "If it rains the ground is wet. The ground is wet, so it rained.",
                 "No birds are mammals and some mammals fly, so some flying things are not birds.",
                 "All squares are rectangles, so all rectangles are squares."),
    "show_work": ("Show your work.", "Solve it step by step.", "Explain each step.", "Think it through step by step."),
    "concept": ("inflation", "photosynthesis", "compound interest", "plate tectonics", "the greenhouse effect",
                "supply and demand", "vaccination", "natural selection", "opportunity cost", "entropy",
                "the water cycle", "machine learning", "public-key encryption", "jet lag", "tides", "black holes",
                "the immune system", "interest rates", "erosion", "the placebo effect", "exchange rates",
                "biodiversity", "the scientific method", "antibiotic resistance", "the Doppler effect"),
    "pair": ("weather and climate", "a virus and a bacterium", "stocks and bonds", "speed and velocity",
             "a democracy and a republic", "baking soda and baking powder", "RAM and storage", "a lake and a pond",
             "mass and weight", "an alligator and a crocodile", "a comet and an asteroid"),
    "mechanism": ("a refrigerator", "a bicycle gear", "the human ear", "a solar panel", "GPS", "a credit card payment",
                  "a vaccine", "an elevator", "a search engine", "a microwave oven", "a hydroelectric dam"),
    "history": ("the printing press", "the bicycle", "paper money", "the Olympic games", "coffee", "the telephone",
                "public libraries", "the metric system", "chess", "vaccines", "maps", "the postal service",
                "the umbrella", "glass making", "the calendar", "street lighting", "the zipper"),
    "tradeoff": ("electric cars", "remote work", "nuclear power", "living in a big city", "open-plan offices",
                 "homeschooling", "credit cards", "renting versus buying a home", "standing desks"),
    "why": ("is the sky blue", "do we have leap years", "does bread go stale", "do cats purr", "does ice float",
            "do leaves change colour in autumn", "do we yawn", "is the sea salty", "do onions make us cry"),
    "language": ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Japanese", "Polish", "Turkish"),
    "language2": ("Spanish", "Swedish", "Greek", "Chinese"),
    "subject": ("the train to the coast", "my sister", "our team", "the museum", "the new bakery", "the meeting",
                "the children", "the library", "my neighbour", "the concert", "the shop on the corner", "the pool"),
    "action": ("will be closed", "arrives late", "starts at noon", "is moving to a bigger place", "needs more time",
               "has been cancelled", "opens again", "will visit us", "is looking for volunteers"),
    "when": ("tomorrow morning", "next Tuesday", "this weekend", "after the holidays", "until further notice",
             "in two weeks", "every Friday", "at the end of the month"),
    "foreign": ("Le marché ouvre à huit heures le samedi.", "Il pleut des cordes depuis ce matin.",
                "No hay mal que por bien no venga.", "Mañana vamos a la playa con mis primos.",
                "Ich verstehe nur Bahnhof.", "Wir treffen uns um halb drei vor dem Kino.",
                "In bocca al lupo per l'esame!", "A caballo regalado no se le mira el diente.",
                "Das ist nicht mein Bier.", "Chi va piano va sano e va lontano."),
    "language_code": ("Python", "JavaScript", "Go", "Rust", "TypeScript", "Java", "C", "Ruby"),
    "code_task": ("parses a date in ISO format and returns the day of the week", "reads a CSV file and returns the "
                  "sum of each numeric column", "retries a function call with exponential backoff",
                  "merges two dictionaries, summing values of shared keys", "implements a least-recently-used cache",
                  "converts a temperature table from Celsius to Fahrenheit", "validates an email address loosely",
                  "splits a list into batches of a given size", "counts the lines of every file in a folder",
                  "formats a number of bytes as KB, MB or GB", "builds a URL query string from a dictionary",
                  "returns the n most common words in a text file", "computes a moving average over a list",
                  "checks whether two rectangles overlap", "flattens a nested JSON object into dotted keys",
                  "debounces calls to a function", "reads environment variables with defaults into a config object"),
    "code_task_short": ("read a file line by line", "sort a list of records by two keys", "make an HTTP GET request",
                        "measure how long a function takes", "run two tasks concurrently", "parse command-line flags",
                        "write JSON to a file", "handle a missing key in a map"),
    "sql_task": ("returns the ten customers with the highest total spending", "counts orders per month in 2023",
                 "finds products that were never ordered", "lists employees who earn more than their manager",
                 "returns the average order value per country", "deletes duplicate rows, keeping the oldest"),
    "table": ("orders(id, customer_id, amount, created_at)", "employees(id, name, salary, manager_id)",
              "products(id, name, price) with order_items(order_id, product_id, quantity)",
              "customers(id, name, country) with orders(id, customer_id, total)"),
    "shell_task": ("finds all files larger than 100 MB under the home folder", "counts unique IP addresses in a log",
                   "renames every .jpeg file in a folder to .jpg", "shows the ten biggest folders",
                   "replaces a word in every .txt file recursively", "prints lines 20 to 30 of a file"),
    "first_name": ("Ana", "Ben", "Chidi", "Dana", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jia", "Kofi", "Lena",
                   "Mateo", "Nia", "Oskar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Yusuf"),
    "surname": ("Almeida", "Brandt", "Costa", "Dubois", "Eriksen", "Fischer", "Gupta", "Haddad", "Ito", "Jansen",
                "Kowalski", "Lindqvist", "Moreau", "Novak", "Okafor", "Petrov", "Rossi", "Sato", "Tanaka", "Weber"),
    "job": ("an accountant", "a nurse", "a carpenter", "a data scientist", "a teacher", "a pilot", "an architect",
            "a chef", "a librarian", "an electrician", "a pharmacist", "a journalist"),
    "city": ("Lisbon", "Tromsø", "Nairobi", "Osaka", "Porto Alegre", "Krakow", "Ghent", "Tucson", "Leeds", "Aarhus",
             "Valparaíso", "Hobart", "Izmir", "Ljubljana"),
    "record_verb": ("will lead", "reported on", "asked for more time on", "finished", "joined", "presented"),
    "project": ("the budget review", "the new website", "the warehouse move", "the hiring plan", "the spring fair",
                "the customer survey", "the safety audit", "the mobile app"),
    "item": ("notebook", "desk lamp", "water bottle", "umbrella", "backpack", "coffee mug", "chair", "cable",
             "keyboard", "plant pot", "towel", "candle", "puzzle", "pillow", "kettle"),
    "month": ("January", "March", "April", "June", "August", "October", "November"),
    "place": ("room 4B", "the old town hall", "the community centre", "the café on Main Street", "the north wing"),
    "company": ("Northwind", "Bluefield", "Ironbark", "Sunhollow", "Redpine", "Clearwater", "Stonebridge"),
    "long_word": ("strawberry", "mississippi", "bookkeeper", "parallel", "committee", "assessment", "banana",
                  "occurrence", "balloon", "necessary", "embarrass", "millennium", "tomorrow", "coffee"),
}
