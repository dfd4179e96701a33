"""builtin:real and its sources: readers on small fixtures, rows of every category, determinism, the cache, the
fallback, disjointness from the evaluation prompts; and (when installed) the real packages."""

import gzip
import json
import struct
from pathlib import Path

import pytest

from draftsmith.data import package_texts as texts
from draftsmith.data import real
from draftsmith.data.general import CATEGORIES
from draftsmith.data.package_texts import Roots
from draftsmith.data.regenerate import PENDING
from draftsmith.data.templates import normalize_row
from draftsmith.errors import DraftsmithError

LS_EN = r""".\" a comment
.TH LS "1" "September 2022" "GNU coreutils 9.1" "User Commands"
.SH NAME
ls \- list directory contents
.SH SYNOPSIS
.B ls
[\fI\,OPTION\/\fR]... [\fI\,FILE\/\fR]...
.SH DESCRIPTION
.PP
List information about the FILEs (the current directory by default).
Sort entries alphabetically if none of \fB\-cftuvSUX\fR nor \fB\-\-sort\fR is specified.
.PP
Mandatory arguments to long options are mandatory for short options too, which is how every tool here works.
.TP
\fB\-a\fR, \fB\-\-all\fR
do not ignore entries starting with a dot, so hidden files are listed
.TP
\fB\-A\fR, \fB\-\-almost\-all\fR
do not list the implied entries for the current and the parent directory
.TP
\fB\-\-author\fR
with \fB\-l\fR, print the author of each file in the long listing
.PP
The SIZE argument is an integer and optional unit (example: 10K is 10*1024). Units are K, M, G, T, P, E, Z, Y
(powers of 1024) or KB, MB, ... (powers of 1000). Binary prefixes can be used, too: KiB=K, MiB=M, and so on.
The TIME_STYLE argument can be full\-iso, long\-iso, iso, locale, or +FORMAT, interpreted like in date.
.SH AUTHOR
Written by Richard M. Stallman and David MacKenzie.
"""
LS_DE = r""".TH LS 1 "September 2022" "GNU coreutils 9.1" "Dienstprogramme für Benutzer"
.SH BEZEICHNUNG
ls \- Verzeichnisinhalte auflisten
.SH ÜBERSICHT
\fBls\fP [\fI\,OPTION\/\fP]… [\fI\,DATEI\/\fP]…
.SH BESCHREIBUNG
.PP
Auflistung von Informationen über die DATEIen (Standardvorgabe ist das aktuelle Verzeichnis). Die Einträge
werden alphabetisch sortiert, falls weder \fB\-cftuvSUX\fP noch \fB\-\-sort\fP angegeben wurden.
.PP
Die obligatorischen Argumente für Optionen sind für deren Kurz\- und Langform gleich, wie bei jedem Werkzeug hier.
.TP
\fB\-a\fP, \fB\-\-all\fP
Einträge nicht ignorieren, die mit einem Punkt beginnen, so dass versteckte Dateien erscheinen
.TP
\fB\-A\fP, \fB\-\-almost\-all\fP
Die impliziten Einträge für das aktuelle und das übergeordnete Verzeichnis nicht auflisten
.TP
\fB\-\-author\fP
Mit \fB\-l\fP den Autor jeder Datei in der langen Auflistung ausgeben
.PP
Das Argument GRÖSSE ist eine Ganzzahl und eine optionale Einheit (Beispiel: 10K ist 10*1024). Einheiten sind
K, M, G, T, P, E, Z, Y (Potenzen von 1024) oder KB, MB, … (Potenzen von 1000).
.SH AUTOR
Geschrieben von Richard M. Stallman und David MacKenzie.
.SH ÜBERSETZUNG
Die deutsche Übersetzung dieser Handbuchseite wurde von Karl Eichwalder erstellt.
"""
DOC = """:mod:`shelfish` --- Keep things on a shelf
=========================================

.. module:: shelfish
   :synopsis: Keep things.

The :mod:`shelfish` module keeps Python objects on a shelf, so that a program can put them away and find them
again later, even after it has been restarted. It is a small module, written for this test, and it says so.

A first example::

    >>> import shelfish
    >>> shelf = shelfish.open("things")
    >>> shelf["key"] = [1, 2, 3]

Functions
---------

.. function:: open(name, flag='c', protocol=None)

   Open a persistent shelf called *name* and return it. The *flag* argument is passed on to the
   underlying database, and *protocol* is the pickle protocol used for the values.

.. function:: close(shelf)

   Close the *shelf* and write everything that is still pending to the disk before returning.

A shelf keeps every value in a separate record, keyed by a string, and reads it back lazily the first time
a key is looked up, which keeps start-up fast even for a very large shelf with many thousands of keys.
"""
FAQ = """How do I keep my shelf small?
-----------------------------

Delete the keys you no longer need and reorganise the file now and then; a shelf never shrinks on its own,
because deleted records leave holes that are only filled by later writes of a similar size.
"""


