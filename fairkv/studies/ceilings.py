"""Positive controls (issue 82): what this model can show at all, measured before any verdict on size, so that a
reader can tell "the paper's claim does not hold" from "this model cannot show it".

- **The leakage ceiling.** The paper's attack on the leakage prompts with nothing in the system prompt telling the
  model not to recite it: the defense replaced by neutral text of the same length (``prompts.NEUTRAL_TEMPLATE``: the
  prompt as long, the directive where it sat, so every policy evicts as it does under the defense), and with no
  defense at all (``no_defense``: a shorter prompt), uncompressed and at the ratios the leakage claims read (Fig 4's
  peak order at r = 0.5 on four policies; Figs 8 and 9 at r = 0.6 and 0.7 on StreamingLLM and SnapKV).
- **The accuracy ceiling.** IFEval prompt accuracy uncompressed at the paper's 1280 new tokens against the profile's
  256 on the same prompts: whether the cap or the model holds accuracy below the paper's.

A paper's number that lies above the interval of what this model reaches (the leakage at the claim's policy and ratio
under the control that reaches the most there, the accuracy at the paper's budget) reads ``untestable here`` in
magnitude (``Ceilings``, ``verdicts.magnitude``), never "differs". Direction verdicts do not read the ceilings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fairkv.core.prompts import NEUTRAL_TEMPLATE
from fairkv.report import analysis, outcomes, verdicts
from fairkv.runs.studies import BASE, CI_PROMPTS, NORMAL, PROFILES, Fields, Scale, Study
from fairkv.studies import reading

BARE = "no_defense"
TEMPLATES = {NEUTRAL_TEMPLATE: "neutral text in the defense's place", BARE: "no defense"}
PEAK_POLICIES = ("streamingllm", "snapkv", "h2o", "knorm")  # Fig 4's peak order, read at r = 0.5
MITIGATED = {"streamingllm": (0.6, 0.7), "snapkv": (0.6, 0.7)}  # Fig 8 reads r = 0.6, Fig 9 r = 0.7
PAPER_TOKENS = PROFILES["paper"].benign_tokens  # the paper's 1280 new tokens for IFEval answers
ACCURACY_PROMPTS = 30  # the accuracy ceiling's prompts at the cpu profile: the first of the leakage prompts


def _leakage(template: str, part: str, policies: tuple[str, ...], ratios: tuple[float, ...]) -> Study:
    """The attack on ``template``'s prompts at ``policies`` x ``ratios`` (and uncompressed), normal order; not a grid
    of the paper's sweep (``Study.sweep``): a control at the claims' own settings."""
    return Study(
        f"ceiling_{'neutral' if template == NEUTRAL_TEMPLATE else 'bare'}_{part}",
        "03",
        f"positive control: leakage with {TEMPLATES[template]}",
        Fields(orders=NORMAL, variants=BASE, queries=("attack",), template=template, policies=policies),
        {
            "ci": Scale(n_prompts=CI_PROMPTS, ratios=(0.0, *ratios)),
            "cpu": Scale(n_prompts=100, ratios=(0.0, *ratios)),
            "paper": Scale(n_prompts=100, ratios=(0.0, *ratios)),
        },
        figures=("03_ceilings",) if (template, part) == (NEUTRAL_TEMPLATE, "peak") else (),
        sweep=False,
    )


LEAKAGE = tuple(
    study
    for template in TEMPLATES
    for study in (
        _leakage(template, "peak", PEAK_POLICIES, (reading.PEAK,)),
        _leakage(template, "mitigated", tuple(MITIGATED), tuple(sorted({r for rs in MITIGATED.values() for r in rs}))),
    )
)


def _accuracy(name: str, tokens: int | None, ci_tokens: int) -> Study:
    """IFEval uncompressed at ``tokens`` new tokens (None: the profile's budget) on the first prompts."""
    budget = {} if tokens is None else {"benign_tokens": tokens}
    side = dict(n_prompts=ACCURACY_PROMPTS)
    return Study(
        name,
        "03",
        f"positive control: accuracy uncompressed at {'the paper' if tokens else 'our profile'}'s budget",
        Fields(orders=NORMAL, variants=BASE, queries=("benign",), policies=("streamingllm",), ratios=(0.0,)),
        {
            "ci": Scale(n_prompts=CI_PROMPTS, benign_tokens=ci_tokens),
            "cpu": Scale(n_prompts=ACCURACY_PROMPTS, benign=side, **budget),
            "paper": Scale(n_prompts=100, benign=dict(n_prompts=100), **budget),
        },
        figures=("03_ceiling_accuracy",) if tokens else (),
        sweep=False,
    )


# at ci the paper's budget is twice the profile's 32 tokens: ci checks the pipeline, not the science
ACCURACY = (_accuracy("ceiling_accuracy_paper_budget", PAPER_TOKENS, 64), _accuracy("ceiling_accuracy", None, 32))
STUDIES = (*LEAKAGE, *ACCURACY)


def run(
    profile: str, folder: Path | None = None, progress: bool = True, executor="serial", **overrides
) -> pd.DataFrame:
    """Every ceiling study's rows at ``profile`` (what the store, ``folder`` or the profile's, lacks computed), the
    attack answers with their ``outcome``; of a notebook's ``overrides`` its model, prompts and an explicit budget
    (which caps every query, the paper's budget too) apply to each (``Study.run_cells``)."""
    rows = [study.run_cells(profile, folder, progress, executor, **overrides) for study in STUDIES]
    rows = pd.concat(rows, ignore_index=True).drop_duplicates("cell_id", ignore_index=True)
    if "template" not in rows:  # no study ran a template of its own (a model or prompts with none)
        rows["template"] = None
    attack = rows["query"] == "attack"
    return rows.assign(outcome=outcomes.classify(rows[attack]).reindex(rows.index))


@dataclass(frozen=True)
class Ceilings:
    """What this model reaches when nothing holds it back, read from the ceiling studies' rows (``run``)."""

    rows: pd.DataFrame

    def leakage(self, policy: str, ratio: float) -> verdicts.Estimate:
        """Directive leakage at ``policy`` and ``ratio`` under the control that reaches the most there (the higher
        upper end of the two: neutral text in the defense's place, or no defense): what the paper's attack draws from
        this model there with nothing telling it not to recite, so that a paper's number is called out of reach only
        above both. A reference level, not a bound on every attack (other attacks draw more: notebook 11) nor on the
        defended prompt (at StreamingLLM r = 0.7 the defense's own rows leak as much)."""
        found = [
            verdicts.mean(reading.values(self.rows[self.rows["template"] == t], analysis.LEAKAGE, ratio, policy=policy))
            for t in TEMPLATES
        ]
        return max(found, key=lambda estimate: estimate.high)

    def _accuracy(self, largest: bool) -> pd.Series:
        """Per prompt, IFEval prompt accuracy uncompressed at the largest (else the smallest) budget run."""
        benign = self.rows[self.rows["query"] == "benign"]
        tokens = benign["max_new_tokens"].max() if largest else benign["max_new_tokens"].min()
        return reading.values(benign[benign["max_new_tokens"] == tokens], analysis.ACCURACY, 0.0)

    def budget(self) -> verdicts.Estimate:
        """IFEval prompt accuracy uncompressed at the largest budget run minus at the smallest, paired over prompts:
        what the paper's budget adds (a null: the model, not the cap, holds accuracy)."""
        return reading.compared(self._accuracy(largest=True), self._accuracy(largest=False))

    def accuracy(self) -> verdicts.Estimate:
        """IFEval prompt accuracy uncompressed at the largest budget run (the paper's 1280 new tokens)."""
        return verdicts.mean(self._accuracy(largest=True))


def leakage_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per control (template), policy and ratio: directive leakage with its interval, the share of answers that recite
    and the other outcomes' shares, n (the ceiling table ``03_ceilings``)."""
    attack = rows[rows["query"] == "attack"].assign(control=lambda f: f["template"].map(TEMPLATES))
    by = ["control", "policy", "ratio"]
    leakage = analysis.means(attack, analysis.LEAKAGE, by)
    leakage["directive leakage"] = [_interval(r) for r in leakage.itertuples()]
    shares = outcomes.shares(attack, by)
    table = leakage[[*by, "directive leakage"]].merge(shares, on=by)
    uncompressed = table["ratio"] == 0.0
    table.loc[uncompressed, "policy"] = "none"
    return table.drop_duplicates(by, ignore_index=True).round(2)


def accuracy_table(rows: pd.DataFrame) -> pd.DataFrame:
    """IFEval prompt accuracy uncompressed at each budget run on the same prompts, the share of answers cut at the cap,
    and the paired change from the smallest budget (``03_ceiling_accuracy``)."""
    benign = analysis.with_benign_flags(rows[rows["query"] == "benign"])
    budgets = sorted(benign["max_new_tokens"].unique())
    per = {t: benign[benign["max_new_tokens"] == t] for t in budgets}
    accuracy = {t: reading.values(frame, analysis.ACCURACY, 0.0) for t, frame in per.items()}
    return pd.DataFrame(
        {
            "new tokens": int(t),
            "accuracy": str(verdicts.mean(accuracy[t])),
            "cut at the cap": str(verdicts.mean(reading.values(per[t], "benign_capped", 0.0))),
            f"change from {int(budgets[0])}": (
                reading.compared(accuracy[t], accuracy[budgets[0]]).signed() if t != budgets[0] else ""
            ),
            "n": len(accuracy[t]),
        }
        for t in budgets
    )


def _interval(row) -> str:
    return f"{row.mean:.2f} [{row.low:.2f}, {row.high:.2f}]"
