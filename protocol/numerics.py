"""The numerics of a shard's forward pass that verification relies on (docs/verification.md,
*Limits*: "Numerics").

A spot check recomputes a node's served block and compares fingerprints at a tolerance
calibrated for identical code: an int8 shard's outputs are bit for bit the verifier's because
both run the same kernels with the same reduction order (node/model/fast.py
`fixed_order_attention`, `FastDecoder.rowwise`, torch's int8 kernel). A node on a release
whose kernel path or reduction order differs computes other bits, and its honest blocks fail
like the mismatched thread counts did. `NUMERICS` names this release's numerics; a node
announces it (`/info` `numerics`, its `register_node`), and a verifier compares bitwise only
against nodes that announce its own (`comparable`).

Versions (bump `NUMERICS` whenever the bits of an honest node's outputs change for any quant:
a kernel, an attention or reduction order, a cast, a fused op, a torch upgrade that moves them;
never for changes that keep every output bit):

    1  int8 attention by torch's sdpa (releases before issue 46's row-wise fixed order;
       an honest block of such a node matches a version-2 recomputation at 562 ‰ with 10
       bad positions); announced by no release: such nodes register without the field
    2  int8: torch's int8 kernel row-wise, one-row attention by `fixed_order_attention`;
       fp32/int4: torch sdpa, as before

A registration without `numerics` (any release before the field existed) is *unannounced*
(`None`): judged by every check, as all nodes were before.

A registered node changes its version with `set_numerics` (abci_app/numerics.py): the change
takes effect at the next epoch boundary, so each epoch's work has one version. Its record then
shows `numerics` (in effect now), `numerics_epoch` (the first epoch of that version),
`numerics_previous` (the version before; absent: unannounced) and, while a change waits for
the boundary, `numerics_next` {numerics, epoch}. A verifier judging work committed in epoch e
reads the version of e (`announced_at`), never today's.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import ProtocolError

NUMERICS = 2  # this release's numerics (see the table above)
MAX_NUMERICS = 65_535  # a version is an integer 1..65535 (uint16)
# epochs between two changes of one record taking effect (abci_app/numerics.py says why);
# here because the node agent waits them out before it sends `set_numerics`
NUMERICS_COOLDOWN_EPOCHS = 8


class NumericsError(ProtocolError):
    """A numerics value that is not an integer 1..65535."""

    def __init__(self, where: str, value: Any) -> None:
        self.where = where
        self.value = value
        super().__init__(
            f"{where}: expected a numerics version, an integer in [1, {MAX_NUMERICS}], "
            f"got {ascii(value)[:40]}"
        )


def parse_numerics(value: Any, where: str = "numerics") -> int:
    """A numerics version (an int 1..65535; bools, floats and strings refused), else
    `NumericsError` naming `where`."""
    if type(value) is not int or not 1 <= value <= MAX_NUMERICS:
        raise NumericsError(where, value)
    return value


def announced(view: Any) -> int | None:
    """The numerics a committee node view (`/node`, `/nodes` entry) announces: None when the
    registration has no field (unannounced); `NumericsError` when the field is malformed."""
    if not isinstance(view, dict) or "numerics" not in view:
        return None
    return parse_numerics(view["numerics"], "node.numerics")


def announced_at(view: Any, epoch: int) -> int | None:
    """The numerics a node view announces for its work of `epoch` (a version change takes
    effect at an epoch boundary: `numerics_epoch`, `numerics_previous`, `numerics_next`); None
    when unannounced in that epoch; `NumericsError` when a field is malformed."""
    if not isinstance(view, dict):
        return None
    pending = view.get("numerics_next")
    if pending is not None:
        if not isinstance(pending, dict) or type(pending.get("epoch")) is not int:
            raise NumericsError("node.numerics_next", pending)
        if epoch >= pending["epoch"]:
            return parse_numerics(pending.get("numerics"), "node.numerics_next.numerics")
    since = view.get("numerics_epoch")
    if since is not None:
        if type(since) is not int:
            raise NumericsError("node.numerics_epoch", since)
        if epoch < since:
            if "numerics_previous" not in view:
                return None
            return parse_numerics(view["numerics_previous"], "node.numerics_previous")
    return announced(view)


def comparable(node: int | None, own: int = NUMERICS) -> bool:
    """Whether a node's outputs can be judged bitwise by a verifier on numerics `own`: the same
    version, or unannounced (judged as before the field existed)."""
    return node is None or node == own


def mismatch_line(node: int | None, own: int = NUMERICS) -> str:
    """One line for operators and logs naming both versions."""
    return f"numerics mismatch: node computes with numerics {node}, this release with {own}"
