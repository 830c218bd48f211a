"""The node's next-hop policy (node/server/next_hops.py): list / none / any / committee with an
in-process fake committee RPC (refresh, miss rate limit, wrong shard), and the `planet node
serve --next-hops` flag's parse and errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.abc import AbstractResolver

from node.server.config import ServerConfig
from node.server.next_hops import (
    ForwardAny,
    ForwardCommittee,
    ForwardList,
    ForwardNone,
    NextHopSpec,
    NonPublicAddressError,
    PublicResolver,
    build_policy,
    is_public_address,
    parse_next_hops,
    read_next_hops_file,
    routable_hops,
)
from planet import main as cli
from protocol.errors import ConfigError, RemoteError, UsageError
from protocol.stream import NextHop, NextHopNotAllowedError
from protocol.urls import canonical_url

pytestmark = pytest.mark.unit

FEED = "f" * 43
MODEL = "sha256:" + "ab" * 32
# names, not IP literals: under `committee` a literal must be a public address, and a name is
# checked where it is resolved (PublicResolver); the tests below cover both
A, B, C = (
    "http://a.nodes.example:18101",
    "http://b.nodes.example:18101",
    "http://c.nodes.example:18102",
)


def hop(url: str, shard: int = 1) -> NextHop:
    return NextHop(url=url, shard=shard, feed=FEED)


def entry(url: Any, shard: int, *, routable: bool = True, key: str = "k" * 64) -> dict:
    return {"key": key.replace("k", "1"), "endpoint": url, "shards": [shard], "routable": routable}


class FakeRpc:
    """The committee's `/nodes` answer, counted; `fail` makes it raise like an unreachable RPC."""

    def __init__(self, nodes: list[Any]) -> None:
        self.nodes = nodes
        self.paths: list[str] = []
        self.fail = False

    async def abci_query(self, path: str) -> Any:
        self.paths.append(path)
        if self.fail:
            raise RemoteError("http://127.0.0.1:1", "rpc_error", "connection refused")
        return {"nodes": list(self.nodes)}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def refused(policy: Any, next_hop: NextHop) -> str:
    with pytest.raises(NextHopNotAllowedError) as error:
        await policy.check(next_hop)
    assert error.value.code == "next_hop_not_allowed" and error.value.http_status == 403
    return error.value.message


# ------------------------------------------------------------------------------ list/none/any
async def test_list_allows_its_urls_only() -> None:
    policy = ForwardList(0, frozenset({A, B}))
    await policy.check(hop(A))
    await policy.check(hop(B))
    assert "not on this node's --next-hops list" in await refused(policy, hop(C))
    assert "not on" in await refused(policy, hop("http://127.0.0.1:22"))


async def test_every_policy_but_none_requires_the_next_shard() -> None:
    for policy in (ForwardList(1, frozenset({A})), ForwardAny(1)):
        await policy.check(hop(A, 2))
        for shard in (0, 1, 3):  # back, itself, skipping one: no loops, no detours
            assert "after shard 1 comes 2" in await refused(policy, hop(A, shard))


async def test_none_refuses_everything_with_a_hint() -> None:
    message = await refused(ForwardNone(0), hop(A))
    assert "forwards to no next hop" in message and "--next-hops" in message


async def test_any_allows_any_url() -> None:
    await ForwardAny(0).check(hop("http://169.254.169.254:80"))


# ------------------------------------------------------------------------------ committee
async def test_committee_allows_routable_node_of_the_claimed_shard(clock: Clock) -> None:
    rpc = FakeRpc([entry(A, 1), entry(C, 2)])
    policy = ForwardCommittee(0, rpc, MODEL, clock=clock)
    await policy.check(hop(A, 1))
    assert rpc.paths == [f"/nodes?model={MODEL}&role=compute"]
    await policy.check(hop(A, 1))  # cached
    assert len(rpc.paths) == 1


