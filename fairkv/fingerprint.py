"""A fingerprint of the code that decides a result row: every row carries it, and rows of other code never mix.

Library versions do not change when our own code does: a second local run would replay rows that older presses, an
older engine or older prompt code computed. ``code_fingerprint`` hashes the syntax trees of the modules whose change
can change a row (data, prompts, presses, engine, decoding and its attention kernel, metrics, models, the sweep's
row assembly, LongBench and N-span prompts), without docstrings, so an edit of a comment or a docstring keeps stored
rows, and any edit of code does not. ``metrics.versions`` includes it; ``experiment.run`` refuses a store whose rows carry another.
The judge (``fairkv.judge``) is not among them: its scores live in a store of their own, keyed by ``JUDGE_VERSION``,
and never change a sweep row.
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
RESULT_CODE = (
    "data.py",
    "prompts.py",
    "engine.py",
    "generation.py",
    "attention.py",
    "metrics.py",
    "models.py",
    "experiment.py",
    "longbench.py",
    "multispan.py",
    "presses/__init__.py",
    "presses/budget.py",
    "presses/recording.py",
    "presses/registry.py",
    "presses/scoring.py",
    "presses/selection.py",
)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def module_fingerprint(names: tuple[str, ...]) -> str:
    """12 hex digits of sha256 over the docstring-free syntax trees of the package modules ``names``."""
    digest = hashlib.sha256()
    for name in names:
        tree = _without_docstrings(ast.parse((PACKAGE / name).read_text()))
        digest.update(name.encode() + b"\0" + ast.dump(tree).encode() + b"\0")
    return digest.hexdigest()[:12]


# Modules that add presses to the engine at run time (``fairkv.anypress.register``): in a process that registered them,
# they decide rows too, so every row it computes carries their fingerprint beside the result code's.
EXTENSIONS: list[str] = []


def extend(names: tuple[str, ...]) -> None:
    """Count ``names`` (package modules) in the fingerprint of every row this process computes from now on."""
    EXTENSIONS.extend(name for name in names if name not in EXTENSIONS)
    code_fingerprint.cache_clear()


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The fingerprint of ``RESULT_CODE``, followed by that of the ``EXTENSIONS`` when a module registered any."""
    base = module_fingerprint(RESULT_CODE)
    return f"{base}+{module_fingerprint(tuple(EXTENSIONS))}" if EXTENSIONS else base
