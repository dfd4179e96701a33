"""Acceptance traces: what `draftsmith eval --save-traces` measured per prompt, and replaying it.

traces.json holds, for every prompt, its category, prompt and output lengths, the measured latency of
our plain loop and of speculative decoding, and for each traced draft length every verify cycle as
[drafted, accepted, emitted, draft_ms, verify_ms]. The simulator replays these cycles, so it never
invents an acceptance rate.

Replay by output position: a request that has emitted p tokens and drafts at length L uses the cycle
of the length-L trace that covers position p. At a fixed length p is always where a cycle began, so
the trace is replayed exactly. When adaptive drafting switches length mid-request, p can fall inside
a cycle that started at s with a accepted: the drafted tokens s+δ..s+a-1 (δ = p - s) were right, so
the rest of that run, a - δ, is taken as accepted. Greedy output does not depend on the draft length,
which is why traces of several lengths describe one output and `--draft-lengths` needs T = 0.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftsmith.errors import DraftsmithError

FORMAT = "draftsmith-traces/1"


# --------------------------------------------------------------------------- writing (eval)
def parse_lengths(text: str | None) -> list[int]:
    """`--draft-lengths 1,2,4,8` as sorted distinct positive ints (empty for None)."""
    if text is None:
        return []
    try:
        lengths = sorted({int(part) for part in str(text).split(",") if part.strip()})
    except ValueError:
        raise DraftsmithError(f"--draft-lengths expects comma-separated integers such as 1,2,4,8, got '{text}'.") from None
    if not lengths or lengths[0] < 1:
        raise DraftsmithError(f"--draft-lengths must list positive integers, got '{text}'.")
    return lengths


def decode_lengths(target, proposer, prompts, lengths: list[int], sampling, max_new_tokens: int, seed: int = 0) -> dict:
    """Speculative decoding of every prompt again at each chain length in `lengths`: {length: [Generation]}."""
    import torch

    from draftsmith.drafters import DraftShape
    from draftsmith.eval.decoder import eos_ids, speculative_generate
    from draftsmith.eval.runner import _generator

    eos = eos_ids(target)
    runs = {}
    for length in lengths:
        began = time.perf_counter()
        runs[length] = [speculative_generate(target, proposer, torch.tensor([p.token_ids]), DraftShape(length=length),
                                             sampling, max_new_tokens, eos, _generator(seed, index))
                        for index, p in enumerate(prompts)]
        print(f"traces: draft length {length} decoded in {time.perf_counter() - began:.0f} s", flush=True)
    return runs


def _run_record(generation) -> dict:
    return {"e2e_ms": generation.total_s * 1e3, "ttft_ms": generation.ttft_s * 1e3, "new_tokens": len(generation.tokens),
            "cycles": [[c.drafted, c.accepted, c.emitted, round(c.draft_s * 1e3, 4), round(c.verify_s * 1e3, 4)]
                       for c in generation.cycles]}


def write_traces(path: str | Path, target, drafter: dict, prompts, runs: dict, main_label: str, extra: dict,
                 environment: dict, max_new_tokens: int) -> Path:
    """traces.json: per prompt its lengths, plain latency and the cycles of every traced draft shape."""
    labels = {main_label: runs["speculative"], **{str(length): generations for length, generations in extra.items()}}
    records = []
    for index, prompt in enumerate(prompts):
        plain = runs["plain"][index]
        records.append({"name": prompt.name, "category": prompt.category, "prompt_tokens": len(prompt.token_ids),
                        "new_tokens": len(plain.tokens), "plain_ms": plain.total_s * 1e3,
                        "plain_ttft_ms": plain.ttft_s * 1e3,
                        "runs": {label: _run_record(generations[index]) for label, generations in labels.items()}})
    data = {"format": FORMAT, "target": target.fingerprint(), "drafter": drafter, "main": main_label,
            "draft_lengths": sorted(int(label) for label in labels if label.isdigit()),
            "max_new_tokens": max_new_tokens, "environment": environment, "prompts": records}
    path = Path(path)
    path.write_text(json.dumps(data) + "\n")
    return path


# --------------------------------------------------------------------------- reading (serve-sim)
@dataclass
class TracedPrompt:
    """One traced prompt, ready to replay: cycles per draft length as arrays, plus the start of each cycle."""

    name: str
    category: str
    prompt_tokens: int
    new_tokens: int
    plain_ms: float
    measured_ms: dict[int, float]  # draft length -> measured speculative end-to-end ms
    cycles: dict[int, np.ndarray]  # draft length -> [cycles, 4] drafted, accepted, emitted, draft seconds
    starts: dict[int, np.ndarray]  # draft length -> output position where each cycle began

    def cycle_at(self, length: int, position: int) -> tuple[int, int, float]:
        """(drafted, accepted, draft seconds) of a verify pass at `position` emitted tokens with draft length `length`."""
        if length == 0:
            return 0, 0, 0.0
        starts = self.starts[length]
        index = max(int(np.searchsorted(starts, position, side="right")) - 1, 0)
        if index >= len(starts):
            return 0, 0, 0.0
        drafted, accepted, _, draft_s = self.cycles[length][index]
        offset = max(position - int(starts[index]), 0)  # inside a cycle when lengths were switched
        return max(int(drafted) - offset, 0), max(int(accepted) - offset, 0), float(draft_s)


@dataclass
class TraceSet:
    """The prompts of one traces.json: one drafter, its target and the draft lengths it was traced at."""

    path: str
    target: dict
    drafter: dict
    main_length: int
    lengths: list[int]
    prompts: list[TracedPrompt]
    environment: dict

    @property
    def label(self) -> str:
        """A short name for reports: the drafter kind and the traced file."""
        return f"{self.drafter.get('kind', 'drafter')} ({Path(self.path).parent.name or self.path})"


def load_traces(path: str | Path) -> TraceSet:
    """Read and check a traces.json written by `draftsmith eval --save-traces`."""
    path = Path(path)
    if not path.is_file():
        raise DraftsmithError(f"Traces file '{path}' does not exist. Write one with draftsmith eval ... --save-traces.")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DraftsmithError(f"{path}:{err.lineno}: not valid JSON ({err.msg}).") from None
    if data.get("format") != FORMAT:
        raise DraftsmithError(f"'{path}' is not a draftsmith traces file (format {data.get('format')!r}, expected {FORMAT}).")
    if not str(data["main"]).isdigit():
        raise DraftsmithError(f"'{path}' traces a tree draft ({data['main']}); serve-sim replays chain drafts only.")
    prompts = []
    for row in data["prompts"]:
        cycles, starts, measured = {}, {}, {}
        for label, run in row["runs"].items():
            table = np.array([c[:3] + [c[3] / 1e3] for c in run["cycles"]], dtype=float).reshape(-1, 4)
            cycles[int(label)] = table
            starts[int(label)] = 1 + np.concatenate([[0], np.cumsum(table[:, 2])[:-1]]) if len(table) else np.zeros(0)
            measured[int(label)] = run["e2e_ms"]
        prompts.append(TracedPrompt(row["name"], row.get("category") or "all", row["prompt_tokens"], row["new_tokens"],
                                    row["plain_ms"], measured, cycles, starts))
    if not prompts:
        raise DraftsmithError(f"'{path}' holds no traced prompts: the workload would be empty.")
    return TraceSet(str(path), data["target"], data["drafter"], int(data["main"]), sorted(cycles), prompts,
                    data.get("environment", {}))
