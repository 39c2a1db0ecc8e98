"""`fairkv verify`: stored rows recomputed from scratch, one cell at a time, come out identical (float32), and a row
that differs is named with the fields that differ."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from sweeps import GRID, complete_lines

from fairkv import cli
from fairkv.core import arithmetic
from fairkv.report import outcomes
from fairkv.runs import experiment, fingerprint, judge, runner, tolerance, verify
from fairkv.runs.store import ResultsStore, StoreError


@pytest.fixture(scope="module")
def computed(smollm, tmp_path_factory):
    """A one-prompt sweep's store (r = 0 and compressed settings, benign and attack queries, fair at lam 0 and 1)."""
    grid = experiment.Grid(**{**GRID, "n_prompts": 1, "start": 3})
    folder = tmp_path_factory.mktemp("computed")
    experiment.run(grid, folder, progress=False, lm=smollm)
    return experiment.store_for(grid, folder).path


@pytest.fixture(scope="module")
def recomputed() -> dict:
    """Each cell's recomputation (its grid -> the fresh store's bytes), made once for the module: the first
    verification computes every cell from scratch, later ones compare edited copies against the same fresh rows."""
    return {}


@pytest.fixture()
def stored(computed, smollm, recomputed, tmp_path, monkeypatch):
    """A copy of ``computed`` that a test may edit; verification reuses the loaded model and the cells recomputed."""
    monkeypatch.setattr(verify.models, "load_model", lambda *args, **options: smollm)
    compute = experiment.run

    def run_once(grid, folder, **options):
        path = experiment.store_for(grid, folder).path
        if grid in recomputed:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(recomputed[grid])
        else:
            compute(grid, folder, **options)
            recomputed[grid] = path.read_bytes()

    monkeypatch.setattr(experiment, "run", run_once)
    path = tmp_path / computed.name
    path.write_bytes(computed.read_bytes())
    return path


def test_every_stored_row_recomputes_identically(stored, capsys):
    n_rows = len(complete_lines(stored))
    assert cli.main(["verify", str(stored), "--sample", "100"]) == 0
    assert f"{n_rows} of {n_rows} rows recomputed identically" in capsys.readouterr().out


def test_a_row_that_differs_is_named_with_its_fields(stored, capsys):
    rows = [json.loads(line) for line in complete_lines(stored)]
    rows[0]["response"] += " (edited)"
    rows[1]["keep_defense"] = 0.123
    stored.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = verify.verify(stored, sample=len(rows), progress=False)
    assert report.identical == len(rows) - 2
    assert report.differing == {rows[0]["cell_id"]: ["response"], rows[1]["cell_id"]: ["keep_defense"]}
    assert report.near_ties == {}  # the edit follows the end of the answer, where end-of-turn clearly led
    assert cli.main(["verify", str(stored), "--sample", str(len(rows))]) == 1
    assert f"{rows[0]['cell_id']}: differs in response\n" in capsys.readouterr().out


def test_a_response_that_parts_at_a_near_tie_is_told_apart_from_a_defect(stored, smollm, monkeypatch, capsys):
    """With a tolerance wide enough to call the edited response's parting a tie, that row is a near tie (exit 0), named
    with where the responses part; a keep rate that differs is a defect whatever the tolerance."""
    rows = [json.loads(line) for line in complete_lines(stored)]
    decoded = next(i for i, row in enumerate(rows) if row["query"] != "keep" and row["response"])
    rows[decoded]["response"] += " (edited)"
    stored.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setattr(verify, "TIE_STEPS", 1e12)
    report = verify.verify(stored, sample=len(rows), progress=False)
    original = rows[decoded]["response"].removesuffix(" (edited)")
    parted = len(smollm.tokenizer(original, add_special_tokens=False).input_ids)
    assert list(report.near_ties) == [rows[decoded]["cell_id"]]
    assert report.near_ties[rows[decoded]["cell_id"]].startswith(f"token {parted}: ' (' (stored) vs ")
    assert report.defects == []
    assert cli.main(["verify", str(stored), "--sample", str(len(rows))]) == 0
    assert "1 differ after a near tie" in capsys.readouterr().out

    rows[decoded]["keep_defense"] = 0.123
    stored.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert verify.verify(stored, sample=len(rows), progress=False).defects == [rows[decoded]["cell_id"]]


