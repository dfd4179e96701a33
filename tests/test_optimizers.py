"""train.optimizer: Muon takes the drafter's weight matrices and AdamW the rest, both as one optimizer that a
scheduler moves and a checkpoint restores exactly; a Muon run learns and resumes bit for bit; under DeepSpeed ZeRO it
is DeepSpeed's own Muon stepping as torch's does; under FSDP2 (two processes over gloo) it steps the sharded matrices
as one process steps the whole ones and Accelerate's FSDP2 checkpoints restore it exactly; FSDP1 is refused."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from test_train_launch import ROOT, crash_copy, environment
from test_train import make_recipe, memory_data, read_log, required_layers, reset_accelerate_state
from tiny import tiny_target

from draftsmith.config import load
from draftsmith.drafters import dflash, eagle
from draftsmith.errors import DraftsmithError
from draftsmith.train.config import TrainConfig
from draftsmith.train.optimizers import MuonWithAdamW, build_optimizer, muon_rate_scale, takes_muon
from draftsmith.train.recipe import TrainRecipe


def options(**changes) -> SimpleNamespace:
    values = {"optimizer": "muon", "lr": 1e-2, "betas": [0.9, 0.95], "weight_decay": 0.0, "muon_lr": 0.0,
              "muon_momentum": 0.95, "muon_weight_decay": 0.0, "muon_adjust_lr_fn": "match_rms_adamw"}
    return SimpleNamespace(**{**values, **changes})


def test_muon_takes_the_weight_matrices_and_adamw_the_heads_norms_and_biases():
    target = tiny_target("qwen3")
    drafter = eagle.create(eagle.Config(), target)
    muon = {name for name, p in drafter.named_parameters() if p.requires_grad and takes_muon(name, p)}
    assert "fc.weight" in muon and any(".self_attn.q_proj." in n for n in muon) and any(".mlp." in n for n in muon)
    assert not any("lm_head" in n or "norm" in n for n in muon)
    spark = dflash.create(dflash.Config(variant="dspark", block_size=4, num_layers=1), target)
    assert not any("markov" in name for name, p in spark.named_parameters() if takes_muon(name, p))
    assert not takes_muon("adapter", torch.zeros(1, 8))  # a degenerate matrix is a vector


def small_model() -> list[tuple[str, torch.nn.Parameter]]:
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"proj": torch.nn.Linear(6, 5), "embed": torch.nn.Embedding(7, 6),
                                 "norm": torch.nn.LayerNorm(5)})
    return list(model.named_parameters())


def loss_of(named) -> torch.Tensor:
    values = dict(named)
    hidden = values["embed.weight"][[1, 3, 5]] @ values["proj.weight"].T + values["proj.bias"]
    return (torch.nn.functional.layer_norm(hidden, (5,), values["norm.weight"], values["norm.bias"]) ** 2).mean()


def step(optimizer, named) -> None:
    optimizer.zero_grad()
    loss_of(named).backward()
    optimizer.step()


def test_one_optimizer_steps_both_halves_a_scheduler_moves_both_and_its_state_restores_exactly():
    named = small_model()
    optimizer = build_optimizer(named, options(muon_lr=2e-2), lambda name: 1.0, fused=False)
    assert isinstance(optimizer, MuonWithAdamW)
    assert {id(p) for g in optimizer.muon.param_groups for p in g["params"]} == {id(dict(named)["proj.weight"])}
    assert optimizer.param_groups == optimizer.muon.param_groups + optimizer.adamw.param_groups
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5)
    assert [g["lr"] for g in optimizer.muon.param_groups] == [1e-2] and optimizer.adamw.param_groups[0]["lr"] == 5e-3
    before = {name: p.detach().clone() for name, p in named}
    step(optimizer, named)
    scheduler.step()
    assert all(not torch.equal(before[name], p) for name, p in named)
    saved = copy.deepcopy(optimizer.state_dict())  # (a checkpoint: torch's state_dict shares the live tensors)
    weights = {name: p.detach().clone() for name, p in named}
    step(optimizer, named)
    expected = {name: p.detach().clone() for name, p in named}
    with torch.no_grad():  # back to the checkpoint, into a fresh optimizer
        for name, p in named:
            p.copy_(weights[name])
    restored = build_optimizer(named, options(muon_lr=2e-2), lambda name: 1.0, fused=False)
    restored.load_state_dict(saved)
    assert restored.param_groups == restored.muon.param_groups + restored.adamw.param_groups
    step(restored, named)
    assert all(torch.equal(expected[name], p) for name, p in named)


def full_rank_loss(named) -> torch.Tensor:
    """A loss whose gradient of proj.weight has full rank (loss_of's three rows through a layer norm leave some
    directions at ~0, which Newton-Schulz blows up from bfloat16 noise)."""
    values = dict(named)
    hidden = (values["embed.weight"] @ values["proj.weight"].T + values["proj.bias"]) * values["norm.weight"]
    return ((hidden + values["norm.bias"]) * torch.arange(35.0).view(7, 5)).sin().sum()


def one_step(optimizer, named, zero_grads: bool = False) -> dict[str, torch.Tensor]:
    before = {name: p.detach().clone() for name, p in named}
    optimizer.zero_grad()
    full_rank_loss(named).backward()
    if zero_grads:
        for _, p in named:
            p.grad.zero_()
    with torch._dynamo.config.patch(disable=True):  # DeepSpeed compiles its Newton-Schulz; eager is the same math
        optimizer.step()
    return {name: p.detach() - before[name] for name, p in named}


@pytest.mark.parametrize("adjust", ["match_rms_adamw", "original"])
def test_under_deepspeed_zero_muon_is_deepspeeds_own_stepping_as_torchs(adjust):
    """DeepSpeed's MuonWithAuxAdam (what ZeRO orthogonalises for) moves a matrix as torch's Muon does, at the
    per-shape rate of `muon_adjust_lr_fn` (the other rule's rate is caught), decays it by rate × decay exactly,
    scheduled, and moves the rest exactly as torch's AdamW."""
    from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam

    config = options(muon_lr=2e-2, muon_adjust_lr_fn=adjust, muon_weight_decay=0.3, weight_decay=0.1)
    other = options(muon_lr=2e-2, muon_adjust_lr_fn={"original": "match_rms_adamw"}.get(adjust, "original"))
    steps = {}
    for which, cfg, sharded in (("torch", config, None), ("deepspeed", config, "DeepSpeed ZeRO"),
                                ("other rule", other, None)):
        named = small_model()
        optimizer = build_optimizer(named, cfg, lambda name: 1.0, fused=False, sharded_by=sharded)
        steps[which] = one_step(optimizer, named)
        if which == "deepspeed":
            assert isinstance(optimizer, MuonWithAuxAdam)
            assert {name for name, p in named if p.use_muon} == {"proj.weight"}
        if which != "other rule":  # a fresh start scheduled to half and a step with no gradient: the decay alone
            named = small_model()
            optimizer = build_optimizer(named, cfg, lambda name: 1.0, fused=False, sharded_by=sharded)
            torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5)
            steps[which + " decay"] = one_step(optimizer, named, zero_grads=True)

    def distance(a, b):
        return ((a - b).norm() / b.norm()).item()

    matrix = "proj.weight"
    assert distance(steps["deepspeed"][matrix], steps["torch"][matrix]) < 0.1  # bfloat16 Newton-Schulz, both
    assert distance(steps["other rule"][matrix], steps["torch"][matrix]) > 0.3
    torch.testing.assert_close(steps["deepspeed decay"][matrix], steps["torch decay"][matrix], rtol=1e-5, atol=1e-9)
    assert steps["torch decay"][matrix].abs().max() > 0
    for name in ("proj.bias", "embed.weight", "norm.weight", "norm.bias"):
        torch.testing.assert_close(steps["deepspeed"][name], steps["torch"][name], rtol=1e-5, atol=1e-8)


