"""Validation numbers: per-step accuracy, the acceptance length it implies, and a real decode.

`best/` is chosen by the τ that held-out per-step accuracies imply (`eval.select_by: implied`, the
default: thousands of held-out positions, so it does not flip on the noise of a few decoded prompts)
or by the τ of a real decode of `eval.num_prompts` prompts (`decoded`). The real decode is logged
beside the implied τ either way: training accuracy can look good while real acceptance is poor
(DESIGN §3, DFlash), and the two side by side show it.
"""

from __future__ import annotations

import re

ACCURACY_KEY = re.compile(r"^acc_(\d+)$")  # drafters report per-step top-1 accuracy as acc_0, acc_1, ...


def step_accuracies(metrics: dict[str, float]) -> list[float]:
    """Per-step top-1 accuracies `acc_0, acc_1, ...` from a metrics dict, in step order."""
    found = {int(m.group(1)): float(v) for k, v in metrics.items() if (m := ACCURACY_KEY.match(k))}
    return [found[j] for j in range(len(found)) if j in found]


def implied_acceptance_length(accuracies: list[float]) -> float:
    """τ = 1 + Σ_i Π_{j≤i} acc_j: the chain acceptance length if step i is accepted with prob acc_i."""
    tau, survive = 1.0, 1.0
    for accuracy in accuracies:
        survive *= accuracy
        tau += survive
    return tau


def decode_acceptance_length(kind: str, folder, target, prompts: list[list[int]], draft_length: int,
                             max_new_tokens: int) -> dict | None:
    """Greedy speculative decode of held-out prompts with a saved drafter; None without prompts."""
    if not prompts:
        return None
    from draftsmith.drafters import DraftShape, Sampling, kind_module
    from draftsmith.eval.runner import evaluate

    proposer = kind_module(kind).load_proposer(folder, target)
    result = evaluate(target, proposer, prompts, shape=DraftShape(length=draft_length), sampling=Sampling(),
                      max_new_tokens=max_new_tokens)
    return {"acceptance_length": result["acceptance_length"],
            "acceptance_per_position": list(result.get("acceptance_per_position", []))}
