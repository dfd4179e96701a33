"""Replaying acceptance traces: the traces.json that `draftsmith eval --save-traces` writes (`draftsmith.eval.traces`
describes it), read back for the simulator, which replays the measured cycles and so never invents an acceptance rate.

Replay by output position: a request that has emitted p tokens and drafts at length L uses the cycle
of the length-L trace that covers position p. At a fixed length p is always where a cycle began, so
the trace is replayed exactly. When adaptive drafting switches length mid-request, p can fall inside
a cycle that started at s with a accepted: the drafted tokens s+δ..s+a-1 (δ = p - s) were right, so
the rest of that run, a - δ, is taken as accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftsmith.errors import DraftsmithError
from draftsmith.eval.traces import FORMAT
from draftsmith.files import read_json


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
    data = read_json(path, f"Traces file '{path}' does not exist. Write one with draftsmith eval ... --save-traces.",
                     FORMAT, "a draftsmith traces file")
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
