"""How the operator tools print: times, ages, integer ranges, the OS user, the table console."""

from __future__ import annotations

import getpass
import os
import sys
from collections.abc import Iterable
from datetime import UTC, datetime

from rich.console import Console


def format_ms(epoch_ms: int | None) -> str:
    """``2026-11-30 09:00:01Z`` for an epoch ms, ``-`` for none."""
    if epoch_ms is None or epoch_ms < 0:
        return "-"
    moment = datetime.fromtimestamp(epoch_ms / 1000, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def parse_keyset(text: str) -> tuple[int, int]:
    """A keyset printed as ``VALUE.ID`` (where a page ends) as two integers; ``ValueError``
    when it is not one."""
    first, _, second = text.strip().partition(".")
    return int(first), int(second)


def format_age(ms: int | float | None) -> str:
    """A short age: ``850ms``, ``42s``, ``7m03s``, ``5h12m``, ``3d04h``."""
    if ms is None:
        return "-"
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86_400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86_400}d{seconds % 86_400 // 3600:02d}h"


def os_user() -> str:
    """The operating-system user running the command (``unknown`` if it has no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER") or "unknown"


def ranges(numbers: Iterable[int]) -> str:
    """``0-15,32,40-41`` for a set of integers."""
    ordered = sorted(set(numbers))
    parts: list[str] = []
    start = previous = None
    for number in ordered:
        if start is None:
            start = previous = number
        elif number == previous + 1:  # type: ignore[operator]
            previous = number
        else:
            parts.append(f"{start}" if start == previous else f"{start}-{previous}")
            start = previous = number
    if start is not None:
        parts.append(f"{start}" if start == previous else f"{start}-{previous}")
    return ",".join(parts) or "-"


def ops_console() -> Console:
    """A rich console for tables: no markup (cells hold operator data), wide when piped."""
    return Console(
        highlight=False,
        markup=False,
        emoji=False,
        width=None if sys.stdout.isatty() else 200,
    )
