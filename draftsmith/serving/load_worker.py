"""Runs inside the engine's own venv (`make engine`: .venv-engine), never in draftsmith's: one serving method of the
engine load bench (`draftsmith.serving.engine_load`) in vLLM, from a request JSON file to a result JSON file.

    .venv-engine/bin/python draftsmith/serving/load_worker.py request.json result.json

Standard library and vLLM only, run by path (like eval/engine_worker.py). vLLM's AsyncLLM (the V1 engine the API
server uses: a frontend in this process, the engine core in a process of its own) is loaded once with the request's
`speculative_config` (null: plain decoding), warmed up with `cap` requests at once, then every schedule of the request
is replayed in turn: each request is submitted at its arrival time, at most `cap` in flight (an asyncio semaphore,
first come first served; the engine's max_num_seqs is `cap` too), and the next schedule starts once the last one has
drained. Per request it records, in seconds from the schedule's start (time.monotonic(), which the engine core's
timestamps use too): arrival, submitted (a slot was free), first token and finish as this process saw the outputs
stream, the tokens it got, and the engine's own RequestStateStats (queued, scheduled, first and last token) when the
output carries them. Prefix caching is off: every rate replays the same prompts, and a cached prompt would skip the
prefill the simulator charges.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
from pathlib import Path

ENGINE_TIMES = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")


def engine(request: dict):
    """The AsyncLLM of the request: target, dtype, the concurrency cap as max_num_seqs, no prefix caching."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    arguments = AsyncEngineArgs(model=request["target"], tokenizer=request["target"], dtype=request["dtype"],
                                max_model_len=request["max_model_len"], seed=request["seed"],
                                enforce_eager=request["enforce_eager"], max_num_seqs=request["cap"],
                                speculative_config=request["speculative_config"], enable_prefix_caching=False,
                                disable_log_stats=False)
    return AsyncLLM.from_engine_args(arguments)


def sampling(max_tokens: int):
    """Greedy, exactly `max_tokens` new tokens (EOS ignored: the simulator replays traced lengths), token ids only,
    one output per engine step (DELTA: the stream's timestamps are the steps')."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True,
                          detokenize=False, output_kind=RequestOutputKind.DELTA)


async def serve_one(llm, request_id: str, token_ids: list[int], max_tokens: int, arrival: float, start: float,
                    slots: asyncio.Semaphore) -> dict:
    """Wait for the arrival time, then for a slot, then stream the request's outputs; its times from `start`."""
    from vllm.inputs import TokensPrompt

    await asyncio.sleep(max(0.0, start + arrival - time.monotonic()))
    async with slots:
        submitted = time.monotonic() - start
        first, tokens, stats = None, 0, None
        async for output in llm.generate(TokensPrompt(prompt_token_ids=token_ids), sampling(max_tokens), request_id):
            tokens += len(output.outputs[0].token_ids)
            if first is None and tokens:
                first = time.monotonic() - start
            stats = output.metrics if output.metrics is not None else stats
        finish = time.monotonic() - start
    seen = {"arrival": arrival, "submitted": submitted, "first_token": first, "finish": finish, "tokens": tokens}
    if stats is not None:  # the engine core's own clock (monotonic), from the same start
        seen["engine"] = {name: getattr(stats, name) - start for name in ENGINE_TIMES if getattr(stats, name, 0.0)}
    return seen


async def replay(llm, request: dict) -> list[dict]:
    """Every schedule, one after another: {label, requests: [per-request times]}."""
    prompts, cap = request["prompts"], request["cap"]
    warm = [serve_one(llm, f"warm-{i}", prompts[i % len(prompts)]["token_ids"], 8, 0.0, time.monotonic(),
                      asyncio.Semaphore(cap)) for i in range(cap)]
    await asyncio.gather(*warm)
    schedules = []
    for number, schedule in enumerate(request["schedules"]):
        slots, start = asyncio.Semaphore(cap), time.monotonic() + 0.05
        jobs = [serve_one(llm, f"{number}-{index}", prompts[row["prompt"]]["token_ids"], prompts[row["prompt"]]["max_tokens"],
                          row["time"], start, slots) for index, row in enumerate(schedule["arrivals"])]
        served = await asyncio.gather(*jobs)
        for row, seen in zip(schedule["arrivals"], served):
            seen["prompt"] = prompts[row["prompt"]]["name"]
        schedules.append({"label": schedule["label"], "requests": served})
        print(f"load worker: schedule {schedule['label']} served ({len(served)} requests)", flush=True)
    return schedules


def scheduler_settings(llm) -> dict:
    """What vLLM's scheduler did with our arguments: batch limits, chunked prefill, prefix caching."""
    config = llm.vllm_config
    return {"max_num_seqs": config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "chunked_prefill": getattr(config.scheduler_config, "enable_chunked_prefill", None),
            "prefix_caching": getattr(config.cache_config, "enable_prefix_caching", None)}


async def run(request: dict) -> dict:
    """Load the engine, replay the schedules, shut it down."""
    began = time.monotonic()
    llm = engine(request)
    try:
        loaded_s = time.monotonic() - began
        schedules = await replay(llm, request)
        return {"ok": True, "load_s": loaded_s, "schedules": schedules, "scheduler": scheduler_settings(llm),
                "vllm_version": __import__("vllm").__version__}
    finally:
        llm.shutdown()
        del llm  # its __del__ shuts down again: now, not at interpreter exit when vLLM's modules are gone


def main(argv: list[str]) -> int:
    """Serve one request file into one result file; a refusal is a result too (ok: false)."""
    request = json.loads(Path(argv[0]).read_text())
    try:
        result = asyncio.run(run(request))
    except Exception as error:  # the engine refusing a method is a finding, reported by draftsmith
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"[:2000]}
    Path(argv[1]).write_text(json.dumps(result) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
