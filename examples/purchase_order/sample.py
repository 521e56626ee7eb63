"""The request this example takes from intake to issue: purchase order PO-2026-481."""

from __future__ import annotations

from typing import Any

TENANT = "acme"

PO_2026_481: dict[str, Any] = {
    "po": "PO-2026-481",
    "tenant": TENANT,
    "requester": "maria.keller@acme.example",
    "supplier": "SUP-0042",
    "cost_centre": "CC-4100-IT",
    "currency": "EUR",
    "items": [{"sku": "PAPER-A4-80G", "qty": 40}, {"sku": "TONER-K-XL", "qty": 6}],
}
"""40 boxes of paper and 6 toner cartridges from Nordpaper, charged to IT: 1,519.40 EUR."""
