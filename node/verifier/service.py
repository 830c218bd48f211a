"""Start-up of `planet verifier serve`: check everything, then run the worker until signalled.

Fails before any challenge is sent, with a `PlanetError` and a hint, when: the validator home
has no consensus key, the local manifest's shards do not hash to the manifest, the manifest is
not the one registered in ModelRegistry, the calibration has no echo map, an RPC does not
answer, or the personal client (`--personal-client`) serves another model (one not answering
yet is waited for: each challenge asks it again).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import signal
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from nacl.signing import SigningKey

from node.retry import Stopped, until_stopped
from node.server.next_hops import Network
from node.verifier.asker import GatewayAsker, PersonalAsker
from node.verifier.calibration import CALIBRATION_FILE
from node.verifier.findings import PeerFindings, serve_findings
from node.verifier.hop_runner import HopRunner
from node.verifier.reference import Reference
from node.verifier.scoring import CredibilityMap
from node.verifier.spotchecks import SpotChecker
from node.verifier.worker import VerifierWorker, WorkerSettings
from protocol.committee.verification import VerifierEndpoint, VerifierNumerics
from protocol.eip712 import as_bytes32
from protocol.errors import ConfigError, IntegrityError, PlanetError, UnavailableError
from protocol.frames.dtypes import WIRE_DTYPE
from protocol.numerics import NUMERICS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifierConfig:
    settings: WorkerSettings
    manifest: Path
    gateway_url: str  # where challenges are asked: a hosted gateway, or ...
    committee_rpc: tuple[str, ...]
    evm_rpc: str
    deployment: Path
    wallet: Path
    password: str
    calibration: Path = CALIBRATION_FILE
    # the wire dtype of the gateway asked (its --wire-dtype): the reference rounds like it
    wire_dtype: str = WIRE_DTYPE
    personal: bool = False  # ... the operator's own personal client (asker.PersonalAsker)
    personal_token: str = ""  # that client's bearer token (node/gateway/personal_token.py)
    findings_listen: tuple[str, int] | None = None  # serve its findings to the peers here
    findings_url: str | None = None  # ... published on chain as reachable at this URL
    private_peers: tuple[Network, ...] | None = None  # peers' private ranges it may dial
    credits: Path | None = None  # the operator's credit wallet: pays charging nodes' probes


def consensus_key(home: Path) -> SigningKey:
    """The validator's ed25519 consensus key (first 32 bytes of `priv_key.value`)."""
    path = home / "config" / "priv_validator_key.json"
    try:
        raw = base64.b64decode(json.loads(path.read_text())["priv_key"]["value"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"cannot read the validator key {path}: {error}",
            hint="--home must be the validator's CometBFT home",
        ) from None
    if len(raw) != 64:
        raise ConfigError(f"{path}: expected a 64-byte ed25519 key")
    return SigningKey(raw[:32])


def echo_map(path: Path) -> CredibilityMap:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))["echo_map"]
        return CredibilityMap(int(entry["full_micro"]), int(entry["zero_micro"]))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"no echo map in the calibration {path}: {error}",
            hint="python -m node.verifier.calibrate_echo",
        ) from None


def spot_checker(
    config: VerifierConfig,
    reference: Reference,
    link: Any,
    http: Any,
    worker: VerifierWorker,
    peers: PeerFindings | None = None,
) -> SpotChecker:
    """Spot checks with the verifier's own shards and the manifest quantization's tolerance;
    findings go to the worker's verdict votes; peers' findings are fetched through `peers`; new
    epochs come from the worker's epoch follower (one `/epochs` poller per process)."""
    from node.verifier.calibration import load_calibration

    quant = str(getattr(reference.shards[0], "quant", "none"))
    return SpotChecker(
        link,
        reference.shards,
        load_calibration().tolerance(quant),
        http,
        worker.vote_spot_check,
        home=config.settings.home,
        rate_ppm=config.settings.spot_check_ppm,
        deadline_s=config.settings.ticket_deadline_s,
        peers=peers,
        epochs=worker.epochs,  # the worker's `follow` reads `/epochs`; the checker waits on it
    )


def hop_runner(config: VerifierConfig, reference: Reference) -> HopRunner | None:
    """The one-node timings (worker step 3b), or None with `hop_probes_per_epoch` 0 (or no
    challenges: the speeds are reported beside the scores only). Charging nodes are timed
    only with `credits`: their credits come from that wallet, as the personal client's do."""
    from node.client.credit_wallet import CreditWallet
    from node.client.paying import CreditPayer
    from node.verifier.calibration import load_calibration

    settings = config.settings
    if settings.hops.per_epoch == 0 or settings.challenges_per_epoch == 0:
        return None
    quant = str(getattr(reference.shards[0], "quant", "none"))
    payer = None
    if config.credits is not None:
        payer = CreditPayer(CreditWallet(config.credits), {})
    return HopRunner(
        reference,
        load_calibration().tolerance(quant),
        settings.hops,
        payer=payer,
        private_ranges=config.private_peers or (),
    )


