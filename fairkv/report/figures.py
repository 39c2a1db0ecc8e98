"""Figures several notebooks share: plot functions take results and return a matplotlib Figure; ``save`` writes PNG and
PDF. A plot one study owns lives in its module (``fairkv.studies.<name>``), the outcome figure in
``fairkv.report.outcomes``.

Plot functions read and write no files; every figure names the model and the sample size in its title.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.container import BarContainer

from fairkv.core.metrics import LEAK_THRESHOLD
from fairkv.core.one_prompt import Evaluation
from fairkv.core.paths import figures_dir
from fairkv.core.presses import get_policy

# One colour per policy and one per variant in every figure (colour-blind safe, Okabe-Ito); a figure coloured by
# variant never uses a policy's meaning of a colour and the reverse.
POLICY_COLOURS = {
    "StreamingLLM": "#0072B2",
    "H2O": "#D55E00",
    "SnapKV": "#56B4E9",
    "TOVA": "#CC79A7",
    "K-Norm": "#000000",
}
VARIANT_COLOURS = {"base": "#7F7F7F", "whitelist": "#E69F00", "fair": "#009E73", "fair+whitelist": "#F0E442"}
# what the shaded bands of a line figure drawn by seaborn are (its title says so)
BOOTSTRAP_BANDS = "bands: 95% bootstrap intervals over prompts"
# the resolution of a figure shown in a notebook (the PNG file of record is written at 150 dpi)
INLINE_DPI = 80


def suptitle(fig: plt.Figure, title: str) -> None:
    """The figure's title, wrapped to the figure's width and set above its panels (figures are saved with a tight
    bounding box), so a long title never runs over the panel titles."""
    width = max(40, int(fig.get_figwidth() * 13))  # about 13 characters per inch at 10 pt
    fig.suptitle(textwrap.fill(title, width), fontsize=10, y=1.0, va="bottom")


def in_order(values: pd.Series, hue: str) -> list:
    """The distinct ``values`` in one order across figures: policies and variants as their colours list them (the
    paper's order), anything else as it first appears."""
    seen = list(dict.fromkeys(values))
    known = list(palette(hue) or {})
    return [v for v in known if v in seen] + [v for v in seen if v not in known]


def palette(hue: str) -> dict | None:
    """The fixed colours of ``hue`` ("policy" labels or "variant"), None for any other hue (seaborn's default)."""
    return {"policy": POLICY_COLOURS, "variant": VARIANT_COLOURS}.get(hue)


def save(fig: plt.Figure, name: str, folder: Path | None = None) -> list[Path]:
    """Write ``name``.png and ``name``.pdf under ``folder`` (default: the figures directory); return the paths."""
    folder = Path(folder) if folder is not None else figures_dir()
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}.{ext}" for ext in ("png", "pdf")]
    for path in paths:
        fig.savefig(
            path, bbox_inches="tight", dpi=150, metadata={"CreationDate": None} if path.suffix == ".pdf" else None
        )
    return paths


def output_dir(profile: str, output: str | Path | None = None) -> Path:
    """Where a notebook writes: ``output`` when given, else ``<figures>/<profile>/`` (so CI's small runs never
    overwrite the committed cpu-profile figures)."""
    return Path(output) if output else figures_dir() / profile


def plotted(fig: plt.Figure) -> str:
    """What a figure plots, in one line: its lines, scatter points, image cells and bars (where it has any), and the
    mean of their values (y for lines and points, heights for bars). A notebook shows it under the figure, so nbval compares every figure's data."""
    values, counts = [], {"lines": 0, "points": 0, "image cells": 0}
    for ax in fig.axes:
        for line in ax.lines:
            y = np.asarray(line.get_ydata(), dtype=float)
            if y.size:
                counts["lines"] += 1
                values.append(y)
        for collection in ax.collections:
            if type(collection).__name__ == "PathCollection":  # scatter points (error bands are polygons)
                y = np.asarray(collection.get_offsets(), dtype=float).reshape(-1, 2)[:, 1]
                counts["points"] += y.size
                values.append(y)
        for image in ax.images:
            cells = np.asarray(image.get_array(), dtype=float).ravel()
            counts["image cells"] += cells.size
            values.append(cells)
        for container in ax.containers:
            if isinstance(container, BarContainer):
                heights = np.array([bar.get_height() for bar in container], dtype=float)
                counts["bars"] = counts.get("bars", 0) + heights.size
                values.append(heights)
    flat = np.concatenate(values) if values else np.array([])
    flat = flat[np.isfinite(flat)]
    return (
        "plotted: "
        + ", ".join(f"{n} {kind}" for kind, n in counts.items())
        + (f"; mean value {flat.mean():.4f}" if flat.size else "")
    )


