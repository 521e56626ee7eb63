"""Dead letters: topics, failure groups (cause, type, original topic, hour), one letter, and
replay of a letter, a group or a filter: a dry run counts first, the replay goes through
:class:`outboxkit.ops.dlq.replay.Replayer` and its ledger exactly as ``outboxkit dlq replay``.
Discard (and un-discard) of a letter, a group or a filter, likewise counted first and confirmed
with a reason, goes through :func:`outboxkit.ops.dlq.discard.discard` as ``outboxkit dlq
discard``; discarded letters are left out of the lists unless ``include_discarded`` is asked.

A letter's payload is shown to operators only (viewers see its size); headers and the error are
shown to both.
"""

from __future__ import annotations

import time
from typing import Any

from outboxkit.console.context import console_of, int_of, reason_of, text_of
from outboxkit.consumers.dlq_headers import header_texts
from outboxkit.ops.access import database_bounded, require_tables
from outboxkit.ops.dlq.discard import (
    DiscardOptions,
    discard,
    discard_of,
    discarded_count,
    discarded_within,
)
from outboxkit.ops.dlq.grouping import FailureGroups, Tallies
from outboxkit.ops.dlq.reader import DlqFilter, DlqReader, DlqRecord, newest
from outboxkit.ops.dlq.rendering import render_data, shown_header
from outboxkit.ops.dlq.replay import Replayer, ReplayOptions
from outboxkit.ops.dlq.tables import dlq_discards, dlq_replays
from outboxkit.ops.status import DlqInfo, DlqTopicUnreachable, add_ledgers, dlq_counts
from starlette.datastructures import FormData, QueryParams
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

MAX_DATA_BYTES = 16_384
FILTER_FIELDS = ("type", "source", "error_class", "fingerprint", "partition", "offset", "until_ms")


def _reader(request: Request) -> DlqReader:
    config = console_of(request).config
    return DlqReader(config.kafka, config.timeout)


def _fields(values: QueryParams | FormData) -> dict[str, str]:
    return {name: text for name in FILTER_FIELDS if (text := text_of(values, name)) is not None}


def _filter(fields: dict[str, str]) -> DlqFilter:
    def one(name: str) -> frozenset[str]:
        return frozenset([fields[name]]) if name in fields else frozenset()

    offset = int_of(fields, "offset")
    partition = int_of(fields, "partition")
    return DlqFilter(
        types=one("type"),
        sources=one("source"),
        error_classes=one("error_class"),
        fingerprints=one("fingerprint"),
        from_offset=offset,
        to_offset=offset,
        partitions=None if partition is None else frozenset([partition]),
        until_ms=int_of(fields, "until_ms"),
    )


async def topics_page(request: Request) -> Response:
    """Every dead-letter topic, its letters still to handle and the discarded ones (the counts
    of ``outboxkit status``)."""
    console = console_of(request)
    config = console.config
    infos: list[DlqInfo | DlqTopicUnreachable]
    async with console.kafka.reading() as reader:
        infos = await dlq_counts(reader, config.dlq_topics or None)
    await add_ledgers(console.engine, config.timeout, infos)
    return console.render(request, "dlq_topics.html", infos=infos)


async def topic_page(request: Request) -> Response:
    """A topic's newest letters (``dlq_sample`` of them at most) grouped, and the first of
    those listed; the filter's actions still cover every letter it matches."""
    console = console_of(request)
    topic = request.path_params["topic"]
    fields = _fields(request.query_params)
    wanted = _filter(fields)
    include = text_of(request.query_params, "include_discarded") is not None
    async with console.kafka.reading() as reader:
        ranges = await reader.plan(topic, wanted)
        sample = newest(ranges, console.config.dlq_sample)
        read = [record async for record in reader.read(topic, wanted, sample)]
    async with database_bounded(console.engine, console.config.timeout):
        await require_tables(console.engine, [dlq_discards.name])
        async with console.engine.connect() as connection:
            read_bounds = {span.partition: (span.start, span.stop) for span in sample}
            discarded = await discarded_within(connection, topic, read_bounds)
            bounds = {span.partition: (span.first, span.end) for span in ranges}
            discarded_in_topic = await discarded_count(connection, topic, bounds)
    groups, tallies, shown, matched = FailureGroups(), Tallies(), list[DlqRecord](), 0
    for record in read:
        if not include and (record.partition, record.offset) in discarded:
            continue
        matched += 1
        groups.add(record)
        tallies.add(record)
        if len(shown) < console.config.page_size:
            shown.append(record)
    return console.render(
        request,
        "dlq_topic.html",
        topic=topic,
        fields=fields,
        matched=matched,
        covered=sum(span.size for span in sample),
        in_range=sum(span.size for span in ranges),
        groups=groups.ordered(),
        tallies=tallies,
        shown=shown,
        discarded=discarded,
        discarded_in_topic=discarded_in_topic,
        include=include,
    )


