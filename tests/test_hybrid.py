"""The hybrid proposer: merged trees, the skip decision, greedy output identical to plain decoding on tiny Llama
and Qwen3 targets and on the real SmolLM2 with a trained-ish EAGLE drafter, and lossless sampling with mixed trees (chi-square)."""

from collections import deque

import pytest
import torch
from test_decoder_sampling import chi2_pvalue, exact_marginals, small_vocab_target
from test_any_drafter import Recorder
from test_eagle_decode import frozen, train_on_own_output
from tiny import tiny_target

from draftsmith.drafters import Draft, DraftShape, Proposer, Sampling, eagle
from draftsmith.drafters.base import accepted_depth
from draftsmith.drafters.hybrid import HybridProposer, best_pass, merge, pass_cost
from draftsmith.drafters.suffix import Candidates, Config, SuffixProposer
from draftsmith.eval import decoder
from draftsmith.eval.decoder import plain_generate, speculative_generate


# --------------------------------------------------------------------------- pieces
def test_merge_shares_common_prefixes():
    suffix = Candidates([5, 6, 7], [-1, 0, 1], [0.9, 0.8, 0.7])
    merged = merge(suffix, Draft(torch.tensor([5, 6, 9, 1])))  # agrees on 5 6, then branches
    assert merged.tokens.tolist() == [5, 6, 7, 9, 1] and merged.parents.tolist() == [-1, 0, 1, 1, 3]
    assert merged.probs is None  # candidates are one-hot in a tree
    inside = merge(suffix, Draft(torch.tensor([5, 6]), probs=torch.rand(2, 10)))
    assert inside.tokens.tolist() == [5, 6, 7] and inside.parents is None and inside.probs is None
    tree = merge(Candidates([], [], []), Draft(torch.tensor([3, 4, 4]), torch.tensor([-1, -1, 0])))
    assert tree.tokens.tolist() == [3, 4, 4] and tree.parents.tolist() == [-1, -1, 0]


def test_accepted_depth_walks_the_committed_path():
    tokens, parents = [5, 8, 6, 7], [-1, -1, 0, 2]  # 5-6-7 and 8
    assert accepted_depth(tokens, parents, [5, 6, 1]) == (2, 3)  # 7 was offered at depth 3 and missed
    assert accepted_depth(tokens, parents, [5, 6, 7, 2]) == (3, 3)  # the whole path: nothing deeper offered
    assert accepted_depth(tokens, parents, [8, 1]) == (1, 1)
    assert accepted_depth(tokens, parents, [2]) == (0, 1)


def test_pass_cost_interpolates_the_measured_curve():
    cost = {1: 1.0, 2: 1.5, 5: 2.1, 9: 2.5}
    assert pass_cost(cost, 2) == 1.5 and pass_cost(cost, 7) == pytest.approx(2.3)
    assert pass_cost(cost, 13) == pytest.approx(2.9)  # beyond: the last slope


def test_the_drafter_runs_only_where_it_pays_at_the_length_and_beside_the_suffix_nodes_that_pay():
    flat = {n: 1.0 + 0.1 * (n - 1) for n in range(1, 20)}
    chain = [-1, 0, 1, 2, 3]

    def kept(scores, expected_drafter, drafter_seconds=0.0, cost=flat, parents=chain):
        plan = best_pass(scores, parents[: len(scores)], [(expected_drafter, 2, drafter_seconds)], cost)
        return None if plan is None else plan[0]

    assert kept([], 2.0) == 0  # no match: the drafter's draft alone
    assert kept([], 2.0, drafter_seconds=3.0) is None and kept([], 0.1) is None  # too slow, too often wrong
    assert kept([0.97, 0.95, 0.93, 0.9], 2.0) is None  # a confident match leaves the drafter little to add
    assert kept([0.3, 0.2], 0.6) == 2  # a weak match and a fair drafter: both, every suffix node
    assert kept([0.3, 0.2], 1.5) == 0  # beside a strong drafter the weak match is not worth its verify time
    # S_1 counts depth-1 nodes only: a second first token leaves the drafter less room than a deeper node does
    assert kept([0.3, 0.3], 0.6) == 2 and kept([0.3, 0.3], 0.6, parents=[-1, -1]) is None
    # (1 + 0.9 + 0.85 + (1 - 0.9) * 1) / t(2 + 1 + 1) beats every other count and the suffix alone: where each node
    # costs a fifth of a pass, the weak tail is dropped beside the drafter
    steep = {n: 1.0 + 0.2 * (n - 1) for n in range(1, 20)}
    assert best_pass([0.9, 0.85, 0.1, 0.05, 0.02], chain, [(1.0, 1, 0.0)], steep) == (2, 0)
    # chains of 1 and 2 on offer (E_d 0.8 and 0.8 + 0.8 * d_2): a second token that is seldom right is not worth
    # its draft time and verify row, one that is mostly right is
    one_or_two = [(0.8, 1, 0.1), (0.8 + 0.8 * 0.1, 2, 0.2)]
    assert best_pass([], [], one_or_two, flat) == (0, 0)
    one_or_two = [(0.8, 1, 0.1), (0.8 + 0.8 * 0.9, 2, 0.2)]
    assert best_pass([], [], one_or_two, flat) == (0, 1)