def write_mo(path: Path, pairs: list[tuple[str, str]]) -> None:
    """A little-endian .mo catalogue of `pairs` (with the empty header entry first, as msgfmt writes it)."""
    pairs = sorted([("", "Content-Type: text/plain; charset=UTF-8\n")] + pairs)
    ids, strs = [p[0].encode() for p in pairs], [p[1].encode() for p in pairs]
    start = 28 + 16 * len(pairs)
    offsets, data = [], b""
    for item in ids + strs:
        offsets.append((len(item), start + len(data)))
        data += item + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, len(pairs), 28, 28 + 8 * len(pairs), 0, 0)
    table = b"".join(struct.pack("<2I", *o) for o in offsets)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + table + data)


MESSAGES = [("Enter a valid email address, please.", "Bitte eine gültige E-Mail-Adresse eingeben."),
            ("The file could not be saved because the disk is full.", "Die Datei konnte nicht gespeichert werden, "
             "weil der Datenträger voll ist."), ("Ok", "Ok"), ("Open", "Öffnen"),
            ("Your password must contain at least eight characters.", "Ihr Passwort muss mindestens acht Zeichen "
             "enthalten."), ("Select the items you want to delete from the list.", "Wählen Sie die Einträge aus, "
             "die Sie aus der Liste löschen möchten."), ("There are no results for your search today.",
             "Für Ihre Suche gibt es heute keine Ergebnisse."), ("Please check the form for errors below.",
             "Bitte prüfen Sie das Formular unten auf Fehler.")]


@pytest.fixture
def roots(tmp_path) -> Roots:
    """Every source, a few units each, in tmp_path."""
    man = tmp_path / "man"
    for path, text in ((man / "man1" / "ls.1.gz", LS_EN), (man / "de" / "man1" / "ls.1.gz", LS_DE),
                       (man / "man1" / "grep.1", LS_EN.replace("ls", "grep").replace("LS", "GREP"))):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(text.encode()) if path.suffix == ".gz" else text.encode())
    docs = tmp_path / "docs" / "_sources"
    (docs / "library").mkdir(parents=True)
    (docs / "library" / "shelfish.rst.txt").write_text(DOC)
    (docs / "faq").mkdir()
    (docs / "faq" / "shelves.rst.txt").write_text(FAQ)
    write_mo(tmp_path / "locale" / "de" / "LC_MESSAGES" / "app.mo", MESSAGES)
    site = tmp_path / "site"
    po = site / "webkit" / "locale" / "fr" / "LC_MESSAGES" / "webkit.po"
    po.parent.mkdir(parents=True)
    po.write_text('msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                  '#, fuzzy\nmsgid "This translation is not finished yet."\nmsgstr "Pas fini."\n\n'
                  'msgid "The page you asked for "\n"could not be found on this server."\n'
                  'msgstr "La page demandée est introuvable "\n"sur ce serveur."\n')
    chat = site / "chatterbot_corpus" / "data" / "english"
    chat.mkdir(parents=True)
    chat.joinpath("greetings.yml").write_text("categories:\n- greetings\nconversations:\n- - Hello, how are you?\n"
                                              "  - I am fine, thanks.\n  - What did you do today?\n  - I read.\n")
    wordnet = tmp_path / "wordnet"
    wordnet.mkdir()
    wordnet.joinpath("data.noun").write_text(
        "  1 This software and database is being provided to you\n"
        "00058743 04 n 02 escape 0 flight 1 010 @ 00046177 n 0000 | the act of escaping physically; "
        "\"he made his escape from the mental hospital\"  \n"
        "00059127 04 n 01 evasion 0 005 @ 00058743 n 0000 | the act of physically escaping from something by "
        "some adroit maneuver  \n")
    fortunes = tmp_path / "fortunes"
    (fortunes / "de").mkdir(parents=True)
    fortunes.joinpath("cookie").write_text("A clean desk is a sign of a cluttered drawer, or so they tell me.\n%\n"
                                           "Never put off until tomorrow what you can do the day after.\n%\n")
    fortunes.joinpath("cookie.dat").write_bytes(b"\0\1binary")
    (fortunes / "de" / "sprueche").write_text("Wer anderen eine Grube gräbt, fällt selbst hinein, sagt man.\n%\n")
    return Roots(man=man, python_docs=docs, locale=tmp_path / "locale", packages=(site,), wordnet=wordnet,
                 fortunes=fortunes)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))


