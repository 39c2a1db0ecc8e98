"""The authors' fair eviction against ours for K-Norm, SnapKV, TOVA and StreamingLLM (issue 83, item 4; H2O:
benchmarks/fair_h2o_spans.py).

    .venv/bin/python benchmarks/fair_authors.py --prompts 100

The authors' kvpress fork (Itisalex2/kvpress, ``kvpress/presses/<policy>_fair_eviction_press.py``) implements fair
eviction per policy for two adjacent spans, each extended to the prefix's start or end (the same partition as ours:
the first span absorbs the chat header, the last the template suffix). Their rules, re-expressed on our tensors:

- the budget: n_kept = int(L (1 - r)); the earlier span keeps floor(n_kept x its length / L) of its top scores, the
  later span the rest (K-Norm, SnapKV, TOVA). Ours apportions by largest remainder (``presses.budget``);
- K-Norm: the press's own score in each span. Ours: the same score (a key's norm reads no other token);
- SnapKV: each span's last window_size // 2 (earlier) or window_size - that (later) queries vote on the span's keys
  before them, averaged over the window and the KV group, pooled with the press's kernel; the window itself scores the
  span's maximum. Ours (Appendix F.4, ``scoring.snapkv_local``): the window split the same way, kvpress's own
  window score per span;
- TOVA: each span's last token's attention over the span's keys, averaged over heads, the anchor scoring the maximum.
  Ours (Appendix F.7): the same anchors;
- StreamingLLM: the 4 sinks score 1, a ramp from 0.1 to 0.9 over the rest of each span, one top-k over the whole prefix
  (their press keeps kvpress's ``compress``: no split of the budget). Ours: the sinks kept, the rest of the budget split
  in proportion to the spans' lengths without them, each span's most recent tokens (Appendix F.3).

Per policy and ratio this prints the share of kept positions the two rules have in common (each span's, the mean over
layers and KV heads, and the prompts where they part at all) and, on the prompts where they part, the attack's refusal
and directive leakage under each with the paired difference and its 95% interval (``verdicts.difference``).
"""

from __future__ import annotations

import time

import pandas as pd
import torch
import torch.nn.functional as F
from fair_h2o_spans import AUTHORS, arguments
from kvpress import BasePress
from transformers import DynamicCache

from fairkv.core import data, generation, metrics, models, prompts, score_once
from fairkv.core.progress import Bar
from fairkv.core.presses import Setting, get_policy
from fairkv.core.presses.selection import gather_kept
from fairkv.report import verdicts

POLICIES = ("knorm", "snapkv", "tova", "streamingllm")


