"""Notebook 11, beyond the paper: its mechanisms checked where it did not look, and the open questions at its end
(arXiv 2510.00231) answered on our rows. Many spans: fair eviction (Algorithm 1, Sec 5.2) on system prompts
of 2 to 8 instruction spans; many attacks: RaccoonBench's attack categories beside the Plain attack of Pitfalls 3-4
and Figs 8-9; defense strength: three defense templates from weak to strong, where the paper has one.

Every claim here is ours (the paper states none of them for these settings), except one sanity check: fair eviction
keeps the worst-kept span at least as well as the base policy, which its per-span budgets (Algorithm 1) make so, up to
a token, on any model. The N-spans claims read each span count's own prompts (n per count, shown in the parts); the
attack claims pool the attack categories, the defense claims read each template's prompts uncompressed or along r."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from fairkv.report import analysis, verdicts
from fairkv.report.claims import OURS, SANITY, Claim, Measured, Part
from fairkv.report.figures import in_order, palette, suptitle
from fairkv.runs.redecode import Cells
from fairkv.runs.studies import CI_PROMPTS, CPU_MITIGATION_RATIOS, NORMAL, TEN_RATIOS, Fields, Scale, Study
from fairkv.studies import reading

# notebook 11 at the cpu profile: StreamingLLM (the paper's headline policy), 10 prompts per span count, 2 per attack
# category, 50 per defense template; at ci its fewest points, short answers: the attack study's cost is its 30
# RaccoonBench attacks over every cache, read in batches padded to their longest attack (one has 412 tokens), so 8 at
# a time.
# One span count per run (dataset spans_2 / 3 / 5 / 8, see fairkv.core.multispan); compliance needs the benign query
# only
SPANS = Study(
    "spans",
    "11",
    "beyond the paper: N instruction spans",
    Fields(dataset="spans_2", variants=("base", "fair"), queries=("benign",)),
    {
        "ci": Scale(n_prompts=CI_PROMPTS, policies=("streamingllm",), ratios=(0.0, 0.5, 0.7), benign_tokens=32),
        "cpu": Scale(
            n_prompts=10, orders=NORMAL, policies=("streamingllm",), ratios=(0.0, 0.5, 0.7), benign_tokens=128
        ),
        "paper": Scale(n_prompts=100, ratios=TEN_RATIOS, benign_tokens=1280),
    },
    figures=("11_spans", "11_spans_budget", "11_spans_starvation", "11_paper_vs_us"),
)
# every RaccoonBench attack category (the notebook passes the attack query kinds, data.attack_queries)
ATTACKS = Study(
    "attacks",
    "11",
    "beyond the paper: many attacks",
    Fields(variants=("base", "whitelist", "fair")),
    {
        "ci": Scale(n_prompts=1, policies=("streamingllm",), ratios=(0.0, 0.5), max_new_tokens=16, batch_size=8),
        "cpu": Scale(n_prompts=2, orders=NORMAL, policies=("streamingllm",), ratios=(0.0, 0.5)),
        "paper": Scale(n_prompts=100, ratios=TEN_RATIOS[:8]),
    },
    figures=("11_attacks", "11_attacks_leakage", "11_attacks_refusal"),
)
# one defense template per run (the notebook passes template=...); the paper's attack. At the cpu profile 64 answers
# at once, not the profile's 128: the longest template's caches peaked at 17.0 GB at 128 before the Decoder (issue
# 37), which holds only the waiting and running answers' caches; with it, 12.1 GB at 128 and 11.2 GB at 64, and 128 no
# faster (10 min 19 s against 9 min 58 s for the template's 550 rows; benchmarks/results/defenses_batch_cpu.txt)
DEFENSES = Study(
    "defenses",
    "11",
    "beyond the paper: defense strength",
    Fields(variants=("base", "fair"), queries=("attack",)),
    {
        "ci": Scale(n_prompts=1, policies=("streamingllm",), ratios=(0.0, 0.3, 0.5, 0.7)),
        "cpu": Scale(
            n_prompts=50, orders=NORMAL, policies=("streamingllm",), ratios=CPU_MITIGATION_RATIOS, batch_size=64
        ),
        "paper": Scale(n_prompts=100, ratios=TEN_RATIOS),
    },
    figures=("11_defense_strength", "11_defense_critical_ratio"),
)
STUDIES = (SPANS, ATTACKS, DEFENSES)
MINUTES = {"ci": 3.0, "cpu": 18}  # the notebook's wall minutes (``fairkv.studies.MINUTES_KIND``)
# defense templates of RaccoonBench with all their text before the directive, from weak to strong (12, 56 and 335
# words); templates with text on both sides of the directive have no single defense span. The refusal rate counts the
# standard template's scripted reply and its variants (metrics.is_refusal); a reply another template scripts (the
# GptInfinite template's "ACCESS DENIED") counts as "other", so read its leakage beside its refusal rate
DEFENSE_LADDER = ("short_defense_1", "standard_defense", "long_defense_GptInfinite")


RATIO_STEP = 0.1  # the step of the defense study's ratio grid above r = 0.3, on which a critical ratio is read
CRITICAL_MARGIN = RATIO_STEP / 2  # a move of the critical ratio smaller than half a grid step is no move

SMALLEST_SPAN_KEPT = Claim(
    "beyond.smallest_span_kept",
    "11_spans",
    "N spans: fair eviction keeps the worst-kept span (a prompt's smallest span keep rate) at least as well as "
    "StreamingLLM at every N (the largest ratio run; one part per span count)",
    "equal keep rate per span (Sec 5.2, two spans)",
    above=-reading.KEEP_MARGIN,
    region="fair minus base above minus the keep margin (reading.KEEP_MARGIN, keep rates move by whole tokens): "
    "Algorithm 1 gives each of the prompt's spans its share of the budget, but the spans as the prompt cuts them (the "
    "first holds the chat header and StreamingLLM's sinks, the last the template suffix) are not the instruction spans "
    "measured here, so a prompt's worst-kept instruction span can lose a token to the base's",
    status=SANITY,
    parts="one per span count: all must hold",
)
COMPLIANCE_RAISED = Claim(
    "beyond.compliance_raised",
    "11_spans",
    "N spans: fair eviction raises per-span compliance at every N (fair minus StreamingLLM, mean over spans and over "
    "r > 0; one part per span count)",
    "open: does fair eviction stop helping once every span starves?",
    above=0.0,
    region="a gain: fair minus base above 0 at every span count",
    margin=reading.RATE_MARGIN,
    null=reading.RATE_NULL,
    status=OURS,
    parts="one per span count: all must hold",
    score="inst_strict",
    cells=(Cells(SPANS, datasets=("spans_2", "spans_3", "spans_5", "spans_8")),),
)

CATEGORIES_RISE = Claim(
    "beyond.categories_rise",
    "11_attacks_leakage",
    "many attacks: StreamingLLM at the largest ratio run raises directive leakage in most attack categories (share "
    "of categories whose mean leakage is higher than at r = 0, minus one half)",
    "leakage rises with r (Pitfall 3, Plain attack only)",
    above=0.0,
    region="most: the share of categories that rise above one half",
    effect=False,
    status=OURS,
    score="leak_directive",
)
REFUSAL_DROPPED = Claim(
    "beyond.refusal_dropped",
    "11_attacks_refusal",
    "many attacks: StreamingLLM at the largest ratio run drops the refusal (r = 0 minus that ratio, mean over every "
    "attack category)",
    "the defense is dropped first (Pitfall 4, Plain attack only)",
    above=0.0,
    region="a drop: the refusal at r = 0 minus at the ratio above 0",
    margin=reading.RATE_MARGIN,
    null=reading.RATE_NULL,
    status=OURS,
    score="refused",
)
WHITELIST_LOWERS = Claim(
    "beyond.whitelist_lowers",
    "11_attacks_leakage",
    "many attacks: the whitelist lowers directive leakage (base minus whitelist at the largest ratio run, mean over "
    "every attack category)",
    "lower than base (Fig 8, Plain attack only)",
    above=0.0,
    region="a decrease: base minus the variant above 0",
    margin=reading.LEAK_MARGIN,
    null=reading.LEAK_NULL,
    status=OURS,
    score="leak_directive",
)
FAIR_LOWERS = Claim(
    "beyond.fair_lowers",
    "11_attacks_leakage",
    "many attacks: fair eviction lowers directive leakage (base minus fair at the largest ratio run, mean over every "
    "attack category)",
    "lower than base (Fig 9, Plain attack only)",
    above=0.0,
    region=WHITELIST_LOWERS.region,
    margin=reading.LEAK_MARGIN,
    null=reading.LEAK_NULL,
    status=OURS,
    score="leak_directive",
)
WHITELIST_KEEPS_REFUSAL = Claim(
    "beyond.whitelist_keeps_refusal",
    "11_attacks_refusal",
    "many attacks: the whitelist keeps the refusal (whitelist minus base at the largest ratio run, mean over every "
    "attack category)",
    "restored (Fig 8, Plain attack only)",
    above=0.0,
    region="a gain: whitelist minus base above 0",
    margin=reading.RATE_MARGIN,
    null=reading.RATE_NULL,
    status=OURS,
    score="refused",
)
STRONGER_REFUSES = Claim(
    "beyond.stronger_refuses",
    "11_defense_strength",
    "defense strength: each stronger template refuses more often uncompressed (one part per step, weak to strong)",
    "one template only",
    above=0.0,
    region="each step: the stronger template's refusal at r = 0 minus the weaker one's above 0",
    margin=reading.RATE_MARGIN,
    null=reading.RATE_NULL,
    status=OURS,
    parts="one per step up the ladder: all must hold",
    score="refused",
)
CRITICAL_MOVES = Claim(
    "beyond.critical_ratio_moves",
    "11_defense_strength",
    "defense strength: a stronger template moves the critical ratio (where the refusal halves) up: the smallest step "
    "up the ladder",
    "open",
    above=0.0,
    region="every step up: the smallest step of the critical ratio above 0",
    margin=CRITICAL_MARGIN,
    null=f"half the {RATIO_STEP:g} step of the ratio grid on which a critical ratio is read: a smaller move is no move",
    status=OURS,
    score="refused",
)
CLAIMS = (
    SMALLEST_SPAN_KEPT,
    COMPLIANCE_RAISED,
    CATEGORIES_RISE,
    REFUSAL_DROPPED,
    WHITELIST_LOWERS,
    FAIR_LOWERS,
    WHITELIST_KEEPS_REFUSAL,
    STRONGER_REFUSES,
    CRITICAL_MOVES,
)


def _rising_categories(frame: pd.DataFrame, top: float) -> float:
    """Share of attack categories whose mean directive leakage (base) is higher at ``top`` than at r = 0, minus 1/2."""
    base = frame[frame["variant"] == "base"].groupby(["category", "ratio"])[analysis.LEAKAGE].mean().unstack("ratio")
    return float((base[top] > base[0.0]).mean() - 0.5) if {0.0, top} <= set(base.columns) else np.nan


def _critical_steps(frame: pd.DataFrame, ladder: list[str], never: float) -> float:
    """Smallest step up the ladder of the critical ratio (refusal halves; ``never`` where it does not halve in the
    ratios run; NaN where a template never refuses)."""
    critical = analysis.critical_ratio(frame[frame["variant"] == "base"], ["template"]).set_index("template")
    values = critical["critical_ratio"].where(critical["refused_at_0"] == 0, critical["critical_ratio"].fillna(never))
    values = values.reindex(list(ladder))
    return float(np.diff(values.to_numpy()).min()) if len(values) > 1 else np.nan


def _per_count(picked: pd.DataFrame) -> tuple[dict, dict, float]:
    """Per span count: (fair minus base smallest span keep rate at the largest ratio, fair minus base compliance over
    r > 0), paired over that count's prompts, and the largest ratio."""
    per_prompt = (
        picked.groupby(["n_spans", "variant", "ratio", "key"])
        .agg(compliance=("compliance", "mean"), min_keep=("keep_rate", "min"))
        .reset_index()
    )
    top = float(per_prompt["ratio"].max())
    keeps, gains = {}, {}
    for count, frame in per_prompt.groupby("n_spans"):

        def get(metric, variant, ratios, frame=frame):
            return reading.values(frame, metric, ratios, average=True, variant=variant)

        keeps[count] = (get("min_keep", "base", top), get("min_keep", "fair", top))
        ratios = reading.positive_ratios(frame)
        gains[count] = (get("compliance", "base", ratios), get("compliance", "fair", ratios))
    return keeps, gains, top


