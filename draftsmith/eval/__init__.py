"""The built-in speculative decoder and `draftsmith eval`.

- `verify.py`: the lossless acceptance rules (chains, trees with sibling retries) and tree masks;
- `decoder.py`: the speculative loop and the plain loop, KV caches rolled back by position;
- `metrics.py`: τ, per-position acceptance, speedup, latency (DESIGN §3 definitions);
- `runner.py`: drafter specs, `evaluate` (training-time validation) and `compare` (the eval run);
- `prompts.py`, `report.py`, `command.py`: prompt sets, reports, the CLI.
"""

from __future__ import annotations


def __getattr__(name: str):
    # Lazy, so `draftsmith --help` does not import torch and transformers.
    if name in ("evaluate", "compare", "load_drafter"):
        from draftsmith.eval import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'draftsmith.eval' has no attribute '{name}'")
