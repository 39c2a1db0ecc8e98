"""Engine vs the plain loop the authors use, side by side in one process; this machine's limit; keep-rate sweeps.

    .venv/bin/python benchmarks/sweep_throughput.py --model qwen2.5-coder-1.5b --dtype bfloat16 \
        --prompts 4 --max-new-tokens 64 --batch-size 64 --plain-prompts 2 --float32-prompts 1

(a) plain loop: for every prompt, policy and ratio, prefill with the press (kvpress's hook) and answer each query at
    batch size 1 (kvpress's pipeline decode); nothing is shared. It runs at the engine's precision on the first
    ``--plain-prompts`` prompts, and (a') at float32 (today's main before bfloat16) on the first ``--float32-prompts``.
(b) engine: ``experiment.run`` on a fresh store: one prefill per prompt, every setting cut from it, one running
    decode batch.
(c) the machine's limit: the model's linear layers (every decoder layer and the LM head) run as plain matmuls on a
    batch of ``--batch-size`` rows at the engine's precision: tokens per second if attention, the cache and Python
    cost nothing.
Prints generated tokens per second (end to end: prefill, compression, decoding), the ratios, the engine's share of
the limit, and the share of responses identical between (a) and (b). Then the keep-rate sweep over 10 ratios both
ways (with a check that the kept sets are identical). The cost of the mitigations is ``benchmarks/runtime.py``.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from fairkv.core import data, generation, models, prompts, score_once
from fairkv.core.presses import PAPER, Setting, rates
from fairkv.runs import experiment


def plain_loop(lm, records, templates, attack, policies, ratios, budgets):
    responses, tokens = {}, 0
    start = time.perf_counter()
    for record in records:
        prompt = prompts.paper_prompt(lm.tokenizer, record, templates, order="normal")
        for policy in policies:
            for ratio in ratios:
                compressed = generation.compress(lm, prompt, Setting(policy, ratio=ratio))
                for query, text in (("benign", record.user), ("attack", attack)):
                    reply = generation.answer(lm, compressed, prompt.query_ids(text), budgets[query])
                    responses[(record.key, policy, ratio, query)] = reply.text
                    tokens += reply.n_tokens
    return responses, tokens, time.perf_counter() - start


def engine_run(lm, grid):
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        rows = experiment.run(grid, folder, progress=False, lm=lm)
    seconds = time.perf_counter() - start
    responses = {(r.key, r.policy, r.ratio, r.query): r.response for r in rows.itertuples()}
    computed = rows.drop_duplicates("cell_id")  # an r = 0 row is listed under every policy but computed once
    return responses, int(computed["new_tokens"].sum()), seconds, computed


def query_tokens(lm, computed, records, templates, attack) -> int:
    """The queries' own tokens the engine ran (each query over its cache, unpadded): model rows, like generated
    tokens, that the generated tokens per second do not count."""
    by_key = {record.key: record for record in records}
    lengths = {}
    for key, query in computed[["key", "query"]].drop_duplicates().itertuples(index=False):
        prompt = prompts.paper_prompt(lm.tokenizer, by_key[key], templates, order="normal")
        lengths[(key, query)] = prompt.query_ids(attack if query == "attack" else by_key[key].user).shape[1]
    return sum(lengths[(r.key, r.query)] for r in computed.itertuples())


@torch.inference_mode()
def matmul_limit(lm, batch: int, repeats: int = 5) -> float:
    """Tokens per second of the model's linear layers alone on ``batch`` rows (best of ``repeats`` passes)."""
    linears = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(batch, m.in_features, dtype=lm.model.dtype) for m in linears}
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for m in linears:
            torch.nn.functional.linear(inputs[m.in_features], m.weight)
        best = min(best, time.perf_counter() - start)
    return batch / best


