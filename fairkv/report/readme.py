"""The README's results section, written from the tables, never by hand.

``section`` reads a figures folder (``figures/<profile>/``: the notebooks' paper-vs-us tables and the tables the
confounds quote) and returns the section: a bottom line (what reproduces, what does not, the likely reason, and where
each mitigation helps and where it hurts: ``fairkv.report.mitigations``), the paper's claims at a glance (claim |
paper | ours [95%] | n | direction | magnitude | mechanism | figure), the coverage of every figure and table of the
paper (``fairkv.report.coverage``) and the known confounds, each with its number from its table. ``write`` puts it
between the README's markers; ``fairkv reproduce`` calls it for the profile the README shows (``PROFILE``), and a
test compares the README with ``section`` on the committed tables, so a number in it cannot drift from its table.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from fairkv.report import analysis, claims, coverage, mitigations, verdicts
from fairkv.runs import studies

PROFILE = "cpu"  # the profile whose results the README shows
BEGIN = "<!-- results: written by `fairkv reproduce` from figures/cpu/ (fairkv.report.readme); edit the code, not this text -->"
END = "<!-- end of results -->"


class ReadmeError(ValueError):
    """A README without the results markers, or a folder without the tables the section reads."""


def paper_claims(folder: Path) -> pd.DataFrame:
    """The paper's claims from the folder's paper-vs-us tables, one row per claim (not its parts, not our claims, not
    the sanity checks), with the notebook each comes from."""
    try:
        frames = claims.read_tables(folder)
    except FileNotFoundError as missing:
        raise ReadmeError(str(missing)) from None
    every = pd.concat([frame.assign(notebook=number) for number, frame in frames.items()], ignore_index=True)
    found = claims.heads(every)
    found = found[found["status"] == claims.FINDING]
    if found.empty:
        raise ReadmeError(f"no claim of the paper in the paper-vs-us tables under {Path(folder) / 'tables'}")
    return found.reset_index(drop=True)


def bottom_line(claims: pd.DataFrame, model: str) -> list[str]:
    """Three lines: what reproduces (the claims that hold, by figure), what does not (fails, inconclusive, magnitudes
    that differ) and the likely reason (the most frequent ``why`` among claims that fail or differ)."""
    holds = claims[claims["verdict"] == verdicts.HOLDS]
    fails = claims[claims["verdict"] == verdicts.FAILS]
    sized = claims[claims["magnitude"] != verdicts.NOT_APPLICABLE]
    differ = sized[sized["magnitude"] == verdicts.DIFFERS]
    matches = sized[sized["magnitude"] == verdicts.MATCHES]
    items = ", ".join(dict.fromkeys(holds["figure"]))
    reasons = Counter(claims.loc[claims["why"] != "", "why"]).most_common(2)
    said = "; ".join(f"{why} ({count} claims)" for why, count in reasons)
    return [
        f"- **Reproduces:** on {model}, {len(holds)} of the paper's {len(claims)} claims hold in direction ({items}).",
        f"- **Does not:** {len(fails)} fail ({'; '.join(fails['claim'])}), "
        f"{int((claims['verdict'] == verdicts.INCONCLUSIVE).sum())} are inconclusive, "
        f"{int((claims['verdict'] == verdicts.UNTESTABLE).sum())} untestable here; in magnitude, of the {len(sized)} "
        f"claims the paper gives a number for, {len(matches)} match it, {len(differ)} differ and the rest are too "
        "uncertain to say.",
        f"- **Likely reason:** {said or 'none given'}.",
    ]


def at_a_glance(claims: pd.DataFrame, folder: Path, link_from: Path) -> str:
    """The paper's claims, one line each: ours is the first part of the claim table's estimate (the full text, with
    the notes on refusals and the token cap, is in SUMMARY.md)."""
    rows = []
    for row in claims.itertuples():
        target = coverage.first_file(folder, row.figure)
        shown = coverage.link(target, link_from) if target is not None else row.figure
        rows.append(
            {
                "notebook": row.notebook,
                "claim": row.claim,
                "paper": row.paper,
                "ours [95%]": row.ours.split("; ")[0],
                "n": row.n,
                "direction": row.verdict,
                "magnitude": row.magnitude,
                "mechanism": row.mechanism,
                "figure": f"{row.figure}: {shown}" if target is not None else shown,
            }
        )
    return pd.DataFrame(rows).to_markdown(index=False)


GALLERY = ("Fig 4", "Fig 7", "Fig 8", "Fig 9")  # the paper's items whose figures the README shows


def gallery(folder: Path, link_from: Path) -> str:
    """The figures of ``GALLERY`` as images, each under its item's name (an item not produced yet is left out)."""
    shown = [(item, coverage.first_file(folder, item)) for item in GALLERY]
    shown = [(item, path) for item, path in shown if path is not None]
    if not shown:
        return ""
    head = "| " + " | ".join(item for item, _ in shown) + " |\n|" + " --- |" * len(shown) + "\n"
    return head + "| " + " | ".join(f"!{coverage.link(path, link_from)}" for _, path in shown) + " |"


def _table(folder: Path, name: str) -> pd.DataFrame:
    """A committed table (``tables/<name>.csv``) as text, as the notebook printed it."""
    path = Path(folder) / "tables" / f"{name}.csv"
    if not path.exists():
        raise ReadmeError(f"{path} is missing: run the notebook that writes it before the README")
    return pd.read_csv(path, keep_default_na=False, dtype=str)


