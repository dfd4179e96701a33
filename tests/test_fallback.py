"""Trained drafters fall back towards plain decoding within a request where their acceptance does not pay
(`draftsmith.drafters.fallback`): the length rule for chains, blocks and trees, probes, greedy equality on a real
decode of every kind, and the eval flag (on by default for every trained kind)."""

from __future__ import annotations

import json
import time

import pytest
import torch
from tiny import save_target, tiny_target

from draftsmith.cli import main
from draftsmith.drafters import DecodeState, Draft, DraftShape, Proposer, Sampling, dflash, draft_lm, eagle, medusa, mtp
from draftsmith.drafters.fallback import FIRST_PROBE, LAST_PROBE, RunningAcceptance, tree_nodes
from draftsmith.eval.decoder import plain_generate, speculative_generate

COST = {1: 1.0, 2: 1.3, 3: 1.5, 4: 1.7, 5: 1.9}  # t(n)/t(1) of a CPU-like target: a wider pass costs more


class Scripted(Proposer):
    """A chain proposer that drafts `token` repeated; its first call of a request takes `first_call_s` (a drafter
    reading the prompt in)."""

    required_layers: list = []

    def __init__(self, token: int, first_call_s: float = 0.0):
        self.token, self.first_call_s, self.asked = token, first_call_s, []

    def reset(self):
        self.asked = []

    def propose(self, state, shape, sampling):
        if not self.asked:
            time.sleep(self.first_call_s)
        self.asked.append(shape.length)
        return Draft(torch.full((shape.length,), self.token))

    def describe(self):
        return {"kind": "scripted"}


def drive(proposer: RunningAcceptance, next_token, passes: int) -> list[int]:
    """Run the proposer through `passes` verify passes as the decoder would, committing what a target whose next
    token is `next_token(position)` accepts; returns each pass's draft length."""
    tokens, lengths = [0], []
    proposer.reset()
    for _ in range(passes):
        draft = proposer.propose(DecodeState(torch.tensor([tokens])), DraftShape(4), Sampling()).tokens.tolist()
        lengths.append(len(draft))
        for token in draft:  # accept while the draft is the target's token, then its own token
            if token != next_token(len(tokens)):
                break
            tokens.append(token)
        tokens.append(next_token(len(tokens)))
    return lengths


def test_a_drafter_the_target_always_rejects_falls_back_to_plain_steps_with_spaced_out_probes():
    lengths = drive(RunningAcceptance(Scripted(7), 4, COST), lambda position: 3, passes=120)
    assert lengths[0] == 3  # the optimistic start drafts (4 does not pay for t(5) even at its prior)
    assert lengths[:4] == [3, 1, 1, 0]  # shorter drafts, then none
    probes = [i for i, n in enumerate(lengths) if n and i > lengths.index(0)]
    assert all(lengths[i] == 1 for i in probes)  # a probe drafts one token
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:3] == [2 * FIRST_PROBE + 1, 4 * FIRST_PROBE + 1, LAST_PROBE + 1] and set(gaps[3:]) == {LAST_PROBE + 1}
    assert sum(n > 0 for n in lengths) < 12  # of 120 passes


class Timed(Scripted):
    """Scripted, with each drafted token taking `per_token_s` (a real drafter's forward)."""

    def __init__(self, token: int, per_token_s: float):
        super().__init__(token)
        self.per_token_s = per_token_s

    def propose(self, state, shape, sampling):
        time.sleep(self.per_token_s * shape.length)
        return super().propose(state, shape, sampling)


def test_where_a_wider_pass_costs_no_more_the_drafted_tokens_cost_still_makes_a_rejected_drafter_stop():
    # A CPU's measured curve: t(2) within 4% of t(1); each drafted token takes a tenth of t(1) = 10 ms. Drafting
    # one token that is never accepted costs 1.14 t(1) a token, so the request must go plain, not draft forever
    # against the optimistic prior (which once kept a_1 >= 1.5 / 7 and the request at length 1, 0.88x plain).
    seconds = {1: 0.010, 2: 0.0104, 3: 0.013}
    lengths = drive(RunningAcceptance(Timed(7, 0.001), 2, seconds), lambda position: 3, passes=60)
    assert 0 in lengths[:8] and sum(n > 0 for n in lengths) <= 10
    assert drive(RunningAcceptance(Timed(3, 0.001), 2, seconds), lambda position: 3, passes=20) == [2] * 20


