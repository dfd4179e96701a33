"""Sequential MTP modules: the loss by hand, exact chain/tree drafting, lossless decoding, frozen target, errors."""

import hashlib
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from draftsmith.config import build
from draftsmith.drafters import DecodeState, DraftShape, Sampling, kind_module, mtp
from draftsmith.errors import DraftsmithError
from draftsmith.eval.decoder import plain_generate, speculative_generate
from test_losses import by_hand as by_hand_loss
from tiny import tiny_target


def frozen(target):
    target.model.requires_grad_(False)
    return target


def perturbed(drafter, scale=0.05, seed=0):
    """Weights unlike their initialisation, so that a wrong index or norm shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return drafter


def make(target, **options):
    torch.manual_seed(0)
    return perturbed(mtp.create(mtp.Config(**options), target))


def batch_for(target, length=16, seed=0):
    ids = torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[:, :4] = 0
    features = target.forward(ids, layers=[target.num_layers - 1], logits=False).features
    return {"input_ids": ids, "loss_mask": mask, "attention_mask": torch.ones_like(ids), "features": features}


def reference_hidden(drafter, target, module, ids, hidden):
    """norm(block(input_proj(...))) by a one-layer transformers model of the target's architecture whose layer is
    the module's block, final norm the target's: its own causal mask and positions 0..S-1."""
    model = AutoModelForCausalLM.from_config(mtp.block_config(target.config.to_dict())).eval()
    model.model.layers[0].load_state_dict(module.block.state_dict())
    model.model.norm.load_state_dict(target.final_norm.state_dict())
    embeds = target.embed(ids)
    x = module.input_proj(torch.cat([module.token_layernorm(embeds), module.hidden_layernorm(hidden)], -1))
    return model.model(inputs_embeds=x).last_hidden_state


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("loss", ["forward_kl", "jsd"])
def test_loss_equals_the_definition_computed_by_hand(tiny_qwen3, shared, loss):
    target = frozen(tiny_qwen3)
    drafter = make(target, num_modules=3, shared=shared, loss_weight=0.7, loss=loss)
    batch = batch_for(target)
    value, metrics = drafter.loss(batch, target.head)
    ids = batch["input_ids"]
    with torch.no_grad():
        out = target.model(ids, output_hidden_states=True)
        hidden = out.hidden_states[-1]  # HF's last entry: after the final norm, what lm_head reads
        p = torch.softmax(out.logits.float(), -1)
        total = 0.0
        for k in range(1, 4):
            shifted = torch.zeros_like(ids)
            shifted[:, :-k] = ids[:, k:]
            hidden = reference_hidden(drafter, target, drafter.module(k), shifted, hidden)
            log_q = torch.log_softmax(target.model.lm_head(hidden).float(), -1)
            n = ids.shape[1] - k - 1  # index t predicts x_{t+k+1}, learned from position 4 on
            step_loss = by_hand_loss(loss, p[:, k : k + n], log_q[:, :n])[:, 4 - k - 1 :]
            total = total + step_loss.mean()
            agreement = (log_q[:, :n].argmax(-1) == p[:, k : k + n].argmax(-1))[:, 4 - k - 1 :].float().mean()
            assert metrics[f"acc_{k - 1}"] == pytest.approx(float(agreement))
    torch.testing.assert_close(value, 0.7 / 3 * total, rtol=1e-4, atol=1e-5)


def from_scratch_logits(drafter, target, tokens, draft, step):
    """Step `step`'s logits at index T-2 from the teacher-forced modules on the committed tokens plus the draft."""
    full = torch.cat([tokens, draft[: step - 1]])[None]
    features = target.forward(full, layers=drafter.required_layers, logits=False).features
    with torch.no_grad():
        outputs = drafter.teacher_forced(full, features[drafter.last_layer], steps=step)
        return drafter.logits(outputs[step - 1][0, tokens.numel() - 2])


def state_of(target, tokens, layer):
    features = target.forward(tokens[None, :-1], layers=[layer], logits=False).features
    return DecodeState(tokens[None], features)


@pytest.mark.parametrize("shared", [False, True])
def test_chain_drafting_equals_the_modules_run_one_by_one_from_scratch(tiny_qwen3, shared):
    target = frozen(tiny_qwen3)
    drafter = make(target, num_modules=3, shared=shared)
    proposer = drafter.proposer(target)
    length = 5 if shared else 3  # a shared module is applied as often as asked
    prompt = torch.tensor([257, 5, 6, 7, 8, 9, 10])
    first = proposer.propose(state_of(target, prompt, drafter.last_layer), DraftShape(length=length), Sampling())
    # next cycle: one draft token accepted, then a correction unlike the second draft token (a rollback)
    later = torch.cat([prompt, first.tokens[:1], torch.tensor([(int(first.tokens[1]) + 1) % 256])])
    # then another continuation of the prompt (cached entries past the prompt are stale), and a context
    # shorter than the steps
    other = torch.cat([prompt, torch.tensor([(int(first.tokens[0]) + 2) % 256, 11, 12])])
    for tokens in (prompt, later, other, prompt[:3]):
        draft = proposer.propose(state_of(target, tokens, drafter.last_layer), DraftShape(length=length), Sampling())
        assert len(draft) == length
        for step in range(1, length + 1):
            logits = from_scratch_logits(drafter, target, tokens, draft.tokens, step)
            assert int(logits.argmax()) == int(draft.tokens[step - 1]), (tokens.numel(), step)


