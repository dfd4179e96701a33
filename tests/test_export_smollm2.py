"""Export for the real SmolLM2-135M target (30 layers): the layer ids DESIGN §4 spells out, both formats."""

from __future__ import annotations

import json

import pytest
import torch

from test_export_support import draft_vocab, load_exported

from draftsmith import export as ex
from draftsmith.drafters import DecodeState, eagle


@pytest.mark.slow
def test_smollm2_eagle3_exports_and_loads_back(smollm2, tmp_path):
    drafter = eagle.create(eagle.Config(), smollm2, draft_vocab(size=2048, vocab=smollm2.vocab_size))
    drafter.save_pretrained(tmp_path / "run" / "best")
    (tmp_path / "run" / "training.json").write_text(json.dumps({"target": "smollm2-135m-instruct"}))
    assert drafter.config.layers == [1, 14, 26]
    tokens = torch.tensor([smollm2.tokenizer.encode("def fibonacci(n):\n    return")])
    features = smollm2.forward(tokens, layers=drafter.config.layers, logits=False).features
    state = DecodeState(tokens, {i: f[:, :-1] for i, f in features.items()}, prompt_length=tokens.shape[1])
    _, want, _ = eagle.load_proposer(tmp_path / "run" / "best", smollm2)._catch_up(state)
    for fmt, ids in (("speculators", [2, 15, 27]), ("sglang", [1, 14, 26])):
        out = ex.export(tmp_path / "run" / "best", fmt, tmp_path / fmt)
        config = json.loads((out / "config.json").read_text())
        written = config.get("eagle_aux_hidden_state_layer_ids") or config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        assert written == ids
        layer = config.get("transformer_layer_config", config)
        assert layer["vocab_size"] == 49152 and layer["hidden_size"] == 576
        assert layer["rope_theta"] == smollm2.config.rope_parameters["rope_theta"]
        card = (out / "README.md").read_text()
        assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "license: apache-2.0" in card
        _, got, _ = load_exported(out, smollm2)._catch_up(state)
        assert torch.equal(got, want)
