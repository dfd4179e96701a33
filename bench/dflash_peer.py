"""DFlash trained by draftsmith and by the speculators library's own DFlash model and loss: same data, same steps.

    .venv/bin/python bench/dflash_peer.py --steps 150 --seeds 0 1 --num-prompts 20 \
        --arm draftsmith --arm draftsmith-matched drafter.anchors_per_sequence=128 train.lr=1e-3

The peer is the library's `DFlashDraftModel` (installed by `make setup`) with the shape of the `dflash` recipe's
drafter (layers, block size, context layers, draft vocabulary), started from the very weights our run starts from
(exported with `--format speculators` and read by the library), and trained by its own forward: its anchor draw
(up to --peer-anchors per packed batch, each anchor a loss-masked token), its targets (the verifier's
distribution through its frozen norm and head rows), its per-position weights and loss normalisation, its frozen
draft-vocabulary head, and the optimiser its trainer builds by default (AdamW, weight decay 0.01, linear schedule
with 1% warm-up, gradient norm clipped at 1.0, --peer-lr). Its batches are ours, micro-batch for micro-batch
(the same sample order and seed), packed into one row with document ids as its collate packs them; its context
is our captured target features (its hidden_states are the outputs of the same layers). What is not the library's:
the loop that calls its forward and steps its optimiser (its Trainer needs its data files and a GPU launcher), and
bf16 autocast on the CPU where the recipe's precision picks it, as for ours.

One evaluator for every arm, per seed: held-out top-1 accuracy per block position over every allowed block of
the first --eval-batches held-out batches (our validation's rule, all anchors), the τ it implies for a chain of
block_size - 1, and a decode of the same HumanEval prompts by our decoder (chains of block_size - 1 at T=0,
interleaved prompt by prompt with the plain loop, every output checked identical). The peer's trained weights are
saved by the library (`save_pretrained`) and read back by draftsmith's loader, which also shows the layouts agree.
Results go to OUT/bench.json and a record to results/dflash_peer/.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import records  # noqa: E402
from common import chains_beside_plain, decode_interleaved, method_rows, train  # noqa: E402
from draftsmith.config import load  # noqa: E402
from draftsmith.train.config import TrainConfig  # noqa: E402
from draftsmith.train.validate import implied_acceptance_length  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2-135m" / "dflash.yaml"

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--steps", type=int, default=200, help="optimizer steps of every arm (one micro-batch each)")
parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="train.seed of each repetition")
parser.add_argument("--arm", nargs="+", action="append", default=[], metavar="NAME [OVERRIDE]",
                    help="a draftsmith arm: the dflash recipe with overrides; repeat the flag for more (none: the recipe "
                         "as shipped, named 'draftsmith')")
parser.add_argument("--set", nargs="*", default=[], metavar="SECTION.FIELD=VALUE",
                    help="overrides of the dflash recipe for every arm, the peer's shape included")
parser.add_argument("--peer-lr", type=float, default=1e-3, help="the peer's learning rate (the library's default)")
parser.add_argument("--peer-anchors", type=int, default=512, help="the peer's max_anchors (the library's default)")
parser.add_argument("--eval-batches", type=int, default=8, help="held-out batches of the accuracy per position")
records.add_shared_options(parser, num_prompts=20, max_new_tokens=96, threads=0, out="runs/bench-dflash-peer")

def recipe_config(overrides: list[str]) -> TrainConfig:
    return load(TrainConfig, RECIPE, overrides)


def our_arm(name: str, overrides: list[str], seed: int, args, target) -> Path:
    """Train the dflash recipe (with `overrides`) for --steps; the folder of its final drafter."""
    out = Path(args.out) / f"{name}-seed{seed}"
    final = out / f"checkpoint-{args.steps}" / "drafter"
    if final.is_dir():
        print(f"{name} seed {seed}: reusing {final}")
        return final
    config = recipe_config([*args.set, *overrides, f"train.seed={seed}", f"train.max_steps={args.steps}",
                            f"output_dir={out}", f"train.checkpoint_every={args.steps}",
                            f"train.eval_every={args.steps}", "eval.select_by=implied", "tracking.report_to=[]"])
    began = time.perf_counter()
    train(config, target)
    print(f"{name} seed {seed}: {args.steps} steps in {time.perf_counter() - began:.0f} s")
    return final


# --------------------------------------------------------------------------- the peer
def peer_model(drafter, target, folder: Path):
    """The library's DFlashDraftModel holding `drafter`'s weights (through our speculators export), with the
    verifier parts (embedding, head rows, final norm) the library would load from the verifier's folder."""
    from safetensors.torch import load_file
    from speculators import SpeculatorModelConfig
    from speculators.models.dflash import DFlashDraftModel

    from draftsmith import export

    drafter.save_pretrained(folder / "init")
    exported = export.export(folder / "init", "speculators", folder / "init-speculators", force=True)
    config = SpeculatorModelConfig.from_pretrained(str(exported))
    config.transformer_layer_config._attn_implementation = "sdpa"  # flex attention needs a GPU compiler
    config.speculators_config.verifier.name_or_path = None  # filled below, from the loaded target
    model = DFlashDraftModel(config)
    missing, unexpected = model.load_state_dict(load_file(str(exported / "model.safetensors")), strict=False)
    assert not unexpected, unexpected
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target.model.get_input_embeddings().weight)
        head = target.model.get_output_embeddings().weight
        rows = head if model.t2d is None else head[model.t2d.bool()]
        model.verifier_lm_head.weight.copy_(rows)
        if model.t2d is None:
            model.lm_head.weight.copy_(rows)
        model.verifier_norm.weight.copy_(target.final_norm.weight)
    for name in ("embed_tokens", "lm_head", "verifier_lm_head", "verifier_norm"):
        getattr(model, name).weight.requires_grad_(False)  # as the library's own loading leaves them
    left = [k for k in missing if not k.startswith(("embed_tokens", "lm_head", "verifier_", "t2d", "d2t"))]
    assert not left, left
    return model


