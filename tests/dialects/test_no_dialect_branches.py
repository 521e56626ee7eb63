"""No module outside ``outbox/dialects/`` branches on a database's name: they ask its Dialect.

The check reads the source (``ast``): a comparison with a dialect's name (``== "sqlite"``,
``!= "postgresql"``, ``in ("postgresql", ...)``), a ``startswith``/``endswith`` of one, a
dict keyed by them or a ``case "sqlite":`` is a branch that belongs in a dialect module.
"""

from __future__ import annotations

import ast
from pathlib import Path

from outboxkit.outbox.dialects import DIALECTS

from tests.support import REPO
from tests.test_layering import package_folders

NAMES = frozenset(DIALECTS)
DIALECT_MODULES = REPO / "outbox" / "dialects"


def _names_in(node: ast.AST | None) -> bool:
    """``node`` is a dialect's name, or a tuple, list or set literal holding one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_in(element) for element in node.elts)
    return False


def _prefixed(node: ast.AST) -> bool:
    """``node`` is a string starting with a dialect's name (``"sqlite"``, ``"postgresql+"``)."""
    if isinstance(node, ast.Tuple):
        return any(_prefixed(element) for element in node.elts)
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and any(node.value.startswith(name) for name in NAMES)
    )


def branches(source: str, filename: str = "<source>") -> list[int]:
    """Line numbers of ``source`` where it branches on a dialect's name."""
    lines = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            found = any(_names_in(side) for side in (node.left, *node.comparators))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            found = node.func.attr in ("startswith", "endswith") and any(
                _prefixed(argument) for argument in node.args
            )
        elif isinstance(node, ast.Dict):
            found = any(_names_in(key) for key in node.keys)
        elif isinstance(node, ast.MatchValue):
            found = _names_in(node.value)
        else:
            found = False
        if found:
            lines.append(node.lineno)
    return lines


def package_modules() -> list[Path]:
    """Every module of the package, the dialect modules left out."""
    modules = [REPO / "outboxkit" / "__init__.py"]
    for folder in package_folders().values():
        modules += folder.rglob("*.py")
    return sorted({m for m in modules if DIALECT_MODULES not in m.parents})


def test_no_module_outside_the_dialects_branches_on_a_dialect_name() -> None:
    found = [
        f"{module.relative_to(REPO)}:{line}"
        for module in package_modules()
        for line in branches(module.read_text(), str(module))
    ]
    assert found == [], "ask dialect_of(...) instead of comparing the database's name"


def test_the_check_reads_every_store_and_migration() -> None:
    modules = {str(module.relative_to(REPO)) for module in package_modules()}
    assert {
        "consumers/inbox.py",
        "workflows/store.py",
        "migrations/versions/0001_outbox.py",
        "cli/relay.py",
    } <= modules
    assert not any(module.startswith("outbox/dialects/") for module in modules)


def test_the_check_sees_each_spelling_of_a_branch() -> None:
    spellings = [
        'if engine.dialect.name == "postgresql": pass',
        'if dialect_name != "sqlite": pass',
        'ok = name in ("postgresql", "mysql")',
        'ok = url.startswith("sqlite")',
        'ok = url.startswith(("mysql", "postgresql+asyncpg"))',
        'CHUNK = {"postgresql": 1000, "sqlite": 300}',
        'match name:\n    case "sqlite":\n        pass',
    ]
    assert [branches(spelling) for spelling in spellings] == [[1]] * 6 + [[2]]


def test_asking_the_dialect_is_no_branch() -> None:
    source = (
        "if dialect_of(session).listen_notify: pass\n"
        'big_id = BigInteger().with_variant(Integer(), "sqlite")\n'
        'now = db_now_ms("postgresql")\n'
    )
    assert branches(source) == []
