"""Regeneration through vLLM against draftsmith's own loop: the same rows answered both ways in one run.

    .venv/bin/python bench/regeneration.py --rows 64 --inputs builtin:general builtin:exercises --max-new-tokens 128

The first --rows rows of the inputs (an equal share of each, as prepare's --max-rows-per-input takes them) are
answered greedily by `regenerate_conversations`, as `draftsmith prepare --regenerate` answers them (chat template,
on-policy turn order, batches of --batch-size, the target in prepare's --dtype auto), twice, each into a fresh cache:
with our batched loop, then with vLLM (prepare.engine=vllm, `make engine`). Each side's time is the whole call, the
engine's start-up included (printed apart too: it is paid once per prepare run, so a larger set amortises it), in
wall seconds and in CPU seconds (this process's and the engine's, every thread): on a machine shared with other jobs,
or where processes get paused, the CPU seconds compare the two sides where the wall clock cannot.

Printed and recorded: rows per minute and answer tokens per minute of each side (answer tokens: every assistant turn,
as the target's tokenizer encodes its text), the engine's ratio to our loop, with and without its start-up, and
greedy identity: rows whose every answer is the same text. For a row that differs, its first differing turn (the
prompts up to it are the same), the first differing token of the two answers (each re-encoded from its text) and
our target's logit gap there between our token and vLLM's (one forward of the prompt and the common prefix): a gap
near zero is a near tie that float arithmetic in another order may flip.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # bench/: the shared command line and the run's record

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--rows", type=int, default=64, help="rows answered by each side")
parser.add_argument("--inputs", nargs="+", default=["builtin:general", "builtin:exercises"],
                    help="prepare inputs the rows come from, an equal share of each")
parser.add_argument("--batch-size", type=int, default=32, help="conversations generated together (both sides)")
parser.add_argument("--engine-eager", action="store_true", help="vLLM without torch.compile (loads faster)")
records.add_shared_options(parser, target="smollm2-135m-instruct", max_new_tokens=128, out="runs/bench-regeneration",
                           helps={"max_new_tokens": "longest answer (prepare --max-new-tokens)",
                                  "out": "where both sides' caches and the engine's log go"})
args = parser.parse_args()
records.start()  # the commit and diff this run is credited to, taken before it measures anything

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from draftsmith.data.prepared import _Rejections, read_conversations  # noqa: E402
from draftsmith.data.regenerate import regenerate_conversations  # noqa: E402
from draftsmith.data.regenerate_engine import EngineWriter  # noqa: E402
from draftsmith.data.templates import encode_prompt  # noqa: E402
from draftsmith.target import in_dtype, load_target, working_dtype  # noqa: E402

out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
per_input = -(-args.rows // len(args.inputs))
_, rows = read_conversations(args.inputs, _Rejections(strict=False), max_rows=args.rows, max_rows_per_input=per_input)
rows = [(f"{source}:{line}", record) for source, line, record in rows]
target = load_target(args.target)
writer = in_dtype(target, working_dtype("auto", target))
dtype = str(writer.dtype).removeprefix("torch.")
tokenizer = writer.tokenizer


def answers(record) -> list[str]:
    """The assistant turns (a completion's text) of a regenerated row."""
    if isinstance(record, dict):
        return [record["completion"]]
    return [m["content"] for m in record if m["role"] == "assistant"]


def answer_tokens(records_: list) -> int:
    return sum(len(tokenizer.encode(text, add_special_tokens=False)) for r in records_ for text in answers(r))


def regenerate(name: str, engine=None) -> tuple[list, float, float]:
    """One side: every row answered into a fresh cache; (records, wall seconds, CPU seconds of this process and the
    engine's)."""
    cache = out / f"{name}.jsonl"
    cache.unlink(missing_ok=True)
    began, cpu = time.perf_counter(), time.process_time()
    done = regenerate_conversations(writer, rows, cache, temperature=0.0, max_new_tokens=args.max_new_tokens,
                                    batch_size=args.batch_size, seed=0, engine=engine)
    return done, time.perf_counter() - began, time.process_time() - cpu + (engine.cpu_seconds if engine else 0.0)


@torch.no_grad()
def first_difference(ours, theirs) -> dict:
    """Where two answers to one row part: turn, token position, both tokens and our logit gap between them."""
    turn = next(k for k, (a, b) in enumerate(zip(answers(ours), answers(theirs))) if a != b)
    if isinstance(ours, dict):
        prompt = ours["prompt"]
    else:
        prompt = ours[:[i for i, m in enumerate(ours) if m["role"] == "assistant"][turn]]
    ids = encode_prompt(tokenizer, prompt)
    a, b = (tokenizer.encode(answers(r)[turn], add_special_tokens=False) + [tokenizer.eos_token_id]
            for r in (ours, theirs))
    position = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    logits = writer.model(input_ids=torch.tensor([ids + a[:position]])).logits[0, -1].float()
    return {"turn": turn, "token_position": position, "ours": tokenizer.decode([a[position]]),
            "vllm": tokenizer.decode([b[position]]),
            "our_logit_gap": round(float(logits[a[position]] - logits[b[position]]), 4)}


print(f"{len(rows)} rows of {', '.join(args.inputs)}; {args.max_new_tokens} new tokens, batches of {args.batch_size}, "
      f"greedy, {dtype}", flush=True)
ours, our_seconds, our_cpu = regenerate("ours")
with EngineWriter(args.target, dtype, out, eager=args.engine_eager) as engine:
    theirs, engine_seconds, engine_cpu = regenerate("vllm", engine)
start_seconds, vllm_version = engine.load_seconds or 0.0, engine.vllm_version

sides = {}
for name, done, seconds, cpu in (("draftsmith", ours, our_seconds, our_cpu),
                                 ("vllm", theirs, engine_seconds, engine_cpu)):
    tokens = answer_tokens(done)
    sides[name] = {"seconds": round(seconds, 1), "rows": len(done), "answer_tokens": tokens,
                   "rows_per_minute": round(len(done) / seconds * 60, 2),
                   "answer_tokens_per_minute": round(tokens / seconds * 60, 1), "cpu_seconds": round(cpu, 1),
                   "rows_per_cpu_minute": round(len(done) / cpu * 60, 2)}
answering = engine_seconds - start_seconds
sides["vllm"].update(start_seconds=round(start_seconds, 1),
                     rows_per_minute_without_start=round(len(theirs) / answering * 60, 2))
differing = {key: first_difference(a, b) for (key, _), a, b in zip(rows, ours, theirs) if answers(a) != answers(b)}
result = {"target": args.target, "dtype": dtype, "inputs": args.inputs, "rows": len(rows),
          "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size, "engine_eager": args.engine_eager,
          "vllm_version": vllm_version, "sides": sides,
          "engine_ratio": round(our_seconds / engine_seconds, 3),
          "engine_ratio_without_start": round(our_seconds / answering, 3),
          "engine_ratio_cpu": round(our_cpu / engine_cpu, 3),
          "identical_rows": len(rows) - len(differing), "differing": differing}

print(f"\n{'side':<11} {'seconds':>8} {'rows/min':>9} {'tokens/min':>11} {'CPU s':>8} {'rows/CPU min':>13}")
for name, side in sides.items():
    print(f"{name:<11} {side['seconds']:8.1f} {side['rows_per_minute']:9.2f} {side['answer_tokens_per_minute']:11.1f} "
          f"{side['cpu_seconds']:8.1f} {side['rows_per_cpu_minute']:13.2f}")
print(f"vLLM / ours: {result['engine_ratio']:.3f}x rows per minute ({result['engine_ratio_without_start']:.3f}x "
      f"without its {start_seconds:.0f} s start-up; {result['engine_ratio_cpu']:.3f}x rows per CPU second); "
      f"identical answers {result['identical_rows']}/{len(rows)} rows")
for key, where in differing.items():
    print(f"  {key}: turn {where['turn']}, token {where['token_position']}: ours {where['ours']!r}, vLLM "
          f"{where['vllm']!r}, our logit gap {where['our_logit_gap']}")
(out / "regeneration.json").write_text(json.dumps(result, indent=1) + "\n")
records.write("regeneration", result, args)
