"""Real text from installed packages, read as plain units: passages, parallel pairs, conversations, definitions.

Every reader takes the folder it reads (so tests hand it small fixtures), walks its files in sorted
order and yields plain tuples; nothing is imported or run. data/real.py turns the units into rows.
  man pages        /usr/share/man (Debian `manpages`, `manpages-de` ...): roff stripped to paragraphs; a page
                   translated under man/<lang>/ is aligned paragraph by paragraph with the English one
  Python docs      the reStructuredText sources of the Python documentation (Debian `python3.X-doc`,
                   /usr/share/doc/python3.X/html/_sources) and `pydoc_data.topics` (in every Python)
  catalogues       gettext .po/.mo files (/usr/share/locale, and `locale/` folders of installed Python
                   packages such as Django and Sphinx): (English message, translation) pairs
  chat             chatterbot-corpus's YAML dialogues (PyPI `chatterbot-corpus`), in two dozen languages
  WordNet          Princeton WordNet's data files (Debian `wordnet-base`): word senses with glosses and examples
  fortunes         fortune files (Debian `fortunes`, `fortunes-de` ...): sayings, jokes and short poems
"""

from __future__ import annotations

import ast
import gzip
import re
import struct
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Roots:
    """Where each source is read from (tests pass folders of small fixtures)."""
    man: Path = Path("/usr/share/man")
    python_docs: Path | None = None
    locale: Path = Path("/usr/share/locale")
    packages: tuple[Path, ...] = field(default_factory=lambda: (Path(sysconfig.get_paths()["purelib"]),))
    wordnet: Path = Path("/usr/share/wordnet")
    fortunes: Path = Path("/usr/share/games/fortunes")

    def docs(self) -> Path | None:
        """The Python documentation's reST sources: this Python's version first, else the newest installed."""
        if self.python_docs is not None:
            return self.python_docs if self.python_docs.is_dir() else None
        minor = f"{sys.version_info.major}.{sys.version_info.minor}"
        found = sorted(Path("/usr/share/doc").glob("python3*/html/_sources"), key=lambda p: (minor not in str(p), p))
        return found[0] if found else None

    def chat(self) -> Path | None:
        """chatterbot-corpus's data folder, if installed."""
        return next((root / "chatterbot_corpus" / "data" for root in self.packages
                     if (root / "chatterbot_corpus" / "data").is_dir()), None)


# --------------------------------------------------------------------------- man pages (roff)
ROFF_SPECIALS = {"em": "—", "en": "–", "aq": "'", "dq": '"', "lq": "“", "rq": "”", "oq": "‘", "cq": "’",
                 "bu": "•", "co": "©", "rg": "®", "tm": "™", "ha": "^", "ti": "~", "rs": "\\", "mi": "-", "pl": "+",
                 "mu": "×", "di": "÷", "<=": "≤", ">=": "≥", "!=": "≠", "->": "→", "<-": "←", "Fo": "«", "Fc": "»",
                 "hy": "-", "lh": "☜", "rh": "☞", "de": "°", "ct": "¢", "sc": "§", "ga": "`", "aa": "´", "R": "®",
                 "Tm": "™"}
ROFF_ESCAPE = re.compile(r"""\\(?:f(?:\[[^\]]*\]|\(..|.)|\((..)|\[([^\]]*)\]|\*(?:\((..)|\[([^\]]*)\]|(.))|s[-+]?\d+|
                             (["\-e&,/ ~0|^c.'%:!`]))""", re.X)
