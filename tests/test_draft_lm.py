"""The distilled draft LM: its losses, what stays frozen, the plain transformers folder it saves, trees."""

import json
import subprocess
import sys

import pytest
import torch

from draftsmith.drafters import DecodeState, DraftShape, Sampling, draft_lm
from draftsmith.errors import DraftsmithError
from draftsmith.eval.decoder import plain_generate, speculative_generate
from test_losses import by_hand as by_hand_loss
from tiny import save_target, tiny_target


def frozen(target):
    target.model.requires_grad_(False)
    return target


def batch_for(target, drafter, batch=2, length=16, seed=0):
    ids = torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[:, :4] = 0  # a prompt that is not learned
    features = target.forward(ids, layers=drafter.required_layers, logits=False).features
    return {"input_ids": ids, "loss_mask": mask, "attention_mask": torch.ones_like(ids), "features": features}


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl", "jsd", "tv", "lk", "lk_hybrid"])
def test_loss_equals_the_definition_computed_by_hand(tiny_llama, loss):
    target = frozen(tiny_llama)
    drafter = draft_lm.create(draft_lm.Config(num_layers=2, loss=loss), target)
    batch = batch_for(target, drafter)
    value, metrics = drafter.loss(batch, target.head)
    q = torch.softmax(drafter.model(batch["input_ids"]).logits[:, 3:-1].float(), -1)  # positions 3..14 predict the learned tokens 4..15
    p = torch.softmax(target.model(batch["input_ids"]).logits[:, 3:-1].float(), -1)
    expected = by_hand_loss(loss, p, q.log()).mean()
    torch.testing.assert_close(value, expected, rtol=1e-4, atol=1e-5)
    agreement = (q.argmax(-1) == p.argmax(-1)).float().mean()
    assert metrics["acc_0"] == pytest.approx(float(agreement))


def test_top_k_distillation_and_data_cross_entropy(tiny_llama):
    target = frozen(tiny_llama)
    drafter = draft_lm.create(draft_lm.Config(num_layers=2, top_k=5, ce_weight=0.5), target)
    batch = batch_for(target, drafter)
    value, _ = drafter.loss(batch, target.head)
    log_q = torch.log_softmax(drafter.model(batch["input_ids"]).logits[:, 3:-1].float(), -1)
    top, indices = target.model(batch["input_ids"]).logits[:, 3:-1].float().topk(5, -1)
    p = torch.softmax(top, -1)
    distilled = (p * (p.log() - log_q.gather(-1, indices))).sum(-1)  # forward_kl: KL over the target's top 5
    ce = -log_q.gather(-1, batch["input_ids"][:, 4:, None])[..., 0]
    torch.testing.assert_close(value, (distilled + 0.5 * ce).mean(), rtol=1e-4, atol=1e-5)


def test_truncated_init_copies_the_target_and_training_moves_only_the_layers(tiny_llama):
    target = frozen(tiny_llama)
    drafter = draft_lm.create(draft_lm.Config(num_layers=3), target)
    source = target.model.state_dict()
    assert all(torch.equal(t, source[name]) for name, t in drafter.model.state_dict().items())
    assert drafter.model.config.num_hidden_layers == 3
    before = {name: t.clone() for name, t in drafter.model.state_dict().items()}
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-2)
    batch = batch_for(target, drafter)
    losses = []
    for _ in range(15):
        loss, _ = drafter.loss(batch, target.head)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    after = drafter.model.state_dict()
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    assert torch.equal(after["lm_head.weight"], before["lm_head.weight"])
    assert not torch.equal(after["model.layers.0.mlp.up_proj.weight"], before["model.layers.0.mlp.up_proj.weight"])
    assert losses[-1] < 0.7 * losses[0]
    assert all(not p.requires_grad for p in target.model.parameters())


