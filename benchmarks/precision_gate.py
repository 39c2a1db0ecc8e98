"""The fidelity gate of a precision: does bfloat16 change what the model does, against float32?

    .venv/bin/python benchmarks/precision_gate.py --model qwen2.5-coder-1.5b --dtype bfloat16

Before a precision becomes a profile's default (the float32 rows stay available and never mix with its rows):
(a) responses: the first ``--prompts`` sys_ifeval_shuffled prompts, normal order, the benign query and the paper's
    attack, uncompressed and under every policy at r = 0.5, decoded by the engine in float32 and in ``--dtype``:
    the share of identical responses per ratio, and the attack refusals per setting in each precision;
(b) keep rates: ``--keep-prompts`` prompts x 5 policies x r in {0.3, 0.5, 0.7}: the mean (and largest) absolute
    difference of per-span keep rates between the two precisions (target <= 0.02).
``tests/test_compliance.py`` checks the defense's refusals in both precisions.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time

import pandas as pd
import torch

from fairkv.core import models
from fairkv.runs import experiment

SPANS = ("keep_defense", "keep_directive")


def rows_in(model: str, dtype: str, grids: list[experiment.Grid]) -> list[pd.DataFrame]:
    lm = models.load_model(model, dtype=getattr(torch, dtype))
    out = []
    with tempfile.TemporaryDirectory() as folder:
        for grid in grids:
            start = time.perf_counter()
            out.append(experiment.run(grid.with_overrides(dtype=dtype), folder, progress=False, lm=lm))
            print(
                f"  {dtype}: {len(out[-1])} rows of {grid.queries} in {time.perf_counter() - start:.0f} s", flush=True
            )
    del lm
    gc.collect()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--dtype", default="bfloat16", choices=[d for d in experiment.DTYPES if d != "float32"])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--keep-prompts", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    answers = experiment.Grid(
        model=args.model,
        n_prompts=args.prompts,
        ratios=(0.0, 0.5),
        max_new_tokens=96,
        benign_tokens=64,
        batch_size=args.batch_size,
    )
    keeps = answers.with_overrides(n_prompts=args.keep_prompts, ratios=(0.3, 0.5, 0.7), queries=("keep",))
    print(
        f"model {args.model}: float32 vs {args.dtype}; responses on {args.prompts} prompts, keep rates on "
        f"{args.keep_prompts}, {torch.get_num_threads()} threads"
    )
    reference = rows_in(args.model, "float32", [answers, keeps])
    candidate = rows_in(args.model, args.dtype, [answers, keeps])
    on = ["key", "policy", "ratio", "query"]
    both = reference[0].merge(candidate[0], on=on, suffixes=("_32", "_x"))
    both["same"] = both["response_32"] == both["response_x"]
    print("(a) identical responses, float32 vs", args.dtype)
    for (ratio, query), frame in both.drop_duplicates(["key", "ratio", "query", "policy"]).groupby(["ratio", "query"]):
        frame = frame.drop_duplicates(["key", "ratio", "query"]) if ratio == 0.0 else frame
        print(f"    r = {ratio:g}, {query}: {int(frame['same'].sum())}/{len(frame)} ({frame['same'].mean():.0%})")
    attacks = both[both["query"] == "attack"]
    refusals = attacks.groupby(["policy", "ratio"])[["refused_32", "refused_x"]].sum().astype(int)
    print("    attack refusals (float32 / " + args.dtype + "):")
    for (policy, ratio), row in refusals.iterrows():
        print(f"      {policy} r = {ratio:g}: {row['refused_32']} / {row['refused_x']} of {args.prompts}")
    benign = both[both["query"] == "benign"]
    for ratio, frame in benign.groupby("ratio"):
        frame = frame.drop_duplicates(["key"]) if ratio == 0.0 else frame
        print(
            f"    IFEval prompt-level strict accuracy, r = {ratio:g}: float32 {frame['prompt_strict_32'].mean():.2f}, "
            f"{args.dtype} {frame['prompt_strict_x'].mean():.2f} (n = {len(frame)})"
        )
    kept = reference[1].merge(candidate[1], on=on, suffixes=("_32", "_x"))
    gaps = pd.concat([(kept[f"{s}_32"] - kept[f"{s}_x"]).abs() for s in SPANS])
    print(
        f"(b) per-span keep rates over {kept['key'].nunique()} prompts x {kept['policy'].nunique()} policies x "
        f"{kept['ratio'].nunique()} ratios: mean |difference| {gaps.mean():.4f}, largest {gaps.max():.4f}"
    )
    for policy, frame in kept.groupby("policy"):
        worst = max((frame[f"{s}_32"] - frame[f"{s}_x"]).abs().mean() for s in SPANS)
        print(f"    {policy}: mean |difference| {worst:.4f}")


if __name__ == "__main__":
    main()
