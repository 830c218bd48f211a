"""What a compute node commits for the work it served: one record per (session, block of 32
positions, shard), and the spool format that carries records from the node to its agent.

For every block b of `protocol.fingerprint.BLOCK_POSITIONS` positions of a session a node
computed, it keeps the fingerprint bytes of its output activations (`protocol.fingerprint`) and
the input activations it received, and commits on the committee chain to

    inputs_b    = sha256(inputs_{b−1} ‖ float32 little-endian bytes of the block's input rows)
                  (inputs_{−1} = "planet/served-inputs/v1"): a hash chain over every input
                  position of the session up to the block's end
    output_hash = keccak256(fingerprint bytes of the block ‖ inputs_b)     (`served_output_hash`)
    commitment  = commitment_value(session, step = b, shard, output_hash, salt)   (protocol.eip712)

Binding the inputs means a spot-check ticket (the inputs up to the block's end, the fingerprint
and the salt) is fixed by the commitment before anyone is selected: a node cannot hand one
verifier other inputs than another, nor pick inputs after it learns it was drawn, so every
verifier that re-judges a block recomputes the same bytes (`inputs_digests`).

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

import hashlib
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.abi_words import keccak
from protocol.eip712 import commitment_value
from protocol.errors import ProtocolError
from protocol.fingerprint import BLOCK_POSITIONS

if TYPE_CHECKING:
    import numpy as np

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


INPUTS_DOMAIN = b"planet/served-inputs/v1"
FLOAT32_LE = "<f4"


def output_hash(fingerprint: bytes) -> bytes:
    """keccak256 of a block's fingerprint bytes (routing's output hash, protocol.routing)."""
    return keccak(fingerprint)


def next_inputs_digest(previous: bytes | None, rows: bytes) -> bytes:
    """The input hash chain one block on: sha256(previous (or the domain) ‖ the block's input
    rows as float32 little-endian bytes)."""
    return hashlib.sha256((previous or INPUTS_DOMAIN) + rows).digest()


def inputs_digests(inputs: np.ndarray) -> list[bytes]:
    """The chain value after each block of `inputs` ([1, T, H] or [T, H] float32 positions
    [0, T)), the last block possibly partial: what `served_output_hash` binds per block."""
    import numpy as np  # lazy: the agent and the verifier's readers import this module too

    rows = np.asarray(inputs)
    rows = rows.reshape(-1, rows.shape[-1]) if rows.ndim == 3 else rows
    out: list[bytes] = []
    previous: bytes | None = None
    for start in range(0, rows.shape[0], BLOCK_POSITIONS):
        chunk = np.ascontiguousarray(rows[start : start + BLOCK_POSITIONS], dtype=FLOAT32_LE)
        previous = next_inputs_digest(previous, chunk.tobytes())
        out.append(previous)
    return out


class InputsChain:
    """A session's input hash chain, fed the input rows as they arrive (`add`); `close_block`
    hashes the next `count` rows into the chain and returns its new value. Rows are kept only
    until hashed (as views of the caller's arrays)."""

    def __init__(self) -> None:
        self.digest: bytes | None = None
        self._pending: list[np.ndarray] = []

    def add(self, rows: np.ndarray) -> None:
        """Input rows [T, H] (float32) in position order."""
        self._pending.append(rows)

    def close_block(self, count: int) -> bytes:
        taken: list[np.ndarray] = []
        need = count
        while need > 0 and self._pending:
            head = self._pending[0]
            if head.shape[0] <= need:
                taken.append(self._pending.pop(0))
                need -= head.shape[0]
            else:
                taken.append(head[:need])
                self._pending[0] = head[need:]
                need = 0
        data = b""
        if taken:
            import numpy as np  # lazy: see inputs_digests

            data = np.ascontiguousarray(np.concatenate(taken, axis=0), dtype=FLOAT32_LE).tobytes()
        self.digest = next_inputs_digest(self.digest, data)
        return self.digest


def served_output_hash(fingerprint: bytes, inputs_digest: bytes) -> bytes:
    """The committed `output_hash` of a served block: keccak256(fingerprint ‖ inputs chain)."""
    if len(inputs_digest) != 32:
        raise ValueError("the inputs digest is 32 bytes")
    return keccak(fingerprint + inputs_digest)


SEGMENT_DOMAIN = b"planet/served-segment/v1\n"


def segment_session(tag: bytes, index: int) -> bytes:
    """The committed session of segment `index` of the hop's session `tag` (32 bytes each).

    A speculating client rewinds the cache (it drops rejected guesses), so a session serves
    several sequences, each the one before it cut at the rewind's position and continued:
    segment 0 is the session itself (`tag`); segment i ≥ 1 = sha256(`SEGMENT_DOMAIN` ‖ tag ‖
    uint32_be(i)). Each segment is committed like a session of its own (blocks over absolute
    positions, its inputs chain over its whole sequence from position 0), so a spot-check
    ticket of any of its blocks is recomputed from its inputs alone; the positions a segment
    shares with the one before are committed there, except the part of the block it restarts
    in, which its first block repeats (node/server/served.py)."""
    if index == 0:
        return tag
    return hashlib.sha256(SEGMENT_DOMAIN + tag + struct.pack(">I", index)).digest()


@dataclass(frozen=True, slots=True)
class ServedRecord:
    """One committed block: the node's opening of its commitment (secret until revealed)."""

    session: bytes  # 32 bytes: the hop's session tag (`segment_session` after a rewind)
    step: int  # block index b: positions [32 b, 32 b + n)
    shard: int
    output_hash: bytes  # keccak256(fingerprint bytes ‖ inputs chain): `served_output_hash`
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
