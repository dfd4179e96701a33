"""Trainer, in one process: schedule, data order, config checks, NaN guard, best/ by τ, validation
that leaves training untouched, checkpoint layout, trackers. Multi-process and SIGKILL tests are in
test_train_launch.py; both use the helpers at the top of this file."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from draftsmith.config import load
from draftsmith.errors import DraftsmithError
from draftsmith.train import recipe as recipe_module
from draftsmith.train.checkpoint import STATE_FILE
from draftsmith.train.config import TrainConfig
from draftsmith.train.data import GROUP_BATCHES, SampleOrder, TrainingData, micro_batch_index
from draftsmith.train.recipe import TrainRecipe, warmup_cosine
from draftsmith.train.validate import implied_acceptance_length, step_accuracies
from tiny import tiny_target


# --------------------------------------------------------------------------- helpers (shared)
def counting_conversations(n: int) -> list[dict]:
    """Conversations with a learnable answer: count on from a number."""
    return [
        {"messages": [{"role": "user", "content": f"count from {k}"},
                      {"role": "assistant", "content": " ".join(str(k + i) for i in range(8))}]}
        for k in range(n)
    ]


def write_target_and_conversations(root: Path):
    """A tiny target saved as a model folder plus 40 conversations as jsonl; returns the target."""
    root.mkdir(parents=True, exist_ok=True)
    target = tiny_target()
    target.model.save_pretrained(root / "target")
    target.tokenizer.save_pretrained(root / "target")
    with open(root / "conversations.jsonl", "w") as handle:
        for row in counting_conversations(40):
            handle.write(json.dumps(row) + "\n")
    return target


def write_assets(root: Path) -> dict:
    """A tiny target folder and a prepared train/eval folder made from it (what the CLI reads)."""
    from draftsmith.data.prepared import PrepareConfig, prepare

    target = write_target_and_conversations(root)
    prepare(PrepareConfig(target=str(root / "target"), input=[str(root / "conversations.jsonl")],
                          out=str(root / "data"), eval_fraction=0.2, max_length=96), target=target)
    return {"target": str(root / "target"), "prepared": str(root / "data")}


def recipe_dict(assets: dict, variant: str = "eagle3", **train) -> dict:
    """A tiny online-capture recipe; `train` overrides the train section."""
    return {
        "target": {"name": assets["target"]},
        "data": {"prepared": assets["prepared"], "online": True, "batch_size": 2, "max_length": 48},
        "drafter": {"kind": "eagle", "variant": variant, **({"ttt_steps": 3} if variant == "eagle3" else {})},
        "train": {"max_steps": 8, "lr": 1e-3, "warmup_steps": 2, "precision": "fp32", "eval_every": 0,
                  "checkpoint_every": 4, "seed": 0, **train},
        "eval": {"batches": 2, "num_prompts": 2, "max_new_tokens": 8, "draft_length": 3},
    }


def write_recipe(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def read_log(output_dir: Path, split: str = "train") -> list[dict]:
    lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def reset_accelerate_state() -> None:
    """Accelerate keeps process-wide singletons; a test that builds a second Accelerator starts them afresh."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def assert_setup_refuses(recipe: Path, overrides: list[str], match: str) -> None:
    """The recipe with `overrides` is refused before training starts (from a fresh Accelerate state)."""
    reset_accelerate_state()
    with pytest.raises(DraftsmithError, match=match):
        TrainRecipe(load(TrainConfig, recipe, overrides)).setup()


# --------------------------------------------------------------------------- in-process fixtures
@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Accelerate keeps process-wide singletons; each test builds its own Accelerator."""
    reset_accelerate_state()
    yield
    reset_accelerate_state()


def memory_data(target, layers, n_train=24, n_eval=4, length=24, seed=0, poison: int | None = None) -> TrainingData:
    """In-memory samples with precomputed features (like offline shards); `poison` gets NaN features."""
    from draftsmith.data.capture import collate

    generator = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n_train + n_eval):
        start = int(torch.randint(0, 200, (1,), generator=generator))
        ids = (torch.arange(length) + start) % 250  # a counting pattern the drafter can learn
        mask = torch.ones(length, dtype=torch.long)
        mask[:4] = 0
        features = target.forward(ids[None], layers=layers, logits=False).features
        item = {"input_ids": ids, "loss_mask": mask, "features": {k: v[0] for k, v in features.items()}}
        if i == poison:
            item["features"] = {k: torch.full_like(v, float("nan")) for k, v in item["features"].items()}
        items.append(item)
    return TrainingData(train=items[:n_train], eval=items[n_train:], collate=lambda xs: collate(xs, pad_id=256),
                        add_features=lambda batch: batch, prompts=[items[n_train]["input_ids"][:6].tolist()])


def required_layers(config: TrainConfig, target) -> list[int]:
    from draftsmith.drafters import kind_module
    from draftsmith.train.config import drafter_config

    kind, options = drafter_config(config.drafter)
    return kind_module(kind).create(options, target).required_layers


def make_recipe(tmp_path, target, variant="eagle3", data=None, poison=None, evaluation=None, drafter=None,
                **train) -> TrainRecipe:
    """An in-process recipe on `target` with in-memory features; `drafter` replaces the drafter section."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    config_dict = recipe_dict({"target": "unused", "prepared": None}, variant, **train)
    config_dict["drafter"] = drafter or config_dict["drafter"]
    config_dict["eval"].update(evaluation or {})
    config_dict["data"] = {"features": "in-memory", "batch_size": 2, "max_length": 48}
    config_dict["output_dir"] = str(tmp_path / "run")
    config = load(TrainConfig, write_recipe(tmp_path / "recipe.yaml", config_dict))
    layers = required_layers(config, target)
    recipe = TrainRecipe(config, data=data or memory_data(target, layers, poison=poison), target=target)
    recipe.setup()
    return recipe


