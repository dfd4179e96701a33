"""import-features: vLLM-extracted hidden states (speculators' data-generation layout) -> a draftsmith capture.

The fixture is written here in the layout speculators 0.9.0 writes: its own `build_speculator_training_dataset`
+ `save_to_disk` for the rows (as `speculators prepare-data` does), and one hs_<row>.safetensors per row holding
what vLLM's `extract_hidden_states` stores, computed from vLLM's definition (aux id k = the stream entering
decoder layer k; id L = the stream entering the final norm) with hooks independent of draftsmith's own.
speculators' training reader loading the fixture is what proves the layout.
"""

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import save_target, tiny_target

from draftsmith.data.capture import FeatureShards, capture_batch, collate, read_manifest
from draftsmith.data.engine_import import ImportConfig, engine_layer_ids, import_engine_features
from draftsmith.data.offline import verify_capture
from draftsmith.errors import DraftsmithError

pytest.importorskip("speculators", reason="the fixture is built and checked with speculators' own code")

ROOT = Path(__file__).resolve().parents[1]
ENGINE_IDS = [2, 4, 5, 8]  # speculators' default for an 8-layer target: [2, L//2, L-3, L]
OUR_LAYERS = [1, 3, 4, 7]  # the same tensors in draftsmith's numbering: `eagle3` for 8 layers
LENGTHS = [9, 23, 14, 31, 6, 18, 11]


def vllm_hidden_states(target, input_ids: torch.Tensor, engine_ids: list[int]) -> torch.Tensor:
    """[T, n, H] as vLLM stacks it: per aux id k ascending, the hidden stream entering decoder layer k (k = L:
    entering the final norm), taken with forward pre-hooks on those modules."""
    seen = {}

    def keep(k):
        def hook(_module, args, kwargs):
            seen[k] = (args[0] if args else kwargs["hidden_states"])[0].detach().clone()
        return hook

    inner = target.model.model
    modules = {k: inner.layers[k] if k < len(inner.layers) else inner.norm for k in engine_ids}
    handles = [modules[k].register_forward_pre_hook(keep(k), with_kwargs=True) for k in engine_ids]
    try:
        with torch.no_grad():
            target.model(input_ids[None])
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack([seen[k] for k in sorted(engine_ids)], dim=1)


