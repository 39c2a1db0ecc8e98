"""The results store shared by processes: one computes a store's missing cells at a time, the other waits and reuses
its rows; a dead holder's lock is taken over; check and compact. Real processes, real SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sweeps import GRID, complete_lines, stable, sweep

from fairkv import cli
from fairkv.runs import experiment, fingerprint
from fairkv.runs.store import ResultsStore, StoreBusy, StoreError, check_lockable, filesystem

N_CELLS = 4 * 5 * 2  # prompts x settings x queries


def wait_for(condition, what: str, process: subprocess.Popen) -> None:
    """Wait for an event of ``process``'s, with no deadline (a loaded machine only makes it later); the process
    ending before it is the failure."""
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the process ended before {what}: {process.stderr.read().decode()}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def reference(smollm, tmp_path_factory) -> Path:
    """The grid computed by one process alone (this one)."""
    folder = tmp_path_factory.mktemp("alone")
    experiment.run(experiment.Grid(**GRID), folder, progress=False, lm=smollm)
    return folder


def store_path(folder: Path) -> Path:
    return experiment.store_for(experiment.Grid(**GRID), folder).path


def rows_of(folder: Path, wait: bool = True) -> str:
    return stable(experiment.run(experiment.Grid(**GRID), folder, progress=False, wait=wait))


def cell_ids(path: Path) -> list[str]:
    return [json.loads(line)["cell_id"] for line in complete_lines(path)]


@pytest.mark.slow
def test_two_runs_at_once_compute_each_cell_once(reference, tmp_path):
    """The first run is stopped (SIGSTOP) once its first rows land, so the second finds it mid-run however fast the
    rest of its grid would go (the race the holder test below met), and goes on (SIGCONT) once the second waits."""
    with open(tmp_path / "a.out", "w") as a_out, open(tmp_path / "b.out", "w") as b_out:
        first = sweep(tmp_path, a_out)
        second = None
        try:
            wait_for(lambda: len(complete_lines(store_path(tmp_path))) >= 1, "the first run's first rows", first)
            first.send_signal(signal.SIGSTOP)
            second = sweep(tmp_path, b_out)  # starts while the first computes
            wait_for(
                lambda: "waiting for it to finish" in (tmp_path / "b.out").read_text(), "the second run to wait", second
            )
        finally:
            first.send_signal(signal.SIGCONT)  # never left stopped, whatever failed
        for process in (first, second):
            assert process.wait(timeout=600) == 0, process.stderr.read().decode()
    said = (tmp_path / "b.out").read_text()
    assert f"is being computed by PID {first.pid} on " in said and "waiting for it to finish" in said, said
    ids = cell_ids(store_path(tmp_path))
    assert len(ids) == len(set(ids)) == N_CELLS  # one line per cell: nothing computed twice
    assert rows_of(tmp_path) == rows_of(reference)


@pytest.mark.slow
def test_holder_killed_while_another_waits_is_taken_over(reference, tmp_path):
    """The holder is stopped (SIGSTOP) once its first rows land, lock and all, so the second run finds it mid-run
    however fast the rest of its grid would go: run as it was, a holder that finished its 40 cells before the second
    process had started found nothing to wait for (with torch capped to AVX2, beside other work), and the wait timed
    out."""
    path = store_path(tmp_path)
    with open(tmp_path / "a.out", "w") as a_out, open(tmp_path / "b.out", "w") as b_out:
        holder = sweep(tmp_path, a_out)
        try:
            wait_for(lambda: len(complete_lines(path)) >= 10, "the holder's first rows", holder)
            holder.send_signal(signal.SIGSTOP)
            assert len(complete_lines(path)) < N_CELLS, "the holder was stopped mid-run"
            waiter = sweep(tmp_path, b_out)
            wait_for(
                lambda: "waiting for it to finish" in (tmp_path / "b.out").read_text(), "the second run to wait", waiter
            )
            assert f"PID {holder.pid} on " in (tmp_path / "b.out").read_text()
        finally:
            holder.send_signal(signal.SIGKILL)  # never left stopped, whatever failed
        assert holder.wait() == -signal.SIGKILL
        assert waiter.wait(timeout=600) == 0, waiter.stderr.read().decode()
    said = (tmp_path / "b.out").read_text()
    assert f"taking over the lock of {path} left by PID {holder.pid} on " in said and "finished" in said
    ids = cell_ids(path)
    assert len(ids) == len(set(ids)) == N_CELLS
    assert rows_of(tmp_path) == rows_of(reference)
    assert ResultsStore(path).holder() is None and path.with_name(path.name + ".lock").read_text() == ""


HOLD = textwrap.dedent("""
    import sys, time
    from fairkv.runs.store import ResultsStore
    with ResultsStore(sys.argv[1]).computing():
        print("held", flush=True)
        sys.stdin.readline()  # held until the test ends (its fixture closes stdin), however long the test takes
