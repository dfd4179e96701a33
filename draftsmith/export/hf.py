"""`hf` exports: a distilled draft LM as a plain `transformers` model folder.

The checkpoint already is one (config.json, safetensors, tokenizer, generation config) with draftsmith's
metadata inside config.json; the export drops that metadata, so the folder is exactly what `transformers`
itself writes, adds a model card that shows how to use it as `assistant_model` and as a vLLM draft
model, and proves the round trip: the folder, loaded by `transformers` alone, gives the checkpoint's
logits.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.export import card

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


def write(checkpoint: Path, fmt: str, staging: Path, options) -> DraftCard:
    """Copy the model folder without draftsmith's metadata into `staging`, check it in plain transformers, add the card."""
    meta = json.loads((checkpoint / "config.json").read_text())
    for name in checkpoint.iterdir():
        if name.is_file() and name.name != "config.json" and not name.name.endswith(".md"):
            shutil.copyfile(name, staging / name.name)
    plain = {k: v for k, v in meta.items() if not k.startswith(META_PREFIX) and k not in PROVENANCE_KEYS}
    (staging / "config.json").write_text(json.dumps(plain, indent=2) + "\n")
    check_round_trip(checkpoint, staging)
    shared, results_path = card.shared_facts(checkpoint, options, "draft_lm", "is a draft LM", meta.get("target_name"))
    config = (shared["results"] or {}).get("config") or {}
    facts = DraftCard(**shared, layers=int(plain["num_hidden_layers"]), hidden_size=int(plain["hidden_size"]),
                      parameters=_parameters(staging), vocab_size=int(plain["vocab_size"]),
                      speculative_tokens=options.speculative_tokens or config.get("draft_length") or 4)
    return card.finish_card(staging, facts, results_path, render_card)


@torch.no_grad()
def check_round_trip(checkpoint: Path, folder: Path) -> None:
    """The export, loaded by `transformers` alone, must compute the checkpoint's logits on a few token sequences."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        exported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as err:  # anything transformers cannot load is a broken export
        raise DraftsmithError(f"The hf export in '{folder}' does not load in transformers: {type(err).__name__}: {err}")
    original = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    if len(tokenizer) > exported.config.vocab_size:
        raise DraftsmithError(f"The exported tokenizer has {len(tokenizer)} tokens, the model {exported.config.vocab_size} rows.")
    ids = torch.randint(0, len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(0))
    if not torch.equal(exported(ids).logits, original(ids).logits):
        raise DraftsmithError(f"The hf export in '{folder}' computes other logits than the checkpoint '{checkpoint}'.")


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
        f"# Draft model for {facts.verifier}", "",
        f"A small causal LM distilled with draftsmith from `{facts.verifier}` to draft tokens for it: it shares the "
        "target's tokenizer, proposes a few tokens at a time, and the target verifies them in one pass, so the output "
        "is exactly the target's own; only the speed changes. It is a plain `transformers` folder.", "",
        "| | |", "|---|---|",
        f"| decoder layers | {facts.layers} |", f"| hidden size | {facts.hidden_size} |",
        f"| parameters (embedding and head included) | {facts.parameters:,} |",
        f"| vocabulary | {facts.vocab_size} (the target's) |", "",
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
    return "\n".join([card.front_matter(tags, facts.verifier, card.is_hub_id(facts.verifier), facts.license),
                      "\n".join(about), card.training_section(facts.training),
                      card.results_section(facts.results, facts.results_source, facts.plots),
                      card.verifier_section(facts.training, facts.verifier), "\n".join(usage)])
