"""One module per notebook: its studies (``STUDIES``: each a ``fairkv.runs.studies.Study``, its axes and its scale
at each profile), its minutes (``MINUTES``), the claims it tests, declared once as data
(``fairkv.report.claims.Claim``), and how it measures them from its rows (``measure``). ``MODULES`` is the index
(notebook -> module): adding a study touches its module, its notebook and, for a new notebook, one line of it.

``paper_vs_us`` turns a study's measurements into its table, one line per claim (with the arithmetic its rows were
computed with, ``paths``); ``family`` counts the claims every
study declares (the Bonferroni family); ``thresholds`` states each claim's own bounds and margins with their reasons
(SUMMARY's preamble); ``every`` / ``study`` / ``sweeps`` the studies by name, ``expected_minutes`` what ``fairkv
reproduce`` announces, ``figure_models`` the model each figure is on, ``catalogue`` the paper's items each module
declares (its ``ITEMS``, for ``fairkv.report.coverage``)."""

from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pandas as pd

from fairkv.core import arithmetic, longbench
from fairkv.core.paths import REDECODED_FOLDER, figures_dir, redecoded
from fairkv.report import claims, coverage, mitigations, summary
from fairkv.report.noise import SENSITIVE, Noise
from fairkv.report.noise import sensitive as moved_by_noise
from fairkv.runs import redecode
from fairkv.runs import studies as machinery
from fairkv.runs.fingerprint import code_fingerprint

# a table's column, on each claim's line: the arithmetic of the rows the study read (``fairkv.core.arithmetic``), each
# path once; a row stored before rows recorded it says so
ARITHMETIC = arithmetic.FIELD
NOT_RECORDED = "not recorded"
AGAIN = "decoded_again"  # a redecoded table's column: how many of a claim's cells were read decoded again
REDONE = "decoded again ("  # how the noise column opens what a claim's cells decoded again gave
MODULES = {  # notebook -> its study module
    "01": "degradation",
    "02": "policies",
    "03": "leakage",
    "04": "keep_rates",
    "05": "whitelist",
    "06": "fair",
    "07": "debias",
    "08": "trec",
    "09": "runtime",
    "10": "judge",
    "11": "beyond",
    "12": "atlas",
    "13": "fixes",
}

# Wall minutes of each notebook (its module's ``MINUTES``) on this repository's 2-core machine from an empty results
# store. ci: measured per notebook (executed one after another with the running decode batch). cpu: 00-07 estimated by
# benchmarks/cpu_estimate.py (benchmarks/results/cpu_estimate.txt): the rows each notebook adds (``added_cells``:
# cells an earlier notebook computed are not counted again) times the costs per row measured with the running batch
# of ``generation.Decoder`` (issue 37) on 12-03, a day this machine's matmul limit was 126.7 tok/s (267.8 on 11-30):
# an IFEval answer of up to 512 new tokens 3.76 s (Fig 3's 1600), of up to 256 tokens 2.37 s (notebook 03's 500), an
# attack answer 0.444 s (420 on 10 prompts); a keep-rate row 0.033 s (no decoding); 08 and 10 from their earlier
# measurements scaled to their prompts; 09, 11 and 12 (the atlas's keep rates from an empty store, then the attack side
# of its presses) measured before the running batch. Rows already in the store cost nothing.
MINUTES_KIND = {"ci": "measured", "cpu": "estimated"}
QUICKSTART_MINUTES = {"ci": 0.8, "cpu": 1}  # notebook 00, which runs no study


def module(notebook: str):
    if notebook not in MODULES:
        raise claims.ClaimError(f"no study module for notebook {notebook!r}: use one of {', '.join(MODULES)}")
    return importlib.import_module(f"fairkv.studies.{MODULES[notebook]}")


