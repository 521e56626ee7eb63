"""What makes a purchase request valid: its shape, tenant, cost centre, supplier, currency, items.

Plain functions of the request, the buyer's purchasing policy and the supplier's record as the
ERP returned it (read through ``ctx.observe``, so the history shows what was checked against).
Each returns the reasons a request is refused; none means it passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

REQUIRED = ("po", "tenant", "requester", "supplier", "cost_centre", "currency", "items")
MAX_LINES = 50
MAX_QTY = 10_000


@dataclass(frozen=True)
class TenantPolicy:
    """One tenant's purchasing rules: its cost centres, approved suppliers and currencies."""

    cost_centres: frozenset[str]
    suppliers: frozenset[str]
    currencies: frozenset[str] = field(default_factory=lambda: frozenset({"EUR"}))


POLICY: Mapping[str, TenantPolicy] = {
    "acme": TenantPolicy(
        cost_centres=frozenset({"CC-4100-IT", "CC-2200-OPS"}),
        suppliers=frozenset({"SUP-0042", "SUP-0099"}),
    ),
}
"""The example's buyers: tenant ``acme`` and what it may buy, from whom, charged to what."""


def normalise(request: Any) -> tuple[dict[str, Any], list[str]]:
    """The request reduced to the fields a purchase order has, and what is missing or malformed."""
    if not isinstance(request, dict):
        return {}, ["the request is not an object"]
    problems = [f"missing {name}" for name in REQUIRED if not request.get(name)]
    po = {name: request.get(name) for name in REQUIRED}
    items = po["items"]
    if items and not isinstance(items, list):
        problems.append("items is not a list")
        po["items"] = []
    return po, problems


def validate(
    po: Mapping[str, Any],
    *,
    tenant: str,
    supplier: Mapping[str, Any] | None,
    policy: Mapping[str, TenantPolicy] = POLICY,
) -> list[str]:
    """Why ``po`` may not be ordered by ``tenant`` from ``supplier`` (the ERP's record)."""
    problems: list[str] = []
    rules = policy.get(tenant)
    if po.get("tenant") != tenant:
        problems.append(f"tenant {po.get('tenant')!r} is not the workflow's tenant {tenant!r}")
    if rules is None:
        return [*problems, f"tenant {tenant!r} has no purchasing policy"]
    if po.get("cost_centre") not in rules.cost_centres:
        problems.append(f"cost centre {po.get('cost_centre')!r} is not one of {tenant}'s")
    supplier_id = po.get("supplier")
    if supplier_id not in rules.suppliers:
        problems.append(f"supplier {supplier_id!r} is not approved for {tenant}")
    if supplier is None:
        problems.append(f"supplier {supplier_id!r} is unknown to the ERP")
    elif supplier.get("status") != "active":
        problems.append(f"supplier {supplier_id!r} is {supplier.get('status')}")
    currency = po.get("currency")
    if currency not in rules.currencies:
        problems.append(f"currency {currency!r} is not allowed for {tenant}")
    elif supplier is not None and supplier.get("currency") != currency:
        problems.append(f"supplier {supplier_id!r} invoices in {supplier.get('currency')}")
    problems.extend(_item_problems(po.get("items"), supplier))
    return problems


def _item_problems(items: Any, supplier: Mapping[str, Any] | None) -> list[str]:
    if not isinstance(items, list) or not items:
        return ["no items"]
    if len(items) > MAX_LINES:
        return [f"more than {MAX_LINES} lines"]
    problems: list[str] = []
    catalogue = supplier.get("catalogue", {}) if supplier is not None else {}
    seen: set[str] = set()
    for number, item in enumerate(items, 1):
        sku = item.get("sku") if isinstance(item, dict) else None
        qty = item.get("qty") if isinstance(item, dict) else None
        if not isinstance(sku, str) or not sku:
            problems.append(f"line {number}: no sku")
            continue
        if sku in seen:
            problems.append(f"line {number}: {sku} appears twice")
        seen.add(sku)
        if supplier is not None and sku not in catalogue:
            problems.append(f"line {number}: {sku} is not in the supplier's catalogue")
        if isinstance(qty, bool) or not isinstance(qty, int) or not 0 < qty <= MAX_QTY:
            problems.append(f"line {number}: quantity must be 1 to {MAX_QTY}")
    return problems
