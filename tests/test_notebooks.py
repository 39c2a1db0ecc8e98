"""The numbered notebooks as committed are the cpu reproduction (``fairkv.report.notebooks``): executed at their
defaults, every figure inline under the cell that makes it, no run metadata, no second copy; a run at their defaults
writes back in place, a run at other parameters under ``reports/<profile>/``; nbval's check fails on a changed output.
"""

from __future__ import annotations

import platform
import re
import subprocess
import threading

import nbformat
import pandas as pd
import pytest

from fairkv import cli
from fairkv.core.paths import REPO_ROOT
from fairkv.report import notebooks
from fairkv.runs.store import ResultsStore

# a notebook with its figures inline (at figures.INLINE_DPI) still opens on the repository's page and in JupyterLab
# in a second or two
NOTEBOOK_MAX_BYTES = 1536 * 1024


def _code(path):
    return [cell for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


@pytest.mark.parametrize("path", notebooks.numbered(), ids=lambda path: path.name[:2])
def test_a_committed_notebook_is_the_cpu_reproduction_with_its_figures_inline(path):
    nb = nbformat.read(path, as_version=4)
    opening = nb.cells[0].source
    assert (
        opening.startswith(f"# {path.name[:2]} ")
        and "**Runs:** at its defaults (the cpu profile) Qwen2.5-Coder-1.5B" in opening
    )
    (parameters,) = [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]
    assert parameters.source.startswith('profile = "cpu"'), "the default is the README's reproduction"
    code = _code(path)
    assert all(cell.execution_count for cell in code), "executed, every code cell"
    assert not [out for cell in code for out in cell.outputs if out.output_type == "error"]
    for cell in code:
        shown = sum("image/png" in out.get("data", {}) for out in cell.outputs)
        assert shown == cell.source.count("figures.publish("), f"a figure not inline under its cell:\n{cell.source}"
    assert not [key for holder in [nb, *nb.cells] for key in notebooks.RUN_METADATA if key in holder.metadata]
    assert path.stat().st_size <= NOTEBOOK_MAX_BYTES
    # the same in every clone: a re-render in another folder leaves git clean
    assert str(REPO_ROOT) not in path.read_text(), "an output names this checkout's folder"


def test_no_second_copy_of_the_rendered_notebooks_is_committed():
    tracked = subprocess.run(["git", "ls-files", "reports"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert tracked.stdout == ""


def _notebook(path, printed: str, stored: str, metadata: dict | None = None) -> None:
    cell = nbformat.v4.new_code_cell(f"print({printed!r})", execution_count=1, metadata=metadata or {})
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=stored + "\n")]
    nb = nbformat.v4.new_notebook(cells=[cell], metadata=dict(metadata or {}))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_settling_an_executed_notebook_strips_its_run_metadata_and_keeps_its_outputs(tmp_path):
    run = {"papermill": {"duration": 1.5, "start_time": "2026-12-06"}, "execution": {"iopub.status.busy": "..."}}
    _notebook(tmp_path / "executed.ipynb", "kept", "kept", {**run, "tags": ["nbval-ignore-output"]})
    notebooks.settle(tmp_path / "executed.ipynb", tmp_path / "committed.ipynb")
    nb = nbformat.read(tmp_path / "committed.ipynb", as_version=4)
    assert "papermill" not in nb.metadata and set(nb.cells[0].metadata) == {"tags"}
    assert nb.cells[0].outputs[0].text == "kept\n"


@pytest.mark.slow
def test_nbval_check_passes_a_reproduced_output_and_fails_a_changed_one(tmp_path):
    _notebook(tmp_path / "same.ipynb", "2 claims hold", "2 claims hold")
    _notebook(tmp_path / "changed.ipynb", "2 claims hold", "3 claims hold")
    assert notebooks.check(tmp_path / "same.ipynb")[0] == 0
    status, printed = notebooks.check(tmp_path / "changed.ipynb")
    assert status != 0 and "3 claims hold" in printed


@pytest.mark.slow
def test_a_notebook_computes_at_the_ci_profile_from_an_empty_store_through_papermill(tmp_path, monkeypatch):
    """The compute path end to end: notebook 04 at the ci profile (SmolLM2, keep rates only) from an empty results
    store, executed by papermill, its copy under reports/ci/, never over the committed notebook."""
    monkeypatch.setenv("FAIRKV_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("FAIRKV_REPORTS_DIR", str(tmp_path / "reports"))
    committed = notebooks.numbered(["04"])[0]
    before = committed.read_bytes()
    (written,) = cli.reproduce(["04"], {"profile": "ci", "output": str(tmp_path / "figures")})
    assert written == str(tmp_path / "reports" / "ci" / committed.name)
    assert committed.read_bytes() == before
    (store,) = (tmp_path / "results" / "ci").glob("*.jsonl")
    assert ResultsStore(store).rows(), "rows computed into the empty store"
    code = _code(written)
    assert sum("image/png" in out.get("data", {}) for cell in code for out in cell.outputs) == 2
    assert any("**What we see**" in out.get("data", {}).get("text/markdown", "") for out in code[-1].outputs)


@pytest.mark.slow
def test_a_parameter_at_the_committed_profile_writes_beside_the_committed_figures_never_over_them(
    tmp_path, monkeypatch
):
    """Notebook 04 rendered from the committed rows at another n_prompts: its copy, figures, tables and summary go
    under reports/cpu/, and the committed notebook, figures, tables, SUMMARY.md and README are left as they were
    (broken on purpose: without the redirection, it rewrote figures/cpu/ and the README's results from 10 prompts)."""
    monkeypatch.setenv("FAIRKV_REPORTS_DIR", str(tmp_path / "reports"))
    monkeypatch.setenv("FAIRKV_RESULTS_DIR", str(REPO_ROOT / "results"))  # the committed rows (make test sets another)
    committed = [
        notebooks.numbered(["04"])[0],
        REPO_ROOT / "README.md",
        *sorted((REPO_ROOT / "figures" / "cpu").rglob("*")),
    ]
    before = {path: path.read_bytes() for path in committed if path.is_file()}
    cli.reproduce(["04"], {"n_prompts": 10}, frozen=True)
    assert {path: path.read_bytes() for path in before} == before
    written = tmp_path / "reports" / "cpu" / "figures"
    assert (written / "04_fig7_keep_rates.png").exists() and (written / "SUMMARY.md").exists()
    claims = pd.read_csv(written / "tables" / "04_paper_vs_us.csv")
    assert set(claims["n"]) == {10}  # the run's 10 prompts, not the committed 100


def test_a_profile_a_notebook_has_no_scale_at_is_said_before_anything_runs(monkeypatch, capsys):
    """Notebook 12 (the atlas) runs at ci and cpu only: named at the paper profile, an error before anything runs; in a
    batch of every notebook, left out and said so, the others run; an unknown profile is an error naming the profiles
    (broken on purpose: without the check, the batch ran notebook 12 last and failed there)."""
    ran = []
    monkeypatch.setattr(notebooks, "execute_all", lambda chosen, *args: ran.extend(n.name[:2] for n in chosen) or [])
    with pytest.raises(SystemExit, match="notebook 12 runs at ci, cpu only, not at the paper profile"):
        cli.reproduce(["12"], {"profile": "paper", "model": "some/model"})
    with pytest.raises(SystemExit, match="unknown profile 'gpu': use one of ci, cpu, paper"):
        cli.reproduce(None, {"profile": "gpu"})
    assert ran == []
    cli.reproduce(None, {"profile": "paper", "model": "some/model"})
    assert ran == [n.name[:2] for n in notebooks.numbered(None) if not n.name.startswith("12")] and "12" not in ran
    assert "left out at the paper profile: notebook 12 runs at ci, cpu only" in capsys.readouterr().out


# what torch is told to make this CPU look like one without bfloat16 arithmetic (an AVX2-only CPU): its kernels capped
# to AVX2, so oneDNN has no bfloat16 kernel and ``models.bfloat16_arithmetic`` is False, as on such a CPU
WITHOUT_BFLOAT16 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def _shown(cell) -> list[str]:
    return [out.get("text") or out.get("data", {}).get("text/plain", "") for out in cell.outputs]


@pytest.mark.slow
@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="capping torch to AVX2 is an x86 CPU's setting"
)
def test_qwen_quickstart_shows_the_same_on_a_cpu_without_bfloat16_arithmetic(tmp_path, monkeypatch):
    """The quickstart decodes live, in float32 where the CPU has no bfloat16 arithmetic (``models.live_dtype``), so
    every cell nbval compares must read the same there (a printed "in float32" failed nbval so, found this way):
    executed with torch capped to AVX2 (one setting, two tokens), each compared cell shows what the committed one
    shows, and the live cell names the float32 arithmetic it ran."""
    for name, value in WITHOUT_BFLOAT16.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FAIRKV_REPORTS_DIR", str(tmp_path / "reports"))
    committed = notebooks.numbered(["00"])[0]
    cheap = {"profile": "cpu", "policies": ["streamingllm"], "ratios": [0.0], "max_new_tokens": 2}
    (written,) = cli.reproduce(["00"], {**cheap, "output": str(tmp_path / "figures")})
    executed = {cell.source: cell for cell in _code(written)}
    compared = [
        cell
        for cell in _code(committed)
        if not {"parameters", "nbval-ignore-output"} & set(cell.metadata.get("tags", []))
    ]
    assert len(compared) == 2
    for cell in compared:
        assert _shown(executed[cell.source]) == _shown(cell), cell.source
    live = next(cell for source, cell in executed.items() if source.startswith('print(f"decoded live'))
    assert _shown(live)[0].startswith("decoded live in cpu float32 avx2")


def test_notebooks_are_checked_several_at_once_each_said_whole(monkeypatch):
    """``check_all`` runs ``jobs`` nbval checks at once (two checks meet at a barrier: run one at a time, it times
    out), never more, prints each notebook's nbval lines together before its wall time, and names the notebooks
    that differ in their order."""
    chosen = notebooks.numbered()[:4]
    meet, lock, running, most = threading.Barrier(2, timeout=30), threading.Lock(), [0], [0]

    def check(notebook):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        meet.wait()
        with lock:
            running[0] -= 1
        return int(notebook in chosen[1::2]), f"nbval of {notebook.name}\n1 passed"

    monkeypatch.setattr(notebooks, "check", check)
    said = []
    failed = notebooks.check_all(chosen, jobs=2, say=said.append)
    assert failed == [chosen[1].name, chosen[3].name] and most[0] == 2
    for number, notebook in enumerate(chosen, start=1):
        (done,) = [
            i for i, line in enumerate(said) if re.fullmatch(rf"  {re.escape(notebook.name)} done in \d+ s", line)
        ]
        assert said[done - 1] == f"nbval of {notebook.name}\n1 passed"
        assert said.index(f"[{number}/4] {notebook.name} -> checked by nbval") < done - 1
    with pytest.raises(ValueError, match="jobs=0: at least one notebook at a time"):
        notebooks.check_all(chosen, jobs=0)
