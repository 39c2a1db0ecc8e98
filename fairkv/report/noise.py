"""Decoding noise: how much a stored score moves when its cell is decoded again under another batch plan.

In bfloat16 an answer depends on which rows share its running batch (the matmuls' batch dimension and the padded
attention width change how sums round: ``benchmarks/batch_dependence.py``). ``benchmarks/decoding_noise.py`` decoded a
seeded slice of the committed cpu rows again with a batch of 64 instead of 128 and kept, per cell, whether the answer
changed and how each score moved (``results/cpu/decoding_noise/comparison.csv``). ``Noise`` reads it: the share of
answers and of each score that change, and the spread of a score's change per cell, from which ``reach`` gives how far
a mean over n prompts of a part (of ``settings`` settings) may move when every cell is decoded again: 2 standard
deviations of the mean change, ``2 sd sqrt(settings / n)``. A claim whose deciding bound lies within that reach of its
threshold is marked as within decoding noise (``fairkv.report.claims``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fairkv.core.paths import results_dir

FILE = Path("decoding_noise") / "comparison.csv"
SENSITIVE = "sensitive to decoding noise"  # how a claim's noise column opens what its cells decoded again moved


def sensitive(column: pd.Series) -> pd.Series:
    """Which claims' noise column (a table's ``noise``) says decoding their cells again moved a verdict."""
    return column.str.contains(SENSITIVE, regex=False, na=False)


MOVED, NEAR = "moved", "near"  # a claim's noise mark: decoded again its verdict moved; within the noise's reach


def mark(column: pd.Series) -> pd.Series:
    """A claim's noise column in a word: ``MOVED`` where decoding its cells again moved a verdict, ``NEAR`` where a
    verdict lies within decoding noise's reach and stayed (or was not decoded again), "" beyond it."""
    return column.fillna("").map(lambda text: "" if not text else NEAR).where(~sensitive(column), MOVED)


class NoiseError(ValueError):
    """A comparison the noise cannot be read from."""


@dataclass(frozen=True)
class Noise:
    table: pd.DataFrame  # one row per cell decoded again: same_response, parted_at, <score>_delta

    @classmethod
    def read(cls, profile: str = "cpu") -> "Noise | None":
        """The profile's committed comparison, None when the profile has none (the noise was measured at cpu)."""
        path = results_dir() / profile / FILE
        if not path.exists():
            return None
        table = pd.read_csv(path)
        if "same_response" not in table or not any(c.endswith("_delta") for c in table):
            raise NoiseError(f"{path} has no same_response and <score>_delta columns: run benchmarks/decoding_noise.py")
        return cls(table)

    def sd(self, score: str) -> float:
        column = f"{score}_delta"
        if column not in self.table:
            raise NoiseError(f"the noise comparison has no {column!r}: scores measured are {', '.join(self.scores)}")
        return float(self.table[column].dropna().std())

    @property
    def scores(self) -> list[str]:
        return [c.removesuffix("_delta") for c in self.table if c.endswith("_delta")]

    def reach(self, score: str, n: int, settings: int = 2) -> float:
        """How far a mean over ``n`` prompts of ``settings`` settings may move when decoded again (2 sd of it)."""
        return 2 * self.sd(score) * math.sqrt(settings / max(n, 1))

    def said(self) -> str:
        """SUMMARY's paragraph: what changes when cells are decoded again."""
        table = self.table
        changed = ~table["same_response"].astype(bool)
        by_query = ", ".join(
            f"{query} {(~frame['same_response'].astype(bool)).mean():.0%} (of {len(frame)})"
            for query, frame in table.groupby("query")
        )
        scores = ", ".join(
            f"{score} {(table[f'{score}_delta'].dropna().abs() > 1e-12).mean():.1%} (sd {self.sd(score):.3f})"
            for score in self.scores
        )
        return (
            f"**Decoding noise.** {len(table)} committed cells decoded again under another batch plan "
            f"(`benchmarks/decoding_noise.py`, `{FILE}` under the profile's results): {changed.mean():.0%} of the answers "
            f"change ({by_query}; they part at token {table['parted_at'].median():.0f}, the median), yet the scores "
            f"change in few cells: {scores}. A claim with a deciding interval end nearer its threshold than decoding "
            "again may move it (2 sd of the mean change of its score over the claim's prompts) is marked in the column "
            "`noise`, and so is a mitigation's mechanism that one of its comparisons moved that far would read "
            "otherwise (decoded again where its claim declares its cells); bfloat16 prefill of identical rows is "
            "batch-invariant, padding beside a longer prompt and the decoding step's batch are not "
            "(`benchmarks/results/batch_dependence_qwen.txt`)."
        )
