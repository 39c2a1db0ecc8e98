"""The reader's page: the README's results section and the pages it links (docs/results.md, docs/beyond_the_paper.md)
are the tables' (generated, compared here), the README is short and opens with what a newcomer needs, the coverage of
the paper's figures and tables is declared and read off the folder, and each notebook ends with what we see. Numbers in
hand-written prose: tests/test_quotes.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

import fairkv.studies
from fairkv.core.paths import synthetic_dir
from fairkv.report import claims as claim_lines
from fairkv.report import coverage, readme, summary, verdicts
from fairkv.runs import studies
from fairkv.studies import trec

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "figures" / "cpu"
CATALOGUE = fairkv.studies.catalogue("cpu")  # the paper's items, as the study modules declare them


def _links_resolve(text: str, folder: Path) -> list[str]:
    """The link targets in ``text`` that do not resolve from ``folder`` (none: every link points at a file)."""
    targets = re.findall(r"\]\(([^)#]+)\)", text)
    assert targets
    return [target for target in targets if not (folder / target).exists()]


def _tables_whole(text: str) -> None:
    for table in re.findall(r"(?:^\|.*\n?)+", text, flags=re.MULTILINE):  # no cell breaks its table with a stray "|"
        cells = {len(re.findall(r"(?<!\\)\|", line)) for line in table.strip().split("\n")}  # an escaped "\|" is text
        assert len(cells) == 1, table[:200]
        assert not re.search(r"[^|\s]\s{2,}\||\|\s{2,}[^|\s]", table), table[:200]  # written without padding


def test_the_readme_results_section_is_the_committed_tables():
    """What the README says between its markers, docs/results.md and docs/beyond_the_paper.md are exactly what
    ``fairkv reproduce`` writes from figures/cpu/: a number there cannot drift from its table, every link in them
    points at a committed file, and their tables are unpadded."""
    written = readme.written(ROOT / "README.md")
    assert written == readme.section(CPU, CATALOGUE, link_from=ROOT)
    assert not _links_resolve(written, ROOT)
    assert "Fig 4" in written and "![03_fig4_compliance]" in written and "### Known confounds" in written
    pages = {
        readme.DETAILS: lambda where: readme.details(CPU, CATALOGUE, link_from=where),
        readme.BEYOND: lambda where: readme.beyond(CPU, CATALOGUE, link_from=where),
    }
    for page, text in pages.items():
        committed = (ROOT / page).read_text()
        assert committed == text((ROOT / page).parent), page
        assert not _links_resolve(committed, (ROOT / page).parent), page
        _tables_whole(committed)
    assert "| Table 4 |" in (ROOT / readme.DETAILS).read_text()
    _tables_whole(written)


README_MAX_BYTES = 15 * 1024  # five minutes of reading: the rest is in docs/
FIRST_SCREEN = 3000  # characters: what a newcomer sees before scrolling, about 40 lines


def test_the_readme_is_short_and_its_first_screen_holds_what_a_newcomer_needs():
    """At most 15 KB; its first screen holds the citation of the ACL paper with its arXiv id, the two commands with
    their measured times, the bottom line's three sentences and the head of the claims table; every link resolves."""
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= README_MAX_BYTES, len(text.encode())
    first = text[:FIRST_SCREEN]
    for needed in (
        "ACL 2026",
        "arXiv 2510.00231",
        "make reproduce   #",
        "make test        #",
        "`make test` ",
        "**What reproduces:**",
        "**What does not:**",
        "**Why:**",
        "| claim | paper | ours [95%] | n | direction | magnitude | mechanism | noise | why | figure |",
    ):
        assert needed in first, needed
    assert not _links_resolve(text, ROOT)


def test_the_claims_why_in_a_phrase():
    """A why's conclusion without its numbers in brackets, and what moved a mitigation's number."""
    why = (
        "model: at r = 0.5 the attack answers (n = 100) refuse in any wording 0.02, echo the attack 0.49; most answers "
        "that neither refuse nor recite echo the attack; mechanism: other, benign queries refused more: attack refused "
        "0.01 -> 0.93"
    )
    assert readme.reasons(why) == [
        "model: most answers that neither refuse nor recite echo the attack",
        "mechanism: benign queries refused more",
    ]
    assert readme.reasons("model: TOVA keeps more (normal: defense 0.35; flipped: 0.45) here") == [
        "model: TOVA keeps more here"
    ]
    assert readme.reasons("") == []


