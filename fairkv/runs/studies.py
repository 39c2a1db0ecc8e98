"""What each notebook computes: a study names its notebook, the axes its figures need, its scale per profile and the
claims it checks; ``MINUTES`` what each notebook costs. Every scale of the project is here, beside the profiles'
grids (``PROFILES``: model, precision, the profile's defaults).

``grid(study, profile, **overrides)`` layers the configuration: the profile's grid
(``PROFILES``), then the study's axes (which orders, variants, lambdas and query kinds the paper's figures
use), then the study's scale at that profile (``Study.scale``: prompts, ratios, policies), then the notebook's explicit
papermill overrides (None means "keep"; an explicit ``max_new_tokens`` caps the benign query too). Cells are keyed by
content, so studies that overlap (the base policy at r = 0.5 appears in notebooks 02, 03, 05 and 06) share their rows
in the results store and compute them once.

A profile can run a study's benign (IFEval) query on a smaller part of its grid than the attack (``BENIGN_SIDE``,
refined per study by ``scale[profile]["benign"]``): IFEval answers are long, attack answers short, so at the
cpu profile the attack side runs on 100 prompts (both orders where a study reads both) and the benign side on the
first 50, normal order (Figs 2-3, whose claims read accuracy only: all 100, at 512 new tokens; notebooks 03, 05 and
06: all 100).
``run`` computes the two parts as two grids of the same cells (``parts``); explicit overrides apply to both.

Each profile keeps its rows in its own folder, ``<results>/<profile>/`` (``results_folder``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import pandas as pd

from fairkv.core import data, longbench
from fairkv.core.paths import results_dir
from fairkv.core.presses import POLICIES
from fairkv.runs import experiment

TEN_RATIOS = tuple(round(0.1 * i, 1) for i in range(10))  # the paper's figures: r = 0.0 ... 0.9
LAMBDAS = tuple(round(0.2 * i, 1) for i in range(6))  # Appendix G's sweep: lambda = 0, 0.2, ..., 1
BOTH_ORDERS = ("normal", "flipped")
NORMAL = ("normal",)
BASE = ("base",)
TABLE1_RATIOS = (0.4, 0.5, 0.6, 0.7)  # Section 6: Table 1 averages the composite score over these ratios


# The profiles: named grids whose model, precision and defaults every study starts from. ``ci`` (SmolLM2, a few
# prompts, minutes), ``cpu`` (the embedded Qwen2.5-Coder-1.5B on a 2-core CPU in bfloat16), ``paper`` (the paper's
# scale, a Hugging Face model on a GPU).
PROFILES: dict[str, experiment.Grid] = {
    "ci": experiment.Grid(
        n_prompts=4,
        ratios=(0.0, 0.3, 0.5, 0.7),
        max_new_tokens=32,
        note="SmolLM2-135M, 4 prompts, 4 ratios, 32 new tokens: checks the pipeline in minutes, not the science",
    ),
    "cpu": experiment.Grid(
        model="qwen2.5-coder-1.5b",
        n_prompts=100,
        orders=("normal", "flipped"),
        ratios=(0.0, 0.3, 0.5, 0.7, 0.9),
        max_new_tokens=128,
        benign_tokens=256,
        variants=("base", "whitelist", "fair"),
        dtype="bfloat16",
        batch_size=128,
        note="Qwen2.5-Coder-1.5B in bfloat16 on 2 CPU cores (the fidelity gate of benchmarks/precision_gate.py: the same "
        "refusals as float32): the attack side on 100 prompts (the paper's leakage set; both orders in notebooks 03-04, "
        "the normal order in 05-06 but for Fig 14's flipped one); the benign "
        "(IFEval) side on the first 50 of them, normal order (flipped only where a claim reads it), 256 new tokens "
        "(paper: 1280, so instructions that need longer answers can fail at every ratio; Figs 2-3, which read accuracy "
        "only: all 100 prompts at 512 new tokens; Figs 4-6, 8-9, 14 and Table 1: all 100); 128 new tokens for the "
        "attack (paper: 256); ratios 0, 0.3, 0.5, 0.7, 0.9 (paper: 0-0.9 by 0.1), the mitigations at 0-0.7 with the "
        "ratios their claims read (0.4, 0.6)",
    ),
    "paper": experiment.Grid(
        model="meta-llama/Llama-3.1-8B-Instruct",
        n_prompts=None,
        orders=("normal", "flipped"),
        variants=("base", "whitelist", "fair"),
        ratios=tuple(round(0.1 * i, 1) for i in range(10)),
        max_new_tokens=256,
        benign_tokens=1280,
        dtype="bfloat16",
        batch_size=16,
        note="the paper's scale: all 539 prompts, both orders, 10 ratios, 1280 / 256 new tokens, bfloat16; needs a GPU",
    ),
}


def profile(name: str, **overrides) -> experiment.Grid:
    """A named profile, with explicit overrides (the layer notebooks and the CLI use)."""
    if name not in PROFILES:
        raise experiment.GridError(f"unknown profile {name!r}: use one of {', '.join(PROFILES)}")
    return PROFILES[name].with_overrides(**overrides)


# the ratios up to where the whitelist still fits, with those the claims are read at (fairkv.studies: Figs 8 at 0.6,
# 9 at 0.7, Table 1 over 0.4-0.7, peaks at 0.5)
CPU_MITIGATION_RATIOS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7)
CI_MITIGATION_RATIOS = (0.0, 0.4, 0.5, 0.6, 0.7)
# ci checks the pipeline, not the science (pytest checks SmolLM2's keep rates and Qwen's refusals): the decoding
# studies on 2 prompts, the fewest that give a claim its interval, so that nbval re-executes every notebook in minutes
CI_PROMPTS = 2
ATLAS_RATIOS = TEN_RATIOS[1:]  # r = 0.1 ... 0.9; r = 0 keeps everything for every press
ATTACK_RATIOS = (0.0, 0.3, 0.5, 0.7)  # the paper's ratios for Figs 8-9
# Figs 2-3 (notebooks 01-02) read accuracy only: at the cpu profile on the attack side's 100 prompts and 512 new
# tokens, not the benign side's 50 and 256 (issue 37: the engine's gain spent on the claims undecided for want of
# prompts)
GROWN_BENIGN = dict(n_prompts=100, benign_tokens=512, benign=dict(n_prompts=100))
# the benign side of the claims of notebooks 03, 05 and 06 (Figs 4-6, 8-9, 14 and Table 1) on all 100 of the attack
# side's prompts, at the side's 256 new tokens (issue 37)
GROWN_SIDE = dict(n_prompts=100)
# the cpu scale of notebooks 05-06 (see the whitelist study): one scale, so the fair study's grid holds the whitelist
# study's and one run computes both
CPU_MITIGATIONS = dict(
    ratios=CPU_MITIGATION_RATIOS, orders=NORMAL, benign=dict(ratios=(0.0, *TABLE1_RATIOS), **GROWN_SIDE)
)


@dataclass(frozen=True)
class Study:
    """What one part of a notebook computes.

    ``axes``: the grid fields every profile shares (which orders, variants, lambdas and query kinds the paper's figures
    use). ``scale``: per profile, what sets its size on top of the profile's grid (prompts, ratios, policies; "benign":
    the benign query's own part, ``BENIGN_SIDE``) or, for the studies that are not a grid of the sweep (the atlas's
    keep rates, the runtime, the judge), the fields of their plan. ``claims``: the module of
    ``fairkv.studies`` that declares the claims its rows are read into; ``figures``: the figures and tables its
    notebook writes from its rows (``figures/<profile>/``, tables in ``tables/``; the notebook's claims table with its
    first study). ``sweep``: a grid of the paper's sweep
    (``run``); the others have a scale only at the profiles listed."""

    notebook: str
    reproduces: str
    axes: dict = field(default_factory=dict)
    scale: dict[str, dict] = field(default_factory=dict)
    claims: str = ""
    figures: tuple[str, ...] = ()
    sweep: bool = True


STUDIES: dict[str, Study] = {
    "degradation": Study(
        "01",
        "Pitfall 1: Fig 2a-b",
        dict(policies=("streamingllm",), variants=BASE, queries=("benign",), orders=NORMAL),
        {
            "ci": dict(n_prompts=CI_PROMPTS),
            "cpu": dict(ratios=TEN_RATIOS, **GROWN_BENIGN),
            # the paper scores IFEval on all 539 records of sys_ifeval (leakage on the first 100 of the shuffled set)
            "paper": dict(dataset="sys_ifeval", n_prompts=None),
        },
        "degradation",
        figures=("01_fig2a_class_accuracy", "01_fig2b_spearman", "01_benign_refusals", "01_paper_vs_us"),
    ),
    "policies": Study(
        "02",
        "Pitfall 2: Fig 3",
        dict(variants=BASE, queries=("benign",), orders=NORMAL),
        {
            "ci": dict(n_prompts=CI_PROMPTS),
            "cpu": dict(GROWN_BENIGN),
            "paper": dict(dataset="sys_ifeval", n_prompts=None),
        },
        "policies",
        figures=("02_fig3_accuracy", "02_fig3_spearman", "02_benign_refusals", "02_paper_vs_us"),
    ),
    "leakage": Study(
        "03",
        "Pitfalls 3-4: Figs 4, 5, 6",
        dict(orders=BOTH_ORDERS, variants=BASE),
        {
            "ci": dict(n_prompts=CI_PROMPTS),
            "cpu": dict(benign=dict(orders=BOTH_ORDERS, policies=("streamingllm",), **GROWN_SIDE)),
            "paper": dict(n_prompts=100),
        },
        "leakage",
        figures=(
            "03_fig4_leakage",
            "03_fig4_compliance",
            "03_fig4_normal",
            "03_fig4_capped",
            "03_fig4_benign_refusals",
            "03_fig5_accuracy",
            "03_fig5_flipped",
            "03_fig6_defense",
            "03_fig6_defense_raw",
            "03_outcomes",
            "03_paper_vs_us",
        ),
    ),
    # keep rates need no decoding, so even the small profiles afford many prompts and all ten ratios
    "keep_rates": Study(
        "04",
        "Pitfall 5: Figs 7, 10",
        dict(orders=BOTH_ORDERS, variants=BASE, queries=("keep",)),
        {
            "ci": dict(n_prompts=8, ratios=TEN_RATIOS),
            "cpu": dict(ratios=TEN_RATIOS),
            "paper": dict(n_prompts=100),
        },
        "keep_rates",
        figures=("04_fig7_keep_rates", "04_paper_vs_us"),
    ),
    # Figs 8-9 and Table 1 are normal order at the cpu profile (Fig 14, flipped, is fair_flipped's); accuracy at
    # Table 1's ratios; at the paper's scale the whitelist no longer fits the budget beyond r = 0.7 (Section 5.1)
    "whitelist": Study(
        "05",
        "Whitelisting: Figs 8, 13 (left)",
        dict(variants=("base", "whitelist")),
        {
            "ci": dict(n_prompts=CI_PROMPTS, ratios=CI_MITIGATION_RATIOS),
            "cpu": dict(CPU_MITIGATIONS),
            "paper": dict(n_prompts=100, ratios=TEN_RATIOS[:8]),
        },
        "whitelist",
        figures=(
            "05_fig8_whitelist",
            "05_fig8_leakage",
            "05_fig13_defense",
            "05_outcomes",
            "05_mechanism",
            "05_paper_vs_us",
        ),
    ),
    "fair": Study(
        "06",
        "Fair eviction: Figs 9, 13 (right), Table 1",
        dict(variants=("base", "whitelist", "fair")),
        {
            "ci": dict(n_prompts=CI_PROMPTS, ratios=CI_MITIGATION_RATIOS),
            "cpu": dict(CPU_MITIGATIONS),
            "paper": dict(n_prompts=100, ratios=TEN_RATIOS[:8]),
        },
        "fair",
        figures=(
            "06_fig9_fair",
            "06_fig13_defense",
            "06_outcomes_normal",
            "06_outcomes",
            "06_mechanism",
            "06_table1",
            "06_paper_vs_us",
        ),
    ),
    "fair_flipped": Study(
        "06",
        "Fair eviction, flipped order: Fig 14",
        dict(orders=("flipped",), variants=("base", "fair")),
        {
            "ci": dict(n_prompts=CI_PROMPTS, policies=("streamingllm",)),  # the policy its claim reads
            "cpu": dict(
                ratios=CPU_MITIGATION_RATIOS,
                benign=dict(orders=("flipped",), policies=("streamingllm",), **GROWN_SIDE),
            ),
            "paper": dict(n_prompts=100),
        },
        "fair",
        figures=("06_fig14_flipped", "06_outcomes_flipped"),
    ),
    # Appendix G-H, Figs 15-18; at the cpu profile StreamingLLM, lambda 0-1 by 0.2, both orders, accuracy and leakage
    # at every point
    "debias": Study(
        "07",
        "Debiasing: Figs 15-16, Table 3",
        dict(variants=("fair",), lams=LAMBDAS),
        {
            "ci": dict(n_prompts=CI_PROMPTS, policies=("streamingllm",), lams=(0.0, 0.5, 1.0)),
            "cpu": dict(policies=("streamingllm",), ratios=CPU_MITIGATION_RATIOS, benign=dict(orders=BOTH_ORDERS)),
            "paper": dict(n_prompts=100),
        },
        "debias",
        figures=("07_fig15_lambda_plane", "07_table3_pareto", "07_paper_vs_us"),
    ),
    # one LongBench TREC word bucket per run (dataset trec_1k / trec_2k / trec_3k, see fairkv.core.longbench;
    # "buckets": the profile's, all three where absent); LongBench generates at most 64 tokens for TREC. ci checks
    # the pipeline on the shortest bucket only: eager attention (which H2O needs, and every policy shares so that
    # r = 0 is one cell) prefills a 3-4k-word prompt in about a minute on SmolLM2 and 2 cores. At the cpu profile
    # Qwen's eager prefill of a 1-2k-word prompt and 2k-token caches dominate: two policies, 50 prompts
    "trec": Study(
        "08",
        "LongBench TREC: Figs 19-22",
        dict(dataset="trec_1k", variants=("base", "fair"), benign_tokens=64),
        {
            "ci": dict(
                n_prompts=1, policies=("streamingllm", "snapkv"), ratios=(0.0, 0.5), benign_tokens=16, buckets=("1k",)
            ),
            "cpu": dict(n_prompts=50, orders=NORMAL, policies=("streamingllm", "snapkv"), ratios=CPU_MITIGATION_RATIOS),
            "paper": dict(n_prompts=None, ratios=TEN_RATIOS),
        },
        "trec",
        figures=("08_trec_means", "08_synthetic_pipeline_check", "08_paper_vs_us"),
    ),
    # Appendices G-H on LongBench TREC (the first bucket): SnapKV and TOVA, lambda 0-1
    "trec_debias": Study(
        "08",
        "LongBench TREC debiasing: Figs 17-18, Table 4",
        dict(dataset="trec_1k", variants=("fair",), lams=LAMBDAS, policies=("snapkv", "tova"), benign_tokens=64),
        {
            "ci": dict(
                n_prompts=1, policies=("snapkv",), ratios=(0.0, 0.5, 0.7), lams=(0.0, 0.5, 1.0), benign_tokens=16
            ),
            "cpu": dict(n_prompts=50, orders=NORMAL, ratios=CPU_MITIGATION_RATIOS),
            "paper": dict(n_prompts=None, ratios=TEN_RATIOS),
        },
        "trec",
        figures=("08_fig17_trec_lambda_plane", "08_table4_pareto"),
    ),
    # Appendix K: the runtime plan's fields (``fairkv.runs.runtime.Plan``); benchmarks/runtime.py measures all five
    # policies at the cpu profile
    "runtime": Study(
        "09",
        "Runtime: Figs 23-24",
        scale={
            "ci": dict(
                model="smollm2-135m",
                ratios=(0.5,),
                repeats=2,
                note="SmolLM2, H2O at r = 0.5, 1 prompt, 2 repeats of 16 tokens: checks the pipeline",
            ),
            "cpu": dict(
                model="qwen2.5-coder-1.5b",
                repeats=10,
                dtype="bfloat16",
                note="Qwen2.5-Coder-1.5B in bfloat16 (the cpu "
                "profile's precision) on 2 CPU cores, H2O (the paper's figure), 1 prompt, 10 repeats of 16 new tokens "
                "(the fewest a bootstrap over repeats decides on; paper: 256, one RTX A6000); benchmarks/runtime.py "
                "measures all five policies",
            ),
            "paper": dict(
                model="meta-llama/Llama-3.1-8B-Instruct",
                policies=tuple(POLICIES),
                ratios=TEN_RATIOS[1:],
                n_prompts=5,
                repeats=10,
                new_tokens=256,
                dtype="bfloat16",
                note="the paper's setting on a GPU: bfloat16, 256 new tokens, r = 0.1-0.9",
            ),
        },
        claims="runtime",
        figures=("09_fig23_runtime", "09_runtime", "09_paper_vs_us"),
        sweep=False,
    ),
    # Appendix L: the judge, the policies whose attack responses it rates (the rows come from the "fair" study: base,
    # whitelist and fair eviction), the directives of its calibration set (six labelled responses each) and its
    # precision (bfloat16 where the profile's model runs in it; a stored score names its judge's precision). On 2 CPU
    # cores the judge reads about 80 prompt tokens/s (Qwen, fp32), so the cpu profile judges StreamingLLM, the paper's
    # headline policy, and ci uses SmolLM2 on two directives to check the pipeline.
    "judge": Study(
        "10",
        "LLM judge: Figs 25-26",
        scale={
            "ci": dict(judge="smollm2-135m", policies=("streamingllm",), calibration_prompts=2, dtype="float32"),
            "cpu": dict(
                judge="qwen2.5-coder-1.5b", policies=("streamingllm",), calibration_prompts=6, dtype="bfloat16"
            ),
            "paper": dict(
                judge="qwen2.5-coder-1.5b",
                policies=("streamingllm", "h2o", "snapkv", "tova", "knorm"),
                calibration_prompts=6,
                dtype="bfloat16",
            ),
        },
        claims="judge",
        figures=(
            "10_fig25_judge_leak_rate",
            "10_fig26_judge_severity",
            "10_judge_agreement",
            "10_judge_calibration",
            "10_paper_vs_us",
        ),
        sweep=False,
    ),
    # notebook 11 at the cpu profile: StreamingLLM (the paper's headline policy), 10 prompts per span count, 2 per
    # attack category, 50 per defense template; at ci its fewest points, short answers: the attack study's cost is
    # its 30 RaccoonBench attacks over every cache, read in batches padded to their longest attack (one has 412
    # tokens), so 8 at a time
    # one span count per run (dataset spans_2 / 3 / 5 / 8, see fairkv.core.multispan); compliance needs the benign
    # query only
    "spans": Study(
        "11",
        "beyond the paper: N instruction spans",
        dict(dataset="spans_2", variants=("base", "fair"), queries=("benign",)),
        {
            "ci": dict(n_prompts=CI_PROMPTS, policies=("streamingllm",), ratios=(0.0, 0.5, 0.7), benign_tokens=32),
            "cpu": dict(
                n_prompts=10, orders=NORMAL, policies=("streamingllm",), ratios=(0.0, 0.5, 0.7), benign_tokens=128
            ),
            "paper": dict(n_prompts=100, ratios=TEN_RATIOS, benign_tokens=1280),
        },
        "beyond",
        figures=("11_spans", "11_spans_budget", "11_spans_starvation", "11_paper_vs_us"),
    ),
    # every RaccoonBench attack category (the notebook passes the attack query kinds, data.attack_queries)
    "attacks": Study(
        "11",
        "beyond the paper: many attacks",
        dict(variants=("base", "whitelist", "fair")),
        {
            "ci": dict(n_prompts=1, policies=("streamingllm",), ratios=(0.0, 0.5), max_new_tokens=16, batch_size=8),
            "cpu": dict(n_prompts=2, orders=NORMAL, policies=("streamingllm",), ratios=(0.0, 0.5)),
            "paper": dict(n_prompts=100, ratios=TEN_RATIOS[:8]),
        },
        "beyond",
        figures=("11_attacks", "11_attacks_leakage", "11_attacks_refusal"),
    ),
    # one defense template per run (the notebook passes template=...); the paper's attack. At the cpu profile 64
    # answers at once, not the profile's 128: the longest template's caches peaked at 17.0 GB at 128 before the
    # Decoder (issue 37), which holds only the waiting and running answers' caches; with it, 12.1 GB at 128 and
    # 11.2 GB at 64, and 128 no faster (10 min 19 s against 9 min 58 s for the template's 550 rows;
    # benchmarks/results/defenses_batch_cpu.txt)
    "defenses": Study(
        "11",
        "beyond the paper: defense strength",
        dict(variants=("base", "fair"), queries=("attack",)),
        {
            "ci": dict(n_prompts=1, policies=("streamingllm",), ratios=(0.0, 0.3, 0.5, 0.7)),
            "cpu": dict(
                n_prompts=50, orders=NORMAL, policies=("streamingllm",), ratios=CPU_MITIGATION_RATIOS, batch_size=64
            ),
            "paper": dict(n_prompts=100, ratios=TEN_RATIOS),
        },
        "beyond",
        figures=("11_defense_strength", "11_defense_critical_ratio"),
    ),
    # the atlas's keep rates (``fairkv.runs.atlas.Plan``'s fields): no decoding, so the cpu profile runs the paper's
    # 100 prompts
    "atlas": Study(
        "12",
        "beyond the paper: the press atlas's keep rates",
        scale={"ci": dict(n_prompts=2, ratios=(0.3, 0.5)), "cpu": dict(n_prompts=100, ratios=ATLAS_RATIOS)},
        claims="atlas",
        figures=(
            "12_atlas_bias",
            "12_atlas_keep_rates",
            "12_atlas_patterns",
            "12_press_failures",
            "12_presses_not_run",
            "12_paper_vs_us",
        ),
        sweep=False,
    ),
    # the attack side of the most biased presses, with whitelist and fair eviction (``atlas.attack_grid``)
    "atlas_attacks": Study(
        "12",
        "beyond the paper: the most biased presses under the attack",
        dict(variants=("base", "whitelist", "fair"), queries=("attack",), orders=NORMAL),
        {"ci": dict(n_prompts=2, ratios=(0.0, 0.5)), "cpu": dict(n_prompts=100, ratios=ATTACK_RATIOS)},
        "atlas",
        figures=("12_atlas_attacks",),
        sweep=False,
    ),
}
SWEEPS = tuple(name for name, chosen in STUDIES.items() if chosen.sweep)  # the paper's studies, run by ``run``

# defense templates of RaccoonBench with all their text before the directive, from weak to strong (12, 56 and 335
# words); templates with text on both sides of the directive have no single defense span. The refusal rate counts the
# standard template's scripted reply and its variants (metrics.is_refusal); a reply another template scripts (the
# GptInfinite template's "ACCESS DENIED") counts as "other", so read its leakage beside its refusal rate
DEFENSE_LADDER = ("short_defense_1", "standard_defense", "long_defense_GptInfinite")

# The benign (IFEval) query's own part of a study's grid, per profile (a study's ``scale[profile]["benign"]`` refines
# it): at the cpu profile an IFEval answer (up to 256 new tokens) costs about six times an attack's, so the accuracy
# side runs on the first 50 of the attack side's 100 prompts, normal order, unless a study's claims read the flipped
# order or a study grows it (Figs 2-3: ``GROWN_BENIGN``; notebooks 03, 05 and 06: ``GROWN_SIDE``).
BENIGN_SIDE: dict[str, dict] = {"cpu": dict(n_prompts=50, orders=NORMAL)}

# Wall minutes of each notebook on this repository's 2-core machine from an empty results store. ci: measured per
# notebook (executed one after another with the running decode batch). cpu: 00-07 estimated by
# benchmarks/cpu_estimate.py (benchmarks/results/cpu_estimate.txt): the rows each notebook adds (``added_cells``:
# cells an earlier notebook computed are not counted again) times the costs per row measured with the running batch
# of ``generation.Decoder`` (issue 37) on 12-03, a day this machine's matmul limit was 126.7 tok/s (267.8 on 11-30):
# an IFEval answer of up to 512 new tokens 3.76 s (Fig 3's 1600), of up to 256 tokens 2.37 s (notebook 03's 500), an
# attack answer 0.444 s (420 on 10 prompts); a keep-rate row 0.033 s (no decoding); 08 and 10 from their earlier
# measurements scaled to their prompts; 09, 11 and 12 (the atlas's keep rates from an empty store, then the attack side
# of its presses) measured before the running batch. Rows already in the store cost nothing.
MINUTES: dict[str, tuple[str, dict[str, float]]] = {
    "ci": (
        "measured",
        {
            "00": 0.8,
            "01": 0.4,
            "02": 0.6,
            "03": 0.8,
            "04": 0.3,
            "05": 0.8,
            "06": 1.0,
            "07": 0.4,
            "08": 0.5,
            "09": 0.7,
            "10": 0.8,
            "11": 3.0,
            "12": 0.6,
        },
    ),
    "cpu": (
        "estimated",
        {
            "00": 1,
            "01": 63,
            "02": 100,
            "03": 71,
            "04": 5,
            "05": 176,
            "06": 151,
            "07": 111,
            "08": 10,
            "09": 5,
            "10": 35,
            "11": 18,
            "12": 83,
        },
    ),
}


class StudyError(ValueError):
    """An unknown study."""


def study(name: str) -> Study:
    if name not in STUDIES:
        raise StudyError(f"unknown study {name!r}: use one of {', '.join(STUDIES)}")
    return STUDIES[name]


def scale(name: str, profile: str) -> dict:
    """Study ``name``'s scale at ``profile`` (an error naming the profiles it has when it has none there)."""
    chosen = study(name)
    if profile not in chosen.scale:
        raise StudyError(f"study {name!r} has no scale for profile {profile!r}: use one of {', '.join(chosen.scale)}")
    return dict(chosen.scale[profile])


