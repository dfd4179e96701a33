"""DSpark (DFlash variant): the loss by hand, the Markov walk, the confidence cut as a stopping rule read off the
verify-cost curve, lossless greedy decoding with and without the cut, training, saving, errors."""

import pytest
import torch
from test_dflash import batch_for, by_hand, frozen, make, train_with_the_loop
from test_losses import by_hand as by_hand_loss
from tiny import tiny_target

from draftsmith import cost
from draftsmith.config import build
from draftsmith.drafters import DecodeState, DraftShape, Sampling, dflash, kind_module
from draftsmith.errors import DraftsmithError
from draftsmith.eval.decoder import plain_generate, speculative_generate


def dspark(target, **options):
    return make(target, variant="dspark", markov_rank=8, **options)


def state_of(target, drafter, tokens):
    features = target.forward(tokens[:, :-1], layers=drafter.required_layers, logits=False).features
    return DecodeState(tokens, features)


def test_loss_adds_the_markov_bias_of_the_previous_token_and_the_confidence_bce(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = dspark(target, block_size=4, num_layers=1, gamma=2.0, confidence_weight=0.5)
    batch = batch_for(target, drafter)
    ids = batch["input_ids"]
    anchors = torch.tensor([[4, 9], [6, 12]])
    value, metrics = drafter(batch, target.head, anchors=anchors)
    with torch.no_grad():
        p = torch.softmax(target.model(ids).logits.float(), -1)
        context = torch.cat([batch["features"][i] for i in drafter.layer_ids], -1)
        ce, bce, hits = {k: [] for k in (1, 2, 3)}, {k: [] for k in (1, 2, 3)}, {k: [] for k in (1, 2, 3)}
        for row, anchor in [(0, 4), (0, 9), (1, 6), (1, 12)]:
            block = torch.tensor([int(ids[row, anchor])] + [drafter.mask_token_id] * 3)
            hidden = by_hand(drafter, target, context[row, :anchor], block, anchor)
            for k in (1, 2, 3):
                prev = ids[row, anchor + k - 1]  # the block token before k: the anchor, then the data's
                emb = drafter.markov_w1.weight[prev]
                log_q = torch.log_softmax(hidden[k] @ target.model.lm_head.weight.T + drafter.markov_w2.weight @ emb, -1)
                hit = float(log_q.argmax() == p[row, anchor + k - 1].argmax())
                c = torch.cat([hidden[k], emb]) @ drafter.confidence.weight[0] + drafter.confidence.bias[0]
                ce[k].append(by_hand_loss("forward_kl", p[row, anchor + k - 1], log_q))
                bce[k].append(-(hit * torch.log(torch.sigmoid(c)) + (1 - hit) * torch.log(1 - torch.sigmoid(c))))
                hits[k].append(hit)
        total = sum(torch.exp(torch.tensor(-(k - 1) / 2.0)) * torch.stack(ce[k]).mean()
                    + 0.5 * torch.stack(bce[k]).mean() for k in (1, 2, 3))
    torch.testing.assert_close(value, total, rtol=1e-4, atol=1e-5)
    for k in (1, 2, 3):
        assert metrics[f"acc_{k - 1}"] == pytest.approx(sum(hits[k]) / len(hits[k]))
        assert metrics[f"confidence_loss_{k - 1}"] == pytest.approx(float(torch.stack(bce[k]).mean()), rel=1e-4)


def test_greedy_drafts_walk_the_block_with_the_bias_of_the_token_drafted_before(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = dspark(target, block_size=5)
    with torch.no_grad():
        drafter.markov_w2.weight.mul_(200)  # a bias strong enough to change the drafts
    tokens = torch.tensor([[257, 5, 6, 7, 8, 9]])
    state = state_of(target, drafter, tokens)
    proposer = drafter.proposer(target)
    base = proposer.block_logits(state)
    draft = proposer.propose(state, DraftShape(length=4), Sampling()).tokens.tolist()
    prev, expected = 9, []
    for k in range(4):
        prev = int((base[k] + drafter.markov_w2.weight @ drafter.markov_w1.weight[prev]).argmax())
        expected.append(prev)
    assert draft == expected
    assert draft != base.argmax(-1).tolist()  # the bias did change something, so the walk was tested


def set_confidence(drafter, probability):
    """A confidence head that says `probability` everywhere."""
    with torch.no_grad():
        drafter.confidence.weight.zero_()
        drafter.confidence.bias.fill_(float(torch.logit(torch.tensor(probability))))


@pytest.mark.parametrize("probability", [0.05, 0.3, 0.6, 0.95])
def test_the_cut_is_the_cost_curves_best_length_for_the_confidence(tiny_qwen3, probability):
    target = frozen(tiny_qwen3)
    drafter = dspark(target, block_size=8)
    set_confidence(drafter, probability)
    curve = {1: 1.0, 2: 1.5, 3: 1.55, 4: 1.6, 5: 1.9, 6: 1.95, 7: 2.0, 8: 2.4}  # jumps, as a CPU's does
    proposer = drafter.proposer(target)
    proposer.verify_cost = curve
    state = state_of(target, drafter, torch.tensor([[257, 5, 6, 7, 8, 9]]))
    drafted = len(proposer.propose(state, DraftShape(length=7), Sampling()))
    assert drafted == cost.best_length([probability**k for k in range(1, 8)], curve)
    assert proposer.describe()["confidence_cut"] is True


def test_without_a_cost_curve_or_with_the_cut_off_the_whole_block_is_drafted(tiny_qwen3):
    target = frozen(tiny_qwen3)
    state_tokens = torch.tensor([[257, 5, 6, 7, 8, 9]])
    for drafter, curve in ((dspark(target, block_size=6), None),
                           (dspark(target, block_size=6, confidence_cut=False), {n: float(n) for n in range(1, 7)})):
        set_confidence(drafter, 0.01)
        proposer = drafter.proposer(target)
        proposer.verify_cost = curve
        assert len(proposer.propose(state_of(target, drafter, state_tokens), DraftShape(length=5), Sampling())) == 5


def test_the_stopping_rule_never_looks_at_the_token_it_decides_on(tiny_qwen3):
    """Whether position k is drafted is decided from the confidences of positions 1..k, the k-th computed from the
    token drafted at k-1, before x_k exists: the heads run once past the last kept token, and never on it."""
    target = frozen(tiny_qwen3)
    drafter = dspark(target, block_size=8)
    proposer = drafter.proposer(target)
    proposer.verify_cost = {n: 1.0 + 0.3 * (n > 1) + 0.05 * n for n in range(1, 9)}
    state = state_of(target, drafter, torch.tensor([[257, 5, 6, 7, 8, 9]]))
    said = [4.0, 4.0, 4.0, -6.0, 4.0, 4.0, 4.0]  # confident, then not at position 4
    seen, original = [], drafter.markov

    def scripted(hidden, prev):
        bias, _ = original(hidden, prev)
        seen.append(int(prev))
        return bias, torch.tensor(said[len(seen) - 1])

    drafter.markov = scripted
    draft = proposer.propose(state, DraftShape(length=7), Sampling()).tokens.tolist()
    assert len(draft) == 3
    assert seen == [9] + draft  # position 4's confidence came from x_3; x_4 was never drafted


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("cut", [False, True])
def test_greedy_decoding_is_token_identical_to_the_plain_loop(arch, cut):
    target = frozen(tiny_target(arch))
    drafter = dspark(target, block_size=6)
    proposer = drafter.proposer(target)
    if cut:
        proposer.calibrate(target)  # the real curve of this target
        with torch.no_grad():
            drafter.confidence.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(1))
    prompt = torch.tensor([[257, 5, 6, 7, 8, 9]])
    plain = plain_generate(target, prompt, Sampling(), 40, eos=set()).tokens
    spec = speculative_generate(target, proposer, prompt, DraftShape(length=5), Sampling(), 40, eos=set())
    assert spec.tokens == plain
    if not cut:
        assert all(cycle.drafted == 5 for cycle in spec.cycles[:-1])


def test_a_dspark_folder_round_trips_and_loads_calibrated(tiny_qwen3, tmp_path):
    target = frozen(tiny_qwen3)
    drafter = dspark(target, block_size=4)
    batch = batch_for(target, drafter)
    drafter.save_pretrained(tmp_path / "d")
    loaded = kind_module("dflash").Drafter.from_pretrained(tmp_path / "d", target)
    assert loaded.dspark and loaded.config.markov_rank == 8
    torch.testing.assert_close(loaded.loss(batch, target.head)[0], drafter.loss(batch, target.head)[0])
    from draftsmith.eval.runner import load_drafter

    proposer = load_drafter(str(tmp_path / "d"), target)
    assert cost.calibrated(proposer.verify_cost, 3)  # the runner measured the curve the cut reads


def test_bad_input_names_the_key():
    with pytest.raises(DraftsmithError, match="drafter.variant must be dflash or dspark"):
        build(dflash.Config, {"variant": "dspeed"}, prefix="drafter.")
    with pytest.raises(DraftsmithError, match="drafter.markov_rank must be at least 1"):
        build(dflash.Config, {"variant": "dspark", "markov_rank": 0}, prefix="drafter.")
    with pytest.raises(DraftsmithError, match="drafter.confidence_weight must be >= 0"):
        build(dflash.Config, {"variant": "dspark", "confidence_weight": -1}, prefix="drafter.")


def test_the_training_loop_trains_a_dspark_drafter_and_logs_its_confidence(tmp_path):
    target, log = train_with_the_loop(tmp_path, variant="dspark", markov_rank=8)
    assert log[-1]["loss"] < 0.6 * log[0]["loss"]
    assert {"confidence_0", "confidence_loss_2"} <= set(log[0])
    start = dflash.create(dflash.Config(variant="dspark", markov_rank=8, block_size=4), target)
    trained = dflash.load_proposer(tmp_path / "run" / "best", target).drafter
    assert not torch.equal(start.markov_w2.weight, trained.markov_w2.weight)  # the Markov head learned
