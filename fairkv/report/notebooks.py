"""The numbered notebooks as the reproduction: ``notebooks/NN_*.ipynb`` are committed executed at their defaults (the
cpu profile, rendered from the committed rows, every figure inline), so opening one shows the paper's figures and
tables as this artifact reproduces them.

Three ways to run them (``fairkv reproduce``): execute at their defaults and write the executed notebook back in place
(``execute`` then ``settle``: papermill's run metadata stripped, so a re-render from the same rows changes nothing
in git); execute at any other parameters and write the executed copy under ``reports/<profile>/``; or re-execute the
committed notebooks under nbval (``check``), which compares every cell's text output with the committed one (paths
and addresses masked by ``notebooks/sanitize.cfg``; a figure by the line ``figures.publish`` prints of what it plots,
never by its PNG bytes; the cells tagged ``nbval-ignore-output`` say why in the notebook) and writes no notebook.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import papermill
from traitlets.config import Config

from fairkv.core.paths import REPO_ROOT

FOLDER = REPO_ROOT / "notebooks"
SANITIZE = FOLDER / "sanitize.cfg"
# The kernel talks to papermill over local sockets (no TCP, so no unencrypted-TCP warning from ipykernel).
KERNEL_CONFIG = Config({"KernelManager": {"transport": "ipc"}})
# what papermill and nbclient record of one run (times, paths, parameters), never part of what a notebook shows
RUN_METADATA = ("papermill", "execution")


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


def check(notebook: Path) -> int:
    """Re-execute the committed ``notebook`` under nbval in this environment (the kernel inherits it, a frozen run
    included) and compare each cell's output with the committed one; pytest's exit status."""
    command = [sys.executable, "-m", "pytest", str(notebook), "-q", "-p", "no:cacheprovider", "--nbval"]
    command += ["--nbval-current-env", "--nbval-sanitize-with", str(SANITIZE), "-o", "addopts="]
    return subprocess.run(command, cwd=REPO_ROOT, env=os.environ.copy(), check=False).returncode
