"""Session-wide fixtures for every test folder.

`zygote_lane`: one zygote (node/zygote, harness/zygote.py) for the session, its socket
exported as $PLANET_ZYGOTE so that the services the tests start — directly, through the
launcher, or through `planet` commands in subprocesses — are forked from it instead of each
importing torch, aiohttp and web3 afresh. The integration and e2e folders ask for it (their
conftest.py); unit tests do not. Set PLANET_TEST_ZYGOTE=0 to run without it. The lanes also
get OMP_WAIT_POLICY=PASSIVE for every process (what `node_env` gives the nodes, and with
OMP_NUM_THREADS=1 it changes nothing else): OpenMP reads it when torch loads, so a process
with another value could not be forked from the zygote.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.zygote import running
from node.zygote import ENV_VAR


@pytest.fixture(scope="session")
def zygote_lane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    if os.environ.get(ENV_VAR) or os.environ.get("PLANET_TEST_ZYGOTE", "1") == "0":
        yield None  # one already serves this run (a parent's), or switched off
        return
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with running(tmp_path_factory.mktemp("zygote")) as path:
        if path is None:
            yield None
            return
        os.environ[ENV_VAR] = str(path)
        try:
            yield path
        finally:
            os.environ.pop(ENV_VAR, None)
