"""Jars from Maven Central, fetched once into a cache folder with ``mvn``.

The Kafka broker (``outboxkit.testing.kafka``) and the CloudEvents Java SDK of the interop
tests both come this way: a small pom, ``mvn dependency:copy-dependencies`` into
``<folder>/libs``, and a marker file once every jar is there, so later runs reuse the folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

# "Downloaded from central: https://.../kafka_2.13-4.1.2.jar (6.6 MB at 2.1 MB/s)"
_DOWNLOADED = re.compile(r"Downloaded from \S+: \S+/(?P<file>[^/\s]+) \((?P<size>[^)]*)\)")


class MavenError(RuntimeError):
    """``mvn`` is missing or could not fetch the jars; the message says why."""


def cache_root() -> Path:
    """The folder of outboxkit's caches: ``OUTBOXKIT_CACHE`` or ``~/.cache/outboxkit``."""
    return Path(os.environ.get("OUTBOXKIT_CACHE") or Path.home() / ".cache" / "outboxkit")


def copy_dependencies(folder: Path, pom: str, *, quiet: bool = True) -> Path:
    """Fetch the runtime dependencies of ``pom`` (the pom's text) into ``folder/libs`` once.

    Returns the folder of jars; raises :class:`MavenError` when ``mvn`` is missing or fails.
    """
    libs = folder / "libs"
    marker = folder / ".complete"
    if marker.exists():
        return libs
    if shutil.which("mvn") is None:
        raise MavenError("mvn is not installed: it fetches the jars from Maven Central")
    folder.mkdir(parents=True, exist_ok=True)
    pom_file = folder / "pom.xml"
    pom_file.write_text(pom)
    command = [
        "mvn",
        "-B",
        *(["-q"] if quiet else []),
        "-f",
        str(pom_file),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={libs}",
    ]
    if quiet:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        code, output = result.returncode, result.stdout
    else:
        print(f"fetching jars from Maven Central into {libs} (once)", flush=True)
        code, output = _run_showing_downloads(command)
    if code != 0:
        raise MavenError(f"mvn failed to fetch the jars of {pom_file}:\n{output[-3000:]}")
    marker.touch()
    return libs


def _run_showing_downloads(command: list[str]) -> tuple[int, str]:
    """Run ``command``, printing one line per file downloaded; return its code and output."""
    lines: list[str] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            found = _DOWNLOADED.search(line)
            if found:
                print(f"  {found['file']} {found['size']}", flush=True)
    return process.returncode, "".join(lines[-200:])
