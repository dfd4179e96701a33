"""Regeneration through vLLM (prepare.engine = vllm): the engine writes the answers' tokens, draftsmith does the rest.

`regenerate.py` keeps everything that makes regeneration what it is (rows, chat template, on-policy turn order,
batches, the resumable cache, the budget); an `EngineWriter` only replaces our batched loop: it gets a batch's
prompts as token ids and returns the answers' token ids. It runs `regenerate_worker.py` in vLLM's venv (`make
engine`), launched as `draftsmith eval --engine vllm` launches its worker (`engine_process`), started at the first
batch that needs it (a resumed run with every row answered never starts it; with a budget, its start-up counts
against it, as regeneration time) and kept for the whole run: the engine loads once.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from draftsmith.engine_process import engine_python, launch, log_tail, target_folder
from draftsmith.errors import DraftsmithError

ENGINES = ("vllm",)
WORKER = Path(__file__).with_name("regenerate_worker.py")


class EngineWriter:
    """The target's answers written by vLLM from token ids (`write`), one engine for the whole run; close it (or use
    it in a `with`) to stop the engine. `target`: a draftsmith target spec (its folder is what vLLM reads)."""

    def __init__(self, target: str, dtype: str, workdir: Path, eager: bool = False, python: Path | None = None,
                 worker: Path = WORKER):
        self.python = python or engine_python("prepare.engine (--engine vllm)")
        self.settings = {"target": target_folder(target), "dtype": dtype, "enforce_eager": eager}
        self.workdir, self.worker = Path(workdir), worker
        self.process: subprocess.Popen | None = None
        self.load_seconds: float | None = None
        self.vllm_version: str | None = None
        self.cpu_seconds = 0.0
        """CPU seconds the engine's process has spent (all its threads, its start-up included), as it last said"""

    @property
    def log(self) -> Path:
        return self.workdir / "regenerate_engine.log"

    def start(self) -> None:
        """Launch the worker and wait until its engine is loaded (raises with the log's tail if it is not)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        settings = self.workdir / "regenerate_engine.settings.json"
        settings.write_text(json.dumps(self.settings) + "\n")
        with open(self.log, "w") as log:
            self.process = launch(self.python, self.worker, [str(settings)], log, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log, text=True)
        ready = self._reply("loading the target")
        self.load_seconds, self.vllm_version = ready["load_s"], ready["vllm_version"]
        self.cpu_seconds = ready.get("cpu_s", 0.0)

    def write(self, encoded: list[list[int]], temperature: float, max_new_tokens: int, eos: int | None,
              seeds: list[int]) -> list[list[int]]:
        """The answers' token ids to prompts given as token ids: ended by `eos` (only it) or after max_new_tokens."""
        if self.process is None:
            self.start()
        batch = {"prompts": encoded, "max_tokens": max_new_tokens, "temperature": max(temperature, 0.0),
                 "seeds": seeds, "stop_token_ids": [] if eos is None else [eos]}
        try:
            self.process.stdin.write(json.dumps(batch) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the engine is gone: _reply says why
        reply = self._reply(f"answering {len(encoded)} prompts")
        outputs, self.cpu_seconds = reply["outputs"], reply.get("cpu_s", self.cpu_seconds)
        if len(outputs) != len(encoded):
            raise DraftsmithError(f"vLLM answered {len(outputs)} of {len(encoded)} prompts (log: {self.log}).")
        return outputs

    def _reply(self, doing: str) -> dict:
        line = self.process.stdout.readline()
        reply = json.loads(line) if line.strip() else None
        if reply is None or "error" in reply:
            why = reply["error"] if reply else f"the engine exited with {self._exit_code()}: {log_tail(self.log)}"
            raise DraftsmithError(f"vLLM failed {doing} for regeneration: {why} (log: {self.log})")
        return reply

    def _exit_code(self) -> int | None:
        try:  # its stdout closed: it is exiting, or has
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Stop the engine: its stdin closes and it exits (killed if it does not within a minute)."""
        if self.process is None:
            return
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        self.process = None

    def __enter__(self) -> EngineWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
