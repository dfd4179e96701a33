"""`hf` exports: a distilled draft LM as a plain `transformers` model folder.

The checkpoint already is one (config.json, safetensors, tokenizer, generation config) with draftsmith's
metadata inside config.json; the export drops that metadata, so the folder is exactly what `transformers`
itself writes, adds a model card that shows how to use it as `assistant_model` and as a vLLM draft
model, and proves the round trip: the folder, loaded by `transformers` alone, gives the checkpoint's
logits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export import card
from draftsmith.export.skeleton import Layout, RoundTrip

FORMATS = ("hf",)
META_PREFIX = "draftsmith_"
PROVENANCE_KEYS = ("target_name", "target_fingerprint")


@dataclass(kw_only=True)
class DraftCard(card.SharedFacts):
    """What the card of a draft-LM export states."""

    layers: int
    hidden_size: int
    parameters: int
    vocab_size: int
    speculative_tokens: int


def layout(checkpoint: Path, fmt: str, options) -> Layout:
    """The model folder without draftsmith's metadata; loaded by `transformers` alone it must compute the
    checkpoint's logits."""
    meta = json.loads((checkpoint / "config.json").read_text())
    plain = {k: v for k, v in meta.items() if not k.startswith(META_PREFIX) and k not in PROVENANCE_KEYS}
    copies = {path.name: path for path in checkpoint.iterdir()
              if path.is_file() and path.name != "config.json" and not path.name.endswith(".md")}
    shared = card.shared_facts(checkpoint, options, "draft_lm", "is a draft LM", meta.get("target_name"))
    config = (shared["results"] or {}).get("config") or {}
    facts = DraftCard(**shared, layers=int(plain["num_hidden_layers"]), hidden_size=int(plain["hidden_size"]),
                      parameters=_parameters(checkpoint), vocab_size=int(plain["vocab_size"]),
                      speculative_tokens=options.speculative_tokens or config.get("draft_length") or 4)
    return Layout(validate=validate, round_trip=RoundTrip(read_back, read_back(checkpoint)[1]), facts=facts,
                  render=render_card, config=plain, copies=copies)


def validate(folder: Path) -> None:
    """The folder loads in `transformers` alone, and its tokenizer fits the model's vocabulary."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        config, tokenizer = AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    except Exception as err:  # anything transformers cannot load is a broken export
        raise DraftsmithError(f"The hf export in '{folder}' does not load in transformers: {type(err).__name__}: {err}")
    if len(tokenizer) > config.vocab_size:
        raise DraftsmithError(f"The exported tokenizer has {len(tokenizer)} tokens, the model {config.vocab_size} "
                              "rows.")


@torch.no_grad()
def read_back(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, {"logits": the logits of fixed token sequences}) of the model in `folder`, as `transformers`
    alone loads it: what the round trip compares (its weights may be stored in other names or tied)."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    except Exception as err:  # anything transformers cannot load is a broken export
        raise DraftsmithError(f"The hf export in '{folder}' does not load in transformers: {type(err).__name__}: {err}")
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    return model.config.to_dict(), {"logits": model(ids).logits}


def _parameters(folder: Path) -> int:
    """Parameters stored in the folder's safetensors files (a tied embedding counts once)."""
    import math

    from safetensors import safe_open

    total = 0
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as handle:
            total += sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())
    return total


def render_card(facts: DraftCard) -> str:
    """README.md of a draft-LM export: metadata, what it is, training, results, how to use it."""
    about = [
        f"A small causal LM distilled with draftsmith from `{facts.verifier}` to draft tokens for it: it shares the "
        "target's tokenizer, proposes a few tokens at a time, and the target verifies them in one pass, so the output "
        "is exactly the target's own; only the speed changes. It is a plain `transformers` folder.", "",
        *card.table([("decoder layers", facts.layers), ("hidden size", facts.hidden_size),
                     ("parameters (embedding and head included)", f"{facts.parameters:,}"),
                     ("vocabulary", f"{facts.vocab_size} (the target's)")]), "",
    ]
    k = facts.speculative_tokens
    vllm = json.dumps({"model": facts.model_ref, "method": "draft_model", "num_speculative_tokens": k})
    usage = [
        "## Using it", "", "With `transformers` (assisted generation):", "", "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f'target = AutoModelForCausalLM.from_pretrained("{facts.verifier}")',
        f'draft = AutoModelForCausalLM.from_pretrained("{facts.model_ref}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{facts.verifier}")',
        'inputs = tokenizer("def fibonacci(n):", return_tensors="pt")',
        "output = target.generate(**inputs, assistant_model=draft, max_new_tokens=128)", "```", "",
        "With vLLM:", "", "```bash", f"vllm serve {facts.verifier} --speculative-config '{vllm}'", "```", ""]
    if not card.is_hub_id(facts.verifier):
        usage += [f"`{facts.verifier}` is not a hub id; replace it with the hub id or folder of the target model.", ""]
    tags = ["speculative-decoding", "draft-model", "draftsmith", "hf", "transformers"]
    return card.compose(facts, tags, "Draft model", about, usage)
