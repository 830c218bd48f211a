"""node/zygote/child.py `_join_cgroups`: a forked child joins the caller's cgroup-v1 groups
under the hierarchies' root ($PLANET_CGROUPS here: a folder standing in for /sys/fs/cgroup), and
only groups inside their hierarchy: the caller's /proc/self/cgroup text arrives over the socket,
and a `..` in it must not reach a `cgroup.procs` elsewhere."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from node.zygote import child

pytestmark = pytest.mark.unit


def test_a_child_joins_the_callers_groups_and_nothing_outside_a_hierarchy(tmp_path: Path) -> None:
    root = tmp_path / "cgroups"
    for folder in ("cpuacct/planet-x/lane0-1", "memory/planet-x/lane0-1", "escape"):
        (root / folder).mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    cgroups = "\n".join(
        [
            "4:cpuacct:/planet-x/lane0-1",
            "7:memory:/planet-x/lane0-1",
            "9:memory:/../escape",  # root/escape: outside every hierarchy
            "3:cpuacct/../..:/outside",  # tmp_path/outside
        ]
    )
    request = SimpleNamespace(env={child.CGROUPS_ENV: str(root)}, cgroups=cgroups)
    child._join_cgroups(request)  # type: ignore[arg-type]
    pid = f"{os.getpid()}\n"
    for hierarchy in ("cpuacct", "memory"):
        assert (root / hierarchy / "planet-x/lane0-1/cgroup.procs").read_text() == pid
    assert not (root / "escape/cgroup.procs").exists()
    assert not (tmp_path / "outside/cgroup.procs").exists()
