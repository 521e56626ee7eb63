"""Every fenced block of README.md and docs/*.md runs here, or is marked as illustrative with
its reason (issue 23, item 6); a new block that is neither fails this module.

- ``python``: the blocks of one document run in order in one namespace (a notebook), top-level
  ``await`` allowed, after that document's prelude (:data:`PRELUDES`: the names a block takes
  from its surroundings, such as the host's ``Order`` model) against a migrated SQLite file;
  :data:`SUBSTITUTIONS` point a placeholder host (``kafka:9092``) at the test broker, and
  :data:`EPILOGUES` check the outcome (the row the README's ``Outbox.add`` wrote).
- shell blocks (``bash``, ``sh``, ``console``, none): every command is one this module
  checks: an ``outboxkit`` line (parsed by the real command line: tests/docs/test_docs.py), an
  ``OUTBOXKIT_*`` assignment (loaded by the real settings, unknown names refused), a
  ``pip install`` of extras the package declares; console output lines are not commands.
- ``toml``: loaded as the ``--config`` file by the real settings (an unknown key fails);
  ``ini``: systemd units, verified by ``systemd-analyze`` (tests/docs/test_docs.py);
  ``yaml``: a Kubernetes manifest whose container ``args`` parse as an outboxkit command line.
- ``<!-- illustrative: REASON -->`` on the line before a block: not run, for REASON;
  ``<!-- example: PATH -->``: run by the test at PATH.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import types
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from outboxkit.cli.main import build_app
from outboxkit.cli.root import cli_variables
from outboxkit.migrations.runner import upgrade
from outboxkit.outbox.config_file import use_config_file
from outboxkit.outbox.kafka_settings import KafkaSettings
from outboxkit.outbox.settings import Settings, refuse_unknown_environment
from pydantic import SecretStr
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from tests.docs.test_docs import DOCS, ROOT, parse_outboxkit_argv
from tests.support.ops import cli
from tests.support.waits import scaled

FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)
MARKER = re.compile(r"<!--\s*(illustrative|example):\s*(.*?)\s*-->\s*$")
SHELL = ("", "bash", "sh", "shell", "console")
ASSIGNMENT = re.compile(r"(OUTBOXKIT_[A-Z0-9_]+)=(.*)")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text, and its marker if any."""

    path: Path
    line: int
    language: str
    body: str
    marker: tuple[str, str] | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def all_blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").splitlines()
            marked = MARKER.search(before[-1]) if before else None
            found.append(
                Block(
                    path,
                    text.count("\n", 0, match.start()) + 1,
                    match.group(1),
                    match.group(2),
                    (marked.group(1), marked.group(2)) if marked else None,
                )
            )
    return found


BLOCKS = all_blocks()


def _run_here(block: Block) -> bool:
    return block.marker is None


# -- what is not run, and why ------------------------------------------------------------


def test_every_block_is_run_or_marked_with_a_reason() -> None:
    problems = []
    for block in BLOCKS:
        if block.marker is not None:
            kind, value = block.marker
            if not value:
                problems.append(f"{block.where}: a {kind} marker needs a reason or a path")
            elif kind == "example" and not (ROOT / value).is_file():
                problems.append(f"{block.where}: example test {value} does not exist")
            continue
        if block.language in SHELL:
            problems += [f"{block.where}: {line!r}" for line in unchecked_commands(block)]
        elif block.language == "ini" and not block.body.startswith("# /etc/systemd/system/"):
            problems.append(f"{block.where}: an ini block that is no systemd unit")
        elif block.language not in ("python", "toml", "ini", "yaml"):
            problems.append(f"{block.where}: no runner for ```{block.language}")
    assert not problems, (
        "blocks neither run nor marked (<!-- illustrative: REASON --> before the block): "
        + "; ".join(problems)
    )


# -- shell blocks ------------------------------------------------------------------------


