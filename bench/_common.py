"""Shared bits of the bench scripts: the machine block, small statistics helpers and the
`--quick` smoke run every bench offers (tests/integration/test_bench_smoke.py runs each one).
Importing it defers hqq's import-time `torch.compile` (bench/_lazy_compile.py)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import _lazy_compile

_lazy_compile.install()  # hqq's import-time torch.compile: ~3.4 CPU-s a process (its docstring)


def machine() -> dict[str, Any]:
    """The machine block of a benchmark's JSON (BENCHMARKS.md). A bench that did not import
    torch ran on the CPU: its block takes torch's version from the installed package's metadata
    and the GPU's name from the NVIDIA driver's /proc files, without importing torch (~1.7 CPU-s,
    most of what a small bench's smoke run costs)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = None
    torch_version = None
    device = "cpu"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch_version = torch.__version__
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
            device = "cuda"
    else:
        torch_version = _installed_torch_version()
        gpu = _driver_gpu_name()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": gpu,
        "torch": torch_version,
        "device": device,
    }


def _installed_torch_version() -> str | None:
    """`torch.__version__` as torch/version.py states it (local build tag included, e.g.
    "+cu132"), read without importing torch; None when torch is not installed."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        try:
            text = (Path(folder) / "version.py").read_text(encoding="utf-8")
        except OSError:
            continue
        if found := re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE):
            return found[1]
    return None


def _driver_gpu_name() -> str | None:
    """The first NVIDIA GPU's model name as the driver lists it, or None (no NVIDIA driver)."""
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text(encoding="utf-8").splitlines():
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            continue
    return None


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def spread(values: list[float], digits: int = 2) -> list[float]:
    """[min, max] of the repeats, rounded."""
    return [round(min(values), digits), round(max(values), digits)] if values else []


def parse_with_quick(
    parser: argparse.ArgumentParser, quick: dict[str, Any], argv: list[str] | None = None
) -> argparse.Namespace:
    """Parse `argv` with a `--quick` flag added: a smoke run (tiny sizes, few repeats) whose
    values in `quick` (argument dest -> value) replace the defaults; flags given on the command
    line still win. The namespace's `quick` says which run it was."""
    shown = ", ".join(f"{name}={value}" for name, value in quick.items())
    parser.add_argument("--quick", action="store_true", help=f"smoke run ({shown})")
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args(argv)
    return args


def stop_nodes(nodes: Sequence[Any], grace_s: float = 5.0) -> None:
    """Stop node processes (launcher `NodeProcess`es) side by side: SIGTERM, then SIGKILL after
    `grace_s` each (`stop_pid`). One after another, every node that outstays its grace (a link
    still open to a node that already went) cost the run its whole grace."""
    from node.server.launcher import stop_pid

    if not nodes:
        return
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        list(pool.map(lambda node: stop_pid(node.pid, grace_s=grace_s, module=node.module), nodes))
