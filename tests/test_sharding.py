"""A frozen target sharded over the training processes (`target.shard: fsdp`, torch FSDP2 over gloo here): each
process holds half of its weights, yet training and capture see exactly what a whole target gives, and both
survive kill -9."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from draftsmith.config import load
from draftsmith.data.offline import verify_capture
from draftsmith.errors import DraftsmithError
from draftsmith.train.config import TrainConfig
from test_train import read_log, recipe_dict, write_assets, write_recipe
from test_train_launch import ACCELERATE, ROOT, command, environment, losses, run


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return write_assets(tmp_path_factory.mktemp("shard_assets"))


@pytest.fixture(scope="module")
def sharded_runs(assets, tmp_path_factory):
    """The same online EAGLE-3 recipe under 2-process DDP with a whole target each, and with the target sharded."""
    root = tmp_path_factory.mktemp("sharded_runs")
    recipe = write_recipe(root / "recipe.yaml", recipe_dict(assets, "eagle3", max_steps=6, checkpoint_every=3,
                                                            eval_every=3))
    whole = run(recipe, [f"output_dir={root / 'whole'}"], launch_config="cpu-ddp.yaml")
    sharded = run(recipe, [f"output_dir={root / 'sharded'}", "target.shard=fsdp", "report.num_prompts=1"],
                  launch_config="cpu-ddp.yaml")
    return {"recipe": recipe, "root": root, "whole": whole, "sharded": sharded}


def test_a_sharded_target_trains_exactly_as_a_whole_one_with_half_its_weights_per_process(sharded_runs):
    root = sharded_runs["root"]
    out = sharded_runs["sharded"].stdout
    share = re.search(r"target sharded over 2 processes: ([\d.]+)% of its weights", out)
    assert share and float(share.group(1)) <= 55.0, out[-2000:]
    assert losses(root / "sharded") == losses(root / "whole")  # bit for bit: gathered weights are the weights
    held_out = [{k: v for k, v in r.items() if k.startswith("acc_") or k == "loss"} for r in read_log(root / "sharded", "eval")]
    assert held_out == [{k: v for k, v in r.items() if k.startswith("acc_") or k == "loss"}
                        for r in read_log(root / "whole", "eval")]
    assert "final report skipped: the target is sharded" in out
    assert (root / "sharded" / "best" / "model.safetensors").is_file()


def test_the_drafter_keeps_its_own_deepspeed_setting_beside_a_sharded_target(sharded_runs, tmp_path):
    out = tmp_path / "zero2"
    run(sharded_runs["recipe"], [f"output_dir={out}", "target.shard=fsdp"], launch_config="cpu-zero2.yaml")
    assert losses(out) == pytest.approx(losses(sharded_runs["root"] / "whole"), rel=1e-5, abs=1e-6)


def test_a_sharded_run_killed_with_sigkill_resumes_exactly(sharded_runs, tmp_path):
    recipe, killed = sharded_runs["recipe"], tmp_path / "killed"
    overrides = [f"output_dir={killed}", "target.shard=fsdp"]
    launcher = subprocess.Popen(command(recipe, overrides, "cpu-ddp.yaml"), cwd=ROOT, env=environment(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 200
        while time.time() < deadline and launcher.poll() is None:
            if (killed / "metrics.jsonl").is_file() and any(r["step"] >= 4 for r in read_log(killed)):
                break  # checkpoint-3 is complete
            time.sleep(0.02)
        kill_every_process_naming(str(killed))  # the launcher and both training processes, as a node dies
    finally:
        launcher.wait()
    assert (killed / "latest").read_text().strip() == "checkpoint-3" and not (killed / "checkpoint-6").exists()
    done = run(recipe, [*overrides, "resume=true"], launch_config="cpu-ddp.yaml")
    assert "(step 3)" in done.stdout
    assert losses(killed) == losses(sharded_runs["root"] / "sharded")


def kill_every_process_naming(marker: str) -> None:
    """SIGKILL every process whose command line holds `marker`: the launcher, and the workers it started in
    sessions of their own (a process-group kill misses those)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue


