"""Emulated bfloat16 (``fairkv.core.arithmetic``): how fast it is and how close to the native kernels' rows.

    .venv/bin/python benchmarks/emulated_bfloat16.py [--rows 40] [--batch 16 --batch-steps 8]

Prints the CPU's bfloat16 kernel family; a decoding step's MLP matmul (a running batch of 128 rows, Qwen2.5-Coder-1.5B's
1536 x 8960) in GFLOP/s for float32, native bfloat16 and emulated bfloat16; one 100-token prefill of Qwen2.5-Coder-1.5B
in each, 32 greedy decoding steps of one answer and ``--batch-steps`` of a running batch of ``--batch`` answers (a
sweep's decode: bound by memory at one answer, by arithmetic in a batch); then ``--rows`` keep-rate rows of the
committed press atlas (``results/cpu/atlas/``, computed natively with AVX512-BF16 kernels), drawn at random (seeded),
recomputed with emulated bfloat16 (and natively, where this CPU has bfloat16 arithmetic): how many come out identical,
and the largest and 90th percentile difference of a span's keep rate: what ``fairkv.runs.tolerance.KEEP_BOUND`` is
derived from. On an AVX2-only CPU leave the native path out (``--paths emulated``: it runs at 0.3 GFLOP/s there); run
under ``ONEDNN_MAX_CPU_ISA`` (``AVX512_CORE``: bfloat16 converted, without its instructions) to measure another native
kernel family against the committed rows, with ``--no-speed`` to skip the timings; under
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` this CPU takes an AVX2-only CPU's kernels (at its own speed),
``--rows 0`` for the timings only.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fairkv.core import arithmetic, models
from fairkv.runs import tolerance, verify
from fairkv.runs.store import ResultsStore

ATLAS = Path("results/cpu/atlas/qwen2.5-coder-1.5b.keep-rates.jsonl")
MODEL = "qwen2.5-coder-1.5b"


def matmul_gflops(dtype: torch.dtype, emulated: bool, repeats: int = 3) -> float:
    a, b = torch.randn(128, 1536).to(dtype), torch.nn.Parameter(torch.randn(1536, 8960).to(dtype))
    best = float("inf")
    with arithmetic._Emulated() if emulated else torch.no_grad():
        for _ in range(repeats + 1):
            began = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - began)
    return 2 * 128 * 1536 * 8960 / best / 1e9


@torch.inference_mode()
def prefill_and_decode(lm: models.LoadedModel, steps: int = 32, batch: int = 1) -> tuple[float, float]:
    """Seconds of one 100-token prefill and of ``steps`` greedy decoding steps after it, the prefilled cache repeated
    ``batch`` times (a running batch of ``batch`` answers, as a sweep decodes them)."""
    ids = torch.randint(0, 1000, (1, 100), generator=torch.Generator().manual_seed(0))
    with arithmetic.emulation(lm):
        lm.model(ids[:, :10])
        began = time.perf_counter()
        out = lm.model(ids, use_cache=True)
        prefill = time.perf_counter() - began
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1).repeat(batch, 1)
        cache.batch_repeat_interleave(batch)
        began = time.perf_counter()
        for _ in range(steps):
            out = lm.model(token, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return prefill, time.perf_counter() - began


def keep_rate_differences(lm: models.LoadedModel, rows: list[dict]) -> list[float]:
    """Per row, the largest difference of a span's keep rate recomputed under ``lm``'s arithmetic here."""
    moved = []
    with tempfile.TemporaryDirectory() as scratch:
        for row in rows:
            with arithmetic.emulation(lm):
                fresh = verify.KEEP_RATES.recompute(row, lm, Path(scratch))[row["cell_id"]]
            moved.append(tolerance.keep_moved(row, fresh))
    return moved


def speed(paths: list[str], batch: int, batch_steps: int) -> None:
    """The matmul's GFLOP/s, then Qwen's prefill and decoding steps (one answer, then a running batch), in float32 and
    on each of ``paths``."""
    for label, dtype, emulated in (
        ("float32", torch.float32, False),
        ("bfloat16 native", torch.bfloat16, False),
        ("bfloat16 emulated", torch.bfloat16, True),
    ):
        print(f"matmul (128 x 1536) @ (1536 x 8960), {label}: {matmul_gflops(dtype, emulated):.1f} GFLOP/s")
    for name in ["float32", *paths]:
        lm = None  # the previous model freed before the next loads
        with arithmetic.forced("native" if name == "native" else "emulated"):
            lm = models.load_model(MODEL, dtype=torch.float32 if name == "float32" else torch.bfloat16)
            prefill, decode = prefill_and_decode(lm)
            _, batched = prefill_and_decode(lm, batch_steps, batch)
            print(
                f"{MODEL}, {arithmetic.path(lm)}: 100-token prefill {prefill:.2f} s, 32 decoding steps {decode:.2f} s, "
                f"{batch_steps} decoding steps of {batch} answers {batched:.2f} s ({batch * batch_steps / batched:.1f} "
                "tokens/s)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=40, help="committed keep-rate rows to recompute (0: none)")
    parser.add_argument("--paths", nargs="+", default=["emulated", "native"], choices=["emulated", "native"])
    parser.add_argument("--no-speed", action="store_true", help="skip the matmuls, prefills and decodes")
    parser.add_argument("--batch", type=int, default=16, help="answers in the running batch of the batched decode")
    parser.add_argument("--batch-steps", type=int, default=8, help="decoding steps of the running batch")
    args = parser.parse_args()
    print(
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, bfloat16 kernels: {arithmetic.cpu_family()}, "
        f"bfloat16 arithmetic: {models.bfloat16_arithmetic()}, {arithmetic.SETTING}=auto chooses {arithmetic.mode()}"
    )
    if not args.no_speed:
        speed(args.paths, args.batch, args.batch_steps)
    rows = [row for row in ResultsStore(ATLAS).rows().values() if row.get("keep")]
    chosen = random.Random(0).sample(rows, args.rows)
    if not chosen:
        return
    for name in args.paths:
        lm = None  # the previous path's model (and its float32 copies) freed before the next loads
        with arithmetic.forced(name):
            lm = models.load_model(MODEL, dtype=torch.bfloat16)
            began = time.perf_counter()
            moved = np.array(keep_rate_differences(lm, chosen))
            print(
                f"{len(chosen)} committed keep-rate rows recomputed, {arithmetic.path(lm)}: {int((moved == 0).sum())} "
                f"identical; a span's keep rate moved by at most {moved.max():.4f} (90th percentile "
                f"{np.percentile(moved, 90):.4f}) in {time.perf_counter() - began:.0f} s"
            )


if __name__ == "__main__":
    main()
