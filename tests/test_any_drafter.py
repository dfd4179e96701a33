"""Any drafter in: every layout `draftsmith export` writes is read back by `draftsmith eval` and `draftsmith info`
(`draftsmith.export.readers`) and drafts exactly as the folder it was exported from; wrong targets, pickle
checkpoints and unknown layouts are refused before any weight is read."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from test_export_support import draft_vocab
from tiny import save_target, tiny_target
from test_export_support import rewrite

from draftsmith.cli import main
from draftsmith.data.vocab import DraftVocab
from draftsmith.drafters import DraftShape, Sampling, dflash, draft_lm, eagle, medusa, mtp
from draftsmith.errors import DraftsmithError
from draftsmith.eval import metrics
from draftsmith.eval.decoder import speculative_generate
from draftsmith.eval.runner import drafter_kind, load_drafter
from draftsmith.export import readers

pytest.importorskip("speculators", reason="the speculators layouts are checked against speculators 0.9.0")

PROMPTS = [[257, 72, 101, 108, 108, 111, 258, 10], [257, 1, 2, 3, 1, 2, 3, 1, 2], [40, 41, 42, 43, 44, 45, 46]]

# kind name -> (the formats `draftsmith export` writes for it -> the layout each reads back as)
EXPORTS = {
    "eagle3": {"speculators": "speculators-eagle3", "sglang": "sglang-eagle3"},
    "peagle": {"speculators": "speculators-peagle"},
    "eagle1": {},
    "medusa": {"medusa": "vllm-medusa"},
    "medusa2": {"medusa": "vllm-medusa"},  # the export adds its tuned target (adapters merged) in target/
    "mtp": {"speculators": "speculators-mtp"},
    "dflash": {"dflash": "dflash-reference", "speculators": "speculators-dflash"},
    "dspark": {"speculators": "speculators-dspark"},
    "draft_lm": {"hf": "hf"},
}
CASES = [(name, fmt) for name, formats in EXPORTS.items() for fmt in ["draftsmith", *formats]]


def vocabulary(size: int = 256) -> DraftVocab:
    """Most of the tiny target's 320 tokens, so that its greedy outputs are mostly draftable."""
    made = draft_vocab(seed=1, size=size)
    return DraftVocab(d2t=made.d2t, t2d=made.t2d, coverage=1.0)


def build(name: str, target):
    """A drafter of each kind as training leaves one: weights moved off their initialisation (heads started from the
    target where the kind does, so that some drafts are accepted)."""
    torch.manual_seed(0)
    made = {
        "eagle3": lambda: eagle.create(eagle.Config(ttt_steps=2, init_head_from_target=True), target, vocabulary()),
        "peagle": lambda: eagle.create(eagle.Config(variant="peagle", ttt_steps=2, init_head_from_target=True), target,
                                       vocabulary()),
        "eagle1": lambda: eagle.create(eagle.Config(variant="eagle1"), target),
        "medusa": lambda: medusa.create(medusa.Config(num_heads=3), target, vocabulary()),
        "medusa2": lambda: medusa.create(medusa.Config(num_heads=3, lora_rank=4), target),
        "mtp": lambda: mtp.create(mtp.Config(num_modules=2, shared=True), target),
        "dflash": lambda: dflash.create(dflash.Config(block_size=4, num_target_layers=3), target),
        "dspark": lambda: dflash.create(dflash.Config(variant="dspark", block_size=4, num_target_layers=3,
                                                      markov_rank=8), target, vocabulary()),
        "draft_lm": lambda: draft_lm.create(draft_lm.Config(num_layers=8), target),  # every layer: all accepted
    }[name]()
    with torch.no_grad():
        for parameter in made.parameters() if name != "draft_lm" else ():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.02)
    return made


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny Qwen3 target saved as a folder (MTP exports load its final norm by name), one drafter folder per kind,
    and every export of each, written by the `draftsmith export` command."""
    root = tmp_path_factory.mktemp("any-drafter")
    target = tiny_target("qwen3")
    with torch.no_grad():  # a final norm unlike ones, so that a lost or foreign norm shows
        target.final_norm.weight.add_(torch.rand(target.hidden_size, generator=torch.Generator().manual_seed(3)))
    target.name = save_target(target, root / "target")
    folders = {}
    for name, formats in EXPORTS.items():
        build(name, target).save_pretrained(root / name / "best")
        folders[name, "source"] = root / name / "best"
        for fmt in ["draftsmith", *formats]:
            out = root / name / fmt
            assert main(["export", str(root / name / "best"), "--format", fmt, "--out", str(out)]) == 0
            folders[name, fmt] = out
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in ("count to ten", "abcabcabc", "hi")))
    return target, folders, prompts


SOURCE_RUNS: dict = {}


def once(key, run):
    """A source folder's figures, measured once for all of its exports."""
    if key not in SOURCE_RUNS:
        SOURCE_RUNS[key] = run()
    return SOURCE_RUNS[key]