def test_write_replaces_only_the_text_between_the_markers(tmp_path):
    page = tmp_path / "README.md"
    page.write_text(f"# x\n\nbefore\n{readme.BEGIN}\nold numbers 0.99\n{readme.END}\nafter\n")
    readme.write(page, CPU, CATALOGUE)
    text = page.read_text()
    assert text.startswith("# x\n\nbefore\n") and text.endswith(f"{readme.END}\nafter\n") and "0.99\n" not in text
    assert readme.written(page) == readme.section(CPU, CATALOGUE, link_from=tmp_path)
    page.write_text("no markers here\n")
    with pytest.raises(readme.ReadmeError, match="needs one"):
        readme.write(page, CPU, CATALOGUE)
    with pytest.raises(readme.ReadmeError, match="no \\*_paper_vs_us.csv table"):
        readme.section(tmp_path, CATALOGUE)
    (tmp_path / "tables").mkdir()
    for name in ("03_paper_vs_us.csv", "03_fig4_benign_refusals.csv"):
        (tmp_path / "tables" / name).write_bytes((CPU / "tables" / name).read_bytes())
    with pytest.raises(readme.ReadmeError, match="03_fig4_capped.csv is missing: run the notebook"):
        readme.section(tmp_path, CATALOGUE)


def _claims(**verdict_of) -> pd.DataFrame:
    rows = []
    for name, (verdict, magnitude, why, figure) in verdict_of.items():
        rows.append(
            {
                "claim": name,
                "paper": "~0.5",
                "ours": f"0.10 [0.05, 0.15]; note on {name}",
                "n": 100,
                "verdict": verdict,
                "magnitude": magnitude,
                "why": why,
                "figure": figure,
                "id": f"t.{name}",
                "bonferroni": "",
                "noise": "",
                "status": claim_lines.FINDING,
                "part": "",
                "mechanism": verdicts.NOT_APPLICABLE,
            }
        )
    return pd.DataFrame(rows)


