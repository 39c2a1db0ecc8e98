"""The studies' grids checked by what a grid must satisfy, not against a written-out copy: each profile cuts corners
of the paper's grid and never adds one, every decoding study reads r = 0, the whitelist stays within the ratios where
it fits (Section 5.1), every cell a claim declares is run, the benign side runs on its own part, and the counts of
cells follow from a grid's axes (the r = 0 cell shared by every policy and variant)."""

import json
import re
from collections import Counter

import pandas as pd
import pytest

import fairkv.studies
from fairkv.core import data
from fairkv.core.paths import REPO_ROOT, results_dir
from fairkv.report.notebooks import numbered
from fairkv.runs import experiment, redecode, studies
from fairkv.runs.studies import PROFILES, TEN_RATIOS, Fields, Scale, Study, StudyError
from fairkv.studies import atlas, fair, judge, leakage, runtime, study, sweeps, trec

SWEEPS = [(chosen, profile) for chosen in sweeps() for profile in PROFILES]
TUPLES = ("orders", "policies", "variants", "lams", "ratios", "queries")


@pytest.mark.parametrize("chosen, profile", SWEEPS, ids=[f"{c.name}-{p}" for c, p in SWEEPS])
def test_each_grid_is_the_profiles_cut_of_the_papers(chosen, profile):
    """Every grid runs on its profile's precision and model (or the second model its scale names: Fig 10), sets the
    fields its axes and scale declare (the scale over
    the axes, the profile below both), reads r = 0 (every claim's uncompressed reference), keeps the whitelist at
    r <= 0.7 (Section 5.1: beyond it the whitelist no longer fits the budget), and at ci and cpu is a part of the
    paper profile's grid: orders, policies, lambdas (ci checks the pipeline at lambda 0, 0.5, 1), ratios and queries
    among the paper's, its variants the paper's, no more prompts or new tokens."""
    base, grid, paper = PROFILES[profile], chosen.grid(profile), chosen.grid("paper")
    assert grid.dtype == base.dtype and grid.model == chosen.scale[profile].get("model", base.model)
    declared = {**base.__dict__, **chosen.axes, **chosen.scale.get(profile, Scale())}
    assert {name: getattr(grid, name) for name in declared} == declared
    assert grid.ratios[0] == 0.0 and list(grid.ratios) == sorted(grid.ratios)
    if "whitelist" in grid.variants:
        assert max(grid.ratios) <= 0.7
    for name in TUPLES[:3] + TUPLES[4:] + (TUPLES[3:4] if profile != "ci" else ()):  # ci's lambdas: its own points
        assert set(getattr(grid, name)) <= set(getattr(paper, name)), name
    assert grid.variants == paper.variants
    if profile != "paper":
        assert paper.n_prompts is None or grid.n_prompts <= paper.n_prompts
        assert all(grid.tokens_for(q) <= paper.tokens_for(q) for q in grid.queries)


def test_the_paper_profile_runs_the_papers_grid():
    """At the paper profile every study runs the paper's ratios (r = 0-0.9, or 0-0.7 where the whitelist runs), both
    orders where its figures read both, the paper's 1280 / 256 new tokens (LongBench: its own 64), its prompts: all 539
    of sys_ifeval for Figs 2-3, the first 100 of the shuffled set for the leakage studies, all of LongBench."""
    for chosen in sweeps():
        grid = chosen.grid("paper")
        assert grid.ratios == (TEN_RATIOS[:8] if "whitelist" in grid.variants else TEN_RATIOS), chosen.name
        longbench = grid.dataset.startswith("trec")
        assert grid.tokens_for("benign") == (64 if longbench else 1280) and grid.tokens_for("attack") == 256
        expected = {"sys_ifeval": None, "sys_ifeval_shuffled": 100}.get(grid.dataset, 100 if not longbench else None)
        assert grid.n_prompts == expected, chosen.name
    assert study("degradation").grid("paper").dataset == study("policies").grid("paper").dataset == "sys_ifeval"
    assert study("leakage").grid("paper").orders == ("normal", "flipped")


@pytest.mark.parametrize("claim", [c for c in fairkv.studies.declared() if c.cells], ids=lambda c: c.id)
def test_every_cell_a_claim_declares_is_run_at_cpu(claim):
    """A claim's ``Cells`` name cells of its study's grid at the cpu profile (an error otherwise): the ratios, policies
    and queries it reads are run."""
    for cells in claim.cells:
        grids = redecode.grids(cells, "cpu")
        assert grids and all(set(g.ratios) <= set(cells.study.grid("cpu").ratios) for g in grids)