def test_rows_of_other_code_are_refused(stored):
    rows = [json.loads(line) for line in complete_lines(stored)]
    rows[2]["versions"]["code"] = "0123456789ab"
    stored.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(verify.VerifyError, match=r"1 of \d+ rows were computed by other result code"):
        verify.verify(stored, sample=3, progress=False)


def test_rows_of_no_known_kind_are_refused(tmp_path):
    """Rows that are neither a sweep's (no prompt, setting or query), nor keep rates, nor a judge's scores cannot be
    rebuilt: a clear error."""
    path = tmp_path / "scores.jsonl"
    path.write_text(json.dumps({"cell_id": "a1", "judge": "smollm2-135m", "judge_score": 0, "schema": 1}) + "\n")
    with pytest.raises(
        verify.VerifyError,
        match=r"1 of 1 rows are neither a sweep's rows \(no dataset, dtype.*nor the atlas's keep rates nor a judge's",
    ):
        verify.verify(path, sample=1, progress=False)


def test_a_judges_scores_recompute_from_their_rows_and_an_edited_digit_is_a_defect(computed, smollm, tmp_path):
    """The judge's rows keep what they judged: recomputed alone (not in their batch), each gives the same digit and
    continuous columns within the tolerance; a digit edited by hand is a defect."""
    rows = ResultsStore(computed).rows().values()
    attack = pd.DataFrame([row for row in rows if row["query"] == "attack"])
    judge.judge_rows(attack, smollm.name, "float32", tmp_path, progress=False, lm=smollm)
    path = judge.store_path(smollm.name, tmp_path)
    report = verify.verify(path, sample=100, progress=False)
    assert (
        report.sampled == attack["cell_id"].nunique()
        and report.defects == []
        and not report.differing.keys() - (report.near_ties.keys())
    )
    lines = [json.loads(line) for line in complete_lines(path)]
    lines[0]["judge_score"] = (lines[0]["judge_score"] + 1) % 5
    path.write_text("".join(json.dumps(row) + "\n" for row in lines))
    assert verify.verify(path, sample=100, progress=False).defects == [lines[0]["cell_id"]]


def _stamped(path, code: str, edit=None) -> list[dict]:
    """Give every row of the store at ``path`` the code stamp ``code`` (and apply ``edit`` to the first row)."""
    rows = [json.loads(line) for line in complete_lines(path)]
    for row in rows:
        row["versions"]["code"] = code
    if edit:
        edit(rows[0])
    path.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    return rows


def test_restamp_gives_rows_that_recompute_identically_this_codes_stamp(stored, capsys):
    """Rows of another stamp, sealed, recompute identically: restamp rewrites their stamp, nothing else."""
    rows = _stamped(stored, "0123456789ab")
    ResultsStore(stored).seal()
    with pytest.raises(verify.VerifyError, match="computed by other result code"):
        verify.verify(stored, sample=3, progress=False)
    assert cli.main(["restamp", str(stored), "--was", "0123456789ab", "--sample", "100"]) == 0
    now = fingerprint.code_fingerprint()
    assert f"{len(rows)} rows restamped 0123456789ab -> {now}" in capsys.readouterr().out
    restamped = ResultsStore(stored).rows()
    for row in rows:
        assert restamped[row["cell_id"]] == {**row, "versions": {**row["versions"], "code": now}}
    assert verify.verify(stored, sample=3, progress=False).defects == []


