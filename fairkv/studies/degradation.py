"""Notebook 01, Pitfall 1 (Fig 2a-b, Section 4.1 of arXiv 2510.00231): under StreamingLLM, IFEval instruction classes
lose accuracy at different rates as r grows, more unevenly when a system prompt carries several instructions (Fig 2a:
accuracy per class normalised by its value at r = 0), and the ranking of the classes (Spearman rho against r = 0)
falls sooner and lower for multi-instruction prompts (Fig 2b). Both are statistics over instruction classes, so their
intervals resample prompts (``verdicts.resampled``). The spread is read at the largest ratio run, on the change in
class accuracy from r = 0 over classes resting on enough instructions (``MIN_INSTRUCTIONS``), not on the figure's
normalised accuracy, which is ill-conditioned on small classes; rho is averaged over every ratio above 0."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from fairkv.report import analysis, verdicts
from fairkv.report.claims import Claim, Measured, Part
from fairkv.report.figures import suptitle
from fairkv.report.coverage import Item
from fairkv.runs.studies import CI_PROMPTS, GROWN_BENIGN, TEN_RATIOS, Fields, Scale, Study
from fairkv.studies import reading

STUDY = Study(
    "degradation",
    "01",
    "Pitfall 1: Fig 2a-b",
    Fields(policies=("streamingllm",), variants=("base",), queries=("benign",), orders=("normal",)),
    {
        "ci": Scale(n_prompts=CI_PROMPTS),
        "cpu": Scale(ratios=TEN_RATIOS, **GROWN_BENIGN),
        # the paper scores IFEval on all 539 records of sys_ifeval (leakage on the first 100 of the shuffled set)
        "paper": Scale(dataset="sys_ifeval", n_prompts=None),
    },
    figures=("01_fig2a_class_accuracy", "01_fig2b_spearman", "01_benign_refusals", "01_paper_vs_us"),
)
STUDIES = (STUDY,)
ITEMS = (  # the paper's items notebook 01 makes (fairkv.report.coverage)
    Item(
        "Fig 2a",
        "accuracy per IFEval instruction class vs r, single- vs multi-instruction prompts",
        ("01_fig2a_class_accuracy",),
        "StreamingLLM, as the paper's",
    ),
    Item("Fig 2b", "Spearman rho(r) of class accuracy, single vs multi", ("01_fig2b_spearman",)),
)
MINUTES = {"ci": 0.4, "cpu": 63}  # the notebook's wall minutes (``fairkv.studies.MINUTES_KIND``)


NORMAL = {"policy": "streamingllm", "variant": "base", "order": "normal"}  # the setting of Fig 2
SPREAD_MARGIN = reading.RATE_MARGIN
SPREAD_NULL = (
    "the spread is one of changes in a rate (class accuracy), so a rate's margin applies: " + reading.RATE_NULL
)
# a class counts toward the spread when its accuracy at r = 0 rests on at least this many instructions, so that one
# instruction moves it by at most 0.1 (issue 66: the normalised spread rested on classes of 1 to 21 instructions, where
# accuracy(r) / accuracy(0) swings by whole units)
MIN_INSTRUCTIONS = 10

SPREAD = Claim(
    "degradation.class_spread",
    "Fig 2a",
    "class accuracy spreads more for multi- than for single-instruction prompts (the spread: max - min over classes "
    "of the change in class accuracy from r = 0 to the largest ratio run, over the classes resting on at least "
    f"{MIN_INSTRUCTIONS} instructions at r = 0, StreamingLLM; the paper's figure normalises by the accuracy at r = 0, "
    "a ratio that swings by whole units on small classes)",
    "classes degrade unevenly, and more so when the system prompt carries several instructions",
    above=0.0,
    region="a larger spread: multi minus single above 0",
    margin=SPREAD_MARGIN,
    null=SPREAD_NULL,
)
RHO = Claim(
    "degradation.rho_multi_lower",
    "Fig 2b",
    "rho(r) is lower for multi- than for single-instruction prompts (per kind of prompt the mean of rho over every "
    "r > 0, StreamingLLM)",
    "the class ranking of multi-instruction prompts falls sooner and lower",
    above=0.0,
    region="a lower rho for multi: single minus multi above 0",
    margin=reading.RHO_MARGIN,
    null=reading.RHO_NULL,
)

CLAIMS = (SPREAD, RHO)


def _spreads(followed: pd.DataFrame, top: float) -> pd.Series:
    """Spread (max - min) per kind of prompt (single / multi) of the change in class accuracy from r = 0 to ``top``,
    over the classes resting on at least ``MIN_INSTRUCTIONS`` instructions at r = 0, from exploded instructions
    (``reading.instructions``); NaN for a kind with fewer than two such classes."""
    accuracy = reading.class_accuracy(followed).set_index(["prompts", "class", "ratio"])["accuracy"]
    sizes = followed[followed["ratio"] == 0.0].groupby(["prompts", "class"]).size()
    enough = sizes[sizes >= MIN_INSTRUCTIONS].index
    change = (accuracy.xs(top, level="ratio") - accuracy.xs(0.0, level="ratio")).reindex(enough).dropna()
    return change.groupby(level="prompts").agg(lambda s: s.max() - s.min() if len(s) > 1 else np.nan)


def _class_spread(followed: pd.DataFrame, top: float) -> float:
    """Spread of normalised class accuracy at ``top``, multi- minus single-instruction prompts."""
    spread = _spreads(followed, top)
    return spread.get("multi", np.nan) - spread.get("single", np.nan)


def _rhos(followed: pd.DataFrame) -> pd.Series:
    """Mean rho(r) over r > 0 per kind of prompt."""
    rho = analysis.spearman(reading.class_accuracy(followed))
    return rho[rho["ratio"] > 0].groupby("prompts")["rho"].mean()


def _rho_gap(followed: pd.DataFrame) -> float:
    """Mean rho(r) over r > 0, single- minus multi-instruction prompts."""
    rho = _rhos(followed)
    return rho.get("single", np.nan) - rho.get("multi", np.nan)


def _by_kind(values: pd.Series) -> str:
    return ", ".join(f"{kind} {values.get(kind, np.nan):.2f}" for kind in ("single", "multi"))


def _classes_why(benign: pd.DataFrame, top: float) -> str:
    """Why the class statistics say little here, from the rows: the benign refusals, how many instructions each
    class's accuracy at r = 0 rests on, and which classes rest on too few to count toward the spread."""
    at_zero = analysis.class_accuracy(benign)
    at_zero = at_zero[at_zero["ratio"] == 0.0]
    small = at_zero[at_zero["n"] < MIN_INSTRUCTIONS]
    left_out = ", ".join(f"{kind}: {name}" for kind, name in zip(small["prompts"], small["class"])) or "none"
    return (
        reading.benign_refusal_why(benign, (0.0, top), **NORMAL)
        + f"; each class's accuracy at r = 0 rests on {int(at_zero['n'].min())} to {int(at_zero['n'].max())} "
        f"instructions, and the spread leaves out the classes resting on fewer than {MIN_INSTRUCTIONS} ({left_out})"
    )


