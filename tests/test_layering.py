"""The package's layers: every import inside outboxkit points down, never up or sideways.

The order, lowest first: the outbox kernel; migrations, relay and consumers (which never import
each other); agent actions and HTTP idempotency; durable workflows; durable agents; operator
tools and the test kit; the web console; the CLI; the root package, which only gathers public
names. A module may import its own layer's package and any lower layer.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.support import REPO

LAYERS: list[set[str]] = [
    {"outbox"},
    {"migrations", "relay", "consumers"},
    {"actions", "idempotency"},
    {"workflows"},
    {"agents"},
    {"ops", "testing"},
    {"console"},
    {"cli"},
]
RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}


def package_folders() -> dict[str, Path]:
    """Each second-level package of outboxkit and the repository folder it installs from."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {
        name.split(".")[1]: REPO / folder
        for name, folder in config["package-dir"].items()
        if name.count(".") == 1
    }


def imported_packages(source: Path) -> set[str]:
    """The outboxkit subpackages a module imports (``"<root>"`` for the root package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "outboxkit":
                found.add(parts[1] if len(parts) > 1 else "<root>")
    return found


def layering_violations() -> list[str]:
    """``module -> package`` for every import that does not point down."""
    violations = []
    for package, folder in package_folders().items():
        for source in sorted(folder.rglob("*.py")):
            for target in imported_packages(source):
                if target == package:
                    continue
                if target == "<root>" or target not in RANK or RANK[target] >= RANK[package]:
                    violations.append(f"{source.relative_to(REPO)} imports outboxkit.{target}")
    return violations


def test_every_package_has_a_layer() -> None:
    assert set(package_folders()) == set(RANK)


def test_imports_point_down() -> None:
    assert layering_violations() == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "upward.py"
    module.write_text("from outboxkit.cli.main import app\nimport outboxkit.relay.runner\n")
    assert imported_packages(module) == {"cli", "relay"}
