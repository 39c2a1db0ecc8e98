"""Notebook 10, LLM-as-judge leakage (Appendix L, Figs 25-26 of arXiv 2510.00231): a judge model rates how much of the
directive a response reveals (0-4, a leak from 2); its leak rate shows the same inverted U as ROUGE-L: StreamingLLM's
rises under compression, and the whitelist and fair eviction lower it. Ours at r = 0.5 (``reading.PEAK``), the judge
being the profile's judge model (at ``cpu``, the audited model judging its own answers).

The judge's gate: the claims that rest on the judge's scores (``judged``) decide nothing while the judge's calibration
(``analysis.calibration_summary``, its first row over every labelled response) reaches below
``analysis.JUDGE_MIN_ACCURACY``: the gate's text quotes the calibration. Our claim about the judge itself (it ranks
responses like ROUGE-L) rests on the judge's scores too, so it is gated as they are: one rule on every page (issue 82).
Where the gate holds, a claim with the paper's numbers reads too uncertain in magnitude."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from fairkv.core.metrics import LEAK_THRESHOLD
from fairkv.report import analysis, outcomes, verdicts
from fairkv.report.claims import NO_NUMBER, OURS, Claim, Measured, Number, Part
from fairkv.report.coverage import Item
from fairkv.runs.judge import Plan
from fairkv.runs.studies import Study
from fairkv.studies import fair, mechanism, reading
from fairkv.studies.reading import PEAK

# Appendix L: the judge, the policies whose attack responses it rates (the rows come from the fair study: base,
# whitelist and fair eviction), the directives of its calibration set (six labelled responses each) and its precision
# (bfloat16 where the profile's model runs in it; a stored score names its judge's precision). On 2 CPU cores the judge
# reads about 80 prompt tokens/s (Qwen, fp32), so the cpu profile judges StreamingLLM, the paper's headline policy, and
# ci uses SmolLM2 on two directives to check the pipeline.
STUDY = Study(
    "judge",
    "10",
    "LLM judge: Figs 25-26",
    None,
    {
        "ci": Plan(judge="smollm2-135m", policies=("streamingllm",), calibration_prompts=2, dtype="float32"),
        "cpu": Plan(judge="qwen2.5-coder-1.5b", policies=("streamingllm",), calibration_prompts=6, dtype="bfloat16"),
        "paper": Plan(
            judge="qwen2.5-coder-1.5b",
            policies=("streamingllm", "h2o", "snapkv", "tova", "knorm"),
            calibration_prompts=6,
            dtype="bfloat16",
        ),
    },
    figures=(
        "10_fig25_judge_leak_rate",
        "10_fig26_judge_severity",
        "10_judge_agreement",
        "10_judge_calibration",
        "10_paper_vs_us",
    ),
    sweep=False,
)
JUDGED = fair.STUDY  # the study whose attack answers the judge rates
STUDIES = (STUDY,)
ITEMS = (  # the paper's items notebook 10 makes (fairkv.report.coverage)
    Item(
        "Figs 25-26",
        "LLM judge: leak rate and severity vs r",
        ("10_fig25_judge_leak_rate", "10_fig26_judge_severity"),
        "the judge is the audited model judging its own answers (the paper's is a larger model)",
    ),
)
MINUTES = {"ci": 0.8, "cpu": 35}  # the notebook's wall minutes (``fairkv.studies.MINUTES_KIND``)


RANKS_ALIKE = 0.5  # a rank correlation above this: the judge orders responses much as ROUGE-L does


def _with_change(before: Number, after: Number) -> dict[str, Number]:
    """The paper's levels before -> after and the change they imply (``reading.change_of``), each written once."""
    return {"before": before, "after": after, "change": reading.change_of(before, after)}


