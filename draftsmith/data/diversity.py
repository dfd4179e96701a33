"""How varied a prepared corpus is: distinct n-grams, languages and lengths, per input and overall.

A drafter that trained on a few templates looks good on those templates and nowhere else, so
`prepare_report.json` says how much variety the data holds (`diversity`), beside the counts:
  distinct_n       distinct n-grams / n-grams (n = 1, 2, 3) over the trainable token ids, n-grams taken
                   inside each row; the ratio falls as a corpus grows, so it is also given at a fixed
                   budget (`distinct_n_at_budget`: the first `budget` trainable tokens of the rows in a
                   seeded order), which compares corpora of any size;
  languages        rows per guessed language (`guess_language`: the script, then stop words for Latin
                   script; cheap and good enough to tell a one-language corpus from a many-language one);
  length           percentiles (p10/p50/p90/max) of the tokens per row, and of the trainable tokens per row.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections import Counter, defaultdict

BUDGET = 20_000
PERCENTILES = (10, 50, 90)

# A few dozen frequent function words per language (Latin script); a row goes to the language with the most hits.
STOP_WORDS = {
    "en": "the and of to is in that it for with as are this be on not by or from you can an which if at have was "
          "what how do your my will all has but they we there their one when would about into",
    "de": "der die und das ist nicht ein eine zu den mit sich auf für von dem des im werden wird auch oder wenn",
    "fr": "le la les et des est une un du que pas pour dans qui sur au avec ce sont vous ne par plus être",
    "es": "el la los las que de y en un una es por con para del se no su al como más lo este",
    "it": "il di che la è per un una non del della sono con gli le si da nel alla questo anche",
    "pt": "o os que de da do em um uma não para com por se mais as dos das ao é você",
    "nl": "de het een van en is dat op te niet voor zijn met er die wordt ook aan bij worden",
    "pl": "i w nie na się z do jest że to o jak dla po od przez są tak może lub",
    "sv": "och att det som en är på för med av inte till den har om kan ett eller",
    "da": "og at det er en til af på som med den ikke for har de kan et eller skal",
    "nb": "og er det som en til av på med for ikke den har kan et eller skal jeg",
    "fi": "ja on ei se että tai kun joka jos mutta myös ovat voi sen tämä niin",
    "cs": "a je se na v že to jako s pro ale z do jsou nebo který by",
    "hu": "a az és hogy nem is egy meg van ez de csak mint vagy már ki",
    "ro": "și de la în că nu este pe cu un o din pentru sunt care mai sau",
    "tr": "ve bir bu da de için ile ne çok olarak daha gibi ama veya olan",
    "id": "dan yang di ini itu dengan untuk tidak dari dalam akan pada adalah atau",
    "vi": "và của là có không được cho các một những này trong với để người",
    "eo": "la kaj de en estas al ne por kun mi vi ke ĉu sed pli",
}
# A word English also uses (to, a, at, do ...) or a single letter (variable names in code) tells nothing.
ENGLISH = set(STOP_WORDS["en"].split())
STOP_SETS = {language: {w for w in words.split() if language == "en" or (len(w) > 1 and w not in ENGLISH)}
             for language, words in STOP_WORDS.items()}
# The first script found decides for scripts that one language mostly writes in.
SCRIPT_LANGUAGES = (("HIRAGANA", "ja"), ("KATAKANA", "ja"), ("HANGUL", "ko"), ("CJK", "zh"), ("GREEK", "el"),
                    ("ARABIC", "ar"), ("HEBREW", "he"), ("DEVANAGARI", "hi"), ("THAI", "th"), ("BENGALI", "bn"),
                    ("GEORGIAN", "ka"), ("ARMENIAN", "hy"), ("TAMIL", "ta"))
UKRAINIAN = set("іїєґ")
WORD = re.compile(r"[^\W\d_]+")


def guess_language(text: str) -> str:
    """A language code guessed from the script and, for Latin and Cyrillic script, frequent words; "und" if unsure."""
    letters = [ch for ch in text[:4000] if ch.isalpha()]
    if not letters:
        return "und"
    scripts = Counter(_script(ch) for ch in letters)
    script, count = scripts.most_common(1)[0]
    for name, language in SCRIPT_LANGUAGES:
        if scripts.get(name, 0) >= 0.2 * len(letters):  # kana beside Han is Japanese, not Chinese
            return language
    if script == "CYRILLIC":
        return "uk" if UKRAINIAN & set(text.lower()) else ("sr" if "ђ" in text or "ћ" in text else "ru")
    if script != "LATIN":
        return "und"
    words = WORD.findall(text[:4000].lower())
    hits = {language: sum(word in stops for word in words) for language, stops in STOP_SETS.items()}
    language, best = max(hits.items(), key=lambda item: item[1])
    return language if best >= 2 and best >= 0.02 * len(words) else "und"


def _script(ch: str) -> str:
    try:
        name = unicodedata.name(ch)
    except ValueError:
        return "OTHER"
    return name.split(" ")[0]


def distinct_ngrams(rows: list[list[int]], n: int) -> tuple[int, int]:
    """(distinct, total) n-grams over `rows`, n-grams taken inside each row."""
    seen, total = set(), 0
    for ids in rows:
        grams = zip(*(ids[i:] for i in range(n)))
        for gram in grams:
            seen.add(gram)
            total += 1
    return len(seen), total


def percentiles(values: list[int]) -> dict:
    """p10/p50/p90 (nearest rank) and max of `values`; empty dict for none."""
    if not values:
        return {}
    ordered = sorted(values)
    picked = {f"p{p}": ordered[min(len(ordered) - 1, max(0, -(-p * len(ordered) // 100) - 1))] for p in PERCENTILES}
    return {**picked, "max": ordered[-1]}


def trainable_ids(input_ids, loss_mask) -> list[int]:
    """The token ids of one row that the loss covers."""
    return [token for token, keep in zip(input_ids, loss_mask) if keep]


def diversity_of(rows: list[tuple[list[int], list[int], str]], seed: int = 0, budget: int = BUDGET) -> dict:
    """The diversity figures of rows given as (input_ids, loss_mask, text): see the module docstring."""
    trainable = [trainable_ids(ids, mask) for ids, mask, _ in rows]
    figures: dict = {"rows": len(rows), "trainable_tokens": sum(map(len, trainable))}
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    sample, left = [], budget
    for index in order:
        if left <= 0:
            break
        sample.append(trainable[index][:left])
        left -= len(sample[-1])
    for n in (1, 2, 3):
        distinct, total = distinct_ngrams(trainable, n)
        figures[f"distinct_{n}"] = round(distinct / total, 4) if total else None
        figures[f"distinct_{n}_count"] = distinct
        if left <= 0:  # only a full budget compares across corpora
            distinct, total = distinct_ngrams(sample, n)
            figures[f"distinct_{n}_at_budget"] = round(distinct / total, 4) if total else None
    figures["budget_tokens"] = budget if left <= 0 else None
    languages = Counter(guess_language(text) for _, _, text in rows)
    figures["languages"] = dict(languages.most_common())
    figures["length_tokens"] = percentiles([len(ids) for ids, _, _ in rows])
    figures["length_trainable_tokens"] = percentiles([len(ids) for ids in trainable])
    return figures


def row_text(messages_json: str) -> str:
    """The text of a prepared row's `messages` column (a conversation or a completion) for the language guess."""
    record = json.loads(messages_json)
    if isinstance(record, dict):
        return f"{record.get('prompt', '')}\n{record.get('completion', '')}"
    return "\n".join(message["content"] for message in record if message["role"] != "system")


def corpus_diversity(columns: dict, seed: int = 0, budget: int = BUDGET) -> dict:
    """`{"overall": figures, "by_input": {input: figures}}` over prepared columns (input_ids, loss_mask, messages,
    source); an input is what `prepare --input` named (a builtin name, a file, a dataset)."""
    groups = defaultdict(list)
    for ids, mask, messages, source in zip(columns["input_ids"], columns["loss_mask"], columns["messages"],
                                           columns["source"]):
        groups[source].append((ids, mask, row_text(messages)))
    every = [row for rows in groups.values() for row in rows]
    return {"budget_tokens": budget, "overall": diversity_of(every, seed, budget),
            "by_input": {source: diversity_of(rows, seed, budget) for source, rows in groups.items()}}
