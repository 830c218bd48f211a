"""One devnet per test run for the e2e modules whose scenarios do not disturb each other.

`shared_devnet` is `planet devnet up --detach --verifiers 0 --epoch-length 10` once per
session (PLANET_E2E_VERIFIERS=N: N verifiers instead); test_devnet.py and test_dapp.py share it.
Each test gets its own funded wallet (`fresh_user`) and, to stake, join, unstake or leave, its
own operator homes (`new_operator`), never the genesis operators. `shared_devnet_dir` is the
devnet's state dir (the folder holding devnet.json) for tools that measure a running devnet.
At the end of the session `planet devnet down` must stop every process, and a second `down`
says none runs.

Modules that kill validators, cheat, or need network namespaces keep their own networks (see
each module's docstring).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from node.server.launcher import pid_alive
from node.zygote import ENV_VAR as ZYGOTE
from tests.e2e.devnet_session import (
    SHARED_EPOCH_LENGTH,
    UP_TIMEOUT_S,
    Operator,
    User,
    devnet_state,
    join_operator,
    new_user,
    operator_env,
    pids_alive,
    planet,
    release_operator,
    shared_verifiers,
    state_path,
)

# the tests' own operator homes, for the teardown's check that nothing outlives the session
_OPERATOR_HOMES: list[Path] = []


@pytest.fixture(scope="session")
def devnet_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment every `planet` command of the shared devnet runs in (its PLANET_HOME)."""
    from node.model.source import models_dir

    home = tmp_path_factory.mktemp("planet-shared-devnet")
    real_models = models_dir()
    real_models.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(real_models, target_is_directory=True)
    # every PLANET_ setting of the test run stays out, but the zygote (tests/conftest.py)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PLANET_") or k == ZYGOTE}
    return {**clean, "PLANET_HOME": str(home), "NO_COLOR": "1"}


class _Lifetime:
    """Brings the shared devnet down once, checking that every process stopped: after the last
    test that uses it (so no other devnet of the run meets it on the devnets' ports or on the
    CPU), or at the end of the session when that test never ran (-x, -k)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.done = False

    def down(self) -> None:
        if self.done:
            return
        self.done = True
        path = state_path(self.env)
        before = pids_alive(json.loads(path.read_text()), _OPERATOR_HOMES) if path.is_file() else []
        down = planet(self.env, "devnet", "down", timeout=180)
        assert down.returncode == 0, down.stderr
        survivors = [p for p in before if pid_alive(p)]
        assert not survivors, f"processes {survivors} outlived `planet devnet down`"
        again = planet(self.env, "devnet", "down", timeout=60)
        assert again.returncode == 0 and "no devnet was running" in again.stdout


_LIFETIMES: list[_Lifetime] = []  # the session's shared devnet, once it was asked for


@pytest.fixture(scope="session")
def _shared_devnet_lifetime(devnet_env: dict[str, str]) -> _Lifetime:
    _LIFETIMES.append(_Lifetime(devnet_env))
    return _LIFETIMES[-1]


@pytest.fixture(scope="session")
def shared_devnet(
    devnet_env: dict[str, str], _shared_devnet_lifetime: _Lifetime
) -> Iterator[dict[str, Any]]:
    """devnet.json of the session's devnet: anvil, the gateway, 4 validators (app, CometBFT,
    stake watcher), 3 compute nodes with their agents, the second model's seat in node0's
    process with its own agent (deploy/devnet/second_model.py); no verifiers (the sharing
    tests stake, leave and settle by hand; tests/e2e/test_verification_devnet.py runs its own
    with them)."""
    verifiers = shared_verifiers()
    # one node per shard (`--replicas 1`): the suite's tests need no spares, and three more
    # nodes cost the whole session their load time and memory
    up = planet(devnet_env, "devnet", "up", "--detach", "--replicas", "1",
                "--verifiers", str(verifiers), "--epoch-length", str(SHARED_EPOCH_LENGTH),
                timeout=UP_TIMEOUT_S)  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr[-4000:]
        assert "Traceback" not in up.stderr
        state = devnet_state(devnet_env)
        gateway = 1 if state.get("gateway_url") else 0
        # anvil (+ gateway), app + cometbft + watcher per validator, node + agent per operator
        # (a seat's node is node0's process: counted again with its own agent)
        seats = len(state.get("seats", []))
        assert len(pids_alive(state)) == 1 + gateway + 3 * 4 + 2 * (3 + seats) + verifiers
        yield state
    finally:
        _shared_devnet_lifetime.down()


@pytest.fixture(autouse=True)
def _shared_devnet_down_after_its_last_test(
    request: pytest.FixtureRequest,
) -> Iterator[None]:
    """After the last collected test that uses the shared devnet: `planet devnet down` (its
    checks fail that test's teardown), not at the end of the session."""
    yield
    item = request.node
    if "shared_devnet" not in item.fixturenames:
        return
    items = request.session.items
    later = items[items.index(item) + 1 :]
    if not any("shared_devnet" in getattr(other, "fixturenames", ()) for other in later):
        for lifetime in _LIFETIMES:
            lifetime.down()


@pytest.fixture(scope="session")
def shared_devnet_dir(devnet_env: dict[str, str], shared_devnet: dict[str, Any]) -> Path:
    """The running shared devnet's state dir (devnet.json and its processes' files)."""
    return state_path(devnet_env).parent


@pytest.fixture
def fresh_user(devnet_env: dict[str, str], shared_devnet: dict[str, Any], tmp_path: Path) -> User:
    """A wallet of this test's own, funded with `planet devnet fund` (10 ETH)."""
    return new_user(devnet_env, shared_devnet, tmp_path / "user")


@pytest.fixture
def new_operator(
    devnet_env: dict[str, str], shared_devnet: dict[str, Any], tmp_path: Path
) -> Iterator[Callable[..., Operator]]:
    """`new_operator(shard)`: an operator home of this test's own, funded, staked and joined
    (`shard` "auto": auto placement; `extra_env`: more environment for its `planet join`);
    whatever still runs of it is stopped (leave) after the test."""
    homes: list[Path] = []
    model = Path(shared_devnet["manifest"]).parent.name  # the devnet's model, by name

    def make(shard: int | str, extra_env: dict[str, str] | None = None) -> Operator:
        home = tmp_path / f"operator{len(homes)}"
        homes.append(home)
        _OPERATOR_HOMES.append(home)
        return join_operator({**devnet_env, **(extra_env or {})}, home, shard, model)

    yield make
    for home in homes:
        release_operator(operator_env(devnet_env, home), home)


@pytest.fixture(scope="session", autouse=True)
def _zygote(zygote_lane: Path | None) -> Path | None:
    """The services this folder's tests start fork from the session's zygote
    (tests/conftest.py `zygote_lane`)."""
    return zygote_lane
