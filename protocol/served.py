"""What a compute node commits for the work it served: one record per (session, block of 32
positions, shard), and the spool format that carries records from the node to its agent.

For every block b of `protocol.fingerprint.BLOCK_POSITIONS` positions of a session a node
computed, it keeps the fingerprint bytes of its output activations (`protocol.fingerprint`) and
commits on the committee chain to

    output_hash = keccak256(fingerprint bytes of the block)
    commitment  = commitment_value(session, step = b, shard, output_hash, salt)   (protocol.eip712)

with `salt` 32 random bytes per record, kept by the node (in the spool) until it reveals. The
`session` is the hop's public session tag (`protocol.frames.sessions.session_tag`: sha256 over a
domain and the capability only the client and this node hold), so a verifier, the client and the
routing checks name the same session, while nothing on chain reveals the capability, the
gateway's query, the user or another hop's session.

Spool (node → its agent, same machine, files mode 0600 because salts are secret until the
reveal): files `served-<start ns>-<pid>.bin` = `SPOOL_MAGIC` (8 bytes) then fixed-width records

    session (32) ‖ step u64 ‖ shard u32 ‖ output_hash (32) ‖ salt (32)      = 108 bytes

A reader takes only whole records (a writer may be mid-append). `SpoolError` names every way a
file can be wrong.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from eth_utils import keccak

from protocol.eip712 import commitment_value
from protocol.errors import ProtocolError

SPOOL_MAGIC = b"PLSRV1\n\x00"
SPOOL_PREFIX = "served-"
SPOOL_SUFFIX = ".bin"
RECORD = struct.Struct(">32sQI32s32s")  # session, step, shard, output_hash, salt
RECORD_BYTES = RECORD.size  # 108
SPOOL_FILE_BYTES = 1024 * 1024  # the node starts a new spool file past this size; the agent
# deletes a file of at least this size (never appended to again) once all its records revealed


class SpoolError(ProtocolError):
    """A spool file that is not ours or is damaged (the agent skips it and says why)."""

    code = "spool_format"


def output_hash(fingerprint: bytes) -> bytes:
    """keccak256 of a block's fingerprint bytes: the `outputHash` a node commits to."""
    return keccak(fingerprint)


@dataclass(frozen=True, slots=True)
class ServedRecord:
    """One committed block: the node's opening of its commitment (secret until revealed)."""

    session: bytes  # 32 bytes: the hop's session tag
    step: int  # block index b: positions [32 b, 32 b + n)
    shard: int
    output_hash: bytes  # keccak256(fingerprint bytes)
    salt: bytes  # 32 random bytes

    def commitment(self) -> bytes:
        return commitment_value(self.session, self.step, self.shard, self.output_hash, self.salt)

    def encode(self) -> bytes:
        return RECORD.pack(self.session, self.step, self.shard, self.output_hash, self.salt)

    @property
    def session_hex(self) -> str:
        return "0x" + self.session.hex()


def decode_records(data: bytes) -> list[ServedRecord]:
    """Whole records of a spool body (after the magic); a trailing partial record is left
    for the next read (the caller advances by `len(records) * RECORD_BYTES`)."""
    whole = len(data) - len(data) % RECORD_BYTES
    out = []
    for session, step, shard, out_hash, salt in RECORD.iter_unpack(data[:whole]):
        out.append(ServedRecord(session, step, shard, out_hash, salt))
    return out


def check_magic(head: bytes, name: str) -> None:
    if len(head) < len(SPOOL_MAGIC):
        raise SpoolError(f"{name}: shorter than the spool header")
    if head[: len(SPOOL_MAGIC)] != SPOOL_MAGIC:
        raise SpoolError(f"{name}: not a served-records spool (bad magic)")
