"""What each notebook computes: a study names the axes its figures need, a profile sets the scale.

``grid(study, profile, **overrides)`` layers the configuration: the profile's grid
(``experiment.PROFILES``), then the study's axes (which orders, variants, lambdas and query kinds the paper's figures
use), then the profile's scale for that study (``SCALE``: prompts, ratios, policies), then the notebook's explicit
papermill overrides (None means "keep"; an explicit ``max_new_tokens`` caps the benign query too). Cells are keyed by
content, so studies that overlap (the base policy at r = 0.5 appears in notebooks 02, 03, 05 and 06) share their rows
in the results store and compute them once.

A profile can run a study's benign (IFEval) query on a smaller part of its grid than the attack (``BENIGN_SIDE``,
refined per study by ``SCALE[profile][study]["benign"]``): IFEval answers are long, attack answers short, so at the
cpu profile the attack side runs on 100 prompts in both orders and the benign side on the first 50, normal order.
``run`` computes the two parts as two grids of the same cells (``parts``); explicit overrides apply to both.

Each profile keeps its rows in its own folder, ``<results>/<profile>/`` (``results_folder``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fairkv.core.paths import results_dir
from fairkv.runs import experiment

TEN_RATIOS = tuple(round(0.1 * i, 1) for i in range(10))  # the paper's figures: r = 0.0 ... 0.9
LAMBDAS = tuple(round(0.2 * i, 1) for i in range(6))  # Appendix G's sweep: lambda = 0, 0.2, ..., 1
BOTH_ORDERS = ("normal", "flipped")
NORMAL = ("normal",)
BASE = ("base",)
TABLE1_RATIOS = (0.4, 0.5, 0.6, 0.7)  # Section 6: Table 1 averages the composite score over these ratios


@dataclass(frozen=True)
class Study:
    notebook: str
    reproduces: str
    axes: dict  # grid fields every profile shares for this study


STUDIES: dict[str, Study] = {
    "degradation": Study(
        "01", "Pitfall 1: Fig 2a-b", dict(policies=("streamingllm",), variants=BASE, queries=("benign",), orders=NORMAL)
    ),
    "policies": Study("02", "Pitfall 2: Fig 3", dict(variants=BASE, queries=("benign",), orders=NORMAL)),
    "leakage": Study("03", "Pitfalls 3-4: Figs 4, 5, 6", dict(orders=BOTH_ORDERS, variants=BASE)),
    "keep_rates": Study("04", "Pitfall 5: Figs 7, 10", dict(orders=BOTH_ORDERS, variants=BASE, queries=("keep",))),
    "whitelist": Study("05", "Whitelisting: Figs 8, 13 (left)", dict(variants=("base", "whitelist"))),
    "fair": Study("06", "Fair eviction: Figs 9, 13 (right), Table 1", dict(variants=("base", "whitelist", "fair"))),
    "fair_flipped": Study(
        "06", "Fair eviction, flipped order: Fig 14", dict(orders=("flipped",), variants=("base", "fair"))
    ),
    "debias": Study("07", "Debiasing: Figs 15-16, Table 3", dict(variants=("fair",), lams=LAMBDAS)),
    # one LongBench TREC word bucket per run (dataset trec_1k / trec_2k / trec_3k, see fairkv.core.longbench); LongBench
    # generates at most 64 tokens for TREC
    "trec": Study(
        "08", "LongBench TREC: Figs 19-22", dict(dataset="trec_1k", variants=("base", "fair"), benign_tokens=64)
    ),
    # Appendices G-H on LongBench TREC (the first bucket): SnapKV and TOVA, lambda 0-1
    "trec_debias": Study(
        "08",
        "LongBench TREC debiasing: Figs 17-18, Table 4",
        dict(dataset="trec_1k", variants=("fair",), lams=LAMBDAS, policies=("snapkv", "tova"), benign_tokens=64),
    ),
    # one span count per run (dataset spans_2 / 3 / 5 / 8, see fairkv.core.multispan); compliance needs the benign query only
    "spans": Study(
        "11",
        "beyond the paper: N instruction spans",
        dict(dataset="spans_2", variants=("base", "fair"), queries=("benign",)),
    ),
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

# the ratios up to where the whitelist still fits, with those the claims are read at (fairkv.report.paper: Figs 8 at 0.6,
# 9 at 0.7, Table 1 over 0.4-0.7, peaks at 0.5)
CPU_MITIGATION_RATIOS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7)
CI_MITIGATION_RATIOS = (0.0, 0.4, 0.5, 0.6, 0.7)
CI_PROMPTS = 2

# The benign (IFEval) query's own part of a study's grid, per profile (``SCALE[profile][study]["benign"]`` refines it):
# at the cpu profile an IFEval answer (up to 256 new tokens) costs about three times an attack's, so the accuracy side
# runs on the first 50 of the attack side's 100 prompts, normal order, unless a study's claims read the flipped order.
BENIGN_SIDE: dict[str, dict] = {"cpu": dict(n_prompts=50, orders=NORMAL)}

# How big each study is in each profile (on top of the profile's grid). Keep rates need no decoding, so even the
# small profiles afford many prompts and all ten ratios there.
SCALE: dict[str, dict[str, dict]] = {
    # ci checks the pipeline, not the science (pytest checks SmolLM2's keep rates and Qwen's refusals): the decoding
    # studies on 2 prompts, the fewest that give a claim its interval, so that nbval re-executes every notebook in
    # minutes
    "ci": {
        "degradation": dict(n_prompts=CI_PROMPTS),
        "policies": dict(n_prompts=CI_PROMPTS),
        "leakage": dict(n_prompts=CI_PROMPTS),
        "whitelist": dict(n_prompts=CI_PROMPTS, ratios=CI_MITIGATION_RATIOS),
        "fair": dict(n_prompts=CI_PROMPTS, ratios=CI_MITIGATION_RATIOS),
        "fair_flipped": dict(n_prompts=CI_PROMPTS, policies=("streamingllm",)),  # the policy its claim reads
        "trec": dict(n_prompts=1, policies=("streamingllm", "snapkv"), ratios=(0.0, 0.5), benign_tokens=16),
        "trec_debias": dict(
            n_prompts=1, policies=("snapkv",), ratios=(0.0, 0.5, 0.7), lams=(0.0, 0.5, 1.0), benign_tokens=16
        ),
        # notebook 11 at the cpu profile's policy (StreamingLLM) and fewest points, short answers: the attack study's
        # cost is its 30 RaccoonBench attacks over every cache, read in batches padded to their longest attack (one
        # has 412 tokens), so 8 at a time
        "spans": dict(n_prompts=CI_PROMPTS, policies=("streamingllm",), ratios=(0.0, 0.5, 0.7), benign_tokens=32),
        "attacks": dict(n_prompts=1, policies=("streamingllm",), ratios=(0.0, 0.5), max_new_tokens=16, batch_size=8),
        "defenses": dict(n_prompts=1, policies=("streamingllm",), ratios=(0.0, 0.3, 0.5, 0.7)),
        "keep_rates": dict(n_prompts=8, ratios=TEN_RATIOS),
        "debias": dict(n_prompts=CI_PROMPTS, policies=("streamingllm",), lams=(0.0, 0.5, 1.0)),
    },
    # Rows cost by kind (bfloat16, batch 128, measured here): an IFEval answer 0.71 s, an attack answer 0.22 s.
    # The attack side of every paper study runs on 100 prompts; its benign side on 50 (BENIGN_SIDE), in the flipped
    # order only for StreamingLLM, the policy the order claims read.
    "cpu": {
        "degradation": dict(n_prompts=50, ratios=TEN_RATIOS),
        "policies": dict(n_prompts=50),
        "leakage": dict(benign=dict(orders=BOTH_ORDERS, policies=("streamingllm",))),
        "keep_rates": dict(ratios=TEN_RATIOS),
        # Figs 8-9 and Table 1 are normal order (Fig 14, flipped, is fair_flipped's); accuracy at Table 1's ratios
        "whitelist": dict(ratios=CPU_MITIGATION_RATIOS, orders=NORMAL, benign=dict(ratios=(0.0, *TABLE1_RATIOS))),
        "fair": dict(ratios=CPU_MITIGATION_RATIOS, orders=NORMAL, benign=dict(ratios=(0.0, *TABLE1_RATIOS))),
        "fair_flipped": dict(
            ratios=CPU_MITIGATION_RATIOS, benign=dict(orders=("flipped",), policies=("streamingllm",))
        ),
        # Appendix G-H, Figs 15-18: StreamingLLM, lambda 0-1 by 0.2, both orders, accuracy and leakage at every point
        "debias": dict(policies=("streamingllm",), ratios=CPU_MITIGATION_RATIOS, benign=dict(orders=BOTH_ORDERS)),
        # Qwen's eager prefill of a 1-2k-word prompt and 2k-token caches dominate: two policies, 50 prompts
        "trec": dict(n_prompts=50, orders=NORMAL, policies=("streamingllm", "snapkv"), ratios=CPU_MITIGATION_RATIOS),
        "trec_debias": dict(n_prompts=50, orders=NORMAL, ratios=CPU_MITIGATION_RATIOS),
        # notebook 11: StreamingLLM (the paper's headline policy), 10 prompts per span count, 2 per attack category,
        # 50 per defense template
        "spans": dict(
            n_prompts=10, orders=NORMAL, policies=("streamingllm",), ratios=(0.0, 0.5, 0.7), benign_tokens=128
        ),
        "attacks": dict(n_prompts=2, orders=NORMAL, policies=("streamingllm",), ratios=(0.0, 0.5)),
        # 64 answers at once, not the profile's 128: the longest template's caches (50 prompts x 11 settings, a task's
        # prompts held until its batch drains) peaked at 17.0 GB at 128 (notebook 11, /usr/bin/time -v)
        "defenses": dict(
            n_prompts=50, orders=NORMAL, policies=("streamingllm",), ratios=CPU_MITIGATION_RATIOS, batch_size=64
        ),
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
        "trec_debias": dict(n_prompts=None, ratios=TEN_RATIOS),
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


def _layers(name: str, profile: str, overrides: dict) -> tuple[experiment.Grid, dict, dict]:
    axes = study(name).axes
    base = experiment.profile(profile)
    scale = dict(SCALE.get(profile, {}).get(name, {}))
    benign_side = {**BENIGN_SIDE.get(profile, {}), **scale.pop("benign", {})}
    explicit = {k: v for k, v in overrides.items() if v is not None}
    benign = {**axes, **scale}.get("benign_tokens", base.benign_tokens)
    if "max_new_tokens" in explicit and "benign_tokens" not in explicit and benign:
        explicit["benign_tokens"] = min(benign, explicit["max_new_tokens"])  # an explicit budget caps every query
    return base.with_overrides(**{**axes, **scale, **explicit}), benign_side, explicit


def grid(name: str, profile: str = "ci", **overrides) -> experiment.Grid:
    """The grid of study ``name`` at ``profile`` scale, with the notebook's overrides (None values are ignored)."""
    return _layers(name, profile, overrides)[0]


