"""fairkv: reproduction of "The Pitfalls of KV Cache Compression" (arXiv 2510.00231).

The core, what a kvpress user installs alone (``pip install .`` in a clone: torch, transformers, kvpress), is exported
here (docs/library.md): the paper's mitigations as kvpress presses, ``WhitelistPress`` (Section 5.1) and ``FairPress``
(Section 5.2, Appendix G's debiasing weight ``lam``), with ``BoundaryPress`` (boundary protection, after arXiv
2605.18053), which take their phrases and spans as text, and keep rates per
span (``keep_rates``, also ``press.keep_rates()`` after a run). They live in ``fairkv.core.presses`` and are imported
when first named, so ``import fairkv`` stays light.

The artifact (``pip install -e '.[artifact]'`` in the clone, what ``make setup`` runs) is layered, each layer importing
only its own and the earlier ones: ``core`` (what a row is made of: ``data``, ``prompts``, ``models``, ``presses``,
``generation``, ``metrics``, ``score_once``, ``one_prompt``), ``runs`` (how rows are computed, kept, fingerprinted and
verified: ``experiment``, ``store``, ``fingerprint``, ``verify``, the press atlas), ``report`` (what rows say:
``analysis``, ``claims``, ``verdicts``, ``figures``, ``notebooks``), ``studies`` (each notebook's grids, claims and
figures), then ``audit`` and ``cli``.
"""

from __future__ import annotations

import importlib
import importlib.util

__version__ = "0.1.0"

# the core's names (fairkv.core.presses)
CORE = (
    "WhitelistPress",
    "FairPress",
    "BoundaryPress",
    "NativePressError",
    "keep_rates",
    "Span",
    "RecordingPress",
    "build_press",
    "Setting",
    "Marks",
)
# what the artifact's command line needs beyond the core (the extra "artifact" in pyproject.toml)
ARTIFACT_MODULES = ("papermill", "matplotlib", "seaborn", "scipy", "rouge_score", "lm_eval", "gguf")


def __getattr__(name: str):
    if name in CORE:
        return getattr(importlib.import_module("fairkv.core.presses"), name)
    raise AttributeError(f"module 'fairkv' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *CORE])


def main(argv=None) -> int:
    """The ``fairkv`` command (``fairkv.cli``): the artifact's, so a core-only install is told which extra it needs."""
    missing = [name for name in ARTIFACT_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(
            f"the fairkv command is the artifact's and needs its extra ({', '.join(missing)} not installed): "
            "pip install -e '.[artifact]' in the clone (the core, fairkv.FairPress and fairkv.WhitelistPress, needs "
            "none of it)"
        )
    from fairkv import cli

    return cli.main(argv)


__all__ = [*CORE, "main"]
