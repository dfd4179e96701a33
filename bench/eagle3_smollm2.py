"""EAGLE-3 on SmolLM2-135M: train under a stated CPU budget, then measure, all in one run.

    .venv/bin/python bench/eagle3_smollm2.py --minutes 60 --num-prompts 40 --vocab-sizes 4096 8192 16384

For each draft-vocabulary size: train the default recipe (recipes/smollm2-135m/eagle3.yaml) for
--minutes of wall time (train.max_minutes ends it; the step count a 16-step probe measures for the budget
sets the validation interval and, three times over, only a ceiling, so a probe that other load slowed cannot end
training early); an offline
recipe first captures the features once into OUT/features, and that capture is charged to every
drafter's budget), evaluating on the held-out split 5 times (best/ is kept by the implied τ, as the
recipe says), then decode the same HumanEval prompts at T=0, interleaved prompt by prompt, with: our plain
loop, EAGLE-3 chains of each --draft-length, EAGLE-3 trees of each --tree, our prompt lookup and
generate(prompt_lookup_num_tokens) (our plain
loop against plain generate() is bench/studies/decode.py's job). --narrow-to N also decodes chains with each
trained head cut to its N most frequent tokens (Drafter.narrow_vocab), which prices the head's size
without training again. As in `draftsmith eval`, the target's linear
layers first take the few-row form draftsmith/small_batch.py routes each row count to; every method runs those same
layers.
Prints best/'s held-out per-step accuracy, τ, speedups as ratios measured in this run, the draft-time
fraction, training tokens/s relative to target-forward-only tokens/s (online or offline, as the recipe
trains), and peak memory (RSS) of the whole run.
Goals on a 2-core CPU (issue 5): τ >= 3.0 chains, >= 3.5 trees; >= 1.7x our plain loop and
>= 1.5x generate(prompt_lookup); the default recipe under 6 GiB.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import PROBE_STEPS, PROBE_WARMUP, decode_interleaved, kept_as_best, steps_for, train  # noqa: E402
from common import forward_tokens_per_s as measure_forward, train_tokens_per_s as train_tokens_per_s_of  # noqa: E402
from draftsmith.config import load  # noqa: E402
from draftsmith.data.prepared import load_token_counts  # noqa: E402
from draftsmith.drafters import DraftShape, Sampling, kind_module  # noqa: E402
from draftsmith.drafters.prompt_lookup import Config as LookupConfig, PromptLookup  # noqa: E402
from draftsmith import small_batch  # noqa: E402
from draftsmith.eval import metrics  # noqa: E402
from draftsmith.eval.decoder import eos_ids, plain_generate, speculative_generate  # noqa: E402
from draftsmith.eval.prompts import load_prompts  # noqa: E402
from draftsmith.eval.runner import environment, hf_generate  # noqa: E402
from draftsmith.train import pipeline  # noqa: E402
from draftsmith.train.config import TrainConfig  # noqa: E402
from draftsmith.train.recipe import TrainRecipe  # noqa: E402

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m" / "eagle3.yaml"

import records  # bench/: the shared command line and the run's record

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--minutes", type=float, default=60.0, help="training wall-time budget per drafter")
parser.add_argument("--vocab-sizes", type=int, nargs="+", default=[8192, 16384], help="draft vocabulary sizes to compare")
parser.add_argument("--vocab-from", default=None,
                    help="prepared-data folder whose token counts pick the draft vocabularies (default: the training data; "
                         "regenerated data can hold fewer distinct tokens than a vocabulary needs)")
parser.add_argument("--narrow-to", type=int, nargs="*", default=[],
                    help="also decode chains with each trained head narrowed to its N most frequent tokens in the training "
                         "data (Drafter.narrow_vocab: no retraining; prices the head's size at decode time)")
parser.add_argument("--draft-length", type=int, nargs="+", default=[2, 3], help="EAGLE-3 chain lengths decoded")
parser.add_argument("--tree", nargs="*", default=["3,4,8"], help="EAGLE-3 trees decoded, each DEPTH,TOPK,TOTAL")
parser.add_argument("--lookup-length", type=int, default=10, help="k of both prompt-lookup methods")
parser.add_argument("--reuse", action="store_true",
                    help="skip the probe and training: decode with the drafters a previous run of this bench left in --out "
                         "(its training figures are carried over from that run's bench.json, written as soon as its training ended)")
parser.add_argument("--set", nargs="*", default=[], metavar="SECTION.FIELD=VALUE",
                    help="extra overrides of the recipe for every drafter, e.g. drafter.ttt_steps=5")
records.add_shared_options(parser, num_prompts=40, max_new_tokens=128, out="runs/bench-eagle3", threads=0,
                           helps={"num_prompts": "HumanEval prompts decoded per drafter",
                                  "out": "where runs and bench.json go"})
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything
records.apply_threads(args)
out = Path(args.out)
SHARED = [f"data.features={out / 'features'}", "report.num_prompts=0", *args.set]  # what every run here sees
recipe = load(TrainConfig, RECIPE, SHARED)


def train_config(name: str, *overrides: str) -> TrainConfig:
    """The recipe for one of this bench's runs; a previous bench run's folder of that name is removed."""
    if (out / name).exists():
        print(f"removing the previous bench run {out / name}", flush=True)
        shutil.rmtree(out / name)
    return load(TrainConfig, RECIPE, [f"output_dir={out / name}", *SHARED, *overrides])


# ----------------------------------------------------------------------------- data and probe
def probe_and_train():
    """Prepare, probe the seconds per step, train one drafter per vocab size; (target, training figures, drafters)."""
    base = train_config("probe")
    target = TrainRecipe(base).load_target()
    began = time.perf_counter()
    pipeline.ensure_prepared(base, target)  # regenerated data (--set prepare.regenerate=true) costs most here
    prepare_minutes = (time.perf_counter() - began) / 60
    from draftsmith.data.vocab import build_draft_vocab, save_draft_vocab  # noqa: E402

    counts = load_token_counts(args.vocab_from or base.data.prepared)
    from draftsmith.data.capture import TokenDataset  # noqa: E402
    from draftsmith.data.prepared import load_prepared  # noqa: E402
    from draftsmith.drafters import eagle  # noqa: E402
    from draftsmith.train.data import capture_once  # noqa: E402

    prepared = load_prepared(base.data.prepared, target)
    split = TokenDataset(prepared["train"])
    layers = eagle.create(eagle.Config(), target).required_layers
    capture_minutes = 0.0
    if not base.data.online:  # captured once, charged to every drafter's budget as if each captured its own
        began = time.perf_counter()
        capture_once(base.data, target, layers, prepared["train"])
        capture_minutes = (time.perf_counter() - began) / 60
    vocabs = {size: out / f"vocab-{size}" for size in args.vocab_sizes}
    for size, folder in vocabs.items():
        save_draft_vocab(folder, build_draft_vocab(counts, size))
    probe = train(train_config("probe", f"data.draft_vocab={vocabs[args.vocab_sizes[0]]}",
                               f"train.max_steps={PROBE_STEPS}", "train.eval_every=0",
                               "train.checkpoint_every=0", "eval.num_prompts=0", "eval.batches=1"), target)
    train_tokens_per_s = train_tokens_per_s_of(out / "probe", skip=PROBE_WARMUP)
    forward_tokens_per_s = measure_forward(target, split, base, probe.layers)

    # one drafter per vocab size. The probe's few batches can be far shorter or longer than the average
    # one, so the step count comes from its tokens/s and the mean tokens per batch of the whole split.
    steps, mean_step_tokens = steps_for(args.minutes - capture_minutes, train_tokens_per_s, split, base)
    print(f"probe: {train_tokens_per_s:.0f} tokens/s ({'online' if base.data.online else 'offline'}), "
          f"{mean_step_tokens:.0f} tokens per step on average -> {steps} steps for {args.minutes:g} minutes per "
          f"drafter ({capture_minutes:.1f} of them capturing)", flush=True)
    drafters = {}
    for size, vocab_dir in vocabs.items():
        began = time.perf_counter()
        every = f"{max(steps // 5, 1)}"
        run = train(train_config(f"eagle3-v{size}", f"train.max_steps={3 * steps}", f"data.draft_vocab={vocab_dir}",
                                 f"train.eval_every={every}", f"train.checkpoint_every={every}",
                                 f"train.max_minutes={args.minutes - capture_minutes:.3f}"), target)
        drafters[size] = {"folder": out / f"eagle3-v{size}" / "best", "train_minutes": (time.perf_counter() - began) / 60,
                          "steps_trained": run.step, "held_out": kept_as_best(out / f"eagle3-v{size}")}
    training = {"prepare_minutes": prepare_minutes, "capture_minutes": capture_minutes,
                "training_minutes_budget": args.minutes, "steps": steps,
                "seconds_per_step": mean_step_tokens / train_tokens_per_s, "online": base.data.online,
                "training_tokens_per_s": train_tokens_per_s, "target_forward_tokens_per_s": forward_tokens_per_s,
                "training_over_forward": train_tokens_per_s / forward_tokens_per_s}
    return target, training, drafters


def drafters_summary(drafters: dict) -> dict:
    """bench.json's "drafters": what --reuse reads back."""
    return {str(k): {"folder": str(v["folder"]), "sha256": records.drafter_sha256(v["folder"]),
                     "train_minutes": v["train_minutes"],
                     "steps_trained": v["steps_trained"], "held_out": v["held_out"]}
            for k, v in drafters.items()}


