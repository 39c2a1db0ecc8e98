"""Which fix, at what price (``fairkv.studies.fixes``, notebook 13): every fix read against the uncompressed model
with the prompt as written, on hand-built rows with known answers: the reorderings relabelled as fixes, a fix that
holds (refusal as uncompressed, no price) told apart from one that pays a price or falls short, and the fix to use."""

from __future__ import annotations

import pandas as pd
import pytest
from hand_rows import answer

from fairkv.runs import experiment
from fairkv.studies import fair, fixes
from fairkv.studies.beyond import geometry

N = 100


def rows(refused: dict, benign: dict, ratios=(0.5,), policy: str = "snapkv", order: str = "normal") -> pd.DataFrame:
    """``N`` prompts of ``policy``: per variant (``uncompressed``: r = 0) how many attacks are refused and how many
    benign queries are refused, at each of ``ratios`` (a dict per ratio where they differ)."""
    out = []
    for name, count in refused.items():
        at = (0.0,) if name == "uncompressed" else ratios
        for ratio in at:
            k = count[ratio] if isinstance(count, dict) else count
            b = benign[name][ratio] if isinstance(benign[name], dict) else benign[name]
            variant = "base" if name == "uncompressed" else name
            for key in range(N):
                cell = f"{order}-{variant}-{ratio}-{key}"
                setting = {"key": key, "policy": policy, "variant": variant, "order": order, "ratio": ratio}
                attack = {**setting, **answer(float(key < k)), "refused": float(key < k), "leak_directive": 0.1}
                out.append({**attack, "cell_id": f"a-{cell}"})
                out.append(
                    {
                        **setting,
                        "cell_id": f"b-{cell}",
                        "query": "benign",
                        "benign_refused": float(key < b),
                        "prompt_strict": 0.5,
                    }
                )
    return pd.DataFrame(out)


def test_the_reorderings_are_fixes_read_against_the_prompt_as_written():
    """The flipped order's compressed base rows become the fix "defense last" in the normal order and its whitelist
    rows "defense last + whitelist", its uncompressed rows left out (the reference is the normal order's); a fix's line
    reads the flipped refusal against the normal order's uncompressed model (broken on purpose: keeping the flipped r =
    0 rows pools two references; the flipped whitelist rows read as the defense last)."""
    normal = rows({"uncompressed": 97, "base": 10}, {"uncompressed": 38, "base": 20})
    flipped = rows(
        {"uncompressed": 60, "base": 97, "whitelist": 40},
        {"uncompressed": 10, "base": 38, "whitelist": 38},
        order="flipped",
    )
    every = fixes.gathered(normal, flipped)
    for fix in (fixes.DEFENSE_LAST, fixes.WHITELISTED_LAST):
        moved = every[every["variant"] == fix]
        assert set(moved["order"]) == {"normal"} and set(moved["ratio"]) == {0.5} and len(moved) == 2 * N
    line = fixes.one(every, fixes.DEFENSE_LAST, "snapkv", 0.5)
    assert line["attack refused"].startswith("0.10 -> 0.97 (uncompressed 0.97")
    assert (line["refusal"], line["price"], line["holds"]) == (fixes.AS_UNCOMPRESSED, fixes.NONE, True)
    line = fixes.one(every, fixes.WHITELISTED_LAST, "snapkv", 0.5)
    assert line["attack refused"].startswith("0.10 -> 0.40 (uncompressed 0.97")
    assert (line["refusal"], line["holds"]) == (fixes.BELOW, False)


@pytest.mark.parametrize(
    ("refused", "benign", "refusal", "price", "holds"),
    [
        (97, 38, fixes.AS_UNCOMPRESSED, fixes.NONE, True),  # as uncompressed, no price
        (97, 77, fixes.AS_UNCOMPRESSED, fixes.PRICE, False),  # the refusal back, benign queries refused far more
        (97, 46, fixes.AS_UNCOMPRESSED, fixes.UNDECIDED, False),  # 0.08 above: an interval across the margin
        (40, 38, fixes.BELOW, fixes.NONE, False),  # short of the uncompressed refusal
    ],
)
def test_a_fix_holds_with_its_refusal_as_uncompressed_and_no_price(refused, benign, refusal, price, holds):
    """Each reading of a boundary fix against the uncompressed model (0.97 attack, 0.38 benign refused)."""
    frame = rows(
        {"uncompressed": 97, "base": 0, "boundary": refused}, {"uncompressed": 38, "base": 1, "boundary": benign}
    )
    line = fixes.one(frame, "boundary", "snapkv", 0.5)
    assert (line["refusal"], line["price"], line["holds"]) == (refusal, price, holds)
    assert line["directive accuracy"].startswith("0.50") and line["directive leakage"].startswith("0.10")


