"""One formatter for the whole tree (ruff's, line length 120, ``pyproject.toml``): a file it would rewrite fails here,
as it fails ``make test-fast``. Formatting never changes a syntax tree, so it never changes the result code's
fingerprint (``fairkv.runs.fingerprint`` hashes syntax trees)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_tree_is_formatted():
    ruff = Path(sys.executable).with_name("ruff")
    checked = subprocess.run(
        [str(ruff), "format", "--check", "fairkv", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
