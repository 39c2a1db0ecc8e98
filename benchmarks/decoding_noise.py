"""Decoding noise: the committed cpu rows decoded again under another batch plan, and what changes.

In bfloat16 an answer depends on which rows share its running batch (issue 50, item 8). This takes a seeded slice of
the ``fair`` study's grid (``--prompts`` consecutive prompts from a seeded start; every policy, base and fair, r = 0,
0.5 and 0.7, the attack and the benign query, the cpu budgets), decodes it into a fresh store under another batch plan
(``--batch-size``, default 64 against the sweep's 128: other neighbours, other shapes) and compares each cell with the
committed row of the same cell id: the share of answers that change, where they part (in tokens), and the share of
each score that changes (and by how much).

    ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 .venv/bin/python benchmarks/decoding_noise.py --out benchmarks/results/decoding_noise

On an Intel CPU with AMX the cap selects the kernels the committed rows were computed with (AVX512-BF16, ``fairkv
verify``'s docstring); without it every difference would mix kernel and batch effects. The fresh rows are kept in
``--out`` (a results store: resumable, and the alternative decode that a claim near its threshold is recomputed
with).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np
import pandas as pd

from fairkv.core import models
from fairkv.report import analysis
from fairkv.runs import experiment, studies
from fairkv.studies import fair

SCORES = (
    "refused",
    "leak_directive",
    "leak_defense",
    "prompt_strict",
    "inst_strict",
    "benign_refused",
    "benign_capped",
)


def flagged(rows: dict) -> dict:
    """Rows by cell id with the benign answer's flags (``analysis.with_benign_flags``)."""
    frame = analysis.with_benign_flags(pd.DataFrame(list(rows.values())))
    return {row["cell_id"]: row for row in frame.to_dict("records")}


def plan(prompts: int, seed: int, batch_size: int) -> list[experiment.Grid]:
    """The slice of the ``fair`` study (cpu) decoded again: both of its parts, ``prompts`` prompts from a seeded start."""
    n = fair.STUDY.grid("cpu").n_prompts
    start = random.Random(seed).randrange(0, n - prompts + 1)
    return [
        part.with_overrides(
            start=start, n_prompts=prompts, variants=("base", "fair"), ratios=(0.0, 0.5, 0.7), batch_size=batch_size
        )
        for part in fair.STUDY.parts("cpu")
    ]


def parted_at(lm_tokenizer, a: str, b: str) -> int:
    """The first token at which two responses part (their common token prefix's length)."""
    x, y = lm_tokenizer(a)["input_ids"], lm_tokenizer(b)["input_ids"]
    common = 0
    for p, q in zip(x, y):
        if p != q:
            break
        common += 1
    return common


def compare(stored: dict, fresh: dict, tokenizer) -> pd.DataFrame:
    out = []
    for cell, row in fresh.items():
        if cell not in stored:
            raise SystemExit(f"cell {cell} is not in the committed store: the slice is not the committed grid's")
        old = stored[cell]
        same = old["response"] == row["response"]
        entry = {
            "cell": cell,
            "query": row["query"],
            "policy": row["policy"],
            "variant": row["variant"],
            "ratio": row["ratio"],
            "same_response": same,
            "parted_at": np.nan if same else parted_at(tokenizer, old["response"], row["response"]),
        }
        for score in SCORES:
            if score in row and not pd.isna(row[score]) and not pd.isna(old.get(score, np.nan)):
                entry[f"{score}_delta"] = float(row[score]) - float(old[score])
        out.append(entry)
    return pd.DataFrame(out)


def report(table: pd.DataFrame) -> str:
    lines = [f"cells decoded again: {len(table)}"]
    for query, frame in [("all", table), *table.groupby("query")]:
        changed = ~frame["same_response"]
        parted = frame.loc[changed, "parted_at"]
        lines.append(
            f"{query}: {int(changed.sum())} of {len(frame)} answers change ({changed.mean():.1%}); "
            + (
                f"they part at token median {parted.median():.0f} (quartiles {parted.quantile(0.25):.0f}-"
                f"{parted.quantile(0.75):.0f})"
                if len(parted)
                else ""
            )
        )
        for score in SCORES:
            column = f"{score}_delta"
            if column in frame and frame[column].notna().any():
                delta = frame[column].dropna()
                moved = delta.abs() > 1e-12
                lines.append(
                    f"  {score}: changes in {int(moved.sum())} of {len(delta)} ({moved.mean():.1%}); mean change "
                    f"{delta.mean():+.4f}, mean |change| {delta.abs().mean():.4f}, largest {delta.abs().max():.3f}"
                )
    at_zero = table[table["ratio"] == 0.0]
    if len(at_zero):
        lines.append(f"at r = 0 (no compression): {int((~at_zero['same_response']).sum())} of {len(at_zero)} change")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True, help="folder of the fresh store (resumable)")
    args = parser.parse_args()
    grids = plan(args.prompts, args.seed, args.batch_size)
    committed = experiment.store_for(grids[0], studies.results_folder("cpu")).rows()
    fresh = {}
    for grid in grids:
        experiment.run(grid, args.out, progress=True)
        fresh.update(experiment.store_for(grid, args.out).rows())
    tokenizer = models.load_tokenizer(grids[0].model)
    table = compare(flagged(committed), flagged(fresh), tokenizer)
    table.to_csv(args.out / "comparison.csv", index=False)
    print(f"slice: prompts {grids[0].start}-{grids[0].start + args.prompts - 1}, batch size {args.batch_size}")
    print(report(table))


if __name__ == "__main__":
    main()