def _commands(block: Block) -> list[list[str]]:
    """The commands of a shell block, as words: continuation lines joined, comments dropped,
    console output (lines without ``$ ``) skipped, ``a && b`` and ``a || b`` split."""
    lines = block.body.replace("\\\n", " ").splitlines()
    if block.language == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    commands = []
    for line in lines:
        part: list[str] = []
        for word in [*shlex.split(line, comments=True), "&&"]:
            if word in ("&&", "||", ";"):
                if part:
                    commands.append(part)
                part = []
            else:
                part.append(word)
    return commands


def _assignment(words: list[str]) -> tuple[str, str] | None:
    """``(name, value)`` of ``OUTBOXKIT_NAME=value`` (or ``export ...``), else ``None``."""
    words = words[1:] if words[:1] == ["export"] else words
    match = ASSIGNMENT.fullmatch(words[0]) if len(words) == 1 else None
    return (match.group(1), match.group(2)) if match else None


def _extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return set(project["project"]["optional-dependencies"])


def unchecked_commands(block: Block) -> list[str]:
    """The commands of ``block`` this module does not check (each needs the block marked)."""
    extras = _extras()
    unchecked = []
    for words in _commands(block):
        if words[0] == "outboxkit" or _assignment(words):
            continue  # parsed (tests/docs/test_docs.py) / loaded (below)
        if words[:2] == ["pip", "install"] and all(
            _is_outboxkit_with(extra, extras) for extra in words[2:]
        ):
            continue
        if words in (["source", ".venv/bin/activate"], ["echo", "$?"]):
            continue  # the shell's own, with no outboxkit part
        unchecked.append(shlex.join(words))
    return unchecked


def _is_outboxkit_with(requirement: str, extras: set[str]) -> bool:
    match = re.fullmatch(r"outboxkit(?:\[([\w,-]+)\])?", requirement)
    return match is not None and set(filter(None, (match.group(1) or "").split(","))) <= extras


# Commands that run on an empty migrated SQLite database in well under a second, in-process.
RUN_ON_SQLITE = {
    ("migrate",),
    ("outbox", "list"),
    ("outbox", "requeue"),
    ("actions", "list"),
    ("actions", "sweep"),
    ("actions", "cleanup"),
    ("workflows", "list"),
}
# postgresql://..., [--json], KEY, N, and a row id of a console sample (requeue 42)
PLACEHOLDER = re.compile(r"\.\.\.|^\[|^(KEY|N|T|NAME|TEXT|JSON|REF|\d+)$")
RUNNABLE = sorted(
    {
        (block.where, tuple(words))
        for block in BLOCKS
        if block.language in SHELL and _run_here(block)
        for words in _commands(block)
        if words[0] == "outboxkit"
        and any(tuple(words[1 : 1 + len(c)]) == c for c in RUN_ON_SQLITE)
        and not any(PLACEHOLDER.search(word) for word in words)
    }
)


