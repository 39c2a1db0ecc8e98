"""The Ray executor on a local cluster of 2 CPU workers with SmolLM2: the same rows as a serial run, row for row; a
worker killed mid-run is restarted and its task retried; a driver killed mid-run resumes without a duplicate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from sweeps import GRID, complete_lines, stable

from fairkv.runs import executors, experiment
from fairkv.runs.executors import ExecutorError, RayExecutor, Serial

ray = pytest.importorskip("ray", reason="the Ray executor needs ray (pip install ray==2.60.0)")

# GRID: 4 prompts x 5 settings, batch 5: one prompt (10 rows) per task, 4 tasks for 2 workers, so that a kill after
# the first task lands falls while both workers hold one


@pytest.fixture(scope="module")
def cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def serial_rows(smollm, tmp_path_factory):
    return experiment.run(experiment.Grid(**GRID), tmp_path_factory.mktemp("serial"), progress=False, lm=smollm)


def worker_pids() -> set[int]:
    """The Ray worker processes of the cluster this test process started (its descendants), never another's."""
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{entry}/stat").read()
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError):
            continue
    family, grew = {os.getpid()}, True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in family} - family
        family |= children
        grew = bool(children)
    workers = set()
    for pid in family - {os.getpid()}:
        try:
            if b"ray::_Worker" in open(f"/proc/{pid}/cmdline", "rb").read():
                workers.add(pid)
        except OSError:
            continue
    return workers


def test_executor_specs():
    assert isinstance(executors.executor("serial"), Serial)
    assert executors.executor({"kind": "ray", "workers": 2}) == RayExecutor(workers=2)
    with pytest.raises(ExecutorError, match="unknown executor 'dask'"):
        executors.executor("dask")
    with pytest.raises(ExecutorError, match="bad Ray executor options.*gpu"):
        executors.executor({"kind": "ray", "gpu": 1})
    with pytest.raises(ExecutorError, match="serial executor only"):
        executors.executor("ray", lm=object())


@pytest.mark.slow
def test_worker_killed_mid_run_is_restarted_and_the_grid_completes(cluster, serial_rows, tmp_path):
    """A Ray run whose worker is killed mid-task: the worker is restarted, its task retried, and the run's rows equal
    the serial run's row for row, each cell in the store once (what a Ray run without a kill must give too). The
    watcher waits on events (the first task's rows landed, the run over), never on a deadline a loaded machine
    misses: the run cannot end before the restarted worker has computed the retried task."""
    grid = experiment.Grid(**GRID)
    store = experiment.store_for(grid, tmp_path).path
    seen, run_over = {}, threading.Event()

    def kill_a_worker_mid_task_then_watch_it_restart():
        while len(complete_lines(store)) < 10 and not run_over.is_set():
            time.sleep(0.05)
        before = worker_pids()
        if run_over.is_set() or not before:
            return
        victim = min(before)
        seen["landed"] = len(complete_lines(store))  # both workers hold a task: 8 tasks of 10 rows, one landed
        os.kill(victim, signal.SIGKILL)
        seen["victim"], seen["before"], seen["restarted"] = victim, before, set()
        while not run_over.is_set():
            seen["restarted"] |= worker_pids() - before
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_a_worker_mid_task_then_watch_it_restart)
    watcher.start()
    try:
        rows = experiment.run(grid, tmp_path, progress=False, executor={"kind": "ray", "workers": 2})
    finally:
        run_over.set()
        watcher.join()
    assert len(seen.get("before", ())) == 2, f"this test's cluster should run 2 workers, found {seen.get('before')}"
    assert seen["landed"] <= serial_rows["cell_id"].nunique() - 20, "the kill should fall while tasks are in flight"
    assert seen["restarted"], "no new worker process replaced the killed one (actor restart)"
    assert seen["victim"] not in worker_pids()
    # the killed worker's task was retried: every cell is in the store once, rows equal the serial run's
    lines = complete_lines(store)
    assert len(lines) == serial_rows["cell_id"].nunique() == len({json.loads(line)["cell_id"] for line in lines})
    assert stable(rows) == stable(serial_rows)


# a driver process that joins the test's cluster (``cluster``), as a user's driver joins a running one
DRIVER = textwrap.dedent(f"""
    import sys
    from fairkv.runs import experiment
    grid = experiment.Grid(**{GRID!r})
    experiment.run(grid, sys.argv[1], progress=False, executor={{"kind": "ray", "address": "auto", "workers": 2}})
""")


@pytest.mark.slow
def test_driver_killed_mid_run_resumes_without_duplicates(cluster, serial_rows, tmp_path):
    grid = experiment.Grid(**GRID)
    store = experiment.store_for(grid, tmp_path).path
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], env=env, stderr=subprocess.PIPE)
    while len(complete_lines(store)) < 20 and driver.poll() is None:  # an event, not a deadline: the rows landed
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    assert driver.wait() == -signal.SIGKILL
    landed = len(complete_lines(store))
    assert 20 <= landed < serial_rows["cell_id"].nunique(), "the kill should fall mid-run"
    resumed = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path)], env=env, capture_output=True)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    lines = complete_lines(store)
    assert len(lines) == serial_rows["cell_id"].nunique() == len({json.loads(line)["cell_id"] for line in lines})
    assert stable(experiment.run(grid, tmp_path, progress=False, lm=None)) == stable(serial_rows)