# --------------------------------------------------------------------------- pure pieces
def test_warmup_then_cosine_to_the_floor():
    factor = warmup_cosine(warmup_steps=4, max_steps=20, min_lr_ratio=0.1)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(4) == pytest.approx(1.0)
    assert factor(12) == pytest.approx(0.1 + 0.9 * 0.5)
    assert factor(20) == pytest.approx(0.1)
    values = [factor(s) for s in range(4, 21)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    share = {"spent": 0.0}  # a wall-clock budget: the cosine follows whichever of steps and time is further along
    timed = warmup_cosine(warmup_steps=4, max_steps=20, min_lr_ratio=0.1, time_spent=lambda: share["spent"])
    assert timed(2) == 0.75 and timed(12) == pytest.approx(0.1 + 0.9 * 0.5)  # no time spent: the steps' rate
    share["spent"] = 0.5
    assert timed(2) == 0.75 and timed(5) == pytest.approx(0.1 + 0.9 * 0.5)  # warmup stays by steps
    assert timed(16) == pytest.approx(factor(16))  # steps further along than time
    share["spent"] = 3.0
    assert timed(5) == pytest.approx(0.1)  # spent: the floor, never below


def test_one_process_two_accumulation_steps_sees_the_batches_of_two_processes():
    order = SampleOrder(num_samples=10, batch_size=3, seed=5)
    for step in range(6):
        single = [order.micro_batch(micro_batch_index(step, a, 0, world=1, accum=2)) for a in range(2)]
        double = [order.micro_batch(micro_batch_index(step, 0, r, world=2, accum=1)) for r in range(2)]
        assert single == double
    # every epoch visits every sample exactly once, in a seed-dependent order
    stream = [i for g in range(10) for i in order.micro_batch(g)]
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:20]) == list(range(10))
    assert stream[:10] != stream[10:20]
    assert SampleOrder(10, 3, seed=6).micro_batch(0) != order.micro_batch(0) or \
        SampleOrder(10, 3, seed=6).micro_batch(1) != order.micro_batch(1)


