"""A press of one's own (issue 54, item 4): registered at run time (``fairkv.core.presses.own.register``), it is a
policy like kvpress's own: the atlas measures it, a grid runs its variants, and its cells carry its source."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
from kvpress import ScorerPress, SnapKVPress

from fairkv.core import paths
from fairkv.core.presses import own, registry
from fairkv.core.presses.policy import SCORE_ONCE, PolicyError
from fairkv.runs import atlas, experiment


@dataclass
class EarliestPress(ScorerPress):
    """A toy press: keeps the earliest tokens (the score falls with the position), whatever the prompt says."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        n = keys.shape[2]
        return -torch.arange(n, dtype=keys.dtype, device=keys.device).expand(*keys.shape[:3])


@pytest.fixture
def earliest():
    """The toy press registered, and the registry as it was afterwards."""
    saved = dict(registry.REGISTRY)
    yield own.register("EarliestPress", "Earliest", lambda r: EarliestPress(compression_ratio=r), "independent")
    registry.REGISTRY.clear()
    registry.REGISTRY.update(saved)


def test_a_registered_press_runs_through_the_atlas(earliest, smollm, tmp_path):
    """The atlas measures it beside kvpress's presses: in the normal order (the defense first, 124 of SmolLM2's 165
    tokens) a press that keeps the earliest tokens spends all of r = 0.3's budget on the defense and none on the
    directive; StreamingLLM, keeping the most recent ones, the opposite."""
    plan = atlas.Plan(
        profile="ci", n_prompts=1, ratios=(0.3,), orders=("normal",), presses=("Earliest", "StreamingLLM")
    )
    rows = atlas.run(plan, folder=tmp_path, progress=False, lm=smollm).set_index("press")
    assert rows.loc["Earliest", "keep_directive"] == 0.0 and rows.loc["Earliest", "keep_defense"] > 0.9
    assert rows.loc["StreamingLLM", "keep_directive"] == 1.0  # the opposite end, for contrast


def test_a_frozen_atlas_names_the_added_press_and_the_command_computing_its_rows(earliest, smollm, tmp_path):
    """A press added to the catalogue lacks its keep rates in the committed atlas: a frozen run stops before loading
    anything, naming the press, its missing cells and the one command that computes them alone (broken on purpose:
    the runner's general advice, "Run without --frozen")."""
    plan = atlas.Plan(profile="ci", n_prompts=1, ratios=(0.3,), orders=("normal",), presses=("StreamingLLM",))
    atlas.run(plan, folder=tmp_path, progress=False, lm=smollm)
    added = replace(plan, presses=("Earliest", "StreamingLLM"))
    with paths.frozen_run(), pytest.raises(paths.FrozenError) as raised:
        atlas.run(added, folder=tmp_path, progress=False)
    said = str(raised.value)
    assert "lacks 1 of the 2 cells" in said and "Missing: the keep rates of Earliest (1 cell)." in said
    assert "Compute only them: fairkv reproduce 12 -p profile ci (every stored row is reused)" in said


def test_a_registered_press_is_a_policy_with_its_variants(earliest, smollm, tmp_path):
    """A grid takes it by its key and runs its fair variant (span-local scores by its declared scoring): fair eviction
    keeps each span's share; its cells' ids hold its source, kvpress's none."""
    grid = experiment.Grid(
        model="smollm2-135m", n_prompts=1, policies=("earliest",), variants=("base", "fair"), ratios=(0.5,),
        queries=("keep",),
    )  # fmt: skip
    rows = experiment.run(grid, tmp_path, progress=False, lm=smollm).set_index("variant")
    assert rows.loc["base", "keep_directive"] == 0.0 and rows.loc["base", "keep_defense"] > 0.6
    assert abs(rows.loc["fair", "keep_directive"] - rows.loc["fair", "keep_defense"]) < 0.05
    assert registry.provenance("earliest") == {"press_source": earliest.source}
    assert registry.provenance("snapkv") == {} and registry.provenance(None) == {}


def test_its_source_and_configuration_are_part_of_its_cells(earliest):
    """What decides its rows is in its hash, so an edited or reconfigured press computes other cells, never the old
    ones: the class's source, its configuration, its scoring (broken on purpose: hashing the class's source alone made
    the reconfigured press's hash equal)."""

    @dataclass
    class Edited(EarliestPress):
        def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
            return -super().score(module, hidden_states, keys, values, attentions, kwargs)

    press = EarliestPress(compression_ratio=0.5)
    assert own.source_hash(press, "independent", SCORE_ONCE) == earliest.source
    others = [
        own.source_hash(Edited(compression_ratio=0.5), "independent", SCORE_ONCE),
        own.source_hash(EarliestPress(compression_ratio=0.25), "independent", SCORE_ONCE),
        own.source_hash(press, "cross-token", SCORE_ONCE),
    ]
    assert len({earliest.source, *others}) == 4


def test_registering_checks_what_it_is_given(earliest):
    with pytest.raises(PolicyError, match="already holds 'EarliestPress'"):
        own.register("EarliestPress", "Other", lambda r: EarliestPress(compression_ratio=r), "independent")
    with pytest.raises(PolicyError, match="already holds 'SnapKV'"):
        own.register("MySnapKV", "SnapKV", lambda r: EarliestPress(compression_ratio=r), "independent")
    with pytest.raises(PolicyError, match="unknown scoring 'positional'"):
        own.register("LatestPress", "Latest", lambda r: EarliestPress(compression_ratio=r), "positional")
    with pytest.raises(PolicyError, match="must return a kvpress press"):
        own.register("LatestPress", "Latest", lambda r: object(), "independent")
    with pytest.raises(PolicyError, match="already holds 'Earliest'"):
        own.register("OtherPress", "Earliest", lambda r: EarliestPress(compression_ratio=r), "independent")
    with pytest.raises(PolicyError, match="SnapKVPress is a class the registry already scores"):
        own.register("Snap8Press", "Snap8", lambda r: SnapKVPress(r, window_size=8), "independent")
    with pytest.raises(PolicyError, match="source of .* cannot be read"):
        own.source_hash(type("Typed", (EarliestPress,), {})(compression_ratio=0.5), "independent", SCORE_ONCE)