if args.reuse:
    previous = json.loads((out / "bench.json").read_text())
    training = {key: previous.get(key) for key in ("prepare_minutes", "capture_minutes", "training_minutes_budget",
                                               "steps", "seconds_per_step", "online", "training_tokens_per_s",
                                               "target_forward_tokens_per_s", "training_over_forward")}
    drafters = {int(size): {"folder": Path(info["folder"]), "train_minutes": info["train_minutes"],
                            "steps_trained": info.get("steps_trained"), "held_out": info.get("held_out") or {}}
                for size, info in previous["drafters"].items()}
    print(f"reusing the drafters of {out / 'bench.json'}: " + ", ".join(str(d["folder"]) for d in drafters.values()))
    target = TrainRecipe(recipe).load_target()
else:
    target, training, drafters = probe_and_train()
    # the training half now: a decode stopped part-way can be redone with --reuse (the end rewrites the file whole)
    (out / "bench.json").write_text(json.dumps({**training, "drafters": drafters_summary(drafters)}, indent=2,
                                               default=str))

# ----------------------------------------------------------------------------- decode, interleaved
training_counts = load_token_counts(recipe.data.prepared).double() if args.narrow_to else None
if args.narrow_to and args.vocab_from:  # tokens the training data never shows: ordered by the counts that chose the vocabulary
    vocab_counts = load_token_counts(args.vocab_from).double()
    training_counts = training_counts * (vocab_counts.max() + 1) + vocab_counts