def capture_command(assets, out: Path, launched: bool, *extra: str) -> list[str]:
    flags = ["capture", "--target", assets["target"], "--data", assets["prepared"], "--out", str(out),
             "--samples-per-shard", "3", "--topk-logits", "4"]
    if not launched:
        return [sys.executable, "-m", "draftsmith", *flags]
    return [ACCELERATE, "launch", "--config_file", str(ROOT / "recipes/accelerate/cpu-ddp.yaml"), "-m", "draftsmith",
            *flags, "--shard", "fsdp", *extra]


def test_sharded_capture_writes_the_single_process_shards_and_resumes_after_sigkill(assets, tmp_path):
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    subprocess.run(capture_command(assets, single, launched=False), cwd=ROOT, env=environment(), check=True,
                   capture_output=True)
    # killed once shards exist (each process writes its own), then rerun: only the missing shards are captured
    launcher = subprocess.Popen(capture_command(assets, sharded, launched=True), cwd=ROOT, env=environment(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 200
        while time.time() < deadline and launcher.poll() is None and len(list(sharded.glob("shard-*.json"))) < 3:
            time.sleep(0.01)
        kill_every_process_naming(str(sharded))
    finally:
        launcher.wait()
    written = {path.name: path.stat().st_mtime_ns for path in sharded.glob("shard-*.safetensors")}
    assert written and not (sharded / "manifest.json").exists()
    done = subprocess.run(capture_command(assets, sharded, launched=True), cwd=ROOT, env=environment(),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("captured ") == 1  # each process is its own rank (all were rank 0 of 1 before)
    assert verify_capture(sharded)["ok"]  # every sample exactly once, every checksum right
    for name, mtime in written.items():
        assert (sharded / name).stat().st_mtime_ns == mtime, f"{name} was captured twice"
    manifest = json.loads((single / "manifest.json").read_text())
    for shard in manifest["shards"]:  # features of the sharded target = the whole target's, bit for bit
        assert (sharded / shard["file"]).read_bytes() == (single / shard["file"]).read_bytes(), shard["file"]
    assert load_file(str(sharded / "shard-00000.safetensors"))["topk.indices"].shape[-1] == 4

    # groups of one process (a whole copy each, as one copy per node would be on many nodes): the same shards
    grouped = tmp_path / "grouped"
    subprocess.run(capture_command(assets, grouped, True, "--shard-group", "1"), cwd=ROOT, env=environment(),
                   check=True, capture_output=True, timeout=240)
    for shard in manifest["shards"]:
        assert (grouped / shard["file"]).read_bytes() == (single / shard["file"]).read_bytes(), shard["file"]


def test_sharding_options_are_checked_before_any_work(assets, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", recipe_dict(assets, "eagle3"))
    with pytest.raises(DraftsmithError, match="select_by=decoded needs a validation decode"):
        load(TrainConfig, recipe, ["target.shard=fsdp", "eval.select_by=decoded"])
    medusa2 = write_recipe(tmp_path / "medusa2.yaml", {**recipe_dict(assets), "drafter": {"kind": "medusa", "lora_rank": 2}})
    with pytest.raises(DraftsmithError, match="Medusa-2"):
        load(TrainConfig, medusa2, ["target.shard=fsdp"])
    with pytest.raises(DraftsmithError, match="target.shard"):
        load(TrainConfig, recipe, ["target.shard=tp"])
    unsaid = recipe_dict(assets)
    del unsaid["data"]["online"]
    unsaid = write_recipe(tmp_path / "unsaid.yaml", unsaid)
    assert load(TrainConfig, unsaid, ["target.shard=fsdp"]).data.online is True  # a big target streams its features
    with pytest.raises(DraftsmithError, match="Set data.features"):
        load(TrainConfig, unsaid)  # a whole one reads captured features, as before


def test_sharding_a_single_process_says_how_to_launch(tiny_llama):
    from draftsmith.sharding import shard_target

    with pytest.raises(DraftsmithError, match="accelerate launch"):
        shard_target(tiny_llama, "cpu")