def test_a_chain_length_costs_what_it_was_measured_at_else_its_nearest_measured_neighbour():
    hybrid = HybridProposer(SuffixProposer(), AlwaysWrong(0))
    assert hybrid._chain_seconds(2) == 0.0  # nothing measured yet
    # the mean, not the median: the rare dear draft (catching up after skipped passes) is part of the cost
    hybrid.length_seconds = {2: [0.02, 0.02, 0.05], 4: [0.05]}
    assert hybrid._chain_seconds(2) == pytest.approx(0.03) and hybrid._chain_seconds(1) == pytest.approx(0.03)
    assert hybrid._chain_seconds(3) == 0.05 and hybrid._chain_seconds(8) == 0.05  # a tie goes to the longer


def test_passes_timed_while_decoding_rescale_the_calibrated_curve_by_their_median_ratio(monkeypatch):
    """A pass is timed from the draft handed over to the next call for a draft; once MEASURED_PASSES are timed the
    calibrated curve is scaled by the median of timed over calibrated, pooled over every size: its shape stays the
    calibration's, and one size timed in a slow spell moves no cost on its own."""
    from draftsmith.drafters import DecodeState
    from draftsmith.drafters import hybrid as module

    monkeypatch.setattr(module, "MEASURED_PASSES", 4)

    clock = [0.0]
    monkeypatch.setattr(module.time, "perf_counter", lambda: clock[0])
    hybrid = HybridProposer(SuffixProposer(), AlwaysWrong(0), verify_cost={1: 1.0, 2: 1.0, 3: 2.0})
    state = DecodeState(torch.tensor([[1, 2, 3, 4, 5, 6, 7]]))  # nothing repeats: no suffix candidates
    assert hybrid.cost() == {1: 1.0, 2: 1.0, 3: 2.0}  # nothing timed yet
    for seconds in (1.5, 1.5, 1.5, 1.5):
        draft = hybrid.propose(state, DraftShape(1), Sampling())  # the drafter's chain of 1: a pass of 2 tokens
        assert len(draft) == 1
        clock[0] += seconds  # the decoder verifies
    assert hybrid.cost() == {1: 1.0, 2: 1.0, 3: 2.0}  # three timed passes: not enough yet
    hybrid.propose(state, DraftShape(1), Sampling())
    assert hybrid.cost() == pytest.approx({1: 1.5, 2: 1.5, 3: 3.0})  # timed 1.5x the calibration: all scaled
    hybrid.reset()  # the gap across requests (prefill) is no pass
    clock[0] += 100.0
    hybrid.propose(state, DraftShape(1), Sampling())
    assert hybrid.cost() == pytest.approx({1: 1.5, 2: 1.5, 3: 3.0})
    assert hybrid.describe()["pass_ms_timed"] == {2: 1500.0}
    assert hybrid.describe()["pass_ms_calibrated"] == {1: 1000.0, 2: 1000.0, 3: 2000.0}  # reports show both
    assert hybrid.describe()["pass_scale"] == 1.5
    hybrid.pass_seconds[2].extend([1.5] * 4)
    hybrid.pass_seconds[1] = deque([4.0] * 4)  # MEASURED_PASSES plain passes in a slow spell: the median holds
    assert hybrid.cost() == pytest.approx({1: 1.5, 2: 1.5, 3: 3.0})
    untimed = HybridProposer(SuffixProposer(), AlwaysWrong(0), verify_cost={1: 1.0, 2: 1.0}, timed=False)
    for _ in range(6):
        untimed.propose(state, DraftShape(1), Sampling())
        clock[0] += 1.0
    assert untimed.cost() == {1: 1.0, 2: 1.0} and untimed.pass_seconds == {}


