"""What each test unit used: CPU seconds and peak memory, each unit in cgroups of its own.

A process starts in its parent's cgroups and stays there, so moving the lane's pytest process
into a unit's groups (one in the cgroup-v1 `cpuacct` hierarchy, one in `memory`) before the
unit's first test charges that unit with everything it starts: its servers, devnets and their
children, until they exit, even after the lane has gone on to other units. The kernel keeps a
group's CPU usage and its memory high-water mark after its processes are gone; the groups are
read once every lane has finished (`python -m harness.unit_meter DIR`, deploy/test.sh), which
prints the units that used most and removes the groups.

The peak is the memory group's `memory.max_usage_in_bytes`: the unit's processes' own memory
and the page cache they brought in (logs, chain data, files they wrote), not pages another unit
or the set-up read first (the shared model cache, warmed before the lanes). It is what
harness/lanes.py's `WEIGHTS_GB` is checked against.

Needs root and the cgroup-v1 hierarchies (`/sys/fs/cgroup/cpuacct`, `/sys/fs/cgroup/memory`);
without cpuacct the lanes run unmetered, without memory they get CPU figures only.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# $PLANET_CGROUPS: another place to reach the hierarchies (the zygote's children join there too)
from node.zygote.child import CGROUPS_ENV

ROOT = Path("/sys/fs/cgroup")  # where the v1 hierarchies are mounted, one folder each
CPU, MEMORY = "cpuacct", "memory"
TOP = 20
GB = 2**30


@dataclass(frozen=True)
class Usage:
    """One unit's CPU seconds, and its memory peak in GB (None where it was not metered)."""

    cpu_s: float
    peak_gb: float | None = None


@dataclass
class UnitMeter:
    """One lane's groups: `<hierarchy>/planet-<folder>/lane<I>-<n>` for its n-th unit, in each
    hierarchy of `hierarchies`; the unit names go to `folder`/units-lane<I>.json as each unit
    starts."""

    root: Path
    hierarchies: tuple[str, ...]
    folder: Path
    lane: int
    units: dict[str, str]

    @classmethod
    def open(cls, folder: Path, lane: int, root: Path | None = None) -> UnitMeter | None:
        """The lane's meter, or None where it cannot meter CPU. `root`: where the hierarchies
        are, by default $PLANET_CGROUPS, else `ROOT` (`ip netns exec` mounts a sysfs of its own
        without the cgroups: deploy/test.sh points a lane at them through its own
        /proc/PID/root)."""
        root = root or hierarchies_root()
        usable = []
        for name in (CPU, MEMORY):
            base = root / name / f"planet-{folder.name}"
            try:
                base.mkdir(exist_ok=True)
                (base / "cgroup.procs").stat()
            except OSError:
                continue  # not root, or no such hierarchy
            usable.append(name)
        if CPU not in usable:
            return None
        return cls(root, tuple(usable), folder, lane, {})

    def enter(self, unit: str) -> None:
        """Move this process (and so whatever it starts from now) into new groups for `unit`."""
        name = f"lane{self.lane}-{len(self.units)}"
        for hierarchy in self.hierarchies:
            group = self.root / hierarchy / f"planet-{self.folder.name}" / name
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
        self.units[name] = unit
        (self.folder / f"units-lane{self.lane}.json").write_text(json.dumps(self.units))

    def leave(self) -> None:
        """Back to each hierarchy's root, so the groups can be removed when their processes end."""
        for hierarchy in self.hierarchies:
            (self.root / hierarchy / "cgroup.procs").write_text(f"{os.getpid()}\n")


def hierarchies_root() -> Path:
    """Where the cgroup-v1 hierarchies are: $PLANET_CGROUPS, else `ROOT`."""
    return Path(os.environ.get(CGROUPS_ENV) or ROOT)


def usage(folder: Path, root: Path | None = None) -> dict[str, Usage]:
    """What each unit of every lane that used `folder` used (a unit in several groups: CPU
    summed, the highest peak), and remove the emptied groups."""
    root = root or hierarchies_root()
    cpu_base = root / CPU / f"planet-{folder.name}"
    memory_base = root / MEMORY / f"planet-{folder.name}"
    used: dict[str, Usage] = {}
    for names in sorted(folder.glob("units-lane*.json")):
        for group, unit in json.loads(names.read_text()).items():
            cpu = _read_int(cpu_base / group / "cpuacct.usage")
            if cpu is None:
                continue
            peak = _read_int(memory_base / group / "memory.max_usage_in_bytes")
            before = used.get(unit, Usage(0.0))
            peaks = [before.peak_gb, None if peak is None else round(peak / GB, 2)]
            highest = max((p for p in peaks if p is not None), default=None)
            used[unit] = Usage(round(before.cpu_s + cpu / 1e9, 1), highest)
            _remove(cpu_base / group)
            _remove(memory_base / group)
    _remove(cpu_base)
    _remove(memory_base)
    return used


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _remove(group: Path) -> None:
    # a process still in it (the lanes' namespaces kill those first) keeps it
    with contextlib.suppress(OSError):
        group.rmdir()


def report(used: dict[str, Usage], top: int = TOP) -> str:
    total = sum(u.cpu_s for u in used.values())
    lines = [f"CPU of the test units: {total:.0f} s in all; the {top} that used most:"]
    for unit, u in sorted(used.items(), key=lambda kv: -kv[1].cpu_s)[:top]:
        lines.append(f"  {u.cpu_s:7.1f} s  {unit}")
    peaks = {unit: u.peak_gb for unit, u in used.items() if u.peak_gb is not None}
    if peaks:
        lines.append(f"Memory peak of the test units: the {top} highest:")
        for unit, peak in sorted(peaks.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {peak:7.2f} GB  {unit}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.unit_meter LANES_DIR", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    used = usage(folder)
    if not used:
        print("no CPU figures (the lanes ran unmetered: not root, or no cpuacct)", file=sys.stderr)
        return 0
    figures = {unit: {"cpu_s": u.cpu_s, "peak_gb": u.peak_gb} for unit, u in used.items()}
    (folder / "units.json").write_text(json.dumps(figures, indent=1, sort_keys=True))
    print(report(used), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
