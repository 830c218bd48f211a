"""CPU seconds per test unit: each unit of a lane runs in a cpuacct cgroup of its own.

A process starts in its parent's cgroup and stays there, so moving the lane's pytest process
into a unit's cgroup before the unit's first test charges that unit with everything it starts:
its servers, devnets and their children, until they exit, even after the lane has gone on to
other units. The kernel keeps a cgroup's usage after its processes are gone; the groups are
read once every lane has finished (`python -m harness.cpu_meter DIR`, deploy/test.sh), which
prints the units that used most CPU and removes the groups.

Needs root and the cgroup-v1 cpuacct hierarchy (`/sys/fs/cgroup/cpuacct`); without them the
lanes run unmetered.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/cpuacct")
TOP = 20


@dataclass
class CpuMeter:
    """One lane's groups: `base`/lane<I>-<n> for its n-th unit; the unit names go to
    `folder`/cpu-lane<I>.json as each unit starts."""

    base: Path
    folder: Path
    lane: int
    units: dict[str, str]

    @classmethod
    def open(cls, folder: Path, lane: int, root: Path | None = None) -> CpuMeter | None:
        """The lane's meter, or None where it cannot meter. `root`: the hierarchy, by default
        $PLANET_CPU_CGROUP, else `ROOT` (`ip netns exec` mounts a sysfs of its own without the
        cgroups: deploy/test.sh points a lane at them through its own /proc/PID/root)."""
        base = (root or hierarchy()) / f"planet-{folder.name}"
        try:
            base.mkdir(exist_ok=True)
            (base / "cgroup.procs").stat()
        except OSError:
            return None  # not root, or no cpuacct hierarchy: unmetered
        return cls(base, folder, lane, {})

    def enter(self, unit: str) -> None:
        """Move this process (and so whatever it starts from now) into a new group for `unit`."""
        group = self.base / f"lane{self.lane}-{len(self.units)}"
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
        self.units[group.name] = unit
        (self.folder / f"cpu-lane{self.lane}.json").write_text(json.dumps(self.units))

    def leave(self) -> None:
        """Back to the hierarchy's root, so the groups can be removed when their processes end."""
        (self.base.parent / "cgroup.procs").write_text(f"{os.getpid()}\n")


def hierarchy() -> Path:
    """Where the cpuacct groups are: $PLANET_CPU_CGROUP, else `ROOT`."""
    return Path(os.environ.get("PLANET_CPU_CGROUP") or ROOT)


def usage(folder: Path, root: Path | None = None) -> dict[str, float]:
    """CPU seconds per unit of every lane that used `folder`, and remove the emptied groups."""
    base = (root or hierarchy()) / f"planet-{folder.name}"
    seconds: dict[str, float] = {}
    for names in sorted(folder.glob("cpu-lane*.json")):
        for group, unit in json.loads(names.read_text()).items():
            path = base / group
            if (path / "cpuacct.usage").is_file():
                used = int((path / "cpuacct.usage").read_text()) / 1e9
                seconds[unit] = round(seconds.get(unit, 0.0) + used, 1)
                _remove(path)
    _remove(base)
    return seconds


def _remove(group: Path) -> None:
    # a process still in it (the lanes' namespaces kill those first) keeps it
    with contextlib.suppress(OSError):
        group.rmdir()


def report(seconds: dict[str, float], top: int = TOP) -> str:
    total = sum(seconds.values())
    lines = [f"CPU of the test units: {total:.0f} s in all; the {top} that used most:"]
    for unit, used in sorted(seconds.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {used:7.1f} s  {unit}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.cpu_meter LANES_DIR", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    seconds = usage(folder)
    if not seconds:
        print("no CPU figures (the lanes ran unmetered: not root, or no cpuacct)", file=sys.stderr)
        return 0
    (folder / "cpu.json").write_text(json.dumps(seconds, indent=1, sort_keys=True))
    print(report(seconds), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
