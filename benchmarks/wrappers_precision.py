"""The precision of the per-setting presses' attack rows (``fairkv.core.per_setting``): float32 against bfloat16, time and
fidelity (issue 20, item 2).

    .venv/bin/python benchmarks/wrappers_precision.py --prompts 4

The cpu profile decodes the engine's rows in bfloat16, 3.5x faster than float32 on an AVX512-BF16 CPU
(``precision_gate_qwen_bf16.txt``). The wrappers' rows are computed otherwise: one prefill per prompt on which every
press's own ``compress`` runs at every setting, then the answers decoded on head-masked caches. On the first
``--prompts`` prompts of the cpu grid of notebook 12's four wrapped presses (attack, r in {0, 0.3, 0.5, 0.7}, base,
whitelist, fair), each precision with its model loaded beforehand: wall time, prefill seconds per prompt, decode
seconds per answer, and the share of identical responses and the refusals per press and ratio, float32 / bfloat16.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time

import pandas as pd
import torch

from fairkv.core import models
from fairkv.core.presses.registry import runnable
from fairkv.runs import experiment
from fairkv.studies import atlas as atlas_study

# notebook 12's wrapped presses at the cpu profile (reports/cpu/12_press_atlas.ipynb)
PRESSES = ["CriticalKV(SnapKV)", "Block64(SnapKV)", "AdaKV(SnapKV)", "CriticalAdaKV(SnapKV)"]


def rows_in(dtype: str, prompts: int) -> pd.DataFrame:
    grid = atlas_study.ATTACKS.grid("cpu", policies=[e.key for e in runnable(PRESSES)], n_prompts=prompts, dtype=dtype)
    lm = models.load_model(grid.model, dtype=getattr(torch, dtype))
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        rows = experiment.run(grid, folder, progress=False, lm=lm)
        wall = time.perf_counter() - start
    prefill = rows.drop_duplicates("key")["prefill_s"].mean()
    print(
        f"  {dtype}: {len(rows)} rows in {wall:.0f} s ({wall / prompts:.1f} s per prompt; prefill with every "
        f"setting's masks {prefill:.1f} s per prompt, decode {rows['decode_s'].mean():.2f} s per answer)",
        flush=True,
    )
    del lm
    gc.collect()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    print(
        f"wrapped presses {PRESSES}: float32 vs bfloat16 on {args.prompts} prompts, {torch.get_num_threads()} "
        f"threads, CPU with AVX512-BF16: {'avx512_bf16' in open('/proc/cpuinfo').read()}"
    )
    on = ["key", "policy", "ratio", "variant", "query"]
    both = rows_in("float32", args.prompts).merge(rows_in("bfloat16", args.prompts), on=on, suffixes=("_32", "_16"))
    both["same"] = both["response_32"] == both["response_16"]
    print(f"identical responses: {int(both['same'].sum())}/{len(both)} ({both['same'].mean():.0%})")
    print("refusals per press and ratio (float32 / bfloat16, of prompts x variants):")
    for (policy, ratio), frame in both.groupby(["policy", "ratio"]):
        print(
            f"  {policy} r = {ratio:g}: {int(frame['refused_32'].sum())} / {int(frame['refused_16'].sum())} "
            f"of {len(frame)}"
        )


if __name__ == "__main__":
    main()
