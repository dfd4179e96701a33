"""Rows of builtin:real's short-text sources: translated messages, dialogues, word senses and fortunes.

The same conventions as data/real_rows.py (hash order, real text as most of each prompt, a real answer
as `reference` where one exists).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path

from draftsmith.data import package_texts as texts
from draftsmith.data.package_texts import Roots
from draftsmith.data.real_rows import (CHAT_LANGUAGES, FORTUNE_SKIP, clip, digest, hash_order, language_name,
                                       pick, row)

PLACEHOLDER = re.compile(r"%[\w(]|\{[\w.]*\}|\$\w")
BATCH = 5  # short messages go in lists of five


# --------------------------------------------------------------------------- gettext catalogues
@functools.lru_cache(maxsize=4)
def catalogue_roots(roots: Roots) -> tuple[Path, ...]:
    """Folders holding catalogues: the system's locale folder, and installed Python packages that ship some."""
    found = [roots.locale] if roots.locale.is_dir() and any(roots.locale.glob("*/LC_MESSAGES/*.mo")) else []
    for root in roots.packages:
        found += sorted({path.parents[3] for path in root.glob("*/**/locale/*/LC_MESSAGES/*.[mp]o")})
    return tuple(found)


def good_message(english: str, translated: str) -> bool:
    """A message worth translating: a sentence or more of words, translated, with at most one placeholder."""
    return (len(english) >= 25 and len(english.split()) >= 4 and translated.strip() != english.strip()
            and len(PLACEHOLDER.findall(english)) <= 1 and "\x00" not in translated and "<" not in english)


@functools.lru_cache(maxsize=4)
def catalogue_messages(roots: Roots) -> tuple:
    """(domain, language, English, translation) of every good message, in hash order, one per English text and
    language."""
    seen, found = set(), []
    for root in catalogue_roots(roots):
        for domain, language, english, translated in texts.catalogue_pairs(root):
            if domain.split("/")[-1].startswith("iso_") or (english, language) in seen:
                continue
            if good_message(english, translated):
                seen.add((english, language))
                found.append((domain, language, english.strip(), translated.strip()))
    return tuple(hash_order(found, key=lambda m: f"{m[1]}\x1f{m[2]}"))


def catalogue_translation(roots: Roots) -> Iterator[dict]:
    """A long message alone, short ones in lists of five of one language; into the language, or back (one in four)."""
    waiting: dict[str, list] = {}
    for domain, language, english, translated in catalogue_messages(roots):
        batch = [(domain, english, translated)]
        if len(english) < 70:
            waiting.setdefault(language, []).append(batch[0])
            if len(waiting[language]) < BATCH:
                continue
            batch = waiting.pop(language)
        yield _translation_row(language, batch)
    for language, batch in sorted(waiting.items()):  # the last short messages of each language
        yield _translation_row(language, batch)


def _translation_row(language: str, batch: list[tuple[str, str, str]]) -> dict:
    """Messages of one language [(domain, English, translation)] to translate, into the language or back."""
    english = batch[0][1]
    name, back = language_name(language), digest("back", language, english) % 4 == 0
    sources, targets = ([b[i] for b in batch] for i in (1, 2))
    if back:
        sources, targets = targets, sources
    numbered = (lambda items: "\n".join(f"{i}. {t}" for i, t in enumerate(items, 1))) if len(batch) > 1 else \
        (lambda items: items[0])
    into = "English" if back else name
    ask = pick(("Translate this interface text into {l}:", "How would this message read in {l}?",
                "I'm localizing an app. Give me the {l} version of:", "Please translate into {l}:")
               if len(batch) == 1 else ("Translate these app messages into {l}, keeping the numbering:",
                                        "Localize these strings for {l} users:"), language, english)
    return row(f"catalogs/{batch[0][0]}/{language}", "translation", [f"{ask.format(l=into)}\n\n{numbered(sources)}"],
               "en" if back else language, numbered(targets))


def catalogue_documents(roots: Roots) -> Iterator[str]:
    groups: dict[str, list] = {}
    for domain, language, english, translated in catalogue_messages(roots):
        groups.setdefault(language, []).append(f"English: {english}\n{language_name(language)}: {translated}")
        if len(groups[language]) == 12:
            yield "\n\n".join(groups.pop(language))
    yield from ("\n\n".join(group) for _, group in sorted(groups.items()))


CATALOGUE_ROWS = {"translation": catalogue_translation}


# --------------------------------------------------------------------------- chat
def dialogues(roots: Roots) -> list[tuple[str, str, list[str]]]:
    """chatterbot-corpus dialogues with more than a greeting, in hash order."""
    folder = roots.chat()
    found = list(texts.chat_dialogues(folder)) if folder else []
    return hash_order(found, key=lambda d: f"{d[0]}/{d[1]}/{d[2][0]}")


