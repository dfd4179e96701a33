"""The parity harness: an export read by the real `speculators` library must compute our drafter's logits.

The library (vLLM's format, `pip install --no-deps speculators==0.9.0` plus `openai`, `hs-connectors`)
loads the export folder with its own model class. The target features are recomputed from the export's
own layer ids in the library's convention (HF `hidden_states[id]`: the stream entering layer id), so an
export whose ids, norms or weights another loader reads differently gives other logits and fails.
"""

from __future__ import annotations

from pathlib import Path

import torch


def speculators_eagle3_logits(folder: str | Path, target, input_ids: torch.Tensor, steps: int,
                              share_embedding: bool = True) -> list[torch.Tensor]:
    """Draft logits [S-1, draft_vocab] of every TTT step of the speculators model loaded from `folder`,
    on the features of `target` at the layers the export's config names (teacher forced). `share_embedding`:
    give the model the target's embedding, as engines do (False: only what the folder holds)."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(folder))
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention needs a GPU compiler
    model = Eagle3DraftModel.from_pretrained(str(folder), config=config).eval()
    with torch.no_grad():
        if share_embedding:  # the library's known quirk: no embedding in the file, so it would stay at zero
            model.embed_tokens.weight.copy_(target.model.get_input_embeddings().weight)
        hidden = target.model(input_ids, output_hidden_states=True).hidden_states
    aux = torch.cat([hidden[i] for i in model.config.eagle_aux_hidden_state_layer_ids], dim=-1)
    logits: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: logits.append(out[0].detach()))
    try:
        with torch.no_grad():  # their data convention: index i reads feature i and token x_{i+1}
            model(hidden_states=aux[:, :-1], input_ids=input_ids[:, 1:],
                  document_ids=torch.zeros_like(input_ids[:, 1:]), ttt_steps=steps)
    finally:
        hook.remove()
    return logits


def ours_eagle3_logits(drafter, target, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Our drafter's logits [S, draft_vocab] of every TTT step on the same sequence."""
    with torch.no_grad():
        features = target.forward(input_ids, layers=drafter.required_layers, logits=False).features
        outputs = drafter.eval().ttt_forward(input_ids, features, steps=steps)
        return [drafter.logits(hidden, target.head)[0] for hidden in outputs]


