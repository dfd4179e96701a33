"""Running the decoder over a prompt set: drafter specs, the light `evaluate` and the full comparison.

`evaluate` is what training calls for validation (acceptance only). `compare` is what
`draftsmith eval` runs: speculative decoding, our plain loop and `transformers.generate()`
interleaved prompt by prompt in one process, so the timings share the machine's state.
"""

from __future__ import annotations

import difflib
import os
import platform
import time

import torch

from draftsmith.drafters import DraftShape, Proposer, Sampling
from draftsmith.errors import DraftsmithError
from draftsmith.eval import metrics
from draftsmith.eval.decoder import Generation, eos_ids, plain_generate, speculative_generate

DRAFTER_FORMS = ("'prompt-lookup', 'suffix', 'hf:<model folder, .gguf or hub id>', a drafter folder or hub id "
                 "(org/name[@revision]): draftsmith's own or any layout `draftsmith export` writes (speculators, "
                 "SGLang, DFlash, vLLM Medusa, hf), or "
                 "'hybrid:<drafter folder or hf:model>' (suffix matching and that drafter in one tree per pass)")


# --------------------------------------------------------------------------- drafter specs
def drafter_kind(spec: str) -> str:
    """Check a `--drafter` value without loading any weights: 'prompt-lookup', 'hf', or the trained kind a folder
    holds in whichever layout (`draftsmith.export.readers`); a clear error otherwise."""
    if spec in ("prompt-lookup", "suffix"):
        return spec
    if spec.startswith("hybrid:"):
        inner = spec[len("hybrid:"):]
        if not inner or drafter_kind(inner) in ("prompt-lookup", "suffix", "hybrid"):
            raise DraftsmithError(f"Drafter '{spec}': hybrid: takes a trained drafter folder or hf:<model> after the "
                                  "colon (suffix matching is the other half), e.g. hybrid:runs/smollm2-135m-instruct/"
                                  "eagle3/best.")
        return "hybrid"
    if spec.startswith("hf:"):
        if not spec[3:]:
            raise DraftsmithError("Drafter 'hf:' needs a model after the colon, e.g. hf:path/to/model.")
        return "hf"
    from draftsmith.hub import drafter_folder

    try:
        folder = drafter_folder(spec)
    except DraftsmithError as err:  # a missing folder whose name reads as a hub id: say both
        raise DraftsmithError(f"Unknown drafter '{spec}': {err}") from None
    if not folder.is_dir():
        close = difflib.get_close_matches(spec, ["prompt-lookup", "suffix"], n=1, cutoff=0.6)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise DraftsmithError(f"Unknown drafter '{spec}' (no such folder).{hint} Use {DRAFTER_FORMS}.")
    from draftsmith.export import readers

    return readers.expectations(folder).kind


FALLBACK_KINDS = ("eagle", "mtp", "medusa", "dflash", "draft_lm", "hf")
"""drafter kinds (`drafter_kind`) whose drafts the running-acceptance fallback can shorten: every trained kind
(EAGLE-1/3, P-EAGLE, MTP, Medusa-1/2, DFlash, DSpark, draft LMs) and an hf: draft model. Prompt lookup and suffix
drafts choose their own lengths, and a hybrid weighs its drafter by its own running acceptance (`drafters.hybrid`)."""


def falls_back_by_default(spec: str) -> bool:
    """Whether a drafter's chains, blocks and trees follow its running acceptance unless told otherwise: the one rule
    of `draftsmith eval`, the recipes' reports and the benches (every kind in FALLBACK_KINDS)."""
    return drafter_kind(spec) in FALLBACK_KINDS


