"""A compression setting as one small value: the policy, its variant (Section 5), the debiasing weight, the ratio
and, for boundary protection, the share of the budget reserved at each boundary.

``Variant`` is the text a row holds ("base", "whitelist", "fair", "fair+whitelist", "boundary") and says what it means
(``fair``, ``whitelist``, ``boundary``): nothing else reads a variant's letters. ``Setting`` carries the fields every
function of the engine takes together, and ``canonical`` the one setting that computes a requested one: r = 0 is the
uncompressed cache shared by every policy and variant, fair eviction at lam = 0 is the base selection (Appendix G),
lam only matters for fair variants and the share for boundary protection.

Boundary protection is not the paper's: it follows "Protection Is (Nearly) All You Need" (Garcia, arXiv 2605.18053,
2026), which reserves 10% of a globally capped cache at each prompt boundary (``BOUNDARY_SHARE``; what a boundary is
in a system prompt: ``selection.boundary_positions``).
"""

from __future__ import annotations

from dataclasses import dataclass

# Variants of a policy (Section 5): the base press, its whitelist, fair eviction (lam = 1, or a debiasing lam), both.
VARIANTS = ("base", "whitelist", "fair", "fair+whitelist", "boundary")
MITIGATIONS = VARIANTS[:3]  # the base and each mitigation alone: what Appendix K times and the audit reports


# arXiv 2605.18053's reserve: 10% of the budget at each boundary of the prompt (its abstract and headline setting)
BOUNDARY_SHARE = 0.1


class VariantError(ValueError):
    """An unknown variant, a debiasing weight outside [0, 1] or a boundary share outside (0, 1)."""


class Variant(str):
    """One of ``VARIANTS``, as the text rows and cell ids hold it (a ``str``: equal to, and hashed as, its text)."""

    def __new__(cls, text: str) -> Variant:
        if text not in VARIANTS:
            raise VariantError(f"unknown variant {text!r}: use one of {', '.join(VARIANTS)}")
        return super().__new__(cls, text)

    @classmethod
    def of(cls, fair: bool, whitelist: bool) -> Variant:
        """The variant that applies fair eviction and (or) the whitelist."""
        return cls("+".join(name for name, on in (("fair", fair), ("whitelist", whitelist)) if on) or "base")

    @property
    def fair(self) -> bool:
        """Fair eviction (Section 5.2) splits the budget between the spans."""
        return self in ("fair", "fair+whitelist")

    @property
    def whitelist(self) -> bool:
        """The whitelist (Section 5.1) keeps the protected positions first."""
        return self in ("whitelist", "fair+whitelist")

    @property
    def boundary(self) -> bool:
        """Boundary protection (arXiv 2605.18053) keeps a share of the budget at each boundary of the prompt."""
        return self == "boundary"


def check_variant(variant: str) -> Variant:
    return Variant(variant)


def check_lam(lam: float) -> float:
    if not 0.0 <= float(lam) <= 1.0:
        raise VariantError(f"lam = {lam} is outside [0, 1]: 0 is the base policy, 1 fair eviction")
    return float(lam)


def check_share(share: float) -> float:
    if not 0.0 < float(share) < 1.0:
        raise VariantError(f"boundary share {share} is outside (0, 1): the share of the budget kept at each boundary")
    return float(share)


@dataclass(frozen=True)
class Setting:
    """One compression setting; ``policy`` None means uncompressed (r = 0)."""

    policy: str | None
    variant: Variant = Variant("base")
    lam: float = 1.0
    ratio: float = 0.0
    share: float = BOUNDARY_SHARE

    def __post_init__(self):
        object.__setattr__(self, "variant", Variant(self.variant))
        check_lam(self.lam)
        check_share(self.share)


def canonical(policy: str | None, variant: str, lam: float, ratio: float, share: float = BOUNDARY_SHARE) -> Setting:
    """The setting that computes (policy, variant, lam, ratio, share): r = 0 is shared, fair at lam = 0 is the base,
    the share counts for boundary protection alone."""
    variant = Variant(variant)
    if ratio == 0.0:
        return Setting(None, Variant("base"), 1.0, 0.0)
    if variant.fair and lam == 0.0:
        variant = Variant.of(fair=False, whitelist=variant.whitelist)
    return Setting(policy, variant, lam if variant.fair else 1.0, ratio, share if variant.boundary else BOUNDARY_SHARE)
