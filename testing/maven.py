"""Jars from Maven Central, fetched once into a cache folder with ``mvn``.

The Kafka broker (``outboxkit.testing.kafka``) and the CloudEvents Java SDK of the interop
tests both come this way: a small pom, ``mvn dependency:copy-dependencies`` into
``<folder>/libs``, and a marker file once every jar is there, so later runs reuse the folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


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
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise MavenError(f"mvn failed to fetch the jars of {pom_file}:\n{result.stdout[-3000:]}")
    marker.touch()
    return libs