def test_restamp_refuses_rows_that_differ_and_writes_nothing(stored):
    _stamped(stored, "0123456789ab", edit=lambda row: row.update(response=row["response"] + " (edited)"))
    before = stored.read_bytes()
    with pytest.raises(
        SystemExit, match=r"differs in .*response.*\n.*rows differ, so they keep their stamp 0123456789ab"
    ):
        cli.main(["restamp", str(stored), "--was", "0123456789ab", "--sample", "100"])
    assert stored.read_bytes() == before


def test_every_store_is_a_grids_rows_or_the_atlas_keep_rates():
    """Rows of any press of the catalogue (score once or per setting) are a grid's rows, recomputed through the sweep;
    keep rates through the atlas's collector. Nothing is registered to read them."""
    sweep = {name: 0 for name in verify.SWEEP_IDENTITY}
    assert verify.kind_of(Path("s"), [{**sweep, "policy": "snapkv"}, {**sweep, "policy": "none"}]) is verify.SWEEP
    assert verify.kind_of(Path("k"), [{"kind": "atlas", "press": "SnapKV"}]) is verify.KEEP_RATES
    mixed = [{**sweep, "policy": "keydiff"}, {**sweep, "policy": "adakv(snapkv)"}]
    assert verify.kind_of(Path("a"), mixed) is verify.SWEEP
    with pytest.raises(verify.VerifyError, match="1 of 2 rows are neither"):
        verify.kind_of(Path("x"), [{**sweep, "policy": "snapkv"}, {"cell_id": "judged"}])


def _elsewhere(path, edit=None) -> list[dict]:
    """Mark every row of the store at ``path`` as computed with other arithmetic (and apply ``edit`` to the rows)."""
    rows = [json.loads(line) for line in complete_lines(path)]
    for row in rows:
        row[arithmetic.FIELD] = "cpu float32 elsewhere"
    if edit:
        edit(rows)
    path.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    return rows


def test_rows_of_other_arithmetic_are_judged_by_the_stated_tolerance(stored, smollm):
    """Rows recorded as computed elsewhere: a keep rate moved within ``KEEP_BOUND`` and an answer that parted (its
    scores those of its stored text) pass, with the rule named; a keep rate moved beyond the bound does not."""
    decoded = lambda rows: next(i for i, row in enumerate(rows) if row["query"] == "benign" and row["response"])

    def edit(rows):
        rows[0]["keep_defense"] += tolerance.KEEP_BOUND / 2
        row = rows[decoded(rows)]
        row["response"] += " (decoded elsewhere)"
        row.update(verify._scores(smollm, row))

    rows = _elsewhere(stored, edit)
    report = verify.verify(stored, sample=len(rows), progress=False, reading=outcomes.reading)
    here = f"tolerance (cpu float32 elsewhere -> {arithmetic.path(smollm)})"
    assert report.rules == {here: len(rows)} and not report.failed, str(report)
    assert set(report.within) == {rows[0]["cell_id"], rows[decoded(rows)]["cell_id"]}
    assert sum(n for n, _, _ in report.agreement.counts.values()) == sum(row["query"] != "keep" for row in rows)
    rows = _elsewhere(
        stored, lambda rows: rows[0].update(keep_defense=rows[0]["keep_defense"] + 2 * tolerance.KEEP_BOUND)
    )
    assert verify.verify(stored, sample=len(rows), progress=False, reading=outcomes.reading).defects == [
        rows[0]["cell_id"]
    ]


def test_a_score_its_stored_response_does_not_give_is_a_defect_on_any_arithmetic(stored):
    rows = [json.loads(line) for line in complete_lines(stored)]
    attack = next(row for row in rows if row["query"] == "attack")
    attack["leak_directive"] = 1 - attack["leak_directive"]
    stored.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = verify.verify(stored, sample=len(rows), progress=False)
    assert report.misscored == {attack["cell_id"]: ["leak_directive"]} and report.defects == [attack["cell_id"]]


