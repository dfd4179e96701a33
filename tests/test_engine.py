"""The real engine in the loop: vLLM's CPU build (`make engine`) serves what draftsmith exports, with the outputs and
the per-position acceptance draftsmith measures on the same prompts (counts, not timings).

On the built-in target: an EAGLE-3 drafter trained briefly with the shipped recipe, and Medusa heads over a draft
vocabulary (the layout vLLM 0.32 refused before it was written at the full vocabulary), each through
`draftsmith eval --engine vllm` (exported into the layout vLLM loads, served, and compared with vLLM's plain
decoding and with our decoder). vLLM runs eager (no torch.compile) to keep the test to minutes.

Runs in the default suite where `.venv-engine` exists; CI (`.ci/run` makes it) fails without it instead of skipping.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"

pytestmark = [pytest.mark.engine, pytest.mark.skipif(
    not ENGINE_PYTHON.is_file() and not os.environ.get("CI"), reason="needs vLLM's venv: `make engine`")]

PROMPTS, NEW_TOKENS = 6, 32


@pytest.fixture(scope="module")
def engine(smollm2):
    """The engine venv (CI must have it) and the built-in target's folder that vLLM reads."""
    if not ENGINE_PYTHON.is_file():
        pytest.fail("CI run without .venv-engine: `make engine` makes it (.ci/run runs it before the tests).")
    from draftsmith.eval.engine import target_folder

    return target_folder("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def prepared(smollm2, tmp_path_factory):
    """64 builtin:stdlib conversations prepared for SmolLM2 with a 1024-token draft vocabulary (no regeneration)."""
    from draftsmith.data.prepared import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("engine") / "data"
    prepare(PrepareConfig(target="smollm2-135m-instruct", input=["builtin:stdlib"], max_rows_per_input=64,
                          out=str(out), eval_fraction=0.1, max_length=256, draft_vocab_size=1024), target=smollm2)
    return out


def engine_eval(smollm2, drafter, out: Path, draft_length: int) -> dict:
    """`draftsmith eval --engine vllm` on the first prompts of the built-in suite (several categories), greedy."""
    from draftsmith.eval.command import EvalConfig, evaluate_and_report

    config = EvalConfig(target="smollm2-135m-instruct", drafter=str(drafter), out=str(out), prompts="builtin:suite",
                        num_prompts=PROMPTS, max_new_tokens=NEW_TOKENS, draft_length=draft_length,
                        transformers_baseline=False, small_batch_linear=False, engine="vllm",
                        engine_methods="plain,drafter", engine_eager=True)
    return evaluate_and_report(config, target=smollm2)["engine"]


def assert_served_as_we_measure(report: dict, method: str) -> None:
    """Loaded, identical to vLLM's plain output on every prompt, and the same per-position counts as ours."""
    served = report["methods"]["drafter"]
    assert served["ok"], served
    assert served["speculative_config"]["method"] == method
    assert served["identical_to_engine_plain"]["identical"] == PROMPTS, served["identical_to_engine_plain"]
    ours = report["ours"]["speculative"]
    print(f"{method}: ours accepted {ours['accepted']} of reached {ours['reached']}; vLLM accepted "
          f"{served['accepted']} of reached {served['reached']}")
    assert (served["reached"], served["accepted"]) == (ours["reached"], ours["accepted"])
    assert report["parity"]["counts_equal"]


def test_vllm_serves_a_trained_eagle3_export_with_our_acceptance(engine, smollm2, prepared, tmp_path):
    """The shipped EAGLE-3 recipe, 20 steps online on the prepared rows, its best/ exported as speculators by the
    engine eval: vLLM's outputs equal its plain ones and its counters equal ours, position by position."""
    from test_train import reset_accelerate_state

    from draftsmith.config import load
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.recipe import TrainRecipe

    reset_accelerate_state()
    run = TrainRecipe(load(TrainConfig, ROOT / "recipes/smollm2-135m/eagle3.yaml", [
        f"data.prepared={prepared}", "data.online=true", "data.features=null", "prepare=null",
        f"data.draft_vocab={prepared}", "data.max_length=256", "train.max_steps=20", "train.max_minutes=0",
        "train.eval_every=0", "train.checkpoint_every=0", "eval.num_prompts=0", "report.num_prompts=0",
        "tracking.report_to=[]", f"output_dir={tmp_path / 'run'}"]), target=smollm2)
    run.setup()
    run.train()
    run.cleanup()
    report = engine_eval(smollm2, tmp_path / "run" / "best", tmp_path / "eval", draft_length=2)
    assert_served_as_we_measure(report, "eagle3")
    assert sum(report["ours"]["speculative"]["accepted"]) > 0, "no draft accepted: the parity would say little"
    assert (tmp_path / "eval" / "engine.md").is_file()


def test_vllm_loads_medusa_heads_over_a_draft_vocabulary(engine, smollm2, prepared, tmp_path):
    """Medusa heads over the prepared 1024-token draft vocabulary (started from the target's lm_head rows): the
    medusa export vLLM 0.32 refused at load (heads of 1024 rows) loads, drafts what ours drafts, and is lossless."""
    from draftsmith.data.vocab import load_draft_vocab
    from draftsmith.drafters import medusa

    vocab = load_draft_vocab(prepared, smollm2)
    medusa.create(medusa.Config(num_heads=2), smollm2, vocab).save_pretrained(tmp_path / "medusa")
    report = engine_eval(smollm2, tmp_path / "medusa", tmp_path / "eval", draft_length=2)
    assert_served_as_we_measure(report, "medusa")
