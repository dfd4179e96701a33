"""Long-context benchmark: does speculation keep its speedup as the prompt grows? Ratios from one run.

    PYTHONPATH=. .venv/bin/python bench/studies/long_context.py --drafter runs/quick/best --contexts 256 2048 8192

Each HumanEval prompt gets N tokens of real code in front of it (standard-library sources, the ones
the built-in corpus `builtin:stdlib` is made from, a different stretch per prompt). At every N, in one
process and interleaved prompt by prompt, it decodes with: our plain loop, prompt lookup (chain), and
the trained drafter as a chain and as a tree. Printed per method and N:
  - decode tokens/s (new tokens after the first / time after the first token: the prefill, equal for
    every method and dominant at long context, is left out) and speedup over the plain loop;
  - per cycle: the verify pass, the rollback (KV-cache keep/crop + committed features) and the drafter;
    beside the rollback, what re-indexing the whole cache (the old tree rollback) costs at that context;
  - prompt lookup's matching cost per cycle with the incremental n-gram index and with a full scan.
Goals (issue 18): each method's speedup at the largest N within 10% of its speedup at the smallest N;
rollback < 2% of a verify pass at every N. Every greedy output is compared with the plain loop's.

Study, not measured: no record of a run is committed (it was listed among the canonical benches without one).
A run still writes its record under results/long_context/, which docs/results.md lists but does not render.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for records.py

from draftsmith.data.corpus import stdlib_functions  # noqa: E402
from draftsmith.drafters import DraftShape, Sampling  # noqa: E402
from draftsmith.drafters.prompt_lookup import Config, PromptLookup  # noqa: E402
from draftsmith.eval import decoder  # noqa: E402
from draftsmith.eval.prompts import read_conversations  # noqa: E402
from draftsmith.eval.runner import environment, load_drafter  # noqa: E402
from draftsmith.target import load_target  # noqa: E402

# ----------------------------------------------------------------------------- arguments
import records  # bench/: the shared command line and the run's record

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--drafter", required=True, help="a trained drafter folder (e.g. runs/quick/best)")
parser.add_argument("--contexts", type=int, nargs="+", default=[256, 2048, 8192], help="tokens of code before each prompt")
parser.add_argument("--draft-length", type=int, default=4, help="chains: tokens per draft (prompt lookup: at most)")
parser.add_argument("--tree", default="4,4,16", help="the drafter's tree: DEPTH,TOPK,TOTAL")
parser.add_argument("--dtype", default="float32")
records.add_shared_options(parser, target="smollm2-135m-instruct", num_prompts=2, max_new_tokens=48, threads=0,
                           out=None, helps={"out": "also write the numbers as JSON here"})
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything
records.apply_threads(args)

GREEDY = Sampling()
target = load_target(args.target, dtype=args.dtype)
tokenizer = target.tokenizer
eos = decoder.eos_ids(target)
drafter = load_drafter(args.drafter, target)
drafter_sha256 = records.drafter_sha256(args.drafter)  # the drafter measured, by content
lookup = PromptLookup(Config(max_ngram=3))
lookup.calibrate(target, args.draft_length)
tree = tuple(int(v) for v in args.tree.split(","))

# ----------------------------------------------------------------------------- rollback timing
# The decoder's rollback (keep_cache + committed features) is timed by wrapping the two calls; the
# wrappers only add two clock reads. The last cache of a tree request is kept to time the old rollback.
rollback_s: list[float] = []
last_cache: list[DynamicCache] = []
keep_cache, append = decoder.keep_cache, decoder.GrowingFeatures.append


def timed_keep_cache(cache, start, keep):
    began = time.perf_counter()
    keep_cache(cache, start, keep)
    rollback_s.append(time.perf_counter() - began)
    last_cache[:] = [cache]


def timed_append(self, new):
    began = time.perf_counter()
    views = append(self, new)
    rollback_s[-1] += time.perf_counter() - began
    return views


decoder.keep_cache, decoder.GrowingFeatures.append = timed_keep_cache, timed_append


def old_rollback_s(cache: DynamicCache, path_length: int = 3, repeats: int = 5) -> float:
    """Median time of the old tree rollback on `cache`: re-index every layer's whole keys and values."""
    length = cache.get_seq_length()
    index = torch.cat([torch.arange(length - path_length - 1), torch.tensor([length - 3, length - 2, length - 1])])
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        for layer in cache.layers:
            layer.keys.index_select(-2, index), layer.values.index_select(-2, index)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


