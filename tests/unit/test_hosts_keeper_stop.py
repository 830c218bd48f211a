"""`stop_lab` (deploy/devnet/hosts.py) returns only once the hosts' keeper is gone. `planet devnet
down` once returned while the keeper was still exiting (its command line already empty, so no
longer "ours"), and the hosts test found it alive; after a SIGKILL it did not wait at all (the
stuck-keeper case fails on the old code).

The keeper here is a stand-in: a real process whose argv names the keeper's module, started
without a lab (`run_id` unset, so nothing else is removed)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from deploy.devnet import hosts
from node.server.launcher import pid_alive

pytestmark = pytest.mark.unit

# exits 0.3 s after SIGTERM (a keeper removing its lab), or ignores it (a stuck keeper)
ON_TERM = {False: "lambda *_: (time.sleep(0.3), sys.exit(0))", True: "signal.SIG_IGN"}


def _keeper(ignore_term: bool) -> subprocess.Popen[str]:
    code = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, {ON_TERM[ignore_term]})\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    time.sleep(1)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, hosts.KEEPER_MODULE], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    return process


@pytest.mark.parametrize("ignore_term", [False, True], ids=["exits-on-term", "needs-kill"])
def test_stop_lab_returns_once_the_keeper_is_gone(
    monkeypatch: pytest.MonkeyPatch, ignore_term: bool
) -> None:
    monkeypatch.setattr(hosts, "KEEPER_STOP_S", 1.0)
    keeper = _keeper(ignore_term)
    try:
        started = time.monotonic()
        assert hosts.stop_lab({"hosts": {"pid": keeper.pid}}) == ["hosts"]
        assert not pid_alive(keeper.pid)  # a zombie (our unreaped child) counts as gone
        assert time.monotonic() - started < 1.0 + hosts.KEEPER_KILL_S
        keeper.wait(timeout=5)
        assert keeper.returncode == (-9 if ignore_term else 0)
    finally:
        keeper.kill()
        keeper.wait()


def test_stop_lab_leaves_a_process_that_is_not_the_keeper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert hosts.stop_lab({"hosts": {"pid": other.pid}}) == []
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