def publish(fig: plt.Figure, name: str, folder: Path):
    """Save the figure (PNG and PDF, the files of record), show it inline (a PNG at ``INLINE_DPI``, so a notebook
    carries every figure it makes and stays small), close it, and return what it plots (``plotted``) as Markdown: the
    line nbval compares, as an image's bytes vary with the machine and are never compared."""
    from IPython.display import Image, Markdown, display

    save(fig, name, folder)
    inline = io.BytesIO()
    fig.savefig(inline, format="png", bbox_inches="tight", dpi=INLINE_DPI)
    summary = plotted(fig)
    plt.close(fig)
    display(Image(data=inline.getvalue(), format="png"))
    return Markdown(f"{name}: {summary}")


def save_table(table: pd.DataFrame, name: str, folder: Path | None = None, digits: int = 4) -> list[Path]:
    """Write ``name``.csv and ``name``.md under ``folder``/tables (default: the figures directory's); a pivoted
    table's two-level column names are written as one ("refused 0.5"), not as tuples."""
    if isinstance(table.columns, pd.MultiIndex):
        table = table.set_axis(
            [" ".join(str(part) for part in column if str(part)) for column in table.columns], axis=1
        )
    folder = (Path(folder) if folder is not None else figures_dir()) / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    csv, markdown = folder / f"{name}.csv", folder / f"{name}.md"
    table.to_csv(csv, index=False)
    markdown.write_text(table.round(digits).to_markdown(index=False) + "\n")
    return [csv, markdown]


def keep_map_figure(evaluation: Evaluation) -> plt.Figure:
    """Kept-token map: per policy, the fraction of (layer, KV head) pairs keeping each prefix token, per ratio.

    Span boundaries are drawn as vertical lines and each span is labelled; the whitelist phrase is marked below.
    """
    prompt = evaluation.prompt
    policies = list(dict.fromkeys(p for p, _ in evaluation.keep_maps))
    ratios = sorted({r for _, r in evaluation.keep_maps})
    fig, axes = plt.subplots(len(policies), 1, figsize=(11, 1.0 + 0.45 * len(ratios) * len(policies)), sharex=True)
    axes = np.atleast_1d(axes)
    for ax, policy in zip(axes, policies):
        grid = np.stack([evaluation.keep_maps[(policy, r)].numpy() for r in ratios])
        image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_yticks(range(len(ratios)), [f"r={r:g}" for r in ratios], fontsize=7)
        ax.set_ylabel(get_policy(policy).label, rotation=0, ha="right", va="center", fontsize=9)
        for span in prompt.spans[1:]:
            ax.axvline(span.start - 0.5, color="white", lw=1.5)
        if prompt.protected:
            ax.plot(prompt.protected, [len(ratios) - 0.5] * len(prompt.protected), "|", color="red", ms=6)
    for span in prompt.spans:
        axes[0].text((span.start + span.end) / 2, -0.8, span.name, ha="center", va="bottom", fontsize=9)
    axes[-1].set_xlabel("prefix token position (red ticks: whitelist phrase)")
    fig.colorbar(image, ax=list(axes), label="share kept", fraction=0.02, pad=0.01)
    fig.suptitle(
        f"Kept-token map (share of layers x KV heads keeping each token) - model {evaluation.model}, "
        f"record {int(evaluation.rows['key'].iloc[0])}, n = {prompt.n_tokens} tokens",
        fontsize=10,
    )
    return fig