def test_a_drafter_the_target_always_accepts_keeps_the_full_length():
    assert drive(RunningAcceptance(Scripted(3), 4, COST), lambda position: 3, passes=30) == [3] + [4] * 29


def test_a_request_that_turns_predictable_gets_its_drafter_back():
    # rejected for the first 40 positions, then the text is what the drafter drafts
    lengths = drive(RunningAcceptance(Scripted(3), 4, COST), lambda position: 5 if position < 40 else 3, passes=85)
    assert 0 in lengths[:30] and lengths[-5:] == [4] * 5  # a probe was accepted, and the lengths grew back


def test_each_request_starts_afresh():
    proposer = RunningAcceptance(Scripted(7), 4, COST)
    drive(proposer, lambda position: 3, passes=20)
    assert drive(proposer, lambda position: 7, passes=3) == [3, 4, 4]


def test_reading_a_long_prompt_in_is_not_charged_as_draft_time_per_token():
    seconds = {n: 0.01 * cost for n, cost in COST.items()}  # t(1) = 10 ms; the first call takes 50 ms
    lengths = drive(RunningAcceptance(Scripted(3, first_call_s=0.05), 4, seconds), lambda position: 3, passes=6)
    assert lengths == [3, 4, 4, 4, 4, 4]  # charged at 50 ms / 3 tokens, drafting would not pay for t(1) = 10 ms


def test_without_a_cost_curve_it_drafts_the_full_length():
    assert drive(RunningAcceptance(Scripted(7), 4), lambda position: 3, passes=5) == [4] * 5


def test_greedy_output_is_plain_decodings_and_weak_requests_draft_less(tiny_llama):
    drafter = eagle.create(eagle.Config(), tiny_llama)  # untrained: mostly rejected on this target
    plain_proposer = drafter.proposer(tiny_llama)
    wrapped = RunningAcceptance(drafter.proposer(tiny_llama), 3, {n: 1.0 + 0.4 * (n - 1) for n in range(1, 5)})
    prompts = [torch.tensor([[5, 6, 7, 8, 9, 10]]), torch.tensor([[40, 41, 42, 43]])]
    for prompt in prompts:
        plain = plain_generate(tiny_llama, prompt, Sampling(), 24, set()).tokens
        full = speculative_generate(tiny_llama, plain_proposer, prompt, DraftShape(3), Sampling(), 24, set())
        adaptive = speculative_generate(tiny_llama, wrapped, prompt, DraftShape(3), Sampling(), 24, set())
        assert adaptive.tokens == full.tokens == plain
        drafted = [c.drafted for c in adaptive.cycles]
        assert sum(drafted) < sum(c.drafted for c in full.cycles) and 0 in drafted