def load_drafter(spec: str, target, max_ngram: int = 3, min_ngram: int = 1, adaptive_length: int | None = None,
                 confidence_cut: bool | None = None, draft_length: int | None = None, suffix_config=None,
                 draft_budget: int | None = None, fallback: bool = False,
                 hybrid_drafter_length: int | None = None, tree: tuple[int, int, int] | None = None) -> Proposer:
    """Turn a `--drafter` value into a Proposer: prompt-lookup, suffix, hf:<model>, a trained drafter folder, or
    hybrid:<folder or hf:model>.

    `adaptive_length` k: prompt lookup measures the target's verify cost for 1 .. k+1 tokens now and
    picks each chain draft's length up to k from it (None: always the full length).
    `confidence_cut`: for trained drafters that cut chains by their confidence (DSpark, Medusa heads, EAGLE and
    MTP chains), on or off whatever the drafter's folder says (None: as it says); a drafter that wants the cost
    curve measures it now, for drafts of up to `draft_length` tokens (None: the drafter's own longest draft).
    `suffix_config` (`drafters.suffix.Config`): suffix drafting alone and in hybrids; `draft_budget`: the nodes of
    one draft (chain length or tree total) up to which they measure the verify-cost curve their cuts and the
    hybrid's skip decision read (None: not measured; suffix drafts keep their full size, the drafter always runs).
    `fallback`: a trained drafter's chains and blocks of up to `draft_length` (trees: of `tree`'s depth) take the
    length (depth) their running acceptance in the request pays for, 0 = a plain step (`draftsmith.drafters.fallback`;
    the cost curve is measured now, for the chains and for each depth of `tree`, (depth, top_k, total_tokens)).
    `hybrid_drafter_length`: a hybrid's drafter drafts chains of at most this many tokens while its suffix
    candidates take the whole draft length (None: the draft length for both)."""
    kind = drafter_kind(spec)
    if kind in ("suffix", "hybrid"):
        from draftsmith.drafters import hybrid, suffix

        proposer = suffix.load_proposer(suffix_config, target)
        if kind == "hybrid":
            drafter = load_drafter(spec[len("hybrid:"):], target, confidence_cut=confidence_cut,
                                   draft_length=draft_length)
            proposer = hybrid.HybridProposer(proposer, drafter, drafter_length=hybrid_drafter_length)
        if draft_budget is not None:
            _calibrate(proposer, target, kind, draft_budget)
        return proposer
    if kind == "prompt-lookup":
        from draftsmith.drafters import prompt_lookup

        lookup = prompt_lookup.PromptLookup(prompt_lookup.Config(
            max_ngram=max_ngram, min_ngram=min_ngram, adaptive=adaptive_length is not None))
        if adaptive_length is not None:
            _calibrate(lookup, target, "prompt lookup", adaptive_length)
        return lookup
    if kind == "hf":
        from draftsmith.drafters import draft_lm

        proposer = draft_lm.load_proposer(spec[3:], target)
        return with_fallback(proposer, target, kind, draft_length, tree) if fallback else proposer
    from draftsmith.export import readers
    from draftsmith.hub import drafter_folder

    proposer = readers.load_proposer(drafter_folder(spec), target)
    if confidence_cut is not None:
        if not proposer.can_cut:
            raise DraftsmithError(f"--confidence-cut: this {kind} drafter has no confidences to cut its drafts by "
                                  "(EAGLE, MTP, Medusa, DFlash and DSpark drafters do).")
        proposer.confidence_cut = confidence_cut
    if proposer.wants_verify_cost:  # a confidence cut reads the verify-cost curve
        _calibrate(proposer, target, kind, max(draft_length or 0, proposer.longest_draft))
    return with_fallback(proposer, target, kind, draft_length, tree) if fallback else proposer


def with_fallback(proposer: Proposer, target, name: str, draft_length: int | None,
                  tree: tuple[int, int, int] | None = None) -> Proposer:
    """`proposer` under the running-acceptance fallback (`load_drafter`'s `fallback`) for chains of up to
    `draft_length` (None: 4) and trees of `tree`'s shape, its cost curve measured now (printed under `name`)."""
    from draftsmith.drafters.fallback import RunningAcceptance

    fallen = RunningAcceptance(proposer, draft_length or 4, tree=tree)
    _calibrate(fallen, target, f"{name} fallback", fallen.longest_draft)
    return fallen


def _calibrate(proposer, target, name: str, *longest: int) -> None:
    """Have `proposer` measure the target's verify-cost curve, which its draft lengths are chosen from; say so."""
    began = time.perf_counter()
    cost = proposer.calibrate(target, *longest)
    print(f"{name}: verify cost t(n)/t(1) measured in {time.perf_counter() - began:.1f} s: "
          + ", ".join(f"{n}: {c / cost[1]:.2f}" for n, c in cost.items()), flush=True)


# --------------------------------------------------------------------------- light mode (training)
def evaluate(
    target, proposer: Proposer, prompts: list[list[int]], shape: DraftShape, sampling: Sampling = Sampling(),
    max_new_tokens: int = 64, seed: int = 0, progress: bool = False,
) -> dict:
    """Speculative decoding of token-id prompts; τ, per-position acceptance, histogram, tokens/s."""
    target = proposer.verifier or target  # Medusa-2: its tuned target verifies
    generations = []
    for index, ids in enumerate(_progress(prompts, progress, "evaluate")):
        prompt = torch.tensor([ids], dtype=torch.long)
        generations.append(speculative_generate(target, proposer, prompt, shape, sampling, max_new_tokens,
                                                generator=_generator(seed, index)))
    return {**metrics.acceptance(generations), **metrics.timing(generations)}