def every() -> dict[str, machinery.Study]:
    """Every study by name, in notebook order; names are unique."""
    found = [chosen for notebook in MODULES for chosen in module(notebook).STUDIES]
    names = [chosen.name for chosen in found]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise machinery.StudyError(f"studies declared twice: {', '.join(repeated)}")
    return {chosen.name: chosen for chosen in found}


def study(name: str) -> machinery.Study:
    """The study named ``name`` (an error naming the studies there are)."""
    found = every()
    if name not in found:
        raise machinery.StudyError(f"unknown study {name!r}: use one of {', '.join(found)}")
    return found[name]


def unscaled(profile: str, notebooks: list[str]) -> dict[str, list[str]]:
    """Of ``notebooks`` (numbers), those with a study that has no scale at ``profile``, with the profiles it has
    (notebook 12's atlas runs at ci and cpu only: a batch run at the paper profile leaves it out, said so)."""
    found = {}
    for notebook in notebooks:
        if notebook in MODULES:
            lacking = [chosen for chosen in module(notebook).STUDIES if profile not in chosen.scale]
            if lacking:
                found[notebook] = sorted(set.intersection(*(set(chosen.scale) for chosen in lacking)))
    return found


def paper_grids(profile: str) -> list[tuple]:
    """Each study of the paper's sweep that notebooks 01-07 run as declared, with each grid it computes at
    ``profile`` (``Study.parts``; notebook 08 reads LongBench's TREC where its data is there, else synthetic data)."""
    return [
        (chosen, part)
        for chosen in sweeps()
        if profile in chosen.scale and chosen.notebook <= "07"
        for part in chosen.parts(profile)
    ]


def settings(profile: str) -> tuple[dict, ...]:
    """What each study of the paper's sweep computes at ``profile`` (``paper_grids``: notebooks 01-07; 08, 11 and 12
    print their own), one row per part, read from the declarations: the results page's settings, never typed by hand."""
    rows = []
    for chosen, part in paper_grids(profile):
        decoded = [query for query in part.queries if query != "keep"]
        fair = f" (lambda {', '.join(f'{lam:g}' for lam in part.lams)})" if part.lams != (1.0,) else ""
        rows.append(
            {
                "notebook": chosen.notebook,
                "study": chosen.name,
                "model": f"{part.model} ({part.dtype})",
                "data": part.dataset,
                "prompts": part.n_prompts or "all",
                "orders": ", ".join(part.orders),
                "ratios": ", ".join(f"{ratio:g}" for ratio in part.ratios),
                "policies": ", ".join(part.policies),
                "variants": ", ".join(part.variants) + fair,
                "queries (new tokens)": ", ".join(f"{q} ({part.tokens_for(q)})" for q in decoded) or "keep rates",
            }
        )
    return tuple(rows)


def sweeps() -> list[machinery.Study]:
    """The paper's sweep: the studies that are grids of it, in notebook order."""
    return [chosen for chosen in every().values() if chosen.sweep]


def added_cells(profile: str) -> dict[str, tuple[int, Counter] | None]:
    """``fairkv.runs.studies.added_cells`` over the paper's sweep (the sizes behind each notebook's minutes)."""
    return machinery.added_cells(profile, sweeps())


def expected_minutes(profile: str, notebooks: list[str]) -> tuple[str, dict[str, float]] | None:
    """("measured" / "estimated", minutes per notebook number) of ``notebooks`` at ``profile`` (each module's
    ``MINUTES``), None for a profile not timed here."""
    if profile not in MINUTES_KIND:
        return None
    minutes = {"00": QUICKSTART_MINUTES[profile]} | {n: module(n).MINUTES[profile] for n in MODULES}
    return MINUTES_KIND[profile], {n: minutes[n] for n in notebooks if n in minutes}


