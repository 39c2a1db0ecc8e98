"""Appendix K (Figs 23-24): compression and decoding cost of base, whitelist and fair for each policy across r,
measured side by side in one process (``fairkv.runs.runtime``: warm-up, interleaved repeats, medians and IQRs).

    .venv/bin/python benchmarks/runtime.py --model smollm2-135m --repeats 5

Prints the summary per (policy, ratio, variant) and the headline: each variant's cost as a ratio to its base policy
(median over ratios). Notebook 09 runs the same measurement and plots it.
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch

from fairkv.core.presses import PAPER
from fairkv.runs import runtime
from fairkv.studies import runtime as runtime_study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--policies", nargs="+", default=list(PAPER))
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64, help="decoded per measurement (paper: 256)")
    args = parser.parse_args()

    chosen = runtime_study.STUDY.plan(
        "ci",
        model=args.model,
        policies=args.policies,
        ratios=args.ratios,
        n_prompts=args.prompts,
        repeats=args.repeats,
        new_tokens=args.new_tokens,
    )
    print(f"{chosen}; {torch.get_num_threads()} threads, 1 warm-up round")
    timings = runtime.run(chosen)
    summary = runtime.summarise(timings)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.round(4).to_string(index=False))
        print("\nratio to base (median over ratios):")
        print(runtime.headline(summary).to_string())


if __name__ == "__main__":
    main()
