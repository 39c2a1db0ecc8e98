"""What each notebook computes: a study names the axes its figures need, a profile sets the scale.

``grid(study, profile, **overrides)`` layers the configuration (STYLE.md, habit 6): the profile's grid
(``experiment.PROFILES``), then the study's axes (which orders, variants, lambdas and query kinds the paper's figures
use), then the profile's scale for that study (``SCALE``: prompts, ratios, policies), then the notebook's explicit
papermill overrides (None means "keep"; an explicit ``max_new_tokens`` caps the benign query too). Cells are keyed by
content, so studies that overlap (the base policy at r = 0.5 appears in notebooks 02, 03, 05 and 06) share their rows
in the results store and compute them once.
"""

from __future__ import annotations

from dataclasses import dataclass

from pathlib import Path

import pandas as pd

from fairkv import experiment

TEN_RATIOS = tuple(round(0.1 * i, 1) for i in range(10))  # the paper's figures: r = 0.0 ... 0.9
LAMBDAS = tuple(round(0.2 * i, 1) for i in range(6))  # Appendix G's sweep: lambda = 0, 0.2, ..., 1
BOTH_ORDERS = ("normal", "flipped")
BASE = ("base",)
TABLE1_RATIOS = (0.4, 0.5, 0.6, 0.7)  # Section 6: Table 1 averages the composite score over these ratios


@dataclass(frozen=True)
class Study:
    notebook: str
    reproduces: str
    axes: dict  # grid fields every profile shares for this study


STUDIES: dict[str, Study] = {
    "degradation": Study(
        "01", "Pitfall 1: Fig 2a-b", dict(policies=("streamingllm",), variants=BASE, queries=("benign",))
    ),
    "policies": Study("02", "Pitfall 2: Fig 3", dict(variants=BASE, queries=("benign",))),
    "leakage": Study("03", "Pitfalls 3-4: Figs 4, 5, 6", dict(orders=BOTH_ORDERS, variants=BASE)),
    "keep_rates": Study("04", "Pitfall 5: Figs 7, 10", dict(orders=BOTH_ORDERS, variants=BASE, queries=("keep",))),
    "whitelist": Study("05", "Whitelisting: Figs 8, 13 (left)", dict(variants=("base", "whitelist"))),
    "fair": Study("06", "Fair eviction: Figs 9, 13 (right), Table 1", dict(variants=("base", "whitelist", "fair"))),
    "fair_flipped": Study("06", "Fair eviction, flipped order: Fig 14", dict(orders=("flipped",), variants=("base", "fair"))),
    "debias": Study("07", "Debiasing: Figs 15-18, Tables 3-4", dict(variants=("fair",), lams=LAMBDAS)),
    # one LongBench TREC word bucket per run (dataset trec_1k / trec_2k / trec_3k, see fairkv.longbench); LongBench
    # generates at most 64 tokens for TREC
    "trec": Study("08", "LongBench TREC: Figs 19-22", dict(dataset="trec_1k", variants=("base", "fair"), benign_tokens=64)),
    # one span count per run (dataset spans_2 / 3 / 5 / 8, see fairkv.multispan); compliance needs the benign query only
    "spans": Study("11", "beyond the paper: N instruction spans", dict(dataset="spans_2", variants=("base", "fair"),
                                                                    queries=("benign",))),
    # every RaccoonBench attack category (the notebook passes the attack query kinds, data.attack_queries)
    "attacks": Study("11", "beyond the paper: many attacks", dict(variants=("base", "whitelist", "fair"))),
    # one defense template per run (the notebook passes template=...); the paper's attack
    "defenses": Study("11", "beyond the paper: defense strength", dict(variants=("base", "fair"), queries=("attack",))),
}

# defense templates of RaccoonBench with all their text before the directive, from weak to strong (12, 56 and 335
# words); templates with text on both sides of the directive have no single defense span. The refusal rate counts the
# standard template's scripted reply and its variants (metrics.is_refusal); a reply another template scripts (the
# GptInfinite template's "ACCESS DENIED") counts as "other", so read its leakage beside its refusal rate
DEFENSE_LADDER = ("short_defense_1", "standard_defense", "long_defense_GptInfinite")

# the ratios up to where the whitelist still fits, with those the claims are read at (fairkv.paper: Figs 8 at 0.6,
# 9 at 0.7, Table 1 over 0.4-0.7, peaks at 0.5)
CPU_MITIGATION_RATIOS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7)
CI_MITIGATION_RATIOS = (0.0, 0.4, 0.5, 0.6, 0.7)

