"""`medusa` exports: Medusa heads in vLLM's Medusa layout (DESIGN §4).

vLLM builds `MedusaModel` from `model_type: "medusa"`, `hidden_size`, `vocab_size`, `num_heads`,
`num_hidden_layers` (ResBlocks per head) and `medusa_fc_bias` (our ResBlocks have a bias, so it is written
true: without it vLLM builds bias-free blocks and silently drops ours), and loads `blocks.{h}.layers.{l}.weight`
/ `.bias` and `lm_heads.{h}.weight`. The heads read the target's hidden state after its final norm, as
vLLM passes it. The validator checks the folder against exactly the parameters that configuration builds,
and the round trip gives back the checkpoint's tensors.

Heads over a draft vocabulary of N tokens are written at the full vocabulary. vLLM 0.32 builds every head with
`vocab_size` rows and, when `truncated_vocab_size` is smaller, slices a checkpoint's heads by `token_map` and then
loads N rows into V, which fails its load-time shape assert (`vocab_parallel_embedding.py`, from
`models/medusa.py` `load_weights`): a truncated head cannot load at all. So `truncated_vocab_size` = `vocab_size`,
row `token_map[i]` of each head is our row i, and every other row is the mean of the draft rows: its logit is the
mean of the draft logits, below their maximum, so vLLM's argmax over the whole vocabulary drafts the token ours
drafts. `token_map` (ignored by vLLM at the full size) and `draft_vocab_size` (vLLM keeps unknown keys as
attributes) stay in the folder, so draftsmith reads the N-row heads back exactly. Folders in the older layout
(heads of N rows, `truncated_vocab_size` N) are still read.

Medusa-2 heads were trained with a LoRA-tuned target, and only that target may verify them: the export also
writes it, adapters merged, as a plain `transformers` folder `target/` (safetensors and tokenizer), checked by
loading it back by path and comparing its logits with the checkpoint's merged model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import load_file

from draftsmith.errors import DraftsmithError
from draftsmith.export import card
from draftsmith.export.skeleton import Layout, RoundTrip, read_folder

FORMATS = ("medusa",)
CONFIG_KEYS = {"model_type", "architectures", "hidden_size", "vocab_size", "num_heads", "num_hidden_layers",
               "medusa_fc_bias", "truncated_vocab_size"}
DRAFT_VOCAB_KEY = "draft_vocab_size"
"""config.json key of heads over a draft vocabulary (draftsmith's; vLLM keeps it as an unused attribute)"""


TUNED_TARGET = "target"
"""Medusa-2: the subfolder holding the tuned target (adapters merged)"""


@dataclass(kw_only=True)
class MedusaCard(card.SharedFacts):
    """What the card of a Medusa export states."""

    num_heads: int
    num_layers: int
    parameters: int
    speculative_tokens: int
    lora_rank: int = 0


def vllm_config(meta: dict) -> dict:
    """config.json of vLLM's Medusa layout for a draftsmith Medusa folder's config.json (full-vocabulary heads)."""
    options = meta["config"]
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": meta["hidden_size"],
              "vocab_size": meta["vocab_size"], "truncated_vocab_size": meta["vocab_size"],
              "num_heads": options["num_heads"], "num_hidden_layers": options["num_layers"], "medusa_fc_bias": True}
    if meta.get("draft_vocab_size"):
        config[DRAFT_VOCAB_KEY] = meta["draft_vocab_size"]
    return config


