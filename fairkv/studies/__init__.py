"""One module per study (notebook): the claims it tests, declared once as data (``fairkv.report.claims.Claim``), and
how it measures them from its rows (``measure``). ``paper_vs_us`` turns a study's measurements into its table, one line
per claim; ``family`` counts the claims every study declares (the Bonferroni family); ``thresholds`` states each
claim's own bounds and margins with their reasons (SUMMARY's preamble)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pandas as pd

from fairkv.core.paths import REDECODED_FOLDER, figures_dir, redecoded
from fairkv.report import claims, mitigations
from fairkv.report.noise import Noise
from fairkv.runs import redecode
from fairkv.runs.fingerprint import code_fingerprint

AGAIN = "decoded_again"  # a redecoded table's column: how many of a claim's cells were read decoded again
SENSITIVE = "sensitive to decoding noise"
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
}


def module(notebook: str):
    if notebook not in MODULES:
        raise claims.ClaimError(f"no study module for notebook {notebook!r}: use one of {', '.join(MODULES)}")
    return importlib.import_module(f"fairkv.studies.{MODULES[notebook]}")


def declared() -> list[claims.Claim]:
    """Every claim every study declares, in notebook order; ids are unique."""
    every = [claim for notebook in MODULES for claim in module(notebook).CLAIMS]
    ids = [claim.id for claim in every]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise claims.ClaimError(f"claim ids declared twice: {', '.join(repeated)}")
    return every


def family() -> int:
    """How many claims are tested (findings of the paper and ours; sanity checks are not): the Bonferroni family."""
    return sum(claim.status != claims.SANITY for claim in declared())


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
    return table if noise is None else _decoded_again(study, table, profile)


def redecoded_table(notebook: str, profile: str) -> Path:
    """Where ``fairkv reproduce --redecoded`` writes a notebook's paper-vs-us table (its figures folder moved to
    ``<figures>/redecoded/``)."""
    return figures_dir() / REDECODED_FOLDER / profile / "tables" / f"{notebook}_paper_vs_us.csv"


def _decoded_again(study, table: pd.DataFrame, profile: str) -> pd.DataFrame:
    """Under ``FAIRKV_REDECODED=1`` (its cells decoded again read in place of the store's): the table with, per claim
    that declares cells, how many of them were there (column ``AGAIN``). Otherwise the column ``noise`` of each claim
    within decoding noise says what decoding its cells again did to its verdicts (the redecoded table), or how many
    are decoded again so far; a claim within decoding noise that declares no cells is an error."""
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
        if not table.at[index, "noise"]:
            continue
        if not claim.cells:
            raise claims.ClaimError(
                f"{claim.id} is within decoding noise at {profile} but declares no cells to decode again (Claim.cells)"
            )
        table.at[index, "noise"] += "; " + _said_again(claim, table.loc[index], again, notebook, profile)
    return table


def _said_again(claim: claims.Claim, line: pd.Series, again: pd.DataFrame | None, notebook: str, profile: str) -> str:
    """What decoding the claim's cells again did to its verdicts, or how far it got."""
    done, total = redecode.coverage(claim.cells, profile)
    if done < total:
        return f"decoded again so far: {done} of its {total} cells (`fairkv redecode {claim.id}`)"
    if again is None or claim.id not in again.index or again.at[claim.id, AGAIN] != f"{total} of {total}":
        return (
            f"its {total} cells decoded again, not yet read: `fairkv reproduce {notebook} --redecoded -p profile "
            f"{profile} --frozen`"
        )
    was = {kind: line[kind] for kind in ("verdict", "magnitude")}
    now = {kind: again.at[claim.id, kind] for kind in was}
    said = f"{REDONE}{total} cells, batch {redecode.BATCH_SIZE})"
    if now == was:
        return f"{said}: {was['verdict']}, {was['magnitude']} again"
    moved = ", ".join(f"{kind} {was[kind]} -> {now[kind]}" for kind in was if was[kind] != now[kind])
    return f"{SENSITIVE}: {said}, {moved}"


def thresholds() -> str:
    """SUMMARY's preamble on thresholds: every bound and margin a claim declares, with its reason."""
    from fairkv.studies import mechanism, reading

    lines = ["Thresholds every study shares:", ""]
    lines += [f"- `{name}` = {value:g}: {reason}" for name, value, reason in reading.SHARED]
    lines += [f"- `mechanism.SPECIFICITY_MARGIN` = {mechanism.SPECIFICITY_MARGIN:g}: {mechanism.SPECIFICITY_NULL}"]
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
    (``fairkv redecode``, ``fairkv reproduce --redecoded``) and which of them are sensitive to it."""
    every = pd.concat(list(claims.read_tables(folder).values()), ignore_index=True)
    marked = claims.heads(every).query("noise != ''")
    again = marked[marked["noise"].str.contains(REDONE, regex=False)]
    sensitive = marked[marked["noise"].str.contains(f"; {SENSITIVE}", regex=False)]
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
    )


def write_summary(folder: Path, title: str) -> Path:
    """``folder``/SUMMARY.md (``claims.write_summary``), its preamble stating every claim's own thresholds and the
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
    return claims.write_summary(folder, title, family(), preamble)