def packed(batch: dict, layer_ids: list[int], last: int) -> dict:
    """A padded micro-batch as the library's collate packs it: one row, document ids, positions from 0 per sample."""
    keep = batch["attention_mask"].bool()
    lengths = keep.sum(1).tolist()
    ids, mask = batch["input_ids"][keep][None], batch["loss_mask"][keep][None]
    hidden = torch.cat([batch["features"][i][keep] for i in layer_ids], -1)[None].float()
    return {"input_ids": ids, "loss_mask": mask, "hidden_states": hidden,
            "verifier_last_hidden_states": batch["features"][last][keep][None].float(),
            "document_ids": torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None],
            "position_ids": torch.cat([torch.arange(n) for n in lengths])[None]}


def peer_arm(seed: int, args, target) -> Path:
    """Train the library's model for --steps on our micro-batches; the folder the library saved it to."""
    from accelerate.utils import set_seed
    from speculators.losses import resolve_loss_config
    from transformers import get_linear_schedule_with_warmup

    from draftsmith.data.vocab import load_draft_vocab
    from draftsmith.drafters import dflash
    from draftsmith.train.builders import resolve_precision
    from draftsmith.train.config import drafter_config
    from draftsmith.train.data import SampleOrder, build_training_data, truncate

    out = Path(args.out) / f"speculators-seed{seed}"
    saved = out / "trained"
    if (saved / "config.json").is_file():
        print(f"speculators seed {seed}: reusing {saved}")
        return saved
    config = recipe_config([*args.set, f"train.seed={seed}"])
    _, options = drafter_config(config.drafter)
    vocab = load_draft_vocab(config.data.draft_vocab, target) if config.data.draft_vocab else None
    set_seed(seed)  # as our recipe seeds before it builds the drafter: the same starting weights
    drafter = dflash.create(options, target, vocab)
    model = peer_model(drafter, target, out)
    layer_ids, last = drafter.layer_ids, target.num_layers - 1
    data = build_training_data(config, target, drafter.required_layers, 0)
    lengths = [min(n, config.data.max_length) for n in data.train.lengths()] if config.data.group_by_length else None
    order = SampleOrder(len(data.train), config.data.batch_size, seed, lengths)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.peer_lr, weight_decay=0.01)
    warmup = math.ceil(0.01 * args.steps)  # the library's default: 1% of the total steps
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, args.steps)
    loss_config = resolve_loss_config("kl_div", "eager")  # "fused" needs Triton
    bf16 = resolve_precision(config.train.precision, False) == "bf16"
    print(f"speculators seed {seed}: {sum(p.numel() for p in trainable)} trainable parameters, lr {args.peer_lr:g}, "
          f"max_anchors {args.peer_anchors}, {'bf16 autocast' if bf16 else 'fp32'}")
    model.train()
    began, log = time.perf_counter(), []
    for step in range(args.steps):
        items = [truncate(data.train[i], config.data.max_length) for i in order.micro_batch(step)]
        batch = packed(data.add_features(data.collate(items)), layer_ids, last)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            _, loss, _ = model(**batch, loss_config=loss_config, gamma=drafter.config.gamma or 4.0,
                                     max_anchors=args.peer_anchors, per_position_loss_weight="fixed-exp-decay")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        log.append(loss.item())
        if (step + 1) % 10 == 0:
            print(f"speculators seed {seed}: step {step + 1}/{args.steps} loss {sum(log[-10:]) / 10:.4f} "
                  f"({time.perf_counter() - began:.0f} s)", flush=True)
    print(f"speculators seed {seed}: {args.steps} steps in {time.perf_counter() - began:.0f} s")
    model.eval()
    model.save_pretrained(str(saved))
    (out / "losses.json").write_text(json.dumps(log))
    return saved


