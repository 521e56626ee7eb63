"""docs/agents.md shows code that the crash tests run: each of its Python blocks is verbatim
in the module those tests start as a process (indentation and blank lines aside)."""

from __future__ import annotations

import re

from tests.support import REPO


def _lines(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def test_every_example_in_the_agents_guide_is_code_the_tests_run() -> None:
    guide = (REPO / "docs" / "agents.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    source = _lines((REPO / "tests" / "support" / "durable_agent.py").read_text())
    assert len(blocks) == 3
    for block in blocks:
        assert _lines(block) in source, block
