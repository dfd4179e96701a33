"""The W·xᵀ linear for few-row inputs: same values as F.linear, routed only where asked, undone cleanly."""

import pytest
import torch
import torch.nn.functional as F

from tiny import tiny_target

from draftsmith.drafters import DraftShape, Sampling, eagle
from draftsmith.drafters.draft_lm import DraftLM
from draftsmith.drafters.prompt_lookup import Config, PromptLookup
from draftsmith import small_batch
from draftsmith.eval.command import EvalConfig, evaluate_and_report
from draftsmith.eval.decoder import plain_generate, speculative_generate

PROMPT = torch.tensor([[257, 10, 20, 30, 40, 10, 20, 30, 50, 60, 70, 10, 20]])


needs_mkl = pytest.mark.skipif(not torch._C.has_mkl, reason="torch built without MKL")
needs_onednn = pytest.mark.skipif(not small_batch.can_onednn(torch.nn.Linear(2, 2)), reason="torch without oneDNN")
FORMS = {"narrow": lambda layer, x: small_batch.narrow_linear(layer.weight, layer.bias, x),
         "packed": lambda layer, x: small_batch.packed_linear(layer.weight, small_batch.pack(layer.weight), layer.bias, x),
         "onednn": lambda layer, x: small_batch.onednn_linear(small_batch.onednn_pack(layer.weight), layer.bias, x)}


@pytest.mark.parametrize("form", ["narrow", pytest.param("packed", marks=needs_mkl),
                                  pytest.param("onednn", marks=needs_onednn)])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("bias", [True, False])
def test_each_form_matches_torch(form, rows, bias):
    generator = torch.Generator().manual_seed(rows)
    layer = torch.nn.Linear(48, 80, bias=bias)
    x = torch.randn(1, rows, 48, generator=generator)
    out = FORMS[form](layer, x)
    assert out.shape == (1, rows, 80) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


REORDERED = {"packed": "packed_linear", "onednn": "onednn_linear"}
"""the forms that keep a reordered copy of each weight (in `layer.<form>_weight`) -> the function that runs them"""


@pytest.mark.parametrize("form", [pytest.param("packed", marks=needs_mkl), pytest.param("onednn", marks=needs_onednn)])
def test_reordered_rows_decode_the_same_tokens_and_a_form_that_disagrees_is_never_chosen(form, tiny_llama, monkeypatch):
    greedy = Sampling()
    before = plain_generate(tiny_llama, PROMPT, greedy, 24, eos=set()).tokens
    calls, run = [], getattr(small_batch, REORDERED[form])
    monkeypatch.setattr(small_batch, REORDERED[form], lambda *args: calls.append(args[-1].shape[-2]) or run(*args))
    small_batch.install(tiny_llama.model, {n: form if n % 2 else "narrow" for n in range(1, 9)})
    try:
        for layer in small_batch.linears(tiny_llama.model):  # only the routed form's copy is made
            assert all((getattr(layer, f"{other}_weight") is not None) == (other == form) for other in REORDERED)
        plain = plain_generate(tiny_llama, PROMPT, greedy, 24, eos=set()).tokens
        speculative = speculative_generate(tiny_llama, PromptLookup(Config()), PROMPT, DraftShape(4), greedy, 24,
                                           eos=set()).tokens
    finally:
        small_batch.remove(tiny_llama.model)
    assert plain == before and speculative == before
    assert calls and all(n % 2 for n in calls)  # the odd row counts only, the plain steps (1 row) among them
    assert all(f"{form}_weight" not in layer.__dict__ for layer in small_batch.linears(tiny_llama.model))
    # weight (or its reordered copy) [out, in] first, input last: a form that returns zeros disagrees with F.linear
    monkeypatch.setattr(small_batch, REORDERED[form], lambda *args: torch.zeros(*args[-1].shape[:-1], args[0].shape[0]))
    monkeypatch.setattr(small_batch, "MARGIN", 100.0)  # any form counts as faster: only agreement can refuse it
    chosen = small_batch.tune(tiny_llama.model, max_rows=3, repeats=1)["rows"]
    assert {1, 2, 3} <= set(chosen) and form not in chosen.values()  # nor at the prompts' row counts