async def test_committee_wrong_shard_is_refused(clock: Clock) -> None:
    # C is routable, but for shard 2: a client may not claim it serves shard 1
    policy = ForwardCommittee(0, FakeRpc([entry(A, 1), entry(C, 2)]), MODEL, clock=clock)
    assert "not a routable compute node of shard 1" in await refused(policy, hop(C, 1))
    # and the order rule holds even for a registered node: shard 0 cannot jump to shard 2
    assert "after shard 0 comes 1" in await refused(policy, hop(C, 2))


async def test_committee_skips_unroutable_and_malformed_entries(clock: Clock) -> None:
    rpc = FakeRpc(
        [
            entry(A, 1, routable=False),
            entry("http://u@d.nodes.example:18101", 1),
            entry("http://e.nodes.example:1", 1, key="not-a-key"),
            {"endpoint": B, "shards": [1], "routable": "true", "key": "1" * 64},
            entry("HTTP://Node.Example.:18101", 1),
        ]
    )
    policy = ForwardCommittee(0, rpc, MODEL, clock=clock)
    for url in (A, "http://d.nodes.example:18101", "http://e.nodes.example:1", B):
        assert "not a routable compute node" in await refused(policy, hop(url))
    await policy.check(hop("http://node.example:18101"))  # compared in canonical form


async def test_committee_miss_refreshes_but_a_flood_costs_one_query(clock: Clock) -> None:
    rpc = FakeRpc([entry(A, 1)])
    policy = ForwardCommittee(0, rpc, MODEL, clock=clock, max_age_s=10.0, miss_refresh_s=2.0)
    await policy.check(hop(A))
    assert len(rpc.paths) == 1
    bogus = [hop(f"http://bogus{i}.example:{1000 + i}") for i in range(300)]
    results = await asyncio.gather(*(policy.check(h) for h in bogus), return_exceptions=True)
    assert all(isinstance(r, NextHopNotAllowedError) for r in results)
    assert len(rpc.paths) == 1  # within miss_refresh_s of the last query: no new one
    clock.now += 2.5
    await asyncio.gather(*(policy.check(h) for h in bogus), return_exceptions=True)
    assert len(rpc.paths) == 2  # one refresh for the whole burst, then rate-limited again


async def test_committee_miss_finds_a_newly_registered_node(clock: Clock) -> None:
    rpc = FakeRpc([entry(A, 1)])
    policy = ForwardCommittee(0, rpc, MODEL, clock=clock, miss_refresh_s=2.0)
    await policy.check(hop(A))
    rpc.nodes.append(entry(B, 1))  # B registers (or moves here) after the view was read
    clock.now += 0.5
    await policy.check(hop(B))  # the miss re-read the view at once (issue 44)
    assert len(rpc.paths) == 2


async def test_committee_miss_rereads_at_once_after_a_read_for_another_reason(
    clock: Clock,
) -> None:
    """Reads for age or warm targets do not hold a miss back: only a miss's own read does."""
    rpc = FakeRpc([entry(A, 1)])
    policy = ForwardCommittee(0, rpc, MODEL, clock=clock, max_age_s=10.0, miss_refresh_s=2.0)
    await policy.check(hop(A))
    clock.now += 10.5
    await policy.check(hop(A))  # stale hit: read again (2 reads)
    rpc.nodes.append(entry(B, 1))
    clock.now += 0.5
    await policy.check(hop(B))  # half a second after that read, the miss reads again
    assert len(rpc.paths) == 3
    rpc.nodes.append(entry(C, 1))
    clock.now += 0.5
    await refused(policy, hop(C))  # a miss read 0.5 s ago: rate-limited
    assert len(rpc.paths) == 3
    clock.now += 1.6
    await policy.check(hop(C))
    assert len(rpc.paths) == 4