# --------------------------------------------------------------------------- readers
def test_roff_blocks_are_plain_text_with_sections_and_option_tags():
    blocks = texts.roff_blocks(LS_EN)
    assert blocks[0] == ("NAME", "para", "", "ls - list directory contents")
    assert ("DESCRIPTION", "para", "-a, --all", "do not ignore entries starting with a dot, so hidden files are "
            "listed") in blocks
    description = [b[3] for b in blocks if b[0] == "DESCRIPTION" and not b[2]]
    assert description[0].startswith("List information about the FILEs") and "-cftuvSUX nor --sort" in description[0]
    assert not any("\\f" in b[3] or "\\-" in b[3] for b in blocks)
    assert texts.roff_blocks(".Dd May 1\n.Sh NAME\n.Nm ls\n") == []  # mdoc pages are left alone


def test_a_translated_page_aligns_paragraph_by_paragraph_despite_its_extra_section():
    pairs = texts.aligned_paragraphs(texts.roff_blocks(LS_EN), texts.roff_blocks(LS_DE))
    assert len(pairs) == 6 and all(section == "DESCRIPTION" for section, _, _ in pairs)
    assert pairs[2] == ("DESCRIPTION", "do not ignore entries starting with a dot, so hidden files are listed",
                        "Einträge nicht ignorieren, die mit einem Punkt beginnen, so dass versteckte Dateien erscheinen")


def test_rst_sections_hold_prose_code_and_api_entries():
    sections = dict(texts.rst_sections(DOC))
    first = sections["`shelfish` --- Keep things on a shelf"]
    assert first[0][0] == "para" and first[0][1].startswith("The `shelfish` module keeps Python objects")
    assert ("para", "A first example:") in first and ("code", '>>> import shelfish\n>>> shelf = shelfish.open('
                                                               '"things")\n>>> shelf["key"] = [1, 2, 3]') in first
    functions = sections["Functions"]
    assert [kind for kind, _ in functions] == ["api", "api", "para"]
    assert functions[0][1].startswith("open(name, flag='c', protocol=None)\nOpen a persistent shelf")


def test_po_and_mo_catalogues_read_translated_messages(roots):
    mo = dict(texts.read_mo(roots.locale / "de" / "LC_MESSAGES" / "app.mo"))
    assert mo == dict(MESSAGES)
    po = list(texts.read_po(roots.packages[0] / "webkit" / "locale" / "fr" / "LC_MESSAGES" / "webkit.po"))
    assert po == [("The page you asked for could not be found on this server.",
                   "La page demandée est introuvable sur ce serveur.")]  # header and fuzzy entry left out
    assert [(d, lang) for d, lang, _ in texts.catalogue_files(roots.packages[0])] == [("webkit/webkit", "fr")]


