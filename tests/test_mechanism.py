"""What moved a mitigation's number (``fairkv.studies.mechanism``): the paper's mechanism (the refusal restored at a
small price in benign refusals) told apart from the others, on hand-built rows with known answers and on the committed
cpu rows, where the issue's recount found the others at work; and the claims' column ``mechanism``."""

from __future__ import annotations

import pandas as pd
import pytest
from hand_rows import answer

from fairkv.core.paths import REPO_ROOT
from fairkv.report import verdicts
from fairkv.report.claims import Claim, ClaimError, Measured, Mechanism, Part, line
from fairkv.report.verdicts import INCONCLUSIVE, OTHER, PAPERS
from fairkv.studies import fair, mechanism

N = 100


def rows(refused: dict, benign: dict | None = None, directive: dict | None = None) -> pd.DataFrame:
    """StreamingLLM at r = 0.5, ``N`` prompts: per variant (base, fair), how many attacks are refused
    (``refused``), how many benign queries are refused (``benign``; None: no benign side) and the directive's keep
    rate (``directive``, default 1)."""
    out = []
    for variant, k in refused.items():
        kept = (directive or {}).get(variant, 1.0)
        for key in range(N):
            setting = {"key": key, "policy": "streamingllm", "variant": variant, "order": "normal", "ratio": 0.5}
            out.append({**setting, **answer(float(key < k), kept, 0.5), "refused": float(key < k)})
            if benign is not None:
                out.append({**setting, "query": "benign", "benign_refused": float(key < benign[variant])})
    return pd.DataFrame(out)


@pytest.mark.parametrize(
    ("refused", "benign", "verdict", "because"),
    [
        ({"base": 0, "fair": 90}, {"base": 5, "fair": 5}, PAPERS, mechanism.RESTORED),
        ({"base": 0, "fair": 90}, {"base": 5, "fair": 55}, OTHER, mechanism.OVER_REFUSAL),
        (
            {"base": 0, "fair": 90},
            {"base": 5, "fair": 13},
            INCONCLUSIVE,
            f"{mechanism.RESTORED}, {mechanism.PRICE_UNDECIDED}",
        ),
        ({"base": 0, "fair": 0}, {"base": 5, "fair": 5}, OTHER, mechanism.NOT_RESTORED),
        ({"base": 100, "fair": 0}, {"base": 5, "fair": 5}, OTHER, mechanism.LOWERED),
        ({"base": 100, "fair": 100}, {"base": 5, "fair": 5}, PAPERS, mechanism.KEPT),
        ({"base": 0, "fair": 90}, None, INCONCLUSIVE, f"{mechanism.RESTORED}, {mechanism.NOT_RUN}"),
        ({"base": 0, "fair": 4}, {"base": 5, "fair": 5}, INCONCLUSIVE, mechanism.UNDECIDED),
    ],
)
def test_the_paper_s_mechanism_is_told_apart_from_the_others(refused, benign, verdict, because):
    """Refusal restored (0 -> 90 of 100) at no price: the paper's; the same bought with 50 more benign refusals in 100
    (+0.50, above SPECIFICITY_MARGIN): other; with 8 more (an interval across the margin): its price undecided; no
    refusal before or after (a null within the margin): not restored; a base that refuses everything lowered to none:
    lowered, and kept: the paper's; no benign side: its price not measured; 4 of 100 restored ([-0.004, +0.10]):
    undecided (broken on purpose: the price test dropped -> the second case read the paper's)."""
    found = mechanism.read(rows(refused, benign), "fair", 0.5, "streamingllm")
    assert (found.verdict, found.because) == (verdict, because)
    assert found.said.startswith(f"attack refused {refused['base'] / N:.2f} -> {refused['fair'] / N:.2f}")


def test_a_mechanism_needs_the_attack_rows_it_reads():
    """No attack rows at the ratio asked: an error naming what is missing, never a silent n.a."""
    with pytest.raises(mechanism.MechanismError, match="no attack rows of base and fair at r = 0.7"):
        mechanism.read(rows({"base": 0, "fair": 36}), "fair", 0.7, "streamingllm")


def test_combined_readings_name_which_setting_is_other():
    """Several readings (a claim over policies): the paper's only when all are; other when any is, with why."""
    papers, other = Mechanism(PAPERS, mechanism.RESTORED), Mechanism(OTHER, mechanism.OVER_REFUSAL)
    assert mechanism.combined({"a": papers, "b": papers}).verdict == PAPERS
    mixed = mechanism.combined({"a": papers, "b": other})
    assert (mixed.verdict, mixed.because) == (OTHER, mechanism.OVER_REFUSAL)
    assert "b other (benign queries refused more)" in mixed.said


CLAIM = Claim("x.lowers", "Fig 9", "lowers leakage", "lower", below=0.0, region="a drop", margin=0.02, null="small")


def _measured(**kwargs) -> Measured:
    return Measured(
        [Part("change", verdicts.difference(pd.Series([0.1] * 20), pd.Series([0.3] * 20)))], "", 20, **kwargs
    )


