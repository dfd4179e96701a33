"""Fine-tuning drafters users have: a hub id works where a drafter folder does (from the local Hugging Face cache
when offline), and a fine-tune validates the held-out sets of the old and the new data side by side (`eval.also`),
so that losing acceptance on what the checkpoint learned shows over the run."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from test_train import read_log, recipe_dict, reset_accelerate_state, write_assets, write_recipe

from draftsmith.cli import main
from draftsmith.config import load
from draftsmith.drafters import DraftShape, Sampling
from draftsmith.errors import DraftsmithError
from draftsmith.eval.decoder import speculative_generate
from draftsmith.eval.runner import drafter_kind, load_drafter
from draftsmith.hub import drafter_folder
from draftsmith.train.config import TrainConfig
from draftsmith.train.recipe import TrainRecipe
from draftsmith.train.validate import implied_acceptance_length


def into_hub_cache(cache, repo: str, folder):
    """`folder` laid out as the Hugging Face cache holds a downloaded repository: refs/main names a snapshot."""
    commit = hashlib.sha1(repo.encode()).hexdigest()
    root = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(folder, root / "snapshots" / commit)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    return root / "snapshots" / commit


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, offline (the tests' conftest turns offline mode on for the whole run)."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert huggingface_hub.is_offline_mode()
    return tmp_path / "hub"


def spelling_conversations(n: int) -> list[dict]:
    """Other data than test_train's counting: spell a word letter by letter."""
    words = ["apple", "river", "stone", "garden", "violet", "harbor", "kettle", "mango", "tiger", "window"]
    return [{"messages": [{"role": "user", "content": f"spell {words[k % 10]} {k}"},
                          {"role": "assistant", "content": " ".join(words[k % 10]) + f" {k}"}]} for k in range(n)]


def run(tmp_path, name: str, assets: dict, steps: int, **top):
    """A tiny online EAGLE-3 recipe run to its end (validation every 2 steps)."""
    reset_accelerate_state()
    config = recipe_dict(assets, "eagle3", max_steps=steps, eval_every=2, checkpoint_every=0)
    config["eval"]["num_prompts"] = 0
    config.update(output_dir=str(tmp_path / name), **top)
    recipe = TrainRecipe(load(TrainConfig, write_recipe(tmp_path / f"{name}.yaml", config)))
    recipe.setup()
    recipe.train()
    recipe.cleanup()
    return read_log(tmp_path / name, "eval")


