"""deploy.netlab without namespaces: latency matrices, link shapes, names, addresses, toxics."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from deploy.netlab import MatrixError, Shape, UnknownRegion, default_matrix, parse_matrix
from deploy.netlab.hosts import netns_name, plan_addresses, run_of, veth_name
from deploy.netlab.links import HOLD_MS, Cut, _toxics
from deploy.netlab.regions import link_shapes

pytestmark = pytest.mark.unit

MATRIX = """\
# one-way delays, ms
from/to,virginia,tokyo,saopaulo,singapore
virginia,1,73,60,110
tokyo,73,1,128,35
saopaulo,60,128,1,161
singapore,110,35,161.4,0.5
"""


def test_parse_matrix_reads_one_way_delays_per_ordered_region_pair() -> None:
    matrix = parse_matrix(MATRIX)
    assert matrix.regions == ("virginia", "tokyo", "saopaulo", "singapore")
    assert matrix.delay_ms("virginia", "tokyo") == 73
    assert matrix.delay_ms("saopaulo", "singapore") == 161
    assert matrix.delay_ms("singapore", "saopaulo") == 161  # 161.4 rounds to whole ms
    assert matrix.delay_ms("singapore", "singapore") == 1  # 0.5 rounds half up
    assert len(matrix.delays_ms) == 16


def test_link_shapes_give_each_ordered_host_pair_its_regions_delay_and_5_percent_jitter() -> None:
    placement = {"anvil": "virginia", "v0": "tokyo", "v1": "saopaulo", "v2": "singapore"}
    shapes = link_shapes(parse_matrix(MATRIX), placement, kbytes_per_s=1000)
    assert len(shapes) == 12  # 4 hosts, every ordered pair, none to itself
    assert shapes[("anvil", "v0")] == Shape(73, 4, 1000)  # 3.65 ms jitter rounds to 4
    assert shapes[("v1", "v2")] == Shape(161, 8, 1000)  # 8.05 -> 8
    assert shapes[("v2", "v1")] == Shape(161, 8, 1000)
    assert shapes[("v0", "v2")] == Shape(35, 2, 1000)  # 1.75 -> 2


def test_link_shapes_asymmetric_matrix_gives_each_direction_its_own_delay() -> None:
    matrix = parse_matrix("x,a,b\na,0,40\nb,10,0\n")
    shapes = link_shapes(matrix, {"h1": "a", "h2": "b", "h3": "a"})
    assert shapes[("h1", "h2")].latency_ms == 40
    assert shapes[("h2", "h1")].latency_ms == 10
    assert shapes[("h1", "h3")] == Shape(0, 0)  # same region: the diagonal


def test_link_shapes_unknown_region_is_named() -> None:
    with pytest.raises(UnknownRegion, match="mars"):
        link_shapes(parse_matrix(MATRIX), {"a": "virginia", "b": "mars"})


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("", 1, "no header"),
        ("from/to\n", 1, "names no regions"),
        ("x,a,a\na,1,1\n", 1, "named twice"),
        ("x,a,b c\n", 1, "bad region name"),
        ("x,a,b\na,1,2\nc,1,2\n", 3, "not in the header"),
        ("x,a,b\na,1,2\na,1,2\n", 3, "second row"),
        ("x,a,b\na,1\n", 2, "1 delays for 2 regions"),
        ("x,a,b\na,1,-2\nb,1,1\n", 2, "not a number"),
        ("x,a,b\na,1,1e3\nb,1,1\n", 2, "not a number"),
        ("x,a,b\na,1,0.0001\nb,1,1\n", 2, "not a number"),
        ("x,a,b\na,1,1234567\nb,1,1\n", 2, "not a number"),
        ("x,a,b\na,1,2\n", 2, "no row for b"),
    ],
)
def test_parse_matrix_rejects_malformed_text_naming_line_and_reason(
    text: str, line: int, reason: str
) -> None:
    with pytest.raises(MatrixError, match=reason) as caught:
        parse_matrix(text)
    assert caught.value.line == line


def test_default_matrix_is_square_and_has_cometbfts_two_reference_links() -> None:
    matrix = default_matrix()
    assert matrix.delay_ms("virginia", "tokyo") == 73
    assert matrix.delay_ms("saopaulo", "singapore") == 161
    assert all(
        matrix.delay_ms(a, b) == matrix.delay_ms(b, a)
        for a in matrix.regions
        for b in matrix.regions
    )


@pytest.mark.parametrize(
    "arguments",
    [(-1, 0, None), (10, 11, None), (10, 1, 0), (1.5, 0, None), (True, 0, None)],
)
def test_shape_rejects_impossible_values(arguments: tuple[object, object, object]) -> None:
    with pytest.raises(ValueError):
        Shape(*arguments)  # type: ignore[arg-type]


def test_plan_addresses_numbers_hosts_in_order_and_rejects_bad_names() -> None:
    network = IPv4Network("10.77.0.0/24")
    assert plan_addresses(["anvil", "v0"], network) == {
        "anvil": IPv4Address("10.77.0.1"),
        "v0": IPv4Address("10.77.0.2"),
    }
    for names in (["Anvil"], ["a", "a"], ["a_b"], [], ["x" * 32]):
        with pytest.raises(ValueError):
            plan_addresses(names, network)
    with pytest.raises(ValueError, match="do not fit"):
        plan_addresses([f"h{i}" for i in range(3)], IPv4Network("10.77.0.0/30"))


def test_names_carry_the_run_id_and_fit_linux_interface_names() -> None:
    assert run_of(netns_name("3fa2c1", "validator0")) == "3fa2c1"
    assert run_of(veth_name("3fa2c1", 7)) == "3fa2c1"
    assert run_of("pnl3fa2c1br") == "3fa2c1"
    assert len(veth_name("3fa2c1", 999)) <= 15  # IFNAMSIZ - 1
    for foreign in ("eth0", "pnl3fa2c1", "pnlxyzxyz-a", "docker0", "pnl3fa2c1v12"):
        assert run_of(foreign) is None


def test_toxics_follow_shape_and_cut() -> None:
    assert _toxics("upstream", Shape(), None) == []
    delayed = _toxics("upstream", Shape(50, 3, 200), None)
    assert [(t.name, t.kind, dict(t.attributes)) for t in delayed] == [
        ("delay-upstream", "latency", {"latency": 50, "jitter": 3}),
        ("rate-upstream", "bandwidth", {"rate": 200}),
    ]
    held = _toxics("downstream", Shape(), Cut.PARTITION)
    assert [(t.name, dict(t.attributes)["latency"]) for t in held] == [("cut-downstream", HOLD_MS)]
    assert _toxics("downstream", Shape(), Cut.DOWN) == []  # a down link disables its proxies
