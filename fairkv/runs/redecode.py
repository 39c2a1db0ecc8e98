"""The cells of a claim decoded again under another batch plan (issue 50, item 8).

In bfloat16 an answer depends on which rows share its running batch (``benchmarks/batch_dependence.py``), so a claim
whose interval ends near its threshold may hang on how its cells happened to be batched (``fairkv.report.noise``). A
claim declares the cells its deciding parts read (``Cells``: a study and the settings of it); ``run`` decodes them
again with a batch of ``BATCH_SIZE`` (the sweeps use 128: other neighbours, other shapes) into the store's
``redecoded/`` folder (``fairkv.core.paths.REDECODED_FOLDER``), resumably, rows written as they land. Under
``FAIRKV_REDECODED=1`` (``fairkv reproduce --redecoded``) every row of such a cell is read from there instead, so the
same notebooks and study modules recompute the claim; ``coverage`` says how many of a claim's cells are there.

Its rows carry the code's fingerprint as every row does: a change that restamps the studies' stores restamps these
too (``fairkv restamp results/cpu/redecoded/*.jsonl results/cpu/atlas/redecoded/*.jsonl``), or the redecoded run
refuses them (``experiment.decoded_again``).

On an Intel CPU with AMX run it with ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``, the kernels the committed rows were
computed with (``fairkv verify``): otherwise a difference mixes kernels and batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from fairkv.core.paths import REDECODED_FOLDER
from fairkv.runs import experiment, studies

BATCH_SIZE = 64


class RedecodeError(ValueError):
    """Cells that name no cell of their study."""


@dataclass(frozen=True)
class Cells:
    """Cells of a study (a ``fairkv.runs.studies.Study``) a claim reads: ``policies``, ``variants`` and ``orders``
    replace the study's (an empty tuple keeps them); ``ratios`` and ``queries`` keep those of the study's parts that
    the part has; ``datasets`` runs the study once per dataset (the spans studies); ``run_queries``, for a study whose
    notebook passes its queries (the attack categories), gives them (read when the cells are, never at import)."""

    study: studies.Study
    policies: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()
    orders: tuple[str, ...] = ()
    ratios: tuple[float, ...] = ()
    queries: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    run_queries: Callable[[], tuple[str, ...]] | None = None

    def __str__(self) -> str:
        said = [
            f"{f.name} {', '.join(map(str, getattr(self, f.name)))}"
            for f in fields(self)[1:]
            if getattr(self, f.name) and f.name != "run_queries"
        ]
        said += [f"queries run: {len(self.run_queries())}"] if self.run_queries else []
        return self.study.name + (f" ({'; '.join(said)})" if said else "")


def folder(cells: Cells, profile: str) -> Path:
    """The store folder the study's rows live in (``Study.results``: the atlas's attacks have their own)."""
    return cells.study.results(profile)


def grids(cells: Cells, profile: str) -> list[experiment.Grid]:
    """The grids of ``cells`` at ``profile``, with the other batch plan."""
    replaced = {name: getattr(cells, name) for name in ("policies", "variants", "orders") if getattr(cells, name)}
    out = []
    for dataset in cells.datasets or (None,):
        run = ({"dataset": dataset} if dataset else {}) | (
            {"queries": cells.run_queries()} if cells.run_queries else {}
        )
        for part in cells.study.parts(profile, **run):
            kept = {
                name: tuple(v for v in getattr(part, name) if v in getattr(cells, name))
                for name in ("ratios", "queries")
                if getattr(cells, name)
            }
            if all(kept.values()):
                out.append(part.with_overrides(**replaced, **kept, batch_size=BATCH_SIZE))
    ran = {r for grid in out for r in grid.ratios}
    if not out or set(cells.ratios) - ran:
        raise RedecodeError(f"{cells} names no cell of the study at {profile} (ratios run: {sorted(ran)})")
    return out


def coverage(cells: tuple[Cells, ...], profile: str) -> tuple[int, int]:
    """(how many of the cells are decoded again, how many there are)."""
    done = total = 0
    for each in cells:
        for grid in grids(each, profile):
            ids = experiment.cell_ids(grid)
            again = experiment.store_for(grid, folder(each, profile) / REDECODED_FOLDER).rows()
            done, total = done + len(ids & again.keys()), total + len(ids)
    return done, total


def run(cells: tuple[Cells, ...], profile: str, progress: bool = True) -> None:
    """Decode ``cells`` again (what the redecoded stores lack), each grid in turn."""
    for each in cells:
        for grid in grids(each, profile):
            experiment.run(grid, folder(each, profile) / REDECODED_FOLDER, progress=progress)
