"""How a study computes its rows; each study is declared in its own module (``fairkv.studies.<name>``: its ``Study``
beside its claims and figures). Here: the profiles (``PROFILES``: model, precision, the profile's defaults), the
scales several studies share, and the machinery every study runs through.

``Study.grid(profile, **overrides)`` layers the configuration: the profile's grid (``PROFILES``), then the study's
axes (``Fields``: which orders, variants, lambdas and query kinds the paper's figures use), then the study's scale at
that profile (``Scale``: prompts, ratios, policies), then the notebook's explicit papermill overrides (None means
"keep"; an explicit ``max_new_tokens`` caps the benign query too). Cells are keyed by content, so studies that overlap
(the base policy at r = 0.5 appears in notebooks 02, 03, 05 and 06) share their rows in the results store and compute
them once.

A profile can run a study's benign (IFEval) query on a smaller part of its grid than the attack (``BENIGN_SIDE``,
refined per study by its ``Scale.benign``): IFEval answers are long, attack answers short, so at the cpu profile the
attack side runs on 100 prompts (both orders where a study reads both) and the benign side on the first 50, normal
order (Figs 2-3, whose claims read accuracy only: all 100, at 512 new tokens; notebooks 03, 05 and 06: all 100).
``Study.run`` computes the two parts as two grids of the same cells (``Study.parts``); explicit overrides apply to both.

Each profile keeps its rows in its own folder, ``<results>/<profile>/`` (``results_folder``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from itertools import product
from pathlib import Path

import pandas as pd

from fairkv.core import data, longbench
from fairkv.core.paths import results_dir
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
        note="Qwen2.5-Coder-1.5B in bfloat16 on 2 CPU cores (the fidelity gate of benchmarks/precision_gate.py "
        "against float32, 20 prompts: uncompressed, attack answers identical on 20 of 20, benign answers on 9 of 20; "
        "at r = 0.5, 72 of 100 attack and 33 of 100 benign answers identical, attack refusals per policy apart by up "
        "to 3 of 20 (SnapKV 11 vs 14); keep rates within 0.021); what each study of "
        "notebooks 01-07 computes is in the table below, read from its declaration (08, 11 and 12 print theirs; the "
        "paper's scale: the paper profile)",
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
# studies on 2 prompts, the fewest that give a claim its interval, so that any notebook computes in minutes
CI_PROMPTS = 2
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


# The benign (IFEval) query's own part of a study's grid, per profile (a study's ``scale[profile]["benign"]`` refines
# it): at the cpu profile an IFEval answer (up to 256 new tokens) costs about six times an attack's, so the accuracy
# side runs on the first 50 of the attack side's 100 prompts, normal order, unless a study's claims read the flipped
# order or a study grows it (Figs 2-3: ``GROWN_BENIGN``; notebooks 03, 05 and 06: ``GROWN_SIDE``).
BENIGN_SIDE: dict[str, dict] = {"cpu": dict(n_prompts=50, orders=NORMAL)}


class StudyError(ValueError):
    """A study declared with an unknown field, or asked for a profile it has no scale at."""


GRID_FIELDS = frozenset(f.name for f in fields(experiment.Grid))
CELL_OVERRIDES = ("model", "n_prompts", "max_new_tokens")  # what a notebook may change of a study's declared cells


class Fields(Mapping):
    """Grid fields a layer of a study's configuration sets (its axes, its scale at a profile), each a field of
    ``experiment.Grid``: an unknown one is an error when the study is declared, not when it runs."""

    def __init__(self, **chosen) -> None:
        unknown = sorted(set(chosen) - GRID_FIELDS)
        if unknown:
            raise StudyError(f"unknown grid field(s) {unknown}: use fields of experiment.Grid")
        self._chosen = {k: tuple(v) if isinstance(v, list) else v for k, v in chosen.items()}

    def __getitem__(self, name: str):
        return self._chosen[name]

    def __iter__(self):
        return iter(self._chosen)

    def __len__(self) -> int:
        return len(self._chosen)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._chosen.items())})"


class Scale(Fields):
    """A study's size at one profile on top of the profile's grid and the study's axes: the grid fields it sets
    (prompts, ratios, policies, ...), the benign (IFEval) query's own part (``benign``: the fields it sets on top of
    the profile's ``BENIGN_SIDE``) and, for LongBench TREC, the word buckets its notebook runs (``buckets``; None:
    every bucket)."""

    def __init__(self, benign: Mapping | None = None, buckets: tuple[str, ...] | None = None, **chosen) -> None:
        super().__init__(**chosen)
        self.benign = Fields(**(benign or {}))
        self.buckets = buckets


@dataclass(frozen=True, eq=False)
class Study:
    """What one part of a notebook computes, declared in its study module (``fairkv.studies.<name>``).

    ``axes``: the grid fields every profile shares (which orders, variants, lambdas and query kinds the paper's figures
    use); None for a study that is a plan of its own, not a grid (the atlas's keep rates, the runtime, the judge).
    ``scale``: per profile, a ``Scale`` (what sets its size on top of the profile's grid) or, for a plan of its own,
    the plan itself (``atlas.Plan``, ``runtime.Plan``, ``judge.Plan``). ``figures``: the figures and tables its
    notebook writes from its rows (``figures/<profile>/``, tables in ``tables/``; the notebook's claims table with its
    first study). ``sweep``: a grid of the paper's sweep (``fairkv.studies.added_cells`` sizes them); ``folder``: where
    its rows live under the profile's results folder ("" the profile's own; the atlas's attacks: "atlas")."""

    name: str
    notebook: str
    reproduces: str
    axes: Fields | None
    scale: Mapping[str, object]
    figures: tuple[str, ...] = ()
    sweep: bool = True
    folder: str = ""

    def __post_init__(self) -> None:
        wrong = [p for p, s in self.scale.items() if (self.axes is not None) != isinstance(s, Scale)]
        if wrong:
            kind = "a Scale" if self.axes is not None else "its plan (a plan of its own)"
            raise StudyError(f"study {self.name!r}: the scale at {', '.join(wrong)} must be {kind}")

    def at(self, profile: str):
        """The study's scale at ``profile`` (an error naming the profiles it has when it has none there)."""
        if profile not in self.scale:
            raise StudyError(
                f"study {self.name!r} has no scale for profile {profile!r}: use one of {', '.join(self.scale)}"
            )
        return self.scale[profile]

    def plan(self, profile: str, **overrides):
        """A plan of its own at ``profile``, with the notebook's overrides (None values keep the profile's)."""
        if self.axes is not None:
            raise StudyError(f"study {self.name!r} is a grid (use grid / run), not a plan of its own")
        return replace(self.at(profile), **_explicit(overrides))

    def results(self, profile: str) -> Path:
        """Where the study's rows live at ``profile``."""
        return results_folder(profile) / self.folder

    def grid(self, profile: str = "ci", **overrides) -> experiment.Grid:
        """The study's grid at ``profile`` scale, with the notebook's overrides (None values are ignored)."""
        return _layers(self, profile, overrides)[0]

    def parts(self, profile: str = "ci", **overrides) -> list[experiment.Grid]:
        """The grids ``run`` computes: the study's grid, or, where the profile gives the benign query a part of its
        own (``BENIGN_SIDE``), the grid without the benign query and the benign query's grid (``_split``)."""
        return _split(*_layers(self, profile, overrides))

    def run(
        self, profile: str = "ci", folder: Path | None = None, progress: bool = True, executor="serial", **overrides
    ):
        """(grid, rows): compute what the results store (``folder``, default ``results``) lacks for each of the
        study's ``parts`` (with ``executor``, see ``experiment.run``), return the study's rows (under
        ``FAIRKV_REDECODED=1`` the cells decoded again read from there: ``experiment.decoded_again``)."""
        folder = folder or self.results(profile)
        layered = _layers(self, profile, overrides)  # once: the grid and its parts
        rows = [
            experiment.decoded_again(part, folder, experiment.run(part, folder, progress=progress, executor=executor))
            for part in _split(*layered)
        ]
        return layered[0], pd.concat(rows, ignore_index=True)

    def run_cells(
        self, profile: str = "ci", folder: Path | None = None, progress: bool = True, executor="serial", **overrides
    ) -> pd.DataFrame:
        """The rows of a study of declared cells (not a grid of the paper's sweep: a control, or the cells that decide
        a claim), as ``run`` computes them; of a notebook's ``overrides`` only its model, prompts and an explicit
        budget apply (None keeps the profile's), never its ratios or policies, which would move the cells off the
        claims' settings."""
        chosen = {k: v for k, v in overrides.items() if k in CELL_OVERRIDES}
        return self.run(profile, folder, progress, executor, **chosen)[1]

    def describe(self, chosen: experiment.Grid, rows: pd.DataFrame) -> str:
        """What was run, in words, from the rows themselves (printed by each notebook under its parameters), and the
        paper's grid for the same study beside it, so a reader sees which corners this profile cuts."""
        paper = self.grid("paper")
        return (
            f"study {self.name!r} (notebook {self.notebook}, {self.reproduces}) on {chosen.model} "
            f"({chosen.dtype}): {_prompts(rows)} of {chosen.dataset} from #{chosen.start}, orders "
            f"{list(chosen.orders)}, policies {list(chosen.policies)}, variants {list(chosen.variants)}, lambdas "
            f"{list(chosen.lams)}, ratios {list(chosen.ratios)}, queries {list(chosen.queries)}, max_new_tokens "
            f"{chosen.tokens_for('benign')} (benign) / {chosen.tokens_for('attack')} (attack); {len(rows)} rows, "
            f"{rows['cell_id'].nunique()} distinct cells (the progress bar counts cells: the r = 0 cell is shared by "
            f"every policy and variant)\nthe paper's grid for this study: {paper.n_prompts or 'all'} prompts of "
            f"{paper.dataset}, orders {list(paper.orders)}, ratios {list(paper.ratios)}, lambdas {list(paper.lams)}, "
            f"max_new_tokens {paper.tokens_for('benign')} (benign) / {paper.tokens_for('attack')} (attack)"
        )


def _explicit(overrides: dict) -> dict:
    """The overrides a notebook sets (None keeps the layer below), lists as tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items() if v is not None}


def _layers(study: Study, at: str, overrides: dict) -> tuple[experiment.Grid, dict, dict]:
    """The profile's grid, then the study's axes, then its scale at the profile, then the explicit overrides (an
    explicit ``max_new_tokens`` caps the benign query too); with the benign side and the explicit overrides."""
    if study.axes is None:
        raise StudyError(f"study {study.name!r} is a plan of its own, not a grid (see its module)")
    base = profile(at)
    sized = study.scale.get(at, Scale()) if study.sweep else study.at(at)
    benign_side = {**BENIGN_SIDE.get(at, {}), **sized.benign}
    explicit = _explicit(overrides)
    benign = {**study.axes, **sized}.get("benign_tokens", base.benign_tokens)
    if "max_new_tokens" in explicit and "benign_tokens" not in explicit and benign:
        explicit["benign_tokens"] = min(benign, explicit["max_new_tokens"])  # an explicit budget caps every query
    return base.with_overrides(**{**study.axes, **sized, **explicit}), benign_side, explicit


def _split(chosen: experiment.Grid, benign_side: dict, explicit: dict) -> list[experiment.Grid]:
    """``chosen`` as its parts: itself, or, where the profile gives the benign query a side of its own, the grid
    without the benign query and the benign query's grid (the profile's benign side, then the explicit overrides: the
    benign side never has more prompts than the study)."""
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


def added_cells(profile: str, sweeps: list[Study]) -> dict[str, tuple[int, Counter] | None]:
    """Per study of ``sweeps`` at ``profile``, in order: (its cells over all its ``parts``, a Counter of the cells it
    adds to a store that holds the studies before it, by (query, max new tokens)); cells are keyed by content, so a
    cell two studies share counts for the first only. None for a study on all of LongBench, whose size is not known
    without its data. Loads no model and reads no store (the sizes behind each notebook's minutes)."""
    seen, added = set(), {}
    for study in sweeps:
        total, fresh = 0, Counter()
        for part in study.parts(profile):
            if part.n_prompts is None and part.dataset in longbench.DATASETS:
                added[study.name] = None
                break
            n = part.n_prompts if part.n_prompts is not None else len(data.load_records(part.dataset)) - part.start
            for key, order, s, q in product(
                range(part.start, part.start + n), part.orders, part.settings(), part.queries
            ):
                total += 1
                cell = (part.model, part.dataset, part.template, key, order, s, q, part.tokens_for(q))
                if cell not in seen:
                    seen.add(cell)
                    fresh[(q, part.tokens_for(q))] += 1
        else:
            added[study.name] = (total, fresh)
    return added


def _prompts(rows: pd.DataFrame) -> str:
    """How many prompts the rows hold, per query kind when the kinds ran on different prompts or orders."""
    per_query = {
        query: (frame["key"].nunique(), tuple(sorted(frame["order"].unique())))
        for query, frame in rows.groupby("query")
    }
    if len(set(per_query.values())) <= 1:
        return f"{rows['key'].nunique()} prompts"
    return "prompts per query " + ", ".join(f"{q}: {n} ({'/'.join(o)})" for q, (n, o) in per_query.items())
