"""The canonical node URL (protocol/urls.py): one spelling per host:port, hostile spellings
refused by name. Hostile values are generated from a grammar of what strangers write (user
info, escapes, IPv4 in other bases, zone ids, whitespace, non-ASCII look-alikes, paths)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.stream import BadRouteError, check_next_url
from protocol.urls import BadUrlError, canonical_url

pytestmark = pytest.mark.unit

CANONICAL_RE = re.compile(
    r"https?://(?:[a-z0-9](?:[a-z0-9\-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9\-]*[a-z0-9])?)*"
    r"|\[[0-9a-f:.]+\]):[1-9][0-9]{0,4}"
)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("http://127.0.0.1:18100", "http://127.0.0.1:18100"),
        ("HTTP://LocalHost:18100/", "http://localhost:18100"),
        ("http://node.example.:80", "http://node.example:80"),
        ("http://node.example", "http://node.example:80"),
        ("https://node.example", "https://node.example:443"),
        ("http://[2001:DB8::0001]:8080", "http://[2001:db8::1]:8080"),
        ("http://[::ffff:127.0.0.1]:1", "http://[::ffff:7f00:1]:1"),
        ("http://a-b.c9:65535", "http://a-b.c9:65535"),
    ],
)
def test_canonical_url_one_spelling(raw: str, canonical: str) -> None:
    assert canonical_url(raw) == canonical
    assert canonical_url(canonical) == canonical


@pytest.mark.parametrize(
    "raw",
    [
        "http://user@127.0.0.1:1",  # user info
        "http://user:pw@127.0.0.1:1",
        "http://127.0.0.1:1@evil:2",
        "http://127.0.0.1%2e:1",  # percent-escapes
        "http://%31%32%37.0.0.1:1",
        "http://127.1:1",  # IPv4 in spellings the resolver reads but the list never named
        "http://0x7f.0.0.1:1",
        "http://0x7f000001:1",
        "http://2130706433:1",
        "http://0177.0.0.1:1",
        "http://127.000.000.001:1",
        "http://[fe80::1%25eth0]:1",  # zone id
        "http://[::1:1",
        "http://[not-ipv6]:1",
        "http://a:1/v1/stream",  # paths, queries, fragments
        "http://a:1//",
        "http://a:1?x=1",
        "http://a:1#f",
        "http://a:1\\x",
        " http://a:1",  # whitespace anywhere
        "http://a:1 ",
        "http://a :1",
        "http://a:1\n",
        "http://a\t:1",
        "http://a:1\x00",
        "http://a..b:1",  # empty label
        "http://a.:1.",
        "http://a..:1",
        "http://-a:1",
        "http://a-:1",
        "http://a_b:1",
        "http://nöde:1",  # non-ASCII / look-alikes
        "http://node\u3002example:1",
        "http://ｎｏｄｅ:1",
        "http://a:0",  # ports
        "https://a:0443",
        "http://a:65536",
        "http://a:123456",
        "http://a:+80",
        "http://a:-1",
        "http://a:",
        "ftp://a:1",  # schemes
        "file:///etc/passwd",
        "http:/a:1",
        "//a:1",
        "http://:1",
        "",
        "http://" + "a" * 300 + ":1",
        "http://" + ".".join(["a" * 63] * 4) + ":1",  # 255 characters: over 253
    ],
)
def test_canonical_url_hostile_forms_refused(raw: str) -> None:
    with pytest.raises(BadUrlError):
        canonical_url(raw)


@pytest.mark.parametrize("value", [None, 3, b"http://a:1", ["http://a:1"], {"url": 1}])
def test_canonical_url_non_strings_refused(value: object) -> None:
    with pytest.raises(BadUrlError):
        canonical_url(value)


def test_next_url_parse_is_canonical_and_refusal_is_bad_route() -> None:
    assert check_next_url("HTTP://Node.:18101/") == "http://node:18101"
    with pytest.raises(BadRouteError):
        check_next_url("http://u@node:18101")


# ------------------------------------------------------------------------ grammar of values
LABEL = st.from_regex(r"[a-z0-9]([a-z0-9\-]{0,10}[a-z0-9])?", fullmatch=True)


def _mixed_case(draw: st.DrawFn, text: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(c.upper() if flip else c for c, flip in zip(text, flips, strict=True))


@st.composite
def valid_urls(draw: st.DrawFn) -> tuple[str, str]:
    """(a spelling, its canonical form)."""
    scheme = draw(st.sampled_from(["http", "https"]))
    kind = draw(st.sampled_from(["name", "ipv4", "ipv6"]))
    if kind == "name":
        labels = draw(st.lists(LABEL, min_size=1, max_size=4))
        if all(re.fullmatch(r"0x[0-9a-f]*|[0-9]+", label) for label in labels):
            labels.append("node")  # all-numeric names are IPv4 spellings (refused below)
        host = ".".join(labels)
        written = _mixed_case(draw, host) + draw(st.sampled_from(["", "."]))
    elif kind == "ipv4":
        octets = draw(st.lists(st.integers(0, 255), min_size=4, max_size=4))
        host = written = ".".join(map(str, octets))
    else:
        import ipaddress

        address = ipaddress.IPv6Address(draw(st.integers(0, 2**128 - 1)))
        host = f"[{address.compressed}]"
        written = (
            "["
            + _mixed_case(draw, draw(st.sampled_from([address.exploded, address.compressed])))
            + "]"
        )
    port = draw(st.one_of(st.none(), st.integers(1, 65535)))
    default = 80 if scheme == "http" else 443
    written_port = "" if port is None else ":" + str(port)
    slash = draw(st.sampled_from(["", "/"]))
    spelled = f"{_mixed_case(draw, scheme)}://{written}{written_port}{slash}"
    return spelled, f"{scheme}://{host}:{default if port is None else port}"


HOSTILE_HOST = st.one_of(
    st.builds(
        lambda u: f"{u}@127.0.0.1", st.from_regex(r"[a-z]{1,5}(:[a-z]{0,5})?", fullmatch=True)
    ),
    st.builds(lambda b: f"%{b:02X}", st.integers(0, 255)).map(lambda e: f"node{e}x"),
    st.sampled_from(["127.1", "127.0.1", "0x7f.1", "0x7F000001", "017700000001", "2130706433"]),
    st.builds(
        lambda a, b, c, d: f"{a}.{b}.{c}.{d}", *[st.integers(0, 255)] * 3, st.integers(256, 9999)
    ),
    st.builds(lambda o: f"0{o}.0.0.1", st.integers(0, 377)),
    st.builds(lambda z: f"[fe80::1%25{z}]", st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True)),
    st.builds(lambda c: f"no{c}de", st.sampled_from(list("_ !\"$&'()*+,;=<>^`{|}~\\"))),
    st.builds(lambda c: f"no{c}de", st.characters(min_codepoint=128, max_codepoint=0x10FFFF)),
    st.sampled_from(["", ".", "..", "a..b", "-a", "a-", "a.-b", "a..", "[::1", "::1]"]),
)
WHITESPACE = st.sampled_from(
    [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x00", "\x7f", "\xa0", "\u2028", "\u3000"]
)
HOSTILE_TAIL = st.one_of(
    st.from_regex(r"/[a-z0-9/._\-]{1,20}", fullmatch=True).filter(lambda p: p != "/"),
    st.from_regex(r"[?#][a-z0-9=&]{0,10}", fullmatch=True),
    st.sampled_from(["//", "/..", "\\", "/%2e%2e", ":", "::1"]),
)


@st.composite
def hostile_urls(draw: st.DrawFn) -> str:
    spelled, _ = draw(valid_urls())
    how = draw(st.sampled_from(["host", "whitespace", "tail", "port", "scheme"]))
    if how == "host":
        port = draw(st.integers(1, 65535))
        return f"http://{draw(HOSTILE_HOST)}:{port}"
    if how == "whitespace":
        at = draw(st.integers(0, len(spelled)))
        return spelled[:at] + draw(WHITESPACE) + spelled[at:]
    if how == "tail":
        return spelled.rstrip("/") + draw(HOSTILE_TAIL)
    if how == "port":
        bad = draw(
            st.one_of(
                st.integers(65536, 10**5 - 1).map(str),
                st.just("0"),
                st.just(""),
                st.from_regex(r"[+\-][0-9]{1,4}", fullmatch=True),
                st.from_regex(r"[0-9]{6,8}", fullmatch=True),
            )
        )
        return f"http://node:{bad}"
    scheme = draw(st.sampled_from(["ftp", "ws", "file", "gopher", "httpx", "", "http:", "h ttp"]))
    return scheme + spelled[spelled.index("://") :]


@given(valid_urls())
@settings(max_examples=200, deadline=None)
def test_canonical_url_valid_grammar_maps_to_one_fixpoint(pair: tuple[str, str]) -> None:
    spelled, expected = pair
    assert canonical_url(spelled) == expected
    assert canonical_url(expected) == expected
    assert CANONICAL_RE.fullmatch(expected)


@given(hostile_urls())
@settings(max_examples=300, deadline=None)
def test_canonical_url_hostile_grammar_refused_by_name(raw: str) -> None:
    with pytest.raises(BadUrlError):
        canonical_url(raw)


@given(st.text(max_size=80))
@settings(max_examples=300, deadline=None)
def test_canonical_url_any_text_is_refused_or_a_canonical_fixpoint(raw: str) -> None:
    try:
        out = canonical_url(raw)
    except BadUrlError:
        return
    assert CANONICAL_RE.fullmatch(out) and canonical_url(out) == out
