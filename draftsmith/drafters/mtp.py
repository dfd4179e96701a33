"""DeepSeek-style sequential multi-token-prediction (MTP) modules (DESIGN §3 "MTP").

Step k = 1..D at index t: h^k_t = norm(block_k(W_k [RMSNorm(embed(x_{t+k})); RMSNorm(h^{k-1}_t)])), logits
lm_head(h^k_t) predict x_{t+k+1}. h^0_t is the target's last hidden state after its final norm (what its
lm_head reads, `hidden_states[L]` in HF: the convention of the speculators library and vLLM), `norm` and
`lm_head` are the target's frozen final norm and head, and block_k is one decoder layer of the target's
own architecture (its class imported from transformers, built from the target's config). W_k takes the
embedding half first, as DeepSeek-V3, vLLM and speculators store it (the same map as [h; embed] with its
columns swapped). `shared=true` applies one module at every step. Positions: index t sits at position t
at every step (as speculators trains it; RoPE is relative, so only the spacing matters).

Decoding (exact, not an approximation): `mtp_proposer.MTPProposer`.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig

from draftsmith.config import build
from draftsmith.drafters import ReadsTarget, load_attached, read_folder, save_folder, target_info
from draftsmith.drafters.losses import LossOptions, distribution_loss
from draftsmith.drafters.mtp_proposer import MTPProposer
from draftsmith.errors import DraftsmithError



@dataclass
class Config(LossOptions):
    """Options of the MTP drafter."""

    num_modules: int = 3
    """D: sequential prediction steps (draft tokens per chain)"""
    shared: bool = False
    """one module applied at every step (MiMo / Qwen3-Next style; what speculators' `mtp` layout holds)"""
    init_from_last_layer: bool = True
    """start each module's block from a copy of the target's last decoder layer (false: fresh init)"""
    loss_weight: float = 1.0
    """lambda: loss = lambda / D * sum_k CE_k"""

    def validate(self) -> None:
        self.validate_loss()
        if self.num_modules < 1:
            raise DraftsmithError(f"drafter.num_modules must be at least 1, got {self.num_modules}.")
        if self.loss_weight <= 0:
            raise DraftsmithError(f"drafter.loss_weight must be positive, got {self.loss_weight}.")


# --------------------------------------------------------------------------- the model
def architecture(layer_config):
    """(decoder-layer class, rotary-embedding class) of a target config, from its transformers modeling module."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(layer_config)]
        module = sys.modules[model_class.__module__]
        layer_class = getattr(module, model_class._no_split_modules[0])
        rotary_class = getattr(module, layer_class.__name__.replace("DecoderLayer", "RotaryEmbedding"))
    except (KeyError, AttributeError, IndexError, TypeError) as err:
        raise DraftsmithError(f"MTP modules need a transformers decoder layer of the target's architecture "
                              f"('{layer_config.model_type}'); none was found ({err}).") from None
    return layer_class, rotary_class


def block_config(target_config: dict):
    """The target's config cut to one full-attention layer (the block's own cache index 0), SDPA attention."""
    values = {k: v for k, v in target_config.items() if k != "model_type"}
    config = AutoConfig.for_model(target_config["model_type"], **values)
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None):
        config.layer_types = ["full_attention"]
    config._attn_implementation = "sdpa"  # boolean masks, as every call here passes one
    return config


class Module(nn.Module):
    """One MTP module: input projection of [norm(embed); norm(hidden)], then one target-architecture block."""

    def __init__(self, layer_config, layer_class):
        super().__init__()
        H = layer_config.hidden_size
        self.input_proj = nn.Linear(2 * H, H, bias=False)
        self.block = layer_class(layer_config, layer_idx=0)
        norm_class = type(self.block.input_layernorm)
        self.token_layernorm = norm_class(H, eps=layer_config.rms_norm_eps)
        self.hidden_layernorm = norm_class(H, eps=layer_config.rms_norm_eps)

    def forward(self, embeds, hidden, mask, positions, rotary, cache=None) -> torch.Tensor:
        """Block output [B, n, H] for n indices; `mask` [B, 1, n, past + n] boolean; `cache` grows by n."""
        x = self.input_proj(torch.cat([self.token_layernorm(embeds), self.hidden_layernorm(hidden)], -1))
        out = self.block(x, attention_mask=mask, position_ids=positions, cache=cache, use_cache=cache is not None,
                         position_embeddings=rotary(x, positions))
        return out[0] if isinstance(out, tuple) else out


class Drafter(ReadsTarget, nn.Module):
    """D sequential MTP modules on the frozen target; `forward(batch, target_head)` is the training loss."""

    named = "This MTP drafter"

    def __init__(self, config: Config, target_config: dict):
        super().__init__()
        self.config, self.target_config = config, target_config
        self.layer_config = block_config(target_config)
        layer_class, rotary_class = architecture(self.layer_config)
        self.last_layer = target_config["num_hidden_layers"] - 1
        count = 1 if config.shared else config.num_modules
        self.mtp_modules = nn.ModuleList([Module(self.layer_config, layer_class) for _ in range(count)])
        self.rotary_emb = rotary_class(config=self.layer_config)
        self.target_info: dict = {}
        self.target = None  # the frozen target (embedding, final norm, head); attached, never a submodule

    @property
    def required_layers(self) -> list[int]:
        """The target's last layer: h^0 and the soft labels both come from it."""
        return [self.last_layer]

    def trained_for(self) -> dict:
        """The target this drafter was made for (it reads the target's frozen embedding, final norm and lm_head)."""
        tc = self.target_config
        return {"hidden_size": tc["hidden_size"], "num_layers": tc["num_hidden_layers"], "model_type": tc["model_type"]}

    def module(self, step: int) -> Module:
        """The module of 1-based step `step` (the one shared module when `shared`)."""
        return self.mtp_modules[0 if self.config.shared else step - 1]

    # ---- pieces shared by training and decoding
    def _target(self):
        if self.target is None:
            raise DraftsmithError("This MTP drafter is not attached to a target: call drafter.attach(target) first.")
        return self.target

    def embed(self, ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """The target's frozen embedding of `ids`, in the drafter's dtype."""
        target = self._target()
        return target.embed(ids.to(target.device)).to(like.device, like.dtype)

    def normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's frozen final norm (gradients flow through it to the drafter)."""
        target = self._target()
        return target.final_norm(hidden.to(target.dtype)).to(hidden.dtype)

    def logits(self, normed_hidden: torch.Tensor) -> torch.Tensor:
        """The target's frozen lm_head on an already-normed hidden."""
        target = self._target()
        return target.model.get_output_embeddings()(normed_hidden.to(target.dtype)).float()

    def run(self, step: int, ids, hidden, positions, mask, cache=None) -> torch.Tensor:
        """h^step [B, n, H] = norm(module(embed(ids), h^{step-1})) for n indices."""
        out = self.module(step)(self.embed(ids, hidden), hidden, mask, positions, self.rotary_emb, cache)
        return self.normed(out)

    def teacher_forced(self, input_ids, last_features, attention_mask=None, steps=None) -> list[torch.Tensor]:
        """h^1..h^D [B, S, H] on a whole sequence: step k at index t reads x_{t+k} (zero past the end). `steps`
        beyond D only for a shared module."""
        batch, length = input_ids.shape
        index = torch.arange(length, device=input_ids.device)
        sees = (index[None, :] <= index[:, None])[None].expand(batch, length, length)
        if attention_mask is not None:  # padded keys are hidden; a query always sees itself
            sees = sees & (attention_mask[:, None, :].bool() | torch.eye(length, dtype=torch.bool, device=index.device))
        mask, positions = sees[:, None], index[None].expand(batch, length)
        hidden = self.normed(last_features.to(self.mtp_modules[0].input_proj.weight.dtype))
        outputs = []
        for step in range(1, (steps or self.config.num_modules) + 1):
            ids = torch.zeros_like(input_ids)
            ids[:, : max(length - step, 0)] = input_ids[:, step:]
            hidden = self.run(step, ids, hidden, positions, mask)
            outputs.append(hidden)
        return outputs

    def forward(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """(lambda/D) sum_k CE_k against the target's own distribution; loss_j / acc_j for step j = k-1."""
        last = batch["features"][self.last_layer]
        outputs = self.teacher_forced(batch["input_ids"], last, batch.get("attention_mask"))
        loss_mask = batch["loss_mask"].bool()
        total, metrics = last.new_zeros((), dtype=torch.float32), {}
        for j, hidden in enumerate(outputs):
            step = j + 1  # index t predicts x_{t+step+1}: the target's prediction at position t+step
            counted = loss_mask[:, step + 1 :]
            rows = counted.nonzero(as_tuple=True)
            if rows[0].numel() == 0:
                continue
            log_q = torch.log_softmax(self.logits(hidden[rows]), -1)
            with torch.no_grad():
                p = torch.softmax(target_head(last[rows[0], rows[1] + step]).float(), -1)
            step_loss = distribution_loss(self.config.loss, log_q, p, eta=self.config.loss_eta).mean()
            total = total + step_loss
            metrics[f"loss_{j}"] = float(step_loss.detach())
            metrics[f"acc_{j}"] = float((log_q.argmax(-1) == p.argmax(-1)).float().mean())
        total = total * self.config.loss_weight / self.config.num_modules
        metrics["loss"] = float(total.detach())
        return total, metrics

    def loss(self, batch: dict, target_head) -> tuple[torch.Tensor, dict[str, float]]:
        """The training loss and metrics (calls `forward`, so wrappers such as DDP see the call)."""
        return self(batch, target_head)

    # ---- saving
    def save_pretrained(self, folder: str | Path) -> None:
        """config.json (kind, options, the target's config) + model.safetensors (modules only, no target parts)."""
        save_folder(folder, "mtp", {"config": dataclasses.asdict(self.config), "target_config": self.target_config}, self)

    @classmethod
    def from_pretrained(cls, folder: str | Path, target=None) -> Drafter:
        """Load a folder written by `save_pretrained`, attached to `target` when given."""
        meta, tensors, target_record = read_folder(folder, "mtp")
        drafter = cls(build(Config, meta["config"], prefix="drafter."), meta["target_config"])
        drafter.load_state_dict(tensors)
        drafter.target_info = target_record
        return drafter if target is None else drafter.attach(target)

    def proposer(self, target, generator: torch.Generator | None = None) -> MTPProposer:
        """The decode-time view of this drafter for `target`."""
        return MTPProposer(self.attach(target), generator)


# --------------------------------------------------------------------------- building
def create(config: Config, target, draft_vocab=None) -> Drafter:
    """Fresh MTP modules for `target` (blocks copied from its last layer when `init_from_last_layer`)."""
    config = dataclasses.replace(config)
    config.validate()
    if draft_vocab is not None:
        raise DraftsmithError("MTP modules predict through the target's own lm_head over its whole vocabulary; set "
                              "data.draft_vocab: null for kind mtp.")
    drafter = Drafter(config, target.config.to_dict()).to(target.device)
    drafter.target_info = target_info(target)
    drafter.attach(target)
    if config.init_from_last_layer:
        last = target.layers[-1].state_dict()
        for module in drafter.mtp_modules:
            missing = set(module.block.state_dict()) ^ set(last)
            if missing:
                raise DraftsmithError(f"drafter.init_from_last_layer: the target's last layer differs from the block "
                                      f"(weights {sorted(missing)[:4]}); set it to false.")
            module.block.load_state_dict({k: v.float() for k, v in last.items()})
    return drafter


def load_proposer(folder: str | Path, target) -> MTPProposer:
    """A saved MTP folder as a Proposer for `target`."""
    return load_attached(Drafter, folder, target).proposer(target)