def test_the_bottom_line_counts_the_claims_and_names_the_commonest_reason():
    """Four claims: two hold (Figs 4 and 7), one fails and one is inconclusive; three carry a paper number, two of
    them differ; the reason given twice (model) comes before the one given once (budget). A mitigation that worked the
    paper's way gives no reason for what does not reproduce (broken on purpose: its mechanism counted, twice as often
    as the budget, it came second); one that worked another way gives its first reason, however many more it has."""
    claims = _claims(
        a=(verdicts.HOLDS, verdicts.DIFFERS, "model: echoes; mechanism: the paper's, refusal restored: 0.9", "Fig 4"),
        b=(verdicts.HOLDS, verdicts.MATCHES, "mechanism: the paper's, refusal restored: 0.9", "Fig 7"),
        c=(verdicts.FAILS, verdicts.DIFFERS, "model: echoes", "Fig 8"),
        d=(verdicts.INCONCLUSIVE, verdicts.NOT_APPLICABLE, "budget: few tokens", "Fig 9"),
    )
    claims.loc[claims["claim"].isin(["a", "b"]), "mechanism"] = verdicts.PAPERS
    lines = readme.bottom_line(claims, "tiny")
    assert lines[0] == "- **Reproduces:** on tiny, 2 of the paper's 4 claims hold in direction (Fig 4, Fig 7)."
    assert lines[1] == (
        "- **Does not:** 1 fail (c), 1 are inconclusive, 0 untestable here; in magnitude, of the 3 with a paper "
        "number, 1 match it, 2 differ, 0 lie above this model's ceiling, 0 are untestable in direction, 0 too "
        "uncertain (0 on a judge too poor)."
    )
    # every claim with a paper number counted, by why it is not sized (issue 82): above the ceiling, untestable in
    # direction, resting on a judge too poor (broken on purpose: the ceiling read from the magnitude alone -> 2 above)
    more = _claims(
        e=(verdicts.HOLDS, verdicts.UNTESTABLE, f"ceiling: x: the paper's 0.5; {claim_lines.ABOVE_CEILING}", "Fig 4"),
        f=(verdicts.UNTESTABLE, verdicts.UNTESTABLE, "code: no second pass", "Fig 23"),
        g=(verdicts.INCONCLUSIVE, verdicts.TOO_UNCERTAIN, "uncertain: the judge too poor", "Fig 25"),
    )
    every = pd.concat([claims, more], ignore_index=True)
    assert (
        "of the 6 with a paper number, 1 match it, 2 differ, 1 lie above this model's ceiling, 1 are untestable in "
        "direction, 1 too uncertain (1 on a judge too poor)" in (readme.bottom_line(every, "tiny")[1])
    )
    assert "of the 6 with a paper number, 1 match it, 2 differ, 1 lie above" in (readme.in_brief(every, "tiny", 10)[1])
    assert lines[2] == "- **Likely reason:** model: echoes (2 claims); budget: few tokens (1 claim)."
    # a verdict that moved when its cells were decoded again is said in both bottom lines, its figure once (broken on
    # purpose: the noise column not read -> no clause)
    claims.loc[claims["claim"] == "c", "noise"] = "sensitive to decoding noise: decoded again (9 cells), verdict x -> y"
    said = "; 1 verdict sensitive to decoding noise (Fig 8)"
    assert readme.bottom_line(claims, "tiny")[1].startswith(
        f"- **Does not:** 1 fail (c), 1 are inconclusive, 0 untestable here{said}; in"
    )
    assert f"0 untestable here{said}; of the 3" in readme.in_brief(claims, "tiny", 10)[1]
    claims.loc[claims["claim"] == "c", "noise"] = ""
    claims.loc[claims["claim"] == "b", ["mechanism", "why"]] = [
        verdicts.OTHER,
        "mechanism: other, refusal lowered: 0.9 -> 0.5 / the defense evicted: 0.4",
    ]
    assert (
        readme.commonest(claims)
        == "model: echoes (2 claims); mechanism: refusal lowered (1 claim); budget: few tokens (1 claim)"
    )
    # an inconclusive claim that also differs gives both its reasons, each under its own kind; what inconclusive
    # means (its interval straddles its bound) is counted apart by the bottom line, not as a reason
    both = f"uncertain: gap +0.05 [-0.01, +0.10] straddles 0.00; {claim_lines.UNDECIDED['straddles']}; model: echoes"
    assert readme.reasons(both) == [f"uncertain: {claim_lines.UNDECIDED['straddles']}", "model: echoes"]
    claims.loc[claims["claim"] == "d", "why"] = both
    assert readme.commonest(claims).startswith("model: echoes (3 claims); mechanism: refusal lowered (1 claim)")


