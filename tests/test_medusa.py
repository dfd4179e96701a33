"""Medusa-1 heads: the loss by hand, what a chain drafts, lossless greedy decoding, frozen target, errors."""

import hashlib

import pytest
import torch

from draftsmith.config import build
from draftsmith.drafters import DecodeState, DraftShape, Sampling, kind_module, medusa
from draftsmith.errors import DraftsmithError
from draftsmith.eval.decoder import plain_generate, speculative_generate
from test_losses import by_hand as by_hand_loss
from tiny import tiny_target


def frozen(target):
    target.model.requires_grad_(False)
    return target


def make(target, **options):
    drafter = medusa.create(medusa.Config(**options), target)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # unlike the initialisation (W = 0, head = lm_head), so a wrong index shows
        for parameter in drafter.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return drafter


def batch_for(target, length=16):
    ids = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[:, :4] = 0
    features = target.forward(ids, layers=[target.num_layers - 1], logits=False).features
    return {"input_ids": ids, "loss_mask": mask, "attention_mask": torch.ones_like(ids), "features": features}


def weights_hash(model) -> str:
    return hashlib.sha256(b"".join(t.numpy().tobytes() for _, t in sorted(model.state_dict().items()))).hexdigest()


def train_steps(drafter, target, steps: int) -> dict:
    """A few AdamW steps of the drafter's trainable weights on one batch; the last metrics."""
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-2)
    batch = batch_for(target)
    for _ in range(steps):
        loss, metrics = drafter.loss(batch, target.head)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return metrics


def by_hand(drafter, i, normed):
    """Head i written out: n ResBlocks x + SiLU(Wx + b), then the projection."""
    x = normed
    for layer in drafter.blocks[i].layers:
        x = x + torch.nn.functional.silu(x @ layer.linear.weight.T + layer.linear.bias)
    return x @ drafter.lm_heads[i].weight.T


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl", "lk_hybrid"])
def test_loss_equals_the_definition_computed_by_hand(tiny_qwen3, loss):
    target = frozen(tiny_qwen3)
    drafter = make(target, num_heads=3, num_layers=2, loss=loss)
    batch = batch_for(target)
    value, metrics = drafter.loss(batch, target.head)
    with torch.no_grad():
        out = target.model(batch["input_ids"], output_hidden_states=True)
        normed, p = out.hidden_states[-1], torch.softmax(out.logits.float(), -1)  # after the final norm
        total = 0.0
        for i in range(3):
            log_q = torch.log_softmax(by_hand(drafter, i, normed), -1)
            n = 16 - 2 - i  # index t predicts x_{t+2+i}, learned from position 4 on: t >= 2 - i
            head_loss = by_hand_loss(loss, p[:, 1 + i : 1 + i + n], log_q[:, :n])[:, 2 - i :]
            total = total + 0.8**i * head_loss.mean()
            hits = (log_q[:, :n].argmax(-1) == p[:, 1 + i : 1 + i + n].argmax(-1))[:, 2 - i :]
            assert metrics[f"acc_{i}"] == pytest.approx(float(hits.float().mean()))
            assert metrics[f"top5_{i}"] >= metrics[f"acc_{i}"]
    torch.testing.assert_close(value, total, rtol=1e-4, atol=1e-5)


