"""Frames: the binary messages that carry hidden states along a circuit's links.

    header.py    the 17-byte frame header, `pack_frame` and `parse_frame` (its one parser)
    codecs.py    dtypes and codec names (wire format), body sizes, encode_body / decode_values
    blocks.py    what the blockwise codecs share: 64-value blocks, the Walsh-Hadamard rotation
    int8.py      "int8": blockwise absmax int8
    hq9.py       "hq9": rotated blocks, 9-bit codes (what `--compress` uses)
    ohq.py       "ohq7": outlier split off, rotated 7-bit codes (opt-in)
    rq.py        "rq": rms-scaled integers, Rice-coded, variable rate (opt-in)
    sessions.py  session capabilities and their public tags
    errors.py    FrameError and its named refusals

The links themselves (WebSockets, control messages, who forwards to whom) are
protocol/stream.py. Pure numpy; no torch, no aiohttp here.
"""