def held_out(record: dict, prefix: str = "") -> dict:
    return {k.removeprefix(prefix): v for k, v in record.items()
            if k in (f"{prefix}loss", f"{prefix}implied_acceptance_length") or k.startswith(f"{prefix}acc_")}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A source EAGLE-3 run on counting conversations, its best/ exported for SGLang, and a second prepared folder of
    other conversations (spelling) for the same target."""
    from draftsmith.data.prepared import PrepareConfig, prepare

    root = tmp_path_factory.mktemp("fine-tune")
    old = write_assets(root / "old")
    (root / "new").mkdir()
    with open(root / "new" / "conversations.jsonl", "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in spelling_conversations(40))
    prepare(PrepareConfig(target=old["target"], input=[str(root / "new" / "conversations.jsonl")],
                          out=str(root / "new" / "data"), eval_fraction=0.2, max_length=96))
    new = {"target": old["target"], "prepared": str(root / "new" / "data")}
    evaluations = run(root, "source", old, steps=6)
    assert main(["export", str(root / "source" / "best"), "--format", "sglang", "--out", str(root / "export"),
                 "--verifier", "HuggingFaceTB/tiny-llama"]) == 0
    kept = next(r for r in evaluations if r["step"] == evaluations[-1]["best_step"])  # the validation best/ is from
    return root, old, new, kept


# --------------------------------------------------------------------------- hub ids
def test_a_hub_id_in_the_local_cache_drafts_exactly_as_its_folder_in_eval_and_info(source, hub_cache, capsys):
    root, old, _, _ = source
    snapshot = into_hub_cache(hub_cache, "me/tiny-eagle3", root / "export")
    assert drafter_folder("me/tiny-eagle3") == snapshot and drafter_folder("me/tiny-eagle3@main") == snapshot
    assert drafter_kind("me/tiny-eagle3") == "eagle" and drafter_kind("hybrid:me/tiny-eagle3") == "hybrid"
    from draftsmith.target import load_target

    target = load_target(old["target"])
    prompts = [[5, 6, 7, 8, 9, 10], [40, 41, 42, 43]]
    outputs = {}
    for spec in ("me/tiny-eagle3", str(root / "export")):
        proposer = load_drafter(spec, target)
        runs = [speculative_generate(target, proposer, torch.tensor([p]), DraftShape(length=3), Sampling(), 12)
                for p in prompts]
        outputs[spec] = [(g.tokens, [c.accepted for c in g.cycles]) for g in runs]
    assert outputs["me/tiny-eagle3"] == outputs[str(root / "export")]
    assert main(["info", "me/tiny-eagle3", "--target", old["target"], "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["layout"] == "sglang-eagle3" and facts["target"].startswith(f"{old['target']}: fits")


def test_a_hub_id_that_is_not_in_the_cache_offline_says_where_it_looked_and_what_to_do(hub_cache):
    with pytest.raises(DraftsmithError, match=r"'me/absent' is not a local folder.*not in the Hugging Face cache "
                                              r"\(.*hub\).*HF_HUB_OFFLINE.*hf download me/absent"):
        drafter_kind("me/absent")


def test_an_existing_folder_wins_over_a_hub_id_of_the_same_name(tmp_path, monkeypatch, hub_cache):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "me" / "local").mkdir(parents=True)
    assert drafter_folder("me/local").resolve() == tmp_path / "me" / "local"
    assert str(drafter_folder("runs/x/best")) == "runs/x/best"  # a missing path stays a path, for the caller to report


# --------------------------------------------------------------------------- old and new held-out sets
def test_a_fine_tune_from_a_hub_id_validates_the_old_and_the_new_held_out_sets_side_by_side(source, hub_cache,
                                                                                           tmp_path):
    root, old, new, source_best = source
    into_hub_cache(hub_cache, "me/tiny-eagle3", root / "export")
    evaluations = run(tmp_path, "tuned", new, steps=4, init_from="me/tiny-eagle3",
                      eval={**recipe_dict(new)["eval"], "num_prompts": 0, "also": {"old": old["prepared"]}})
    assert [r["step"] for r in evaluations] == [0, 2, 4]
    # step 0 on the old held-out split is the source's validation that kept best/: the same weights on the same batches
    assert held_out(evaluations[0], "old/") == pytest.approx(held_out(source_best), rel=1e-6, abs=1e-7)
    for record in evaluations:  # both sets at every validation, each with its implied τ
        new_figures, old_figures = held_out(record), held_out(record, "old/")
        assert new_figures.keys() == old_figures.keys() and {"acc_0", "acc_2", "loss"} <= new_figures.keys()
        for figures in (new_figures, old_figures):
            accuracies = [figures[f"acc_{i}"] for i in range(3)]
            assert figures["implied_acceptance_length"] == pytest.approx(implied_acceptance_length(accuracies))
    assert evaluations[-1]["loss"] < evaluations[0]["loss"]  # it learns the new data
    assert evaluations[0]["loss"] != evaluations[0]["old/loss"]  # two sets, not one twice


def test_a_held_out_set_name_that_cannot_be_logged_is_refused(tmp_path):
    config = recipe_dict({"target": "t", "prepared": "p"})
    config["eval"]["also"] = {"a/b": "p"}
    with pytest.raises(DraftsmithError, match="eval.also: 'a/b' cannot name a held-out set"):
        load(TrainConfig, write_recipe(tmp_path / "r.yaml", config))


def test_a_held_out_set_without_an_eval_split_is_refused_naming_it(source, tmp_path):
    from draftsmith.data.prepared import PrepareConfig, prepare

    root, old, _, _ = source
    prepare(PrepareConfig(target=old["target"], input=[str(root / "new" / "conversations.jsonl")],
                          out=str(tmp_path / "all-train"), eval_fraction=0.0, max_length=96))
    with pytest.raises(DraftsmithError, match="eval.also.old: '.*all-train' has no held-out"):
        run(tmp_path, "bad", old, steps=1, eval={**recipe_dict(old)["eval"], "also": {"old": str(tmp_path / "all-train")}})