DODGE = 0.01  # how far along r the lines of a policy figure are moved apart at most, so equal lines stay visible
ZOOM_BELOW = 0.3  # a panel whose means all stay below this is drawn on its own scale (stated in its label)


def _scale(ax: plt.Axes, means: pd.Series) -> str:
    """0-1 for rates, accuracies and leakages; a panel whose means all stay below ``ZOOM_BELOW`` on 0 to a little above
    them, so small values are not flattened against the axis: returns the note its label carries then ("" else)."""
    top = float(means.max()) if len(means) else 1.0
    if not top < ZOOM_BELOW:
        ax.set_ylim(-0.05, 1.05)
        return ""
    upper = max(0.05, float(np.ceil(top * 1.6 / 0.05) * 0.05))
    ax.set_ylim(-upper / 20, upper)
    return f" (y axis 0-{upper:g})"


def policy_curves(rows: pd.DataFrame, columns: dict[str, str], title: str, hue: str = "policy") -> plt.Figure:
    """One panel per metric column (column -> axis label), one line per ``hue`` value, against the compression ratio.

    Lines are means over prompts with bootstrap 95% intervals (seeded, 1000 resamples), each ``hue`` value's moved
    along r by at most ``DODGE`` so that equal lines do not hide one another. Each panel's title gives its
    own n (the prompts with that metric: the benign side can be smaller than the attack side) and, when it draws fewer
    ``hue`` values than the figure, which; small values get their own scale (``_scale``).
    """
    rows = label_policies(rows) if hue == "policy" else rows
    fig, axes = plt.subplots(1, len(columns), figsize=(4 * len(columns), 3.4), sharex=True)
    axes = np.atleast_1d(axes)
    everyone = in_order(rows[hue], hue)
    # lines that coincide (two policies keeping the same tokens) stay visible: each hue's points are dodged a little
    # along r, by at most DODGE
    dodge = dict(zip(everyone, np.linspace(-DODGE, DODGE, len(everyone)) if len(everyone) > 1 else [0.0]))
    for ax, (column, label) in zip(axes, columns.items()):
        data = rows.dropna(subset=[column]) if column in rows else rows.iloc[:0]
        data = data.assign(ratio=data["ratio"] + data[hue].map(dodge))
        sns.lineplot(
            data=data,
            x="ratio",
            y=column,
            hue=hue,
            marker="o",
            ax=ax,
            errorbar=("ci", 95),
            n_boot=1000,
            seed=0,
            legend=ax is axes[-1],
            palette=palette(hue),
            hue_order=everyone,
        )
        drawn = list(dict.fromkeys(data[hue]))
        only = f", {', '.join(drawn)} only" if len(drawn) < len(everyone) else ""
        ax.set_title(f"n = {data['key'].nunique()} prompts{only}", fontsize=8)
        ax.set_ylabel(textwrap.fill(label + _scale(ax, data.groupby([hue, "ratio"])[column].mean()), 32))
        ax.set_xlabel("compression ratio r")
    if axes[-1].get_legend() is not None:
        sns.move_legend(axes[-1], "upper left", bbox_to_anchor=(1, 1))
    suptitle(fig, f"{title}; {BOOTSTRAP_BANDS}")
    fig.tight_layout()
    return fig


# Wherever leakage is plotted, defense compliance is plotted beside it: ROUGE-L alone misses a model that drops the
# defense but echoes the attack instead of reciting its prompt.
COMPLIANCE_PANELS = {"refused": "defense obeyed (refusal rate)", "leaked": f"leak rate (ROUGE-L > {LEAK_THRESHOLD})"}


REFERENCES = {
    "directive": "directive",
    "defense": "defense (without its scripted reply)",
    "defense_raw": "defense (whole template)",
}


def leakage_figure(rows: pd.DataFrame, title: str, hue: str = "policy", reference: str = "directive") -> plt.Figure:
    """Leakage of ``reference`` (directive or defense) beside the defense-compliance and leak rates."""
    panels = {f"leak_{reference}": f"{REFERENCES[reference]} leakage (ROUGE-L recall)", **COMPLIANCE_PANELS}
    return policy_curves(rows, panels, title, hue)