# --------------------------------------------------------------------------- rows
def test_every_source_gives_rows_of_its_categories_awaiting_the_target(roots):
    for name, source in real.SOURCES.items():
        rows = list(real.source_rows(name, roots, 200))
        assert rows, name
        assert {row["category"] for row in rows} <= set(source.rows) <= set(CATEGORIES)
        for row in rows:
            messages = normalize_row(row)
            assert [m["role"] for m in messages][::2] == ["user"] * (len(messages) // 2)
            assert all(m["content"] == PENDING for m in messages[1::2])
    manpages = list(real.source_rows("manpages", roots, 200))
    assert set(real.SOURCES["manpages"].rows) == {row["category"] for row in manpages}
    translations = [row for row in manpages if row["category"] == "translation"]
    pairs = texts.aligned_paragraphs(texts.roff_blocks(LS_EN), texts.roff_blocks(LS_DE))
    chunks = [tuple("\n\n".join(p[i] for p in pairs[start:start + 3]) for i in (1, 2)) for start in (0, 3)]
    assert len(translations) == 2
    for row in translations:  # the real translation is the reference, whichever way the row asks
        body = row["messages"][0]["content"].split("\n\n", 1)[1]
        assert (body, row["reference"]) in chunks + [chunk[::-1] for chunk in chunks]
    catalogue = list(real.source_rows("catalogs", roots, 200))
    assert {row["language"] for row in catalogue} <= {"de", "fr", "en"} and len(catalogue) >= 3
    assert any("Bitte eine gültige E-Mail-Adresse eingeben." in row["reference"] for row in catalogue)
    assert not any("Pas fini" in json.dumps(row) for row in catalogue)  # fuzzy translations stay out
    docs = list(real.source_rows("python-docs", roots, 200))
    assert {"code", "extraction", "summarization", "knowledge"} <= {row["category"] for row in docs}
    assert any(row["messages"][0]["content"] == "How do I keep my shelf small?" for row in docs)


def test_same_files_give_the_same_file_and_a_changed_file_a_new_one(roots, tmp_path, monkeypatch):
    first = real.corpus_path("real", roots)
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "other"))
    second = real.corpus_path("real", roots)
    assert first != second and first.name == second.name and first.read_bytes() == second.read_bytes()
    (roots.fortunes / "cookie").write_text("Something else entirely was written in this fortune file today.\n")
    assert real.corpus_path("real", roots).name != first.name


def test_builtin_real_covers_every_category_and_fills_the_rest_from_templates(roots):
    rows = [json.loads(line) for line in real.corpus_path("real", roots).read_text().splitlines()]
    assert {row["category"] for row in rows} == set(CATEGORIES)
    from_templates = {row["category"] for row in rows if row["source"].startswith("builtin:general/")}
    assert from_templates == {"math"}  # the fixtures cover everything else (fortunes: reasoning)
    assert len({row["messages"][0]["content"] for row in rows}) == len(rows)
    documents = [json.loads(line) for line in real.corpus_path("real-text", roots).read_text().splitlines()]
    assert {d["source"] for d in documents} == set(real.SOURCES) and all(normalize_row(d) for d in documents)


def test_a_missing_package_is_named_with_what_installs_it(roots, capsys):
    bare = Roots(man=roots.man, python_docs=roots.python_docs, locale=Path("/nonexistent"), packages=(),
                 wordnet=Path("/nonexistent"), fortunes=Path("/nonexistent"))
    with pytest.raises(DraftsmithError, match="wordnet-base"):
        list(real.source_rows("wordnet", bare))
    rows = [json.loads(line) for line in real.corpus_path("real", bare).read_text().splitlines()]
    notice = capsys.readouterr().err
    assert "4 of 6 sources" in notice and "pip install chatterbot-corpus" in notice and "make setup" in notice
    from_templates = {row["category"] for row in rows if row["source"].startswith("builtin:general/")}
    assert from_templates == {"math", "roleplay", "reasoning"}


def test_rows_that_share_text_with_an_evaluation_prompt_are_left_out(roots, monkeypatch):
    held_out = "Explain the rules of the little shelf game that my grandmother taught me when I was young."
    monkeypatch.setattr(real, "evaluation_turns", lambda: [held_out])
    real.held_out_shingles.cache_clear()
    (roots.fortunes / "cookie").write_text(f"{held_out}\n%\nA short saying that no evaluation prompt holds, surely.\n")
    try:
        rows = list(real.source_rows("fortunes", roots))
        assert rows and not any("grandmother" in json.dumps(row) for row in rows)
    finally:
        real.held_out_shingles.cache_clear()


# --------------------------------------------------------------------------- the real packages, when installed
def installed_sources() -> list[str]:
    return [name for name, source in real.SOURCES.items() if source.present(Roots())]


@pytest.mark.skipif(len(installed_sources()) < len(real.SOURCES),
                    reason="needs every source's package (make setup installs them)")
