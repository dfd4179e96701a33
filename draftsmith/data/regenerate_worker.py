"""Runs inside the engine's own venv (`make engine`: .venv-engine), never in draftsmith's: the target's answers for
`draftsmith prepare --regenerate --engine vllm`, written by vLLM, for as long as draftsmith sends batches.

    .venv-engine/bin/python draftsmith/data/regenerate_worker.py settings.json

It imports only the standard library and vLLM, so it can be run by path. The settings file names the target folder,
dtype and whether vLLM runs eager. The engine loads once; then every line on stdin is one batch, as token ids
(draftsmith applied the chat template, and it decodes the answers: the text path is its own), and every batch gets
one line back: the answers' token ids, or the error (with the CPU seconds the process has spent so far). The first
line back says the engine is ready. Everything else
the process prints (vLLM's logs, C++ threads) goes to stderr, so the protocol owns stdout alone.

A batch: {"prompts": [[ids]], "max_tokens": n, "temperature": t, "seeds": [s per prompt], "stop_token_ids": [eos]}.
Decoding stops at the stop tokens only
(`ignore_eos`: the model's generation config adds no stops of its own), as draftsmith's loop stops at the
tokenizer's EOS, or after max_tokens.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path


def load(settings: dict):
    """The engine over the target folder."""
    from vllm import LLM

    return LLM(model=settings["target"], tokenizer=settings["target"], dtype=settings["dtype"],
               seed=settings.get("seed", 0), enforce_eager=settings.get("enforce_eager", False),
               max_num_seqs=settings.get("max_num_seqs", 256), max_model_len=settings.get("max_model_len"))


def answer(llm, batch: dict) -> dict:
    """The batch's answers as token ids, in the order of its prompts."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sampling = [SamplingParams(temperature=batch["temperature"], max_tokens=batch["max_tokens"], seed=seed,
                               ignore_eos=True, stop_token_ids=batch["stop_token_ids"], detokenize=False)
                for seed in batch["seeds"]]
    began = time.perf_counter()
    results = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in batch["prompts"]], sampling,
                           use_tqdm=False)
    outputs = [list(result.outputs[0].token_ids) for result in results]
    return {"outputs": outputs, "seconds": time.perf_counter() - began, "cpu_s": time.process_time()}


def main(argv: list[str]) -> int:
    """Load the engine, say so, then answer every batch on stdin until it closes."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM's prints and logs go to stderr from now on
    sys.stdout = sys.stderr
    settings = json.loads(Path(argv[0]).read_text())
    began = time.perf_counter()
    try:
        llm = load(settings)
    except Exception as error:
        traceback.print_exc()
        protocol.write(json.dumps({"error": f"{type(error).__name__}: {error}"[:2000]}) + "\n")
        protocol.flush()
        return 1
    import vllm

    protocol.write(json.dumps({"ready": True, "load_s": time.perf_counter() - began, "cpu_s": time.process_time(),
                               "vllm_version": vllm.__version__}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        try:
            reply = answer(llm, json.loads(line))
        except Exception as error:
            traceback.print_exc()
            reply = {"error": f"{type(error).__name__}: {error}"[:2000]}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
