"""Drafter families on SmolLM2-135M at the same CPU budget, measured side by side in one run.

    .venv/bin/python bench/families.py --minutes 20 --num-prompts 40 --families eagle3 draft-lm \
        --set data.prepared=runs/bench-complete/data 'prepare.input=[builtin:stdlib-complete]' prepare.regenerate=true

Each family is its shipped recipe, recipes/smollm2-135m/<family>.yaml, on the same prepared data: the first
family's (by default the default recipe's general mix, answered by the target); every run takes that recipe's prepare
options and prepared folder (and a draft vocabulary from there when its recipe has one), an offline recipe captures
its features from it once, under OUT, and --set applies to all of them. Per family: a
short probe measures its training tokens/s, it trains for about --minutes of wall time (steps = budget /
seconds per step), and its held-out accuracy per step or head is read from its last validation.
Then the same HumanEval prompts are decoded at T=0, interleaved prompt by prompt, with our plain loop,
transformers generate(), our prompt lookup, suffix matching, every family as a chain (--draft-length) and as an
EAGLE-2 tree (--tree), each under the running-acceptance fallback as `draftsmith eval` decodes it (lengths and depths
down to plain steps with probes; --fallback false: whole chains and trees), the hybrid of suffix matching and a
family's drafter (--hybrid; by default the first family), and a draft LM also in generate(assistant_model=...). Medusa-2 heads are verified by their
tuned target, whose plain loop runs too: their outputs must equal it, and how often it equals the original
target's is printed. Printed per method: tokens/s, τ, per-position acceptance, draft-time fraction, the drafter's cost per drafted token over the target's per
token, speedup vs our plain loop and vs generate(), outputs identical to plain; per family: training
tokens/s against target-forward-only tokens/s, held-out accuracy, trainable parameters, and for a draft
LM its parameters, one cached step against the target's and its lm_head's share of that step; and the
peak RSS of the whole run. --family adds a decoded run of a recipe with overrides under its own name (DFlash at
B = 16, EAGLE-3 with a chain of 7); --variant adds an A/B run of one recipe option (trained at the same budget,
compared on held-out accuracy, not decoded); --dynamic also decodes a Medusa family's dynamic tree. A drafter that cuts its drafts by confidence under the verify-cost
curve (DSpark and DFlash; EAGLE, MTP and Medusa with --cut) is calibrated on the target and also decoded uncut,
drafting whole chains without the fallback. Per method also the drafter's
milliseconds per verify cycle; per family its held-out accuracy per step, head or block position beside the τ it
implies and the τ decoded. Results go to OUT/bench.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import decode_interleaved, forward_tokens_per_s, method_rows, read_log, steps_for, train  # noqa: E402
from common import step_costs, train_tokens_per_s, whole_chains  # noqa: E402
from draftsmith.config import load  # noqa: E402
from draftsmith.data.capture import TokenDataset  # noqa: E402
from draftsmith.data.prepared import load_prepared  # noqa: E402
from draftsmith.drafters import DraftShape, Sampling  # noqa: E402
from draftsmith.export.readers import load_proposer as load_drafter_folder  # noqa: E402
from draftsmith.drafters.prompt_lookup import Config as LookupConfig, PromptLookup  # noqa: E402
from draftsmith import small_batch  # noqa: E402
from draftsmith.eval.decoder import eos_ids, plain_generate, speculative_generate  # noqa: E402
from draftsmith.eval.prompts import load_prompts  # noqa: E402
from draftsmith.drafters.suffix import Config as SuffixConfig  # noqa: E402
from draftsmith.eval.runner import (  # noqa: E402
    assisted_model, environment, falls_back_by_default, hf_generate, load_drafter, with_fallback,
)
from draftsmith.train import pipeline  # noqa: E402
from draftsmith.train.config import TrainConfig  # noqa: E402
from draftsmith.train.recipe import TrainRecipe  # noqa: E402
from draftsmith.train.validate import implied_acceptance_length, step_accuracies  # noqa: E402

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m"

import records  # bench/: the shared command line and the run's record

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--families", nargs="+",
                    default=["eagle3", "eagle1", "mtp", "medusa1", "medusa2", "dflash", "dspark", "draft-lm"],
                    help="recipes of recipes/smollm2-135m/ to train and compare (file names without .yaml); the "
                         "first one's data is every family's (default: every family, the default recipe first)")
parser.add_argument("--variant", nargs="+", action="append", default=[], metavar="NAME RECIPE [OVERRIDE]",
                    help="an extra run of a family's recipe with overrides (e.g. --variant draft-lm-fresh draft-lm "
                         "drafter.freeze_embeddings=false), trained at the same budget and compared on held-out "
                         "accuracy (not decoded): an A/B of one option; repeat the flag for more")
parser.add_argument("--family", nargs="+", action="append", default=[], metavar="NAME RECIPE [OVERRIDE]",
                    help="an extra family to train and decode: a recipe with overrides under its own name (e.g. --family "
                         "dflash16 dflash drafter.block_size=16 report.draft_length=15); repeat the flag for more")
parser.add_argument("--minutes", type=float, default=20.0, help="training wall-time budget per family")
parser.add_argument("--draft-length", type=int, default=None,
                    help="chain length of every family (default: each recipe's report.draft_length, e.g. a DFlash "
                         "drafter's block size - 1)")
parser.add_argument("--tree", default="4,4,8", help="EAGLE-2 tree DEPTH,TOPK,TOTAL of every family")
parser.add_argument("--trees", nargs="*", default=None, metavar="FAMILY",
                    help="the families also decoded as a tree (default: all; none: --trees with no names)")
parser.add_argument("--cut", nargs="*", default=[], metavar="FAMILY",
                    help="families (EAGLE, MTP, Medusa heads) also decoded with their chains cut by confidence under the "
                         "verify-cost curve; a family whose drafter cuts by default (DSpark, DFlash) always is. Each "
                         "such family is decoded cut ('chain (L)') and uncut ('chain (L), uncut')")
parser.add_argument("--fallback", choices=["true", "false"], default=None,
                    help="chains and trees of every family follow their running acceptance, down to plain steps with "
                         "probes (draftsmith.drafters.fallback); default: `draftsmith eval`'s rule (on for every "
                         "trained family, eval.runner.falls_back_by_default)")
parser.add_argument("--dynamic", nargs="*", default=[], metavar="FAMILY",
                    help="Medusa families also decoded with EAGLE-2's dynamic tree over the heads' probabilities beside "
                         "their static tree (grown from held-out rank accuracies): 'tree (SHAPE), dynamic'")
parser.add_argument("--hybrid", nargs="*", default=None, metavar="FAMILY",
                    help="families also decoded in the hybrid with suffix matching (`draftsmith eval --drafter "
                         "hybrid:DIR`: suffix chains up to --lookup-length beside the family's chain of its draft length, "
                         "in one tree per pass); default: the first family; none: --hybrid with no names")
parser.add_argument("--without", nargs="*", default=[], choices=["generate", "lookup", "suffix"],
                    help="baselines to leave out: transformers generate() (speedups are then against our plain loop "
                         "only), prompt lookup, suffix matching")
parser.add_argument("--lookup-length", type=int, default=10,
                    help="longest prompt-lookup draft; also suffix matching's, alone and in the hybrid")
parser.add_argument("--set", nargs="*", default=[], metavar="SECTION.FIELD=VALUE",
                    help="overrides of every family's recipe (data, prepare, budget-neutral options)")
records.add_shared_options(parser, num_prompts=40, max_new_tokens=128, out="runs/bench-families", threads=0,
                           helps={"out": "where the runs and bench.json go"})
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything
records.apply_threads(args)
out = Path(args.out)
GREEDY = Sampling()


runs_to_train = {family: (family, [], True) for family in args.families}  # name -> (recipe, overrides, decoded)
for flag, decoded, extra in (("--family", True, args.family), ("--variant", False, args.variant)):
    for name, family, *overrides in extra:
        if name in runs_to_train:
            parser.error(f"{flag} {name}: that name is taken")
        runs_to_train[name] = (family, overrides, decoded)
if unknown := set(args.hybrid or []) - set(runs_to_train):
    parser.error(f"--hybrid {' '.join(sorted(unknown))}: not a family or --family run of this bench")


def recipe(family: str, name: str, *overrides: str, data_from: TrainConfig | None = None) -> TrainConfig:
    """A family's recipe for one of this bench's runs (a previous run of that name is removed), reading the
    prepared data of `data_from` (the first family's recipe): its prepare options, its prepared folder, a draft
    vocabulary from there, and for an offline recipe features captured from it once per family under OUT."""
    if (out / name).exists():
        shutil.rmtree(out / name)
    config = load(TrainConfig, RECIPES / f"{family}.yaml",
                  [f"output_dir={out / name}", "report.num_prompts=0", "tracking.report_to=[]", *args.set, *overrides])
    if data_from is not None:
        config.prepare = copy.deepcopy(data_from.prepare)
        config.data.prepared = data_from.data.prepared
        if config.data.draft_vocab:
            config.data.draft_vocab = data_from.data.prepared
        if config.data.features:
            config.data.features = str(out / f"features-{family}")
    return config


# ----------------------------------------------------------------------------- data, probes, training
first = recipe(args.families[0], "prepare")  # only its target, data and prepare sections are used
target = TrainRecipe(first).load_target()  # loaded once, shared by every run
began = time.perf_counter()
pipeline.ensure_prepared(first, target)
prepare_minutes = (time.perf_counter() - began) / 60
split = TokenDataset(load_prepared(first.data.prepared, target)["train"])
families: dict[str, dict] = {}
for name, (family, overrides, decoded) in runs_to_train.items():
    probe = train(recipe(family, f"{name}-probe", *overrides, "train.max_steps=6", "train.eval_every=0",
                         "train.checkpoint_every=0", "eval.num_prompts=0", "eval.batches=1", data_from=first), target)
    tokens_per_s = train_tokens_per_s(out / f"{name}-probe")
    forward = forward_tokens_per_s(target, split, probe.config, probe.layers)
    steps, step_tokens = steps_for(args.minutes, tokens_per_s, split, probe.config)
    print(f"{name}: {tokens_per_s:.0f} training tokens/s ({tokens_per_s / forward:.2f}x target forward) -> {steps} steps "
          f"for {args.minutes:g} min", flush=True)
    began = time.perf_counter()
    run = train(recipe(family, name, *overrides, f"train.max_steps={steps}", f"train.eval_every={max(steps // 3, 1)}",
                       f"train.checkpoint_every={max(steps // 3, 1)}", f"train.max_minutes={args.minutes}",
                       data_from=first), target)
    last_eval = [r for r in read_log(out / name) if r.get("split") == "eval"][-1]
    families[name] = {
        "recipe": family, "overrides": overrides, "variant": not decoded,
        "draft_length": args.draft_length or run.config.report.draft_length,
        "kind": run.kind, "folder": str(out / name / "best"), "sha256": records.drafter_sha256(out / name / "best"),
        "steps": run.step, "best_step": run.best_step,
        "train_minutes": (time.perf_counter() - began) / 60, "training_tokens_per_s": tokens_per_s,
        "target_forward_tokens_per_s": forward, "training_over_forward": tokens_per_s / forward,
        "held_out_accuracy": step_accuracies(last_eval), "validation": last_eval,
        "implied_acceptance_length": implied_acceptance_length(step_accuracies(last_eval)),
        "trainable_parameters": sum(p.numel() for p in run.model.parameters() if p.requires_grad),
    }

# ----------------------------------------------------------------------------- decode, interleaved
prompts = load_prompts("humaneval", target, args.num_prompts)
eos = eos_ids(target)
tree = DraftShape(tree=tuple(int(v) for v in args.tree.split(",")))
rows = small_batch.tune_and_install(target.model)["rows"]  # as draftsmith eval does; every method runs these layers
methods = {"plain": lambda ids: plain_generate(target, ids, GREEDY, args.max_new_tokens, eos)}
if "generate" not in args.without:
    methods["generate"] = lambda ids: hf_generate(target, ids, GREEDY, args.max_new_tokens, eos)
if "lookup" not in args.without:
    lookup = PromptLookup(LookupConfig())
    lookup.calibrate(target, args.lookup_length)
    methods["prompt lookup"] = lambda ids: speculative_generate(target, lookup, ids, DraftShape(args.lookup_length),
                                                                GREEDY, args.max_new_tokens, eos)
if "suffix" not in args.without:
    suffix = load_drafter("suffix", target, suffix_config=SuffixConfig(), draft_budget=args.lookup_length)
    methods["suffix"] = lambda ids: speculative_generate(target, suffix, ids, DraftShape(args.lookup_length),
                                                         GREEDY, args.max_new_tokens, eos)
hybrids = args.families[:1] if args.hybrid is None else args.hybrid
references = {}  # method -> the plain method its outputs must equal (Medusa-2: its tuned target's)
for family, info in families.items():
    proposer = load_drafter_folder(info["folder"], target)  # the one loader `draftsmith eval` uses, any layout
    chain = DraftShape(info["draft_length"])
    cuts = getattr(proposer, "can_cut", False) and (family in args.cut or proposer.confidence_cut)
    if cuts:  # the cut reads the verify-cost curve
        proposer.confidence_cut = True
        proposer.calibrate(target, info["draft_length"])
    verifier = getattr(proposer, "verifier", None) or target  # Medusa-2 heads are verified by their tuned target
    assistant = assisted_model(proposer, chain)
    if assistant is not None:  # a draft model: its own cost per token against the target's, and its head's share
        info["step_costs"] = {"draft": step_costs(assistant), "target": step_costs(target.model)}
        info["draft_step_vs_target"] = info["step_costs"]["draft"]["full_ms"] / info["step_costs"]["target"]["full_ms"]
        info["parameters"] = sum(p.numel() for p in assistant.parameters())
    if info["variant"]:
        continue
    small_batch.install_on_proposer(proposer, target, rows)
    info["fallback"] = falls_back_by_default(info["folder"]) if args.fallback is None else args.fallback == "true"
    drafting = proposer  # what drafts the chains and trees: the drafter under the fallback, as `draftsmith eval` has it
    if info["fallback"]:
        drafting = with_fallback(proposer, target, family, info["draft_length"], tree.tree)
    shapes = [(f"chain ({info['draft_length']})", chain, drafting)]  # (label, shape, the drafter drafting it)
    if args.trees is None or family in args.trees:
        shapes.append((f"tree ({args.tree})", tree, drafting))
    if family in args.dynamic and getattr(proposer, "static", None):  # static against dynamic, the same heads
        dynamic = copy.copy(proposer)
        dynamic.static = None
        shapes.append((f"tree ({args.tree}), dynamic", tree, dynamic))
    if verifier is not target:  # (install_on_proposer gave the verifier the small-batch layers too)
        tuned_plain = f"{family} tuned target, plain"
        methods[tuned_plain] = lambda ids, v=verifier: plain_generate(v, ids, GREEDY, args.max_new_tokens, eos)
        references.update({f"{family} {label}": tuned_plain for label, _, _ in shapes})
    for label, shape, drafter in shapes:
        methods[f"{family} {label}"] = (lambda ids, p=drafter, s=shape, v=verifier: speculative_generate(
            v, p, ids, s, GREEDY, args.max_new_tokens, eos))
    if cuts:  # does the cut pay? the same drafter drafting whole chains
        whole = whole_chains(proposer)
        uncut = f"{family} chain ({info['draft_length']}), uncut"
        methods[uncut] = (lambda ids, p=whole, s=chain, v=verifier: speculative_generate(
            v, p, ids, s, GREEDY, args.max_new_tokens, eos))
        if verifier is not target:
            references[uncut] = references[f"{family} chain ({info['draft_length']})"]
    if family in hybrids:  # suffix chains of --lookup-length beside the family's chain, one tree per pass
        hybrid = load_drafter(f"hybrid:{info['folder']}", target, suffix_config=SuffixConfig(),
                              draft_budget=args.lookup_length, draft_length=info["draft_length"],
                              hybrid_drafter_length=info["draft_length"])
        small_batch.install_on_proposer(hybrid, target, rows)
        methods[f"{family} hybrid"] = (lambda ids, p=hybrid, v=verifier: speculative_generate(
            v, p, ids, DraftShape(args.lookup_length), GREEDY, args.max_new_tokens, eos))
        if verifier is not target:
            references[f"{family} hybrid"] = references[f"{family} chain ({info['draft_length']})"]
    if assistant is not None:
        methods[f"{family} in generate(assistant_model)"] = (lambda ids, a=assistant: hf_generate(
            target, ids, GREEDY, args.max_new_tokens, eos, assistant_model=a))
runs = decode_interleaved(methods, prompts)

# ----------------------------------------------------------------------------- report
baseline = "generate" if "generate" in methods else "plain"
results = method_rows(runs, "plain", baseline, references)
for name, reference in references.items():
    results[name]["identical_to"] = reference
for name in set(references.values()):  # how far each tuned target drifted from the original
    results[name]["identical_to_original"] = sum(a.tokens == b.tokens for a, b in zip(runs[name], runs["plain"]))
peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
summary = {"prepare_minutes": prepare_minutes, "minutes_per_family": args.minutes, "families": families,
           "methods": results, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "peak_rss_gib": peak_gib,
           "environment": environment(target), "small_batch_linear_rows": rows, "overrides": args.set}
out.mkdir(parents=True, exist_ok=True)
(out / "bench.json").write_text(json.dumps(summary, indent=2, default=str))
records.write("families", summary, args)
print(f"\nprepare {prepare_minutes:.1f} min (0 when already prepared); peak RSS {peak_gib:.2f} GiB")
for family, info in families.items():
    accuracy = ", ".join(f"{a:.3f}" for a in info["held_out_accuracy"])
    decoded = results.get(f"{family} chain ({info['draft_length']})", {}).get("acceptance_length")
    print(f"{family}: {info['steps']} steps in {info['train_minutes']:.1f} min, {info['training_over_forward']:.2f}x "
          f"target-forward tokens/s, {info['trainable_parameters'] / 1e6:.2f} M trainable, held-out acc [{accuracy}]"
          f" -> implied τ {info['implied_acceptance_length']:.2f}" + (f", decoded chain τ {decoded:.2f}" if decoded else ""))
    if "step_costs" in info:
        draft, full = info["step_costs"]["draft"], info["step_costs"]["target"]
        print(f"  draft model: {info['parameters'] / 1e6:.1f} M parameters; one cached step {draft['full_ms']:.2f} ms = "
              f"{info['draft_step_vs_target']:.2f}x the target's {full['full_ms']:.2f} ms; lm_head "
              f"{draft['lm_head_share']:.0%} of the draft step ({full['lm_head_share']:.0%} of the target's)")
print(f"{'method':<36} {'tok/s':>7} {'τ':>5} {'vs plain':>9} {'vs gen()' if baseline == 'generate' else '':>9} {'draft':>6} {'ms/cyc':>6} {'d/tok':>6} "
      "identical  α per position")
for name, row in results.items():
    tau = f"{row['acceptance_length']:.2f}" if "acceptance_length" in row else "-"
    frac = f"{row['draft_time_fraction']:.2f}" if row.get("draft_time_fraction") is not None else "-"
    alphas = " ".join(f"{a:.2f}" for a in row.get("acceptance_per_position") or [])
    per_token = f"{row['draft_cost_per_token_vs_target']:.2f}" if "draft_cost_per_token_vs_target" in row else "-"
    per_cycle = f"{row['draft_ms_per_cycle']:.1f}" if "draft_ms_per_cycle" in row else "-"
    versus = f"{row['speedup_vs_generate']:8.2f}x" if baseline == "generate" else " " * 9
    print(f"{name:<36} {row['tokens_per_s']:7.2f} {tau:>5} {row['speedup_vs_plain']:8.2f}x {versus} "
          f"{frac:>6} {per_cycle:>6} {per_token:>6} {row['identical_to_plain']:>4}/{len(prompts)}  {alphas}")
print("ms/cyc: the drafter's milliseconds per verify cycle; d/tok: the drafter's seconds per drafted token over the target's seconds per token in our plain loop")
for name in set(references.values()):
    print(f"{name}: the reference of {', '.join(m for m, r in references.items() if r == name)} (their 'identical' "
          f"counts); identical to the original target's plain output on {results[name]['identical_to_original']}/"
          f"{len(prompts)} prompts")
print(f"wrote {out / 'bench.json'}")