def parts(name: str, profile: str = "ci", **overrides) -> list[experiment.Grid]:
    """The grids ``run`` computes: the study's grid, or, where the profile gives the benign query a part of its own
    (``BENIGN_SIDE``), the grid without the benign query and the benign query's grid (the profile's benign side, then
    the explicit overrides: the benign side never has more prompts than the study)."""
    chosen, benign_side, explicit = _layers(name, profile, overrides)
    if "benign" not in chosen.queries or not benign_side:
        return [chosen]
    prompts = chosen.n_prompts
    if benign_side.get("n_prompts") is not None and prompts is not None:
        benign_side = {**benign_side, "n_prompts": min(benign_side["n_prompts"], prompts)}
    benign = chosen.with_overrides(**{**benign_side, **explicit, "queries": ("benign",)})
    rest = tuple(q for q in chosen.queries if q != "benign")
    return ([chosen.with_overrides(queries=rest)] if rest else []) + [benign]


def results_folder(profile: str) -> Path:
    """Where a profile's rows live: ``<results>/<profile>/`` (``FAIRKV_RESULTS_DIR`` moves ``<results>``)."""
    return results_dir() / profile


def run(
    name: str, profile: str = "ci", folder: Path | None = None, progress: bool = True, executor="serial", **overrides
):
    """(grid, rows) of study ``name``: compute what the results store (``folder``, default ``results_folder``)
    lacks for each of the study's ``parts`` (with ``executor``, see ``experiment.run``), return the study's rows."""
    folder = folder or results_folder(profile)
    rows = [
        experiment.run(part, folder, progress=progress, executor=executor) for part in parts(name, profile, **overrides)
    ]
    return grid(name, profile, **overrides), pd.concat(rows, ignore_index=True)