RISES = Claim(
    "judge.rises",
    "Figs 25-26",
    f"StreamingLLM's leak rate by the judge rises under compression (r = {PEAK:g} minus r = 0)",
    "leak rate {peak} at r = 0.5-0.6",
    {"peak": Number((0.7, 0.8), "rate")},
    above=0.0,
    region="a rise: the leak rate at the peak minus at r = 0 above 0",
    margin=reading.RATE_MARGIN,
    null=reading.RATE_NULL,
    judged=True,
)
WHITELIST_LOWERS = Claim(
    "judge.whitelist_lowers",
    "Figs 25-26",
    f"the whitelist lowers StreamingLLM's leak rate by the judge (r = {PEAK:g}, whitelist minus base)",
    "{before} -> {after} with the whitelist",
    _with_change(RISES.numbers["peak"], Number((0.0, 0.2), "rate")),
    below=0.0,
    region="a decrease: the variant's leak rate minus the base's below 0",
    margin=reading.RATE_MARGIN,
    null=reading.RATE_NULL,
    judged=True,
    mitigation="whitelist",
)

FAIR_LOWERS = Claim(
    "judge.fair_lowers",
    "Figs 25-26",
    f"fair eviction lowers StreamingLLM's leak rate by the judge (r = {PEAK:g}, fair minus base)",
    "{before} -> {after} with fair eviction",
    _with_change(RISES.numbers["peak"], Number((0.4, 0.5), "rate")),
    below=0.0,
    region=WHITELIST_LOWERS.region,
    margin=reading.RATE_MARGIN,
    null=reading.RATE_NULL,
    judged=True,
    mitigation="fair",
)
RANKS_LIKE_ROUGE = Claim(
    "judge.ranks_like_rouge",
    "Figs 25-26",
    f"the judge ranks responses like ROUGE-L (Spearman rho of its expected severity and directive ROUGE-L over every "
    f"distinct response, all settings pooled, above {RANKS_ALIKE:g})",
    f"{NO_NUMBER}: the paper reports no rank agreement of its judge with ROUGE-L",
    above=RANKS_ALIKE,
    region=f"a strong rank agreement: rho above {RANKS_ALIKE:g}, where the two metrics order most responses alike",
    effect=False,
    status=OURS,
    judged=True,
)
CLAIMS = (RISES, WHITELIST_LOWERS, FAIR_LOWERS, RANKS_LIKE_ROUGE)
LOWERS = {"whitelist": WHITELIST_LOWERS, "fair": FAIR_LOWERS}


def _rank_agreement(frame: pd.DataFrame) -> float:
    """Spearman rho of the judge's expected severity and directive ROUGE-L over the distinct responses: one per
    (prompt, cell), so that a prompt drawn twice by ``verdicts.resampled`` (its ``key`` and ``cell_id`` renamed in
    the second copy) counts twice, while a response the rows hold under several settings (r = 0 is one cell for every
    variant) counts once."""
    judged = frame.drop_duplicates(["key", "cell_id"])
    if judged["judge_expected"].nunique() < 2 or judged[analysis.LEAKAGE].nunique() < 2:
        return np.nan
    return float(stats.spearmanr(judged["judge_expected"], judged[analysis.LEAKAGE]).statistic)


def _calibration(calibration: pd.DataFrame | None) -> tuple[str, str]:
    """(the calibration quoted, the gate's text: empty when the judge is trusted)."""
    if calibration is None:
        return "", ""
    right = calibration.iloc[0]
    quoted = (
        f"judge right on {verdicts.number(right['accuracy'])} [{verdicts.number(right['low'])}, "
        f"{verdicts.number(right['high'])}] of {int(right['n'])} labelled responses"
    )
    if right["low"] >= analysis.JUDGE_MIN_ACCURACY:
        return quoted, ""
    return quoted, f"{quoted} (below {analysis.JUDGE_MIN_ACCURACY:g}: decides nothing)"


def _judge_why(rows: pd.DataFrame, quoted: str, **matched) -> str:
    """Why the judge's leak rate sits where it does, from the rows: what the answers at the peak are
    (``reading.recital_why``), what the answers it calls a leak are (``leak_calls``) and how far the judge is right
    (its calibration)."""
    return "; ".join(
        [reading.recital_why(rows, PEAK, **matched), leak_calls(rows, **matched), *([quoted] if quoted else [])]
    )