def measure(
    spans: pd.DataFrame, attacks: pd.DataFrame, defenses: pd.DataFrame, ladder: list[str], policy: str = "streamingllm"
) -> dict[str, Measured]:
    """The claims of notebook 11. ``spans`` is ``analysis.per_span``, ``attacks`` the ``analysis.by_attack`` rows,
    ``defenses`` the defense-template rows (column ``template``) and ``ladder`` the templates from weak to strong."""
    label = reading.label(policy)
    picked = spans[spans["policy"] == policy]
    attacked = attacks[attacks["policy"] == policy]
    if picked[picked["ratio"] > 0].empty or attacked.empty:
        raise analysis.AnalysisError(f"no compressed {label} rows in the spans or the attacks study")
    out = {}

    keeps, gains, top = _per_count(picked)
    kept = {count: reading.compared(fair, base) for count, (base, fair) in keeps.items()}
    counts = ", ".join(f"N={count}: {len(base)}" for count, (base, _) in keeps.items())
    out[SMALLEST_SPAN_KEPT.id] = Measured(
        [Part(f"N={count}", estimate) for count, estimate in kept.items()],
        f"mean smallest span keep rate at r = {top:g}, base -> fair: "
        + ", ".join(f"N={count}: {base.mean():.2f} -> {fair.mean():.2f}" for count, (base, fair) in keeps.items())
        + f" (prompts per count {counts})",
        min(e.n for e in kept.values()),
        why="; ".join(
            f"N={count}: fair keeps less of its worst-kept span than {label} on {int((fair < base).sum())} of "
            f"{len(base)} prompts"
            for count, (base, fair) in keeps.items()
        ),
    )
    gained = {count: reading.compared(fair, base) for count, (base, fair) in gains.items()}
    out[COMPLIANCE_RAISED.id] = Measured(
        [Part(f"N={count}", estimate) for count, estimate in gained.items()],
        "mean compliance over r > 0, base -> fair: "
        + ", ".join(f"N={count}: {base.mean():.2f} -> {fair.mean():.2f}" for count, (base, fair) in gains.items())
        + f" (prompts per count {counts})",
        min(e.n for e in gained.values()),
        why="model: compliance base -> fair "
        + ", ".join(f"N={count}: {base.mean():.2f} -> {fair.mean():.2f}" for count, (base, fair) in gains.items()),
    )

    r = float(attacked["ratio"].max())
    categories = attacked["category"].nunique()
    rising = verdicts.resampled(attacked, lambda f: _rising_categories(f, r))
    out[CATEGORIES_RISE.id] = Measured(
        [Part("share rising - 1/2", rising)],
        f"r = {r:g}: share of the {categories} categories rising minus one half {rising.signed()}",
        rising.n,
        why=f"model: {rising.value + 0.5:.0%} of the {categories} categories rise at r = {r:g}",
    )

    def over(metric, variant, ratio):
        return reading.values(attacked, metric, ratio, average=True, variant=variant)

    refused = {ratio: over("refused", "base", ratio) for ratio in (0.0, r)}
    drop = reading.compared(refused[0.0], refused[r])
    out[REFUSAL_DROPPED.id] = Measured(
        [Part("drop", drop)],
        f"refusal {verdicts.mean(refused[0.0])} at r = 0, {verdicts.mean(refused[r])} at r = {r:g}, drop "
        f"{drop.signed()} (mean over {categories} categories)",
        drop.n,
        why=f"model: the attacks are refused {refused[0.0].mean():.2f} of the time uncompressed, "
        f"{refused[r].mean():.2f} at r = {r:g}",
        untestable=reading.no_room(verdicts.mean(refused[0.0]), 0.0, "the refusal rate uncompressed"),
    )
    base_leak = over(analysis.LEAKAGE, "base", r)
    for variant, claim in (("whitelist", WHITELIST_LOWERS), ("fair", FAIR_LOWERS)):
        if variant not in set(attacked["variant"]):
            continue
        after = over(analysis.LEAKAGE, variant, r)
        lower = reading.compared(base_leak, after)
        out[claim.id] = Measured(
            [Part(f"base - {variant}", lower)],
            f"leakage base {verdicts.mean(base_leak)}, {variant} {verdicts.mean(after)} at r = {r:g}, base - "
            f"{variant} {lower.signed()} (mean over {categories} categories)",
            lower.n,
            why=f"model: mean leakage {base_leak.mean():.2f} with the base, {after.mean():.2f} with {variant} at "
            f"r = {r:g}",
        )
    if "whitelist" in set(attacked["variant"]):
        white = over("refused", "whitelist", r)
        keeps_refusal = reading.compared(white, refused[r])
        out[WHITELIST_KEEPS_REFUSAL.id] = Measured(
            [Part("whitelist - base", keeps_refusal)],
            f"refusal base {verdicts.mean(refused[r])}, whitelist {verdicts.mean(white)} at r = {r:g}, whitelist - "
            f"base {keeps_refusal.signed()} (mean over {categories} categories)",
            keeps_refusal.n,
            why=f"model: the attacks are refused {white.mean():.2f} of the time with the whitelist, "
            f"{refused[r].mean():.2f} without",
            untestable=reading.no_room(verdicts.mean(refused[r]), 1.0, f"the base policy's refusal rate at r = {r:g}"),
        )

    base = defenses[(defenses["variant"] == "base") & (defenses["policy"] == policy)]
    refusal = {t: reading.values(base, "refused", 0.0, template=t) for t in ladder}
    steps = [Part(f"{b} - {a}", reading.compared(refusal[b], refusal[a])) for a, b in itertools.pairwise(ladder)]
    out[STRONGER_REFUSES.id] = Measured(
        steps,
        ", ".join(f"{t}: {verdicts.mean(v)}" for t, v in refusal.items())
        + "; steps "
        + ", ".join(part.estimate.signed() for part in steps),
        min(len(v) for v in refusal.values()),
        why="model: refused uncompressed "
        + ", ".join(f"{t} {v.mean():.2f}" for t, v in refusal.items())
        + " of the time",
    )
    never = float(base["ratio"].max()) + RATIO_STEP
    moved = verdicts.resampled(base, lambda f: _critical_steps(f, ladder, never))
    critical = analysis.critical_ratio(base, ["template"]).set_index("template").reindex(ladder)
    shown = ", ".join(f"{t}: {'none' if np.isnan(v) else f'{v:g}'}" for t, v in critical["critical_ratio"].items())
    silent = [t for t, refused in critical["refused_at_0"].items() if refused == 0]
    out[CRITICAL_MOVES.id] = Measured(
        [Part("smallest step", moved)],
        f"critical ratio {shown}; smallest step up the ladder {moved.signed()} (never halving counts as "
        f"r = {never:g}; none: never refused at r = 0)",
        moved.n,
        why=f"model: critical ratio {shown}",
        untestable=(
            f"{', '.join(silent)} never refused at r = 0 (refusal "
            + ", ".join(f"{refusal[t].mean():.2f}" for t in silent)
            + "): no critical ratio to move"
            if silent
            else ""
        ),
    )
    return out


