"""node/zygote/cmdline.py: /proc/PID/cmdline keeps reading a forked child's argv to the end.

The kernel reads a process's cmdline from the memory range `show` recorded, for as long as the
process lives. While Python shuts down it frees what its modules hold; a range that pointed into
memory Python owned then read whatever was allocated there next (seen on a CI run: `planet
devnet down` polling a forked keeper's cmdline while it exited got undecodable bytes).
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

from node.zygote import cmdline

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc and prctl are Linux's")


SKIPPED = 3  # the child's exit status when the kernel refuses PR_SET_MM_MAP


def _in_child(check) -> None:  # type: ignore[no-untyped-def]
    """Run `check` in a forked child; fail with what it wrote if it did not exit 0."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's cleanup
        os.close(read)
        try:
            check()
        except cmdline.CmdlineError as error:
            os.write(write, str(error).encode()[:4000])
            os._exit(SKIPPED)
        except BaseException as error:  # everything else goes back to the parent
            os.write(write, repr(error).encode()[:4000])
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == SKIPPED:
        pytest.skip(f"the kernel refused PR_SET_MM_MAP here: {said}")
    assert os.waitstatus_to_exitcode(status) == 0, said


def test_cmdline_outlives_every_python_reference_to_it() -> None:
    argv = ["/usr/bin/python3", "-m", "planet.keeper", "--home", "/tmp/" + "h" * 40]

    def check() -> None:
        cmdline.show(argv, {"A": "1"})
        # what interpreter shutdown does: the module's objects go, and their memory is reused
        sys.modules.pop("node.zygote.cmdline", None)
        vars(cmdline).clear()
        gc.collect()
        filler = [bytes([0xB2]) * size for size in range(8, 600) for _ in range(40)]
        seen = Path("/proc/self/cmdline").read_bytes()
        del filler
        assert seen == b"\0".join(os.fsencode(a) for a in argv) + b"\0", seen[:80]

    _in_child(check)
