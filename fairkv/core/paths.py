"""Every path fairkv reads or writes, in one place.

Paths are rooted at the repository (for notebooks, figures and results) or come from an environment setting:

- ``FAIRKV_DATA_DIR``: the reference data (sys_ifeval, RaccoonBench); default ``<repo>/data`` (shipped with fairkv).
- ``FAIRKV_CACHE_DIR``: converted model weights and NLTK tables; default ``~/.cache/fairkv``.
- ``FAIRKV_RESULTS_DIR``: results store; default ``<repo>/results``.
- ``FAIRKV_FIGURES_DIR``: figures and tables; default ``<repo>/figures``.
- ``FAIRKV_REPORTS_DIR``: executed notebooks (``fairkv reproduce``); default ``<repo>/reports``.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RESOURCES = Path(__file__).resolve().parents[1] / "resources"
DATA_DIR_SETTING = "FAIRKV_DATA_DIR"


def _from_env(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().resolve() if value else default


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