# --------------------------------------------------------------------------- full comparison
def compare(
    target, proposer: Proposer, prompts: list, shape: DraftShape, sampling: Sampling, max_new_tokens: int,
    seed: int = 0, transformers_baseline: bool = True, progress: bool = True, return_runs: bool = False,
):
    """Speculative vs plain vs generate(), interleaved prompt by prompt; every number of results.json.

    `return_runs`: also return the Generations by method (what `--save-traces` writes out).

    A proposer with a `verifier` (Medusa-2's tuned target) is verified by it, and every baseline runs on it too;
    plain decoding of the original `target` runs as well, for the drift figure (`tuned_target`)."""
    original, target = target, proposer.verifier or target
    eos = eos_ids(target)
    assisted = assisted_model(proposer, shape) if transformers_baseline else None
    _warm_up(target, proposer, shape, sampling, eos, transformers_baseline, assisted)
    runs: dict[str, list[Generation]] = {"speculative": [], "plain": [], "transformers": [], "assisted": [],
                                         "original": []}
    identical = 0
    for index, prompt in enumerate(_progress(prompts, progress, "eval")):
        ids = torch.tensor([prompt.token_ids], dtype=torch.long)
        methods = {
            "speculative": lambda: speculative_generate(target, proposer, ids, shape, sampling, max_new_tokens, eos,
                                                        _generator(seed, index)),
            "plain": lambda: plain_generate(target, ids, sampling, max_new_tokens, eos, _generator(seed, index)),
        }
        if transformers_baseline:
            methods["transformers"] = lambda: hf_generate(target, ids, sampling, max_new_tokens, eos, seed + index)
        if original is not target:  # what the target the drafter was trained for writes, for the drift figure
            methods["original"] = lambda: plain_generate(original, ids, sampling, max_new_tokens, eos,
                                                         _generator(seed, index))
        if assisted is not None:  # the same draft model in transformers' own assisted generation
            methods["assisted"] = lambda: hf_generate(target, ids, sampling, max_new_tokens, eos, seed + index,
                                                      assistant_model=assisted)
        order = list(methods) if index % 2 == 0 else list(reversed(methods))  # no method always runs first
        for name in order:
            runs[name].append(methods[name]())
        identical += runs["speculative"][-1].tokens == runs["plain"][-1].tokens
    results = _results(prompts, runs, sampling, identical)
    return (results, runs) if return_runs else results


def _results(prompts, runs: dict[str, list[Generation]], sampling: Sampling, identical: int) -> dict:
    speculative, plain, hf, assisted = runs["speculative"], runs["plain"], runs["transformers"], runs["assisted"]
    timing = metrics.timing(speculative)
    results = {
        **metrics.acceptance(speculative),
        "speedup": metrics.speedup(speculative, plain),
        "speedup_vs_transformers": metrics.speedup(speculative, hf) if hf else None,
        "plain_vs_transformers": metrics.speedup(plain, hf) if hf else None,
        "tokens_per_s": {**metrics.stats(len(g.tokens) / g.total_s for g in speculative), "overall": timing["tokens_per_s"]},
        "ttft_ms": timing["ttft_ms"], "tpot_ms": timing["tpot_ms"], "e2e_ms": timing["e2e_ms"],
        "draft_time_fraction": timing["draft_time_fraction"],
        "new_tokens": timing["new_tokens"],
        "lossless": {"checked": len(plain) if sampling.greedy else 0, "identical": identical if sampling.greedy else 0},
        "baselines": {"plain": metrics.timing(plain), **({"transformers": metrics.timing(hf)} if hf else {})},
        "per_prompt": [
            {
                "name": p.name, "category": getattr(p, "category", None), "prompt_tokens": len(p.token_ids), "new_tokens": len(s.tokens),
                "acceptance_length": metrics.acceptance([s])["acceptance_length"],
                "speedup": (len(s.tokens) / s.total_s) / (len(b.tokens) / b.total_s),
                "speculative_ms": s.total_s * 1e3, "plain_ms": b.total_s * 1e3,
                "transformers_ms": h.total_s * 1e3 if h else None,
                "identical_to_plain": s.tokens == b.tokens,
            }
            for p, s, b, h in zip(prompts, speculative, plain, hf or [None] * len(plain))
        ],
        "definitions": metrics.DEFINITIONS,
    }
    if assisted:
        results["assisted_generate"] = {
            "speedup_vs_transformers": metrics.speedup(assisted, hf), "speedup_vs_plain": metrics.speedup(assisted, plain),
            "ours_vs_assisted": metrics.speedup(speculative, assisted), "timing": metrics.timing(assisted),
            "identical_to_plain": sum(a.tokens == b.tokens for a, b in zip(assisted, plain)) if sampling.greedy else None,
        }
    if runs["original"]:
        same = sum(a.tokens == b.tokens for a, b in zip(plain, runs["original"]))
        results["tuned_target"] = {
            "note": "verified by the drafter's tuned target (Medusa-2), so outputs are exactly the tuned target's; "
                    "drift = how often its plain output equals the original target's",
            "identical_to_original": same, "checked": len(plain),
            "token_agreement": metrics.prefix_agreement(plain, runs["original"]),
            "plain_vs_original": metrics.speedup(plain, runs["original"]),
        }
    results["per_category"] = per_category(prompts, speculative, plain)
    if not sampling.greedy:
        results["lossless"]["note"] = "sampled decoding: outputs differ run to run; losslessness is checked by the test suite"
    return results