async def test_the_database_commands_of_the_shell_blocks_run(
    migrated_sqlite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outboxkit lines that need only the database, run as written against a copy of a
    migrated SQLite file (``OUTBOXKIT_DB_URL``): exit 0."""
    assert len(RUNNABLE) >= 5, RUNNABLE
    db = tmp_path / "commands.db"
    shutil.copy(migrated_sqlite, db)
    monkeypatch.setenv("OUTBOXKIT_DB_URL", f"sqlite:///{db}")
    for where, words in RUNNABLE:
        done = await cli(*words[1:])
        assert done.code == 0, (where, words, done.out, done.err)


def test_the_pip_extras_the_docs_install_exist() -> None:
    extras = _extras()
    named = {
        requirement
        for block in BLOCKS
        if block.language in SHELL
        for words in _commands(block)
        if words[:2] == ["pip", "install"]
        for requirement in words[2:]
    }
    assert named and all(_is_outboxkit_with(r, extras) for r in named), (named, extras)


ENV_BLOCKS = [
    block
    for block in BLOCKS
    if block.language in SHELL
    and _run_here(block)
    and any(_assignment(words) for words in _commands(block))
]


@pytest.mark.parametrize("block", ENV_BLOCKS, ids=lambda b: b.where)
def test_the_settings_blocks_load(block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ``OUTBOXKIT_*=...`` block, as the environment of a process: no unknown name, and
    every value reaches its setting."""
    for name in [n for n in os.environ if n.startswith("OUTBOXKIT_")]:
        monkeypatch.delenv(name)
    given = dict(filter(None, map(_assignment, _commands(block))))
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    root = typer.main.get_command(build_app())
    refuse_unknown_environment(cli_variables(root))
    loaded = {
        **{f"OUTBOXKIT_{k.upper()}": v for k, v in Settings().model_dump().items()},
        **{f"OUTBOXKIT_KAFKA_{k.upper()}": v for k, v in KafkaSettings().model_dump().items()},
    }
    for name, value in given.items():
        found = loaded[name]
        found = found.get_secret_value() if isinstance(found, SecretStr) else found
        assert str(found) == value, (block.where, name)


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.language == "toml" and _run_here(b)], ids=lambda b: b.where
)
def test_the_config_file_blocks_load(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("OUTBOXKIT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SASL_PASSWORD", "from-the-secret-store")
    path = tmp_path / "outboxkit.toml"
    path.write_text(block.body, encoding="utf-8")
    document = tomllib.loads(block.body)
    use_config_file(path)
    try:
        kafka, settings = KafkaSettings(), Settings()
    finally:
        use_config_file(None)
    for key, value in document.get("kafka", {}).items():
        assert getattr(kafka, key) == value, (block.where, key)
    if "database" in document:
        assert settings.db_url == document["database"]["url"]


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.language == "yaml" and _run_here(b)], ids=lambda b: b.where
)
def test_the_kubernetes_manifests_run_outboxkit_commands_that_parse(block: Block) -> None:
    manifest = yaml.safe_load(block.body)
    containers = manifest["spec"]["template"]["spec"]["containers"]
    args = [container["args"] for container in containers if "args" in container]
    assert args, block.where
    for argv in args:
        assert argv[0] == "outboxkit", argv
        parse_outboxkit_argv(block.where, [str(word) for word in argv[1:]])


# -- python blocks -----------------------------------------------------------------------

