"""SIGTERM and SIGINT from the first instant of the process: recorded until a command is ready.

``main()`` calls :func:`hold` before it imports anything heavy, so a stop request that arrives
while the process starts up is recorded instead of killing it (status 143). A long-running
command (``relay``, ``dev kafka``) then installs its own handlers and asks :func:`requested`
whether to stop before it begins: a process stopped at any moment of start-up exits 0. Every
other command gets the default handlers back (:func:`release`), and a signal recorded meanwhile
is delivered again, so it ends as it always would (SIGINT: exit 130, SIGTERM: status 143).

Only the standard library here: this module is imported before anything else.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_recorded: list[int] = []


def _record(signum: int, _frame: FrameType | None) -> None:
    _recorded.append(signum)


def _in_main_thread() -> bool:
    # signal.signal works only there; main() run in a worker thread (tests) leaves signals alone
    return threading.current_thread() is threading.main_thread()


def hold() -> None:
    """Record SIGTERM and SIGINT instead of acting on them, until a command takes over."""
    _recorded.clear()
    if _in_main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, _record)


def requested() -> bool:
    """True when SIGTERM or SIGINT arrived while held: a long-running command should not begin."""
    return bool(_recorded)


def release() -> None:
    """Give SIGTERM and SIGINT their default handlers back and deliver any recorded one again."""
    if not _in_main_thread():
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    recorded, _recorded[:] = list(_recorded), []
    for signum in dict.fromkeys(recorded):
        os.kill(os.getpid(), signum)


def hold_again() -> None:
    """Record stop signals again after a command's own handlers are gone (e.g. when an asyncio
    loop closes, which restores the defaults): the process is stopping already."""
    if _in_main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, _record)