def describe(name: str, chosen: experiment.Grid, rows: pd.DataFrame) -> str:
    """What was run, in words, from the rows themselves (printed by each notebook under its parameters), and the
    paper's grid for the same study beside it, so a reader sees which corners this profile cuts."""
    paper = grid(name, "paper")
    return (
        f"study {name!r} (notebook {study(name).notebook}, {study(name).reproduces}) on {chosen.model} "
        f"({chosen.dtype}): {_prompts(rows)} of {chosen.dataset} from #{chosen.start}, orders {list(chosen.orders)}, "
        f"policies {list(chosen.policies)}, variants {list(chosen.variants)}, lambdas {list(chosen.lams)}, "
        f"ratios {list(chosen.ratios)}, queries {list(chosen.queries)}, max_new_tokens "
        f"{chosen.tokens_for('benign')} (benign) / {chosen.tokens_for('attack')} (attack); {len(rows)} rows, "
        f"{rows['cell_id'].nunique()} distinct cells (the progress bar counts cells: the r = 0 cell is shared by every "
        f"policy and variant)\nthe paper's grid for this study: {paper.n_prompts or 'all'} prompts of {paper.dataset}, "
        f"orders {list(paper.orders)}, ratios {list(paper.ratios)}, lambdas {list(paper.lams)}, max_new_tokens "
        f"{paper.tokens_for('benign')} (benign) / {paper.tokens_for('attack')} (attack)"
    )


def _prompts(rows: pd.DataFrame) -> str:
    """How many prompts the rows hold, per query kind when the kinds ran on different prompts or orders."""
    per_query = {
        query: (frame["key"].nunique(), tuple(sorted(frame["order"].unique())))
        for query, frame in rows.groupby("query")
    }
    if len(set(per_query.values())) <= 1:
        return f"{rows['key'].nunique()} prompts"
    return "prompts per query " + ", ".join(f"{q}: {n} ({'/'.join(o)})" for q, (n, o) in per_query.items())