# ----------------------------------------------------------------------------- prompts with N tokens of code in front
def code_tokens(total: int) -> list[int]:
    """Enough standard-library functions, in the corpus's file order, for `total` tokens."""
    ids: list[int] = []
    for entry in stdlib_functions():
        ids += tokenizer(entry["code"] + "\n\n\n", add_special_tokens=False)["input_ids"]
        if len(ids) >= total:
            return ids[:total]
    raise SystemExit(f"the standard library holds fewer than {total} tokens of functions")


conversations = read_conversations("humaneval")[: args.num_prompts]
code = code_tokens(max(args.contexts) * (args.num_prompts + 1))


def prompt_ids(index: int, context: int) -> torch.Tensor:
    """Prompt `index` with `context` tokens of code (its own stretch of the library) before the task."""
    name, messages = conversations[index]
    stretch = tokenizer.decode(code[index * max(args.contexts) :][:context])
    task = messages[-1]["content"]
    user = {"role": "user", "content": f"Some code from the project:\n```python\n{stretch}\n```\n\n{task}"}
    text = tokenizer.apply_chat_template([*messages[:-1], user], tokenize=False, add_generation_prompt=True)
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


METHODS = {
    "plain": lambda ids: decoder.plain_generate(target, ids, GREEDY, args.max_new_tokens, eos),
    "prompt lookup (chain)": lambda ids: decoder.speculative_generate(
        target, lookup, ids, DraftShape(args.draft_length), GREEDY, args.max_new_tokens, eos),
    "drafter (chain)": lambda ids: decoder.speculative_generate(
        target, drafter, ids, DraftShape(args.draft_length), GREEDY, args.max_new_tokens, eos),
    "drafter (tree)": lambda ids: decoder.speculative_generate(
        target, drafter, ids, DraftShape(tree=tree), GREEDY, args.max_new_tokens, eos),
}


# ----------------------------------------------------------------------------- prompt lookup's matching cost
def full_scan(tokens: torch.Tensor, length: int, ngrams=(3, 2, 1)) -> torch.Tensor | None:
    """The search the n-gram index replaced: compare the suffix with every earlier window."""
    for n in ngrams:
        starts = (tokens.unfold(0, n, 1)[:-1] == tokens[-n:]).all(1).nonzero().flatten() + n
        full = starts[starts + length <= tokens.numel()]
        if full.numel():
            return tokens[int(full[-1]) : int(full[-1]) + length]
    return None


def matching_cost(tokens: torch.Tensor, cycles: int = 30, step: int = 3) -> dict[str, float]:
    """Per-cycle seconds of the chain match, as the committed tokens grow by `step` a cycle."""
    index = PromptLookup(Config(max_ngram=3))
    start = tokens.numel() - cycles * step
    index.continuations(tokens[:start], args.draft_length, 1)  # the prompt is indexed once per request
    timings: dict[str, list[float]] = {"index": [], "full scan": []}
    for cycle in range(1, cycles + 1):
        seen = tokens[: start + cycle * step]
        began = time.perf_counter()
        ours = index.continuations(seen, args.draft_length, 1)
        middle = time.perf_counter()
        theirs = full_scan(seen, args.draft_length)
        timings["index"].append(middle - began)
        timings["full scan"].append(time.perf_counter() - middle)
        assert (ours[0][1].tolist() if ours else None) == (None if theirs is None else theirs.tolist())
    return {name: statistics.median(values) for name, values in timings.items()}


# ----------------------------------------------------------------------------- decode, interleaved
warm = prompt_ids(0, 32)
for run in METHODS.values():
    run(warm)
