"""Benchmark: first GGUF load (dequantize + cache) vs a cached load, measured in one run.

    .venv/bin/python bench/studies/target_load.py

Uses a fresh temporary cache directory so the first load really dequantizes.

Study, settled: GGUF files are dequantized once and cached as safetensors (`~/.cache/draftsmith` or
$DRAFTSMITH_CACHE). No measured figure of this bench was kept in README.md or the git log.
"""

import argparse
import os
import tempfile
import time


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["DRAFTSMITH_CACHE"] = cache
        from draftsmith.target import load_target

        start = time.perf_counter()
        load_target("smollm2-135m-instruct")
        first = time.perf_counter() - start
        start = time.perf_counter()
        load_target("smollm2-135m-instruct")
        cached = time.perf_counter() - start
    print(f"first load (dequantize GGUF + write cache): {first:6.2f} s")
    print(f"cached load (safetensors):                  {cached:6.2f} s")
    print(f"ratio first/cached: {first / cached:.1f}x (goal >= 5x)")


if __name__ == "__main__":
    main()