def test_install_routes_only_the_given_row_counts_and_remove_undoes_it(monkeypatch, tiny_llama):
    calls = []
    real = small_batch.narrow_linear
    monkeypatch.setattr(small_batch, "narrow_linear", lambda w, b, x: calls.append(x.shape[-2]) or real(w, b, x))
    layers = len(small_batch.linears(tiny_llama.model))
    assert small_batch.install(tiny_llama.model, [2]) == layers
    assert small_batch.installed_rows(tiny_llama.model) == {2: "narrow"}
    with torch.no_grad():
        tiny_llama.model(input_ids=PROMPT[:, :3])
        assert calls == []  # 3 rows: torch's own linear
        tiny_llama.model(input_ids=PROMPT[:, :2])
    assert len(calls) == layers and set(calls) == {2}  # every linear layer once, lm_head included
    small_batch.remove(tiny_llama.model)
    assert small_batch.installed_rows(tiny_llama.model) == {}
    assert all("forward" not in layer.__dict__ for layer in small_batch.linears(tiny_llama.model))
    with torch.no_grad():
        tiny_llama.model(input_ids=PROMPT[:, :2])
    assert len(calls) == layers


def test_decoding_with_it_installed_gives_the_same_tokens(tiny_llama):
    greedy = Sampling()
    before = plain_generate(tiny_llama, PROMPT, greedy, 24, eos=set()).tokens
    small_batch.install(tiny_llama.model, range(1, 9))
    try:
        plain = plain_generate(tiny_llama, PROMPT, greedy, 24, eos=set()).tokens
        lookup = PromptLookup(Config())
        speculative = speculative_generate(tiny_llama, lookup, PROMPT, DraftShape(4), greedy, 24, eos=set()).tokens
    finally:
        small_batch.remove(tiny_llama.model)
    assert plain == before and speculative == before


def test_tune_picks_the_rows_where_the_narrow_form_was_faster(tiny_llama):
    result = small_batch.tune(tiny_llama.model, max_rows=4, repeats=3, long_rows=())
    assert sorted(result["linear_ms"]) == [1, 2, 3, 4] and sorted(result["narrow_ms"]) == [1, 2, 3, 4]
    timed = {form: result[f"{form}_ms"] for form in small_batch.FORM_NAMES if result[f"{form}_ms"]}
    assert result["rows"] == small_batch.choose(timed)  # every form agrees with F.linear on this model
    assert bool(result["packed_ms"]) == torch._C.has_mkl  # float32 weights on a CPU: packed is timed where MKL is
    assert bool(result["onednn_ms"]) == small_batch.can_onednn(small_batch.linears(tiny_llama.model)[0])


@pytest.mark.skipif(not (torch._C.has_mkl or small_batch.can_onednn(torch.nn.Linear(2, 2))), reason="no reordered form")
def test_tune_times_prompt_rows_with_the_reordered_forms_and_routes_the_fastest(tiny_llama, monkeypatch):
    monkeypatch.setattr(small_batch, "MARGIN", 100.0)  # every form counts as faster than F.linear
    result = small_batch.tune(tiny_llama.model, max_rows=2, repeats=1, long_rows=(1, 32, 128))
    assert sorted(result["linear_ms"]) == [1, 2, 32, 128] and sorted(result["narrow_ms"]) == [1, 2]  # 1: a few
    for n in (32, 128):  # W·xᵀ is for a few rows: not timed there
        timed = {form: result[f"{form}_ms"][n] for form in ("packed", "onednn") if n in result[f"{form}_ms"]}
        assert timed[result["rows"][n]] == min(timed.values())  # (times as reported: rounded, so ties may show)
    monkeypatch.setattr(small_batch, "MARGIN", 0.0)  # nothing beats F.linear: prompts keep it
    assert set(small_batch.tune(tiny_llama.model, max_rows=2, repeats=1, long_rows=(32,))["rows"]) <= {1, 2}


def test_a_row_count_above_the_few_takes_the_form_of_the_long_size_at_or_above_it(tiny_llama, monkeypatch):
    rows = {2: "narrow", 32: "onednn", 512: "packed"}
    assert [small_batch.routed(rows, n) for n in (2, 3, 16, 17, 32, 33, 128, 129, 512, 4096)] == [
        "narrow", None, None, "onednn", "onednn", None, None, "packed", "packed", "packed"]
    assert [small_batch.rows_label(n) for n in (5, 32, 128, 512)] == ["5", "17-32", "33-128", "129+"]
    calls, real = [], small_batch.narrow_linear
    monkeypatch.setattr(small_batch, "narrow_linear", lambda w, b, x: calls.append(x.shape[-2]) or real(w, b, x))
    small_batch.install(tiny_llama.model, {32: "narrow"})
    try:
        with torch.no_grad():
            for n in (16, 20, 40):
                tiny_llama.model(input_ids=torch.arange(3, 3 + n)[None])
    finally:
        small_batch.remove(tiny_llama.model)
    assert calls and set(calls) == {20}  # 16: a few rows, not routed; 40: the 128 band, not routed


