"""Linear layers for the few-row products of decoding on CPU: y = (W·xᵀ)ᵀ where that is measured faster.

Decoding multiplies every weight matrix by 1 row (a plain step) or by 2..k+1 rows (a verify pass).
Both should cost about one read of the weights. On some CPUs the BLAS path torch takes for x·Wᵀ
with a few rows is far from that: on the 2-core AMD EPYC (AVX2, MKL 2024.2) this project is
measured on, SmolLM2-135M's linear layers take 76 ms for 1 row but 132 ms for 2 rows and 143 ms
for 4, while the same products written as W·xᵀ (the row block as the narrow right-hand side,
1 row padded to 2) take 58, 54 and 55 ms. That flattens the target's verify-cost curve, which is
what a speculative decoder's speedup is made of: τ·t(1)/t(n+1) for n drafted tokens.

A third form, where torch has MKL and the weights are float32: MKL's packed GEMM (the weight reordered
once into MKL's packed layout, `torch.ops.mkl._mkl_reorder_linear_weight`, then `_mkl_linear` per call).
With MKL limited to AVX2 (`MKL_ENABLE_INSTRUCTIONS=AVX2`, what a CPU without AVX-512 runs) 60 of
SmolLM2's 1536x576 matrices took 14 ms for 1 row and 25 ms for 2 or 3 rows through F.linear, but
14 / 15 / 15 ms packed: a flat verify-cost curve again. It keeps a packed copy of every routed weight
(more memory), so it is only tried on models whose linear weights take at most PACK_LIMIT_BYTES.

A fourth form, where torch has oneDNN and the weights are float32: oneDNN's linear on a weight reordered once
into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise` per call; the path
torch.compile's CPU backend takes). On the 2-core AMD EPYC with AVX-512 (Zen 4) a pass over SmolLM2's 211 linear
layers took (median of 5) 46 / 80 / 75 / 50 / 69 ms through F.linear for 1 / 2 / 4 / 8 / 12 rows, 29 / 27 / 32 /
67 / 85 as W·xᵀ, and 18 / 22 / 20 / 25 / 26 through oneDNN: the flattest curve, and the fastest single row. It
too keeps a copy of every routed weight, under the same PACK_LIMIT_BYTES.

Prompts go through the same layers with many rows (the target's prefill, a drafter's first pass over the prompt):
on the Zen 4 CPU above oneDNN's form took 35 / 93 / 338 / 1239 ms for 32 / 128 / 512 / 2048 rows over SmolLM2's
linear layers where F.linear (MKL) took 83 / 216 / 787 / 2950, and HumanEval's prefill (136 tokens on average) fell
from 0.21 to 0.11 s. So `tune` also times LONG_ROWS, and a row count above MAX_ROWS takes the form chosen at the
nearest of those at or above it (the largest beyond them).

`tune` times the forms on the model's own weights for 1..max_rows rows (and LONG_ROWS) and `install` routes each row
count where a form beat F.linear by a clear margin to the form fastest over all row counts, or to another
that beat that one there by the margin too (`choose`; a form whose output disagrees with F.linear beyond
float rounding is never chosen); every other call is torch's own `F.linear`. Results
agree with `F.linear` to float rounding (the summation order differs). CPU only: on other devices
`tune` returns no rows and nothing changes.
"""

from __future__ import annotations

import time
import types

import torch
import torch.nn.functional as F
from torch import nn