def test_the_fix_to_use_holds_to_the_highest_ratio_from_its_lowest():
    """Boundary holds at 0.3-0.5 and not at 0.6; fair holds at 0.3 only, and at 0.6 again (a hole ends the run): the
    boundary is the fix to use, to r = 0.5. A policy where no fix holds at its lowest ratio is told none."""
    ratios = (0.3, 0.4, 0.5, 0.6)
    boundary = {0.3: 97, 0.4: 97, 0.5: 97, 0.6: 30}
    fair = {0.3: 97, 0.4: 30, 0.5: 30, 0.6: 97}
    refused = {"uncompressed": 97, "base": 0, "boundary": boundary, "fair": fair}
    benign = {"uncompressed": 38, "base": 1, "boundary": 38, "fair": 38}
    weak = rows({"uncompressed": 97, "base": 0, "boundary": 10}, benign | {"boundary": 38}, ratios, policy="knorm")
    table = fixes.table(pd.concat([rows(refused, benign, ratios), weak], ignore_index=True))
    chosen = fixes.recommended(table).set_index("policy")
    assert chosen.loc["SnapKV", "boundary"] == "to r = 0.5; at 0.6: refusal below it"
    assert chosen.loc["SnapKV", "fair"] == "to r = 0.3; at 0.4: refusal below it"
    assert chosen.loc["SnapKV", "use"] == "boundary (to r = 0.5)"
    assert chosen.loc["SnapKV", "whitelist"] == fixes.NOT_MEASURED
    assert chosen.loc["K-Norm", "use"].startswith("none")
    assert chosen.loc["K-Norm", "boundary"] == "not at r = 0.3: refusal below it"
    assert "**SnapKV**: boundary (to r = 0.5)" in fixes.advice(fixes.recommended(table))


def _asked_before() -> set:
    """The cells at the cpu profile of every study notebook 13 read before its price and reordering studies."""
    before = set()
    for study in (fair.STUDY, fair.FLIPPED, fair.FLIPPED_ACCURACY, fixes.BOUNDARY):
        before |= {cell for part in study.parts("cpu") for cell in experiment.cell_ids(part)}
    for template in geometry.PLACES.values():
        before |= {
            cell for part in geometry.GEOMETRY.parts("cpu", template=template) for cell in experiment.cell_ids(part)
        }
    return before


def test_the_price_studies_ask_for_the_benign_cells_notebook_13_lacked_and_no_other():
    """At the cpu profile the price studies ask for benign cells only, at r = 0.3, none of which a study notebook 13
    reads already asks for: per fix, the price the table showed as not measured (broken on purpose: a price study at
    r = 0.4 asked again for cells the fair study has; the defense last's asked again for StreamingLLM's)."""
    before = _asked_before()
    asked = {}
    for study in fixes.PRICES:
        (part,) = study.parts("cpu")
        cells = experiment.cell_ids(part)
        assert part.queries == ("benign",) and part.ratios == (fixes.LOW,) and not cells & before, study.name
        asked[study.name] = (part.orders, part.variants, part.template, part.ratios, part.n_prompts, len(cells))
    assert asked == {
        "price_mitigations": (("normal",), ("base", "whitelist", "fair"), None, (0.3,), 100, 1500),
        "price_defense_last": (("flipped",), ("base",), None, (0.3,), 100, 400),
        "price_whitelist_last": (("flipped",), ("whitelist",), None, (0.3,), 100, 500),
    }


def test_the_whitelist_with_the_defense_last_asks_only_for_its_own_attack_cells():
    """At the cpu profile the defense last + whitelist study adds the flipped order's whitelist attack cells at the
    table's ratios and nothing else: its base and uncompressed cells are the fair study's flipped ones (broken on
    purpose: its base asked at r = 0.8, which no study has)."""
    (part,) = fixes.WHITELIST_LAST.parts("cpu")
    new = experiment.cell_ids(part) - _asked_before()
    assert len(new) == 5 * 5 * 100 and part.queries == ("attack",)
    assert new == experiment.cell_ids(part.with_overrides(variants=("whitelist",), ratios=(0.3, 0.4, 0.5, 0.6, 0.7)))


def test_a_fix_whose_price_was_not_measured_is_named_as_not_known():
    """The whitelist's refusal is as the uncompressed model's at 0.3-0.6 but its price is measured at 0.3 alone: it
    holds to r = 0.3 and stops for want of its price, so the fix to use (boundary, to r = 0.4) names it as not known
    (broken on purpose: the use column read "boundary (to r = 0.4)" alone)."""
    ratios = (0.3, 0.4, 0.5, 0.6)
    refused = {"uncompressed": 97, "base": 0, "boundary": {0.3: 97, 0.4: 97, 0.5: 30, 0.6: 30}, "whitelist": 97}
    benign = {"uncompressed": 38, "base": 1, "boundary": 38, "whitelist": 38}
    frame = rows(refused, benign, ratios)
    unpriced = (frame["variant"] == "whitelist") & (frame["query"] == "benign") & (frame["ratio"] > 0.3)
    chosen = fixes.recommended(fixes.table(frame[~unpriced])).set_index("policy")
    assert chosen.loc["SnapKV", "whitelist"] == "to r = 0.3; at 0.4: price not measured"
    assert chosen.loc["SnapKV", "use"] == (
        "boundary (to r = 0.4); not known: whitelist (its price not measured from r = 0.4)"
    )