class ScriptedTree(Scripted):
    """A tree proposer: at every depth `top_k` siblings, `token` first (the rest never right), the first one the
    parent of the next depth's; records each tree's depth."""

    def propose(self, state, shape, sampling):
        depth, top_k, total = shape.tree
        self.asked.append(depth)
        tokens = [self.token + rank for _ in range(depth) for rank in range(top_k)][:total]
        parents = [-1 if i < top_k else (i // top_k - 1) * top_k for i in range(len(tokens))]
        return Draft(torch.tensor(tokens), torch.tensor(parents))


def drive_tree(proposer: RunningAcceptance, next_token, passes: int, tree=(3, 2, 6)) -> list[int]:
    """`drive` for trees: the target walks down the tree while a child is its token; returns each pass's node count."""
    tokens, sizes = [0], []
    proposer.reset()
    for _ in range(passes):
        draft = proposer.propose(DecodeState(torch.tensor([tokens])), DraftShape(tree=tree), Sampling())
        sizes.append(len(draft))
        node, parents = -1, draft.parents.tolist() if len(draft) else []
        while True:
            child = next((i for i, p in enumerate(parents) if p == node and
                          int(draft.tokens[i]) == next_token(len(tokens))), None)
            if child is None:
                break
            tokens.append(int(draft.tokens[child]))
            node = child
        tokens.append(next_token(len(tokens)))
    return sizes


TREE_COST = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.2, 5: 1.3, 7: 1.5}  # t(n)/t(1) at the tree sizes (2, 4, 6 nodes) + 1


def test_a_tree_the_target_always_rejects_shrinks_to_plain_steps_with_depth_one_probes():
    inner = ScriptedTree(7)
    sizes = drive_tree(RunningAcceptance(inner, 4, TREE_COST, tree=(3, 2, 6)), lambda position: 3, passes=80)
    assert inner.asked[0] == 3 and sizes[0] == 6  # the optimistic start drafts the whole tree
    assert 0 in sizes[:10]  # then, its running acceptance below what t(3) = 1.1 t(1) needs, plain steps
    after = sizes[sizes.index(0):]
    assert set(after) == {0, 2} and sum(n > 0 for n in after) < 8  # probes: the depth-1 level, spaced out
    assert set(inner.asked[inner.asked.index(1):]) == {1}


def test_a_tree_the_target_always_accepts_keeps_its_depth_and_a_half_right_one_gets_shallower():
    assert drive_tree(RunningAcceptance(ScriptedTree(3), 4, TREE_COST, tree=(3, 2, 6)), lambda p: 3, 20) == [6] * 20
    # the target takes the first token of each draft and then another: depth 1 pays, deeper levels do not
    inner = ScriptedTree(3)
    drive_tree(RunningAcceptance(inner, 4, TREE_COST, tree=(3, 2, 6)), lambda p: 3 if p % 2 else 5, 30)
    assert inner.asked[0] == 3 and set(inner.asked[-10:]) == {1}


def test_tree_nodes_counts_what_an_eagle2_tree_keeps():
    from draftsmith.drafters.tree import dynamic_tree

    def grow(node_ids, tokens, parents):
        return torch.log_softmax(torch.randn(len(node_ids), 50, generator=torch.Generator().manual_seed(1)), -1)

    root = torch.log_softmax(torch.randn(50), -1)
    for depth, top_k, total in [(1, 3, 10), (2, 3, 10), (3, 3, 30), (4, 2, 9), (5, 4, 8)]:
        assert len(dynamic_tree(root, grow, depth, top_k, total)[0]) == tree_nodes(depth, top_k, total)


class Block(Scripted):
    """A block drafter: one forward (taking `call_s`) drafts every position, whatever the length asked."""

    drafts_in_one_forward = True

    def __init__(self, token: int, call_s: float):
        super().__init__(token)
        self.call_s = call_s

    def propose(self, state, shape, sampling):
        time.sleep(self.call_s)
        return super().propose(state, shape, sampling)


def test_a_block_drafter_is_charged_per_forward_not_per_token():
    # a block drafter's one forward drafts every position: a block of 1 costs what a block of 4 does. Charged per
    # token, as a chain drafter is, a block measured at 4 tokens would make a 1-token block look 4 times cheaper.
    seconds = {n: 0.010 + 0.0002 * (n - 1) for n in range(1, 6)}
    block, chain = RunningAcceptance(Block(3, 0.008), 4, seconds), RunningAcceptance(Timed(3, 0.002), 4, seconds)
    assert drive(block, lambda position: 3, 6) == drive(chain, lambda position: 3, 6) == [4] * 6
    assert block.draft_cost(1) == pytest.approx(block.draft_cost(4)) and 0.008 <= block.draft_cost(1) < 0.03
    assert chain.draft_cost(4) == pytest.approx(4 * chain.draft_cost(1)) and 0.008 <= chain.draft_cost(4) < 0.03
    assert block.draft_cost(0) == chain.draft_cost(0) == 0.0


KINDS = {  # every trained kind, untrained and perturbed: its drafts are mostly rejected on this target
    "eagle3": lambda t: eagle.create(eagle.Config(), t),
    "eagle1": lambda t: eagle.create(eagle.Config(variant="eagle1"), t),
    "peagle": lambda t: eagle.create(eagle.Config(variant="peagle", ttt_steps=3), t),
    "mtp": lambda t: mtp.create(mtp.Config(num_modules=3), t),
    "medusa": lambda t: medusa.create(medusa.Config(num_heads=3), t),
    "dflash": lambda t: dflash.create(dflash.Config(block_size=4, num_target_layers=2), t),
    "dspark": lambda t: dflash.create(dflash.Config(variant="dspark", block_size=4, num_target_layers=2,
                                                    markov_rank=4), t),
    "draft_lm": lambda t: draft_lm.create(draft_lm.Config(num_layers=1), t),
}
SHAPES = {"chain": DraftShape(3), "tree": DraftShape(tree=(3, 2, 4))}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_decodes_greedy_output_exactly_under_the_fallback_and_drafts_less(tiny_llama, kind, shape):
    torch.manual_seed(0)
    drafter = KINDS[kind](tiny_llama)
    with torch.no_grad():  # fresh Medusa heads and draft LMs start from the target's parts: make every kind a poor one
        for parameter in drafter.parameters():
            if parameter.dtype.is_floating_point:
                parameter.add_(torch.randn_like(parameter) * 0.5)
    cost = {n: 1.0 + 0.1 * (n - 1) for n in range(1, 8)}
    full, wrapped = drafter.proposer(tiny_llama), RunningAcceptance(drafter.proposer(tiny_llama), 3, cost,
                                                                   tree=SHAPES[shape].tree)
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10]])
    plain = plain_generate(tiny_llama, prompt, Sampling(), 30, set()).tokens
    whole = speculative_generate(tiny_llama, full, prompt, SHAPES[shape], Sampling(), 30, set())
    adaptive = speculative_generate(tiny_llama, wrapped, prompt, SHAPES[shape], Sampling(), 30, set())
    assert adaptive.tokens == whole.tokens == plain
    drafted = [c.drafted for c in adaptive.cycles]
    assert drafted[0] > 0 and 0 in drafted, "a rejected drafter falls back to plain steps"
    assert sum(drafted) < sum(c.drafted for c in whole.cycles)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("fallback")
    target = tiny_target("llama")
    name = save_target(target, root / "target")
    eagle.create(eagle.Config(), target).save_pretrained(root / "eagle")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("count to ten", "hi")))
    return name, root


