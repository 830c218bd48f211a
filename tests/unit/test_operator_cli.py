"""Operator CLI errors: each user mistake is one `error:` line plus a `hint:`, never a traceback.

The chain side is an in-process fake (unit tests); the same paths run against a real anvil in
tests/e2e/test_devnet.py.
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from safetensors.numpy import save_file

from node.cli import operator
from node.model.manifest import Manifest, ShardEntry, with_chunk_lists
from planet import main as cli
from protocol.canonical import hash_file
from protocol.errors import UsageError

pytestmark = pytest.mark.unit

ETHER = 10**18


class FakeStaking:
    """The Staking binding's reads and sends the operator commands use."""

    def __init__(self, *, staked: int, status: int, role: int) -> None:
        self._staked, self._status, self._role = staked, status, role
        self.staked_calls: list[tuple[int, int]] = []

    def stake_of(self) -> int:
        return self._staked

    def status_of(self) -> int:
        return self._status

    def role_of(self) -> int:
        return self._role

    def minimum_stake(self, role: int) -> int:
        return ETHER if role == 1 else ETHER // 2

    def stake(self, role: int, amount: int) -> Any:
        self.staked_calls.append((role, amount))
        return SimpleNamespace(tx_hash="0x01", event=lambda _name: {"total": self._staked + amount})


class FakeRegistry:
    def __init__(self, shard_hashes: list[bytes]) -> None:
        self._shard_hashes = shard_hashes

    def shard_hashes_of(self, model_id: bytes) -> list[bytes]:
        return self._shard_hashes


class FakeChain:
    """The parts of PlanetChain the operator commands use."""

    def __init__(
        self,
        *,
        balance: int = 10 * ETHER,
        staked: int = 0,
        status: int = 0,
        role: int = 0,
        shard_hashes: list[bytes] | None = None,
    ) -> None:
        self.address = "0x" + "ab" * 20
        self._balance = balance
        self.staking = FakeStaking(staked=staked, status=status, role=role)
        self.registry = FakeRegistry(shard_hashes or [])

    @property
    def staked_calls(self) -> list[tuple[int, int]]:
        return self.staking.staked_calls

    def balance(self) -> int:
        return self._balance


