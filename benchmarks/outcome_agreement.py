"""How the attack-answer outcome rule (``fairkv.report.outcomes``) agrees with the answers labelled by reading them
(``data/outcome_labels/labels.jsonl``): per labelled set, per outcome, precision and recall with their Wilson 95%
intervals; and how the two readers of each set agreed (share and Cohen's kappa), before adjudication.

    .venv/bin/python benchmarks/outcome_agreement.py
"""

from __future__ import annotations

import pandas as pd

from fairkv.core.metrics import proportion_ci
from fairkv.report import outcomes
from fairkv.runs import experiment, studies
from fairkv.studies import leakage


def kappa(a: pd.Series, b: pd.Series) -> float:
    seen = (a == b).mean()
    chance = sum((a == k).mean() * (b == k).mean() for k in set(a) | set(b))
    return (seen - chance) / (1 - chance)


def interval(hits: int, n: int) -> str:
    if not n:
        return "n.a."
    low, high = proportion_ci(hits, n)
    return f"{hits / n:.2f} [{low:.2f}, {high:.2f}] ({hits}/{n})"


def main() -> None:
    labels = outcomes.read_labels()
    stored = experiment.store_for(leakage.STUDY.grid("cpu"), studies.results_folder("cpu")).rows()
    rows = pd.DataFrame([stored[c] for c in labels["cell_id"]])
    labels["outcome"] = outcomes.classify(rows).to_numpy()
    for name, _, _, _ in outcomes.SETS:
        part = labels[labels["set"] == name]
        agreed = (part["reader_a"] == part["reader_b"]).sum()
        print(
            f"{name}: {len(part)} answers; readers agree on {agreed} ({agreed / len(part):.0%}), kappa "
            f"{kappa(part['reader_a'], part['reader_b']):.2f}; {len(part) - agreed} adjudicated"
        )
        for outcome in outcomes.OUTCOMES:
            said, true = part["outcome"] == outcome, part["label"] == outcome
            both = int((said & true).sum())
            print(
                f"  {outcome:8s} precision {interval(both, int(said.sum()))}, recall {interval(both, int(true.sum()))}"
            )


if __name__ == "__main__":
    main()
