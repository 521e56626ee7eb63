"""Deadlines sized for a loaded machine: every wait in the suite scales its nominal figure here.

A deadline only bounds how long a failing test takes: a condition that holds ends the wait at
once. The nominal figures in the tests are what a quiet 2-core machine needs; ``scaled`` gives
them room for a machine running other suites beside this one (up to 8 at once, or a CPU burner
taking a core). ``OUTBOXKIT_TEST_DEADLINE_SCALE`` (default 3) sets the factor.
"""

from __future__ import annotations

import os

DEADLINE_SCALE = float(os.environ.get("OUTBOXKIT_TEST_DEADLINE_SCALE", "3"))
"""The factor every deadline of the suite is multiplied by."""


def scaled(seconds: float) -> float:
    """``seconds`` (a deadline for a quiet machine) sized for the load the suite runs under."""
    return seconds * DEADLINE_SCALE
