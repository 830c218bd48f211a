"""`planet devnet up | status | fund | exec | down`: the whole network on this machine.

`up` starts anvil, deploys the contracts, registers the default model, starts a CometBFT
committee with its apps and stake watchers, stakes and joins compute nodes with the same
`planet stake` / `planet join` an operator types, and starts the gateway. With --hosts every
process runs in its own network namespace ("host", own address, links with real latency);
the operator commands then run inside a host: `planet devnet exec HOST -- planet …`. Without
--detach it stays in the foreground until Ctrl-C, then tears everything down.

Every operator command (`stake`, `join`, `status`, `leave`, `earnings`, `claim`, `balance`,
`ask`) finds the running devnet by itself: $PLANET_DEVNET, else $PLANET_HOME/devnet.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from node.config import default_home
from protocol.errors import UsageError

EXAMPLES = """\
examples:
  planet devnet up --detach                 4 validators, 2 compute nodes on each of 3 shards
                                            (1 where memory is short: it says), gateway
  planet devnet up --detach --replicas 1    one node per shard (less memory, no spare)
  planet devnet up --validators 1 --nodes 3 the smallest committee, stays in the foreground
  planet devnet up --detach --nodes 3 --cheat-node substitute-skip:2
                                            a 4th node that cheats (a test double): watch the
                                            verifiers make it unroutable and slash it
  planet devnet status --json
  planet devnet down

a new operator on the running devnet (each command finds it by itself):
  planet stake --role compute --amount 1    creates your wallet; says how to fund it
  planet devnet fund 0xYOUR_ADDRESS 10      anvil's dev account sends 10 ETH
  planet stake --role compute --amount 1
  planet join --model smollm2-135m-3p-int8 --shard 0
  planet status                             routable yes; later `planet earnings`, `claim`
  planet leave

