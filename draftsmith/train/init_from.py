"""Fine-tuning from an existing drafter (recipe key `init_from: DIR`): the weights, architecture and draft vocabulary
a run starts from.

`draftsmith train RECIPE init_from=DIR` starts the recipe's drafter kind from a draftsmith folder or from any export
or public checkpoint of that kind, read in memory by `draftsmith.export.readers` (the loader `draftsmith eval` uses).
What the weights mean is kept exactly as the checkpoint has it: its architecture options (feature layers, sizes,
block size, ...) and its draft vocabulary (d2t/t2d, or a Medusa head's token map); the recipe supplies how to train
(loss weights, TTT steps, ...). A recipe that names an architecture option, or a draft vocabulary (`data.draft_vocab`),
other than the checkpoint's is refused with both named: rebuilding a vocabulary would send every trained head row to
another token, and acceptance would collapse without training accuracy showing it. `data.draft_vocab: null` takes
the checkpoint's vocabulary as it is.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from draftsmith.config import build
from draftsmith.data.vocab import DraftVocab
from draftsmith.drafters import kind_module, target_info
from draftsmith.errors import DraftsmithError

ARCHITECTURE = {
    "eagle": ("variant", "layers", "intermediate_size", "norm_before_residual", "fc_norm", "norm_output", "mask_token_id"),
    "medusa": ("num_heads", "num_layers", "lora_rank", "lora_alpha", "lora_target_modules"),
    "mtp": ("shared",),  # plus num_modules when the modules are separate (`architecture_keys`)
    "dflash": ("variant", "block_size", "num_layers", "num_target_layers", "target_layer_ids", "mask_token_id",
               "markov_rank"),
    "draft_lm": ("num_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"),
}
"""drafter options that say what the weights are (the checkpoint's are kept); every other option is the recipe's"""


def starting_drafter(kind: str, section: dict, folder: str | Path, target, recipe_vocab: DraftVocab | None,
                     vocab_source: str | None):
    """(drafter, its options, its draft vocabulary) for a run that starts from the checkpoint in `folder`.

    `section`: the recipe's drafter section (its explicit keys are checked against the checkpoint's architecture);
    `recipe_vocab`: the vocabulary `data.draft_vocab` (`vocab_source`) names, refused unless it is the checkpoint's."""
    from draftsmith.export import readers
    from draftsmith.hub import drafter_folder

    folder = drafter_folder(str(folder))
    expected = readers.expectations(folder)
    if expected.kind != kind:
        raise DraftsmithError(f"init_from: '{folder}' holds a {expected.kind} drafter ({expected.layout}); this recipe "
                              f"trains drafter.kind {kind}.")
    readers.check_fit(folder, expected, target)
    if kind == "draft_lm":
        drafter, options = _draft_model(folder, section, target)
    else:
        _, parts = readers.contents(folder, target)
        options = _options(kind, section, parts.meta.get("config") or {}, folder)
        parts.meta = {**parts.meta, "config": dataclasses.asdict(options)}
        try:
            drafter = kind_module(kind).Drafter.from_pretrained(parts, target)
        except RuntimeError as err:  # load_state_dict: names or shapes our drafter does not have
            raise DraftsmithError(f"init_from: '{folder}' does not hold what a draftsmith {kind} drafter has: "
                                  f"{' '.join(str(err).split())[:400]}") from None
        drafter.target_info = target_info(target)
    vocab = _kept_vocab(drafter, target.vocab_size)
    _check_same_vocab(vocab, recipe_vocab, folder, vocab_source)
    return drafter.to(target.device), options, vocab


def _options(kind: str, section: dict, saved: dict, folder: Path):
    """The recipe's options with the checkpoint's architecture; a recipe key that names another architecture is
    refused."""
    explicit = {k: v for k, v in section.items() if k != "kind"}
    merged = dict(explicit)
    keys = ARCHITECTURE[kind] + (("num_modules",) if kind == "mtp" and not saved.get("shared") else ())
    conflicts = []
    for key in keys:
        if key not in saved:
            continue
        if key in explicit and explicit[key] is not None and explicit[key] != saved[key]:
            conflicts.append(f"drafter.{key}: {explicit[key]!r} in the recipe, {saved[key]!r} in the checkpoint")
        merged[key] = saved[key]
    if conflicts:
        raise DraftsmithError(f"init_from: '{folder}' keeps its own architecture; the recipe asks for another ("
                              + "; ".join(conflicts) + "). Remove those keys from the drafter section or set them to "
                              "the checkpoint's values.")
    return build(kind_module(kind).Config, merged, prefix="drafter.")


def _draft_model(folder: Path, section: dict, target):
    """A draft LM from any transformers folder (ours or an `hf` export), trained with the recipe's options."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftsmith.drafters import draft_lm

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    draft_lm.check_same_tokenizer(tokenizer, target.tokenizer, str(folder), target.name)
    c = model.config
    saved = {"num_layers": c.num_hidden_layers, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
             "num_attention_heads": c.num_attention_heads,
             "num_key_value_heads": getattr(c, "num_key_value_heads", None) or c.num_attention_heads}
    if c.hidden_size == target.hidden_size:  # what `init: fresh` leaves unset means the target's; keep it unset
        saved = {k: v for k, v in saved.items() if k == "num_layers" or getattr(target.config, k, None) != v}
    options = _options("draft_lm", section, saved, folder)
    if options.freeze_embeddings:
        for module in (model.get_input_embeddings(), model.get_output_embeddings()):
            module.requires_grad_(False)
    drafter = draft_lm.Drafter(options, model, target.num_layers, tokenizer)
    drafter.target_info = {"target_name": target.name, "target_fingerprint": target.fingerprint()}
    return drafter, options


def _kept_vocab(drafter, vocab_size: int) -> DraftVocab | None:
    """The checkpoint's draft vocabulary as the recipe holds one (None: the whole vocabulary)."""
    ids = None
    if getattr(drafter, "token_map", None) is not None:  # Medusa heads over a draft vocabulary
        ids = drafter.token_map.detach().cpu().long()
    elif getattr(drafter, "d2t", None) is not None and drafter.d2t.numel() < vocab_size:  # EAGLE-3, DFlash
        ids = torch.arange(drafter.d2t.numel()) + drafter.d2t.detach().cpu().long()
    if ids is None:
        return None
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return DraftVocab(d2t=ids - torch.arange(ids.numel()), t2d=t2d, coverage=float("nan"))


def _check_same_vocab(kept: DraftVocab | None, recipe: DraftVocab | None, folder: Path, source: str | None) -> None:
    """Refuse a recipe vocabulary other than the checkpoint's (null in the recipe takes the checkpoint's)."""
    if recipe is None:
        return
    def describe(vocab):
        return "the whole vocabulary" if vocab is None else f"{vocab.size} tokens"

    same = kept is not None and torch.equal(kept.target_ids(), recipe.target_ids().long())
    if not same:
        differ = ""
        if kept is not None and kept.size == recipe.size:
            row = int((kept.target_ids() != recipe.target_ids().long()).nonzero()[0])
            differ = f"; row {row} drafts token {int(kept.target_ids()[row])} in the checkpoint, " \
                     f"{int(recipe.target_ids()[row])} in the recipe's"
        raise DraftsmithError(
            f"init_from: the checkpoint '{folder}' drafts over {describe(kept)}, the recipe's data.draft_vocab "
            f"'{source}' over {describe(recipe)}{differ}. The checkpoint's draft vocabulary is kept as it is, never "
            "rebuilt (its head rows would draft other tokens); set data.draft_vocab: null to train with it.")
