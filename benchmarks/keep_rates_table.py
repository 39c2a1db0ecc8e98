"""Defense and directive keep rates per policy and variant (base, whitelist, fair), both orders, one ratio.

The mechanism behind the paper's Fig 7 and what the mitigations do to it, measured on real sys_ifeval prompts:

    .venv/bin/python benchmarks/keep_rates_table.py --model smollm2-135m --n 20 --ratio 0.5

Prints a Markdown table: mean keep rate over the prompts (per layer: mean over KV heads; then mean over layers).
"""

from __future__ import annotations

import argparse

import pandas as pd

from fairkv.core import data, generation, metrics, models, prompts
from fairkv.core.presses import MITIGATIONS, PAPER, Setting, get_policy


def measure(model: str, n: int, ratio: float) -> pd.DataFrame:
    lm = models.load_model(model)
    records = data.load_sys_ifeval("sys_ifeval_shuffled", limit=n)
    templates = data.load_defense_templates()
    rows = []
    for record in records:
        for order in ("normal", "flipped"):
            prompt = prompts.paper_prompt(lm.tokenizer, record, templates, order=order)
            for policy in PAPER:
                for variant in MITIGATIONS:
                    kept = generation.compress(lm, prompt, Setting(policy, ratio=ratio, variant=variant)).kept
                    rates = metrics.keep_rates(kept, prompt.spans, prompt.n_tokens)
                    rows.append({"order": order, "policy": get_policy(policy).label, "variant": variant, **rates})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=20, help="number of sys_ifeval_shuffled prompts")
    parser.add_argument("--ratio", type=float, default=0.5)
    args = parser.parse_args()
    frame = measure(args.model, args.n, args.ratio)
    table = (
        frame.groupby(["order", "policy", "variant"], sort=False)[["defense", "directive"]].mean().unstack("variant")
    )
    table.columns = [f"{span} {variant}" for span, variant in table.columns]
    print(f"model {args.model}, r = {args.ratio}, n = {args.n} prompts (sys_ifeval_shuffled), mean keep rate\n")
    print(table.round(3).reset_index().to_markdown(index=False))


if __name__ == "__main__":
    main()
