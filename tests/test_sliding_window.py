"""Targets whose layers attend over a sliding window (Mistral, Gemma 3, Qwen with `layer_types`): chains and trees
verify and roll back on them exactly as plain decoding of the target reads its context."""

from pathlib import Path

import pytest
import torch
from test_decoder import PROMPT, Rigged, random_tree, reference
from test_decoder_sampling import chi2_pvalue, exact_marginals
from tiny import tiny_target

from draftsmith.drafters import DecodeState, DraftShape, Sampling
from draftsmith.drafters.draft_lm import DraftLM
from draftsmith.eval import decoder
from draftsmith.eval.verify import tree_layout
from draftsmith.kv_cache import attention_windows, rollback_cache, tree_attention_mask

GREEDY = Sampling()
WINDOW = 4  # far shorter than PROMPT (11 tokens) plus the answers: every pass reads past a window
SLIDING = {
    "mistral": {"sliding_window": WINDOW},  # every layer slides
    "qwen3": {"sliding_window": WINDOW, "use_sliding_window": True,
              "layer_types": ["sliding_attention", "full_attention"] * 4},
    "gemma3_text": {"sliding_window": WINDOW},  # five sliding layers to one full
}


def sliding_target(arch: str, seed: int = 0, **extra):
    return tiny_target(arch, seed=seed, **{**SLIDING[arch], **extra})


@pytest.fixture(params=list(SLIDING))
def target(request):
    return sliding_target(request.param)


def test_the_windows_are_read_from_the_config(target):
    windows = attention_windows(target.config)
    assert windows["sliding_attention"] == WINDOW
    assert ("full_attention" in windows) == (target.config.model_type != "mistral")
    cache = rollback_cache(target.config)
    assert cache.layers and not any(getattr(layer, "is_sliding", False) for layer in cache.layers)