def test_eval_falls_back_by_default_for_eagle_chains_and_not_when_told(folders, tmp_path):
    name, root = folders
    args = ["eval", "--target", name, "--drafter", str(root / "eagle"), "--prompts", str(root / "prompts.jsonl"),
            "--num-prompts", "2", "--max-new-tokens", "12", "--no-transformers-baseline", "--no-small-batch-linear"]
    for flags, expected in (([], True), (["--fallback", "false"], False)):
        out = tmp_path / f"eval-{expected}"
        assert main([*args, *flags, "--out", str(out)]) == 0
        results = json.loads((out / "results.json").read_text())
        assert ("fallback" in results["drafter"]) == expected and results["lossless"]["identical"] == 2


def test_eval_falls_back_by_default_for_trees_too(folders, tmp_path):
    name, root = folders
    out = tmp_path / "tree"
    assert main(["eval", "--target", name, "--drafter", str(root / "eagle"), "--tree", "2,2,4", "--prompts",
                 str(root / "prompts.jsonl"), "--num-prompts", "2", "--max-new-tokens", "12",
                 "--no-transformers-baseline", "--no-small-batch-linear", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert "fallback" in results["drafter"] and results["lossless"]["identical"] == 2


@pytest.mark.parametrize("drafter", ["prompt-lookup", "suffix", "hybrid"])
def test_fallback_is_refused_where_lengths_are_not_the_drafters_to_choose(folders, tmp_path, drafter, capsys):
    name, root = folders
    spec = f"hybrid:{root / 'eagle'}" if drafter == "hybrid" else drafter
    assert main(["eval", "--target", name, "--drafter", spec, "--fallback", "true", "--prompts",
                 str(root / "prompts.jsonl"), "--out", str(tmp_path / "e")]) == 2
    assert "--fallback is for trained drafters" in capsys.readouterr().err


def test_one_rule_says_which_drafters_fall_back_by_default(folders):
    from draftsmith.eval.command import EvalConfig, falls_back
    from draftsmith.eval.runner import falls_back_by_default

    name, root = folders
    assert falls_back_by_default(str(root / "eagle")) and falls_back_by_default("hf:some/model")
    assert not any(falls_back_by_default(spec) for spec in ("prompt-lookup", "suffix", f"hybrid:{root / 'eagle'}"))
    config = EvalConfig(target=name, drafter=str(root / "eagle"), out="o")
    assert falls_back(config) and not falls_back(EvalConfig(target=name, drafter=str(root / "eagle"), out="o",
                                                            save_traces=True))
    assert not falls_back(EvalConfig(target=name, drafter=str(root / "eagle"), out="o", fallback=False))
