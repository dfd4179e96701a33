"""The one export skeleton (`draftsmith.export.skeleton`): every format's writer only maps, and whatever a writer gets
wrong, in any format, fails the export before a folder ships: a changed tensor, a field that reads back otherwise,
a stray file."""

from __future__ import annotations

import importlib
import inspect
import json

import pytest
import torch
from test_export_support import draft_vocab
from tiny import save_target, tiny_target

from draftsmith import export as ex
from draftsmith.drafters import dflash, draft_lm, eagle, medusa, mtp
from draftsmith.errors import DraftsmithError
from draftsmith.export import skeleton

CASES = [("eagle3", "speculators"), ("eagle3", "sglang"), ("eagle3", "draftsmith"), ("medusa", "medusa"),
         ("mtp", "speculators"), ("dflash", "dflash"), ("dflash", "speculators"), ("dspark", "speculators"),
         ("draft_lm", "hf")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One drafter folder per kind for a tiny Qwen3 target saved as a folder (MTP exports load its final norm)."""
    root = tmp_path_factory.mktemp("skeleton")
    target = tiny_target("qwen3")
    target.name = save_target(target, root / "target")
    made = {
        "eagle3": lambda: eagle.create(eagle.Config(), target, draft_vocab(size=64)),
        "medusa": lambda: medusa.create(medusa.Config(num_heads=2), target),
        "mtp": lambda: mtp.create(mtp.Config(num_modules=2, shared=True), target),
        "dflash": lambda: dflash.create(dflash.Config(block_size=4, num_target_layers=3), target),
        "dspark": lambda: dflash.create(dflash.Config(variant="dspark", block_size=4, num_target_layers=3,
                                                      markov_rank=8), target),
        "draft_lm": lambda: draft_lm.create(draft_lm.Config(num_layers=2), target),
    }
    for name, make in made.items():
        torch.manual_seed(0)
        make().save_pretrained(root / name)
    return root


def test_every_writer_only_maps():
    """Each format's module builds a Layout; writing, reading back, comparing and the card are the skeleton's."""
    modules = {*ex.WRITERS.values(), *ex.FORMAT_WRITERS.values()}
    for name in sorted(modules):
        module = importlib.import_module(name)
        source = inspect.getsource(module)
        assert callable(module.layout) and not hasattr(module, "write"), name
        for call in ("save_file(", "write_text(", "finish_card(", "write_card(", "front_matter("):
            assert call not in source, f"{name} calls {call} itself"


@pytest.mark.parametrize("kind, fmt", CASES)
def test_a_changed_tensor_fails_the_round_trip_in_every_format(checkpoints, tmp_path, monkeypatch, kind, fmt):
    ex.export(checkpoints / kind, fmt, tmp_path / "good")  # the faithful export passes
    write_files = skeleton.write_files

    def off_by_a_little(layout, folder):  # a plausible writer bug: one tensor not quite the checkpoint's
        write_files(layout, folder)
        path = folder / skeleton.WEIGHTS
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(path))
        name = next(n for n in sorted(tensors) if tensors[n].is_floating_point())
        tensors[name] = tensors[name] + 1e-3
        save_file(tensors, str(path), metadata={"format": "pt"})

    monkeypatch.setattr(skeleton, "write_files", off_by_a_little)
    with pytest.raises(DraftsmithError, match=r"(?s)does not convert back to the checkpoint.*changed in the round trip"
                       r"|differs from the checkpoint in model\.safetensors"):
        ex.export(checkpoints / kind, fmt, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_a_field_that_reads_back_otherwise_is_named(tmp_path):
    tensors = {"w": torch.ones(2)}
    trip = skeleton.RoundTrip(lambda folder: ({"config": {"layers": [2, 3]}}, {"w": torch.ones(2)}), tensors,
                              {"config.layers": [1, 2], "config.missing": None})
    with pytest.raises(DraftsmithError, match=r"config\.layers reads back as \[2, 3\], the checkpoint has \[1, 2\]"):
        skeleton.check_round_trip(tmp_path, trip)
    trip.fields = {"config.layers": [2, 3]}
    skeleton.check_round_trip(tmp_path, trip)  # the same values pass
    trip.tensors = {"w": torch.ones(2), "v": torch.ones(1)}
    with pytest.raises(DraftsmithError, match=r"tensor names differ after the round trip: \['v'\]"):
        skeleton.check_round_trip(tmp_path, trip)


def test_a_file_nothing_wrote_fails_the_export(checkpoints, tmp_path, monkeypatch):
    from draftsmith.export import mtp as mtp_export

    real = mtp_export.layout

    def with_a_stray_part(*args):
        layout = real(*args)
        layout.parts = {"notes": lambda folder: None}  # says it writes `notes/`, writes nothing
        return layout

    monkeypatch.setattr(mtp_export, "layout", with_a_stray_part)
    with pytest.raises(DraftsmithError, match="notes is missing"):
        ex.export(checkpoints / "mtp", "speculators", tmp_path / "out")


def test_the_mtp_validator_refuses_what_the_library_would_read_otherwise(checkpoints, tmp_path):
    from draftsmith.export import mtp as mtp_export

    out = ex.export(checkpoints / "mtp", "speculators", tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    config["num_nextn_predict_layers"] = 2
    config["mtp_extra"] = True  # engines drop unknown keys silently
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftsmithError, match="config keys must be exactly.*num_nextn_predict_layers: 1"):
        mtp_export.validate(out)