def _snapkv(press, attentions: torch.Tensor, kv_heads: int, window: tuple[int, int], keys: tuple[int, int]):
    """Their ``_scores_from_attn_window``: queries ``window`` over ``keys``, averaged over queries, pooled, averaged
    over each KV group."""
    scores = attentions[..., window[0] : window[1], keys[0] : keys[1]].mean(dim=-2)
    scores = F.avg_pool1d(scores, kernel_size=press.kernel_size, padding=press.kernel_size // 2, stride=1)
    return scores.view(scores.shape[0], kv_heads, -1, keys[1] - keys[0]).mean(2)


def authors_scores(policy: str, press, keys: torch.Tensor, attentions, junction: int) -> torch.Tensor:
    """(1, kv_heads, L) scores of the authors' fair press of ``policy`` for spans [0, junction) and [junction, L)."""
    _, kv_heads, n, _ = keys.shape
    spans = ((0, junction), (junction, n))
    if policy == "knorm":
        return press.score(None, None, keys, None, None, None)
    scores = keys[..., 0].new_zeros((1, kv_heads, n)).float()
    if policy == "streamingllm":
        for start, end in ((press.n_sink, junction), (junction, n)):
            scores[..., start:end] = torch.linspace(0.1, 0.9, end - start)
        scores[..., : press.n_sink] = 1.0
        return scores
    earlier = min(press.window_size // 2, junction) if policy == "snapkv" else 1
    for (start, end), width in zip(spans, (earlier, press.window_size - earlier if policy == "snapkv" else 1)):
        window = (max(end - width, start), end)
        if policy == "snapkv":
            local = _snapkv(press, attentions.float(), kv_heads, window, (start, window[0]))
        else:  # TOVA: the span's last token over the span's keys before it, averaged over heads
            local = attentions[..., end - 1 : end, start : end - 1].float().mean(1).repeat(1, kv_heads, 1)
        scores[..., start : window[0]] = local
        scores[..., window[0] : window[1]] = local.amax(-1, keepdim=True)
    return scores


def authors_kept(policy: str, scores: torch.Tensor, junction: int, ratio: float) -> torch.Tensor:
    """Their selection: (1, kv_heads, n_kept) sorted positions."""
    n = scores.shape[-1]
    n_kept = int(n * (1 - ratio))
    if policy == "streamingllm":
        return scores.topk(n_kept, dim=-1).indices.sort(-1).values
    earlier = n_kept * junction // n
    picks = [scores[..., :junction].topk(earlier, dim=-1).indices]
    picks.append(scores[..., junction:].topk(n_kept - earlier, dim=-1).indices + junction)
    return torch.cat(picks, dim=-1).sort(-1).values


class Authors(BasePress):
    """Records, per layer, the authors' kept positions of ``policy`` at each of ``ratios``; compresses nothing."""

    def __init__(self, policy: str, junction: int, ratios: tuple[float, ...]):
        self.policy, self.junction, self.ratios = policy, junction, ratios
        self.press = get_policy(policy).build(0.5)
        self.kept = {ratio: {} for ratio in ratios}

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        scores = authors_scores(self.policy, self.press, keys, attentions, self.junction)
        for ratio in self.ratios:
            self.kept[ratio][module.layer_idx] = authors_kept(self.policy, scores, self.junction, ratio)
        return keys, values


def _cache(prefill: DynamicCache, kept: dict[int, torch.Tensor], prompt, setting: Setting) -> generation.Compressed:
    cache, positions = DynamicCache(), {}
    for layer, indices in kept.items():
        keys, values = prefill.layers[layer].keys, prefill.layers[layer].values
        kept_keys, kept_values, positions[layer] = gather_kept(keys, values, indices)
        cache.update(kept_keys, kept_values, layer)
    return generation.Compressed(cache, prompt.n_tokens, positions, 0.0, setting)


def in_common(a: dict, b: dict, span: tuple[int, int]) -> float:
    """The share of ``a``'s kept positions inside ``span`` that ``b`` keeps too, the mean over layers and KV heads."""
    shares = []
    for layer in a:
        for head in range(a[layer].shape[1]):
            mine = a[layer][0, head]
            mine = mine[(mine >= span[0]) & (mine < span[1])]
            shares.append(float(torch.isin(mine, b[layer][0, head]).float().mean()) if len(mine) else 1.0)
    return sum(shares) / len(shares)


@torch.inference_mode()
def measure(lm, n: int, ratios: tuple[float, ...], max_new_tokens: int, batch: int) -> pd.DataFrame:
    templates, attack = data.load_defense_templates(), data.paper_attack().text
    rows, items = [], []
    records = data.load_records("sys_ifeval_shuffled")[:n]
    bar = Bar(len(records) * len(POLICIES), "prefills (ours and theirs)")
    for record in records:
        prompt = prompts.paper_prompt(lm.tokenizer, record, templates, "normal")
        spans = [(s.start, s.end) for s in prompt.spans]
        for policy in POLICIES:
            collector, cache = Authors(policy, spans[0][1], ratios), DynamicCache()
            with collector(lm.model):
                lm.model.model(input_ids=prompt.ids.to(lm.device), past_key_values=cache)
            ours = score_once.prefill(lm, prompt, (policy,))
            for ratio in ratios:
                setting = Setting(policy, "fair", ratio=ratio)
                mine = score_once.cut(ours, setting)
                theirs = collector.kept[ratio]
                parted = any(not torch.equal(mine.kept[layer], theirs[layer]) for layer in theirs)
                row = {"key": record.key, "policy": policy, "ratio": ratio, "parted": parted}
                row |= {f"common {s.name}": in_common(mine.kept, theirs, span) for s, span in zip(prompt.spans, spans)}
                rows.append(row)
                if parted:
                    items += [
                        (row, "ours", prompt, mine),
                        (row, AUTHORS, prompt, _cache(cache, theirs, prompt, setting)),
                    ]
            bar.update()
    bar.close()
    answers = generation.answer_batch(
        lm, [(cut, prompt.query_ids(attack)) for _, _, prompt, cut in items], max_new_tokens, batch_size=batch
    )
    for (row, side, prompt, _), answer in zip(items, answers):
        scores = metrics.attack_scores(prompt.references, answer.text)
        row |= {f"refused {side}": scores["refused"], f"leak_directive {side}": scores["leak_directive"]}
    return pd.DataFrame(rows)


def compare(frame: pd.DataFrame) -> pd.DataFrame:
    out = []
    for (policy, ratio), group in frame.groupby(["policy", "ratio"], sort=False):
        parted = group[group["parted"]]
        line = {
            "policy": policy,
            "r": ratio,
            **{c: f"{group[c].mean():.3f}" for c in group if c.startswith("common ")},
            "prompts parted": f"{len(parted)} of {len(group)}",
        }
        for what in ("refused", "leak_directive"):
            if len(parted):
                mine, theirs = (parted.set_index("key")[f"{what} {side}"] for side in ("ours", AUTHORS))
                line[what] = f"{mine.mean():.2f} vs {theirs.mean():.2f}: {verdicts.difference(mine, theirs).signed()}"
            else:
                line[what] = "the same kept sets"
        out.append(line)
    return pd.DataFrame(out)


def main() -> None:
    args = arguments(__doc__)
    start = time.time()
    lm = models.load_model(args.model, dtype=getattr(torch, args.dtype))
    frame = measure(lm, args.prompts, tuple(args.ratios), args.max_new_tokens, args.batch_size)
    print(
        f"fair eviction, ours against the authors' fork, {args.model} ({args.dtype}), {frame['key'].nunique()} prompts "
        f"(sys_ifeval_shuffled, normal order), the paper's attack, {args.max_new_tokens} new tokens; per policy and r: "
        "the share of each span's kept positions (ours) the authors' rule keeps too, the prompts where any layer's "
        "kept set parts, and there the refusal rate and directive ROUGE-L leakage, ours vs theirs: ours - theirs "
        f"with its paired 95% interval ({time.time() - start:.0f} s)\n"
    )
    print(compare(frame).to_markdown(index=False))


if __name__ == "__main__":
    main()
