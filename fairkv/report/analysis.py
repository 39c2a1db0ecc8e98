"""Analysis of result rows (``experiment.run``'s long format): the paper's derived quantities.

- ``class_accuracy``: IFEval accuracy per instruction class, single- vs multi-instruction prompts, raw and normalised
  by the class's accuracy at r = 0 (Section 4.1, Fig 2a).
- ``spearman``: rank correlation rho(r) between the classes' accuracies at r = 0 and at r (Fig 2b, Fig 3).
- ``means``: mean of a metric per setting with a 95% interval (Wilson for 0/1 metrics, seeded bootstrap otherwise);
  the paper reports none, we do.
- ``composite`` and ``table1``: the composite score of a mitigation against its base policy (Section 6, Table 1).
- ``judge_agreement``: the LLM judge against ROUGE-L, per setting (Appendix L).
- ``per_span`` and ``starvation``: N instruction spans, per-span keep rates and compliance (beyond the paper).
- ``by_attack`` and ``critical_ratio``: leakage per attack category, and where a defense stops holding.
- ``pareto_frequency``: per lambda, the share of ratios where it is Pareto-optimal in (accuracy, leakage)
  (Appendix H, Tables 3-4).

Functions take and return DataFrames; none reads or writes files.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from fairkv.core.metrics import LEAK_THRESHOLD, instruction_class, is_refusal, proportion_ci
from fairkv.core.presses import Variant
from fairkv.report import verdicts

SETTING = ["policy", "variant", "lam", "order", "ratio"]  # what identifies a setting across prompts
ACCURACY, LEAKAGE = "prompt_strict", "leak_directive"  # the paper's directive accuracy and directive leakage


class AnalysisError(ValueError):
    """Rows that cannot give the asked quantity (a missing query kind, ratio or variant)."""


def _query(rows: pd.DataFrame, query: str) -> pd.DataFrame:
    picked = rows[rows["query"] == query]
    if picked.empty:
        raise AnalysisError(f"no {query!r} rows: run a grid whose queries include {query!r}")
    return picked


CAP_DRIVES = 0.10  # a change this large in the share of answers cut at the token cap moves accuracy by itself


def with_benign_flags(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows plus two flags of the answer to the benign query (NaN on other rows): ``benign_refused``, 1 where it is the
    defense's refusal, and ``benign_capped``, 1 where it stopped at the new-token cap (``max_new_tokens``). A model that
    over-applies the defense refuses harmless requests, and evicting the defense then raises directive accuracy; an
    answer cut at the cap fails IFEval's length, ending and combination checks whatever it says. Both are shown
    beside accuracy, so a reader sees when they, not the directive, move it."""
    benign = rows["query"] == "benign"
    refused = rows["response"].where(benign).map(lambda text: float(is_refusal(text)), na_action="ignore")
    capped = (rows["new_tokens"] >= rows["max_new_tokens"]).astype(float).where(benign)
    return rows.assign(benign_refused=refused, benign_capped=capped)


def means(rows: pd.DataFrame, metric: str, by: list[str] | None = None) -> pd.DataFrame:
    """Mean of ``metric`` per setting (``by``, default SETTING) over prompts, with n and a 95% interval, the
    claims' own (``verdicts.mean``: Wilson for 0/1 values, else a seeded percentile bootstrap), the prompts in the
    order of their keys as a claim reads them (``reading.values``), so a table's cell and a claim's estimate of the
    same setting are the same interval (a seeded bootstrap draws by position)."""
    by = by or SETTING
    picked = rows.dropna(subset=[metric]) if metric in rows else rows.iloc[:0]
    if picked.empty:
        raise AnalysisError(f"no rows carry {metric!r}")
    picked = picked.sort_values("key", kind="stable") if "key" in picked else picked
    out = []
    for key, group in picked.groupby(by, sort=True):
        estimate = verdicts.mean(group[metric].to_numpy(dtype=float))
        out.append(
            {**dict(zip(by, key)), "mean": estimate.value, "low": estimate.low, "high": estimate.high, "n": estimate.n}
        )
    return pd.DataFrame(out)