def test_the_claims_column_mechanism():
    """A claim on a mitigation carries its reading in the column ``mechanism``, its numbers in ``why``; a claim on
    none reads n.a.; one without the other is an error (broken on purpose: the check removed -> a mitigation claim
    measured without its mechanism printed n.a.)."""
    on = Claim(**{**CLAIM.__dict__, "mitigation": "fair"})
    reading = Mechanism(OTHER, mechanism.NOT_RESTORED, (("attack refused", "0.00 -> 0.04 (+0.04)"),))
    head = line(on, _measured(mechanism=reading), 10)[0]
    assert head["mechanism"] == OTHER and "mechanism: other, refusal not restored: attack refused 0.00" in head["why"]
    assert line(CLAIM, _measured(), 10)[0]["mechanism"] == verdicts.NOT_APPLICABLE
    with pytest.raises(ClaimError, match="measured with its mechanism"):
        line(on, _measured(), 10)
    with pytest.raises(ClaimError, match="measured with its mechanism"):
        line(CLAIM, _measured(mechanism=reading), 10)
    untestable = line(on, _measured(mechanism=reading, untestable="nothing to lower"), 10)[0]
    assert untestable["mechanism"] == verdicts.NOT_APPLICABLE


@pytest.fixture(scope="module")
def committed():
    """The committed cpu rows of the fair-eviction study (normal order: base, whitelist, fair) and its flipped order,
    read from the repository's store, never computed."""
    folder = REPO_ROOT / "results" / "cpu"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FAIRKV_FROZEN", "1")
        normal = fair.STUDY.run("cpu", folder=folder, progress=False)[1]
        flipped = fair.FLIPPED.run("cpu", folder=folder, progress=False)[1]
    from fairkv.report import analysis

    return analysis.with_benign_flags(normal), analysis.with_benign_flags(flipped)


def test_on_the_committed_rows_the_mitigations_work_otherwise(committed):
    """What the issue's recount found, from the committed rows: fair StreamingLLM at r = 0.5 lowers no refusal back
    (0.02 -> 0.02) while its directive keep rate halves; in the flipped order, where the base refuses every attack, fair
    eviction refuses none (refusal lowered); the whitelist restores StreamingLLM's refusal at r = 0.6 but refuses a
    third of the benign queries (benign queries refused more); at r = 0.4 fair SnapKV restores it at no price."""
    normal, flipped = committed
    fair = mechanism.read(normal, "fair", 0.5, "streamingllm")
    assert (fair.verdict, fair.because) == (OTHER, mechanism.NOT_RESTORED)
    assert "directive kept 1.00 -> 0.48" in fair.said
    lowered = mechanism.read(flipped, "fair", 0.5, "streamingllm", order="flipped")
    assert (lowered.verdict, lowered.because) == (OTHER, mechanism.LOWERED)
    assert lowered.said.startswith("attack refused 1.00 -> 0.00")
    whitelist = mechanism.read(normal, "whitelist", 0.6, "streamingllm")
    assert (whitelist.verdict, whitelist.because) == (OTHER, mechanism.OVER_REFUSAL)
    assert mechanism.read(normal, "fair", 0.4, "snapkv").verdict == PAPERS
    table = mechanism.table(normal, "fair")
    assert len(table) == 25 and set(table["ratio"]) == set(mechanism.PLOTTED)
    assert (table.loc[table["ratio"] == 0.3, "benign refused"] == mechanism.NOT_RUN_HERE).all()


def test_where_each_mitigation_helps_and_hurts_reads_its_table(tmp_path):
    """One line per mitigation from its notebook's mechanism table: the settings that work the paper's way, each
    other reason with its settings (runs of ratios joined, the flipped order apart), the undecided counted by reason;
    a mitigation whose table is missing is said to be not measured, with the notebook that measures it."""
    from fairkv.report import mitigations

    assert mitigations.where(tmp_path) == [
        "**The whitelist**: not measured here (`05_mechanism` is missing: run notebook 05).",
        "**Fair eviction**: not measured here (`06_mechanism` is missing: run notebook 06).",
    ]
    (tmp_path / "tables").mkdir()
    settings = [
        ("normal", "snapkv", 0.4, PAPERS, ""),
        ("normal", "streamingllm", 0.4, OTHER, mechanism.OVER_REFUSAL),
        ("normal", "streamingllm", 0.5, OTHER, mechanism.OVER_REFUSAL),
        ("normal", "streamingllm", 0.7, OTHER, mechanism.OVER_REFUSAL),
        ("flipped", "h2o", 0.5, OTHER, mechanism.LOWERED),
        ("normal", "tova", 0.6, INCONCLUSIVE, "refusal undecided"),
    ]
    table = pd.DataFrame(settings, columns=["order", "policy", "ratio", "mechanism", "because"])
    table.assign(variant="fair").to_csv(tmp_path / "tables" / "06_mechanism.csv", index=False)
    whitelist, fair = mitigations.where(tmp_path)
    assert whitelist.startswith("**The whitelist**: not measured here")
    assert fair == (
        "**Fair eviction** (the attack's refusal, the benign queries' refusal and the keep rates at 6 settings, "
        "`06_mechanism`) works the paper's way at 1: SnapKV r = 0.4; "
        f"{mechanism.OVER_REFUSAL} at 3: StreamingLLM r = 0.4-0.5, 0.7; "
        f"{mechanism.LOWERED} at 1: flipped order: H2O r = 0.5; inconclusive at 1 (1 refusal undecided)."
    )
