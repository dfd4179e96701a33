"""Pieces the training benchmarks share: train a recipe, read its log, price the target's forward,
decode methods interleaved prompt by prompt, and tabulate what was measured."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from draftsmith.eval import metrics
from draftsmith.target import flush_denormals
from draftsmith.train.recipe import TrainRecipe

flush_denormals()  # as the CLI does: every bench that imports this file runs as `draftsmith` would


PROBE_STEPS, PROBE_WARMUP = 16, 4
"""a probe run's steps, and its first steps left out of the rate: 6 steps after 2 warm-up ones misjudged one
variant's rate by 1.7x (bench/studies/train_levers.py)"""


def train(config, target) -> TrainRecipe:
    """Run one training recipe to its end (setup, train, cleanup) with a shared, already loaded target."""
    recipe = TrainRecipe(config, target=target)
    recipe.setup()
    try:
        recipe.train()
    finally:
        recipe.cleanup()
    return recipe


def read_log(folder: Path) -> list[dict]:
    """The records of a run's metrics.jsonl."""
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def kept_as_best(run: Path) -> dict:
    """The held-out figures of the step a run's best/ was kept from (its best.json); {} when it has none."""
    record = Path(run) / "best.json"
    return json.loads(record.read_text()) if record.is_file() else {}


def train_tokens_per_s(folder: Path, skip: int = 2) -> float:
    """Real (non-padding) training tokens per second over a run's logged steps, after `skip` warm-up steps."""
    log = [r for r in read_log(folder) if r.get("split") == "train"][skip:]
    return sum(r["tokens"] for r in log) / sum(r["tokens"] / r["tokens_per_s"] for r in log)


def forward_tokens_per_s(target, split, config, layers: list[int], batches: int = 4) -> float:
    """Target-forward-only tokens/s on the recipe's kind of batches: what online capture costs at least."""
    from draftsmith.data.capture import collate

    tokens, seconds, size = 0, 0.0, config.data.batch_size
    for start in range(0, batches * size, size):
        batch = collate([split[i] for i in range(start, start + size)])
        ids, mask = batch["input_ids"][:, : config.data.max_length], batch["attention_mask"][:, : config.data.max_length]
        began = time.perf_counter()
        target.forward(ids, layers=layers, attention_mask=mask, logits=False)
        seconds += time.perf_counter() - began
        tokens += int(mask.sum())
    return tokens / seconds


def steps_for(minutes: float, tokens_per_s: float, split, config) -> tuple[int, float]:
    """(optimizer steps that fit `minutes` at `tokens_per_s`, mean real tokens per step) on the whole split."""
    lengths = [min(n, config.data.max_length) for n in split.lengths()]
    step_tokens = config.data.batch_size * config.train.grad_accum * sum(lengths) / len(lengths)
    return max(10, int(minutes * 60 * tokens_per_s / step_tokens)), step_tokens


def whole_chains(proposer):
    """The same drafter drafting whole chains, whatever its confidence cut says (its state is per request: every
    decode resets it, so the copy shares the weights safely)."""
    import copy

    whole = copy.copy(proposer)
    if getattr(whole, "can_cut", False):
        whole.confidence_cut = False
    return whole


def chains_beside_plain(target, folders: dict, length: int, max_new_tokens: int) -> dict:
    """Decode methods: our plain loop ("plain") and, per name -> drafter folder, chains of `length` at T=0, with the
    target's and each drafter's few-row layers set as `draftsmith eval` sets them."""
    from draftsmith.drafters import DraftShape
    from draftsmith import small_batch
    from draftsmith.eval.runner import load_drafter

    rows = small_batch.tune_and_install(target.model)["rows"]
    return beside_plain(target, {name: (load_drafter(str(folder), target), DraftShape(length))
                                 for name, folder in folders.items()}, rows, max_new_tokens)


def beside_plain(target, proposers: dict, rows, max_new_tokens: int) -> dict:
    """Decode methods at T=0: our plain loop ("plain") and, per name -> (proposer, DraftShape), speculative decoding
    with it; each proposer's networks get the few-row layers `rows` (what `small_batch.tune_and_install` routed on
    the target, before the proposers were loaded and measured their costs)."""
    from draftsmith.drafters import Sampling
    from draftsmith import small_batch
    from draftsmith.eval.decoder import eos_ids, plain_generate, speculative_generate

    greedy, eos = Sampling(), eos_ids(target)
    methods = {"plain": lambda ids: plain_generate(target, ids, greedy, max_new_tokens, eos)}
    for name, (proposer, shape) in proposers.items():
        small_batch.install_on_proposer(proposer, target, rows)
        methods[name] = (lambda ids, p=proposer, s=shape: speculative_generate(
            target, p, ids, s, greedy, max_new_tokens, eos))
    return methods