def test_the_cells_of_a_grid_follow_from_its_axes():
    """A grid's distinct cells: prompts x orders x queries x settings, the settings every (policy, variant, lambda,
    ratio) with r = 0 one setting shared by all and fair at lambda = 0 the base; the same count as the ids the store
    keys rows by."""
    for chosen, profile in ((study("debias"), "ci"), (study("fair"), "ci"), (study("keep_rates"), "ci")):
        grid = chosen.grid(profile)
        lams = lambda v: [lam for lam in grid.lams if lam > 0] if v.startswith("fair") else [1.0]
        compressed = [(p, v, lam) for p in grid.policies for v in grid.variants for lam in lams(v)]
        if "fair" in grid.variants and 0.0 in grid.lams and "base" not in grid.variants:
            compressed += [(p, "base", 1.0) for p in grid.policies]  # fair at lambda = 0 is the base policy
        settings = 1 + len(compressed) * len([r for r in grid.ratios if r > 0])
        assert len(grid.settings()) == settings, chosen.name
        records = tuple(data.load_records(grid.dataset)[: grid.n_prompts])
        ids = experiment.Job(grid, records, experiment._checksum(grid.model), {}, {}, {}).cells()
        assert len(set(ids.values())) == grid.n_prompts * len(grid.orders) * len(grid.queries) * settings


def test_the_benign_side_runs_on_its_own_part_of_the_grid():
    """At the cpu profile the IFEval (benign) query runs on the first 50 of the attack side's 100 prompts, normal order,
    or where a study says otherwise (leakage: all 100, StreamingLLM in both orders; the mitigations of notebooks 05-06:
    all 100 at Table 1's ratios; Figs 2-3: all 100 at 512 new tokens); the parts cover the same cells a single grid
    would; explicit overrides reach both parts; ci runs one grid."""
    attack, benign = study("leakage").parts("cpu")
    assert (attack.queries, attack.n_prompts, attack.orders, len(attack.policies)) == (("attack",), 100, BOTH, 5)
    assert (benign.queries, benign.n_prompts, benign.orders, benign.policies) == (("benign",), 100, BOTH, STREAMING)
    assert (benign.ratios, benign.max_new_tokens, benign.benign_tokens) == (attack.ratios, 128, 256)
    attack, benign = study("whitelist").parts("cpu")
    assert (benign.n_prompts, benign.orders, benign.ratios) == (100, ("normal",), (0.0, 0.4, 0.5, 0.6, 0.7))
    assert [(p.n_prompts, p.orders) for p in study("fair_flipped").parts("cpu")] == [(100, ("flipped",))] * 2
    assert study("debias").parts("cpu")[1].n_prompts == 50  # the profile's benign side where no study grows it
    assert [part.queries for part in study("degradation").parts("cpu")] == [("benign",)]
    for name in ("degradation", "policies"):  # Figs 2-3
        assert [(p.n_prompts, p.benign_tokens) for p in study(name).parts("cpu")] == [(100, 512)]
    small = study("leakage").parts("cpu", n_prompts=8, orders=["normal"])
    assert [(part.n_prompts, part.orders) for part in small] == [(8, ("normal",)), (8, ("normal",))]
    assert study("leakage").parts("cpu", n_prompts=20)[1].n_prompts == 20  # never more prompts than the study
    assert study("leakage").parts("ci") == [study("leakage").grid("ci")]
    assert studies.results_folder("cpu") == results_dir() / "cpu"
    assert study("atlas_attacks").results("cpu") == results_dir() / "cpu" / "atlas"


BOTH = ("normal", "flipped")
STREAMING = ("streamingllm",)


def test_fig4s_accuracy_on_every_policy_reads_cells_other_studies_run():
    """Fig 4's accuracy side on all five policies (issue 51 item 5) computes no cell of its own: at the cpu profile its
    cells (normal order, 100 prompts, r = 0 and 0.4-0.7) are the whitelist study's benign base cells, at ci the
    leakage study's; the notebook counts a cell both studies hold once."""
    accuracy = leakage.ACCURACY
    (part,) = accuracy.parts("cpu")
    assert (len(part.policies), part.orders, part.n_prompts, part.queries) == (5, ("normal",), 100, ("benign",))
    assert _cells(accuracy, "cpu") <= _cells(study("whitelist"), "cpu")
    assert _cells(accuracy, "ci") <= _cells(leakage.STUDY, "ci")
    rows = pd.DataFrame({"key": [1, 1], "cell_id": ["a", "a"], "policy": ["h2o"] * 2, "variant": ["base"] * 2})
    assert len(leakage.joined(rows.assign(lam=1.0), rows.assign(lam=1.0, extra=0))) == 1


