"""`--private-next-hops CIDR`: a committee node at a private address dials exactly its network's
range (the devnet's), public addresses, and nothing else; `planet join` passes its range."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from node.agent.launch import _next_hop_args
from node.server.config import ServerConfig
from node.server.next_hops import ForwardCommittee, NextHopSpec, build_policy, parse_ranges
from planet import main as cli
from protocol.errors import UsageError
from protocol.stream import NextHop, NextHopNotAllowedError
from protocol.urls import canonical_url

pytestmark = pytest.mark.unit

MODEL = "sha256:" + "ab" * 32
LAB = ipaddress.ip_network("10.77.0.0/24")


class FakeRpc:
    """The committee's `/nodes` answer: every URL given is a routable node of shard 1."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    async def abci_query(self, path: str) -> Any:
        return {
            "nodes": [
                {"key": f"{i + 1:064x}", "endpoint": url, "shards": [1], "routable": True}
                for i, url in enumerate(self.urls)
            ]
        }


def hop(url: str) -> NextHop:
    return NextHop(url=canonical_url(url), shard=1, feed="f" * 43)


async def refused(policy: ForwardCommittee, url: str) -> str:
    with pytest.raises(NextHopNotAllowedError) as error:
        await policy.check(hop(url))
    return error.value.message


async def test_range_policy_dials_its_range_and_public_addresses_only() -> None:
    inside, public = "http://10.77.0.7:18100", "http://8.8.8.8:18100"
    outside, loopback = "http://10.78.0.7:18100", "http://127.0.0.1:6379"
    name = "http://node.example:18100"
    rpc = FakeRpc([inside, public, outside, loopback, name])  # all routable, registered
    policy = ForwardCommittee(0, rpc, MODEL, public_only=False, private_ranges=(LAB,))
    await policy.check(hop(inside))
    await policy.check(hop(public))
    for url in (outside, loopback):
        assert "outside this node's private next-hop ranges (10.77.0.0/24)" in await refused(
            policy, url
        )
    assert "dials IP addresses only" in await refused(policy, name)
    # the same registrations under the public-only policy: every private one refused
    public_only = ForwardCommittee(0, rpc, MODEL)
    assert "not a public address" in await refused(public_only, inside)
    await public_only.check(hop(public))


async def test_range_policy_still_needs_a_routable_committee_node() -> None:
    policy = ForwardCommittee(0, FakeRpc([]), MODEL, public_only=False, private_ranges=(LAB,))
    assert "not a routable compute node" in await refused(policy, "http://10.77.0.9:18100")


def test_build_policy_carries_the_ranges() -> None:
    spec = NextHopSpec("committee", private=True, private_ranges=(LAB,))
    policy = build_policy(spec, 0, source=FakeRpc([]), model_hash=MODEL)
    assert isinstance(policy, ForwardCommittee)
    assert policy.private_ranges == (LAB,) and not policy.public_only
    assert "10.77.0.0/24" in spec.describe()


def test_parse_ranges_accepts_cidr_lists_and_names_bad_ones() -> None:
    assert parse_ranges("10.77.0.0/24, 127.0.0.0/8") == (LAB, ipaddress.ip_network("127.0.0.0/8"))
    with pytest.raises(UsageError, match=r"'10\.77\.0\.0/33' is not an address range"):
        parse_ranges("10.77.0.0/33")


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[list[str], list[Any]]:
    import node.server.run

    seen: list[ServerConfig] = []
    monkeypatch.setattr(
        node.server.run, "serve", lambda config, ticket_key=None: seen.append(config)
    )
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    argv = ["node", "serve", "--manifest", str(manifest), "--shard", "0", "--plaintext-links"]
    return [*argv, "--committee-rpc", "http://10.77.0.2:26657"], seen


def test_serve_private_next_hops_with_a_range(served: tuple[list[str], list[Any]], capsys) -> None:
    argv, seen = served
    assert cli.main([*argv, "--private-next-hops", "10.77.0.0/24"]) == 0
    assert cli.main([*argv, "--private-next-hops"]) == 0
    assert seen[0].next_hops == NextHopSpec("committee", private=True, private_ranges=(LAB,))
    assert seen[1].next_hops == NextHopSpec("committee", private=True)
    assert cli.main([*argv, "--private-next-hops", "ten.77"]) == UsageError.exit_status
    err = capsys.readouterr().err
    assert "error: --private-next-hops: 'ten.77' is not an address range" in err
    assert "hint:" in err and "Traceback" not in err


def test_join_passes_the_devnet_range_to_a_node_at_a_private_address() -> None:
    rpcs = ["http://10.77.0.2:26657"]
    assert _next_hop_args(rpcs, "http://10.77.0.7:18100", "10.77.0.0/24") == [
        "--next-hops",
        "committee",
        "--private-next-hops",
        "10.77.0.0/24",
    ]
    # a node at a public address dials public addresses only, whatever range is configured
    assert _next_hop_args(rpcs, "http://8.8.8.8:18100", "10.77.0.0/24") == [
        "--next-hops",
        "committee",
    ]
