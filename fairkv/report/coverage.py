"""Which of the paper's figures and tables (Figs 2-26, Tables 1-4; arXiv 2510.00231) fairkv produces, from what data,
and why not where it does not.

``PAPER_ITEMS`` declares, per item of the paper, what it shows, the notebook that makes ours and our files for it;
``table`` reads a figures folder (``figures/<profile>/``) and says per item on which model it was produced, and whether
from real data, as a pipeline check only (notebook 08 on fairkv's synthetic TREC file when LongBench's data is absent:
its files in the synthetic folder beside, ``fairkv.core.paths.synthetic_dir``), not produced (and why), or is missing
from the folder (its notebook has not run). The results page's coverage table and the claims'
figure links come from here (``fairkv.report.readme``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fairkv.core.paths import synthetic_dir
from fairkv.runs import studies

REAL = "produced from real data"
PIPELINE = "pipeline check only"
NOT_PRODUCED = "not produced"
MISSING = "missing"
NOT_IN_CHECKLIST = (
    "not in the checklist of figures and tables fairkv reproduces (the paper's main-text and appendix "
    "results it reports numbers for)"
)
SYNTHETIC = (
    "on fairkv's synthetic TREC file (LongBench's format, one prompt per bucket) where LongBench's data is "
    "absent, as here: from real data once LongBench's TREC file is in `longbench/`"
)


@dataclass(frozen=True)
class Item:
    """One figure or table of the paper: ``files`` are our figure or table names (globs) in the figures folder (or,
    made from synthetic data, in its synthetic folder), ``note`` how ours differs from the paper's or, without files,
    why it is not produced; ``synthetic``: what its files are where they come from synthetic data."""

    item: str
    shows: str
    notebook: str = ""
    files: tuple[str, ...] = ()
    note: str = ""
    synthetic: str = ""


PAPER_ITEMS = (
    Item(
        "Fig 2a",
        "accuracy per IFEval instruction class vs r, single- vs multi-instruction prompts",
        "01",
        ("01_fig2a_class_accuracy",),
        "StreamingLLM, as the paper's",
    ),
    Item("Fig 2b", "Spearman rho(r) of class accuracy, single vs multi", "01", ("01_fig2b_spearman",)),
    Item(
        "Fig 3",
        "mean accuracy and rho vs r for the five policies",
        "02",
        ("02_fig3_accuracy", "02_fig3_spearman"),
        "one model (the paper shows two)",
    ),
    Item(
        "Fig 4",
        "normal order: directive accuracy and leakage vs r",
        "03",
        ("03_fig4_normal", "03_fig4_compliance"),
        "with benign refusals, answers cut at the token cap and attack refusals beside",
    ),
    Item("Fig 5", "flipped order: directive accuracy and leakage vs r", "03", ("03_fig5_flipped",)),
    Item("Fig 6", "defense leakage vs r", "03", ("03_fig6_defense", "03_fig6_defense_raw")),
    Item(
        "Fig 7",
        "keep rate of the defense and the directive vs r, both orders",
        "04",
        ("04_fig7_keep_rates",),
        "our model's keep rates (the paper's Fig 7 is Llama-3.1-8B)",
    ),
    Item("Fig 8", "whitelist before / after", "05", ("05_fig8_whitelist",)),
    Item("Fig 9", "fair eviction before / after", "06", ("06_fig9_fair",)),
    Item(
        "Fig 10",
        "Fig 7 on a second model",
        "04",
        ("04_fig10_keep_rates",),
        "a second architecture (the paper's is Qwen2.5-14B): keep rates need no instruction following",
    ),
    Item("Figs 11-12", "", note=NOT_IN_CHECKLIST),
    Item(
        "Fig 13",
        "defense leakage with the whitelist and with fair eviction",
        "05, 06",
        ("05_fig13_defense", "06_fig13_defense"),
    ),
    Item("Fig 14", "fair eviction in the flipped order", "06", ("06_fig14_flipped",)),
    Item(
        "Figs 15-16",
        "accuracy against leakage per lambda (IFEval, StreamingLLM), both orders",
        "07",
        ("07_fig15_lambda_plane",),
    ),
    Item(
        "Figs 17-18",
        "accuracy against leakage per lambda on LongBench TREC (SnapKV, TOVA)",
        "08",
        ("08_fig17_trec_lambda_plane",),
        synthetic=SYNTHETIC,
    ),
    Item(
        "Figs 19-22",
        "LongBench TREC by length bucket (1-2k, 2-3k, 3-4k words), base vs fair",
        "08",
        ("08_fig19_trec_*",),
        synthetic=SYNTHETIC,
    ),
    Item(
        "Figs 23-24",
        "compression and decoding cost of H2O, + whitelist, + fair",
        "09",
        ("09_fig23_runtime",),
        "measured on this CPU in bfloat16 (the paper: one RTX A6000)",
    ),
    Item(
        "Figs 25-26",
        "LLM judge: leak rate and severity vs r",
        "10",
        ("10_fig25_judge_leak_rate", "10_fig26_judge_severity"),
        "the judge is the audited model judging its own answers (the paper's is a larger model)",
    ),
    Item("Table 1", "composite score per policy and mitigation, r in 0.4-0.7", "06", ("06_table1",)),
    Item("Table 2", "", note=NOT_IN_CHECKLIST),
    Item(
        "Table 3",
        "Pareto frequency per lambda (IFEval, StreamingLLM)",
        "07",
        ("07_table3_pareto",),
        "over the ratios above 0 (every lambda ties at r = 0)",
    ),
    Item(
        "Table 4",
        "Pareto frequency per lambda on LongBench TREC (SnapKV, TOVA)",
        "08",
        ("08_table4_pareto",),
        synthetic=SYNTHETIC,
    ),
)


class CoverageError(ValueError):
    """A figure name that no item of the paper declares."""


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


def table(folder: Path, link_from: Path | None = None, models: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One row per item of the paper: the item, what it shows, its status, the model it is on (at the profile the
    folder is named after; ``models``: see ``model``), the notebook, our files (Markdown links relative to
    ``link_from`` when given, else names) and the note (what synthetic data made of it, where it did)."""
    out = []
    for item in PAPER_ITEMS:
        files = [path for stem in item.files for path in found(folder, stem)]
        shown = ", ".join(link(path, link_from) for path in files)
        said = status(item, folder)
        why = {MISSING: f"not in this folder yet: run notebook {item.notebook}", PIPELINE: item.synthetic}
        out.append(
            {
                "item": item.item,
                "shows": item.shows,
                "status": said,
                "model": model(item, Path(folder).name, models),
                "notebook": item.notebook,
                "ours": shown,
                "note": why.get(said, item.note),
            }
        )
    return pd.DataFrame(out)


def first_file(folder: Path, figure: str) -> Path | None:
    """The file a claim's ``figure`` points at: the first of the paper item's files, or for a claim beyond the paper
    our figure of that name; None when it is not in the folder."""
    items = {item.item: item for item in PAPER_ITEMS}
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
