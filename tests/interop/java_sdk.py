"""The official CloudEvents Java SDK, built once and run as a subprocess by the interop tests.

``java/pom.xml`` names the SDK's jars (fetched with ``mvn`` by the same code that fetches the
Kafka broker, ``outboxkit.testing.maven``); ``javac`` compiles ``java/*.java`` against them into
``<cache>/interop-<hash of the pom and sources>/``. A later run with the same sources reuses
that folder, so only the first run pays for the build.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outboxkit.testing.maven import cache_root, copy_dependencies

JAVA_DIR = Path(__file__).parent / "java"
MAIN_CLASS = "CloudEventsInterop"
# A short-lived JVM: skip the optimising compiler and the parallel collector.
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m")


class InteropBuildError(RuntimeError):
    """The Java side could not be built; the message says why."""


def build_folder() -> Path:
    """The cache folder of this version of the Java sources and pom."""
    digest = hashlib.sha256()
    for path in sorted([JAVA_DIR / "pom.xml", *JAVA_DIR.glob("*.java")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return cache_root() / f"interop-{digest.hexdigest()[:16]}"


def build() -> str:
    """Fetch the jars and compile the sources unless already done; return the classpath."""
    folder = build_folder()
    classes = folder / "classes"
    classpath = f"{classes}{os.pathsep}{folder / 'libs'}/*"
    if (folder / ".built").exists():
        return classpath
    if shutil.which("javac") is None:
        raise InteropBuildError(
            "javac is not installed: the interop tests need a JDK 17 "
            "(scripts/install.sh installs openjdk-17-jdk-headless)"
        )
    libs = copy_dependencies(folder, (JAVA_DIR / "pom.xml").read_text())
    # Compile into a folder of our own and rename it, so a concurrent build never sees half.
    scratch = folder / f"classes-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    sources = [str(path) for path in sorted(JAVA_DIR.glob("*.java"))]
    result = subprocess.run(
        ["javac", "-d", str(scratch), "-cp", f"{libs}/*", *sources],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise InteropBuildError(f"javac failed:\n{result.stderr[-3000:]}")
    try:
        scratch.rename(classes)
    except OSError:  # another build got there first
        shutil.rmtree(scratch, ignore_errors=True)
    (folder / ".built").touch()
    return classpath


@dataclass(frozen=True)
class JavaSDK:
    """Runs the built ``CloudEventsInterop`` program against a broker."""

    classpath: str

    def produce(self, bootstrap: str, topic: str, events: list[dict[str, Any]]) -> None:
        """Publish ``events`` (see :func:`java_event`) with the SDK's ``CloudEventSerializer``."""
        lines = "".join(json.dumps(event) + "\n" for event in events)
        output = self._run(["produce", bootstrap, topic], lines, timeout_s=120)
        assert json.loads(output) == {"sent": len(events)}, output

    def consume(
        self, bootstrap: str, topic: str, count: int, timeout_s: int = 60
    ) -> list[dict[str, Any]]:
        """Read ``topic`` from the beginning with the SDK's ``CloudEventDeserializer`` until
        ``count`` records or the deadline; one dict per record, in offset order."""
        output = self._run(
            ["consume", bootstrap, topic, str(count), str(timeout_s)], "", timeout_s=timeout_s + 60
        )
        return [json.loads(line) for line in output.splitlines() if line.strip()]

    def _run(self, arguments: list[str], stdin: str, timeout_s: int) -> str:
        result = subprocess.run(
            ["java", *JVM_OPTIONS, "-cp", self.classpath, MAIN_CLASS, *arguments],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if result.returncode != 0:
            raise AssertionError(f"java {arguments[0]} failed:\n{result.stderr[-3000:]}")
        return result.stdout


def java_event(
    mode: str,
    attributes: dict[str, str],
    extensions: dict[str, tuple[str, str]] | None = None,
    data: bytes | None = None,
    key: bytes | None = None,
) -> dict[str, Any]:
    """One line of the Java producer's input: ``extensions`` maps a name to (CloudEvents type,
    canonical string)."""
    return {
        "mode": mode,
        "key": None if key is None else base64.b64encode(key).decode(),
        "attributes": attributes,
        "extensions": {
            name: {"type": kind, "value": value}
            for name, (kind, value) in (extensions or {}).items()
        },
        "data_base64": None if data is None else base64.b64encode(data).decode(),
    }
