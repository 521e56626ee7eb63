"""The action events' data models: their JSON schemas in the docs are the models' own."""

from __future__ import annotations

import json

import pytest
from outboxkit.actions import ActionFailed, ActionSucceeded, State
from outboxkit.actions.events import EVENT_MODELS, event_schemas
from pydantic import ValidationError

from tests.support import REPO

SCHEMA_FILE = REPO / "docs" / "agent-action-events.schema.json"


def test_the_documented_schemas_are_the_models_schemas() -> None:
    documented = json.loads(SCHEMA_FILE.read_text())
    assert documented == event_schemas(), (
        "docs/agent-action-events.schema.json is stale; regenerate it with: python -c "
        '"import json; from outboxkit.actions.events import event_schemas; '
        'print(json.dumps(event_schemas(), indent=2))" > docs/agent-action-events.schema.json'
    )
    assert set(documented["$defs"]) >= {model.__name__ for model in EVENT_MODELS.values()}


def test_each_model_takes_only_its_own_target_states() -> None:
    data = {
        "tenant": "acme",
        "key": "op_1",
        "generation": 1,
        "attempt": 1,
        "action_type": "payments.refund",
        "params_hash": "ab" * 32,
        "from": "RUNNING",
        "to": "SUCCEEDED",
        "by": "worker",
        "reason": "completed",
        "needs_attention": False,
        "external_ref": None,
    }
    assert ActionSucceeded.model_validate(data).to is State.SUCCEEDED
    with pytest.raises(ValidationError):
        ActionFailed.model_validate(data)
    with pytest.raises(ValidationError):  # external_ref is always present, null or not
        ActionSucceeded.model_validate({k: v for k, v in data.items() if k != "external_ref"})
