"""The activations' dtypes a raw frame may carry, and the one clients send by default.

Numpy-free, so that the command line can offer `--wire-dtype` without loading numpy. The order
is wire format (a header carries the index, protocol/frames/header.py): append, never reorder.

    float32  exact activations, 4 bytes a value
    float16  half the bytes; every hop rounds its activations to fp16 (|x| ≤ 65504, else the
             frame is refused with Fp16OverflowError, never saturated)
"""

from __future__ import annotations

from typing import Final

WIRE_DTYPES: Final = ("float32", "float16")
# What every client sends unless asked otherwise (`--wire-dtype float32`): half the bytes per
# token on node ports; what it does to greedy tokens is measured in docs/compute.md.
WIRE_DTYPE: Final = "float16"

WIRE_DTYPE_HELP: Final = (
    "activations' dtype on the wire: float16 (default) sends half the bytes of float32 and "
    "rounds the activations to fp16 at every hop (greedy tokens can differ from an fp32 run, "
    "see docs/compute.md); float32 for exact activations"
)
