"""How much memory this machine has for a joining node (`planet join --shards auto`,
node/agent/placement.py `MemoryFit`): the kernel's MemAvailable (Linux, /proc/meminfo: what can
be allocated without swapping, page cache it may drop included), else the free physical pages
(`os.sysconf`), less a fixed headroom for the node agent, the node's Python runtime and the
rest of the machine."""

from __future__ import annotations

import os
import re
from pathlib import Path

from protocol.errors import UsageError

HEADROOM_BYTES = 1024**3  # kept back: the agent and the node process's own runtime
MEMINFO = Path("/proc/meminfo")
_AVAILABLE = re.compile(r"^MemAvailable:\s+([0-9]{1,15}) kB$", re.MULTILINE)


class MemoryUnknown(UsageError):
    code = "memory_unknown"

    def __init__(self) -> None:
        super().__init__(
            "cannot read how much memory this machine has available (no MemAvailable in "
            f"{MEMINFO}, no free-page count from the OS) to size the span",
            hint="give the span's size yourself: --shards N (or --shard K)",
        )


def parse_meminfo(text: str) -> int | None:
    """/proc/meminfo's text → MemAvailable in bytes, None when it has no such line."""
    found = _AVAILABLE.search(text)
    return int(found.group(1)) * 1024 if found else None


def available_bytes(meminfo: Path = MEMINFO) -> int:
    """The bytes this machine can give a new process now, or `MemoryUnknown`."""
    try:
        found = parse_meminfo(meminfo.read_text(encoding="ascii", errors="replace"))
    except OSError:
        found = None
    if found is not None:
        return found
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        raise MemoryUnknown() from None