_SQLITE = """
import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session
from outboxkit.outbox.db import make_async_engine, make_engine

engine = _db = make_engine(DB_URL)  # _db: for the epilogue, whatever a block calls engine
sessions = async_sessionmaker(make_async_engine(DB_URL), expire_on_commit=False)
db_url = url = DB_URL
"""
_PROVIDER = """
class Refund(BaseModel):
    id: str
    amount_cents: int


refunds = []


class _Provider:  # a payment provider: one refund per idempotency key
    async def refund(self, charge_id, amount_cents, key=None, headers=None):
        refunds.append(key or headers["Idempotency-Key"])
        return {"id": f"re_{len(refunds)}", "amount_cents": amount_cents}


provider = _Provider()
lookup_refund = lookup_refund_by_key = None
tenant, run_id, charge_id, amount = "acme", "run-1", "ch_42", 1999
"""
PRELUDES: dict[str, str] = {
    "README.md": _SQLITE
    + _PROVIDER
    + """
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):  # the host's own model
    __tablename__ = "readme_orders"
    id: Mapped[int] = mapped_column(primary_key=True)


Base.metadata.create_all(engine)
order = Order()


class OrderPlaced(BaseModel):
    order_id: int


class ItemViewed(BaseModel):
    item_id: str


class _Psp(_Provider):
    async def refund(self, charge_id, amount_cents, key):
        return Refund.model_validate(await super().refund(charge_id, amount_cents, key=key))


psp = _Psp()


class _Agent:  # stands for pydantic-ai and friends: it calls the tool once
    async def run(self, ticket):
        return await refund("ch_42", 1999)


agent, ticket = _Agent(), "refund ch_42"
""",
    "agent-actions.md": _SQLITE
    + _PROVIDER
    + """
from outboxkit.actions import ActionResult
""",
    "consumers.md": _SQLITE
    + """
from asyncio import Event
from sqlalchemy import insert

invoices = sa.table("invoices", sa.column("order_id"))
engine = make_async_engine(DB_URL)  # a consumer's engine is async
shutdown_requested = Event()
shutdown_requested.set()  # the block's runtime starts, joins, and stops at once


async def billing_service_ready():
    return True


class OrderPaid(BaseModel):
    order_id: int
""",
    "deploy.md": """
from sqlalchemy import MetaData


class _Context:  # alembic's context in a host's env.py: what configure() was given
    configured = {}

    def configure(self, **kwargs):
        self.configured.update(kwargs)


context, connection, target_metadata = _Context(), object(), MetaData()
""",
    "http-idempotency.md": _SQLITE
    + _PROVIDER
    + """
from fastapi import FastAPI
from starlette.responses import JSONResponse

orders = sa.Table(  # the host's table, as the block's handler writes it
    "orders",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("sku", sa.String(20)),
)
orders.metadata.create_all(_db)
ticket_refunds = sa.table("ticket_refunds", sa.column("refund_id"))
api = FastAPI()


class OrderIn(BaseModel):
    sku: str


class OrderOut(BaseModel):
    id: int


class QuoteIn(BaseModel):
    sku: str


class QuoteOut(BaseModel):
    cents: int
""",
    "kafka-security.md": _SQLITE
    + """
from cloudevents.core.v1.event import CloudEvent
from outboxkit import ConsumerApp

app = ConsumerApp(name="security-doc")


@app.handler("order.placed", topic="orders")
async def placed(event: CloudEvent) -> None: ...
""",
    "relay.md": "",
    "workflows.md": _SQLITE
    + """
from outboxkit import Outbox
from outboxkit.workflows import Complete, HmacVerifier, Workflow, WorkflowEngine


def price_still_valid(ctx):
    return None


def preview(ctx):
    return {"sku": "A-1", "amount_cents": 1000}


class _Erp:
    async def issue(self, key, params):
        return {"id": "erp-1"}


erp, key, request = _Erp(), b"k" * 32, {"sku": "A-1"}
orders_v1 = Workflow("purchase_order", version=1, initial="intake")  # the version before


@orders_v1.state("intake")
async def intake_v1(ctx):
    return Complete()
""",
}
# Placeholders of a block, pointed at what this test has (text replaced before running).
SUBSTITUTIONS: dict[str, dict[str, str]] = {
    # the runtime joins the shared test broker: a group and topics of its own
    "consumers.md": {'"kafka:9092"': "BOOTSTRAP", '"billing"': "UNIQUE", '"orders"': "UNIQUE"},
    "workflows.md": {"[orders_v1, orders_v2]": "[orders_v1, orders]"},  # orders: version 2
    "http-idempotency.md": {"orders.insert().values(...)": "orders.insert().values(sku='A-1')"},
    "relay.md": {'"postgresql+asyncpg://..."': "DB_URL", '"kafka:9092"': "BOOTSTRAP"},
}
# What a document's blocks must have done, checked after they ran.
EPILOGUES: dict[str, str] = {
    "README.md": """
from outboxkit.outbox.tables import outbox_events
with _db.connect() as c:
    row = c.execute(
        sa.select(outbox_events.c.kafka_key, outbox_events.c.payload).where(
            outbox_events.c.type == "shop.order.placed"
        )
    ).one()
    order_id = c.scalar(sa.select(Order.id))  # the order the block added (expired on commit)
assert order_id is not None and row.kafka_key == str(order_id).encode(), row
assert f'"order_id":{order_id}'.encode() in row.payload.replace(b" ", b""), row.payload
assert len(refunds) == 1, refunds  # the step ran once
""",
    "agent-actions.md": """
assert made.id == "re_1" and outcome.executed and len(refunds) == 2, (made, outcome, refunds)
""",
    "deploy.md": """
assert context.configured["include_object"] is include_object
assert include_object(None, "outbox_events", "table", False, None) is False
""",
    "http-idempotency.md": """
import httpx
from outboxkit.outbox.tables import outbox_events

headers = {"Idempotency-Key": "8e03978e-40d5-43e8-bc93-6894a57f9324", "X-Tenant": "acme"}
async with httpx.AsyncClient(
    transport=httpx.ASGITransport(app=app), base_url="http://shop"
) as client:
    first = await client.post("/orders", headers=headers, json={"sku": "A-1"})
    again = await client.post("/orders", headers=headers, json={"sku": "A-1"})
assert first.status_code == again.status_code == 201, (first.text, again.text)
assert again.content == first.content and again.headers["idempotent-replay"] == "true"
with _db.connect() as c:  # the order and its event, once
    assert c.scalar(sa.select(sa.func.count()).select_from(orders)) == 1
    assert c.scalar(sa.select(sa.func.count()).select_from(outbox_events)) == 1
""",
    "workflows.md": """
from outboxkit.workflows.tables import workflow_instances
with _db.connect() as c:
    assert c.scalar(sa.select(sa.func.count()).select_from(workflow_instances)) == 1
""",
}
NEEDS_BROKER = frozenset({"consumers.md", "relay.md"})


