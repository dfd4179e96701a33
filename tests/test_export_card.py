"""Model card (real eval numbers or an honest 'none'), W&B link-up, and the Hub upload (mocked)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import yaml
from test_export_support import TARGET_HUB_ID, always_accepted_target, make_checkpoint

from draftsmith import export as ex
from draftsmith.export import eagle3
from draftsmith.export import card as model_card
from draftsmith.cli import main
from draftsmith.errors import DraftsmithError


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A drafter checkpoint and a real `draftsmith eval` run of it on a rigged tiny target saved to disk."""
    root = tmp_path_factory.mktemp("card")
    target_dir = root / "tiny-target"
    rigged = always_accepted_target()
    rigged.model.save_pretrained(target_dir)
    rigged.tokenizer.save_pretrained(target_dir)
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["abcabcabc", "hello hello", "1 2 3 1 2 3"]))
    checkpoint = make_checkpoint(root / "run", seed=5, for_target=rigged, perturb=False, init_head_from_target=True, training={
        "target": TARGET_HUB_ID, "recipe": "recipes/tiny/eagle3.yaml", "examples": 1200, "tokens": 345678,
        "steps": 40, "hardware": "cpu x2", "wandb": {"id": "abc123", "project": "drafters",
                                                      "url": "https://wandb.ai/team/drafters/runs/abc123"}})
    eval_dir = root / "eval"
    code = main(["eval", "--target", str(target_dir), "--drafter", str(checkpoint), "--prompts", str(prompts),
                 "--num-prompts", "3", "--max-new-tokens", "12", "--draft-length", "3", "--threads", "1",
                 "--no-transformers-baseline", "--out", str(eval_dir)])
    assert code == 0
    return checkpoint, eval_dir


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_card_reports_the_real_eval_numbers(evaluated, tmp_path):
    checkpoint, eval_dir = evaluated
    results = json.loads((eval_dir / "results.json").read_text())
    assert results["acceptance_length"] > 3 and results["acceptance_per_position"] == [1.0, 1.0, 1.0]
    out = ex.export(checkpoint, "speculators", tmp_path / "out", eval_results=eval_dir)
    card = (out / "README.md").read_text()
    meta = front_matter(card)
    assert meta["base_model"] == TARGET_HUB_ID and meta["library_name"] == "draftsmith" and "eagle3" in meta["tags"]
    assert f"{results['acceptance_length']:.3f}" in card
    assert ", ".join(f"{a:.3f}" for a in results["acceptance_per_position"]) in card
    assert f"{results['speedup']:.3f}" in card
    assert "temperature | 0.0 " in card and "prompts.jsonl, 3 prompts" in card and "chain of 3" in card
    assert '"num_speculative_tokens": 3' in card  # the draft length the results were measured with
    assert (out / "acceptance.png").read_bytes().startswith(b"\x89PNG") and "](acceptance.png)" in card
    assert "1200" in card and "345678" in card and "https://wandb.ai/team/drafters/runs/abc123" in card
    assert f"vllm serve {TARGET_HUB_ID}" in card and '"method": "eagle3"' in card
    assert "--speculative-algorithm EAGLE3" in card
    assert eagle3.validate_export(out) == "speculators"  # the card and plot are allowed files


def test_card_finds_results_under_the_checkpoint(evaluated, tmp_path):
    import shutil

    checkpoint, eval_dir = evaluated
    copy = tmp_path / "run" / "best"
    shutil.copytree(checkpoint, copy)
    shutil.copy(checkpoint.parent / "training.json", tmp_path / "run")
    shutil.copytree(eval_dir, copy / "eval")
    card = (ex.export(copy, "sglang", tmp_path / "out") / "README.md").read_text()
    assert "## Measured results" in card and "No `draftsmith eval` results" not in card
    assert "sglang.launch_server" in card.split("```bash")[1]  # SGLang's command first for an SGLang folder
    tags = yaml.safe_load(card.split("---")[1])["tags"]
    assert tags.count("sglang") == 1 and len(tags) == len(set(tags))


def test_card_without_results_invents_nothing(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "run", training={"target": TARGET_HUB_ID})
    card = (ex.export(checkpoint, "speculators", tmp_path / "out") / "README.md").read_text()
    assert "No `draftsmith eval` results were found" in card
    assert "acceptance length τ" not in card and "speedup vs" not in card
    assert "recipe | not recorded" in card
    assert not list((tmp_path / "out").glob("*.png"))


def test_results_of_another_drafter_are_refused_or_skipped(evaluated, tmp_path):
    _, eval_dir = evaluated
    other = make_checkpoint(tmp_path / "run", layers=[2, 3, 4])
    with pytest.raises(DraftsmithError, match="does not hold results of this drafter"):
        ex.export(other, "speculators", tmp_path / "out", eval_results=eval_dir)
    assert not (tmp_path / "out").exists()
    with pytest.raises(DraftsmithError, match="does not exist"):
        ex.export(other, "speculators", tmp_path / "out", eval_results=tmp_path / "nowhere")


def test_render_card_states_layer_ids_in_both_conventions():
    facts = eagle3.CardFacts(
        fmt="speculators", model_ref="me/drafter", verifier="./local-target", verifier_is_hub_id=False,
        target_layers=[1, 14, 26], format_layer_ids=[2, 15, 27], draft_vocab_size=32000, target_vocab_size=49152,
        hidden_size=576, parameters=1234, speculative_tokens=4)
    card = eagle3.render_card(facts)
    assert "base_model" not in front_matter(card)  # never a made-up hub id
    assert "1, 14, 26" in card and "[2, 15, 27]" in card
    assert '"num_speculative_tokens": 4' in card and "me/drafter" in card
    assert "is not a hub id" in card