results: dict[int, dict] = {}
for context in args.contexts:
    runs = {name: [] for name in METHODS}
    rollbacks = {name: [] for name in METHODS}
    old_rollbacks: list[float] = []
    for index in range(args.num_prompts):
        ids = prompt_ids(index, context)
        for name in METHODS if index % 2 == 0 else reversed(METHODS):
            rollback_s.clear()
            runs[name].append(METHODS[name](ids))
            rollbacks[name] += rollback_s
            if name == "drafter (tree)":
                old_rollbacks.append(old_rollback_s(last_cache[0]))
        same = {name: runs[name][-1].tokens == runs["plain"][-1].tokens for name in METHODS}
        print(f"N={context} [{index + 1}/{args.num_prompts}] {ids.shape[1]} prompt tokens, identical to plain: {same}",
              flush=True)
    row = {}
    for name, gens in runs.items():
        decode_s = sum(g.total_s - g.ttft_s for g in gens)
        cycles = [c for g in gens for c in g.cycles]
        entry = {"tokens_per_s": sum(len(g.tokens) - 1 for g in gens) / decode_s,
                 "identical": sum(g.tokens == p.tokens for g, p in zip(gens, runs["plain"]))}
        if cycles:
            verify = statistics.mean(c.verify_s for c in cycles) - statistics.mean(rollbacks[name])
            entry.update(acceptance_length=sum(c.emitted for c in cycles) / len(cycles), verify_ms=verify * 1e3,
                         rollback_ms=statistics.mean(rollbacks[name]) * 1e3,
                         rollback_fraction=statistics.mean(rollbacks[name]) / verify,
                         draft_ms=statistics.mean(c.draft_s for c in cycles) * 1e3,
                         draft_fraction=statistics.mean(c.draft_s for c in cycles) / verify)
        row[name] = entry
    for name in METHODS:
        row[name]["speedup"] = row[name]["tokens_per_s"] / row["plain"]["tokens_per_s"]
    row["old_tree_rollback_ms"] = statistics.mean(old_rollbacks) * 1e3
    row["old_tree_rollback_fraction"] = statistics.mean(old_rollbacks) / (row["drafter (tree)"]["verify_ms"] / 1e3)
    row["prompt_lookup_matching_ms"] = {k: v * 1e3 for k, v in matching_cost(prompt_ids(0, context)[0]).items()}
    row["prompt_tokens"] = statistics.mean(prompt_ids(i, context).shape[1] for i in range(args.num_prompts))
    results[context] = row

# ----------------------------------------------------------------------------- report
print(f"\n{args.target} ({args.dtype}, {torch.get_num_threads()} threads), {args.num_prompts} HumanEval prompts "
      f"with N tokens of stdlib code in front, T=0, {args.max_new_tokens} new tokens; drafter {args.drafter}, "
      f"chain k={args.draft_length}, tree {args.tree}")
for context, row in results.items():
    print(f"\nN={context} (prompt {row['prompt_tokens']:.0f} tokens)")
    for name in METHODS:
        entry = row[name]
        line = f"  {name:<22} {entry['tokens_per_s']:6.2f} tok/s  speedup {entry['speedup']:.2f}x  identical {entry['identical']}"
        if "verify_ms" in entry:
            step_ms = 1e3 / row["plain"]["tokens_per_s"]  # one plain decoding step
            line += (f"  tau {entry['acceptance_length']:.2f}  verify {entry['verify_ms']:.1f} ms "
                     f"({entry['verify_ms'] / step_ms:.2f} plain steps)  rollback "
                     f"{entry['rollback_ms']:.3f} ms ({entry['rollback_fraction']:.2%})  drafter {entry['draft_ms']:.1f} ms "
                     f"({entry['draft_fraction']:.0%} of verify)")
        print(line)
    print(f"  old tree rollback (re-index the whole cache): {row['old_tree_rollback_ms']:.2f} ms "
          f"({row['old_tree_rollback_fraction']:.1%} of a tree verify pass)")
    matching = row["prompt_lookup_matching_ms"]
    print(f"  prompt lookup matching per cycle: n-gram index {matching['index']:.3f} ms, full scan {matching['full scan']:.3f} ms")
low, high = min(results), max(results)
summary = {}
for name in METHODS:
    if name != "plain":
        ratio = results[high][name]["speedup"] / results[low][name]["speedup"]
        worst = max(results[c][name]["rollback_fraction"] for c in results)
        summary[name] = {"speedup_ratio": ratio, "worst_rollback_fraction": worst}
        print(f"{name:<22} speedup at N={high} / at N={low}: {ratio:.2f} (goal 0.90-1.10: "
              f"{'met' if abs(ratio - 1) <= 0.10 else 'NOT met'}); worst rollback {worst:.2%} of verify "
              f"(goal < 2%: {'met' if worst < 0.02 else 'NOT met'})")
measured = {"results": results, "summary": summary, "config": {**vars(args), "drafter_sha256": drafter_sha256}, "environment": environment(target)}
if args.out:
    Path(args.out).write_text(json.dumps(measured, indent=2, default=str) + "\n")
records.write("long_context", measured, args)