def test_real_packages_give_every_category_and_no_evaluation_prompt():
    roots = Roots()
    rows = [row for name in ("manpages", "chat", "fortunes", "wordnet") for row in real.source_rows(name, roots, 60)]
    assert {"summarization", "extraction", "rag", "knowledge", "writing", "translation", "roleplay",
            "reasoning"} <= {row["category"] for row in rows}
    assert len({row["language"] for row in rows}) >= 5
    held_out = real.held_out_shingles()
    assert len(held_out) > 1000  # the suite and the prompt sets were read
    assert not any(real.shares_shingle(" ".join(m["content"] for m in row["messages"]), held_out) for row in rows)
    turns = {turn.strip() for turn in real.evaluation_turns()}
    assert not any(m["content"].strip() in turns for row in rows for m in row["messages"])


# --------------------------------------------------------------------------- the diversity report
def test_language_guess_from_script_and_stop_words():
    from draftsmith.data.diversity import guess_language

    assert guess_language("The cat sat on the mat and it was happy with that.") == "en"
    assert guess_language("Die Katze sitzt auf der Matte und ist nicht unglücklich, das ist gut.") == "de"
    assert guess_language("Le chat est sur le tapis et il ne veut pas bouger pour le moment.") == "fr"
    assert guess_language("El gato está en la alfombra y no se quiere mover de ahí por el momento.") == "es"
    assert guess_language("Кот сидит на ковре и никуда не хочет уходить.") == "ru"
    assert guess_language("Кіт сидить на килимі і нікуди не хоче йти.") == "uk"
    assert guess_language("猫はマットの上に座っています。") == "ja" and guess_language("猫坐在垫子上。") == "zh"
    assert guess_language("12345 !!!") == "und"


def test_diversity_counts_distinct_ngrams_of_trainable_tokens_per_input():
    from draftsmith.data.diversity import corpus_diversity, diversity_of

    rows = [([9, 1, 2, 1, 2], [0, 1, 1, 1, 1], "the cat and the dog"), ([9, 3, 4], [0, 1, 1], "der Hund und die Katze")]
    figures = diversity_of(rows, budget=4)
    assert figures["trainable_tokens"] == 6 and figures["rows"] == 2
    assert (figures["distinct_1_count"], figures["distinct_1"]) == (4, round(4 / 6, 4))  # 1 2 1 2 3 4
    assert (figures["distinct_2_count"], figures["distinct_2"]) == (3, round(3 / 4, 4))  # 12 21 12 | 34
    assert figures["distinct_3"] == 1.0 and figures["budget_tokens"] == 4 and "distinct_1_at_budget" in figures
    assert figures["languages"] == {"en": 1, "de": 1}
    assert figures["length_tokens"] == {"p10": 3, "p50": 3, "p90": 5, "max": 5}
    assert "distinct_1_at_budget" not in diversity_of(rows, budget=100)  # too few tokens to compare at that budget
    columns = {"input_ids": [r[0] for r in rows], "loss_mask": [r[1] for r in rows], "source": ["a", "b"],
               "messages": [json.dumps({"prompt": "", "completion": r[2]}) for r in rows]}
    report = corpus_diversity(columns, budget=4)
    assert set(report["by_input"]) == {"a", "b"} and report["overall"]["rows"] == 2
    assert report["by_input"]["b"]["distinct_1"] == 1.0


def test_prepare_report_holds_the_diversity(tmp_path, tiny_llama):
    from draftsmith.data.prepared import PrepareConfig, prepare

    texts_file = tmp_path / "texts.jsonl"
    texts_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in (
        "The quick brown fox jumps over the lazy dog.", "Der schnelle braune Fuchs springt über den faulen Hund.")))
    report = prepare(PrepareConfig(input=[str(texts_file)], out=str(tmp_path / "out"), eval_fraction=0.0),
                     target=tiny_llama)
    overall = report["diversity"]["overall"]
    assert overall["rows"] == 2 and overall["trainable_tokens"] == report["trainable_tokens"]
    assert overall["languages"] == {"en": 1, "de": 1} and 0 < overall["distinct_2"] <= 1
    assert list(report["diversity"]["by_input"]) == [str(texts_file)]
    assert json.loads((tmp_path / "out" / "prepare_report.json").read_text())["diversity"] == report["diversity"]
