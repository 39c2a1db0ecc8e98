"""What the press atlas's rows say (notebook 12): each press's eviction bias and its pattern over both orders, the
presses that raised, the presses identical to another on these prompts, the most biased presses, and the attack
side's table. The claims notebook 12 tests on them are declared in ``fairkv.studies.atlas``.

Bias: the defense's keep rate minus the directive's at ``BIAS_RATIO``, per prompt, mean over prompts with a bootstrap
interval (``bias``); ``pattern`` reads both orders together: whether a press favours the later span (the paper's
pitfall, Section 4.5: the defense, earlier in the normal order, is lost first), the earlier one, or neither. A press
whose keep rates equal another's at every ratio, order and prompt (``identical``: LagKV scores by recency on prompts
shorter than its two lag windows, so it is StreamingLLM here) is named as that press's copy, and takes no place among
the most biased. The rows come from ``fairkv.runs.atlas`` (keep rates) and ``fairkv.runs.experiment`` on
``fairkv.studies.atlas.ATTACKS`` (attacks).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fairkv.core.presses import get_policy
from fairkv.report.verdicts import HOLDS, INCONCLUSIVE, Estimate, decide, is_null, mean
from fairkv.runs import atlas

BIAS_RATIO = 0.5
N_MOST_BIASED = 5
# both orders' bias intervals within this of 0: balanced (two tokens of a span of a hundred; keep rates move by tokens)
BALANCED_WITHIN = 0.02
# keep rates this close at every ratio, order and prompt: the same press here (a keep rate is a whole number of tokens
# over the span's length, stored in float32: the same kept set gives the same rate, one token of a 200-token span 0.005)
IDENTICAL_WITHIN = 1e-6


def failures(rows: pd.DataFrame) -> pd.DataFrame:
    """The presses that raised on some prompts: how many (prompt, order) pairs per ratio, and the first error."""
    failed = rows[rows["error"].notna()]
    if failed.empty:
        return pd.DataFrame(columns=["press", "ratio", "failed", "of", "error"])
    total = rows.groupby(["press", "ratio"], observed=True).size()
    return (
        failed.groupby(["press", "ratio"], observed=True, sort=False)
        .agg(failed=("key", "size"), error=("error", "first"))
        .reset_index()
        .assign(of=lambda t: [int(total[(p, r)]) for p, r in zip(t["press"], t["ratio"])])[
            ["press", "ratio", "failed", "of", "error"]
        ]
    )


def bias(rows: pd.DataFrame, ratio: float = BIAS_RATIO) -> pd.DataFrame:
    """Per press and order: defense keep rate minus directive keep rate at ``ratio``, mean over prompts with its 95%
    bootstrap interval, ranked from the most negative (the defense lost first) in the normal order. Prompts on which
    a press raised (``failures``) are left out of its n."""
    if ratio not in set(rows["ratio"]):
        raise atlas.AtlasError(f"no atlas rows at r = {ratio}: the plan's ratios are {sorted(set(rows['ratio']))}")
    out = []
    for (press, order), estimate in bias_estimates(rows, ratio).items():
        group = rows[(rows["press"] == press) & (rows["order"] == order)]
        out.append(
            {
                "press": press,
                "order": order,
                "bias": estimate.value,
                "low": estimate.low,
                "high": estimate.high,
                "n": estimate.n,
                "scoring": group["scoring"].iloc[0],
                "paper": bool(group["paper"].iloc[0]),
            }
        )
    table = pd.DataFrame(out)
    rank = table[table["order"] == table["order"].iloc[0]].sort_values("bias")["press"].tolist()
    return table.assign(press=pd.Categorical(table["press"], rank, ordered=True)).sort_values(["press", "order"])


def bias_estimates(rows: pd.DataFrame, ratio: float = BIAS_RATIO) -> dict[tuple[str, str], Estimate]:
    """Per (press, order) in the rows' order: the defense's keep rate minus the directive's at ``ratio``, mean over
    prompts with its bootstrap interval (prompts on which the press raised left out)."""
    if ratio not in set(rows["ratio"]):
        raise atlas.AtlasError(f"no atlas rows at r = {ratio}: the plan's ratios are {sorted(set(rows['ratio']))}")
    at = rows[rows["ratio"] == ratio]
    return {
        (str(press), str(order)): mean(group["keep_defense"] - group["keep_directive"])
        for (press, order), group in at.groupby(["press", "order"], sort=False, observed=True)
    }


def identical(rows: pd.DataFrame) -> dict[str, str]:
    """The presses whose keep rates (every span) equal another's within ``IDENTICAL_WITHIN`` at every ratio, order and
    prompt of the rows, each mapped to the press it copies: the paper's presses come first, then the others in the
    rows' order, and a press copies the first it equals."""
    keeps = [f"keep_{span}" for span in atlas.SPANS]
    papers = rows.drop_duplicates("press").set_index("press")["paper"]
    order = [p for p in papers.index if papers[p]] + [p for p in papers.index if not papers[p]]
    table = {
        press: group.set_index(["order", "ratio", "key"])[keeps].sort_index()
        for press, group in rows.groupby("press", sort=False, observed=True)
    }
    copies: dict[str, str] = {}
    originals: list[str] = []
    for press in order:
        same = next((o for o in originals if _equal(table[press], table[o])), None)
        if same is None:
            originals.append(press)
        else:
            copies[str(press)] = str(same)
    return copies


