"""A test or benchmark's synchronous committee reads, every page followed through the product's
own readers (node/chain/committee_pages.py), so a test reads a list as the nodes and gateways
do: `BadPage` / `TooManyPages` by name, never a first page taken for the whole list.

    nodes_of(committee.query, model=m, role="compute")   every `/nodes` entry matching
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from node.chain.committee_pages import path_query, read_nodes


def nodes_of(query: Callable[[str], Any], **filters: Any) -> list[dict[str, Any]]:
    """Every `/nodes` entry matching `filters`, each page followed (`read_nodes`); `query` is a
    blocking ABCI query of a whole path (`/nodes?model=…&after=…`) returning its JSON answer."""

    async def abci_query(path: str) -> Any:
        return query(path)

    return asyncio.run(read_nodes(path_query(abci_query), **filters))