def test_each_notebook_closes_with_what_we_see_at_its_profile():
    """The closing cell: counts, what holds, what fails with why, what is inconclusive, what differs beside the
    paper's number; the ci profile's pipeline-check sentence only at ci; a sanity check apart, not counted."""
    claims = _claims(
        a=(verdicts.HOLDS, verdicts.DIFFERS, "model: echoes", "Fig 4"),
        c=(verdicts.FAILS, verdicts.NOT_APPLICABLE, "model: other ranking", "Fig 3"),
        d=(verdicts.INCONCLUSIVE, verdicts.NOT_APPLICABLE, "uncertain: part straddles 0", "Fig 9"),
    )
    claims = pd.concat(
        [claims, _claims(e=(verdicts.HOLDS, verdicts.NOT_APPLICABLE, "", "Fig 7")).assign(status=claim_lines.SANITY)]
    )
    # a, a claim on a mitigation, holds for another reason: its why ends with what moved the number
    claims.loc[claims["claim"] == "a", ["mechanism", "why"]] = [
        verdicts.OTHER,
        "model: echoes; mechanism: other, benign queries refused more: benign refused 0.01 -> 0.36",
    ]
    cpu = summary.closing(claims, "qwen", "cpu", 100).split("\n\n")
    assert cpu == [
        "**What we see** on qwen (cpu profile, n = 100 prompts): the paper's claims: 3 claims, in direction 1 holds, 1 fails, "
        "1 inconclusive, 0 untestable here; in magnitude 0 matches, 1 differs, 0 too uncertain, 0 untestable here, "
        "2 n.a.; mechanism of the 1 judged on it: 0 the paper's, 0 partly the paper's, 1 other, 0 inconclusive; "
        "1 sanity check apart",
        "Holds: a.",
        "Fails: c (model: other ranking).",
        "Inconclusive: d (uncertain: part straddles 0).",
        "Differs from the paper's number: a (paper ~0.5; ours 0.10 [0.05, 0.15]).",
        "What moved the mitigations' numbers (attack refusal, benign refusal and keep rates, base -> mitigation): "
        "a: other, benign queries refused more.",
        "Sanity checks (true on any model by construction, not counted): e: holds.",
    ]
    # d's number above this model's ceiling: said apart, with the paper's number and the ceiling (broken on purpose:
    # the magnitude not read -> no such paragraph)
    claims.loc[claims["claim"] == "d", ["magnitude", "why"]] = [
        verdicts.UNTESTABLE,
        f"ceiling: peak: the paper's 0.50, this model's ceiling 0.13 [0.09, 0.17]; {claim_lines.ABOVE_CEILING}",
    ]
    assert (
        "Above what this model reaches (its positive controls), so untestable in magnitude: d (peak: the paper's 0.50, "
        "this model's ceiling 0.13 [0.09, 0.17])."
    ) in summary.closing(claims, "qwen", "cpu", 100).split("\n\n")
    ci = summary.closing(claims, "smol", "ci", 2, note="SYNTHETIC data (pipeline check)").split("\n\n")
    assert ci[0] == "SYNTHETIC data (pipeline check)" and ci[2].startswith("At the `ci` profile")
    assert not any("pipeline, not the science" in line for line in cpu)


def test_coverage_reads_each_item_off_the_folder(tmp_path):
    """An item with its files is produced from real data, on the profile's model (Fig 10 on the second model the
    studies name); LongBench's figures in the synthetic
    folder beside are a pipeline check, said so; an item whose file is absent is missing (its notebook has not run);
    one without files is not produced, with its reason and no model; Table 4's file absent, it is missing."""
    folder = tmp_path / "cpu"  # a folder named after its profile, as figures/cpu/ is
    synthetic = synthetic_dir(folder)
    assert synthetic == tmp_path / "synthetic" / "cpu"
    for where in (folder, synthetic):
        (where / "tables").mkdir(parents=True)
    (folder / "04_fig7_keep_rates.png").write_bytes(b"png")
    (synthetic / "08_fig19_trec_1k.png").write_bytes(b"png")
    unnamed = coverage.Catalogue(CATALOGUE.items)  # no figure on another model than the profile's
    table = unnamed.table(folder).set_index("item")
    assert table.loc["Fig 7", "status"] == coverage.REAL and table.loc["Fig 7", "ours"] == "04_fig7_keep_rates.png"
    assert table.loc["Fig 7", "model"] == studies.PROFILES["cpu"].model == "qwen2.5-coder-1.5b"
    assert table.loc["Figs 19-22", "status"] == coverage.PIPELINE
    assert table.loc["Figs 19-22", "note"] == trec.SYNTHETIC
    assert table.loc["Fig 8", "status"] == coverage.MISSING and "run notebook 05" in table.loc["Fig 8", "note"]
    assert table.loc["Table 2", "status"] == coverage.NOT_PRODUCED and "checklist" in table.loc["Table 2", "note"]
    assert table.loc["Table 2", "model"] == ""
    assert table.loc["Table 4", "status"] == coverage.MISSING  # notebook 08's lambda sweep has not run here
    (folder / "08_fig19_trec_1k.png").write_bytes(b"png")  # from LongBench's real data
    assert unnamed.table(folder).set_index("item").loc["Figs 19-22", "status"] == coverage.REAL
    assert unnamed.table(tmp_path).set_index("item").loc["Fig 7", "model"] == ""  # no profile's folder
    (folder / "04_fig10_keep_rates.png").write_bytes(b"png")  # Fig 10: a second model, as the studies name it
    named = CATALOGUE.table(folder).set_index("item")
    assert named.loc["Fig 10", "model"] == "smollm2-135m" and named.loc["Fig 7", "model"] == "qwen2.5-coder-1.5b"
    with pytest.raises(coverage.CoverageError, match="neither an item of the paper"):
        CATALOGUE.first_file(folder, "Figure 4")