def rows_for_test() -> tuple[list[list[int]], list[list[int]]]:
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in LENGTHS]
    masks = [[0] * (n // 3) + [1] * (n - n // 3) for n in LENGTHS]
    return ids, masks


@pytest.fixture(scope="module")
def engine_data(tmp_path_factory):
    """SOURCE (prepared rows + hidden_states/hs_<row>.safetensors) for the tiny Llama target, in float32."""
    from datasets import Dataset
    from speculators.data_generation.preprocessing import build_speculator_training_dataset

    target = tiny_target("llama")
    source = tmp_path_factory.mktemp("engine") / "speculators-data"
    ids, masks = rows_for_test()
    rows = build_speculator_training_dataset(Dataset.from_dict({"input_ids": ids, "loss_mask": masks}),
                                             target.tokenizer, max_length=512, num_proc=1)
    rows.save_to_disk(str(source))  # what `speculators prepare-data` does with it
    (source / "hidden_states").mkdir()
    hidden = []
    for row, tokens in enumerate(ids):
        states = vllm_hidden_states(target, torch.tensor(tokens), ENGINE_IDS)
        save_file({"hidden_states": states, "token_ids": torch.tensor(tokens, dtype=torch.int64)},
                  str(source / "hidden_states" / f"hs_{row}.safetensors"))
        hidden.append(states)
    return SimpleNamespace(target=target, source=source, ids=ids, masks=masks, hidden=hidden)


def run_import(data, out: Path, source: Path | None = None, **options) -> dict:
    config = ImportConfig(source=str(source or data.source), out=str(out), dtype="fp32", **options)
    return import_engine_features(config, data.target)


def matches_capture(target, shards: FeatureShards, labelled: list[int]) -> dict[int, bool]:
    """Per stored layer id: do its features equal `capture_batch`'s at that id for the same tokens?"""
    items = [shards[i] for i in range(len(shards))]
    captured = capture_batch(target, collate(items), labelled, dtype=torch.float32)
    result = {}
    for layer in labelled:
        result[layer] = all(
            torch.allclose(item["features"][layer], captured["features"][layer][row, : len(item["input_ids"])],
                           atol=1e-5, rtol=1e-4)
            for row, item in enumerate(items))
    return result


# --------------------------------------------------------------------------- the layout
def test_fixture_is_what_speculators_training_reads_and_the_import_carries_the_same_numbers(engine_data, tmp_path):
    from speculators.data_generation.offline import check_hidden_states
    from speculators.train.data import ArrowDataset

    theirs = ArrowDataset(max_len=512, datapath=str(engine_data.source), on_missing="raise",
                          hidden_states_dtype=torch.float32)
    run_import(engine_data, tmp_path / "out")
    ours = FeatureShards(tmp_path / "out", expect_fingerprint=engine_data.target.fingerprint(),
                         expect_layers=OUR_LAYERS)
    assert len(theirs) == len(ours) == len(LENGTHS)
    for row in range(len(LENGTHS)):
        check_hidden_states(load_file(engine_data.source / "hidden_states" / f"hs_{row}.safetensors"),
                            engine_data.ids[row])
        item, mine = theirs[row], ours[row]
        assert item["input_ids"].tolist() == mine["input_ids"].tolist() == engine_data.ids[row]
        assert item["loss_mask"].tolist() == mine["loss_mask"].tolist() == engine_data.masks[row]
        # speculators' trainer: the aux layers flattened, the last one split off as the verifier's last state
        assert torch.equal(item["hidden_states"], torch.cat([mine["features"][i] for i in OUR_LAYERS[:-1]], -1))
        assert torch.equal(item["verifier_last_hidden_states"], mine["features"][OUR_LAYERS[-1]])


def test_engine_layer_ids_default_and_order():
    assert engine_layer_ids("default", 8) == ENGINE_IDS
    assert engine_layer_ids("8,2,5", 8) == [2, 5, 8]  # vLLM stacks them in layer order, not config order
    for bad in ("0,4", "2,2", "9", "a,b"):
        with pytest.raises(DraftsmithError, match="engine-layers"):
            engine_layer_ids(bad, 8)


# --------------------------------------------------------------------------- the numbers
def test_imported_features_equal_capture_at_the_converted_layers(engine_data, tmp_path):
    manifest = run_import(engine_data, tmp_path / "out", samples_per_shard=3)
    assert manifest["layers"] == OUR_LAYERS and manifest["num_samples"] == len(LENGTHS)
    assert manifest["num_tokens"] == sum(LENGTHS) and manifest["hidden_size"] == 64
    shards = FeatureShards(tmp_path / "out", expect_fingerprint=engine_data.target.fingerprint(),
                           expect_layers=OUR_LAYERS)
    # the last layer too: vLLM's id L is the last layer's output before the final norm, as draftsmith's L-1
    assert matches_capture(engine_data.target, shards, OUR_LAYERS) == {layer: True for layer in OUR_LAYERS}
    assert verify_capture(tmp_path / "out")["ok"]


def test_a_wrong_layer_mapping_fails_the_equality(engine_data, tmp_path, monkeypatch):
    from draftsmith.data import engine_import

    monkeypatch.setattr(engine_import, "draftsmith_layer", lambda engine_layer: engine_layer)  # no shift
    run_import(engine_data, tmp_path / "out")
    shards = FeatureShards(tmp_path / "out")
    assert shards.layers == [2, 4, 5, 8]  # 8 names no layer of this target at all
    assert matches_capture(engine_data.target, shards, [2, 4, 5]) == {2: False, 4: False, 5: False}


def test_fp8_connector_files_read_as_speculators_dequantizes_them(engine_data, tmp_path):
    from hs_connectors.fp8_utils import SCALES_KEY, quantize_tensor_to_fp8
    from hs_connectors.transfer import FP8Transfer

    source = tmp_path / "fp8-data"
    shutil.copytree(engine_data.source, source)
    for row, states in enumerate(engine_data.hidden):
        values, scales = quantize_tensor_to_fp8(states)
        save_file({"hidden_states": values, SCALES_KEY: scales,
                   "token_ids": torch.tensor(engine_data.ids[row], dtype=torch.int64)},
                  str(source / "hidden_states" / f"hs_{row}.safetensors"))
    run_import(engine_data, tmp_path / "out", source=source)
    shards = FeatureShards(tmp_path / "out")
    theirs = FP8Transfer(source / "hidden_states", dequantize_dtype=torch.float32)
    for row in range(len(LENGTHS)):
        dequantized = theirs.get_cached(row)["hidden_states"]
        for position, layer in enumerate(OUR_LAYERS):
            assert torch.equal(shards[row]["features"][layer], dequantized[:, position])
            assert torch.allclose(shards[row]["features"][layer], engine_data.hidden[row][:, position],
                                  rtol=0.07, atol=1e-3)


def test_fp8_storage_reads_back_as_bf16_close_to_the_source(engine_data, tmp_path):
    manifest = import_engine_features(ImportConfig(source=str(engine_data.source), out=str(tmp_path / "out"),
                                                   dtype="fp8"), engine_data.target)
    assert manifest["dtype"] == "float8_e4m3fn"
    shards = FeatureShards(tmp_path / "out")
    for row in range(len(LENGTHS)):
        for position, layer in enumerate(OUR_LAYERS):
            got, want = shards[row]["features"][layer], engine_data.hidden[row][:, position]
            assert got.dtype == torch.bfloat16
            torch.testing.assert_close(got.float(), want, rtol=0.08, atol=0.02 * float(want.abs().max()))


# --------------------------------------------------------------------------- resume and refusals
def test_resume_rewrites_only_the_deleted_shard(engine_data, tmp_path):
    out = tmp_path / "out"
    first = run_import(engine_data, out, samples_per_shard=2)
    assert first["num_shards"] == 4
    before = {path.name: (path.stat().st_ino, path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
              for path in out.glob("shard-*.safetensors")}
    (out / "shard-00001.safetensors").unlink()
    (out / "shard-00001.json").unlink()
    (out / "shard-00002.json").unlink()  # killed after shard 2's rename, before its sidecar
    (out / ".shard-00003.safetensors.tmp999").write_bytes(b"half a shard")
    (out / "manifest.json").unlink()

    again = run_import(engine_data, out, samples_per_shard=2)
    after = {path.name: (path.stat().st_ino, path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
             for path in out.glob("shard-*.safetensors")}
    assert after.keys() == before.keys()
    for name, (inode, mtime, sha256) in before.items():
        if name == "shard-00001.safetensors":  # the same bytes in a new file
            assert after[name][2] == sha256 and after[name][:2] != (inode, mtime)
        else:
            assert after[name] == (inode, mtime, sha256), f"{name} was rewritten"
    assert not list(out.glob(".*.tmp*"))
    assert again == first == read_manifest(out)


def test_a_rerun_with_other_settings_is_refused(engine_data, tmp_path):
    run_import(engine_data, tmp_path / "out")
    with pytest.raises(DraftsmithError, match="different settings"):
        run_import(engine_data, tmp_path / "out", layers="1,7")


def corrupt_truncated(folder: Path) -> str:
    path = folder / "hs_3.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return "hs_3.safetensors"


def corrupt_tokens(folder: Path) -> str:
    stored = load_file(folder / "hs_2.safetensors")
    stored["token_ids"] = stored["token_ids"].flip(0)
    save_file(stored, str(folder / "hs_2.safetensors"))
    return "hs_2.safetensors"


def corrupt_key(folder: Path) -> str:
    save_file({"hidden_states": load_file(folder / "hs_1.safetensors")["hidden_states"]},
              str(folder / "hs_1.safetensors"))
    return "hs_1.safetensors"


def corrupt_layer_count(folder: Path) -> str:
    stored = load_file(folder / "hs_4.safetensors")
    stored["hidden_states"] = stored["hidden_states"][:, :3].contiguous()  # as if the last layer were not added
    save_file(stored, str(folder / "hs_4.safetensors"))
    return "hs_4.safetensors"


def corrupt_missing(folder: Path) -> str:
    (folder / "hs_5.safetensors").unlink()
    return "hs_5.safetensors"


def corrupt_lock(folder: Path) -> str:
    (folder / "hs_0.safetensors.lock").write_bytes(b"")
    return "hs_0.safetensors"


def corrupt_pickles(folder: Path) -> str:
    for path in folder.iterdir():
        path.unlink()
    torch.save({"hidden_states": torch.zeros(2, 2)}, folder / "data_0.pt")
    return "data_0.pt"


@pytest.mark.parametrize("corrupt, why", [
    (corrupt_truncated, "not a readable safetensors file"), (corrupt_tokens, "other tokens than row 2"),
    (corrupt_key, "no 'token_ids' tensor"), (corrupt_layer_count, "launch_vllm.py appends the last layer"),
    (corrupt_missing, "--allow-missing"), (corrupt_lock, "still being written"), (corrupt_pickles, "pickle files"),
])
def test_malformed_input_is_refused_naming_the_file(engine_data, tmp_path, corrupt, why):
    source = tmp_path / "data"
    shutil.copytree(engine_data.source, source)
    name = corrupt(source / "hidden_states")
    with pytest.raises(DraftsmithError, match=why) as caught:
        run_import(engine_data, tmp_path / "out", source=source)
    assert name in str(caught.value)


def test_allow_missing_imports_the_rows_that_have_hidden_states(engine_data, tmp_path):
    source = tmp_path / "data"
    shutil.copytree(engine_data.source, source)
    corrupt_missing(source / "hidden_states")
    manifest = run_import(engine_data, tmp_path / "out", source=source, allow_missing=True, samples_per_shard=4)
    assert manifest["num_samples"] == len(LENGTHS) - 1
    shards = FeatureShards(tmp_path / "out")
    kept = [row for row in range(len(LENGTHS)) if row != 5]
    assert [shards[i]["input_ids"].tolist() for i in range(len(shards))] == [engine_data.ids[r] for r in kept]
    stored = load_file(tmp_path / "out" / "shard-00001.safetensors")
    assert stored["source_rows"].tolist() == [4, 6] and stored["sample_ids"].tolist() == [4, 5]
    assert verify_capture(tmp_path / "out")["ok"]


def test_layers_vllm_did_not_extract_are_refused(engine_data, tmp_path):
    with pytest.raises(DraftsmithError, match=r"including \[3\]"):  # draftsmith 2 = vLLM 3
        run_import(engine_data, tmp_path / "out", layers="1,2")
    run_import(engine_data, tmp_path / "out", layers="eagle3")
    with pytest.raises(DraftsmithError, match=r"missing \[2\]"):
        FeatureShards(tmp_path / "out", expect_layers=[1, 2])
    with pytest.raises(DraftsmithError, match="cannot train a drafter for this target"):
        FeatureShards(tmp_path / "out", expect_fingerprint=tiny_target("llama", seed=1, num_layers=6).fingerprint())


# --------------------------------------------------------------------------- the command line
def test_cli_imports_with_a_weightless_target(engine_data, tmp_path):
    from draftsmith.target import load_target

    folder = save_target(engine_data.target, tmp_path / "tiny-llama")
    result = subprocess.run(
        [sys.executable, "-m", "draftsmith", "import-features", "--source", str(engine_data.source),
         "--target", folder, "--layers", "eagle3", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert result.returncode == 0, result.stderr
    assert f"imported {len(LENGTHS)} samples" in result.stdout
    shards = FeatureShards(tmp_path / "out", expect_fingerprint=load_target(folder).fingerprint(),
                           expect_layers=OUR_LAYERS)
    assert shards[0]["features"][7].dtype == torch.bfloat16

    by_fingerprint = import_engine_features(
        ImportConfig(source=str(engine_data.source), out=str(tmp_path / "out2"), layers="eagle3"),
        fingerprint=load_target(folder).fingerprint(), num_layers=8)
    assert by_fingerprint["target"] == read_manifest(tmp_path / "out")["target"]
    assert by_fingerprint["shards"] == read_manifest(tmp_path / "out")["shards"]

    missing = subprocess.run([sys.executable, "-m", "draftsmith", "import-features", "--source",
                              str(tmp_path / "nowhere"), "--target", folder, "--out", str(tmp_path / "out3")],
                             capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert missing.returncode == 2 and "nowhere" in missing.stderr and "Traceback" not in missing.stderr