# --------------------------------------------------------------------------- greedy: identical to plain
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_hybrid_greedy_equals_plain_and_skips_the_drafter_on_some_passes(arch):
    target = frozen(tiny_target(arch))
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(30)  # a peaked target that repeats itself
    torch.manual_seed(0)
    prompt = torch.tensor([[257, 40, 41, 42, 43, 40, 41, 42, 44, 40, 41]])
    plain = plain_generate(target, prompt, Sampling(), 40, eos=set()).tokens
    drafter = train_on_own_output(target, eagle.create(eagle.Config(ttt_steps=3), target), prompt, plain[:20])
    # seconds per pass: one extra draft node costs a tenth of a pass; the tiny drafter's milliseconds are nothing
    # (passes are not timed: the plan reads this curve as it is)
    cost = {n: 1.0 + 0.1 * (n - 1) for n in range(1, 24)}
    for shape in (DraftShape(4), DraftShape(tree=(4, 3, 10))):
        hybrid = HybridProposer(SuffixProposer(), drafter.proposer(target), verify_cost=cost, timed=False)
        result = speculative_generate(target, hybrid, prompt, shape, Sampling(), 40, eos=set())
        assert result.tokens == plain
        passes = hybrid.passes
        assert passes["drafter"] + passes["merged"] > 0 and passes["suffix"] > 0, passes
        assert sum(passes.values()) == len(result.cycles)
        assert sum(c.accepted for c in result.cycles) > 10
    # without a cost curve the drafter runs every pass, merged with the suffix candidates where there are some
    hybrid = HybridProposer(SuffixProposer(), drafter.proposer(target))
    assert speculative_generate(target, hybrid, prompt, DraftShape(4), Sampling(), 40, eos=set()).tokens == plain
    assert hybrid.passes["merged"] > 0 and set(hybrid.passes) <= {"merged", "drafter"}


class AlwaysWrong(Proposer):
    """A drafter whose every draft is a token the target never emits."""

    required_layers: list[int] = []

    def __init__(self, token: int):
        self.token, self.calls = token, 0

    def reset(self) -> None:
        pass

    def describe(self) -> dict:
        return {"kind": "always-wrong"}

    def propose(self, state, shape, sampling):
        self.calls += 1
        return Draft(torch.full((shape.length,), self.token))


HALF_A_PASS = {n: 1.0 + 0.5 * (n - 1) for n in range(1, 24)}
"""a verify-cost curve where each drafted node costs half a pass"""


def missing_everywhere(new_tokens: int):
    """A tiny Llama target, a prompt with repeats for the suffix, plain decoding's `new_tokens` tokens after it, and a
    drafter that always proposes a token the target never emits there."""
    target = frozen(tiny_target("llama"))
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(30)
    prompt = torch.tensor([[257, 40, 41, 42, 43, 40, 41, 42, 44, 40, 41]])
    plain = plain_generate(target, prompt, Sampling(), new_tokens, eos=set()).tokens
    wrong = AlwaysWrong(next(t for t in range(target.vocab_size) if t not in plain and t not in prompt[0]))
    return target, prompt, plain, wrong


def test_a_request_where_the_drafter_misses_stops_running_it_whatever_earlier_requests_say():
    """The skip decision reads this request's own acceptance (earlier requests' rate only as its start): a drafter
    that was right on earlier requests and misses every draft here runs a few passes, then only as a probe, at
    least PROBE_EVERY skipped passes apart; the output stays plain's."""
    from draftsmith.drafters.hybrid import PROBE_EVERY

    target, prompt, plain, wrong = missing_everywhere(120)
    hybrid = HybridProposer(SuffixProposer(), wrong, verify_cost=HALF_A_PASS, drafter_length=2, timed=False)
    hybrid.by_depth = [[95, 100], [90, 95]]  # earlier requests: a drafter right 95% of the time
    result = speculative_generate(target, hybrid, prompt, DraftShape(4), Sampling(), 120, eos=set())
    assert result.tokens == plain
    probes = (len(result.cycles) - 8) // (PROBE_EVERY + 1)  # the most there can be
    assert len(result.cycles) > 2 * PROBE_EVERY and 2 <= wrong.calls <= 8 + probes + 1, (wrong.calls, hybrid.passes)
    hybrid.reset()  # the next request starts from the rate over all requests, now lowered by this one's misses
    assert hybrid.by_depth[0][1] == 100 + wrong.calls and hybrid.request_by_depth == []