MARGIN = 0.9
"""a form is used for a row count only when its measured time is below this share of F.linear's; and a form other than
the one fastest over all row counts only when it is below this share of that one's (no switching for noise)"""
TUNE_PARAMS = 150_000_000
"""tune times at most this many weights per pass (more than any CPU cache, so passes stay memory-bound)"""
MAX_ROWS = 16
"""row counts tuned: 1..this, enough for a hybrid pass (8 suffix tokens, a drafter's chain, the root) and small trees;
SmolLM2's linear layers, fp32 on a 2-core Xeon: 9..13 rows took 75-110 ms through F.linear, 57-82 ms packed"""
PACK_LIMIT_BYTES = 2 << 30
"""MKL's packed and oneDNN's forms are tried only where the model's linear weights take at most this many bytes
(each adds a copy)"""
LONG_ROWS = (32, 128, 512)
"""row counts above MAX_ROWS that `tune` times, for prompts: a count n > MAX_ROWS takes the form routed at the first
of these >= n (the last beyond them), or F.linear where none is routed there"""
LONG_MACS = 16 * TUNE_PARAMS
"""multiply-adds timed per pass at LONG_ROWS: a first share of the layers of at most this many weights x rows (these
products are compute-bound, so a share stands for the whole; at least one layer)"""
FORM_NAMES = ("linear", "narrow", "packed", "onednn")
"""torch's own F.linear, then the forms `tune` may route to, in the order its timings are reported"""


def can_pack(layer: nn.Linear) -> bool:
    """Whether MKL's packed GEMM serves this layer: torch built with MKL, float32 weights on the CPU."""
    return torch._C.has_mkl and layer.weight.dtype == torch.float32 and layer.weight.device.type == "cpu"


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight in MKL's packed layout (packed for a few rows; any row count is then passed per call)."""
    return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), 8)


