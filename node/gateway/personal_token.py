"""The personal client's bearer token: the secret every request to it must carry (issue 42).

`planet gateway serve --personal` answers only requests with `Authorization: Bearer <token>`
(node/gateway/personal_guard.py), so a web page the user visits cannot spend the user's
credits through it. The token is drawn at the first start (32 bytes of system randomness),
kept in a file of mode 0600 next to the personal client's other state
(`<PLANET_HOME>/personal-token`, or `--token-file` / `$PLANET_PERSONAL_TOKEN_FILE`), printed
when it is made, and reused on later starts; the official `openai` client takes it as its
`api_key`. Delete the file to draw a new one.

The file holds one line, `planet-personal-<43 base64url characters>`. A file that others may
read or write (any group/other permission bit) or that holds anything else is refused by name
(never overwritten: the user may have put it there), and so is a symlink.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from pathlib import Path

from protocol.errors import ConfigError

TOKEN_FILE = "personal-token"  # under PLANET_HOME
TOKEN_FILE_ENV = "PLANET_PERSONAL_TOKEN_FILE"
PREFIX = "planet-personal-"
_TOKEN = re.compile(re.escape(PREFIX) + r"[A-Za-z0-9_-]{43}\Z")
_MAX_FILE_BYTES = 4096


def default_token_file(flag: Path | None) -> Path:
    """`--token-file`, else `$PLANET_PERSONAL_TOKEN_FILE`, else `<PLANET_HOME>/personal-token`."""
    from node.client.nodesfile import planet_home

    if flag is not None:
        return flag
    env = os.environ.get(TOKEN_FILE_ENV)
    if env:
        return Path(env)
    return planet_home() / TOKEN_FILE


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def is_token(text: str) -> bool:
    return _TOKEN.match(text) is not None


def load_or_create(path: Path) -> tuple[str, bool]:
    """The token in `path`, drawn and written (mode 0600) if there is none: (token, created)."""
    try:
        return read_token(path), False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = new_token()
    try:
        # O_EXCL: two clients starting at once never overwrite each other's token; the mode is
        # set at creation (a umask can only narrow it), so the secret is never readable by others
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    except FileExistsError:  # another start made it meanwhile: use that one
        return read_token(path), False
    except OSError as error:
        raise ConfigError(
            f"cannot write the personal client's token to {path}: {error.strerror}",
            hint="pass --token-file PATH (or $PLANET_PERSONAL_TOKEN_FILE) in a folder you own",
        ) from None
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        with contextlib.suppress(OSError):
            path.unlink()
        raise ConfigError(f"cannot write the personal client's token to {path}: {error}") from None
    return token, True


def read_token(path: Path) -> str:
    """The token in `path` (FileNotFoundError when there is none; ConfigError when the file is
    open to others, a symlink, or holds something else)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise ConfigError(
            f"cannot read the personal client's token file {path}: {error.strerror}",
            hint="a regular file of yours, mode 0600 (delete it to draw a new token)",
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"the personal client's token file {path} is not a regular file",
                hint="pass --token-file PATH (a file of yours, mode 0600)",
            )
        if info.st_mode & 0o077:
            raise ConfigError(
                f"the personal client's token file {path} is open to others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}): anyone who reads it can spend your "
                "credits",
                hint=f"chmod 600 {path}, or delete it to draw a new token",
            )
        raw = os.read(fd, _MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        text = ""
    if not is_token(text):
        raise ConfigError(
            f"the personal client's token file {path} does not hold a token "
            f"({PREFIX}<43 base64url characters>)",
            hint="delete it to draw a new token at the next start",
        )
    return text


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
