"""The built-in training corpus, `builtin:stdlib`: conversations made from Python's own standard library.

Every machine that runs draftsmith has the standard-library sources, so the default recipe can
train offline. Each public function or method with a docstring and a short body (3-40 lines) in the
stdlib's pure-Python modules (tests, GUI and demo packages left out) becomes one conversation of
one of four kinds, picked by a hash of its qualified name:
  implement   "Write a Python function `f(args)` that <docstring summary>."  -> the source code
  explain     "What does `module.f` do?"                                    -> its docstring
  read        "Explain this code: <source>"                                  -> its docstring
  two-turn    "What does `module.f` do?" -> docstring; "Show me an implementation." -> source
The sources are parsed with `ast` (nothing is imported), the order is a fixed hash order, and the
corpus stops at `max_conversations` or `max_chars` (~4 characters per token), so the same Python
version always writes the same file. No HumanEval content: it only holds standard-library code.
The file is cached as $DRAFTSMITH_CACHE/corpus/stdlib-py<version>-v1.jsonl.

`builtin:stdlib-complete` holds the same functions, every one as a bare stub to complete, the shape of
a HumanEval prompt: the user message is the `def` line and docstring, the answer the source. It is
meant for regeneration (prepare.regenerate): prompts like a code benchmark's, answers in the
target's own words.

`builtin:exercises` (data/exercises.py) holds 1024 small typed exercises with worked examples, the
prompt shape of a code benchmark, also for regeneration. Cached as $DRAFTSMITH_CACHE/corpus/exercises-v1.jsonl.

`builtin:general` (data/general.py) holds 4096 prompts of ten categories beyond code (writing, role-play,
reasoning, math, extraction, summarization, knowledge, RAG, translation, code), a quarter of them with a
follow-up turn; its assistant turns are written by the target only (prepare --regenerate). Cached as
$DRAFTSMITH_CACHE/corpus/general-py<version>-v1.jsonl.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import sys
import sysconfig
import textwrap
from pathlib import Path

from draftsmith.errors import DraftsmithError

VERSION = "v1"
SKIP_PARTS = {"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "site-packages",
              "dist-packages", "pydoc_data", "__pycache__", "venv", "config-3", "distutils"}
KINDS = ("implement", "explain", "read", "two-turn")
BUILTIN_CORPORA = ("stdlib", "stdlib-complete", "exercises", "general")
"""the built-in corpora this module writes (data/real.py holds builtin:real and its parts)"""


def builtin_corpus_path(name: str) -> Path:
    """Path of a built-in corpus file, written on first use (`builtin:stdlib`, `builtin:stdlib-complete`,
    `builtin:exercises`: typed exercises in a code benchmark's prompt shape, data/exercises.py; `builtin:general`:
    prompts of ten categories for regeneration, data/general.py)."""
    from draftsmith.files import cache_dir

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if name == "general":  # its long texts are the stdlib's docstrings, so the file depends on the Python version
        from draftsmith.data import general

        path = cache_dir() / "corpus" / f"general-py{version}-{general.VERSION}.jsonl"
        if not path.is_file():
            write_rows(path, general.general_conversations())
        return path
    if name == "exercises":
        from draftsmith.data import exercises

        path = cache_dir() / "corpus" / f"exercises-{exercises.VERSION}.jsonl"
        if not path.is_file():
            write_rows(path, exercises.exercise_conversations())
        return path
    if name not in BUILTIN_CORPORA:
        suite = " (an evaluation prompt set: draftsmith eval --prompts builtin:suite)" * (name == "suite")
        raise DraftsmithError(f"Unknown built-in corpus 'builtin:{name}'{suite}. The built-in corpora are "
                              "builtin:stdlib, builtin:stdlib-complete, builtin:exercises and builtin:general.")
    path = cache_dir() / "corpus" / f"{name}-py{version}-{VERSION}.jsonl"
    if not path.is_file():
        write_stdlib_corpus(path, complete=name == "stdlib-complete")
    return path


def write_stdlib_corpus(path: Path, max_conversations: int = 4000, max_chars: int = 3_000_000,
                        complete: bool = False) -> int:
    """Write the corpus (`complete`: the stub-completion one) as jsonl, atomically; returns the number of rows."""
    return write_rows(path, stdlib_conversations(max_conversations, max_chars, complete))


def write_rows(path: Path, rows) -> int:
    """Write conversation rows as jsonl, atomically; returns the number of rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    count = 0
    with open(tmp, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return count


def stdlib_conversations(max_conversations: int = 4000, max_chars: int = 3_000_000, complete: bool = False):
    """Conversations in a fixed order, until either budget is spent."""
    entries = sorted(stdlib_functions(), key=lambda entry: _hash(entry["qualname"]))
    if complete:  # a stub needs a body to complete (abstract methods have only their docstring)
        entries = [entry for entry in entries if entry["flush_code"] != entry["stub"]]
    chars = 0
    for number, entry in enumerate(entries[:max_conversations]):
        kind = "complete" if complete else KINDS[_hash("kind:" + entry["qualname"]) % len(KINDS)]
        messages = _conversation(entry, kind)
        chars += sum(len(m["content"]) for m in messages)
        if chars > max_chars:
            return
        yield {"id": f"stdlib-{number}", "source": entry["qualname"], "messages": messages}


def stdlib_functions():
    """Public functions/methods with a docstring and a 3-40 line body, from stdlib sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for file in sorted(root.rglob("*.py")):
        relative = file.relative_to(root)
        if SKIP_PARTS & set(relative.parts[:-1]) or relative.name.startswith("_") and relative.name != "__init__.py":
            continue
        module = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        try:
            source = file.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        yield from _functions_in(tree, module, lines)


def _functions_in(tree, module: str, lines: list[str]):
    for node in tree.body:
        owners = [(node, None)]
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            owners = [(child, node.name) for child in node.body]
        for function, owner in owners:
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.name.startswith("_"):
                continue
            docstring = ast.get_docstring(function)
            length = function.end_lineno - function.lineno + 1
            if not docstring or len(docstring) < 40 or not 3 <= length <= 40:
                continue
            code = textwrap.dedent("\n".join(lines[function.lineno - 1:function.end_lineno]))
            # flush left by the def line's own indent (dedent stops at a docstring line or comment in column 0)
            flush = [line[min(function.col_offset, len(line) - len(line.lstrip())):]
                     for line in lines[function.lineno - 1:function.end_lineno]]
            name = f"{owner}.{function.name}" if owner else function.name
            yield {"qualname": f"{module}.{name}", "module": module, "name": name, "code": code,
                   "docstring": inspect.cleandoc(docstring), "signature": _signature(function, owner),
                   "stub": "\n".join(flush[:function.body[0].end_lineno - function.lineno + 1]), "flush_code": "\n".join(flush)}


def _signature(function, owner) -> str:
    args = ast.unparse(function.args)
    return f"{owner + '.' if owner else ''}{function.name}({args})"


def _conversation(entry: dict, kind: str) -> list[dict[str, str]]:
    summary = entry["docstring"].split("\n\n")[0].replace("\n", " ").strip()
    code = f"```python\n{entry['code']}\n```"
    where = f"`{entry['qualname']}` from Python's `{entry['module']}` module"
    explanation = f"{where} has the signature `{entry['signature']}`.\n\n{entry['docstring']}"
    if kind == "complete":  # a HumanEval-shaped prompt: the bare def line(s) and docstring
        return [{"role": "user", "content": entry["stub"] + "\n"},
                {"role": "assistant", "content": f"```python\n{entry['flush_code']}\n```"}]
    if kind == "implement":
        ask = f"Write a Python function `{entry['signature']}` that does the following: {summary}"
        return [{"role": "user", "content": ask},
                {"role": "assistant", "content": f"Here is an implementation, as in the `{entry['module']}` module:\n\n{code}"}]
    if kind == "explain":
        return [{"role": "user", "content": f"What does `{entry['qualname']}` do in Python?"},
                {"role": "assistant", "content": explanation}]
    if kind == "read":
        return [{"role": "user", "content": f"Explain what this Python code does:\n\n{code}"},
                {"role": "assistant", "content": f"This is {where}.\n\n{entry['docstring']}"}]
    return [{"role": "user", "content": f"What does `{entry['qualname']}` do in Python?"},
            {"role": "assistant", "content": explanation},
            {"role": "user", "content": "Show me how it is implemented."},
            {"role": "assistant", "content": code}]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
