"""Every family that trains from captured features: one training step offline (shards of the recipes' shared
capture) and online (the target run on the batch) gives the same loss and gradients, at the shipped recipe's
drafter settings, on a tiny random target.

The batch is not one the capture made (its samples in another order, so padded to another width), as a
shuffled trainer's batches are not. Tolerances: loss within 1e-4 relative; gradients (every trainable parameter,
flattened) at cosine >= 0.9999 and a difference below 1e-3 of their norm: room for float32 rounding inside a
target that computes a batch of another width otherwise (on this tiny target, one thread, both are exact)"""

import copy
from pathlib import Path

import pytest
import torch

from draftsmith.config import load
from draftsmith.data.capture import FeatureShards, parse_layers, read_manifest
from draftsmith.drafters import kind_module
from draftsmith.errors import DraftsmithError
from draftsmith.train.config import TrainConfig, drafter_config
from draftsmith.train.data import build_training_data, truncate

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m"
OFFLINE_FAMILIES = ["eagle1", "medusa1", "mtp", "mtp-shared", "dflash", "dspark", "draft-lm"]
BATCH = [5, 0, 17]  # not a group the capture ran: another padded width than any capture batch


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny target saved as a folder, its prepared data (with a draft vocabulary) and a features folder that
    every family's test shares, as the recipes share runs/{target}/features-stdlib."""
    from test_train import write_target_and_conversations

    from draftsmith.data.prepared import PrepareConfig, prepare
    from draftsmith.target import load_target

    root = tmp_path_factory.mktemp("offline-families")
    write_target_and_conversations(root)
    target = load_target(str(root / "target"))
    prepare(PrepareConfig(target=str(root / "target"), input=[str(root / "conversations.jsonl")],
                          out=str(root / "data"), eval_fraction=0.2, max_length=96, draft_vocab_size=24), target=target)
    return {"target": str(root / "target"), "prepared": str(root / "data"), "features": str(root / "features"),
            "target_object": target}


def family_config(family: str, assets: dict, online: bool) -> TrainConfig:
    """The shipped recipe with the tiny target and data; its drafter and data.capture_layers as shipped."""
    config = load(TrainConfig, RECIPES / f"{family}.yaml", [
        f"target.name={assets['target']}", f"data.prepared={assets['prepared']}", f"data.features={assets['features']}",
        f"data.online={'true' if online else 'false'}", "data.batch_size=3", "data.max_length=48",
        "data.capture_dtype=float32", "prepare=null"])
    if config.data.draft_vocab:
        config.data.draft_vocab = assets["prepared"]
    return config


def training_step(drafter, batch: dict, target_head) -> tuple[float, torch.Tensor]:
    """The loss of one training step and the gradient of every trainable parameter, flattened."""
    drafter.train()
    drafter.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # EAGLE-1's feature noise draws the same in both modes
    loss, _ = drafter.loss(batch, target_head)
    loss.backward()
    grads = [p.grad.flatten() for p in drafter.parameters() if p.requires_grad and p.grad is not None]
    return float(loss.detach()), torch.cat(grads)


def batches_both_ways(offline_config: TrainConfig, online_config: TrainConfig, target, layers) -> dict:
    """The batch of samples BATCH as each mode's training data gives it (the offline run captures on first use)."""
    batches = {}
    for mode, config in (("offline", offline_config), ("online", online_config)):
        data = build_training_data(config, target, layers, num_prompts=0)
        assert isinstance(data.train, FeatureShards) == (mode == "offline")
        batch = data.collate([truncate(data.train[i], config.data.max_length) for i in BATCH])
        batch = data.add_features(batch)
        batch["micro_batch"] = 0
        assert sorted(batch["features"]) == sorted(layers)
        batches[mode] = batch
    assert torch.equal(batches["offline"]["input_ids"], batches["online"]["input_ids"])
    assert torch.equal(batches["offline"]["loss_mask"], batches["online"]["loss_mask"])
    return batches


