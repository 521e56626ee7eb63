"""The CloudEvents Java SDK for the interop tests, built on first use and cached."""

from __future__ import annotations

import pytest

from tests.interop.java_sdk import JavaSDK, build


@pytest.fixture(scope="session")
def java_sdk() -> JavaSDK:
    """The built Java side (a cold build fetches the SDK from Maven Central and compiles it)."""
    return JavaSDK(build())