def test_a_tree_pass_sees_what_each_layers_window_shows_and_rolls_back_exactly(target):
    """Every node's logits equal a from-scratch run of the model (its own sliding masks, no cache) over the prefix and
    the node's ancestors; after keeping one path, the next pass equals a from-scratch run too."""
    generator = torch.Generator().manual_seed(3)
    committed = PROMPT
    cache = rollback_cache(target.config)
    target.forward(committed[:, :-1], cache=cache)
    past = committed.shape[1] - 1
    tokens, parents = random_tree(12, generator, target.vocab_size)
    inputs = torch.cat([committed[:, -1:], tokens[None]], dim=1)
    out = decoder.tree_forward(target, inputs, parents, past, cache, layers=[7])
    sees, _ = tree_layout(parents)
    assert int(sees.sum(1).max()) > 2  # paths deep enough for the window to cut inside the tree too
    for node in range(13):
        path = inputs[0, sees[node]]
        scratch = target.forward(torch.cat([committed[0, :-1], path])[None], layers=[7])
        torch.testing.assert_close(out.logits[0, node], scratch.logits[0, -1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.features[7][0, node], scratch.features[7][0, -1], atol=1e-4, rtol=1e-4)
    leaf = int(sees.sum(1).argmax())
    path = sees[leaf].nonzero().flatten()
    decoder.keep_cache(cache, past, path)
    kept = torch.cat([committed[0, :-1], inputs[0, path]])
    follow = torch.tensor([[5, 6, 7]])
    step = target.forward(follow, cache=cache)
    torch.testing.assert_close(step.logits, target.forward(torch.cat([kept[None], follow], 1)).logits[:, -3:],
                               atol=1e-4, rtol=1e-4)


def test_the_mask_without_the_window_is_wrong_there(target):
    """The check above can fail: a tree mask that ignores the window gives other logits on a sliding target."""
    generator = torch.Generator().manual_seed(3)
    cache = rollback_cache(target.config)
    target.forward(PROMPT[:, :-1], cache=cache)
    past = PROMPT.shape[1] - 1
    tokens, parents = random_tree(6, generator, target.vocab_size)
    inputs = torch.cat([PROMPT[:, -1:], tokens[None]], dim=1)
    sees, depth = tree_layout(parents)
    full = tree_attention_mask(sees, past, target.dtype)  # no windows: every cached position visible
    out = target.forward(inputs, cache=cache, attention_mask=full, position_ids=(past + depth)[None])
    scratch = target.forward(PROMPT)
    assert not torch.allclose(out.logits[0, 0], scratch.logits[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("shape", [DraftShape(4), DraftShape(tree=(3, 2, 9))], ids=["chain4", "tree"])
@pytest.mark.parametrize("agree", ["always", "sometimes"])
def test_greedy_speculative_equals_plain_on_a_sliding_window_target(target, shape, agree):
    max_new = 23
    full = reference(target, max_new + 8)  # plain decoding with the model's own sliding-window cache
    out = decoder.speculative_generate(target, Rigged(full, agree, target.vocab_size), PROMPT, shape, GREEDY,
                                       max_new, eos=set())
    assert out.tokens == full[PROMPT.shape[1]:][:max_new]
    assert sum(c.accepted for c in out.cycles) > 0


@pytest.mark.parametrize("arch", list(SLIDING))
def test_a_sliding_window_draft_model_drafts_trees_and_chains_losslessly(arch):
    """The draft model's own cache and tree masks follow its windows too: the target drafting for itself accepts
    every chain; every node of its tree is a top-2 child of its path in a fresh run of the model (its own masks, no
    cache), and trees decode to plain greedy's output."""
    target, twin = sliding_target(arch), sliding_target(arch)
    full = reference(target, 30)[PROMPT.shape[1]:]
    proposer = DraftLM(twin, target.vocab_size)
    chain = decoder.speculative_generate(target, proposer, PROMPT, DraftShape(3), GREEDY, 24, eos=set())
    assert chain.tokens == full[:24] and all(c.accepted == 3 for c in chain.cycles[:-1])
    state = DecodeState(torch.cat([PROMPT, torch.tensor([full[:5]])], 1))  # the cache holds the chain's run: reused
    draft = proposer.propose(state, DraftShape(tree=(3, 2, 8)), GREEDY)
    for node in range(len(draft)):
        path, at = [], node
        while at >= 0:
            path.insert(0, int(draft.tokens[at]))
            at = int(draft.parents[at])
        context = torch.cat([state.tokens[0], torch.tensor(path[:-1], dtype=torch.long)])
        assert path[-1] in twin.forward(context[None]).logits[0, -1].topk(2).indices.tolist()
    tree = decoder.speculative_generate(target, proposer, PROMPT, DraftShape(tree=(3, 2, 8)), GREEDY, 24, eos=set())
    assert tree.tokens == full[:24]


def test_sampled_trees_on_a_sliding_window_target_follow_the_targets_distribution():
    """Chi-square over the second and third sampled tokens of a window-2 target (a window shorter than the prompt)
    with a draft model's trees: the tokens follow plain sampling's marginals, computed by enumeration."""
    options = dict(vocab_size=8, num_layers=2, pad_token_id=0, eos_token_id=None, bos_token_id=None, sliding_window=2)
    target = tiny_target("mistral", seed=0, **options)
    target.model.lm_head.weight.data.mul_(10)
    drafter = DraftLM(tiny_target("mistral", seed=5, **options), 8)
    prompt, sampling = torch.tensor([[1, 2, 3, 4]]), Sampling(1.0)
    p1, p2 = exact_marginals(target, prompt, sampling)
    generator = torch.Generator().manual_seed(0)
    runs = [decoder.speculative_generate(target, drafter, prompt, DraftShape(tree=(2, 2, 4)), sampling, 3, set(),
                                         generator) for _ in range(700)]
    assert sum(c.accepted for run in runs for c in run.cycles) > 100  # the trees are taken, not only corrected
    tokens = [run.tokens for run in runs]
    assert min(chi2_pvalue([t[1] for t in tokens], p1), chi2_pvalue([t[2] for t in tokens], p2)) > 1e-3


def test_the_default_recipe_ends_with_its_report_on_a_sliding_window_base_model(tmp_path, monkeypatch):
    """The README's own-target path on a base model whose layers slide: prepare, capture, train, then a report
    whose hybrid (a tree of suffix and drafter chains) verifies on the sliding-window target, lossless, exit 0."""
    import json

    from test_any_target import text_rows, write_jsonl
    from tiny import base_tokenizer, save_target, tiny_model

    from draftsmith.cli import main
    from draftsmith.target import Target

    model = tiny_model("mistral", bos_token_id=259, eos_token_id=256, pad_token_id=256, sliding_window=WINDOW)
    folder = save_target(Target(model, base_tokenizer(), name="tiny-sliding"), tmp_path / "sliding-base")
    texts = write_jsonl(tmp_path / "texts.jsonl", text_rows(30))
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "# count from 4\n"}, {"prompt": "def count_9():"}])
    more = write_jsonl(tmp_path / "more.jsonl", [{"prompt": "def count_5():"}])
    monkeypatch.chdir(tmp_path)
    recipe = Path(__file__).resolve().parents[1] / "recipes/smollm2-135m/eagle3.yaml"
    overrides = [f"target.name={folder}", f"prepare.input=[{texts}]", "prepare.regenerate=false",
                 "prepare.max_length=64", "prepare.draft_vocab_size=64", "data.max_length=48", "data.batch_size=2",
                 "train.max_steps=4", "train.warmup_steps=1", "train.eval_every=2", "train.checkpoint_every=2",
                 "train.precision=fp32", "eval.batches=1", "eval.num_prompts=1", "eval.max_new_tokens=6",
                 f"report.prompts={prompts}", "report.num_prompts=2", "report.max_new_tokens=12",
                 "report.methods=[drafter,suffix,hybrid]", "tracking.report_to=[]", f"report.also_prompts=[{more}]"]
    assert main(["train", str(recipe), *overrides]) == 0
    for method in ("drafter", "suffix", "hybrid"):
        results = json.loads((tmp_path / f"runs/sliding-base/eagle3/eval/{method}/results.json").read_text())
        assert results["lossless"] == {"checked": 2, "identical": 2}, method
        other = json.loads((tmp_path / f"runs/sliding-base/eagle3/eval/more/{method}/results.json").read_text())
        assert other["lossless"] == {"checked": 1, "identical": 1}, method  # report.also_prompts, in its own folder
