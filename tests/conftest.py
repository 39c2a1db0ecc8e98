"""Shared fixtures: the embedded SmolLM2 model, the reference data shipped in data/, and the paper's prompts."""

from __future__ import annotations

import os
import time

import pytest
import torch

from fairkv.core import data, models, progress, prompts

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["FAIRKV_FROZEN"] = "0"  # tests compute into fresh stores, whatever the shell exported (fairkv.core.paths)
QWEN = "qwen2.5-coder-1.5b"  # the cpu profile's model

# Under pytest-xdist each worker takes its share of the cores, and so do the processes it starts (notebook kernels,
# sweeps): two processes of two OpenMP threads each on two cores spin against each other and run many times slower.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    THREADS = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(THREADS)
    torch.set_num_threads(THREADS)


@pytest.fixture(scope="session")
def smollm() -> models.LoadedModel:
    return models.load_model("smollm2-135m")


@pytest.fixture(scope="session")
def qwen() -> models.LoadedModel:
    """The cpu profile's model at its precision (Qwen2.5-Coder-1.5B, bfloat16, eager attention as the engine needs;
    float32 on a CPU without bfloat16 arithmetic: ``models.live_dtype``), loaded once for the defense compliance
    checks."""
    return models.load_model(QWEN, dtype=getattr(torch, models.live_dtype("bfloat16")))


@pytest.fixture(scope="session")
def qwen_judge() -> models.LoadedModel:
    """The cpu profile's judge as notebook 10 loads it (``judge.load_judge``: Qwen in bfloat16, SDPA attention; with
    eager attention its scores on the calibration set differ; on the GPU where there is one, else float32 on a CPU
    without bfloat16 arithmetic: ``models.live_dtype``), loaded once for the judge's checks."""
    from fairkv.runs import judge
    from fairkv.studies import judge as judge_study

    chosen = judge_study.STUDY.plan("cpu")
    return judge.load_judge(chosen.judge, models.live_dtype(chosen.dtype, models.default_device()))


@pytest.fixture(scope="session")
def records() -> list[data.Record]:
    return data.load_sys_ifeval("sys_ifeval_shuffled", limit=20)


@pytest.fixture(scope="session")
def templates() -> dict[str, str]:
    return data.load_defense_templates()


@pytest.fixture(scope="session")
def attack() -> str:
    return data.paper_attack().text


@pytest.fixture(scope="session", params=["normal", "flipped"])
def order(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def normal_prompt(smollm, records, templates) -> prompts.Prompt:
    return prompts.paper_prompt(smollm.tokenizer, records[0], templates, order="normal")


# Tiers, set here and nowhere else: `model` (loads a language model: directly, through a fixture, or in a child
# process), `data` (reads the reference data in data/), `slow` (Qwen, Ray, killed subprocesses, Chromium, notebooks run by papermill).
# `make test-fast` runs what is neither `model` nor `slow`.
MODEL_FIXTURES = {"smollm", "qwen", "qwen_judge", "hf_folder", "reference", "serial_rows", "report"}
DATA_FIXTURES = {"records", "templates", "attack", "normal_prompt"}


def pytest_configure(config):
    config.addinivalue_line("markers", "model: loads a language model (embedded SmolLM2 or Qwen), here or in a child")
    config.addinivalue_line("markers", "data: reads the reference data shipped in data/")
    config.addinivalue_line(
        "markers", "slow: Qwen, Ray, killed subprocesses, Chromium, notebooks run by papermill: seconds to minutes"
    )


# Workers (`make test` runs pytest-xdist, two workers; the notebooks are checked by nbval in `make reproduce FROZEN=1`,
# fairkv.report.notebooks): the Qwen checks (tests named test_qwen_*, and the items run on Qwen's tokenizer) in one worker, after the judge's
# check has converted the model, so that Qwen is converted and loaded once; every other test with the rest of its
# module, so a module's fixtures are computed once. The groups are scopes of xdist's loadscope scheduler (xdist's own
# xdist_group marks rename node ids, which pytest 9 ignores), handed out in the order ``group_rank`` gives them (the
# longest first: Qwen, modules with slow tests, with model tests, the rest), so that no long group starts last.
QWEN_GROUP = "qwen"


def worker_group(nodeid: str) -> str:
    path, _, name = nodeid.partition("::")
    return QWEN_GROUP if name.startswith("test_qwen") or QWEN in name else path  # QWEN in name: a parameter


def group_rank(group: str, slow: set[str], model: set[str]) -> int:
    """0 Qwen, 1 groups with slow tests, 2 with tests of a model, 3 the rest."""
    return 0 if group == QWEN_GROUP else 1 if group in slow else 2 if group in model else 3


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, called only where it runs
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    config.option.loadscopereorder = False  # the groups in collection order, which group_rank sets
    return Groups(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & {"qwen", "qwen_judge"}:
            if not item.name.startswith("test_qwen"):
                raise pytest.UsageError(f"{item.nodeid} loads Qwen: name it test_qwen_* (its worker group)")
            item.add_marker("slow")
        if fixtures & MODEL_FIXTURES or item.get_closest_marker("slow"):
            item.add_marker("model")
        if fixtures & DATA_FIXTURES or item.path.name == "test_data.py":
            item.add_marker("data")
    slow, model = (
        {worker_group(item.nodeid) for item in items if item.get_closest_marker(m)} for m in ("slow", "model")
    )
    items.sort(key=lambda item: group_rank(worker_group(item.nodeid), slow, model))  # stable: in-group order kept


SLOWEST = 5  # items named at the end of every run, so that a slow drift is seen
STARTED = time.monotonic()  # when pytest imported this file: the run's start, collection included


def pytest_terminal_summary(terminalreporter):
    """The run's wall time and its slowest items (setup, call and teardown together), the last thing pytest prints
    before its result line; under xdist the items ran side by side, so their times add up to more than the wall."""
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown"):
                seconds[report.nodeid] = seconds.get(report.nodeid, 0.0) + report.duration
    if not seconds:
        return
    wall = time.monotonic() - STARTED
    terminalreporter.section(f"wall time {progress.duration(wall)}; the {SLOWEST} slowest items")
    for nodeid, spent in sorted(seconds.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        terminalreporter.write_line(f"{spent:8.1f} s  {nodeid}")


def pytest_sessionfinish(session, exitstatus):
    """With FAIRKV_FORBID_SKIPS set (CI), a skipped test fails the run: a clone must run every check."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if os.environ.get("FAIRKV_FORBID_SKIPS") and skipped and session.exitstatus == 0:
        reporter.write_line(f"FAIRKV_FORBID_SKIPS: {len(skipped)} test(s) skipped", red=True)
        session.exitstatus = 1