def measure(rows: pd.DataFrame) -> dict[str, Measured]:
    """The claims of notebook 01 from the degradation study's rows (``analysis.with_benign_flags`` applied)."""
    benign = rows[rows["query"] == "benign"]
    top = float(benign["ratio"].max())
    notes = reading.accuracy_note(benign, (0.0, top), **NORMAL)
    why = _classes_why(benign, top)

    followed = reading.instructions(benign)
    spread = verdicts.resampled(followed, lambda f: _class_spread(f, top))
    rho = verdicts.resampled(followed, _rho_gap)
    return {
        SPREAD.id: Measured(
            [Part("multi - single", spread)],
            f"spread at r = {top:g}: {_by_kind(_spreads(followed, top))}; multi - single {spread.signed()}{notes}",
            spread.n,
            why=why,
        ),
        RHO.id: Measured(
            [Part("single - multi", rho)],
            f"mean rho over r > 0: {_by_kind(_rhos(followed))}; single - multi {rho.signed()}{notes}",
            rho.n,
            why=why,
        ),
    }


def class_accuracy_figure(accuracy: pd.DataFrame, title: str) -> plt.Figure:
    """Fig 2a: accuracy per instruction class vs r; rows single / multi-instruction prompts, columns raw / normalised
    by the class's accuracy at r = 0. Every class is drawn in the raw column; the legend gives each class's number of
    instructions (single / multi), and the normalised panel names the classes that score 0 at r = 0 and so cannot be
    normalised (they are absent from it, not lost)."""
    counts = accuracy[accuracy["ratio"] == 0.0].pivot_table(index="class", columns="prompts", values="n", aggfunc="sum")
    count = lambda name, kind: int(counts.at[name, kind]) if kind in counts and pd.notna(counts.at[name, kind]) else 0
    label = {name: f"{name} (n = {count(name, 'single')} / {count(name, 'multi')})" for name in counts.index}
    labelled = accuracy.assign(**{"class": accuracy["class"].map(label)})
    long = labelled.melt(
        id_vars=["prompts", "class", "ratio"],
        value_vars=["accuracy", "normalised"],
        var_name="scale",
        value_name="value",
    )
    grid = sns.relplot(
        data=long,
        x="ratio",
        y="value",
        hue="class",
        row="prompts",
        col="scale",
        kind="line",
        marker="o",
        height=2.8,
        aspect=1.4,
        facet_kws={"sharey": False},
        row_order=["single", "multi"],
        col_order=["accuracy", "normalised"],
    )
    grid.set_titles("{row_name}-instruction prompts, {col_name}")
    colours = {
        text.get_text(): handle.get_color() for text, handle in zip(grid.legend.texts, grid.legend.legend_handles)
    }
    for (kind, scale), ax in grid.axes_dict.items():
        if scale == "accuracy":  # the raw accuracy's 95% Wilson band per class (``analysis.class_accuracy``)
            for name, line in labelled[labelled["prompts"] == kind].sort_values("ratio").groupby("class"):
                ax.fill_between(
                    line["ratio"], line["low"], line["high"], color=colours.get(name), alpha=0.1, linewidth=0
                )
        ax.set_xlabel("compression ratio r")
        ax.set_ylabel("accuracy (instructions followed)" if scale == "accuracy" else "accuracy / accuracy at r = 0")
        if scale == "normalised":
            lost = accuracy[(accuracy["prompts"] == kind) & (accuracy["ratio"] == 0.0) & (accuracy["accuracy"] == 0.0)]
            if not lost.empty:
                ax.text(
                    0.02,
                    0.02,
                    "0 at r = 0, not normalised:\n" + ", ".join(sorted(lost["class"])),
                    fontsize=6,
                    transform=ax.transAxes,
                    va="bottom",
                )
    grid.legend.set_title("class (n instructions: single / multi)")
    suptitle(grid.figure, f"{title}; bands: 95% Wilson intervals of the raw accuracy")
    return grid.figure
