"""Requests that repeat, as agents send them: suffix matching with a cross-request cache against per-request matching.

    .venv/bin/python bench/repeated_workload.py --num-prompts 24 --cache-tokens 4096 512

The workload (written by this script, seeded): a tool-using assistant's requests. Every request carries the same
system instructions, one of six tool outputs (the documentation of a Python standard-library function, as a
documentation tool returns it) and one of four task templates (a tool call as JSON, a parameter table as JSON, a
three-point summary, a usage example), with a ticket number of its own. No two requests are the same: each pairs
a tool output with a task once, in a seeded order, so later requests share templates and tool outputs with
earlier ones but never all of a request.

Methods, each one `draftsmith eval` over the requests in that order (T = 0, chains, each method against its own plain
loop interleaved request by request): prompt lookup and suffix matching within each request (what was free
before), then suffix matching with the cross-request cache of earlier outputs at each --cache-tokens bound (its
memory bound in tokens; a small one makes it evict). Printed and recorded: τ and speedup over all requests and
over the later half (where earlier requests can have taught the cache something), the cache's peak tokens against
its bound, the documents it evicted, and the bytes its structure takes (measured by rebuilding it from the cache
file the run wrote, under tracemalloc). The check: the cache at the largest bound beats per-request suffix matching
on speedup, and no cache ever held more tokens than its bound.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records  # bench/: the shared command line and the run's record

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DRAFTSMITH = [sys.executable, "-m", "draftsmith"]

SYSTEM = ("You are the assistant of a small software team. You can call one tool, `docs`, which returns the "
          "documentation of a Python function. When a task asks for JSON, answer with JSON only. Keep answers short.")
TOOLS = ["json.dumps", "os.path.join", "textwrap.wrap", "shutil.copyfile", "random.sample", "functools.lru_cache"]
TASKS = {
    "call": "Ticket #{ticket}: write the JSON tool call that uses `{name}` for the user's request, as "
            '{{"function": ..., "arguments": {{...}}}}, with realistic argument values.',
    "params": "Ticket #{ticket}: list every parameter of `{name}` as a JSON array of objects with the keys "
              '"name", "default" and "meaning".',
    "summary": "Ticket #{ticket}: summarise for the user, in three bullet points, what `{name}` does and when to use it.",
    "example": "Ticket #{ticket}: show a short Python example that calls `{name}`, then explain its output in one sentence.",
}


def documentation(name: str, limit: int = 700) -> str:
    """What the `docs` tool returns for `name`: its signature and docstring, cut at `limit` characters."""
    import importlib

    module, attribute = name.rsplit(".", 1)
    function = getattr(importlib.import_module(module), attribute)
    try:
        signature = f"{name}{inspect.signature(function)}"
    except (TypeError, ValueError):
        signature = name
    return f"{signature}\n\n{inspect.getdoc(function) or ''}"[:limit]


def workload(count: int, seed: int) -> list[dict]:
    """`count` requests (at most tools x tasks), each a (tool output, task) pair once, in a seeded order."""
    pairs = [(tool, task) for tool in TOOLS for task in TASKS]
    if count > len(pairs):
        raise SystemExit(f"--num-prompts: at most {len(pairs)} requests ({len(TOOLS)} tools x {len(TASKS)} tasks).")
    generator = random.Random(seed)
    generator.shuffle(pairs)
    rows = []
    for index, (tool, task) in enumerate(pairs[:count]):
        tool_output = f"[docs] {documentation(tool)}"
        request = TASKS[task].format(ticket=4100 + 7 * index + generator.randrange(7), name=tool)
        rows.append({"messages": [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": f"{request}\n\nOutput of docs(\"{tool}\"):\n```\n"
                                                              f"{tool_output}\n```"}],
                     "category": task})
    return rows


def run(command: list[str]) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, check=True)


def cache_bytes(path: Path, bound: int) -> int | None:
    """Bytes the cache's structure takes in memory: rebuilt from the file the run wrote, under tracemalloc."""
    from draftsmith.drafters.suffix import DocumentCache

    if not path.is_file():
        return None
    tracemalloc.start()
    cache = DocumentCache.load(path, bound)
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del cache
    return size


