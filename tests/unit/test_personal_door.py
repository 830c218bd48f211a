"""Issue 42, attack 6: any web page spent the personal client's credits. The personal client's
app (node/gateway/app.py with `PersonalDesk` and its door, node/gateway/personal_guard.py),
served over real HTTP on loopback, answers only its user's own tools: a foreign Origin, a
foreign Host (DNS rebinding), a missing or wrong token, a text/plain or form body are each
refused by name in OpenAI's error shape, and nothing is served on them (no circuit asked, no
credit paid); the official `openai` client with the token as its API key is answered. The token
file (node/gateway/personal_token.py) is 0600, survives restarts, and is refused when others
may read it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import node.gateway.app as gateway_app
import node.gateway.personal_guard as guard_module
from node.gateway.app import create_app
from node.gateway.personal import PersonalDesk
from node.gateway.personal_token import load_or_create, read_token
from protocol.errors import ConfigError
from tests.unit.gateway_fakes import CHAT, FakeEscrow, Script, ScriptedGeneration, build_gateway

pytestmark = pytest.mark.unit

# a question's JSON, as a page sends it in a text/plain body (no preflight)
RAW_JSON = json.dumps({**CHAT, "max_tokens": 2}).encode()
TOKEN = "planet-personal-" + "Ab3_-" * 8 + "xyz"


@dataclass
class FakeWallet:
    held: int = 10

    def count(self) -> int:
        return self.held


@dataclass
class FakePayer:
    """What PersonalDesk reads of a CreditPayer (credits spent and left)."""

    spent: int = 0
    wallet: FakeWallet = field(default_factory=FakeWallet)


@dataclass
class Door:
    url: str
    port: int
    script: Script
    http: aiohttp.ClientSession

    async def post(
        self,
        body: bytes | dict[str, Any],
        headers: dict[str, str],
        path: str = "/v1/chat/completions",
    ) -> tuple[int, dict[str, Any]]:
        kwargs: dict[str, Any] = {"json": body} if isinstance(body, dict) else {"data": body}
        async with self.http.post(self.url + path, headers=headers, **kwargs) as answer:
            return answer.status, await answer.json(content_type=None)

    async def get(self, path: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        async with self.http.get(self.url + path, headers=headers) as answer:
            return answer.status, await answer.json(content_type=None)


@pytest.fixture
async def door(aiohttp_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The personal client's app over real HTTP on 127.0.0.1, its nodes scripted."""
    script = Script()
    monkeypatch.setattr(ScriptedGeneration, "script", script, raising=False)
    monkeypatch.setattr(gateway_app, "Generation", ScriptedGeneration)
    nodes = aiohttp.ClientSession()
    gateway = build_gateway(tmp_path, nodes, FakeEscrow())
    gateway.desk = PersonalDesk(FakePayer())  # type: ignore[arg-type]
    server = await aiohttp_server(
        create_app(gateway, guards=[guard_module.personal_guard(TOKEN, "127.0.0.1")]),
        host="127.0.0.1",
    )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        yield Door(f"http://127.0.0.1:{server.port}", server.port, script, http)
    await nodes.close()


def _auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _refusal(status: int, doc: dict[str, Any], want_status: int, code: str) -> dict[str, Any]:
    assert status == want_status, doc
    error = doc["error"]
    assert set(error) == {"message", "type", "param", "code"}  # OpenAI's shape
    assert error["code"] == code and error["message"]
    return error


async def test_the_cross_site_simple_post_of_the_attack_is_refused_and_nothing_is_served(
    door: Door,
) -> None:
    """What a page the user visits sends with `fetch(url, {method: "POST", mode: "no-cors",
    body})`: no preflight, a text/plain body that parses as JSON, its own Origin, no token."""
    door.script.tokens(10, 11)
    raw = (
        b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    )
    headers = {"Content-Type": "text/plain;charset=UTF-8", "Origin": "https://evil.example"}
    status, doc = await door.post(raw, headers)
    _refusal(status, doc, 403, "origin_not_allowed")
    assert not door.script.started.is_set()  # no circuit asked: no credit paid


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"Origin": "https://evil.example"}, 403, "origin_not_allowed"),
        ({"Origin": "null"}, 403, "origin_not_allowed"),  # a sandboxed frame, a file: page
        ({"Origin": "http://127.0.0.1:1"}, 403, "origin_not_allowed"),  # another local port
        ({"Host": "evil.example:{port}"}, 403, "host_not_allowed"),  # DNS rebinding
        (
            {"Host": "evil.example:{port}", "Origin": "http://evil.example:{port}"},
            403,
            "host_not_allowed",
        ),
        ({"Host": "127.0.0.1:1"}, 403, "host_not_allowed"),  # not the port it serves
        ({"Host": "localhost.evil.example:{port}"}, 403, "host_not_allowed"),
        ({"Host": "127.0.0.1"}, 403, "host_not_allowed"),  # port 80 implied
        ({"Authorization": None}, 401, "token_missing"),
        ({"Authorization": "Bearer unused"}, 401, "token_invalid"),
        ({"Authorization": f"Bearer {TOKEN}x"}, 401, "token_invalid"),
        ({"Authorization": f"Basic {TOKEN}"}, 401, "token_invalid"),
    ],
)
async def test_a_foreign_origin_host_or_token_is_refused_by_name_and_nothing_is_served(
    door: Door, headers: dict[str, Any], status: int, code: str
) -> None:
    door.script.tokens(10, 11)
    sent = _auth()
    for name, value in headers.items():  # None: the header is not sent
        sent.pop(name, None) if value is None else sent.update({name: value.format(port=door.port)})
    answer_status, doc = await door.post({**CHAT, "max_tokens": 2}, sent)
    _refusal(answer_status, doc, status, code)
    assert not door.script.started.is_set()


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        (
            "text/plain",
            RAW_JSON,
        ),
        ("application/x-www-form-urlencoded", b"model=fake-model"),
        ("multipart/form-data; boundary=x", b"--x--"),
        (None, b'{"model": "fake-model"}'),
    ],
)
async def test_a_body_that_is_not_json_is_refused_with_415(
    door: Door, content_type: str | None, body: bytes
) -> None:
    door.script.tokens(10, 11)
    headers = _auth() | ({"Content-Type": content_type} if content_type else {})
    status, doc = await door.post(body, headers)
    _refusal(status, doc, 415, "unsupported_media_type")
    assert not door.script.started.is_set()


