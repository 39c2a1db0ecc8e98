"""One module per study (notebook): the claims it tests, declared once as data (``fairkv.report.claims.Claim``), and
how it measures them from its rows (``measure``). ``paper_vs_us`` turns a study's measurements into its table, one line
per claim; ``family`` counts the claims every study declares (the Bonferroni family); ``thresholds`` states each
claim's own bounds and margins with their reasons (SUMMARY's preamble)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pandas as pd

from fairkv.report import claims
from fairkv.report.noise import Noise
from fairkv.runs.fingerprint import code_fingerprint

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
    return claims.table(
        [claims.line(claim, measured[claim.id], size, noise) for claim in study.CLAIMS if claim.id in measured]
    )


def thresholds() -> str:
    """SUMMARY's preamble on thresholds: every bound and margin a claim declares, with its reason."""
    from fairkv.studies import reading

    lines = ["Thresholds every study shares:", ""]
    lines += [f"- `{name}` = {value:g}: {reason}" for name, value, reason in reading.SHARED]
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


def write_summary(folder: Path, title: str) -> Path:
    """``folder``/SUMMARY.md (``claims.write_summary``), its preamble stating every claim's own thresholds and the
    result code that computed the rows."""
    noise = Noise.read(Path(folder).name)
    preamble = "\n\n".join(
        [
            f"Rows computed by fairkv's result code {code_fingerprint()} (`fairkv.runs.fingerprint`).",
            *([noise.said()] if noise is not None else []),
            thresholds(),
        ]
    )
    return claims.write_summary(folder, title, family(), preamble)
