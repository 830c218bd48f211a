"""node.import_hooks.around_import: a module's body runs inside the given context, once per
name; `unless` leaves the import alone (the mechanism of node/lazy_bls.py and
bench/_lazy_compile.py)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.import_hooks import around_import

pytestmark = pytest.mark.unit

STATE = {"inside": False, "runs": 0}


@contextlib.contextmanager
def _marked() -> Iterator[None]:
    STATE["inside"], STATE["runs"] = True, STATE["runs"] + 1
    try:
        yield
    finally:
        STATE["inside"] = False


def test_a_modules_body_runs_inside_the_context_and_only_that_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = f"from {__name__} import STATE\nSEEN = STATE['inside']\n"
    for name in ("planet_hooked_a", "planet_hooked_b", "planet_hooked_c"):
        (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    around_import("planet_hooked_a", _marked)
    around_import("planet_hooked_a", _marked)  # once per name
    around_import("planet_hooked_c", _marked, unless=lambda: True)
    try:
        import planet_hooked_a  # type: ignore[import-not-found]
        import planet_hooked_b  # type: ignore[import-not-found]
        import planet_hooked_c  # type: ignore[import-not-found]

        assert planet_hooked_a.SEEN and STATE["runs"] == 1 and not STATE["inside"]
        assert not planet_hooked_b.SEEN  # another module: untouched
        assert not planet_hooked_c.SEEN  # `unless` held
    finally:
        for name in ("planet_hooked_a", "planet_hooked_b", "planet_hooked_c"):
            sys.modules.pop(name, None)