def expected_minutes(profile: str, notebooks: list[str]) -> tuple[str, dict[str, float]] | None:
    """("measured" / "estimated", minutes per notebook number) of ``notebooks`` at ``profile`` (``MINUTES``), None
    for a profile not timed here."""
    if profile not in MINUTES:
        return None
    kind, minutes = MINUTES[profile]
    return kind, {n: minutes[n] for n in notebooks if n in minutes}


def buckets(profile: str) -> tuple[str, ...] | None:
    """The LongBench TREC word buckets notebook 08 runs at ``profile`` (None: every bucket)."""
    return study("trec").scale.get(profile, {}).get("buckets")


def _layers(name: str, at: str, overrides: dict) -> tuple[experiment.Grid, dict, dict]:
    chosen = study(name)
    if not chosen.axes:
        raise StudyError(f"study {name!r} is a plan of its own, not a grid (see its module)")
    axes = chosen.axes
    base = profile(at)
    sized = dict(chosen.scale.get(at, {})) if chosen.sweep else scale(name, at)
    sized.pop("buckets", None)  # which datasets to run (``buckets``), not a grid field
    benign_side = {**BENIGN_SIDE.get(at, {}), **sized.pop("benign", {})}
    explicit = {k: v for k, v in overrides.items() if v is not None}
    benign = {**axes, **sized}.get("benign_tokens", base.benign_tokens)
    if "max_new_tokens" in explicit and "benign_tokens" not in explicit and benign:
        explicit["benign_tokens"] = min(benign, explicit["max_new_tokens"])  # an explicit budget caps every query
    return base.with_overrides(**{**axes, **sized, **explicit}), benign_side, explicit


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
    lacks for each of the study's ``parts`` (with ``executor``, see ``experiment.run``), return the study's rows
    (under ``FAIRKV_REDECODED=1`` the cells decoded again read from there: ``experiment.decoded_again``)."""
    folder = folder or results_folder(profile)
    rows = [
        experiment.decoded_again(part, folder, experiment.run(part, folder, progress=progress, executor=executor))
        for part in parts(name, profile, **overrides)
    ]
    return grid(name, profile, **overrides), pd.concat(rows, ignore_index=True)


def added_cells(profile: str) -> dict[str, tuple[int, Counter] | None]:
    """Per sweep study at ``profile``, in order: (its cells over all its ``parts``, a Counter of the cells it adds to a
    store that holds the studies before it, by (query, max new tokens)); cells are keyed by content, so a cell two
    studies share counts for the first only. None for a study on all of LongBench, whose size is not known without
    its data. Loads no model and reads no store (the sizes behind ``MINUTES``)."""
    seen, added = set(), {}
    for name in SWEEPS:
        total, fresh = 0, Counter()
        for part in parts(name, profile):
            if part.n_prompts is None and part.dataset in longbench.DATASETS:
                added[name] = None
                break
            n = part.n_prompts if part.n_prompts is not None else len(data.load_records(part.dataset)) - part.start
            for key, order, s, q in product(
                range(part.start, part.start + n), part.orders, part.settings(), part.queries
            ):
                total += 1
                cell = (part.dataset, part.template, key, order, s, q, part.tokens_for(q))
                if cell not in seen:
                    seen.add(cell)
                    fresh[(q, part.tokens_for(q))] += 1
        else:
            added[name] = (total, fresh)
    return added


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