ROFF_PLAIN = {"-": "-", "e": "\\", " ": " ", "~": " ", "0": " ", ".": ".", "'": "'", "`": "`", "!": ""}
FONT_MACROS = {"B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "SM", "SB", "CW"}
BREAK_MACROS = {"PP", "P", "LP", "HP", "IP", "TP", "TQ", "sp", "RS", "RE", "in", "SH", "SS", "nf", "fi", "EX", "EE",
                "ne", "bp", "TH"}
ARGUMENT = re.compile(r'"([^"]*)"|(\S+)')
MAN_BOILERPLATE = {"AUTHOR", "AUTHORS", "COPYRIGHT", "REPORTING BUGS", "SEE ALSO", "COLOPHON", "NAME", "SYNOPSIS"}


def roff_text(line: str) -> str:
    """One roff input line as plain text (fonts dropped, special characters and strings spelled out)."""
    line = line.split('\\"', 1)[0]

    def replace(match: re.Match) -> str:
        special = match.group(1) or match.group(2) or match.group(3) or match.group(4) or match.group(5)
        if special is not None:
            return ROFF_SPECIALS.get(special, "")
        plain = match.group(6)
        return ROFF_PLAIN.get(plain, "") if plain else ""

    return ROFF_ESCAPE.sub(replace, line)


def roff_blocks(source: str) -> list[tuple[str, str, str, str]]:
    """A man page as (section heading, kind, tag, text) blocks: kind "para" (prose; `tag` is the term of a .TP/.IP
    item, such as an option) or "example" (.nf/.EX text kept line by line). mdoc pages (BSD style) give none."""
    if "\n.Sh " in source and "\n.SH" not in source:
        return []
    blocks, lines, section, tag, kind = [], [], "", "", "para"
    want_tag = want_heading = False

    def flush():
        nonlocal lines, tag
        text = ("\n" if kind == "example" else " ").join(lines).strip()
        if text:
            blocks.append((section, kind, tag, re.sub(r"[ \t]+", " ", text) if kind == "para" else text))
        lines, tag = [], ""

    for raw in source.splitlines():
        if raw.startswith((".\\\"", "'\\\"", '.\\"')) or raw.strip() in (".", "'"):
            continue
        if raw.startswith((".", "'")) and len(raw) > 1:
            macro, _, args = raw[1:].strip().partition(" ")
            if macro in FONT_MACROS:
                parts = [roff_text(a or b) for a, b in ARGUMENT.findall(args)]
                text = ("" if len(macro) == 2 else " ").join(parts)
            elif macro in BREAK_MACROS:
                flush()
                if macro in ("SH", "SS"):
                    section = roff_text(args.strip().strip('"')).strip()
                    want_heading = not section
                kind = "example" if macro in ("nf", "EX") else "para" if macro in ("fi", "EE") else kind
                want_tag = macro in ("TP", "TQ")
                if macro == "IP" and args:
                    tag = roff_text(ARGUMENT.findall(args)[0][0] or ARGUMENT.findall(args)[0][1])
                continue
            elif macro == "br":
                lines.append("\n" if kind == "para" else "")
                continue
            else:
                continue
        else:
            text = roff_text(raw)
        if want_heading:
            section, want_heading = text.strip(), False
        elif want_tag:
            tag, want_tag = text.strip(), False
        else:
            lines.append(text)
    flush()
    return blocks


def read_man_page(path: Path) -> str:
    """The roff source of a (possibly gzipped) man page; "" for a `.so` redirect to another page."""
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = data.decode("utf-8", errors="replace")
    return "" if text.lstrip().startswith(".so ") else text


def man_pages(root: Path, language: str = "") -> Iterator[tuple[str, list]]:
    """(page, blocks) for the man pages of `language` ("" = English, else man/<language>/), sorted; `page` is
    `section/name`, e.g. `man1/ls.1`."""
    base = root / language if language else root
    for path in sorted(base.glob("man*/*")):
        if not path.is_file():
            continue
        page = f"{path.parent.name}/{path.name.removesuffix('.gz')}"
        try:
            blocks = roff_blocks(read_man_page(path))
        except (OSError, EOFError, ValueError):  # a broken gzip member
            continue
        if blocks:
            yield page, blocks


def man_languages(root: Path) -> list[str]:
    """Languages with translated man pages under `root` (folders like de/, pt_BR/ holding man1/ ...)."""
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("man")
                  and any(p.glob("man*/*"))) if root.is_dir() else []


def aligned_paragraphs(english: list, translated: list) -> list[tuple[str, str, str]]:
    """(section, English text, translated text) for prose blocks that line up: the whole page when both hold as many
    blocks, else each section whose block counts agree (sections matched by position). Untranslated or short
    blocks are left out, and so are the boilerplate sections (authors, copyright, where to report bugs).
    Translations add a section of their own at the end, so sections are matched from the first."""
    def sections(blocks):
        grouped: list[list] = []
        for block in blocks:
            if not grouped or block[0] != grouped[-1][0][0]:
                grouped.append([])
            grouped[-1].append(block)
        return grouped

    if len(english) == len(translated):
        pairs = list(zip(english, translated))
    else:
        ours, theirs = sections(english), sections(translated)
        pairs = [pair for a, b in zip(ours, theirs) if len(a) == len(b) for pair in zip(a, b)]
    return [(a[0], a[3], b[3]) for a, b in pairs if a[1] == b[1] == "para" and a[0] not in MAN_BOILERPLATE
            and len(a[3]) >= 40 and len(b[3]) >= 30 and a[3] != b[3]]


