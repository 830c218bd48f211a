"""`python -m node.watcher`: a validator's stake watcher process.

    python -m node.watcher --home VALIDATOR_HOME --committee-rpc URL \
        --evm-rpc http://127.0.0.1:8545 --deployment deployment.json [--poll 1.0]

Signs `attest_stake` with the validator's CometBFT consensus key
(`VALIDATOR_HOME/config/priv_validator_key.json`), and each closed epoch's payout statement
with its operator key (`VALIDATOR_HOME/config/operator_key.json`), relaying confirmed ones to
the QueryEscrow (`node/watcher/payouts.py`), and relays the verdicts the committee confirmed to
FraudProofs (`node/watcher/verdicts.py`: the convicted node is slashed; a verdict confirmed by
a numerics version's quorum it first ratifies, node/watcher/ratifier.py), and vouches for the
credit mints its EVM read says the payer's balance covers (`node/watcher/funding.py`, with the
consensus key; a validator without an operator key runs none of these three). It also takes
part in each credit key period's DKG (`node/watcher/credit_dkg.py`, with the consensus key, its
key share written to `VALIDATOR_HOME/credit_shares/`), and posts its partial signatures for
every funded mint with that share (`node/watcher/mint_signer.py`: a mint short of t posted sets
at its deadline is refunded): neither needs the EVM nor the operator key, so every validator
does both. Runs until
SIGTERM/SIGINT; an EVM RPC or a validator that is down is logged and retried with backoff,
never fatal.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import signal
from pathlib import Path

from nacl.signing import SigningKey

from node.chain.committee_link import CommitteeLink, signer_nonce_file
from node.chain.evm.deployment import Deployment
from node.keys import operator_key_path, read_operator_key
from node.procs import exit_process, run_service
from node.retry import Backoff, sleep_or_stop
from node.watcher.credit_dkg import CreditDkgDriver
from node.watcher.evm import StakingReader
from node.watcher.funding import MintFunder
from node.watcher.mint_signer import MintSigner
from node.watcher.payouts import PayoutRelay
from node.watcher.ratifier import VerdictRatifier
from node.watcher.verdicts import VerdictRelay
from node.watcher.watcher import RESYNC_S, StakeWatcher
from protocol.errors import ConfigError, PlanetError

log = logging.getLogger("node.watcher")


def consensus_key(home: Path) -> SigningKey:
    """The validator's ed25519 consensus key (first 32 bytes of `priv_key.value`)."""
    path = home / "config" / "priv_validator_key.json"
    try:
        doc = json.loads(path.read_text())
        raw = base64.b64decode(doc["priv_key"]["value"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"cannot read the validator key {path}: {error}") from None
    if len(raw) != 64:
        raise ConfigError(f"{path}: expected a 64-byte ed25519 key")
    return SigningKey(raw[:32])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m node.watcher", description=__doc__)
    parser.add_argument("--home", type=Path, required=True, help="the validator's CometBFT home")
    parser.add_argument("--committee-rpc", action="append", required=True, help="repeatable")
    parser.add_argument("--evm-rpc", help="EVM RPC (default: the deployment's rpc_url)")
    parser.add_argument("--deployment", type=Path, required=True, help="deployment file")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between passes")
    parser.add_argument(
        "--resync", type=float, default=RESYNC_S, help="seconds between full stake reads"
    )
    parser.add_argument("--log-level", default=os.environ.get("PLANET_LOG_LEVEL", "INFO"))
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    key = consensus_key(args.home)
    deployment = Deployment.load(args.deployment)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    link = CommitteeLink(args.committee_rpc, key, nonce_file=signer_nonce_file(args.home))
    backoff = Backoff(initial_s=0.5, max_s=10.0)
    reader: StakingReader | None = None
    watcher: StakeWatcher | None = None
    relay: PayoutRelay | None = None
    verdicts: VerdictRelay | None = None
    funder: MintFunder | None = None
    dkg = CreditDkgDriver.of_validator(link, key, args.home)
    signer = MintSigner(link, dkg.store)
    key_path = operator_key_path(args.home)
    operator_key = read_operator_key(key_path) if key_path.exists() else None
    if operator_key is None:
        log.warning("no config/operator_key.json: payout roots are not signed by this watcher")
    log.info(
        "watcher starting validator=%s staking=%s",
        key.verify_key.encode().hex()[:16],
        deployment.address("Staking"),
    )
    try:
        while not stop.is_set():
            if reader is not None:
                reader.head.new_pass()  # the EVM block is read once a pass, by its first step
            try:
                await _relay_step(dkg)  # first: the key periods' DKG needs no EVM read
                await _relay_step(signer)  # funded mints' partials: no EVM read either
                if watcher is None:
                    reader = await asyncio.to_thread(StakingReader, deployment, args.evm_rpc)
                    watcher = StakeWatcher(reader, link, deployment.block, resync_s=args.resync)
                if relay is None and operator_key is not None and reader is not None:
                    relay = await asyncio.to_thread(
                        payout_relay, deployment, operator_key, link, args.evm_rpc
                    )
                    relay.height = lambda: dkg.committed_height  # read first in each pass
                    verdicts = await asyncio.to_thread(
                        verdict_relay, deployment, operator_key, link, args.evm_rpc
                    )
                    funder = await asyncio.to_thread(
                        mint_funder, deployment, operator_key, link, reader
                    )
                await watcher.step()
                if relay is not None:
                    await _relay_step(relay)
                if verdicts is not None:
                    await _relay_step(verdicts)
                if funder is not None:
                    await _relay_step(funder)
                backoff.reset()
                delay = args.poll
            except PlanetError as error:
                delay = backoff.next_delay()
                log.warning("pass failed: %s; retry_in_s=%.1f", error.message, delay)
            except (KeyError, ValueError, TypeError) as error:  # an odd answer: log, go on
                delay = backoff.next_delay()
                log.warning(
                    "pass failed on an unexpected answer: %r; retry_in_s=%.1f", error, delay
                )
            await sleep_or_stop(stop, delay)
    finally:
        await link.close()
    return 0


async def _relay_step(
    relay: PayoutRelay | VerdictRelay | MintFunder | CreditDkgDriver | MintSigner,
) -> None:
    """One relay pass; its failures are logged and never slow the stake attestations, nor
    stop the loop (a bug's traceback is logged and the next pass runs)."""
    what = type(relay).__name__
    try:
        await relay.step()
    except PlanetError as error:
        log.warning("%s pass failed: %s", what, error.message)
    except (KeyError, ValueError, TypeError) as error:  # an odd answer: log, go on
        log.warning("%s pass failed on an unexpected answer: %r", what, error)
    except Exception:  # a bug: the other relays and the stake watcher go on
        log.exception("%s pass failed", what)


def verdict_relay(
    deployment: Deployment, operator_key: bytes, link: CommitteeLink, evm_rpc: str | None
) -> VerdictRelay:
    """The relayer of confirmed verdicts to FraudProofs (the operator key pays the gas) and the
    ratifier of those a numerics version's quorum confirmed (the operator key signs)."""
    from node.chain.evm.account import PlanetChain
    from protocol.eip712 import committee_domain

    chain = PlanetChain(deployment, operator_key, rpc_url=evm_rpc)
    ratifier = VerdictRatifier(
        committee=link,
        operator_key=operator_key,
        domain=committee_domain(deployment.chain_id, deployment.address("Committee")),
        fraud_proofs_address=chain.fraud_proofs.address,
    )
    return VerdictRelay(committee=link, fraud_proofs=chain.fraud_proofs, ratifier=ratifier)


def mint_funder(
    deployment: Deployment, operator_key: bytes, link: CommitteeLink, reader: StakingReader
) -> MintFunder:
    """The voucher for credit mints the payer's escrow balance covers (reads only); its deposit
    log reads up to the pass's block the stake reader read (one `eth_blockNumber` a pass)."""
    from node.chain.evm.account import PlanetChain
    from node.watcher.depositors import EscrowDepositors

    escrow = PlanetChain(deployment, operator_key, rpc_url=reader.rpc_url).escrow
    deposits = EscrowDepositors(deployment, reader.rpc_url, latest_block=reader.latest_block)
    return MintFunder(committee=link, escrow=escrow, deposits=deposits)


def payout_relay(
    deployment: Deployment, operator_key: bytes, link: CommitteeLink, evm_rpc: str | None
) -> PayoutRelay:
    """The payout signer/relayer of this validator (its operator key pays the relay gas)."""
    from node.chain.evm.account import PlanetChain
    from protocol.eip712 import committee_domain

    escrow = PlanetChain(deployment, operator_key, rpc_url=evm_rpc).escrow
    return PayoutRelay(
        committee=link,
        escrow=escrow,
        escrow_address=deployment.address("QueryEscrow"),
        operator_key=operator_key,
        domain=committee_domain(deployment.chain_id, deployment.address("Committee")),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_service(lambda: run(args), log_level=args.log_level, log=log)


if __name__ == "__main__":
    exit_process(main)