def test_muon_rate_scale_carries_the_rest_of_torchs_factor():
    assert muon_rate_scale(torch.Size([8, 2]), "original") == 1.0
    assert muon_rate_scale(torch.Size([8, 2]), "match_rms_adamw") == pytest.approx(0.2 * 8 ** 0.5 / 2)
    assert muon_rate_scale(torch.Size([2, 8]), "match_rms_adamw") == pytest.approx(0.2 * 8 ** 0.5)


def test_fsdp1_and_a_checkpoint_of_the_other_optimizer_are_refused():
    named = small_model()
    with pytest.raises(DraftsmithError, match="not under FSDP1, which hands the optimizer flat 1-D shards"):
        build_optimizer(named, options(), lambda name: 1.0, fused=False, sharded_by="FSDP1")
    adamw_only = build_optimizer(named[2:], options(), lambda name: 1.0, fused=False)  # embed, norm: no Muon half
    with pytest.raises(DraftsmithError, match="no muon half"):
        build_optimizer(named, options(), lambda name: 1.0, fused=False).load_state_dict(adamw_only.state_dict())


def test_a_muon_run_learns_and_resumes_exactly(tmp_path):
    target = tiny_target()
    recipe = make_recipe(tmp_path, target, max_steps=6, checkpoint_every=3, keep_checkpoints=0, lr=3e-3,
                         optimizer="muon")
    assert isinstance(recipe.optimizer.optimizer, MuonWithAdamW)
    recipe.train()
    straight = read_log(tmp_path / "run")
    assert straight[-1]["loss"] < straight[0]["loss"]
    crashed = tmp_path / "crashed"
    crash_copy(tmp_path / "run", crashed, 3, 6)
    reset_accelerate_state()
    config = load(TrainConfig, tmp_path / "recipe.yaml", ["resume=true", f"output_dir={crashed}"])
    resumed = TrainRecipe(config, data=memory_data(target, required_layers(config, target)), target=target)
    resumed.setup()
    resumed.train()
    assert [r["loss"] for r in read_log(crashed)] == [r["loss"] for r in straight]