async def test_every_route_needs_the_token(door: Door) -> None:
    for path in ("/health", "/v1/models", "/v1/pools", "/v1/network", "/"):
        status, doc = await door.get(path, {})
        _refusal(status, doc, 401, "token_missing")
    status, doc = await door.get("/v1/models", _auth())
    assert status == 200 and doc["data"][0]["id"] == "fake-model"


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}"])
async def test_its_own_tools_are_answered_under_a_loopback_host_and_their_own_origin(
    door: Door, host: str
) -> None:
    host = host.format(port=door.port)
    headers = {**_auth(), "Host": host, "Origin": f"http://{host}"}
    door.script.tokens(10, 11)
    status, doc = await door.post({**CHAT, "max_tokens": 2}, headers)
    assert status == 200, doc
    assert doc["planet_receipt"]["paid_with"] == "credits"
    assert door.script.started.is_set()


async def test_the_official_openai_client_with_the_token_as_its_api_key(door: Door) -> None:
    import openai

    wrong = openai.AsyncOpenAI(
        base_url=door.url + "/v1", api_key="unused", max_retries=0, timeout=20
    )
    with pytest.raises(openai.AuthenticationError) as caught:
        await wrong.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert caught.value.status_code == 401 and caught.value.code == "token_invalid"
    assert not door.script.started.is_set()
    api = openai.AsyncOpenAI(base_url=door.url + "/v1", api_key=TOKEN, max_retries=0, timeout=20)
    door.script.tokens(10, 11)
    answer = await api.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 2
    assert answer.model_extra and answer.model_extra["planet_receipt"]["paid_with"] == "credits"
    await wrong.close()
    await api.close()


# --- the token file --------------------------------------------------------------------------


def test_the_token_file_is_0600_and_survives_restarts(tmp_path: Path) -> None:
    path = tmp_path / "home" / "personal-token"
    old = os.umask(0)  # the mode is set at creation, whatever the umask
    try:
        token, created = load_or_create(path)
    finally:
        os.umask(old)
    assert created and path.stat().st_mode & 0o777 == 0o600
    assert token.startswith("planet-personal-") and len(token) == len("planet-personal-") + 43
    assert load_or_create(path) == (token, False)  # the next start: the same token
    assert read_token(path) == token
    other, created = load_or_create(tmp_path / "other-token")
    assert created and other != token  # drawn at random


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: (p.write_text(TOKEN), p.chmod(0o644)), "open to others"),
        (lambda p: (p.write_text(TOKEN), p.chmod(0o620)), "open to others"),
        (lambda p: (p.write_text("hunter2\n"), p.chmod(0o600)), "does not hold a token"),
        (lambda p: (p.write_bytes(b"\xff" * 10_000), p.chmod(0o600)), "does not hold a token"),
        (lambda p: p.symlink_to(p.with_name("elsewhere")), "cannot read"),
        (lambda p: p.mkdir(), "cannot read|not a regular file"),
    ],
)
def test_a_token_file_open_to_others_or_not_a_token_is_refused_never_overwritten(
    tmp_path: Path, setup: Any, message: str
) -> None:
    path = tmp_path / "personal-token"
    (tmp_path / "elsewhere").write_text(TOKEN)
    (tmp_path / "elsewhere").chmod(0o600)
    setup(path)
    before = path.lstat()
    with pytest.raises(ConfigError, match=message):
        load_or_create(path)
    assert path.lstat().st_mtime_ns == before.st_mtime_ns  # left as it was


def test_the_cli_prints_the_token_once_and_reuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`planet gateway serve --personal`: the token is drawn at the first start (printed, with
    where it is kept), reused at the next (not printed again); `$PLANET_PERSONAL_TOKEN_FILE`
    names the file. (The starts here stop at the model: the token comes first.)"""
    from planet import main as cli

    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    path = tmp_path / "state" / "token"
    monkeypatch.setenv("PLANET_PERSONAL_TOKEN_FILE", str(path))
    monkeypatch.setenv("PLANET_HOME", str(tmp_path / "home"))
    argv = ["gateway", "serve", "--personal", "--manifest", str(manifest)]
    argv += ["--committee-rpc", "http://127.0.0.1:9"]
    assert cli.main(argv) != 0
    first = capsys.readouterr()
    token = read_token(path)
    assert token in first.out and str(path) in first.out and "Traceback" not in first.err
    assert cli.main(argv) != 0
    second = capsys.readouterr()
    assert token not in second.out + second.err and read_token(path) == token
    flag = tmp_path / "flag-token"
    assert cli.main([*argv, "--token-file", str(flag)]) != 0
    assert read_token(flag) in capsys.readouterr().out  # the flag wins over the environment
