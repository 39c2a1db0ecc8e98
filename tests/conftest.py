"""Shared fixtures: the embedded SmolLM2 model, the reference data shipped in data/, and the paper's prompts."""

from __future__ import annotations

import os

import pytest

from fairkv import data, models, prompts

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def smollm() -> models.LoadedModel:
    return models.load_model("smollm2-135m")


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
# process), `data` (reads the reference data in data/), `slow` (Qwen, Ray, killed subprocesses, Chromium, notebooks).
# `make test-fast` runs what is neither `model` nor `slow`.
MODEL_FIXTURES = {"smollm", "hf_folder", "reference", "serial_rows", "report"}
DATA_FIXTURES = {"records", "templates", "attack", "normal_prompt"}


def pytest_configure(config):
    config.addinivalue_line("markers", "model: loads a language model (embedded SmolLM2 or Qwen), here or in a child")
    config.addinivalue_line("markers", "data: reads the reference data shipped in data/")
    config.addinivalue_line("markers", "slow: Qwen, Ray, killed subprocesses, Chromium, notebooks: seconds to minutes")


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.path.suffix == ".ipynb":  # nbval: a notebook cell runs a model
            item.add_marker("slow")
            item.add_marker("model")
        if fixtures & MODEL_FIXTURES or item.get_closest_marker("slow"):
            item.add_marker("model")
        if fixtures & DATA_FIXTURES or item.path.name == "test_data.py":
            item.add_marker("data")


def pytest_sessionfinish(session, exitstatus):
    """With FAIRKV_FORBID_SKIPS set (CI), a skipped test fails the run: a clone must run every check."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if os.environ.get("FAIRKV_FORBID_SKIPS") and skipped and session.exitstatus == 0:
        reporter.write_line(f"FAIRKV_FORBID_SKIPS: {len(skipped)} test(s) skipped", red=True)
        session.exitstatus = 1
