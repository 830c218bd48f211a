"""Run the committee ABCI app: `python -m abci_app --home DIR --listen tcp://127.0.0.1:26658`.

State lives in `<home>/app.sqlite`; the validator's local reputation scores are read from
`<home>/reputation_scores.json` (see `abci_app.app`). Logs go to stderr; SIGTERM/SIGINT shut
down cleanly (the last committed block is always on disk).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from protocol.errors import PlanetError

if TYPE_CHECKING:
    from abci_app.app import CommitteeApp


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m abci_app", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--home", type=Path, required=True, help="validator home directory (state in app.sqlite)"
    )
    parser.add_argument(
        "--listen",
        default=os.environ.get("PLANET_ABCI_LISTEN", "tcp://127.0.0.1:26658"),
        help="tcp://HOST:PORT or unix://PATH (default tcp://127.0.0.1:26658)",
    )
    parser.add_argument("--log-level", default=os.environ.get("PLANET_LOG_LEVEL", "INFO"))
    return parser.parse_args(argv)


async def serve(home: Path, listen: str, app_class: type[CommitteeApp] | None = None) -> None:
    """Serve the app of `home` on `listen` until SIGTERM/SIGINT. `app_class`: `CommitteeApp`,
    or a subclass of it (a test entry point's)."""
    from abci_app.app import CommitteeApp
    from abci_app.machine import StateMachine
    from abci_app.server import AbciServer
    from abci_app.state import State
    from abci_app.store import Store

    app_class = app_class or CommitteeApp
    home.mkdir(parents=True, exist_ok=True)
    store = Store(home / "app.sqlite")
    state = State(store)
    server = AbciServer(app_class(StateMachine(state), home), listen)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logging.getLogger("abci_app").info(
        "committee app ready home=%s height=%d app_hash=%s",
        home,
        state.height,
        state.app_hash.hex(),
    )
    await stop.wait()
    await server.close()
    store.close()


def main(argv: list[str] | None = None, app_class: type[CommitteeApp] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        asyncio.run(serve(args.home, args.listen, app_class))
    except PlanetError as error:
        print(f"error: {error.message}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
        return error.exit_status
    return 0


if __name__ == "__main__":
    sys.exit(main())
