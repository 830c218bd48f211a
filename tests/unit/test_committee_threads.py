"""cometbft's Go threads on a local committee: the host's cores shared among its validators
(`deploy.committee.start.cometbft_env`) when the binary is setup.sh's build with the 1 ms ABCI
flush timer (`flush_patched`), and `start_network` starting cometbft with them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import deploy.committee.cometbft as cometbft
import deploy.committee.start as start
from deploy.committee.network import Network, Validator

pytestmark = pytest.mark.unit


def _network(directory: Path, validators: int) -> Network:
    return Network(
        dir=str(directory),
        chain_id="c",
        app="planet",
        base_port=46900,
        timeout_commit="300ms",
        epoch_length=5,
        validators=tuple(
            Validator(
                index=i,
                home=str(directory / f"node{i}"),
                node_id=f"{i:040x}",
                p2p_port=46900 + 10 * i,
                rpc_port=46901 + 10 * i,
                abci_port=46902 + 10 * i,
                pprof_port=46903 + 10 * i,
                operator_address="0x" + "00" * 20,
                validator_address="00" * 20,
            )
            for i in range(validators)
        ),
    )


@pytest.mark.parametrize(
    ("cores", "validators", "threads"), [(2, 4, "1"), (1, 1, "1"), (16, 4, "4"), (8, 3, "2")]
)
def test_cometbft_env_shares_the_cores_among_validators(
    tmp_path: Path, cores: int, validators: int, threads: str
) -> None:
    env = start.cometbft_env(
        _network(tmp_path, validators), {"PATH": "/bin"}, patched=True, cores=cores
    )
    assert env == {"PATH": "/bin", "GOMAXPROCS": threads}


def test_cometbft_env_keeps_a_gomaxprocs_the_user_set(tmp_path: Path) -> None:
    env = start.cometbft_env(_network(tmp_path, 4), {"GOMAXPROCS": "3"}, patched=True, cores=2)
    assert env["GOMAXPROCS"] == "3"


def test_cometbft_env_leaves_an_unpatched_binary_on_go_defaults(tmp_path: Path) -> None:
    env = start.cometbft_env(_network(tmp_path, 4), {"PATH": "/bin"}, patched=False, cores=2)
    assert env == {"PATH": "/bin"}


def test_flush_patched_needs_setups_binary_and_its_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cometbft, "REPO_ROOT", tmp_path)
    binary = tmp_path / ".tools" / "bin" / "cometbft"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"")
    assert not cometbft.flush_patched(binary)  # no stamp: an older setup's upstream build
    stamp = tmp_path / ".tools" / "stamps" / "cometbft"
    stamp.parent.mkdir(parents=True)
    stamp.write_text(f"{cometbft.COMETBFT_VERSION}\n")
    assert not cometbft.flush_patched(binary)
    stamp.write_text(f"{cometbft.COMETBFT_BUILD}\n")
    assert cometbft.flush_patched(binary)
    assert not cometbft.flush_patched(tmp_path / "elsewhere" / "cometbft")  # $PLANET_COMETBFT


@pytest.mark.parametrize(("patched", "threads"), [(True, "1"), (False, None)])
def test_start_network_starts_cometbft_with_shared_threads_and_the_app_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, patched: bool, threads: str | None
) -> None:
    network = _network(tmp_path, 4)
    spawned: list[tuple[str, int, Mapping[str, str] | None]] = []

    def fake_spawn(_network: Network, process: str, index: int, _argv: list[str], **kw: Any) -> int:
        spawned.append((process, index, kw.get("env")))
        return 1000 + len(spawned)

    monkeypatch.delenv("GOMAXPROCS", raising=False)
    monkeypatch.setattr(start, "spawn", fake_spawn)
    monkeypatch.setattr(start, "wait_port_open", lambda *_a, **_k: None)
    monkeypatch.setattr(start, "require_ports", lambda _ports: None)
    monkeypatch.setattr(start, "find_cometbft", lambda: Path("/opt/cometbft"))
    monkeypatch.setattr(start.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(
        start, "flush_patched", lambda binary: binary == Path("/opt/cometbft") and patched
    )
    started = start.start_network(network, wait=False)
    assert len(started) == 8
    cometbft = [env for process, _i, env in spawned if process == "cometbft"]
    assert len(cometbft) == 4
    assert all(env is not None and env.get("GOMAXPROCS") == threads for env in cometbft)
    assert all(env is None for process, _i, env in spawned if process == "app")
