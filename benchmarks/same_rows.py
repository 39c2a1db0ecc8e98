"""Do two checkouts compute the same rows? A refactor's check where ``fairkv verify`` cannot run.

    .venv/bin/python benchmarks/same_rows.py --base main

A change to code rows run through moves their fingerprint; ``fairkv verify --sample 20`` then recomputes committed
rows in their own precision before ``fairkv restamp``. The cpu profile's rows are bfloat16, and on a CPU without
bfloat16 arithmetic (AVX2 only: ``benchmarks/results/bfloat16_avx2.txt``) they cannot be recomputed as they were. This
script is the evidence such a machine can give: a small float32 grid of every kind of row, computed by this checkout
and by ``--base`` (a git revision, checked out in a temporary worktree) into two empty folders, each in its own
process, and compared row by row on every field but timings and stamps (``verify.IGNORED``):

- the sweep (``experiment.run``): SmolLM2-135M, 2 prompts, both orders, the paper's five presses and AdaKV (built per
  setting), every variant, lam 0, 0.5 and 1, r = 0, 0.3 and 0.6, the benign, attack and keep queries, 12 new tokens;
- the operative words' keep rates (``operative.run``) and the press atlas's (``atlas.run``, every runnable press).

It says which rows differ and how; it does not replace ``verify`` (other precision, other prompts), and the branch's
stores keep their stamps until a bfloat16 CPU verifies them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from fairkv.core.paths import REPO_ROOT
from fairkv.runs import atlas, experiment, operative
from fairkv.runs.store import ResultsStore
from fairkv.runs.verify import IGNORED, differences

SMOLLM = dict(model="smollm2-135m", n_prompts=2, orders=("normal", "flipped"), dtype="float32")
SWEEP = dict(
    policies=("streamingllm", "h2o", "snapkv", "tova", "knorm", "adakv(snapkv)"),
    variants=("base", "whitelist", "fair", "fair+whitelist"),
    lams=(0.0, 0.5, 1.0),
    ratios=(0.0, 0.3, 0.6),
    queries=("benign", "attack", "keep"),
    max_new_tokens=12,
    batch_size=16,
)
OPERATIVE = dict(
    policies=("streamingllm", "snapkv", "knorm"),
    variants=("base", "whitelist", "fair"),
    lams=(0.5, 1.0),
    ratios=(0.0, 0.5, 0.7),
    queries=("attack",),
)
ATLAS = dict(profile="ci", n_prompts=1, ratios=(0.3, 0.7))
FRAME = "sweep_rows.pkl"  # the sweep's returned rows (labelled per setting asked), compared too


def compute(folder: Path) -> None:
    """Every kind of row into ``folder``, by whichever fairkv this process imports."""
    rows = experiment.run(experiment.Grid(**SMOLLM, **SWEEP), folder, progress=False)
    rows.to_pickle(folder / FRAME)
    operative.run(experiment.Grid(**SMOLLM, **OPERATIVE), folder, progress=False)
    atlas.run(atlas.Plan(**ATLAS), folder, progress=False)


def compare(base: Path, here: Path) -> int:
    """Print, per store, the rows of each and how many differ; return the number that differ."""
    differing = 0
    for path in sorted(base.rglob("*.jsonl")):
        stored, fresh = ResultsStore(path).rows(), ResultsStore(here / path.relative_to(base)).rows()
        changed = {cell: differences(row, fresh[cell]) for cell, row in stored.items() if cell in fresh}
        changed = {cell: names for cell, names in changed.items() if names}
        lost, new = stored.keys() - fresh.keys(), fresh.keys() - stored.keys()
        differing += len(changed) + len(lost) + len(new)
        print(
            f"{path.relative_to(base)}: {len(stored)} rows at the base, {len(fresh)} here; "
            f"{len(changed)} differ, {len(lost)} only at the base, {len(new)} only here"
        )
        for cell, names in list(changed.items())[:3]:
            print(f"  {cell}: {', '.join(names)}")
    frames = [pd.read_pickle(folder / FRAME) for folder in (base, here)]
    columns = sorted(set(frames[0].columns) - IGNORED)
    same = set(frames[0].columns) == set(frames[1].columns) and frames[0][columns].astype(str).equals(
        frames[1][columns].astype(str)
    )
    differing += not same
    print(
        f"the sweep's returned rows ({len(frames[0])} labelled per setting asked): {'the same' if same else 'DIFFER'}"
    )
    return differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="main", help="the git revision to compare this checkout with")
    parser.add_argument("--compute", type=Path, help=argparse.SUPPRESS)  # a child process: compute into this folder
    args = parser.parse_args()
    if args.compute:
        compute(args.compute)
        return
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        revision = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", args.base], check=True, capture_output=True, text=True
        ).stdout.strip()
        worktree = ["git", "-C", str(REPO_ROOT), "worktree", "add", "-q", "--detach", str(work / "tree"), revision]
        subprocess.run(worktree, check=True)
        try:
            for name, tree in (("base", work / "tree"), ("here", REPO_ROOT)):
                start = time.perf_counter()  # this script's compute, importing the fairkv of ``tree``
                env = {**os.environ, "PYTHONPATH": str(tree), "FAIRKV_FROZEN": "0"}
                command = [sys.executable, str(Path(__file__).resolve()), "--compute", str(work / name)]
                subprocess.run(command, check=True, env=env, cwd=tree)
                print(
                    f"{name} ({revision if name == 'base' else 'this checkout'}): {time.perf_counter() - start:.0f} s"
                )
            differing = compare(work / "base", work / "here")
        finally:
            subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(work / "tree")])
    print(f"{differing} rows differ" if differing else "every row the same")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
