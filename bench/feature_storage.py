"""Disk a capture of target features takes, per storage option, from the formula `draftsmith capture` writes by
(`feature_bytes_per_token`), for a target of any size; with --check, the formula against a real capture folder.

    .venv/bin/python bench/feature_storage.py --hidden-size 8192 --num-layers 80 --conversations 100000 \\
        --tokens-per-conversation 1000                         # a Llama-3-70B-sized target
    .venv/bin/python bench/feature_storage.py --check runs/smollm2-135m-instruct/features-mix-top8
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftsmith.data.capture import feature_bytes_per_token, read_safetensors_mmap

import records  # bench/: the shared command line and the run's record
from render_results import human_bytes

OPTIONS = [  # (what a user chooses, layers stored, dtype, top-k logits)
    ("EAGLE-3 layers + last, bf16", 4, "bf16", 0),
    ("EAGLE-3 layers + last, bf16, top-8 logits", 4, "bf16", 8),
    ("EAGLE-3 layers + last, fp8", 4, "fp8", 0),
    ("last layer only (Medusa, MTP, draft LM), bf16", 1, "bf16", 0),
    ("DFlash 5 layers + last, bf16", 6, "bf16", 0),
]


def check(folder: Path) -> None:
    """The formula's bytes against the tensors of every shard of a finished capture."""
    manifest = json.loads((folder / "manifest.json").read_text())
    per_token = feature_bytes_per_token(manifest["hidden_size"], len(manifest["layers"]), manifest["dtype"],
                                        manifest.get("topk_logits", 0))
    predicted = stored = on_disk = 0
    for shard in manifest["shards"]:
        tensors, _ = read_safetensors_mmap(folder / shard["file"])
        predicted += shard["num_tokens"] * per_token + 16 * len(shard["sample_ids"]) + 8
        stored += sum(t.nbytes for t in tensors.values())
        on_disk += (folder / shard["file"]).stat().st_size
    print(f"{folder}: {manifest['num_tokens']} tokens, {per_token} bytes per token by the formula; tensors "
          f"{stored} bytes, formula {predicted} ({'equal' if stored == predicted else 'DIFFERENT'}); files with "
          f"headers {on_disk} bytes ({on_disk / stored - 1:+.2%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden-size", type=int, default=8192, help="the target's hidden size")
    parser.add_argument("--num-layers", type=int, default=80, help="the target's decoder layers (for the label)")
    parser.add_argument("--conversations", type=int, default=100_000, help="training conversations")
    parser.add_argument("--tokens-per-conversation", type=int, default=1000, help="mean tokens per conversation")
    parser.add_argument("--check", type=Path, help="compare the formula with this capture folder instead")
    records.add_shared_options(parser)
    args = parser.parse_args()
    records.start()  # the commit and diff this run is credited to, taken before it measures anything
    if args.check:
        check(args.check)
        return
    tokens = args.conversations * args.tokens_per_conversation
    print(f"hidden size {args.hidden_size} ({args.num_layers} layers), {args.conversations} conversations x "
          f"{args.tokens_per_conversation} tokens = {tokens:.3g} tokens")
    print("| features stored | bytes per token | whole capture | online (data.online) |")
    print("|---|---|---|---|")
    options = []
    for label, layers, dtype, topk in OPTIONS:
        per_token = feature_bytes_per_token(args.hidden_size, layers, dtype, topk)
        whole = per_token * tokens + 16 * args.conversations
        print(f"| {label} | {per_token:,} | {human_bytes(whole)} | 0 B |")
        options.append({"features": label, "layers": layers, "dtype": dtype, "topk_logits": topk,
                        "bytes_per_token": per_token, "capture_bytes": whole})
    records.write("feature_storage", {"hidden_size": args.hidden_size, "num_layers": args.num_layers,
                                      "conversations": args.conversations,
                                      "tokens_per_conversation": args.tokens_per_conversation, "tokens": tokens,
                                      "options": options}, args)


if __name__ == "__main__":
    main()