async def test_committee_a_stale_view_and_a_miss_in_one_check_cost_one_read(clock: Clock) -> None:
    """The read a stale view makes already is as new as the miss could ask for (the clock
    moves while it runs): the miss does not read again."""
    rpc = FakeRpc([entry(A, 1)])
    policy = ForwardCommittee(0, rpc, MODEL, clock=clock, max_age_s=10.0, miss_refresh_s=2.0)
    await policy.check(hop(A))
    query = rpc.abci_query

    async def slow(path: str) -> Any:
        clock.now += 0.3  # the read takes a while
        return await query(path)

    rpc.abci_query = slow  # type: ignore[method-assign]
    clock.now += 10.5
    await refused(policy, hop(B))
    assert len(rpc.paths) == 2


async def test_committee_stale_hit_refreshes_and_drops_a_node_that_left(clock: Clock) -> None:
    rpc = FakeRpc([entry(A, 1)])
    policy = ForwardCommittee(0, rpc, MODEL, clock=clock, max_age_s=10.0, miss_refresh_s=2.0)
    await policy.check(hop(A))
    rpc.nodes[:] = [entry(A, 1, routable=False)]  # A is DOWN / left on chain
    clock.now += 5
    await policy.check(hop(A))  # fresh enough: still allowed from the cache
    clock.now += 6
    assert "not a routable" in await refused(policy, hop(A))
    assert len(rpc.paths) == 2


async def test_committee_unreachable_refuses_by_name_and_is_rate_limited(clock: Clock) -> None:
    rpc = FakeRpc([entry(A, 1)])
    rpc.fail = True
    policy = ForwardCommittee(0, rpc, MODEL, clock=clock, miss_refresh_s=2.0)
    assert "committee chain did not answer" in await refused(policy, hop(A))
    for _ in range(20):
        await refused(policy, hop(A))
    assert len(rpc.paths) == 1
    rpc.fail = False
    clock.now += 3
    await policy.check(hop(A))
    rpc.fail = True
    clock.now += 30  # stale view, RPC down: the last view still decides
    await policy.check(hop(A))


async def test_committee_slow_rpc_times_out_by_name(clock: Clock) -> None:
    class Hanging(FakeRpc):
        async def abci_query(self, path: str) -> Any:
            await asyncio.sleep(3600)

    policy = ForwardCommittee(0, Hanging([]), MODEL, timeout_s=0.05, clock=clock)
    assert "did not answer" in await refused(policy, hop(A))


def test_routable_hops_groups_shards_per_canonical_url() -> None:
    answer = {"nodes": [entry(A, 1), entry("HTTP://A.Nodes.Example.:18101/", 2), entry(B, -1)]}
    assert routable_hops(answer) == {A: frozenset({1, 2})}
    assert routable_hops(None) == {} and routable_hops({"nodes": "x"}) == {}


def test_build_policy_per_mode() -> None:
    assert isinstance(build_policy(NextHopSpec(), 0), ForwardNone)
    assert isinstance(build_policy(NextHopSpec("any"), 0), ForwardAny)
    assert isinstance(build_policy(NextHopSpec("list", frozenset({A})), 0), ForwardList)
    assert isinstance(
        build_policy(NextHopSpec("committee"), 0, source=FakeRpc([]), model_hash=MODEL),
        ForwardCommittee,
    )
    with pytest.raises(UsageError, match="committee"):
        build_policy(NextHopSpec("committee"), 0)


# ------------------------------------------------------------------------------ parse / CLI
def test_parse_next_hops_values() -> None:
    assert parse_next_hops("none") == NextHopSpec("none")
    assert parse_next_hops(" Committee ") == NextHopSpec("committee")
    assert parse_next_hops("any") == NextHopSpec("any")
    spec = parse_next_hops("HTTP://A.Nodes.Example.:18101/, http://b.nodes.example:18101,")
    assert spec == NextHopSpec("list", frozenset({A, B}))
    for bad in ("", ",", "all", "http://u@a:1", "10.0.0.1:18101", "http://a:1/v1/stream"):
        with pytest.raises(UsageError):
            parse_next_hops(bad)


