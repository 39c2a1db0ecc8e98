"""Verdicts on the paper's claims: an estimate over prompts with a 95% interval, and holds / fails / inconclusive.

A claim says where a quantity lies: above a bound, below one, or inside a margin. The quantity is estimated from
one value per prompt:

- ``rate``: the mean of a 0/1 outcome (refused, leaked, followed), with a Wilson interval;
- ``mean``: the mean of any per-prompt value, Wilson for 0/1 values, else a seeded percentile bootstrap over prompts;
- ``difference``: setting A minus setting B on the same prompts (paired): Newcombe's interval for paired
  proportions (method 10, from Wilson intervals) when both are 0/1, else a seeded paired bootstrap over prompts.

``decide``: a claim ``holds`` when the whole interval lies inside the claimed region, ``fails`` when none of it does
(the interval excludes the claimed effect, e.g. it lies at or below no effect for a claimed increase), and is
``inconclusive`` otherwise: this is the claim's *direction*. A bootstrap over fewer than ``MIN_BOOTSTRAP`` prompts
prints no interval ("too few prompts for an interval (n = 2)") and decides nothing (inconclusive): with four prompts
that all show no change it is [0, 0], which would read as a finding; Wilson and Newcombe intervals stay honest at
small n and decide at any n. A compound claim (a ranking, a shape) is the conjunction of its parts (``all_of``): it
holds when every part holds, fails when any part fails, else is inconclusive. ``resampled`` gives any other statistic
(a spread over classes, a rank correlation, a Pareto share) an interval by resampling prompts. Numbers print with two
decimals, or one significant digit where two decimals would show a value that is not 0 as 0 (``number``).

``magnitude``: whether the paper's own number (its figures', approximate) lies inside our interval widened by a
tolerance per kind of quantity (``TOLERANCE``, stated once here): ``matches``, ``differs``, or ``n.a.`` when the paper
gives no number. A direction can hold while the magnitude differs (the effect is there, smaller).

The paper reports no intervals; these are ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fairkv.core.metrics import proportion_ci

HOLDS, FAILS, INCONCLUSIVE = "holds", "fails", "inconclusive"
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE)
MIN_BOOTSTRAP = 10  # prompts below which a bootstrap gives no interval and decides nothing
MATCHES, DIFFERS, NOT_APPLICABLE = "matches", "differs", "n.a."
MAGNITUDES = (MATCHES, DIFFERS, NOT_APPLICABLE)
# How far outside our 95% interval the paper's number may lie and still match, per kind of quantity: the paper's
# numbers are read off its figures (about +-0.05) on another model (Llama-3.1-8B), so a match is "about the same".
TOLERANCE = {
    "rate": 0.10,  # refusal, leak or judge rate
    "leakage": 0.10,  # ROUGE-L recall
    "keep": 0.10,  # keep rate of a span
    "accuracy": 0.10,  # IFEval accuracy
    "difference": 0.10,  # a change in one of the above (after - before)
    "score": 0.05,  # Table 1's composite score (half an accuracy change plus half a leakage change)
    "share": 0.15,  # a share of ratios (Pareto frequency)
    "cost": 0.10,  # a runtime ratio to the base policy
}


class VerdictError(ValueError):
    """Values that cannot give an estimate (none, or two settings on different prompts)."""


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` prompts with its 95% interval."""

    value: float
    low: float
    high: float
    n: int
    method: str = "bootstrap"  # wilson, newcombe or bootstrap (over prompts)

    def __str__(self) -> str:
        return self._show("")

    def signed(self) -> str:
        """For differences: the sign shown."""
        return self._show("+")

    @property
    def too_few(self) -> bool:
        """A bootstrap over fewer than ``MIN_BOOTSTRAP`` prompts: no interval, no verdict."""
        return self.method == "bootstrap" and self.n < MIN_BOOTSTRAP

    def _show(self, sign: str) -> str:
        if math.isnan(self.value):
            return "undefined"
        shown = number(self.value, sign)
        if self.too_few:
            return f"{shown} [too few prompts for an interval (n = {self.n})]"
        if math.isnan(self.low):
            return f"{shown} [no interval]"
        return f"{shown} [{number(self.low, sign)}, {number(self.high, sign)}]"


def number(value: float, sign: str = "") -> str:
    """Two decimals, or one significant digit where two decimals would print a value that is not 0 as 0 (+0.003,
    not +0.00: a bound at zero stays visible)."""
    shown = f"{value:{sign}.2f}"
    if value != 0 and float(shown) == 0:
        return f"{value:{sign}.1g}" if abs(value) >= 1e-4 else f"{value:{sign}.0e}"
    return shown


def _binary(values: np.ndarray) -> bool:
    return bool(np.isin(values, (0.0, 1.0)).all())


def _values(values) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    if not len(array):
        raise VerdictError("no values to estimate from")
    return array


def bootstrap_ci(values: np.ndarray, level: float = 0.95, n_boot: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (seeded, so tables are reproducible); NaN below two values (then
    every claim on it is inconclusive)."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float("nan"), float("nan")
    draws = np.random.default_rng(seed).choice(values, size=(n_boot, len(values))).mean(axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail))


def rate(values) -> Estimate:
    """A 0/1 outcome's rate with its Wilson interval."""
    array = _values(values)
    if not _binary(array):
        raise VerdictError(f"a rate needs 0/1 values, got {sorted(set(array.tolist()))[:5]}")
    low, high = proportion_ci(int(array.sum()), len(array))
    return Estimate(float(array.mean()), low, high, len(array), "wilson")


