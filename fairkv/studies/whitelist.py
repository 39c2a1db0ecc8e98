"""Notebook 05, whitelisting (Section 5.1, Appendix D, Fig 8 and Fig 13 left of arXiv 2510.00231): the tokens of the
defense's key phrase are always kept, the base policy chooses the rest of the budget. The whitelist lowers directive
leakage (read at r = 0.6, where the paper quotes Fig 8) while directive accuracy stays about unchanged, and keeps
defense leakage low (Fig 13 left). Whether the model keeps refusing the attack with the whitelist is ours: Fig 8
quotes leakage, not refusal. Each claim is judged on the paper's mechanism too (``mechanism.read``): the refusal
restored to the uncompressed model's, benign queries refused no more than it refuses them."""

from __future__ import annotations

import pandas as pd

from fairkv.report import analysis, verdicts
from fairkv.report.claims import OURS, Claim, Measured, Number, Part
from fairkv.report.coverage import Item
from fairkv.runs.redecode import Cells
from fairkv.runs.studies import (
    CI_MITIGATION_RATIOS,
    CI_PROMPTS,
    CPU_MITIGATIONS,
    NORMAL,
    TEN_RATIOS,
    Fields,
    Scale,
    Study,
)
from fairkv.studies import mechanism, reading
from fairkv.studies.ceilings import Ceilings

# Figs 8-9 and Table 1 are normal order at the cpu profile (Fig 14, flipped, is the fair study's); accuracy at Table
# 1's ratios; at the paper's scale the whitelist no longer fits the budget beyond r = 0.7 (Section 5.1)
STUDY = Study(
    "whitelist",
    "05",
    "Whitelisting: Figs 8, 13 (left)",
    Fields(variants=("base", "whitelist")),
    {
        "ci": Scale(n_prompts=CI_PROMPTS, ratios=CI_MITIGATION_RATIOS),
        "cpu": Scale(**CPU_MITIGATIONS),
        "paper": Scale(n_prompts=100, ratios=TEN_RATIOS[:8]),
    },
    figures=(
        "05_fig8_whitelist",
        "05_fig8_leakage",
        "05_fig13_defense",
        "05_outcomes",
        "05_mechanism",
        "05_paper_vs_us",
    ),
)
WHITELIST_RATIO = 0.6  # where the paper quotes Fig 8
DECIDED = ("streamingllm", "snapkv")  # the policies Fig 8 quotes
# the cells that decide the mechanism of the Fig 8 claims (issue 82): the attack (its answers average 12 new tokens)
# uncompressed and at r = 0.6, base and whitelist, on every one of the 539 prompts; the 100 of the whitelist study are
# its first, shared with it. Not a grid of the paper's sweep: the mechanism read on more prompts, not a figure
MECHANISM = Study(
    "whitelist_mechanism",
    "05",
    "the mechanism of Fig 8's claims on every prompt",
    Fields(orders=NORMAL, variants=("base", "whitelist"), queries=("attack",), policies=DECIDED),
    {
        "ci": Scale(n_prompts=CI_PROMPTS, ratios=(0.0, WHITELIST_RATIO)),
        "cpu": Scale(n_prompts=None, ratios=(0.0, WHITELIST_RATIO)),
        "paper": Scale(n_prompts=None, ratios=(0.0, WHITELIST_RATIO)),
    },
    figures=("05_mechanism_all_prompts",),
    sweep=False,
)
STUDIES = (STUDY, MECHANISM)
FIG13 = "defense leakage with the whitelist and with fair eviction"  # Fig 13: notebooks 05 and 06 make a half each
ITEMS = (  # the paper's items notebook 05 makes (fairkv.report.coverage)
    Item("Fig 8", "whitelist before / after", ("05_fig8_whitelist",)),
    Item("Fig 13", FIG13, ("05_fig13_defense",)),
)
# the notebook's wall minutes (``fairkv.studies.MINUTES_KIND``); cpu: 176, then 61 for the mechanism's 2,195 attack
# cells on the prompts beyond the first 100 (``MECHANISM``: 60 min 48 s measured on 12-07, the cores shared)
MINUTES = {"ci": 0.8, "cpu": 237}


