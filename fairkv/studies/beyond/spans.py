"""Notebook 11, many spans: fair eviction (Algorithm 1, Sec 5.2) on system prompts of 2 to 8 instruction spans (the
paper stops at two). The claims read each span count's own prompts (n per count, shown in the parts)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from fairkv.report.claims import OURS, Claim, Measured, Part
from fairkv.report.figures import BOOTSTRAP_BANDS, in_order, palette, suptitle
from fairkv.runs.redecode import Cells
from fairkv.runs.studies import CI_PROMPTS, NORMAL, TEN_RATIOS, Fields, Scale, Study
from fairkv.studies import reading

# one span count per run (dataset spans_2 / 3 / 5 / 8, see fairkv.core.multispan); compliance needs the benign query
# only. At the cpu profile StreamingLLM (the paper's headline policy), 30 prompts per span count; at ci its fewest points
SPANS = Study(
    "spans",
    "11",
    "beyond the paper: N instruction spans",
    Fields(dataset="spans_2", variants=("base", "fair"), queries=("benign",)),
    {
        "ci": Scale(n_prompts=CI_PROMPTS, policies=("streamingllm",), ratios=(0.0, 0.5, 0.7), benign_tokens=32),
        "cpu": Scale(
            n_prompts=30, orders=NORMAL, policies=("streamingllm",), ratios=(0.0, 0.5, 0.7), benign_tokens=128
        ),
        "paper": Scale(n_prompts=100, ratios=TEN_RATIOS, benign_tokens=1280),
    },
    figures=("11_spans", "11_spans_budget", "11_spans_starvation", "11_paper_vs_us"),
)

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
    effect=False,
    status=OURS,
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
CLAIMS = (SMALLEST_SPAN_KEPT, COMPLIANCE_RAISED)


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


def measure(picked: pd.DataFrame, label: str) -> dict[str, Measured]:
    """The N-spans claims: fair eviction keeps the worst-kept span, and raises compliance, per span count."""
    keeps, gains, top = _per_count(picked)
    kept = {count: reading.compared(fair, base) for count, (base, fair) in keeps.items()}
    counts = ", ".join(f"N={count}: {len(base)}" for count, (base, _) in keeps.items())
    moves = lambda pairs: ", ".join(f"N={c}: {base.mean():.2f} -> {fair.mean():.2f}" for c, (base, fair) in pairs)
    gained = {count: reading.compared(fair, base) for count, (base, fair) in gains.items()}
    return {
        SMALLEST_SPAN_KEPT.id: Measured(
            [Part(f"N={count}", estimate) for count, estimate in kept.items()],
            f"mean smallest span keep rate at r = {top:g}, base -> fair: {moves(keeps.items())} (prompts per count "
            f"{counts})",
            min(e.n for e in kept.values()),
            why="; ".join(
                f"N={count}: fair keeps less of its worst-kept span than {label} on {int((fair < base).sum())} of "
                f"{len(base)} prompts"
                for count, (base, fair) in keeps.items()
            ),
        ),
        COMPLIANCE_RAISED.id: Measured(
            [Part(f"N={count}", estimate) for count, estimate in gained.items()],
            f"mean compliance over r > 0, base -> fair: {moves(gains.items())} (prompts per count {counts})",
            min(e.n for e in gained.values()),
            why=f"model: compliance base -> fair {moves(gains.items())}",
        ),
    }


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
    suptitle(grid.figure, f"{title}; {BOOTSTRAP_BANDS}")
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