class Recorder:
    """A proposer that keeps every draft it makes and the shape each was asked for (the decoder sees the proposer
    it wraps)."""

    def __init__(self, proposer):
        self.proposer, self.drafts, self.shapes = proposer, [], []

    def __getattr__(self, name):
        return getattr(self.proposer, name)

    def propose(self, state, shape, sampling):
        self.shapes.append(shape)
        draft = self.proposer.propose(state, shape, sampling)
        self.drafts.append(draft.tokens.tolist())
        return draft


def decode(folder, target, cut: bool | None = None):
    """What `draftsmith eval --drafter FOLDER` drafts (its own loader and decoder): every draft, the greedy outputs
    and the acceptance figures. `cut` False: DSpark and DFlash draft whole blocks (their confidence cut reads a
    verify-cost curve measured at load time, which differs run to run)."""
    proposer = Recorder(load_drafter(str(folder), target, confidence_cut=cut))
    verifier = getattr(proposer.proposer, "verifier", None) or target  # Medusa-2: its tuned target verifies
    shape = DraftShape(length=3)
    runs = [speculative_generate(verifier, proposer, torch.tensor([p]), shape, Sampling(), 20) for p in PROMPTS]
    return proposer.drafts, [g.tokens for g in runs], metrics.acceptance(runs)


