"""`network_status`: per validator, its processes and what its RPC says."""

from __future__ import annotations

import asyncio
from typing import Any

from deploy.committee.network import Network, Validator
from deploy.committee.processes import read_pid
from node.chain.committee_rpc import CommitteeRpc


async def network_status(network: Network, *, timeout_s: float = 3.0) -> list[dict[str, Any]]:
    """Per validator: pids and liveness, and what its RPC says (height, hashes, peers)."""

    async def one(validator: Validator) -> dict[str, Any]:
        row: dict[str, Any] = {
            "validator": validator.index,
            "rpc": validator.rpc_url,
            "node_id": validator.node_id,
            "operator_address": validator.operator_address,
        }
        for process in ("app", "cometbft", "watcher"):
            path = network.pid_path(process, validator.index)
            try:
                pid: int | None = int(path.read_text().strip())
            except (OSError, ValueError):
                pid = None
            row[f"{process}_pid"] = pid
            row[f"{process}_alive"] = read_pid(network, process, validator.index) is not None
        if network.app != "planet":
            row["app_alive"] = row["cometbft_alive"]
        if not row["cometbft_alive"]:
            row.update(
                height=None,
                app_hash=None,
                block_hash=None,
                catching_up=None,
                peers=None,
                error="cometbft is not running",
            )
            return row
        async with CommitteeRpc(validator.rpc_url, timeout_s=timeout_s) as rpc:
            try:
                status = await rpc.status()
                peers = await rpc.net_info()
            except Exception as error:  # reported per node, the others still answer
                row.update(
                    height=None,
                    app_hash=None,
                    block_hash=None,
                    catching_up=None,
                    peers=None,
                    error=getattr(error, "message", str(error)),
                )
                return row
        row.update(
            height=status.latest_block_height,
            app_hash=status.latest_app_hash,
            block_hash=status.latest_block_hash,
            block_time=status.latest_block_time,
            catching_up=status.catching_up,
            peers=int(peers.get("n_peers", 0)),
            error=None,
        )
        return row

    return list(await asyncio.gather(*(one(v) for v in network.validators)))