def test_the_flipped_orders_accuracy_on_every_policy_is_one_set_of_cells():
    """Fig 5's and Fig 14's flipped-order accuracy on all five policies (issue 67 item 5): the leakage study's base
    cells are fair eviction's base cells (computed once, whichever notebook runs first), at the cpu profile on the
    five policies, 100 prompts, r = 0 and ``leakage.FLIPPED_RATIOS``; at ci they are the studies' own (the leakage
    study's; the flipped fair study's), so a notebook computes nothing more (broken on purpose: fair's cpu ratios apart
    from leakage's -> the first check fails)."""
    base = _cells(leakage.FLIPPED_ACCURACY, "cpu")
    (part,) = fair.FLIPPED_ACCURACY.parts("cpu")
    assert (len(part.policies), part.orders, part.n_prompts, part.ratios) == (
        5,
        ("flipped",),
        100,
        leakage.FLIPPED_RATIOS,
    )
    assert base <= _cells(fair.FLIPPED_ACCURACY, "cpu") and len(base) < len(_cells(fair.FLIPPED_ACCURACY, "cpu"))
    assert _cells(leakage.FLIPPED_ACCURACY, "ci") <= _cells(leakage.STUDY, "ci")
    assert _cells(fair.FLIPPED_ACCURACY, "ci") <= _cells(fair.FLIPPED, "ci")


def _cells(chosen, profile: str) -> set[str]:
    return set().union(*(experiment.cell_ids(part) for part in chosen.parts(profile)))


def test_added_cells_count_a_cell_two_studies_share_once():
    """The sizes behind the minutes and scaleout's estimate: at the cpu profile Fig 3's grid holds Fig 2's
    StreamingLLM cells (r = 0, 0.3, 0.5, 0.7, 0.9), so it adds 1600 of its 2100; the same count as the ids the store
    keys rows by."""
    added = fairkv.studies.added_cells("cpu")
    assert added["degradation"] == (1000, Counter({("benign", 512): 1000}))
    assert added["policies"] == (2100, Counter({("benign", 512): 1600}))
    assert added["keep_rates"] == (9200, Counter({("keep", 0): 9200}))
    ids = set()
    for name in ("degradation", "policies"):
        for part in study(name).parts("cpu"):
            records = tuple(data.load_records(part.dataset)[: part.n_prompts])
            ids |= set(experiment.Job(part, records, experiment._checksum(part.model), {}, {}, {}).cells().values())
    assert len(ids) == 2600
    assert fairkv.studies.added_cells("paper")["trec"] is None  # all of LongBench: its size is not known without it


def test_describe_says_what_the_rows_hold_and_the_papers_grid():
    """The printed description is read off the rows (prompts per query kind when they differ, rows and distinct
    cells, which the progress bar counts) and names the paper's grid for the study, never a profile note about
    another grid."""
    row = lambda key, query, policy, cell: dict(key=key, query=query, order="normal", policy=policy, cell_id=cell)
    rows = pd.DataFrame(
        [
            row(1, "attack", "streamingllm", "a"),
            row(1, "attack", "snapkv", "a"),
            row(2, "attack", "snapkv", "b"),
            row(1, "benign", "snapkv", "c"),
        ]
    )
    text = leakage.STUDY.describe(leakage.STUDY.grid("cpu"), rows)
    assert "prompts per query attack: 2 (normal), benign: 1 (normal)" in text
    assert "4 rows, 3 distinct cells" in text and "(bfloat16)" in text
    paper = leakage.STUDY.grid("paper")
    assert text.endswith(
        f"the paper's grid for this study: 100 prompts of sys_ifeval_shuffled, orders {list(paper.orders)}, ratios "
        f"{list(paper.ratios)}, lambdas [1.0], max_new_tokens 1280 (benign) / 256 (attack)"
    )