def _equal(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    if not a.index.equals(b.index):
        return False
    x, y = a.to_numpy(dtype=float), b.to_numpy(dtype=float)
    both_missing = np.isnan(x) & np.isnan(y)
    return bool(((np.abs(x - y) <= IDENTICAL_WITHIN) | both_missing).all())


LATER = "later span favoured (the paper's pitfall)"
EARLIER = "earlier span favoured"
DEFENSE = "defense lost first in both orders"
DIRECTIVE = "directive lost first in both orders"
BALANCED = "balanced"


def copy_of(press: str) -> str:
    """The pattern of a press identical to ``press`` on these prompts."""
    return f"identical to {press}"


def pattern(table: pd.DataFrame, identical: dict[str, str] | None = None) -> pd.DataFrame:
    """Each press's pattern over both orders, from the sign of its bias interval in each (the defense comes first
    in the normal order, last in the flipped one): ``LATER`` when the later span is kept more in both orders,
    ``EARLIER`` the opposite, ``DEFENSE``/``DIRECTIVE`` when one instruction loses whatever its place, ``BALANCED`` when both
    intervals lie inside +-``BALANCED_WITHIN``, else inconclusive; a press ``identical`` (the ``identical`` of the
    keep-rate rows) names the press it copies instead ("identical to StreamingLLM")."""
    identical = identical or {}
    out = []
    for press, group in table.groupby("press", observed=True, sort=False):
        by_order = {row.order: Estimate(row.bias, row.low, row.high, row.n) for row in group.itertuples()}
        if set(by_order) != {"normal", "flipped"}:
            raise atlas.AtlasError(f"{press}: a pattern needs both orders, the rows have {sorted(by_order)}")
        normal, flipped = by_order["normal"], by_order["flipped"]
        signs = tuple(_sign(e) for e in (normal, flipped))
        label = {(-1, 1): LATER, (1, -1): EARLIER, (-1, -1): DEFENSE, (1, 1): DIRECTIVE}.get(signs, INCONCLUSIVE)
        if label == INCONCLUSIVE and all(is_null(e, 0.0, BALANCED_WITHIN) for e in (normal, flipped)):
            label = BALANCED
        if str(press) in identical:
            label = copy_of(identical[str(press)])
        out.append({"press": press, "bias normal": normal.signed(), "bias flipped": flipped.signed(), "pattern": label})
    return pd.DataFrame(out)


def _sign(estimate: Estimate) -> int:
    """+1 / -1 when the interval lies wholly above / below zero and not wholly within +-``BALANCED_WITHIN`` of it (a
    bias that small is none: a null decided with its margin, ``is_null``, as ``BALANCED`` reads it), else 0."""
    above = decide(estimate, above=0.0, margin=BALANCED_WITHIN) == HOLDS
    return 1 if above else -1 if decide(estimate, below=0.0, margin=BALANCED_WITHIN) == HOLDS else 0


def most_biased(
    table: pd.DataFrame, candidates: list[str], n: int = N_MOST_BIASED, identical: dict[str, str] | None = None
) -> list[str]:
    """The ``n`` presses among ``candidates`` (labels) whose normal-order bias is most negative (defense lost first);
    a press ``identical`` to another (``identical``) takes no place among them (it is that press here), candidates the
    table has not measured are not chosen, and none measured is an error."""
    ranked = [c for c in candidates if c not in (identical or {})]
    normal = table[(table["order"] == "normal") & table["press"].isin(ranked)].sort_values("bias")
    if normal.empty:
        raise atlas.AtlasError(f"no bias measured for any of {candidates}: run the keep-rate atlas on them first")
    return [str(p) for p in normal["press"].head(n)]


def attack_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Refusal and leak rate (Wilson 95% intervals over prompts) per press, variant and ratio."""
    out = []
    for (policy, variant, ratio), group in rows.groupby(["policy", "variant", "ratio"], sort=False):
        refused, leaked = mean(group["refused"]), mean(group["leaked"])
        out.append(
            {
                "press": get_policy(policy).label,
                "variant": variant,
                "ratio": ratio,
                "n": refused.n,
                "refused": str(refused),
                "leaked": str(leaked),
            }
        )
    return pd.DataFrame(out)


def bias_curve(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean keep rate of each span per press, order and ratio (the atlas's curves)."""
    return (
        rows.groupby(["press", "order", "ratio"], observed=True, sort=False)[[f"keep_{s}" for s in atlas.SPANS]]
        .mean()
        .reset_index()
    )
