"""The model card of an EAGLE-3 export: the facts it states (`CardFacts`, the shared ones plus EAGLE-3's own) and
its rendering, a pure function. Gathering the facts and writing the card go through the shared card code
(`draftsmith.export.card`), as for every format."""

from __future__ import annotations

import json
from dataclasses import dataclass

from draftsmith.export import card


@dataclass(kw_only=True)
class CardFacts(card.SharedFacts):
    """Everything the card states, gathered before rendering (rendering is a pure function)."""

    fmt: str
    verifier_is_hub_id: bool
    target_layers: list[int]
    format_layer_ids: list[int]
    draft_vocab_size: int
    target_vocab_size: int
    hidden_size: int
    parameters: int
    speculative_tokens: int
    embedding_included: bool = False
    parallel: bool = False
    layers: int = 1


def _serving_section(facts: CardFacts) -> list[str]:
    """The lines of the card's serving commands: this format's engine first, the other's export after."""
    k = facts.speculative_tokens
    method = {"method": "eagle3", "parallel_drafting": True} if facts.parallel else {"method": "eagle3"}
    vllm_config = json.dumps({**method, "model": facts.model_ref, "num_speculative_tokens": k})
    vllm = f"vllm serve {facts.verifier} \\\n  --speculative-config '{vllm_config}'"
    sglang = (f"python -m sglang.launch_server --model-path {facts.verifier} \\\n"
              f"  --speculative-algorithm EAGLE3 --speculative-draft-model-path {facts.model_ref} \\\n"
              f"  --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}")
    native, other = ("vLLM", "SGLang") if facts.fmt == "speculators" else ("SGLang", "vLLM")
    other_fmt = "sglang" if facts.fmt == "speculators" else "speculators"
    lines = ["## Serving", "", f"This folder is in the **{facts.fmt}** format, which {native} loads.", ""]
    first, second = (vllm, sglang) if facts.fmt == "speculators" else (sglang, vllm)
    if facts.parallel:  # no SGLang layout computes P-EAGLE (`--format sglang` refuses it)
        lines += ["```bash", first, "```", "", "SGLang's EAGLE-3 layer drafts one position per forward; there is no "
                  "SGLang export of a P-EAGLE drafter.", ""]
        return lines
    lines += ["```bash", first, "```", "",
              f"For {other}, export the same checkpoint with `draftsmith export CHECKPOINT --format {other_fmt}` "
              f"and point this command at that folder:", "", "```bash",
              second.replace(facts.model_ref, "EXPORTED_DIR"), "```"]
    if not facts.verifier_is_hub_id:
        lines += ["", f"`{facts.verifier}` is not a hub id; replace it with the hub id or folder of the target model."]
    return lines + [""]


def render_card(facts: CardFacts) -> str:
    """The README.md of an EAGLE-3 export: Hub metadata, what the drafter is, training, results, serving."""
    shift = "+1, vLLM collects the stream entering a layer" if facts.fmt == "speculators" else \
        "unchanged, SGLang adds 1 itself"
    about = [
        f"A speculative-decoding drafter trained with draftsmith for `{facts.verifier}`: "
        f"{'one decoder layer reads' if facts.layers == 1 else f'{facts.layers} decoder layers read'} the target's "
        "hidden states from three layers plus the last token and draft the next tokens, which the target verifies "
        "in one pass. Output is identical to the target's own decoding; "
        "only the speed changes.", "",
        *(["P-EAGLE (parallel drafting): the positions after the first read a mask token and a learned mask hidden "
           "instead of the tokens drafted before them, so one drafter forward drafts all "
           f"{facts.speculative_tokens} tokens.", ""] if facts.parallel else []),
        *card.table([
            ("target layers read (output of 0-based layer)", ", ".join(map(str, facts.target_layers))),
            ("`eagle_aux_hidden_state_layer_ids` in config.json", f"{facts.format_layer_ids} ({shift})"),
            ("draft vocabulary",
             f"{facts.draft_vocab_size} of {facts.target_vocab_size} target tokens (`d2t`/`t2d` map)"),
            ("hidden size", facts.hidden_size), ("parameters", f"{facts.parameters:,}"), ("format", facts.fmt)]), "",
    ]
    if facts.embedding_included:
        about += ["`embed_tokens.weight` is the target's own input embedding, stored for fine-tuning this folder with "
                  "the speculators library without the verifier at hand. vLLM loads it instead of sharing the "
                  "target's; the values are the same.", ""]
    elif facts.fmt == "speculators":
        about += ["No embedding is stored: vLLM shares the target's. To fine-tune this folder with the speculators "
                  "library without the verifier at hand, export again with `--include-embedding`.", ""]
    tags = ["speculative-decoding", "peagle" if facts.parallel else "eagle3", "draftsmith", facts.fmt,
            "vllm" if facts.fmt == "speculators" else "sglang"]
    name = "P-EAGLE" if facts.parallel else "EAGLE-3"
    return card.compose(facts, tags, f"{name} drafter", about, _serving_section(facts), facts.verifier_is_hub_id)