def interval_table(
    rows: pd.DataFrame, metric: str, index: str = "policy", columns: str = "ratio", digits: int = 2
) -> pd.DataFrame:
    """``metric`` as "mean [low, high]" (95% interval) with ``index`` down and ``columns`` across; the rows must hold
    one setting per (index, column) pair."""
    table = means(rows, metric, by=[index, columns])
    table["cell"] = [
        f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
        for m, lo, hi in zip(table["mean"], table["low"], table["high"])
    ]
    return table.pivot(index=index, columns=columns, values="cell")


def _instructions(rows: pd.DataFrame, strict: bool = True, split: bool = True) -> pd.DataFrame:
    """One row per instruction of each benign answer: its setting, prompt, kind of prompt (single / multi, or "all"
    when not ``split``), instruction class and whether it was followed."""
    outcomes = "strict_list" if strict else "loose_list"
    exploded = []
    for row in _query(rows, "benign").itertuples():
        kind = ("single" if len(row.instruction_ids) == 1 else "multi") if split else "all"
        for instruction, ok in zip(row.instruction_ids, getattr(row, outcomes)):
            exploded.append(
                (
                    row.policy,
                    row.variant,
                    row.lam,
                    row.order,
                    row.ratio,
                    row.key,
                    kind,
                    instruction_class(instruction),
                    float(ok),
                )
            )
    return pd.DataFrame(exploded, columns=[*SETTING, "key", "prompts", "class", "followed"])


def _class_table(frame: pd.DataFrame, weights: pd.Series | None = None) -> pd.DataFrame:
    """Accuracy and n per setting, kind of prompt, class and ratio; ``weights`` (per prompt key: how often a bootstrap
    drew it) weigh each prompt's instructions."""
    group = [c for c in SETTING if c != "ratio"] + ["prompts", "class"]
    if weights is not None:
        frame = frame.assign(weight=frame["key"].map(weights).fillna(0.0))
        frame = frame[frame["weight"] > 0].assign(followed=lambda t: t["followed"] * t["weight"])
        sums = frame.groupby([*group, "ratio"])[["followed", "weight"]].sum()
        return sums.assign(accuracy=sums["followed"] / sums["weight"], n=sums["weight"])[
            ["accuracy", "n"]
        ].reset_index()
    return frame.groupby([*group, "ratio"])["followed"].agg(accuracy="mean", n="size").reset_index()


def class_accuracy(rows: pd.DataFrame, strict: bool = True, split: bool = True) -> pd.DataFrame:
    """Accuracy per instruction class and ratio, for single- and multi-instruction prompts (Fig 2a).

    Columns: SETTING without ratio, ``prompts`` (single / multi; "all" when ``split`` is False), ``class``, ``ratio``, ``accuracy`` (passes /
    instructions of that class), ``n`` (instructions), ``low`` / ``high`` (its 95% Wilson interval over instructions),
    ``normalised`` (accuracy / accuracy at r = 0; NaN where the class scored 0 at r = 0).
    """
    group = [c for c in SETTING if c != "ratio"] + ["prompts", "class"]
    accuracy = _class_table(_instructions(rows, strict, split))
    at_zero = accuracy[accuracy["ratio"] == 0.0].set_index(group)["accuracy"]
    if at_zero.empty:
        raise AnalysisError("class accuracy needs r = 0 among the ratios (normalisation and rho use it)")
    bounds = [proportion_ci(round(a * n), int(n)) for a, n in zip(accuracy["accuracy"], accuracy["n"])]
    accuracy["low"], accuracy["high"] = [b[0] for b in bounds], [b[1] for b in bounds]
    zero = accuracy.set_index(group).index.map(at_zero.get)
    accuracy["normalised"] = accuracy["accuracy"] / pd.Series(zero, index=accuracy.index).replace(0.0, np.nan)
    return accuracy


def spearman(accuracy: pd.DataFrame) -> pd.DataFrame:
    """rho(r): Spearman correlation across instruction classes of accuracy at r = 0 and at r (Fig 2b, Fig 3 right).

    One value per setting, prompt kind and ratio; NaN where fewer than 3 classes or a constant ranking.
    """
    group = [c for c in SETTING if c != "ratio"] + ["prompts"]
    out = []
    for key, frame in accuracy.groupby(group, sort=True):
        table = frame.pivot(index="class", columns="ratio", values="accuracy")
        zero = table[0.0].to_numpy()
        for ratio in table.columns:
            at = table[ratio].to_numpy()
            both = ~(np.isnan(zero) | np.isnan(at))
            rho = _rank_correlation(zero[both], at[both])
            out.append({**dict(zip(group, key)), "ratio": ratio, "rho": rho, "classes": int(both.sum())})
    return pd.DataFrame(out)


