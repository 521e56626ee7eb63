"""Classifying handler failures, and messages that carry no payload."""

from __future__ import annotations

from outboxkit.consumers.errors import Category, classify
from outboxkit.outbox import PermanentError, TransientError
from outboxkit.outbox.secrecy import describe_error as safe_message
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError


class Order(BaseModel):
    order_id: int


class _Orig(Exception):
    def __init__(self, code: str) -> None:
        super().__init__("value 'secret-value' violates something")
        self.pgcode = code


def test_classification() -> None:
    try:
        Order.model_validate({"order_id": "x"})
    except ValidationError as error:
        invalid = error
    assert classify(TransientError()) is Category.TRANSIENT
    assert classify(TimeoutError()) is Category.TRANSIENT
    assert classify(OperationalError("SELECT", {}, Exception("gone"))) is Category.TRANSIENT
    assert classify(DBAPIError("SELECT", {}, _Orig("40001"))) is Category.TRANSIENT
    assert classify(DBAPIError("SELECT", {}, _Orig("40P01"))) is Category.TRANSIENT
    lost = DBAPIError("SELECT", {}, Exception("closed"), connection_invalidated=True)
    assert classify(lost) is Category.TRANSIENT
    assert classify(PermanentError()) is Category.PERMANENT
    assert classify(invalid) is Category.PERMANENT
    assert classify(IntegrityError("INSERT", {}, _Orig("23505"))) is Category.UNKNOWN
    assert classify(KeyError("k")) is Category.UNKNOWN


def test_safe_messages_carry_no_payload() -> None:
    try:
        Order.model_validate({"order_id": "secret-value"})
    except ValidationError as error:
        assert "secret" not in safe_message(error)
        assert "order_id" in safe_message(error)
    failed = IntegrityError("INSERT x VALUES (%(v)s)", {"v": "secret-value"}, _Orig("23505"))
    assert "secret" not in safe_message(failed) and "23505" in safe_message(failed)
    try:
        int("secret-value")
    except ValueError as error:
        text = safe_message(error)
    assert "secret" not in text and "ValueError" in text
    assert safe_message(PermanentError("refund above limit\nsecond line")) == "refund above limit"
    assert len(safe_message(TransientError("x" * 1000))) == 300