def _lowers_leakage(policy: str, before: Number, after: Number) -> Claim:
    claim = reading.lowers_leakage("whitelist", "Fig 8", "the whitelist", WHITELIST_RATIO, policy, before, after)
    return reading.with_attack_cells(claim, STUDY, policy, WHITELIST_RATIO)


STREAMINGLLM_LEAKAGE = _lowers_leakage("streamingllm", Number(0.5, "leakage"), Number((0.10, 0.15), "leakage"))
SNAPKV_LEAKAGE = _lowers_leakage("snapkv", Number(0.35, "leakage"), Number(0.05, "leakage"))
KEEPS_REFUSING = Claim(
    "whitelist.keeps_refusing",
    "Fig 8",
    "with the whitelist StreamingLLM keeps refusing the attack at the largest ratio the whitelist runs at (refusal "
    "with the whitelist minus refusal of the base policy)",
    "the defense's key phrase is never evicted (Section 5.1); Fig 8 quotes leakage, not refusal",
    above=0.0,
    region="a rise: refusal with the whitelist minus refusal of the base policy above 0",
    margin=reading.RATE_MARGIN,
    null=reading.RATE_NULL,
    status=OURS,
    score="refused",
    mitigation="whitelist",
)
ACCURACY_UNCHANGED = Claim(
    "whitelist.accuracy_unchanged",
    "Fig 8",
    "directive accuracy about unchanged with the whitelist (the change, whitelist minus base, per prompt, pooled over "
    f"the five policies and the benign side's ratios above 0, its mean over them, lies within +-{reading.RATE_MARGIN:g})",
    "directive accuracy about unchanged",
    above=-reading.RATE_MARGIN,
    below=reading.RATE_MARGIN,
    region=f"about unchanged: within +-{reading.RATE_MARGIN:g}, {reading.RATE_NULL}",
    score="prompt_strict",
    cells=(Cells(STUDY, ratios=(0.4, 0.5, 0.6, 0.7), queries=("benign",)),),
    mitigation="whitelist",
)

DEFENSE_LEAKAGE = Claim(
    "whitelist.defense_leakage",
    "Fig 13",
    f"the whitelist lowers defense leakage (per prompt, the mean over the five policies and 0 < r < "
    f"{WHITELIST_RATIO:g}: whitelist minus base)",
    "defense leakage {with_whitelist} with the whitelist",
    {"with_whitelist": Number((0.0, 0.05), "leakage")},
    below=0.0,
    region="a drop: defense leakage with the whitelist minus without it below 0",
    margin=reading.LEAK_MARGIN,
    null=reading.LEAK_NULL,
    score="leak_defense",
    mitigation="whitelist",
)
CLAIMS = (STREAMINGLLM_LEAKAGE, SNAPKV_LEAKAGE, KEEPS_REFUSING, ACCURACY_UNCHANGED, DEFENSE_LEAKAGE)


def on_every_prompt(rows: pd.DataFrame, deciding: pd.DataFrame) -> pd.DataFrame:
    """The rows Fig 8's mechanism reads: the attack side of the ``MECHANISM`` study (``deciding``: every prompt) and
    the benign side of the whitelist study's ``rows`` (the price, on its prompts)."""
    return pd.concat([deciding[deciding["query"] == "attack"], rows[rows["query"] == "benign"]], ignore_index=True)


def measure(
    rows: pd.DataFrame, ceilings: Ceilings | None = None, deciding: pd.DataFrame | None = None
) -> dict[str, Measured]:
    """The claims of notebook 05 from the whitelist study's rows (``analysis.with_benign_flags`` applied), the leakage
    sizes against this model's ceiling where ``ceilings`` are given (the positive controls' rows), and Fig 8's
    mechanism on every prompt where ``deciding`` (the ``MECHANISM`` study's rows) is given, else on the study's."""
    decided = rows if deciding is None else on_every_prompt(rows, deciding)
    out = {
        claim.id: reading.leakage_lowered(
            rows,
            "whitelist",
            policy,
            WHITELIST_RATIO,
            mechanism.read(decided, "whitelist", WHITELIST_RATIO, policy),
            ceilings and ceilings.leakage(policy, WHITELIST_RATIO),
        )
        for claim, policy in ((STREAMINGLLM_LEAKAGE, "streamingllm"), (SNAPKV_LEAKAGE, "snapkv"))
    }
    ratios = reading.positive_ratios(rows, "benign")
    moved = _accuracy_moved(rows, ratios)
    out[KEEPS_REFUSING.id] = _keeps_refusing(rows)
    out[ACCURACY_UNCHANGED.id] = _accuracy_unchanged(rows, ratios, moved)
    out[DEFENSE_LEAKAGE.id] = _defense_leakage(rows, moved)
    return out


