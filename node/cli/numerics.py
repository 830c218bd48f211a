"""`planet node numerics`: the numerics version the committee holds for the node joined from this
home, and the command that changes it after a kernel upgrade (`set_numerics`,
abci_app/numerics.py; docs/network.md, *Numerics*)."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from node.cli import operator
from protocol.errors import PlanetError, UsageError
from protocol.numerics import MAX_NUMERICS, NUMERICS

# the committee's refusal codes of `set_numerics` (abci_app/codes.py)
UNKNOWN_NODE, WRONG_ROLE, INVALID_LIFECYCLE = 10, 13, 15
NUMERICS_NOT_ACCEPTED, NUMERICS_UNCHANGED, NUMERICS_TOO_SOON = 105, 107, 108

EXAMPLES = f"""\
examples:
  planet node numerics                 the version the chain holds for this node, and whether
                                       enough verifiers run it to check it
  planet node numerics --set           announce this release's numerics ({NUMERICS}) after upgrading
  planet node numerics --set 3         announce version 3
  planet node numerics --json

what a version is: the arithmetic of the node's forward pass (kernels, reduction order). A
verifier recomputes a node's blocks bit for bit only on the same version, so after an upgrade
that changes it (the release notes say so) the node must announce the new one, or the
verifiers of the new version skip its checks and those of the old one fail its honest blocks.

the change takes effect when the next committee epoch opens (each epoch's work is judged under
one version), one change at a time, and at most once every 8 epochs (a node cannot hop between
versions to dodge the verifiers of one); the chain accepts only the versions its genesis lists
(/params: genesis.numerics). A version is "checked" when verifiers holding at least a third of
the committee's power (two at least) run it; below that, spot checks on it convict nobody.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "numerics",
        help="show or change the numerics version the committee holds for this node",
        description="Show the numerics version the committee holds for the node joined from "
        "this home, or change it (--set) after a kernel upgrade.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--set",
        dest="set_to",
        nargs="?",
        const=NUMERICS,
        type=parse_version,
        metavar="VERSION",
        help=f"announce VERSION (default: this release's, {NUMERICS}) from the next epoch on",
    )
    parser.add_argument("--json", action="store_true", help="print the committee's view as JSON")
    operator._common(parser)
    parser.set_defaults(handler=_numerics)


def parse_version(text: str) -> int:
    """--set VERSION: an integer 1..65535."""
    # ASCII digits only: int() also takes other scripts' digits
    version = int(text) if text.isascii() and text.isdigit() else 0
    if not 1 <= version <= MAX_NUMERICS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a numerics version (an integer 1-{MAX_NUMERICS}); "
            f"this release's is {NUMERICS}"
        )
    return version


def _numerics(args: argparse.Namespace) -> int:
    from node.agent.launch import read_joined  # lazy: aiohttp, numpy

    config = operator._config(args)
    joined = read_joined(config.run_dir)
    if joined is None:
        raise UsageError(
            f"no node was joined from this home ({config.home})",
            hint="`planet join` first, or pass the --home the node was joined from",
        )
    if args.set_to is not None:
        code, text = asyncio.run(_send(config, joined.node_key, args.set_to))
        failure = refusal(code, text, args.set_to)
        if failure is not None:
            raise failure
        if code == NUMERICS_UNCHANGED:
            operator._say(f"nothing to change: {text}")
    view, listing = asyncio.run(_read(config, joined.node_key))
    if args.json:
        print(json.dumps({"node": view, "numerics": listing}, indent=1))
        return 0
    for line in describe(view, listing):
        print(line)
    return 0


async def _send(config: Any, key: str, version: int) -> tuple[int, str]:
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp, nacl
    from node.keys import load_node_key
    from protocol.committee.registry import SetNumerics

    node_key = load_node_key(config.node_key_path, operator._password(config))
    if node_key.verify_key.encode().hex() != key:
        raise UsageError(f"{config.node_key_path} is not the key of the joined node {key[:16]}…")
    link = CommitteeLink([config.committee_rpc], node_key)
    try:
        return await link.send(SetNumerics(version), timeout_s=20)
    finally:
        await link.close()


async def _read(config: Any, key: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    from node.chain.committee_link import CommitteeLink  # lazy: aiohttp

    link = CommitteeLink([config.committee_rpc])
    try:
        return await link.node(key), dict(await link.query("/numerics"))
    finally:
        await link.close()


def refusal(code: int, text: str, version: int) -> PlanetError | None:
    """The error (with its hint) for a committee refusal of `set_numerics`; None when the
    change is scheduled (0) or already there (107)."""
    if code in (0, NUMERICS_UNCHANGED):
        return None
    hints = {
        NUMERICS_NOT_ACCEPTED: "run the release the network's verifiers run (its committee's "
        "/params lists the accepted versions under genesis.numerics)",
        NUMERICS_TOO_SOON: "one change at a time, at most once every 8 epochs: wait for the "
        "epoch the message names (`planet node numerics` shows the pending change)",
        UNKNOWN_NODE: "the node key is not registered (expired or never joined): `planet join`",
        INVALID_LIFECYCLE: "the node has left; join again to serve with the new version",
        WRONG_ROLE: "only compute nodes announce numerics; a verifier's version is announced "
        "by `planet verifier serve`",
    }
    return UsageError(
        f"the committee refused numerics {version}: {text} (code {code})",
        hint=hints.get(code, "see docs/network.md, Numerics"),
    )


def describe(view: dict[str, Any] | None, listing: dict[str, Any]) -> list[str]:
    """Lines for an operator: the version in effect, a pending change, this release's, and
    whether enough verifiers run it (`/numerics`)."""
    if view is None:
        return ["numerics    the node is not registered"]
    current = view.get("numerics")
    since = view.get("numerics_epoch")
    lines = [
        f"numerics    {current if current is not None else 'not announced'}"
        + (f" (since epoch {since})" if since is not None else "")
        + f"; this release: {NUMERICS}"
    ]
    pending = view.get("numerics_next")
    if isinstance(pending, dict):
        lines.append(f"pending     {pending.get('numerics')} from epoch {pending.get('epoch')}")
    groups = {g.get("numerics"): g for g in listing.get("versions", [])}
    group = groups.get(current)
    if group is not None:
        verdict = "yes" if group.get("checked") else "NO (spot checks on it convict nobody)"
        lines.append(
            f"checked     {verdict}: {len(group.get('verifiers', []))} verifiers with "
            f"{group.get('power')} of {listing.get('total_power')} power run it (floor: "
            f"{listing.get('floor', {}).get('verifiers')} verifiers and "
            f"{listing.get('floor', {}).get('power')} power)"
        )
    accepted = sorted(v for v in groups if v is not None)
    lines.append(f"versions    {accepted} on this chain")
    return lines
