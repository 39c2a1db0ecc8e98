"""Does the model obey the defense under compression? Refusals and ROUGE-L leakage per policy, ratio and order.

The probe of issue 9, on the embedded Qwen2.5-Coder-1.5B-Instruct by default:

    .venv/bin/python benchmarks/defense_compliance.py --n 12 --max-new-tokens 64

For each setting: how many attack responses give the defense's refusal, how many leak (ROUGE-L > 0.3), how many do
neither, and the mean directive ROUGE-L recall. One compressed cache per system prompt and setting.
"""

from __future__ import annotations

import argparse

import pandas as pd

from fairkv.core import data, generation, metrics, models, prompts
from fairkv.core.presses import Setting

SETTINGS = [(None, 0.0)] + [(p, r) for p in ("streamingllm", "snapkv") for r in (0.3, 0.5, 0.7)]


def measure(model: str, n: int, max_new_tokens: int, orders: list[str]) -> pd.DataFrame:
    lm = models.load_model(model)
    records = data.load_sys_ifeval("sys_ifeval_shuffled", limit=n)
    templates, attack = data.load_defense_templates(), data.paper_attack().text
    rows = []
    for order in orders:
        for record in records:
            prompt = prompts.paper_prompt(lm.tokenizer, record, templates, order=order)
            query = prompt.query_ids(attack)
            for policy, ratio in SETTINGS:
                reply = generation.answer(
                    lm, generation.compress(lm, prompt, Setting(policy, ratio=ratio)), query, max_new_tokens
                )
                leaks = {name: metrics.leakage(ref, reply.text) for name, ref in prompt.references.items()}
                rows.append(
                    {
                        "order": order,
                        "policy": policy or "none",
                        "ratio": ratio,
                        "key": record.key,
                        "label": metrics.attack_label(reply.text, leaks),
                        "leak_directive": leaks["directive"],
                    }
                )
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--n", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--orders", nargs="+", default=["normal", "flipped"])
    args = parser.parse_args()
    frame = measure(args.model, args.n, args.max_new_tokens, args.orders)
    table = frame.groupby(["order", "policy", "ratio"], sort=False).agg(
        refused=("label", lambda s: f"{(s == 'refused').sum()}/{len(s)}"),
        leaked=("label", lambda s: f"{(s == 'leaked').sum()}/{len(s)}"),
        other=("label", lambda s: f"{(s == 'other').sum()}/{len(s)}"),
        leak_directive=("leak_directive", "mean"),
    )
    print(f"model {args.model}, n = {args.n} prompts (sys_ifeval_shuffled), max_new_tokens {args.max_new_tokens}\n")
    print(table.round(3).reset_index().to_markdown(index=False))


if __name__ == "__main__":
    main()
