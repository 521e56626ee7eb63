"""Run mypy on the ``outboxkit`` package as it installs.

The repository's folders become subpackages of ``outboxkit`` through setuptools' ``package-dir``
(``relay/`` is ``outboxkit.relay``), which mypy cannot follow. This lays the installed shape out
as symlinks under ``build/typecheck/`` and runs mypy there with the ``[tool.mypy]`` settings of
``pyproject.toml``; paths in its report are mapped back to the repository's own files.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"


def lay_out_tree() -> Path:
    """Symlink each top-level subpackage folder into ``build/typecheck/outboxkit``."""
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    shutil.rmtree(TREE, ignore_errors=True)
    package = TREE / "outboxkit"
    package.mkdir(parents=True)
    for item in (ROOT / package_dirs["outboxkit"]).iterdir():
        if item.suffix in (".py", ".typed"):
            (package / item.name).symlink_to(item)
    for name, folder in package_dirs.items():
        parts = name.split(".")
        if len(parts) == 2:  # outboxkit.<sub>; deeper ones live inside their parent's folder
            (package / parts[1]).symlink_to(ROOT / folder, target_is_directory=True)
    return package


def main() -> int:
    """Type-check the package; exit with mypy's status."""
    package = lay_out_tree()
    stdout, stderr, status = api.run(
        ["--config-file", str(ROOT / "pyproject.toml"), str(package.relative_to(ROOT))]
    )
    prefix = str(package.relative_to(ROOT)) + "/"
    for line in stdout.splitlines():
        print(line.removeprefix(prefix) if line.startswith(prefix) else line)
    print(stderr, end="", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