def _cell(folder: Path, name: str, row: dict, column: str) -> str:
    """One cell of a committed table, the row picked by ``row``'s column values."""
    frame = _table(folder, name)
    for key, value in row.items():
        frame = frame[frame[key] == value]
    if len(frame) != 1 or column not in frame:
        raise ReadmeError(f"{name}.csv has no single row {row} with a column {column!r}")
    return str(frame[column].iloc[0])


def confounds(folder: Path, profile: str) -> list[str]:
    """What besides the claimed mechanism moves our numbers, each with its number from its table."""
    grid = studies.PROFILES[profile]
    cap = grid.benign_tokens or grid.max_new_tokens
    refused = _cell(folder, "03_fig4_benign_refusals", {"policy": "streamingllm"}, "0.0")
    shares = _table(folder, "03_fig4_capped").set_index("policy").loc["streamingllm"]
    peak = max(shares.index, key=lambda r: float(shares[r].split()[0]))  # the ratio with the most capped answers
    judge = _table(folder, "10_judge_calibration").iloc[0]
    right = verdicts.Estimate(float(judge["accuracy"]), float(judge["low"]), float(judge["high"]), int(judge["n"]))
    return [
        f"- **Benign over-refusal.** Uncompressed, the model answers {refused} of the benign IFEval queries with the "
        "defense's refusal (StreamingLLM, `03_fig4_benign_refusals`); evicting the defense ends it, so accuracy can "
        "rise under compression. Accuracy claims print the share beside them, and the directive-followed claim is "
        "decided over answers that are not refusals.",
        f"- **The {cap}-token cap.** {shares['0.0']} of "
        f"StreamingLLM's benign answers stop at the cap at r = 0, {shares[peak]} at r = {float(peak):g}, the most "
        "(`03_fig4_capped`; the paper allows 1280); a capped answer fails IFEval's length, ending and combination "
        "checks, so part of the change in accuracy with r is the cap. Accuracy claims print the share and say when it "
        f"changes by {analysis.CAP_DRIVES:g} or more.",
        f"- **A self-judging small judge.** The LLM judge is the audited model judging its own answers, right on "
        f"{right} of {right.n} labelled responses (`10_judge_calibration`); while its interval reaches below "
        f"{analysis.JUDGE_MIN_ACCURACY:g}, every claim resting on it is inconclusive.",
        "- **ROUGE-L counts obeying a short directive as leakage.** An answer that carries the directive's own phrase "
        "(as the directive asks) recalls part of it; the paper's metric shares this limit.",
    ]


def section(folder: Path, profile: str = PROFILE, link_from: Path | None = None) -> str:
    """The README's results section for the tables in ``folder`` (links relative to ``link_from``, the README's
    folder; default the folder's grandparent, the repository root for ``figures/<profile>``)."""
    folder = Path(folder)
    link_from = Path(link_from) if link_from is not None else folder.parent.parent
    found = paper_claims(folder)
    grid = studies.PROFILES[profile]
    parts = [
        f"On the `{profile}` profile ({grid.note}).",
        "",
        *bottom_line(found, grid.model),
        *(f"- {line}" for line in mitigations.where(folder)),
        "",
        f"### The paper's claims at a glance ({len(found)}: direction "
        f"{claims.counted(found, 'verdict', verdicts.VERDICTS)}; magnitude "
        f"{claims.counted(found, 'magnitude', verdicts.MAGNITUDES)}{claims.mechanism_counts(found)})",
        "",
        "Direction: the claim holds, fails (outside, or a null within its margin) or is inconclusive on our 95% "
        "interval, or is untestable here; magnitude: our interval inside the paper's number widened by a tolerance per "
        "kind of quantity (matches), wholly away from it (differs), neither (too uncertain), or n.a. where the paper "
        "gives none (`fairkv.report.verdicts`); mechanism, for a claim on a mitigation: the paper's (the attack's "
        "refusal restored at a small price in benign refusals), other (something else moved the number), inconclusive "
        "(`fairkv.studies.mechanism`). One line per claim; sanity checks are not counted. Every claim in "
        f"full, with its parts and why it fails or differs: "
        f"{coverage.link(folder / 'SUMMARY.md', link_from)}; our claims beyond the paper: "
        f"{coverage.link(link_from / 'docs' / 'beyond_the_paper.md', link_from)}.",
        "",
        at_a_glance(found, folder, link_from),
        "",
        gallery(folder, link_from),
        "",
        "### Coverage: every figure and table of the paper",
        "",
        coverage.table(folder, link_from).to_markdown(index=False),
        "",
        "### Known confounds",
        "",
        *confounds(folder, profile),
    ]
    return "\n".join(parts)


def write(readme: Path, folder: Path, profile: str = PROFILE) -> Path:
    """Replace the text between ``BEGIN`` and ``END`` in ``readme`` with ``section``."""
    readme = Path(readme)
    text = readme.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ReadmeError(f"{readme} needs one {BEGIN!r} line and, after it, one {END!r} line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    readme.write_text(f"{head}{BEGIN}\n{section(folder, profile, readme.parent)}\n{END}{tail}")
    return readme


def written(readme: Path) -> str:
    """The section as the README holds it now (between the markers)."""
    text = Path(readme).read_text()
    if BEGIN not in text or END not in text:
        raise ReadmeError(f"{readme} has no results markers")
    return text.split(BEGIN)[1].split(END)[0].strip("\n")
