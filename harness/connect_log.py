"""Which addresses a real process connects to (tests): a `sitecustomize` that installs a
Python audit hook (`socket.connect`) and appends `HOST PORT` per connect to a file. The
process runs unchanged; the hook only records (issue 43: the personal client over relays must
connect to relays only, never to a node)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

LOG_VARIABLE = "PLANET_TEST_CONNECT_LOG"

_SITECUSTOMIZE = f'''import os
import sys

_LOG = os.environ.get("{LOG_VARIABLE}")


def _record(event, args):
    if event == "socket.connect" and isinstance(args[1], tuple) and len(args[1]) >= 2:
        with open(_LOG, "a") as log:
            log.write(f"{{args[1][0]}} {{args[1][1]}}\\n")


if _LOG:
    sys.addaudithook(_record)
'''


def connect_logging(env: Mapping[str, str], folder: Path, log: Path) -> dict[str, str]:
    """`env` for a Python process whose every socket connect is appended to `log`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    return {**env, "PYTHONPATH": path, LOG_VARIABLE: str(log)}


def connected_ports(log: Path) -> list[int]:
    """The ports connected to, in order (none when the log was never written)."""
    if not log.exists():
        return []
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.strip()]
