"""The README's results section and the full results page, written from the tables, never by hand.

``section`` reads a figures folder (``figures/<profile>/``: the notebooks' paper-vs-us tables and the tables the
confounds quote) and returns the README's part: the bottom line in three sentences (what reproduces, what does not,
why), the paper's claims one line each (claim | paper | ours [95%] | n | direction | magnitude | mechanism | why, in a
phrase | figure), the three figures that show the pitfall and its mechanism best at full width, and the known confounds,
each number from its table. ``details`` returns ``docs/results.md``: the profile's settings, the bottom line in full
with where each mitigation helps and where it hurts (``fairkv.report.mitigations``), every claim in full with its whole
why, the paper's figures and the coverage of every figure and table (``fairkv.report.coverage``). ``write`` puts the
first between the README's markers and writes the second; ``fairkv reproduce`` calls it for the profile the README shows
(``PROFILE``), and a test compares both with what the committed tables give, so no number in them can drift.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pandas as pd

from fairkv.report import ceilings, claims, confounds, coverage, mitigations, noise, situations, summary, verdicts
from fairkv.report.noise import SENSITIVE
from fairkv.report.ours import OURS
from fairkv.runs import studies

PROFILE = "cpu"  # the profile whose results the README shows
BEGIN = "<!-- results: written by `fairkv reproduce` from figures/cpu/ (fairkv.report.readme); edit the code, not this text -->"
END = "<!-- end of results -->"
DETAILS = Path("docs") / "results.md"  # the full results page, beside the README
BEYOND = Path("docs") / "beyond_the_paper.md"  # our own claims and figures (notebooks 11-12), beside the README
# the figures the README shows at full width: the refusal collapse, the eviction bias behind it, and the operative words
# whose eviction the refusal follows (issue 51: the paper's mechanism, measured)
KEY_FIGURES = (
    (
        "03_fig4_compliance",
        "The defense collapses: attacks refused (middle) against r per policy (Fig 4, normal order).",
    ),
    (
        "04_fig7_keep_rates",
        "The eviction bias: keep rates of the defense and the directive per policy (Fig 7).",
    ),
    (
        "06_operative",
        "Per cell, the defense kept against its operative words kept; right, attacks refused by the words kept.",
    ),
)
GALLERY = ("Fig 4", "Fig 7", "Fig 8", "Fig 9")  # the paper's items whose figures the results page shows


class ReadmeError(ValueError):
    """A README without the results markers, or a folder without the tables the section reads."""


def markdown(frame: pd.DataFrame) -> str:
    """``frame`` as a Markdown table without padding (a pipe in a cell escaped)."""

    def line(values) -> str:
        return "| " + " | ".join(str(value).replace("|", "\\|") for value in values) + " |"

    rows = [line(frame.columns), "|" + " --- |" * len(frame.columns)]
    return "\n".join(rows + [line(values) for values in frame.itertuples(index=False)])


def paper_claims(folder: Path, status: str = claims.FINDING) -> pd.DataFrame:
    """The paper's claims from the folder's paper-vs-us tables, one row per claim (not its parts, not our claims, not
    the sanity checks), with the notebook each comes from; ``status`` ``claims.SECOND_MODEL``: those read again on the
    second model (none is no error: a profile may run one model)."""
    try:
        frames = summary.read_tables(folder)
    except FileNotFoundError as missing:
        raise ReadmeError(str(missing)) from None
    every = pd.concat([frame.assign(notebook=number) for number, frame in frames.items()], ignore_index=True)
    found = claims.heads(every)
    found = found[found["status"] == status]
    if found.empty and status == claims.FINDING:
        raise ReadmeError(f"no claim of the paper in the paper-vs-us tables under {Path(folder) / 'tables'}")
    return found.reset_index(drop=True)


def bottom_line(claims: pd.DataFrame, model: str) -> list[str]:
    """Three lines: what reproduces (the claims that hold, by figure), what does not (fails, inconclusive, those
    ``sensitive`` to decoding noise, and every claim the paper gives a number for: ``summary.sizes``) and the likely
    reasons (``commonest``)."""
    holds = claims[claims["verdict"] == verdicts.HOLDS]
    fails = claims[claims["verdict"] == verdicts.FAILS]
    items = ", ".join(dict.fromkeys(holds["figure"]))
    said = commonest(claims)
    return [
        f"- **Reproduces:** on {model}, {len(holds)} of the paper's {len(claims)} claims hold in direction ({items}).",
        f"- **Does not:** {len(fails)} fail ({'; '.join(fails['claim'])}), "
        f"{int((claims['verdict'] == verdicts.INCONCLUSIVE).sum())} are inconclusive, "
        f"{int((claims['verdict'] == verdicts.UNTESTABLE).sum())} untestable here{sensitive(claims)}; in magnitude, "
        f"{summary.sizes(claims)}.",
        f"- **Likely reason:** {said or 'none given'}.",
    ]


def untested(catalogue: coverage.Catalogue) -> list[str]:
    """The results page's line on the paper's claims declared but run on synthetic text here (``Catalogue.synthetic``),
    which it does not count: none where every claim ran on data."""
    if not catalogue.synthetic:
        return []
    figures = ", ".join(dict.fromkeys(catalogue.synthetic))
    return [
        f"- **Not counted:** {len(catalogue.synthetic)} more of the paper's claims ({figures}, LongBench TREC, "
        "notebook 08): without LongBench's file here they run on fairkv's synthetic text, a check of the pipeline, "
        "not of the paper."
    ]


def sensitive(claims: pd.DataFrame) -> str:
    """A clause saying how many of ``claims`` moved a verdict when their cells were decoded again (their noise
    column), and their figures; nothing when none did."""
    moved = claims[noise.sensitive(claims["noise"])]
    verdicts_said = "verdict" if len(moved) == 1 else "verdicts"
    figures = ", ".join(dict.fromkeys(moved["figure"]))
    return f"; {len(moved)} {verdicts_said} {SENSITIVE} ({figures})" if len(moved) else ""


BRACKETS = r" ?(\([^()]*\)|\[[^\[\]]*\])"  # a bracketed group holding no other
STATISTICAL = {f"uncertain: {p}" for k, p in claims.UNDECIDED.items() if k != "gate"}  # what inconclusive means


def reasons(why: str, more: bool = True) -> list[str]:
    """A claim's ``why`` in a phrase per reason: its kind (``claims.WHY_KINDS``) with its conclusion (the last clause
    without a number, else the first without its brackets: 'model: most answers that neither refuse nor recite echo
    the attack'), and what moved a mitigation's number ('mechanism: refusal lowered', with ``more`` how many other
    reasons a reading over several settings gives: the results page has them all); none for an empty why."""
    reason, _, moved = why.partition("mechanism: ")
    said = []
    for one in re.split(rf"; (?=(?:{'|'.join(claims.WHY_KINDS)}): )", reason.rstrip("; ")):
        if not one:
            continue
        kind, _, body = one.partition(": ")
        while re.search(BRACKETS, body):  # innermost brackets first
            body = re.sub(BRACKETS, "", body)
        clauses = body.split("; ")
        plain = [clause for clause in clauses if not re.search(r"\d", clause)]
        said.append(f"{kind}: {plain[-1] if plain else clauses[0]}")
    if moved:
        first, *others = summary.because(moved).split(" / ")
        said.append(f"mechanism: {first}" + (f" and {len(others)} more" if others and more else ""))
    return said


def commonest(claims: pd.DataFrame, k: int = 3) -> str:
    """The ``k`` reasons (``reasons``, a mechanism's first) the most claims give for what does not reproduce, with how
    many give each (every page prints this count): a mechanism's only where it is not the paper's, and none that only
    restates what inconclusive means (``STATISTICAL``, counted apart)."""
    phrases = Counter()
    for row in claims.itertuples():
        said = [phrase for phrase in reasons(row.why, more=False) if phrase not in STATISTICAL]
        if row.mechanism == verdicts.PAPERS:
            said = [phrase for phrase in said if not phrase.startswith("mechanism: ")]
        phrases.update(list(dict.fromkeys(said)))
    return "; ".join(f"{phrase} ({times} claim{'s' * (times != 1)})" for phrase, times in phrases.most_common(k))


def _figure(row, folder: Path, link_from: Path, catalogue: coverage.Catalogue) -> str:
    """The claim's figure item, linked to its first file where the folder has it."""
    target = catalogue.first_file(folder, row.figure)
    return row.figure if target is None else coverage.link(target, link_from, row.figure)


def at_a_glance(claims: pd.DataFrame, folder: Path, link_from: Path, catalogue: coverage.Catalogue) -> str:
    """The paper's claims, one line each: the claim's and the paper's words before their details, our estimate (the
    first part of the claim table's) and its n, the verdicts, decoding noise's mark (``noise.mark``) and the why in a
    phrase (in full: the results page)."""
    marks = noise.mark(claims["noise"])
    rows = [
        {
            "claim": row.claim.split(" (")[0],
            "paper": row.paper.split(": ")[0],
            "ours [95%]": row.ours.split("; ")[0],
            "n": row.n,
            "direction": row.verdict,
            "magnitude": row.magnitude,
            "mechanism": row.mechanism,
            "noise": mark,
            "why": "; ".join(reasons(row.why)),
            "figure": _figure(row, folder, link_from, catalogue),
        }
        for row, mark in zip(claims.itertuples(), marks)
    ]
    return markdown(pd.DataFrame(rows))


def in_full(claims: pd.DataFrame, folder: Path, link_from: Path, catalogue: coverage.Catalogue) -> str:
    """The paper's claims, one line each, in full: the claim's words, our whole estimate (every number the claim reads),
    n, the whole why and what decoding noise does to it (the column ``noise``: empty where its verdict lies beyond the
    noise's reach, or the profile has no measure of it)."""
    rows = [
        {
            "notebook": row.notebook,
            "claim": row.claim,
            "paper": row.paper,
            "ours [95%]": row.ours,
            "n": row.n,
            "direction": row.verdict,
            "magnitude": row.magnitude,
            "mechanism": row.mechanism,
            "why": row.why,
            "decoding noise": row.noise,
            "figure": _figure(row, folder, link_from, catalogue),
        }
        for row in claims.itertuples()
    ]
    return markdown(pd.DataFrame(rows))


def in_brief(claims: pd.DataFrame, model: str, n: int) -> list[str]:
    """The bottom line in three sentences: what reproduces (the claims that hold, by figure), what does not (fails,
    inconclusive, untestable, and how many verdicts moved when their cells were decoded again; magnitudes; the
    mitigations judged on their mechanism) and why (the phrases the most claims give, with their counts)."""
    count = {verdict: int((claims["verdict"] == verdict).sum()) for verdict in verdicts.VERDICTS}
    judged = claims[~claims["mechanism"].isin(["", verdicts.NOT_APPLICABLE])]
    return [
        f"**What reproduces:** on {model} ({n} prompts), {count[verdicts.HOLDS]} of the paper's {len(claims)} claims "
        f"hold in direction ({', '.join(dict.fromkeys(claims.loc[claims['verdict'] == verdicts.HOLDS, 'figure']))}).",
        f"**What does not:** {count[verdicts.FAILS]} fail, {count[verdicts.INCONCLUSIVE]} are inconclusive and "
        f"{count[verdicts.UNTESTABLE]} untestable here{sensitive(claims)}; {summary.sizes(claims)}; of the "
        f"{len(judged)} judged on their mechanism (against r = 0), "
        f"{int((judged['mechanism'] == verdicts.PAPERS).sum())} moved the number the paper's way, "
        f"{int((judged['mechanism'] == verdicts.PARTLY).sum())} partly.",
        f"**Why:** {commonest(claims) or 'none given'}.",
    ]


def figures_at_full_width(folder: Path, link_from: Path, shown, catalogue: coverage.Catalogue) -> list[str]:
    """Each of ``shown`` ((file stem or paper item, caption)) as a full-width image under its caption; one not in
    the folder is left out."""
    out = []
    for name, caption in shown:
        path = catalogue.first_file(folder, name)
        if path is not None:
            out += [caption, "", f"!{coverage.link(path, link_from)}", ""]
    return out


def section(folder: Path, catalogue: coverage.Catalogue, profile: str = PROFILE, link_from: Path | None = None) -> str:
    """The README's results section for the tables in ``folder`` (links relative to ``link_from``, the README's
    folder; default the folder's grandparent, the repository root for ``figures/<profile>``); the paper's items from
    ``catalogue`` (``fairkv.studies.catalogue``)."""
    folder = Path(folder)
    link_from = Path(link_from) if link_from is not None else folder.parent.parent
    found = paper_claims(folder)
    grid = studies.PROFILES[profile]
    details = coverage.link(link_from / DETAILS, link_from)
    try:
        known, reached = confounds.said(folder, profile), ceilings.said(folder)
    except confounds.ConfoundError as missing:
        raise ReadmeError(str(missing)) from None
    return "\n".join(
        [
            " ".join(
                [reached]
                + in_brief(found, grid.model, grid.n_prompts)
                + [summary.family_wise(found, catalogue.family, summary.THESE)]
            ),
            "",
            f"### The paper's claims ({len(found)})",
            "",
            "Direction: 95% interval vs the claim; magnitude: vs the paper's number +- a tolerance; mechanism: vs r = "
            f"0; noise: {noise.NEAR} (within decoding noise), {noise.MOVED} (moved when decoded again); n: prompts "
            f"(timings: rounds). Rules: {details}.",
            "",
            at_a_glance(found, folder, link_from, catalogue),
            "",
            *figures_at_full_width(folder, link_from, KEY_FIGURES, catalogue),
            "### Known confounds",
            "",
            *known,
        ]
    )


def details(folder: Path, catalogue: coverage.Catalogue, profile: str = PROFILE, link_from: Path | None = None) -> str:
    """The results page (``DETAILS``) for the tables in ``folder``, links relative to ``link_from`` (its folder);
    the paper's items and the model of each figure from ``catalogue`` (``fairkv.studies.catalogue``)."""
    folder = Path(folder)
    link_from = Path(link_from) if link_from is not None else folder.parent.parent / DETAILS.parent
    found = paper_claims(folder)
    grid = studies.PROFILES[profile]
    return "\n".join(
        [
            f"# Results on the `{profile}` profile",
            "",
            "<!-- written by `fairkv reproduce` from the tables (fairkv.report.readme); edit the code, not this text "
            "-->",
            "",
            f"Settings: {grid.note}.",
            "",
            *([markdown(pd.DataFrame(catalogue.settings)), ""] if catalogue.settings else []),
            *bottom_line(found, grid.model),
            *untested(catalogue),
            f"- **Multiplicity:** {summary.family_wise(found, catalogue.family, summary.THESE)}",
            *(f"- {line}" for line in summary.on_second(paper_claims(folder, claims.SECOND_MODEL), catalogue, profile)),
            *(f"- {line}" for line in mitigations.where(folder)),
            "",
            f"## The paper's claims in full ({len(found)}: direction "
            f"{summary.counted(found, 'verdict', verdicts.VERDICTS)}; magnitude "
            f"{summary.counted(found, 'magnitude', verdicts.MAGNITUDES)}{summary.mechanism_counts(found)})",
            "",
            "The rules: `fairkv.report.verdicts` (direction, magnitude) and `fairkv.studies.mechanism` (mechanism, "
            f"{verdicts.MECHANISM_WORDS}). "
            f"Each claim with its parts: {coverage.link(folder / 'SUMMARY.md', link_from)}; our claims beyond the "
            f"paper: {coverage.link(link_from / 'beyond_the_paper.md', link_from)}.",
            "",
            in_full(found, folder, link_from, catalogue),
            "",
            "## One situation, one label",
            "",
            "Every claim's direction, magnitude and mechanism on every page follow this table "
            "(`fairkv.report.situations.SITUATIONS`, applied where each row says):",
            "",
            markdown(
                pd.DataFrame(
                    [(s.verdict, s.name, s.label, f"`{s.by}`") for s in situations.in_order()],
                    columns=["verdict", "situation", "label", "applied by"],
                )
            ),
            "",
            "## The paper's figures, ours",
            "",
            *figures_at_full_width(folder, link_from, [(item, f"{item}:") for item in GALLERY], catalogue),
            "## Coverage: every figure and table of the paper",
            "",
            markdown(catalogue.table(folder, link_from)),
            "",
        ]
    )


def _ours(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Our own claims (not the sanity checks) in every notebook's table ``frames`` hold, one row per claim."""
    found = claims.heads(pd.concat(list(frames.values()), ignore_index=True))
    return found[found["status"] == claims.OURS]


def beyond(folder: Path, catalogue: coverage.Catalogue, profile: str = PROFILE, link_from: Path | None = None) -> str:
    """The page of our own claims beyond the paper (``BEYOND``): per notebook of ``OURS`` what it measures, its
    claims one line each with their whole why, its figures at full width and links to its tables."""
    folder = Path(folder)
    link_from = Path(link_from) if link_from is not None else folder.parent.parent / BEYOND.parent
    frames = summary.read_tables(folder)
    counted = _ours(frames)
    parts = [
        f"# Beyond the paper: our own results (`{profile}` profile)",
        "",
        "<!-- written by `fairkv reproduce` from the tables (fairkv.report.readme); edit the code, not this text -->",
        "",
        "What fairkv measures that the paper does not. These are our claims, counted apart from the paper's in "
        f"{coverage.link(folder / 'SUMMARY.md', link_from)}; the paper's own are in "
        f"{coverage.link(link_from / DETAILS.name, link_from)}. Sanity checks are true on any model by construction. "
        + summary.family_wise(counted, catalogue.family, f"our {len(counted)} claims (every notebook's)")
        + " (column `family-wise`).",
        "",
    ]
    for notebook, (title, what, shown, tables) in OURS.items():
        if notebook not in frames:
            parts += [f"## {title}", "", f"Not run here: run notebook {notebook}.", ""]
            continue
        ours = claims.heads(frames[notebook])
        rows = [
            {
                "claim": row.claim,
                "ours [95%]": row.ours.split("; ")[0],
                "n": row.n,
                "direction": row.verdict,
                "family-wise": row.bonferroni or row.verdict,
                "kind": row.status,
                "why": row.why,
                "figure": _figure(row, folder, link_from, catalogue),
            }
            for row in ours.itertuples()
        ]
        paths = [folder / "tables" / f"{name}.md" for name in tables]
        linked = [coverage.link(path, link_from) for path in paths if path.exists()]
        parts += [
            f"## {title}",
            "",
            what,
            "",
            markdown(pd.DataFrame(rows)),
            "",
            *figures_at_full_width(folder, link_from, [(name, f"`{name}`:") for name in shown], catalogue),
            f"Tables: {', '.join(linked)}.",
            "",
        ]
    return "\n".join(parts)


def write(readme: Path, folder: Path, catalogue: coverage.Catalogue, profile: str = PROFILE) -> Path:
    """Replace the text between ``BEGIN`` and ``END`` in ``readme`` with ``section``, and write the results page
    (``details``, ``DETAILS``) and the page beyond the paper (``beyond``, ``BEYOND``) beside it; the paper's items
    from ``catalogue``."""
    readme = Path(readme)
    text = readme.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ReadmeError(f"{readme} needs one {BEGIN!r} line and, after it, one {END!r} line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    pages = {
        DETAILS: lambda where: details(folder, catalogue, profile, where),
        BEYOND: lambda where: beyond(folder, catalogue, profile, where),
    }
    for page, text in pages.items():
        (readme.parent / page).parent.mkdir(parents=True, exist_ok=True)
        (readme.parent / page).write_text(text((readme.parent / page).parent))
    readme.write_text(f"{head}{BEGIN}\n{section(folder, catalogue, profile, readme.parent)}\n{END}{tail}")
    return readme


def written(readme: Path) -> str:
    """The section as the README holds it now (between the markers)."""
    text = Path(readme).read_text()
    if BEGIN not in text or END not in text:
        raise ReadmeError(f"{readme} has no results markers")
    return text.split(BEGIN)[1].split(END)[0].strip("\n")