""")


@pytest.fixture
def held(tmp_path):
    """A process holding the compute lock of the sweep's store in tmp_path."""
    path = store_path(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "held\n"
    yield path, process
    process.stdin.close()
    assert process.wait() == 0  # it held the lock to the end


@pytest.mark.parametrize("executor", ["serial", "ray"])
def test_fail_fast_names_the_holder(held, tmp_path, executor):
    path, process = held
    assert str(ResultsStore(path).holder()).startswith(f"PID {process.pid} on ")
    with pytest.raises(StoreBusy, match=rf"{path} is being computed by PID {process.pid} on .*FAIRKV_RESULTS_DIR"):
        experiment.run(experiment.Grid(**GRID), tmp_path, progress=False, executor=executor, wait=False)
    with pytest.raises(StoreBusy, match=f"PID {process.pid}"):  # nor is a store compacted under a running sweep
        ResultsStore(path).compact()


def test_a_complete_grid_reads_without_the_lock(held, reference, tmp_path):
    """Reading what is stored never waits: only a run that must compute takes the lock."""
    path, _ = held
    path.write_bytes(store_path(reference).read_bytes())
    assert rows_of(tmp_path, wait=False) == rows_of(reference)


def test_check_and_compact_a_store_with_duplicates_and_a_torn_tail(reference, tmp_path, capsys):
    lines = complete_lines(store_path(reference))
    path = tmp_path / "store.jsonl"
    altered = json.loads(lines[1])
    altered["versions"]["torch"] = "1.0.0"
    # three lines written twice (the second copy of line 1 computed under another torch), then a torn last line
    path.write_text("\n".join(lines + [lines[0], json.dumps(altered), lines[2]]) + "\n" + lines[3][:40])
    store = ResultsStore(path)
    before = store.rows()

    assert cli.main(["store", "check", str(path)]) == 0
    printed = capsys.readouterr().out
    assert (
        f"lines={N_CELLS + 3} cells={N_CELLS} duplicates=3 unterminated_tail_bytes=40 other_schema=0 "
        f"other_versions=1 computing=None" in printed
    )

    report = store.compact()
    assert report == {
        "path": str(path),
        "lines_before": N_CELLS + 3,
        "lines_after": N_CELLS,
        "removed_duplicates": 3,
        "removed_tail_bytes": 40,
    }
    assert path.read_text().endswith("}\n") and len(complete_lines(path)) == N_CELLS
    assert store.rows() == before  # the row read for each cell is unchanged (the last written wins)
    assert store.check(lambda row: fingerprint.expected(fingerprint.versions(), row))["duplicates"] == 0
    assert not path.with_name(path.name + ".compacting").exists()


MOUNTS = """\
/dev/nvme0n1p1 / ext4 rw,relatime 0 0
server:/export /mnt/shared nfs4 rw,vers=4.2 0 0
//nas/results /mnt/shared/smb cifs rw 0 0
"""


def test_file_systems_without_shared_locks_are_refused():
    assert filesystem(Path("/mnt/shared/run/results"), MOUNTS) == "nfs4"
    assert filesystem(Path("/mnt/shared/smb/results"), MOUNTS) == "cifs"  # the longest mount point wins
    assert filesystem(Path("/mnt/sharedness"), MOUNTS) == "ext4"  # a prefix of the name is not a mount above it
    check_lockable(Path("/mnt/shared/run"), MOUNTS)  # NFS carries flock through its lock manager
    with pytest.raises(StoreError, match=r"/mnt/shared/smb/x is on a cifs file system.*FAIRKV_RESULTS_DIR"):
        check_lockable(Path("/mnt/shared/smb/x"), MOUNTS)


def test_sealed_segments_are_read_back_and_reproducible(reference, tmp_path, monkeypatch, capsys):
    """`fairkv store seal` moves the live rows into gzip segments (what results/cpu/ commits): the store reads the
    same rows, a run finds every cell and computes nothing, later rows go to a new segment, the same rows give the
    same bytes, and a segment never exceeds SEGMENT_BYTES of rows."""
    import gzip

    from fairkv.runs import store as store_module

    source = complete_lines(store_path(reference))
    path = store_path(tmp_path)
    path.write_text("\n".join(source[:30]) + "\n" + source[30][:25])  # a torn tail is never sealed
    store = ResultsStore(path)
    first = store.rows()

    assert cli.main(["store", "seal", str(path)]) == 0
    assert "sealed_rows=30 segments=['" in capsys.readouterr().out
    assert path.read_bytes() == b"" and [s.name for s in store.segments()] == [f"{path.stem}.part-0000.jsonl.gz"]
    assert store.rows() == first
    store.append([json.loads(line) for line in source[30:]])
    monkeypatch.setattr(store_module, "SEGMENT_BYTES", 4 * max(len(line) for line in source))
    report = store.seal()
    assert report["sealed_rows"] == N_CELLS - 30 and len(report["segments"]) == 3  # 10 rows, at most 4 per segment
    assert all(len(gzip.decompress(s.read_bytes()).splitlines()) <= 4 for s in store.segments()[1:])
    assert rows_of(tmp_path, wait=False) == rows_of(reference)  # every cell found: nothing recomputed
    assert path.read_bytes() == b""

    monkeypatch.undo()
    again = tmp_path / "again"
    again.mkdir()
    copy = ResultsStore(again / path.name)
    copy.path.write_text("\n".join(source[:30]) + "\n")
    copy.seal()
    assert copy.segments()[0].read_bytes() == store.segments()[0].read_bytes()  # no time stamp in the gzip header
    assert store.compact()["lines_before"] == 0  # compact rewrites the live file only: segments stay as sealed
    assert store.rows() == ResultsStore(store_path(reference)).rows()