def chat_rows(roots: Roots) -> Iterator[dict]:
    """The user's turns of a dialogue (every other line, up to three), each answered by the target."""
    for language, topic, turns in dialogues(roots):
        asked = turns[0::2][:3]
        yield row(f"chat/{language}/{topic}", "writing", asked, CHAT_LANGUAGES.get(language, language),
                  "\n".join(turns[1::2][:3]))


def chat_documents(roots: Roots) -> Iterator[str]:
    for language, topic, turns in dialogues(roots):
        if len(turns) >= 4:
            yield "\n".join(f"{'AB'[i % 2]}: {turn}" for i, turn in enumerate(turns))


CHAT_ROWS = {"writing": chat_rows}


# --------------------------------------------------------------------------- WordNet
@functools.lru_cache(maxsize=4)
def senses(roots: Roots) -> tuple:
    """WordNet senses with a real gloss, in hash order."""
    found = [(pos, offset, words, gloss, examples) for pos, offset, words, gloss, examples
             in texts.wordnet_senses(roots.wordnet) if len(gloss) >= 25 and len(words[0]) >= 4]
    return tuple(hash_order(found, key=lambda s: f"{s[0]}{s[1]}"))


def wordnet_knowledge(roots: Roots) -> Iterator[dict]:
    for pos, offset, words, gloss, examples in senses(roots):
        word = words[0]
        if len(words) >= 2 and digest("pair", offset) % 3 == 0:
            ask = f"Is there any difference between \"{word}\" and \"{words[1]}\"?"
        else:
            ask = pick(("What does \"{w}\" mean?", "What is the meaning of the {p} \"{w}\"? Give an example.",
                        "Define \"{w}\" and use it in a sentence.",
                        "I came across the word \"{w}\". What does it mean?"),
                       offset).format(w=word, p={"adj": "adjective", "adv": "adverb"}.get(pos, pos))
        yield row(f"wordnet/{pos}/{offset}", "knowledge", [ask], reference=gloss)


def wordnet_writing(roots: Roots) -> Iterator[dict]:
    for pos, offset, words, gloss, examples in hash_order(senses(roots), key=lambda s: f"writing{s[1]}"):
        if not examples:
            continue
        ask = pick(("Write a short paragraph that uses \"{w}\" in the sense of \"{g}\".",
                    "Write three example sentences with \"{w}\" meaning \"{g}\".",
                    "Write a four-line poem that uses the word \"{w}\" ({g})."), offset)
        yield row(f"wordnet/{pos}/{offset}", "writing", [ask.format(w=words[0], g=gloss)], reference=examples[0])


def wordnet_documents(roots: Roots) -> Iterator[str]:
    lines = []
    for pos, offset, words, gloss, examples in senses(roots):
        example = f" For example: {'; '.join(examples)}." if examples else ""
        lines.append(f"{', '.join(words)} ({pos}): {gloss}.{example}")
        if len(lines) == 20:
            yield "\n".join(lines)
            lines = []
    if lines:
        yield "\n".join(lines)


WORDNET_ROWS = {"knowledge": wordnet_knowledge, "writing": wordnet_writing}


# --------------------------------------------------------------------------- fortunes
@functools.lru_cache(maxsize=4)
def sayings(roots: Roots) -> tuple:
    """Fortunes of 40-700 characters, files that lean offensive or are pictures left out, in hash order."""
    found = [(language, name, text) for language, name, text in texts.fortunes(roots.fortunes, FORTUNE_SKIP)
             if 40 <= len(text) <= 700 and language != "off"] if roots.fortunes.is_dir() else []
    return tuple(hash_order(found, key=lambda f: f[2]))


def fortune_rows(category: str):
    """The rows of one category: writing, roleplay, reasoning (English sayings) or translation (the others)."""
    asks = {
        "writing": ("Write a short story that ends with this line:", "Write a poem inspired by this:",
                    "Write a birthday card message built around this quote:"),
        "roleplay": ("You are a late-night radio host. A caller reads this out and asks what you make of it:",
                     "Play a grumpy old sailor and react to this, in character:",
                     "Pretend you are a stand-up comedian and build a short bit around this:"),
        "reasoning": ("Explain the joke or the point of this:", "What is the reasoning behind this saying, and "
                      "is it right?", "Is this argument sound? Think it through:"),
    }

    def make(roots: Roots) -> Iterator[dict]:
        for language, name, text in hash_order(sayings(roots), key=lambda f: category + f[2]):
            if category == "translation":
                if language != "en":
                    yield row(f"fortunes/{language}/{name}", category,
                              [f"{pick(('Translate this into English:', 'What does this mean in English?'), text)}"
                               f"\n\n{text}"], language)
            elif language == "en":
                yield row(f"fortunes/en/{name}", category, [f"{pick(asks[category], text)}\n\n{clip(text)}"])
    return make


def fortune_documents(roots: Roots) -> Iterator[str]:
    for language, name, text in sayings(roots):
        yield text


FORTUNE_ROWS = {category: fortune_rows(category) for category in ("writing", "roleplay", "reasoning", "translation")}
