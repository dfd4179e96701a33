"""The whole pipeline in one command (`draftsmith train RECIPE`): prepare -> online capture -> train
-> final eval report -> export; and every shipped recipe parses against its command's config."""

import json
import re
from pathlib import Path

import pytest
import yaml

from draftsmith.cli import main
from draftsmith.config import load
from draftsmith.errors import DraftsmithError
from draftsmith.train.config import TrainConfig
from test_train import write_target_and_conversations

ROOT = Path(__file__).resolve().parents[1]
TRAIN_RECIPES = sorted((ROOT / "recipes").glob("*/*.yaml"))
TRAIN_RECIPES = [p for p in TRAIN_RECIPES if p.parent.name != "accelerate"]


@pytest.mark.parametrize("path", TRAIN_RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_recipe_parses_and_opens_with_its_command(path):
    first = path.read_text().splitlines()[0]
    assert first == f"# draftsmith train {path.relative_to(ROOT)}", first
    config = load(TrainConfig, path)
    assert config.prepare is not None and config.report.num_prompts > 0  # runs end to end


def test_default_recipe_is_the_one_make_demo_runs():
    makefile = (ROOT / "Makefile").read_text()
    assert "draftsmith train recipes/smollm2-135m/eagle3.yaml" in makefile


def test_prepare_section_is_checked_strictly():
    with pytest.raises(DraftsmithError, match="prepare.max_lenght.*max_length"):
        load(TrainConfig, ROOT / "recipes/smollm2-135m/eagle3.yaml", ["prepare.max_lenght=3"])
    with pytest.raises(DraftsmithError, match="prepare.target comes from the recipe"):
        load(TrainConfig, ROOT / "recipes/smollm2-135m/eagle3.yaml", ["prepare.target=x"])


def test_one_command_prepares_trains_reports_and_exports(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # offline W&B runs (conftest) stay in tmp_path
    write_target_and_conversations(tmp_path)
    with open(tmp_path / "conversations.jsonl", "a") as handle:
        handle.write("{broken json\n")  # reported by prepare, never fatal
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"count from {k}"}) + "\n" for k in (3, 11)))
    recipe = {
        "target": {"name": str(tmp_path / "target")},
        "prepare": {"input": [str(tmp_path / "conversations.jsonl")], "max_length": 96, "eval_fraction": 0.2,
                    "draft_vocab_size": 8},
        "data": {"prepared": str(tmp_path / "data"), "online": True, "draft_vocab": str(tmp_path / "data"),
                 "batch_size": 2, "max_length": 48},
        "drafter": {"kind": "eagle", "variant": "eagle3", "ttt_steps": 3},
        "train": {"max_steps": 6, "lr": 1e-3, "warmup_steps": 1, "precision": "fp32", "eval_every": 3,
                  "checkpoint_every": 3},
        "eval": {"batches": 1, "num_prompts": 1, "max_new_tokens": 8, "draft_length": 3},
        "report": {"num_prompts": 2, "prompts": str(prompts), "max_new_tokens": 12, "draft_length": 3},
        "tracking": {"report_to": ["wandb"], "project": "draftsmith-tests"},
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["train", str(path)]) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "data" / "prepare_report.json").read_text())
    assert report["rows_rejected"] == 1 and report["rejected"][0]["line"] == 41
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    assert results["acceptance_length"] >= 1.0 and results["lossless"] == {"checked": 2, "identical": 2}
    assert "τ" in out and "speedup" in out and str(tmp_path / "run" / "eval" / "report.html") in out
    assert re.search(r"time: target and data [\d.]+ min, training [\d.]+ min, report [\d.]+ min; [\d.]+ min in all",
                     out.splitlines()[-1])  # where the time went, last
    training = json.loads((tmp_path / "run" / "training.json").read_text())
    assert training["steps"] == 6 and training["examples"] == report["rows_kept"]
    assert training["wandb"]["project"] == "draftsmith-tests" and Path(training["wandb"]["dir"]).is_dir()

    # the contract other commands rely on: DIR/best is what eval and export take
    assert main(["export", str(tmp_path / "run" / "best"), "--format", "speculators",
                 "--out", str(tmp_path / "export")]) == 0
    assert json.loads((tmp_path / "export" / "config.json").read_text())["speculators_model_type"] == "eagle3"
    card = (tmp_path / "export" / "README.md").read_text()
    assert f"run id `{training['wandb']['id']}`" in card and f"{results['acceptance_length']:.3f}" in card

    # prepared data made with other options is never reused silently
    assert main(["train", str(path), "resume=true", "prepare.max_length=64"]) == 2
    assert "prepare.max_length: recipe 64, data 96" in capsys.readouterr().err

    # a second run with resume=true finds the finished run and only reports again
    assert main(["train", str(path), "resume=true", "report.num_prompts=1"]) == 0
    assert json.loads((tmp_path / "run" / "eval" / "results.json").read_text())["lossless"]["checked"] == 1


def test_prepared_data_made_by_the_cli_matches_a_recipe_without_a_vocabulary(tmp_path):
    """`draftsmith prepare` without --draft-vocab-size reports null; a recipe's 0 means the same."""
    from draftsmith.data.prepared import PrepareConfig
    from draftsmith.train.pipeline import check_prepared_matches

    report = {"inputs": ["builtin:stdlib-complete"], "max_length": 512, "last_turn_only": False, "regenerated": True,
              "draft_vocab_size": None}
    wanted = PrepareConfig(input=["builtin:stdlib-complete"], max_length=512, regenerate=True, draft_vocab_size=0)
    check_prepared_matches(report, wanted, tmp_path / "prepare_report.json")
    with pytest.raises(DraftsmithError, match="prepare.draft_vocab_size: recipe 8192, data 0"):
        check_prepared_matches(report, PrepareConfig(**{**wanted.__dict__, "draft_vocab_size": 8192}),
                               tmp_path / "prepare_report.json")
    # a report from before prepare.max_rows_per_input (no such key) was made without a share per input
    with pytest.raises(DraftsmithError, match="prepare.max_rows_per_input: recipe 256, data 0"):
        check_prepared_matches(report, PrepareConfig(**{**wanted.__dict__, "max_rows_per_input": 256}),
                               tmp_path / "prepare_report.json")


def test_a_misspelt_report_prompt_set_is_refused_before_training():
    with pytest.raises(DraftsmithError, match="builtin:handwriten.*neither a built-in set"):
        load(TrainConfig, ROOT / "recipes/smollm2-135m/eagle3.yaml", ["report.also_prompts=[builtin:handwriten]"])
    assert load(TrainConfig, ROOT / "recipes/smollm2-135m/eagle3.yaml").report.also_prompts == ["builtin:handwritten"]
