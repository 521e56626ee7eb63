"""Operation keys, canonical parameter hashes and the transition table (no database)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from outboxkit.actions import (
    ActionStore,
    IllegalTransitionError,
    InvalidActionInputError,
    State,
    operation_key,
)
from outboxkit.actions.hashing import canonical_json, params_hash
from outboxkit.actions.states import ALLOWED, check_transition
from pydantic import BaseModel

PARTS = ("acme", "run-1", "issue-refund", "payments.refund", "ch_42", 1)


def test_key_is_stable_and_depends_on_every_part() -> None:
    key = operation_key(*PARTS)
    assert key == operation_key(*PARTS)
    assert key.startswith("op_") and len(key) == 35
    for index in range(len(PARTS)):
        changed = list(PARTS)
        changed[index] = "other" if index < 5 else 2
        assert operation_key(*changed) != key, f"part {index} does not change the key"


def test_key_parts_cannot_be_shifted_between_fields() -> None:
    assert operation_key("a", "b:c", "d", "e", "f", 1) != operation_key(
        "a", "b", "c:d", "e", "f", 1
    )


@pytest.mark.parametrize("index", range(6))
@pytest.mark.parametrize("bad", [None, "", "   "])
def test_empty_or_missing_parts_are_rejected(index: int, bad: object) -> None:
    parts = list(PARTS)
    parts[index] = bad
    with pytest.raises(InvalidActionInputError):
        operation_key(*parts)


@pytest.mark.parametrize("bad", [1.5, True, object(), b"bytes"])
def test_parts_of_other_types_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidActionInputError):
        operation_key("acme", "run-1", "step", "type", bad, 1)


@pytest.mark.parametrize("index", range(5))
def test_only_the_version_may_be_an_int(index: int) -> None:
    parts = list(PARTS)
    parts[index] = 42
    with pytest.raises(InvalidActionInputError, match="must be a str, not int"):
        operation_key(*parts)


def test_an_int_version_is_the_same_version_as_its_text() -> None:
    assert operation_key(*PARTS[:5], 1) == operation_key(*PARTS[:5], "1")
    assert operation_key(*PARTS[:5], 1) != operation_key(*PARTS[:5], 2)
    with pytest.raises(InvalidActionInputError, match="negative"):
        operation_key(*PARTS[:5], -1)


def test_tenant_with_a_slash_is_rejected() -> None:
    with pytest.raises(InvalidActionInputError, match="tenant"):
        operation_key("acme/eu", "run-1", "step", "type", "t", 1)


def test_canonical_json_sorts_keys_and_has_no_whitespace() -> None:
    assert canonical_json({"b": [1, {"d": 2, "c": 3}], "a": "é"}) == (
        '{"a":"é","b":[1,{"c":3,"d":2}]}'
    )


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_rejected(bad: float) -> None:
    with pytest.raises(InvalidActionInputError):
        params_hash({"amount": bad})


def test_non_string_keys_and_non_json_values_are_rejected() -> None:
    with pytest.raises(InvalidActionInputError, match="keys must be str"):
        params_hash({1: "a"})
    with pytest.raises(InvalidActionInputError):
        params_hash({"when": object()})


def test_pydantic_models_hash_like_their_json() -> None:
    class Refund(BaseModel):
        charge_id: str
        amount_cents: int

    assert params_hash(Refund(charge_id="c", amount_cents=5)) == params_hash(
        {"amount_cents": 5, "charge_id": "c"}
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)


@given(st.dictionaries(st.text(max_size=5), json_values, max_size=6))
def test_hash_ignores_key_order(params: dict) -> None:
    reordered = dict(reversed(list(params.items())))
    assert params_hash(reordered) == params_hash(params)


def test_transition_table_is_enforced() -> None:
    check_transition(None, State.PENDING)
    check_transition(State.RUNNING, State.UNKNOWN)
    check_transition(State.UNKNOWN, State.PENDING)
    for terminal in (State.SUCCEEDED, State.FAILED_FINAL):
        assert ALLOWED[terminal] == frozenset()
        with pytest.raises(IllegalTransitionError):
            check_transition(terminal, State.PENDING)
    with pytest.raises(IllegalTransitionError):
        check_transition(State.PENDING, State.SUCCEEDED)  # never succeeded without running
    with pytest.raises(IllegalTransitionError):
        check_transition(State.UNKNOWN, State.RUNNING)  # never re-run before reconciling
    check_transition(State.SUCCEEDED, State.PENDING, new_generation=True)  # expiry
    for live in (State.RUNNING, State.UNKNOWN):
        with pytest.raises(IllegalTransitionError):
            check_transition(live, State.PENDING, new_generation=True)


@pytest.mark.parametrize("bad", [0, 0.0004, -1.0, float("nan"), float("inf"), True, "60"])
def test_durations_are_positive_finite_seconds(bad: object) -> None:
    with pytest.raises(InvalidActionInputError, match="seconds"):
        ActionStore(lease_s=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidActionInputError, match="seconds"):
        ActionStore(ttl_s=bad)  # type: ignore[arg-type]


def test_a_store_keeps_the_durations_it_was_given_in_seconds() -> None:
    store = ActionStore(lease_s=1.5, ttl_s=0.001)
    assert (store.lease_s, store.ttl_s) == (1.5, 0.001)
