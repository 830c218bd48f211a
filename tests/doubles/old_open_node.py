"""A compute node of before `next.alternates`: `planet node serve` whose open grammar has no
`next.alternates` and whose /info advertises no `open_features` (protocol/open_features.py).

    python -m tests.doubles.old_open_node -v node serve --manifest M --shard 0 ...

An open that names `next.alternates` is refused `bad_control`, as a node released before them
refuses it; everything else is the real node (`node.server.run.serve` over the real shard).
The product knows nothing of it; start it with `start_node(module=MODULE)` and stop it with
`stop_pid(pid, module=MODULE)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import node.server.app as app_module
import node.server.overlay as overlay_module
import protocol.stream as stream
from node.procs import exit_process
from tests.doubles.wrapped_node import main_of, serve_wrapped

MODULE = "tests.doubles.old_open_node"


def without_features(info_body: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """`info_body` as a node of before answered it: no `open_features` field."""

    def body(*args: Any) -> dict[str, Any]:
        answer = dict(info_body(*args))
        answer.pop("open_features", None)
        return answer

    return body


def run(argv: Sequence[str]) -> int:
    # the open parser reads its `next` field sets at each message: the first two, of before
    stream._NEXT_FIELDS = tuple(f for f in stream._NEXT_FIELDS if "alternates" not in f)
    app_module.info_body = without_features(app_module.info_body)
    overlay_module.info_body = without_features(overlay_module.info_body)
    return serve_wrapped(
        MODULE, "serve as a node of before", argv, lambda honest: honest, "NODE OF BEFORE"
    )


def main(argv: Sequence[str] | None = None) -> int:
    return main_of(run, argv)


if __name__ == "__main__":
    exit_process(main)
