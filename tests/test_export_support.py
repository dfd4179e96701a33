"""Helpers for the export tests: real EAGLE-3 drafter folders for a tiny target.

`make_checkpoint` builds the drafter with `draftsmith.drafters.eagle.create` (random fc/layer weights,
lm_head from the target's rows, a 64-token draft vocabulary) and saves it with `save_pretrained`,
exactly as training does, inside a run folder whose training.json names the target.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file
from tiny import tiny_target

from draftsmith.export import readers
from draftsmith.export.check import Expected, validate_export

HIDDEN, VOCAB, DRAFT_VOCAB, LAYERS = 64, 320, 64, 8
TARGET_LAYERS = [1, 3, 4]  # EAGLE-3 default for an 8-layer target: 1, L/2 - 1, L - 4
TARGET_HUB_ID = "HuggingFaceTB/tiny-llama"

_TARGET = None


def target():
    """One tiny Llama target shared by the export tests (8 layers, H=64, V=320)."""
    global _TARGET
    if _TARGET is None:
        _TARGET = tiny_target("llama")
    return _TARGET


def draft_vocab(seed: int = 0, size: int = DRAFT_VOCAB, vocab: int = VOCAB) -> SimpleNamespace:
    """A draft vocabulary of token 0 plus `size - 1` random target tokens: d2t offsets and the t2d mask."""
    others = torch.randperm(vocab - 1, generator=torch.Generator().manual_seed(seed))[: size - 1] + 1
    used = torch.cat([torch.zeros(1, dtype=torch.long), others]).sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    return SimpleNamespace(d2t=used - torch.arange(size), t2d=t2d)


def make_checkpoint(run: Path, seed: int = 0, training: dict | None = None, for_target=None, perturb: bool = True,
                    **options) -> Path:
    """Train-free EAGLE-3 drafter saved like `draftsmith train` saves `best/`; returns the drafter folder."""
    from draftsmith.drafters import eagle

    torch.manual_seed(seed)
    config = eagle.Config(**options)
    drafter = eagle.create(config, for_target or target(), draft_vocab(seed) if config.variant == "eagle3" else None)
    with torch.no_grad():  # make every weight distinct from its init, norms included
        for parameter in drafter.parameters():
            if parameter.requires_grad and perturb:
                parameter.add_(torch.randn_like(parameter) * 0.02)
    folder = run / "best"
    drafter.save_pretrained(folder)
    (run / "training.json").write_text(json.dumps(training if training is not None else {"target": TARGET_HUB_ID}))
    return folder


def always_accepted_target():
    """A tiny target whose lm_head is zero, so it always emits token 0; a drafter whose head starts from
    it (and whose draft vocabulary holds token 0) always drafts 0 too: every draft is accepted."""
    from tiny import byte_tokenizer, tiny_model

    from draftsmith.target import Target

    model = tiny_model("llama")
    with torch.no_grad():
        model.lm_head.weight.zero_()
    return Target(model, byte_tokenizer(), name="tiny-always-0")


def rewrite(folder: Path, config_edit=None, tensor_edit=None) -> None:
    """Edit an exported folder in place (to plant one defect for the validator to find)."""
    if config_edit:
        config = json.loads((folder / "config.json").read_text())
        config_edit(config)
        (folder / "config.json").write_text(json.dumps(config))
    if tensor_edit:
        tensors = load_file(str(folder / "model.safetensors"))
        tensor_edit(tensors)
        save_file(tensors, str(folder / "model.safetensors"))


def load_exported(folder: str | Path, target):
    """One of our speculators or SGLang exports -> a Proposer for `target`, in memory.

    Validated strictly first (what `draftsmith export` guarantees), so a broken export fails here with the
    validator's message instead of drafting badly; `draftsmith.export.readers` reads any folder of the layout."""
    validate_export(folder, expected=Expected(num_target_layers=target.num_layers,
                                              target_hidden_size=target.hidden_size,
                                              target_vocab_size=target.vocab_size))
    return readers.load_proposer(folder, target)