def span_figure(spans: pd.DataFrame, title: str) -> plt.Figure:
    """N instruction spans: per prompt, the smallest span keep rate (the worst-kept of its spans, which notebook 11's
    claim is about) and the mean per-span compliance, vs r (rows), one column per span count with its n (prompts),
    one line per variant: means over that count's prompts with 95% bootstrap intervals."""
    per_prompt = (
        spans.groupby(["n_spans", "variant", "ratio", "key"])
        .agg(smallest=("keep_rate", "min"), compliance=("compliance", "mean"))
        .reset_index()
    )
    prompts = per_prompt.groupby("n_spans")["key"].nunique()
    per_prompt["spans"] = per_prompt["n_spans"].map(lambda n: f"{n} spans (n = {prompts[n]} prompts)")
    names = {"smallest": "smallest span keep rate", "compliance": "compliance (mean over spans)"}
    long = per_prompt.melt(
        id_vars=["spans", "variant", "ratio", "key"], value_vars=list(names), var_name="metric", value_name="value"
    )
    long["metric"] = long["metric"].map(names)
    grid = sns.relplot(
        data=long,
        x="ratio",
        y="value",
        hue="variant",
        col="spans",
        row="metric",
        kind="line",
        marker="o",
        errorbar=("ci", 95),
        n_boot=1000,
        seed=0,
        height=2.4,
        aspect=1.0,
        palette=palette("variant"),
        hue_order=in_order(long["variant"], "variant"),
        col_order=[f"{n} spans (n = {prompts[n]} prompts)" for n in sorted(prompts.index)],
        row_order=list(names.values()),
    )
    grid.set_axis_labels("compression ratio r", "")
    grid.set_titles("{col_name}:\n{row_name}", size=8)
    grid.set(ylim=(-0.05, 1.05))
    suptitle(grid.figure, title)
    return grid.figure


