"""What a set of claim tables says, in words: the sentences each notebook ends with (``closing``), the counts of a
section (``headline``), and ``SUMMARY.md`` (``write_summary``: the paper's findings, ours, and the sanity checks apart,
claims counted, not rows). The rules that decide each claim are ``fairkv.report.claims``'."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from fairkv.report import coverage, noise, verdicts
from fairkv.report.claims import (
    CEILING,
    COLUMNS,
    FINDING,
    OURS,
    SANITY,
    SECOND_MODEL,
    UNDECIDED,
    beyond_reach,
    heads,
)
from fairkv.report.noise import SENSITIVE


def counted(claims: pd.DataFrame, column: str, values) -> str:
    """'20 holds, 4 fails, 11 inconclusive, 0 untestable here': how many claims carry each of ``values``."""
    counts = claims[column].value_counts() if column in claims else pd.Series(dtype=int)
    return ", ".join(f"{int(counts.get(value, 0))} {value}" for value in values)


def closing(table: pd.DataFrame, model: str, profile: str, n: int | str, note: str = "") -> str:
    """What we see: the few sentences (Markdown) each notebook ends with, generated from its claims. The counts
    (direction, magnitude, mechanism) of the paper's claims, those on the second model and ours apart (``GROUPS``, as
    every page counts them), sanity checks apart, then which hold, fail (with why), are inconclusive or
    untestable, and which differ from the paper's number. At the ``ci`` profile it says that the run checks the
    pipeline, not the science."""
    claims = heads(table)
    findings, checks = claims[claims["status"] != SANITY], claims[claims["status"] == SANITY]
    said = [note] if note else []
    counts = [
        f"{label}: {_count(group)}" for status, label in GROUPS if len(group := findings[findings["status"] == status])
    ]
    said.append(
        f"**What we see** on {model} ({profile} profile, n = {n} prompts): "
        + ("; ".join(counts) or "no claims")
        + (f"; {len(checks)} sanity check{'s' * (len(checks) != 1)} apart" if len(checks) else "")
    )
    if profile == "ci":
        said.append(
            "At the `ci` profile (SmolLM2-135M, a few prompts) this run checks the pipeline, not the science: "
            "the `cpu` profile's results are in `figures/cpu/` and its summary in `figures/cpu/SUMMARY.md`."
        )
    for opening, verdict, why in (
        ("Holds", verdicts.HOLDS, False),
        ("Fails", verdicts.FAILS, True),
        ("Untestable here", verdicts.UNTESTABLE, True),
        ("Inconclusive", verdicts.INCONCLUSIVE, True),
    ):
        picked = findings[findings["verdict"] == verdict]
        if len(picked):
            said.append(f"{opening}: " + "; ".join(_with_why(row, why) for row in picked.itertuples()) + ".")
    differ = findings[findings["magnitude"] == verdicts.DIFFERS]
    if len(differ):
        said.append(
            "Differs from the paper's number: "
            + "; ".join(
                f"{row.claim} (paper {row.paper}; ours {row.ours.split('; ')[0]})" for row in differ.itertuples()
            )
            + "."
        )
    said += _above_ceiling(findings[beyond_reach(findings)])
    said += _near_noise(findings)
    judged = findings[~findings["mechanism"].isin(["", verdicts.NOT_APPLICABLE])]
    if len(judged):
        said.append(
            "What moved the mitigations' numbers (attack refusal, benign refusal and keep rates, base -> mitigation): "
            + "; ".join(f"{row.claim}: {row.mechanism}, {because(row.why)}" for row in judged.itertuples())
            + "."
        )
    if len(checks):
        said.append(
            "Sanity checks (true on any model by construction, not counted): "
            + "; ".join(f"{row.claim}: {row.verdict}" for row in checks.itertuples())
            + "."
        )
    return "\n\n".join(said)


def sizes(found: pd.DataFrame) -> str:
    """'of the 18 with a paper number, ...': each claim with a paper number counted by its magnitude, those
    untestable here by why (above this model's ceiling: ``beyond_reach``; or the claim's direction untestable) and
    those too uncertain with how many rest on a judge too poor to decide."""
    sized = found[found["magnitude"] != verdicts.NOT_APPLICABLE]
    is_ = lambda label: sized["magnitude"] == label
    above = beyond_reach(sized)
    gated = is_(verdicts.TOO_UNCERTAIN) & sized["why"].str.contains(UNDECIDED["gate"], regex=False)
    return (
        f"of the {len(sized)} with a paper number, {int(is_(verdicts.MATCHES).sum())} match it, "
        f"{int(is_(verdicts.DIFFERS).sum())} differ, {int(above.sum())} lie above this model's ceiling, "
        f"{int((is_(verdicts.UNTESTABLE) & ~above).sum())} are untestable in direction, "
        f"{int(is_(verdicts.TOO_UNCERTAIN).sum())} too uncertain ({int(gated.sum())} on a judge too poor)"
    )


def _near_noise(findings: pd.DataFrame) -> list[str]:
    """The closing's paragraph on the claims within decoding noise's reach (their column ``noise``), each with its mark
    (``noise.mark``) and what decoding its cells again gave where it was; none when no claim is."""
    near = findings[findings["noise"].fillna("") != ""]
    if near.empty:
        return []
    again = lambda text: re.search(rf"({SENSITIVE}: )?decoded again.*$", text)
    each = [
        f"{row.claim} ({mark}{': ' + found.group(0) if (found := again(row.noise)) else ', not decoded again'})"
        for row, mark in zip(near.itertuples(), noise.mark(near["noise"]))
    ]
    return ["Within decoding noise (column `noise`): " + "; ".join(each) + "."]


def _above_ceiling(above: pd.DataFrame) -> list[str]:
    """The closing's paragraph on the claims whose number lies above this model's ceiling, each with the paper's
    number and the ceiling (its why's ``claims.CEILING`` part); none when no claim's does."""
    if above.empty:
        return []
    each = [f"{row.claim} ({re.search(CEILING, row.why).group(1)})" for row in above.itertuples()]
    return [
        "Above what this model reaches (its positive controls), so untestable in magnitude: " + "; ".join(each) + "."
    ]


THESE = "the paper's claims on this model"  # what every page's family-wise counts count
GROUPS = (  # the kinds of claim every page counts apart, in this order (sanity checks apart from all)
    (FINDING, "the paper's claims"),
    (SECOND_MODEL, "the paper's claims on the second model"),
    (OURS, "our own claims"),
)


def _count(claims: pd.DataFrame) -> str:
    """'3 claims, in direction ...; in magnitude ...; mechanism of the 1 judged on it: ...'."""
    return (
        f"{len(claims)} claim{'s' * (len(claims) != 1)}, in direction "
        f"{counted(claims, 'verdict', verdicts.VERDICTS)}; in magnitude "
        f"{counted(claims, 'magnitude', verdicts.MAGNITUDES)}" + mechanism_counts(claims)
    )


def mechanism_counts(claims: pd.DataFrame) -> str:
    """'; mechanism of the 4 judged on it: 1 the paper's, 2 other, 1 inconclusive' ('' when no claim is)."""
    judged = claims[~claims["mechanism"].isin(["", verdicts.NOT_APPLICABLE])]
    if judged.empty:
        return ""
    mechanisms = verdicts.MECHANISMS[:-1]
    return f"; mechanism of the {len(judged)} judged on it: {counted(judged, 'mechanism', mechanisms)}"


def family_wise(claims: pd.DataFrame, family: int, what: str) -> str:
    """The multiplicity rule in one sentence, with the family-wise counts of ``claims`` (``what`` names them) beside
    the per-claim ones: every page that counts claims says it so."""
    again = claims["bonferroni"].where(claims["bonferroni"] != "", claims["verdict"])
    return (
        f"Family-wise (Bonferroni, 1 - 5% / {family}: the {family} claims tested on data here, sanity checks "
        "apart), "
        f"{what} read {counted(pd.DataFrame({'verdict': again}), 'verdict', verdicts.VERDICTS)}."
    )


def on_second(second: pd.DataFrame, catalogue: coverage.Catalogue, profile: str) -> list[str]:
    """The second-architecture line: the paper's claims read again on the second model, counted apart from the
    reproduction's (none where the profile runs one model)."""
    if second.empty:
        return []
    figures = list(dict.fromkeys(second["figure"]))
    items = [item for item in catalogue.items if item.item in figures]
    model = ", ".join(dict.fromkeys(coverage.model(item, profile, catalogue.models) for item in items))
    return [
        f"**Second architecture** ({model}, {', '.join(figures)}; counted apart): the paper's {len(second)} claims "
        f"read again there: {counted(second, 'verdict', verdicts.VERDICTS)}."
    ]


def because(why: str) -> str:
    """The mechanism's phrase from a line's ``why`` (what follows 'mechanism: <verdict>, ' up to its numbers)."""
    said = why.split("mechanism: ", 1)[-1]
    return said.split(", ", 1)[-1].split(": ", 1)[0]


def _with_why(row, why: bool) -> str:
    return f"{row.claim} ({row.why})" if why and row.why else row.claim


class SummaryError(ValueError):
    """A paper-vs-us table the summary cannot count."""


def read_tables(folder: Path) -> dict[str, pd.DataFrame]:
    """The notebooks' paper-vs-us tables under ``folder``/tables, by notebook number; a table without the claim
    columns (written by an older fairkv) is an error naming the notebook to re-run."""
    tables = sorted((Path(folder) / "tables").glob("*_paper_vs_us.csv"))
    if not tables:
        raise FileNotFoundError(f"no *_paper_vs_us.csv table under {Path(folder) / 'tables'}: run the notebooks first")
    frames = {path.name[:2]: pd.read_csv(path, keep_default_na=False) for path in tables}
    stale = [number for number, frame in frames.items() if not set(COLUMNS) <= set(frame.columns)]
    if stale:
        raise SummaryError(
            f"{', '.join(f'{n}_paper_vs_us.csv' for n in stale)} lacks the columns {', '.join(COLUMNS)} (written by an "
            f"older fairkv): re-run notebook {', '.join(stale)} before the summary"
        )
    return frames


def headline(every: pd.DataFrame) -> str:
    """The counts of a section: findings by direction and magnitude (as each notebook's closing counts them), sanity
    checks apart."""
    claims = heads(every)
    findings, checks = claims[claims["status"] != SANITY], claims[claims["status"] == SANITY]
    if findings.empty:
        return f"{len(checks)} sanity checks; {counted(checks, 'verdict', verdicts.VERDICTS)}"
    return _count(findings) + (f"; {len(checks)} sanity checks apart" if len(checks) else "")


def _parts_shown(claims: pd.DataFrame) -> pd.DataFrame:
    """The table as SUMMARY prints it: a part's row indented under its claim, its claim text left blank."""
    shown = claims.drop(columns=["id", "status", "part"]).copy()
    is_part = claims["part"] != ""
    shown.loc[is_part, "claim"] = "  ↳ " + claims.loc[is_part, "part"]
    shown.loc[is_part, ["figure"]] = ""
    shown["n"] = shown["n"].astype(str)
    return shown


# SUMMARY's opening: how a line reads (the rules of ``fairkv.report.claims``, ``verdicts`` and ``studies.mechanism``)
RULES = (
    "Written by `fairkv reproduce` from the notebooks' paper-vs-us tables; each claim is declared once, beside its "
    "study (`fairkv/studies/`), with the paper's numbers and its thresholds. One line per claim: the paper's "
    "words and numbers, our estimate with its 95% interval over prompts, n (the prompts the claim reads), and three "
    "verdicts. **Direction**: holds (the interval lies where the claim says), fails (it lies outside, or wholly "
    "within the claim's equivalence margin: no effect), inconclusive (it straddles the bound, or the rows cannot "
    "decide it: the why says which), untestable here (the rows cannot test it on this model, with the reason). "
    "**Magnitude**: matches when our whole interval lies within the paper's number widened by a tolerance per kind of "
    "quantity ("
    + ", ".join(f"{kind} {value:g}" for kind, value in verdicts.TOLERANCE.items())
    + "; for a change or a score at most half the paper's size of it, so that a match tells the effect from none; "
    "`fairkv.report.verdicts.TOLERANCE`) and is narrower than it, differs when the widened number lies wholly outside "
    "our interval, too uncertain when neither (or where the claim rests on a judge too poor to decide), untestable "
    "here where the paper's number lies above this model's ceiling or the claim's direction is untestable, n.a. when "
    "the paper gives no number. **Mechanism** (a claim on a mitigation, whatever its direction; "
    f"`fairkv.studies.mechanism`), {verdicts.MECHANISM_WORDS} (n.a. also for a claim on no mitigation, or one that "
    "decides nothing); the numbers it rests on are in `why`. A claim of several parts (orders, policies, dominance "
    "rules) is one line whose verdict its deciding parts give (all must hold; any failing fails it); its parts are "
    "listed under it, each decided at the claim's level with no further correction: holding needs every part to hold "
    "(an intersection-union test, which needs none), while of k parts one may fail by chance up to k times as often as "
    "one part alone. Sanity checks (true on any model by the policy's definition or by construction) are listed apart "
    "and not counted. `why` is computed from the rows. "
)


def write_summary(folder: Path, title: str, family: int, preamble: str) -> Path:
    """Collate the notebooks' paper-vs-us tables into ``folder``/SUMMARY.md: the paper's findings, then ours, then
    the sanity checks, each with its counts (claims, not rows: a claim's parts are listed under it and not counted).
    ``preamble`` states the study-specific thresholds (``fairkv.studies.thresholds``), ``family`` the number of claims
    decided again at the Bonferroni level."""
    frames = read_tables(folder)
    every = pd.concat([frame.assign(notebook=number) for number, frame in frames.items()], ignore_index=True)
    claims = heads(every)
    flips = claims[claims["bonferroni"] != ""]
    parts = [
        f"# {title}\n",
        RULES
        + "**Multiplicity**: "
        + family_wise(claims[claims["status"] == FINDING], family, THESE)
        + " Of all the claims tested, "
        + (
            f"{len(flips)} change there ({'; '.join(f'{r.id}: {r.verdict} -> {r.bonferroni}' for r in flips.itertuples())})"
            if len(flips)
            else "none changes there"
        )
        + " (column `bonferroni`, empty where the verdict stays).\n",
        preamble + "\n",
    ]
    sections = (
        ("The paper's claims", every["status"] == FINDING),
        ("The paper's claims on the second model (Fig 10's)", every["status"] == SECOND_MODEL),
        ("Beyond the paper: our own claims", every["status"] == OURS),
        ("Sanity checks (not counted)", every["status"] == SANITY),
    )
    for heading, rows in sections:
        picked = every[rows]
        if picked.empty:
            continue
        parts.append(f"## {heading}: {headline(picked)}\n")
        for number, frame in picked.groupby("notebook", sort=True):
            parts.append(f"### Notebook {number}: {headline(frame)}\n")
            parts.append(_parts_shown(frame.drop(columns="notebook")).to_markdown(index=False) + "\n")
    summary = Path(folder) / "SUMMARY.md"
    summary.write_text("\n".join(parts))
    return summary
