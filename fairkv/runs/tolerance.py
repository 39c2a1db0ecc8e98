"""How ``fairkv verify`` judges a row recomputed with other arithmetic than made it (issue 67, item 2).

Bits are the standard only on the same arithmetic (``fairkv.core.arithmetic``: the device, the precision and the
kernel family a row records in its ``arithmetic`` field). Elsewhere a sum runs in another order, so a keep rate can move
by a token's share at the eviction threshold and a decoded answer can part where two tokens were close, as it does
when the same cells are decoded natively in another batch. A row of other arithmetic is then judged by a rule per
kind of row, each stated here with the measurement behind it:

- **Scores from the stored response** (any decoded row, on any path): scoring the stored response with this code gives
  the stored scores exactly. No arithmetic is involved, so this is a defect wherever it fails.
- **Keep rates**: every span's keep rate within ``KEEP_BOUND`` of the stored one: twice the largest move measured
  (``MOVED``) when 40 rows of the committed press atlas (AVX512-BF16) were recomputed on other arithmetic, emulated
  bfloat16 and oneDNN's AVX512 kernels without bfloat16 instructions (``benchmarks/emulated_bfloat16.py``; an earlier
  session measured AMX's kernels within 0.0031 on 40 rows too).
- **Decoded answers**: an answer may part; over the sample, per kind of query (the attack's, the benign one), the
  share of identical answers and the share of identical readings (``fairkv.report.outcomes.reading``: an attack
  answer's outcome, refuses / recites / echoes / obeys / other; a benign answer's IFEval verdict per instruction) must
  not be shown lower than two native decodes of the same cells agree (``AGREEMENT``, from the committed redecoded
  stores: ``benchmarks/results/decode_agreement.txt``): a defect when the upper end of the sample share's 95% Wilson
  interval lies below it. The fields scored from a parted answer are not compared (its own scores are checked above).
- **A judge's scores**: its digit equal, its continuous columns within ``verify.JUDGE_TOLERANCE`` (as for another
  batch on the same path).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fairkv.core.metrics import proportion_ci

# the largest move of a span's keep rate over 40 committed atlas rows (computed with AVX512-BF16 kernels) recomputed
# on other arithmetic (benchmarks/results/emulated_bfloat16*.txt)
MOVED = {"cpu bfloat16 emulated": 0.0048, "cpu bfloat16 avx512": 0.0071}
KEEP_BOUND = round(2 * max(MOVED.values()), 3)  # a span's keep rate on other arithmetic: at most this far
# two native decodes of the same cells in other batches (benchmarks/results/decode_agreement.txt: 3,700 attack and
# 6,300 benign cells of results/cpu/redecoded/ against the committed rows): the shares identical
AGREEMENT = {
    "attack": {"answers": 3485 / 3700, "readings": 3653 / 3700},
    "benign": {"answers": 4096 / 6300, "readings": 6084 / 6300},
}
KEEP_FIELDS = (
    "keep",
    "keep_",
)  # an atlas row's keep rates (a dict by span), a grid's or operative row's (one per span)


def keep_rates(row: dict) -> dict[str, float]:
    """A row's keep rate per span (empty where it has none)."""
    if isinstance(row.get("keep"), dict):
        return dict(row["keep"])
    return {name.removeprefix("keep_"): value for name, value in row.items() if name.startswith("keep_")}


def keep_moved(stored: dict, fresh: dict) -> float:
    """How far the two rows' keep rates are apart: the largest difference over spans (a rate missing in both, None
    or NaN as for an empty span, is equal; infinite where their spans differ or one row alone lacks a rate)."""
    a, b = keep_rates(stored), keep_rates(fresh)
    if a.keys() != b.keys():
        return float("inf")
    missing = lambda value: value is None or math.isnan(value)
    moved = 0.0
    for span in a:
        if missing(a[span]) != missing(b[span]):
            return float("inf")
        if not missing(a[span]):
            moved = max(moved, abs(a[span] - b[span]))
    return moved


def is_keep_field(name: str) -> bool:
    return name == "keep" or name.startswith("keep_")


@dataclass
class Agreement:
    """Decoded rows recomputed with other arithmetic: per kind of query, how many pairs, identical answers and
    identical readings."""

    counts: dict[str, list[int]] = field(default_factory=dict)  # kind -> [pairs, same answers, same readings]

    def add(self, kind: str, same_answer: bool, same_reading: bool) -> None:
        tally = self.counts.setdefault(kind, [0, 0, 0])
        tally[0] += 1
        tally[1] += same_answer
        tally[2] += same_reading

    def below(self) -> list[str]:
        """Each share shown lower than two native decodes agree (its 95% interval's upper end below the floor)."""
        short = []
        for kind, (n, *same) in sorted(self.counts.items()):
            for what, k in zip(("answers", "readings"), same):
                floor, upper = AGREEMENT[kind][what], proportion_ci(k, n)[1]
                if upper < floor:
                    short.append(
                        f"{kind} {what} identical in {k} of {n} (95% CI up to {upper:.2f}), below two native "
                        f"decodes' {floor:.3f}"
                    )
        return short

    def __str__(self) -> str:
        return "; ".join(
            f"{kind}: {same_answers} of {n} answers identical (native floor {AGREEMENT[kind]['answers']:.3f}), "
            f"{same_readings} of {n} readings (floor {AGREEMENT[kind]['readings']:.3f})"
            for kind, (n, same_answers, same_readings) in sorted(self.counts.items())
        )
