"""IFEval accuracy, ROUGE-L leakage and keep rates on hand-worked examples."""

from __future__ import annotations

import string

import pytest
import torch

import fairkv
from fairkv.core import data, metrics
from fairkv.core.presses import rates
from fairkv.core.presses.selection import SpanError
from fairkv.core.prompts import Span

# Four records written for these tests in sys_ifeval's format (not taken from IFEval), each with instruction ids and
# kwargs that lm-eval's checker verifies, and responses written by hand: one that follows the directive, one that not.
AUTHORED = {
    9001: (("change_case:english_lowercase",), ({},)),
    9002: (("detectable_content:number_placeholders",), ({"num_placeholders": 3},)),
    9003: (
        ("punctuation:no_comma", "startend:end_checker"),
        ({}, {"end_phrase": "Is there anything else I can help with?"}),
    ),
    9004: (("detectable_format:number_bullet_lists",), ({"num_bullets": 3},)),
}
COMPLIANT = {
    9001: "the forest is quiet at dawn. mist hangs between the pines and a jay calls once.",
    9002: "Join us at [park] on [date]. Bring [dish] to share!",
    9003: "Sunlight scatters off air molecules and blue light scatters most. Is there anything else I can help with?",
    9004: "* Water when the soil is dry.\n* Give them bright indirect light.\n* Wipe dust off the leaves.",
}
VIOLATING = {
    9001: "The Forest is quiet at dawn.",
    9002: "Join us at the park on Sunday.",
    9003: "Sunlight scatters off air molecules, and blue light scatters most.",
    9004: "* Water when dry.\n* Bright light.",
}


@pytest.fixture(scope="module")
def sample():
    return {key: data.Record(key, "directive", "query", ids, kwargs) for key, (ids, kwargs) in AUTHORED.items()}


def test_ifeval_compliant_and_violating(sample):
    for key, record in sample.items():
        good, bad = metrics.ifeval(record, COMPLIANT[key]), metrics.ifeval(record, VIOLATING[key])
        assert good.prompt_strict and good.prompt_loose and all(good.strict), key
        assert not bad.prompt_strict, key


def test_ifeval_accuracy_levels(sample):
    results = [metrics.ifeval(sample[9003], COMPLIANT[9003]), metrics.ifeval(sample[9003], VIOLATING[9003])]
    # the violating response breaks both instructions, the compliant one passes both
    assert metrics.ifeval_accuracy(results) == {
        "prompt_strict": 0.5,
        "prompt_loose": 0.5,
        "inst_strict": 0.5,
        "inst_loose": 0.5,
    }
    half = metrics.ifeval(sample[9003], "No commas here at all.")  # passes no_comma, misses the end phrase
    assert half.strict == (True, False)
    assert metrics.per_class_accuracy([half]) == {"punctuation": 1.0, "startend": 0.0}


@pytest.mark.parametrize("key, index", [(1122, 1), (1129, 0)])
def test_ifeval_random_letter_records_are_stable(key, index):
    """Keys 1122 and 1129 ask for a non-letter's frequency, so IFEval's checker draws a random letter; seeded, it
    draws 'y' every time: a response with 'y' seven times passes, one with any other letter seven times fails."""
    record = {r.key: r for r in data.load_sys_ifeval()}[key]
    assert record.instruction_id_list[index] == "keywords:letter_frequency"
    for _ in range(3):
        passing = [c for c in string.ascii_lowercase if metrics.ifeval(record, (c + " ") * 7 + "!" * 7).strict[index]]
        assert passing == ["y"]


def test_every_real_record_scores():
    """The checker scores all 539 records offline (NLTK's punkt_tab tables in place)."""
    results = [metrics.ifeval(r, "Hello. This is a reply.") for r in data.load_sys_ifeval()]
    assert len(results) == 539
    assert sum(len(r.strict) for r in results) == 830


def test_rouge_l_recall():
    reference = "Write the itinerary in a Shakespearean style. Do not use any commas."
    assert metrics.leakage(reference, reference) == 1.0
    assert metrics.leakage(reference, "Bananas grow on tall herbaceous plants near rivers.") < 0.1
    # recall, not precision: the reference reproduced inside a longer reply still counts in full
    assert metrics.leakage(reference, "Sure! " + reference + " That is all I was told.") == 1.0
    # stemming: "writing" matches "write"
    assert metrics.leakage("writing itineraries", "write itinerary") == 1.0


def test_keep_rates_hand_worked():
    """2 layers x 2 KV heads, n = 4, spans A = [0, 2), B = [2, 4).

    Layer 0 keeps {0, 2} (head 0) and {2, 3} (head 1): A = mean(1/2, 0) = 0.25, B = mean(1/2, 1) = 0.75.
    Layer 1 keeps {0, 1} in both heads: A = 1, B = 0. Over layers: A = 0.625, B = 0.375.
    """
    kept = {0: torch.tensor([[[0, 2], [2, 3]]]), 1: torch.tensor([[[0, 1], [0, 1]]])}
    spans = [Span("A", 0, 2, ""), Span("B", 2, 4, "")]
    assert rates.keep_rates(kept, spans, 4) == {"A": 0.625, "B": 0.375}
    # what docs/library.md names at fairkv's top: a core user's keep rates with no import from the artifact's modules
    assert fairkv.keep_rates(kept, [fairkv.Span("A", 0, 2, ""), fairkv.Span("B", 2, 4, "")], 4) == {
        "A": 0.625,
        "B": 0.375,
    }
    assert rates.keep_map(kept, 4).tolist() == [0.75, 0.5, 0.5, 0.25]
    # a core user's bad spans or length are named, not read as a clipped rate, a NaN or torch's index error (broken on
    # purpose: unchecked, the first read {'x': 0.5} and the last raised torch's RuntimeError)
    for spans, n, said in (
        (
            [fairkv.Span("x", 0, 6, "")],
            4,
            r"span 'x' covers tokens \[0, 6\): give a non-empty range inside the prefix of 4",
        ),
        ([fairkv.Span("x", 2, 2, "")], 4, r"span 'x' covers tokens \[2, 2\)"),
        ([fairkv.Span("A", 0, 2, "")], 3, "kept positions 0 to 3 lie outside the prefix.s tokens 0 to 2"),
        ([], 4, "no spans to read keep rates of"),
        ([(0, 2)], 4, r"\(0, 2\) is no span: give fairkv.Span"),
    ):
        with pytest.raises(SpanError, match=said):
            fairkv.keep_rates(kept, spans, n)
    with pytest.raises(SpanError, match="kept positions -1 to 1 lie outside"):
        fairkv.keep_rates({0: torch.tensor([[[-1, 1]]])}, [fairkv.Span("A", 0, 2, "")], 4)
    # kept as one tensor, not a dict of layers (broken on purpose: torch's sparse-layout error), or one layer's 1-d
    for wrong, said in ((kept[0], "kept is Tensor: give a dict of layer"), ({0: torch.tensor([0, 2])}, "kept is dict")):
        with pytest.raises(SpanError, match=f"{said}.*as a press records them"):
            fairkv.keep_rates(wrong, [fairkv.Span("A", 0, 2, "")], 4)
