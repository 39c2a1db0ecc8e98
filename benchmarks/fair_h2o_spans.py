"""Fair H2O: our span-local normalisation against the authors' (issue 17, item 8c), on Fig 9's H2O row.

    .venv/bin/python benchmarks/fair_h2o_spans.py --model qwen2.5-coder-1.5b --dtype bfloat16 --prompts 100

Appendix F.5 zeroes attention from another span's queries and divides each key's received attention by the number of
its span's causal queries; it names the two instruction spans, not the chat header before them nor the template suffix
after them. Ours (``presses.scoring.h2o_local``) scores over the spans as the prompt cuts them (the first absorbs the
header, the last the suffix). The authors' ``ObservedAttentionFairEvictionPress`` zeroes only attention from the raw
later instruction span's queries to the raw earlier span's keys, divides the earlier span's keys by (earlier_end - k)
and every other key by (L - k), and leaves header and suffix keys scored by every query. Both split the budget over
the same extended spans. This runs the same prompts (normal order, the paper's attack) with fair H2O under both
scorings from one prefill each (``score_once.prefill`` with the local scorer swapped) and prints, per ratio, the keep rate
of each span, the attack refusal and the directive leakage under each, and the paired difference with its 95%
interval over prompts (``fairkv.report.verdicts.difference``).
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from dataclasses import replace

import pandas as pd
import torch

from fairkv.core import data, generation, metrics, models, prompts, score_once
from fairkv.core.presses import Setting, rates, registry
from fairkv.report import verdicts

AUTHORS = "authors'"


def raw_spans(prompt: prompts.Prompt) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two instruction spans without the chat header (before the system text) and the template suffix (after it)."""
    begin = prompt.text.index(prompt.system_text)
    end = begin + len(prompt.system_text)
    first = next(i for i, (s, _) in enumerate(prompt.offsets) if s >= begin)
    last = max(i for i, (_, e) in enumerate(prompt.offsets) if e <= end) + 1
    earlier, later = prompt.spans
    return (first, earlier.end), (later.start, last)


def authors_h2o(keys: torch.Tensor, attentions: torch.Tensor, earlier: tuple[int, int], later: tuple[int, int]):
    """The authors' ObservedAttentionFairEvictionPress.score (their repository, kvpress/presses/
    observed_attention_fair_eviction_press.py), on our tensors."""
    batch, kv_heads, n, _ = keys.shape
    mask = attentions.new_ones((n, n))
    mask[later[0] : later[1], earlier[0] : earlier[1]] = 0.0
    per_head = (attentions * mask).float().sum(dim=2)
    position = torch.arange(n, dtype=torch.float32)
    counts = torch.where((position >= earlier[0]) & (position < earlier[1]), earlier[1] - position, n - position)
    per_head = per_head / counts.clamp_min(1)
    return per_head.view(batch, kv_heads, -1, n).mean(2)


@contextmanager
def authors_scoring(earlier, later):
    saved = registry.REGISTRY["h2o"]
    registry.REGISTRY["h2o"] = replace(
        saved,
        local=lambda press, module, hidden, keys, values, attentions, kwargs, spans: authors_h2o(
            keys, attentions, earlier, later
        ),
    )
    try:
        yield
    finally:
        registry.REGISTRY["h2o"] = saved


def shared(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> float:
    """The share of kept positions two kept sets have in common, mean over layers and KV heads."""
    common = [
        torch.isin(a[layer][0, h], b[layer][0, h]).float().mean() for layer in a for h in range(a[layer].shape[1])
    ]
    return float(torch.stack(common).mean())


def measure(model: str, dtype: str, n: int, ratios: tuple[float, ...], max_new_tokens: int, batch: int) -> pd.DataFrame:
    lm = models.load_model(model, dtype=getattr(torch, dtype))
    templates, attack = data.load_defense_templates(), data.paper_attack().text
    rows, items = [], []
    for record in data.load_records("sys_ifeval_shuffled")[:n]:
        prompt = prompts.paper_prompt(lm.tokenizer, record, templates, "normal")
        earlier, later = raw_spans(prompt)
        with authors_scoring(earlier, later):
            theirs = score_once.prefill(lm, prompt, ("h2o",))
        ours = score_once.prefill(lm, prompt, ("h2o",))
        for ratio in ratios:
            cuts = {
                scorer: score_once.cut(prefilled, Setting("h2o", ratio=ratio, variant="fair"))
                for scorer, prefilled in (("ours", ours), (AUTHORS, theirs))
            }
            for scorer, cut in cuts.items():
                keep = rates.keep_rates(cut.kept, prompt.spans, prompt.n_tokens)
                rows.append(
                    {
                        "key": record.key,
                        "scorer": scorer,
                        "ratio": ratio,
                        **keep,
                        "shared kept": shared(cuts["ours"].kept, cuts[AUTHORS].kept),
                    }
                )
                items.append((prompt, cut))
    answers = generation.answer_batch(
        lm, [(cut, prompt.query_ids(attack)) for prompt, cut in items], max_new_tokens, batch_size=batch
    )
    for row, (prompt, _), answer in zip(rows, items, answers):
        row.update(metrics.attack_scores(prompt.references, answer.text))
    return pd.DataFrame(rows)


def compare(frame: pd.DataFrame) -> pd.DataFrame:
    out = []
    for ratio, group in frame.groupby("ratio"):
        side = lambda scorer, column, group=group: group[group["scorer"] == scorer].set_index("key")[column]
        out.append(
            {
                "r": ratio,
                "measure": "shared kept positions",
                "ours": "",
                AUTHORS: "",
                f"ours - {AUTHORS}": f"{group['shared kept'].mean():.3f} in common",
            }
        )
        for column in ("defense", "directive", "refused", "leak_directive"):
            ours, theirs = side("ours", column), side(AUTHORS, column)
            out.append(
                {
                    "r": ratio,
                    "measure": column,
                    "ours": f"{ours.mean():.3f}",
                    AUTHORS: f"{theirs.mean():.3f}",
                    f"ours - {AUTHORS}": verdicts.difference(ours, theirs).signed(),
                }
            )
    return pd.DataFrame(out)


def arguments(doc: str) -> argparse.Namespace:
    """The command line both fair-eviction comparisons take (this one and ``fair_authors.py``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=100, help="first sys_ifeval_shuffled prompts, normal order")
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.3, 0.5, 0.7])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=128)
    return parser.parse_args()


def main() -> None:
    args = arguments(__doc__)
    frame = measure(args.model, args.dtype, args.prompts, tuple(args.ratios), args.max_new_tokens, args.batch_size)
    print(
        f"fair H2O, {args.model} ({args.dtype}), {frame['key'].nunique()} prompts (sys_ifeval_shuffled, normal order), "
        f"the paper's attack, {args.max_new_tokens} new tokens; keep rate per span, refusal rate, directive ROUGE-L "
        "leakage; paired difference with its 95% interval over prompts\n"
    )
    print(compare(frame).to_markdown(index=False))


if __name__ == "__main__":
    main()
