"""The one rule for secret fields and the one safe describer of exceptions (pure logic)."""

from __future__ import annotations

import pytest
from outboxkit.outbox.errors import InvalidEventError, PermanentError
from outboxkit.outbox.secrecy import (
    REDACTED,
    describe_error,
    is_secret_key,
    message_is_safe,
    redact,
)
from outboxkit.workflows.errors import PolicyError


@pytest.mark.parametrize(
    "name",
    [
        "apiKey", "api-key", "API_KEY", "api.key", "private_key", "privateKey", "PRIVATE-KEY",
        "passphrase", "ssh_passphrase", "password", "db_passwd", "token", "refreshToken",
        "client_secret", "sessionId", "session_id", "SESSION", "bearer", "Authorization",
        "cookie", "Set-Cookie", "signature", "authsig", "card_number", "cardNumber", "PAN",
        "cvv", "credentials", "aws_access_key_id",
    ],
)  # fmt: skip
def test_every_spelling_of_a_secret_name_is_secret(name: str) -> None:
    assert is_secret_key(name)


@pytest.mark.parametrize("name", ["amount", "company", "expand", "panel", "item", "owner"])
def test_ordinary_names_are_kept(name: str) -> None:
    assert not is_secret_key(name)


def test_redact_hides_nested_secrets_and_the_definitions_keys() -> None:
    value = {
        "a": [{"Private-Key": "K1", "keep": 1}],
        "passphrase": "P1",
        "Requester": {"n": "x"},
        "x": ("y", {"apiKey": "A1"}),
    }
    assert redact(value, ["requester"]) == {
        "a": [{"Private-Key": REDACTED, "keep": 1}],
        "passphrase": REDACTED,
        "Requester": REDACTED,
        "x": ["y", {"apiKey": REDACTED}],
    }


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def test_an_unknown_exceptions_message_is_withheld_with_its_class_and_place() -> None:
    text = describe_error(_raised(ValueError("card ERR-SECRET-8888 was declined")))
    assert "8888" not in text
    assert text.startswith("ValueError raised at test_secrecy.py:") and "withheld" in text


def test_messages_written_on_purpose_are_kept_first_line_only() -> None:
    assert describe_error(PermanentError("over the limit\nmore")) == "over the limit"
    assert describe_error(PolicyError("refused")) == "refused"
    assert describe_error(InvalidEventError("no type")) == "no type"
    assert describe_error(PermanentError()) == "PermanentError"
    assert len(describe_error(PermanentError("x" * 1000))) == 300


def test_the_known_safe_types_are_these_and_no_others() -> None:
    from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
    from outboxkit.actions import errors as action_errors
    from outboxkit.consumers.errors import ConsumerError, HandlerTimeoutError, NoHandlerError
    from outboxkit.idempotency.context import IdempotencyError
    from outboxkit.idempotency.keys import InvalidKeyError
    from outboxkit.outbox.errors import OutboxError, OutcomeUnknownError, TransientError
    from outboxkit.relay.logical import LeasesLost, SlotRefused
    from outboxkit.relay.publisher import KafkaUnavailable
    from outboxkit.relay.replication import StreamLost
    from outboxkit.workflows.errors import AuthorizationError, ConflictError

    safe = [
        OutboxError("x"), InvalidEventError("x"), TransientError("x"), PermanentError("x"),
        OutcomeUnknownError("x"), ConflictError("x"), AuthorizationError("x"), PolicyError("x"),
        NoHandlerError("x"), HandlerTimeoutError("x"), ConsumerError("x"),
        action_errors.ActionError("x"), IdempotencyError("x"), InvalidKeyError("x"),
        KafkaUnavailable("x"), StreamLost("x"), SlotRefused("x"), LeasesLost("x"),
        MessageSizeTooLargeError("x"), KafkaTimeoutError("x"),
    ]  # fmt: skip
    assert [type(e).__name__ for e in safe if not message_is_safe(e)] == []
    unsafe = [
        ValueError("x"), RuntimeError("x"), KeyError("x"), TypeError("x"), OSError("x"),
        ConnectionError("x"), TimeoutError("x"), UnicodeDecodeError("utf-8", b"x", 0, 1, "x"),
        KeyboardInterrupt("x"),
    ]  # fmt: skip
    assert [type(e).__name__ for e in unsafe if message_is_safe(e)] == []


def test_a_kafka_errors_message_is_kept_and_its_class_not_repeated() -> None:
    from aiokafka.errors import MessageSizeTooLargeError

    text = describe_error(MessageSizeTooLargeError("The message is 9 bytes"), with_class=True)
    assert text == "[Error 10] MessageSizeTooLargeError: The message is 9 bytes"
    assert describe_error(PolicyError("refused"), with_class=True) == "PolicyError: refused"


def test_dead_letter_headers_named_as_secrets_are_redacted_for_display() -> None:
    from outboxkit.ops.dlq.rendering import shown_header

    assert shown_header("ce_authtoken", b"T0K") == REDACTED
    assert shown_header("ce_pin", b"1234") == REDACTED  # a short name, once ce_ is dropped
    assert shown_header("Authorization", b"Bearer x") == REDACTED
    assert shown_header("ce_type", b"order.placed") == "order.placed"
    assert shown_header("ce_apitoken", None) is None