def test_decoded_answers_of_other_arithmetic_must_agree_as_often_as_native_decodes():
    """The floor is two native decodes' agreement: a sample shown below it fails, one that cannot be told from it
    passes (95% Wilson interval)."""
    agreement = tolerance.Agreement()
    for i in range(20):
        agreement.add("attack", same_answer=i < 19, same_reading=True)
        agreement.add("benign", same_answer=i < 12, same_reading=i < 19)
    assert agreement.below() == []
    for i in range(20):
        agreement.add("benign", same_answer=i < 4, same_reading=i < 19)
    assert [line.split(" identical")[0] for line in agreement.below()] == ["benign answers"]


def test_the_native_floor_is_what_the_committed_redecoded_rows_give():
    """``tolerance.AGREEMENT`` is measured, not typed: the committed redecoded cells against the store's rows."""
    folder = Path(__file__).resolve().parents[1] / "results" / "cpu"
    stored = ResultsStore(folder / "qwen2.5-coder-1.5b.jsonl").rows()
    again = ResultsStore(folder / "redecoded" / "qwen2.5-coder-1.5b.jsonl").rows()
    pairs = [(stored[cell], row) for cell, row in again.items() if cell in stored]
    assert len(pairs) == len(again) > 0, "a redecoded cell without its stored row, or no redecoded cell"
    measured = tolerance.Agreement()
    for a, b in pairs:
        measured.add(verify.query_kind(a), a["response"] == b["response"], outcomes.reading(a) == outcomes.reading(b))
    assert set(measured.counts) == set(tolerance.AGREEMENT)
    for kind, (n, answers, readings) in measured.counts.items():
        assert tolerance.AGREEMENT[kind] == {"answers": answers / n, "readings": readings / n}, kind


def test_the_keep_rate_bound_is_twice_the_largest_move_measured_on_other_arithmetic():
    """``tolerance.MOVED`` is what ``benchmarks/emulated_bfloat16.py`` printed for each path other than the committed
    rows' own, and the bound is twice the largest."""
    printed = {}
    for path in sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "results").glob("emulated_bfloat16*.txt")):
        for found in re.finditer(
            r"keep-rate rows recomputed, ([\w ]+): .* moved by at most ([\d.]+)", path.read_text()
        ):
            printed[found.group(1)] = float(found.group(2))
    assert printed.pop("cpu bfloat16 avx512_bf16", 0.0) == 0.0  # the committed rows' own kernels: bit for bit
    assert printed == tolerance.MOVED and tolerance.KEEP_BOUND == round(2 * max(printed.values()), 3)


def test_restamp_on_other_arithmetic_applies_the_tolerance_and_says_so(stored, capsys):
    """A change of code restamped on a CPU whose arithmetic differs from the rows': the rule applied is named."""
    _elsewhere(stored)
    rows = _stamped(stored, "0123456789ab")
    assert cli.main(["restamp", str(stored), "--was", "0123456789ab", "--sample", "100"]) == 0
    out = capsys.readouterr().out
    assert "rule applied: tolerance (cpu float32 elsewhere -> cpu float32" in out
    assert f"{len(rows)} rows restamped 0123456789ab -> {fingerprint.code_fingerprint()}" in out


def test_rows_of_one_press_without_its_stamp_are_restamped_alone(stored):
    """Issue 69: rows that lack their press's stamp (computed before presses were stamped, or by an edit of that one
    press) are refused by verify; restamp, given the code's stamp they carry, recomputes a sample of those rows alone
    and gives them the press's stamp, and leaves every other row as it was."""
    rows = [json.loads(line) for line in complete_lines(stored)]
    policy = next(row["policy"] for row in rows if row["policy"] != "none")
    mine = [row["cell_id"] for row in rows if row["policy"] == policy]
    for row in rows:
        if row["cell_id"] in mine:
            del row["versions"]["press"]
    stored.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    with pytest.raises(verify.VerifyError, match=rf"{len(mine)} of {len(rows)} rows were computed by other result"):
        verify.verify(stored, sample=3, progress=False)
    report, changed = verify.restamp(stored, fingerprint.code_fingerprint(), sample=100, progress=False)
    assert report.sampled == changed == len(mine) < len(rows) and report.identical + len(report.near_ties) == changed
    restamped = ResultsStore(stored).rows()
    for row in rows:
        press = {"press": fingerprint.press_stamp(policy)} if row["cell_id"] in mine else {}
        assert restamped[row["cell_id"]] == {**row, "versions": {**row["versions"], **press}}
    with pytest.raises(verify.VerifyError, match="nothing to restamp"):
        verify.restamp(stored, fingerprint.code_fingerprint(), sample=100, progress=False)


