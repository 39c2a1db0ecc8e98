"""Every path fairkv reads or writes, in one place.

Paths are rooted at the repository (for notebooks, figures and results) or come from an environment setting:

- ``FAIRKV_DATA_DIR``: the reference data (sys_ifeval, RaccoonBench); no default, the data is never copied into the repo.
- ``FAIRKV_CACHE_DIR``: converted model weights and NLTK tables; default ``~/.cache/fairkv``.
- ``FAIRKV_RESULTS_DIR``: results store; default ``<repo>/results``.
- ``FAIRKV_FIGURES_DIR``: figures and tables; default ``<repo>/figures``.
- ``FAIRKV_REPORTS_DIR``: executed notebooks (``fairkv reproduce``); default ``<repo>/reports``.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESOURCES = Path(__file__).resolve().parent / "resources"
DATA_DIR_SETTING = "FAIRKV_DATA_DIR"


def _from_env(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().resolve() if value else default


def data_dir() -> Path | None:
    """The reference data directory from ``FAIRKV_DATA_DIR``, or None when the setting is absent."""
    value = os.environ.get(DATA_DIR_SETTING)
    return Path(value).expanduser().resolve() if value else None


def cache_dir() -> Path:
    return _from_env("FAIRKV_CACHE_DIR", Path.home() / ".cache" / "fairkv")


def results_dir() -> Path:
    return _from_env("FAIRKV_RESULTS_DIR", REPO_ROOT / "results")


def figures_dir() -> Path:
    return _from_env("FAIRKV_FIGURES_DIR", REPO_ROOT / "figures")


def reports_dir() -> Path:
    return _from_env("FAIRKV_REPORTS_DIR", REPO_ROOT / "reports")