def compare(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> dict:
    """Worst max-abs logit difference and lowest argmax agreement over the steps, on the indices both
    compute from real tokens (step j: the first S-1-j indices)."""
    worst, agreement = 0.0, 1.0
    for step, (a, b) in enumerate(zip(ours, theirs)):
        n = b.shape[0] - step
        a, b = a[:n].float(), b[:n].float()
        worst = max(worst, float((a - b).abs().max()))
        agreement = min(agreement, float((a.argmax(-1) == b.argmax(-1)).float().mean()))
    return {"max_abs_difference": worst, "argmax_agreement": agreement, "steps": len(theirs)}


def speculators_mtp_logits(folder: str | Path, target, input_ids: torch.Tensor) -> list[torch.Tensor]:
    """Logits [valid, V] of every MTP step of the speculators model loaded from `folder`, teacher forced on
    `target`'s hidden state at the index the library names (`target_layer_ids`: HF `hidden_states[L]`)."""
    from speculators.models.mtp import MTPDraftModel, MTPSpeculatorConfig

    config = MTPSpeculatorConfig.from_pretrained(str(folder))
    config.transformer_layer_config._attn_implementation = "eager"
    model = MTPDraftModel.from_pretrained(str(folder), config=config).eval()
    with torch.no_grad():  # the verifier's embedding and head, as engines share them (not in the file)
        model.embed_tokens.weight.copy_(target.model.get_input_embeddings().weight)
        model.lm_head.weight.copy_(target.model.get_output_embeddings().weight)
        hidden = target.model(input_ids, output_hidden_states=True).hidden_states
        logits, _, _ = model(input_ids=input_ids, hidden_states=hidden[model.target_layer_ids[0]])
    return [step[0] for step in logits]


def ours_mtp_logits(drafter, target, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Our MTP drafter's logits [S, V] of every step on the same sequence."""
    with torch.no_grad():
        features = target.forward(input_ids, layers=drafter.required_layers, logits=False).features
        outputs = drafter.eval().teacher_forced(input_ids, features[drafter.last_layer], steps=steps)
        return [drafter.logits(hidden)[0] for hidden in outputs]


def load_speculators_dflash(folder: str | Path):
    """The speculators model of a `dflash` / `dspark` folder: the class its config's speculators_model_type names,
    with the embedding and lm_head the library itself fills from the verifier the config names."""
    from speculators import SpeculatorModelConfig
    from speculators.model import SpeculatorModel

    config = SpeculatorModelConfig.from_pretrained(str(folder))
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention needs a GPU compiler
    return SpeculatorModel.from_pretrained(str(folder), config=config).eval()


def speculators_dflash_logits(model, target, input_ids: torch.Tensor, anchors: list[int]) -> dict[str, torch.Tensor]:
    """Draft logits [N, B-1, V] of the blocks at `anchors` (DSpark: with its Markov bias, plus its confidence logits
    [N, B-1]) as the library's own forward computes them on `input_ids` [1, S], from `target`'s features at the
    config's layer ids read as the library reads them (HF `hidden_states[id]`). A loss mask allowing exactly the
    anchors pins the blocks it draws (they must be sorted, distinct and end inside the sequence); its loss is not
    computed (the fused kernels need Triton): the recorder keeps what it would score."""
    import importlib
    from unittest import mock

    size, length = model.block_size, input_ids.shape[1]
    assert anchors == sorted(set(anchors)) and anchors[-1] < length - size, anchors
    loss_mask = torch.zeros_like(input_ids)
    loss_mask[0, anchors] = 1
    module = importlib.import_module(type(model).__module__)  # dflash.core or dspark.core: each its compute_metrics
    scored: list[tuple] = []
    with torch.no_grad(), mock.patch.object(module, "compute_metrics",
                                            lambda *args, **_: scored.append(args) or (torch.zeros(()), {})):
        hidden = target.model(input_ids, output_hidden_states=True).hidden_states
        model(hidden_states=torch.cat([hidden[i] for i in model.target_layer_ids], dim=-1), input_ids=input_ids,
              loss_mask=loss_mask, verifier_last_hidden_states=hidden[-1], document_ids=torch.zeros_like(input_ids),
              max_anchors=len(anchors))
    logits = scored[0][0].view(len(anchors), size, -1)[:, 1:]  # block position 0 is the anchor: nothing drafted
    out = {"logits": logits.float()}
    if model.config.speculators_model_type == "dspark":
        out["confidence"] = scored[0][2].view(len(anchors), size)[:, 1:].float()
    return out


def ours_dflash_logits(drafter, target, input_ids: torch.Tensor, anchors: list[int]) -> dict[str, torch.Tensor]:
    """Our proposer's draft logits [N, B-1, V] (the decode path) for the block at each anchor a: committed tokens
    0..a, the target's features of positions 0..a-1. DSpark: plus the Markov bias, and the confidence logits
    [N, B-1], of the sequence's own tokens as the previous block tokens (x_a, x_{a+1}, ...: teacher forced, as the
    library computes them)."""
    from draftsmith.drafters import DecodeState

    out: dict[str, list] = {"logits": [], "confidence": []}
    with torch.no_grad():
        for a in anchors:
            tokens = input_ids[:, : a + 1]
            features = target.forward(tokens[:, :-1], layers=drafter.required_layers, logits=False).features
            hidden = drafter.proposer(target).block_hidden(DecodeState(tokens, features))[1:]
            logits = drafter.logits(hidden)
            if drafter.dspark:
                bias, confidence = drafter.markov(hidden, input_ids[0, a : a + len(hidden)])
                logits = logits + bias
                out["confidence"].append(confidence)
            out["logits"].append(logits)
    return {name: torch.stack(values).float() for name, values in out.items() if values}


def compare_blocks(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> dict:
    """Max-abs difference of every output both computed, and the argmax agreement of the draft logits."""
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    return {"max_abs_difference": max(float((ours[k] - theirs[k]).abs().max()) for k in ours),
            "argmax_agreement": float((ours["logits"].argmax(-1) == theirs["logits"].argmax(-1)).float().mean())}


def speculators_peagle_logits(folder: str | Path, target, input_ids: torch.Tensor, steps: int
                              ) -> dict[tuple[int, int], torch.Tensor]:
    """Draft logits of the speculators P-EAGLE model loaded from `folder`, keyed by (anchor index, depth), on the
    features of `target` (their data convention, as for EAGLE-3: index i reads feature i and token x_{i+1}). The
    library samples which anchors run at each depth at random (COD); the anchors it drew are read back from its
    own sampler, so every position it computed is compared."""
    import speculators.models.peagle.core as core
    from speculators.losses import resolve_loss_config
    from speculators.models.peagle import PEagleDraftModel, PEagleSpeculatorConfig

    config = PEagleSpeculatorConfig.from_pretrained(str(folder))
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention needs a GPU compiler
    model = PEagleDraftModel.from_pretrained(str(folder), config=config).eval()
    drawn, logits = [], []
    sampler = core.generate_cod_sample_indices

    def recorded(*args, **kwargs):
        drawn.append(sampler(*args, **kwargs))
        return drawn[-1]

    core.generate_cod_sample_indices = recorded
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: logits.append(out[0].detach()))
    try:
        with torch.no_grad():
            model.embed_tokens.weight.copy_(target.model.get_input_embeddings().weight)  # engines share the target's
            hidden = target.model(input_ids, output_hidden_states=True).hidden_states
            aux = torch.cat([hidden[i] for i in model.config.eagle_aux_hidden_state_layer_ids], dim=-1)
            length = input_ids.shape[1] - 1
            model(hidden_states=aux[:, :-1], input_ids=input_ids[:, 1:], document_ids=torch.zeros(1, length, dtype=torch.long),
                  loss_mask=torch.ones(1, length), verifier_last_hidden_states=hidden[-1][:, 1:], num_depths=steps,
                  down_sample_ratio=1.0, down_sample_ratio_min=1.0,
                  loss_config=resolve_loss_config("kl_div", "eager"))  # the fused loss needs Triton
    finally:
        core.generate_cod_sample_indices = sampler
        hook.remove()
    anchors, depths = drawn[0]
    # the sampler may start a depth-d chain at index d - 1 - d = -1 (a position with no context; it sees only
    # itself): nothing a decoder ever drafts from, so left out
    return {(int(a), int(d)): row for a, d, row in zip(anchors, depths, logits[0]) if a >= 0}


def ours_peagle_logits(drafter, target, input_ids: torch.Tensor, steps: int) -> dict[tuple[int, int], torch.Tensor]:
    """Our P-EAGLE drafter's logits keyed by (index, step) on the same sequence (every index, every step)."""
    rows = ours_eagle3_logits(drafter, target, input_ids, steps)
    return {(a, d): rows[d][a] for d in range(steps) for a in range(rows[d].shape[0])}


def compare_keyed(ours: dict, theirs: dict) -> dict:
    """Worst max-abs logit difference and argmax agreement over the (index, step) pairs the library computed
    from real tokens (index + step inside the sequence)."""
    worst, same, count = 0.0, 0, 0
    for key, b in theirs.items():
        a = ours[key].float()
        worst = max(worst, float((a - b.float()).abs().max()))
        same += int(a.argmax() == b.argmax())
        count += 1
    return {"max_abs_difference": worst, "argmax_agreement": same / max(count, 1), "pairs": count,
            "steps": len({d for _, d in theirs})}