# --------------------------------------------------------------------------- Python documentation (reST)
HEADING_UNDERLINE = re.compile(r"^([=\-~^*#+\"'`])\1{2,}\s*$")
ROLE = re.compile(r":[\w:.-]+:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`")
LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`__?")
PROSE_DIRECTIVES = {"note", "warning", "seealso", "versionadded", "versionchanged", "deprecated", "tip", "important",
                    "attention", "caution", "hint", "impl-detail"}
API_DIRECTIVES = {"function", "method", "class", "attribute", "data", "exception", "decorator", "classmethod",
                  "staticmethod", "coroutinefunction", "coroutinemethod", "property", "describe", "opcode", "cmdoption"}
CODE_DIRECTIVES = {"code-block", "sourcecode", "doctest", "testcode", "code"}


def rst_inline(text: str) -> str:
    """reST inline markup as plain text: roles and links by their words, ``literals`` as `literals`."""
    text = ROLE.sub(lambda m: f"`{m.group(1).strip()}`", text)
    text = LINK.sub(r"\1", text).replace("``", "`")
    return re.sub(r"\[#[\w-]*\]_|\|(\w+)\|", "", text)


def rst_sections(source: str) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """(heading, [(kind, text)]) per section of a reST page; kind "para" (prose), "code" (a literal block or code
    directive) or "api" (a `.. function::` and such: text = signature, then its description)."""
    lines = source.splitlines() + [""]
    heading, blocks, index = "", [], 0
    paragraph: list[str] = []

    def end_paragraph():
        if paragraph:
            text = rst_inline(" ".join(line.strip() for line in paragraph))
            literal = text.endswith("::")
            blocks.append(("para", text[:-1] if literal and not text.endswith(" ::") else text.removesuffix(" ::")))
            paragraph.clear()
            return literal
        return False

    while index < len(lines):
        line = lines[index]
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if line.strip() and HEADING_UNDERLINE.match(following) and len(following.strip()) >= len(line.strip()) - 1 \
                and not line.startswith(" "):
            end_paragraph()
            if blocks:
                yield heading, blocks
            heading, blocks = rst_inline(line.strip()), []
            index += 2
            continue
        if HEADING_UNDERLINE.match(line):  # an overline or a transition
            index += 1
            continue
        directive = re.match(r"^\.\. ([\w-]+)::\s*(.*)$", line)
        if line.strip() == "" and paragraph:
            if end_paragraph():
                body, index = _indented(lines, index + 1)
                blocks.append(("code", body)) if body else None
                continue
        elif directive and not line.startswith(" "):
            end_paragraph()
            name, argument = directive.groups()
            body, index = _indented(lines, index + 1)
            body = "\n".join(l for l in body.splitlines() if not re.match(r"^\s*:[\w-]+:", l)).strip()
            if name in CODE_DIRECTIVES and body:
                blocks.append(("code", body))
            elif name in API_DIRECTIVES and argument:
                blocks.append(("api", rst_inline(f"{argument}\n{' '.join(body.split())}".strip())))
            elif name in PROSE_DIRECTIVES and (body or argument):
                blocks.append(("para", rst_inline(" ".join(f"{argument} {body}".split()))))
            continue
        elif line.strip() and not line.startswith(".. ") and not (line.startswith(" ") and not paragraph):
            paragraph.append(line)
        elif line.startswith(".. "):  # a comment, a target or a substitution
            end_paragraph()
        index += 1
    end_paragraph()
    if blocks:
        yield heading, blocks


def _indented(lines: list[str], index: int) -> tuple[str, int]:
    """The indented block starting at `index` (blank lines inside kept), dedented; and the index after it."""
    body = []
    while index < len(lines) and (not lines[index].strip() or lines[index].startswith((" ", "\t"))):
        body.append(lines[index])
        index += 1
    import textwrap

    return textwrap.dedent("\n".join(body)).strip("\n"), index


def python_doc_pages(root: Path, skip: set[str] = frozenset()) -> Iterator[tuple[str, list]]:
    """(page, sections) of the reST sources under `root` (…/html/_sources), sorted; pages named in `skip`
    (relative paths without .rst.txt, e.g. library/csv) are left out."""
    for path in sorted(root.rglob("*.rst.txt")):
        page = str(path.relative_to(root)).removesuffix(".rst.txt")
        if page in skip:
            continue
        yield page, list(rst_sections(path.read_text(encoding="utf-8", errors="replace")))