def to_vllm(tensors: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """Our `blocks.{h}.layers.{l}.linear.*` -> vLLM's `blocks.{h}.layers.{l}.*`; heads over a draft vocabulary
    widened to `vocab_size` rows (the module docstring says why and how), `token_map` kept."""
    renamed = {name.replace(".linear.", "."): t for name, t in tensors.items()}
    token_map = tensors.get("token_map")
    if token_map is not None:
        for name in [n for n in renamed if n.startswith("lm_heads.")]:
            rows = renamed[name]
            full = rows.mean(0, keepdim=True).expand(vocab_size, -1).clone()
            full[token_map.long()] = rows
            renamed[name] = full
    return renamed


def from_vllm(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `to_vllm`: our names, and heads cut back to the `token_map` rows when they hold more."""
    renamed = {}
    token_map = tensors.get("token_map")
    for name, tensor in tensors.items():
        if name.startswith("blocks."):
            head, _, layer, leaf = name.split(".")[1:]
            name = f"blocks.{head}.layers.{layer}.linear.{leaf}"
        elif name.startswith("lm_heads.") and token_map is not None and tensor.shape[0] > token_map.numel():
            tensor = tensor[token_map.long()]
        renamed[name] = tensor
    return renamed


def from_format(config: dict, tensors: dict[str, torch.Tensor], num_target_layers: int) -> tuple[dict, dict]:
    """vLLM's Medusa layout -> (a draftsmith Medusa folder's config.json, its tensors in our names). vLLM's config does
    not record the target's depth: `num_target_layers` is the target's. Heads written without biases
    (`medusa_fc_bias` false, vLLM's default) get zero biases, which compute the same."""
    H, V = int(config["hidden_size"]), int(config["vocab_size"])
    token_map = tensors.get("token_map")  # full-size heads with a token_map: a draft vocabulary of its length
    rows = token_map.numel() if token_map is not None else int(config.get("truncated_vocab_size") or V)
    heads, layers = int(config["num_heads"]), int(config.get("num_hidden_layers", 1))
    ours = from_vllm(tensors)
    if not config.get("medusa_fc_bias", False):
        for head in range(heads):
            for layer in range(layers):
                ours.setdefault(f"blocks.{head}.layers.{layer}.linear.bias", torch.zeros(H))
    meta = {"draftsmith_kind": "medusa", "config": {"num_heads": heads, "num_layers": layers}, "hidden_size": H,
            "vocab_size": V, "num_target_layers": num_target_layers, "draft_vocab_size": rows if rows < V else None}
    return meta, ours


def validate(folder: Path) -> None:
    """The folder holds exactly what vLLM's Medusa builds from its config, every name and shape, with heads at the
    full vocabulary (the only size vLLM 0.32 loads), and draft-vocabulary heads widened as `to_vllm` does."""
    config = json.loads((folder / "config.json").read_text())
    problems = [f"config.json lacks {key}" for key in sorted(CONFIG_KEYS - set(config))]
    problems += [f"config.json has unknown key {key} (engines drop it silently)"
                 for key in sorted(set(config) - CONFIG_KEYS - {DRAFT_VOCAB_KEY})]
    if not problems and config["truncated_vocab_size"] != config["vocab_size"]:
        problems.append(f"truncated_vocab_size {config['truncated_vocab_size']} < vocab_size {config['vocab_size']}: "
                        "vLLM 0.32 slices such heads by token_map and then fails its load-time shape assert "
                        "(vocab_parallel_embedding.py); write full-vocabulary heads")
    if not problems:
        H, V, N = config["hidden_size"], config["vocab_size"], config.get(DRAFT_VOCAB_KEY) or config["vocab_size"]
        expected = {f"lm_heads.{h}.weight": (V, H) for h in range(config["num_heads"])}
        if N < V:  # draftsmith's own map of head rows to token ids (vLLM ignores it at the full size)
            expected["token_map"] = (N,)
        for h in range(config["num_heads"]):
            for layer in range(config["num_hidden_layers"]):
                expected[f"blocks.{h}.layers.{layer}.weight"] = (H, H)
                if config["medusa_fc_bias"]:
                    expected[f"blocks.{h}.layers.{layer}.bias"] = (H,)
        tensors = load_file(str(folder / "model.safetensors"))
        shapes = {name: tuple(t.shape) for name, t in tensors.items()}
        problems += [f"{name}: missing" for name in sorted(set(expected) - set(shapes))]
        problems += [f"{name}: not a parameter vLLM's Medusa has" for name in sorted(set(shapes) - set(expected))]
        problems += [f"{name}: shape {shapes[name]}, expected {shape}" for name, shape in expected.items()
                     if name in shapes and shapes[name] != shape]
        if not problems and N < V:
            problems += _outside_rows_problems(tensors, config["num_heads"])
    if problems:
        raise DraftsmithError(f"The medusa export in '{folder}' is not what vLLM loads: " + "; ".join(problems))


def _outside_rows_problems(tensors: dict[str, torch.Tensor], num_heads: int) -> list[str]:
    """Rows outside the draft vocabulary must be the mean of its rows, or vLLM's argmax could draft them."""
    token_map = tensors["token_map"].long()
    if token_map.unique().numel() != token_map.numel():
        return ["token_map repeats a token id"]
    problems = []
    for h in range(num_heads):
        head = tensors[f"lm_heads.{h}.weight"]
        outside = torch.ones(head.shape[0], dtype=torch.bool)
        outside[token_map] = False
        if not torch.equal(head[outside], head[token_map].mean(0, keepdim=True).expand(int(outside.sum()), -1)):
            problems.append(f"lm_heads.{h}.weight: rows outside token_map are not the mean of its rows")
    return problems


def head_tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The heads' own tensors of a draftsmith Medusa folder (not its rank accuracies or Medusa-2 adapters)."""
    return {name: t for name, t in load_file(str(checkpoint / "model.safetensors")).items()
            if name.startswith(("blocks.", "lm_heads.")) or name == "token_map"}


def write_tuned_target(checkpoint: Path, meta: dict, folder: Path) -> None:
    """Medusa-2: the tuned target, adapters merged, as a transformers folder that loads by path (checked)."""
    from transformers import AutoModelForCausalLM

    from draftsmith.drafters import medusa
    from draftsmith.target import load_target

    name = meta.get("target_name")
    if not name:
        raise DraftsmithError(f"'{checkpoint}' does not say which target its adapters belong to.")
    target = load_target(name)
    merged = medusa.merge_tuned(medusa.Drafter.from_pretrained(checkpoint, target).tuned)
    merged.save_pretrained(folder)
    if target.tokenizer is not None:
        target.tokenizer.save_pretrained(folder)
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=merged.dtype).eval()
    ids = torch.arange(16)[None] % merged.config.vocab_size
    with torch.no_grad():
        if not torch.allclose(loaded(ids).logits, merged(ids).logits, atol=1e-5, rtol=1e-4):
            raise DraftsmithError(f"The tuned target written to '{folder}' does not load back as the checkpoint's.")


def layout(checkpoint: Path, fmt: str, options) -> Layout:
    """vLLM's Medusa layout of the heads (plus Medusa-2's tuned target), read back as `draftsmith eval` reads it."""
    meta = json.loads((checkpoint / "config.json").read_text())
    tensors = head_tensors(checkpoint)
    lora_rank = meta["config"].get("lora_rank", 0)
    shared = card.shared_facts(checkpoint, options, "medusa", "is Medusa heads", meta.get("target_name"))
    facts = MedusaCard(**shared, num_heads=meta["config"]["num_heads"], num_layers=meta["config"]["num_layers"],
                       parameters=sum(t.numel() for n, t in tensors.items() if n != "token_map"), lora_rank=lora_rank,
                       speculative_tokens=options.speculative_tokens or meta["config"]["num_heads"])
    fields = {key: meta.get(key) for key in ("hidden_size", "vocab_size", "num_target_layers", "draft_vocab_size")}
    fields.update({f"config.{key}": meta["config"][key] for key in ("num_heads", "num_layers")})
    round_trip = RoundTrip(lambda folder: from_format(*read_folder(folder), meta["num_target_layers"]), tensors, fields)
    return Layout(validate=validate, round_trip=round_trip, facts=facts, render=render_card,
                  config=vllm_config(meta), tensors=to_vllm(tensors, meta["vocab_size"]),
                  parts={TUNED_TARGET: partial(write_tuned_target, checkpoint, meta)} if lora_rank else {})


def render_card(facts: MedusaCard) -> str:
    """README.md of a Medusa export: metadata, what it is, training, results, serving."""
    about = [
        f"{facts.num_heads} Medusa heads trained with draftsmith on the frozen `{facts.verifier}`: head i reads the "
        "target's last hidden state (after its final norm) and proposes the token i+2 ahead; the target verifies the "
        "proposals in one pass, so the output is exactly the target's own.", "",
        *card.table([("heads", facts.num_heads), ("ResBlocks per head", facts.num_layers),
                     ("parameters", f"{facts.parameters:,}"), ("format", "vLLM Medusa (`MedusaModel`)")]), ""]
    k = facts.speculative_tokens
    verifier = facts.verifier
    if facts.lora_rank:
        verifier = f"{facts.model_ref}/{TUNED_TARGET}"
        about += [
            "## Medusa-2: the tuned target verifies", "",
            f"These heads were trained jointly with LoRA adapters (rank {facts.lora_rank}) on `{facts.verifier}`, "
            f"whose own next-token distribution was distilled towards the original's. `{TUNED_TARGET}/` holds that "
            "tuned target with the adapters merged (a plain `transformers` folder); serve it, not the original, "
            "as the verifier: the output is exactly the tuned target's. How often the tuned target's greedy output "
            "equals the original's is measured in the results below (drift), when an eval was found.", ""]
    serving = ["## Serving", "", "```bash", f"vllm serve {verifier} --speculative-config "
               f"'{json.dumps({'method': 'medusa', 'model': facts.model_ref, 'num_speculative_tokens': k})}'", "```", ""]
    tags = ["speculative-decoding", "medusa", "draftsmith", "vllm"]
    return card.compose(facts, tags, "Medusa heads", about, serving)
