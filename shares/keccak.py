"""keccak256 for bulk work (an epoch's Merkle tree hashes ~3 times per payout).

`keccak256(data)` is protocol.abi_words' keccak (eth-hash's, the one the EIP-712 code hashes
with). `bulk_keccak256()` returns a hasher for one bulk job that drives pycryptodome's C
Keccak (the backend eth-hash itself uses here) through one reusable state: reset, absorb, digest
into a fixed buffer, three C calls instead of building a hash object per call (about 4× faster
on these machines). It uses pycryptodome's internal cffi binding, so it is checked at first use
against eth-hash on known inputs and replaced by `keccak256` when that binding is missing,
changed, or backed by ctypes. Each call of `bulk_keccak256()` gets its own state, so separate
jobs (threads) never share one.
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.abi_words import keccak as keccak256

Hasher = Callable[[bytes], bytes]

_KECCAK_CAPACITY_BYTES = 64  # keccak256: capacity 512 bits
_KECCAK_ROUNDS = 24
_KECCAK_PADDING = 0x01  # original Keccak padding (SHA-3 uses 0x06)
_CHECKS = (b"", b"abc", bytes(range(256)) * 3)
_fast_ok: bool | None = None


def _fast_hasher() -> Hasher:
    from Crypto.Hash.keccak import _raw_keccak_lib as lib
    from Crypto.Util._raw_api import (
        SmartPointer,
        VoidPointer,
        backend,
        c_size_t,
        c_ubyte,
        create_string_buffer,
        ffi,
    )

    if backend != "cffi":
        raise ImportError("pycryptodome is not on its cffi backend")
    state = VoidPointer()
    capacity, rounds = c_size_t(_KECCAK_CAPACITY_BYTES), c_ubyte(_KECCAK_ROUNDS)
    if lib.keccak_init(state.address_of(), capacity, rounds):
        raise ImportError("keccak_init failed")
    owner = SmartPointer(state.get(), lib.keccak_destroy)  # frees the state with the hasher
    raw = owner.get()
    out = create_string_buffer(32)
    view = ffi.buffer(out)  # slicing a buffer view copies 32 bytes; bytes(out) walks the items
    reset, absorb, digest = lib.keccak_reset, lib.keccak_absorb, lib.keccak_digest

    def hasher(data: bytes) -> bytes:
        if reset(raw) or absorb(raw, data, len(data)) or digest(raw, out, 32, _KECCAK_PADDING):
            raise RuntimeError("pycryptodome keccak failed")
        return view[:]

    hasher.owner = owner  # type: ignore[attr-defined]  # keep the state alive
    return hasher


def bulk_keccak256() -> Hasher:
    """A keccak256 function for one bulk job (see the module docstring)."""
    global _fast_ok
    if _fast_ok is False:
        return keccak256
    try:
        hasher = _fast_hasher()
        if _fast_ok is None:
            _fast_ok = all(hasher(data) == keccak256(data) for data in _CHECKS)
    except (ImportError, AttributeError, TypeError, OSError, RuntimeError):
        # a missing or changed internal binding: use the public path
        _fast_ok = False
    return hasher if _fast_ok else keccak256