def test_next_hops_file(tmp_path: Path) -> None:
    path = tmp_path / "hops.txt"
    path.write_text(f"# circuit 7\n{A}\n\n  {B}   # the second\n")
    assert read_next_hops_file(path) == NextHopSpec("list", frozenset({A, B}))
    path.write_text("http://a:1 http://b:2\n")
    with pytest.raises(UsageError):
        read_next_hops_file(path)
    with pytest.raises(UsageError, match="cannot read"):
        read_next_hops_file(tmp_path / "missing.txt")


def test_server_config_committee_needs_rpc() -> None:
    with pytest.raises(ConfigError, match="committee RPC"):
        ServerConfig(Path("m"), 0, next_hops=NextHopSpec("committee")).validate()
    ServerConfig(
        Path("m"), 0, next_hops=NextHopSpec("committee"), committee_rpc="http://a:1"
    ).validate()


def _serve(*flags: str) -> list[str]:
    return ["node", "serve", "--manifest", "/nonexistent/m.json", "--shard", "0", *flags]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--next-hops", "everything"], "--next-hops"),
        (["--next-hops", "http://user@10.0.0.1:18101"], "--next-hops"),
        (["--next-hops", "committee"], "--next-hops committee needs --committee-rpc"),
        (["--next-hops-file", "/nonexistent/hops.txt"], "cannot read --next-hops-file"),
    ],
)
def test_serve_bad_next_hops_is_error_and_hint(flags: list[str], says: str, capsys) -> None:
    assert cli.main(_serve(*flags)) == UsageError.exit_status
    err = capsys.readouterr().err
    assert f"error: {says}" in err and "hint:" in err and "Traceback" not in err