async def publish_endpoint(link: Any, url: str, *, tries: int = 5, pause_s: float = 3.0) -> bool:
    """Send `verifier_endpoint{url}` until the committee accepts it (a few tries: the chain may
    be catching up); whether it did. Without it the peers cannot fetch this verifier's
    findings, which is logged as a warning."""
    for attempt in range(1, tries + 1):
        try:
            code, text = await link.send(VerifierEndpoint(url), timeout_s=15)
        except PlanetError as error:
            code, text = -1, error.message
        if code == 0:
            log.info("findings published at %s", url)
            return True
        log.warning("verifier_endpoint not accepted (try %d of %d): %d %s", attempt, tries,
                    code, text)  # fmt: skip
        if attempt < tries:
            await asyncio.sleep(pause_s)
    log.warning(
        "the peers cannot fetch this verifier's findings: its URL %s is not on chain, so a "
        "node that withholds its tickets from them escapes its failed checks",
        url,
    )
    return False


# the committee's answers to `verifier_numerics` that leave nothing to do (abci_app/codes.py)
NUMERICS_UNCHANGED, NUMERICS_TOO_SOON, NUMERICS_NOT_ACCEPTED = 107, 108, 105


async def announce_numerics(
    link: Any, version: int = NUMERICS, *, tries: int = 5, pause_s: float = 3.0
) -> bool:
    """Send `verifier_numerics{version}` so the chain counts this verifier in its version's
    spot-check quorum (abci_app/numerics.py; from the next epoch on); whether the chain holds
    that version for it now or soon. Already announced (107): nothing to do. A change
    refused as too soon (108) or a version the chain does not list (105) is logged: until it
    takes effect this verifier's votes count only toward 2/3 of all the power."""
    for attempt in range(1, tries + 1):
        try:
            code, text = await link.send(VerifierNumerics(version), timeout_s=15)
        except PlanetError as error:
            code, text = -1, error.message
        if code in (0, NUMERICS_UNCHANGED):
            log.info("numerics %d announced for this verifier (code %d)", version, code)
            return True
        if code in (NUMERICS_TOO_SOON, NUMERICS_NOT_ACCEPTED):
            log.warning("verifier_numerics %d not accepted: %d %s", version, code, text)
            return False
        log.warning("verifier_numerics not accepted (try %d of %d): %d %s", attempt, tries,
                    code, text)  # fmt: skip
        if attempt < tries:
            await asyncio.sleep(pause_s)
    return False


async def _until_stopped_quietly(work: Coroutine[Any, Any, Any], stop: asyncio.Event) -> None:
    """`work` until it ends or `stop` is set (then it is cancelled): its tries and pauses must
    not hold a SIGTERM up."""
    with contextlib.suppress(Stopped):
        await until_stopped(work, stop)


async def serve(config: VerifierConfig) -> int:
    from node.chain.committee_link import CommitteeLink, signer_nonce_file
    from node.chain.evm.account import PlanetChain
    from node.chain.evm.deployment import Deployment
    from node.keys import load_or_create_wallet

    key = consensus_key(config.settings.home)
    credibility = echo_map(config.calibration)
    reference = await asyncio.to_thread(  # hash-checked
        Reference.load, config.manifest, None, config.wire_dtype
    )
    wallet = load_or_create_wallet(config.wallet, config.password)
    chain = PlanetChain(
        Deployment.load(config.deployment), bytes(wallet.key), rpc_url=config.evm_rpc
    )
    model_id = as_bytes32(reference.model_hash, "model_hash")
    registered = await asyncio.to_thread(chain.registry.manifest_hash_of, model_id)
    if registered == bytes(32):
        raise IntegrityError(
            f"model {reference.model_hash} is not registered in ModelRegistry",
            hint="register the model, or pass the registered manifest",
        )
    reference.check_registered(
        registered, await asyncio.to_thread(chain.registry.shard_hashes_of, model_id)
    )
    link = CommitteeLink(
        list(config.committee_rpc), key, nonce_file=signer_nonce_file(config.settings.home)
    )
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
    peers = PeerFindings(config.private_peers)
    findings = None
    try:
        await link.params()  # the committee answers
        asker: GatewayAsker | PersonalAsker
        if config.personal:
            asker = PersonalAsker(
                config.gateway_url, http, reference.model_hash, config.personal_token
            )
            try:
                await asker.model()  # another model: a ConfigError-like stop, before any work
            except UnavailableError as error:  # not up yet: seeds, spot checks and verdicts
                log.warning(  # go on; each challenge asks again (and logs if not served)
                    "personal client not answering yet: %s", error.message
                )
        else:
            asker = GatewayAsker(config.gateway_url, chain, http)
        hops = hop_runner(config, reference)
        worker = VerifierWorker(config.settings, reference, credibility, asker, link, hops)
        log.info(
            "verifier serving home=%s model=%s %s=%s wallet=%s",
            config.settings.home,
            reference.model_hash,
            "personal_client" if config.personal else "gateway",
            config.gateway_url,
            wallet.address,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runs = [worker.run(stop), _until_stopped_quietly(announce_numerics(link), stop)]
        if config.settings.spot_check_ppm > 0:
            checker = spot_checker(config, reference, link, http, worker, peers)
            if config.findings_listen is not None:
                host, port = config.findings_listen
                findings = await serve_findings(checker.book, host, port)
                url = config.findings_url or f"http://{host}:{port}"
                runs.append(_until_stopped_quietly(publish_endpoint(link, url), stop))
            else:
                log.warning(
                    "findings not served (no --findings-listen): the other verifiers cannot "
                    "re-judge this verifier's failed checks from the node's own tickets"
                )
            runs.append(checker.run(stop))
        await asyncio.gather(*runs)
    finally:
        if findings is not None:
            await findings.cleanup()
        await peers.close()
        await http.close()
        await link.close()
    return 0
