"""Which arithmetic made a row's numbers, and bfloat16 numerics on a CPU without bfloat16 arithmetic (issue 67).

The same code, model, precision and cell give other bits on other kernels: a bfloat16 matrix product sums its terms in
an order, and rounds where, the kernel family decides (oneDNN's AMX kernels against its AVX512-BF16 ones: 1,056 of
1,584 keep-rate rows differed, ``benchmarks/results/restamp_issue49.txt``). So every stored row carries the arithmetic
it was computed with in a field of its own, ``arithmetic`` (never in its cell id or its code fingerprint: the cell is
the same cell, and the same code), for example:

- ``cpu bfloat16 avx512_bf16``: oneDNN's AVX512-BF16 kernels (the committed Qwen rows' native path);
- ``cpu bfloat16 amx``: its AMX kernels (an Intel CPU with AMX, uncapped);
- ``cpu bfloat16 avx512``: bfloat16 converted on AVX512 without bfloat16 instructions;
- ``cpu bfloat16 avx2``: a CPU with neither (oneDNN's reference path: 0.3 GFLOP/s, ``bfloat16_avx2.txt``);
- ``cpu bfloat16 emulated``: the emulation below;
- ``cpu float32 avx512`` / ``cpu float32 avx2``: ATen's kernel level (float32 sums in other orders there too);
- ``cuda bfloat16 <GPU name>``.

The kernel family is read from the CPU's flags, capped by ``ONEDNN_MAX_CPU_ISA`` as oneDNN caps itself.

**Emulated bfloat16** (``FAIRKV_BFLOAT16=emulated``; ``auto``, the default, chooses it on a CPU without bfloat16
arithmetic, ``models.bfloat16_arithmetic``; ``native`` never does): the model stays in bfloat16, every tensor, norm,
softmax and cast as the native path has them, and only the products that would fall to the slow kernels (matrix
products, linear layers, attention: ``PRODUCTS``) are carried out in float32 on the same bfloat16 values, their result
rounded to bfloat16, as a native kernel accumulates in float32 and rounds its output. A product of two bfloat16 numbers
is exact in float32, so the emulation parts from a native kernel only in the order of the float32 sums (and a kernel's
own blocking), the same kind of difference as AMX's against AVX512-BF16's. Weights are converted to float32 once per
process (``_FLOAT32``: a float32 copy of each bfloat16 parameter, twice the model's bfloat16 size in memory).
How close and how fast it is: ``benchmarks/emulated_bfloat16.py``, ``benchmarks/results/emulated_bfloat16.txt``.

This module is neutral to the code fingerprint (``fairkv.runs.fingerprint.NEUTRAL``): like the CPU a row ran on, the
arithmetic is recorded by the row's own ``arithmetic`` field, and ``fairkv verify`` compares rows of other paths by
stated tolerances (``fairkv.runs.verify``).
"""

from __future__ import annotations

import os
import weakref
from contextlib import nullcontext
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from fairkv.core import models, paths

SETTING = "FAIRKV_BFLOAT16"
MODES = ("auto", "native", "emulated")
FIELD = "arithmetic"  # the row field
EMULATED = "emulated"
# oneDNN's bfloat16 kernel families, slowest first, each with the CPU flag that enables it
FAMILIES = (("avx2", "avx2"), ("avx512", "avx512f"), ("avx512_bf16", "avx512_bf16"), ("amx", "amx_bf16"))
# ``ONEDNN_MAX_CPU_ISA`` values -> the most capable family they allow
CAPS = {
    "AVX2": "avx2",
    "AVX2_VNNI": "avx2",
    "AVX2_VNNI_2": "avx2",
    "AVX512_CORE": "avx512",
    "AVX512_CORE_VNNI": "avx512",
    "AVX512_CORE_BF16": "avx512_bf16",
    "AVX512_CORE_FP16": "avx512_bf16",
    "AVX512_CORE_AMX": "amx",
    "AVX512_CORE_AMX_FP16": "amx",
    "ALL": "amx",
    "DEFAULT": "amx",
}
PRODUCTS = {
    F.linear,
    F.scaled_dot_product_attention,
    torch.matmul,
    torch.mm,
    torch.bmm,
    torch.addmm,
    torch.baddbmm,
    torch.einsum,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.Tensor.__rmatmul__,
    torch.Tensor.mm,
    torch.Tensor.bmm,
}


