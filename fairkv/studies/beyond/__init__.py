"""Notebook 11, beyond the paper: its mechanisms checked where it did not look, and the open questions at its end
(arXiv 2510.00231) answered on our rows. Many spans: fair eviction (Algorithm 1, Sec 5.2) on system prompts
of 2 to 8 instruction spans; many attacks: RaccoonBench's attack categories beside the Plain attack of Pitfalls 3-4
and Figs 8-9; defense strength: three defense templates from weak to strong, where the paper has one; geometry: the
defense's operative sentence moved to its start or end (is its place why fair eviction loses the refusal?).

Every claim here is ours (the paper states none of them for these settings), except one sanity check: fair eviction
keeps the worst-kept span at least as well as the base policy, which its per-span budgets (Algorithm 1) make so, up to
a token, on any model. The N-spans claims read each span count's own prompts (n per count, shown in the parts); the
attack claims pool the attack categories, the defense claims read each template's prompts uncompressed or along r, the geometry claim the
prompts of each place of the sentence at r = 0.5-0.7.

One module per study: ``spans``, ``attacks``, ``defenses``, ``geometry``; this package gathers them for the notebook (its studies,
claims, minutes and ``measure``)."""

from __future__ import annotations

import pandas as pd

from fairkv.report import analysis
from fairkv.report.claims import Measured
from fairkv.studies import reading
from fairkv.studies.beyond import attacks, defenses, geometry, spans
from fairkv.studies.beyond.attacks import (
    ATTACKS,
    ATTACKS_CEILING,
    CATEGORIES_RISE,
    FAIR_LOWERS,
    REFUSAL_DROPPED,
    WHITELIST_KEEPS_REFUSAL,
    WHITELIST_LOWERS,
    category_figure,
    ceiling_table,
    recitals,
)
from fairkv.studies.beyond.defenses import CRITICAL_MOVES, DEFENSE_LADDER, DEFENSES, STRONGER_REFUSES
from fairkv.studies.beyond.geometry import GEOMETRY, LAST_RESTORES
from fairkv.studies.beyond.spans import COMPLIANCE_RAISED, SMALLEST_SPAN_KEPT, SPANS, budget_figure, span_figure

STUDIES = (SPANS, ATTACKS, ATTACKS_CEILING, DEFENSES, GEOMETRY)
# the notebook's wall minutes (``fairkv.studies.MINUTES_KIND``); cpu: 18, then 20 for the geometry study's two moved
# places (1,300 attack answers and their operative keep rates each: 27 min for one beside other runs on 12-04, about
# 10 alone at the 2.8 answers a second measured alone), then 50 for the rows the intended counts added on 12-06 (the
# attack categories on 10 prompts, 30 prompts per span count, the geometry at r = 0.3-0.4: 2,871 answers and 1,600
# operative keep rates on a CPU with AVX512-BF16, beside a notebook render for a fifth of it), then 25 for the attack
# categories' positive control (``ATTACKS_CEILING``: 300 answers uncompressed with neutral text, 42.7 new tokens on
# average; 1,283 s for the last 210 of them beside notebook renders on 12-07), then 25 for its 300 at r = 0.5 (as
# many answers, as long: 29 min 18 s for the last 205 of them beside a test run on both cores, 12-07)
MINUTES = {"ci": 3.0, "cpu": 138}
CLAIMS = spans.CLAIMS + attacks.CLAIMS + defenses.CLAIMS + geometry.CLAIMS


def measure(
    spans_rows: pd.DataFrame,
    attack_rows: pd.DataFrame,
    defense_rows: pd.DataFrame,
    ladder: list[str],
    geometry_rows: pd.DataFrame,
    policy: str = "streamingllm",
) -> dict[str, Measured]:
    """The claims of notebook 11. ``spans_rows`` is ``analysis.per_span``, ``attack_rows`` the ``analysis.by_attack``
    rows, ``defense_rows`` the defense-template rows (column ``template``), ``ladder`` the templates from weak to
    strong and ``geometry_rows`` ``geometry.run``'s (column ``place``); ``policy``'s rows only, but the geometry's
    (its claim reads fair StreamingLLM)."""
    label = reading.label(policy)
    picked = spans_rows[spans_rows["policy"] == policy]
    attacked = attack_rows[attack_rows["policy"] == policy]
    if picked[picked["ratio"] > 0].empty or attacked.empty:
        raise analysis.AnalysisError(f"no compressed {label} rows in the spans or the attacks study")
    base = defense_rows[(defense_rows["variant"] == "base") & (defense_rows["policy"] == policy)]
    return {
        **spans.measure(picked, label),
        **attacks.measure(attacked),
        **defenses.measure(base, ladder),
        **geometry.measure(geometry_rows),
    }


__all__ = [
    "ATTACKS",
    "ATTACKS_CEILING",
    "CATEGORIES_RISE",
    "CLAIMS",
    "COMPLIANCE_RAISED",
    "CRITICAL_MOVES",
    "DEFENSES",
    "DEFENSE_LADDER",
    "FAIR_LOWERS",
    "GEOMETRY",
    "LAST_RESTORES",
    "MINUTES",
    "REFUSAL_DROPPED",
    "SMALLEST_SPAN_KEPT",
    "SPANS",
    "STRONGER_REFUSES",
    "STUDIES",
    "WHITELIST_KEEPS_REFUSAL",
    "WHITELIST_LOWERS",
    "budget_figure",
    "category_figure",
    "ceiling_table",
    "recitals",
    "measure",
    "span_figure",
]
