"""The notebooks beyond the paper (11-13) as the page of our own results shows them (``readme.beyond``): per notebook
its title, what it measures (no number: those come from its tables), the figures shown at full width and the tables
linked."""

from __future__ import annotations

OURS = {
    "11": (
        "Notebook 11: the paper's open questions",
        "More instruction spans (2-8 IFEval spans per prompt: does fair eviction end the starvation of small spans, "
        "and does compliance follow?), every RaccoonBench attack category (does the lost refusal and its repair hold "
        "beyond the paper's one attack?), defense strength (does a longer or shorter defense template move the "
        "critical ratio?) and where the defense's operative words sit (does fair eviction keep the refusal when "
        "they sit where it keeps tokens?).",
        ("11_attacks_refusal", "11_spans", "11_defense_strength", "11_geometry"),
        ("11_spans_starvation", "11_attacks", "11_defense_critical_ratio", "11_geometry_cells"),
    ),
    "12": (
        "Notebook 12: the press atlas",
        "Eviction bias (the defense's keep rate minus the directive's at r = 0.5) of every kvpress press that "
        "compresses a prefill offline on a CPU, both orders, from one prefill per prompt; the attack side of the most "
        "biased presses with the whitelist and fair eviction. The atlas judges a press against the paper only where "
        "the paper states its pattern (Fig 7); every other press's pattern is described, not judged.",
        ("12_atlas_bias", "12_atlas_attacks"),
        ("12_atlas_patterns", "12_atlas_bias", "12_atlas_attacks", "12_presses_not_run", "12_press_failures"),
    ),
    "13": (
        "Notebook 13: which fix, at what price",
        "Every mitigation of instruction eviction side by side, per policy and ratio: the whitelist, fair eviction, "
        "boundary protection (after arXiv 2605.18053, not the paper's), the defense last (alone and with the "
        "whitelist) and the defense's operative sentence last; the attack's refusal and the benign queries' refusal "
        "(the price) against the uncompressed model, and per policy the fix that holds to the highest ratio at no "
        "price.",
        ("13_fixes",),
        ("13_fixes_table", "13_recommended"),
    ),
}