GREEDY = Sampling()
prompts = load_prompts("humaneval", target, args.num_prompts)
eos = eos_ids(target)
trees = [tuple(int(v) for v in spec.split(",")) for spec in args.tree]
tuning = small_batch.tune_and_install(target.model)
lookup = PromptLookup(LookupConfig())
lookup.calibrate(target, args.lookup_length)  # adaptive draft lengths, as draftsmith eval does
methods = {
    "plain (ours)": lambda ids: plain_generate(target, ids, GREEDY, args.max_new_tokens, eos),
    "prompt lookup (ours)": lambda ids: speculative_generate(target, lookup, ids, DraftShape(args.lookup_length),
                                                            GREEDY, args.max_new_tokens, eos),
    "generate(prompt_lookup)": lambda ids: hf_generate(target, ids, GREEDY, args.max_new_tokens, eos,
                                                       prompt_lookup_num_tokens=args.lookup_length),
}
for size, info in drafters.items():
    proposer = kind_module("eagle").load_proposer(info["folder"], target)
    small_batch.install_on_proposer(proposer, target, tuning["rows"])  # as draftsmith eval does
    for length in args.draft_length:
        methods[f"eagle3 v{size} chain {length}"] = (lambda ids, p=proposer, k=length: speculative_generate(
            target, p, ids, DraftShape(k), GREEDY, args.max_new_tokens, eos))
    for tree in trees:
        methods[f"eagle3 v{size} tree {','.join(map(str, tree))}"] = (lambda ids, p=proposer, t=tree: speculative_generate(
            target, p, ids, DraftShape(tree=t), GREEDY, args.max_new_tokens, eos))
    for narrow in [n for n in args.narrow_to if n < size]:
        narrowed = kind_module("eagle").load_proposer(info["folder"], target)
        narrowed.drafter.narrow_vocab(training_counts, narrow)
        small_batch.install_on_proposer(narrowed, target, tuning["rows"])
        for length in args.draft_length:
            methods[f"eagle3 v{size}->{narrow} chain {length}"] = (lambda ids, p=narrowed, k=length: speculative_generate(
                target, p, ids, DraftShape(k), GREEDY, args.max_new_tokens, eos))

