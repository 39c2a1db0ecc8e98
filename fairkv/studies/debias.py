"""Notebook 07, the debiasing weight lambda and the Pareto view (Appendices G-H, Figs 15-16 and Table 3 of arXiv
2510.00231): span budgets between the base policy's (lambda = 0) and fair eviction's (lambda = 1); at each ratio a
lambda is Pareto-optimal when no other lambda has both lower directive leakage and higher directive accuracy. Table 3:
lambda = 1 is optimal more often than lambda = 0 for StreamingLLM on IFEval.

The paper reads Table 3 over both orders together, so the claim pools them: the Pareto frequency of a lambda is the
share of every (order, ratio) point above r = 0 where it is optimal. With the same ratios in both orders (as every
profile runs them) this is the mean of the two orders' frequencies; pooling the points rather than averaging the
frequencies keeps an order run at fewer ratios from weighing as much as the other. The two dominance rules
(``analysis.PARETO_RULES``: "strict", the paper's words, and "weak") both decide; each order's value is shown below,
deciding nothing. ``pareto`` measures any such claim (Table 4 of notebook 08 reads LongBench TREC with it)."""

from __future__ import annotations

import dataclasses

import pandas as pd

from fairkv.report import analysis, verdicts
from fairkv.report.claims import Claim, Measured, Number, Part
from fairkv.report.coverage import Item
from fairkv.runs.studies import BOTH_ORDERS, CI_PROMPTS, CPU_MITIGATION_RATIOS, LAMBDAS, Fields, Scale, Study
from fairkv.studies import reading

# Appendix G-H, Figs 15-18; at the cpu profile StreamingLLM, lambda 0-1 by 0.2, both orders, accuracy and leakage at
# every point
STUDY = Study(
    "debias",
    "07",
    "Debiasing: Figs 15-16, Table 3",
    Fields(variants=("fair",), lams=LAMBDAS),
    {
        "ci": Scale(n_prompts=CI_PROMPTS, policies=("streamingllm",), lams=(0.0, 0.5, 1.0)),
        "cpu": Scale(policies=("streamingllm",), ratios=CPU_MITIGATION_RATIOS, benign=dict(orders=BOTH_ORDERS)),
        "paper": Scale(n_prompts=100),
    },
    figures=("07_fig15_lambda_plane", "07_table3_pareto", "07_paper_vs_us"),
)
STUDIES = (STUDY,)
ITEMS = (  # the paper's items notebook 07 makes (fairkv.report.coverage)
    Item(
        "Figs 15-16",
        "accuracy against leakage per lambda (IFEval, StreamingLLM), both orders",
        ("07_fig15_lambda_plane",),
    ),
    Item(
        "Table 3",
        "Pareto frequency per lambda (IFEval, StreamingLLM)",
        ("07_table3_pareto",),
        "over the ratios above 0 (every lambda ties at r = 0)",
    ),
)
MINUTES = {"ci": 0.4, "cpu": 111}  # the notebook's wall minutes (``fairkv.studies.MINUTES_KIND``)


PAPER_RULE = "strict"  # the paper's words (Appendix H): the rule its numbers are compared under
PARETO_MARGIN = 0.10
PARETO_NULL = (
    "one ratio in the paper's ten: a lead of lambda = 1 over lambda = 0 smaller than one ratio's worth of the share is "
    "none worth reporting"
)
PARETO_PARTS = (
    "the strict rule (the paper's words) and the weak rule, the orders the rows hold pooled: holds when it holds under "
    "both, fails when it fails under either; where both orders ran, each order's lead under each rule is shown below "
    "and decides nothing"
)


def lead(first: Number, second: Number) -> Number:
    """The paper's lead of lambda = 1 over lambda = 0 (a share minus a share), derived from its two shares."""
    return Number(round(first.value - second.value, 6), "share")


def numbers(policy: str, first: Number, second: Number) -> dict[str, Number]:
    """A Pareto claim's numbers for ``policy``: lambda = 1's share, lambda = 0's, and the lead, by the names ``pareto``
    gives its estimates."""
    return {f"{policy}_lambda1": first, f"{policy}_lambda0": second, f"{policy}_lead": lead(first, second)}


