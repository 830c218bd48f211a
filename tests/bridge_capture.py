"""A packet capture of a hosts lab's bridge (deploy/netlab): what anyone on the path between the
lab's hosts reads.

    with BridgeCapture(run_id, host_count) as capture:
        ...                                   # traffic between the hosts
    flows = capture.flows()                   # {(src, sport, dst, dport): TCP payload bytes}

One AF_PACKET socket (root) on every root-side veth of the lab (`pnl<run>v<index>`) keeps the
frames the bridge hands to a host (PACKET_OUTGOING there), so each frame crossing the bridge is
seen once. The payloads of each TCP flow are joined in arrival order: enough to look for a
string, or a 64-byte window, in what a link carried (retransmits may repeat bytes; nothing here
decrypts anything). Bounded: at most `max_bytes` of payload, then the capture stops keeping.
"""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
PACKET_OUTGOING = 4
IPPROTO_TCP = 6
MAX_BYTES = 64 << 20

Flow = tuple[str, int, str, int]


def tcp_payload(frame: bytes) -> tuple[Flow, bytes] | None:
    """The (flow, payload) of an Ethernet frame carrying IPv4 TCP with data, else None."""
    if len(frame) < 14 + 20 or struct.unpack("!H", frame[12:14])[0] != ETH_P_IP:
        return None
    ip = frame[14:]
    header = (ip[0] & 0x0F) * 4
    if ip[9] != IPPROTO_TCP or len(ip) < header + 20:
        return None
    total = struct.unpack("!H", ip[2:4])[0]
    tcp = ip[header:total]
    if len(tcp) < 20:
        return None
    offset = (tcp[12] >> 4) * 4
    payload = tcp[offset:]
    if not payload:
        return None
    sport, dport = struct.unpack("!HH", tcp[:4])
    return (socket.inet_ntoa(ip[12:16]), sport, socket.inet_ntoa(ip[16:20]), dport), payload


class BridgeCapture:
    def __init__(self, run_id: str, host_count: int, *, max_bytes: int = MAX_BYTES) -> None:
        from deploy.netlab.hosts import veth_name

        self.devices = {veth_name(run_id, index) for index in range(host_count)}
        self.max_bytes = max_bytes
        self.kept = 0
        self.frames = 0
        self._flows: dict[Flow, bytearray] = {}
        self._stop = threading.Event()
        self._socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._socket.settimeout(0.2)
        self._thread = threading.Thread(target=self._run, name="bridge-capture", daemon=True)

    def __enter__(self) -> BridgeCapture:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frame, address = self._socket.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            device, packet_type = address[0], address[2]
            if device not in self.devices or packet_type != PACKET_OUTGOING:
                continue
            self.frames += 1
            found = tcp_payload(frame)
            if found is None or self.kept >= self.max_bytes:
                continue
            flow, payload = found
            self._flows.setdefault(flow, bytearray()).extend(payload)
            self.kept += len(payload)

    def flows(self) -> dict[Flow, bytes]:
        return {flow: bytes(data) for flow, data in self._flows.items()}
