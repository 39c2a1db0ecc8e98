"""One decoding step of a full running batch, by cache length: a ``DynamicCache`` against the running batch's slots.

    .venv/bin/python benchmarks/decode_step.py --model qwen2.5-coder-1.5b --dtype bfloat16 --rows 128 \
        --lengths 100 500 1000

For each cache length, a batch of ``--rows`` rows with random keys and values: the best of three decoding steps (the
model's forward on one token per row, grouped attention as the engine decodes) and the cost of one row leaving the
batch, (a) in a ``DynamicCache`` (each step concatenates its column onto the whole cache; a row leaves by selecting the
others) and (b) in ``fairkv.core.running``'s slots (each step writes its column; the last row moves into the freed
slot). Beside them, this machine's matmul limit at that many rows (``sweep_throughput.matmul_limit``).
"""

from __future__ import annotations

import argparse
import time

import torch
from sweep_throughput import matmul_limit
from transformers import DynamicCache

from fairkv.core import models
from fairkv.core.attention import decoding
from fairkv.core.running import Running
from fairkv.runs import experiment


def filled(lm: models.LoadedModel, rows: int, length: int) -> DynamicCache:
    config, dtype = lm.model.config, lm.model.dtype
    shape = (rows, config.num_key_value_heads, length, config.hidden_size // config.num_attention_heads)
    cache = DynamicCache()
    for layer in range(config.num_hidden_layers):
        cache.update(torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype), layer)
    return cache


@torch.inference_mode()
def dynamic(lm, rows: int, length: int) -> tuple[float, float]:
    cache, ids = filled(lm, rows, length), torch.zeros(rows, 1, dtype=torch.long)
    best = float("inf")
    for step in range(3):
        start = time.perf_counter()
        lm.model(
            input_ids=ids,
            past_key_values=cache,
            attention_mask=torch.ones(rows, length + step + 1, dtype=torch.long),
            position_ids=torch.full((rows, 1), length + step),
        )
        best = min(best, time.perf_counter() - start)
    start = time.perf_counter()
    cache.batch_select_indices(torch.arange(1, rows))
    return best, time.perf_counter() - start


@torch.inference_mode()
def slots(lm, rows: int, length: int) -> tuple[float, float]:
    running = Running.open(
        rows,
        filled(lm, rows, length),
        torch.ones(rows, length, dtype=torch.long),
        torch.full((rows, 1), length),
        torch.zeros(rows, 1),
        list(range(rows)),
    )
    ids, best = torch.zeros(rows, 1, dtype=torch.long), float("inf")
    for _ in range(3):
        start = time.perf_counter()
        bias = running.step()
        lm.model(input_ids=ids, past_key_values=running.cache, attention_mask=bias, position_ids=running.positions)
        best = min(best, time.perf_counter() - start)
        running.positions = running.positions + 1
    start = time.perf_counter()
    running.drop([0])
    return best, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16", choices=experiment.DTYPES)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--lengths", type=int, nargs="+", default=[100, 500, 1000])
    args = parser.parse_args()
    lm = models.load_model(args.model, dtype=getattr(torch, args.dtype))
    print(f"model {args.model} in {args.dtype}, {args.rows} rows, {torch.get_num_threads()} threads")
    with decoding(lm.model):
        for length in args.lengths:
            for name, measure in (("DynamicCache", dynamic), ("slots", slots)):
                step, leave = measure(lm, args.rows, length)
                print(
                    f"{length} cached tokens, {name}: step {step:.3f} s = {args.rows / step:.1f} rows/s; "
                    f"a row leaving {leave:.3f} s"
                )
    print(f"limit (matmuls of the model's shapes at {args.rows} rows): {matmul_limit(lm, args.rows):.1f} rows/s")


if __name__ == "__main__":
    main()