class SettingError(ValueError):
    """An unknown setting of the bfloat16 path."""


def mode() -> str:
    """``FAIRKV_BFLOAT16`` read: native or emulated (auto: emulated exactly where the CPU has no bfloat16
    arithmetic)."""
    value = os.environ.get(SETTING, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise SettingError(f"{SETTING}={value!r}: use one of {', '.join(MODES)}")
    if value == "auto":
        return "native" if models.bfloat16_arithmetic() else EMULATED
    return value


@lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    # elsewhere (macOS, Windows): what torch reports
    level = torch.backends.cpu.get_cpu_capability().lower()
    flags = {"avx2"} if level.startswith("avx") else set()
    if level == "avx512":
        flags.add("avx512f")
    if level == "avx512" and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        flags.add("avx512_bf16")
    return frozenset(flags)


def cpu_family() -> str:
    """The family of oneDNN kernels a bfloat16 product runs on here: the most capable the CPU's flags enable, capped
    by ``ONEDNN_MAX_CPU_ISA`` ("reference" on a CPU without AVX2)."""
    names = [name for name, _ in FAMILIES]
    found = [name for name, flag in FAMILIES if flag in _cpu_flags()]
    if not found:
        return "reference"
    best = found[-1]
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if cap in CAPS:
        best = names[min(names.index(best), names.index(CAPS[cap]))]
    return best


def emulates(lm: models.LoadedModel) -> bool:
    """Whether ``lm``'s bfloat16 products are emulated here (a bfloat16 model on the CPU, ``mode`` emulated)."""
    return lm.model.dtype == torch.bfloat16 and lm.device.type == "cpu" and mode() == EMULATED


def path(lm: models.LoadedModel) -> str:
    """The arithmetic ``lm`` computes with in this process, as a row records it."""
    dtype = str(lm.model.dtype).removeprefix("torch.")
    if lm.device.type == "cuda":
        label = f"cuda {dtype} {torch.cuda.get_device_name(lm.device)}"
    elif lm.model.dtype == torch.bfloat16:
        label = f"cpu bfloat16 {EMULATED if emulates(lm) else cpu_family()}"
    else:
        label = f"{lm.device.type} {dtype} {torch.backends.cpu.get_cpu_capability().lower()}"
    return label + (" int8" if lm.int8 else "")


# a bfloat16 parameter's id -> (a weak reference to it, its float32 copy): converted once per process
_FLOAT32: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


def _float32(value):
    if not isinstance(value, torch.Tensor) or value.dtype != torch.bfloat16:
        return value
    if not isinstance(value, torch.nn.Parameter):
        return value.float()
    key = id(value)
    held = _FLOAT32.get(key)
    if held is None or held[0]() is not value:  # the copy leaves with its parameter (a model freed frees both)
        held = (weakref.ref(value, lambda _, key=key: _FLOAT32.pop(key, None)), value.detach().float())
        _FLOAT32[key] = held
    return held[1]


class _Emulated(TorchFunctionMode):
    """bfloat16 products in float32 on the same values, rounded to bfloat16 (the module's docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in PRODUCTS:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            if any(t.dtype == torch.bfloat16 for t in tensors):
                args, kwargs = tree_map(_float32, (args, kwargs))
                return func(*args, **kwargs).to(torch.bfloat16)
        return func(*args, **kwargs)


def emulation(lm: models.LoadedModel):
    """A block in which ``lm``'s bfloat16 products are emulated, where ``emulates(lm)``; else nothing changes."""
    return _Emulated() if emulates(lm) else nullcontext()


def computed(lm: models.LoadedModel, batches: Iterable[list[dict]]) -> Iterator[list[dict]]:
    """Each batch of rows ``batches`` yields, computed under ``emulation(lm)`` (only while it computes: the caller's
    code between batches runs as it would) and stamped with ``path(lm)``."""
    label, batches = path(lm), iter(batches)
    while True:
        with emulation(lm):
            rows = next(batches, None)
        if rows is None:
            return
        yield [{**row, FIELD: label} for row in rows]


def forced(value: str):
    """Within the block, ``FAIRKV_BFLOAT16`` is ``value`` (tests, benchmarks); restored after."""
    if value not in MODES:
        raise SettingError(f"{SETTING}={value!r}: use one of {', '.join(MODES)}")
    return paths.environment(SETTING, value)
