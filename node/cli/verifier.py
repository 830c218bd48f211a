"""`planet verifier serve`: a validator operator's verifier (challenges → reputation scores)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from node.config import resolve_config
from node.procs import run_service
from protocol.errors import ConfigError, UsageError
from protocol.frames.dtypes import WIRE_DTYPE, WIRE_DTYPES

EXAMPLES = """\
examples:
  planet verifier serve --home ~/.cache/planet/devnet/committee/node0 \\
      --manifest ~/.cache/planet/models/smollm2-135m-3p-int8/manifest.json \\
      --gateway http://127.0.0.1:8000 --deployment deployment.json \\
      --wallet verifier-wallet.json --password-file pw.txt
  planet verifier serve ... --committee-rpc http://127.0.0.1:27001 --challenges-per-epoch 8
  planet gateway serve --personal --route uniform --port 8001   # your own client, then:
  planet verifier serve ... --personal-client http://127.0.0.1:8001   # reaches charging nodes
  planet verifier serve ... --findings-listen 0.0.0.0:8700 \\
      --findings-url http://203.0.113.7:8700        # hand failed checks to the other verifiers
what it does each committee epoch: commits a secret seed for the next epoch and reveals the
last one; asks its challenges through the gateway like a paying user (echo + logprobs), or
through your own personal client, paying nodes that charge with your credits; scores
them against its own copy of the registered model; writes <home>/reputation_scores.json for the
validator's vote extension; votes verdicts on nodes the committee has agreed are failing;
spot-checks the nodes' committed work and serves its failed checks (the node's own signed
tickets, sealed to each peer) at --findings-listen, so a node that withholds its tickets from
the other verifiers is convicted all the same.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verifier",
        help="run a validator's verifier",
        description="Run a validator operator's verifier (teacher-forced challenges).",
    )
    sub = parser.add_subparsers(dest="verifier_command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="challenge the network each epoch and write the validator's reputation scores",
        description="Challenge compute nodes through the gateway each committee epoch, score "
        "them teacher-forced against the registered model and write the validator's scores.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--home", type=Path, required=True, help="the validator's CometBFT home directory"
    )
    serve.add_argument(
        "--manifest", type=Path, required=True, help="the registered model's manifest.json"
    )
    asks = serve.add_mutually_exclusive_group(required=True)
    asks.add_argument(
        "--gateway", help="ask through this hosted gateway (OpenAI API; reaches free nodes only)"
    )
    asks.add_argument(
        "--personal-client",
        metavar="URL",
        help="ask through your own personal client instead (`planet gateway serve --personal "
        "--route uniform` with credits you bought): its circuits take nodes that charge "
        "credits too",
    )
    serve.add_argument(
        "--personal-token-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="with --personal-client: the token file that client keeps (its --token-file; "
        "default $PLANET_PERSONAL_TOKEN_FILE, else $PLANET_HOME/personal-token)",
    )
    serve.add_argument("--deployment", type=Path, required=True, help="contract deployment JSON")
    serve.add_argument(
        "--evm-rpc", default=None, help="EVM RPC (else $PLANET_EVM_RPC, config.toml, :8545)"
    )
    serve.add_argument(
        "--committee-rpc",
        action="append",
        default=None,
        help="a validator's CometBFT RPC, repeatable (else $PLANET_COMMITTEE_RPC, :26657)",
    )
    serve.add_argument(
        "--wallet", type=Path, required=True, help="the verifier's paying wallet (keystore)"
    )
    serve.add_argument(
        "--password-file",
        type=Path,
        default=None,
        help="wallet password file (else $PLANET_PASSWORD_FILE, config.toml, $PLANET_PASSWORD)",
    )
    serve.add_argument(
        "--operator-key",
        type=Path,
        default=None,
        help="the validator's operator keystore (empty password) that signs verdicts "
        "(default <home>/config/operator_key.json when present; none: no verdict votes)",
    )
    serve.add_argument(
        "--challenges-per-epoch",
        type=int,
        default=4,
        help="challenges per epoch (default 4; 0: none — the verifier only spot-checks the "
        "nodes' committed work and serves its findings, with --sampled-per-epoch 0)",
    )
    serve.add_argument("--prompt-tokens", type=int, default=32, help="default 32")
    serve.add_argument("--continuation-tokens", type=int, default=64, help="default 64")
    serve.add_argument(
        "--verdict-after",
        type=int,
        default=1,
        help="agreed epochs below tau in a row before a verdict vote (default 1)",
    )
    serve.add_argument(
        "--spot-check-ppm",
        type=int,
        default=50_000,
        metavar="PPM",
        help="spot-check selection rate, as the nodes use it (default 50000 = 5 %%; 0: none)",
    )
    serve.add_argument(
        "--challenge-source",
        choices=("generated", "corpus"),
        default="generated",
        help="where challenge text comes from: written by the reference model from the "
        "committed secret seed (default; secret until the seed is revealed, ~70 ms of CPU per "
        "token here), or windows of the public held-out text (cheap, a node can index it)",
    )
    serve.add_argument(
        "--sampled-per-epoch",
        type=int,
        default=1,
        help="sampled completions per epoch checked by replaying their seed (default 1; 0: none)",
    )
    serve.add_argument(
        "--sampled-tokens", type=int, default=32, help="tokens per sampled check (default 32)"
    )
    serve.add_argument(
        "--hop-probes-per-epoch",
        type=int,
        default=2,
        metavar="N",
        help="nodes timed alone per epoch for their speed: the verifier feeds each, as the last "
        "hop, inputs it computed with its own shards and times its answers (default 2; 0: none)",
    )
    serve.add_argument(
        "--hop-sessions",
        type=int,
        default=16,
        metavar="N",
        help="sessions a node is timed with at most: 4 at first, doubled while the time per "
        "position still drops (default 16; 4: one probe of 4, the least CPU)",
    )
    serve.add_argument(
        "--hop-positions",
        type=int,
        default=8,
        metavar="N",
        help="positions each timed session steps (default 8)",
    )
    serve.add_argument(
        "--credits",
        type=Path,
        default=None,
        metavar="FILE",
        help="your credit wallet (the one your personal client spends): pays the nodes that "
        "charge for the positions they compute when timed alone (default none: charging nodes "
        "are not timed alone)",
    )
    serve.add_argument(
        "--wire-dtype",
        choices=WIRE_DTYPES,
        default=WIRE_DTYPE,
        help="the wire dtype of the gateway you ask through (its --wire-dtype; default "
        "float16, as every client's): the reference rounds its activations at the shard "
        "boundaries the same way, else an honest circuit's sampled tokens mismatch",
    )
    serve.add_argument(
        "--ticket-deadline",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="a node that sends no valid ticket by then is voted for a timeout (default 30)",
    )
    serve.add_argument(
        "--threads",
        type=int,
        default=0,
        metavar="N",
        help="torch intra-op threads of the reference and spot-check passes (default 0: half "
        "the cores, 1 to 4, as `planet node serve`; torch's own default, every core, burned ~3x "
        "the CPU on a box the verifier shares with nodes, each op waiting for a descheduled "
        "thread)",
    )
    serve.add_argument(
        "--findings-listen",
        metavar="HOST:PORT",
        help="serve this verifier's failed spot checks to the other verifiers here, and publish "
        "the URL on the committee chain (default: not served; peers then cannot convict a node "
        "that withholds its tickets from them)",
    )
    serve.add_argument(
        "--findings-url",
        metavar="URL",
        help="the URL peers reach --findings-listen at (default http://HOST:PORT; required when "
        "HOST is 0.0.0.0 or ::)",
    )
    serve.add_argument(
        "--private-peers",
        metavar="CIDR[,CIDR]",
        help="also fetch peers' findings from, and time nodes alone at, these private ranges, IP "
        "addresses only (a devnet: 127.0.0.0/8; default: public addresses only)",
    )
    serve.set_defaults(handler=_serve)
    parser.set_defaults(help_parser=parser)


def _serve(args: argparse.Namespace) -> int:
    # lazy: the verifier's runtime (torch, aiohttp, the web3 stack)
    from node.keys import PasswordSource, operator_key_path, read_operator_key
    from node.server.run import configure_torch_threads
    from node.verifier.hop_probe import FIRST_SESSIONS
    from node.verifier.hop_schedule import HopSettings
    from node.verifier.service import VerifierConfig, serve
    from node.verifier.worker import WorkerSettings

    if args.challenges_per_epoch < 0:
        raise UsageError(
            "--challenges-per-epoch must be at least 0", hint="see planet verifier serve -h"
        )
    if args.challenges_per_epoch == 0 and args.sampled_per_epoch > 0:
        raise UsageError(
            "--challenges-per-epoch 0 leaves no prompts for --sampled-per-epoch",
            hint="add --sampled-per-epoch 0 (spot checks only), or ask 1 challenge or more",
        )
    for name in ("prompt_tokens", "continuation_tokens", "verdict_after"):
        if getattr(args, name) < 1:
            raise UsageError(
                f"--{name.replace('_', '-')} must be at least 1",
                hint="see planet verifier serve -h",
            )
    if args.sampled_per_epoch < 0 or not 1 <= args.sampled_tokens <= 4096:
        raise UsageError(
            "--sampled-per-epoch must be ≥ 0 and --sampled-tokens 1 … 4096", hint="e.g. 1 and 32"
        )
    if not 0 <= args.spot_check_ppm <= 1_000_000:
        raise UsageError("--spot-check-ppm must be 0 … 1000000", hint="e.g. 50000 (5 %)")
    if not 1 <= args.ticket_deadline <= 3600:
        raise UsageError("--ticket-deadline must be 1 … 3600 seconds", hint="e.g. 30")
    hops = HopSettings(
        per_epoch=args.hop_probes_per_epoch,
        sessions=min(FIRST_SESSIONS, args.hop_sessions),
        most_sessions=args.hop_sessions,
        positions=args.hop_positions,
    )
    problem = hops.problem()
    if problem is not None:
        raise UsageError(
            f"--hop-probes-per-epoch/--hop-sessions/--hop-positions: {problem}",
            hint="e.g. --hop-probes-per-epoch 2 --hop-sessions 16 --hop-positions 8",
        )
    if args.credits is not None and not args.credits.exists():
        raise UsageError(
            f"no credit wallet at {args.credits}",
            hint="the file `planet credits buy` fills (your personal client's --credits)",
        )
    if not 0 <= args.threads <= 256:
        raise UsageError("--threads must be 0 … 256", hint="0: half the cores, 1 to 4")
    for flag, url in (("--gateway", args.gateway), ("--personal-client", args.personal_client)):
        if url is not None and not url.startswith(("http://", "https://")):
            raise UsageError(
                f"{flag} must be an http(s) URL, got {url!r}",
                hint="e.g. http://127.0.0.1:8000 (a hosted gateway) or http://127.0.0.1:8001 "
                "(your `planet gateway serve --personal`)",
            )
    personal_token = _personal_token(args)
    if not (args.home / "config" / "priv_validator_key.json").exists():
        raise UsageError(
            f"{args.home} is not a validator home (no config/priv_validator_key.json)",
            hint="pass the validator's CometBFT home, e.g. <devnet>/committee/node0",
        )
    for path, what in ((args.manifest, "manifest"), (args.deployment, "deployment")):
        if not path.exists():
            raise UsageError(
                f"no {what} at {path}",
                hint="the registered model's manifest (planet model prepare) and the deployment "
                "file of the network (e.g. <devnet>/deployment.json)",
            )
    findings_listen, findings_url, private_peers = _findings_options(args)
    operator_path = args.operator_key or operator_key_path(args.home)
    operator_key = None
    if operator_path.exists():
        try:
            operator_key = read_operator_key(operator_path)
        except ConfigError as error:
            raise UsageError(
                error.message,
                hint="an eth-account keystore with an empty password (planet committee init)",
            ) from None
    elif args.operator_key is not None:
        raise UsageError(
            f"no operator key at {args.operator_key}",
            hint="omit --operator-key to run without verdict votes",
        )
    chains = resolve_config(
        {
            "evm_rpc": args.evm_rpc,
            "committee_rpc": args.committee_rpc[0] if args.committee_rpc else None,
            "password_file": args.password_file.resolve() if args.password_file else None,
        }
    )
    rpcs = tuple(args.committee_rpc or [chains.committee_rpc])
    password = PasswordSource(file=chains.password_file).read(confirm=not args.wallet.exists())
    config = VerifierConfig(
        settings=WorkerSettings(
            home=args.home,
            challenges_per_epoch=args.challenges_per_epoch,
            prompt_tokens=args.prompt_tokens,
            continuation_tokens=args.continuation_tokens,
            verdict_after=args.verdict_after,
            operator_key=operator_key,
            spot_check_ppm=args.spot_check_ppm,
            ticket_deadline_s=args.ticket_deadline,
            challenge_source=args.challenge_source,
            sampled_per_epoch=args.sampled_per_epoch,
            sampled_tokens=args.sampled_tokens,
            hops=hops,
        ),
        manifest=args.manifest,
        wire_dtype=args.wire_dtype,
        gateway_url=args.personal_client or args.gateway,
        personal=args.personal_client is not None,
        personal_token=personal_token,
        committee_rpc=rpcs,
        evm_rpc=chains.evm_rpc,
        deployment=args.deployment,
        wallet=args.wallet,
        password=password,
        findings_listen=findings_listen,
        findings_url=findings_url,
        private_peers=private_peers,
        credits=args.credits,
    )
    # before the reference loads: every torch pass of this process (its worker threads too)
    configure_torch_threads(args.threads)
    # a service: its own progress (epochs, challenges, verdicts) at INFO even without -v
    logging.getLogger("node.verifier").setLevel(logging.INFO)
    level = os.environ.get("PLANET_LOG_LEVEL", "INFO")
    return run_service(lambda: serve(config), log_level=level, log=logging.getLogger("verifier"))


def _findings_options(
    args: argparse.Namespace,
) -> tuple[tuple[str, int] | None, str | None, tuple[Any, ...] | None]:
    """(--findings-listen as (host, port), --findings-url canonical, --private-peers ranges)."""
    from node.server.next_hops import parse_ranges
    from protocol.urls import BadUrlError, canonical_url

    ranges = parse_ranges(args.private_peers, "--private-peers") if args.private_peers else None
    if args.findings_listen is None:
        if args.findings_url is not None:
            raise UsageError(
                "--findings-url needs --findings-listen", hint="e.g. --findings-listen 0.0.0.0:8700"
            )
        return None, None, ranges
    host, _, port_text = args.findings_listen.rpartition(":")
    host = host.strip("[]")
    if not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise UsageError(
            f"--findings-listen must be HOST:PORT, got {args.findings_listen!r}",
            hint="e.g. 127.0.0.1:8700 or 0.0.0.0:8700",
        )
    url = args.findings_url
    if url is None:
        if host in ("0.0.0.0", "::"):
            raise UsageError(
                f"--findings-listen {args.findings_listen} names no address peers can reach",
                hint="add --findings-url http://<your public address>:" + port_text,
            )
        url = f"http://[{host}]:{port_text}" if ":" in host else f"http://{host}:{port_text}"
    try:
        url = canonical_url(url)
    except BadUrlError as error:
        raise UsageError(
            f"--findings-url: {error.message}", hint="e.g. http://203.0.113.7:8700"
        ) from None
    return (host, int(port_text)), url, ranges


def _personal_token(args: argparse.Namespace) -> str:
    """The personal client's bearer token ("" when asking a hosted gateway)."""
    from node.gateway.personal_token import default_token_file, read_token

    if args.personal_client is None:
        if args.personal_token_file is not None:
            raise UsageError(
                "--personal-token-file goes with --personal-client",
                hint="a hosted gateway is paid per question; drop the flag",
            )
        return ""
    path = default_token_file(args.personal_token_file)
    try:
        return read_token(path)
    except FileNotFoundError:
        raise UsageError(
            f"no personal client token at {path}",
            hint="start the personal client first (planet gateway serve --personal writes it), "
            "or pass its --token-file as --personal-token-file",
        ) from None
    except ConfigError as error:
        raise UsageError(error.message, hint=error.hint) from None
