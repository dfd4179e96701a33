"""Acceptance traces: what `draftsmith eval --save-traces` measured per prompt, written for `draftsmith serve-sim`
to replay (`draftsmith.serving.traces` reads them back).

traces.json holds, for every prompt, its category, prompt and output lengths, the measured latency of
our plain loop and of speculative decoding, and for each traced draft length every verify cycle as
[drafted, accepted, emitted, draft_ms, verify_ms]. Greedy output does not depend on the draft length,
which is why traces of several lengths describe one output and `--draft-lengths` needs T = 0.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from draftsmith.errors import DraftsmithError

FORMAT = "draftsmith-traces/1"


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
