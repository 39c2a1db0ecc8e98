"""Re-score a store's benign rows with the current scoring code, from their stored responses (no decoding).

A row's score fields (``metrics.benign_scores``: IFEval's accuracies and per-instruction outcomes, or LongBench's
``trec_score``) are a pure function of its record and response. When the scoring code changes without changing what
a score means (so ``METRICS_VERSION``, part of every cell id, stays), the stored rows are brought up to date here:
e.g. once langdetect was seeded, the IFEval rows whose language checks had drawn a different verdict from run to run.
Only rows whose score fields change are rewritten (``ResultsStore.restamp``: other rows keep their bytes); their
``versions`` stamp is left as it is: the scoring's edit moved the code's fingerprint, so the store is then verified and
restamped (``fairkv restamp``) like after any edit of code its rows run.

    python -m fairkv.runs.rescore results/cpu/qwen2.5-coder-1.5b.jsonl [--dry-run]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fairkv.core import data, metrics
from fairkv.runs.store import ResultsStore


class Scorer:
    """``benign_scores`` of a row's record and response, the record found by the row's dataset and key, each
    (dataset, key, response) scored once."""

    def __init__(self):
        self.records: dict[str, dict] = {}
        self.cache: dict[tuple, dict] = {}

    def __call__(self, row: dict) -> dict:
        dataset, key, response = row["dataset"], row["key"], row["response"]
        if (dataset, key, response) not in self.cache:
            if dataset not in self.records:
                self.records[dataset] = {record.key: record for record in data.load_records(dataset)}
            self.cache[dataset, key, response] = metrics.benign_scores(self.records[dataset][key], response)
        return self.cache[dataset, key, response]


def changed_fields(row: dict, scores: dict) -> list[str]:
    """The score fields whose stored value differs from ``scores``."""
    return [name for name, value in scores.items() if row.get(name) != value]


def rescore(path: Path, write: bool = True, say=print, every: int = 1000) -> dict:
    """Re-score every benign row of the store at ``path``; with ``write``, rewrite those whose score fields change.
    Returns the rows re-scored and the cell ids of the rows that change (``changed``) and of those whose
    prompt-level strict accuracy flips (``prompt_flips``)."""
    store = ResultsStore(path)
    started = time.monotonic()
    benign = [row for row in store.lines()[0] if row.get("query") == "benign"]
    score = Scorer()
    changed, flips = [], []
    for done, row in enumerate(benign, start=1):
        scores = score(row)
        if changed_fields(row, scores):
            changed.append(row["cell_id"])
            if "prompt_strict" in scores and row.get("prompt_strict") != scores["prompt_strict"]:
                flips.append(row["cell_id"])
        if done % every == 0 or done == len(benign):
            say(f"{done}/{len(benign)} benign rows scored, {len(changed)} changed ({time.monotonic() - started:.0f} s)")

    def change(row: dict) -> dict | None:
        if row.get("query") != "benign":
            return None
        scores = score(row)  # cached: the lines read above, unless appended since
        return {**row, **scores} if changed_fields(row, scores) else None

    rewritten = store.restamp(change) if write and changed else 0
    return {
        "path": str(path),
        "rescored": len(benign),
        "changed": changed,
        "prompt_flips": flips,
        "rewritten": rewritten,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path, help="the store's live file (its sealed segments are read beside it)")
    parser.add_argument("--dry-run", action="store_true", help="report the rows that would change, write nothing")
    args = parser.parse_args(argv)
    report = rescore(args.store, write=not args.dry_run)
    print(
        f"{report['path']}: {report['rescored']} benign rows re-scored in {report['seconds']} s, "
        f"{len(report['changed'])} changed, {len(report['prompt_flips'])} of them flip prompt-level strict accuracy, "
        f"{report['rewritten']} rows rewritten"
    )
    for cell in report["changed"]:
        print(f"  changed {cell}{' (prompt-level flip)' if cell in report['prompt_flips'] else ''}")
    return report


if __name__ == "__main__":
    main()
