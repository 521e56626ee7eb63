"""Purchase order PO-2026-481 from request to issue, as a durable workflow.

See ``definition.py`` for the states, ``README.md`` for how to run it
(``python -m examples.purchase_order``).
"""
