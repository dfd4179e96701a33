"""Memory per GPU to train an EAGLE-3 drafter for a big target, from the parameter counts of the real modules.

Nothing is downloaded and no weights are made: the target is built on the meta device from its config (a published
architecture below, or any config.json on disk), and the drafter is draftsmith's own EAGLE-3 module shaped for that
target, also on the meta device, so its parameter count is the one `draftsmith train` would train. Per process:

- the target, whole on every process in its dtype, or with `target.shard=fsdp` 1/N of it plus what is whole while
  it runs (one decoder layer, and the embedding, final norm and head the drafter reads every step);
- the drafter's training state at 16 bytes per trainable parameter (float32 weights 4, gradients 4, AdamW's two
  moments 8): whole under DDP; ZeRO-2 keeps the weights whole and shards gradients and moments over the N
  processes; ZeRO-3 and FSDP shard all of it;
- the features of one micro-batch in flight when capture is online: the three fused layers and the last, bf16.

Activations (they grow with data.batch_size, data.max_length and drafter.ttt_steps) are not counted.

    .venv/bin/python bench/memory_plan.py --architectures llama-3.1-8b llama-3.1-70b --processes 8 \\
        --draft-vocab 32000 --batch-size 4 --max-length 2048
    .venv/bin/python bench/memory_plan.py --architectures /models/my-target/config.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from draftsmith.drafters.eagle import Config as EagleConfig, Drafter, _layer_config

import records  # bench/: the shared command line and the run's record

ARCHITECTURES = {  # published configs (config.json of the hub repo), the fields that size the model
    "llama-3.1-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                     "tie_word_embeddings": False},
    "llama-3.1-70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                      "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
                      "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                      "tie_word_embeddings": False},
}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
STATE_BYTES = 16  # float32 weights 4 + gradients 4 + AdamW's two moments 8, per trainable parameter
PARTS = (("fc.", "fc"), (".self_attn.", "attention"), (".mlp.", "mlp"), ("lm_head.", "head"))  # the rest: norms
FEATURE_LAYERS = 4  # EAGLE-3's three fused layers and the last (the loss's labels)


def target_config(name: str):
    if name in ARCHITECTURES:
        return LlamaConfig(**ARCHITECTURES[name])
    path = Path(name)
    if path.is_file():
        return AutoConfig.from_pretrained(path.parent)
    raise SystemExit(f"{name}: neither a known architecture ({', '.join(ARCHITECTURES)}) nor a config.json")


def drafter_parts(config, draft_vocab: int) -> dict[str, int]:
    """Trainable parameters of draftsmith's EAGLE-3 drafter for a target of this config, by part."""
    target = SimpleNamespace(config=config, hidden_size=config.hidden_size, num_layers=config.num_hidden_layers,
                             vocab_size=config.vocab_size)
    with torch.device("meta"):
        drafter = Drafter(EagleConfig(variant="eagle3", layers=[1, 2, 3]), _layer_config(target, EagleConfig(),
                                                                                          draft_vocab))
    parts: dict[str, int] = {}
    for name, parameter in drafter.named_parameters():
        if parameter.requires_grad:
            part = next((part for key, part in PARTS if key in name), "norms")
            parts[part] = parts.get(part, 0) + parameter.numel()
    return parts


def plan(name: str, processes: int, draft_vocab: int, dtype: str, batch_size: int, max_length: int) -> dict:
    config = target_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    target_parameters = sum(p.numel() for p in model.parameters())
    vocab = min(draft_vocab or config.vocab_size, config.vocab_size)
    parts = drafter_parts(config, vocab)
    trainable = sum(parts.values())
    full_vocab = sum(drafter_parts(config, config.vocab_size).values())
    size = DTYPE_BYTES[dtype]
    target_bytes = target_parameters * size
    # sharded (target.shard=fsdp): 1/N of the weights, plus, whole while they run, one decoder layer and the
    # embedding, final norm and head that the drafter reads in every step
    whole_while_used = {model.get_input_embeddings(), model.get_output_embeddings(), model.model.norm,
                        model.model.layers[0]}
    gathered = sum(p.numel() for module in whole_while_used for p in module.parameters()) * size
    sharded_bytes = target_bytes / processes + gathered
    state = trainable * STATE_BYTES
    drafter_state = {"DDP": state, "ZeRO-2": trainable * 4 + (state - trainable * 4) / processes,
                     "ZeRO-3 / FSDP": state / processes}
    features = FEATURE_LAYERS * config.hidden_size * 2 * batch_size * max_length
    rows = [{"launcher": launcher, "target": where, "target_bytes": t, "drafter_state_bytes": d,
             "features_bytes": features, "total_bytes": t + d + features}
            for where, t in (("whole", target_bytes), ("target.shard=fsdp", sharded_bytes))
            for launcher, d in drafter_state.items()]
    return {"architecture": name, "hidden_size": config.hidden_size, "layers": config.num_hidden_layers,
            "vocab_size": config.vocab_size, "target_parameters": target_parameters, "draft_vocab": vocab,
            "drafter_parameters": parts, "drafter_trainable": trainable, "drafter_trainable_full_vocab": full_vocab,
            "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architectures", nargs="+", default=["llama-3.1-8b", "llama-3.1-70b"],
                        help=f"targets to size: {', '.join(ARCHITECTURES)}, or paths to config.json files")
    parser.add_argument("--processes", type=int, default=8, help="training processes (GPUs) the state is sharded over")
    parser.add_argument("--draft-vocab", type=int, default=32000,
                        help="EAGLE-3 draft vocabulary (prepare.draft_vocab_size); 0 = the target's whole vocabulary")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16", help="target.dtype")
    parser.add_argument("--batch-size", type=int, default=4, help="data.batch_size (sequences per micro-batch)")
    parser.add_argument("--max-length", type=int, default=2048, help="data.max_length (tokens per sequence)")
    records.add_shared_options(parser)
    args = parser.parse_args()
    records.start()  # the commit and diff this run is credited to, taken before it measures anything
    targets = [plan(name, args.processes, args.draft_vocab, args.dtype, args.batch_size, args.max_length)
               for name in args.architectures]
    for target in targets:
        print(f"{target['architecture']}: {target['target_parameters']:,} target parameters; drafter "
              f"{target['drafter_trainable']:,} trainable ({target['draft_vocab']:,}-token head) "
              f"{json.dumps(target['drafter_parameters'])}")
        for row in target["rows"]:
            print(f"  {row['launcher']:<14} target {row['target']:<18} {row['target_bytes'] / 1e9:7.2f} GB + drafter "
                  f"{row['drafter_state_bytes'] / 1e9:6.2f} GB + features {row['features_bytes'] / 1e9:5.2f} GB = "
                  f"{row['total_bytes'] / 1e9:7.2f} GB per process")
    records.write("memory_plan", {"processes": args.processes, "dtype": args.dtype, "batch_size": args.batch_size,
                                  "max_length": args.max_length, "state_bytes_per_parameter": STATE_BYTES,
                                  "targets": targets}, args)


if __name__ == "__main__":
    main()