async def letter_page(request: Request) -> Response:
    """One letter: where it came from, its error and headers; its data for operators."""
    console = console_of(request)
    topic = request.path_params["topic"]
    partition, offset = request.path_params["partition"], request.path_params["offset"]
    async with console.kafka.reading() as reader:
        record = await reader.fetch(topic, partition, offset)
    async with database_bounded(console.engine, console.config.timeout):
        await require_tables(console.engine, [dlq_discards.name])
        discarded = await discard_of(console.engine, topic, partition, offset)
    letter = record.letter
    data: tuple[str, bool] | None = None
    if request.state.principal.may_act:
        content_type = header_texts(letter.headers).get("content-type")
        data = render_data(letter.value, content_type, MAX_DATA_BYTES)
    return console.render(
        request,
        "dlq_letter.html",
        topic=topic,
        record=record,
        headers=[(name, shown_header(name, value)) for name, value in letter.headers],
        data=data,
        size=len(letter.value or b""),
        discarded=discarded,
    )


async def replay_action(request: Request) -> Response:
    """``step=count``: a dry run, its count and a confirmation form (bounded to the letters
    dead-lettered until now); ``step=confirm``: the replay, recorded in the audit trail."""
    console = console_of(request)
    principal, form = await console.change_form(request)
    topic = request.path_params["topic"]
    fields = _fields(form)
    fields.setdefault("until_ms", str(int(time.time() * 1000)))
    wanted = _filter(fields)
    confirm = text_of(form, "step") == "confirm"
    reason = reason_of(form) if confirm else ""
    options = ReplayOptions(by=principal.name, dry_run=not confirm)
    engine = console.engine
    async with _reader(request) as reader, database_bounded(engine, console.config.timeout):
        await require_tables(engine, [dlq_replays.name, dlq_discards.name])
        summary = await Replayer(reader, engine).run(topic, wanted, options)
    if not confirm:
        return console.render(
            request, "dlq_confirm.html", topic=topic, fields=fields, summary=summary
        )
    expected = int_of(form, "expected")
    text = (
        f"replay {summary.replay_id}: {summary.matched} matched, {summary.replayed} replayed, "
        f"{summary.already_replayed} skipped as already replayed, "
        f"{summary.discarded} skipped as discarded, {summary.no_target} without an original topic"
    )
    if expected is not None and expected != summary.replayed:
        text += f" ({expected} counted by the dry run)"
    described: dict[str, Any] = {"topic": topic, **fields}
    await console.audit(
        principal,
        action="dlq.replay",
        target=topic,
        filter=described,
        count=summary.replayed,
        reason=reason,
        outcome=text,
    )
    return console.render(request, "done.html", message=text, back=f"/dlq/{topic}")


async def discard_action(request: Request) -> Response:
    """Discard (``/undiscard``: bring back) a letter, a group or a filter. ``step=count``: a dry
    run, its count and a confirmation form asking for the reason (bounded to the letters
    dead-lettered until now); ``step=confirm``: the change, recorded in the audit trail."""
    console = console_of(request)
    principal, form = await console.change_form(request)
    topic = request.path_params["topic"]
    undo = request.url.path.endswith("/undiscard")
    fields = _fields(form)
    fields.setdefault("until_ms", str(int(time.time() * 1000)))
    confirm = text_of(form, "step") == "confirm"
    reason = reason_of(form) if confirm else ""
    options = DiscardOptions(by=principal.name, reason=reason, dry_run=not confirm, undo=undo)
    engine = console.engine
    async with _reader(request) as reader, database_bounded(engine, console.config.timeout):
        await require_tables(engine, [dlq_discards.name])
        summary = await discard(reader, engine, topic, _filter(fields), options)
    verb = "undiscard" if undo else "discard"
    if not confirm:
        return console.render(
            request, "dlq_discard_confirm.html", topic=topic, fields=fields, summary=summary,
            verb=verb,
        )  # fmt: skip
    expected = int_of(form, "expected")
    same = "not discarded" if undo else "already discarded"
    text = (
        f"{verb} {summary.discard_id}: {summary.matched} matched, {summary.changed} "
        f"{'restored' if undo else 'discarded'}, {summary.unchanged} {same}"
    )
    if expected is not None and expected != summary.changed:
        text += f" ({expected} counted by the dry run)"
    await console.audit(
        principal,
        action=f"dlq.{verb}",
        target=topic,
        filter={"topic": topic, **fields},
        count=summary.changed,
        reason=reason,
        outcome=text,
    )
    return console.render(request, "done.html", message=text, back=f"/dlq/{topic}")


routes = [
    Route("/dlq", topics_page, methods=["GET"]),
    Route("/dlq/{topic}", topic_page, methods=["GET"]),
    Route("/dlq/{topic}/replay", replay_action, methods=["POST"]),
    Route("/dlq/{topic}/discard", discard_action, methods=["POST"]),
    Route("/dlq/{topic}/undiscard", discard_action, methods=["POST"]),
    Route("/dlq/{topic}/{partition:int}/{offset:int}", letter_page, methods=["GET"]),
]