def test_every_committed_item_is_where_coverage_says():
    """At the committed cpu profile no declared item is missing, every item from Fig 2a to Table 4 is listed once, and
    every claim's figure resolves to a committed file."""
    table = CATALOGUE.table(CPU)
    assert coverage.MISSING not in set(table["status"])
    assert table["item"].is_unique and table["item"].iloc[0] == "Fig 2a" and table["item"].iloc[-1] == "Table 4"
    claims = pd.concat(pd.read_csv(path, keep_default_na=False) for path in (CPU / "tables").glob("*_paper_vs_us.csv"))
    unresolved = sorted({figure for figure in claims["figure"] if CATALOGUE.first_file(CPU, figure) is None})
    assert not unresolved


def test_summary_headline_recounts_from_the_claim_declarations():
    """SUMMARY.md's headline is recounted here from the committed tables and the studies' declarations, by hand (not
    with the function that wrote it): every line is a declared claim with its declared status, each claim once, every
    declared claim of the notebooks that ran is there, and the counts of each section are those of its claims (not of
    their parts)."""
    declared = {claim.id: claim for claim in fairkv.studies.declared()}
    frames = summary.read_tables(CPU)
    every = pd.concat(frames.values(), ignore_index=True)
    heads = every[every["part"] == ""]
    assert heads["id"].is_unique and set(heads["id"]) <= set(declared)
    assert all(declared[row.id].status == row.status for row in heads.itertuples())
    ran = {fairkv.studies.MODULES[number] for number in frames}
    unmeasured = {i for i, claim in declared.items() if i.split(".")[0] in ran} - set(heads["id"])
    assert unmeasured <= {"trec.defense_weak_3k", "trec.weaker_2k"}  # the cpu profile runs TREC's 1k bucket only
    written = (CPU / "SUMMARY.md").read_text()
    for heading, status in (("The paper's claims", "finding"), ("Beyond the paper: our own claims", "ours")):
        picked = heads[heads["status"] == status]
        directions = picked["verdict"].value_counts()
        sizes = picked["magnitude"].value_counts()
        expected = (
            f"## {heading}: {len(picked)} claims, in direction "
            + ", ".join(f"{directions.get(v, 0)} {v}" for v in ("holds", "fails", "inconclusive", "untestable here"))
            + "; in magnitude "
            + ", ".join(
                f"{sizes.get(v, 0)} {v}" for v in ("matches", "differs", "too uncertain", "untestable here", "n.a.")
            )
        )
        assert expected in written, expected
    family = fairkv.studies.family()
    assert f"Family-wise (Bonferroni, 1 - 5% / {family}: the {family} claims tested on data here" in written


def test_the_paper_items_are_read_in_the_papers_order_once_each():
    """Each study module declares the paper's items its notebook makes: gathered, they run Fig 2a ... Fig 26, then
    Table 1 ... Table 4, one line each; Fig 13, which notebooks 05 and 06 each make half of, is one item of both
    notebooks; an item declared twice as showing different things, or named outside the paper's scheme, is refused."""
    items = [item.item for item in CATALOGUE.items]
    assert items[:4] == ["Fig 2a", "Fig 2b", "Fig 3", "Fig 4"] and items[-4:] == [f"Table {n}" for n in range(1, 5)]
    assert items.index("Fig 9") < items.index("Fig 10") < items.index("Figs 11-12") < items.index("Fig 13")
    assert len(items) == len(set(items)) == 22
    fig13 = next(item for item in CATALOGUE.items if item.item == "Fig 13")
    assert fig13.notebook == "05, 06" and fig13.files == ("05_fig13_defense", "06_fig13_defense")
    with pytest.raises(coverage.CoverageError, match="declared twice"):
        coverage.in_paper_order([coverage.Item("Fig 3", "one thing"), coverage.Item("Fig 3", "another")])
    with pytest.raises(coverage.CoverageError, match="is not named"):
        coverage.in_paper_order([coverage.Item("Figure 3", "x")])