def test_each_missed_probe_doubles_the_passes_to_the_next_and_a_hit_resets_them():
    """A drafter that misses everywhere: after its first few drafts it runs only as a probe, after PROBE_EVERY
    skipped passes, then 2x and 4x that, then every PROBE_LIMIT (each probe catches up on every skipped token, so on
    text the drafter never gets right each one is a loss); a probe with a token accepted brings the gap back."""
    from draftsmith.drafters.hybrid import PROBE_EVERY, PROBE_LIMIT

    target, prompt, plain, wrong = missing_everywhere(1000)
    hybrid = HybridProposer(SuffixProposer(), wrong, verify_cost=HALF_A_PASS, drafter_length=2, timed=False)
    at = []  # the pass at which each draft of the drafter was made
    propose = wrong.propose
    wrong.propose = lambda *args: (at.append(sum(hybrid.passes.values())), propose(*args))[1]
    result = speculative_generate(target, hybrid, prompt, DraftShape(4), Sampling(), 1000, eos=set())
    assert result.tokens == plain
    gaps = [later - earlier for earlier, later in zip(at, at[1:]) if later - earlier > 1]
    expected = [min(PROBE_EVERY * 2**i, PROBE_LIMIT) + 1 for i in range(len(gaps))]
    assert len(gaps) >= 4 and gaps == expected, (at, gaps)  # 17, 33, 65, 65, ...

    hybrid.probes.wait = PROBE_LIMIT
    hybrid.remember_draft(3, [7, 9], [-1, 0], note=True)  # a probe whose first token the target then commits
    hybrid._learn([1, 2, 3, 7, 5])
    assert hybrid.probes.wait == PROBE_EVERY


def test_on_the_real_target_the_hybrid_decodes_what_plain_decoding_does(smollm2):
    """SmolLM2 with an EAGLE-3 drafter fitted to part of its own output: chains and trees, with the measured cost
    curve deciding when the drafter runs and without one (it runs every pass), give plain decoding's tokens."""
    target = frozen(smollm2)  # the drafter learns; the target never does
    code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
    chat = [{"role": "user", "content": "Add a docstring to each function:\n" + code}]
    prompt = torch.tensor([target.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                                return_dict=True)["input_ids"]])  # it copies the code
    plain = plain_generate(target, prompt, Sampling(), 32, eos=set()).tokens
    torch.manual_seed(0)
    drafter = train_on_own_output(target, eagle.create(eagle.Config(ttt_steps=2), target), prompt, plain[:16], steps=10)
    calibrated = HybridProposer(SuffixProposer(), drafter.proposer(target), drafter_length=2)
    calibrated.calibrate(target, 6)
    for hybrid, shape in ((calibrated, DraftShape(6)), (calibrated, DraftShape(tree=(3, 2, 6))),
                          (HybridProposer(SuffixProposer(), drafter.proposer(target)), DraftShape(3))):
        hybrid.passes.clear()
        result = speculative_generate(target, hybrid, prompt, shape, Sampling(), 32, eos=set())
        assert result.tokens == plain, (shape, hybrid.passes)
    # without a curve the drafter runs every pass: merged trees where the suffix matched, its own chain elsewhere
    assert hybrid.passes["merged"] > 0 and set(hybrid.passes) <= {"merged", "drafter"}, hybrid.passes
    assert sum(c.accepted for c in result.cycles) > 5


