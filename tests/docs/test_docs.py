"""The docs say what the code does: every ``OUTBOXKIT_*`` name in README.md and docs/ is one a
setting reads (and every setting is documented), every ``outboxkit ...`` line of a shell block
parses with the real command line, and the systemd units in docs/deploy.md pass
``systemd-analyze verify``."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import typer
from outboxkit.cli.main import build_app
from outboxkit.cli.root import cli_variables
from outboxkit.outbox.settings import RESERVED_PREFIXES, known_variables, setting_variables

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)


def blocks(language: str | None = None) -> list[tuple[Path, str, str]]:
    """(file, language, body) of every fenced block, or of one language's."""
    found = []
    for path in DOCS:
        for lang, body in FENCE.findall(path.read_text(encoding="utf-8")):
            if language is None or lang == language:
                found.append((path, lang, body))
    return found


def test_every_documented_variable_is_a_setting_and_every_setting_is_documented() -> None:
    root = typer.main.get_command(build_app())
    known = known_variables(cli_variables(root))
    named: dict[str, set[str]] = {}
    for path in DOCS:
        for name in re.findall(r"OUTBOXKIT_[A-Z0-9_]+", path.read_text(encoding="utf-8")):
            if not name.endswith("_"):  # OUTBOXKIT_KAFKA_* names the family
                named.setdefault(name, set()).add(path.name)
    unknown = {
        name: files
        for name, files in named.items()
        if name not in known and not name.startswith(RESERVED_PREFIXES)
    }
    assert not unknown, f"named in the docs, read by no setting: {unknown}"
    undocumented = sorted(setting_variables() - set(named))
    assert not undocumented, f"settings the docs never name: {undocumented}"


def _synopsis_as_call(words: list[str]) -> list[str]:
    """A usage synopsis as one call: ``[--json]`` given, ``--failed|--retry`` its first."""
    call = []
    for word in words:
        word = word.strip("[]")
        if word.startswith("--") and "|" in word:
            word = word.split("|")[0]
        if word:
            call.append("1" if word == "N" else word)  # N: a number placeholder
    return call


def _outboxkit_lines() -> list[tuple[str, list[str]]]:
    lines = []
    for path, lang, body in blocks():
        if lang not in ("", "bash", "sh", "shell", "console"):
            continue
        joined = body.replace("\\\n", " ")
        for line in joined.splitlines():
            text = line.strip().removeprefix("$ ")
            if not text.startswith("outboxkit "):
                continue
            words = shlex.split(text, comments=True)
            # Stop at a pipe or a shell operator: only outboxkit's own words are checked.
            for stop in ("|", "||", "&&", ";", ">", "2>&1", "&"):
                if stop in words:
                    words = words[: words.index(stop)]
            lines.append((f"{path.name}: {text}", _synopsis_as_call(words[1:])))
    return lines


@pytest.mark.parametrize(("where", "argv"), _outboxkit_lines(), ids=lambda v: str(v)[:60])
def test_every_outboxkit_line_in_the_docs_parses(where: str, argv: list[str]) -> None:
    """The real parser: an option the command does not take, a bad duration or a missing
    argument fails here (``--help``-level checking; nothing runs)."""
    parse_outboxkit_argv(where, argv)


def parse_outboxkit_argv(where: str, argv: list[str]) -> None:
    """Parse ``outboxkit ARGV`` down to its last subcommand with the real command line."""
    root = typer.main.get_command(build_app())
    ctx = root.make_context("outboxkit", list(argv))
    command, rest = root, list(argv)
    while getattr(command, "commands", None) and rest:
        name = next((w for w in rest if not w.startswith("-")), None)
        if name is None:
            break
        rest = rest[rest.index(name) + 1 :]
        command = command.get_command(ctx, name)
        assert command is not None, where
        ctx = command.make_context(name, list(rest), parent=ctx)


def test_the_systemd_units_in_deploy_md_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: scripts/install.sh installs Debian's systemd")
    units = []
    for _, _, body in blocks("ini"):
        first = body.splitlines()[0]
        if not first.startswith("# /etc/systemd/system/"):
            continue
        name = Path(first.removeprefix("# ").split(":")[0]).name.replace("@.", "@1.")
        unit = tmp_path / name
        # ExecStart must exist for verify; the unit's own text is what is checked.
        unit.write_text(body.replace("/opt/outboxkit/bin/outboxkit", shutil.which("true") or ""))
        units.append(unit)
    assert len(units) >= 2
    done = subprocess.run(
        [analyze, "verify", *map(str, units)], capture_output=True, text=True, timeout=120
    )
    complaints = [
        line for line in (done.stdout + done.stderr).splitlines() if str(tmp_path) in line
    ]
    assert done.returncode == 0 and not complaints, done.stdout + done.stderr
