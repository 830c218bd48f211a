"""Who a caller is, for per-caller limits: the peer address of the TCP connection.

Honest limits of this definition:
- it is the address the node sees, never a header the caller writes (`X-Forwarded-For` and the
  like are ignored: any stranger could forge them);
- an IPv6 caller is its /64 prefix (one host usually owns a whole /64, so per-address quotas
  would be free to multiply);
- a gateway or a NAT serves many users from one address; they share one caller's quota, which
  the node operator raises for known gateways (`max_sessions_per_peer`), or the gateway spreads
  its users over several nodes of the shard;
- one attacker with many addresses gets many shares; the node-wide caps and idle reclaiming
  bound what they can hold, not the number of addresses.
"""

from __future__ import annotations

import ipaddress

UNKNOWN_PEER = "unknown"


def peer_key(remote: str | None) -> str:
    """The caller key of a connection's remote address (`request.remote`)."""
    if not remote:
        return UNKNOWN_PEER
    try:
        address = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return UNKNOWN_PEER
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)