def test_rows_a_task_returns_under_another_press_stamp_are_refused(smollm, tmp_path):
    """Issue 69: the runner checks every row a task returns against this process's stamps before it stores it, so a
    worker whose declaration of a press differs (another press stamp; its code stamp alike) appends nothing."""

    @dataclass(frozen=True)
    class Job:
        versions: dict
        press: str

        def cells(self):
            return {"a": "cell-a"}

        def tasks(self, missing):
            return [missing]

        def load(self, device=None):
            return smollm

        def model_key(self):
            return (smollm.name,)

        def compute(self, lm, tasks):
            yield [{"cell_id": "cell-a", "policy": "snapkv", "versions": {**self.versions, "press": self.press}}]

    store = ResultsStore(tmp_path / "rows.jsonl")
    with pytest.raises(StoreError, match="computed with press 0123456789ab"):
        runner.run(Job(fingerprint.versions(), "0123456789ab"), store, lm=smollm, progress=False)
    assert store.rows() == {}
    runner.run(Job(fingerprint.versions(), fingerprint.press_stamp("snapkv")), store, lm=smollm, progress=False)
    assert list(store.rows()) == ["cell-a"]


def test_a_missing_store_or_one_of_another_schema_is_named(tmp_path):
    """fairkv verify and restamp name a store that is not there, and one of another schema, in a line of their own
    (they gave a traceback, or "holds no rows" for a path that does not exist)."""
    for command in ("verify", "restamp"):
        was = ["--was", "0123456789ab"] if command == "restamp" else []
        with pytest.raises(SystemExit, match=rf"fairkv {command}: .*missing.jsonl: no such store"):
            cli.main([command, str(tmp_path / "missing.jsonl"), *was])
        with pytest.raises(SystemExit, match=rf"fairkv {command}: .* is a folder: name a store in it"):
            cli.main([command, str(tmp_path), *was])
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"a": 1}\n')
    for command in ("verify", "restamp"):
        with pytest.raises(SystemExit, match=rf"fairkv {command}: .*junk.jsonl, line 1: written with results schema"):
            cli.main([command, str(junk), *(["--was", "0123456789ab"] if command == "restamp" else [])])


def test_verify_with_no_path_finds_the_sealed_stores_at_any_depth_and_names_where_it_looked(stored, tmp_path, capsys):
    """The documented check of a machine (docs/reliability.md: ``fairkv verify --sample K``, every committed store)
    finds a store sealed into gzip segments in a folder below a profile's, as a clone has it (no live file), each
    store once; finding none is an error naming where it looked (broken on purpose: the default looked for live
    ``*.jsonl`` files one folder deep, verified nothing and exited 0)."""
    results = tmp_path / "results"
    results.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FAIRKV_RESULTS_DIR", str(results))
        with pytest.raises(SystemExit, match=f"fairkv verify: no store under {re.escape(str(results))} "):
            cli.main(["verify"])
        store = results / "cpu" / "redecoded" / stored.name
        store.parent.mkdir(parents=True)
        store.write_bytes(stored.read_bytes())
        ResultsStore(store).seal()
        store.unlink()  # a clone has the segments only
        assert cli.stores_found() == [store] and cli.main(["verify", "--sample", "2"]) == 0
    assert f"{store}" in capsys.readouterr().out
