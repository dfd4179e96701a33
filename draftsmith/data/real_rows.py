"""The rows of builtin:real's sources (data/real.py): real text from data/package_texts.py put into requests.

Every maker takes the Roots to read and yields rows (real.row shape: category, source, language, user
turns awaiting the target, a real answer as `reference` where one exists) in a fixed hash order of its
files or units, lazily, so that a corpus of a few thousand rows reads only the files it needs. The
instructions are short and varied; the real text is most of every prompt. A quarter of the rows carry a
follow-up turn. `*_documents` give the same text as plain documents.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

from draftsmith.data import package_texts as texts
from draftsmith.data.general import awaiting_target
from draftsmith.data.package_texts import Roots

MAX_CHARS = 1400  # a prompt's real text, so that the answer fits prepare's max_length
DOCUMENT_CHARS = 2000
LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian",
                  "pt": "Portuguese", "pt_BR": "Brazilian Portuguese", "nl": "Dutch", "pl": "Polish", "ru": "Russian",
                  "uk": "Ukrainian", "cs": "Czech", "da": "Danish", "fi": "Finnish", "hu": "Hungarian",
                  "id": "Indonesian", "ja": "Japanese", "ko": "Korean", "ro": "Romanian", "sr": "Serbian",
                  "sv": "Swedish", "tr": "Turkish", "zh_CN": "Chinese", "zh_TW": "Traditional Chinese", "el": "Greek",
                  "nb": "Norwegian", "vi": "Vietnamese", "ca": "Catalan", "ar": "Arabic", "he": "Hebrew",
                  "hr": "Croatian", "sl": "Slovenian", "sk": "Slovak", "bg": "Bulgarian", "et": "Estonian",
                  "lt": "Lithuanian", "lv": "Latvian", "eo": "Esperanto", "gl": "Galician", "eu": "Basque",
                  "fa": "Persian", "hi": "Hindi", "th": "Thai", "pt_PT": "Portuguese", "zh_Hans": "Chinese",
                  "zh_Hant": "Traditional Chinese", "nn": "Norwegian Nynorsk", "be": "Belarusian", "mk": "Macedonian"}
CHAT_LANGUAGES = {"english": "en", "german": "de", "french": "fr", "spanish": "es", "italian": "it",
                  "portuguese": "pt", "russian": "ru", "ukrainian": "uk", "dutch": "nl", "swedish": "sv",
                  "turkish": "tr", "indonesian": "id", "chinese": "zh_CN", "traditionalchinese": "zh_TW",
                  "japanese": "ja", "korean": "ko", "hindi": "hi", "bengali": "bn", "hebrew": "he", "persian": "fa",
                  "tamil": "ta", "telugu": "te", "thai": "th", "urdu": "ur", "marathi": "mr", "oriya": "or",
                  "yoruba": "yo", "hinglish": "hi-Latn"}
# Asking about a passage in its own language: (summarize, explain simply).
NATIVE_ASKS = {
    "de": ("Fasse diesen Abschnitt kurz zusammen:", "Erkläre mir diesen Text in einfachen Worten:"),
    "fr": ("Résume ce passage en quelques phrases :", "Explique-moi ce texte simplement :"),
    "es": ("Resume este fragmento en pocas frases:", "Explícame este texto con palabras sencillas:"),
    "it": ("Riassumi questo brano in poche frasi:", "Spiegami questo testo in parole semplici:"),
    "pt_BR": ("Resuma este trecho em poucas frases:", "Explique este texto com palavras simples:"),
    "nl": ("Vat dit stuk kort samen:", "Leg deze tekst eenvoudig uit:"),
    "pl": ("Streść krótko ten fragment:", "Wyjaśnij mi ten tekst prostymi słowami:"),
    "ru": ("Кратко перескажи этот фрагмент:", "Объясни этот текст простыми словами:"),
}
FORTUNE_SKIP = {"ethnic", "drugs", "sex", "men-women", "politics", "religion", "ascii-art", "asciiart", "art",
                "debian-hints", "off", "kids", "zitate", "translate-me"}
FOLLOW_UPS = {
    "summarization": ("Which part of it would a newcomer find hardest?", "Can you put that into a bulleted list?"),
    "extraction": ("Sort that by name, please.", "Now give the same thing as a markdown table."),
    "rag": ("Which passage did you rely on most?", "Is there anything the passages leave unclear?"),
    "knowledge": ("Can you give me a concrete example?", "What are common mistakes people make with this?"),
    "writing": ("Make it a bit shorter.", "Now make it sound more casual."),
    "code": ("How would you test this?", "Could it be written more simply?"),
    "translation": ("Are there any words in it that are hard to translate?", "Now make it sound more natural."),
    "roleplay": ("Stay in character and keep going.",), "reasoning": ("Could it be read another way?",),
}


# --------------------------------------------------------------------------- deterministic choices
def digest(*parts: object) -> int:
    """A stable integer hash of `parts` (Python's own hash() changes between processes)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big")


def pick(options, *key: object):
    """One of `options`, chosen by the hash of `key`."""
    return options[digest("pick", *key) % len(options)]


def hash_order(items, key=str) -> list:
    """`items` in a fixed pseudo-random order (by hash), so that any prefix samples all of them."""
    return sorted(items, key=lambda item: digest(key(item)))


def clip(text: str, limit: int = MAX_CHARS) -> str:
    """`text` cut at a paragraph or sentence end before `limit` characters."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    end = max(cut.rfind("\n\n"), cut.rfind(". "), cut.rfind(".\n"))
    return cut[:end + 1].strip() if end > limit // 3 else cut.rsplit(" ", 1)[0] + " ..."


def row(source: str, category: str, turns: list[str], language: str = "en", reference: str | None = None) -> dict:
    """A row awaiting the target; a quarter of them (by hash) with a follow-up turn of the category."""
    if len(turns) == 1 and category in FOLLOW_UPS and digest("follow", turns[0]) % 4 == 0:
        turns = turns + [pick(FOLLOW_UPS[category], "follow-up", turns[0])]
    made = {"category": category, "source": source, "language": language, "messages": awaiting_target(turns)}
    return made | ({"reference": reference} if reference else {})


def language_name(code: str) -> str:
    """English name of a locale code (de, pt_BR, sr@latin ...); the code itself when unknown."""
    code = code.split("@")[0].split(".")[0]
    return LANGUAGE_NAMES.get(code) or LANGUAGE_NAMES.get(code.split("_")[0]) or code


# --------------------------------------------------------------------------- man pages
@functools.lru_cache(maxsize=None)
def man_blocks(path: Path) -> tuple:
    """The parsed blocks of one man page (cached: several categories read the same pages)."""
    try:
        return tuple(texts.roff_blocks(texts.read_man_page(path)))
    except (OSError, EOFError, ValueError):
        return ()


def man_files(roots: Roots, language: str = "", salt: str = "") -> list[Path]:
    """Man pages of `language` ("" = English) in hash order (salted per use), families interleaved: one page of
    every family (gcloud_*, git-*, perl*...) before a second of any, so that no suite of tools crowds the rest."""
    base = roots.man / language if language else roots.man
    ranks: dict[str, int] = {}
    ranked = []
    for path in hash_order([p for p in base.glob("man*/*") if p.is_file()], key=lambda p: salt + p.name):
        family = re.split(r"[_\-.:]", path.name, maxsplit=1)[0]
        ranks[family] = ranks.get(family, -1) + 1
        ranked.append((ranks[family], len(ranked), path))
    return [path for _, _, path in sorted(ranked)]


def command(path: Path) -> str:
    """The page's name without its section: ls.1.gz -> ls."""
    return re.sub(r"\.[0-9][a-z]*(\.gz)?$", "", path.name)


def options_of(blocks) -> list[tuple[str, str]]:
    """(option, description) items of a page."""
    return [(b[2], b[3]) for b in blocks if b[1] == "para" and b[2].startswith("-") and len(b[3]) >= 15]


def description(blocks, limit: int = MAX_CHARS) -> str:
    """The prose of a page's first sections after the synopsis (its description)."""
    prose = [b[3] for b in blocks if b[1] == "para" and not b[2] and b[0] not in texts.MAN_BOILERPLATE]
    return clip("\n\n".join(prose), limit)


def _man_pages(roots: Roots, salt: str) -> Iterator[tuple[Path, tuple]]:
    for path in man_files(roots, salt=salt):
        blocks = man_blocks(path)
        if blocks:
            yield path, blocks


def man_summaries(roots: Roots) -> Iterator[dict]:
    english = ((path, blocks, "en") for path, blocks in _man_pages(roots, "summarization"))
    translated = ((path, man_blocks(path), language) for language in sorted(NATIVE_ASKS)
                  for path in man_files(roots, language) if (roots.man / language).is_dir())
    for path, blocks, language in _alternate(english, translated, every=3):
        text, name = description(blocks), command(path)
        if len(text) < 300:
            continue
        if language == "en":
            ask = pick(("Summarize this excerpt from the manual of `{c}` in a few sentences:",
                        "Here is part of the documentation for `{c}`. What are the key points?",
                        "Give me a short summary of what this manual page says:",
                        "TL;DR of this, please (it is from the `{c}` man page):"), path.name).format(c=name)
        else:
            ask = NATIVE_ASKS[language][digest(path.name) % 2]
        yield row(f"manpages/{language}/{path.name}", "summarization", [f"{ask}\n\n{text}"], language)


def _alternate(first: Iterator, second: Iterator, every: int) -> Iterator:
    """Items of `first`, one of `second` after every `every` of them (the rest of either at the end)."""
    for index, item in enumerate(first, start=1):
        yield item
        if index % every == 0:
            other = next(second, None)
            if other is not None:
                yield other
    yield from second


def man_extraction(roots: Roots) -> Iterator[dict]:
    for path, blocks in _man_pages(roots, "extraction"):
        options = options_of(blocks)
        if len(options) < 3:
            continue
        listing = clip("\n".join(f"{tag}\n    {text}" for tag, text in options[:12]))
        ask = pick(("Turn these options of `{c}` into a JSON array of objects with \"option\" and \"meaning\":",
                    "Make a markdown table (option | what it does) from this part of the `{c}` manual:",
                    "List every option below that takes an argument, with the argument's name, as JSON:"),
                   path.name).format(c=command(path))
        yield row(f"manpages/en/{path.name}", "extraction", [f"{ask}\n\n{listing}"])


def man_rag(roots: Roots) -> Iterator[dict]:
    for path, blocks in _man_pages(roots, "rag"):
        options, name = options_of(blocks), command(path)
        if len(options) < 3:
            continue
        chosen = hash_order(options, key=lambda o: f"{path.name}{o[0]}")[:4]
        passages = "\n\n".join(f"[{i}] {tag}: {text}" for i, (tag, text) in enumerate(chosen, 1))
        tag, text = chosen[digest(path.name) % len(chosen)]
        question = pick(("Using only the excerpts above, what does `{t}` do in `{c}`?",
                         "Based on these excerpts of the `{c}` manual, when would I use `{t}`? Cite the excerpt.",
                         "I'm reading the `{c}` docs. According to the passages, how does `{t}` behave?"),
                        path.name).format(t=tag.split(",")[0].strip(), c=name)
        yield row(f"manpages/en/{path.name}", "rag", [f"{clip(passages)}\n\n{question}"], reference=text)


def man_knowledge(roots: Roots) -> Iterator[dict]:
    for path, blocks in _man_pages(roots, "knowledge"):
        name, title = command(path), next((b[3] for b in blocks if b[0] == "NAME"), "")
        options = options_of(blocks)
        if options and digest("option", path.name) % 2:
            tag, text = options[digest(path.name) % len(options)]
            yield row(f"manpages/en/{path.name}", "knowledge",
                      [f"What does the `{tag.split(',')[0].strip()}` option of `{name}` do?"], reference=text)
        elif title:
            ask = pick(("What is `{c}` used for on Linux, and how do I use it?", "How do I use the `{c}` command?",
                        "Can you explain what `{c}` does, with an example?"), path.name)
            yield row(f"manpages/en/{path.name}", "knowledge", [ask.format(c=name)], reference=title)


def man_writing(roots: Roots) -> Iterator[dict]:
    for path, blocks in _man_pages(roots, "writing"):
        prose = [b[3] for b in blocks if b[1] == "para" and not b[2] and len(b[3]) >= 250
                 and b[0] not in texts.MAN_BOILERPLATE]
        if not prose:
            continue
        ask = pick(("Rewrite this paragraph from the `{c}` manual in plain, friendly language for a beginner:",
                    "Write a short how-to post for newcomers based on this excerpt from the `{c}` manual:",
                    "Turn this into an email to my team explaining what it means for us:"),
                   path.name).format(c=command(path))
        yield row(f"manpages/en/{path.name}", "writing", [f"{ask}\n\n{clip(prose[0])}"])


def man_translation(roots: Roots) -> Iterator[dict]:
    """Aligned paragraphs of translated pages, a few joined: English into the language, or back (one in three)."""
    languages = [language for language in texts.man_languages(roots.man)]
    pages = hash_order([(language, path) for language in languages for path in man_files(roots, language)],
                       key=lambda item: f"{item[0]}/{item[1].name}")
    for language, path in pages:
        english = next((p for p in (roots.man / path.parent.name).glob(f"{path.name.removesuffix('.gz')}*")), None)
        pairs = texts.aligned_paragraphs(list(man_blocks(english)), list(man_blocks(path))) if english else []
        for start in range(0, min(len(pairs), 6), 3):
            chunk = pairs[start:start + 3]
            source_text, target_text = ("\n\n".join(p[i] for p in chunk) for i in (1, 2))
            back = digest("direction", language, path.name, start) % 3 == 0
            lang = language_name(language)
            if back:
                ask = pick(("Translate this {l} text into English:", "What does this say in English?"),
                           path.name, start)
                turns, reference = [f"{ask.format(l=lang)}\n\n{clip(target_text)}"], source_text
            else:
                ask = pick(("Translate this paragraph into {l}:", "Please translate the following into {l}:",
                            "How would you say this in {l}?"), path.name, start)
                turns, reference = [f"{ask.format(l=lang)}\n\n{clip(source_text)}"], target_text
            yield row(f"manpages/{language}/{path.name}", "translation", turns, "en" if back else language, reference)


def man_documents(roots: Roots) -> Iterator[str]:
    english = ((path, man_blocks(path)) for path in man_files(roots))
    translated = ((path, man_blocks(path)) for language in texts.man_languages(roots.man)
                  for path in man_files(roots, language))
    for path, blocks in _alternate(english, translated, every=3):
        text = description(blocks, DOCUMENT_CHARS)
        if len(text) >= 300:
            yield f"{command(path)}\n\n{text}"


MAN_ROWS = {"summarization": man_summaries, "extraction": man_extraction, "rag": man_rag,
            "knowledge": man_knowledge, "writing": man_writing, "translation": man_translation}


# --------------------------------------------------------------------------- Python documentation
SKIP_DOC_PAGES = {"whatsnew/changelog", "license", "copyright", "bugs", "about", "contents", "glossary"}


@functools.lru_cache(maxsize=4)
def doc_sections(docs: Path | None) -> tuple:
    """(page, heading, blocks) of every section of the Python documentation's sources, in hash order. The library
    pages of the modules the evaluation suite quotes (data/suite.py) are left out."""
    if docs is None:
        return ()
    from draftsmith.data.suite import MODULES

    skip = SKIP_DOC_PAGES | {f"library/{module.removesuffix('/__init__')}" for module in MODULES}
    sections = [(page, heading, tuple(blocks)) for page, found in texts.python_doc_pages(docs, skip)
                for heading, blocks in found if heading]
    return tuple(hash_order(sections, key=lambda s: f"{s[0]}#{s[1]}"))


def prose_of(blocks, limit: int = MAX_CHARS) -> str:
    """A section's paragraphs (no code, no API entries)."""
    return clip("\n\n".join(text for kind, text in blocks if kind == "para" and len(text) > 30), limit)


def topics(roots: Roots) -> list[tuple[str, str]]:
    """(title, text) of the language reference's topics (pydoc_data), in hash order."""
    found = [(text.split("\n", 1)[0].strip(), text.split("\n", 2)[-1].strip())
             for text in texts.pydoc_topics().values() if text.count("\n") > 2]
    return hash_order(found, key=lambda t: t[0])


def doc_summaries(roots: Roots) -> Iterator[dict]:
    sections = ((f"python-docs/{page}#{heading}", heading, prose_of(blocks)) for page, heading, blocks
                in doc_sections(roots.docs()))
    reference = ((f"pydoc/{title}", title, clip(text)) for title, text in topics(roots))
    for source, heading, text in _alternate(sections, reference, every=6):
        if len(text) >= 400:
            ask = pick(("Summarize this section of the Python documentation:",
                        "Can you give me the gist of this? It's from the Python docs, \"{h}\".",
                        "Explain the main points of this passage in a short paragraph:",
                        "Summarize the following for a developer who is new to Python:"), source).format(h=heading)
            yield row(source, "summarization", [f"{ask}\n\n{text}"])


def doc_rag(roots: Roots) -> Iterator[dict]:
    pages: dict[str, list] = {}
    for page, heading, blocks in doc_sections(roots.docs()):
        pages.setdefault(page, []).append((heading, prose_of(blocks, 450)))
    for page, found in pages.items():
        found = [(h, t) for h, t in found if len(t) >= 150][:4]
        if len(found) < 2:
            continue
        passages = "\n\n".join(f"[{i}] ({h}) {t}" for i, (h, t) in enumerate(found, 1))
        heading, text = found[digest(page) % len(found)]
        question = pick(("Using only the passages above, explain \"{h}\".",
                         "According to these documents, what should I know about \"{h}\"? Say which passage you used.",
                         "Answer from the passages only: what do they say about \"{h}\"?"), page).format(h=heading)
        yield row(f"python-docs/{page}", "rag", [f"{passages}\n\n{question}"], reference=text)


def doc_extraction(roots: Roots) -> Iterator[dict]:
    for page, heading, blocks in hash_order(doc_sections(roots.docs()), key=lambda s: "extraction" + s[0] + s[1]):
        entries = [text for kind, text in blocks if kind == "api"]
        if len(entries) < 2:
            continue
        listing = clip("\n\n".join(entries))
        ask = pick(("From this reference, extract every function or class as JSON objects with \"name\", "
                    "\"parameters\" and \"purpose\":", "Make a table of the callables described below: name, "
                    "arguments, one-line description.", "List the names and default values of every keyword "
                    "argument documented here, as JSON:"), page, heading)
        yield row(f"python-docs/{page}#{heading}", "extraction", [f"{ask}\n\n{listing}"])


def doc_code(roots: Roots) -> Iterator[dict]:
    for page, heading, blocks in hash_order(doc_sections(roots.docs()), key=lambda s: "code" + s[0] + s[1]):
        for index, (kind, text) in enumerate(blocks):
            source = f"python-docs/{page}#{heading}/{index}"
            if kind == "code" and 3 <= text.count("\n") + 1 <= 40:
                ask = pick(("Explain what this Python code does, step by step:", "What does this code print, and why?",
                            "Can you walk me through this snippet?", "How could this code be improved?"), source)
                yield row(source, "code", [f"{ask}\n\n```python\n{text}\n```"])
            elif kind == "api" and len(text) > 80:
                signature, _, meaning = text.partition("\n")
                ask = pick(("Show me a short example that uses `{s}`, and explain it.",
                            "How do I use `{s}` in Python? Give me a small working example.",
                            "Write a small function that makes good use of `{s}`."), source)
                yield row(source, "code", [ask.format(s=signature.strip())], reference=meaning)


def doc_knowledge(roots: Roots) -> Iterator[dict]:
    """The FAQs' own questions, then topics of the language reference."""
    faq = ((f"python-docs/{page}#{heading}", heading, prose_of(blocks)) for page, heading, blocks
           in doc_sections(roots.docs()) if page.startswith("faq/") and heading.endswith("?"))
    reference = ((f"pydoc/{title}", pick(("Explain {t} in Python.", "How does Python handle {t}? Keep it practical.",
                                          "What should I know about {t} in Python?"), title).format(t=title.strip('"')
                                                                                                   .replace('"', '')),
                  clip(text, 800)) for title, text in topics(roots))
    for source, question, answer in _alternate(faq, reference, every=2):
        yield row(source, "knowledge", [question], reference=answer)


def doc_writing(roots: Roots) -> Iterator[dict]:
    for page, heading, blocks in hash_order(doc_sections(roots.docs()), key=lambda s: "writing" + s[0] + s[1]):
        if not page.startswith(("tutorial/", "howto/", "faq/", "using/")):
            continue
        text = prose_of(blocks, 900)
        if len(text) >= 300:
            ask = pick(("Rewrite this for a blog post aimed at beginners, in a friendly tone:",
                        "Turn these notes into a short lesson plan for a Python class:",
                        "Write a short, upbeat newsletter item based on this:",
                        "Rephrase this so that a non-programmer can follow it:"), page, heading)
            yield row(f"python-docs/{page}#{heading}", "writing", [f"{ask}\n\n{text}"])


def doc_documents(roots: Roots) -> Iterator[str]:
    sections = (f"{heading}\n\n" + clip("\n\n".join(text if kind == "para" else f"```python\n{text}\n```"
                                                     if kind == "code" else text for kind, text in blocks),
                                         DOCUMENT_CHARS)
                for page, heading, blocks in doc_sections(roots.docs()))
    reference = (f"{title}\n\n{clip(text, DOCUMENT_CHARS)}" for title, text in topics(roots))
    for text in _alternate(sections, reference, every=6):
        if len(text) >= 300:
            yield text


DOC_ROWS = {"summarization": doc_summaries, "rag": doc_rag, "extraction": doc_extraction, "code": doc_code,
            "knowledge": doc_knowledge, "writing": doc_writing}
