"""The paths a user takes that the other tests do not: the GPU user's paper profile (a Hugging Face model folder in
bfloat16, both orders, through ``fairkv reproduce``) and JupyterLab's kernel. Run on every CI run, on the CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from jupyter_client.kernelspec import KernelSpecManager

from fairkv import cli
from fairkv.core import data
from fairkv.report.notebooks import numbered
from fairkv.runs import experiment
from fairkv.studies import leakage, trec

NOTEBOOKS = numbered()


@pytest.fixture(scope="module")
def hf_folder(smollm, tmp_path_factory) -> Path:
    """The embedded SmolLM2 written as a Hugging Face model folder (safetensors), as a GPU user's model arrives."""
    folder = tmp_path_factory.mktemp("models") / "SmolLM2-135M-Instruct"
    smollm.model.save_pretrained(folder, safe_serialization=True)
    smollm.tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_paper_profile_on_a_model_folder_in_bfloat16(hf_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("FAIRKV_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("FAIRKV_REPORTS_DIR", str(tmp_path / "reports"))
    overrides = dict(model=str(hf_folder), n_prompts=2, ratios=[0.0, 0.5], max_new_tokens=4)  # all five policies
    written = cli.reproduce(["03"], {"profile": "paper", "output": str(tmp_path / "figures"), **overrides})

    assert written == [str(tmp_path / "reports" / "paper" / "03_pitfalls3_4_leakage.ipynb")]
    grid = leakage.STUDY.grid("paper", **overrides)
    assert (grid.dtype, grid.orders, grid.max_new_tokens, grid.benign_tokens) == (
        "bfloat16",
        ("normal", "flipped"),
        4,
        4,
    )
    assert experiment.Job(grid, (), None, {}, {}, {}).load().model.dtype == torch.bfloat16
    rows = list(experiment.store_for(grid, tmp_path / "results" / "paper").rows().values())  # the profile's folder
    controls = {row["template"] for row in rows if row.get("template")}  # the positive controls' (issue 82)
    assert controls == {"neutral_defense", "no_defense"}
    rows = [row for row in rows if not row.get("template")]
    # 2 prompts x 2 orders x (r = 0, and 5 policies at r = 0.5) x (benign, attack)
    assert len(rows) == 2 * 2 * 6 * 2
    assert {row["dtype"] for row in rows} == {"bfloat16"}
    assert {row["order"] for row in rows} == {"normal", "flipped"}
    assert {row["key"] for row in rows} == {r.key for r in data.load_sys_ifeval("sys_ifeval_shuffled", limit=2)}
    assert {row["policy"] for row in rows} == {"none", "streamingllm", "h2o", "snapkv", "tova", "knorm"}
    assert {row["max_new_tokens"] for row in rows} == {4} and max(row["new_tokens"] for row in rows) <= 4
    assert (tmp_path / "figures" / "03_fig4_normal.png").is_file()
    assert (tmp_path / "figures" / "03_fig5_flipped.png").is_file()


def test_an_explicit_budget_caps_every_query():
    """A GPU user cutting the paper's budgets with -p max_new_tokens cuts IFEval's 1280 too; a smaller cap stays."""
    assert leakage.STUDY.grid("paper").benign_tokens == 1280
    assert leakage.STUDY.grid("paper", max_new_tokens=4).benign_tokens == 4
    assert trec.STUDY.grid("cpu", max_new_tokens=256).benign_tokens == 64  # LongBench answers TREC in 64


def test_notebooks_declare_the_kernel_this_environment_registers():
    """JupyterLab opens each notebook with the kernel it names; it must be this environment's Python."""
    specs = KernelSpecManager().find_kernel_specs()
    for notebook in NOTEBOOKS:
        name = json.loads(notebook.read_text())["metadata"]["kernelspec"]["name"]
        assert name in specs, f"{notebook.name} asks for kernel {name!r}; registered: {sorted(specs)}"
        argv = KernelSpecManager().get_kernel_spec(name).argv
        assert Path(argv[0]).resolve() == Path(sys.executable).resolve(), (
            f"kernel {name!r} runs {argv[0]}, not this environment's {sys.executable}: run make setup"
        )