def test_choose_keeps_the_overall_fastest_form_unless_another_beats_it_by_the_margin():
    times = {"linear": {1: 10.0, 2: 10.0, 3: 10.0, 4: 10.0, 5: 4.0},
             "narrow": {1: 8.5, 2: 4.8, 3: 4.0, 4: 8.5, 5: 3.8},   # 4% faster than oneDNN at 2, 20% at 3
             "onednn": {1: 4.9, 2: 5.0, 3: 5.0, 4: 9.6, 5: 3.9}}  # fastest over all row counts
    assert small_batch.choose(times) == {1: "onednn", 2: "onednn", 3: "narrow", 4: "narrow"}
    # at 4 only W·xᵀ beats torch by the margin; at 5 nothing does; with one form there is no choice
    assert small_batch.choose({"linear": times["linear"], "narrow": times["narrow"]}) == {1: "narrow", 2: "narrow",
                                                                                         3: "narrow", 4: "narrow"}
    assert small_batch.choose({"linear": times["linear"]}) == {}


def test_tune_leaves_non_cpu_weights_alone(tiny_llama):
    model = tiny_llama.model.to("meta")
    assert small_batch.tune(model)["rows"] == {}


def test_proposer_modules_are_the_drafting_networks_not_the_target(tiny_llama):
    twin = tiny_target("llama")
    assert small_batch.proposer_modules(DraftLM(twin, tiny_llama.vocab_size), tiny_llama) == [twin.model]
    proposer = eagle.create(eagle.Config(), tiny_llama).proposer(tiny_llama)
    assert small_batch.proposer_modules(proposer, tiny_llama) == [proposer.drafter]
    assert small_batch.proposer_modules(PromptLookup(Config()), tiny_llama) == []
    assert small_batch.install_on_proposer(proposer, tiny_llama, [2]) == [proposer.drafter]
    assert small_batch.installed_rows(proposer.drafter) == {2: "narrow"}
    assert small_batch.installed_rows(tiny_llama.model) == {}


def test_eval_reports_the_rows_and_leaves_the_target_as_it_came(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setattr(small_batch, "tune", lambda model, max_rows=8: {
        "rows": [1, 2, 3], "linear_ms": {1: 2.0}, "narrow_ms": {1: 1.0}, "seconds": 0.0})
    config = EvalConfig(target="unused", drafter="prompt-lookup", out=str(tmp_path / "run"), prompts=str(_prompts(tmp_path)),
                        num_prompts=1, max_new_tokens=8, transformers_baseline=False)
    results = evaluate_and_report(config, target=tiny_llama)
    assert results["environment"]["small_batch_linear_rows"] == {1: "narrow", 2: "narrow", 3: "narrow"}
    assert results["lossless"] == {"checked": 1, "identical": 1}
    assert small_batch.installed_rows(tiny_llama.model) == {}
    off = evaluate_and_report(EvalConfig(**{**config.__dict__, "small_batch_linear": False}), target=tiny_llama)
    assert off["environment"]["small_batch_linear_rows"] == {}


def _prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "abc abc abc abc"}\n')
    return path


@pytest.mark.parametrize("form", ["narrow", pytest.param("packed", marks=needs_mkl),
                                  pytest.param("onednn", marks=needs_onednn)])
def test_a_routed_model_copies_pickles_and_follows_changes_to_its_weights(form, tiny_llama):
    """A deep copy or a pickle of a routed model is a model that computes the same (the reordered copies do not
    travel: it runs F.linear until routed again), and a weight changed in place is never read from a stale copy."""
    import copy
    import io

    model = tiny_llama.model
    small_batch.install(model, {n: form for n in range(1, small_batch.MAX_ROWS + 1)})
    tokens = PROMPT[:, :3]
    with torch.no_grad():
        expected = model(tokens).logits
        twin = copy.deepcopy(model)
        torch.testing.assert_close(twin(tokens).logits, expected, atol=1e-5, rtol=1e-5)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        torch.testing.assert_close(torch.load(buffer, weights_only=False)(tokens).logits, expected, atol=1e-5, rtol=1e-5)
        layer = small_batch.linears(model)[-1]  # the output head
        layer.weight.mul_(2.0)  # an in-place change (as an optimizer step makes)
        doubled = model(tokens).logits
        small_batch.remove(model)
        torch.testing.assert_close(doubled, model(tokens).logits, atol=1e-5, rtol=1e-5)
