"""The same small grid serial (this process, all cores) vs the Ray executor (N single-core workers on a local
cluster), on fresh stores; then what the paper profile costs in cells and generated tokens.

    .venv/bin/python benchmarks/scaleout.py --prompts 8 --workers 2

Prints wall time of both runs (the Ray run includes starting the local cluster and loading the model in every
worker, reported apart), the ratio, and whether the rows are identical. On a 2-core machine the serial run already
uses both cores (torch intra-op threads), so 2 workers can win only what one process leaves idle: tokenisation,
scoring, compression and small-batch decoding that do not fill 2 cores.

``--estimate`` prints, per sys_ifeval study of the paper profile, the distinct cells (cells shared by studies counted once)
and the tokens they decode at most (every answer at its cap), to turn a measured tokens/s into GPU-hours; then, from
the committed ``cpu`` rows, how long the answers really are per query (mean new tokens, share at the cap), which says
how loose that bound is.

    .venv/bin/python benchmarks/scaleout.py --estimate paper   # printed: benchmarks/results/scaleout_estimate_paper.txt
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter

import ray
import torch

import fairkv.studies
from fairkv.core import models
from fairkv.runs import executors, experiment, studies
from fairkv.runs.store import ResultsStore


def timed_run(grid, executor, lm=None):
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        rows = experiment.run(grid, folder, progress=False, lm=lm, executor=executor)
    return rows, time.perf_counter() - start


def comparable(rows) -> str:
    return json.dumps(
        rows.drop(columns=["prefill_s", "cut_s", "decode_s", "schema"]).to_dict("records"), sort_keys=True
    )


def speed(args) -> None:
    grid = experiment.Grid(
        model=args.model,
        n_prompts=args.prompts,
        ratios=(0.0, 0.3, 0.5, 0.7),
        max_new_tokens=args.max_new_tokens,
        variants=("base", "whitelist", "fair"),
        batch_size=16,
    )
    print(
        f"grid: {args.model}, {args.prompts} prompts x {len(grid.settings())} settings x 2 queries, "
        f"{args.max_new_tokens} new tokens; torch threads in this process: {torch.get_num_threads()}"
    )
    lm = models.load_model(args.model)
    serial_rows, serial_s = timed_run(grid, "serial", lm)
    start = time.perf_counter()
    ray.init(address="local", num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    start_s = time.perf_counter() - start
    ray_rows, ray_s = timed_run(grid, executors.RayExecutor(workers=args.workers))
    tokens = int(serial_rows.drop_duplicates("cell_id")["new_tokens"].sum())
    print(f"serial: {serial_s:.1f} s ({tokens / serial_s:.1f} tok/s)")
    print(
        f"ray, {args.workers} workers: {ray_s:.1f} s incl. worker start and model load "
        f"({tokens / ray_s:.1f} tok/s); cluster start {start_s:.1f} s not included"
    )
    print(
        f"speed-up serial / ray: {serial_s / ray_s:.2f}x; rows identical: {comparable(serial_rows) == comparable(ray_rows)}"
    )


def estimate(profile: str) -> None:
    cells = Counter()
    print(f"{'study':14} {'cells':>8} {'new cells':>10} {'max new tokens':>15}")
    for name, added in fairkv.studies.added_cells(profile).items():
        if added is None:
            print(f"{name:14} LongBench TREC: its size is not known without the data (200 prompts in LongBench)")
            continue
        total, fresh = added
        cells += fresh
        print(f"{name:14} {total:8d} {fresh.total():10d} {sum(n * tokens for (_, tokens), n in fresh.items()):15,d}")
    for query in ("benign", "attack"):
        mine = {tokens: n for (kind, tokens), n in cells.items() if kind == query}
        print(f"{query}: {sum(mine.values()):,} cells, at most {sum(n * t for t, n in mine.items()):,} new tokens")
    tokens = sum(n * tokens for (_, tokens), n in cells.items())
    print(f"profile {profile}: {cells.total():,} distinct cells, at most {tokens:,} generated tokens")
    for rate in (500, 1000, 2000):
        print(f"  at {rate} tok/s (batched decoding, one GPU): {tokens / rate / 3600:.0f} GPU-hours at most")
    measured("cpu")


def measured(profile: str) -> None:
    """Mean new tokens and the share of answers at their cap per query, over the profile's stored sweep rows."""
    grid = studies.PROFILES[profile]
    store = ResultsStore(studies.results_folder(profile) / f"{grid.model}.jsonl")
    rows = [row for row in store.rows().values() if row.get("query") in ("benign", "attack")]
    if not rows:
        print(f"no stored {profile} rows at {store.path}: run its notebooks for the measured answer lengths")
        return
    print(f"measured on the {profile} profile's stored rows ({grid.model}):")
    for query in ("benign", "attack"):
        mine = [row for row in rows if row["query"] == query]
        capped = sum(row["new_tokens"] >= row["max_new_tokens"] for row in mine) / len(mine)
        caps = sorted({row["max_new_tokens"] for row in mine})
        print(
            f"  {query}: {len(mine):,} answers, {sum(row['new_tokens'] for row in mine) / len(mine):.1f} new tokens "
            f"on average, {capped:.1%} at their cap ({', '.join(map(str, caps))} tokens)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--estimate", metavar="PROFILE", help="print the cells and tokens of PROFILE instead")
    args = parser.parse_args()
    estimate(args.estimate) if args.estimate else speed(args)
