"""Dollars per GPU-hour of each node class, and budgets: the one place prices are decided.

Where a price comes from, first found wins (`resolve`):

1. an override: ``%config Tg.standard_price = 2.5`` / ``Tg.preemptible_price``, or ``prices=`` in
   Python (`Prices.override`);
2. the platform, where its API gives a price: a cluster's ``pricing`` object
   (``{"currency", "standard_per_gpu_hour", "preemptible_per_gpu_hour"}``, which the local
   emulator serves for its GPU types); the clusters API of together 3.1.1 reports no price,
   so against Together itself:
3. `PUBLISHED`, documented list prices per GPU type, below.

`PUBLISHED` is NOT read from any API: the clusters API gives no cluster rates (Post-Training's
API does, through estimate-cost). The numbers are on-demand prices per GPU-hour, and preemptible
nodes at `PREEMPTIBLE_FRACTION` of on-demand. Check your contract, and override with ``%config``
where it differs. What each number rests on (searched 2026-12-04):

- Preemptible at 50 % of on-demand: Together's announcement "Introducing preemptible compute: the
  same compute, half the price" (together.ai/blog, 2026-09-10): "a flat 50% of the on-demand rate".
- H100_SXM 3.49 and B200_SXM 7.49: the two ends of the on-demand range, "$3.49-$7.49 per hour"
  for H100, H200 and B200 clusters, that Together's pricing page (together.ai/pricing) gave when a
  third party transcribed it on 2026-05-08 (api-evangelist/together-ai, plans/); reserved was
  "$2.99-$7.15". Taking the low end for the H100 and the high end for the B200 is our reading.
- Every other type (H200_SXM inside that range, B300 and GB200 at the B200's rate, L40, RTX 6000):
  UNVERIFIED, not found in any reachable copy of Together's pages; Together's billing docs
  (docs.together.ai/docs/gpu-clusters-billing) defer to together.ai/instant-gpu-clusters "for
  current rates", which could not be reached. Every price from this table says so (`FROM_TABLE`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tgnb.errors import ValidationError

CURRENCY = "USD"
#: Preemptible nodes cost this fraction of the on-demand price (Together: "a flat 50%", see above).
PREEMPTIBLE_FRACTION = 0.5
#: On-demand list price in USD per GPU-hour, by the API's ``gpu_type`` (documented, not from
#: the API: see the module docstring).
PUBLISHED: Mapping[str, float] = {
    "H100_SXM": 3.49,
    "H100_SXM_INF": 3.49,
    "H200_SXM": 3.79,
    "B200_SXM": 7.49,
    "B300_SXM": 7.49,
    "GB200_SXM": 7.49,
    "L40_PCIE": 1.49,
    "RTX_6000_PCI": 1.29,
}
#: Where a price came from, in words (`Prices.source`).
FROM_API, FROM_TABLE, FROM_CONFIG = (
    "the platform's API",
    "tgnb's list-price table (partly unverified: see tgnb.prices)",
    "%config",
)
#: Node names of preemptible nodes start with this; standard nodes start with ``gpu-dp``.
PREEMPTIBLE_PREFIX = "gpu-preemptible-dp"
#: A budget's notice is given at this fraction of it.
NOTICE_FRACTION = 0.8


def node_class(name: str) -> str:
    """``"preemptible"`` for a ``gpu-preemptible-dp...`` node, else ``"standard"``."""
    return "preemptible" if name.startswith(PREEMPTIBLE_PREFIX) else "standard"


def dollars(amount: float | None) -> str:
    """``$1.23`` (``$0.0042`` under a cent); ``-`` for None."""
    if amount is None:
        return "-"
    return f"${amount:.4f}" if 0 < abs(amount) < 0.01 else f"${amount:,.2f}"


def money(amount: float, currency: str = CURRENCY) -> str:
    """`dollars` for USD, else ``1.23 EUR``: how every amount of tgnb is written."""
    return dollars(amount) if currency.upper() == CURRENCY else f"{amount:.2f} {currency}"


@dataclass(frozen=True)
class Prices:
    """USD per GPU-hour of standard and preemptible nodes, and where they came from."""

    standard: float
    preemptible: float
    source: str = FROM_TABLE
    currency: str = CURRENCY

    def of(self, node_class: str) -> float:
        return self.preemptible if node_class == "preemptible" else self.standard

    def cost(self, standard_gpu_hours: float, preemptible_gpu_hours: float) -> float:
        return standard_gpu_hours * self.standard + preemptible_gpu_hours * self.preemptible

    def override(self, standard: float | None = None, preemptible: float | None = None) -> Prices:
        """These prices with `standard` / `preemptible` set (None keeps one), each checked."""
        if standard is None and preemptible is None:
            return self
        return replace(
            self,
            standard=self.standard if standard is None else check_price(standard, "standard"),
            preemptible=(
                self.preemptible if preemptible is None else check_price(preemptible, "preemptible")
            ),
            source=FROM_CONFIG
            if self.source == FROM_CONFIG
            else f"{FROM_CONFIG} and {self.source}",
        )

    def line(self) -> str:
        return (
            f"{dollars(self.standard)}/GPU-h standard, {dollars(self.preemptible)}/GPU-h "
            f"preemptible (from {self.source})"
        )

    def to_api(self) -> dict[str, Any]:
        """The cluster's ``pricing`` object as the emulator serves it."""
        return {
            "currency": self.currency,
            "standard_per_gpu_hour": self.standard,
            "preemptible_per_gpu_hour": self.preemptible,
        }