def describe(model: str, rows: pd.DataFrame, extra: str = "") -> str:
    """A figure title naming the model and the sample size (number of distinct prompts); where the queries ran on
    different numbers of prompts (the benign side of a profile can be smaller), the range, each panel stating its
    own (``policy_curves``, ``variant_figure``)."""
    sizes = sorted({group["key"].nunique() for _, group in rows.groupby("query")}) if "query" in rows else []
    sizes = sizes or [rows["key"].nunique()]
    n = f"n = {sizes[0]} prompt(s)" if len(sizes) == 1 else f"n = {sizes[0]}-{sizes[-1]} prompts (each panel its own)"
    return f"model {model}, {n}{', ' + extra if extra else ''}"


def label_policies(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.assign(policy=rows["policy"].map(lambda p: get_policy(p).label))


def rho_figure(rhos: pd.DataFrame, title: str, hue: str = "prompts") -> plt.Figure:
    """Fig 2b / Fig 3 right: Spearman rho(r) of the instruction-class ranking, one line per ``hue`` value."""
    rhos = label_policies(rhos) if hue == "policy" else rhos
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    sns.lineplot(data=rhos, x="ratio", y="rho", hue=hue, marker="o", ax=ax, palette=palette(hue))
    if {"low", "high"} <= set(rhos.columns):  # ``analysis.spearman_intervals``: a 95% band per line
        colours = {line.get_label(): line.get_color() for line in ax.get_legend().get_lines()}
        for name, line in rhos.sort_values("ratio").groupby(hue):
            ax.fill_between(
                line["ratio"], line["low"], line["high"], color=colours.get(str(name)), alpha=0.15, linewidth=0
            )
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1, 1))  # beside the panel, never over the curves
    ax.set_xlabel("compression ratio r")
    ax.set_ylabel("Spearman rho vs r = 0")
    ax.set_ylim(-1.05, 1.05)
    ax.set_title(f"{title}; {BOOTSTRAP_BANDS}" if {"low", "high"} <= set(rhos.columns) else title, fontsize=9)
    return fig


LAMBDA_MARKERS = ("o", "s", "^", "D", "v")  # one per policy, in the order the plane lists them


