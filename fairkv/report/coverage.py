"""Which of the paper's figures and tables (Figs 2-26, Tables 1-4; arXiv 2510.00231) fairkv produces, from what data,
and why not where it does not.

Each study module declares the paper's items its notebook makes (``ITEMS``: what each shows and our files for it;
``fairkv.studies.catalogue`` gathers them into a ``Catalogue``, with the items not in our checklist).
``Catalogue.table`` reads a figures folder (``figures/<profile>/``) and says per item on which model it was produced,
and whether from real data, as a pipeline check only (notebook 08 on fairkv's synthetic TREC file when LongBench's
data is absent: its files in the synthetic folder beside, ``fairkv.core.paths.synthetic_dir``), not produced (and
why), or is missing from the folder (its notebook has not run). The results page's coverage table and the claims'
figure links come from here (``fairkv.report.readme``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from fairkv.core.paths import synthetic_dir
from fairkv.runs import studies

REAL = "produced from real data"
PIPELINE = "pipeline check only"
NOT_PRODUCED = "not produced"
MISSING = "missing"


class CoverageError(ValueError):
    """A figure name that no item of the paper declares, a paper item named outside the paper's scheme, or one declared
    twice as showing different things."""


@dataclass(frozen=True)
class Item:
    """One figure or table of the paper, declared by the study module whose notebook makes ours (its ``ITEMS``;
    ``fairkv.studies.catalogue`` fills in ``notebook``): ``files`` are our figure or table names (globs) in the figures
    folder (or, made from synthetic data, in its synthetic folder), ``note`` how ours differs from the paper's or,
    without files, why it is not produced; ``synthetic``: what its files are where they come from synthetic data."""

    item: str
    shows: str
    files: tuple[str, ...] = ()
    note: str = ""
    synthetic: str = ""
    notebook: str = ""


def _place(item: Item) -> tuple:
    """Where ``item`` stands in the paper: figures before tables, by number ("Fig 2a" before "Fig 2b")."""
    found = re.fullmatch(r"(Figs?|Table) (\d+)(\w?)(-\d+)?", item.item)
    if found is None:
        raise CoverageError(f"paper item {item.item!r} is not named 'Fig N', 'Figs N-M' or 'Table N'")
    return (found[1] == "Table", int(found[2]), found[3])


def in_paper_order(items) -> tuple[Item, ...]:
    """``items`` in the paper's order, one per item: an item two notebooks make (Fig 13: notebooks 05 and 06) is
    declared by each and read as one (its notebooks and files joined); two that say it shows different things are an
    error."""
    merged: dict[str, Item] = {}
    for item in items:
        seen = merged.get(item.item)
        if seen is None:
            merged[item.item] = item
            continue
        if seen.shows != item.shows:
            raise CoverageError(f"{item.item} is declared twice, showing {seen.shows!r} and {item.shows!r}")
        merged[item.item] = replace(
            seen,
            files=seen.files + item.files,
            notebook=f"{seen.notebook}, {item.notebook}",
            note="; ".join(filter(None, dict.fromkeys((seen.note, item.note)))),
        )
    return tuple(sorted(merged.values(), key=_place))


def _files(folder: Path, stem: str) -> list[Path]:
    return sorted(folder.glob(f"{stem}.png")) or sorted((folder / "tables").glob(f"{stem}.md"))


def found(folder: Path, stem: str) -> list[Path]:
    """Our files for one figure or table name (a glob): the PNG of a figure, else the Markdown of a table; from real
    data in ``folder``, else from synthetic data in its synthetic folder."""
    folder = Path(folder)
    return _files(folder, stem) or _files(synthetic_dir(folder), stem)


def status(item: Item, folder: Path) -> str:
    """``REAL``, ``PIPELINE`` (a file from synthetic data), ``NOT_PRODUCED`` or ``MISSING`` (a declared file absent:
    its notebook has not run)."""
    if not item.files:
        return NOT_PRODUCED
    if not all(found(folder, stem) for stem in item.files):
        return MISSING
    if not all(_files(Path(folder), stem) for stem in item.files):
        return PIPELINE
    return REAL


def model(item: Item, profile: str, models: Mapping[str, str] | None = None) -> str:
    """The model ``item``'s files are on at ``profile``: as ``models`` names it for its files (figure name -> model,
    ``fairkv.studies.figure_models``), else the profile's; "" for an item not produced or a folder that is no
    profile's."""
    if not item.files or profile not in studies.PROFILES:
        return ""
    named = [models[stem] for stem in item.files if models and stem in models]
    return ", ".join(dict.fromkeys(named)) or studies.PROFILES[profile].model


@dataclass(frozen=True)
class Catalogue:
    """The paper's items fairkv makes (``items``, in the paper's order: ``in_paper_order``), the model each of our
    figures is on where it is not the profile's (``models``: figure name -> model), how many claims the studies
    test (``family``: the Bonferroni family, sanity checks apart; 0 where unknown), each grid study's settings
    (``settings``: a row per part) and the paper's items of the claims declared but run on synthetic text here
    (``synthetic``: one entry per claim); ``fairkv.studies.catalogue`` gathers them from the study modules."""

    items: tuple[Item, ...]
    models: Mapping[str, str] = field(default_factory=dict)
    family: int = 0
    settings: tuple[dict, ...] = ()  # what each grid study computes at the profile, a row per part
    synthetic: tuple[str, ...] = ()  # the paper's claims not tested on data here, by their item (Figs 19-22, ...)

    def table(self, folder: Path, link_from: Path | None = None) -> pd.DataFrame:
        """One row per item of the paper: the item, what it shows, its status, the model it is on (at the profile
        the folder is named after; see ``model``), the notebook, our files (Markdown links relative to ``link_from``
        when given, else names) and the note (what synthetic data made of it, where it did)."""
        out = []
        for item in self.items:
            files = [path for stem in item.files for path in found(folder, stem)]
            said = status(item, folder)
            why = {MISSING: f"not in this folder yet: run notebook {item.notebook}", PIPELINE: item.synthetic}
            out.append(
                {
                    "item": item.item,
                    "shows": item.shows,
                    "status": said,
                    "model": model(item, Path(folder).name, self.models),
                    "notebook": item.notebook,
                    "ours": ", ".join(link(path, link_from) for path in files),
                    "note": why.get(said, item.note),
                }
            )
        return pd.DataFrame(out)

    def first_file(self, folder: Path, figure: str) -> Path | None:
        """The file a claim's ``figure`` points at: the first of the paper item's files, or for a claim beyond the
        paper our figure of that name; None when it is not in the folder."""
        items = {item.item: item for item in self.items}
        if figure in items:
            files = [path for stem in items[figure].files for path in found(folder, stem)]
            return files[0] if files else None
        if not figure[:2].isdigit():
            raise CoverageError(
                f"figure {figure!r} is neither an item of the paper ({', '.join(items)}) nor one of ours (NN_name)"
            )
        files = found(folder, figure)
        return files[0] if files else None


def link(path: Path, link_from: Path | None, text: str | None = None) -> str:
    """A Markdown link to ``path`` relative to ``link_from``, reading ``text`` (default the file's stem); its name
    alone when ``link_from`` is None."""
    if link_from is None:
        return path.name
    return f"[{text or path.stem}]({Path(os.path.relpath(path.resolve(), Path(link_from).resolve())).as_posix()})"
