"""Which modules a fresh interpreter has imported after running some code (start-up cost tests:
tests/unit/test_start_imports.py, tests/unit/test_lazy_bls.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def loaded_after(code: str, *names: str) -> list[str]:
    """Which of `names` a fresh interpreter (`python -c`, the repository on its path) has
    imported after running `code`."""
    listed = f"[n for n in {list(names)!r} if sys.modules.get(n)]"
    probe = f"{code}\nimport json, sys\nprint(json.dumps({listed}))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))
