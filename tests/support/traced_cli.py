"""``outboxkit`` with an OpenTelemetry SDK tracer exporting every span to a file.

``python -m tests.support.traced_cli ARGS...`` runs ``outboxkit ARGS...`` as a process whose
spans are written, one JSON document each, to ``LEAK_SPANS_FILE`` (the leak hunt reads it).
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor


def main() -> None:
    """Install the file exporter and remove the redactions ``LEAK_SABOTAGE`` names (the leak
    hunt's self-check), then run the CLI."""
    from tests.support.leak_sabotage import apply_from_environment

    apply_from_environment()
    spans = open(os.environ["LEAK_SPANS_FILE"], "a", encoding="utf-8")  # noqa: SIM115
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=spans)))
    trace.set_tracer_provider(provider)
    from outboxkit.cli.main import main as cli_main

    try:
        cli_main()
    finally:
        provider.shutdown()
        spans.close()


if __name__ == "__main__":
    main()
