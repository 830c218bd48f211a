"""Where ezkl lives and how Planet calls it: the ezkl virtualenv's Python running
`ezkl_worker.py` one step at a time (nothing in Planet's own interpreter imports ezkl).

    ezkl_python()            .tools/ezkl-venv/bin/python ($PLANET_EZKL_PYTHON overrides); a
                             missing install raises EzklMissing (ConfigError) with a hint
    run_step(step, args)     one worker step, its JSON result; a failed step raises ZkStepError;
                             a worker that crashed (SIGSEGV/SIGBUS) runs once more
    tools_dir()              .tools of the repository ($PLANET_TOOLS overrides): caches live here

Errors: PlanetError ─┬─ ConfigError ── EzklMissing
                     └─ ZkStepError (a worker step exited non-zero; message names step + stderr)
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from protocol.errors import ConfigError, PlanetError

EZKL_VERSION = "23.0.5"
REPO_ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("ezkl_worker.py")
STEP_TIMEOUT_S = 900
# ezkl's native code has crashed a worker now and then on a loaded CI machine (SIGSEGV in the
# official CI of d8b007d; SIGABRT at interpreter shutdown after a finished build, clean-clone CI
# of 02bef01, which the worker now skips with os._exit): a step is a pure function of its files,
# so a crashed worker is run once more; a second crash is an error
CRASHES = (-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGABRT)
CRASH_RETRIES = 1

log = logging.getLogger(__name__)


class EzklMissing(ConfigError):
    code = "ezkl_missing"

    def __init__(self, python: Path) -> None:
        super().__init__(
            f"ezkl's virtualenv is missing ({python} does not exist)",
            hint="run `bash deploy/setup.sh` (installs ezkl into .tools/ezkl-venv) or set "
            "PLANET_EZKL_PYTHON",
        )


class ZkStepError(PlanetError):
    code = "zk_step"

    def __init__(self, step: str, status: int, stderr: str) -> None:
        tail = stderr.strip()[-1500:]
        super().__init__(f"ezkl step {step!r} failed (exit {status}): {tail}")
        self.step = step


def tools_dir() -> Path:
    return Path(os.environ.get("PLANET_TOOLS") or REPO_ROOT / ".tools")


def ezkl_python() -> Path:
    configured = os.environ.get("PLANET_EZKL_PYTHON")
    python = Path(configured) if configured else tools_dir() / "ezkl-venv" / "bin" / "python"
    if not python.is_file():
        raise EzklMissing(python)
    return python


@functools.cache
def ezkl_site_packages() -> str:
    """The ezkl venv's site-packages (for the ONNX exporter's `onnx` / `onnxscript`)."""
    return subprocess.run(
        [str(ezkl_python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def run_step(step: str, args: dict[str, Any], *, timeout_s: float = STEP_TIMEOUT_S) -> Any:
    """Run one worker step in ezkl's venv and return its JSON result."""
    python = ezkl_python()
    with tempfile.TemporaryDirectory(prefix="planet-zk-") as scratch:
        args_path, result_path = Path(scratch) / "args.json", Path(scratch) / "result.json"
        args_path.write_text(json.dumps(args))
        for attempt in range(CRASH_RETRIES + 1):
            done = subprocess.run(
                [str(python), str(WORKER), step, str(args_path), str(result_path)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "error")},
            )
            if done.returncode not in CRASHES or attempt == CRASH_RETRIES:
                break
            log.warning("ezkl step %r crashed (exit %d): running it again", step, done.returncode)
        if done.returncode != 0 or not result_path.is_file():
            raise ZkStepError(step, done.returncode, done.stderr)
        return json.loads(result_path.read_text())
