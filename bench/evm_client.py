"""Python-side settlement costs on a real anvil: deploy time, client tx throughput, settlement.

Starts its own anvil (port 18547), deploys every contract with `deploy.evm.deploy_all`, then
drives the typed client `node.chain.evm.account.PlanetChain`: sequential deposits (each waits
for its receipt), one committee-signed payout root over N queries, and its gateway's claim (a page
of per-query fees pays only the deposits' own gateway: one leaf, QueryEscrow's page rule).
Prints one JSON object (BENCHMARKS.md); logs go to stderr.

    .venv/bin/python bench/evm_client.py [--deposits 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from eth_utils import keccak

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import machine, median, parse_with_quick, spread
from deploy.anvil import ANVIL_DEV_KEY, rpc_call, start_anvil
from deploy.evm import DeployConfig, compile_contracts, deploy_all
from node.chain.evm.account import PlanetChain
from protocol.eip712 import PayoutRoot, address_of, committee_signatures, queries_hash
from shares.merkle import PayoutTree

log = logging.getLogger("bench.evm_client")
PORT = 18547
ETHER = 10**18
COMMITTEE_KEYS = [keccak(text=f"bench committee {i}") for i in range(4)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deposits", type=int, default=100, help="sequential deposits per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_with_quick(parser, {"deposits": 5, "repeats": 1})
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    compile_contracts()

    deploy_s: list[float] = []
    deposit_tx_s: list[float] = []
    post_root_s: list[float] = []
    claim_tx_s: list[float] = []
    gas: dict[str, int] = {}
    with start_anvil(PORT) as anvil:
        for repeat in range(args.repeats):
            config = DeployConfig.devnet(committee=[(address_of(k), 1) for k in COMMITTEE_KEYS])
            started = time.perf_counter()
            deployment = deploy_all(anvil.rpc_url, ANVIL_DEV_KEY, config, progress=log.debug)
            deploy_s.append(time.perf_counter() - started)

            user_key = keccak(text=f"bench user {repeat}")
            rpc_call(anvil.rpc_url, "anvil_setBalance", [address_of(user_key), hex(10**6 * ETHER)])
            user = PlanetChain(deployment, user_key)
            queries = [keccak(text=f"bench query {repeat} {i}") for i in range(args.deposits)]
            started = time.perf_counter()
            gateway_key = keccak(text="bench gateway")
            gateway = address_of(gateway_key)
            for query in queries:
                result = user.escrow.deposit(query, keccak(text="model"), gateway, 10**15)
            deposit_tx_s.append(args.deposits / (time.perf_counter() - started))
            gas["deposit_gas"] = result.gas_used

            fees = [10**15] * len(queries)
            epoch = repeat + 1
            amounts = {gateway: sum(fees)}
            tree = PayoutTree.for_epoch(epoch, amounts)
            statement = PayoutRoot(
                epoch,
                tree.root,
                tree.total,
                queries_hash(queries, fees),
                user.deployment.address("QueryEscrow"),
            )
            sigs = committee_signatures(statement, COMMITTEE_KEYS, user.committee.domain())
            started = time.perf_counter()
            posted = user.escrow.post_payout_root(statement, queries, fees, sigs)
            post_root_s.append(time.perf_counter() - started)
            gas[f"settle_{args.deposits}_queries_4_signers_gas"] = posted.gas_used

            rpc_call(anvil.rpc_url, "evm_increaseTime", [61])
            rpc_call(anvil.rpc_url, "evm_mine", [])
            rpc_call(anvil.rpc_url, "anvil_setBalance", [gateway, hex(ETHER)])
            payee = PlanetChain(deployment, gateway_key)
            [payout] = tree.payouts
            started = time.perf_counter()
            claimed = payee.escrow.claim(epoch, payout.amount, tree.proof(0))
            claim_tx_s.append(1 / (time.perf_counter() - started))
            gas["claim_gas"] = claimed.gas_used

    print(
        json.dumps(
            {
                "bench": "evm_client",
                "machine": machine(),
                "config": {
                    "deposits": args.deposits,
                    "repeats": args.repeats,
                    "quick": args.quick,
                    "committee": len(COMMITTEE_KEYS),
                    "chain": "anvil (npm @foundry-rs/anvil-linux-amd64), instant mining",
                },
                "metrics": {
                    "deploy_s": round(median(deploy_s), 3),
                    "deploy_s_spread": spread(deploy_s, 3),
                    "deposit_tx_s": round(median(deposit_tx_s), 1),
                    "deposit_tx_s_spread": spread(deposit_tx_s, 1),
                    "post_payout_root_s": round(median(post_root_s), 3),
                    "claim_tx_s": round(median(claim_tx_s), 1),
                    **gas,
                },
                "targets": {},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
