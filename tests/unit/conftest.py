"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.zygote import running


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A zygote of the test module's own that preloads only `json` (quick to start): the
    zygote's unit tests fork their probes from it."""
    with running(tmp_path_factory.mktemp("zygote"), preload="json") as path:
        assert path is not None, "the zygote did not start"
        yield path