def test_the_state_dict_is_torchs_one_layout_and_a_checkpoint_of_two_halves_still_loads():
    """torch.distributed.checkpoint (and Accelerate's FSDP2 checkpoints through it) reads an optimizer's state by
    parameter index beside its groups; a checkpoint written before that, one state dict per half (a torch Muon's and
    a torch AdamW's, as this optimizer saved them then), resumes the same."""
    named = small_model()
    optimizer = build_optimizer(named, options(muon_lr=2e-2), lambda name: 1.0, fused=False)
    weights = {name: p.detach().clone() for name, p in named}
    step(optimizer, named)
    saved = copy.deepcopy(optimizer.state_dict())
    assert set(saved) == {"state", "param_groups"} and sorted(saved["state"]) == [0, 1, 2, 3, 4]
    # proj.weight (Muon), embed.weight (AdamW, decayed), then proj.bias and the norm's two (AdamW, not decayed)
    assert [("ns_coefficients" in g, g["params"]) for g in saved["param_groups"]] == [(True, [0]), (False, [1]),
                                                                                   (False, [2, 3, 4])]
    assert set(saved["state"][0]) == {"momentum_buffer"} and {"exp_avg", "step"} <= set(saved["state"][1])
    after_one = {name: p.detach().clone() for name, p in named}
    step(optimizer, named)
    expected = {name: p.detach().clone() for name, p in named}

    with torch.no_grad():  # the same first step by the two torch optimizers the halves came from
        for name, p in named:
            p.copy_(weights[name])
    fresh = build_optimizer(named, options(muon_lr=2e-2), lambda name: 1.0, fused=False)
    muon = torch.optim.Muon(fresh.param_groups[:1], lr=2e-2, momentum=0.95, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW(fresh.param_groups[1:], lr=1e-2, betas=(0.9, 0.95))
    for half in (muon, adamw):
        half.zero_grad()
    loss_of(named).backward()
    muon.step()
    adamw.step()
    assert all(torch.equal(after_one[name], p) for name, p in named)
    halves = copy.deepcopy({"muon": muon.state_dict(), "adamw": adamw.state_dict()})

    for layout in (saved, halves):
        with torch.no_grad():
            for name, p in named:
                p.copy_(after_one[name])
        restored = build_optimizer(named, options(muon_lr=2e-2), lambda name: 1.0, fused=False)
        restored.load_state_dict(copy.deepcopy(layout))
        assert restored.muon.state is restored.state and restored.adamw.state is restored.state
        assert restored.param_groups == restored.muon.param_groups + restored.adamw.param_groups
        step(restored, named)
        assert all(torch.equal(expected[name], p) for name, p in named)


def test_under_fsdp2_muon_steps_the_shards_as_one_process_steps_the_whole_and_resumes_exactly(tmp_path):
    """Two processes over gloo, each with half of every matrix's rows (tests/fsdp_muon_worker.py): the recipe's
    optimizer on FSDP2's DTensor shards moves the weights bit for bit as one process training on both batches does
    (Muon's Newton-Schulz sees each whole matrix, not a shard's rows: an optimizer that orthogonalised each shard
    apart is caught), and Accelerate's FSDP2 checkpoint functions, in the recipe's FULL_STATE_DICT layout and the sharded
    one, restore it so that the next step is bit for bit the step without the stop."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(ROOT / "tests" / "fsdp_muon_worker.py"), str(tmp_path)],
                          cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world_size"] == 2 and result["local_rows_mid"] == 4  # 7 rows: 4 here, 3 on the other process
    assert result["dtensor_parameters"] == ["embed.weight", "lm_head.weight", "mid.weight", "norm.bias", "norm.weight",
                                            "up.bias", "up.weight"]
    assert result["muon_groups"] == 1  # up.weight and mid.weight; embed, lm_head, the norm and biases are AdamW's
    assert result["moved_after_step_1"] > 1e-3
    assert result["gap_to_one_process_per_step"] == [0.0, 0.0, 0.0]  # bit for bit, every weight, three steps
    assert result["shard_local_gap_after_step_1"] > 1e-3
    assert result["resume_equal"] == {"FULL_STATE_DICT": True, "SHARDED_STATE_DICT": True}