TABLE3 = Claim(
    "debias.table3",
    "Table 3",
    "StreamingLLM on IFEval: lambda = 1 is Pareto-optimal more often than lambda = 0 (lead = lambda 1's share minus "
    "lambda 0's), over the ratios above 0 of both orders pooled (the share of every (order, ratio) point; with the same "
    "ratios in both orders, the mean of the two orders' shares), under both dominance rules",
    "lambda=1 {streamingllm_lambda1}, lambda=0 {streamingllm_lambda0} (StreamingLLM, IFEval, both orders)",
    numbers("streamingllm", Number(0.75, "share"), Number(0.45, "share")),
    above=0.0,
    region="lambda = 1's share of points where it is optimal minus lambda = 0's above 0",
    margin=PARETO_MARGIN,
    null=PARETO_NULL,
    parts=PARETO_PARTS,
)
CLAIMS = (TABLE3,)


Counts = dict[tuple[str, str, float], tuple[int, int]]  # (policy, order, lambda) -> (points optimal, points)


def _counts(frame: pd.DataFrame, rule: str, accuracy: str) -> Counts:
    """``analysis.pareto_frequency`` as counts: per policy, order and lambda, the ratios where it is optimal and the
    ratios read."""
    frequency = analysis.pareto_frequency(frame, rule, accuracy)
    return {
        (row.policy, row.order, float(row.lam)): (round(row.frequency * row.ratios), int(row.ratios))
        for row in frequency.itertuples()
    }


class _Frequencies:
    """Pareto counts of one set of rows (or of one bootstrap draw of them) under both rules, computed once for the
    several statistics a claim reads from it: ``verdicts.resampled`` draws the same prompts for each statistic (its
    seed), and a draw is known here by the multiset of its prompts."""

    def __init__(self, accuracy: str):
        self.accuracy = accuracy
        self.seen: dict[tuple, dict[str, Counts]] = {}

    def __call__(self, frame: pd.DataFrame, rule: str) -> Counts:
        token = (len(frame), int(pd.util.hash_pandas_object(frame["key"], index=False).sum()))
        if token not in self.seen:
            self.seen[token] = {r: _counts(frame, r, self.accuracy) for r in analysis.PARETO_RULES}
        return self.seen[token][rule]


def _share(counts: Counts, policy: str, orders, lam: float) -> tuple[float, int, int]:
    """lambda ``lam``'s share of the (order, ratio) points of ``orders`` where it is optimal: (share, optimal, points)."""
    picked = [counts[(policy, order, lam)] for order in orders if (policy, order, lam) in counts]
    optimal, points = sum(k for k, _ in picked), sum(n for _, n in picked)
    return (optimal / points if points else float("nan")), optimal, points


def _lead(counts: Counts, policy: str, orders) -> float:
    return _share(counts, policy, orders, 1.0)[0] - _share(counts, policy, orders, 0.0)[0]


def _sides(rows: pd.DataFrame, accuracy: str) -> tuple[int, int]:
    """The prompts of the attack side (leakage) and of the benign side (accuracy)."""
    attack = rows[(rows["query"] == "attack") & rows[analysis.LEAKAGE].notna()]["key"].nunique()
    benign = rows[(rows["query"] == "benign") & rows[accuracy].notna()]["key"].nunique()
    return int(attack), int(benign)


