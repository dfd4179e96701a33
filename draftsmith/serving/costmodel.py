"""The measured cost model of one accelerator: seconds of a batched target forward over (b, n, c).

`profile` times real forwards of the target: b requests, each adding n new tokens after c cached
ones, left-padded with an attention mask exactly as a padded batch is served. Two tables come out:
decode/verify passes (b, n small, c > 0) and prefills (b, prompt length n, c = 0). `CostModel`
interpolates each table (multilinearly between measured points: on a CPU the cost is far from linear
in b and n, e.g. 2-3 token rows cost more per row than 5, so no few-term formula fits b = 1 and b = 8
alike) and, outside the measured grid, adds the slopes of a least-squares fit of a few per-unit costs
(fixed, per request, per token row, per cached token, attention) to the nearest measured point;
`fit_error` says how far that fit alone is from the measured points. A batch whose requests differ
pays for its widest row and longest context (padding), which is what the padded forward costs. Mixed batches (b = 2..4, random contexts and widths) are timed in
the same rounds and stored in the profile; every report compares them with the model.
"""

from __future__ import annotations

import bisect
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftsmith.files import read_json

FORMAT = "draftsmith-costmodel/1"


# --------------------------------------------------------------------------- the fitted model
def decode_features(b, n, c) -> np.ndarray:
    """What a padded decode/verify pass pays for: a fixed part, per request, per token row, per cached token
    read, and per (token row × cached token) of attention."""
    b, n, c = (np.asarray(v, dtype=float) for v in (b, n, c))
    return np.stack(np.broadcast_arrays(np.ones_like(b * n * c), b, b * n, b * c, b * n * c / 1e3), axis=-1)


def prefill_features(b, n) -> np.ndarray:
    """What a padded prefill pays for: a fixed part, per prompt token, and attention over prompt tokens squared."""
    b, n = (np.asarray(v, dtype=float) for v in (b, n))
    return np.stack(np.broadcast_arrays(np.ones_like(b * n), b * n, b * n * n / 1e3), axis=-1)