def mean(values) -> Estimate:
    """The mean over prompts: Wilson for 0/1 values, else a percentile bootstrap."""
    array = _values(values)
    if _binary(array):
        return rate(array)
    low, high = bootstrap_ci(array)
    return Estimate(float(array.mean()), low, high, len(array))


def newcombe(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """95% interval of mean(a) - mean(b) for paired 0/1 outcomes (Newcombe 1998, method 10)."""
    n = len(a)
    both, only_a = int(((a == 1) & (b == 1)).sum()), int(((a == 1) & (b == 0)).sum())
    only_b, neither = int(((a == 0) & (b == 1)).sum()), int(((a == 0) & (b == 0)).sum())
    p1, p2 = (both + only_a) / n, (both + only_b) / n
    l1, u1 = proportion_ci(both + only_a, n)
    l2, u2 = proportion_ci(both + only_b, n)
    margins = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    phi = (both * neither - only_a * only_b) / math.sqrt(margins) if margins else 0.0
    delta = p1 - p2
    low = delta - math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    high = delta + math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    return max(low, -1.0), min(high, 1.0)


def difference(a: pd.Series, b: pd.Series) -> Estimate:
    """Paired difference mean(a - b) over the prompts both carry (Series indexed by prompt).

    Both must hold the same prompts: a comparison on different prompts is not like for like."""
    a, b = a.dropna(), b.dropna()
    if set(a.index) != set(b.index):
        raise VerdictError(
            f"a paired comparison needs the same prompts on both sides: {len(set(a.index) ^ set(b.index))} "
            f"prompts are on one side only"
        )
    if not len(a):
        raise VerdictError("no prompts to compare")
    if a.index.has_duplicates or b.index.has_duplicates:
        raise VerdictError("a paired comparison needs one value per prompt on each side")
    x, y = a.sort_index().to_numpy(dtype=float), b.sort_index().to_numpy(dtype=float)
    if _binary(x) and _binary(y):
        return Estimate(float((x - y).mean()), *newcombe(x, y), len(x), "newcombe")
    low, high = bootstrap_ci(x - y)
    return Estimate(float((x - y).mean()), low, high, len(x))


def decide(estimate: Estimate, above: float | None = None, below: float | None = None) -> str:
    """Whether the claimed region (value > ``above`` and/or value < ``below``) holds the interval.

    holds: the whole interval lies inside the region; fails: no part of it does; else inconclusive (also when the
    interval is undefined, NaN, or a bootstrap over fewer than ``MIN_BOOTSTRAP`` prompts)."""
    if above is None and below is None:
        raise VerdictError("a claim needs a region: above and/or below")
    if estimate.too_few or math.isnan(estimate.low):
        return INCONCLUSIVE
    inside = (above is None or estimate.low > above) and (below is None or estimate.high < below)
    outside = (above is not None and estimate.high <= above) or (below is not None and estimate.low >= below)
    return HOLDS if inside else FAILS if outside else INCONCLUSIVE


def magnitude(estimate: Estimate, paper: float | tuple[float, float] | None, kind: str) -> str:
    """``matches`` when the paper's number (or any part of its range) lies inside our 95% interval widened by
    ``TOLERANCE[kind]`` on both sides, ``differs`` when it lies outside; ``n.a.`` when the paper gives no number or we
    have no interval."""
    if kind not in TOLERANCE:
        raise VerdictError(f"unknown kind of quantity {kind!r}: use one of {', '.join(TOLERANCE)}")
    if paper is None or estimate.too_few or math.isnan(estimate.low):
        return NOT_APPLICABLE
    low, high = (paper, paper) if isinstance(paper, (int, float)) else paper
    tolerance = TOLERANCE[kind]
    return MATCHES if high >= estimate.low - tolerance and low <= estimate.high + tolerance else DIFFERS


def all_magnitudes(magnitudes: list[str]) -> str:
    """A quantity of several parts (a ranking): matches when every part does, differs when any does, else n.a."""
    return (
        DIFFERS
        if DIFFERS in magnitudes
        else MATCHES
        if magnitudes and all(m == MATCHES for m in magnitudes)
        else NOT_APPLICABLE
    )


def all_of(verdicts: list[str]) -> str:
    """A claim made of several parts: holds when all hold, fails when any fails, else inconclusive."""
    if not verdicts:
        raise VerdictError("a compound claim needs at least one part")
    return FAILS if FAILS in verdicts else HOLDS if all(v == HOLDS for v in verdicts) else INCONCLUSIVE


def resampled(rows: pd.DataFrame, statistic, by: str = "key", n_boot: int = 400, seed: int = 0) -> Estimate:
    """``statistic(rows)`` with a percentile bootstrap interval over the units in column ``by`` (prompts): for claims
    that are no mean of per-prompt values (a spread over classes, a rank correlation, a Pareto share, a gap between
    two means). Each draw takes as many units as there are, with replacement, with all their rows (so paired settings
    stay paired); draws where the statistic is undefined (NaN) are left out, and the interval is NaN when more than
    half are."""
    units = rows[by].to_numpy()
    names, inverse = np.unique(units, return_inverse=True)
    members = [np.flatnonzero(inverse == k) for k in range(len(names))]
    value = float(statistic(rows))
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        chosen = rng.integers(0, len(names), len(names))
        draws.append(float(statistic(rows.iloc[np.concatenate([members[k] for k in chosen])])))
    draws = np.array(draws)
    valid = draws[~np.isnan(draws)]
    if len(valid) < n_boot / 2 or len(names) < 2:
        return Estimate(value, float("nan"), float("nan"), len(names))
    return Estimate(value, float(np.percentile(valid, 2.5)), float(np.percentile(valid, 97.5)), len(names))