def figure_models(profile: str) -> dict[str, str]:
    """The model each study's figures and tables are on at ``profile`` (figure name -> model; a plan of its own
    names its model where it has one, else the profile's): the coverage table's model column."""
    found = {}
    for chosen in every().values():
        if profile not in chosen.scale:
            continue
        scale = chosen.scale[profile]
        model = chosen.grid(profile).model if chosen.axes is not None else getattr(scale, "model", None)
        found |= {figure: model or machinery.profile(profile).model for figure in chosen.figures}
    return found


NOT_IN_CHECKLIST = (
    "not in the checklist of figures and tables fairkv reproduces (the paper's main-text and appendix "
    "results it reports numbers for)"
)
UNLISTED = (  # the paper's items no study makes, and why
    coverage.Item("Figs 11-12", "", note=NOT_IN_CHECKLIST),
    coverage.Item("Table 2", "", note=NOT_IN_CHECKLIST),
)


def catalogue(profile: str) -> coverage.Catalogue:
    """Every item of the paper (``fairkv.report.coverage``): those each study module declares (its ``ITEMS``, with
    its notebook), and ``UNLISTED``; with the model each figure is on at ``profile`` (``figure_models``), the
    Bonferroni family (``family``), each study's grid there (``settings``) and the paper's claims run on synthetic
    text here (``on_synthetic``)."""
    items = [
        replace(item, notebook=notebook) for notebook in MODULES for item in getattr(module(notebook), "ITEMS", ())
    ]
    synthetic = tuple(claim.figure for claim in on_synthetic() if claim.status == claims.FINDING)
    return coverage.Catalogue(
        coverage.in_paper_order([*items, *UNLISTED]), figure_models(profile), family(), settings(profile), synthetic
    )


def declared() -> list[claims.Claim]:
    """Every claim every study declares, in notebook order; ids are unique."""
    found = [claim for notebook in MODULES for claim in module(notebook).CLAIMS]
    ids = [claim.id for claim in found]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise claims.ClaimError(f"claim ids declared twice: {', '.join(repeated)}")
    return found


def on_synthetic() -> list[claims.Claim]:
    """The claims declared but not tested on data here: notebook 08's where LongBench's TREC file is absent (they run
    on fairkv's synthetic text then, a check of the pipeline: ``longbench.on_disk``)."""
    return [] if longbench.on_disk() else list(module("08").CLAIMS)


def family() -> int:
    """How many claims are tested on data here: the Bonferroni family. Findings of the paper and ours; not the sanity
    checks, nor those ``on_synthetic``."""
    synthetic = {claim.id for claim in on_synthetic()}
    return sum(claim.status != claims.SANITY and claim.id not in synthetic for claim in declared())


def paper_vs_us(study, *inputs, profile: str | None = None, **options) -> pd.DataFrame:
    """``study``'s table: its ``measure(*inputs, **options)`` (claim id -> ``claims.Measured``), one line per claim
    it measured, in the order it declares them, with the ``profile``'s decoding noise where it was measured
    (``fairkv.report.noise``). A measurement of an undeclared claim is an error."""
    measured = study.measure(*inputs, **options)
    known = {claim.id for claim in study.CLAIMS}
    stray = sorted(set(measured) - known)
    if stray:
        raise claims.ClaimError(f"{study.__name__} measured undeclared claims: {', '.join(stray)}")
    size, noise = family(), Noise.read(profile) if profile else None
    table = claims.table(
        [claims.line(claim, measured[claim.id], size, noise) for claim in study.CLAIMS if claim.id in measured]
    )
    table[ARITHMETIC] = (table["part"] == "").map({True: paths(inputs), False: ""})
    return table if noise is None else _decoded_again(study, table, profile)


def paths(inputs) -> str:
    """The arithmetic paths of the rows in ``inputs`` (the frames a study measures that carry them), each once; a
    column ``<what>_arithmetic`` (the judge's scores beside the rows they judge) says ``<what>: <path>``."""
    labels = set()
    for frame in [frame for frame in inputs if isinstance(frame, pd.DataFrame)]:
        for column in [c for c in frame.columns if c == ARITHMETIC or str(c).endswith(f"_{ARITHMETIC}")]:
            said = "" if column == ARITHMETIC else column.removesuffix(f"_{ARITHMETIC}") + ": "
            labels |= {said + label for label in frame[column].fillna(NOT_RECORDED)}
    return "; ".join(sorted(labels))


