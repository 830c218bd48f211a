"""Which node a challenge's score belongs to: group testing over the epoch's circuits.

A challenge scores a whole circuit (one node per shard, chosen by the gateway at random); the
receipt tells the paying verifier which nodes served it. Over one epoch:

- a node that served any circuit scoring `>= clean` (credibility at 10^6) is *cleared*; its C
  is the best credibility among its circuits;
- a circuit scoring below `clean` is blamed on its only uncleared node, which gets the lowest
  such credibility; with two or more uncleared nodes it stays ambiguous and blames nobody;
- a node neither cleared nor blamed gets no score this epoch (the chain keeps its R).

So an honest node is never blamed for a cheater it shared a circuit with, as long as the
cheater's other circuits or the honest node's own clean circuits tell them apart; a circuit of
two cheaters blames neither until one of them is seen alone.

A verifier whose epoch fits few challenges (a slow machine, short epochs) may end an epoch with a
low circuit still ambiguous: `unresolved` names those results, and the worker carries them into
the next epoch's attribution once, where they can only blame (a low score clears nobody) — so a
cheater seen beside an honest node at the end of epoch e is blamed in e+1 as soon as that honest
node scores clean there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from node.verifier.scoring import SCALE


@dataclass(frozen=True, slots=True)
class CircuitScore:
    nodes: tuple[str, ...]  # node keys, one per shard
    credibility: int  # 0 … SCALE


def attribute(results: Sequence[CircuitScore], clean: int = SCALE) -> dict[str, int]:
    """node key → C(T) for the nodes this epoch's results say something about."""
    cleared: dict[str, int] = {}
    for result in results:
        if result.credibility >= clean:
            for node in result.nodes:
                cleared[node] = max(cleared.get(node, 0), result.credibility)
    blamed: dict[str, int] = {}
    for result in results:
        if result.credibility >= clean:
            continue
        suspects = [n for n in dict.fromkeys(result.nodes) if n not in cleared]
        if len(suspects) == 1:
            node = suspects[0]
            blamed[node] = min(blamed.get(node, SCALE), result.credibility)
    return {**cleared, **blamed}


def unresolved(results: Sequence[CircuitScore], clean: int = SCALE) -> list[CircuitScore]:
    """The results scoring below `clean` that `attribute` blamed on nobody (two or more of
    their nodes uncleared), in order."""
    cleared = {node for r in results if r.credibility >= clean for node in r.nodes}
    return [
        r
        for r in results
        if r.credibility < clean and len({n for n in r.nodes if n not in cleared}) > 1
    ]