# How big each study is in each profile (on top of the profile's grid). Keep rates need no decoding, so even the
# small profiles afford many prompts and all ten ratios there.
SCALE: dict[str, dict[str, dict]] = {
    "ci": {
        "whitelist": dict(ratios=CI_MITIGATION_RATIOS),
        "fair": dict(ratios=CI_MITIGATION_RATIOS),
        "trec": dict(n_prompts=1, policies=("streamingllm", "snapkv"), ratios=(0.0, 0.5), benign_tokens=16),
        "spans": dict(n_prompts=3, policies=("streamingllm", "snapkv"), ratios=(0.0, 0.5, 0.7), benign_tokens=96),
        "attacks": dict(n_prompts=2, policies=("streamingllm",), ratios=(0.0, 0.5)),
        "defenses": dict(n_prompts=3, policies=("streamingllm",), ratios=(0.0, 0.3, 0.5, 0.7)),
        "keep_rates": dict(n_prompts=8, ratios=TEN_RATIOS),
        "debias": dict(policies=("streamingllm",), lams=(0.0, 0.5, 1.0)),
    },
    "cpu": {
        "degradation": dict(n_prompts=24),
        "keep_rates": dict(n_prompts=100, ratios=TEN_RATIOS),
        "whitelist": dict(ratios=CPU_MITIGATION_RATIOS),
        "fair": dict(ratios=CPU_MITIGATION_RATIOS),
        # Qwen's eager prefill of a 1-2k-word prompt and 2k-token caches dominate: two policies
        "trec": dict(policies=("streamingllm", "snapkv"), ratios=CPU_MITIGATION_RATIOS),
        # notebook 11 on 2 cores, 62 min: StreamingLLM (the paper's headline policy), 10 prompts per span count (3 left
        # the open question to noise), 2 per attack
        "spans": dict(n_prompts=10, policies=("streamingllm",), ratios=(0.0, 0.5, 0.7), benign_tokens=128),
        "attacks": dict(n_prompts=2, policies=("streamingllm",), ratios=(0.0, 0.5)),
        "defenses": dict(policies=("streamingllm",), ratios=CPU_MITIGATION_RATIOS),
        "fair_flipped": dict(ratios=CPU_MITIGATION_RATIOS),
        "debias": dict(policies=("streamingllm",), lams=(0.0, 0.4, 0.8, 1.0), ratios=CPU_MITIGATION_RATIOS),
    },
    "paper": {
        # the paper scores IFEval on all 539 records of sys_ifeval and leakage on the first 100 of the shuffled set
        "degradation": dict(dataset="sys_ifeval", n_prompts=None),
        "policies": dict(dataset="sys_ifeval", n_prompts=None),
        "leakage": dict(n_prompts=100),
        "keep_rates": dict(n_prompts=100),
        "whitelist": dict(n_prompts=100, ratios=TEN_RATIOS[:8]),  # the whitelist no longer fits the budget beyond
        "fair": dict(n_prompts=100, ratios=TEN_RATIOS[:8]),  # r = 0.7 (Section 5.1)
        "fair_flipped": dict(n_prompts=100),
        "debias": dict(n_prompts=100),
        "trec": dict(n_prompts=None, ratios=TEN_RATIOS),
        "spans": dict(n_prompts=100, ratios=TEN_RATIOS, benign_tokens=1280),
        "attacks": dict(n_prompts=100, ratios=TEN_RATIOS[:8]),
        "defenses": dict(n_prompts=100, ratios=TEN_RATIOS),
    },
}


class StudyError(ValueError):
    """An unknown study."""


def study(name: str) -> Study:
    if name not in STUDIES:
        raise StudyError(f"unknown study {name!r}: use one of {', '.join(STUDIES)}")
    return STUDIES[name]


def grid(name: str, profile: str = "ci", **overrides) -> experiment.Grid:
    """The grid of study ``name`` at ``profile`` scale, with the notebook's overrides (None values are ignored)."""
    axes = study(name).axes
    base = experiment.profile(profile)
    scale = SCALE.get(profile, {}).get(name, {})
    explicit = {k: v for k, v in overrides.items() if v is not None}
    benign = {**axes, **scale}.get("benign_tokens", base.benign_tokens)
    if "max_new_tokens" in explicit and "benign_tokens" not in explicit and benign:
        explicit["benign_tokens"] = min(benign, explicit["max_new_tokens"])  # an explicit budget caps every query
    return base.with_overrides(**{**axes, **scale, **explicit})



def run(name: str, profile: str = "ci", folder: Path | None = None, progress: bool = True, executor="serial",
        **overrides):
    """(grid, rows) of study ``name``: compute what the results store lacks (with ``executor``, see
    ``experiment.run``), return the study's rows."""
    chosen = grid(name, profile, **overrides)
    return chosen, experiment.run(chosen, folder, progress=progress, executor=executor)


def describe(name: str, chosen: experiment.Grid, rows: pd.DataFrame) -> str:
    """What was run, in words: printed by each notebook under its parameters."""
    return (
        f"study {name!r} (notebook {study(name).notebook}, {study(name).reproduces}) on {chosen.model}: "
        f"{rows['key'].nunique()} prompts of {chosen.dataset} from #{chosen.start}, orders {list(chosen.orders)}, "
        f"policies {list(chosen.policies)}, variants {list(chosen.variants)}, lambdas {list(chosen.lams)}, "
        f"ratios {list(chosen.ratios)}, queries {list(chosen.queries)}, max_new_tokens "
        f"{chosen.tokens_for('benign')} (benign) / {chosen.tokens_for('attack')} (attack); {len(rows)} rows"
        + (f"\nprofile note: {chosen.note}" if chosen.note else "")
    )