def per_category(prompts, speculative: list[Generation], plain: list[Generation]) -> dict:
    """For each prompt category (none when no prompt has one), the overall figures over its prompts alone: τ,
    per-position acceptance, speedup vs our plain loop (tokens/s over tokens/s), the draft-time share, tokens/s of
    both, and how many outputs equal plain's."""
    names = sorted({p.category for p in prompts if getattr(p, "category", None)})
    table = {}
    for name in names:
        rows = [i for i, p in enumerate(prompts) if getattr(p, "category", None) == name]
        fast, slow = [speculative[i] for i in rows], [plain[i] for i in rows]
        accepted, timed = metrics.acceptance(fast), metrics.timing(fast)
        table[name] = {"prompts": len(rows), "acceptance_length": accepted["acceptance_length"],
                       "acceptance_per_position": accepted["acceptance_per_position"],
                       "speedup": metrics.speedup(fast, slow), "draft_time_fraction": timed["draft_time_fraction"],
                       "tokens_per_s": timed["tokens_per_s"], "plain_tokens_per_s": metrics.timing(slow)["tokens_per_s"],
                       "identical_to_plain": sum(a.tokens == b.tokens for a, b in zip(fast, slow))}
    return table


def hf_generate(target, prompt: torch.Tensor, sampling: Sampling, max_new_tokens: int, eos: set[int],
                seed: int = 0, **extra) -> Generation:
    """`transformers` `generate()` on the same prompt, timed the same way (no TTFT: it has no hook for it)."""
    options = dict(do_sample=False) if sampling.greedy else dict(
        do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None,
        top_p=sampling.top_p)
    if not sampling.greedy:
        torch.manual_seed(seed)
    pad = target.tokenizer.pad_token_id if target.tokenizer is not None else None
    prompt = prompt.to(target.device)
    start = time.perf_counter()
    output = target.model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens, min_new_tokens=0,
        eos_token_id=sorted(eos) or None, pad_token_id=pad if pad is not None else (min(eos) if eos else 0),
        **options, **extra,
    )
    tokens = output[0, prompt.shape[1]:].tolist()  # waits for the device, so the time below is complete
    return Generation(tokens, None, time.perf_counter() - start)


def environment(target) -> dict:
    """Versions, threads and dtype: what a reader needs to reproduce the timings."""
    import transformers

    from draftsmith.small_batch import installed_rows

    return {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "platform": platform.platform(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "device": str(target.device), "dtype": str(target.dtype).removeprefix("torch."),
        "small_batch_linear_rows": installed_rows(target.model),
    }


def _warm_up(target, proposer, shape, sampling, eos, transformers_baseline: bool, assisted=None) -> None:
    """One short run of each method so one-time costs (allocations, kernel choice) are not timed."""
    ids = torch.tensor([[int(min(eos)) if eos else 0] * 4 + [1, 2, 3, 1, 2]], dtype=torch.long) % target.vocab_size
    speculative_generate(target, proposer, ids, shape, sampling, 8, set(), _generator(0, 0))
    plain_generate(target, ids, sampling, 8, set(), _generator(0, 0))
    if transformers_baseline:
        hf_generate(target, ids, sampling, 8, set())
    if assisted is not None:
        hf_generate(target, ids, sampling, 8, set(), assistant_model=assisted)


def assisted_model(proposer, shape: DraftShape):
    """The proposer's draft model as `generate(assistant_model=...)` takes it, drafting `shape.length` tokens a
    step like our chains (constant schedule, no early stop on confidence), or None for other drafters."""
    model = proposer.assistant_model
    if model is None:
        return None
    config = model.generation_config
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = shape.length, "constant"
    config.assistant_confidence_threshold = 0.0
    return model


def _generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 100_003 + index)


def _progress(items, enabled: bool, label: str):
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=label, unit="prompt", dynamic_ncols=True)
