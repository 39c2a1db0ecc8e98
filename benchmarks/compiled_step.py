"""The lever of a compiled decoding step (issue 37): ``torch.compile`` of the model's forward against the eager step.

    .venv/bin/python benchmarks/compiled_step.py --model qwen2.5-coder-1.5b --dtype bfloat16 \
        --points 128:300 128:900 40:600

For each point ROWS:CACHED, a running batch (``fairkv.core.running``) of ROWS rows with CACHED random keys and values
per row, decoding one token per row and step under the engine's grouped attention, the eager model's forward and the
compiled one (``torch.compile(model, dynamic=True)``: rows and columns symbolic, so it compiles once per kind of shape,
not per step) alternate on the same batch for ``--steps`` steps each; the median step of each, the gain, the seconds
the first compiled step took (compilation included) and the graphs compiled so far. Then the numerics, on a real
prompt (on random caches the two differ far more than on any real one: rounding differences grow through the layers):
the first paper prompt and its benign query prefilled on ``AGREEMENT_ROWS`` rows, one step eager and the same step
compiled: rows that pick the same next token and the largest logit difference (inductor fuses the elementwise work,
so bfloat16 rounds at other places than eager does).

The engine's slots write each step's column at ``end``, a Python int: compiled, every step would be a new graph
(dynamo specialises on it and gives up at its recompile limit). Here the column comes in as ``cache_position``, a
tensor (``TensorColumn``), the change the engine would need.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from decode_step import filled
from torch._dynamo.utils import counters

from fairkv.core import data, models, prompts
from fairkv.core.attention import decoding
from fairkv.core.running import Running, SlotLayer
from fairkv.runs import experiment

AGREEMENT_ROWS = 8


class TensorColumn(SlotLayer):
    """A ``SlotLayer`` that writes the step's column at ``cache_position`` (a tensor) instead of its Python ``end``."""

    def update(self, key_states, value_states, cache_kwargs=None):
        column = cache_kwargs["cache_position"]
        self.keys.index_copy_(2, column, key_states)
        self.values.index_copy_(2, column, value_states)
        self.end += 1
        return self.keys, self.values


def batch(rows: int, cache, logits) -> Running:
    cached = cache.get_seq_length()
    running = Running.open(
        rows,
        cache,
        torch.ones(rows, cached, dtype=torch.long),
        torch.full((rows, 1), cached),
        logits,
        list(range(rows)),
    )
    for layer in running.cache.layers:
        layer.__class__ = TensorColumn
    return running


def step(model, running: Running, ids: torch.Tensor) -> torch.Tensor:
    bias = running.step()
    column = torch.tensor([running.end])
    logits = model(
        input_ids=ids,
        past_key_values=running.cache,
        attention_mask=bias,
        position_ids=running.positions,
        cache_position=column,
    ).logits[:, -1]
    running.positions = running.positions + 1
    return logits


def rewind(running: Running) -> None:
    """Undo one step: the next step writes the same column at the same positions."""
    for layer in running.cache.layers:
        layer.end -= 1
    running.mask[:, running.end] = 0
    running.positions = running.positions - 1


@torch.inference_mode()
def measure(lm, compiled, rows: int, cached: int, steps: int) -> str:
    running, ids = batch(rows, filled(lm, rows, cached), torch.zeros(rows, 1)), torch.zeros(rows, 1, dtype=torch.long)
    step(lm.model, running, ids)
    start = time.perf_counter()
    step(compiled, running, ids)
    first = time.perf_counter() - start
    seconds = {"eager": [], "compiled": []}
    for _ in range(steps):
        for name, model in (("eager", lm.model), ("compiled", compiled)):
            start = time.perf_counter()
            step(model, running, ids)
            seconds[name].append(time.perf_counter() - start)
    eager, fast = statistics.median(seconds["eager"]), statistics.median(seconds["compiled"])
    return (
        f"{rows} rows, {cached} cached tokens: eager {eager:.3f} s, compiled {fast:.3f} s a step (medians of {steps}), "
        f"gain {1 - fast / eager:.1%}; first compiled step {first:.1f} s, graphs compiled so far "
        f"{counters['stats']['unique_graphs']}"
    )


@torch.inference_mode()
def agreement(lm, compiled, rows: int) -> str:
    record = data.load_sys_ifeval("sys_ifeval_shuffled", limit=1)[0]
    prompt = prompts.paper_prompt(lm.tokenizer, record, data.load_defense_templates())
    ids = torch.cat([prompt.ids, prompt.query_ids(record.user)], dim=1).repeat(rows, 1)
    prefilled = lm.model(input_ids=ids, use_cache=True)
    running = batch(rows, prefilled.past_key_values, prefilled.logits[:, -1])
    tokens = running.logits.argmax(-1, keepdim=True)
    reference = step(lm.model, running, tokens).float()
    rewind(running)
    other = step(compiled, running, tokens).float()
    same = int((reference.argmax(-1) == other.argmax(-1)).sum())
    return (
        f"a real prompt ({ids.shape[1]} tokens) on {rows} rows, one step: same next token {same}/{rows}, largest logit "
        f"difference {float((reference - other).abs().max()):.3f} (largest logit {float(reference.abs().max()):.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16", choices=experiment.DTYPES)
    parser.add_argument("--points", nargs="+", default=["128:300", "128:900", "40:600"], help="ROWS:CACHED")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    points = []
    for point in args.points:
        rows, _, cached = point.partition(":")
        if not (rows.isdigit() and cached.isdigit()):
            parser.error(f"a point is ROWS:CACHED, two whole numbers, not {point!r}")
        points.append((int(rows), int(cached)))
    lm = models.load_model(args.model, dtype=getattr(torch, args.dtype))
    compiled = torch.compile(lm.model, dynamic=True)
    print(f"model {args.model} in {args.dtype}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    with decoding(lm.model):
        for rows, cached in points:
            print(measure(lm, compiled, rows, cached, args.steps), flush=True)
        print(agreement(lm, compiled, AGREEMENT_ROWS))


if __name__ == "__main__":
    main()
