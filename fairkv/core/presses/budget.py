"""Per-span budgets: the fair split (Algorithm 1), the lambda blend (Appendix G), integer apportionment.

Written once and used by every policy. Budgets are integers that sum exactly to the base policy's budget
(``kvpress.utils.compute_n_kept``), never exceed a span's length and never fall below the number of tokens the span
must keep (whitelisted tokens, and StreamingLLM's sinks).

Differs from the paper's Algorithm 1: for two spans the paper takes k_earlier = floor(n_kept * len_earlier / n) and
gives the rest to the later span; we apportion by largest remainder (ties to the later span), which for two spans
differs by at most one token and stays fair for N spans (the paper's rule would hand the last span up to N - 1 extra
tokens).
"""

from __future__ import annotations

from typing import Sequence


class BudgetError(ValueError):
    """The constraints on the per-span budgets cannot all hold."""


def apportion(total: int, targets: Sequence[float], lower: Sequence[int], upper: Sequence[int]) -> list[int]:
    """Integers x with sum(x) = total and lower <= x <= upper, closest to ``targets`` by largest remainder.

    Start from floor(target) clamped to the bounds, then add one token at a time to the span furthest below its
    target (ties: the later span), or remove one from the span furthest above it (ties: the earlier span).
    """
    if not len(targets) == len(lower) == len(upper):
        raise ValueError("targets, lower and upper must have one entry per span")
    if any(lo > up for lo, up in zip(lower, upper)):
        raise BudgetError(f"a span needs more tokens than it has: lower {list(lower)} > upper {list(upper)}")
    if not sum(lower) <= total <= sum(upper):
        raise BudgetError(f"cannot split {total} tokens with per-span bounds {list(lower)} .. {list(upper)}")
    counts = [min(max(int(t // 1), lo), up) for t, lo, up in zip(targets, lower, upper)]
    indices = range(len(counts))
    while sum(counts) < total:
        k = max((i for i in indices if counts[i] < upper[i]), key=lambda i: (targets[i] - counts[i], i))
        counts[k] += 1
    while sum(counts) > total:
        k = min((i for i in indices if counts[i] > lower[i]), key=lambda i: (targets[i] - counts[i], i))
        counts[k] -= 1
    return counts


def fair_budgets(
    n_kept: int, lengths: Sequence[int], lower: Sequence[int], reserved: Sequence[int] | None = None
) -> list[int]:
    """Algorithm 1: budgets proportional to span length (equal keep rates), never below ``lower`` (the whitelisted
    and reserved tokens of each span, which count inside its budget).

    ``reserved`` tokens per span are kept outside the split (Appendix F.3, StreamingLLM's sinks): the remaining
    budget is split in proportion to each span's length without them, and each span gets its reserved tokens on top.
    """
    reserved = list(reserved) if reserved is not None else [0] * len(lengths)
    free, rest = n_kept - sum(reserved), [length - r for length, r in zip(lengths, reserved)]
    targets = [r + free * length / sum(rest) for r, length in zip(reserved, rest)] if sum(rest) else list(reserved)
    return apportion(n_kept, targets, lower, lengths)


def debiased_budgets(
    n_kept: int,
    lengths: Sequence[int],
    lower: Sequence[int],
    default: Sequence[int],
    lam: float,
    reserved: Sequence[int] | None = None,
) -> list[int]:
    """Appendix G: b_k(lam) = lam * b_k^fair + (1 - lam) * b_k^default, apportioned to integers.

    ``default`` is the number of each span's tokens the unmodified policy keeps; lam = 0 returns it unchanged and
    lam = 1 returns the fair budgets (``fair_budgets``, with the same ``lower`` and ``reserved``).
    """
    fair = fair_budgets(n_kept, lengths, lower, reserved)
    targets = [lam * f + (1.0 - lam) * d for f, d in zip(fair, default)]
    return apportion(n_kept, targets, lower, lengths)


def window_split(window: int, n_spans: int) -> list[int]:
    """Appendix F.4: the observation window split across spans, W_X = floor(W / 2), W_Y = W - W_X for two spans;
    for N spans floor(W / N) each, the remainder to the later spans."""
    base, extra = divmod(window, n_spans)
    return [base + (1 if k >= n_spans - extra else 0) for k in range(n_spans)]
