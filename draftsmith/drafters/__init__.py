"""Drafters and the small interface the speculative decoder talks to.

Decode time (every drafter, trained or training-free, looks the same to `draftsmith.eval`):

- the decoder keeps a `DecodeState`: every committed token (prompt included) and, for drafters
  that read target features, the target's features at every committed position except the
  last (the last committed token has not been through the target yet);
- it calls `proposer.propose(state, shape, sampling)` and gets a `Draft` back;
- it verifies the draft in one target forward, commits the accepted prefix plus one target
  token, and calls `propose` again. A proposer keeps its own cache and rolls it back itself
  by comparing what it has cached with `state.tokens` (the committed prefix can only grow by
  tokens it proposed or by the target's correction/bonus token).

Training time (trained kinds) is in each kind's file: `required_layers(target)`,
`loss(batch, target_head) -> (loss, metrics)`, `save_pretrained(dir)` / `from_pretrained(dir)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from draftsmith.sampling import Sampling  # noqa: F401  (part of the drafter interface)


@dataclass(frozen=True)
class DraftShape:
    """What to propose: a chain of `length` tokens, or an EAGLE-2 dynamic tree when `tree` is set."""

    length: int = 4
    tree: tuple[int, int, int] | None = None  # (depth, top_k, total_tokens)


@dataclass
class DecodeState:
    """What has been committed so far for one request (batch size 1)."""

    tokens: torch.Tensor  # [1, T] every committed token, prompt included
    features: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [1, T-1, H]
    prompt_length: int = 0


@dataclass
class Draft:
    """Drafted tokens. `parents` None = a chain (or a block); else a tree.

    - tokens: [n] token ids (target vocabulary).
    - parents: [n] index of each node's parent in `tokens`, -1 for children of the root (the
      last committed token); parents[i] < i. None for chains.
    - probs: [n, V] the draft distribution q each token was sampled from, over the target
      vocabulary and after the same temperature/top-k/top-p processing as the target. Needed
      for lossless sampling with chains; None for greedy drafts, and for trees, whose
      candidates are top-k picks (q treated as one-hot, DESIGN §3).
    """

    tokens: torch.Tensor
    parents: torch.Tensor | None = None
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.numel())


class Proposer(Protocol):
    """Anything that drafts: trained drafters, suffix matching and its prompt-lookup preset, an independent HF model,
    a hybrid. This is the whole contract: the decoder, the eval runner and the small-batch router use nothing else.

    Every proposer defines `reset`, `propose` and `describe` (and `required_layers` where it reads target features).
    The rest are optional capabilities; a proposer subclasses this class to inherit their defaults, which mean "not
    this proposer". The pieces proposers share (accepted-count bookkeeping, cache catch-up and crop, probe back-off,
    confidence cuts, draft-vocabulary rows) are in `draftsmith.drafters.base`."""

    required_layers: list[int] = []
    """target layers whose features the decoder must keep in `DecodeState.features` (empty: none)"""
    verifier = None
    """the target that must verify these drafts where it is not the target itself (Medusa-2's tuned target): the
    runner verifies, and runs every baseline, with it"""
    assistant_model = None
    """the draft network as `transformers` `generate(assistant_model=...)` takes it (a draft LM), for the assisted
    baseline; None: this proposer has none"""
    can_cut = False
    """whether drafts can be cut where the drafter's confidences stop paying (`--confidence-cut`)"""
    confidence_cut = False
    """whether drafts are cut so (settable where `can_cut`)"""
    verify_cost: dict[int, float] | None = None
    """the target's verify-cost curve t(n) that drafting reads (`calibrate` measures it); None: not measured"""
    longest_draft = 1
    """the longest draft this proposer makes unasked: how far `calibrate` measures by default"""

    def reset(self) -> None:
        """Forget everything about the previous request."""

    def propose(self, state: DecodeState, shape: DraftShape, sampling: Sampling) -> Draft:
        """Draft continuations of `state.tokens`."""

    def describe(self) -> dict:
        """A JSON-able description for reports (kind, size, source)."""

    @property
    def wants_verify_cost(self) -> bool:
        """Whether drafting reads `verify_cost`: the runner has the proposer `calibrate` before decoding."""
        return self.confidence_cut

    def calibrate(self, target, longest: int | None = None, context_tokens: int = 256) -> dict[int, float]:
        """Measure the target's verify-cost curve t(n) for n = 1 .. longest + 1 (default `longest_draft`), in
        seconds, after a random context of `context_tokens` (a few seconds); drafting reads it from now on."""
        from draftsmith.cost import measure

        self.verify_cost = measure(target, longest or self.longest_draft, context_tokens)
        return self.verify_cost

    def networks(self) -> list:
        """The networks (`torch.nn.Module`s) this proposer drafts with, not the target: where the small-batch router
        installs its few-row products."""
        return []


# --------------------------------------------------------------------------- trained kinds
# kind -> module. Each module defines:
#   Config                      dataclass of the kind's options (field docstrings -> --help)
#   Drafter(nn.Module)          .required_layers: list[int]; .loss(batch, target_head) -> (loss, metrics);
#                               .save_pretrained(dir); Drafter.from_pretrained(dir);
#                               .proposer(target) -> Proposer (decode-time view of this drafter)
#   create(config, target, draft_vocab=None) -> Drafter
#   load_proposer(folder, target) -> Proposer
# A kind whose file would carry two jobs keeps its decode-time Proposer class (and its layers) in files beside it,
# <kind>_proposer.py (<kind>_layers.py); the names above stay in the kind's own module.
# A saved drafter folder holds config.json with "draftsmith_kind": <kind> and model.safetensors.
KINDS = {
    "eagle": "draftsmith.drafters.eagle",
    "draft_lm": "draftsmith.drafters.draft_lm",
    "mtp": "draftsmith.drafters.mtp",
    "medusa": "draftsmith.drafters.medusa",
    "dflash": "draftsmith.drafters.dflash",
}


def kind_module(kind: str):
    """The module implementing a trained drafter kind; clear error for unknown kinds."""
    import difflib
    import importlib

    from draftsmith.errors import DraftsmithError

    if kind not in KINDS:
        close = difflib.get_close_matches(kind, list(KINDS), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise DraftsmithError(f"Unknown drafter kind '{kind}'.{hint} Known kinds: {', '.join(KINDS)}.")
    return importlib.import_module(KINDS[kind])


# --------------------------------------------------------------------------- what every trained kind shares
def shared_prefix(cached: torch.Tensor, tokens: torch.Tensor) -> int:
    """How many leading tokens of 1-D `cached` and `tokens` are equal: how much of a proposer's cache, made for the
    tokens it saw, still holds for the tokens committed now."""
    common = min(cached.numel(), tokens.numel())
    if not common:
        return 0
    if torch.equal(cached[:common], tokens[:common]):  # the usual case: what was seen is still committed (one op)
        return common
    return int(torch.cumprod((cached[:common] == tokens[:common]).long(), 0).sum())


def predicting_positions(loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch rows, positions) s whose next token x_{s+1} is learned (loss_mask[s+1] = 1): where the target's
    distribution is needed as a training label."""
    needed = torch.zeros_like(loss_mask, dtype=torch.bool)
    needed[:, :-1] = loss_mask[:, 1:].bool()
    return needed.nonzero(as_tuple=True)


@torch.no_grad()
def soft_labels(target_head, last: torch.Tensor, rows: torch.Tensor | None = None,
                argmax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the target's next-token distribution over a head's rows [n, N], its argmax over the whole vocabulary [n]) at
    the target's last-layer features `last` [n, H]. `rows`: the target ids of a draft-vocabulary head's rows, over
    which the distribution is the target's renormalised (as EAGLE-3 trains); None: the whole vocabulary.
    `argmax`: the target's argmax when it is already known (stored at capture, `stored_soft_labels`), which spares
    a draft-vocabulary head the pass over the rest of the vocabulary.
    `target_head`: a `TargetHead`, whose `draft_targets` never holds [n, V] logits, or any function giving them."""
    if rows is None:
        p = torch.softmax(target_head(last).float(), -1)
        return p, p.argmax(-1) if argmax is None else argmax
    if hasattr(target_head, "draft_targets"):
        logits, found = target_head.draft_targets(last, rows, argmax=argmax is None)
    else:
        full = target_head(last).float()
        logits, found = full[..., rows], full.argmax(-1)
    return torch.softmax(logits.float(), -1), found if argmax is None else argmax


def stored_soft_labels(values: torch.Tensor, indices: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`soft_labels` from the target's top-k logits stored at capture (`draftsmith capture --topk-logits K`):
    `values`, `indices` [n, k], best first; `rows`: the sorted target ids of the head's rows. The distribution
    over the rows is the softmax over those of the k tokens that are rows; the vocabulary beyond the top k counts
    as zero, an approximation that needs no target head at all. A position none of whose k tokens is a row gets
    zeros (its argmax is not a row either)."""
    indices = indices.long()
    slot = torch.searchsorted(rows, indices).clamp(max=rows.numel() - 1)
    inside = rows[slot] == indices
    probs = torch.softmax(values.float().masked_fill(~inside, float("-inf")), -1)
    probs = torch.where(inside, probs, 0.0)  # a position with no k token inside is all -inf: NaN -> 0
    p = probs.new_zeros(indices.shape[0], rows.numel()).scatter_add_(1, torch.where(inside, slot, 0), probs)
    return p, indices[:, 0]


TARGET_INFO = ("target_name", "target_architectures", "target_fingerprint")
"""what a drafter folder records about its target (config.json top level)"""


def target_info(target) -> dict:
    """A drafter's record of its target: name and architectures (what exporters name as the verifier) and the
    fingerprint that `check_target` compares when the drafter is attached to a target again."""
    architectures = getattr(target.config, "architectures", None) or [type(target.model).__name__]
    return {"target_name": target.name, "target_architectures": list(architectures),
            "target_fingerprint": target.fingerprint()}


def check_target(trained_for: dict, recorded: dict | None, target, what: str) -> None:
    """Refuse `target` unless it matches the `trained_for` facts (name -> value, read from the target by the same
    names: hidden_size, vocab_size, num_layers, ...) and, where the drafter records one, its tokenizer."""
    from draftsmith.errors import DraftsmithError
    from draftsmith.target import fingerprint_mismatch

    actual = {name: getattr(target, name, None) if hasattr(target, name) else getattr(target.config, name, None)
              for name in trained_for}
    if actual != trained_for:
        def facts(values: dict) -> str:
            return ", ".join(f"{name.replace('_', ' ')} {value}" for name, value in values.items())

        raise DraftsmithError(f"{what} was trained for a target with {facts(trained_for)}; '{target.name}' has "
                              f"{facts(actual)}.")
    why = recorded and fingerprint_mismatch(recorded, target.fingerprint(), model=False)
    if why:
        raise DraftsmithError(f"{what} does not fit target '{target.name}': {why}. Its token ids would mean other "
                              "tokens; use the target it was trained for.")


class ReadsTarget:
    """A trained drafter that reads frozen parts of its target (embedding, final norm, lm_head), never stored and
    never its submodules, once `attach`ed: the kind says which facts it was trained for (`trained_for`, read from a
    target by the same names) and how messages name it (`named`)."""

    named = "This drafter"
    target = None

    def trained_for(self) -> dict:
        """The target's facts this drafter was trained for (hidden_size, vocab_size, num_layers, ...)."""
        raise NotImplementedError

    def attach(self, target):
        """Read `target`'s frozen parts from now on, after checking that it is the target this drafter was made for:
        the same sizes, and the same tokenizer where the drafter records one."""
        check_target(self.trained_for(), self.target_info.get("target_fingerprint"), target, self.named)
        self.target = target
        return self


def load_attached(drafter_class, folder, target):
    """`drafter_class.from_pretrained(folder, target)` on the target's device and dtype (bf16 targets draft in
    bf16 too); errors name the folder."""
    from draftsmith.errors import DraftsmithError

    try:
        drafter = drafter_class.from_pretrained(folder, target)
    except DraftsmithError as err:
        raise DraftsmithError(f"The drafter in '{folder}': {err}") from None
    return drafter.to(target.device, target.dtype)


def save_folder(folder, kind: str, meta: dict, drafter, names=None) -> None:
    """A drafter folder: config.json ({"draftsmith_kind": kind, **meta, target record}) and model.safetensors
    (the drafter's own tensors, or only those in `names`: no frozen target part is ever stored)."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"draftsmith_kind": kind, **meta, **drafter.target_info}
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
    save_file({k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items() if names is None or k in names},
              str(folder / "model.safetensors"), metadata={"format": "pt"})


@dataclass
class FolderContents:
    """What a drafter folder holds (its config.json and tensors), in memory: how a drafter in another layout, turned
    into our names by `draftsmith.export.readers`, is built by its kind's `from_pretrained` without writing files.
    Anything that takes a folder for `read_folder` takes this too; `source` names the folder in messages."""

    meta: dict
    tensors: dict[str, torch.Tensor]
    source: str

    def __str__(self) -> str:
        return self.source


def read_folder(folder, kind: str) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """(config.json, tensors, target record) of a folder `save_folder` wrote for `kind` (or of `FolderContents`);
    clear errors otherwise."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    from draftsmith.errors import DraftsmithError

    if isinstance(folder, FolderContents):
        meta, tensors = folder.meta, dict(folder.tensors)
        if meta.get("draftsmith_kind") != kind:
            raise DraftsmithError(f"'{folder}' holds a '{meta.get('draftsmith_kind')}' drafter, not a {kind} one.")
        return meta, tensors, {k: meta[k] for k in TARGET_INFO if meta.get(k) is not None}
    folder = Path(folder)
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise DraftsmithError(f"'{folder}' is not a drafter folder: it needs config.json and model.safetensors.")
    meta = json.loads((folder / "config.json").read_text())
    if meta.get("draftsmith_kind") != kind:
        raise DraftsmithError(f"'{folder}' holds a '{meta.get('draftsmith_kind')}' drafter, not a {kind} one.")
    return meta, load_file(str(folder / "model.safetensors")), {k: meta[k] for k in TARGET_INFO if k in meta}
