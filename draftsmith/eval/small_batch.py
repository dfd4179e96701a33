"""Linear layers for the few-row products of decoding on CPU: y = (W·xᵀ)ᵀ where that is measured faster.

Decoding multiplies every weight matrix by 1 row (a plain step) or by 2..k+1 rows (a verify pass).
Both should cost about one read of the weights. On some CPUs the BLAS path torch takes for x·Wᵀ
with a few rows is far from that: on the 2-core AMD EPYC (AVX2, MKL 2024.2) this project is
measured on, SmolLM2-135M's linear layers take 76 ms for 1 row but 132 ms for 2 rows and 143 ms
for 4, while the same products written as W·xᵀ (the row block as the narrow right-hand side,
1 row padded to 2) take 58, 54 and 55 ms. That flattens the target's verify-cost curve, which is
what a speculative decoder's speedup is made of: τ·t(1)/t(n+1) for n drafted tokens.

`tune` times both forms on the model's own weights for 1..max_rows rows and `install` routes only
the row counts where W·xᵀ won by a clear margin; every other call is torch's own `F.linear`.
Results agree with `F.linear` to float rounding (the summation order differs). CPU only: on other
devices `tune` returns no rows and nothing changes.
"""

from __future__ import annotations

import time
import types

import torch
import torch.nn.functional as F
from torch import nn

MARGIN = 0.9
"""W·xᵀ is used for a row count only when its median time is below this share of F.linear's"""
TUNE_PARAMS = 150_000_000
"""tune times at most this many weights per pass (more than any CPU cache, so passes stay memory-bound)"""


def narrow_linear(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight, bias) computed as (weight · xᵀ)ᵀ; one row is padded to two (else gemv runs)."""
    rows = x.numel() // x.shape[-1]
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:
        flat = torch.cat([flat, flat])
    out = torch.mm(weight, flat.t())[:, :rows].t().contiguous()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.numel() // x.shape[-1] in self.narrow_rows:
        return narrow_linear(self.weight, self.bias, x)
    return F.linear(x, self.weight, self.bias)


def linears(model: nn.Module) -> list[nn.Linear]:
    """Plain nn.Linear layers only: subclasses (quantized layers and the like) keep their own forward."""
    return [module for module in model.modules() if type(module) is nn.Linear]


def install(model: nn.Module, rows) -> int:
    """Route the linear layers of `model` through W·xᵀ for inputs of these row counts; returns layers changed."""
    rows = frozenset(int(r) for r in rows)
    layers = linears(model)
    for layer in layers:
        if rows:
            layer.narrow_rows = rows
            layer.forward = types.MethodType(_forward, layer)
        else:
            remove_layer(layer)
    return len(layers) if rows else 0


def remove_layer(layer: nn.Linear) -> None:
    layer.__dict__.pop("forward", None)
    layer.__dict__.pop("narrow_rows", None)


def remove(model: nn.Module) -> None:
    """Undo `install`: every linear layer of `model` is torch's own again."""
    for layer in linears(model):
        remove_layer(layer)


def installed_rows(model: nn.Module) -> list[int]:
    """The row counts routed through W·xᵀ in `model` (empty when nothing is installed)."""
    for layer in linears(model):
        return sorted(getattr(layer, "narrow_rows", ()))
    return []


@torch.no_grad()
def tune(model: nn.Module, max_rows: int = 8, repeats: int = 3) -> dict:
    """Time F.linear against W·xᵀ on the model's own weights for 1..max_rows rows.

    Returns {"rows": [row counts where W·xᵀ wins], "linear_ms": {n: ms}, "narrow_ms": {n: ms}, "seconds": s};
    the two forms alternate inside every round, so drift hits both alike. CPU weights only."""
    began = time.perf_counter()
    layers, total = [], 0
    for layer in linears(model):
        if layer.weight.device.type != "cpu":
            return {"rows": [], "linear_ms": {}, "narrow_ms": {}, "seconds": 0.0}
        if total >= TUNE_PARAMS:
            break
        layers.append(layer)
        total += layer.weight.numel()
    if not layers:
        return {"rows": [], "linear_ms": {}, "narrow_ms": {}, "seconds": 0.0}
    generator = torch.Generator().manual_seed(0)
    forms = {"linear": lambda w, b, x: F.linear(x, w, b), "narrow": narrow_linear}
    times = {(form, n): [] for form in forms for n in range(1, max_rows + 1)}
    for n in range(1, max_rows + 1):
        inputs = [torch.randn(n, layer.in_features, generator=generator).to(layer.weight.dtype) for layer in layers]
        for round_ in range(repeats):
            for form in (forms if round_ % 2 == 0 else reversed(forms)):
                run = forms[form]
                start = time.perf_counter()
                for layer, x in zip(layers, inputs):
                    run(layer.weight, layer.bias, x)
                times[(form, n)].append(time.perf_counter() - start)
    median = {key: sorted(values)[len(values) // 2] * 1000 for key, values in times.items()}
    rows = [n for n in range(1, max_rows + 1) if median[("narrow", n)] < MARGIN * median[("linear", n)]]
    return {"rows": rows, "linear_ms": {n: round(median[("linear", n)], 2) for n in range(1, max_rows + 1)},
            "narrow_ms": {n: round(median[("narrow", n)], 2) for n in range(1, max_rows + 1)},
            "seconds": round(time.perf_counter() - began, 2)}


def tune_and_install(model: nn.Module, max_rows: int = 8) -> dict:
    """`tune`, then `install` the winning row counts; prints one line and returns tune's result."""
    result = tune(model, max_rows)
    install(model, result["rows"])
    if result["linear_ms"]:
        shown = ", ".join(f"{n}: {result['linear_ms'][n]:.0f}->{result['narrow_ms'][n]:.0f}" for n in result["linear_ms"])
        print(f"small-batch linear: W·xᵀ for rows {result['rows'] or 'none'} (ms per pass over the weights, "
              f"torch->W·xᵀ by rows: {shown}; measured in {result['seconds']:.1f} s)", flush=True)
    return result


def proposer_modules(proposer, target) -> list[nn.Module]:
    """The networks a proposer drafts with (an EAGLE drafter, an hf: draft model, a hybrid's drafter's), not the
    target itself."""
    found = []
    for value in vars(proposer).values():
        inner = proposer_modules(value, target) if hasattr(value, "propose") else []  # a proposer in a proposer
        for module in [value if isinstance(value, nn.Module) else getattr(value, "model", None), *inner]:
            if isinstance(module, nn.Module) and module is not target.model and all(module is not m for m in found):
                found.append(module)
    return found


def install_on_proposer(proposer, target, rows) -> list[nn.Module]:
    """`install` on the proposer's own networks (same CPU, same kind of few-row products); returns them for `remove`."""
    modules = proposer_modules(proposer, target)
    for module in modules:
        install(module, rows)
    return modules
