"""A consumer app module that takes seconds to import, as a big application may.

It prints ``importing slow app`` first, so a test can send SIGTERM while ``outboxkit consume``
is still starting up (``OUTBOXKIT_TEST_IMPORT_DELAY_S``, default 3 s).
"""

from __future__ import annotations

import os
import time

from tests.support.consumer_apps import effects_app

print("importing slow app", flush=True)
time.sleep(float(os.environ.get("OUTBOXKIT_TEST_IMPORT_DELAY_S", "3")))

app = effects_app
