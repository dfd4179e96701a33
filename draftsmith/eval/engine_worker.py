"""Runs inside the engine's own venv (`make engine`: .venv-engine), never in draftsmith's: one decoding method of
`draftsmith eval --engine vllm` in vLLM, from a request JSON file to a result JSON file.

    .venv-engine/bin/python draftsmith/eval/engine_worker.py request.json result.json

It imports only the standard library and vLLM (draftsmith's venv has no vLLM, the engine's venv has no draftsmith),
so it can be run by path. The request names the target folder, the prompts as token ids (draftsmith applied the chat
template, so both decoders read the same ids), the sampling options and one `speculative_config` (null: plain
decoding). The prompts are decoded one request at a time, as draftsmith's decoder does, after one untimed warm-up
request. Per request it records the output ids, TTFT, TPOT and end-to-end time, and the engine's speculative
counters (`LLM.get_metrics()`: drafts, draft tokens, accepted tokens per draft position) read before and after it.
A method the engine refuses writes the error and the innermost vLLM file:line that raised it.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def counters(llm) -> dict:
    """The engine's speculative-decoding counters now (all zero and no positions without speculation)."""
    seen = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": []}
    for metric in llm.get_metrics():
        if metric.name in COUNTERS:
            seen[COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == PER_POSITION:
            values = [int(v) for v in metric.values]
            old = seen["accepted_per_position"]
            seen["accepted_per_position"] = [a + b for a, b in zip(values, old + [0] * len(values))] if old else values
    return seen


def difference(after: dict, before: dict) -> dict:
    """Counters accumulated between two readings."""
    per_position = [a - (before["accepted_per_position"][i] if i < len(before["accepted_per_position"]) else 0)
                    for i, a in enumerate(after["accepted_per_position"])]
    return {key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted_tokens")} | {
        "accepted_per_position": per_position}


def refusing_file(error: BaseException) -> str | None:
    """Where vLLM refused, as 'vllm/<path>:<line>': the source line that words a config validator's message (pydantic
    keeps a validator's text, not its traceback), else the innermost frame of the traceback in vLLM's own code."""
    marker, found = "/site-packages/vllm/", None
    for frame in traceback.extract_tb(error.__traceback__):
        if marker in frame.filename:
            found = f"vllm/{frame.filename.split(marker, 1)[1]}:{frame.lineno}"
    message = str(error)
    if "Value error, " in message:
        import vllm

        probe = message.split("Value error, ", 1)[1].split(" [type=")[0].split(":")[0].strip()  # an f-string's constant head
        root = Path(vllm.__file__).parent
        for path in sorted(root.rglob("*.py")) if probe else []:
            for number, line in enumerate(path.read_text(errors="ignore").splitlines(), start=1):
                if probe in line:
                    return f"vllm/{path.relative_to(root)}:{number}"
    return found


def decode(request: dict) -> dict:
    """Load the engine with the request's speculative config, warm it up, decode every prompt, read the counters."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    began = time.perf_counter()
    llm = LLM(model=request["target"], tokenizer=request["target"], dtype=request["dtype"],
              max_model_len=request["max_model_len"], seed=request["seed"], enforce_eager=request["enforce_eager"],
              speculative_config=request["speculative_config"], disable_log_stats=False, max_num_seqs=1)
    loaded_s = time.perf_counter() - began
    options = request["sampling"]
    sampling = SamplingParams(temperature=options["temperature"], top_p=options["top_p"],
                              top_k=options["top_k"] or -1, max_tokens=options["max_tokens"],
                              stop_token_ids=options["stop_token_ids"], seed=request["seed"], detokenize=False)
    warm = SamplingParams(temperature=0.0, max_tokens=8, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=request["prompts"][0]["token_ids"])], warm, use_tqdm=False)
    outputs = []
    for prompt in request["prompts"]:
        before = counters(llm)
        start = time.perf_counter()
        [result] = llm.generate([TokensPrompt(prompt_token_ids=prompt["token_ids"])], sampling, use_tqdm=False)
        e2e_s = time.perf_counter() - start
        stats = result.metrics
        tokens = list(result.outputs[0].token_ids)
        ttft_s = getattr(stats, "first_token_latency", None) or None
        decode_s = (stats.last_token_ts - stats.first_token_ts) if stats is not None else None
        outputs.append({"name": prompt["name"], "token_ids": tokens, "e2e_s": e2e_s, "ttft_s": ttft_s,
                        "tpot_s": decode_s / (len(tokens) - 1) if decode_s is not None and len(tokens) > 1 else None,
                        "counters": difference(counters(llm), before)})
    return {"ok": True, "load_s": loaded_s, "outputs": outputs, "vllm_version": __import__("vllm").__version__}


def main(argv: list[str]) -> int:
    """Decode one request file into one result file; a refusal is a result too (ok: false)."""
    request = json.loads(Path(argv[0]).read_text())
    try:
        result = decode(request)
    except Exception as error:  # the engine refusing a format is a finding, reported by draftsmith
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"[:2000], "refused_by": refusing_file(error)}
    Path(argv[1]).write_text(json.dumps(result) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