def test_grouping_by_length_cuts_padding_and_keeps_the_order_a_function_of_the_counter():
    lengths = torch.randint(5, 500, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    plain, grouped = SampleOrder(200, 4, seed=3), SampleOrder(200, 4, seed=3, lengths=lengths)

    def padded_tokens(order):
        return sum(4 * max(lengths[i] for i in order.micro_batch(g)) for g in range(50))

    assert sum(lengths) / padded_tokens(grouped) > 0.9 > sum(lengths) / padded_tokens(plain) + 0.2
    stream = [i for g in range(100) for i in grouped.micro_batch(g)]
    assert sorted(stream[:200]) == list(range(200)) and sorted(stream[200:]) == list(range(200))  # still epochs
    assert stream[:200] != stream[200:]
    window = 4 * GROUP_BATCHES  # the same samples as the plain shuffle's window, longest first
    plain_stream = [i for g in range(50) for i in plain.micro_batch(g)]
    assert set(stream[:window]) == set(plain_stream[:window])
    assert [lengths[i] for i in stream[:window]] == sorted((lengths[i] for i in stream[:window]), reverse=True)
    resumed = SampleOrder(200, 4, seed=3, lengths=lengths)  # a resumed run rebuilds the order from scratch
    assert [resumed.micro_batch(g) for g in (73, 12)] == [grouped.micro_batch(73), grouped.micro_batch(12)]
    for step in range(6):
        single = [grouped.micro_batch(micro_batch_index(step, a, 0, world=1, accum=2)) for a in range(2)]
        double = [grouped.micro_batch(micro_batch_index(step, 0, r, world=2, accum=1)) for r in range(2)]
        assert single == double


def test_implied_acceptance_length_is_one_plus_sum_of_survival_products():
    assert implied_acceptance_length([]) == 1.0
    assert implied_acceptance_length([1.0, 1.0, 1.0]) == 4.0
    assert implied_acceptance_length([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert implied_acceptance_length([0.8, 0.0, 1.0]) == pytest.approx(1.8)
    metrics = {"acc_1": 0.5, "loss": 2.0, "acc_0": 0.9, "acc_10": 0.1, "loss_0": 1.0}
    assert step_accuracies(metrics)[:2] == [0.9, 0.5]


def test_recipe_errors_name_the_bad_key(tmp_path):
    assets = {"target": "t", "prepared": "p"}
    bad_drafter = recipe_dict(assets)
    bad_drafter["drafter"]["ttt_step"] = 3
    with pytest.raises(DraftsmithError, match="drafter.ttt_step.*Did you mean 'drafter.ttt_steps'"):
        load(TrainConfig, write_recipe(tmp_path / "a.yaml", bad_drafter))
    with pytest.raises(DraftsmithError, match="train.max_stesp"):
        load(TrainConfig, write_recipe(tmp_path / "b.yaml", recipe_dict(assets)), ["train.max_stesp=3"])
    with pytest.raises(DraftsmithError, match="Unknown drafter kind 'eagel'"):
        load(TrainConfig, write_recipe(tmp_path / "c.yaml", recipe_dict(assets)), ["drafter.kind=eagel"])
    with pytest.raises(DraftsmithError, match="data.online=true needs data.prepared"):
        load(TrainConfig, write_recipe(tmp_path / "d.yaml", recipe_dict(assets)), ["data.prepared=null"])
    config = load(TrainConfig, write_recipe(tmp_path / "e.yaml", recipe_dict(assets)),
                  ["train.max_steps=3", "resume=true", "tracking.report_to=tensorboard"])
    assert (config.train.max_steps, config.resume, config.tracking.report_to) == (3, True, ["tensorboard"])


# --------------------------------------------------------------------------- the loop
def test_training_learns_and_writes_checkpoints_best_and_log(tmp_path):
    target = tiny_target()
    with torch.no_grad():  # a peaked target distribution, so there is something to learn beyond its entropy
        target.model.lm_head.weight.mul_(30)
    layers = required_layers(load(TrainConfig, None, ["drafter.kind=eagle", "drafter.variant=eagle3", "drafter.ttt_steps=3",
                                                      "data.features=x"]), target)
    one_batch = memory_data(target, layers, n_train=2)  # every step sees the same batch: loss must fall
    recipe = make_recipe(tmp_path, target, data=one_batch, max_steps=16, lr=3e-3, checkpoint_every=5,
                         eval_every=8, keep_checkpoints=2)
    recipe.train()
    recipe.cleanup()
    out = tmp_path / "run"
    log = read_log(out)
    assert [r["step"] for r in log] == list(range(1, 17))
    assert log[-1]["loss"] < 0.6 * log[0]["loss"]
    assert {"acc_0", "acc_1", "acc_2", "lr", "tokens_per_s", "grad_norm"} <= set(log[0])
    assert log[0]["lr"] == pytest.approx(1.5e-3)  # first warmup step: half the peak rate
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-15", "checkpoint-16"]  # keep=2
    assert (out / "latest").read_text().strip() == "checkpoint-16"
    state = json.loads((out / "checkpoint-16" / "trainer_state.json").read_text())
    assert state["step"] == 16 and state["layout"]["global_batch"] == 2
    evals = read_log(out, "eval")
    assert [r["step"] for r in evals] == [8, 16]
    implied = 1 + sum(math.prod(evals[-1][f"acc_{j}"] for j in range(i + 1)) for i in range(3))
    assert evals[-1]["implied_acceptance_length"] == pytest.approx(implied)
    assert evals[-1]["acceptance_length"] >= 1.0  # a real decode through draftsmith.eval
    # best/ is a loadable drafter folder
    from draftsmith.drafters import kind_module

    proposer = kind_module("eagle").load_proposer(out / "best", target)
    assert proposer is not None
    assert not list(out.glob(".*tmp")) and not list(out.glob(".candidate-*"))


def test_nan_loss_stops_naming_step_and_samples_and_keeps_last_good_checkpoint(tmp_path):
    target = tiny_target()
    order = SampleOrder(num_samples=24, batch_size=2, seed=0)
    poison = order.micro_batch(4)[1]  # used by optimizer step 5 (0-based step 4)
    recipe = make_recipe(tmp_path, target, poison=poison, max_steps=8, checkpoint_every=2)
    with pytest.raises(DraftsmithError) as caught:
        recipe.train()
    message = str(caught.value)
    assert "at step 5" in message and f"{{0: {order.micro_batch(4)}}}" in message and "checkpoint-4" in message
    out = tmp_path / "run"
    assert (out / "latest").read_text().strip() == "checkpoint-4"
    assert not (out / "checkpoint-6").exists()
    assert [r["step"] for r in read_log(out)] == [1, 2, 3, 4]


def test_best_is_chosen_by_decoded_acceptance_length_not_by_loss(tmp_path, monkeypatch):
    """eval.select_by: decoded."""
    scripted = iter([1.2, 1.9, 1.4])  # the decoder's τ at steps 2, 4, 6

    def rigged_decode(kind, folder, target, prompts, draft_length, max_new_tokens):
        assert (Path(folder) / "config.json").is_file()  # it decodes the saved candidate folder
        return {"acceptance_length": next(scripted), "acceptance_per_position": []}

    monkeypatch.setattr(recipe_module, "decode_acceptance_length", rigged_decode)
    target = tiny_target()
    recipe = make_recipe(tmp_path, target, max_steps=6, eval_every=2, checkpoint_every=2, keep_checkpoints=0,
                         lr=3e-3, evaluation={"select_by": "decoded"})
    recipe.train()
    out = tmp_path / "run"
    losses = [r["loss"] for r in read_log(out, "eval")]
    assert losses[2] < losses[1]  # loss would have picked step 6
    assert json.loads((out / "best.json").read_text())["step"] == 4
    assert recipe.best_step == 4 and recipe.best_score == 1.9
    from safetensors.torch import load_file

    best = load_file(str(out / "best" / "model.safetensors"))
    at4 = load_file(str(out / "checkpoint-4" / "drafter" / "model.safetensors"))
    at6 = load_file(str(out / "checkpoint-6" / "drafter" / "model.safetensors"))
    assert all(torch.equal(best[k], at4[k]) for k in best)
    assert not all(torch.equal(best[k], at6[k]) for k in best)


def test_best_is_chosen_by_the_implied_acceptance_length_by_default_and_the_decode_is_only_logged(tmp_path, monkeypatch):
    """The default selector reads the held-out accuracies' implied τ; a decode that ranks the steps otherwise is
    logged as measured and changes nothing else."""
    implied, decoded = iter([1.3, 1.6, 1.4]), iter([1.9, 1.2, 1.5])  # at steps 2, 4, 6: they disagree
    monkeypatch.setattr(recipe_module, "implied_acceptance_length", lambda accuracies: next(implied))
    monkeypatch.setattr(recipe_module, "decode_acceptance_length",
                        lambda *args: {"acceptance_length": next(decoded), "acceptance_per_position": []})
    target = tiny_target()
    recipe = make_recipe(tmp_path, target, max_steps=6, eval_every=2, checkpoint_every=2, keep_checkpoints=0,
                         lr=3e-3)
    recipe.train()
    out = tmp_path / "run"
    records = read_log(out, "eval")
    assert [(r["implied_acceptance_length"], r["acceptance_length"]) for r in records] == [(1.3, 1.9), (1.6, 1.2),
                                                                                            (1.4, 1.5)]
    assert (recipe.best_step, recipe.best_score) == (4, 1.6)
    best = json.loads((out / "best.json").read_text())
    assert (best["step"], best["selected_by"]) == (4, "implied")
    assert json.loads((out / "checkpoint-6" / STATE_FILE).read_text())["select_by"] == "implied"
    # resumed with the other selector: its first figure starts a new comparison, however low
    reset_accelerate_state()
    implied, decoded = iter([1.9]), iter([1.01])
    config = load(TrainConfig, tmp_path / "recipe.yaml", ["resume=true", "train.max_steps=8", "eval.select_by=decoded"])
    resumed = TrainRecipe(config, data=memory_data(target, required_layers(config, target)), target=target)
    resumed.setup()
    resumed.train()
    assert (resumed.best_step, resumed.best_score) == (8, 1.01)


def test_a_spent_time_budget_ends_training_like_max_steps_and_a_resume_counts_the_time_already_spent(tmp_path,
                                                                                                       monkeypatch):
    """train.max_minutes: the step that spends it is validated, checkpointed and last; a resume keeps counting."""
    import types

    clock = {"now": 0.0}
    monkeypatch.setattr(recipe_module, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    real_step = TrainRecipe._train_step

    def two_seconds_a_step(self):
        clock["now"] += 2.0
        return real_step(self)

    monkeypatch.setattr(TrainRecipe, "_train_step", two_seconds_a_step)
    target = tiny_target()
    recipe = make_recipe(tmp_path, target, max_steps=8, max_minutes=0.1, checkpoint_every=0)  # 6 s: 3 steps
    recipe.train()
    out = tmp_path / "run"
    assert recipe.step == 3 and [r["step"] for r in read_log(out)] == [1, 2, 3]
    # the cosine follows the budget, further along than the steps: after 2 of 8 steps (warmup 2), 4 of 6 s are spent
    # by the start of step 3, so its rate is the cosine a third of the way down (by steps it would be the peak)
    assert [r["lr"] for r in read_log(out)] == pytest.approx([0.5e-3, 1e-3, (0.1 + 0.45 * 1.5) * 1e-3])
    assert [r["step"] for r in read_log(out, "eval")] == [3]
    assert json.loads((out / "checkpoint-3" / STATE_FILE).read_text())["train_seconds"] == 6.0
    assert (out / "best" / "config.json").is_file()

    def resumed(*overrides):
        reset_accelerate_state()
        config = load(TrainConfig, tmp_path / "recipe.yaml", ["resume=true", *overrides])
        run = TrainRecipe(config, data=memory_data(target, required_layers(config, target)), target=target)
        run.setup()
        run.train()
        return run

    assert resumed().step == 3  # the same budget is spent already: no step is taken
    assert resumed("train.max_minutes=0.2").step == 6  # 6 s more
    assert resumed("train.max_minutes=0").step == 8  # no budget: max_steps ends it
    assert [r["step"] for r in read_log(out)] == list(range(1, 9))
    with pytest.raises(DraftsmithError, match="max_minutes must be >= 0"):
        load(TrainConfig, tmp_path / "recipe.yaml", ["train.max_minutes=-1"])


def test_validation_does_not_change_the_training_trajectory(tmp_path):
    """EAGLE-1 draws input noise from the RNG; validating every step must not shift that stream."""
    target = tiny_target()
    quiet = make_recipe(tmp_path / "a", target, variant="eagle1", max_steps=5, eval_every=0)
    quiet.train()
    reset_accelerate_state()
    busy = make_recipe(tmp_path / "b", target, variant="eagle1", max_steps=5, eval_every=1)
    busy.train()
    assert [r["loss"] for r in read_log(tmp_path / "a" / "run")] == [r["loss"] for r in read_log(tmp_path / "b" / "run")]


def test_fresh_run_refuses_an_output_dir_with_checkpoints_and_resume_refuses_other_data(tmp_path):
    target = tiny_target()
    recipe = make_recipe(tmp_path, target, max_steps=2, checkpoint_every=2)
    recipe.train()
    reset_accelerate_state()
    with pytest.raises(DraftsmithError, match="resume=true"):
        make_recipe(tmp_path, target, max_steps=4)
    # resuming needs the same sample stream: other data cannot continue "where it stopped"
    reset_accelerate_state()
    config = load(TrainConfig, tmp_path / "recipe.yaml", ["resume=true", "train.max_steps=4"])
    other_data = memory_data(target, required_layers(config, target), n_train=20)
    with pytest.raises(DraftsmithError, match="cannot continue"):
        TrainRecipe(config, data=other_data, target=target).setup()


def test_a_tracker_that_is_not_installed_is_refused_instead_of_dropped(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    target = tiny_target()
    config_dict = recipe_dict({"target": "unused", "prepared": None}, max_steps=2, checkpoint_every=0)
    config_dict["data"] = {"features": "in-memory", "batch_size": 2, "max_length": 48}
    config_dict["output_dir"] = str(tmp_path / "run")
    config_dict["tracking"] = {"report_to": ["tensorboard", "wandb"]}
    config = load(TrainConfig, write_recipe(tmp_path / "recipe.yaml", config_dict))
    recipe = TrainRecipe(config, data=memory_data(target, required_layers(config, target)), target=target)
    with pytest.raises(DraftsmithError, match="report_to names wandb, which is not installed: pip install wandb"):
        recipe.setup()


def test_trackers_tensorboard_and_offline_wandb_write_local_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    target = tiny_target()
    config_dict = recipe_dict({"target": "unused", "prepared": None}, max_steps=3, eval_every=3, checkpoint_every=0)
    config_dict["data"] = {"features": "in-memory", "batch_size": 2, "max_length": 48}
    config_dict["output_dir"] = str(tmp_path / "run")
    config_dict["tracking"] = {"report_to": ["tensorboard", "wandb"], "project": "tiny", "run_name": "t1"}
    config = load(TrainConfig, write_recipe(tmp_path / "recipe.yaml", config_dict))
    recipe = TrainRecipe(config, data=memory_data(target, required_layers(config, target)), target=target)
    recipe.setup()
    recipe.train()
    recipe.cleanup()
    out = tmp_path / "run"
    events = list(out.rglob("events.out.tfevents*"))
    assert events, "no TensorBoard event file"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = set()
    for path in events:
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        scalars |= set(accumulator.Tags()["scalars"])
    assert {"train/loss", "train/acc_0", "train/tokens_per_s", "eval/implied_acceptance_length"} <= scalars
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))


# --------------------------------------------------------------------------- CLI and shipped launch configs
def test_train_help_lists_every_recipe_key_and_the_drafter_options(capsys):
    from draftsmith.cli import main
    from draftsmith.config import describe

    with pytest.raises(SystemExit) as exited:
        main(["train", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for line in describe(TrainConfig):
        assert line.strip() in text
    assert "drafter.ttt_steps" in text and "accelerate launch --config_file" in text


ACCELERATE_CONFIGS = sorted((Path(__file__).resolve().parents[1] / "recipes" / "accelerate").glob("*.yaml"))


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=[p.stem for p in ACCELERATE_CONFIGS])
def test_shipped_accelerate_configs_load_with_accelerate(path):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    assert path.read_text().startswith("#") and "accelerate launch --config_file" in path.read_text()
    cpu = path.stem.startswith("cpu-")
    assert config.num_processes == (2 if cpu else 8)
    assert config.mixed_precision == ("no" if cpu else "bf16")
    kind = path.stem.removeprefix("cpu-")
    if kind.startswith("zero"):
        assert config.distributed_type == "DEEPSPEED"
        assert config.deepspeed_config["zero_stage"] == int(kind[-1])
        assert config.deepspeed_config["zero3_init_flag"] is False  # the frozen target must stay whole
        # the recipe, not the launch config, sets accumulation and clipping
        assert "gradient_accumulation_steps" not in config.deepspeed_config
        assert "gradient_clipping" not in config.deepspeed_config
        if kind == "zero3":
            assert config.deepspeed_config["zero3_save_16bit_model"] is True
    elif kind == "fsdp":
        assert config.distributed_type == "FSDP" and config.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    else:
        assert config.distributed_type == "MULTI_GPU"


# --------------------------------------------------------------------------- offline shards through the real data path
def test_offline_shards_from_capture_train_and_validate_on_prepared_eval(tmp_path):
    from draftsmith.data.offline import CaptureConfig, write_capture

    assets = write_assets(tmp_path / "assets")
    features = tmp_path / "features"
    write_capture(CaptureConfig(target=assets["target"], data=assets["prepared"], layers="eagle3", out=str(features),
                                dtype="fp32", samples_per_shard=16))
    config_dict = recipe_dict(assets, "eagle3", max_steps=3, checkpoint_every=0)
    config_dict["data"] = {"prepared": assets["prepared"], "features": str(features), "batch_size": 2, "max_length": 48}
    config_dict["output_dir"] = str(tmp_path / "run")
    config = load(TrainConfig, write_recipe(tmp_path / "recipe.yaml", config_dict))
    recipe = TrainRecipe(config)
    recipe.setup()
    recipe.train()
    recipe.cleanup()
    log = read_log(tmp_path / "run")
    assert len(log) == 3 and all(math.isfinite(r["loss"]) for r in log)
    evals = read_log(tmp_path / "run", "eval")
    assert "acc_0" in evals[-1] and evals[-1]["acceptance_length"] >= 1.0  # held-out features captured online
    assert (tmp_path / "run" / "best" / "model.safetensors").is_file()

    # shards captured for other layers are refused before training starts
    assert_setup_refuses(write_recipe(tmp_path / "recipe.yaml", config_dict),
                         ["drafter.layers=[0,2,5]", f"output_dir={tmp_path / 'run2'}"], "missing")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_offline_recipe_captures_once_and_trains_as_online_does(tmp_path):
    """data.online=false with data.prepared and an empty data.features: the first run captures the features
    (what `draftsmith capture` writes), and training on them takes the same steps as online capture; features
    captured from other prepared data are refused."""
    from draftsmith.data.offline import verify_capture

    assets = write_assets(tmp_path / "assets")
    features = tmp_path / "features"
    losses = {}
    for mode in ("online", "offline"):
        config_dict = recipe_dict(assets, "eagle3", max_steps=3, checkpoint_every=0, eval_every=0)
        config_dict["data"] = {"prepared": assets["prepared"], "batch_size": 2, "max_length": 48,
                               **({"online": True} if mode == "online" else {"features": str(features)})}
        config_dict["output_dir"] = str(tmp_path / mode)
        recipe = TrainRecipe(load(TrainConfig, write_recipe(tmp_path / f"{mode}.yaml", config_dict)))
        recipe.setup()
        recipe.train()
        recipe.cleanup()
        reset_accelerate_state()
        losses[mode] = [r["loss"] for r in read_log(tmp_path / mode)]
    assert verify_capture(features)["num_samples"] == 32  # the whole train split
    assert losses["offline"] == pytest.approx(losses["online"], rel=1e-5)

    from draftsmith.data.prepared import PrepareConfig, prepare

    other = tmp_path / "other"  # the same conversations, split otherwise: another train split
    prepare(PrepareConfig(target=assets["target"], input=[str(tmp_path / "assets" / "conversations.jsonl")],
                          out=str(other), eval_fraction=0.3, max_length=96))
    config = load(TrainConfig, write_recipe(tmp_path / "offline.yaml", config_dict),
                  [f"data.prepared={other}", f"output_dir={tmp_path / 'other-run'}"])
    with pytest.raises(DraftsmithError, match="captured from other data"):
        TrainRecipe(config).setup()


def record_top_k_asked(monkeypatch) -> list[int]:
    """The topk_logits of every online capture from now on (0: the batch's top-k was not computed)."""
    from draftsmith.data import capture as capture_module

    asked, original = [], capture_module.capture_batch

    def recording(target, batch, layers, dtype=torch.bfloat16, topk_logits=0):
        asked.append(topk_logits)
        return original(target, batch, layers, dtype, topk_logits)

    monkeypatch.setattr(capture_module, "capture_batch", recording)
    return asked


def test_online_top_k_is_computed_once_per_sequence_and_trains_as_offline_top_k(tmp_path, monkeypatch):
    """Online training with data.topk_logits: the target's head runs for a sequence's top-k on its first visit
    only; later epochs take the kept top-k (rows reshuffled and padded otherwise) and train exactly as offline
    training on shards captured with the same top-k."""
    assets = write_assets(tmp_path / "assets")
    losses, asked = {}, []
    for mode in ("online", "offline"):
        config_dict = recipe_dict(assets, "eagle3", max_steps=40, checkpoint_every=0, eval_every=0)
        config_dict["data"] = {"prepared": assets["prepared"], "batch_size": 2, "max_length": 48, "topk_logits": 4,
                               **({"online": True} if mode == "online" else {"features": str(tmp_path / "features")})}
        config_dict["output_dir"] = str(tmp_path / mode)
        if mode == "online":
            asked = record_top_k_asked(monkeypatch)
        recipe = TrainRecipe(load(TrainConfig, write_recipe(tmp_path / f"{mode}.yaml", config_dict)))
        recipe.setup()
        recipe.train()
        recipe.cleanup()
        reset_accelerate_state()
        monkeypatch.undo()
        losses[mode] = [r["loss"] for r in read_log(tmp_path / mode)]
    # 32 training sequences in micro-batches of 2: 16 first visits; the held-out check adds at most 2 batches
    assert len(asked) >= 40 and sum(map(bool, asked)) <= 16 + 2
    assert len(losses["online"]) == 40
    assert losses["offline"] == pytest.approx(losses["online"], rel=1e-5)


def test_checkpoints_keep_the_online_top_k_so_a_resumed_run_needs_no_head_for_sequences_seen(tmp_path, monkeypatch):
    """Each checkpoint saves the online top-k memory; a run resumed from step 24 of 40 (the second epoch) takes
    every training sequence's top-k from it, and its losses are the uninterrupted run's bit for bit."""
    import shutil

    assets = write_assets(tmp_path / "assets")
    config_dict = recipe_dict(assets, "eagle3", max_steps=40, checkpoint_every=8, eval_every=0, keep_checkpoints=10)
    config_dict["data"] = {"prepared": assets["prepared"], "batch_size": 2, "max_length": 48, "topk_logits": 4,
                           "online": True}
    config_dict["output_dir"] = str(tmp_path / "straight")
    recipe_file = write_recipe(tmp_path / "recipe.yaml", config_dict)
    recipe = TrainRecipe(load(TrainConfig, recipe_file))
    recipe.setup()
    recipe.train()
    recipe.cleanup()
    reset_accelerate_state()
    assert (tmp_path / "straight" / "checkpoint-24" / "topk_memory_0.safetensors").is_file()

    resumed = tmp_path / "resumed"  # the run as if stopped after checkpoint-24
    shutil.copytree(tmp_path / "straight", resumed)
    for folder in resumed.glob("checkpoint-*"):
        if int(folder.name.split("-")[1]) > 24:
            shutil.rmtree(folder)
    (resumed / "latest").write_text("checkpoint-24\n")
    kept = [line for line in (resumed / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 24]
    (resumed / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    asked = record_top_k_asked(monkeypatch)
    recipe = TrainRecipe(load(TrainConfig, recipe_file, [f"output_dir={resumed}", "resume=true"]))
    recipe.setup()
    recipe.train()
    recipe.cleanup()
    reset_accelerate_state()
    assert len(asked) >= 16 and sum(map(bool, asked)) <= 2  # the held-out batches of the last validation only
    assert [r["loss"] for r in read_log(resumed)] == [r["loss"] for r in read_log(tmp_path / "straight")]


def test_offline_recipe_with_fp8_features_and_top_k_labels(tmp_path):
    """data.features_dtype=fp8 and data.topk_logits=K: the first run captures fp8 shards with the target's top-K
    logits, labels=topk trains on them and validates on held-out batches given the same; a recipe that asks
    for more logits than were captured is refused."""
    from draftsmith.data.capture import read_manifest

    assets = write_assets(tmp_path / "assets")
    features = tmp_path / "features"
    config_dict = recipe_dict(assets, "eagle3", max_steps=3, checkpoint_every=0, eval_every=3)
    config_dict["data"] = {"prepared": assets["prepared"], "batch_size": 2, "max_length": 48, "features": str(features),
                           "features_dtype": "fp8", "topk_logits": 8}
    config_dict["drafter"]["labels"] = "topk"
    config_dict["output_dir"] = str(tmp_path / "run")
    recipe = TrainRecipe(load(TrainConfig, write_recipe(tmp_path / "recipe.yaml", config_dict)))
    recipe.setup()
    recipe.train()
    recipe.cleanup()
    manifest = read_manifest(features)
    assert manifest["dtype"] == "float8_e4m3fn" and manifest["topk_logits"] == 8
    log = read_log(tmp_path / "run")
    assert len(log) == 3 and all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in log)
    assert 0.0 <= read_log(tmp_path / "run", "eval")[-1]["acc_0"] <= 1.0
    assert_setup_refuses(write_recipe(tmp_path / "recipe.yaml", config_dict),
                         ["data.topk_logits=16", f"output_dir={tmp_path / 'refused'}"], "fewer than data.topk_logits 16")


def test_fsdp_on_cpu_is_refused_instead_of_silently_running_ddp(monkeypatch):
    from draftsmith.train.recipe import build_accelerator

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(DraftsmithError, match="FSDP needs GPUs"):
        build_accelerator(TrainConfig())


def test_auto_precision_is_bf16_only_where_the_hardware_has_it_and_it_is_faster(monkeypatch):
    from draftsmith.train import builders
    from draftsmith.train.builders import resolve_precision

    assert resolve_precision("fp32", cuda=False) == "no" and resolve_precision("bf16", cuda=False) == "bf16"
    monkeypatch.setattr(builders, "cpu_bf16_is_faster", lambda: True)
    assert resolve_precision("auto", cuda=False) == "bf16"
    monkeypatch.setattr(builders, "cpu_bf16_is_faster", lambda: False)  # no AMX, or emulated bf16 (AVX2 only)
    assert resolve_precision("auto", cuda=False) == "no"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_precision("auto", cuda=True) == "no"


# --------------------------------------------------------------------------- CPU threads under a multi-process launch
def test_cpu_processes_never_oversubscribe_the_cores():
    from draftsmith.train.builders import cpu_threads_per_process

    for cores in range(1, 34):
        for processes in range(1, 9):
            share = max(1, cores // processes)
            assert cpu_threads_per_process(cores, processes, None) == share  # the default: an even split
            for requested in (0, 1, 2, cores, 4 * cores):
                threads = cpu_threads_per_process(cores, processes, requested)
                assert 1 <= threads <= share and threads * processes <= max(cores, processes)
                assert threads == max(1, min(requested, share))  # a smaller request is kept


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, torch's threads are left alone")
def test_share_cpu_threads_sets_torch_threads_from_the_launch_environment():
    import os

    from draftsmith.train.builders import share_cpu_threads

    cores = len(os.sched_getaffinity(0))
    before = torch.get_num_threads()
    try:
        assert share_cpu_threads({"OMP_NUM_THREADS": "64"}) is None  # one process: left alone
        assert torch.get_num_threads() == before
        note = share_cpu_threads({"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "64"})
        assert torch.get_num_threads() == max(1, cores // 2) and "would oversubscribe" in note
        share_cpu_threads({"LOCAL_WORLD_SIZE": str(2 * cores)})
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
