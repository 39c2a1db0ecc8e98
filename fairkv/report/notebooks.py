"""The numbered notebooks as the reproduction: ``notebooks/NN_*.ipynb`` are committed executed at their defaults (the
cpu profile, rendered from the committed rows, every figure inline), so opening one shows the paper's figures and
tables as this artifact reproduces them.

Three ways to run them (``fairkv reproduce``): execute at their defaults and write the executed notebook back in place
(``execute`` then ``settle``: papermill's run metadata stripped, so a re-render from the same rows changes nothing
in git); execute at any other parameters and write the executed copy under ``reports/<profile>/``; or re-execute the
committed notebooks under nbval (``check``; ``check_all``, several at once), which compares every cell's text output
with the committed one (paths and addresses masked by ``notebooks/sanitize.cfg``; a figure by the line
``figures.publish`` prints of what it plots, never by its PNG bytes; the cells tagged ``nbval-ignore-output`` say why
in the notebook) and writes no notebook.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import papermill
from traitlets.config import Config

from fairkv.core.paths import REPO_ROOT
from fairkv.core.progress import Monitor, duration

FOLDER = REPO_ROOT / "notebooks"
SANITIZE = FOLDER / "sanitize.cfg"
# The kernel talks to papermill over local sockets (no TCP, so no unencrypted-TCP warning from ipykernel).
KERNEL_CONFIG = Config({"KernelManager": {"transport": "ipc"}})
# what papermill and nbclient record of one run (times, paths, parameters), never part of what a notebook shows
RUN_METADATA = ("papermill", "execution")
# notebooks nbval checks at once: one a core this process may use, at most 4 (each kernel holds its rows, the
# quickstart's a model: a few GiB each)
CHECK_JOBS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def numbered(names: list[str] | None = None) -> list[Path]:
    """The numbered notebooks whose file names start with one of ``names`` (all when None), in run order."""
    found = sorted(FOLDER.glob("[0-9][0-9]_*.ipynb"))
    chosen = [nb for nb in found if not names or any(nb.name.startswith(n) for n in names)]
    if not chosen:
        raise SystemExit(f"no notebook matches {names}; available: {[nb.name for nb in found]}")
    return chosen


def execute(notebook: Path, target: Path, parameters: dict, cwd: Path) -> None:
    """Run ``notebook`` with papermill (``parameters`` injected only when there are any) and write it to ``target``."""
    papermill.execute_notebook(
        str(notebook), str(target), parameters=parameters, cwd=str(cwd), progress_bar=False, config=KERNEL_CONFIG
    )


def settle(executed: Path, notebook: Path) -> None:
    """Write the executed notebook over the committed one without its run metadata (``RUN_METADATA``)."""
    nb = nbformat.read(executed, as_version=4)
    for holder in [nb, *nb.cells]:
        for key in RUN_METADATA:
            holder.metadata.pop(key, None)
    nbformat.write(nb, notebook)


def execute_all(chosen: list[Path], parameters: dict, out_dir: Path | None) -> list[str]:
    """Execute ``chosen`` one after the other, each notebook's progress shown: written back in place (``out_dir``
    None) or into ``out_dir`` with ``parameters``; the paths written."""
    written = []
    with tempfile.TemporaryDirectory(prefix="fairkv-notebooks-") as scratch:
        for number, notebook in enumerate(chosen, start=1):
            target = notebook if out_dir is None else out_dir / notebook.name
            print(f"[{number}/{len(chosen)}] {notebook.name} -> {target}", flush=True)
            began = time.monotonic()
            with Monitor(Path(scratch) / "state.json"):
                if out_dir is None:
                    execute(notebook, Path(scratch) / notebook.name, {}, FOLDER)
                    settle(Path(scratch) / notebook.name, notebook)
                else:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    execute(notebook, target, parameters, out_dir)
            print(f"  {notebook.name} done in {duration(time.monotonic() - began)}", flush=True)
            written.append(str(target))
    return written


def check(notebook: Path) -> tuple[int, str]:
    """Re-execute the committed ``notebook`` under nbval in this environment (the kernel inherits it, a frozen run
    included) and compare each cell's output with the committed one; pytest's exit status and what it printed."""
    command = [sys.executable, "-m", "pytest", str(notebook), "-q", "-p", "no:cacheprovider", "--nbval"]
    command += ["--nbval-current-env", "--nbval-sanitize-with", str(SANITIZE), "-o", "addopts="]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=os.environ.copy(), capture_output=True, text=True, errors="replace", check=False
    )
    return done.returncode, done.stdout + done.stderr


def check_all(chosen: list[Path], jobs: int = CHECK_JOBS, say=lambda line: print(line, flush=True)) -> list[str]:
    """``check`` each of ``chosen``, ``jobs`` at a time (a frozen notebook's kernel keeps about one core busy, the
    quickstart's live decode more): says when each starts (``[k/n] <name> -> checked by nbval``) and, when it ends,
    what nbval printed of it and its wall time, never two notebooks' lines interleaved; the names of those whose
    output differs, in ``chosen``'s order."""
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: at least one notebook at a time")
    failed, lock = set(), threading.Lock()

    def one(number: int, notebook: Path) -> None:
        with lock:
            say(f"[{number}/{len(chosen)}] {notebook.name} -> checked by nbval")
        began = time.monotonic()
        status, printed = check(notebook)
        with lock:
            say(printed.rstrip())
            say(f"  {notebook.name} done in {duration(time.monotonic() - began)}")
            if status:
                failed.add(notebook.name)

    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        for running in [pool.submit(one, number, nb) for number, nb in enumerate(chosen, start=1)]:
            running.result()
    finally:  # on an error or Ctrl-C, no notebook still queued starts
        pool.shutdown(wait=True, cancel_futures=True)
    return [nb.name for nb in chosen if nb.name in failed]
