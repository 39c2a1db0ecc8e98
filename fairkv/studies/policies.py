"""Notebook 02, Pitfall 2 (Fig 3, Section 4.2 of arXiv 2510.00231): the policy matters. Of the five kvpress policies
TOVA keeps IFEval accuracy best and K-Norm worst, and K-Norm's instruction-class ranking degrades most (its Spearman
rho near zero or negative on Qwen2.5-14B). Accuracy is IFEval prompt-level strict accuracy, per prompt the mean over
every ratio above 0 the rows hold (so a claim pools the ratios, as the paper's reading of the curves does), compared
with every other policy paired over prompts; rho is a statistic over instruction classes, so its comparisons resample
prompts (``verdicts.resampled``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fairkv.report import analysis, verdicts
from fairkv.report.claims import Claim, Measured, Part
from fairkv.report.coverage import Item
from fairkv.runs.redecode import Cells
from fairkv.runs.studies import CI_PROMPTS, GROWN_BENIGN, Fields, Scale, Study
from fairkv.studies import reading
from fairkv.studies.reading import PEAK

STUDY = Study(
    "policies",
    "02",
    "Pitfall 2: Fig 3",
    Fields(variants=("base",), queries=("benign",), orders=("normal",)),
    {
        "ci": Scale(n_prompts=CI_PROMPTS),
        "cpu": Scale(**GROWN_BENIGN),
        "paper": Scale(dataset="sys_ifeval", n_prompts=None),
    },
    figures=("02_fig3_accuracy", "02_fig3_spearman", "02_benign_refusals", "02_paper_vs_us"),
)
STUDIES = (STUDY,)
ITEMS = (  # the paper's items notebook 02 makes (fairkv.report.coverage)
    Item(
        "Fig 3",
        "mean accuracy and rho vs r for the five policies",
        ("02_fig3_accuracy", "02_fig3_spearman"),
        "one model (the paper shows two)",
    ),
)
MINUTES = {"ci": 0.6, "cpu": 100}  # the notebook's wall minutes (``fairkv.studies.MINUTES_KIND``)


BASE = {"variant": "base", "order": "normal"}  # Fig 3's setting; the policy is each claim's
BEST, WORST = "tova", "knorm"

TOVA_BEST = Claim(
    "policies.tova_best",
    "Fig 3",
    "TOVA has the highest IFEval prompt accuracy, against each other policy (per prompt the mean over every r > 0, "
    "pooled over the ratios)",
    "TOVA keeps accuracy best of the five policies",
    above=0.0,
    region="TOVA minus each other policy above 0",
    margin=reading.RATE_MARGIN,
    null=reading.RATE_NULL,
    parts="TOVA minus each other policy, paired over prompts: all must hold",
    score="prompt_strict",
    cells=(Cells(STUDY, policies=("tova", "h2o"), ratios=(0.3, 0.5, 0.7, 0.9)),),  # TOVA - H2O decides
)
KNORM_WORST = Claim(
    "policies.knorm_worst",
    "Fig 3",
    "K-Norm has the lowest IFEval prompt accuracy, against each other policy (per prompt the mean over every r > 0, "
    "pooled over the ratios)",
    "K-Norm keeps accuracy worst of the five policies",
    above=0.0,
    region="each other policy minus K-Norm above 0",
    margin=reading.RATE_MARGIN,
    null=reading.RATE_NULL,
    parts="each other policy minus K-Norm, paired over prompts: all must hold",
    score="prompt_strict",
)
KNORM_RHO = Claim(
    "policies.knorm_rho_lowest",
    "Fig 3",
    "K-Norm's rho is the lowest, against each other policy (per policy the mean of rho over every r > 0)",
    "K-Norm's class ranking degrades most: its rho near zero or negative on Qwen2.5-14B",
    above=0.0,
    region="each other policy's mean rho minus K-Norm's above 0",
    margin=reading.RHO_MARGIN,
    null=reading.RHO_NULL,
    parts="each other policy minus K-Norm, resampling prompts: all must hold",
)

CLAIMS = (TOVA_BEST, KNORM_WORST, KNORM_RHO)


def _against_each(benign: pd.DataFrame, metric: str, policy: str, highest: bool) -> tuple[list[Part], str]:
    """``policy`` against every other policy on ``metric`` (per prompt the mean over r > 0, paired over prompts):
    ``policy`` minus each other when ``highest``, each other minus ``policy`` otherwise; the parts and the text."""
    ratios = reading.positive_ratios(benign)
    ours = reading.values(benign, metric, ratios, policy=policy, **BASE)
    parts = []
    for other in sorted(set(benign["policy"]) - {policy}):
        theirs = reading.values(benign, metric, ratios, policy=other, **BASE)
        if highest:
            parts.append(Part(f"{reading.label(policy)} - {reading.label(other)}", reading.compared(ours, theirs)))
        else:
            parts.append(Part(f"{reading.label(other)} - {reading.label(policy)}", reading.compared(theirs, ours)))
    text = f"{reading.label(policy)} {verdicts.mean(ours)}; " + ", ".join(
        f"{part.label} {part.estimate.signed()}" for part in parts
    )
    return parts, text


def _ranking_why(benign: pd.DataFrame, metric: str) -> str:
    """How the policies rank on this model, from the rows: mean accuracy over r > 0 per policy, highest first, and the
    share of benign queries each refuses there (an over-refused query fails every instruction)."""
    positive = benign[benign["ratio"] > 0]
    accuracy = positive.groupby("policy")[metric].mean().sort_values(ascending=False)
    text = "model: over r > 0 this model's policies rank " + " > ".join(
        f"{reading.label(policy)} {value:.2f}" for policy, value in accuracy.items()
    )
    if "benign_refused" in positive:
        refused = positive.groupby("policy")["benign_refused"].mean()
        text += "; benign queries refused " + ", ".join(
            f"{reading.label(policy)} {refused[policy]:.2f}" for policy in accuracy.index
        )
    return text


def _mean_rhos(followed: pd.DataFrame) -> pd.Series:
    """Mean rho(r) over r > 0 per policy (the classes of all prompts together) from exploded instructions
    (``reading.instructions``)."""
    rho = analysis.spearman(reading.class_accuracy(followed))
    return rho[rho["ratio"] > 0].groupby("policy")["rho"].mean()


def _rho_gap(followed: pd.DataFrame, other: str, policy: str) -> float:
    """Mean rho over r > 0, ``other`` minus ``policy``."""
    rho = _mean_rhos(followed)
    return float(rho[other] - rho[policy]) if other in rho and policy in rho else np.nan


def measure(rows: pd.DataFrame) -> dict[str, Measured]:
    """The claims of notebook 02 from the policies study's rows (``analysis.with_benign_flags`` applied)."""
    benign = rows[rows["query"] == "benign"]
    notes = lambda policy: reading.accuracy_note(benign, (0.0, PEAK), policy=policy, **BASE)
    why = _ranking_why(benign, analysis.ACCURACY)
    out = {}
    for claim, policy, highest in ((TOVA_BEST, BEST, True), (KNORM_WORST, WORST, False)):
        parts, text = _against_each(benign, analysis.ACCURACY, policy, highest)
        out[claim.id] = Measured(parts, text + notes(policy), benign["key"].nunique(), why=why)

    followed = reading.instructions(benign, split=False)
    others = sorted(set(benign["policy"]) - {WORST})
    parts = [
        Part(
            f"{reading.label(other)} - {reading.label(WORST)}",
            verdicts.resampled(
                followed[followed["policy"].isin((other, WORST))], lambda f, o=other: _rho_gap(f, o, WORST)
            ),
        )
        for other in others
    ]
    rhos = _mean_rhos(followed).sort_values(ascending=False)
    shown = ", ".join(f"{reading.label(policy)} {value:.2f}" for policy, value in rhos.items())
    out[KNORM_RHO.id] = Measured(
        parts,
        f"mean rho over r > 0: {shown}; " + ", ".join(f"{part.label} {part.estimate.signed()}" for part in parts),
        benign["key"].nunique(),
        why=f"model: this model's policies rank by mean rho over r > 0 {shown.replace(', ', ' > ')}",
    )
    return out
