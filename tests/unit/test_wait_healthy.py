"""`wait_healthy` believes a node's /health only from the node's own process."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from node.server.launcher import NodeProcess, wait_healthy
from protocol.errors import UnavailableError

pytestmark = pytest.mark.unit

# a stand-in node: answers /health 200 on the port in argv[1] once it has "loaded"
SERVE = """
import sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status": "ok"}')
    def log_message(self, *args): pass
time.sleep(0.3)
HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""
# a stand-in node that loads, then cannot bind its port (as `planet node serve` reports it)
FAIL_TO_BIND = """
import sys, time
time.sleep(1.0)
print("error: cannot listen on 127.0.0.1:%s: address already in use" % sys.argv[1])
sys.exit(1)
"""


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stranger() -> Iterator[int]:
    """Another program answering /health 200 on a port: the port a node then fails to bind."""
    server = HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _spawn(code: str, port: int, log_path: Path) -> tuple[NodeProcess, subprocess.Popen[bytes]]:
    with log_path.open("w") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(port)], stdout=log, stderr=subprocess.STDOUT
        )
    return NodeProcess(0, port, child.pid, log_path, log_path.with_suffix(".pid")), child


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_node_that_failed_to_bind_is_not_taken_for_healthy_by_anothers_answer(
    stranger: int, tmp_path: Path
) -> None:
    node, _ = _spawn(FAIL_TO_BIND, stranger, tmp_path / "node.log")
    with pytest.raises(UnavailableError) as caught:
        wait_healthy([node], timeout_s=30)
    assert "exited during start-up" in caught.value.message
    assert "address already in use" in caught.value.message  # its log's last lines


def test_a_node_answering_on_its_own_port_is_healthy(tmp_path: Path) -> None:
    node, child = _spawn(SERVE, _free_port(), tmp_path / "node.log")
    try:
        ready: list[float] = []
        wait_healthy([node], timeout_s=30, on_ready=lambda _n, took: ready.append(took))
        assert len(ready) == 1
    finally:
        child.kill()
        child.wait(timeout=30)