def test_tree_nodes_are_top_k_children_under_their_path(tiny_qwen3):
    target = frozen(tiny_qwen3)
    drafter = make(target, num_modules=3)
    proposer = drafter.proposer(target)
    tokens = torch.tensor([257, 5, 6, 7, 8, 9])
    draft = proposer.propose(state_of(target, tokens, drafter.last_layer), DraftShape(tree=(3, 2, 6)), Sampling())
    assert len(draft) == 6 and int(draft.parents.max()) >= 0
    for node in range(len(draft)):
        path, at = [], node
        while at >= 0:
            path.insert(0, int(draft.tokens[at]))
            at = int(draft.parents[at])
        logits = from_scratch_logits(drafter, target, tokens, torch.tensor(path), len(path))
        assert path[-1] in logits.topk(2).indices.tolist()


@pytest.mark.parametrize("arch,shared", [("qwen3", False), ("llama", True)])
def test_greedy_decoding_is_token_identical_to_the_plain_loop(arch, shared):
    target = frozen(tiny_target(arch))
    drafter = make(target, num_modules=3, shared=shared)
    prompt = torch.tensor([[257, 5, 6, 7, 8, 9]])
    plain = plain_generate(target, prompt, Sampling(), 32, eos=set()).tokens
    for shape in (DraftShape(length=3), DraftShape(tree=(3, 3, 8))):
        proposer = drafter.proposer(target)
        spec = speculative_generate(target, proposer, prompt, shape, Sampling(), 32, eos=set())
        assert spec.tokens == plain


def weights_hash(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def test_training_moves_the_modules_only_and_the_target_stays_frozen(tiny_qwen3, tmp_path):
    target = frozen(tiny_qwen3)
    before = weights_hash(target.model)
    drafter = mtp.create(mtp.Config(num_modules=2), target)
    last = target.layers[-1].state_dict()
    assert all(torch.equal(t, last[name]) for name, t in drafter.module(2).block.state_dict().items())
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    batch, losses = batch_for(target), []
    for _ in range(12):
        loss, _ = drafter.loss(batch, target.head)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():  # the loss is bounded below by the soft labels' entropy: every step learns p at 3..S-2
        p = torch.softmax(target.model(batch["input_ids"]).logits[:, 3:-1].float(), -1)
        entropy = float(-(p * p.log()).sum(-1).mean())
    assert losses[-1] - entropy < 0.5 * (losses[0] - entropy)
    assert weights_hash(target.model) == before
    drafter.save_pretrained(tmp_path / "d")
    saved = json.loads((tmp_path / "d" / "config.json").read_text())
    assert saved["draftsmith_kind"] == "mtp"
    loaded = kind_module("mtp").Drafter.from_pretrained(tmp_path / "d", target)
    assert all(name.startswith("mtp_modules.") for name in loaded.state_dict())  # no target parts stored
    torch.testing.assert_close(loaded.loss(batch, target.head)[0], drafter.loss(batch, target.head)[0])


def test_bad_options_name_the_key(tiny_qwen3):
    with pytest.raises(DraftsmithError, match="drafter.num_modules must be at least 1"):
        build(mtp.Config, {"num_modules": 0}, prefix="drafter.")
    with pytest.raises(DraftsmithError, match="drafter.loss_weight"):
        build(mtp.Config, {"loss_weight": 0}, prefix="drafter.")
    with pytest.raises(DraftsmithError, match="drafter.shraed"):
        build(mtp.Config, {"shraed": True}, prefix="drafter.")
    with pytest.raises(DraftsmithError, match="data.draft_vocab: null"):
        mtp.create(mtp.Config(), tiny_qwen3, draft_vocab=object())
    drafter = mtp.create(mtp.Config(num_modules=1), tiny_qwen3)
    with pytest.raises(DraftsmithError, match="trained for a target with .*num layers 8.*has .*num layers 4"):
        drafter.attach(tiny_target("qwen3", num_layers=4))


def test_the_trainer_trains_mtp_and_validates_it_by_decoding(tmp_path):
    """The kind on the real training recipe: per-step accuracies logged, a decoded τ, a loadable best/."""
    from draftsmith.config import load
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.recipe import TrainRecipe
    from test_train import memory_data, read_log, recipe_dict, reset_accelerate_state, write_recipe

    reset_accelerate_state()
    target = tiny_target("qwen3")
    config_dict = recipe_dict({"target": "unused", "prepared": None}, max_steps=4, eval_every=4, checkpoint_every=4)
    config_dict.update(drafter={"kind": "mtp", "num_modules": 2}, output_dir=str(tmp_path / "run"),
                       data={"features": "in-memory", "batch_size": 2, "max_length": 48})
    config = load(TrainConfig, write_recipe(tmp_path / "recipe.yaml", config_dict))
    recipe = TrainRecipe(config, data=memory_data(target, [target.num_layers - 1]), target=target)
    recipe.setup()
    recipe.train()
    recipe.cleanup()
    reset_accelerate_state()
    assert {"acc_0", "acc_1", "loss_0", "loss_1"} <= set(read_log(tmp_path / "run")[0])
    assert read_log(tmp_path / "run", "eval")[-1]["acceptance_length"] >= 1.0
    assert kind_module("mtp").load_proposer(tmp_path / "run" / "best", target).describe()["kind"] == "mtp"