def packed_linear(weight: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight, bias) through MKL's packed GEMM on `packed` (`pack(weight)`)."""
    rows = x.numel() // x.shape[-1]
    out = torch.ops.mkl._mkl_linear(x.reshape(rows, x.shape[-1]), packed, weight, bias, rows)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def can_onednn(layer: nn.Linear) -> bool:
    """Whether oneDNN's reordered linear serves this layer: torch built with oneDNN, float32 weights on the CPU."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and layer.weight.dtype == torch.float32 and layer.weight.device.type == "cpu")


def onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight in oneDNN's blocked layout (reordered for a few rows; any row count is then passed per call)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 8)


def onednn_linear(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight, bias) through oneDNN on `packed` (`onednn_pack(weight)`)."""
    rows = x.numel() // x.shape[-1]
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, x.shape[-1]), packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _run_packed(layer: nn.Linear, copy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return packed_linear(layer.weight, copy, layer.bias, x)


def _run_onednn(layer: nn.Linear, copy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return onednn_linear(copy, layer.bias, x)


REORDERED = {"packed": (can_pack, pack, _run_packed), "onednn": (can_onednn, onednn_pack, _run_onednn)}
"""the forms that keep a reordered copy of each weight (a `ReorderedWeight` in `layer.<form>_weight` once installed):
(whether it serves a layer, the copy of a weight, run(layer, copy, x))"""


class ReorderedWeight:
    """A form's reordered copy of one layer's weight, used only while that weight is the one it was made from.

    The copies are opaque tensors (oneDNN's cannot even be read back), so a copy of the model (deepcopy, pickling:
    Medusa-2 deep-copies the target it tunes) gets an empty one and runs F.linear until `install` routes it again;
    a weight replaced or changed in place (a new storage, an optimizer step) no longer matches and does the same.
    (An in-place change through `.data` keeps both stamps: `install` again after one.)"""

    __slots__ = ("tensor", "stamp")

    def __init__(self, weight: torch.Tensor | None = None, tensor: torch.Tensor | None = None):
        self.tensor = tensor
        self.stamp = None if weight is None else (weight.data_ptr(), weight._version)

    def serves(self, weight: torch.Tensor) -> bool:
        """Whether this copy still stands for `weight`."""
        return self.tensor is not None and self.stamp == (weight.data_ptr(), weight._version)

    def __deepcopy__(self, memo) -> "ReorderedWeight":
        return ReorderedWeight()

    def __reduce__(self):
        return ReorderedWeight, ()


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


def routed(rows: dict[int, str], n: int) -> str | None:
    """The form `rows` (row count -> form, as `install` takes it) routes n rows to: n's own entry, or above MAX_ROWS the
    entry of the first of LONG_ROWS at or above n (the last beyond them); None: F.linear."""
    form = rows.get(n)
    if form is None and n > MAX_ROWS:
        form = rows.get(next((size for size in LONG_ROWS if size >= n), LONG_ROWS[-1]))
    return form


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    form = routed(self.narrow_rows, x.numel() // x.shape[-1])
    if form == "narrow":
        return narrow_linear(self.weight, self.bias, x)
    if form in REORDERED and not torch.is_grad_enabled():
        copy = getattr(self, f"{form}_weight")
        if copy is not None and copy.serves(self.weight):
            return REORDERED[form][2](self, copy.tensor, x)
    return F.linear(x, self.weight, self.bias)


# A pickled layer's bound `forward` is rebuilt on load as getattr(layer, <function name>); under this name that is
# nn.Linear's own forward, so an unpickled model runs F.linear until `install` routes it again (as a deep copy does).
_forward.__name__ = "forward"


def linears(model: nn.Module) -> list[nn.Linear]:
    """Plain nn.Linear layers only: subclasses (quantized layers and the like) keep their own forward."""
    return [module for module in model.modules() if type(module) is nn.Linear]


def install(model: nn.Module, rows) -> int:
    """Route the linear layers of `model` by row count: `rows` maps a row count to "narrow" (W·xᵀ), "packed"
    (MKL's packed GEMM) or "onednn" (oneDNN's reordered linear); the last two serve float32 layers only, the others
    keep F.linear there. A plain list of row counts means W·xᵀ for each. Returns layers changed."""
    forms = {int(n): form for n, form in (rows.items() if isinstance(rows, dict) else ((r, "narrow") for r in rows))}
    layers = linears(model)
    for layer in layers:
        if forms:
            layer.narrow_rows = forms
            for name, (serves, prepare, _) in REORDERED.items():
                serving = name in forms.values() and serves(layer)
                setattr(layer, f"{name}_weight", ReorderedWeight(layer.weight, prepare(layer.weight)) if serving else None)
            layer.forward = types.MethodType(_forward, layer)
        else:
            remove_layer(layer)
    return len(layers) if forms else 0


def remove_layer(layer: nn.Linear) -> None:
    for name in ("forward", "narrow_rows", *(f"{form}_weight" for form in REORDERED)):
        layer.__dict__.pop(name, None)


def remove(model: nn.Module) -> None:
    """Undo `install`: every linear layer of `model` is torch's own again."""
    for layer in linears(model):
        remove_layer(layer)


def installed_rows(model: nn.Module) -> dict[int, str]:
    """Row count -> the form ("narrow", "packed", "onednn") it is routed through in `model` (empty when nothing is)."""
    for layer in linears(model):
        return dict(sorted(getattr(layer, "narrow_rows", {}).items()))
    return {}


@torch.no_grad()
def tune(model: nn.Module, max_rows: int = MAX_ROWS, repeats: int = 5, long_rows: tuple[int, ...] = LONG_ROWS) -> dict:
    """Time F.linear against W·xᵀ and (where they can run) MKL's packed GEMM and oneDNN's reordered linear on the
    model's own weights for 1..max_rows rows, and F.linear against the reordered forms for `long_rows` (prompts).

    Returns {"rows": {n: form} for the row counts where a form beat F.linear by the margin (the form fastest over
    all row counts, unless another is faster than it there by the margin too: a pass of the whole model runs one
    form in every layer, and a form swapped in for a few percent measured on the linear layers alone can cost
    more than that in it: on a Zen 4 CPU 2 rows went to W·xᵀ at 25 against oneDNN's 26 ms over the linear layers,
    and the target's 2-token pass then took 52 ms where its 1-, 3- and 4-token passes, all oneDNN, took 42-44; at
    `long_rows` simply the fastest that beat F.linear by the margin), "linear_ms", "narrow_ms", "packed_ms",
    "onednn_ms": {n: ms}, "seconds": s}; the forms alternate inside every round, so drift hits all alike, and each
    time is the fastest of `repeats` passes: a host that slows for a second made the median of 3 put oneDNN's 2- and
    4-row passes at 34 and 32 ms (15 to 17 in other runs that hour) and send them to W·xᵀ. A time at `long_rows` is
    over the first layers of at most LONG_MACS / n weights, not the whole model. CPU weights only."""
    began = time.perf_counter()
    everything = linears(model)
    empty = {"rows": {}, "linear_ms": {}, "narrow_ms": {}, "packed_ms": {}, "onednn_ms": {}, "seconds": 0.0}
    if not everything or any(layer.weight.device.type != "cpu" for layer in everything):
        return empty
    layers = _first_layers(everything, TUNE_PARAMS)
    forms = {"linear": lambda layer, x: F.linear(x, layer.weight, layer.bias),
             "narrow": lambda layer, x: narrow_linear(layer.weight, layer.bias, x)}
    weight_bytes = sum(layer.weight.numel() * layer.weight.element_size() for layer in everything)
    for name, (serves, prepare, run) in REORDERED.items():
        if all(serves(layer) for layer in layers) and weight_bytes <= PACK_LIMIT_BYTES:
            copies = {id(layer): prepare(layer.weight) for layer in layers}
            forms[name] = lambda layer, x, run=run, copies=copies: run(layer, copies[id(layer)], x)
    for run in forms.values():  # one untimed pass each: first touches of fresh (packed) weights are not its cost
        for layer in layers:
            run(layer, torch.zeros(2, layer.in_features, dtype=layer.weight.dtype))
    generator, agrees = torch.Generator().manual_seed(0), dict.fromkeys(forms, True)
    few = range(1, max_rows + 1)
    long_rows = [n for n in long_rows if n > max_rows]
    fastest = {}
    for n in [*few, *long_rows]:
        timed = forms if n <= max_rows else {form: run for form, run in forms.items() if form != "narrow"}
        share = layers if n <= max_rows else _first_layers(layers, LONG_MACS // n)
        fastest.update(_time_forms(timed, share, n, repeats, generator, agrees))
    usable = ["linear", *(form for form in forms if form != "linear" and agrees[form])]
    rows = choose({form: {n: fastest[(form, n)] for n in few} for form in usable})
    for n in long_rows:
        beat = [form for form in usable if form not in ("linear", "narrow")
                and fastest[(form, n)] < MARGIN * fastest[("linear", n)]]
        if beat:
            rows[n] = min(beat, key=lambda form: fastest[(form, n)])
    result = {"rows": rows, "seconds": round(time.perf_counter() - began, 2)}
    for form in FORM_NAMES:
        result[f"{form}_ms"] = {n: round(fastest[(form, n)], 2) for n in [*few, *long_rows]
                                if (form, n) in fastest} if form in forms else {}
    return result


def _first_layers(layers: list[nn.Linear], weights: int) -> list[nn.Linear]:
    """The first of `layers` until they hold `weights` weights (at least one)."""
    chosen, total = [], 0
    for layer in layers:
        if chosen and total >= weights:
            break
        chosen.append(layer)
        total += layer.weight.numel()
    return chosen


def _time_forms(forms: dict, layers: list[nn.Linear], n: int, repeats: int, generator: torch.Generator,
                agrees: dict[str, bool]) -> dict[tuple[str, int], float]:
    """{(form, n): ms}, the fastest of `repeats` passes of each form over `layers` with n rows, the forms alternating
    inside every round; `agrees[form]` turns False where a form's output on the first layer is not F.linear's."""
    inputs = [torch.randn(n, layer.in_features, generator=generator).to(layer.weight.dtype) for layer in layers]
    reference = F.linear(inputs[0], layers[0].weight, layers[0].bias).float()
    for form, run in forms.items():  # a form that computes something else is never chosen
        error = (run(layers[0], inputs[0]).float() - reference).abs().max()
        agrees[form] &= bool(error <= 1e-3 * max(float(reference.abs().max()), 1.0))
    times = {form: [] for form in forms}
    for round_ in range(repeats):
        for form in (list(forms) if round_ % 2 == 0 else list(reversed(forms))):
            start = time.perf_counter()
            for layer, x in zip(layers, inputs):
                forms[form](layer, x)
            times[form].append(time.perf_counter() - start)
    return {(form, n): min(values) * 1000 for form, values in times.items()}


def choose(times: dict[str, dict[int, float]]) -> dict[int, str]:
    """Row count -> form, from measured times {form: {rows: ms}} of torch's "linear" and the forms that may be used:
    where some beat "linear" by MARGIN, the form fastest over all row counts, unless another beats that one there by
    MARGIN too (a few percent over the linear layers alone is noise next to what a swap of forms can cost a whole
    pass). Row counts where none beats "linear" are left out."""
    forms = [form for form in times if form != "linear"]
    overall = min(forms, key=lambda form: sum(times[form].values()), default=None)
    rows = {}
    for n, torch_ms in times["linear"].items():
        beat = [form for form in forms if times[form][n] < MARGIN * torch_ms]
        if beat:
            fastest = min(beat, key=lambda form: times[form][n])
            clearly = times[fastest][n] < MARGIN * times[overall][n]
            rows[n] = overall if overall in beat and not clearly else fastest
    return rows


def tune_and_install(model: nn.Module, max_rows: int = MAX_ROWS) -> dict:
    """`tune`, then `install` the winning row counts; prints one line and returns tune's result."""
    result = tune(model, max_rows)
    install(model, result["rows"])
    if result["linear_ms"]:
        def cell(n):
            return "/".join(f"{result[f'{form}_ms'][n]:.0f}" if n in result[f"{form}_ms"] else "-"
                            for form in FORM_NAMES if result.get(f"{form}_ms"))
        rows = result["rows"] if isinstance(result["rows"], dict) else dict.fromkeys(result["rows"], "narrow")
        routed = ", ".join(f"{rows_label(n)}: {form}" for n, form in rows.items()) or "none"
        forms = "torch/W·xᵀ" + ("/MKL packed" if result.get("packed_ms") else "") + ("/oneDNN" if result.get("onednn_ms") else "")
        shown = ", ".join(f"{n}: {cell(n)}" for n in result["linear_ms"])
        print(f"small-batch linear: rows routed {routed} (ms per pass over the weights, {forms} by rows: {shown}; "
              f"above {max_rows} rows over a share of the layers; measured in {result['seconds']:.1f} s)", flush=True)
    return result


def rows_label(n: int) -> str:
    """The row counts an entry of `install`'s rows serves: "n", or for LONG_ROWS the band up to it ("17-32", "129+")."""
    if n <= MAX_ROWS or n not in LONG_ROWS:
        return str(n)
    below = max([MAX_ROWS, *(size for size in LONG_ROWS if size < n)])
    return f"{below + 1}+" if n == LONG_ROWS[-1] else f"{below + 1}-{n}"


def proposer_modules(proposer, target) -> list[nn.Module]:
    """The networks a proposer drafts with (its `networks()`: an EAGLE drafter, an hf: draft model, a hybrid's
    drafter's), each once, not the target itself."""
    found = []
    for module in proposer.networks():
        if module is not target.model and all(module is not m for m in found):
            found.append(module)
    return found


def install_on_proposer(proposer, target, rows) -> list[nn.Module]:
    """`install` on the proposer's own networks (same CPU, same kind of few-row products); returns them for `remove`."""
    modules = proposer_modules(proposer, target)
    for module in modules:
        install(module, rows)
    return modules