def keep_rate_sweep(lm, prompt, ratios):
    start = time.perf_counter()
    pressed = {(p, r): generation.compress(lm, prompt, Setting(p, ratio=r)).kept for p in PAPER for r in ratios}
    press_s = time.perf_counter() - start
    start = time.perf_counter()
    prefilled = score_once.prefill(lm, prompt, PAPER)
    cut = {(p, r): score_once.cut(prefilled, Setting(p, ratio=r)).kept for p in PAPER for r in ratios}
    cut_s = time.perf_counter() - start
    identical = all(torch.equal(cut[k][layer], pressed[k][layer]) for k in pressed for layer in pressed[k])
    keep = {k: rates.keep_rates(v, prompt.spans, prompt.n_tokens) for k, v in cut.items()}
    return press_s, cut_s, identical, keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--benign-tokens", type=int, help="the benign query's budget (default: --max-new-tokens)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16", choices=experiment.DTYPES)
    parser.add_argument("--plain-prompts", type=int, help="prompts for the plain loop (default: all)")
    parser.add_argument("--plain-ratios", type=float, nargs="+", help="ratios for the plain loops (default: all)")
    parser.add_argument("--float32-prompts", type=int, default=1, help="prompts for the float32 plain loop (0: skip)")
    args = parser.parse_args()

    lm = models.load_model(args.model, dtype=getattr(torch, args.dtype))
    records = data.load_sys_ifeval("sys_ifeval_shuffled", limit=args.prompts)
    templates, attack = data.load_defense_templates(), data.paper_attack().text
    policies = PAPER
    grid = experiment.Grid(
        model=args.model,
        n_prompts=args.prompts,
        ratios=tuple(args.ratios),
        max_new_tokens=args.max_new_tokens,
        benign_tokens=args.benign_tokens,
        batch_size=args.batch_size,
        dtype=args.dtype,
    )
    budgets = {query: grid.tokens_for(query) for query in ("benign", "attack")}
    plain_ratios = args.plain_ratios or args.ratios
    print(
        f"model {args.model} in {args.dtype}: {args.prompts} prompts x {len(policies)} policies x {len(args.ratios)} "
        f"ratios x 2 queries, new tokens {budgets['benign']} benign / {budgets['attack']} attack, batch {args.batch_size}, "
        f"{torch.get_num_threads()} threads"
    )
    engine_run(lm, grid.with_overrides(n_prompts=1, max_new_tokens=4, benign_tokens=None))  # warm-up
    plain_records = records[: args.plain_prompts]
    plain, plain_tokens, plain_s = plain_loop(lm, plain_records, templates, attack, policies, plain_ratios, budgets)
    ours, our_tokens, our_s, computed = engine_run(lm, grid)
    queried = query_tokens(lm, computed, records, templates, attack)
    limit = matmul_limit(lm, args.batch_size)
    same = sum(plain[k] == ours[k] for k in plain)
    engine_speed, plain_speed = our_tokens / our_s, plain_tokens / plain_s
    print(
        f"(a) plain loop, {args.dtype}, {len(plain_records)} prompts x {len(plain_ratios)} ratios: {plain_tokens} tokens in "
        f"{plain_s:.1f} s = "
        f"{plain_speed:.1f} tok/s"
    )
    if args.float32_prompts:
        lm32 = lm if args.dtype == "float32" else models.load_model(args.model, dtype=torch.float32)
        _, tokens32, seconds32 = plain_loop(
            lm32, records[: args.float32_prompts], templates, attack, policies, plain_ratios, budgets
        )
        print(
            f"(a') plain loop, float32, {args.float32_prompts} prompts: {tokens32} tokens in {seconds32:.1f} s = "
            f"{tokens32 / seconds32:.1f} tok/s"
        )
    print(
        f"(b) engine, {args.dtype}, {args.prompts} prompts: {our_tokens} tokens in {our_s:.1f} s = "
        f"{engine_speed:.1f} tok/s"
    )
    print(f"(c) limit, {args.dtype} matmuls of the model's shapes at batch {args.batch_size}: {limit:.1f} tok/s")
    print(
        f"engine / plain loop at {args.dtype}: {engine_speed / plain_speed:.2f}x"
        + (
            f"; engine / float32 plain loop: {engine_speed / (tokens32 / seconds32):.2f}x"
            if args.float32_prompts
            else ""
        )
        + f"; engine / limit: {engine_speed / limit:.1%}"
    )
    print(
        f"token rows the engine ran: {our_tokens} generated + {queried} of the queries over their caches; counting "
        f"both, engine / limit: {(our_tokens + queried) / our_s / limit:.1%}; generated tokens are "
        f"{our_tokens / (our_tokens + queried):.0%} of them, the most the generated share of the limit could reach"
    )
    print(f"identical responses, plain loop vs engine: {same}/{len(plain)} ({same / len(plain):.1%})")

    prompt = prompts.paper_prompt(lm.tokenizer, records[0], templates)
    ratios = [round(0.1 * i, 1) for i in range(10)]
    press_s, cut_s, identical, _ = keep_rate_sweep(lm, prompt, ratios)
    print(
        f"keep-rate sweep, 5 policies x 10 ratios: press at each ratio {press_s:.2f} s, score once + cut "
        f"{cut_s:.2f} s = {press_s / cut_s:.1f}x faster; kept sets identical: {identical}"
    )


if __name__ == "__main__":
    main()