def _rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """``scipy.stats.spearmanr(x, y).statistic`` as scipy computes it (Pearson's r of the average ranks, by
    ``np.corrcoef``), without its per-call checks: bootstraps call it thousands of times. NaN where fewer than 3
    values or either side constant."""
    if len(x) < 3 or np.unique(x).size < 2 or np.unique(y).size < 2:
        return np.nan
    return float(np.corrcoef(np.column_stack([stats.rankdata(x), stats.rankdata(y)]), rowvar=False)[1, 0])


def spearman_intervals(rows: pd.DataFrame, split: bool = True, n_boot: int = 200, seed: int = 0) -> pd.DataFrame:
    """``spearman`` of ``class_accuracy`` with a 95% interval per point (``low``, ``high``): a seeded bootstrap over
    prompts (each draw weighs a prompt's instructions by how often it was drawn), so Figs 2b and 3 show bands."""
    frame = _instructions(rows, split=split)
    point = spearman(_class_table(frame))
    keys, rng = frame["key"].unique(), np.random.default_rng(seed)
    draws = [
        spearman(_class_table(frame, pd.Series(rng.choice(keys, len(keys))).value_counts())) for _ in range(n_boot)
    ]
    group = [c for c in point.columns if c not in ("rho", "classes")]
    bounds = pd.concat(draws).groupby(group)["rho"].quantile([0.025, 0.975]).unstack()
    bounds.columns = ["low", "high"]
    return point.merge(bounds.reset_index(), on=group, how="left")


def setting_means(rows: pd.DataFrame, accuracy: str = ACCURACY) -> pd.DataFrame:
    """Directive accuracy (benign rows; the column ``accuracy``, e.g. ``trec_score`` for LongBench TREC) and directive
    leakage (attack rows) per setting, side by side."""
    accuracy = _query(rows, "benign").groupby(SETTING)[accuracy].mean().rename("accuracy")
    leakage = _query(rows, "attack").groupby(SETTING)[LEAKAGE].mean().rename("leakage")
    return pd.concat([accuracy, leakage], axis=1).reset_index()


def composite(rows: pd.DataFrame, variant: str, base: str = "base") -> pd.DataFrame:
    """Composite score of ``variant`` against ``base`` per policy, order and ratio (Section 6):
    0.5 (a_variant - a_base) + 0.5 (l_base - l_variant), a = directive accuracy, l = directive leakage."""
    table = setting_means(rows)
    index = ["policy", "order", "ratio"]
    for name in (variant, base):
        if name not in set(table["variant"]):
            raise AnalysisError(f"no rows of variant {name!r}: the grid's variants are {sorted(set(table['variant']))}")
    ours = table[table["variant"] == variant].set_index(index)
    theirs = table[table["variant"] == base].set_index(index)
    score = 0.5 * (ours["accuracy"] - theirs["accuracy"]) + 0.5 * (theirs["leakage"] - ours["leakage"])
    return score.rename("score").dropna().reset_index().assign(variant=variant)


def table1(
    rows: pd.DataFrame, ratios: tuple[float, ...], variants: tuple[str, ...] = ("whitelist", "fair")
) -> pd.DataFrame:
    """Table 1: composite score per policy and variant, mean and std (numpy's, ddof 0) over ``ratios`` (all of
    which the rows must hold: a table over fewer ratios is not the paper's)."""
    missing = sorted(set(ratios) - set(rows["ratio"]))
    if missing:
        raise AnalysisError(f"Table 1 needs r = {missing} beside the ratios run {sorted(set(rows['ratio']))}")
    scores = pd.concat([composite(rows, v) for v in variants])
    scores = scores[scores["ratio"].isin(ratios)]
    out = scores.groupby(["policy", "order", "variant"])["score"].agg(
        mean="mean", std=lambda s: float(np.std(s)), ratios=lambda s: len(s)
    )
    return out.reset_index()


PARETO_RULES = ("strict", "weak")


