"""The embedded models' first load: GGUF parts joined, de-quantised and saved as float32 (``fairkv.core.models``), with
each GGUF file parsed once (``models._gguf_parsed_once``) against transformers' own way (parsed anew for the config,
the tokenizer and the weights).

    .venv/bin/python benchmarks/gguf_conversion.py [--models smollm2-135m qwen2.5-coder-1.5b]

A fresh clone converts each model once (``make reproduce``'s quickstart converts Qwen2.5-Coder-1.5B; CI does it with an
empty model cache on every run). Each line: a model, the way, the wall time of one conversion into an empty cache;
the ways take turns ``--repeats`` times (so neither alone meets a cold page cache), then each way's best, and whether
every file each conversion wrote (weights, tokenizer, config) is byte for byte the same.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

from fairkv.core import models, paths

WAYS = {"parsed anew per call": contextlib.nullcontext, "parsed once": models._gguf_parsed_once}


def convert(name: str, way: str) -> tuple[float, dict[str, str]]:
    """Seconds to convert ``name`` into an empty cache the ``way`` named, and each written file's sha256."""
    with tempfile.TemporaryDirectory(prefix="fairkv-conversion-") as cache:
        with (
            paths.environment("FAIRKV_CACHE_DIR", cache),
            mock.patch.object(models, "_gguf_parsed_once", WAYS[way]),
        ):
            began = time.perf_counter()
            folder, _ = models._resolve(name, convert=True)
            seconds = time.perf_counter() - began
        files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(folder).iterdir())}
    return seconds, files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(models.EMBEDDED))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    for name in args.models:
        seconds, written = {way: [] for way in WAYS}, set()
        for _ in range(args.repeats):
            for way in WAYS:
                took, files = convert(name, way)
                seconds[way].append(took)
                written.add(tuple(files.items()))
                print(f"{name}, {way}: {took:.1f} s", flush=True)
        best = ", ".join(f"{way} {min(times):.1f} s" for way, times in seconds.items())
        same = "identical" if len(written) == 1 else "DIFFERENT"
        count = len(next(iter(written)))
        print(f"{name}: best {best}; {count} files written, {same} in all {len(WAYS) * args.repeats} conversions")


if __name__ == "__main__":
    main()