def half_speedup(per_prompt: list[dict]) -> dict:
    """τ-free view of the later half: its plain time over its speculative time, and its own τ (token-weighted)."""
    later = per_prompt[len(per_prompt) // 2:]
    plain, speculative = sum(p["plain_ms"] for p in later), sum(p["speculative_ms"] for p in later)
    tokens = sum(p["new_tokens"] for p in later)
    passes = sum(p["new_tokens"] / p["acceptance_length"] for p in later if p["acceptance_length"])
    return {"requests": len(later), "speedup": plain / speculative if speculative else None,
            "acceptance_length": tokens / passes if passes else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-tokens", type=int, nargs="+", default=[4096, 512],
                        help="bounds of the cross-request cache to run, in tokens (each one eval)")
    parser.add_argument("--draft-length", type=int, default=8, help="longest chain drafted per verify pass")
    parser.add_argument("--seed", type=int, default=0, help="the workload's order and ticket numbers")
    records.add_shared_options(parser, target="smollm2-135m-instruct", num_prompts=24, max_new_tokens=96,
                               out="runs/bench-repeated-workload",
                               helps={"num_prompts": "requests in the workload (at most 24)",
                                      "out": "where the workload file and every method's eval go"})
    args = parser.parse_args()
    records.start()  # the commit and diff this run is credited to, taken before it measures anything
    if any(bound <= 0 for bound in args.cache_tokens):
        parser.error("--cache-tokens: every bound must be a positive number of tokens")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = out / "requests.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in workload(args.num_prompts, args.seed)))

    methods = {"prompt lookup": (["--drafter", "prompt-lookup"], None),
               "suffix, per request": (["--drafter", "suffix"], None)}
    for bound in args.cache_tokens:
        file = out / f"cache-{bound}.bin"
        methods[f"suffix + cache {bound}"] = (["--drafter", "suffix", "--suffix-cache-tokens", str(bound),
                                               "--suffix-cache-file", str(file)], (bound, file))
    results = {}
    for name, (flags, cache_of) in methods.items():
        folder = out / name.replace(", ", "-").replace(" + ", "-").replace(" ", "-")
        if cache_of:  # each run starts from an empty cache: a file left by an earlier run would warm it
            cache_of[1].unlink(missing_ok=True)
        run([*DRAFTSMITH, "eval", "--target", args.target, "--prompts", str(prompts), "--num-prompts",
             str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens), "--draft-length",
             str(args.draft_length), "--no-transformers-baseline", "--out", str(folder), *flags])
        data = json.loads((folder / "results.json").read_text())
        cache = None
        if cache_of:
            cache = {**data["drafter"]["cache"], "bytes": cache_bytes(cache_of[1], cache_of[0])}
        results[name] = {"acceptance_length": data["acceptance_length"], "speedup": data["speedup"],
                         "tokens_per_s": data["tokens_per_s"]["overall"],
                         "plain_tokens_per_s": data["baselines"]["plain"].get("tokens_per_s"),
                         "lossless": data["lossless"], "later_half": half_speedup(data["per_prompt"]), "cache": cache}

    print(f"\n{'method':<22} {'τ':>6} {'speedup':>8} {'later τ':>8} {'later ×':>8}  cache peak / bound, evicted, bytes")
    for name, row in results.items():
        cache = row["cache"]
        held = (f"{cache['peak_tokens']} / {cache['bound_tokens']}, {cache['evicted_documents']}, {cache['bytes']}"
                if cache else "")
        print(f"{name:<22} {row['acceptance_length']:6.2f} {row['speedup']:8.2f} "
              f"{row['later_half']['acceptance_length']:8.2f} {row['later_half']['speedup']:8.2f}  {held}")
    largest = f"suffix + cache {max(args.cache_tokens)}"
    checks = {"cache_beats_per_request": results[largest]["speedup"] > results["suffix, per request"]["speedup"],
              "cache_within_bound": all(row["cache"]["peak_tokens"] <= row["cache"]["bound_tokens"]
                                        for row in results.values() if row["cache"]),
              "lossless": all(row["lossless"]["identical"] == row["lossless"]["checked"] for row in results.values())}
    print("checks:", json.dumps(checks))
    records.write("repeated_workload", {"num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
                                        "draft_length": args.draft_length, "seed": args.seed,
                                        "tools": TOOLS, "tasks": list(TASKS), "methods": results, "checks": checks},
                  args)


if __name__ == "__main__":
    main()