def budget_figure(spans: pd.DataFrame, title: str, bin_tokens: int = 10) -> plt.Figure:
    """Absolute budget against ratio: the spans' compliance against the tokens they keep (rounded to the nearest
    ``bin_tokens``, the axis's ticks), one panel per variant, colour the span count (ratio-free: a span that keeps k
    tokens complies about as well whatever the prompt size?). Each point is the mean over the spans in its bin at every
    r > 0, labelled with their number (n spans, several per prompt); the span counts' points are moved apart along
    the axis by a fifth of a bin at most so that their labels do not cover one another."""
    compressed = spans[spans["ratio"] > 0].assign(kept=lambda t: (t["kept_tokens"] / bin_tokens).round() * bin_tokens)
    compressed = compressed.rename(columns={"n_spans": "spans in the prompt"})
    points = (
        compressed.groupby(["variant", "spans in the prompt", "kept"])["compliance"]
        .agg(compliance="mean", n="size")
        .reset_index()
    )
    counts = sorted(points["spans in the prompt"].unique())
    dodge = dict(zip(counts, np.linspace(-bin_tokens / 5, bin_tokens / 5, len(counts)) if len(counts) > 1 else [0.0]))
    points["at"] = points["kept"] + points["spans in the prompt"].map(dodge)
    grid = sns.relplot(
        data=points,
        x="at",
        y="compliance",
        hue="spans in the prompt",
        col="variant",
        kind="line",
        marker="o",
        errorbar=None,
        palette="viridis",
        height=2.8,
        aspect=1.8,
        col_order=in_order(points["variant"], "variant"),
    )
    for variant, ax in grid.axes_dict.items():
        for point in points[points["variant"] == variant].itertuples():
            ax.annotate(
                str(point.n),
                (point.at, point.compliance),
                textcoords="offset points",
                xytext=(0, 4),
                fontsize=6,
                ha="center",
            )
    grid.set(xticks=np.arange(0, points["kept"].max() + bin_tokens, bin_tokens), ylim=(-0.05, 1.1))
    grid.set_axis_labels(f"tokens kept in the span (nearest {bin_tokens})", "compliance")
    grid.set_titles("{col_name} (each point: its n spans)", size=8)
    suptitle(grid.figure, title)
    return grid.figure


def category_figure(rows: pd.DataFrame, metric: str, label: str, title: str) -> plt.Figure:
    """Many attacks: ``metric`` per attack category (rows of the heat map) and (variant, ratio) (columns), means over
    prompts and the category's attacks."""
    table = rows.pivot_table(index="category", columns=["variant", "ratio"], values=metric, aggfunc="mean")
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * table.shape[1], 0.8 + 0.32 * table.shape[0]))
    sns.heatmap(
        table,
        vmin=0,
        vmax=1,
        cmap="rocket_r",
        annot=True,
        fmt=".2f",
        annot_kws={"size": 7},
        ax=ax,
        cbar_kws={"label": label},
    )
    ax.set_xlabel("variant, compression ratio r")
    ax.set_ylabel("")
    ax.set_title(title, fontsize=9)
    return fig