def _python_documents() -> list[Any]:
    """One parameter per document with Python blocks to run; ``integration`` where they
    start a relay or a consumer (the fixture is taken at run time, so the conftest cannot
    see it)."""
    names = sorted({b.path.name for b in BLOCKS if b.language == "python" and _run_here(b)})
    return [
        pytest.param(name, marks=[pytest.mark.integration] if name in NEEDS_BROKER else [])
        for name in names
    ]


@pytest.fixture(scope="module")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated SQLite file; each document runs on a copy of it."""
    path = tmp_path_factory.mktemp("docs") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


async def _run(code: str, namespace: dict[str, Any], where: str) -> None:
    compiled = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, namespace)  # the docs' own code, on purpose
    if inspect.iscoroutine(result):
        await result


@pytest.mark.parametrize("document", _python_documents())
async def test_the_python_blocks_of_a_document_run(
    document: str, migrated_sqlite: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    assert document in PRELUDES, f"{document}: say in PRELUDES what its blocks take as given"
    db = tmp_path / "doc.db"
    shutil.copy(migrated_sqlite, db)
    # a module of its own: SQLAlchemy and pydantic resolve annotations through sys.modules
    module = types.ModuleType(f"docs_{document.split('.')[0].replace('-', '_')}")
    sys.modules[module.__name__] = module
    namespace: dict[str, Any] = module.__dict__
    namespace["DB_URL"] = f"sqlite:///{db}"
    if document in NEEDS_BROKER:
        namespace["BOOTSTRAP"] = request.getfixturevalue("kafka_bootstrap")
        namespace["UNIQUE"] = f"docs-{uuid.uuid4().hex[:12]}"
    await _run(PRELUDES[document], namespace, f"<prelude of {document}>")
    try:
        for block in BLOCKS:
            if block.path.name != document or block.language != "python" or not _run_here(block):
                continue
            code = block.body
            for placeholder, name in SUBSTITUTIONS.get(document, {}).items():
                code = code.replace(placeholder, name)
            await _run(code, namespace, block.where)
        await _run(EPILOGUES.get(document, ""), namespace, f"<epilogue of {document}>")
    finally:
        for value in list(namespace.values()):
            if isinstance(value, async_sessionmaker):
                value = value.kw.get("bind")
            if isinstance(value, AsyncEngine):
                await value.dispose()
            elif isinstance(value, Engine):
                value.dispose()
        sys.modules.pop(module.__name__, None)


def test_the_fixtures_of_testing_md_pass_as_a_pytest_session(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """docs/testing.md's first block (fixtures on the test kit's helpers, and a test using
    them) as a user's own test file, under pytest-asyncio's default (strict) mode."""
    (block,) = [
        b
        for b in BLOCKS
        if b.path.name == "testing.md" and b.marker == ("example", "tests/docs/test_code_blocks.py")
    ]
    (tmp_path / "test_fixtures_doc.py").write_text(block.body, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "OUTBOXKIT_KAFKA_BOOTSTRAP": kafka_bootstrap},
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr
