"""The command line as a user meets it: help, info, errors without tracebacks, README commands."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def draftsmith(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "draftsmith", *args], capture_output=True, text=True,
                            cwd=ROOT, timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(f"draftsmith {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def test_help_lists_commands():
    from draftsmith.cli import COMMANDS

    out = draftsmith("--help").stdout
    for command in COMMANDS:
        assert command in out
        assert f"usage: draftsmith {command}" in draftsmith(command, "--help").stdout


def test_info_on_local_folder_json(tmp_path, tiny_llama):
    tiny_llama.model.save_pretrained(tmp_path / "m")
    tiny_llama.tokenizer.save_pretrained(tmp_path / "m")
    facts = json.loads(draftsmith("info", str(tmp_path / "m"), "--json").stdout)
    assert facts["num_layers"] == 8 and facts["hidden_size"] == 64 and facts["vocab_size"] == 320
    assert facts["chat_template"] is True and facts["eagle3_layers"] == [1, 3, 4]


def test_info_builtin_smollm2(smollm2):  # the fixture fills the GGUF cache first
    facts = json.loads(draftsmith("info", "smollm2-135m-instruct", "--json").stdout)
    assert (facts["num_layers"], facts["hidden_size"], facts["vocab_size"]) == (30, 576, 49152)
    assert facts["eagle3_layers"] == [1, 14, 26] and facts["dtype"] == "float32"


def test_errors_are_one_paragraph_without_traceback(tmp_path):
    result = draftsmith("info", str(tmp_path / "nowhere"), check=False)
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr
    debug = draftsmith("--debug", "info", str(tmp_path / "nowhere"), check=False)
    assert "Traceback" in debug.stderr


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.S).group(1)
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line]


def test_readme_starts_with_demo_and_test_commands_that_ci_runs():
    commands = readme_commands()
    assert commands[:2] == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    for target in ("demo", "test"):
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
        assert dry.returncode == 0, dry.stderr


@pytest.mark.slow
def test_readme_demo_command_runs():
    result = subprocess.run(["make", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_every_command_flushes_denormals_before_it_runs(monkeypatch, tmp_path):
    import draftsmith.target
    from draftsmith.cli import main

    calls = []
    monkeypatch.setattr(draftsmith.target, "flush_denormals", lambda: calls.append(1) or True)
    assert main(["capture", "--verify", str(tmp_path / "missing")]) == 2
    assert calls == [1]