def published(gpu_type: str) -> Prices | None:
    """The documented list prices of `gpu_type`; None for a type the table lacks."""
    rate = PUBLISHED.get(gpu_type)
    if rate is None:
        return None
    return Prices(rate, round(rate * PREEMPTIBLE_FRACTION, 4), FROM_TABLE)


def from_api(pricing: Any) -> Prices | None:
    """Prices from a cluster's ``pricing`` object; None when absent or not well formed."""
    if not isinstance(pricing, Mapping):
        return None
    try:
        std = check_price(pricing["standard_per_gpu_hour"], "standard")
        pre = check_price(pricing["preemptible_per_gpu_hour"], "preemptible")
    except (KeyError, ValidationError):
        return None
    return Prices(std, pre, FROM_API, str(pricing.get("currency") or CURRENCY))


def resolve(
    gpu_type: str,
    pricing: Any = None,
    standard: float | None = None,
    preemptible: float | None = None,
) -> Prices | None:
    """The prices of a cluster of `gpu_type` (see the module docstring for the order); None when
    neither the API, the table nor both overrides give them."""
    base = from_api(pricing) or published(gpu_type)
    if base is None:
        if standard is None or preemptible is None:
            return None
        base = Prices(0.0, 0.0, FROM_CONFIG)
    return base.override(standard, preemptible)


def check_price(value: Any, what: str) -> float:
    """A price per GPU-hour: a finite number >= 0, else a `ValidationError` naming the fix."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(
            f"the {what} price must be a number of dollars per GPU-hour, got {value!r:.40}: "
            f"e.g. %config Tg.{what}_price = 2.5"
        )
    if value < 0:
        raise ValidationError(
            f"the {what} price must be >= 0 dollars per GPU-hour, got {value}: "
            f"e.g. %config Tg.{what}_price = 2.5"
        )
    return float(value)


def check_budget(value: Any) -> float | None:
    """A budget in dollars: None (no budget) or a finite number > 0, else a `ValidationError`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(
            f"budget_usd must be a number of dollars, got {value!r:.40}: e.g. budget_usd=25"
        )
    if value <= 0:
        raise ValidationError(
            f"budget_usd must be more than 0 dollars, got {value}: e.g. budget_usd=25 "
            "(or None for no budget)"
        )
    return float(value)


__all__ = [
    "CURRENCY",
    "NOTICE_FRACTION",
    "PREEMPTIBLE_FRACTION",
    "PREEMPTIBLE_PREFIX",
    "PUBLISHED",
    "Prices",
    "check_budget",
    "check_price",
    "dollars",
    "from_api",
    "money",
    "node_class",
    "published",
    "resolve",
]
