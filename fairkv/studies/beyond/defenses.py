"""Notebook 11, defense strength: three defense templates from weak to strong (the paper has one). The claims read each
template's prompts uncompressed or along r."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from fairkv.report import analysis, verdicts
from fairkv.report.claims import OURS, Claim, Measured, Part
from fairkv.runs.studies import CPU_MITIGATION_RATIOS, NORMAL, TEN_RATIOS, Fields, Scale, Study
from fairkv.studies import reading

# one defense template per run (the notebook passes template=...); the paper's attack; at the cpu profile StreamingLLM on
# 50 prompts per template, 64 answers at once, not the profile's 128: the longest template's caches peaked at 17.0 GB
# at 128 before the Decoder (issue 37), which holds only the waiting and running answers' caches; with it, 12.1 GB at
# 128 and 11.2 GB at 64, and 128 no faster (10 min 19 s against 9 min 58 s for the template's 550 rows;
# benchmarks/results/defenses_batch_cpu.txt)
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


# defense templates of RaccoonBench with all their text before the directive, from weak to strong (12, 56 and 335
# words); templates with text on both sides of the directive have no single defense span. The refusal rate counts the
# standard template's scripted reply and its variants (metrics.is_refusal); a reply another template scripts (the
# GptInfinite template's "ACCESS DENIED") counts as "other", so read its leakage beside its refusal rate
DEFENSE_LADDER = ("short_defense_1", "standard_defense", "long_defense_GptInfinite")


RATIO_STEP = 0.1  # the step of the defense study's ratio grid above r = 0.3, on which a critical ratio is read
CRITICAL_MARGIN = RATIO_STEP / 2  # a move of the critical ratio smaller than half a grid step is no move

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
CLAIMS = (STRONGER_REFUSES, CRITICAL_MOVES)


def _critical_steps(frame: pd.DataFrame, ladder: list[str], never: float) -> float:
    """Smallest step up the ladder of the critical ratio (refusal halves; ``never`` where it does not halve in the
    ratios run; NaN where a template never refuses)."""
    critical = analysis.critical_ratio(frame[frame["variant"] == "base"], ["template"]).set_index("template")
    values = critical["critical_ratio"].where(critical["refused_at_0"] == 0, critical["critical_ratio"].fillna(never))
    values = values.reindex(list(ladder))
    return float(np.diff(values.to_numpy()).min()) if len(values) > 1 else np.nan


def measure(base: pd.DataFrame, ladder: list[str]) -> dict[str, Measured]:
    """The defense-strength claims, on the base policy's rows of each template of the ``ladder``."""
    refusal = {t: reading.values(base, "refused", 0.0, template=t) for t in ladder}
    steps = [Part(f"{b} - {a}", reading.compared(refusal[b], refusal[a])) for a, b in itertools.pairwise(ladder)]
    never = float(base["ratio"].max()) + RATIO_STEP
    moved = verdicts.resampled(base, lambda f: _critical_steps(f, ladder, never))
    critical = analysis.critical_ratio(base, ["template"]).set_index("template").reindex(ladder)
    shown = ", ".join(f"{t}: {'none' if np.isnan(v) else f'{v:g}'}" for t, v in critical["critical_ratio"].items())
    silent = [t for t, refused in critical["refused_at_0"].items() if refused == 0]
    return {
        STRONGER_REFUSES.id: Measured(
            steps,
            ", ".join(f"{t}: {verdicts.mean(v)}" for t, v in refusal.items())
            + "; steps "
            + ", ".join(part.estimate.signed() for part in steps),
            min(len(v) for v in refusal.values()),
            why="model: refused uncompressed "
            + ", ".join(f"{t} {v.mean():.2f}" for t, v in refusal.items())
            + " of the time",
        ),
        CRITICAL_MOVES.id: Measured(
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
        ),
    }