def _policy(frame: pd.DataFrame, claim: Claim, policy: str, accuracy: str) -> tuple[list[Part], str, dict, str, int]:
    """``pareto`` for one policy's rows: its parts, text, sizes, why and n."""
    attack, benign = _sides(frame, accuracy)
    n = min(attack, benign)
    frequencies = _Frequencies(accuracy)
    orders = sorted(set(frame["order"]))
    pooled = "both orders pooled" if len(orders) > 1 else f"{orders[0]} order"

    def lead(rule: str, over: tuple[str, ...]):
        return lambda f: _lead(frequencies(f, rule), policy, over)

    def share(lam: float):
        return lambda f: _share(frequencies(f, PAPER_RULE), policy, orders, lam)[0]

    overs = [tuple(orders)] + ([(order,) for order in orders] if len(orders) > 1 else [])
    statistics = {(rule, over): lead(rule, over) for rule in analysis.PARETO_RULES for over in overs}
    statistics.update({lam: share(lam) for lam in (1.0, 0.0)})
    # every statistic over the same draws, each draw made once (verdicts.resampled_each)
    estimates = {key: dataclasses.replace(e, n=n) for key, e in verdicts.resampled_each(frame, statistics).items()}

    parts, said, sizes, why = [], [], {}, ""
    for rule in analysis.PARETO_RULES:
        gap = estimates[(rule, tuple(orders))]
        parts.append(Part(f"{reading.label(policy)}, {rule} dominance, {pooled}", gap))
        counts = frequencies(frame, rule)
        shares = {lam: _share(counts, policy, orders, lam) for lam in sorted({lam for _, _, lam in counts})}
        points = shares[1.0][2]
        said.append(
            f"{rule}: "
            + ", ".join(f"lambda={lam:g}: {share:.0%}" for lam, (share, _, _) in shares.items())
            + f" of {points} points, lambda 1 - lambda 0 {gap.signed()}"
        )
        if rule != PAPER_RULE:
            continue
        for lam, name in ((1.0, "lambda1"), (0.0, "lambda0")):
            if f"{policy}_{name}" in claim.numbers:
                sizes[f"{policy}_{name}"] = estimates[lam]
        if f"{policy}_lead" in claim.numbers:
            sizes[f"{policy}_lead"] = gap
        ratios = {order: read for (p, order, _), (_, read) in sorted(counts.items()) if p == policy}
        why = (
            f"{reading.label(policy)}: "
            + ", ".join(f"{read} ratios above 0 in the {order} order" for order, read in ratios.items())
            + ", against the paper's nine per order (its ten include r = 0, where every lambda ties); under the "
            f"{rule} rule lambda = 1 is optimal at {shares[1.0][1]} of {points} points, lambda = 0 at {shares[0.0][1]}"
        )
    if len(orders) > 1:
        for rule in analysis.PARETO_RULES:
            for order in orders:
                label = f"{reading.label(policy)}, {rule} dominance, {order} order"
                parts.append(Part(label, estimates[(rule, (order,))], decides=False))
    text = f"{reading.label(policy)}, {pooled} (prompts: attack {attack}, benign {benign}): " + "; ".join(said)
    return parts, text, sizes, why, n


def pareto(rows: pd.DataFrame, claim: Claim, policies, accuracy: str = analysis.ACCURACY) -> Measured:
    """``claim`` (lambda = 1 Pareto-optimal more often than lambda = 0) for each of ``policies`` from the lambda
    sweep's rows: per policy and rule the lead pooled over the orders the rows hold (deciding), and per order
    (shown); the paper's shares under ``PAPER_RULE`` as sizes. Intervals resample prompts (``verdicts.resampled``);
    n is the fewer of the two sides' prompts (accuracy is often read on fewer prompts than leakage)."""
    kept = [c for c in ("key", "query", *analysis.SETTING, analysis.LEAKAGE, accuracy) if c in rows]
    ran = [p for p in policies if p in set(rows["policy"])]
    if not ran:
        raise analysis.AnalysisError(f"{claim.id}: no rows of {', '.join(policies)}")
    each = [_policy(rows.loc[rows["policy"] == policy, kept], claim, policy, accuracy) for policy in ran]
    return Measured(
        [part for parts, *_ in each for part in parts],
        " | ".join(text for _, text, *_ in each),
        min(n for *_, n in each),
        {name: size for _, _, sizes, _, _ in each for name, size in sizes.items()},
        "budget: " + "; ".join(why for *_, why, _ in each),
    )


def measure(rows: pd.DataFrame) -> dict[str, Measured]:
    """The claim of notebook 07 from the lambda sweep's rows (StreamingLLM, both orders)."""
    return {TABLE3.id: pareto(rows, TABLE3, ("streamingllm",))}