@pytest.mark.parametrize("trained_on", ["smollm2-135m-instruct", "/models/SmolLM2-135M-Instruct.Q4_1.gguf", TARGET_HUB_ID])
def test_card_says_which_weights_the_drafter_was_trained_against(trained_on):
    facts = eagle3.CardFacts(
        fmt="speculators", model_ref="me/drafter", verifier=TARGET_HUB_ID, verifier_is_hub_id=True,
        target_layers=[1, 14, 26], format_layer_ids=[2, 15, 27], draft_vocab_size=32000, target_vocab_size=49152,
        hidden_size=576, parameters=1234, speculative_tokens=4, training={"target": trained_on})
    card = eagle3.render_card(facts)
    if trained_on == TARGET_HUB_ID:  # trained against the verifier itself: nothing to warn about
        assert "Verifier weights" not in card
    else:
        assert "SmolLM2-135M-Instruct.Q4_1.gguf" in card and "full-precision" in card and "--verifier" in card


# --------------------------------------------------------------------------- W&B
def test_eval_results_are_logged_to_the_training_run(evaluated, tmp_path, monkeypatch, capsys):
    checkpoint, eval_dir = evaluated
    fake = types.SimpleNamespace(init=mock.MagicMock(), Table=mock.MagicMock(), Image=mock.MagicMock())
    monkeypatch.setitem(sys.modules, "wandb", fake)
    assert main(["export", str(checkpoint), "--format", "speculators", "--out", str(tmp_path / "out"),
                 "--eval-results", str(eval_dir)]) == 0
    assert "Logged the eval results" in capsys.readouterr().out
    kwargs = fake.init.call_args.kwargs
    assert kwargs["id"] == "abc123" and kwargs["project"] == "drafters" and kwargs["resume"] == "allow"
    logged = fake.init.return_value.log.call_args.args[0]
    assert "eval/results" in logged and "eval/acceptance" in logged
    fake.init.return_value.finish.assert_called_once()


def test_wandb_failures_do_not_fail_the_export(evaluated, tmp_path, monkeypatch, capsys):
    checkpoint, eval_dir = evaluated
    fake = types.SimpleNamespace(init=mock.MagicMock(side_effect=RuntimeError("offline")))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    assert main(["export", str(checkpoint), "--format", "sglang", "--out", str(tmp_path / "out"),
                 "--eval-results", str(eval_dir)]) == 0
    assert "Not logged to W&B: W&B logging failed" in capsys.readouterr().out
    assert model_card.log_to_wandb({}, {"acceptance_length": 2.0}, []) == "the training run did not use W&B"


# --------------------------------------------------------------------------- Hub
class FakeApi:
    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        if self.fail:
            raise self.fail
        return f"https://huggingface.co/{repo_id}"

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs["repo_id"], kwargs))
        self.uploaded = sorted(p.name for p in Path(kwargs["folder_path"]).iterdir())


def test_push_creates_the_repo_then_uploads_the_validated_folder(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "run")
    out = ex.export(checkpoint, "speculators", tmp_path / "out", repo_id="me/tiny-eagle3")
    api = FakeApi()
    url = model_card.push_to_hub(out, "me/tiny-eagle3", private=True, revision="v1", api=api)
    assert url == "https://huggingface.co/me/tiny-eagle3"
    assert [c[0] for c in api.calls] == ["create_repo", "create_branch", "upload_folder"]
    assert api.calls[0][2]["exist_ok"] is True and api.calls[0][2]["private"] is True
    assert api.calls[2][2]["revision"] == "v1"
    assert api.uploaded == ["README.md", "config.json", "model.safetensors"]
    assert '"model": "me/tiny-eagle3"' in (out / "README.md").read_text()


def test_push_without_network_is_a_clear_error_and_keeps_the_folder(tmp_path, monkeypatch):
    import httpx

    checkpoint = make_checkpoint(tmp_path / "run")
    out = ex.export(checkpoint, "sglang", tmp_path / "out")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_value")
    with pytest.raises(DraftsmithError) as err:
        model_card.push_to_hub(out, "me/x", api=FakeApi(fail=httpx.ConnectError("no route to huggingface.co")))
    assert "Could not reach the Hugging Face Hub" in str(err.value) and str(out) in str(err.value)
    assert "hf_secret_token_value" not in str(err.value)
    assert eagle3.validate_export(out) == "sglang"
    for path in out.iterdir():
        assert b"hf_secret_token_value" not in path.read_bytes()


def test_push_with_a_rejected_token_says_how_to_log_in(tmp_path):
    import httpx
    from huggingface_hub.errors import HfHubHTTPError

    checkpoint = make_checkpoint(tmp_path / "run")
    out = ex.export(checkpoint, "speculators", tmp_path / "out")
    response = httpx.Response(401, request=httpx.Request("POST", "https://huggingface.co/api/repos/create"))
    with pytest.raises(DraftsmithError, match="hf auth login"):
        model_card.push_to_hub(out, "me/x", api=FakeApi(fail=HfHubHTTPError("401 Unauthorized", response=response)))