def test_a_fresh_config_with_its_own_width_trains_its_own_embedding(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = draft_lm.create(draft_lm.Config(init="fresh", num_layers=1, hidden_size=32, num_attention_heads=2,
                                              num_key_value_heads=1, freeze_embeddings=False), target)
    assert drafter.model.config.hidden_size == 32 and type(drafter.model) is type(target.model)
    assert drafter.model.get_input_embeddings().weight.requires_grad
    loss, _ = drafter.loss(batch_for(target, drafter), target.head)
    assert torch.isfinite(loss)
    with pytest.raises(DraftsmithError, match="freeze_embeddings=true needs the target's width"):
        draft_lm.create(draft_lm.Config(init="fresh", hidden_size=32, num_attention_heads=2,
                                        num_key_value_heads=1), target)


def test_the_saved_folder_loads_in_plain_transformers(tiny_llama, tmp_path):
    target = frozen(tiny_llama)
    drafter = draft_lm.create(draft_lm.Config(num_layers=2), target)
    with torch.no_grad():
        drafter.model.model.layers[0].mlp.up_proj.weight.add_(0.1)  # unlike the target's
    drafter.save_pretrained(tmp_path / "d")
    ids = [257, 10, 20, 30]
    expected = drafter.model(torch.tensor([ids])).logits[0, -1]
    script = (  # no draftsmith import: what a vLLM or transformers user does
        "import json, sys, torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'd')!r})\n"
        f"AutoTokenizer.from_pretrained({str(tmp_path / 'd')!r})\n"
        f"print(json.dumps(model(torch.tensor([{ids}])).logits[0, -1].tolist()))\n"
        "assert 'draftsmith' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    torch.testing.assert_close(torch.tensor(json.loads(out.strip().splitlines()[-1])), expected, rtol=1e-5, atol=1e-5)
    loaded = draft_lm.Drafter.from_pretrained(tmp_path / "d", target)
    assert loaded.config == drafter.config and loaded.target_info["target_name"] == "tiny-llama"
    assert json.loads((tmp_path / "d" / "config.json").read_text())["draftsmith_kind"] == "draft_lm"


def test_bad_draft_models_are_refused_naming_the_sizes(tiny_llama, tmp_path):
    target = frozen(tiny_llama)
    with pytest.raises(DraftsmithError, match="num_layers=9.*only 8 layers"):
        draft_lm.create(draft_lm.Config(num_layers=9), target)
    with pytest.raises(DraftsmithError, match="data.draft_vocab: null"):
        draft_lm.create(draft_lm.Config(), target, draft_vocab=object())
    small = tiny_target("llama", vocab_size=200, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # < 259 tokens
    folder = save_target(small, tmp_path / "small")
    with pytest.raises(DraftsmithError, match="predicts over 200 tokens.*has 259"):
        draft_lm.load_proposer(folder, target)
    with pytest.raises(DraftsmithError, match="reverse_kl needs the target's whole distribution"):
        draft_lm.Config(loss="reverse_kl", top_k=4).validate()


def test_tree_drafts_are_what_the_model_says_and_decode_losslessly(tiny_llama):
    target = frozen(tiny_llama)
    drafter = draft_lm.create(draft_lm.Config(num_layers=4), target)
    proposer = drafter.proposer(target)
    prompt = torch.tensor([[257, 5, 6, 7, 8, 9]])
    draft = proposer.propose(DecodeState(prompt), DraftShape(tree=(3, 2, 6)), Sampling())
    assert len(draft) == 6 and proposer.cache.get_seq_length() == prompt.shape[1]  # tree entries dropped
    model = drafter.model
    for node in range(len(draft)):  # each node's token is a top-2 child of its parent, from a fresh run
        path, at = [], node
        while at >= 0:
            path.insert(0, int(draft.tokens[at]))
            at = int(draft.parents[at])
        context = torch.cat([prompt[0], torch.tensor(path[:-1], dtype=torch.long)])
        logits = model(context[None]).logits[0, -1]
        assert path[-1] in logits.topk(2).indices.tolist()
    for shape in (DraftShape(length=3), DraftShape(tree=(3, 2, 6))):
        proposer.reset()
        spec = speculative_generate(target, proposer, prompt, shape, Sampling(), 24, eos=set())
        assert spec.tokens == plain_generate(target, prompt, Sampling(), 24, eos=set()).tokens


def test_the_recipe_trains_reports_and_resumes_a_draft_lm(tmp_path):
    import yaml

    from draftsmith.cli import main
    from test_train import write_target_and_conversations

    write_target_and_conversations(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"count from {k}"}) + "\n" for k in (3, 11)))
    recipe = {
        "target": {"name": str(tmp_path / "target")},
        "prepare": {"input": [str(tmp_path / "conversations.jsonl")], "max_length": 96, "eval_fraction": 0.2},
        "data": {"prepared": str(tmp_path / "data"), "online": True, "batch_size": 2, "max_length": 48},
        "drafter": {"kind": "draft_lm", "num_layers": 2, "loss": "tv"},
        "train": {"max_steps": 4, "lr": 1e-3, "warmup_steps": 1, "precision": "fp32", "eval_every": 2,
                  "checkpoint_every": 2},
        "eval": {"batches": 1, "num_prompts": 1, "max_new_tokens": 8, "draft_length": 3},
        "report": {"num_prompts": 2, "prompts": str(prompts), "max_new_tokens": 12, "draft_length": 3},
        "output_dir": str(tmp_path / "run"),
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["train", str(tmp_path / "recipe.yaml")]) == 0
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    assert results["lossless"] == {"checked": 2, "identical": 2} and results["drafter"]["kind"] == "draft_lm"
    assisted = results["assisted_generate"]  # the same folder in generate(assistant_model=...), same prompts
    assert assisted["identical_to_plain"] == 2 and assisted["speedup_vs_transformers"] > 0
    assert "generate(assistant_model) vs generate()" in (tmp_path / "run" / "eval" / "report.md").read_text()
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("acc_0" in r and r["split"] == "eval" and "acceptance_length" in r for r in log)
    assert main(["train", str(tmp_path / "recipe.yaml"), "resume=true", "train.max_steps=6"]) == 0
    assert json.loads((tmp_path / "run" / "checkpoint-6" / "trainer_state.json").read_text())["step"] == 6

    # the hf export: a folder transformers loads as it is, with a card that says how to use it
    assert main(["export", str(tmp_path / "run" / "best"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert not any(key.startswith("draftsmith") or key.startswith("target_") for key in config)
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "assistant_model=draft" in card and '"method": "draft_model"' in card
    final = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())  # the resumed run's report
    assert f"{final['acceptance_length']:.3f}" in card
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").config.num_hidden_layers == 2
    assert main(["export", str(tmp_path / "run" / "best"), "--format", "speculators", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()
