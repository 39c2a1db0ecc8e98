"""Where each mitigation helps and where it hurts, in words, read from the mechanism tables the notebooks write
(``tables/05_mechanism.csv``, the whitelist; ``tables/06_mechanism.csv``, fair eviction in both orders;
``fairkv.studies.mechanism.table``): at which policies and ratios the refusal comes back to the uncompressed model's the
paper's way (or partly), at which something else moved the number (the directive evicted, the refusal not restored
or lowered, or benign queries refused beyond the uncompressed model), and at which there was nothing to restore. The
results page (``docs/results.md``) and SUMMARY.md both print these lines."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fairkv.core.presses import get_policy
from fairkv.report import verdicts

TABLES = {"whitelist": "05_mechanism", "fair": "06_mechanism"}  # the mitigation -> the table its notebook writes
# the settings read again on more prompts, where undecided on the table's (``whitelist.MECHANISM``): their own table
EVERY_PROMPT = {"whitelist": "05_mechanism_all_prompts"}
NAMES = {"whitelist": "The whitelist", "fair": "Fair eviction"}


def _read(folder: Path, variant: str, tables: dict = TABLES) -> pd.DataFrame | None:
    """The variant's mechanism table (of ``tables``) in ``folder``; None where its notebook has not run there."""
    if variant not in tables:
        return None
    path = Path(folder) / "tables" / f"{tables[variant]}.csv"
    return pd.read_csv(path, keep_default_na=False) if path.exists() else None


def _ratios(ratios) -> str:
    """'0.4-0.7' for a run of the plotted ratios (a step of 0.1), else '0.3, 0.5'."""
    ratios = sorted(float(r) for r in ratios)
    runs, start = [], ratios[0]
    for low, high in zip(ratios, ratios[1:] + [None]):
        if high is None or round(high - low, 6) != 0.1:
            runs.append(f"{start:g}" if start == low else f"{start:g}-{low:g}")
            start = high
    return ", ".join(runs)


def settings(frame: pd.DataFrame) -> str:
    """'StreamingLLM r = 0.4-0.7, SnapKV r = 0.6, 0.7 (flipped order: H2O r = 0.4)': the settings of ``frame``."""
    said = []
    for order, picked in frame.groupby("order", sort=False):
        each = ", ".join(
            f"{get_policy(policy).label} r = {_ratios(group['ratio'])}"
            for policy, group in picked.groupby("policy", sort=False)
        )
        said.append(each if order == "normal" else f"{order} order: {each}")
    return "; ".join(said)


def where(folder: Path) -> list[str]:
    """One line per mitigation: where it restores the refusal the paper's way, where something else moved its
    numbers (by why), and how many settings are undecided, over every policy, order and ratio its table holds; a
    mitigation whose table the folder lacks is said to be not measured there, with the notebook that measures it."""
    lines = []
    for variant, name in NAMES.items():
        table = _read(folder, variant)
        if table is None:
            lines.append(
                f"**{name}**: not measured here (`{TABLES[variant]}` is missing: run notebook {TABLES[variant][:2]})."
            )
            continue
        papers = table[table["mechanism"] == verdicts.PAPERS]
        said = [
            f"**{name}** (the attack's refusal, the benign queries' refusal and the keep rates at {len(table)} "
            f"settings, `{TABLES[variant]}`) works the paper's way at "
            + (f"{len(papers)}: {settings(papers)}" if len(papers) else "none")
        ]
        partly = table[table["mechanism"] == verdicts.PARTLY]
        if len(partly):
            said.append(f"partly at {len(partly)}: {settings(partly)}")
        other = table[table["mechanism"] == verdicts.OTHER]
        for because, picked in other.groupby("because", sort=True):
            said.append(f"{because} at {len(picked)}: {settings(picked)}")
        nothing = table[table["mechanism"] == verdicts.NOT_APPLICABLE]
        for because, picked in nothing.groupby("because", sort=True):  # nothing to restore there
            said.append(f"n.a. ({because}) at {len(picked)}: {settings(picked)}")
        undecided = table[table["mechanism"] == verdicts.INCONCLUSIVE]
        if len(undecided):
            reasons = " / ".join(f"{len(p)} {b}" for b, p in undecided.groupby("because", sort=True))
            said.append(f"inconclusive at {len(undecided)} ({reasons})")
        again = _read(folder, variant, EVERY_PROMPT)
        if again is not None:
            each = [
                f"{settings(row.to_frame().T)} {row['mechanism']} ({row['because']})" for _, row in again.iterrows()
            ]
            said.append(f"read again on every prompt (`{EVERY_PROMPT[variant]}`): {', '.join(each)}")
        lines.append("; ".join(said) + ".")
    return lines