def test_study_overrides_and_errors():
    """None keeps a layer; an unknown study, profile, grid field or a scale of the wrong kind is an error naming it."""
    assert leakage.STUDY.grid("ci", n_prompts=2, ratios=None).n_prompts == 2
    assert leakage.STUDY.grid("ci", ratios=None).ratios == PROFILES["ci"].ratios
    assert study("keep_rates").grid("ci").queries == ("keep",)
    with pytest.raises(StudyError, match="unknown study 'fig99'"):
        study("fig99")
    with pytest.raises(experiment.GridError, match="unknown profile"):
        leakage.STUDY.grid("laptop")
    with pytest.raises(StudyError, match=r"unknown grid field\(s\) \['ratio'\]"):
        Scale(ratio=(0.5,))
    with pytest.raises(StudyError, match=r"unknown grid field\(s\) \['prompts'\]"):
        Scale(benign=dict(prompts=3))
    with pytest.raises(StudyError, match="scale at cpu must be a Scale"):
        Study("x", "99", "nothing", Fields(), {"cpu": atlas.STUDY.scale["cpu"]})
    with pytest.raises(StudyError, match="study 'atlas_attacks' has no scale for profile 'paper'"):
        study("atlas_attacks").grid("paper")
    with pytest.raises(StudyError, match="plan of its own"):
        study("runtime").grid("ci")
    with pytest.raises(StudyError, match="is a grid"):
        leakage.STUDY.plan("ci")


def test_plans_of_their_own_are_their_plans_at_each_profile():
    """The atlas's, the runtime's and the judge's scales are their plans; the notebook's overrides replace fields
    (None keeps the profile's); a profile a plan has no scale at is an error naming the ones it has."""
    assert atlas.STUDY.plan("cpu").n_prompts == 100 and atlas.STUDY.plan("cpu").ratios == TEN_RATIOS[1:]
    assert atlas.STUDY.plan("ci", ratios=[0.5], n_prompts=None).ratios == (0.5,)
    assert judge.STUDY.plan("cpu") == judge.Plan("qwen2.5-coder-1.5b", ("streamingllm",), 6, "bfloat16")
    assert judge.STUDY.plan("cpu", judge="smollm2-135m", policies=["h2o"]).policies == ("h2o",)
    with pytest.raises(StudyError, match="study 'judge' has no scale for profile 'huge'"):
        judge.STUDY.plan("huge")
    assert runtime.STUDY.plan("cpu").model == PROFILES["cpu"].model  # timed on the profile's model and precision
    assert runtime.STUDY.plan("cpu").dtype == PROFILES["cpu"].dtype
    assert trec.buckets("ci") == ("1k",) and trec.buckets("cpu") is None


def test_every_study_lives_in_its_notebooks_module_and_every_notebook_is_timed():
    """Each study is declared in the module of ``fairkv.studies`` its notebook imports (the one that declares its
    claims and reads its rows with ``paper_vs_us``), names unique; the cli's time of every notebook comes from the
    modules' ``MINUTES``; each figure and table a notebook writes is declared by exactly one of its studies."""
    notebooks = numbered()
    for name, chosen in fairkv.studies.every().items():
        module = fairkv.studies.module(chosen.notebook)
        assert module.CLAIMS and chosen in module.STUDIES, name
        (notebook,) = [nb for nb in notebooks if nb.name.startswith(chosen.notebook)]
        short = fairkv.studies.MODULES[chosen.notebook]
        assert re.search(rf"from fairkv.studies import [^\n]*\b{short}\b", notebook.read_text()), name
    for kind in fairkv.studies.MINUTES_KIND:
        _, minutes = fairkv.studies.expected_minutes(kind, [nb.name[:2] for nb in notebooks])
        assert set(minutes) == {nb.name[:2] for nb in notebooks}, kind
    for notebook in notebooks[1:]:  # 00, the quickstart, runs no study
        code = "".join(
            "".join(c["source"]) for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"
        )
        written = set(re.findall(r'"(\d\d_[a-z0-9_]+)"', code))
        chosen = [s for s in fairkv.studies.every().values() if s.notebook == notebook.name[:2]]
        assert sorted(f for s in chosen for f in s.figures) == sorted(written), notebook.name


