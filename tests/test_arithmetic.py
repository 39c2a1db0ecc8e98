"""Which arithmetic made a row (``fairkv.core.arithmetic``): the kernel family read from the CPU and oneDNN's cap, the
setting that chooses emulated bfloat16, the emulation's products, and the stamp every computed row carries."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from fairkv import studies
from fairkv.core import arithmetic, models
from fairkv.runs import experiment

EVERY_FLAG = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})


@pytest.mark.parametrize(
    "flags, cap, family",
    [
        (EVERY_FLAG, "", "amx"),
        (EVERY_FLAG, "AVX512_CORE_BF16", "avx512_bf16"),  # the committed rows' kernels on an Intel CPU with AMX
        (EVERY_FLAG, "avx512_core", "avx512"),
        (frozenset({"avx2", "avx512f", "avx512_bf16"}), "AVX512_CORE_AMX", "avx512_bf16"),  # a cap adds nothing
        (frozenset({"avx2"}), "", "avx2"),
        (frozenset(), "", "reference"),
    ],
)
def test_the_kernel_family_is_the_cpus_best_under_onednns_cap(flags, cap, family, monkeypatch):
    monkeypatch.setattr(arithmetic, "_cpu_flags", lambda: flags)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert arithmetic.cpu_family() == family


def test_auto_emulates_exactly_where_the_cpu_has_no_bfloat16_arithmetic(monkeypatch):
    for native in (True, False):
        monkeypatch.setattr(models, "bfloat16_arithmetic", lambda device=None: native)
        with arithmetic.forced("auto"):
            assert arithmetic.mode() == ("native" if native else "emulated")
        with arithmetic.forced("emulated"):
            assert arithmetic.mode() == "emulated"
    monkeypatch.setenv(arithmetic.SETTING, "fast")
    with pytest.raises(arithmetic.SettingError, match="FAIRKV_BFLOAT16='fast': use one of auto, native, emulated"):
        arithmetic.mode()


def test_an_emulated_product_is_the_float32_product_of_the_same_values_rounded_to_bfloat16():
    """bfloat16 x bfloat16 is exact in float32, so the emulation is a float32 sum rounded once; float32 work is left
    alone, and a weight is converted once."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(3, 5, 64, generator=generator).to(torch.bfloat16)
    w = torch.nn.Parameter(torch.randn(32, 64, generator=generator).to(torch.bfloat16), requires_grad=False)
    x32 = torch.randn(4, 64, generator=generator)
    with arithmetic._Emulated():
        linear, product, untouched = F.linear(a, w), a @ a.transpose(1, 2), F.linear(x32, w.float())
    assert linear.dtype == product.dtype == torch.bfloat16
    assert torch.equal(linear, F.linear(a.float(), w.float()).to(torch.bfloat16))
    assert torch.equal(product, (a.float() @ a.float().transpose(1, 2)).to(torch.bfloat16))
    assert untouched.dtype == torch.float32 and torch.equal(untouched, F.linear(x32, w.float()))
    assert arithmetic._FLOAT32[id(w)][1] is arithmetic._float32(w)  # cached: not converted again


@pytest.mark.model
def test_every_computed_row_records_the_arithmetic_that_made_it(smollm, tmp_path):
    grid = experiment.Grid(n_prompts=1, policies=("snapkv",), ratios=(0.0, 0.5), max_new_tokens=2)
    rows = experiment.run(grid, tmp_path, progress=False, lm=smollm)
    assert (
        set(rows[arithmetic.FIELD])
        == {arithmetic.path(smollm)}
        == {f"cpu float32 {torch.backends.cpu.get_cpu_capability().lower()}"}
    )


@pytest.mark.model
def test_smollm_in_emulated_bfloat16_keeps_what_native_bfloat16_keeps_within_the_bound(tmp_path):
    """SmolLM2's keep rates of one prompt, computed natively and emulated: within the verify bound, and stamped
    apart."""
    from fairkv.runs import tolerance

    lm = models.load_model("smollm2-135m", dtype=torch.bfloat16)
    grid = experiment.Grid(n_prompts=1, policies=("snapkv", "tova"), ratios=(0.5,), queries=("keep",), dtype="bfloat16")
    rows = {}
    for mode in ("native", "emulated"):
        with arithmetic.forced(mode):
            rows[mode] = experiment.run(grid, tmp_path / mode, progress=False, lm=lm).set_index("cell_id")
    assert set(rows["emulated"][arithmetic.FIELD]) == {"cpu bfloat16 emulated"}
    assert set(rows["native"][arithmetic.FIELD]) == {f"cpu bfloat16 {arithmetic.cpu_family()}"}
    for cell, native in rows["native"].iterrows():
        assert tolerance.keep_moved(native.to_dict(), rows["emulated"].loc[cell].to_dict()) <= tolerance.KEEP_BOUND


def test_a_claims_table_names_the_arithmetic_of_the_rows_it_read():
    """``studies.paths``: every path among the frames a study measures, once each, rows stored before the field as
    such, the judge's scores beside the rows they judge by name; a frame without the field (timings, a derived table)
    adds nothing."""
    native = pd.DataFrame({arithmetic.FIELD: ["cpu bfloat16 avx512_bf16"] * 2})
    mixed = pd.DataFrame({arithmetic.FIELD: ["cpu bfloat16 emulated", None]})
    judged = native.assign(judge_arithmetic="cpu bfloat16 amx")
    said = studies.paths([native, mixed, judged, pd.DataFrame({"ratio": [0.5]}), ["not a frame"]])
    assert said == f"cpu bfloat16 avx512_bf16; cpu bfloat16 emulated; judge: cpu bfloat16 amx; {studies.NOT_RECORDED}"
