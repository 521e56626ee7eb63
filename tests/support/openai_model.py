"""A scripted model for the OpenAI Agents SDK (its ``Model`` interface), offline.

It makes the given tool calls one per turn, then answers with a text; each request it answers
appends a line to ``log`` so a test counts model calls across processes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Model, ModelResponse, Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


class ScriptedModel(Model):
    """Tool calls from ``calls`` (JSON arguments of ``tool``), one per turn, then a text."""

    def __init__(self, tool: str, calls: list[dict[str, Any]], log: Path | None = None) -> None:
        self.tool = tool
        self.calls = calls
        self.log = log

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        if self.log is not None:
            with self.log.open("a") as out:
                out.write("call\n")
        items = input if isinstance(input, list) else []
        outputs = [
            item.get("output") if isinstance(item, dict) else getattr(item, "output", None)
            for item in items
            if (item.get("type") if isinstance(item, dict) else getattr(item, "type", None))
            == "function_call_output"
        ]
        done = len(outputs)
        if done < len(self.calls):
            call = ResponseFunctionToolCall(
                type="function_call",
                id=f"fc-{done}",
                call_id=f"call-{done}",
                name=self.tool,
                arguments=json.dumps(self.calls[done]),
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = f"done: {len({str(o) for o in outputs})} distinct results"
        message = ResponseOutputMessage(
            id="msg-final",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")