runs = decode_interleaved(methods, prompts)

# ----------------------------------------------------------------------------- report
plain = runs["plain (ours)"]
tps = {name: metrics.timing(gens)["tokens_per_s"] for name, gens in runs.items()}
rows = {}
for name, gens in runs.items():
    row = {"tokens_per_s": tps[name], "speedup_vs_plain": tps[name] / tps["plain (ours)"],
           "speedup_vs_generate_prompt_lookup": tps[name] / tps["generate(prompt_lookup)"],
           "identical_to_plain": sum(g.tokens == p.tokens for g, p in zip(gens, plain))}
    if any(g.cycles for g in gens):
        row.update(acceptance_length=metrics.acceptance(gens)["acceptance_length"],
                   draft_time_fraction=metrics.timing(gens).get("draft_time_fraction"))
    rows[name] = row
peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
summary = {
    **training, "reused_drafters": args.reuse,
    "peak_rss_gib": peak_gib, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
    "drafters": drafters_summary(drafters),
    "methods": rows, "environment": environment(target), "small_batch_linear": tuning,
}
(out / "bench.json").write_text(json.dumps(summary, indent=2, default=str))
records.write("eagle3_smollm2", summary, args)
print(f"\nprepare {training['prepare_minutes'] or 0:.1f} min (0 when the data was already prepared); capture "
      f"{training.get('capture_minutes') or 0:.1f} min; "
      + ", ".join(f"v{size} trained {info['train_minutes']:.1f} min, {info.get('steps_trained')} of "
                  f"{training.get('steps')} planned steps" for size, info in drafters.items()))
for size, info in drafters.items():
    best = info["held_out"]
    if best:
        print(f"v{size} best/ (step {best['step']}): held-out acc 0 {best['acc_0']:.3f}, acc 1 {best['acc_1']:.3f}, "
              f"implied τ {best['implied_acceptance_length']:.3f}")
print(f"{'online' if training.get('online') else 'offline'} training {training['training_tokens_per_s']:.0f} tok/s vs "
      f"target forward only {training['target_forward_tokens_per_s']:.0f} tok/s -> {training['training_over_forward']:.2f}x"
      f"{' (carried over from the run that trained the drafters)' if args.reuse else ''}; peak RSS {peak_gib:.2f} GiB")
print(f"{'method':<28} {'tok/s':>7} {'τ':>5} {'vs plain':>9} {'vs gen(PLD)':>12} {'draft frac':>11} identical")
for name, row in rows.items():
    tau = f"{row['acceptance_length']:.2f}" if "acceptance_length" in row else "-"
    frac = f"{row['draft_time_fraction']:.2f}" if row.get("draft_time_fraction") is not None else "-"
    print(f"{name:<28} {row['tokens_per_s']:7.2f} {tau:>5} {row['speedup_vs_plain']:8.2f}x "
          f"{row['speedup_vs_generate_prompt_lookup']:11.2f}x {frac:>11} {row['identical_to_plain']}/{len(prompts)}")
print(f"wrote {out / 'bench.json'}")