def redecoded_table(notebook: str, profile: str) -> Path:
    """Where ``fairkv reproduce --redecoded`` writes a notebook's paper-vs-us table (its figures folder moved to
    ``<figures>/redecoded/``)."""
    return figures_dir() / REDECODED_FOLDER / profile / "tables" / f"{notebook}_paper_vs_us.csv"


def _decoded_again(study, table: pd.DataFrame, profile: str) -> pd.DataFrame:
    """Under ``FAIRKV_REDECODED=1`` (its cells decoded again read in place of the store's): the table with, per claim
    that declares cells, how many of them were there (column ``AGAIN``). Otherwise the column ``noise`` of each claim
    within decoding noise says what decoding its cells again did to its verdicts (the redecoded table), or how many
    are decoded again so far; a claim within decoding noise that declares no cells is an error. A mechanism within
    decoding noise (``claims.MECHANISM_NOISE``) is decoded again where its claim declares cells, else only said."""
    declared = {claim.id: claim for claim in study.CLAIMS}
    heads = table.index[table["part"] == ""]
    if redecoded():
        table[AGAIN] = ""
        for index in heads:
            claim = declared[table.at[index, "id"]]
            if claim.cells:
                table.at[index, AGAIN] = "{} of {}".format(*redecode.coverage(claim.cells, profile))
        return table
    notebook = next(number for number, name in MODULES.items() if study.__name__.endswith(f".{name}"))
    path = redecoded_table(notebook, profile)
    again = claims.heads(pd.read_csv(path, keep_default_na=False)).set_index("id") if path.exists() else None
    for index in heads:
        claim = declared[table.at[index, "id"]]
        mine, _, mechanism = table.at[index, "noise"].partition(claims.MECHANISM_NOISE)  # its parts', its mechanism's
        if not mine and not (mechanism and claim.cells):
            continue  # nothing within noise, or only the mechanism of a claim that declares no cells: said
        if not claim.cells:
            raise claims.ClaimError(
                f"{claim.id} is within decoding noise at {profile} but declares no cells to decode again (Claim.cells)"
            )
        mechanism = claims.MECHANISM_NOISE + mechanism if mechanism else ""
        said = [mine.removesuffix("; "), mechanism, _said_again(claim, table.loc[index], again, notebook, profile)]
        table.at[index, "noise"] = "; ".join(filter(None, said))
    return table


def _said_again(claim: claims.Claim, line: pd.Series, again: pd.DataFrame | None, notebook: str, profile: str) -> str:
    """What decoding the claim's cells again did to its verdicts (its mechanism's too, for a claim on a mitigation), or
    how far it got."""
    done, total = redecode.coverage(claim.cells, profile)
    if done < total:
        return f"decoded again so far: {done} of its {total} cells (`fairkv redecode {claim.id}`)"
    if again is None or claim.id not in again.index or again.at[claim.id, AGAIN] != f"{total} of {total}":
        return (
            f"its {total} cells decoded again, not yet read: `fairkv reproduce {notebook} --redecoded -p profile "
            f"{profile} --frozen`"
        )
    was = {kind: line[kind] for kind in ("verdict", "magnitude", *(("mechanism",) if claim.mitigation else ()))}
    now = {kind: again.at[claim.id, kind] for kind in was}
    said = f"{REDONE}{total} cells, batch {redecode.BATCH_SIZE})"
    if now == was:
        return (
            f"{said}: {was['verdict']}, {was['magnitude']}"
            + (f", mechanism {was['mechanism']}" if claim.mitigation else "")
            + " again"
        )
    moved = ", ".join(f"{kind} {was[kind]} -> {now[kind]}" for kind in was if was[kind] != now[kind])
    return f"{SENSITIVE}: {said}, {moved}"


