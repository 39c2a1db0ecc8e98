"""Claims near decoding noise recomputed from their cells decoded again (issue 50, item 8): which cells a claim's
declaration names, how a run reads them in place of the store's rows, and what its noise column says then."""

from __future__ import annotations

import pandas as pd
import pytest

from fairkv import cli, studies
from fairkv.core.paths import REDECODED_FOLDER, REDECODED_SETTING
from fairkv.report import claims, summary
from fairkv.runs import experiment, redecode
from fairkv.runs.redecode import Cells, RedecodeError
from fairkv.runs.store import ResultsStore, StoreError
from fairkv.studies import beyond, fair, leakage


def test_cells_name_the_settings_of_their_study():
    (grid,) = redecode.grids(Cells(leakage.STUDY, policies=("snapkv",), ratios=(0.5,), queries=("attack",)), "cpu")
    assert (grid.policies, grid.ratios, grid.queries, grid.batch_size) == (("snapkv",), (0.5,), ("attack",), 64)
    assert grid.orders == ("normal", "flipped")  # not named: the study's
    # a ratio only one part of the study runs keeps that part alone (the fair study's benign side has no 0.3)
    parts = redecode.grids(Cells(fair.STUDY, ratios=(0.3,)), "cpu")
    assert [g.queries for g in parts] == [("attack",)]
    assert [g.dataset for g in redecode.grids(Cells(beyond.SPANS, datasets=("spans_2", "spans_8")), "cpu")] == [
        "spans_2",
        "spans_8",
    ]
    with pytest.raises(RedecodeError, match="names no cell"):
        redecode.grids(Cells(leakage.STUDY, ratios=(0.45,)), "cpu")


def test_every_claim_within_decoding_noise_declares_its_cells():
    """The committed cpu tables: a claim the noise column marks can be decoded again (``fairkv redecode``)."""
    marked = set()
    for frame in summary.read_tables(studies.figures_dir() / "cpu").values():
        heads = claims.heads(frame)  # a mechanism's comparisons within noise alone are said, not decoded again
        marked |= set(heads[(heads["noise"] != "") & ~heads["noise"].str.startswith(claims.MECHANISM_NOISE)]["id"])
    with_cells = {claim.id for claim in studies.declared() if claim.cells}
    assert marked and marked <= with_cells, sorted(marked - with_cells)


def tiny() -> experiment.Grid:
    return experiment.Grid(n_prompts=2, policies=("streamingllm",), ratios=(0.0, 0.5), max_new_tokens=4)


def test_a_redecoded_run_reads_the_cells_decoded_again(smollm, tmp_path, monkeypatch):
    grid = tiny()
    rows = experiment.run(grid, tmp_path, progress=False, lm=smollm)
    stored = experiment.store_for(grid, tmp_path).rows()
    cell = rows.loc[rows["ratio"] == 0.0, "cell_id"].iloc[0]  # stored once, labelled streamingllm by the grid
    again = ResultsStore(experiment.store_for(grid, tmp_path / REDECODED_FOLDER).path)
    again.append([{**stored[cell], "response": "decoded again"}])

    assert experiment.decoded_again(grid, tmp_path, rows).equals(rows)  # not asked for: the store's rows
    monkeypatch.setenv(REDECODED_SETTING, "1")
    read = experiment.decoded_again(grid, tmp_path, rows)
    changed = read["response"] != rows["response"]
    assert list(read.loc[changed, "cell_id"]) == [cell]
    assert read.loc[changed, "response"].iloc[0] == "decoded again"
    assert read[["policy", "variant", "lam", "ratio"]].equals(rows[["policy", "variant", "lam", "ratio"]])

    again.append([{**stored[cell], "versions": {**stored[cell]["versions"], "code": "another"}}])
    with pytest.raises(StoreError, match="not mixed"):
        experiment.decoded_again(grid, tmp_path, rows)


def line(verdict: str, magnitude: str) -> pd.Series:
    return pd.Series({"id": leakage.PEAK_ORDER.id, "verdict": verdict, "magnitude": magnitude})