def test_a_short_drafter_chain_beside_the_whole_length_of_suffix_candidates():
    """drafter_length: the drafter drafts chains of its own length while suffix candidates run to the draft length;
    greedy output stays plain's."""
    target = frozen(tiny_target("llama"))
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(30)
    prompt = torch.tensor([[257, 40, 41, 42, 43, 40, 41, 42, 44, 40, 41]])
    plain = plain_generate(target, prompt, Sampling(), 30, eos=set()).tokens
    spy = Recorder(eagle.create(eagle.Config(ttt_steps=2), target).proposer(target))
    hybrid = HybridProposer(SuffixProposer(Config(adaptive=False)), spy, drafter_length=2)  # the drafter every pass
    sent = Recorder(hybrid)
    result = speculative_generate(target, sent, prompt, DraftShape(6), Sampling(), 30, eos=set())
    assert result.tokens == plain
    assert spy.shapes and {shape.length for shape in spy.shapes} == {2}
    assert max(len(draft) for draft in sent.drafts) > 2  # the suffix candidates run longer than the drafter's chains
    assert hybrid.describe()["drafter_length"] == 2
    assert HybridProposer(SuffixProposer(), spy).drafter_shape(DraftShape(6)).length == 6
    tree = DraftShape(tree=(3, 2, 6))
    assert HybridProposer(SuffixProposer(), spy, drafter_length=2).drafter_shape(tree) == tree
    with pytest.raises(ValueError, match="drafter_length"):
        HybridProposer(SuffixProposer(), spy, drafter_length=0)


# --------------------------------------------------------------------------- sampling: lossless with mixed trees
def random_eagle(target):
    drafter = eagle.create(eagle.Config(layers=[0, 1, 2]), target)
    with torch.no_grad():  # q must differ from p for a wrong rule to show
        for parameter in drafter.parameters():
            if parameter.dtype.is_floating_point:
                parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(3)) * 0.5)
    return drafter.proposer(target, torch.Generator().manual_seed(1))


class SuffixWithDrafterQ(HybridProposer):
    """The bug the point-mass rule prevents: suffix tokens sent as a chain with the drafter's q as their draft
    distribution. They were not drawn from q, so accepting with min(1, p/q) favours them."""

    def propose(self, state, shape, sampling):
        found = self.suffix.candidates(state, shape)
        draft = self.drafter.propose(state, shape, sampling)
        if not found.tokens or draft.probs is None:
            return draft
        kept = min(len(found.tokens), len(draft))
        return Draft(torch.tensor(found.tokens[:kept]), probs=draft.probs[:kept])


CASES = {"chain": (HybridProposer, DraftShape(2)), "tree": (HybridProposer, DraftShape(tree=(2, 2, 4))),
         "broken": (SuffixWithDrafterQ, DraftShape(2))}


@pytest.mark.parametrize("case", ["chain", "tree", pytest.param("broken", marks=pytest.mark.slow)])
def test_hybrid_sampling_matches_plain_end_to_end(case):
    """The drafter runs every pass (no cost curve): passes where the suffix matches send merged one-hot trees, the
    others the EAGLE drafter's own draft (a chain with its q, or its tree)."""
    target = small_vocab_target(0, num_layers=4)
    target.tokenizer = None
    prompt = torch.tensor([[1, 2, 3, 4, 1, 2, 3]])
    sampling = Sampling(1.0)
    p1, p2 = exact_marginals(target, prompt, sampling)
    kind, shape = CASES[case]
    hybrid = kind(SuffixProposer(Config(max_match=3)), random_eagle(target))
    generator = torch.Generator().manual_seed(0)
    runs = [decoder.speculative_generate(target, hybrid, prompt, shape, sampling, 3, set(), generator)
            for _ in range(600)]
    pvalues = chi2_pvalue([r.tokens[1] for r in runs], p1), chi2_pvalue([r.tokens[2] for r in runs], p2)
    if case == "broken":
        assert min(pvalues) < 1e-6
        return
    assert hybrid.passes["merged"] > 300 and hybrid.passes["drafter"] > 300, hybrid.passes
    largest = 2 if shape.tree is None else shape.tree[2]
    merged = sum(1 for r in runs for c in r.cycles if c.drafted > largest)
    assert merged > 100, "merged drafts must branch beyond either source for the test to mean anything"
    assert min(pvalues) > 1e-3


