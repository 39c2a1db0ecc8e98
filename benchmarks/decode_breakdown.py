"""Where the engine's decoding time goes: the running batch's occupancy and the queries' own prefill (issue 37).

    .venv/bin/python benchmarks/decode_breakdown.py --model qwen2.5-coder-1.5b --dtype bfloat16 --prompts 4 \
        --batch-size 64 128

For each batch size, ``experiment.run`` on a fresh store (the paper's five policies, r = 0.25 / 0.5 / 0.75, both
queries, ``--max-new-tokens``) with the model's forward timed call by call: the decoding steps (one new token per
row: how many, how many rows each carried on average, rows per second inside them) and the query prefills that start
rows in the running batch (each query's tokens over its cache: rows, mean padded query length, seconds). Generated
tokens per second end to end are what ``sweep_throughput.py`` compares with this machine's matmul limit; the query
tokens are work it does not count. Beside them, this machine's matmul limit at the batch size
(``sweep_throughput.matmul_limit``, measured in the same run) and the engine's share of it counting generated tokens
only (``sweep_throughput.py``'s share) and counting every token row the model ran (generated and query tokens).
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time

import torch
from sweep_throughput import matmul_limit

from fairkv.core import models
from fairkv.runs import experiment


class TimedForward:
    """The model's forward, timed and sorted into decoding steps (one input token per row) and query prefills."""

    def __init__(self, lm: models.LoadedModel):
        self.forward, self.steps, self.starts = lm.model.forward, collections.Counter(), []
        self.step_s = self.start_s = 0.0
        self.seconds = collections.Counter()  # rows per step -> seconds in such steps

    def __call__(self, *args, **kwargs):
        ids = kwargs.get("input_ids")
        start = time.perf_counter()
        out = self.forward(*args, **kwargs)
        seconds = time.perf_counter() - start
        if ids is not None and ids.shape[1] == 1:
            self.steps[ids.shape[0]] += 1
            self.seconds[ids.shape[0]] += seconds
            self.step_s += seconds
        elif ids is not None:
            self.starts.append((ids.shape[0], ids.shape[1]))
            self.start_s += seconds
        return out


def measure(lm: models.LoadedModel, grid: experiment.Grid) -> None:
    timed = TimedForward(lm)
    lm.model.forward = timed
    try:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            rows = experiment.run(grid, folder, progress=False, lm=lm)
        wall = time.perf_counter() - start
    finally:
        lm.model.forward = timed.forward
    computed = rows.drop_duplicates("cell_id")
    tokens = int(computed["new_tokens"].sum())
    n_steps = sum(timed.steps.values())
    step_rows = sum(batch * count for batch, count in timed.steps.items())
    started = sum(rows for rows, _ in timed.starts)
    query_tokens = sum(rows * length for rows, length in timed.starts)
    print(f"batch {grid.batch_size}: {tokens} generated tokens in {wall:.1f} s = {tokens / wall:.1f} tok/s end to end")
    print(
        f"  decoding steps: {n_steps}, {step_rows / n_steps:.1f} rows per step on average "
        f"({step_rows / (n_steps * grid.batch_size):.0%} of the batch), {timed.step_s:.1f} s = "
        f"{step_rows / timed.step_s:.1f} rows/s"
    )
    thin = [batch for batch in timed.steps if batch < grid.batch_size / 2]
    print(
        f"  of them with less than half the batch (the run's last answers): {sum(timed.steps[b] for b in thin)} "
        f"steps, {sum(b * timed.steps[b] for b in thin)} rows, {sum(timed.seconds[b] for b in thin):.1f} s"
    )
    print(
        f"  query prefills: {len(timed.starts)}, {started} rows, {query_tokens / started:.0f} query tokens per row "
        f"(padded), {timed.start_s:.1f} s = {query_tokens / timed.start_s:.1f} query tokens/s"
    )
    print(f"  the rest (prompt prefills, cuts, scoring, the store): {wall - timed.step_s - timed.start_s:.1f} s")
    limit = matmul_limit(lm, grid.batch_size)
    print(
        f"  limit (matmuls of the model's shapes at batch {grid.batch_size}): {limit:.1f} tok/s; engine / limit "
        f"{tokens / wall / limit:.1%} counting generated tokens, {(tokens + query_tokens) / wall / limit:.1%} "
        f"counting generated and query tokens; generated tokens are {tokens / (tokens + query_tokens):.0%} of the "
        "token rows run, the most that share could reach"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16", choices=experiment.DTYPES)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--benign-tokens", type=int, help="the benign query's budget (default: --max-new-tokens)")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[64])
    args = parser.parse_args()
    lm = models.load_model(args.model, dtype=getattr(torch, args.dtype))
    print(
        f"model {args.model} in {args.dtype}, {args.prompts} prompts x 5 policies x 3 ratios x 2 queries, "
        f"new tokens {args.benign_tokens or args.max_new_tokens} benign / {args.max_new_tokens} attack, "
        f"{torch.get_num_threads()} threads"
    )
    for batch in args.batch_size:
        grid = experiment.Grid(
            model=args.model,
            n_prompts=args.prompts,
            ratios=(0.25, 0.5, 0.75),
            max_new_tokens=args.max_new_tokens,
            benign_tokens=args.benign_tokens,
            dtype=args.dtype,
            batch_size=batch,
        )
        measure(lm, grid)


if __name__ == "__main__":
    main()
