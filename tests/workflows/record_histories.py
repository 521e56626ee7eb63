"""Record histories of the test ``refund`` workflow as replay fixtures.

``python -m tests.workflows.record_histories [DIR]`` runs real instances of
:func:`tests.support.workflows.build` (v1) through the engine on a fresh SQLite file, against
the example payment provider, and writes each instance's history as JSON to ``DIR`` (default
``tests/workflows/histories``). The committed files are what ``test_replay`` replays: record
them again only when a version is added, never to make an edited old version pass.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from outboxkit.migrations.runner import upgrade

from examples.refund_agent.provider import PaymentProvider
from tests.support import workflows as wf

HERE = Path(__file__).parent / "histories"


def dump(workflow_id: str, records: list[Any]) -> dict[str, Any]:
    """The fixture form of one instance's history."""
    return {
        "tenant": wf.TENANT,
        "workflow_id": workflow_id,
        "name": records[0].name,
        "version": records[0].version,
        "history": [record.to_json() for record in records],
    }


async def record(url: str, provider_url: str) -> dict[str, dict[str, Any]]:
    """Run the recorded scenarios on ``url``; their histories by file stem."""
    world = wf.reset_world()
    out: dict[str, dict[str, Any]] = {}
    async with wf.engine_on(url, [wf.build(1)]) as engine:
        # the happy path: approval, refund, notification
        await wf.start(engine, "R-100", wf.refund_input(provider_url, "ch_100"))
        await wf.approve(engine, "R-100")
        await wf.until_state(engine, "R-100", {"complete"})
        # a re-check on resume sends it elsewhere (the limit dropped during the wait)
        await wf.start(engine, "R-101", wf.refund_input(provider_url, "ch_101", 90_000))
        await wf.until_state(engine, "R-101", {"await_approval"})
        world.limit_cents = 50_000
        await wf.approve(engine, "R-101")
        await wf.until_state(engine, "R-101", {"rejected"})
        world.limit_cents = 1_000_000
        # the record changed after the approval: back to await_approval, approved again
        await wf.start(engine, "R-102", wf.refund_input(provider_url, "ch_102"))
        await wf.approve(engine, "R-102")
        await wf.until_state(engine, "R-102", {"execute"})
        world.record_versions["R-102"] = 2
        await wf.until_state(engine, "R-102", {"await_approval"})
        await wf.approve(engine, "R-102")
        await wf.until_state(engine, "R-102", {"complete"})
        for workflow_id, stem in (
            ("R-100", "refund-v1-complete"),
            ("R-101", "refund-v1-recheck-rejected"),
            ("R-102", "refund-v1-approval-stale"),
        ):
            out[stem] = dump(workflow_id, await wf.history(engine, workflow_id))
    wf.reset_world()
    return out


async def record_to(directory: Path) -> list[Path]:
    """Record the scenarios on a throwaway SQLite file and write them to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp, PaymentProvider() as provider:
        url = f"sqlite:///{Path(tmp) / 'histories.db'}"
        upgrade(url)
        for stem, fixture in (await record(url, provider.url)).items():
            path = directory / f"{stem}.json"
            path.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
            written.append(path)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    for path in asyncio.run(record_to(target)):
        print(f"wrote {path}")