def _counts(text: str, pattern: str) -> list[tuple[int, ...]]:
    """Every match of ``pattern`` (its groups: numbers) in ``text``."""
    return [tuple(int(x) for x in found) for found in re.findall(pattern, text)]


DIRECTIONS = r"(\d+) claims?, in direction (\d+) holds, (\d+) fails, (\d+) inconclusive, (\d+) untestable here"


def test_every_page_counts_the_same():
    """Issue 66 item 7: the README, docs/results.md, SUMMARY.md and the notebooks' closing cells give the paper's
    claims on this model, those on the second model and ours apart, with equal counts by direction (the notebooks'
    closings summed), and the README and the results page give the same reasons with the same counts (broken on
    purpose: SUMMARY's count of the paper's claims that hold raised by one -> fails)."""
    page = lambda path: (ROOT / path).read_text()
    written = page("figures/cpu/SUMMARY.md")
    totals = {}
    for label, heading in (
        ("the paper's claims", "The paper's claims"),
        ("the paper's claims on the second model", "The paper's claims on the second model (Fig 10's)"),
        ("our own claims", "Beyond the paper: our own claims"),
    ):
        (totals[label],) = _counts(written, rf"## {re.escape(heading)}: {DIRECTIONS}")
    counted = {path.name[:2] for path in (CPU / "tables").glob("*_paper_vs_us.csv")}  # not 08's synthetic run
    outputs = [
        "".join(out.get("data", {}).get("text/markdown", ""))
        for notebook in sorted((ROOT / "notebooks").glob("*.ipynb"))
        if notebook.name[:2] in counted
        for cell in json.loads(notebook.read_text())["cells"]
        for out in cell.get("outputs", [])
    ]
    said = "\n".join(text for text in outputs if "**What we see**" in text)
    for label, total in totals.items():
        found = _counts(said, rf"{re.escape(label)}: {DIRECTIONS}")
        assert tuple(map(sum, zip(*found))) == total, label
    paper = totals["the paper's claims"]
    readme_text, results = page("README.md"), page("docs/results.md")
    assert _counts(readme_text, r"(\d+) of the paper's (\d+) claims hold in direction") == [(paper[1], paper[0])]
    assert _counts(readme_text, r"(\d+) fail, (\d+) are inconclusive and (\d+) untestable here") == [paper[2:]]
    assert _counts(
        results,
        rf"## The paper's claims in full \((\d+): direction (\d+) holds, (\d+) fails, "
        rf"(\d+) inconclusive, (\d+) untestable here",
    ) == [paper]
    why = re.search(r"\*\*Why:\*\* (.*?)\. ", readme_text)[1]
    assert f"- **Likely reason:** {why}." in results


def test_the_papers_claims_run_on_synthetic_text_are_said_not_counted(monkeypatch):
    """Notebook 08's claims without LongBench's file run on synthetic text: the results page names them as not
    counted (issue 82's fresh reading: 28 is the claims tested on data); with the file, no such line (broken on
    purpose: the file's presence ignored -> the line stayed)."""
    import fairkv.studies
    from fairkv.core import longbench
    from fairkv.studies import trec

    monkeypatch.setattr(longbench, "on_disk", lambda: False)
    (said,) = readme.untested(fairkv.studies.catalogue("cpu"))
    assert said.startswith(f"- **Not counted:** {len(trec.CLAIMS)} more of the paper's claims (Figs 19-22, Table 4")
    monkeypatch.setattr(longbench, "on_disk", lambda: True)
    assert readme.untested(fairkv.studies.catalogue("cpu")) == []
