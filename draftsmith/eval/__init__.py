"""The built-in speculative decoder and `draftsmith eval`.

- `verify.py`: the lossless acceptance rules (chains, trees with sibling retries) and tree masks;
- `decoder.py`: the speculative loop and the plain loop, KV caches rolled back by position;
- `metrics.py`: τ, per-position acceptance, speedup, latency (DESIGN §3 definitions);
- `runner.py`: drafter specs, `evaluate` (training-time validation) and `compare` (the eval run);
- `prompts.py`, `report.py`, `traces.py`, `command.py`: prompt sets, reports, acceptance traces (for
  `draftsmith serve-sim`), the CLI.
"""