def fit(features: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Least squares on relative error (rows weighted by 1/t): a few coefficients from the whole grid, so one
    noisy point on a shared machine moves the model little."""
    x, y = features.reshape(-1, features.shape[-1]), seconds.reshape(-1)
    coefficients, *_ = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)
    return coefficients


class Table:
    """Multilinear interpolation in a measured grid (plain Python: the simulator calls it for every pass)."""

    def __init__(self, axes, values: np.ndarray):
        self.axes = [[float(v) for v in axis] for axis in axes]
        self.values = np.asarray(values, dtype=float)

    def __call__(self, point: tuple) -> tuple[tuple, float]:
        """(the point clamped into the grid, as floats; the interpolated value there)."""
        inside, corners = [], [((), 1.0)]
        for axis, value in zip(self.axes, point):
            value = min(max(float(value), axis[0]), axis[-1])
            inside.append(value)
            upper = min(bisect.bisect_right(axis, value), len(axis) - 1)
            lower = max(upper - 1, 0)
            span = axis[upper] - axis[lower]
            weight = (value - axis[lower]) / span if span else 0.0
            corners = [(index + (i,), w * share) for index, w in corners
                       for i, share in ((lower, 1.0 - weight), (upper, weight)) if share]
        return tuple(inside), sum(float(self.values[index]) * w for index, w in corners)


@dataclass
class CostModel:
    """Forward times (seconds) of the profiled target, fitted to the measured grid, plus where they were measured."""

    decode_axes: list[list[float]]  # batch sizes, new tokens per request, context lengths
    decode_s: np.ndarray  # [len(b), len(n), len(c)] median seconds
    prefill_axes: list[list[float]]  # batch sizes, prompt lengths
    prefill_s: np.ndarray  # [len(b), len(n)]
    target: dict  # Target.fingerprint()
    machine: dict
    batched_check: list[dict]

    def __post_init__(self):
        grid = np.meshgrid(*self.decode_axes, indexing="ij")
        self.decode_fit = fit(decode_features(*grid), self.decode_s)
        self.prefill_fit = fit(prefill_features(*np.meshgrid(*self.prefill_axes, indexing="ij")), self.prefill_s)
        self.floor = 0.5 * float(self.decode_s.min())  # extrapolation must never promise a free pass
        self._decode, self._prefill = [float(v) for v in self.decode_fit], [float(v) for v in self.prefill_fit]
        self._decode_table = Table(self.decode_axes, self.decode_s)
        self._prefill_table = Table(self.prefill_axes, self.prefill_s)

    def fitted_step(self, batch: int, new_tokens: int, context: int) -> float:
        """The least-squares formula's seconds for a decode/verify pass (the slopes used outside the grid)."""
        fixed, per_request, per_token, per_cached, per_attention = self._decode  # decode_features, unrolled: hot path
        rows = batch * new_tokens
        return fixed + per_request * batch + per_token * rows + per_cached * batch * context + per_attention * rows * context / 1e3

    def fitted_prefill(self, batch: int, prompt_tokens: int) -> float:
        """The least-squares formula's seconds for a prefill."""
        fixed, per_token, per_attention = self._prefill
        tokens = batch * prompt_tokens
        return fixed + per_token * tokens + per_attention * tokens * prompt_tokens / 1e3

    def step(self, batch: int, new_tokens: int, context: int) -> float:
        """Seconds of one decode/verify pass: `batch` rows of `new_tokens` each after `context` cached ones."""
        point = (float(batch), float(new_tokens), float(context))
        inside, seconds = self._decode_table(point)
        if inside != point:  # beyond the grid: the fit's slopes from the nearest measured point
            seconds += self.fitted_step(*point) - self.fitted_step(*inside)
        return max(seconds, self.floor)

    def prefill(self, batch: int, prompt_tokens: int) -> float:
        """Seconds of prefilling `batch` prompts padded to `prompt_tokens`."""
        point = (float(batch), float(prompt_tokens))
        inside, seconds = self._prefill_table(point)
        if inside != point:
            seconds += self.fitted_prefill(*point) - self.fitted_prefill(*inside)
        return max(seconds, self.floor)

    def fit_error(self) -> dict:
        """Median and worst relative error of the fit on the measured grid points (decode and prefill)."""
        grid = np.meshgrid(*self.decode_axes, indexing="ij")
        decode = decode_features(*grid) @ self.decode_fit / self.decode_s - 1
        prefill = prefill_features(*np.meshgrid(*self.prefill_axes, indexing="ij")) @ self.prefill_fit / self.prefill_s - 1
        return {"decode_median": float(np.median(np.abs(decode))), "decode_max": float(np.abs(decode).max()),
                "prefill_median": float(np.median(np.abs(prefill))), "prefill_max": float(np.abs(prefill).max())}

    def to_json(self) -> dict:
        """The profile as stored on disk."""
        return {"format": FORMAT, "target": self.target, "machine": self.machine,
                "decode": {"batch": self.decode_axes[0], "new_tokens": self.decode_axes[1],
                           "context": self.decode_axes[2], "seconds": self.decode_s.tolist()},
                "prefill": {"batch": self.prefill_axes[0], "prompt_tokens": self.prefill_axes[1],
                            "seconds": self.prefill_s.tolist()},
                "batched_check": self.batched_check, "fit_error": self.fit_error()}

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON (parent folders made)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path


def load_profile(path: str | Path) -> CostModel:
    """Read a profile written by `serve-sim profile` (from this machine or any other)."""
    data = read_json(path, f"Profile '{path}' does not exist. Make one with: draftsmith serve-sim profile --out {path}",
                     FORMAT, "a draftsmith cost profile")
    decode, prefill = data["decode"], data["prefill"]
    return CostModel([decode["batch"], decode["new_tokens"], decode["context"]], np.array(decode["seconds"]),
                     [prefill["batch"], prefill["prompt_tokens"]], np.array(prefill["seconds"]),
                     data["target"], data["machine"], data.get("batched_check", []))


# --------------------------------------------------------------------------- measuring
def time_passes(target, contexts: list[int], steps: list[list[int]], seed: int = 0) -> list[float]:
    """Seconds of real padded forwards after one shared prefix: row i holds `contexts[i]` cached tokens and
    adds `step[i]` new ones, for each `step` in `steps` (the cache is cropped back after each).

    Rows are left-padded to the longest context and the widest step, with an attention mask and
    per-row positions, as a padded batch is served. Contexts of 0 time prefills of the step's width."""
    import torch
    from draftsmith.kv_cache import rollback_cache

    generator = torch.Generator().manual_seed(seed)
    device, longest = target.device, max(contexts)

    def padded(lengths: list[int], size: int):
        ids = torch.randint(0, target.vocab_size, (len(lengths), size), generator=generator)
        mask = torch.zeros(len(lengths), size, dtype=torch.long)
        for row, length in enumerate(lengths):
            mask[row, size - length:] = 1
        return ids, mask

    times = []
    with torch.no_grad():
        cache, mask = rollback_cache(target.config), torch.zeros(len(contexts), 0, dtype=torch.long)
        if longest:
            ids, mask = padded(contexts, longest)
            target.forward(ids.to(device), attention_mask=mask.to(device),
                           position_ids=(mask.cumsum(-1) - 1).clamp(min=0).to(device), cache=cache, logits_to_keep=1)
        for step in steps:
            step_ids, step_mask = padded(step, max(step))
            full_mask = torch.cat([mask, step_mask], dim=1)
            positions = (full_mask.cumsum(-1) - 1).clamp(min=0)[:, longest:]
            start = time.perf_counter()
            # a prefill keeps only the last logits (as the decoder's prefill does); a verify pass needs all
            target.forward(step_ids.to(device), attention_mask=full_mask.to(device), position_ids=positions.to(device),
                           cache=cache, logits_to_keep=0 if longest else 1)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            if longest:
                cache.crop(-max(step))
            else:
                cache = rollback_cache(target.config)
    return times


def machine(target) -> dict:
    """What the timings depend on: CPU or GPU model, cores, threads, library versions, dtype."""
    import torch

    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from draftsmith.small_batch import installed_rows

    return {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if target.device.type == "cuda" else str(target.device),
            "dtype": str(target.dtype).removeprefix("torch."), "small_batch_linear_rows": installed_rows(target.model)}


def profile(target, batches, new_tokens, contexts, prompt_lengths, rounds: int = 5, progress=print) -> CostModel:
    """Time the decode grid (b, n, c), the prefill grid (b, prompt length) and the mixed batches of the check.

    Every point is timed once per round and the median over rounds is kept; the order is reversed
    every other round. A shared machine's load drifts over minutes, so spreading each point's timings
    across the whole run lets the drift hit every point, and the check, alike."""
    batches, new_tokens, contexts, prompt_lengths = (sorted(set(int(v) for v in axis))
                                                      for axis in (batches, new_tokens, contexts, prompt_lengths))
    caches = [(i, k) for i in range(len(batches)) for k in range(len(contexts))]
    checks = mixed_batches(new_tokens, contexts)
    decode = np.zeros((rounds, len(batches), len(new_tokens), len(contexts)))
    prefill = np.zeros((rounds, len(batches), len(prompt_lengths)))
    check = np.zeros((rounds, len(checks)))
    for r in range(rounds):
        order = caches if r % 2 == 0 else caches[::-1]
        for i, k in order:
            b = batches[i]
            decode[r, i, :, k] = time_passes(target, [contexts[k]] * b, [[n] * b for n in new_tokens], seed=r)
        for i, b in enumerate(batches):
            prefill[r, i] = time_passes(target, [0] * b, [[n] * b for n in prompt_lengths], seed=r)
        for index, (row_contexts, row_new) in enumerate(checks):
            (check[r, index],) = time_passes(target, row_contexts, [row_new], seed=r)
        progress(f"round {r + 1}/{rounds}: decode b={batches[-1]} c={contexts[-1]} "
                 + ", ".join(f"n={n} {decode[r, -1, j, -1] * 1e3:.0f} ms" for j, n in enumerate(new_tokens)))
    model = CostModel([batches, new_tokens, contexts], np.median(decode, axis=0), [batches, prompt_lengths],
                      np.median(prefill, axis=0), target.fingerprint(), machine(target), [])
    model.batched_check = [{"batch": len(c), "contexts": c, "new_tokens": n, "measured_ms": float(m) * 1e3}
                           for (c, n), m in zip(checks, np.median(check, axis=0))]
    return model


def mixed_batches(new_tokens, contexts, batch_sizes=(2, 3, 4), trials: int = 3, seed: int = 0) -> list[tuple[list, list]]:
    """(contexts, new tokens) of the check's batches: b = 2..4 rows of random context and width inside the grid."""
    rng = np.random.default_rng(seed)
    return [([int(c) for c in rng.integers(contexts[0], contexts[-1] + 1, size=b)],
             [int(n) for n in rng.integers(1, new_tokens[-1] + 1, size=b)])
            for b in batch_sizes for _ in range(trials)]