@pytest.mark.parametrize("shape_flags", [["--draft-length", "3"], ["--tree", "3,2,6"]], ids=["chain", "tree"])
def test_eval_command_decodes_with_suffix_and_hybrid_losslessly(tmp_path, shape_flags):
    """`draftsmith eval --drafter suffix` and `--drafter hybrid:FOLDER` (an EAGLE-3 drafter saved as training writes
    it), with a cross-request cache file: every output equals plain decoding, and the cache file is written."""
    import json

    from draftsmith import cli
    from draftsmith.drafters import eagle
    from tiny import byte_tokenizer, tiny_model

    folder = tmp_path / "target"
    tiny_model("llama").save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    from draftsmith.target import load_target

    target = load_target(str(folder))
    eagle.create(eagle.Config(variant="eagle3", ttt_steps=2), target).save_pretrained(tmp_path / "drafter")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("abc abc abc abc", "one two one two one")))
    for drafter in ("suffix", f"hybrid:{tmp_path / 'drafter'}"):
        out = tmp_path / drafter.split(":")[0]
        code = cli.main(["eval", "--target", str(folder), "--drafter", drafter, "--prompts", str(prompts),
                         "--num-prompts", "2", "--max-new-tokens", "12", "--out", str(out), "--no-transformers-baseline",
                         "--suffix-cache-tokens", "1000", "--suffix-cache-file", str(out / "cache.bin"), *shape_flags])
        assert code == 0
        results = json.loads((out / "results.json").read_text())
        assert results["lossless"] == {"checked": 2, "identical": 2}, drafter
        assert (out / "cache.bin").is_file()
    assert cli.main(["eval", "--target", str(folder), "--drafter", "hybrid:prompt-lookup", "--prompts", str(prompts),
                     "--out", str(tmp_path / "x")]) == 2
    if "--tree" in shape_flags:
        return
    short = ["eval", "--target", str(folder), "--prompts", str(prompts), "--num-prompts", "2", "--max-new-tokens", "12",
             "--draft-length", "5", "--hybrid-drafter-length", "2", "--no-transformers-baseline"]
    assert cli.main([*short, "--drafter", f"hybrid:{tmp_path / 'drafter'}", "--out", str(tmp_path / "short")]) == 0
    results = json.loads((tmp_path / "short" / "results.json").read_text())
    assert results["drafter"]["drafter_length"] == 2 and results["lossless"] == {"checked": 2, "identical": 2}
    assert cli.main([*short, "--drafter", "suffix", "--out", str(tmp_path / "y")]) == 2  # a hybrid's option only


def test_a_recipe_reports_drafter_suffix_and_hybrid_side_by_side(tmp_path):
    """report.methods: the final report decodes with best/ alone, suffix matching alone and the hybrid of both,
    each lossless, and writes the table that sets them side by side."""
    import json

    import yaml

    from draftsmith import cli
    from test_train import recipe_dict, write_assets

    assets = write_assets(tmp_path / "assets")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"count from {k}"}) + "\n" for k in (3, 11)))
    recipe = recipe_dict(assets, "eagle3", max_steps=2, checkpoint_every=2, eval_every=2)
    recipe["report"] = {"num_prompts": 2, "prompts": str(prompts), "max_new_tokens": 10, "draft_length": 3,
                        "suffix_length": 5, "transformers_baseline": False, "methods": ["drafter", "suffix", "hybrid"],
                        "suffix_cache_tokens": 64}
    recipe["output_dir"] = str(tmp_path / "run")
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert cli.main(["train", str(tmp_path / "recipe.yaml")]) == 0
    for method in ("drafter", "suffix", "hybrid"):
        results = json.loads((tmp_path / "run" / "eval" / method / "results.json").read_text())
        assert results["lossless"] == {"checked": 2, "identical": 2}, method
    lengths = {method: json.loads((tmp_path / "run" / "eval" / method / "results.json").read_text())["config"]
               for method in ("drafter", "suffix", "hybrid")}  # suffix candidates of 5 beside the drafter's 3
    assert [lengths[m]["draft_length"] for m in ("drafter", "suffix", "hybrid")] == [3, 5, 5]
    assert [lengths[m]["hybrid_drafter_length"] for m in ("drafter", "suffix", "hybrid")] == [0, 0, 3]
    assert [lengths[m]["suffix_cache_tokens"] for m in ("drafter", "suffix", "hybrid")] == [0, 64, 64]
    caches = {m: json.loads((tmp_path / "run" / "eval" / m / "results.json").read_text())["drafter"]
              for m in ("suffix", "hybrid")}  # the first prompt's output went into the cache before the second
    assert caches["suffix"]["cache"]["documents"] >= 1 and caches["hybrid"]["suffix"]["cache"]["documents"] >= 1
    table = (tmp_path / "run" / "eval" / "methods.md").read_text()
    assert all(f"| {method} |" in table for method in ("drafter", "suffix", "hybrid"))
