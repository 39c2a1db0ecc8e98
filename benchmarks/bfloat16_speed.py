"""bfloat16 against float32 on this CPU: is bfloat16 arithmetic there (``fairkv.core.models.bfloat16_arithmetic``), and
what each precision costs.

    .venv/bin/python benchmarks/bfloat16_speed.py

The cpu profile's rows are bfloat16, several times faster than float32 on a CPU with AVX512-BF16 or AMX. On an
AVX2-only CPU oneDNN has no bfloat16 kernel and a bfloat16 matmul runs far slower than float32; there the quickstart and
the tests' checks of Qwen's behaviour run float32 (``models.live_dtype``), and a sweep that computes bfloat16 rows is
impractical. Prints: the CPU's capability, whether bfloat16 arithmetic is there, a decoding step's MLP matmul (a
running batch of 128 rows, Qwen2.5-Coder-1.5B's 1536 x 8960) in GFLOP/s, and the wall time of one prefill per model
(``--tokens`` tokens, after a warm-up), float32 then bfloat16.
"""

from __future__ import annotations

import argparse
import time

import torch

from fairkv.core import models


def matmul_gflops(dtype: torch.dtype, repeats: int = 3) -> float:
    """GFLOP/s of (128 x 1536) @ (1536 x 8960) at ``dtype``, the best of ``repeats``."""
    a, b = torch.randn(128, 1536).to(dtype), torch.randn(1536, 8960).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - began)
    return 2 * 128 * 1536 * 8960 / best / 1e9


def prefill_seconds(name: str, dtype: torch.dtype, tokens: int) -> float:
    """Seconds of one ``tokens``-token prefill of ``name`` at ``dtype`` (after a 10-token warm-up)."""
    lm = models.load_model(name, dtype=dtype)
    ids = torch.randint(0, 1000, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        lm.model(ids[:, :10])
        began = time.perf_counter()
        lm.model(ids)
        return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "qwen2.5-coder-1.5b"])
    args = parser.parse_args()
    print(
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, bfloat16 arithmetic: {models.bfloat16_arithmetic()}, "
        f"live precision of a bfloat16 profile: {models.live_dtype('bfloat16')}"
    )
    for dtype in (torch.float32, torch.bfloat16):
        print(f"matmul (128 x 1536) @ (1536 x 8960), {dtype}: {matmul_gflops(dtype):.1f} GFLOP/s")
    for name in args.models:
        seconds = {dtype: prefill_seconds(name, dtype, args.tokens) for dtype in (torch.float32, torch.bfloat16)}
        print(
            f"{name}, one {args.tokens}-token prefill: float32 {seconds[torch.float32]:.2f} s, bfloat16 "
            f"{seconds[torch.bfloat16]:.2f} s ({seconds[torch.bfloat16] / seconds[torch.float32]:.1f}x)"
        )


if __name__ == "__main__":
    main()
