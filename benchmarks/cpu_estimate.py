"""The cpu profile's wall time from an empty results store, estimated from the rows each notebook adds.

    .venv/bin/python benchmarks/cpu_estimate.py --cost benign:512=3.0 --cost benign:256=1.5 --cost attack:128=0.5

For each notebook whose studies are grids of the sweep (``fairkv.runs.studies``, up to ``--last``), the cells it adds
to a store that holds only what the notebooks before it computed (cells are keyed by content, so a cell two studies
share is counted once, for the first), by query kind and token budget, times the seconds per row given with
``--cost`` (measured: the wall of a run over the rows it computed). Rows that need no decoding (``keep``) cost
``--cost keep:0``. A notebook that is no grid, or one after ``--last``, keeps its ``studies.MINUTES``. Prints a
Markdown table and the total; it computes nothing and reads no store.
"""

from __future__ import annotations

import argparse
from collections import Counter

import pandas as pd

from fairkv.runs import studies

PROFILE = "cpu"


def estimate(costs: dict[tuple[str, int], float], last: str) -> pd.DataFrame:
    per: dict[str, Counter] = {}
    for name, (_, fresh) in studies.added_cells(PROFILE).items():
        notebook = studies.study(name).notebook
        if notebook <= last:
            per[notebook] = per.get(notebook, Counter()) + fresh
    unpriced = sorted({kind for counts in per.values() for kind in counts} - set(costs))
    if unpriced:
        raise SystemExit(f"no --cost for {', '.join(f'{q}:{t}' for q, t in unpriced)}")
    kept = studies.MINUTES[PROFILE][1]
    rows = []
    for notebook in sorted(set(per) | set(kept)):
        counts = per.get(notebook)
        if counts is None:
            rows.append({"notebook": notebook, "rows": "", "minutes": kept[notebook], "source": "studies.MINUTES"})
            continue
        seconds = sum(n * costs[kind] for kind, n in counts.items())
        shown = ", ".join(f"{n} {q}:{t}" for (q, t), n in sorted(counts.items()))
        rows.append({"notebook": notebook, "rows": shown, "minutes": round(seconds / 60), "source": "rows x cost"})
    return pd.DataFrame(rows)


def cost(text: str) -> tuple[tuple[str, int], float]:
    try:
        kind, seconds = text.split("=")
        query, tokens = kind.split(":")
        return (query, int(tokens)), float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not QUERY:TOKENS=SECONDS (e.g. benign:512=3.0)") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cost", type=cost, action="append", required=True, help="QUERY:TOKENS=SECONDS per row")
    parser.add_argument("--last", default="07", help="the last notebook counted from rows (later: studies.MINUTES)")
    args = parser.parse_args()
    table = estimate(dict(args.cost), args.last)
    print(table.to_markdown(index=False))
    total = table["minutes"].sum()
    print(f"\ntotal: {total:.0f} min ({total // 60:.0f} h {total % 60:.0f} min)")


if __name__ == "__main__":
    main()
