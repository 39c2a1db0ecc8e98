"""Which operations make a row's logits depend on the batch it is decoded in (issue 50, item 8).

One prompt (the first sys_ifeval_shuffled record with the paper's attack), its next-token logits computed:
(a) alone (batch 1);
(b) in a batch of ``--copies`` identical rows: the same row, only the matmuls' batch dimension differs;
(c) in a batch of two beside a longer prompt, left-padded with an attention mask: the row's attention spans a padded
    width and the matmuls see another shape;
(d) one decoding step over the cache, alone and in a batch of ``--copies``.
Each compared with (a): the largest |logit change|, in units of the precision's rounding step at the logits' scale,
and whether the top token changes. Run in bfloat16 and float32.

    .venv/bin/python benchmarks/batch_dependence.py
"""

from __future__ import annotations

import argparse

import torch

from fairkv.core import data, models, prompts


def _step(lm, ids, mask=None):
    with torch.no_grad():
        out = lm.model(input_ids=ids, attention_mask=mask, use_cache=True)
    return out.logits[:, -1].float(), out.past_key_values


def compare(reference: torch.Tensor, other: torch.Tensor, dtype: torch.dtype) -> str:
    scale = reference.abs().max().item()
    step = scale * (2.0 ** -(8 if dtype == torch.bfloat16 else 24))
    delta = (reference - other).abs().max().item()
    same = int(reference.argmax()) == int(other.argmax())
    return f"max |change| {delta:.4g} ({delta / step:.1f} rounding steps at the logits' scale); top token {'same' if same else 'CHANGED'}"


def measure(model: str, dtype: torch.dtype, copies: int) -> list[str]:
    lm = models.load_model(model, dtype=dtype)
    records = data.load_records("sys_ifeval_shuffled")[:2]
    templates = data.load_defense_templates()
    built = [prompts.paper_prompt(lm.tokenizer, record, templates, "normal") for record in records]
    query = data.paper_attack().text
    ids = torch.cat([built[0].ids, built[0].query_ids(query)], dim=1)
    longer = torch.cat([built[1].ids, built[1].query_ids(query), built[1].ids[:, :40]], dim=1)
    alone, cache = _step(lm, ids)
    batch, _ = _step(lm, ids.repeat(copies, 1))
    pad = longer.shape[1] - ids.shape[1]
    padded = torch.cat([torch.full((1, pad), lm.tokenizer.pad_token_id or 0), ids], dim=1)
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones_like(ids)], dim=1)
    beside, _ = _step(lm, torch.cat([padded, longer]), torch.cat([mask, torch.ones_like(longer)]))
    token = alone.argmax(-1, keepdim=True)
    with torch.no_grad():
        one = lm.model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1].float()
        _, many_cache = _step(lm, ids.repeat(copies, 1))
        many = lm.model(input_ids=token.repeat(copies, 1), past_key_values=many_cache, use_cache=True).logits[:, -1]
    name = str(dtype).split(".")[-1]
    return [
        f"{name}, prompt of {ids.shape[1]} tokens:",
        f"  (b) batch of {copies} identical rows: {compare(alone[0], batch[0], dtype)}",
        f"  (c) beside a prompt {pad} tokens longer, left-padded and masked: {compare(alone[0], beside[0], dtype)}",
        f"  (d) one decoding step, batch of {copies}: {compare(one[0], many[0].float(), dtype)}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--copies", type=int, default=8)
    args = parser.parse_args()
    for dtype in (torch.bfloat16, torch.float32):
        print("\n".join(measure(args.model, dtype, args.copies)), flush=True)


if __name__ == "__main__":
    main()