def assert_same_step(drafter, batches: dict, target_head) -> None:
    """One training step on each batch, from the same weights: same loss and gradients (tolerances above)."""
    twin = copy.deepcopy(drafter)
    if getattr(drafter, "target", None) is not None:
        twin.target = drafter.target  # the frozen target is attached, never copied
    offline_loss, offline_grad = training_step(drafter, batches["offline"], target_head)
    online_loss, online_grad = training_step(twin, batches["online"], target_head)
    assert offline_loss == pytest.approx(online_loss, rel=1e-4), (offline_loss, online_loss)
    assert offline_grad.norm() > 0
    cosine = torch.nn.functional.cosine_similarity(offline_grad, online_grad, dim=0)
    assert cosine >= 0.9999, float(cosine)
    assert (offline_grad - online_grad).norm() <= 1e-3 * online_grad.norm()


def fresh_drafter(config: TrainConfig, target, **options):
    """The recipe's drafter (with `options` changed) for the tiny target, seeded."""
    from draftsmith.data.vocab import load_draft_vocab

    kind, parsed = drafter_config({**config.drafter, **options})
    vocab = load_draft_vocab(config.data.draft_vocab, target) if config.data.draft_vocab else None
    torch.manual_seed(0)
    return kind_module(kind).create(parsed, target, vocab)


@pytest.mark.parametrize("family", OFFLINE_FAMILIES)
def test_one_step_offline_equals_the_step_online(family, assets):
    target = assets["target_object"]
    shipped = load(TrainConfig, RECIPES / f"{family}.yaml").data  # ships online, names the shared capture
    assert shipped.features and shipped.capture_layers
    offline_config, online_config = family_config(family, assets, False), family_config(family, assets, True)
    drafter = fresh_drafter(offline_config, target)
    layers = list(drafter.required_layers)
    batches = batches_both_ways(offline_config, online_config, target, layers)
    # one capture serves every family: the recipes' capture_layers, this drafter's layers among them
    captured = read_manifest(Path(assets["features"]))["layers"]
    assert captured == parse_layers(offline_config.data.capture_layers, target) and set(layers) <= set(captured)
    assert_same_step(drafter, batches, target.head)


def test_the_draft_lm_distils_from_stored_top_k_only_when_it_asks_for_top_k(assets, tmp_path):
    """drafter.top_k=K with data.topk_logits=K: the stored top-k (offline) and the kept one (online) give the same
    step. top_k=0 (the recipe's full distribution) ignores top-k logits a shared capture holds: its loss is the one
    from the last layer through the target's head, as online without them."""
    target = assets["target_object"]
    configs = [family_config("draft-lm", assets, online) for online in (False, True)]
    for config in configs:
        config.data.features, config.data.topk_logits = str(tmp_path / "with-top-k"), 4
    drafter = fresh_drafter(configs[0], target, top_k=4)
    batches = batches_both_ways(*configs, target, list(drafter.required_layers))
    assert batches["offline"]["target_topk"]["values"].shape[-1] == 4
    assert_same_step(drafter, batches, target.head)

    full = fresh_drafter(configs[0], target)  # top_k 0
    without = {key: value for key, value in batches["offline"].items() if key != "target_topk"}
    head_passes = []

    def head(features):
        head_passes.append(features.shape[0])
        return target.head(features)

    with torch.no_grad():
        given, _ = full.loss(batches["offline"], head)
        plain, _ = full.loss(without, target.head)
        sparse, _ = drafter.loss(batches["offline"], head)
    assert float(given) == float(plain) and len(head_passes) == 1  # the full distribution: one head pass
    assert float(sparse) != float(plain) and len(head_passes) == 1  # top_k=4 read the stored logits: no head pass


def test_a_shared_capture_without_a_drafters_layer_is_refused(assets, tmp_path):
    """A features folder captured for fewer layers than a family reads is refused before training, naming them."""
    config = family_config("dflash", assets, False)
    config.data.features = str(tmp_path / "last-only")
    config.data.capture_layers = "last"
    target = assets["target_object"]
    build_training_data(config, target, [target.num_layers - 1], num_prompts=0)  # a Medusa-style capture
    kind, options = drafter_config(config.drafter)
    layers = list(kind_module(kind).create(options, target, None).required_layers)
    with pytest.raises(DraftsmithError, match="missing"):
        build_training_data(config, target, layers, num_prompts=0)