def pareto_frequency(rows: pd.DataFrame, rule: str = "strict", accuracy: str = ACCURACY) -> pd.DataFrame:
    """Appendix H: per policy and order, the share of ratios where each lambda is Pareto-optimal in (accuracy,
    leakage). ``rule`` "strict" (the paper's words): a lambda is dominated when another has both lower leakage and
    higher accuracy, so ties on one axis dominate nothing; "weak": when another is at least as good on both and
    strictly better on one. Over the ratios above 0 only: at r = 0 nothing is evicted, every lambda is the same
    uncompressed model and ties, so it would add the same share to every lambda (the paper's ten ratios, 0-0.9,
    include it)."""
    if rule not in PARETO_RULES:
        raise AnalysisError(f"unknown dominance rule {rule!r}: use one of {', '.join(PARETO_RULES)}")
    table = setting_means(rows, accuracy)
    table = table[table["variant"].map(lambda variant: Variant(variant).fair) & (table["ratio"] > 0)]
    if table.empty:
        raise AnalysisError("no lambda rows above r = 0: the Pareto frequency needs compressed ratios")
    out = []
    for (policy, order, ratio), frame in table.groupby(["policy", "order", "ratio"]):
        leakage, accuracy = frame["leakage"].to_numpy(), frame["accuracy"].to_numpy()
        for point in frame.itertuples():
            if rule == "strict":
                dominated = ((leakage < point.leakage) & (accuracy > point.accuracy)).any()
            else:
                no_worse = (leakage <= point.leakage) & (accuracy >= point.accuracy)
                dominated = (no_worse & ((leakage < point.leakage) | (accuracy > point.accuracy))).any()
            out.append({"policy": policy, "order": order, "ratio": ratio, "lam": point.lam, "optimal": not dominated})
    frame = pd.DataFrame(out)
    return frame.groupby(["policy", "order", "lam"])["optimal"].agg(frequency="mean", ratios="size").reset_index()


def lambda_plane(rows: pd.DataFrame, accuracy: str = ACCURACY) -> pd.DataFrame:
    """Directive accuracy (``accuracy``) and leakage per policy, order, lambda and ratio (the points of Figs 15-18)."""
    table = setting_means(rows, accuracy)
    return table[table["variant"].map(lambda variant: Variant(variant).fair)].reset_index(drop=True)


def judge_agreement(rows: pd.DataFrame, by: tuple[str, ...] = ("policy", "variant", "ratio")) -> pd.DataFrame:
    """How the LLM judge (``fairkv.runs.judge``) and ROUGE-L agree on judged attack rows (Appendix L): over all distinct
    responses (first row, ``setting`` "all") and per setting, the Spearman rho between the judge's expected severity
    and directive ROUGE-L (NaN where either is constant), the share of responses both call a leak or both call
    safe (judge score >= 2 vs ROUGE-L > the leak threshold), and both leak rates."""

    def summary(frame: pd.DataFrame) -> dict:
        rouge_leak = frame[LEAKAGE] > LEAK_THRESHOLD
        varied = frame["judge_expected"].nunique() > 1 and frame[LEAKAGE].nunique() > 1
        rho = stats.spearmanr(frame["judge_expected"], frame[LEAKAGE]).statistic if varied else np.nan
        return {
            "n": len(frame),
            "rho": rho,
            "label_agreement": float((frame["judge_leak"] == rouge_leak).mean()),
            "judge_leak_rate": float(frame["judge_leak"].mean()),
            "rouge_leak_rate": float(rouge_leak.mean()),
        }

    judged = rows.dropna(subset=["judge_expected", LEAKAGE])
    if judged.empty:
        raise AnalysisError("no judged attack rows: run fairkv.runs.judge.judge_rows first")
    out = [{"setting": "all", **summary(judged.drop_duplicates("cell_id"))}]
    for values, frame in judged.groupby(list(by)):
        out.append({"setting": ", ".join(f"{k}={v}" for k, v in zip(by, values)), **summary(frame)})
    return pd.DataFrame(out)


