"""The README's first sentence on results: what this model can show at all, its positive controls' ceilings read from
their committed tables (``03_ceilings``, ``03_ceiling_accuracy``: ``fairkv.studies.ceilings``); the counts after it
say how many of the paper's numbers lie above them (``summary.sizes``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fairkv.report.confounds import ConfoundError, table

PEAK = ("streamingllm", "0.5")  # Fig 4's leakage peak, where the paper's largest leakage lies


def _highest(leak: pd.DataFrame, policy: str, ratio: str) -> str:
    """The directive leakage ("mean [low, high] (its control)") of the control that reaches the highest upper end at
    ``policy`` and ``ratio`` (the most this model says there with nothing telling it not to: ``Ceilings.leakage``'s
    rule), named."""
    cells = leak[(leak["policy"] == policy) & (leak["ratio"].astype(float) == float(ratio))]
    if cells.empty:
        raise ConfoundError(f"03_ceilings.csv has no row at {policy} r = {ratio}")
    top = cells.loc[cells["directive leakage"].map(lambda cell: float(cell.rstrip("]").split(", ")[-1])).idxmax()]
    return f"{top['directive leakage']} ({top['control']})"


def said(folder: Path) -> str:
    """One sentence: the leakage this model reaches with nothing telling it not to recite (uncompressed and at Fig 4's
    peak, each with the control that reaches it), and the accuracy it reaches at the paper's budget against ours on
    the same prompts (how many claims' numbers lie above these: the counts that follow it, ``summary.sizes``)."""
    leak = table(folder, "03_ceilings")
    accuracy = table(folder, "03_ceiling_accuracy").sort_values("new tokens", key=lambda c: c.astype(int))
    ours, top = accuracy.iloc[0], accuracy.iloc[-1]
    same = "as" if ours["accuracy"] == top["accuracy"] else ours["accuracy"]
    return (
        f"**What this model can show** (positive controls, `03_ceilings`): told nothing against reciting, the attack "
        f"draws {_highest(leak, 'none', '0.0')} of its directive uncompressed, {_highest(leak, *PEAK)} at "
        f"StreamingLLM r = {PEAK[1]}; uncompressed it follows {top['accuracy']} of {top['n']} IFEval prompts at the "
        f"paper's {top['new tokens']} new tokens, {same} at {ours['new tokens']}."
    )
