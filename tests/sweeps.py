"""A small sweep run in child processes (SmolLM2, 4 prompts, 5 settings, 8 new tokens), for the tests that kill,
race or resume real runs; and how to compare two runs' rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd

GRID = dict(
    n_prompts=4,
    policies=("streamingllm", "snapkv"),
    variants=("base", "fair"),
    lams=(0.0, 1.0),
    ratios=(0.0, 0.5),
    max_new_tokens=8,
    batch_size=5,  # 5 settings: one prompt per group
)
TIMINGS = ["prefill_s", "cut_s", "decode_s", "versions"]

SWEEP = textwrap.dedent(f"""
    import sys
    from fairkv.runs import experiment
    experiment.run(experiment.Grid(**{GRID!r}), sys.argv[1], progress=False, wait=sys.argv[2] == "wait")
    print("finished", flush=True)
""")


def sweep(folder: Path, out=None, wait: bool = True) -> subprocess.Popen:
    """The sweep into ``folder`` in a child process; its stdout to ``out`` (a file) when given."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", SWEEP, str(folder), "wait" if wait else "fail"],
        env=env,
        stdout=out,
        stderr=subprocess.PIPE,
    )


def complete_lines(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1] if path.exists() else []


def stable(frame: pd.DataFrame) -> str:
    """Rows without the fields that legitimately vary between runs (timings, and the versions dict checked apart),
    as JSON so that missing metrics (NaN) compare equal."""
    rows = frame.drop(columns=TIMINGS).sort_values(["key", "policy", "variant", "lam", "ratio", "query"])
    return json.dumps(rows.to_dict("records"), sort_keys=True)