def test_serve_next_hops_and_file_are_exclusive(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(_serve("--next-hops", "any", "--next-hops-file", "x"))
    assert exited.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_serve_help_teaches_next_hops(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["node", "serve", "--help"])
    out = capsys.readouterr().out
    assert "--next-hops http://10.0.0.8:18101" in out and "--next-hops committee" in out


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[list[str], list[Any]]:
    """`planet node serve` argv for a manifest that exists, and the configs it would serve."""
    import node.server.run

    seen: list[ServerConfig] = []
    monkeypatch.setattr(node.server.run, "serve", lambda config, node_key=None: seen.append(config))
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    return ["node", "serve", "--manifest", str(manifest), "--shard", "0", "--plaintext-links"], seen


def test_serve_passes_the_spec_to_the_config(served: tuple[list[str], list[Any]]) -> None:
    argv, seen = served
    assert cli.main([*argv, "--next-hops", f"{A},{B}"]) == 0
    assert cli.main(argv) == 0
    assert seen[0].next_hops == NextHopSpec("list", frozenset({A, B}))
    assert seen[1].next_hops == NextHopSpec("none")


def test_join_starts_the_node_with_committee_next_hops(tmp_path: Path) -> None:
    from node.agent.launch import _next_hop_args

    assert _next_hop_args([], "http://127.0.0.1:18100") == []
    # a node at a public address dials public addresses only; one on loopback (the devnet) or a
    # private network serves that network, whose next hops are private too
    assert _next_hop_args(["http://a:26657"], "http://8.8.8.8:18100") == [
        "--next-hops",
        "committee",
    ]
    assert _next_hop_args(["http://a:26657"], "http://127.0.0.1:18100") == [
        "--next-hops",
        "committee",
        "--private-next-hops",
    ]


@pytest.mark.parametrize(
    ("spec", "rpc", "policy"),
    [
        (NextHopSpec(), None, ForwardNone),
        (NextHopSpec("list", frozenset({A})), None, ForwardList),
        (NextHopSpec("committee"), "http://127.0.0.1:1", ForwardCommittee),
        (NextHopSpec("any"), None, ForwardAny),
    ],
)
async def test_node_app_installs_its_policy_and_warns_on_any(
    aiohttp_server, caplog, spec, rpc, policy
) -> None:
    import logging

    from node.server.app import STATE_KEY, create_app
    from tests.doubles.fake_shard import FakeShard

    caplog.set_level(logging.INFO, logger="node.server.stream")
    config = ServerConfig(Path("m"), 0, next_hops=spec, committee_rpc=rpc)
    server = await aiohttp_server(create_app(config, FakeShard(shard_id=0, hidden_size=8)))
    installed = server.app[STATE_KEY].next_hops
    assert isinstance(installed, policy)
    if policy is ForwardCommittee:
        assert installed.model_hash == "sha256:" + "0" * 64  # the node's own model
    warned = [r for r in caplog.records if r.levelname == "WARNING" and "ANY URL" in r.message]
    assert bool(warned) == (policy is ForwardAny)


# ------------------------------------------------------------------------------ public addresses
@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("1.1.1.1", True),
        ("2001:4860:4860::8888", True),
        ("::ffff:8.8.8.8", True),
        ("127.0.0.1", False),
        ("127.255.0.9", False),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # carrier-grade NAT
        ("192.0.2.1", False),  # documentation
        ("224.0.0.1", False),
        ("255.255.255.255", False),
        ("::1", False),
        ("::", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("ff02::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped loopback
        ("::ffff:10.0.0.1", False),
        ("2002:7f00:1::1", False),  # 6to4 carrying 127.0.0.1
        ("64:ff9b::7f00:1", False),  # NAT64 carrying 127.0.0.1
        ("64:ff9b::a00:1", False),  # NAT64 carrying 10.0.0.1
        ("localhost", False),
        ("", False),
    ],
)
def test_is_public_address(address: str, public: bool) -> None:
    assert is_public_address(address) is public


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:6379",
        "http://10.0.0.7:18101",
        "http://169.254.169.254:80",
        "http://[::1]:18101",
        "http://[::ffff:127.0.0.1]:18101",
        "http://[fe80::1]:18101",
        "http://0.0.0.0:18101",
    ],
)
async def test_committee_refuses_a_registered_non_public_literal_unless_private(
    clock: Clock, url: str
) -> None:
    url = canonical_url(url)  # as NextHop.url arrives from the parser
    rpc = FakeRpc([entry(url, 1)])  # registered and routable: a staked stranger's choice
    public = ForwardCommittee(0, rpc, MODEL, clock=clock)
    assert "not a public address" in await refused(public, hop(url, 1))
    assert "--private-next-hops" in await refused(public, hop(url, 1))
    await ForwardCommittee(0, rpc, MODEL, public_only=False, clock=clock).check(hop(url, 1))


async def test_committee_public_literal_and_names_pass_the_address_rule(clock: Clock) -> None:
    rpc = FakeRpc([entry("http://8.8.8.8:18101", 1), entry(A, 1)])
    policy = ForwardCommittee(0, rpc, MODEL, clock=clock)
    await policy.check(hop("http://8.8.8.8:18101", 1))
    await policy.check(hop(A, 1))  # a name: PublicResolver decides where it is resolved


def test_build_policy_committee_is_public_only_unless_private() -> None:
    source = FakeRpc([])
    default = build_policy(NextHopSpec("committee"), 0, source=source, model_hash=MODEL)
    private = build_policy(
        NextHopSpec("committee", private=True), 0, source=source, model_hash=MODEL
    )
    assert isinstance(default, ForwardCommittee) and default.public_only
    assert isinstance(private, ForwardCommittee) and not private.public_only
    assert NextHopSpec("committee").public_only and not NextHopSpec("any").public_only


class FakeResolver(AbstractResolver):
    def __init__(self, hosts: list[str]) -> None:
        self.hosts = hosts

    async def resolve(self, host: str, port: int = 0, family: Any = 0) -> list[Any]:
        return [
            {"hostname": host, "host": h, "port": port, "family": 0, "proto": 0, "flags": 0}
            for h in self.hosts
        ]

    async def close(self) -> None:
        pass