def thresholds() -> str:
    """SUMMARY's preamble on thresholds: every bound and margin a claim declares, with its reason."""
    from fairkv.studies import reading

    lines = ["Thresholds every study shares:", ""]
    lines += [f"- `{name}` = {value:g}: {reason}" for name, value, reason in reading.SHARED]
    lines += [
        f"- `reading.RATE_MARGIN` = {reading.RATE_MARGIN:g}, the one margin of a refusal rate, in the direction and "
        f"the mechanism (restored, lost, risen, the benign price) alike: {reading.RATE_NULL}"
    ]
    lines += ["", "Thresholds of the claims' own (each declared with its claim, `fairkv/studies/`):", ""]
    for claim in declared():
        said = []
        if claim.region:
            bounds = [
                f"> {claim.above:g}" if claim.above is not None else "",
                f"< {claim.below:g}" if claim.below is not None else "",
            ]
            said.append(f"bound {' and '.join(b for b in bounds if b)}: {claim.region}")
        if claim.margin is not None:
            said.append(f"margin +-{claim.margin:g}: {claim.null}")
        if claim.parts:
            said.append(f"parts: {claim.parts}")
        lines.append(f"- `{claim.id}` ({claim.status}): " + "; ".join(said))
    return "\n".join(lines)


def recomputed(folder: Path) -> str:
    """SUMMARY's words on the claims within decoding noise: how many were recomputed from their cells decoded again
    (``fairkv redecode``, ``fairkv reproduce --redecoded``), which of them are sensitive to it, and those whose
    mechanism alone is within it and that declare no cells (said in the column, not decoded again)."""
    heads = claims.heads(pd.concat(list(summary.read_tables(folder).values()), ignore_index=True))
    cells = {claim.id: bool(claim.cells) for claim in declared()}
    said = heads[heads["noise"].str.startswith(claims.MECHANISM_NOISE) & ~heads["id"].map(cells)]
    marked = heads[(heads["noise"] != "") & ~heads["id"].isin(said["id"])]
    again = marked[marked["noise"].str.contains(REDONE, regex=False)]
    sensitive = marked[moved_by_noise(marked["noise"])]
    left = sorted(set(marked["id"]) - set(again["id"]))
    return (
        f"Of the {len(marked)} claims marked, {len(again)} {'was' if len(again) == 1 else 'were'} recomputed from "
        "their cells decoded again with a batch "
        f"of {redecode.BATCH_SIZE} (`fairkv redecode`, then `fairkv reproduce --redecoded`): "
        + (
            f"{len(sensitive)} sensitive to decoding noise ({', '.join(sensitive['id'])})"
            if len(sensitive)
            else "none flips"
        )
        + (f"; not yet: {', '.join(left)}" if left else "")
        + "."
        + (
            f" The mechanism of {len(said)} more is within it ({', '.join(said['id'])}): said, its cells not declared."
            if len(said)
            else ""
        )
    )


def write_summary(folder: Path, title: str) -> Path:
    """``folder``/SUMMARY.md (``summary.write_summary``), its preamble stating every claim's own thresholds and the
    result code that computed the rows."""
    noise = Noise.read(Path(folder).name)
    preamble = "\n\n".join(
        [
            f"Rows computed by fairkv's result code {code_fingerprint()} (`fairkv.runs.fingerprint`).",
            *([f"{noise.said()} {recomputed(folder)}"] if noise is not None else []),
            "Where each mitigation helps and where it hurts (`fairkv.report.mitigations`, from the notebooks' "
            "mechanism tables):\n\n" + "\n".join(f"- {line}" for line in mitigations.where(folder)),
            thresholds(),
        ]
    )
    return summary.write_summary(folder, title, family(), preamble)