def lambda_plane_figure(plane: pd.DataFrame, title: str, accuracy: str = "directive accuracy") -> plt.Figure:
    """Figs 15-18: directive accuracy (named ``accuracy`` on the axis) against directive leakage, one panel per order
    (rows) and ratio (columns), one point per lambda, its colour named in the legend. Points of one policy are joined
    in lambda order, drawn from lambda 0 up: where lambdas land on one point the largest shows (at r = 0 every lambda
    is the base policy)."""
    plane = label_policies(plane)
    ratios, orders = sorted(plane["ratio"].unique()), [o for o in ("normal", "flipped") if o in set(plane["order"])]
    lams = sorted(plane["lam"].unique())
    colours = dict(zip(lams, sns.color_palette("viridis", len(lams))))
    markers = dict(zip(plane["policy"].unique(), LAMBDA_MARKERS))
    fig, axes = plt.subplots(
        len(orders),
        len(ratios),
        figsize=(2.8 * len(ratios), 2.8 * len(orders) + 0.4),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    for row, order in enumerate(orders):
        for ax, ratio in zip(axes[row], ratios):
            frame = plane[(plane["ratio"] == ratio) & (plane["order"] == order)]
            for policy, points in frame.sort_values("lam").groupby("policy", sort=False):
                ax.plot(points["leakage"], points["accuracy"], color="0.7", linewidth=0.8, zorder=1)
                for point in points.itertuples():
                    ax.scatter(
                        point.leakage,
                        point.accuracy,
                        s=45,
                        marker=markers[policy],
                        color=[colours[point.lam]],
                        edgecolors="white",
                        linewidths=0.6,
                        zorder=2,
                    )
            ax.set_title(f"{order} order, r = {ratio:g}", fontsize=8)
            ax.set_xlabel("directive leakage" if row == len(orders) - 1 else "")
        axes[row][0].set_ylabel(accuracy)
    handles = [
        plt.Line2D([], [], marker="o", linestyle="", color=colours[lam], markersize=7, label=f"{lam:g}") for lam in lams
    ]
    handles += [plt.Line2D([], [], marker=m, linestyle="", color="0.3", label=policy) for policy, m in markers.items()]
    fig.legend(
        handles=handles,
        title="lambda\n(0: the base policy,\n1: fair eviction)",
        loc="upper left",
        bbox_to_anchor=(1.0, 0.95),
        fontsize=8,
        title_fontsize=8,
        frameon=False,
    )
    suptitle(fig, title)
    fig.tight_layout()
    return fig


def span_keep_rates(rows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """The defense's and the directive's keep rates (columns ``keep_defense``, ``keep_directive``) as one column
    ``keep rate`` beside the span they belong to (``span``: defense / directive), one row per span and row of ``by``."""
    long = rows.melt(id_vars=by, value_vars=["keep_defense", "keep_directive"], var_name="span", value_name="keep rate")
    return long.assign(span=long["span"].str.removeprefix("keep_"))


def every_ratio(grid: sns.FacetGrid, ratios: pd.Series) -> None:
    """A tick at every ratio run, each labelled (upright labels would run into each other at a step of 0.1)."""
    ticks = sorted(ratios.unique())
    grid.set(xticks=ticks)
    grid.set_xticklabels([f"{r:g}" for r in ticks], fontsize=7, rotation=90)


def variant_figure(
    rows: pd.DataFrame, columns: dict[str, str], title: str, ylim: tuple[float, float] | None = None
) -> plt.Figure:
    """Figs 8, 9, 13, 14, 19, 25, 26: each metric (rows of panels, named on the y axis with its own n) vs r per policy
    (columns, named above), one line per variant, a tick at every ratio run; ``ylim`` for every row, else 0-1 and a row
    whose means all stay small on its own scale (``_scale``)."""
    long = (
        label_policies(rows)
        .melt(
            id_vars=["key", "policy", "variant", "ratio"],
            value_vars=list(columns),
            var_name="metric",
            value_name="value",
        )
        .dropna(subset=["value"])
    )
    present = [column for column in columns if (long["metric"] == column).any()]  # a metric no row carries: no panels
    long["metric"] = long["metric"].map(columns)
    grid = sns.relplot(
        data=long,
        x="ratio",
        y="value",
        hue="variant",
        col="policy",
        row="metric",
        kind="line",
        marker="o",
        errorbar=("ci", 95),
        n_boot=1000,
        seed=0,
        height=2.4,
        aspect=1.0,
        row_order=[columns[c] for c in present],
        palette=palette("variant"),
        facet_kws={"sharey": "row"},
        hue_order=in_order(long["variant"], "variant"),
        col_order=in_order(long["policy"], "policy"),
    )
    grid.set_axis_labels("compression ratio r", "")
    grid.set_titles("{col_name}", size=9)
    every_ratio(grid, long["ratio"])
    for row, (axes, column) in enumerate(zip(grid.axes, present)):
        _label_row(axes, long[long["metric"] == columns[column]], columns[column], ylim, first=row == 0)
    suptitle(grid.figure, f"{title}; {BOOTSTRAP_BANDS}")
    return grid.figure


def _label_row(axes, picked: pd.DataFrame, label: str, ylim: tuple[float, float] | None, first: bool) -> None:
    """One row of a variant figure: its scale (``ylim``, else 0-1 or its own for small means, on its first panel:
    sharey="row"), its label with its n, "not run" on a policy's panel without lines, the policy named above the first
    row only."""
    if ylim is None:
        note = _scale(axes[0], picked.groupby(["policy", "variant", "ratio"])["value"].mean())
    else:
        axes[0].set_ylim(ylim)
        note = ""
    axes[0].set_ylabel(textwrap.fill(f"{label}{note} (n = {picked['key'].nunique()})", 24), fontsize=8)
    for ax in axes:
        if not ax.lines:  # a policy this metric was not measured for at this profile: say so, not a blank panel
            ax.text(
                0.5,
                0.5,
                "not run at\nthis profile",
                ha="center",
                va="center",
                fontsize=8,
                color="grey",
                transform=ax.transAxes,
            )
        if not first:
            ax.set_title("")
