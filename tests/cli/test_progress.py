"""The progress display of long work (cli/progress.py): plain lines when stderr is not a
terminal, a rich bar when it is, nothing when disabled or when the work is quick."""

from __future__ import annotations

import io

from outboxkit.cli.progress import ProgressReport


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal() -> None:
    stream = io.StringIO()
    report = ProgressReport("relay --drain: published", stream=stream, every_s=0.0)
    for done in (0, 500, 1000):
        report.update(done, 1000)
    report.close()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "relay --drain: published: 0 of 1000"
    assert lines[-1] == "relay --drain: published: 1000 of 1000"
    assert "\x1b" not in stream.getvalue()  # no terminal codes in a log file


def test_quick_work_prints_nothing() -> None:
    stream = io.StringIO()
    report = ProgressReport("x", stream=stream, every_s=3600.0)
    report.update(3, 3)
    report.close()
    assert stream.getvalue() == ""


def test_a_bar_on_a_terminal() -> None:
    stream = _Terminal()
    report = ProgressReport("replaying", stream=stream)
    report.update(10, 100)
    report.update(100, 100)
    report.close()
    shown = stream.getvalue()
    assert "replaying" in shown and "100/100" in shown


def test_disabled_shows_nothing() -> None:
    stream = _Terminal()
    report = ProgressReport("x", stream=stream, enabled=False, every_s=0.0)
    report.update(1, 2)
    report.close()
    assert stream.getvalue() == ""
