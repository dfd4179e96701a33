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

PROMPTS, NEW_TOKENS = 6, 32


@pytest.fixture(scope="module")
def engine(smollm2):
    """The engine venv (skipped without it; CI must have it) and the built-in target's folder that vLLM reads."""
    if not ENGINE_PYTHON.is_file():
        if os.environ.get("CI"):
            pytest.fail("CI run without .venv-engine: `make engine` makes it (.ci/run runs it before the tests).")
        pytest.skip("needs vLLM's venv: `make engine`")
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


@pytest.mark.engine
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


@pytest.mark.engine
def test_vllm_loads_medusa_heads_over_a_draft_vocabulary(engine, smollm2, prepared, tmp_path):
    """Medusa heads over the prepared 1024-token draft vocabulary (started from the target's lm_head rows): the
    medusa export vLLM 0.32 refused at load (heads of 1024 rows) loads, drafts what ours drafts, and is lossless."""
    from draftsmith.data.vocab import load_draft_vocab
    from draftsmith.drafters import medusa

    vocab = load_draft_vocab(prepared, smollm2)
    medusa.create(medusa.Config(num_heads=2), smollm2, vocab).save_pretrained(tmp_path / "medusa")
    report = engine_eval(smollm2, tmp_path / "medusa", tmp_path / "eval", draft_length=2)
    assert_served_as_we_measure(report, "medusa")


# --------------------------------------------------------------------------- without the engine: the bookkeeping
def test_the_engines_counters_read_as_our_per_position_counts():
    """vLLM counts a_i = drafts that accepted positions 1..i; a_{i-1} drafts reached position i (a_0 = drafts): the
    same reached/accepted counts our decoder's cycles give for the same accept lengths."""
    from draftsmith.eval.decoder import Cycle, Generation
    from draftsmith.eval.engine_report import engine_positions, our_positions, parity

    accepts = [[0, 2, 1, 3], [3, 0, 0]]  # chains of 3: accepted tokens per verify pass, two requests
    ours = our_positions([Generation([], None, 1.0, [Cycle(3, min(3, a + 1), a, a + 1, 0.0, 0.0) for a in passes])
                          for passes in accepts], 3)
    outputs = [{"counters": {"drafts": len(passes), "accepted_per_position": [sum(a >= i for a in passes)
                                                                               for i in (1, 2, 3)]}}
               for passes in accepts]
    engine = engine_positions(outputs)
    assert (ours["reached"], ours["accepted"]) == (engine["reached"], engine["accepted"]) == ([7, 4, 3], [4, 3, 2])
    assert engine["acceptance_per_position"] == [4 / 7, 3 / 4, 2 / 3]
    assert ours["acceptance_length"] == engine["acceptance_length"] == 1 + 9 / 7
    assert parity(ours, engine) == {"counts_equal": True, "max_abs_difference": 0.0, "positions": 3}


@pytest.mark.parametrize("kind", ["eagle", "mtp", "medusa", "dflash"])
def test_the_engine_comparison_turns_off_every_confidence_cut(kind, monkeypatch, tmp_path):
    """vLLM drafts whole chains, so every kind that cuts its chains by confidence (DFlash by default) drafts whole."""
    from draftsmith.eval import runner
    from draftsmith.eval.command import EvalConfig
    from draftsmith.eval.engine import fixed_chains

    monkeypatch.setattr(runner, "drafter_kind", lambda spec: kind)
    config = EvalConfig(target="smollm2-135m-instruct", drafter=str(tmp_path), out=str(tmp_path), engine="vllm")
    assert fixed_chains(config).confidence_cut is False


def test_the_engine_comparison_drafts_full_chains_and_refuses_what_vllm_does_not(tmp_path):
    """Our side drafts as vLLM does (no fallback, confidence cut or adaptive lookup); trees and fallback are refused;
    the engine gets every core of this process and vLLM's preloads."""
    from draftsmith.errors import DraftsmithError
    from draftsmith.eval.command import EvalConfig
    from draftsmith.eval.engine import engine_environment, fixed_chains

    config = EvalConfig(target="smollm2-135m-instruct", drafter="prompt-lookup", out=str(tmp_path), engine="vllm")
    fixed = fixed_chains(config)
    assert (fixed.fallback, fixed.adaptive_lookup, fixed.confidence_cut) == (False, False, None)
    for changes, match in [({"tree": "3,2,6"}, "drafts chains"), ({"fallback": True}, "full chains"),
                           ({"engine": "sglang"}, "the engines are vllm"),
                           ({"engine_methods": "plain,eagle"}, "unknown eagle")]:
        with pytest.raises(DraftsmithError, match=match):
            fixed_chains(EvalConfig(**{**config.__dict__, **changes}))
    python = tmp_path / "venv" / "bin" / "python"
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "venv" / "lib" / "libiomp5.so").touch()
    environment = engine_environment(python)
    assert environment["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))
    assert str(tmp_path / "venv" / "lib" / "libiomp5.so") in environment["LD_PRELOAD"].split(":")
    assert environment["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