def test_a_chain_is_each_heads_choice_at_the_feature_before_the_last_token(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = make(target, num_heads=4)
    tokens = torch.tensor([257, 5, 6, 7, 8, 9])
    features = target.forward(tokens[None, :-1], layers=[target.num_layers - 1], logits=False).features
    draft = drafter.proposer(target).propose(DecodeState(tokens[None], features), DraftShape(length=3), Sampling())
    with torch.no_grad():
        normed = target.model(tokens[None], output_hidden_states=True).hidden_states[-1][0, -2]
        expected = [int(by_hand(drafter, i, normed).argmax()) for i in range(3)]
    assert draft.tokens.tolist() == expected


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_greedy_decoding_is_token_identical_to_the_plain_loop(arch):
    target = frozen(tiny_target(arch))
    drafter = make(target, num_heads=4)
    prompt = torch.tensor([[257, 5, 6, 7, 8, 9]])
    plain = plain_generate(target, prompt, Sampling(), 32, eos=set()).tokens
    spec = speculative_generate(target, drafter.proposer(target), prompt, DraftShape(length=4), Sampling(), 32, eos=set())
    assert spec.tokens == plain


def test_training_moves_the_heads_only_and_the_folder_round_trips(tiny_qwen3, tmp_path):
    target = frozen(tiny_qwen3)
    before = weights_hash(target.model)
    drafter = medusa.create(medusa.Config(num_heads=2), target)
    assert torch.equal(drafter.lm_heads[1].weight, target.model.lm_head.weight)
    train_steps(drafter, target, 3)
    assert weights_hash(target.model) == before
    assert not torch.equal(drafter.lm_heads[1].weight, target.model.lm_head.weight)
    drafter.save_pretrained(tmp_path / "d")
    loaded = kind_module("medusa").Drafter.from_pretrained(tmp_path / "d", target)
    assert sorted(loaded.state_dict()) == sorted(drafter.state_dict())  # heads only: no target parts stored
    batch = batch_for(target)
    torch.testing.assert_close(loaded.loss(batch, target.head)[0], drafter.loss(batch, target.head)[0])


def test_bad_options_name_the_key(tiny_qwen3):
    with pytest.raises(DraftsmithError, match="drafter.num_heads must be at least 1"):
        build(medusa.Config, {"num_heads": 0}, prefix="drafter.")
    with pytest.raises(DraftsmithError, match="drafter.top_k"):
        build(medusa.Config, {"top_k": 0}, prefix="drafter.")


def test_trees_hold_each_heads_top_choices_and_decode_losslessly(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = make(target, num_heads=3)
    tokens = torch.tensor([257, 5, 6, 7, 8, 9])
    features = target.forward(tokens[None, :-1], layers=[target.num_layers - 1], logits=False).features
    draft = drafter.proposer(target).propose(DecodeState(tokens[None], features), DraftShape(tree=(3, 2, 6)), Sampling())
    assert len(draft) == 6 and bool((draft.parents < torch.arange(6)).all())
    feature = features[target.num_layers - 1][0, -1]
    for node in range(len(draft)):
        depth, at = 0, node
        while at >= 0:
            depth, at = depth + 1, int(draft.parents[at])
        top = drafter.head(depth - 1, feature).topk(2).indices.tolist()  # a depth-d node is head d-1's pick
        assert int(draft.tokens[node]) in top
    prompt = tokens[None]
    plain = plain_generate(target, prompt, Sampling(), 24, eos=set()).tokens
    spec = speculative_generate(target, drafter.proposer(target), prompt, DraftShape(tree=(3, 2, 6)), Sampling(), 24,
                                eos=set())
    assert spec.tokens == plain


def test_the_medusa_export_is_vllms_layout_and_round_trips(tiny_qwen3, tmp_path):
    import json

    from safetensors.torch import load_file

    from draftsmith.export import export, medusa as medusa_export

    target = frozen(tiny_qwen3)
    drafter = make(target, num_heads=2, num_layers=2)
    drafter.save_pretrained(tmp_path / "best")
    out = export(tmp_path / "best", "medusa", tmp_path / "out", verifier="Qwen/Qwen3-0.6B")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
    assert (config["num_heads"], config["num_hidden_layers"], config["medusa_fc_bias"]) == (2, 2, True)
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["blocks.1.layers.1.bias"].shape == (64,) and tensors["lm_heads.0.weight"].shape == (320, 64)
    ours = drafter.state_dict()
    assert torch.equal(tensors["blocks.1.layers.0.weight"], ours["blocks.1.layers.0.linear.weight"])
    assert '"method": "medusa"' in (out / "README.md").read_text()
    # what vLLM would build differently fails the validator: a bias it would not load
    config["medusa_fc_bias"] = False
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match="blocks.0.layers.0.bias: not a parameter"):
        medusa_export.validate(out)


# --------------------------------------------------------------------------- the static tree
def test_the_static_tree_is_the_best_tree_of_its_size():
    import itertools

    accuracy = torch.tensor([[0.6, 0.2, 0.1], [0.5, 0.25, 0.05], [0.4, 0.3, 0.1]])
    tree = medusa.static_tree(accuracy, 10)
    assert len(tree) == 10 and len(set(tree)) == 10
    assert all(p[:-1] in tree[:i] for i, p in enumerate(tree) if len(p) > 1)  # parents come first
    value = {p: float(torch.tensor([accuracy[d, r] for d, r in enumerate(p)]).prod())
             for n in (1, 2, 3) for p in itertools.product(range(3), repeat=n)}
    best = sorted(value.values(), reverse=True)
    for size in (3, 6, 10):  # every prefix holds the most expected acceptance any tree of that size can
        assert sum(value[p] for p in tree[:size]) == pytest.approx(sum(best[:size]))
    assert tree[:4] == [(0,), (0, 0), (1,), (0, 1)]  # 0.6, 0.3, 0.2, 0.15 (then (0, 0, 0) at 0.12)


def test_validation_figures_give_the_folder_a_tree_that_decodes_losslessly(tiny_qwen3, tmp_path):
    import json

    target = frozen(tiny_qwen3)
    drafter = make(target, num_heads=3, top_k=3, tree_nodes=7)
    assert drafter.static_tree() is None  # nothing measured yet: trees are EAGLE-2's dynamic ones
    drafter.eval()
    _, metrics = drafter.loss(batch_for(target), target.head)
    assert {f"hit_{i}_{r}" for i in range(3) for r in range(3)} <= set(metrics)
    assert metrics["top3_1"] == pytest.approx(sum(metrics[f"hit_1_{r}"] for r in range(3)))
    drafter.use_held_out(metrics)
    drafter.save_pretrained(tmp_path / "d")
    saved = json.loads((tmp_path / "d" / medusa.TREE_FILE).read_text())
    assert len(saved["paths"]) == 7 and saved["rank_accuracy"][2][1] == pytest.approx(metrics["hit_2_1"])
    proposer = medusa.load_proposer(tmp_path / "d", target)
    assert [tuple(p) for p in saved["paths"]] == proposer.static and proposer.describe()["tree"] == "static"
    tokens = torch.tensor([257, 5, 6, 7, 8, 9])
    features = target.forward(tokens[None, :-1], layers=[target.num_layers - 1], logits=False).features
    draft = proposer.propose(DecodeState(tokens[None], features), DraftShape(tree=(3, 3, 7)), Sampling())
    feature = features[target.num_layers - 1][0, -1]
    for node, path in enumerate(proposer.static):  # node (r_1..r_d) = head d-1's rank-r_d choice under its parent
        ranked = proposer.drafter.head(len(path) - 1, feature).topk(3).indices
        assert int(draft.tokens[node]) == int(ranked[path[-1]])
        assert int(draft.parents[node]) == (proposer.static.index(path[:-1]) if len(path) > 1 else -1)
    prompt = tokens[None]
    plain = plain_generate(target, prompt, Sampling(), 24, eos=set()).tokens
    assert speculative_generate(target, proposer, prompt, DraftShape(tree=(3, 3, 7)), Sampling(), 24, eos=set()).tokens == plain


def test_a_tree_budget_below_the_head_count_is_refused():
    with pytest.raises(DraftsmithError, match="drafter.tree_nodes=2 is smaller than drafter.num_heads=4"):
        build(medusa.Config, {"num_heads": 4, "tree_nodes": 2}, prefix="drafter.")


# --------------------------------------------------------------------------- Medusa-2
def medusa2(target, **options):
    """Medusa-2 heads with every trained weight perturbed (adapters' B too, so they act); the base copy untouched."""
    drafter = medusa.create(medusa.Config(num_heads=2, lora_rank=4, **options), target)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            if not name.startswith("tuned.") or "lora_" in name:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return drafter


def test_medusa2_trains_adapters_and_heads_and_leaves_the_target_unchanged(tiny_qwen3):
    target = frozen(tiny_qwen3)
    before = weights_hash(target.model)
    drafter = medusa2(target)
    trainable = {name for name, p in drafter.named_parameters() if p.requires_grad}
    assert any("lora_A" in name for name in trainable) and "lm_heads.0.weight" in trainable
    assert not any(name.startswith("tuned.") and "lora_" not in name for name in trainable)  # base copy frozen
    assert drafter.lr_scale("lm_heads.0.weight") == 4.0 and drafter.lr_scale(next(n for n in trainable if "lora_B" in n)) == 1.0
    lora = {n: p.detach().clone() for n, p in drafter.named_parameters() if "lora_" in n}
    metrics = train_steps(drafter, target, 2)
    assert {"distill", "agree", "acc_0", "acc_1"} <= set(metrics)
    assert all(not torch.equal(p, lora[n]) for n, p in drafter.named_parameters() if "lora_" in n)
    assert weights_hash(target.model) == before


def test_medusa2_loss_is_the_heads_on_the_tuned_states_plus_distillation(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = medusa2(target, distill_weight=0.5)
    batch = batch_for(target)
    value, _ = drafter.loss(batch, target.head)
    with torch.no_grad():
        tuned = drafter.tuned(batch["input_ids"], output_hidden_states=True)
        normed, log_tuned = tuned.hidden_states[-1], torch.log_softmax(tuned.logits.float(), -1)
        p = torch.softmax(target.model(batch["input_ids"]).logits.float(), -1)  # the frozen target's
        total = 0.5 * -(p[:, 3:15] * log_tuned[:, 3:15]).sum(-1).mean()  # positions whose next token is learned
        for i in range(2):
            n = 16 - 2 - i
            log_q = torch.log_softmax(by_hand(drafter, i, normed), -1)
            total = total + 0.8**i * by_hand_loss("forward_kl", p[:, 1 + i : 1 + i + n], log_q[:, :n])[:, 2 - i :].mean()
    torch.testing.assert_close(value, total, rtol=1e-4, atol=1e-5)


def test_medusa2_merged_target_equals_the_unmerged_forward_and_verifies_losslessly(tiny_qwen3, tmp_path):
    target = frozen(tiny_qwen3)
    drafter = medusa2(target)
    ids = torch.tensor([[257, 5, 6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        unmerged = drafter.tuned(ids).logits
        original = target.model(ids).logits
    assert not torch.allclose(unmerged, original, atol=1e-4)  # the adapters do change the target
    drafter.save_pretrained(tmp_path / "d")
    stored = set(load_tensors(tmp_path / "d"))
    assert any("lora_A" in n for n in stored) and not any("tuned." in n and "lora_" not in n for n in stored)
    proposer = medusa.load_proposer(tmp_path / "d", target)
    verifier = proposer.verifier
    with torch.no_grad():
        torch.testing.assert_close(verifier.model(ids).logits, unmerged, rtol=1e-4, atol=1e-5)
    assert proposer.describe()["variant"] == "medusa2"
    plain = plain_generate(verifier, ids, Sampling(), 24, eos=set()).tokens
    for shape in (DraftShape(length=2), DraftShape(tree=(2, 2, 4))):
        assert speculative_generate(verifier, proposer, ids, shape, Sampling(), 24, eos=set()).tokens == plain


def load_tensors(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_eval_verifies_medusa2_with_the_tuned_target_and_reports_the_drift(tiny_qwen3, tmp_path):
    from draftsmith.eval.prompts import Prompt
    from draftsmith.eval.report import markdown
    from draftsmith.eval.runner import compare

    target = frozen(tiny_qwen3)
    drafter = medusa2(target)
    drafter.save_pretrained(tmp_path / "d")
    proposer = medusa.load_proposer(tmp_path / "d", target)
    prompts = [Prompt(f"p{i}", [257, 5 + i, 6, 7, 8, 9]) for i in range(3)]
    results = compare(target, proposer, prompts, DraftShape(length=2), Sampling(), 12, transformers_baseline=False,
                      progress=False)
    assert results["lossless"] == {"checked": 3, "identical": 3}  # against the tuned target's plain output
    drift = results["tuned_target"]
    original = [plain_generate(target, torch.tensor([p.token_ids]), Sampling(), 12, eos=set()).tokens for p in prompts]
    tuned = [plain_generate(proposer.verifier, torch.tensor([p.token_ids]), Sampling(), 12, eos=set()).tokens
             for p in prompts]
    assert drift["identical_to_original"] == sum(a == b for a, b in zip(tuned, original)) and drift["checked"] == 3
    assert "verified by" in markdown(results)


def test_medusa2_on_modules_peft_cannot_find_is_one_clear_error(tiny_qwen3, tmp_path):
    with pytest.raises(DraftsmithError, match="drafter.lora_target_modules=\\['no_such_proj'\\]"):
        medusa.create(medusa.Config(lora_rank=4, lora_target_modules=["no_such_proj"]), frozen(tiny_qwen3))
    medusa.create(medusa.Config(num_heads=1, lora_rank=2), frozen(tiny_qwen3)).save_pretrained(tmp_path / "d")
    with pytest.raises(DraftsmithError, match="needs their target"):
        medusa.Drafter.from_pretrained(tmp_path / "d")


def test_the_medusa2_export_carries_the_tuned_target_that_loads_by_path(tmp_path):
    from transformers import AutoModelForCausalLM

    from draftsmith.export import export
    from draftsmith.target import load_target
    from tiny import save_target

    target = frozen(load_target(save_target(tiny_target("qwen3"), tmp_path / "target")))
    drafter = medusa2(target)
    drafter.save_pretrained(tmp_path / "best")
    out = export(tmp_path / "best", "medusa", tmp_path / "out")
    assert sorted(load_tensors(out)) == sorted(n.replace(".linear.", ".") for n in drafter.state_dict()
                                               if n.startswith(("blocks.", "lm_heads.")))
    loaded = AutoModelForCausalLM.from_pretrained(out / "target")
    ids = torch.tensor([[257, 5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, drafter.tuned(ids).logits, rtol=1e-4, atol=1e-5)
    card = (out / "README.md").read_text()
    assert "the tuned target verifies" in card and f"{out}/target" in card


def test_the_draftsmith_format_copies_the_folder_exactly_and_decodes_the_same(tiny_qwen3, tmp_path):
    from draftsmith.export import export

    target = frozen(tiny_qwen3)
    drafter = make(target, num_heads=2, top_k=2, tree_nodes=4)
    drafter.use_held_out({"hit_0_0": 0.5, "hit_0_1": 0.2, "hit_1_0": 0.4, "hit_1_1": 0.1})
    drafter.save_pretrained(tmp_path / "best")
    out = export(tmp_path / "best", "draftsmith", tmp_path / "out", verifier="Qwen/Qwen3-0.6B")
    assert (out / medusa.TREE_FILE).read_bytes() == (tmp_path / "best" / medusa.TREE_FILE).read_bytes()
    assert "draftsmith eval --target Qwen/Qwen3-0.6B" in (out / "README.md").read_text()
    prompt = torch.tensor([[257, 5, 6, 7, 8, 9]])
    shape = DraftShape(tree=(2, 2, 4))
    runs = [speculative_generate(target, medusa.load_proposer(folder, target), prompt, shape, Sampling(), 16, eos=set())
            for folder in (tmp_path / "best", out)]
    assert runs[0].tokens == runs[1].tokens and [c.accepted for c in runs[0].cycles] == [c.accepted for c in runs[1].cycles]
    (out / "model.safetensors").write_bytes(b"broken")
    with pytest.raises(DraftsmithError, match="differs from the checkpoint in model.safetensors"):
        from draftsmith.export import native

        native.validate(out, tmp_path / "best", ["config.json", "model.safetensors"])


# --------------------------------------------------------------------------- a draft vocabulary
def draft_vocab(size=64, vocab=320, seed=0):
    from draftsmith.data.vocab import DraftVocab

    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:size].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return DraftVocab(ids - torch.arange(size), t2d, 1.0)


def test_heads_over_a_draft_vocabulary_train_on_the_renormalised_target_and_draft_only_its_tokens(tiny_qwen3):
    target = frozen(tiny_qwen3)
    vocab = draft_vocab()
    ids = vocab.target_ids()
    drafter = medusa.create(medusa.Config(num_heads=2), target, vocab)
    assert drafter.lm_heads[0].weight.shape == (64, 64)
    assert torch.equal(drafter.lm_heads[1].weight, target.model.lm_head.weight[ids])  # init: the target's rows
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    batch = batch_for(target)
    value, metrics = drafter.loss(batch, target.head)
    with torch.no_grad():
        out = target.model(batch["input_ids"], output_hidden_states=True)
        normed, logits = out.hidden_states[-1], out.logits.float()
        p = torch.softmax(logits[..., ids], -1)  # the target's distribution renormalised over the draft rows
        total = 0.0
        for i in range(2):
            n = 16 - 2 - i
            log_q = torch.log_softmax(by_hand(drafter, i, normed), -1)
            total = total + 0.8**i * by_hand_loss("forward_kl", p[:, 1 + i : 1 + i + n], log_q[:, :n])[:, 2 - i :].mean()
            hits = (ids[log_q[:, :n].argmax(-1)] == logits[:, 1 + i : 1 + i + n].argmax(-1))[:, 2 - i :]  # full argmax
            assert metrics[f"acc_{i}"] == pytest.approx(float(hits.float().mean()))
    torch.testing.assert_close(value, total, rtol=1e-4, atol=1e-5)
    tokens = torch.tensor([[257, 5, 6, 7, 8, 9]])
    features = target.forward(tokens[:, :-1], layers=[target.num_layers - 1], logits=False).features
    proposer = drafter.proposer(target)
    chain = proposer.propose(DecodeState(tokens, features), DraftShape(length=2), Sampling())
    sampled = proposer.propose(DecodeState(tokens, features), DraftShape(length=2), Sampling(temperature=1.0))
    tree = proposer.propose(DecodeState(tokens, features), DraftShape(tree=(2, 3, 5)), Sampling())
    for draft in (chain, sampled, tree):
        assert bool(vocab.t2d[draft.tokens].all())  # never a token outside the draft vocabulary
    assert float(sampled.probs[:, ~vocab.t2d].sum()) == 0.0
    plain = plain_generate(target, tokens, Sampling(), 24, eos=set()).tokens
    for shape in (DraftShape(length=2), DraftShape(tree=(2, 3, 5))):
        assert speculative_generate(target, proposer, tokens, shape, Sampling(), 24, eos=set()).tokens == plain


def test_a_draft_vocabulary_exports_as_full_vocabulary_heads_that_draft_what_ours_draft(tiny_qwen3, tmp_path):
    """vLLM 0.32 loads Medusa heads only at the full vocabulary (a truncated head fails its load-time shape assert):
    row token_map[i] is our row i, every other row the mean of those, so the argmax over the whole vocabulary is the
    token our argmax over the draft rows gives; draftsmith reads the heads back exactly, and the older layout too."""
    import json

    from safetensors.torch import load_file, save_file

    from draftsmith.export import export, medusa as medusa_export, readers

    target = frozen(tiny_qwen3)
    vocab = draft_vocab()
    drafter = medusa.create(medusa.Config(num_heads=2), target, vocab)
    drafter.save_pretrained(tmp_path / "best")
    loaded = medusa.Drafter.from_pretrained(tmp_path / "best", target)
    assert torch.equal(loaded.token_map, vocab.target_ids())
    out = export(tmp_path / "best", "medusa", tmp_path / "out", verifier="Qwen/Qwen3-0.6B")
    config = json.loads((out / "config.json").read_text())
    assert (config["vocab_size"], config["truncated_vocab_size"], config["draft_vocab_size"]) == (320, 320, 64)
    tensors = load_file(str(out / "model.safetensors"))
    token_map = vocab.target_ids().long()
    assert torch.equal(tensors["token_map"], vocab.target_ids()) and tensors["lm_heads.1.weight"].shape == (320, 64)
    ours = drafter.state_dict()
    hidden = torch.randn(500, 64, generator=torch.Generator().manual_seed(0))
    for h in range(2):
        full, rows = tensors[f"lm_heads.{h}.weight"], ours[f"lm_heads.{h}.weight"]
        assert torch.equal(full[token_map], rows)
        assert torch.equal((hidden @ full.T).argmax(-1), token_map[(hidden @ rows.T).argmax(-1)])
    assert readers.expectations(out).draft_vocab_size == 64
    meta, back = medusa_export.from_format(config, tensors, target.num_layers)
    assert meta["draft_vocab_size"] == 64 and torch.equal(back["lm_heads.0.weight"], ours["lm_heads.0.weight"])
    # the older layout (heads of 64 rows, truncated_vocab_size 64) still reads back as the same heads
    old = {name: (t[token_map] if name.startswith("lm_heads.") else t) for name, t in tensors.items()}
    meta, back = medusa_export.from_format({**config, "truncated_vocab_size": 64}, old, target.num_layers)
    assert meta["draft_vocab_size"] == 64 and torch.equal(back["lm_heads.1.weight"], ours["lm_heads.1.weight"])
    # what vLLM refuses, or could draft differently, fails the validator
    (out / "config.json").write_text(json.dumps({**config, "truncated_vocab_size": 64}))
    with pytest.raises(DraftsmithError, match="truncated_vocab_size 64 < vocab_size 320: vLLM 0.32 .*shape assert"):
        medusa_export.validate(out)
    (out / "config.json").write_text(json.dumps(config))
    outside = next(i for i in range(320) if i not in set(token_map.tolist()))
    changed = tensors["lm_heads.0.weight"].clone()
    changed[outside] += 1.0
    save_file({**tensors, "lm_heads.0.weight": changed}, str(out / "model.safetensors"))
    with pytest.raises(DraftsmithError, match="lm_heads.0.weight: rows outside token_map are not the mean"):
        medusa_export.validate(out)
    del tensors["token_map"]
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(DraftsmithError, match="token_map: missing"):
        medusa_export.validate(out)


def test_the_trainer_gives_medusa2_heads_their_own_learning_rate(tiny_qwen3, tmp_path):
    from draftsmith.config import load
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.recipe import TrainRecipe
    from test_train import memory_data, recipe_dict, reset_accelerate_state, write_recipe

    reset_accelerate_state()
    target = frozen(tiny_qwen3)
    config_dict = recipe_dict({"target": "unused", "prepared": None}, max_steps=1, warmup_steps=0, lr=1e-3)
    config_dict.update(drafter={"kind": "medusa", "num_heads": 2, "lora_rank": 2, "head_lr_scale": 5.0},
                       output_dir=str(tmp_path / "run"), data={"features": "in-memory", "batch_size": 2, "max_length": 48})
    recipe = TrainRecipe(load(TrainConfig, write_recipe(tmp_path / "recipe.yaml", config_dict)),
                         data=memory_data(target, [target.num_layers - 1]), target=target)
    recipe.setup()
    drafter = recipe.accelerator.unwrap_model(recipe.model).drafter
    group_of = {id(p): g for g in recipe.optimizer.param_groups for p in g["params"]}
    for name, parameter in drafter.named_parameters():
        if parameter.requires_grad:
            assert group_of[id(parameter)]["lr"] == pytest.approx(1e-3 * (1.0 if name.startswith("tuned.") else 5.0)), name
    recipe.cleanup()
    reset_accelerate_state()


# --------------------------------------------------------------------------- the confidence cut
def test_the_confidence_cut_stops_at_the_first_head_that_does_not_pay(tiny_qwen3):
    from draftsmith import cost

    target = frozen(tiny_qwen3)
    drafter = make(target, num_heads=4, confidence_cut=True)
    tokens = torch.tensor([257, 5, 6, 7, 8, 9])
    features = target.forward(tokens[None, :-1], layers=[target.num_layers - 1], logits=False).features
    state = DecodeState(tokens[None], features)
    proposer = drafter.proposer(target)
    full = proposer.propose(state, DraftShape(length=4), Sampling()).tokens.tolist()
    assert len(full) == 4  # no cost curve yet: nothing to cut by
    with torch.no_grad():
        normed = target.model(tokens[None], output_hidden_states=True).hidden_states[-1][0, -2]
        confidences = [float(torch.softmax(by_hand(drafter, i, normed), -1).max()) for i in range(4)]
    for curve in ({n: 1.0 for n in range(1, 6)}, {1: 1.0, 2: 1.02, 3: 1.5, 4: 1.6, 5: 1.7},
                  {n: float(n) for n in range(1, 6)}):
        proposer.verify_cost = curve
        rule, expected = cost.StoppingRule(curve, 4), 0
        while expected < 4 and rule.keep(confidences[expected]):
            expected += 1
        draft = proposer.propose(state, DraftShape(length=4), Sampling()).tokens.tolist()
        assert draft == full[:expected]
    proposer.verify_cost = {n: 1.0 for n in range(1, 6)}  # free verification: every head pays
    assert len(proposer.propose(state, DraftShape(length=4), Sampling())) == 4
    proposer.verify_cost = {n: float(n) for n in range(1, 6)}  # each token costs a full pass: none pays
    assert len(proposer.propose(state, DraftShape(length=4), Sampling())) == 0
    assert proposer.describe()["confidence_cut"] is True


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_greedy_decoding_with_the_confidence_cut_is_token_identical_to_the_plain_loop(arch):
    target = frozen(tiny_target(arch))
    drafter = make(target, num_heads=4, confidence_cut=True)
    proposer = drafter.proposer(target)
    proposer.calibrate(target)  # this target's own curve
    prompt = torch.tensor([[257, 5, 6, 7, 8, 9]])
    plain = plain_generate(target, prompt, Sampling(), 32, eos=set()).tokens
    assert speculative_generate(target, proposer, prompt, DraftShape(length=4), Sampling(), 32, eos=set()).tokens == plain


def test_eval_turns_the_cut_on_for_a_medusa_folder_and_refuses_it_where_there_are_no_confidences(tiny_qwen3, tmp_path):
    from draftsmith.drafters import draft_lm
    from draftsmith.eval.runner import load_drafter

    target = frozen(tiny_qwen3)
    make(target, num_heads=2).save_pretrained(tmp_path / "heads")
    proposer = load_drafter(str(tmp_path / "heads"), target, confidence_cut=True)
    assert proposer.confidence_cut and set(proposer.verify_cost) == {1, 2, 3}  # measured at load: t(1..heads+1)
    assert not load_drafter(str(tmp_path / "heads"), target).confidence_cut  # the folder's own setting (off)
    draft_lm.create(draft_lm.Config(num_layers=1), target).save_pretrained(tmp_path / "draft-lm")
    with pytest.raises(DraftsmithError, match="no confidences to cut its drafts by"):
        load_drafter(str(tmp_path / "draft-lm"), target, confidence_cut=True)


@pytest.mark.parametrize("form", ["narrow", "packed", "onednn"])
def test_medusa2_evaluates_and_reports_whatever_form_the_targets_linear_layers_took(form, tiny_qwen3, tmp_path,
                                                                                  monkeypatch):
    """Eval routes the target's linear layers (small_batch) before it loads the drafter, and Medusa-2's proposer
    deep-copies that target: with each form forced on every row count, `draftsmith eval` and the recipe's report
    run, lossless (oneDNN's reordered weights once made the copy raise on AMX CPUs)."""
    from draftsmith import small_batch
    from draftsmith.config import load
    from draftsmith.eval.command import EvalConfig, evaluate_and_report
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.pipeline import final_report

    if form in small_batch.REORDERED and not small_batch.REORDERED[form][0](small_batch.linears(tiny_qwen3.model)[0]):
        pytest.skip(f"torch here has no {form} form")
    forced = {n: form for n in [*range(1, small_batch.MAX_ROWS + 1), *small_batch.LONG_ROWS]}
    monkeypatch.setattr(small_batch, "tune", lambda model, max_rows=small_batch.MAX_ROWS: {
        "rows": forced, "linear_ms": {}, "seconds": 0.0})
    target = frozen(tiny_qwen3)
    medusa2(target).save_pretrained(tmp_path / "run" / "best")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(f'{{"prompt": "count {k} {k} {k}"}}\n' for k in range(3)))
    config = EvalConfig(target="unused", drafter=str(tmp_path / "run" / "best"), out=str(tmp_path / "eval"),
                        prompts=str(prompts), num_prompts=3, max_new_tokens=10, transformers_baseline=False)
    results = evaluate_and_report(config, target=target)
    assert results["lossless"] == {"checked": 3, "identical": 3}
    assert set(results["environment"]["small_batch_linear_rows"].values()) == {form}
    recipe = load(TrainConfig, "recipes/smollm2-135m/medusa2.yaml", [
        f"output_dir={tmp_path / 'run'}", f"report.prompts={prompts}", "report.num_prompts=2",
        "report.max_new_tokens=8", "report.transformers_baseline=false"])
    assert final_report(recipe, target)["lossless"] == {"checked": 2, "identical": 2}
    assert small_batch.installed_rows(target.model) == {}  # the report leaves the target as it came