@pytest.fixture
def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PLANET_HOME", str(tmp_path))
    monkeypatch.setenv("PLANET_PASSWORD", "correct horse")
    for name in ("PLANET_EVM_RPC", "PLANET_COMMITTEE_RPC", "PLANET_CHAIN_ID"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def _use_chain(monkeypatch: pytest.MonkeyPatch, chain: FakeChain) -> None:
    monkeypatch.setattr(operator, "_chain", lambda _config, _password: chain)


def test_stake_unreachable_rpc_is_one_error_with_hint(env: Path, capsys, free_port: int) -> None:
    code, err = _run(
        capsys, "stake", "--role", "compute", "--amount", "1",
        "--evm-rpc", f"http://127.0.0.1:{free_port}",
    )  # fmt: skip
    assert code == 6
    assert f"error: EVM RPC http://127.0.0.1:{free_port} is unreachable" in err
    assert "hint:" in err and "--evm-rpc" in err


def test_stake_wrong_chain_names_both_chain_ids(env: Path, capsys, monkeypatch) -> None:
    fake_w3 = SimpleNamespace(eth=SimpleNamespace(chain_id=1))
    monkeypatch.setattr("node.chain.evm.rpc.connect", lambda *_a, **_k: fake_w3)
    code, err = _run(capsys, "stake", "--role", "compute", "--amount", "1", "--chain-id", "31337")
    assert code == 2
    assert "is chain 1, but this operator expects chain 31337" in err
    assert "hint: point --evm-rpc at the right chain" in err


def test_stake_below_minimum_refused_before_any_transaction(env, capsys, monkeypatch) -> None:
    chain = FakeChain()
    _use_chain(monkeypatch, chain)
    code, err = _run(capsys, "stake", "--role", "compute", "--amount", "0.4")
    assert code == 2
    assert "error: a compute stake must be at least 1 ETH; 0 ETH staked + 0.4 ETH is less" in err
    assert "hint: stake at least 1 ETH" in err
    assert chain.staked_calls == []


def test_stake_top_up_reaching_the_minimum_is_sent(env, capsys, monkeypatch) -> None:
    chain = FakeChain(staked=ETHER // 2, status=1, role=1)
    _use_chain(monkeypatch, chain)
    code = cli.main(["stake", "--role", "compute", "--amount", "0.5"])
    assert code == 0
    assert chain.staked_calls == [(1, ETHER // 2)]
    assert "total 1 ETH" in capsys.readouterr().out


def test_stake_insufficient_funds_names_address_and_balance(env, capsys, monkeypatch) -> None:
    chain = FakeChain(balance=ETHER // 2)
    _use_chain(monkeypatch, chain)
    code, err = _run(capsys, "stake", "--role", "compute", "--amount", "1.5")
    assert code == 8
    assert f"error: {chain.address} has 0.5 ETH, needs 1.5 ETH plus gas" in err
    assert f"hint: send ETH to {chain.address}" in err
    assert chain.staked_calls == []


@pytest.mark.parametrize("amount", ["-1", "0", "abc", "1e400", "0.0000000000000000001", "nan"])
def test_stake_bad_amount_is_a_usage_error(env, capsys, amount: str) -> None:
    code, err = _run(capsys, "stake", "--role", "compute", "--amount", amount)
    assert code == 2 and err.startswith("error: --amount")


def test_parse_eth_exact_wei() -> None:
    assert operator.parse_eth("1.5") == 3 * ETHER // 2
    assert operator.parse_eth("0.000000000000000001") == 1
    assert operator.format_eth(3 * ETHER // 2) == "1.5 ETH"


def _tiny_model(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    shards = []
    for index in range(2):
        path = directory / f"shard-{index}.safetensors"
        save_file({"w": __import__("numpy").full((2,), index, dtype="float32")}, str(path))
        shards.append(
            ShardEntry(
                shard_id=index,
                layers=(index, index + 1),
                hash=hash_file(path),
                size=path.stat().st_size,
                quant="none",
                file=path.name,
            )
        )
    manifest = Manifest.build(
        model_id="tiny",
        total_layers=2,
        hidden_size=2,
        dtype="float32",
        tokenizer_hash="sha256:" + "1" * 64,
        config_hash="sha256:" + "2" * 64,
        client_hash="sha256:" + "3" * 64,
        shards=tuple(shards),
    )
    return manifest.save(directory / "manifest.json")


def test_join_shard_hash_mismatch_with_registry_is_refused(env, capsys, monkeypatch) -> None:
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    chain = FakeChain(staked=ETHER, status=1, role=1, shard_hashes=[b"\x01" * 32, b"\x02" * 32])
    _use_chain(monkeypatch, chain)
    code, err = _run(capsys, "join", "--model", str(manifest_file), "--shard", "1")
    assert code == 3
    assert "error: shard 1: the local manifest says sha256:" in err
    assert "the ModelRegistry on chain says sha256:" + "02" * 32 in err
    assert "hint:" in err
    assert not (env / "run" / "joined.json").exists()


def test_join_corrupt_local_shard_file_is_refused(env, capsys, monkeypatch) -> None:
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    manifest = Manifest.load(manifest_file)
    registered = [bytes.fromhex(s.hash[7:]) for s in manifest.shards]
    (manifest_file.parent / "shard-0.safetensors").write_bytes(b"tampered")
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=registered))
    code, err = _run(capsys, "join", "--model", "tiny-2p", "--shard", "0")
    assert code == 3
    assert "does not match the manifest's" in err


def test_join_without_stake_says_how_to_stake(env, capsys, monkeypatch) -> None:
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    _use_chain(monkeypatch, FakeChain(staked=0))
    code, err = _run(capsys, "join", "--model", str(manifest_file), "--shard", "0")
    assert code == 2
    assert "a compute node needs 1 ETH" in err
    assert "hint: planet stake --role compute --amount 1" in err


def test_join_unregistered_model_is_refused(env, capsys, monkeypatch) -> None:
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=[]))
    code, err = _run(capsys, "join", "--model", str(manifest_file), "--shard", "0")
    assert code == 2
    assert "is not registered in the ModelRegistry on chain" in err


def test_join_without_the_models_config_is_refused_before_anything_is_fetched(
    env, capsys, monkeypatch
) -> None:
    """The shard file is fetched from peers; config.json must be there (the node loads it)."""
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    (manifest_file.parent / "config.json").unlink()
    (manifest_file.parent / "shard-0.safetensors").unlink()
    fetched: list[object] = []
    monkeypatch.setattr(operator, "fetch_with_progress", lambda *a: fetched.append(a))
    code, err = _run(capsys, "join", "--model", str(manifest_file), "--shard", "0")
    assert code == 2 and fetched == []
    assert "has the manifest but no config.json" in err and "hint:" in err
    assert not (env / "run" / "joined.json").exists()


def test_join_unknown_model_name_is_refused(env, capsys) -> None:
    code, err = _run(capsys, "join", "--model", "no-such-model", "--shard", "0")
    assert code == 2
    assert "error: no prepared model 'no-such-model'" in err and "hint:" in err


def test_status_without_keys_or_chain_prints_what_it_knows(env, capsys) -> None:
    code = cli.main(["status", "--json", "--evm-rpc", "http://127.0.0.1:9"])
    out = capsys.readouterr().out
    assert code == 0
    assert '"address": null' in out and '"committee": null' in out


def _chunked_tiny_model(env: Path) -> tuple[Path, Path]:
    """A tiny model with chunk lists whose shard 0 file is missing; (manifest, origin dir)."""
    source = _tiny_model(env / "origin")
    chunked = with_chunk_lists(Manifest.load(source), source.parent, chunk_size=16)
    home = env / "models" / "tiny-2p"
    home.mkdir(parents=True)
    (home / "shard-1.safetensors").write_bytes((source.parent / "shard-1.safetensors").read_bytes())
    (home / "config.json").write_text("{}")  # the model's small files come with the manifest
    return chunked.save(home / "manifest.json"), source.parent


def test_join_fetches_a_missing_shard_file_then_goes_on(env, capsys, monkeypatch) -> None:
    manifest_file, origin = _chunked_tiny_model(env)
    manifest = Manifest.load(manifest_file)
    registered = [bytes.fromhex(s.hash[7:]) for s in manifest.shards]
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=registered))
    asked: list[tuple[str, int]] = []

    def serving(_config: Any, model_hash: str, shard: int) -> dict[str, str]:
        asked.append((model_hash, shard))
        return {"http://127.0.0.1:9": "ab" * 32}  # listed but down: the origin takes over

    def stop_here(*_args: Any) -> None:
        raise UsageError("stopped after the shard check")

    monkeypatch.setattr(operator, "_serving_peers", serving)
    monkeypatch.setattr(operator, "_committee_view", stop_here)
    code, err = _run(
        capsys, "join", "--model", str(manifest_file), "--shard", "0", "--origin", str(origin)
    )
    assert code == 2 and "stopped after the shard check" in err, err
    assert asked == [(manifest.model_hash, 0)]
    assert hash_file(manifest_file.parent / "shard-0.safetensors") == manifest.shards[0].hash
    assert "fetching shard 0" in err and "from origin" in err


def test_join_with_a_missing_shard_and_no_source_says_what_to_do(env, capsys, monkeypatch) -> None:
    manifest_file, _ = _chunked_tiny_model(env)
    manifest = Manifest.load(manifest_file)
    registered = [bytes.fromhex(s.hash[7:]) for s in manifest.shards]
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=registered))
    monkeypatch.setattr(operator, "_serving_peers", lambda *_a: {})
    code, err = _run(capsys, "join", "--model", str(manifest_file), "--shard", "0")
    assert code == 6
    assert "error:" in err and "missing and no peer is left" in err
    assert "hint:" in err and "origin" in err