# --------------------------------------------------------------------------- every layout drafts as its source
@pytest.mark.parametrize("name,fmt", CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_an_export_drafts_exactly_as_its_source(world, name, fmt):
    target, folders, _ = world
    cut = False if name in ("dspark", "dflash") else None
    source = once(("decode", name), lambda: decode(folders[name, "source"], target, cut=cut))
    exported = decode(folders[name, fmt], target, cut=cut)
    assert exported == source
    assert source[2]["verify_passes"] > 0


@pytest.mark.parametrize("name,fmt", CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_draftsmith_eval_reports_the_same_tau_for_an_export(world, name, fmt, tmp_path):
    from draftsmith.eval.command import EvalConfig, evaluate_and_report

    target, folders, prompts = world

    def evaluate(folder, out):
        config = EvalConfig(target=target.name, drafter=str(folder), out=str(tmp_path / out), prompts=str(prompts),
                            num_prompts=3, max_new_tokens=16, transformers_baseline=False, small_batch_linear=False,
                            confidence_cut=False if name in ("dspark", "dflash") else None,  # a measured cut and
                            fallback=False)  # lengths from measured draft times are not repeatable
        return evaluate_and_report(config, target=target)

    source = once(("eval", name), lambda: evaluate(folders[name, "source"], "source"))
    exported = evaluate(folders[name, fmt], "export")
    assert exported["acceptance_length"] == source["acceptance_length"] >= 1.0
    assert exported["acceptance_per_position"] == source["acceptance_per_position"]
    assert [p["new_tokens"] for p in exported["per_prompt"]] == [p["new_tokens"] for p in source["per_prompt"]]
    assert exported["lossless"]["identical"] == exported["lossless"]["checked"] == 3
    assert (exported["drafter"]["kind"], exported["drafter"].get("variant")) == \
        (source["drafter"]["kind"], source["drafter"].get("variant"))  # Medusa-2: verified by its tuned target


def test_the_eval_command_line_reads_an_export(world, tmp_path, capsys):
    target, folders, prompts = world
    args = ["eval", "--target", target.name, "--prompts", str(prompts), "--num-prompts", "2", "--max-new-tokens", "8",
            "--no-transformers-baseline", "--no-small-batch-linear"]
    assert main([*args, "--drafter", str(folders["dspark", "speculators"]), "--out", str(tmp_path / "e")]) == 0
    results = json.loads((tmp_path / "e" / "results.json").read_text())
    assert results["drafter"]["kind"] == "dflash" and results["drafter"]["variant"] == "dspark"
    assert "lossless 2/2" in capsys.readouterr().out


# --------------------------------------------------------------------------- detection and info
@pytest.mark.parametrize("name,fmt", CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_each_layout_is_detected_and_described(world, name, fmt, capsys):
    target, folders, _ = world
    layout = EXPORTS[name].get(fmt, "draftsmith")
    kind = {"eagle3": "eagle", "peagle": "eagle", "eagle1": "eagle", "dspark": "dflash", "medusa2": "medusa"}.get(name, name)
    expected = readers.expectations(folders[name, fmt])
    assert (expected.layout, expected.kind) == (layout, kind)
    assert drafter_kind(str(folders[name, fmt])) == kind
    assert main(["info", str(folders[name, fmt]), "--target", target.name, "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert (facts["layout"], facts["kind"]) == (layout, kind)
    assert facts["target"].startswith(f"{target.name}: fits") and facts["parameters"] > 0
    if kind != "draft_lm":
        assert (facts["hidden_size"], facts["vocab_size"]) == (64, 320)
    draft = {"eagle3": 256, "peagle": 256, "medusa": 256, "dspark": 256}.get(name, "the whole vocabulary")
    assert facts["draft_vocab_size"] == draft
    assert ("100%" in facts["coverage"]) == (draft == "the whole vocabulary")


def test_info_on_an_export_without_a_target_reads_no_weights(world, monkeypatch, capsys):
    _, folders, _ = world
    monkeypatch.setattr("safetensors.torch.load_file", lambda *a, **k: pytest.fail("a weight file was read"))
    assert main(["info", str(folders["eagle3", "sglang"])]) == 0
    out = capsys.readouterr().out
    assert "sglang-eagle3" in out and "[1, 3, 4]" in out and "256" in out


def test_info_on_a_target_folder_still_describes_the_target(world, capsys):
    target, _, _ = world
    assert main(["info", target.name, "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["num_layers"] == 8 and "layout" not in facts


def test_a_plain_model_folder_is_a_draft_model(world):
    target, _, _ = world
    assert readers.expectations(target.name).layout == "hf"
    assert type(load_drafter(target.name, target)).__name__ == "DraftLM"


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("name,fmt", [("eagle3", "speculators"), ("dflash", "dflash"), ("medusa", "medusa"),
                                      ("mtp", "speculators"), ("eagle3", "draftsmith"), ("dspark", "speculators")])
def test_a_wrong_target_is_refused_before_any_weight_is_read(world, name, fmt, monkeypatch, capsys, tmp_path):
    _, folders, _ = world
    other = tiny_target("qwen3", hidden_size=32, num_layers=6)
    other.name = save_target(other, tmp_path / "other")
    monkeypatch.setattr("safetensors.torch.load_file", lambda *a, **k: pytest.fail("a weight file was read"))
    with pytest.raises(DraftsmithError, match="does not fit target .*hidden size 64 .*Nothing was loaded"):
        load_drafter(str(folders[name, fmt]), other)
    assert main(["info", str(folders[name, fmt]), "--target", other.name]) == 2
    assert "does not fit" in capsys.readouterr().err


def test_a_pickle_checkpoint_is_refused_with_the_reason(world, tmp_path):
    target, folders, _ = world
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(folders["eagle3", "speculators"] / "config.json", folder)
    torch.save(load_file(str(folders["eagle3", "speculators"] / "model.safetensors")), folder / "pytorch_model.bin")
    for attempt in (lambda: load_drafter(str(folder), target), lambda: readers.expectations(folder)):
        with pytest.raises(DraftsmithError, match="pickle files \\(pytorch_model.bin\\).*runs whatever code"):
            attempt()


@pytest.mark.parametrize("config,found", [
    ({"speculators_model_type": "xpress"}, "speculators_model_type 'xpress'"),
    ({"architectures": ["DFlash2DraftModel"], "model_type": "qwen3"}, "DFlash2DraftModel"),
    ({"medusa_num_heads": 5, "model_type": "llama"}, "medusa_num_heads"),
    ({"hello": 1}, "none of draftsmith_kind"),
])
def test_an_unknown_layout_is_named_and_the_readable_ones_listed(tmp_path, config, found):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match="not a drafter layout draftsmith reads") as caught:
        drafter_kind(str(tmp_path))
    assert found in str(caught.value) and "speculators eagle3 / peagle / dflash / dspark / mtp" in str(caught.value)


# --------------------------------------------------------------------------- public checkpoints of these layouts
def copy_export(world, name, fmt, tmp_path):
    folder = tmp_path / f"{name}-{fmt}"
    shutil.copytree(world[1][name, fmt], folder)
    return folder


def test_a_library_written_eagle3_checkpoint_reads_as_ours(world, tmp_path):
    """What the speculators library itself writes: version stamps, defaults left out of the layer config,
    transformers-4 RoPE keys, and the verifier's embedding (`--include-embedding`), checked against the target's."""
    target, folders, _ = world
    folder = copy_export(world, "eagle3", "speculators", tmp_path)
    embedding = target.model.get_input_embeddings().weight.detach().clone()

    def library_config(config):
        layer = config["transformer_layer_config"]
        layer["rope_theta"] = layer.pop("rope_parameters")["rope_theta"]
        for default in ("tie_word_embeddings", "attention_dropout", "pretraining_tp"):
            layer.pop(default, None)
        config.update(speculators_version="0.9.0", transformers_version="4.57.0", torch_dtype="float32",
                      norm_before_fc=False, fc_norm=False, norm_output=False, embed_requires_grad=False)

    rewrite(folder, library_config, lambda tensors: tensors.update({"embed_tokens.weight": embedding}))
    assert decode(folder, target) == decode(folders["eagle3", "source"], target)
    rewrite(folder, tensor_edit=lambda tensors: tensors.update({"embed_tokens.weight": embedding + 1e-2}))
    with pytest.raises(DraftsmithError, match="embed_tokens.weight .* is not this target's input embedding"):
        load_drafter(str(folder), target)


@pytest.mark.parametrize("option", ["norm_before_fc"])
def test_eagle3_options_our_drafter_does_not_compute_are_refused(world, tmp_path, option):
    folder = copy_export(world, "eagle3", "speculators", tmp_path)
    rewrite(folder, lambda config: config.update({option: True}))
    with pytest.raises(DraftsmithError, match=f"uses {option} .*does not compute"):
        load_drafter(str(folder), world[0])


def test_vllm_medusa_heads_without_biases_read_as_zero_biases(world, tmp_path):
    target = world[0]
    folder = copy_export(world, "medusa", "medusa", tmp_path)
    biases = {}

    def drop_biases(tensors):
        for name in [n for n in tensors if n.endswith(".bias")]:
            biases[name] = tensors.pop(name)

    rewrite(folder, lambda config: config.update(medusa_fc_bias=False), drop_biases)
    proposer = load_drafter(str(folder), target)
    assert biases and all(not block.linear.bias.any() for head in proposer.drafter.blocks for block in head.layers)


def test_an_mtp_folder_whose_final_norm_is_not_the_targets_is_refused(world, tmp_path):
    folder = copy_export(world, "mtp", "speculators", tmp_path)
    rewrite(folder, tensor_edit=lambda t: t["mtp_layers.0.final_layernorm.weight"].mul_(2))
    with pytest.raises(DraftsmithError, match="final_layernorm.weight .* is not this target's final norm"):
        load_drafter(str(folder), world[0])


def test_a_dspark_folder_that_samples_from_its_anchor_is_refused(world, tmp_path):
    folder = copy_export(world, "dspark", "speculators", tmp_path)
    rewrite(folder, lambda config: config.pop("sample_from_anchor"))  # the library's DSpark default is true
    with pytest.raises(DraftsmithError, match="sample_from_anchor: true"):
        load_drafter(str(folder), world[0])


def test_a_dflash_reference_folder_reads_the_references_default_layer_ids(world, tmp_path):
    """Without dflash_config.target_layer_ids the reference reads one layer per draft layer (the middle one for a
    single draft layer); so does our reader, which then finds the 3-layer fc of this folder does not fit them."""
    folder = copy_export(world, "dflash", "dflash", tmp_path)
    rewrite(folder, lambda config: config["dflash_config"].pop("target_layer_ids"))
    with pytest.raises(DraftsmithError, match="dflash-reference.*fc.weight.*\\[64, 192\\].*\\[64, 64\\]"):
        load_drafter(str(folder), world[0])


# --------------------------------------------------------------------------- fine-tuning from any of them
def run_recipe(tmp_path, name, target, data, max_steps, **top):
    """A tiny EAGLE-3 run on in-memory features (test_train's helpers), set up; `top`: top-level recipe keys and
    data.draft_vocab."""
    from test_train import recipe_dict, reset_accelerate_state, write_recipe

    from draftsmith.config import load
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.recipe import TrainRecipe

    reset_accelerate_state()
    config = recipe_dict({"target": "unused", "prepared": None}, "eagle3", max_steps=max_steps, eval_every=0,
                         checkpoint_every=0)
    config["data"] = {"features": "in-memory", "batch_size": 2, "max_length": 48,
                      "draft_vocab": top.pop("draft_vocab", None)}
    config["eval"]["num_prompts"] = 0
    config["drafter"].update(init_head_from_target=True, **top.pop("drafter", {}))
    config["train"].update(lr=3e-3)
    config.update(output_dir=str(tmp_path / name), **top)
    recipe = TrainRecipe(load(TrainConfig, write_recipe(tmp_path / f"{name}.yaml", config)), data=data, target=target)
    recipe.setup()
    return recipe


@pytest.fixture(scope="module")
def fine_tune(tmp_path_factory):
    """A source EAGLE-3 run over a 200-token draft vocabulary (a few steps), and its best/ exported for SGLang."""
    from test_train import memory_data, read_log

    from draftsmith.data.vocab import save_draft_vocab

    root = tmp_path_factory.mktemp("init-from")
    target = tiny_target("llama")
    save_draft_vocab(root / "vocab", vocabulary(size=200), target.fingerprint())
    other = draft_vocab(seed=2, size=200)
    save_draft_vocab(root / "other-vocab", DraftVocab(d2t=other.d2t, t2d=other.t2d, coverage=1.0), target.fingerprint())
    data = memory_data(target, [1, 3, 4, 7])
    source = run_recipe(root, "source", target, data, max_steps=12, draft_vocab=str(root / "vocab"))
    source.train()
    source.cleanup()
    assert main(["export", str(root / "source" / "best"), "--format", "sglang", "--out", str(root / "export"),
                 "--verifier", "HuggingFaceTB/tiny-llama"]) == 0
    return root, target, data, read_log(root / "source", "eval")[-1]


def held_out(record: dict) -> dict:
    return {k: v for k, v in record.items() if k == "loss" or k.startswith("acc_")}


def test_a_fine_tune_from_an_export_logs_the_sources_held_out_accuracy_at_step_0(fine_tune, tmp_path):
    from test_train import read_log

    root, target, data, source_final = fine_tune
    # A random tiny target's next-token distributions are near uniform, so a few steps leave the top-1 accuracies near
    # zero; the held-out loss (three TTT steps' cross-entropies) is the figure that tells one set of weights from another.
    assert source_final["step"] == 12 and {"acc_0", "acc_1", "acc_2", "loss"} <= source_final.keys()
    run = run_recipe(tmp_path, "tuned", target, data, max_steps=2, init_from=str(root / "export"))
    assert torch.equal(run.accelerator.unwrap_model(run.model).drafter.d2t.cpu(), vocabulary(size=200).d2t)  # the checkpoint's map, kept as it is
    run.train()
    run.cleanup()
    evaluations = read_log(tmp_path / "tuned", "eval")
    assert [r["step"] for r in evaluations] == [0, 2]
    start = held_out(evaluations[0])
    assert start == pytest.approx(held_out(source_final), rel=1e-6, abs=1e-7)
    assert start.keys() == held_out(evaluations[1]).keys()


def test_a_recipe_with_the_same_draft_vocabulary_is_accepted_and_another_is_refused(fine_tune, tmp_path):
    root, target, data, _ = fine_tune
    run_recipe(tmp_path, "same", target, data, max_steps=1, init_from=str(root / "export"),
               draft_vocab=str(root / "vocab")).cleanup()
    with pytest.raises(DraftsmithError, match="drafts over 200 tokens, the recipe's data.draft_vocab .*other-vocab.* "
                                              "over 200 tokens; row .* never rebuilt"):
        run_recipe(tmp_path, "other", target, data, max_steps=1, init_from=str(root / "export"),
                   draft_vocab=str(root / "other-vocab"))


def test_a_recipe_that_names_another_architecture_is_refused(fine_tune, tmp_path):
    root, target, data, _ = fine_tune
    with pytest.raises(DraftsmithError, match="drafter.layers: \\[2, 3, 4\\] in the recipe, \\[1, 3, 4\\] in the "
                                              "checkpoint"):
        run_recipe(tmp_path, "layers", target, data, max_steps=1, init_from=str(root / "export"),
                   drafter={"layers": [2, 3, 4]})
    with pytest.raises(DraftsmithError, match="holds a dflash drafter .*trains drafter.kind eagle"):
        run_recipe(tmp_path, "kind", target, data, max_steps=1, init_from=str(world_dflash(tmp_path, target)))


def world_dflash(tmp_path, target):
    """A DFlash drafter folder for the same tiny target (a drafter of another kind than the recipe's)."""
    dflash.create(dflash.Config(block_size=4, num_target_layers=3), target).save_pretrained(tmp_path / "dflash")
    return tmp_path / "dflash"


# --------------------------------------------------------------------------- the real target
REAL_EXPORTS = {"eagle3": ("speculators", "sglang"), "eagle1": (), "medusa1": ("medusa",), "medusa2": ("medusa",),
                "mtp": (), "dflash": ("dflash", "speculators"), "dspark": ("speculators",), "draft-lm": ("hf",)}
"""shipped recipe -> the formats it exports for SmolLM2 besides draftsmith's own (a Llama: speculators' mtp layout has
no Llama layer, so MTP has only its own)"""


@pytest.fixture(scope="module")
def real_data(smollm2, tmp_path_factory):
    """64 builtin:stdlib conversations prepared for SmolLM2, with a 1024-token draft vocabulary."""
    from draftsmith.data.prepared import PrepareConfig, prepare

    out = tmp_path_factory.mktemp("real") / "data"
    prepare(PrepareConfig(target="smollm2-135m-instruct", input=["builtin:stdlib"], max_rows_per_input=64,
                          out=str(out), eval_fraction=0.1, max_length=256, draft_vocab_size=1024), target=smollm2)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(REAL_EXPORTS))
def test_on_the_real_target_every_export_of_a_trained_drafter_gives_its_tau(smollm2, real_data, recipe, tmp_path):
    """SmolLM2-135M-Instruct: each shipped recipe trains 30 steps (online, on 64 prepared conversations), its best/ is
    exported in every format of its kind, and `draftsmith eval` on 3 HumanEval prompts (24 new tokens, greedy) reports
    the same τ, per-position acceptance and outputs for the source and every export."""
    import yaml

    from draftsmith.eval.command import EvalConfig, evaluate_and_report
    from test_train import reset_accelerate_state

    from draftsmith.config import load
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.recipe import TrainRecipe

    path = f"recipes/smollm2-135m/{recipe}.yaml"
    # the DFlash reference layout drafts through the target's lm_head, so that recipe trains over the whole vocabulary
    own_vocab = yaml.safe_load(open(path))["data"].get("draft_vocab") and recipe != "dflash"
    reset_accelerate_state()
    run = TrainRecipe(load(TrainConfig, path, [
        f"data.prepared={real_data}", "data.online=true", "data.features=null", "prepare=null",
        f"data.draft_vocab={real_data if own_vocab else 'null'}", "data.max_length=256", "train.max_steps=30",
        "train.eval_every=0", "train.checkpoint_every=0", "eval.num_prompts=0", "report.num_prompts=0",
        "tracking.report_to=[]", f"output_dir={tmp_path / 'run'}"]), target=smollm2)
    run.setup()
    run.train()
    run.cleanup()
    folders = {"source": tmp_path / "run" / "best"}
    for fmt in ("draftsmith", *REAL_EXPORTS[recipe]):
        assert main(["export", str(folders["source"]), "--format", fmt, "--out", str(tmp_path / fmt)]) == 0
        folders[fmt] = tmp_path / fmt
    figures = {}
    for label, folder in folders.items():
        config = EvalConfig(target="smollm2-135m-instruct", drafter=str(folder), out=str(tmp_path / f"eval-{label}"),
                            prompts="humaneval", num_prompts=3, max_new_tokens=24, transformers_baseline=False,
                            small_batch_linear=False, confidence_cut=False if recipe in ("dspark", "dflash") else None,
                            fallback=False)  # measured cuts and fallback lengths are not repeatable
        results = evaluate_and_report(config, target=smollm2)
        figures[label] = (results["acceptance_length"], results["acceptance_per_position"],
                          [p["new_tokens"] for p in results["per_prompt"]], results["lossless"]["identical"])
        print(f"real target {recipe} {label}: tau {results['acceptance_length']:.4f} prompts "
              f"{[p['name'] for p in results['per_prompt']]}")
    assert all(value == figures["source"] for value in figures.values()), figures
    assert figures["source"][3] == 3