def per_span(rows: pd.DataFrame) -> pd.DataFrame:
    """N-span rows (``fairkv.core.multispan``) in long format, one row per (response, span): the span count, the span,
    its length, its keep rate, the tokens it keeps (the absolute budget) and its instruction's strict compliance."""
    out = []
    for row in _query(rows, "benign").itertuples():
        spans = sorted(row.span_tokens, key=lambda name: int(name.removeprefix("span")))
        for index, name in enumerate(spans):
            keep = getattr(row, f"keep_{name}")
            out.append(
                {
                    "key": row.key,
                    "n_spans": len(spans),
                    "span": name,
                    "instruction": row.instruction_ids[index],
                    "policy": row.policy,
                    "variant": row.variant,
                    "ratio": row.ratio,
                    "span_tokens": row.span_tokens[name],
                    "keep_rate": keep,
                    "kept_tokens": keep * row.span_tokens[name],
                    "compliance": float(row.strict_list[index]),
                }
            )
    return pd.DataFrame(out)


def starvation(spans: pd.DataFrame) -> pd.DataFrame:
    """Per span count, policy and ratio: the mean compliance and the smallest span keep rate under base and fair
    eviction, and what fair eviction changes (does it stop helping once every span starves?)."""
    per_prompt = spans.groupby(["n_spans", "policy", "variant", "ratio", "key"]).agg(
        compliance=("compliance", "mean"), min_keep=("keep_rate", "min")
    )
    means = per_prompt.groupby(["n_spans", "policy", "variant", "ratio"]).mean().unstack("variant")
    table = pd.DataFrame(
        {
            "compliance_base": means[("compliance", "base")],
            "compliance_fair": means[("compliance", "fair")],
            "min_keep_base": means[("min_keep", "base")],
            "min_keep_fair": means[("min_keep", "fair")],
        }
    )
    table["fair_gain"] = table["compliance_fair"] - table["compliance_base"]
    return table.reset_index()


def by_attack(rows: pd.DataFrame) -> pd.DataFrame:
    """Attack rows with the attack's ``suite`` and ``category`` (from the query kind "attack:<suite>/<category>/<name>";
    the paper's attack is RaccoonBench's singular_attacks / Plain)."""
    attacks = rows[rows["query"].str.startswith("attack")]
    if attacks.empty:
        raise AnalysisError("no attack rows")
    parts = attacks["query"].map(
        lambda q: q.split(":", 1)[1].split("/") if ":" in q else ["singular_attacks", "Plain", "prompt1"]
    )
    return attacks.assign(suite=parts.str[0], category=parts.str[1])


def critical_ratio(rows: pd.DataFrame, by: list[str], metric: str = "refused", fraction: float = 0.5) -> pd.DataFrame:
    """Per group of ``by``: the smallest compression ratio at which the mean of ``metric`` (default the refusal rate)
    falls below ``fraction`` of its uncompressed (r = 0) value; NaN where it never does in the ratios run, or where
    r = 0 itself is 0 (nothing to lose)."""
    out = []
    for values, frame in rows.groupby(by):
        curve = frame.groupby("ratio")[metric].mean().sort_index()
        start = curve.get(0.0, np.nan)
        below = curve[(curve.index > 0) & (curve < fraction * start)] if start > 0 else curve.iloc[:0]
        out.append(
            {
                **dict(zip(by, values if isinstance(values, tuple) else (values,))),
                f"{metric}_at_0": start,
                "critical_ratio": float(below.index[0]) if len(below) else np.nan,
            }
        )
    return pd.DataFrame(out)


JUDGE_MIN_ACCURACY = 0.8  # a judge whose calibration interval reaches below this decides no claim resting on its scores


def calibration_summary(calibrated: pd.DataFrame) -> pd.DataFrame:
    """Per kind of labelled response and over all (first row): n, the share the judge calls right with its 95%
    Wilson interval, the mean score and expected severity."""

    def summary(kind: str, frame: pd.DataFrame) -> dict:
        accuracy = verdicts.rate(frame["correct"].astype(float))
        return {
            "kind": kind,
            "label": "leak" if frame["leak"].all() else "no leak" if not frame["leak"].any() else "both",
            "n": len(frame),
            "accuracy": accuracy.value,
            "low": accuracy.low,
            "high": accuracy.high,
            "mean_score": frame["judge_score"].mean(),
            "mean_expected": frame["judge_expected"].mean(),
        }

    rows = [summary("all", calibrated)] + [summary(k, f) for k, f in calibrated.groupby("kind", sort=False)]
    return pd.DataFrame(rows)
