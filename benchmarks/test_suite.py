"""The test suite's wall time: `make test` on a fresh clone of this checkout, set-up timed apart (issue 33).

    .venv/bin/python benchmarks/test_suite.py            # this CPU
    .venv/bin/python benchmarks/test_suite.py --no-bf16  # a CPU without bfloat16 arithmetic, emulated on this one

As ``.ci/run`` runs it: the checkout's HEAD cloned into an empty folder, no pip cache, an empty model cache (the
embedded models are converted on first load, inside the tests' time), ``FAIRKV_FORBID_SKIPS`` set. ``--no-bf16`` sets
``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` for the whole run: oneDNN then leaves out AVX512-BF16 and AMX, and bfloat16 matmuls
fall to about a sixth of their speed while float32 keeps its own, as on an AVX2 Zen 3 (``ONEDNN_MAX_CPU_ISA=AVX2`` is
far slower than any real CPU). Prints the set-up time, the suite's wall time, the peak memory of its largest process
and pytest's own closing lines (its wall time and the five slowest items, tests/conftest.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(command: list[str], cwd: Path, env: dict) -> tuple[float, str, int]:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, done.stdout + done.stderr, done.returncode


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-bf16", action="store_true", help="emulate a CPU without bfloat16 arithmetic")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fairkv-suite-") as work:
        clone = Path(work) / "fairkv"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRKV_")}
        env.update(PIP_NO_CACHE_DIR="1", FAIRKV_CACHE_DIR=str(Path(work) / "cache"), FAIRKV_FORBID_SKIPS="1")
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "unknown CPU",
        )
        print(
            f"commit {commit.stdout.strip()}, {os.cpu_count()} cores ({cpu}), "
            f"{'bfloat16 arithmetic emulated away (ONEDNN_MAX_CPU_ISA=AVX512_CORE)' if args.no_bf16 else 'as is'}"
        )
        setup, output, status = timed(["make", "setup"], clone, env)
        if status:
            print(output[-3000:])
            return status
        print(f"make setup: {minutes(setup)}")
        if args.no_bf16:
            env["ONEDNN_MAX_CPU_ISA"] = "AVX512_CORE"
        wall, output, status = timed(["make", "test"], clone, env)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        lines = output.rstrip().splitlines()
        summary = next((i for i, line in enumerate(lines) if " slowest items " in line), len(lines) - 1)
        print(f"make test: {minutes(wall)} (exit status {status}), peak memory of one process {peak:.1f} GB")
        print("\n".join(lines[summary:]))
        return status


if __name__ == "__main__":
    sys.exit(main())