async def test_public_resolver_keeps_only_public_answers() -> None:
    mixed = PublicResolver(FakeResolver(["10.0.0.1", "8.8.8.8", "::1", "2001:4860::1"]))
    assert [a["host"] for a in await mixed.resolve("n.example", 80)] == ["8.8.8.8", "2001:4860::1"]
    inner = PublicResolver(FakeResolver(["127.0.0.1", "169.254.169.254"]))
    with pytest.raises(NonPublicAddressError, match="no public address"):
        await inner.resolve("rebind.example", 80)


async def test_a_public_only_connector_never_connects_to_a_name_resolving_to_loopback() -> None:
    """The real connector path: `localhost` resolves to loopback, so the dial fails before any
    byte leaves and the listening socket sees no connection."""
    import socket

    import aiohttp

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        connector = aiohttp.TCPConnector(resolver=PublicResolver())
        async with aiohttp.ClientSession(connector=connector) as http:
            with pytest.raises(aiohttp.ClientConnectorError):
                await http.ws_connect(f"http://localhost:{port}/v1/stream")
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


def test_serve_private_next_hops_only_with_committee(
    served: tuple[list[str], list[Any]], capsys
) -> None:
    argv, seen = served
    rpc = ["--committee-rpc", "http://127.0.0.1:26657"]
    assert cli.main([*argv, *rpc]) == 0
    assert cli.main([*argv, *rpc, "--private-next-hops"]) == 0
    assert seen[0].next_hops == NextHopSpec("committee")
    assert seen[1].next_hops == NextHopSpec("committee", private=True)
    assert cli.main([*argv, "--next-hops", A, "--private-next-hops"]) == UsageError.exit_status
    err = capsys.readouterr().err
    assert "error: --private-next-hops only applies to the committee policy" in err
    assert "hint:" in err


@pytest.mark.parametrize(("private", "dialled"), [(False, False), (True, True)])
async def test_committee_node_dials_a_name_only_if_it_resolves_public(
    aiohttp_server, private: bool, dialled: bool
) -> None:
    """The node's own downstream links: under `committee` a registered NAME that resolves to
    loopback (`localhost`) is never connected to; with --private-next-hops it is. (An http://
    name is not a loopback literal: the node runs in local mode, --plaintext-links, to dial it.)"""
    from node.server.app import STATE_KEY, create_app
    from protocol.stream import DownstreamError
    from tests.doubles.fake_shard import FakeShard

    connections = 0

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()  # no WebSocket upgrade: dialled or not, no link comes of it

    canary = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    url = f"http://localhost:{canary.sockets[0].getsockname()[1]}"
    spec = NextHopSpec("committee", private=private)
    config = ServerConfig(
        Path("m"), 0, next_hops=spec, committee_rpc="http://127.0.0.1:1", plaintext_links=True
    )
    server = await aiohttp_server(create_app(config, FakeShard(shard_id=0, hidden_size=8)))
    try:
        with pytest.raises(DownstreamError, match="cannot reach next hop"):
            await server.app[STATE_KEY].links.get(url)
        await asyncio.sleep(0.05)
        assert (connections > 0) is dialled  # aiohttp may try more than once
    finally:
        canary.close()
        await canary.wait_closed()


def test_routable_hops_take_graced_nodes_and_no_other_unroutable_one() -> None:
    """A node DOWN lately but otherwise routable (`grace`, abci_app/liveness.py) stays a next
    hop this node dials: the client routes through it only while it answers."""
    graced = {**entry(A, 1), "routable": False, "grace": True}
    down = {**entry(B, 1), "routable": False, "grace": False}
    lying = {**entry("http://c.nodes.example:18101", 1), "routable": False, "grace": "true"}
    assert routable_hops({"nodes": [graced, down, lying]}) == {A: frozenset({1})}
