"""Every `draftsmith ...` command in README.md and docs/*.md parses against the real command line, and every
`draftsmith train RECIPE key=value` names a recipe that exists and only keys the recipe knows, checked by the same
strict loader `draftsmith train` runs. Nothing is run: a command is parsed and its recipe validated, no more."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", "<"}
PLACEHOLDER = re.compile(r"^(<[^>]*>|[A-Z][A-Z0-9_]*)(\.yaml)?$")  # <run>, DIR, FORMAT, RECIPE.yaml
# what a mention in running text may leave out: `draftsmith eval` or `--tree` name a command or an option
PARTIAL = ("the following arguments are required", "expected one argument", "expected at least one argument")


# --------------------------------------------------------------------------- finding the commands
def snippets(text: str):
    """(line number, code) for each line of a code block (`\\` continuations joined onto their first line) and
    each inline code span (which may wrap onto the next line of its paragraph), and whether it was inline."""
    lines, prose, in_block, i = text.splitlines(), [], False, 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            in_block = not in_block
        elif in_block:
            start, code = i, lines[i]
            while code.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                code = code.rstrip()[:-1] + " " + lines[i]
            yield start + 1, code, False
        else:
            prose.append((i + 1, lines[i]))
        i += 1
    joined = "\n".join(line for _, line in prose)
    for span in re.finditer(r"(`+)(.+?)\1", joined, re.S):
        yield prose[joined.count("\n", 0, span.start())][0], span.group(2).replace("\n", " "), True


def _is_command_start(tokens: list[str], i: int) -> bool:
    """`draftsmith`, `.venv/bin/draftsmith` or `-m draftsmith` where a command begins (not `--format draftsmith`)."""
    if tokens[i] != "draftsmith" and not tokens[i].endswith("/bin/draftsmith"):
        return False
    return i == 0 or tokens[i - 1] == "-m" or tokens[i - 1] in OPERATORS


def _unbracket(args: list[str]) -> list[str]:
    """Usage notation out: `[--private]` -> `--private`, `...` dropped."""
    plain = []
    for arg in args:
        if arg == "...":
            continue
        if arg.startswith("["):
            arg = arg[1:]
        if arg.endswith("]") and "[" not in arg:
            arg = arg[:-1]
        if arg and arg != "...":
            plain.append(arg)
    return plain


def draftsmith_commands(code: str, variables: dict[str, str]) -> list[list[str]]:
    """The argument lists of the draftsmith commands in one line of shell; `NAME=value` lines set `variables`,
    which later `$NAME`s expand to. `make` lines are not draftsmith commands."""
    tokens = shlex.split(code, comments=True)
    if len(tokens) == 1 and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
        name, value = tokens[0].split("=", 1)
        variables[name] = value
        return []
    expanded = []
    for token in tokens:
        if token.startswith("$") and token[1:] in variables:
            expanded += shlex.split(variables[token[1:]])
        else:
            expanded.append(token)
    commands = []
    for i, token in enumerate(expanded):
        if expanded[0] != "make" and _is_command_start(expanded, i):
            rest = expanded[i + 1:]
            end = next((j for j, arg in enumerate(rest) if arg in OPERATORS), len(rest))
            commands.append(_unbracket(rest[:end]))
    return commands


def doc_commands() -> list[tuple[str, int, str, list[str] | None, bool]]:
    """(file, line, the command as written, its arguments (None: not shell), inline) for every draftsmith command
    in the docs."""
    found = []
    for path in DOCS:
        variables: dict[str, str] = {}
        for line, code, inline in snippets(path.read_text()):
            name = str(path.relative_to(ROOT))
            try:
                commands = draftsmith_commands(code, variables)
            except ValueError:  # unbalanced quotes: broken as written, if it is a command at all
                if "draftsmith" in code:
                    found.append((name, line, code.strip(), None, inline))
                continue
            found += [(name, line, code.strip(), args, inline) for args in commands]
    return found


# --------------------------------------------------------------------------- checking one command
class _ParseError(Exception):
    pass


@functools.cache
def _parser() -> argparse.ArgumentParser:
    from draftsmith.cli import build_parser

    return build_parser()


def parse(args: list[str]) -> argparse.Namespace | None:
    """The namespace the real parser makes of `args` (None for --help); argparse's complaint as _ParseError."""

    def complain(self, message):
        raise _ParseError(f"{self.prog}: {message}")

    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = complain
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return _parser().parse_args(args)
    except SystemExit as done:  # --help prints and exits 0
        if done.code:
            raise _ParseError(f"exit {done.code}") from None
        return None
    finally:
        argparse.ArgumentParser.error = original


def problem(args: list[str], inline: bool) -> str | None:
    """What is wrong with `draftsmith ARGS` as the docs write it, or None."""
    try:
        namespace = parse(args)
    except _ParseError as err:
        message = str(err)
        choice = re.search(r"invalid choice: '([^']*)' \(choose from '([^']*)'", message)
        if choice and PLACEHOLDER.match(choice.group(1)) and choice.group(1) in args:  # --format FORMAT
            args = list(args)
            args[args.index(choice.group(1))] = choice.group(2)
            return problem(args, inline)
        if inline and any(partial in message for partial in PARTIAL):
            # running text names a command or an option, not a whole command; its options must still exist
            unknown = unknown_options(args)
            return f"unrecognized arguments: {' '.join(unknown)}" if unknown else None
        return message
    if namespace is None or getattr(namespace, "command", None) != "train":
        return None
    return recipe_problem(namespace.recipe, namespace.overrides)