many hosts on one machine (as root: network namespaces; links through toxiproxy):
  sudo -E env PATH="$PATH" planet devnet up --hosts --detach            region latency matrix
  planet devnet up --hosts --link-ms 50 --detach                        every link 50 ms
  planet devnet exec user -- planet ask --pay "What is a black hole?"   ask from the user host
  planet devnet exec operator0 -- planet stake --role compute --amount 1
  planet devnet exec operator0 -- planet join --model smollm2-135m-3p-int8 --shard 0
  planet devnet down                        also removes the hosts; after a crash:
  python -m deploy.netlab down              removes what a dead run left
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "devnet",
        help="the whole network on this machine (anvil, committee, nodes, gateway)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="devnet_command", metavar="COMMAND")
    up = sub.add_parser(
        "up",
        help="start everything",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("--validators", type=int, default=4, help="committee size (default 4)")
    up.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="N",
        help="compute nodes per shard of the model's 3 (default: 2, the replica floor, where "
        "the available memory holds them, else 1, and `up` says why)",
    )
    up.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="compute nodes in all instead (1-9; fewer than 3: that many shards)",
    )
    up.add_argument(
        "--quant",
        choices=("none", "int8", "int4"),
        default="int8",
        help="shard weights (default int8)",
    )
    up.add_argument("--detach", action="store_true", help="return once everything is up")
    up.add_argument("--no-gateway", action="store_true", help="do not start the gateway")
    up.add_argument(
        "--one-model",
        action="store_true",
        help="register and serve the default model only (by default a second model, the "
        "1-part int8 set, is served by a seat in node0's process: docs/network.md)",
    )
    up.add_argument(
        "--epoch-length",
        type=int,
        default=20,
        help="committee blocks per settlement epoch (default 20, about 10 s)",
    )
    up.add_argument(
        "--verifiers",
        type=int,
        default=None,
        metavar="N",
        help="run `planet verifier serve` for the first N validators (default: every validator, "
        "so their reports reach the 2/3 that reputation and verdicts need; each loads its own "
        "copy of the model; 0: none)",
    )
    up.add_argument(
        "--verifier-challenges",
        type=int,
        default=None,
        metavar="N",
        help="each verifier's challenges per epoch (default: the verifier's 4; 0: none — the "
        "verifiers only spot-check and serve their findings, an idle devnet's CPU spared)",
    )
    up.add_argument(
        "--cheat-node",
        action="append",
        default=[],
        metavar="MODE",
        help="also join a node that cheats, for demos and tests of verification (repeatable): "
        "substitute-skip:N, noise:R:K[:withhold] (withhold: its tickets only to the assigned "
        "verifier), silent (serves, commits nothing), … — the node is the "
        "test double tests/doubles/cheating_node.py, joined by tests/doubles/cheating_join.py",
    )
    up.add_argument(
        "--credit-positions",
        type=int,
        default=None,
        metavar="N",
        help="what each compute node charges: a bearer credit per N positions, registered on "
        "the committee chain by its agent and paid by the gateway from credits it buys as it "
        "runs low (default 64; 0: free nodes)",
    )
    up.add_argument(
        "--gateway-node-cooldown-s",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long the gateway leaves out a node that failed a question (its "
        "`--node-cooldown-s`; default: the gateway's 30 s); with one node per shard a shard "
        "goes unserved that long",
    )
    up.add_argument("--home", type=Path, help="PLANET_HOME (default $PLANET_HOME)")
    hosts = up.add_argument_group(
        "many hosts (--hosts: root, or CAP_NET_ADMIN + CAP_SYS_ADMIN; docs/network.md)"
    )
    hosts.add_argument(
        "--hosts",
        action="store_true",
        help="run anvil, every validator, every compute node, the gateway and a `user` host "
        "each in its own network namespace with its own address (10.77.0.0/24), links shaped "
        "(default: the region latency matrix deploy/netlab/regions.csv)",
    )
    hosts.add_argument(
        "--link-ms",
        type=int,
        metavar="MS",
        help="every link this one-way delay (jitter 5 %%), instead of the matrix; 0: unshaped",
    )
    hosts.add_argument(
        "--latency-matrix",
        type=Path,
        metavar="CSV",
        help="one-way delays between regions (deploy/netlab/regions.csv's format); the hosts "
        "are placed in its regions in turn",
    )
    hosts.add_argument(
        "--link-kbps",
        type=int,
        metavar="KB_S",
        help="bandwidth of every connection, each way, in 1000 bytes/s (default unlimited)",
    )
    hosts.add_argument(
        "--operator-hosts",
        type=int,
        default=1,
        metavar="N",
        help="empty hosts operator0… for new operators (default 1; ports 18100-18103 open)",
    )
    hosts.add_argument(
        "--relay-hosts",
        type=int,
        default=0,
        metavar="N",
        help="empty hosts relay0… for relays (`planet relay serve --port 9100`, "
        "--rendezvous-ports 9200-9203; default 0)",
    )
    hosts.add_argument(
        "--nat-hosts",
        type=int,
        default=0,
        metavar="N",
        help="hosts nat0… behind NAT, each on a private LAN behind its router router0…, "
        "which masquerades it and lets nothing in (needs iptables; default 0)",
    )
    up.set_defaults(handler=_up)
    status = sub.add_parser(
        "status",
        help="what runs, hosts, accounts, routable nodes, pool",
        description="What of the devnet runs: anvil, validators (height, watcher), the nodes "
        "the committee lists (routable or not), pool health, the gateway; the funded accounts "
        "(the devnet's own and every address `planet devnet fund` funded) and, with --hosts, "
        "every host's address and namespace.",
    )
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument("--home", type=Path, help="PLANET_HOME (default $PLANET_HOME)")
    status.set_defaults(handler=_status)
    fund = sub.add_parser(
        "fund",
        help="send ETH from anvil's dev account to an address (devnet chains only)",
        description="Send ETH from anvil's funded dev account to ADDRESS, on the running "
        "devnet's chain (refused on any chain that is not a devnet's anvil).",
        epilog="examples:\n  planet devnet fund 0x5B38Da6a701c568545dCfcB03FcB875f56beddC4 10\n"
        "  planet devnet fund 0x5B38Da6a701c568545dCfcB03FcB875f56beddC4        (10 ETH)\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fund.add_argument("address", help="the EVM address to fund (0x…)")
    fund.add_argument("eth", nargs="?", default="10", help="ETH to send (default 10)")
    fund.add_argument("--evm-rpc", help="another devnet RPC (default: the running devnet's)")
    fund.add_argument("--json", action="store_true", help="print one JSON object")
    fund.add_argument("--home", type=Path, help="PLANET_HOME (default $PLANET_HOME)")
    fund.set_defaults(handler=_fund)
    run = sub.add_parser(
        "exec",
        help="run a command inside one of the devnet's hosts (--hosts)",
        description="Run COMMAND inside HOST's network namespace (its address, its shaped "
        "links), with PLANET_DEVNET set so every `planet` command finds this devnet. Hosts: "
        "anvil, validator<i>, node<i>, gateway, user, operator<i> (`planet devnet status`).",
        epilog="examples:\n"
        "  planet devnet exec user -- planet ask --pay 'What is a black hole?'\n"
        "  planet devnet exec operator0 -- planet stake --role compute --amount 1\n"
        "  planet devnet exec operator0 -- bash          a shell on that host\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("host", help="a host of the devnet, e.g. operator0 or user")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    run.add_argument("--home", type=Path, help="PLANET_HOME (default $PLANET_HOME)")
    run.set_defaults(handler=_exec)
    down = sub.add_parser("down", help="stop everything, hosts included (idempotent)")
    down.add_argument("--home", type=Path, help="PLANET_HOME (default $PLANET_HOME)")
    down.set_defaults(handler=_down)
    parser.set_defaults(help_parser=parser)


def _home(args: argparse.Namespace) -> Path:
    return Path(args.home).expanduser() if args.home else default_home()


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _links(args: argparse.Namespace) -> Any:
    from deploy.devnet.plan import LinkPlan  # lazy: deploy.evm (the web3 stack)

    shaping = {"--link-ms": args.link_ms, "--latency-matrix": args.latency_matrix}
    shaping["--link-kbps"] = args.link_kbps
    given = [flag for flag, value in shaping.items() if value is not None]
    if not args.hosts:
        counts = {"--operator-hosts": args.operator_hosts != 1}
        counts |= {"--relay-hosts": args.relay_hosts != 0, "--nat-hosts": args.nat_hosts != 0}
        given += [flag for flag, differs in counts.items() if differs]
        if given:
            raise UsageError(
                f"{given[0]} shapes the hosts' links; it needs --hosts",
                hint="planet devnet up --hosts --link-ms 50",
            )
        return None
    if args.link_ms is not None and args.latency_matrix is not None:
        raise UsageError(
            "--link-ms and --latency-matrix are two ways to shape the links; pick one",
            hint="--link-ms 50 (every link), or --latency-matrix regions.csv",
        )
    if args.link_ms is not None and not 0 <= args.link_ms <= 10_000:
        raise UsageError(f"--link-ms must be 0..10000 (got {args.link_ms})")
    if args.link_kbps is not None and args.link_kbps < 1:
        raise UsageError(f"--link-kbps must be at least 1 (got {args.link_kbps})")
    if args.latency_matrix is not None and not args.latency_matrix.is_file():
        raise UsageError(
            f"--latency-matrix {args.latency_matrix}: no such file",
            hint="a CSV like deploy/netlab/regions.csv",
        )
    return LinkPlan(args.link_ms, args.latency_matrix, args.link_kbps)


def _up(args: argparse.Namespace) -> int:
    # lazy: the web3 stack, aiohttp (deploy.devnet starts and talks to everything)
    from deploy.devnet.down import down
    from deploy.devnet.plan import DevnetOptions
    from deploy.devnet.replicas import available_memory, node_count
    from deploy.devnet.up import up

    if args.verifiers is not None and not 0 <= args.verifiers <= args.validators:
        raise UsageError(
            f"--verifiers must be 0 to --validators ({args.validators}), got {args.verifiers}",
            hint="one verifier per validator at most",
        )
    if args.credit_positions is not None and not 0 <= args.credit_positions < 2**31:
        raise UsageError(
            f"--credit-positions must be 0 (free) or a positive count, got {args.credit_positions}"
        )
    if args.cheat_node and args.no_gateway:
        raise UsageError(
            "--cheat-node needs the gateway", hint="the verifiers challenge through it"
        )
    if args.verifier_challenges is not None and not 0 <= args.verifier_challenges <= 64:
        raise UsageError(f"--verifier-challenges must be 0..64, got {args.verifier_challenges}")
    cooldown = args.gateway_node_cooldown_s
    if cooldown is not None and not 0 <= cooldown <= 3_600:
        raise UsageError(f"--gateway-node-cooldown-s must be 0..3600 seconds, got {cooldown:g}")
    count = node_count(
        nodes=args.nodes,
        replicas=args.replicas,
        validators=args.validators,
        verifiers=args.validators if args.verifiers is None else args.verifiers,
        gateway=not args.no_gateway,
        available=available_memory(),
        second_model=not args.one_model,  # its seat and client part count too
    )
    options = DevnetOptions(
        home=_home(args),
        validators=args.validators,
        nodes=count.nodes,
        nodes_note=count.note,
        quant=args.quant,
        gateway=not args.no_gateway,
        epoch_length=args.epoch_length,
        verifiers=args.verifiers,
        hosts=_links(args),
        operator_hosts=args.operator_hosts,
        relay_hosts=args.relay_hosts,
        nat_hosts=args.nat_hosts,
        cheat_nodes=tuple(args.cheat_node),
        credit_positions=args.credit_positions,
        gateway_node_cooldown_s=cooldown,
        verifier_challenges=args.verifier_challenges,
        second_model=not args.one_model,
    )
    state = up(options, _say)
    _summary(state)
    if args.detach:
        print("stop it with: planet devnet down")
        return 0
    print("running in the foreground; Ctrl-C stops everything")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    _say("stopping the devnet…")
    down(options.home, _say)
    return 0


def _summary(state: dict[str, Any]) -> None:
    print(f"devnet up in {state.get('startup_s')} s — run directory {state['dir']}")
    print(f"  EVM RPC        {state['evm_rpc']} (chain {state['chain_id']})")
    for index, url in enumerate(state.get("committee_rpc", [])):
        print(f"  validator{index}     {url}")
    print(f"  gateway        {state.get('gateway_url') or '(not started)'}")
    if state.get("gateway_credits"):
        print(f"  its credits    {state['gateway_credits']} (`planet credits show --credits-file`)")
    print(f"  model          {state['model_hash']} ({state['shards']} shards)")
    for path, model_hash in zip(
        state.get("more_manifests", []), state.get("more_model_hashes", []), strict=False
    ):
        name = Path(path).parent.name
        print(f"  model 2        {model_hash} ({name}, a seat of node0's process)")
    print(f"  deployment     {state['deployment']}")
    for name, address in sorted(state.get("contracts", {}).items()):
        print(f"  {name:<14} {address}")
    print(f"  password file  {state['password_file']} (dev keystores)")
    if state.get("nodes_file"):
        print(f"  nodes file     {state['nodes_file']}")
    _accounts(state)
    _hosts(state)


def _accounts(state: dict[str, Any]) -> None:
    from deploy.anvil import ANVIL_DEV_ADDRESS  # lazy: deploy

    print("  funded accounts (dev keys; `planet devnet fund ADDRESS [ETH]` funds yours):")
    print(f"  {'anvil dev':<14} {ANVIL_DEV_ADDRESS}  the deployer; sends `devnet fund`")
    for account in state.get("accounts", []):
        where = f"home {account['home']}" if account.get("home") else account.get("keystore")
        print(f"  {account['name']:<14} {account['address']}  {where or '(your own key)'}")


def _hosts(state: dict[str, Any]) -> None:
    lab = state.get("hosts")
    if not lab:
        return
    print(f"  hosts          {lab.get('network')} ({lab.get('links')}), run {lab.get('run_id')}")
    regions = lab.get("regions") or {}
    for name, host in lab.get("hosts", {}).items():
        region = f"  {regions[name]}" if name in regions else ""
        print(f"    {name:<12} {host['address']:<12} netns {host['netns']}{region}")
    print("  commands run inside a host: planet devnet exec user -- planet ask --pay '…'")


def _status(args: argparse.Namespace) -> int:
    from deploy.devnet.status import status  # lazy: the web3 stack, aiohttp

    report = status(_home(args))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    if report.get("status") == "absent":
        print("no devnet (start one with `planet devnet up`)")
        return 0
    print(
        f"devnet {report['status']} ({'running' if report['running'] else 'nothing runs'}) "
        f"— {report['dir']}"
    )
    if report.get("hosts_alive") is False:
        print("  its hosts are gone (keeper exited): `planet devnet down` cleans up")
        return 0
    anvil = (report.get("processes") or {}).get("anvil")
    print(f"  anvil {report.get('evm_rpc')}: {'up' if anvil else 'DOWN'}")
    for row in report.get("validators", []):
        alive = row.get("cometbft_alive") and row.get("app_alive")
        watcher = "watcher up" if row.get("watcher_alive") else "watcher DOWN"
        print(
            f"  validator{row['validator']} {row['rpc']}: "
            f"{'height ' + str(row.get('height')) if alive else 'DOWN'}, {watcher}"
        )
    for node in report.get("nodes", []):
        print(
            f"  node {node['key'][:12]}… shard {node['shards']} {node['endpoint']}: "
            f"{node['status']}, reputation {_reputation(node)}, routable {node['routable']}"
        )
    pool = report.get("pool")
    if pool:
        print(f"  pool {pool.get('status')}: routable per shard {pool.get('routable_per_shard')}")
        short = pool.get("below_floor")
        if isinstance(short, list) and short:  # the committee's answer: shown, never trusted
            shards = ", ".join(str(s) for s in short[:16] if type(s) is int)
            print(
                f"  below the replica floor of {pool.get('replica_floor')}: shard {shards} "
                "(the next `planet join --model M` fills it)"
            )
    if report.get("gateway_url"):
        print(
            f"  gateway {report['gateway_url']}: "
            f"{'healthy' if report.get('gateway_healthy') else 'NOT ANSWERING'}"
        )
    for row in report.get("verifiers", []):
        url = row.get("findings_url")
        print(
            f"  verifier of validator{row['validator']}: {'up' if row.get('alive') else 'DOWN'}, "
            + (f"findings at {url}" if url else "findings URL not on chain yet")
        )
    _accounts(report)
    _hosts(report)
    return 0


def _fund(args: argparse.Namespace) -> int:
    from deploy.devnet.fund import fund, parse_address, parse_fund_amount  # lazy: deploy.evm

    wei = parse_fund_amount(args.eth)
    address = parse_address(args.address)
    result = fund(_home(args), address, wei, args.evm_rpc)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"sent {args.eth} ETH to {address} (tx {result['tx']}); balance now "
            f"{int(result['balance_wei']) / 10**18:g} ETH"
        )
    return 0


def _exec(args: argparse.Namespace) -> int:
    from deploy.devnet.hosts import exec_argv  # lazy: deploy.netlab
    from deploy.devnet.plan import devnet_dir, read_state
    from node.zygote.handoff import exec_or_fork

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    directory = devnet_dir(_home(args))
    state = read_state(directory)
    if state is None or state.get("status") != "up":
        raise UsageError(
            f"no devnet is up in {directory}",
            hint="planet devnet up --hosts --detach (as root), or pass --home",
        )
    argv, env = exec_argv(state, directory, args.host, command)
    exec_or_fork(argv, env)  # the exec, or the zygote's fork in its stead (the test lanes)


def _reputation(node: dict[str, Any]) -> str:
    """R as a decimal, with the flags that make a node unroutable."""
    value = node.get("reputation")
    text = f"{value / 1_000_000:.3f}" if isinstance(value, int) else "?"
    flags = [name for name in ("untrusted", "uncommitted") if node.get(name)]
    return text + (f" ({', '.join(flags)})" if flags else "")


def _down(args: argparse.Namespace) -> int:
    from deploy.devnet.down import down  # lazy: the web3 stack, aiohttp

    stopped = down(_home(args), _say)
    print(f"devnet stopped ({len(stopped)} parts)" if stopped else "no devnet was running")
    return 0