def test_the_noise_column_says_what_decoding_again_did(monkeypatch):
    claim = leakage.PEAK_ORDER
    again = pd.DataFrame(
        [{"id": claim.id, "verdict": "fails", "magnitude": "differs", studies.AGAIN: "200 of 200"}]
    ).set_index("id")
    monkeypatch.setattr(redecode, "coverage", lambda cells, profile: (120, 200))
    assert studies._said_again(claim, line("fails", "differs"), again, "03", "cpu").startswith(
        "decoded again so far: 120 of its 200 cells"
    )
    monkeypatch.setattr(redecode, "coverage", lambda cells, profile: (200, 200))
    assert studies._said_again(claim, line("fails", "differs"), again, "03", "cpu") == (
        "decoded again (200 cells, batch 64): fails, differs again"
    )
    flipped = studies._said_again(claim, line("inconclusive", "differs"), again, "03", "cpu")
    assert flipped == f"{studies.SENSITIVE}: decoded again (200 cells, batch 64), verdict inconclusive -> fails"
    partial = again.assign(**{studies.AGAIN: "150 of 200"})  # rendered before its cells were all there
    assert "not yet read" in studies._said_again(claim, line("fails", "differs"), partial, "03", "cpu")
    # a claim on a mitigation: its mechanism read again too (broken on purpose: left out -> "fails, differs again")
    mitigation, said = (
        fair.TABLE1_POSITIVE,
        pd.Series({"verdict": "fails", "magnitude": "differs", "mechanism": "other"}),
    )
    again = pd.DataFrame([{"id": mitigation.id, **said, studies.AGAIN: "200 of 200"}]).set_index("id")
    assert studies._said_again(mitigation, said, again, "06", "cpu").endswith(": fails, differs, mechanism other again")
    again.at[mitigation.id, "mechanism"] = "the paper's"
    assert studies._said_again(mitigation, said, again, "06", "cpu").endswith(", mechanism other -> the paper's")


def test_a_mechanism_within_decoding_noise_is_decoded_again_where_its_claim_declares_cells(monkeypatch):
    """The noise column: a claim's parts within decoding noise, then its mechanism's, then what decoding its cells again
    did; a claim whose mechanism alone is within noise and that declares cells (fair.streamingllm_leakage: its attack
    cells) is decoded again too, one that declares none is only said; one whose parts are and that declares none is an
    error (broken on purpose: the mechanism's text counted as the claim's -> fair.order_gap asked for cells)."""
    monkeypatch.setattr(redecode, "coverage", lambda cells, profile: (10, 3200))
    mechanism = (
        claims.MECHANISM_NOISE
        + "r = 0.6: attack refused, fair - uncompressed -0.05 [-0.10, +0.00], moved by 0.02: inconclusive"
    )
    so_far = "decoded again so far: 10 of its 3200 cells (`fairkv redecode {}`)"
    table = pd.DataFrame(
        [
            {
                "id": fair.TABLE1_POSITIVE.id,
                "part": "",
                "noise": "within decoding noise (prompt_strict): x; " + mechanism,
            },
            {"id": fair.STREAMINGLLM_LEAKAGE.id, "part": "", "noise": mechanism},
            {"id": fair.ORDER_GAP.id, "part": "", "noise": mechanism},
        ]
    )
    noted = studies._decoded_again(fair, table.copy(), "cpu")["noise"].tolist()
    assert noted == [
        f"within decoding noise (prompt_strict): x; {mechanism}; " + so_far.format(fair.TABLE1_POSITIVE.id),
        f"{mechanism}; " + so_far.format(fair.STREAMINGLLM_LEAKAGE.id),
        mechanism,
    ]
    table.at[2, "noise"] = "within decoding noise (prompt_strict): y"
    with pytest.raises(claims.ClaimError, match=f"{fair.ORDER_GAP.id} is within decoding noise at cpu but declares"):
        studies._decoded_again(fair, table, "cpu")


def test_a_redecoded_render_takes_no_parameter_but_the_profile():
    """``--redecoded`` writes the tables the claims' noise column reads (figures/redecoded/): a parameter (another
    n_prompts) would rewrite them from other rows, so it is refused before anything runs."""
    with pytest.raises(SystemExit, match="--redecoded rewrites the tables the claims' noise column reads"):
        cli.main(["reproduce", "02", "--redecoded", "-p", "n_prompts", "10"])