def test_the_grid_checks_fail_on_a_grid_that_adds_to_the_papers():
    """The property checks bite: a cpu scale with a ratio the paper does not run, or more prompts than the paper's,
    breaks them."""
    paper = Scale(n_prompts=100, ratios=TEN_RATIOS[:8])
    for cpu in (Scale(ratios=(0.0, 0.5, 0.75)), Scale(n_prompts=200)):
        widened = Study(
            "widened", "99", "nothing", Fields(variants=("base", "whitelist")), {"cpu": cpu, "paper": paper}
        )
        with pytest.raises(AssertionError):
            test_each_grid_is_the_profiles_cut_of_the_papers(widened, "cpu")
    fine = Study(
        "fine",
        "99",
        "nothing",
        Fields(variants=("base", "whitelist")),
        {"cpu": Scale(ratios=(0.0, 0.5)), "paper": paper},
    )
    test_each_grid_is_the_profiles_cut_of_the_papers(fine, "cpu")


def test_every_grid_of_the_settings_table_is_in_the_committed_rows(monkeypatch):
    """The results page's settings table (``fairkv.studies.settings``) shows what notebooks 01-07 run: every cell of
    each grid it lists is in the committed cpu store the notebook reads, so the table cannot show a grid the rows do
    not hold (broken on purpose: the grids read at the paper profile's scale fail). Cells two studies share count for
    both, so this holds the table to the rows, not each study to cells of its own."""
    monkeypatch.setenv("FAIRKV_RESULTS_DIR", str(REPO_ROOT / "results"))  # the committed rows (make test sets another)
    grids = fairkv.studies.paper_grids("cpu")
    assert len(grids) == len(fairkv.studies.settings("cpu")) and {c.notebook for c, _ in grids} == {
        f"{n:02d}" for n in range(1, 8)
    }
    stored = {}
    for chosen, part in grids:
        path = experiment.store_for(part, chosen.results("cpu")).path
        if path not in stored:
            stored[path] = set(experiment.ResultsStore(path).rows())
        missing = experiment.cell_ids(part) - stored[path]
        assert not missing, f"{chosen.name}: {len(missing)} cells of its grid are not in {path.name}"


def test_the_cpu_profiles_precision_caveat_quotes_the_whole_committed_gate():
    """The cpu profile's note (the settings line of every results page) gives the whole fidelity gate as
    ``benchmarks/precision_gate.py`` printed it for the committed rows, not the half that agrees (issue 82): the
    identical answers of each query uncompressed and at r = 0.5, the widest gap in attack refusals per policy and the
    largest keep-rate difference (broken on purpose: benign answers said 19 of 20 -> fails)."""
    gate = (REPO_ROOT / "benchmarks" / "results" / "precision_gate_qwen_bf16.txt").read_text()
    note = PROFILES["cpu"].note
    same = {(r, q): n for r, q, n in re.findall(r"r = ([\d.]+), (\w+): (\d+/\d+)", gate)}
    assert same[("0", "attack")] == "20/20" and same[("0", "benign")] == "9/20"
    assert "attack answers identical on 20 of 20, benign answers on 9 of 20" in note
    assert f"{same[('0.5', 'attack')].replace('/', ' of ')} attack and " in note
    assert f"{same[('0.5', 'benign')].replace('/', ' of ')} benign answers identical" in note
    refusals = {p: (int(a), int(b)) for p, a, b in re.findall(r"(\w+) r = 0\.5: (\d+) / (\d+) of 20", gate)}
    widest = max(refusals, key=lambda p: abs(refusals[p][0] - refusals[p][1]))
    gap = abs(refusals[widest][0] - refusals[widest][1])
    assert widest == "snapkv" and f"up to {gap} of 20 (SnapKV {refusals[widest][0]} vs {refusals[widest][1]})" in note
    largest = float(re.search(r"largest ([\d.]+)", gate).group(1))
    assert f"keep rates within {largest:.3f}" in note


def test_the_family_wise_family_counts_the_claims_tested_on_data(monkeypatch):
    """The Bonferroni family counts the claims tested on data here: every declared claim but the sanity checks, and
    notebook 08's only where LongBench's TREC file is on this machine (else they run on synthetic text, issue 82);
    broken on purpose: the file's absence ignored -> the two counts equal."""
    from fairkv.core import longbench
    from fairkv.report.claims import SANITY

    tested = [claim for claim in fairkv.studies.declared() if claim.status != SANITY]
    monkeypatch.setattr(longbench, "on_disk", lambda: True)
    assert fairkv.studies.family() == len(tested)
    monkeypatch.setattr(longbench, "on_disk", lambda: False)
    assert fairkv.studies.family() == len(tested) - len(trec.CLAIMS) > 0