# --------------------------------------------------------------------------- one evaluator
@torch.no_grad()
def held_out_accuracy(drafter, target, data, batches: int, max_length: int) -> list[float]:
    """Top-1 accuracy per block position over every allowed block of the first `batches` held-out batches."""
    from draftsmith.train.data import truncate

    drafter.eval()
    size, hits, counts = drafter.config.block_size, None, None
    for start in range(0, min(batches * 4, len(data.eval)), 4):
        items = [truncate(data.eval[i], max_length) for i in range(start, min(start + 4, len(data.eval)))]
        batch = data.add_features(data.collate(items))
        ids, mask = batch["input_ids"], batch["loss_mask"].bool()
        anchors = drafter.sample_anchors(ids, mask, every=True)
        _, metrics = drafter(batch, target.head, anchors=anchors)
        count = [int(drafter.counted(anchors, mask, k)[1].sum()) for k in range(1, size)]
        got = [metrics.get(f"acc_{k - 1}", 0.0) * count[k - 1] for k in range(1, size)]
        hits = got if hits is None else [a + b for a, b in zip(hits, got)]
        counts = count if counts is None else [a + b for a, b in zip(counts, count)]
    return [h / c if c else 0.0 for h, c in zip(hits, counts)]


def main() -> None:
    args = parser.parse_args()
    records.start()  # the commit and diff this run is credited to, taken before it measures anything
    records.apply_threads(args)
    from draftsmith.eval.prompts import load_prompts
    from draftsmith.eval.runner import environment
    from draftsmith.export.readers import load_proposer
    from draftsmith.target import load_target
    from draftsmith.train import pipeline
    from draftsmith.train.data import build_training_data

    arms = {name: overrides for name, *overrides in args.arm} or {"draftsmith": []}
    base = recipe_config(list(args.set))
    target = load_target(base.target.name, dtype=base.target.dtype)
    target.model.requires_grad_(False)
    pipeline.ensure_prepared(base, target)
    prompts = load_prompts("humaneval", target, args.num_prompts)
    result = {"steps": args.steps, "seeds": args.seeds, "set": args.set, "peer_lr": args.peer_lr,
              "peer_anchors": args.peer_anchors, "num_prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "arms": {name: {"overrides": overrides} for name, overrides in arms.items()}, "per_seed": {}}
    result["arms"]["speculators"] = {"overrides": [], "peer": True}
    for seed in args.seeds:
        folders = {name: our_arm(name, overrides, seed, args, target) for name, overrides in arms.items()}
        folders["speculators"] = peer_arm(seed, args, target)
        first = load_proposer(next(iter(folders.values())), target).drafter
        data = build_training_data(base, target, first.required_layers, 0)
        figures = {}
        for name, folder in folders.items():
            drafter = load_proposer(folder, target).drafter
            accuracy = held_out_accuracy(drafter, target, data, args.eval_batches, base.data.max_length)
            figures[name] = {"held_out_accuracy": accuracy, "implied_tau": implied_acceptance_length(accuracy)}
            print(f"seed {seed} {name}: held-out accuracy per position "
                  f"{' '.join(f'{a:.3f}' for a in accuracy)}, implied tau {figures[name]['implied_tau']:.3f}")
        length = first.config.block_size - 1
        methods = chains_beside_plain(target, folders, length, args.max_new_tokens)
        rows = method_rows(decode_interleaved(methods, prompts), "plain", "plain")
        for name in folders:
            row = rows[name]
            figures[name].update(tau=row["acceptance_length"], speedup=row["speedup_vs_plain"],
                                 identical=row["identical_to_plain"],
                                 acceptance_per_position=row["acceptance_per_position"])
            print(f"seed {seed} {name}: decoded tau {row['acceptance_length']:.3f}, "
                  f"{row['speedup_vs_plain']:.2f}x plain, identical {row['identical_to_plain']}/{len(prompts)}")
        result["per_seed"][str(seed)] = figures
    for name in result["arms"]:
        seeds = [result["per_seed"][str(s)][name] for s in args.seeds]
        result["arms"][name].update(mean_tau=sum(f["tau"] for f in seeds) / len(seeds),
                                    mean_implied_tau=sum(f["implied_tau"] for f in seeds) / len(seeds))
    peer = result["arms"]["speculators"]["mean_tau"]
    for name in arms:
        result["arms"][name]["tau_vs_speculators"] = result["arms"][name]["mean_tau"] / peer
        print(f"{name}: mean decoded tau {result['arms'][name]['mean_tau']:.3f} = "
              f"{result['arms'][name]['tau_vs_speculators']:.3f}x the speculators model's ({peer:.3f})")
    result["environment"] = environment(target)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'bench.json'}")
    records.write("dflash_peer", result, args)


if __name__ == "__main__":
    main()
