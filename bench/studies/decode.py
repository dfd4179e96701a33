"""Decode benchmark: our loops against transformers generate(), as ratios measured in one run.

    .venv/bin/python bench/studies/decode.py --num-prompts 10 --max-new-tokens 128

On HumanEval prompts with smollm2-135m-instruct at T=0, interleaved prompt by prompt:
  1. our plain loop vs generate()                                  (goal >= 1.0x)
  2. our prompt-lookup speculation vs generate(prompt_lookup_num_tokens=k)   (goal >= 1.25x);
     ours picks each draft's length up to k from the cost curve below and running acceptance
     rates per match length (drafters/prompt_lookup.py); fixed-length runs are shown beside it
  3. the verify-cost curve t(k)/t(1): one target forward over k tokens at a realistic context,
     and each speculative method's speedup as a fraction of the bound tau * t(1) / t(k+1).
Like `draftsmith eval`, the target's linear layers first get W·xᵀ for the few-row inputs where it is
measured faster (draftsmith/small_batch.py); every method, generate() included, runs those same layers, and
our plain loop is also run with torch's own linear to show what that alone is worth.
Every greedy output is also compared token by token with our plain loop.

Study, not measured: no record of a run is committed (it was listed among the canonical benches without one).
A run still writes its record under results/decode/, which docs/results.md lists but does not render.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for records.py

from draftsmith.drafters import DraftShape, Sampling  # noqa: E402
from draftsmith.drafters.prompt_lookup import Config, PromptLookup  # noqa: E402
from draftsmith import small_batch  # noqa: E402
from draftsmith.eval import metrics  # noqa: E402
from draftsmith.cost import verify_cost_curve  # noqa: E402
from draftsmith.eval.decoder import Generation, eos_ids, plain_generate, speculative_generate  # noqa: E402
from draftsmith.eval.prompts import load_prompts  # noqa: E402
from draftsmith.eval.runner import environment, hf_generate  # noqa: E402
from draftsmith.target import load_target  # noqa: E402

# ----------------------------------------------------------------------------- arguments
import records  # bench/: the shared command line and the run's record

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--draft-length", type=int, default=10, help="k of generate(prompt_lookup_num_tokens=k) and of ours")
parser.add_argument("--also-draft-length", type=int, nargs="*", default=[3],
                    help="more k values to run our prompt lookup at with a fixed length (every draft the full k)")
parser.add_argument("--ngram", type=int, default=3, help="our prompt lookup: longest n-gram")
parser.add_argument("--dtype", default="float32")
parser.add_argument("--no-small-batch-linear", dest="small_batch_linear", action="store_false",
                    help="keep torch's own linear layers (default: W·xᵀ where measured faster, as draftsmith eval)")
records.add_shared_options(parser, target="smollm2-135m-instruct", num_prompts=10, max_new_tokens=128, threads=0,
                           out=None, helps={"out": "also write the numbers as JSON here"})
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything
records.apply_threads(args)

GREEDY = Sampling()
target = load_target(args.target, dtype=args.dtype)
prompts = load_prompts("humaneval", target, args.num_prompts)
eos = eos_ids(target)
k = args.draft_length
tuning = small_batch.tune_and_install(target.model) if args.small_batch_linear else None
fixed = PromptLookup(Config(max_ngram=args.ngram, adaptive=False))


class ForwardCounter:
    """Counts target forwards (to get generate()'s own tau for prompt lookup)."""

    def __init__(self, module):
        self.calls = 0
        module.register_forward_pre_hook(self.count)

    def count(self, *_):
        self.calls += 1


counter = ForwardCounter(target.model)
hf_passes = []  # verify passes per generate(prompt lookup) request


def hf_lookup(ids):
    before = counter.calls
    generation = hf_generate(target, ids, GREEDY, args.max_new_tokens, eos, prompt_lookup_num_tokens=k)
    hf_passes.append(counter.calls - before - 1)  # minus the prefill
    return generation


# ----------------------------------------------------------------------------- verify-cost curve (first: the adaptive lookup uses it)
# A realistic context: the first prompt plus some of its own tokens repeated up to ~prompt + 64.
sizes = sorted({*range(1, max([k, *args.also_draft_length]) + 2), 16, 32})
base = prompts[0].token_ids
context = torch.tensor([(base * (1 + (len(base) + 64 + max(sizes)) // len(base)))[: len(base) + 64 + max(sizes)]])
cost = verify_cost_curve(target, sizes, context, repeats=7)
adaptive = PromptLookup(Config(max_ngram=args.ngram), verify_cost=cost)

METHODS = {
    "plain (ours)": lambda ids: plain_generate(target, ids, GREEDY, args.max_new_tokens, eos),
    "generate()": lambda ids: hf_generate(target, ids, GREEDY, args.max_new_tokens, eos),
    "prompt lookup (ours)": lambda ids: speculative_generate(target, adaptive, ids, DraftShape(k), GREEDY,
                                                            args.max_new_tokens, eos),
    "generate(prompt_lookup)": hf_lookup,
}
if tuning and tuning["rows"]:
    def plain_torch_linear(ids):
        small_batch.remove(target.model)
        try:
            return plain_generate(target, ids, GREEDY, args.max_new_tokens, eos)
        finally:
            small_batch.install(target.model, tuning["rows"])

    METHODS["plain (ours, torch linear)"] = plain_torch_linear
for fixed_k in [k, *args.also_draft_length]:
    METHODS[f"prompt lookup (ours, fixed k={fixed_k})"] = (
        lambda ids, fixed_k=fixed_k: speculative_generate(target, fixed, ids, DraftShape(fixed_k), GREEDY,
                                                          args.max_new_tokens, eos))

# ----------------------------------------------------------------------------- decode, interleaved
warm = torch.tensor([prompts[0].token_ids[:32]])
for run in METHODS.values():
    run(warm)
hf_passes.clear()
runs: dict[str, list[Generation]] = {name: [] for name in METHODS}
for index, prompt in enumerate(prompts):
    ids = torch.tensor([prompt.token_ids])
    order = list(METHODS) if index % 2 == 0 else list(reversed(METHODS))
    for name in order:
        runs[name].append(METHODS[name](ids))
    reference = runs["plain (ours)"][-1].tokens
    same = {name: runs[name][-1].tokens == reference for name in METHODS}
    print(f"[{index + 1}/{len(prompts)}] {prompt.name}: {len(reference)} tokens, identical to our plain loop: "
          + ", ".join(f"{n}={s}" for n, s in same.items()), flush=True)

# ----------------------------------------------------------------------------- report
tps = {name: metrics.timing(gens)["tokens_per_s"] for name, gens in runs.items()}
hf_new = sum(len(g.tokens) - 1 for g in runs["generate(prompt_lookup)"])
drafts = {name: k for name in METHODS if "lookup" in name}  # the most each method drafts per pass
drafts.update({f"prompt lookup (ours, fixed k={extra})": extra for extra in args.also_draft_length})
tau = {name: metrics.acceptance(runs[name])["acceptance_length"] for name in drafts if "ours" in name}
tau["generate(prompt_lookup)"] = hf_new / sum(hf_passes)
identical = {name: sum(g.tokens == p.tokens for g, p in zip(gens, runs["plain (ours)"])) for name, gens in runs.items()}
speedup = {name: tps[name] / (tps["generate()"] if name.startswith("generate") else tps["plain (ours)"]) for name in drafts}
bound = {name: tau[name] * cost[1] / cost[drafts[name] + 1] for name in drafts}
# Prompt lookup often drafts fewer than k tokens (short or no match), so its passes cost less than
# t(k+1): the bound at the draft sizes actually sent is tau * t(1) / mean over passes of t(size+1).
bound_at_sizes = {name: tau[name] * cost[1] / statistics.mean(cost[c.drafted + 1] for g in runs[name] for c in g.cycles)
                  for name in drafts if "ours" in name}
results = {
    "plain_ours_vs_generate": tps["plain (ours)"] / tps["generate()"],
    "prompt_lookup_ours_vs_generate_prompt_lookup": {
        name: tps[name] / tps["generate(prompt_lookup)"] for name in drafts if "ours" in name},
    "speedup_vs_own_plain": speedup,
    "tokens_per_s": tps,
    "acceptance_length": tau,
    "verify_cost_relative": {size: cost[size] / cost[1] for size in sizes},
    "verify_cost_ms": {size: cost[size] * 1e3 for size in sizes},
    "bound": bound,
    "fraction_of_bound": {name: speedup[name] / bound[name] for name in drafts},
    "bound_at_actual_draft_sizes": bound_at_sizes,
    "fraction_of_bound_at_actual_draft_sizes": {name: speedup[name] / bound_at_sizes[name] for name in bound_at_sizes},
    "identical_to_plain_ours": identical,
    "config": vars(args), "context_tokens": context.shape[1] - max(sizes),
    "adaptive_lookup": adaptive.describe(), "environment": environment(target), "small_batch_linear": tuning,
}

print(f"\n{args.target}, {len(prompts)} HumanEval prompts, T=0, {args.max_new_tokens} new tokens, "
      f"{args.dtype}, {torch.get_num_threads()} threads")
for name, value in tps.items():
    print(f"  {name:<30} {value:7.2f} tokens/s   identical to our plain loop: {identical[name]}/{len(prompts)}")
print(f"our plain loop / generate(): {results['plain_ours_vs_generate']:.2f}x  (goal >= 1.0)")
if "plain (ours, torch linear)" in tps:
    print(f"our plain loop with W·xᵀ for rows {tuning['rows']} / with torch's linear: "
          f"{tps['plain (ours)'] / tps['plain (ours, torch linear)']:.2f}x")
for name, ratio in results["prompt_lookup_ours_vs_generate_prompt_lookup"].items():
    print(f"{name} / generate(prompt_lookup_num_tokens={k}): {ratio:.2f}x  (goal >= 1.25)")
print(f"verify cost t(k)/t(1) at {context.shape[1] - max(sizes)} tokens of context: "
      + ", ".join(f"k={s}: {cost[s] / cost[1]:.2f}" for s in sizes if s in (1, 2, 4, 8, 16, 32) or s - 1 in drafts.values()) + f"  (t(1) = {cost[1] * 1e3:.1f} ms)")
for name in drafts:
    # The adaptive lookup sends drafts of any length up to k, so only the bound at the sizes it sent applies.
    full_k = "" if name == "prompt lookup (ours)" else (
        f", bound tau*t(1)/t({drafts[name] + 1}) = {bound[name]:.2f}x, measured {results['fraction_of_bound'][name]:.0%} of it")
    print(f"  {name:<30} tau {tau[name]:.2f}, speedup over its own plain {speedup[name]:.2f}x{full_k}"
          + (f"; bound at the draft sizes actually sent {bound_at_sizes[name]:.2f}x, measured "
             f"{results['fraction_of_bound_at_actual_draft_sizes'][name]:.0%} of it" if name in bound_at_sizes else ""))
if args.out:
    Path(args.out).write_text(json.dumps(results, indent=2, default=str) + "\n")
records.write("decode", results, args)
print("adaptive prompt lookup, acceptance per drafted token by match: "
      + ", ".join(f"{key} {rate:.2f}" for key, rate in adaptive.describe()["acceptance_by_match"].items()))
