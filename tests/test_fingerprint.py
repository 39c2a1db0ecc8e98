"""The fingerprint follows the definitions that decide rows: docstrings, error messages, formatting, moves and code no
row reaches keep it; an edit of code a row runs changes it (``fairkv.runs.fingerprint``)."""

from __future__ import annotations

import re
import runpy
import shutil
from pathlib import Path

import pytest

from fairkv.core.presses import registry
from fairkv.runs import fingerprint

KINDS = {
    "sweep": fingerprint.SWEEP,
    "atlas": fingerprint.ATLAS,
    "judge": fingerprint.JUDGE,
    "operative": fingerprint.OPERATIVE,
}


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A copy of the package that the fingerprint reads instead of the real one."""
    copy = tmp_path / "fairkv"
    shutil.copytree(fingerprint.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(fingerprint, "PACKAGE", copy)
    fingerprint.clear()
    yield copy
    monkeypatch.undo()
    fingerprint.clear()  # the next caller hashes the real package again


def prints() -> dict[str, str]:
    fingerprint.clear()
    return {kind: fingerprint.of(roots) for kind, roots in KINDS.items()}


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer holds {old!r}: update this test"
    path.write_text(text.replace(old, new))


def test_docstrings_keep_it_and_code_a_row_runs_changes_it(package):
    before = prints()
    selection = package / "core" / "presses" / "selection.py"
    edit(selection, '"""Which positions to keep:', '"""Which positions (edited) to keep:')
    assert prints() == before
    edit(selection, "scores.topk(n_kept, dim=-1).indices", "scores.topk(n_kept, dim=-1, sorted=False).indices")
    after = prints()
    assert after["sweep"] != before["sweep"] and after["atlas"] != before["atlas"]
    assert after["operative"] != before["operative"]


def _data_from_datasets(match: re.Match) -> str:
    """``from fairkv.core import data, engine`` -> ``from fairkv.core import engine`` and
    ``from fairkv.core.datasets import data``."""
    indent, names = match.group(1), [name.strip() for name in match.group(2).split(",")]
    if "data" not in names:
        return match.group(0)
    rest = [name for name in names if name != "data"]
    moved = f"{indent}from fairkv.core.datasets import data"
    return (f"{indent}from fairkv.core import {', '.join(rest)}\n" if rest else "") + moved


def test_a_pure_move_keeps_it(package):
    """core/data.py moves into a new subpackage ``core/datasets``, every import follows: no fingerprint changes."""
    before = prints()
    datasets = package / "core" / "datasets"
    datasets.mkdir()
    (datasets / "__init__.py").write_text('"""The datasets."""\n')
    (package / "core" / "data.py").rename(datasets / "data.py")
    for module in package.rglob("*.py"):
        text = re.sub(r"(?m)^( *)from fairkv.core import (.*)$", _data_from_datasets, module.read_text())
        module.write_text(text.replace("from fairkv.core.data import", "from fairkv.core.datasets.data import"))
    assert "from fairkv.core.datasets import data" in (package / "runs" / "experiment.py").read_text()
    assert prints() == before


def test_code_no_row_reaches_keeps_it(package):
    """An edit of the atlas's patterns, of a function in the atlas's module that no row runs, or of an error's text
    keeps every fingerprint; an edit of the atlas's keep rates changes the atlas's only (the sweep never runs them)."""
    before = prints()
    edit(package / "report" / "press_patterns.py", "def pattern(table", "def pattern_renamed(table")
    edit(package / "runs" / "atlas.py", "def describe(chosen: Plan, rows", "def describe(chosen, rows")
    edit(package / "runs" / "studies.py", 'f"unknown profile {name!r}', 'f"no profile {name!r}')
    assert prints() == before
    edit(package / "runs" / "atlas.py", 'failed = {span.name: float("nan")', 'failed = {span.name: float("inf")')
    after = prints()
    assert after["atlas"] != before["atlas"] and after["sweep"] == before["sweep"]


def test_neutral_modules_count_by_name(package):
    """Editing the progress reports or the runner's store loop keeps the sweep's fingerprint; taking ``note`` from
    another module changes it."""
    before = prints()["sweep"]
    edit(package / "core" / "progress.py", "class Bar", "class _Unused:\n    pass\n\n\nclass Bar")
    edit(package / "runs" / "runner.py", "bar.close()", "bar.update(0)\n            bar.close()")
    assert prints()["sweep"] == before
    edit(
        package / "runs" / "experiment.py",
        "from fairkv.core.progress import note as progress_note",
        "from fairkv.runs.store import note as progress_note",
    )
    assert prints()["sweep"] != before


def test_an_entry_point_that_names_nothing_is_an_error():
    with pytest.raises(fingerprint.FingerprintError, match=r"'runs/experiment.py:runs'.*defines no 'runs'"):
        fingerprint.of(("runs/experiment.py:runs",))


def test_a_scale_keeps_every_fingerprint_and_scoring_code_changes_it(package):
    """Which rows a study asks for is not how a row is computed (issue 49): a profile's or a study's prompts, ratios,
    budgets and batch sizes, and the defaults of the plans that carry them, keep every fingerprint; an edit of the
    scoring a row runs through changes the fingerprint of its kind of row: the sweep's for a response's scores, the
    judge's for a judge's."""
    before = prints()
    studies = package / "runs" / "studies.py"
    edit(
        studies,
        'model="qwen2.5-coder-1.5b",\n        n_prompts=100,',
        'model="qwen2.5-coder-1.5b",\n        n_prompts=200,',
    )
    edit(studies, "CPU_MITIGATION_RATIOS = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7)", "CPU_MITIGATION_RATIOS = (0.0, 0.5)")
    declared = package / "studies"  # each study's declaration, beside its claims: no row reaches it
    edit(
        declared / "atlas.py",
        '"cpu": Plan("cpu", n_prompts=100, ratios=TEN_RATIOS[1:])',
        '"cpu": Plan("cpu", n_prompts=20)',
    )
    edit(declared / "leakage.py", '"paper": Scale(n_prompts=100)', '"paper": Scale(n_prompts=50)')
    edit(studies, "batch_size=128,", "batch_size=64,")
    edit(studies, "GROWN_SIDE = dict(n_prompts=100)", "GROWN_SIDE = dict(n_prompts=50)")
    experiment = package / "runs" / "experiment.py"
    edit(experiment, "    n_prompts: int | None = 4\n", "    n_prompts: int | None = 8\n")
    edit(experiment, "    batch_size: int = 32\n", "    batch_size: int = 16\n")
    edit(experiment, "    ratios: tuple[float, ...] = (0.0, 0.5)\n", "    ratios: tuple[float, ...] = (0.0, 0.7)\n")
    atlas = package / "runs" / "atlas.py"
    edit(atlas, "    n_prompts: int = 4\n", "    n_prompts: int = 40\n")
    edit(atlas, "    ratios: tuple[float, ...] = (0.3, 0.5, 0.7)\n", "    ratios: tuple[float, ...] = (0.5,)\n")
    assert prints() == before
    edit(declared / "judge.py", "calibration_prompts=6", "calibration_prompts=12")  # the judge's scale
    assert prints() == before
    edit(package / "core" / "metrics.py", '["rougeL"].recall', '["rougeL"].fmeasure')
    scored = prints()
    assert scored["sweep"] != before["sweep"] and scored["judge"] == before["judge"]
    edit(
        package / "runs" / "experiment.py",
        "return 0\n        return self.benign_tokens",
        "return 1\n        return self.benign_tokens",
    )
    assert prints()["sweep"] != scored["sweep"]  # a plan's method counts: only its defaults do not
    scored = prints()
    edit(package / "runs" / "judge.py", "LEAK_SCORE = 2", "LEAK_SCORE = 3")
    judged = prints()
    assert judged["judge"] != scored["judge"] and judged["sweep"] == scored["sweep"]


def stamps() -> dict[str, str]:
    """Every policy's press stamp, beside the code fingerprints of each kind of row."""
    return {**prints(), **{key: fingerprint.press_stamp(key) for key in registry.REGISTRY}}