def decode_interleaved(methods: dict, prompts, rounds: int = 1) -> dict[str, list]:
    """Every method on every prompt, in alternating order (no method always first), after one warm-up run each.

    `rounds` > 1: the whole prompt list again, each round in the order the last one did not use for each prompt,
    so that a prompt's methods take turns being first; the lists hold round after round (`len(prompts) * rounds`)."""
    warm = torch.tensor([prompts[0].token_ids[:32]])
    for run in methods.values():
        run(warm)
    runs = {name: [] for name in methods}
    for round_ in range(rounds):
        for index, prompt in enumerate(prompts):
            ids = torch.tensor([prompt.token_ids])
            for name in (list(methods) if (index + round_) % 2 == 0 else list(reversed(methods))):
                runs[name].append(methods[name](ids))
            done = round_ * len(prompts) + index + 1
            print(f"[{done}/{len(prompts) * rounds}] {prompt.name}", flush=True)
    return runs


def method_rows(runs: dict, plain: str, baseline: str, references: dict[str, str] | None = None) -> dict[str, dict]:
    """Per method: tokens/s, speedups against `plain` and `baseline` (both methods of `runs`), identical outputs,
    and for speculative methods τ, per-position acceptance, the draft-time fraction, the draft milliseconds per
    verify cycle and the drafter's seconds per drafted token over the target's seconds per token in `plain` (both measured in this run).

    `references`: method -> the plain method whose outputs it must equal, where that is not `plain` (a drafter
    verified by its own tuned target, Medusa-2, must equal that target's plain outputs)."""
    tps = {name: metrics.timing(gens)["tokens_per_s"] for name, gens in runs.items()}
    target_s_per_token = 1 / tps[plain]
    rows = {}
    for name, gens in runs.items():
        reference = runs[(references or {}).get(name, plain)]
        row = {"tokens_per_s": tps[name], f"speedup_vs_{plain}": tps[name] / tps[plain],
               f"speedup_vs_{baseline}": tps[name] / tps[baseline],
               "identical_to_plain": sum(g.tokens == p.tokens for g, p in zip(gens, reference))}
        if any(g.cycles for g in gens):
            acceptance = metrics.acceptance(gens)
            row.update(acceptance_length=acceptance["acceptance_length"],
                       acceptance_per_position=acceptance.get("acceptance_per_position"),
                       draft_time_fraction=metrics.timing(gens).get("draft_time_fraction"))
            cycles = [c for g in gens for c in g.cycles]
            row["draft_ms_per_cycle"] = 1000 * sum(c.draft_s for c in cycles) / len(cycles)
            drafted = sum(c.drafted for c in cycles)
            if drafted:
                row["draft_cost_per_token_vs_target"] = (
                    sum(c.draft_s for g in gens for c in g.cycles) / drafted / target_s_per_token)
        rows[name] = row
    return rows


@torch.no_grad()
def step_costs(model, context: int = 256, repeats: int = 20) -> dict[str, float]:
    """Median ms of one cached single-token step of a causal LM after `context` tokens: the whole model, and its
    decoder body alone (the rest is the lm_head); what a draft model pays per drafted token."""
    from transformers import DynamicCache

    ids = torch.randint(0, model.config.vocab_size, (1, context + 1), device=model.device)
    times: dict[str, list[float]] = {"full": [], "body": []}
    for round_ in range(repeats):
        for part in ("full", "body") if round_ % 2 == 0 else ("body", "full"):
            cache = DynamicCache(config=model.config)
            (model.get_decoder() if part == "body" else model)(input_ids=ids[:, :context], cache=cache, use_cache=True)
            began = time.perf_counter()
            (model.get_decoder() if part == "body" else model)(input_ids=ids[:, context:], cache=cache, use_cache=True)
            times[part].append(time.perf_counter() - began)
    full, body = (sorted(times[k])[repeats // 2] * 1e3 for k in ("full", "body"))
    return {"full_ms": full, "body_ms": body, "lm_head_share": 1 - body / full}
