"""The trainer as users run it: `python -m draftsmith train` and `accelerate launch ... -m draftsmith train`.

- a real training process killed with SIGKILL and resumed gives the loss trajectory of a run never killed;
- 1 process x 2 accumulation steps == 2 processes x 1 (DDP over gloo), and DDP == DeepSpeed ZeRO-2.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from test_train import read_log, recipe_dict, write_assets, write_recipe

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return write_assets(tmp_path_factory.mktemp("train_assets"))


def environment() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("ACCELERATE_USE_DEEPSPEED", None)
    return env


def command(recipe: Path, overrides: list[str], launch_config: str | None = None) -> list[str]:
    prefix = [sys.executable, "-m"] if launch_config is None else [
        ACCELERATE, "launch", "--config_file", str(ROOT / "recipes" / "accelerate" / launch_config), "-m"]
    return [*prefix, "draftsmith", "train", str(recipe), *overrides]


def run(recipe: Path, overrides: list[str], launch_config: str | None = None, timeout: int = 240, env=None):
    done = subprocess.run(command(recipe, overrides, launch_config), cwd=ROOT, env={**environment(), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def crash_copy(straight: Path, crashed: Path, checkpoint: int, last: int) -> None:
    """`crashed`: the finished run `straight` as a crash right after checkpoint-`checkpoint` left it."""
    shutil.copytree(straight, crashed)
    shutil.rmtree(crashed / f"checkpoint-{last}")
    (crashed / "latest").write_text(f"checkpoint-{checkpoint}\n")


def losses(output_dir: Path) -> list[float]:
    log = read_log(output_dir)
    assert [r["step"] for r in log] == list(range(1, len(log) + 1))
    return [r["loss"] for r in log]


def test_sigkill_then_resume_continues_exactly(assets, tmp_path):
    # EAGLE-1 adds random input noise each step, so the RNG states must be restored, not only weights.
    recipe = write_recipe(tmp_path / "recipe.yaml", recipe_dict(assets, "eagle1", max_steps=10, checkpoint_every=3))
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run(recipe, [f"output_dir={straight}"])

    process = subprocess.Popen(command(recipe, [f"output_dir={killed}"]), cwd=ROOT, env=environment(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 200
        while time.time() < deadline and process.poll() is None:
            if (killed / "metrics.jsonl").is_file() and any(r["step"] >= 4 for r in read_log(killed)):
                break  # checkpoint-3 is complete (it is written before step 4 starts)
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    resumed_from = int((killed / "latest").read_text().strip().split("-")[1])
    assert resumed_from in (3, 6, 9) and not (killed / "checkpoint-10").exists()
    logged_before_kill = [r["step"] for r in read_log(killed)]

    done = run(recipe, [f"output_dir={killed}", "resume=true"])
    assert f"(step {resumed_from})" in done.stdout
    assert losses(killed) == losses(straight)  # bit for bit, every step
    assert max(logged_before_kill) >= 4
    assert len(losses(straight)) == 10


def test_medusa2_resumes_exactly_with_its_adapters_and_two_learning_rates(assets, tmp_path):
    """A crash after checkpoint-2 (its later files removed) resumes into the straight run's losses, bit for bit:
    the tuned copy's adapters, the heads and the optimizer's two rate groups all come back."""
    import json

    config = recipe_dict(assets, max_steps=4, checkpoint_every=2, eval_every=2)
    config["drafter"] = {"kind": "medusa", "num_heads": 2, "lora_rank": 2, "head_lr_scale": 4.0}
    recipe = write_recipe(tmp_path / "recipe.yaml", config)
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    run(recipe, [f"output_dir={straight}"])
    crash_copy(straight, crashed, 2, 4)
    done = run(recipe, [f"output_dir={crashed}", "resume=true"])
    assert "(step 2)" in done.stdout
    assert losses(crashed) == losses(straight) and len(losses(straight)) == 4
    tree = json.loads((crashed / "best" / "medusa_tree.json").read_text())
    assert len(tree["paths"]) == 5 + 5 * 5 and tree["expected_acceptance_length"] >= 1.0  # the budget (64) holds all


def test_one_process_two_accumulation_steps_equals_two_processes_ddp(assets, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", recipe_dict(assets, "eagle3", max_steps=4, checkpoint_every=0))
    run(recipe, [f"output_dir={tmp_path / 'accum'}", "train.grad_accum=2"])
    # An OMP_NUM_THREADS that would oversubscribe the cores is cut to each process's share.
    threads = str(2 * len(os.sched_getaffinity(0)))
    ddp = run(recipe, [f"output_dir={tmp_path / 'ddp'}", "train.grad_accum=1"], launch_config="cpu-ddp.yaml",
              env={"OMP_NUM_THREADS": threads})
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert f"torch threads per process: {share} (2 processes" in ddp.stdout, ddp.stdout[-2000:]
    single, double = losses(tmp_path / "accum"), losses(tmp_path / "ddp")
    assert single == pytest.approx(double, rel=1e-5, abs=1e-6)
    assert len(double) == 4


def test_ddp_equals_deepspeed_zero2(assets, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", recipe_dict(assets, "eagle3", max_steps=4, checkpoint_every=2))
    run(recipe, [f"output_dir={tmp_path / 'ddp'}"], launch_config="cpu-ddp.yaml")
    run(recipe, [f"output_dir={tmp_path / 'zero2'}"], launch_config="cpu-zero2.yaml")
    assert losses(tmp_path / "zero2") == pytest.approx(losses(tmp_path / "ddp"), rel=1e-5, abs=1e-6)
    assert (tmp_path / "zero2" / "checkpoint-4" / "drafter" / "model.safetensors").is_file()
    assert (tmp_path / "zero2" / "best" / "config.json").is_file()


@pytest.mark.slow
def test_zero3_equals_ddp_and_writes_whole_drafter_folders(assets, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", recipe_dict(assets, "eagle3", max_steps=4, checkpoint_every=2))
    run(recipe, [f"output_dir={tmp_path / 'ddp'}"], launch_config="cpu-ddp.yaml")
    run(recipe, [f"output_dir={tmp_path / 'zero3'}"], launch_config="cpu-zero3.yaml")
    assert losses(tmp_path / "zero3") == pytest.approx(losses(tmp_path / "ddp"), rel=1e-5, abs=1e-6)
    from safetensors.torch import load_file

    sharded = load_file(str(tmp_path / "zero3" / "checkpoint-4" / "drafter" / "model.safetensors"))
    whole = load_file(str(tmp_path / "ddp" / "checkpoint-4" / "drafter" / "model.safetensors"))
    assert sharded.keys() == whole.keys()
    for name in whole:
        assert sharded[name].shape == whole[name].shape
        assert torch.allclose(sharded[name].float(), whole[name].float(), atol=1e-5), name


@pytest.mark.slow
def test_deepspeed_zero2_resumes_exactly_from_its_own_checkpoint(assets, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", recipe_dict(assets, "eagle1", max_steps=6, checkpoint_every=3,
                                                                  keep_checkpoints=0))
    straight, rewound = tmp_path / "straight", tmp_path / "rewound"
    run(recipe, [f"output_dir={straight}"], launch_config="cpu-zero2.yaml")
    crash_copy(straight, rewound, 3, 6)  # the sharded optimizer state and per-process RNG come back from it
    run(recipe, [f"output_dir={rewound}", "resume=true"], launch_config="cpu-zero2.yaml")
    assert losses(rewound) == losses(straight)


def test_muon_under_ddp_resumes_exactly(assets, tmp_path):
    """train.optimizer=muon over two processes: a crash after checkpoint-2 resumes into the straight run's losses,
    Muon's momentum and AdamW's moments both restored on every process."""
    recipe = write_recipe(tmp_path / "recipe.yaml", recipe_dict(assets, max_steps=4, checkpoint_every=2,
                                                                  keep_checkpoints=0, optimizer="muon"))
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    run(recipe, [f"output_dir={straight}"], launch_config="cpu-ddp.yaml")
    crash_copy(straight, crashed, 2, 4)
    run(recipe, [f"output_dir={crashed}", "resume=true"], launch_config="cpu-ddp.yaml")
    assert losses(crashed) == losses(straight) and len(losses(straight)) == 4


@pytest.mark.parametrize("zero", ["cpu-zero2.yaml", pytest.param("cpu-zero3.yaml", marks=pytest.mark.slow)])
def test_muon_under_deepspeed_zero_steps_as_under_ddp_and_resumes_exactly(assets, tmp_path, zero):
    """train.optimizer=muon under ZeRO-2 (and -3) is DeepSpeed's own Muon (each matrix's whole gradient gathered and
    orthogonalised before it is sharded): its first step moves the Muon matrices as torch's Muon moves them under DDP,
    within the two bfloat16 Newton-Schulz implementations' difference (about 5% of a step), and a crash after
    checkpoint-2 resumes into the straight run's losses. DeepSpeed would clip the orthogonalised updates, so under it
    the recipe's max_grad_norm is not applied, and the run says so."""
    from safetensors.torch import load_file

    from draftsmith.train.optimizers import takes_muon

    recipe = write_recipe(tmp_path / "recipe.yaml", recipe_dict(assets, max_steps=4, checkpoint_every=1,
                                                                  keep_checkpoints=0, optimizer="muon", muon_lr=1e-2,
                                                                  max_grad_norm=0.5))
    initial, ddp, straight, crashed = (tmp_path / name for name in ("initial", "ddp", "straight", "crashed"))
    run(recipe, [f"output_dir={initial}", "train.max_steps=1", "train.lr=0", "train.muon_lr=0"])  # the start
    run(recipe, [f"output_dir={ddp}", "train.max_steps=1"], launch_config="cpu-ddp.yaml")
    launched = run(recipe, [f"output_dir={straight}"], launch_config=zero)
    assert "train.max_grad_norm=0.5 is not applied under DeepSpeed with Muon" in launched.stdout

    def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
        return load_file(str(run_dir / f"checkpoint-{step}" / "drafter" / "model.safetensors"))

    start, torch_step, deepspeed_step = weights(initial, 1), weights(ddp, 1), weights(straight, 1)
    matrices = [name for name, w in start.items() if takes_muon(name, w)]
    assert len(matrices) >= 4
    for name in (n for n, w in start.items() if w.is_floating_point()):
        by_torch, by_deepspeed = (torch_step[name] - start[name]).float(), (deepspeed_step[name] - start[name]).float()
        assert by_torch.norm() > 0, name
        size = float(by_deepspeed.norm() / by_torch.norm())
        cosine = float((by_torch * by_deepspeed).sum() / by_torch.norm() / by_deepspeed.norm())
        if name in matrices:  # the same rate; the direction within bfloat16 Newton-Schulz noise (cosine >= 0.88 seen)
            assert 0.93 < size < 1.07 and cosine > 0.8, (name, size, cosine)
        else:  # torch's AdamW
            assert abs(size - 1) < 1e-3 and cosine > 0.9999, (name, size, cosine)

    shutil.copytree(straight, crashed)  # a crash right after checkpoint-2
    for later in (3, 4):
        shutil.rmtree(crashed / f"checkpoint-{later}")
    (crashed / "latest").write_text("checkpoint-2\n")
    run(recipe, [f"output_dir={crashed}", "resume=true"], launch_config=zero)
    assert losses(crashed) == losses(straight) and len(losses(straight)) == 4