def test_adding_a_press_keeps_every_other_stamp(package):
    """One binding more in the declarations (issue 69): every kind of row's fingerprint and every other press's stamp
    stay, and the new press is stamped by its own binding."""
    before = stamps()
    declarations = package / "core" / "presses" / "policies.py"
    edit(
        declarations,
        "\n# the one registry:",
        '\nKEYDIFF_AGAIN = _cross_token("KeyDiffPress", "KeyDiffAgain")\n\n# the one registry:',
    )
    assert stamps() == before
    assert "keydiffagain" in runpy.run_path(str(declarations))["REGISTRY"]  # the binding alone registers it
    assert fingerprint.of((f"{fingerprint.DECLARATIONS}:KEYDIFF_AGAIN",)) not in before.values()


def test_editing_one_press_moves_only_its_stamp(package):
    """An edit of SnapKV's span-local score (Appendix F.4) moves SnapKV's stamp alone: no code fingerprint, no other
    press's; an edit of the selection every press runs moves the code's fingerprints and no press stamp; an edit of the
    independent kind's span-local score only the stamp of the press declared with it."""
    before = stamps()
    edit(package / "core" / "presses" / "scoring.py", "votes.max() + 1", "votes.max() + 2")
    after = stamps()
    assert {name for name in before if after[name] != before[name]} == {"snapkv"}
    edit(package / "core" / "presses" / "selection.py", "or setting.lam == 0.0", "or setting.lam <= 0.0")
    moved = {name for name, value in stamps().items() if value != after[name]}
    assert moved == {"sweep", "operative"}  # the atlas keeps the base selection alone
    middle = stamps()  # the independent kind's span-local score: the catalogue's independent scorers (Random's)
    edit(package / "core" / "presses" / "scoring.py", "values, None, kwargs)", "values, attentions, kwargs)")
    independent = {key for key, e in registry.REGISTRY.items() if e.scoring == "independent" and not e.paper}
    assert (
        "random" in independent and {name for name, value in stamps().items() if value != middle[name]} == independent
    )


def test_a_row_carries_the_stamp_of_its_press():
    """A grid's row names its press by key, the atlas's by label: both read the same stamp; the uncompressed cache
    (policy "none") carries none."""
    versions = {"code": "c"}
    snapkv = fingerprint.press_stamp("snapkv")
    assert fingerprint.expected(versions, {"policy": "snapkv"}) == {"code": "c", "press": snapkv}
    assert fingerprint.expected(versions, {"press": "SnapKV"}) == {"code": "c", "press": snapkv}
    assert fingerprint.expected(versions, {"policy": "none"}) == versions
    assert fingerprint.expected(versions, {"judged": "cell"}) == versions
    assert len({fingerprint.press_stamp(key) for key in registry.REGISTRY}) == len(registry.REGISTRY)


def test_rows_of_a_press_this_process_does_not_know_are_named():
    """A press of one's own registered in another process: its rows' stamp cannot be read here, and the error says so
    (a raw lookup error before)."""
    with pytest.raises(fingerprint.FingerprintError, match=r"press 'earliest', which this process does not know"):
        fingerprint.expected({}, {"policy": "earliest"})
