"""The cpu profile's wall time from an empty results store, estimated from the rows each notebook adds.

    .venv/bin/python benchmarks/cpu_estimate.py --cost benign:512=3.0 --cost benign:256=1.5 --cost attack:128=0.5

For each notebook whose studies are grids of the sweep (``fairkv.studies.sweeps``, up to ``--last``), the cells it adds
to a store that holds only what the notebooks before it computed (cells are keyed by content, so a cell two studies
share is counted once, for the first), by query kind and token budget, times the seconds per row given with
``--cost`` (measured: the wall of a run over the rows it computed). Rows that need no decoding (``keep``) cost
``--cost keep:0``. A notebook that is no grid, or one after ``--last``, keeps its module's ``MINUTES``. Prints a
Markdown table and the total; it computes nothing and reads no store.

``--measure STUDY --prompts N [--query Q]``: the cost per row instead, measured. Each part of the study's cpu grid (its
benign side apart, ``Study.parts``) on its first N prompts, computed into an empty store with the model loaded
before; prints the rows, the wall and the seconds per row of each part.

    .venv/bin/python benchmarks/cpu_estimate.py --measure leakage --prompts 10 --query attack
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter

import pandas as pd
import torch

import fairkv.studies
from fairkv.core import models
from fairkv.runs import experiment

PROFILE = "cpu"


def estimate(costs: dict[tuple[str, int], float], last: str) -> pd.DataFrame:
    per: dict[str, Counter] = {}
    for name, (_, fresh) in fairkv.studies.added_cells(PROFILE).items():
        notebook = fairkv.studies.study(name).notebook
        if notebook <= last:
            per[notebook] = per.get(notebook, Counter()) + fresh
    unpriced = sorted({kind for counts in per.values() for kind in counts} - set(costs))
    if unpriced:
        raise SystemExit(f"no --cost for {', '.join(f'{q}:{t}' for q, t in unpriced)}")
    kept = fairkv.studies.expected_minutes(PROFILE, ["00", *fairkv.studies.MODULES])[1]
    rows = []
    for notebook in sorted(set(per) | set(kept)):
        counts = per.get(notebook)
        if counts is None:
            rows.append({"notebook": notebook, "rows": "", "minutes": kept[notebook], "source": "MINUTES"})
            continue
        seconds = sum(n * costs[kind] for kind, n in counts.items())
        shown = ", ".join(f"{n} {q}:{t}" for (q, t), n in sorted(counts.items()))
        rows.append({"notebook": notebook, "rows": shown, "minutes": round(seconds / 60), "source": "rows x cost"})
    return pd.DataFrame(rows)


def measure(name: str, n_prompts: int, query: str | None) -> None:
    lm = None
    for part in fairkv.studies.study(name).parts(PROFILE, n_prompts=n_prompts):
        if query is not None and query not in part.queries:
            continue
        lm = lm or models.load_model(part.model, dtype=getattr(torch, part.dtype))
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            rows = experiment.run(part, folder, lm=lm, progress=False)
            wall = time.perf_counter() - start
        n = rows["cell_id"].nunique()
        kinds = ", ".join(f"{q}:{part.tokens_for(q)}" for q in part.queries)
        print(f"{name} ({kinds}) on {n_prompts} prompts: {n} rows in {wall:.1f} s, {wall / n:.3f} s per row")


def cost(text: str) -> tuple[tuple[str, int], float]:
    try:
        kind, seconds = text.split("=")
        query, tokens = kind.split(":")
        return (query, int(tokens)), float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not QUERY:TOKENS=SECONDS (e.g. benign:512=3.0)") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cost", type=cost, action="append", help="QUERY:TOKENS=SECONDS per row")
    parser.add_argument(
        "--last", default="07", help="the last notebook counted from rows (later: the modules' MINUTES)"
    )
    parser.add_argument("--measure", metavar="STUDY", help="measure the cost per row of STUDY's parts instead")
    parser.add_argument("--prompts", type=int, default=10, help="prompts for --measure")
    parser.add_argument("--query", help="--measure only the parts with this query kind")
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.prompts, args.query)
        return
    if not args.cost:
        parser.error("give the cost per row of each query kind (--cost QUERY:TOKENS=SECONDS), or --measure STUDY")
    table = estimate(dict(args.cost), args.last)
    print(table.to_markdown(index=False))
    total = table["minutes"].sum()
    print(f"\ntotal: {total:.0f} min ({total // 60:.0f} h {total % 60:.0f} min)")


if __name__ == "__main__":
    main()
