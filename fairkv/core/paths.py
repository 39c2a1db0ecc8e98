"""Every path fairkv reads or writes, in one place.

Paths are rooted at the repository (for notebooks, figures and results) or come from an environment setting:

- ``FAIRKV_DATA_DIR``: the reference data (sys_ifeval, RaccoonBench); default ``<repo>/data`` (shipped with fairkv).
- ``FAIRKV_CACHE_DIR``: converted model weights and NLTK tables; default ``~/.cache/fairkv``.
- ``FAIRKV_RESULTS_DIR``: results store; default ``<repo>/results``.
- ``FAIRKV_FIGURES_DIR``: figures and tables; default ``<repo>/figures``.
- ``FAIRKV_REPORTS_DIR``: executed notebooks (``fairkv reproduce``); default ``<repo>/reports``.
- ``FAIRKV_REDECODED``: ``1`` reads, for each cell decoded again under another batch plan, that row instead of the
  store's (``fairkv.runs.redecode``; ``fairkv reproduce --redecoded``): the claims recomputed under decoding noise.
- ``FAIRKV_FROZEN``: ``1`` renders from stored results only (``fairkv reproduce --frozen``): a result that would be
  computed (a missing or stale row, timings of another plan) is an error (``FrozenError``) instead.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RESOURCES = Path(__file__).resolve().parents[1] / "resources"
DATA_DIR_SETTING = "FAIRKV_DATA_DIR"
FROZEN_SETTING = "FAIRKV_FROZEN"
REDECODED_SETTING = "FAIRKV_REDECODED"
REDECODED_FOLDER = "redecoded"  # beside a store: its cells decoded again (fairkv.runs.redecode)
SYNTHETIC_FOLDER = "synthetic"  # beside a figures folder: what fairkv's synthetic data made (a pipeline check)


class FrozenError(RuntimeError):
    """A frozen run (``FAIRKV_FROZEN=1``) found a result it would have to compute."""


def frozen() -> bool:
    """Whether this run renders from stored results only (``FAIRKV_FROZEN=1``)."""
    return os.environ.get(FROZEN_SETTING) == "1"


@contextmanager
def environment(name: str, value: str):
    """Within the block (and the processes it starts, which inherit it) the environment setting ``name`` is ``value``;
    restored after, or removed where it was unset."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def frozen_run(on: bool = True):
    """Within the block, and in the notebook kernels it starts (they inherit the setting), render from stored results
    only (``on``) or compute what is missing (not ``on``, whatever the environment said); restored after."""
    return environment(FROZEN_SETTING, "1" if on else "0")


def redecoded() -> bool:
    """Whether this run reads the cells decoded again in place of the store's rows (``FAIRKV_REDECODED=1``)."""
    return os.environ.get(REDECODED_SETTING) == "1"


def refuse_if_frozen(what: str, fix: str) -> None:
    """In a frozen run, stop at ``what`` would be computed, saying so and how to fix it; otherwise nothing."""
    if frozen():
        raise FrozenError(
            f"{what}; this run is frozen ({FROZEN_SETTING}=1, `fairkv reproduce --frozen`): it renders from stored "
            f"results and computes nothing. {fix}"
        )


def _from_env(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().resolve() if value else default


def shown(path: Path) -> str:
    """``path`` as a message shows it: relative to the repository when inside it, so that a notebook's output is the
    same in every clone."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def data_dir() -> Path:
    return _from_env(DATA_DIR_SETTING, REPO_ROOT / "data")


def cache_dir() -> Path:
    return _from_env("FAIRKV_CACHE_DIR", Path.home() / ".cache" / "fairkv")


def results_dir() -> Path:
    return _from_env("FAIRKV_RESULTS_DIR", REPO_ROOT / "results")


def figures_dir() -> Path:
    return _from_env("FAIRKV_FIGURES_DIR", REPO_ROOT / "figures")


def reports_dir() -> Path:
    return _from_env("FAIRKV_REPORTS_DIR", REPO_ROOT / "reports")


def synthetic_dir(folder: Path) -> Path:
    """Where a notebook that ran on fairkv's synthetic data writes in place of ``folder`` (``figures/<profile>/`` ->
    ``figures/synthetic/<profile>/``): a pipeline check, kept out of the real results."""
    folder = Path(folder)
    return folder.parent / SYNTHETIC_FOLDER / folder.name