def pydoc_topics() -> dict[str, str]:
    """Python's language reference as prose, by topic (`pydoc_data.topics`, shipped with every CPython)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return {}
    return dict(sorted(topics.items()))


# --------------------------------------------------------------------------- gettext catalogues
def read_po(path: Path) -> Iterator[tuple[str, str]]:
    """(msgid, msgstr) of a .po file, fuzzy entries and plurals left out."""
    entry: dict[str, str] = {}
    key, fuzzy = None, False
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines() + [""]:
        line = line.strip()
        if not line:
            if entry.get("msgid") and entry.get("msgstr") and not fuzzy:
                yield entry["msgid"], entry["msgstr"]
            entry, key, fuzzy = {}, None, False
        elif line.startswith("#,") and "fuzzy" in line:
            fuzzy = True
        elif line.startswith(("msgid ", "msgstr ", "msgctxt ", "msgid_plural ", "msgstr[")):
            key, _, value = line.partition(" ")
            entry[key] = _po_string(value)
        elif line.startswith('"') and key:
            entry[key] = entry.get(key, "") + _po_string(line)
    return


def _po_string(value: str) -> str:
    try:
        return ast.literal_eval(value) if value.startswith('"') else ""
    except (ValueError, SyntaxError):
        return ""


def read_mo(path: Path) -> Iterator[tuple[str, str]]:
    """(msgid, msgstr) of a compiled .mo catalogue, the header and plural forms left out."""
    data = path.read_bytes()
    if len(data) < 28:
        return
    order = "<" if data[:4] == b"\xde\x12\x04\x95" else ">" if data[:4] == b"\x95\x04\x12\xde" else None
    if order is None:
        return
    count, originals, translations = struct.unpack(order + "3I", data[8:20])
    for i in range(count):
        length, offset = struct.unpack(order + "2I", data[originals + 8 * i:originals + 8 * i + 8])
        msgid = data[offset:offset + length]
        length, offset = struct.unpack(order + "2I", data[translations + 8 * i:translations + 8 * i + 8])
        msgstr = data[offset:offset + length]
        if msgid and b"\x00" not in msgid and b"\x04" not in msgid:
            yield msgid.decode("utf-8", "replace"), msgstr.decode("utf-8", "replace")


def catalogue_files(root: Path) -> list[tuple[str, str, Path]]:
    """(domain, language, path) of the catalogues under `root` (…/<lang>/LC_MESSAGES/<domain>.po|.mo), a .po
    preferred to the .mo beside it, sorted."""
    found = {}
    for path in sorted(root.rglob("LC_MESSAGES/*.[mp]o")):
        language = path.parent.parent.name
        where = [part for part in path.relative_to(root).parts[:-3] if part != "locale"]
        domain = "/".join(where + [path.stem])
        found.setdefault((domain, language), path)
        if path.suffix == ".po":
            found[(domain, language)] = path
    return [(domain, language, path) for (domain, language), path in sorted(found.items())]


def catalogue_pairs(root: Path) -> Iterator[tuple[str, str, str, str]]:
    """(domain, language, English message, translation) from every catalogue under `root`."""
    for domain, language, path in catalogue_files(root):
        reader = read_po if path.suffix == ".po" else read_mo
        try:
            for msgid, msgstr in reader(path):
                yield domain, language, msgid, msgstr
        except (OSError, struct.error):
            continue


# --------------------------------------------------------------------------- chat, WordNet, fortunes
def chat_dialogues(root: Path) -> Iterator[tuple[str, str, list[str]]]:
    """(language, file, turns) of every chatterbot-corpus dialogue under `root` (…/chatterbot_corpus/data)."""
    import yaml

    for path in sorted(root.glob("*/*.yml")):
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace")) or {}
        except yaml.YAMLError:
            continue
        for turns in loaded.get("conversations") or []:
            turns = [str(t).strip() for t in turns if isinstance(t, (str, int, float)) and str(t).strip()]
            if len(turns) >= 2:
                yield path.parent.name, path.stem, turns


def wordnet_senses(root: Path) -> Iterator[tuple[str, str, list[str], str, list[str]]]:
    """(part of speech, offset, words, gloss, examples) of every synset in WordNet's data.* files under `root`."""
    for pos in ("noun", "verb", "adj", "adv"):
        path = root / f"data.{pos}"
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(" ") or "|" not in line:
                continue
            fields, _, gloss = line.partition("|")
            parts = fields.split()
            count = int(parts[3], 16)
            words = [parts[4 + 2 * i].replace("_", " ") for i in range(count)]
            pieces = [piece.strip() for piece in gloss.split(";")]
            examples = [p.strip('"') for p in pieces if p.startswith('"')]
            definition = "; ".join(p for p in pieces if not p.startswith('"'))
            yield pos, parts[0], [re.sub(r"\(\w+\)$", "", w) for w in words], definition, examples


def fortunes(root: Path, skip: set[str] = frozenset()) -> Iterator[tuple[str, str, str]]:
    """(language, file, text) of every fortune under `root` (English files at the top, others in <lang>/ folders);
    files named in `skip` are left out."""
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix in (".dat", ".u8") or path.name in skip or path.is_symlink():
            continue
        language = path.parent.name if path.parent != root else "en"
        text = path.read_text(encoding="utf-8", errors="replace")
        for fortune in text.split("\n%\n"):
            fortune = fortune.strip().strip("%").strip()
            if fortune:
                yield language, path.name, fortune