def unknown_options(args: list[str]) -> list[str]:
    """The `--options` in `args` that the (sub)command they belong to does not have."""
    parser, known = _parser(), set()
    for arg in args:
        known |= {option for action in parser._actions for option in action.option_strings}
        commands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
        if not commands or arg not in commands[0].choices:
            break
        parser = commands[0].choices[arg]
    known |= {option for action in parser._actions for option in action.option_strings}
    return [arg for arg in args if arg.startswith("--") and arg.split("=")[0] not in known]


def recipe_problem(recipe: str, overrides: list[str]) -> str | None:
    """Whether `draftsmith train RECIPE OVERRIDES` would load: the recipe exists, every key is known, every value
    fits (the strict loader `draftsmith train` runs first). A placeholder recipe (RECIPE.yaml) is not checked."""
    from draftsmith.config import load
    from draftsmith.errors import DraftsmithError
    from draftsmith.train.config import TrainConfig

    if PLACEHOLDER.match(recipe):
        return None
    if not (ROOT / recipe).is_file():
        return f"recipe {recipe} does not exist"
    try:
        load(TrainConfig, ROOT / recipe, overrides)
    except DraftsmithError as err:
        return str(err)
    return None


# --------------------------------------------------------------------------- the docs
COMMANDS = doc_commands()


@pytest.mark.parametrize("where, code, args, inline", [(f"{f}:{n}", c, a, i) for f, n, c, a, i in COMMANDS],
                         ids=[f"{f}:{n}" for f, n, *_ in COMMANDS])
def test_doc_command_parses(where, code, args, inline):
    wrong = "its quotes do not close" if args is None else problem(args, inline)
    assert wrong is None, f"{where}: `{code}` does not parse as a draftsmith command: {wrong}"


def test_the_docs_commands_are_found():
    found = {(f, " ".join(a[:1])) for f, _, _, a, _ in COMMANDS if a}
    for subcommand in ("info", "prepare", "capture", "import-features", "train", "eval", "export", "serve-sim"):
        assert any(s == subcommand for _, s in found), f"no `draftsmith {subcommand}` found in the docs"
    launched = [a for f, _, c, a, _ in COMMANDS if f == "README.md" and c.startswith("accelerate launch")]
    assert launched and "train.max_steps=6000" in launched[0]  # the 8-GPU example, continuations joined


def test_gpu_examples_set_their_own_time_budget():
    """The recipes' train.max_minutes is a CPU demo's budget: a GPU launch that inherited it would stop there."""
    for f, n, code, args, _ in COMMANDS:
        gpu = re.search(r"--config_file recipes/accelerate/(?!cpu-)", code)
        if gpu and args and args[0] == "train" and not PLACEHOLDER.match(args[1]):
            assert any(arg.startswith("train.max_minutes=") for arg in args), \
                f"{f}:{n}: `{code}` inherits the recipe's train.max_minutes"


# --------------------------------------------------------------------------- the checker itself
def test_snippets_join_continuations_and_read_inline_code():
    text = "intro `draftsmith eval\n--tree 5,8,32` here\n```bash\nmake demo\ndraftsmith train a.yaml \\\n" \
           "    x=1   # note\n```\nafter `--format draftsmith`\n"
    assert list(snippets(text)) == [
        (4, "make demo", False), (5, "draftsmith train a.yaml      x=1   # note", False),
        (1, "draftsmith eval --tree 5,8,32", True), (8, "--format draftsmith", True)]


def test_commands_are_cut_from_their_shell():
    variables: dict[str, str] = {}
    assert draftsmith_commands("make demo  # runs draftsmith train", variables) == []
    assert draftsmith_commands("pip install -e . --format draftsmith", variables) == []
    assert draftsmith_commands('COMMON="--num-prompts 4 --threads 1"', variables) == []
    assert draftsmith_commands("accelerate launch --num_processes 8 -m draftsmith eval $COMMON --out <run>/x "
                               "&& ls", variables) == [["eval", "--num-prompts", "4", "--threads", "1", "--out",
                                                        "<run>/x"]]
    assert draftsmith_commands("draftsmith export A --private [--revision BRANCH] ...", variables) == [
        ["export", "A", "--private", "--revision", "BRANCH"]]


def test_wrong_commands_fail():
    assert problem(["eval", "--target", "t", "--drafter", "<run>/best"], inline=False) is None
    assert "unrecognized arguments: --no-such-flag" in problem(["eval", "--no-such-flag"], inline=False)
    assert "invalid choice" in problem(["evaluate"], inline=False)
    assert "required" in problem(["export", "x"], inline=False)
    assert problem(["export", "x"], inline=True) is None  # a mention in running text
    assert problem(["serve-sim", "run", "--traces"], inline=True) is None
    assert "--bogus" in problem(["export", "--bogus"], inline=True)
    assert "--bogus" in problem(["serve-sim", "run", "--bogus", "--traces"], inline=True)
    assert "--bogus" in problem(["export", "x", "--format", "FORMAT", "--out", "y", "--bogus"], inline=False)
    assert problem(["export", "x", "--format", "FORMAT", "--out", "y"], inline=False) is None
    assert "invalid choice" in problem(["export", "x", "--format", "onnx", "--out", "y"], inline=False)


def test_wrong_recipes_and_keys_fail():
    recipe = "recipes/smollm2-135m/eagle3.yaml"
    assert problem(["train", recipe, "train.max_minutes=0", "target.name=<model>"], inline=False) is None
    assert "does not exist" in problem(["train", "recipes/nowhere.yaml"], inline=False)
    assert "Unknown config key 'train.max_minute'" in problem(["train", recipe, "train.max_minute=0"], inline=False)
    assert "drafter" in problem(["train", recipe, "drafter.no_such_option=1"], inline=False)
    assert "expects int" in problem(["train", recipe, "train.max_steps=many"], inline=False)
    assert problem(["train", "RECIPE.yaml", "--help"], inline=False) is None