def test_join_progress_says_each_state_once_and_a_long_wait_again_every_15_s() -> None:
    progress = operator.JoinProgress(100.0)
    loading = "waiting for the node to load its shard and register"
    said = [progress.say(loading, 100.0 + t) for t in (0.0, 0.5, 14.9, 15.0, 15.5, 30.0)]
    assert said == [
        f"  [  0.0 s] {loading}",
        None,
        None,
        f"  [ 15.0 s] still: {loading}",
        None,
        f"  [ 30.0 s] still: {loading}",
    ]
    joined = "JOIN, stake not yet agreed, reputation 0.500, routable False"
    assert progress.say(joined, 31.0 + 100.0) == f"  [ 31.0 s] {joined}"  # a new state at once
    assert progress.say(joined, 100.0 + 31.0 + operator.STILL_EVERY_S - 0.1) is None


def test_leave_keeps_the_node_answering_spot_checks_of_its_last_work(
    env: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`planet leave`: the agent's `leave` is on chain, then the node stays up until the
    committee is CHECK_LOOKBACK_EPOCHS + 2 epochs past the epoch it left in (the verifiers'
    last checks of its last blocks), then stops; `--now` stops it at once."""
    import json
    import subprocess
    import sys

    import node.chain.committee_link as committee_link
    from node.server.launcher import pid_alive
    from protocol.spotcheck import CHECK_LOOKBACK_EPOCHS

    epochs: list[int] = []
    alive_at: dict[int, bool] = {}

    def stand_in_node() -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-c", "import time; time.sleep(120)", "planet", "serve"]
        return subprocess.Popen(argv)

    def joined(node: subprocess.Popen[bytes]) -> None:
        run = env / "run"
        run.mkdir(exist_ok=True)
        record = {
            "shard": 0, "port": 1, "endpoint": "http://127.0.0.1:1", "model": "m",
            "manifest": "m", "node_pid": node.pid, "agent_pid": 999_999_998, "node_key": "ab",
            "node_log": "n", "agent_log": "a",
        }  # fmt: skip
        (run / "joined.json").write_text(json.dumps(record))

    class Link:
        def __init__(self, urls: Any, **kwargs: Any) -> None:
            pass

        async def node(self, key: str) -> dict[str, Any]:
            return {"key": key, "status": "LEFT"}

        async def query(self, path: str, **params: Any) -> dict[str, Any]:
            assert path == "/epochs"
            epochs.append(10 + len(epochs))  # one epoch further at every poll
            alive_at[epochs[-1]] = pid_alive(node.pid)
            return {"current": epochs[-1]}

        async def close(self) -> None:
            pass

    monkeypatch.setattr(committee_link, "CommitteeLink", Link)
    monkeypatch.setattr(operator, "_DRAIN_POLL_S", 0.01)
    node = stand_in_node()
    try:
        joined(node)
        code, err = _run(capsys, "leave")
        assert code == 0
        until = 10 + CHECK_LOOKBACK_EPOCHS + 2
        assert epochs[-1] == until and all(alive_at[e] for e in epochs)  # up until the end
        assert node.wait(timeout=10) is not None  # then stopped
        assert f"answering spot checks of its last work until epoch {until}" in err
        epochs.clear()
        node = stand_in_node()
        joined(node)
        code, _ = _run(capsys, "leave", "--now")
        assert code == 0 and epochs == [] and node.wait(timeout=10) is not None
    finally:
        if node.poll() is None:
            node.kill()


# -- join without --shard: auto placement from the committee's /nodes ----------------------------


def _committee_answering(monkeypatch: pytest.MonkeyPatch, answer: Any) -> list[tuple[str, Any]]:
    """CommitteeLink replaced by one that answers /nodes with `answer` (and /params with a
    genesis that keeps the default replica floor); returns what was asked."""
    import node.chain.committee_link as committee_link

    asked: list[tuple[str, Any]] = []

    class Link:
        def __init__(self, urls: Any, **kwargs: Any) -> None:
            pass

        async def query(self, path: str, **params: Any) -> Any:
            asked.append((path, params))
            return {"genesis": {}} if path == "/params" else answer

        async def close(self) -> None:
            pass

    monkeypatch.setattr(committee_link, "CommitteeLink", Link)
    return asked


def _pool_entry(model: str, shard: int) -> dict[str, Any]:
    return {
        "key": f"{shard + 1:064x}", "role": "compute", "model": model, "shards": [shard],
        "status": "SERVING", "routable": True,
    }  # fmt: skip


def _stop_after_the_shard_check(monkeypatch: pytest.MonkeyPatch) -> None:
    def stop_here(*_args: Any) -> None:
        raise UsageError("stopped after the shard check")

    monkeypatch.setattr(operator, "_committee_view", stop_here)


def test_join_without_shard_takes_the_shard_the_pool_lacks(env, capsys, monkeypatch) -> None:
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    manifest = Manifest.load(manifest_file)
    registered = [bytes.fromhex(s.hash[7:]) for s in manifest.shards]
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=registered))
    asked = _committee_answering(monkeypatch, {"nodes": [_pool_entry(manifest.model_hash, 0)]})
    _stop_after_the_shard_check(monkeypatch)
    code, err = _run(capsys, "join", "--model", "tiny-2p")
    assert code == 2 and "stopped after the shard check" in err, err
    assert asked == [("/nodes", {"model": manifest.model_hash, "role": "compute"}), ("/params", {})]
    assert "placement: shard 1 of 2: it has 0 routable nodes (shard 0 has 1)" in err
    assert f"checking shard 1 of {manifest.model_hash}" in err


def test_join_auto_placement_says_it_weighed_the_measured_speeds(env, capsys, monkeypatch) -> None:
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    manifest = Manifest.load(manifest_file)
    registered = [bytes.fromhex(s.hash[7:]) for s in manifest.shards]
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=registered))

    def measured(n: int, shard: int, speed: int) -> dict[str, Any]:
        return {**_pool_entry(manifest.model_hash, shard), "key": f"{n:064x}", "speed": speed}

    # shard 0: three nodes at 5 tokens/s; shard 1: two at 40. By counts shard 1 is short, by
    # the committee's measured speeds shard 0 is the weakest (15 against 80)
    nodes = [measured(1, 0, 5), measured(2, 0, 5), measured(3, 0, 5)]
    nodes += [measured(4, 1, 40), measured(5, 1, 40)]
    _committee_answering(monkeypatch, {"nodes": nodes})
    _stop_after_the_shard_check(monkeypatch)
    code, err = _run(capsys, "join", "--model", "tiny-2p")
    assert code == 2 and "stopped after the shard check" in err, err
    assert "placement: shard 0 of 2: it has 15 tokens/s over 3 routable nodes" in err
    assert "weighed by the speeds the verifiers measured" in err


def test_join_shard_auto_on_an_empty_pool_takes_shard_0(env, capsys, monkeypatch) -> None:
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    registered = [bytes.fromhex(s.hash[7:]) for s in Manifest.load(manifest_file).shards]
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=registered))
    _committee_answering(monkeypatch, {"nodes": []})
    _stop_after_the_shard_check(monkeypatch)
    code, err = _run(capsys, "join", "--model", "tiny-2p", "--shard", "auto")
    assert code == 2 and "placement: shard 0 of 2: no shard has a routable node yet" in err


def test_join_with_an_explicit_shard_does_not_ask_for_a_placement(env, capsys, monkeypatch) -> None:
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    registered = [bytes.fromhex(s.hash[7:]) for s in Manifest.load(manifest_file).shards]
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=registered))
    asked = _committee_answering(monkeypatch, {"nodes": []})
    _stop_after_the_shard_check(monkeypatch)
    code, err = _run(capsys, "join", "--model", "tiny-2p", "--shard", "1")
    assert code == 2 and "checking shard 1 of" in err
    assert asked == [] and "placement:" not in err


def test_join_auto_refuses_an_unregistered_model_by_name(env, capsys, monkeypatch) -> None:
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    model_hash = Manifest.load(manifest_file).model_hash
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=[]))
    asked = _committee_answering(monkeypatch, {"nodes": []})
    code, err = _run(capsys, "join", "--model", "tiny-2p")
    assert code == 2
    assert f"error: model {model_hash} is not registered in the ModelRegistry" in err
    assert "hint:" in err and asked == []


def test_join_auto_refuses_a_malformed_committee_answer_by_name(env, capsys, monkeypatch) -> None:
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    manifest = Manifest.load(manifest_file)
    registered = [bytes.fromhex(s.hash[7:]) for s in manifest.shards]
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=registered))
    bad = {**_pool_entry(manifest.model_hash, 0), "shards": ["0"]}
    _committee_answering(monkeypatch, {"nodes": [bad]})
    code, err = _run(capsys, "join", "--model", "tiny-2p")
    assert code == 4
    assert "error: the committee's /nodes answer is malformed: nodes[0].shards" in err
    assert "hint:" in err and "--shard K" in err
    assert not (env / "run" / "joined.json").exists()


def test_join_auto_with_the_committee_down_says_how_to_go_on(env, capsys, monkeypatch) -> None:
    manifest_file = _tiny_model(env / "models" / "tiny-2p")
    registered = [bytes.fromhex(s.hash[7:]) for s in Manifest.load(manifest_file).shards]
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=registered))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, err = _run(
        capsys, "join", "--model", "tiny-2p", "--committee-rpc", f"http://127.0.0.1:{port}"
    )
    assert code == 6
    assert "error: cannot read the pool of sha256:" in err and "to pick a shard" in err
    assert "--shard K" in err


@pytest.mark.parametrize("given", ["x", "-1", "65536", "1.5", ""])
def test_join_bad_shard_is_a_usage_error(env, capsys, given: str) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["join", "--model", "m", "--shard", given])
    assert exited.value.code == 2
    assert "is not a shard index (0-65535) or auto" in capsys.readouterr().err


def test_join_help_teaches_auto_placement(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["join", "--help"])
    out = capsys.readouterr().out
    assert "auto placement" in out and "weakest shard" in out
    assert "--shard K|auto" in out


def test_join_help_teaches_rebalancing(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["join", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--rebalance, --no-rebalance" in out
    assert "default: on with auto placement, off with --shard K" in out
    assert "A node joined with --shard K stays there" in out and "rebalance: stayed" in out


# -- join --shards auto: the span sized from this machine's memory and the pool ------------------


def _joinable_tiny(env: Path, monkeypatch: pytest.MonkeyPatch, nodes: list[Any]) -> Manifest:
    manifest = Manifest.load(_tiny_model(env / "models" / "tiny-2p"))
    registered = [bytes.fromhex(s.hash[7:]) for s in manifest.shards]
    _use_chain(monkeypatch, FakeChain(staked=ETHER, status=1, role=1, shard_hashes=registered))
    _committee_answering(monkeypatch, {"nodes": nodes})
    _stop_after_the_shard_check(monkeypatch)
    return manifest


def test_join_shards_auto_on_a_fresh_pool_serves_the_whole_model(env, capsys, monkeypatch) -> None:
    import node.agent.machine_memory as machine_memory

    monkeypatch.setattr(machine_memory, "available_bytes", lambda: 64 * 1024**3)
    manifest = _joinable_tiny(env, monkeypatch, [])
    code, err = _run(capsys, "join", "--model", "tiny-2p", "--shards", "auto")
    assert code == 2 and "stopped after the shard check" in err, err
    assert "placement (--shards auto): shards 0-1 of 2 have no node; serving them as one hop" in err
    assert "of 64.0 GiB available less 1.0 GiB headroom) makes the model answerable" in err
    assert f"checking shard 0 of {manifest.model_hash}" in err
    assert f"checking shard 1 of {manifest.model_hash}" in err


def test_join_without_shards_stays_one_shard_on_a_fresh_pool(env, capsys, monkeypatch) -> None:
    manifest = _joinable_tiny(env, monkeypatch, [])
    code, err = _run(capsys, "join", "--model", "tiny-2p")
    assert code == 2 and "placement: shard 0 of 2: no shard has a routable node yet" in err
    assert f"checking shard 1 of {manifest.model_hash}" not in err


def test_join_shards_auto_without_memory_for_a_shard_is_an_error(env, capsys, monkeypatch) -> None:
    import node.agent.machine_memory as machine_memory

    monkeypatch.setattr(machine_memory, "available_bytes", lambda: 2 * 1024**3)
    _joinable_tiny(env, monkeypatch, [])
    code, err = _run(capsys, "join", "--model", "tiny-2p", "--shards", "auto")
    lines = err.strip().splitlines()
    assert code == 2 and lines[-2].startswith("error: shard 0 needs "), err
    assert "this machine has 2.0 GiB available less 1.0 GiB headroom" in lines[-2]
    assert lines[-1].startswith("hint: ") and "checking shard" not in err
