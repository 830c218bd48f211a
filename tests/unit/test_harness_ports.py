"""The tests' own loopback ports (harness/ports.py): from the lane's range, never twice."""

from __future__ import annotations

import socket

import pytest

from harness import ports

pytestmark = pytest.mark.unit


def test_ports_come_from_the_lanes_range_distinct_and_free(monkeypatch) -> None:
    busy = 20_003  # bound by another program
    monkeypatch.setenv("PLANET_TEST_PORTS", "20000-20007")
    monkeypatch.setattr(ports, "_HANDED_OUT", set())
    monkeypatch.setattr(ports, "port_free", lambda port: port != busy)
    drawn = [ports.ephemeral_port() for _ in range(7)]
    assert sorted(drawn) == [p for p in range(20_000, 20_008) if p != busy]
    with pytest.raises(RuntimeError, match="no free loopback port"):
        ports.ephemeral_port()  # all 8 are handed out or busy


def test_a_port_bound_right_now_is_not_free() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        assert not ports.port_free(taken.getsockname()[1])


@pytest.mark.parametrize("value", ["10-20", "abc", "20000-10000", "1024-70000"])
def test_a_bad_range_is_refused_by_name(monkeypatch, value: str) -> None:
    monkeypatch.setenv("PLANET_TEST_PORTS", value)
    with pytest.raises(ValueError, match="PLANET_TEST_PORTS"):
        ports.port_range()


def test_the_default_range_is_below_the_kernels_ephemeral_ports(monkeypatch) -> None:
    monkeypatch.delenv("PLANET_TEST_PORTS", raising=False)
    low, high = ports.port_range()
    assert (low, high) == ports.DEFAULT_RANGE and high < 32_768
