"""System prompts of N independent instruction spans (beyond the paper, notebook 11).

The paper stops at two spans (defense and directive) and asks what happens with more (the end of the paper, arXiv 2510.00231).
Here a system prompt holds N IFEval instructions, one span each, written by the IFEval checker library itself
(lm-eval's ``build_description``, whose randomised arguments are seeded per prompt, so the same dataset name always
gives the same prompts), and each span's compliance is that instruction's own check on the answer to a benign writing
task. Datasets ``spans_2``, ``spans_3``, ``spans_5``, ``spans_8`` (``data.load_records``) yield ``SpanRecord``s, which
``prompts.prompt_for`` turns into N-span prompts (spans ``span1`` .. ``spanN``, no defense template) and
``metrics.benign_scores`` scores like any sys_ifeval record (``strict_list[i]`` is span i+1's compliance).

The instruction bank holds instructions that ask for something a plain answer lacks (a title, a postscript, bullet
points, keywords, ...): an instruction most answers satisfy anyway ("use fewer than 300 words") would hide what
eviction does. No two instructions of the bank conflict (IFEval's own conflict table, and none forces the case or
the ending that another needs).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fairkv.core.metrics import ifeval_instructions
from fairkv.core.records import Record

SPAN_COUNTS = (2, 3, 5, 8)
DATASETS = {f"spans_{n}": n for n in SPAN_COUNTS}
BANK = (
    "detectable_format:title",
    "detectable_content:postscript",
    "keywords:existence",
    "startend:end_checker",
    "detectable_format:number_highlighted_sections",
    "detectable_format:number_bullet_lists",
    "detectable_content:number_placeholders",
    "keywords:frequency",
    "punctuation:no_comma",
)
TASKS = (
    "Write a short blog post about a weekend trip to the mountains.",
    "Write a product description for a reusable water bottle.",
    "Write a letter to a friend about learning to cook.",
    "Write a short guide on how to start running.",
    "Write a brief history of the bicycle.",
    "Write a review of a cafe you visited recently.",
)
N_RECORDS = 100  # prompts per dataset (a grid takes its first n_prompts)
# arguments fixed where the checker's random choice could make the instruction trivially satisfied
FIXED = {"keywords:frequency": {"relation": "at least"}}


class MultiSpanError(ValueError):
    """An unknown span dataset or a span count the bank cannot fill."""


@dataclass(frozen=True)
class SpanRecord(Record):
    """A sys_ifeval-like record whose system prompt is ``segments``, one instruction per span."""

    segments: tuple[tuple[str, str], ...] = ()


def compose(n_spans: int, index: int) -> SpanRecord:
    """Prompt ``index`` of ``spans_<n_spans>``: n instructions drawn from the bank, in a seeded order, each with
    its description and arguments from lm-eval's checker."""
    if not 1 <= n_spans <= len(BANK):
        raise MultiSpanError(f"{n_spans} spans: the instruction bank holds 1 to {len(BANK)}")
    instructions = ifeval_instructions()
    rng = random.Random(f"spans-{n_spans}-{index}")
    ids = rng.sample(BANK, n_spans)
    texts, kwargs = [], []
    for instruction_id in ids:
        checker = instructions[instruction_id](instruction_id)
        random.seed(rng.randrange(2**31))  # build_description draws its arguments from the global generator
        texts.append(checker.build_description(**FIXED.get(instruction_id, {})).strip())
        kwargs.append(checker.get_instruction_args() or {})
    segments = tuple((f"span{i + 1}", text) for i, text in enumerate(texts))
    return SpanRecord(
        key=1_000_000 * n_spans + index,
        system="\n".join(texts),
        user=TASKS[index % len(TASKS)],
        instruction_id_list=tuple(ids),
        kwargs=tuple(kwargs),
        segments=segments,
    )


def load(dataset: str, limit: int | None = None) -> list[SpanRecord]:
    if dataset not in DATASETS:
        raise MultiSpanError(f"unknown span dataset {dataset!r}: use one of {', '.join(DATASETS)}")
    return [compose(DATASETS[dataset], i) for i in range(limit if limit is not None else N_RECORDS)]