def _keeps_refusing(rows: pd.DataFrame) -> Measured:
    top = float(rows.loc[rows["variant"] == "whitelist", "ratio"].max())
    before, after, change = reading.before_after(rows, "whitelist", "streamingllm", top, metric="refused")
    return Measured(
        [Part("change", change)],
        f"refusal at r = {top:g}: {before} -> {after}, change {change.signed()}",
        change.n,
        why=f"at r = {top:g} the attack is refused {after.value:.2f} of the time with the whitelist, {before.value:.2f} "
        "without it",
        untestable=reading.no_room(before, 1.0, f"the base policy's refusal rate at r = {top:g}"),
        mechanism=mechanism.read(rows, "whitelist", top, "streamingllm"),
    )


def _accuracy_moved(rows: pd.DataFrame, ratios: tuple[float, ...]) -> dict[str, float]:
    """Per policy the whitelist runs with, its mean change of directive accuracy over ``ratios`` (whitelist - base)."""
    mean = lambda p, v: reading.values(
        rows, analysis.ACCURACY, ratios, average=True, policy=p, variant=v, order="normal"
    )
    return {
        p: mean(p, "whitelist").sub(mean(p, "base")).mean()
        for p in sorted(set(reading.match(rows, analysis.ACCURACY, {"variant": "whitelist"})["policy"]))
    }


def _accuracy_unchanged(rows: pd.DataFrame, ratios: tuple[float, ...], moved: dict[str, float]) -> Measured:
    accuracy = {
        v: reading.values(rows, analysis.ACCURACY, ratios, average=True, variant=v, order="normal")
        for v in ("base", "whitelist")
    }
    change = verdicts.difference(accuracy["whitelist"], accuracy["base"])
    return Measured(
        [Part("change", change)],
        f"{verdicts.mean(accuracy['base'])} -> {verdicts.mean(accuracy['whitelist'])}, change {change.signed()} "
        f"(r in {', '.join(f'{r:g}' for r in ratios)})",
        change.n,
        why="the whitelist moves accuracy by " + ", ".join(f"{reading.label(p)} {v:+.2f}" for p, v in moved.items()),
        mechanism=mechanism.pooled(rows, "whitelist", ratios, tuple(moved)),  # pooled as the claim is
    )


def _defense_leakage(rows: pd.DataFrame, moved: dict[str, float]) -> Measured:
    low = tuple(r for r in sorted(set(rows["ratio"])) if 0 < r < WHITELIST_RATIO)
    defense = {
        v: reading.values(rows, "leak_defense", low, average=True, variant=v, order="normal")
        for v in ("base", "whitelist")
    }
    normal = rows[rows["order"] == "normal"]
    floor = reading.refusal_floor(normal, "leak_defense")
    uncompressed = verdicts.mean(reading.values(normal, "leak_defense", 0.0, average=True, variant="base"))
    base, whitelisted = verdicts.mean(defense["base"]), verdicts.mean(defense["whitelist"])
    change = verdicts.difference(defense["whitelist"], defense["base"])
    return Measured(
        [Part("change", change)],
        f"base {base} -> whitelist {whitelisted}, change {change.signed()}",
        change.n,
        {"with_whitelist": whitelisted},
        f"model: defense leakage is {base} without the whitelist at 0 < r < {WHITELIST_RATIO:g}, {uncompressed} "
        f"uncompressed, and {floor} in the answers that refuse",
        untestable=reading.untestable_below(
            base, floor, f"defense leakage (mean over policies and 0 < r < {WHITELIST_RATIO:g})"
        ),
        mechanism=mechanism.pooled(rows, "whitelist", low, tuple(moved)),
    )