def leak_calls(rows: pd.DataFrame, **matched) -> str:
    """What the answers the judge calls a leak at the peak are (``outcomes.classify``): how many of them recite."""
    picked = reading.match(rows, "judge_leak", matched)
    called = picked[(picked["ratio"].round(6) == PEAK) & (picked["judge_leak"] == 1)].drop_duplicates("cell_id")
    if called.empty:
        return f"the judge calls no answer at r = {PEAK:g} a leak"
    counts = outcomes.classify(called).value_counts()
    said = ", ".join(
        f"{int(counts[name])} {reading.OUTCOME_WORDS[name]}" for name in outcomes.OUTCOMES if name in counts
    )
    return f"of the {len(called)} answers the judge calls a leak at r = {PEAK:g}: {said}"


def measure(
    rows: pd.DataFrame, policy: str, calibration: pd.DataFrame | None, study: pd.DataFrame
) -> dict[str, Measured]:
    """The claims of notebook 10 from the judged attack rows (``fairkv.runs.judge.judge_rows``), the judge's
    calibration (``analysis.calibration_summary``; None: no gate) and the ``study``'s rows the judged ones come from
    (``analysis.with_benign_flags`` applied: what moved the mitigations' numbers, ``mechanism.read``, reads their benign
    side)."""
    judged = rows.assign(judge_leak=rows["judge_leak"].astype(float))
    quoted, gate = _calibration(calibration)
    trusted = f"; {quoted}" if quoted and not gate else ""
    base = {"policy": policy, "variant": "base", "order": "normal"}
    label = reading.label(policy)
    at = {r: reading.values(judged, "judge_leak", r, **base) for r in (0.0, PEAK)}
    before = verdicts.mean(at[PEAK])
    rise = reading.compared(at[PEAK], at[0.0])
    why = _judge_why(judged, quoted, **base)
    out = {
        RISES.id: Measured(
            [Part("rise", rise)],
            f"{label}: {verdicts.mean(at[0.0])} at r = 0 -> {before} at r = {PEAK:g}, rise {rise.signed()}{trusted}; "
            + leak_calls(judged, **base),
            rise.n,
            {"peak": before},
            why,
            gate=gate,
        )
    }
    for variant, claim in LOWERS.items():
        if variant not in set(judged["variant"]):
            continue
        after_values = reading.values(judged, "judge_leak", PEAK, policy=policy, variant=variant, order="normal")
        after = verdicts.mean(after_values)
        change = reading.compared(after_values, at[PEAK])
        moved = "a drop" if change.value < 0 else "a rise" if change.value > 0 else "no change"
        out[claim.id] = Measured(
            [Part(f"{variant} - base", change)],
            f"base {before} -> {variant} {after} at r = {PEAK:g}, change {change.signed()} ({moved}){trusted}",
            change.n,
            {"before": before, "after": after, "change": change},
            f"{variant}: leak rate {before.value:.2f} -> {after.value:.2f} at r = {PEAK:g}; "
            + _judge_why(judged, quoted, policy=policy, variant=variant, order="normal"),
            gate=gate,
            mechanism=mechanism.read(study, variant, PEAK, policy),
        )
    scored = judged.dropna(subset=["judge_expected", analysis.LEAKAGE])
    rho = verdicts.resampled(scored, _rank_agreement)
    distinct = scored.drop_duplicates(["key", "cell_id"])
    alike = float((distinct["judge_leak"] == (distinct[analysis.LEAKAGE] > LEAK_THRESHOLD)).mean())
    out[RANKS_LIKE_ROUGE.id] = Measured(
        [Part("rho", rho)],
        f"rho {rho} over {len(distinct)} distinct responses (intervals resample the prompts)"
        + (f"; {quoted}" if quoted else ""),
        rho.n,
        why=f"model: the judge's expected severity and ROUGE-L order the {len(distinct)} responses alike only in part "
        f"(rho {rho.value:.2f}); they call the same responses a leak {alike:.0%} of the time (judge >= 2, ROUGE-L > "
        f"{LEAK_THRESHOLD:g})",
        gate=gate,
    )
    return out
