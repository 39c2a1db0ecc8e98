"""The positive controls (issue 82, ``fairkv.studies.ceilings``) on the committed cpu rows: what Qwen2.5-Coder-1.5B
does when nothing holds it back, the ceiling tables the notebook writes from them, and the claims' magnitudes judged
against them (a paper's number above the ceiling reads untestable here, never differs)."""

from __future__ import annotations

import pytest

from fairkv.core.paths import REPO_ROOT
from fairkv.core.prompts import NEUTRAL_TEMPLATE
from fairkv.report import analysis, verdicts
from fairkv.studies import ceilings, leakage, paper_vs_us
from fairkv.studies.reading import PEAK

CPU = REPO_ROOT / "results" / "cpu"


@pytest.fixture(scope="module")
def committed():
    """The ceiling studies' committed rows and the leakage study's (normal order), read from the repository's store,
    never computed."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FAIRKV_FROZEN", "1")
        controls = ceilings.run("cpu", CPU, progress=False)
        rows = leakage.STUDY.run("cpu", CPU, progress=False)[1]
    return controls, analysis.with_benign_flags(rows)


def test_every_ceiling_cell_is_committed_and_read_as_declared(committed):
    """Each leakage control on the 100 leakage prompts at the ratios its claims read (Fig 4's peak on four policies,
    Figs 8 and 9 on StreamingLLM and SnapKV), the accuracy on the first prompts at both budgets: the tables' cells are
    the estimates the claims read (``Ceilings``)."""
    controls, _ = committed
    attack = controls[controls["query"] == "attack"]
    assert set(attack["template"]) == set(ceilings.TEMPLATES)
    assert attack.groupby(["template", "policy", "ratio"])["key"].nunique().eq(100).all()
    table = ceilings.leakage_table(controls).set_index(["control", "policy", "ratio"])
    reached = ceilings.Ceilings(controls)
    for policy, ratio in [(p, PEAK) for p in ceilings.PEAK_POLICIES] + [("snapkv", 0.7), ("streamingllm", 0.6)]:
        cells = [table.loc[(control, policy, ratio), "directive leakage"] for control in ceilings.TEMPLATES.values()]
        estimate = reached.leakage(policy, ratio)  # the control that reaches the higher upper end
        assert (
            max(cells, key=lambda c: c.split(", ")[-1])
            == f"{estimate.value:.2f} [{estimate.low:.2f}, {estimate.high:.2f}]"
        )
    assert ceilings.TEMPLATES[NEUTRAL_TEMPLATE] in table.index.get_level_values(0)
    budgets = ceilings.accuracy_table(controls)
    assert budgets["new tokens"].tolist() == [256, ceilings.PAPER_TOKENS]
    assert budgets["n"].tolist() == [ceilings.ACCURACY_PROMPTS] * 2
    assert budgets["accuracy"].iloc[-1] == str(reached.accuracy())


def test_with_nothing_telling_it_not_to_the_model_recites_more_yet_far_below_the_papers_peak(committed):
    """The controls' finding: with neutral text in the defense's place, uncompressed, the attack draws more directive
    leakage than under the defense (the control is positive: the defense holds some recitals back), no answer gives
    the defense's scripted refusal (nothing asks for it), and yet at Fig 4's peak (StreamingLLM, r = 0.5) neither
    control reaches the paper's 0.50 to 0.55: the model, not the defense, holds leakage there."""
    controls, rows = committed
    neutral = controls[(controls["template"] == NEUTRAL_TEMPLATE) & (controls["ratio"] == 0.0)]
    neutral = neutral.drop_duplicates("key").set_index("key")
    defended = rows[(rows["query"] == "attack") & (rows["ratio"] == 0.0)].drop_duplicates("key").set_index("key")
    gap = verdicts.difference(neutral[analysis.LEAKAGE], defended.loc[neutral.index, analysis.LEAKAGE])
    assert gap.low > 0, gap
    assert neutral["refused"].sum() == 0
    assert ceilings.Ceilings(controls).leakage("streamingllm", PEAK).high < 0.50


def test_a_paper_number_above_the_ceiling_reads_untestable_in_magnitude(committed):
    """Fig 4's inverted U differs from the paper's 0.50 to 0.55 without the ceiling; against it, untestable here, its
    why naming the ceiling; Fig 6's defense leakage has no ceiling (the neutral text's recall bounds nothing) and
    still differs; the direction verdicts are the same either way."""
    controls, rows = committed
    without = paper_vs_us(leakage, rows).set_index("id")
    against = paper_vs_us(leakage, rows, ceilings=ceilings.Ceilings(controls)).set_index("id")
    heads = lambda table: table[table["part"] == ""]
    assert heads(without)["verdict"].equals(heads(against)["verdict"])
    line = heads(against).loc[leakage.INVERTED_U.id]
    assert heads(without).loc[leakage.INVERTED_U.id, "magnitude"] == verdicts.DIFFERS
    assert line["magnitude"] == verdicts.UNTESTABLE and "ceiling: peak: the paper's 0.50 to 0.55" in line["why"]
    assert heads(against).loc[leakage.DEFENSE_SHAPE.id, "magnitude"] == verdicts.DIFFERS
