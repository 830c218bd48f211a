"""Inter-region latency matrices: the one-way delay of a link between hosts in two regions.

The file format is the shape of CometBFT's e2e latency files, a CSV whose first row names the
regions after a corner cell, and whose every other row starts with a region and gives the one-way
delay in milliseconds from that region to each region of the header:

    from/to,virginia,tokyo
    virginia,1,73
    tokyo,73,1

Blank lines and lines starting with `#` are skipped. A delay is a decimal number of milliseconds
(up to 6 digits, up to 3 decimals), rounded half up to whole milliseconds (toxiproxy's unit). The
matrix may be asymmetric: row A, column B is the delay of bytes going from A to B. A link between
two hosts of the same region gets the diagonal's value. Each link's jitter is 5 % of its delay
(`Shape.from_latency`), as in CometBFT's e2e.

`default_matrix()` is `regions.csv` next to this module: five cloud regions, rough figures.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from deploy.netlab.errors import MatrixError, UnknownRegion
from deploy.netlab.shape import Shape

DEFAULT_MATRIX_PATH = Path(__file__).with_name("regions.csv")
MAX_REGIONS = 64

_REGION = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,39}\Z")
_DELAY = re.compile(r"(\d{1,6})(?:\.(\d{1,3}))?\Z")


@dataclass(frozen=True)
class Matrix:
    """One-way delays between regions, whole milliseconds."""

    regions: tuple[str, ...]
    delays_ms: Mapping[tuple[str, str], int]  # (from region, to region) -> ms

    def delay_ms(self, source: str, destination: str) -> int:
        for region in (source, destination):
            if region not in self.regions:
                raise UnknownRegion(region, self.regions)
        return self.delays_ms[(source, destination)]


def parse_matrix(text: str) -> Matrix:
    """A Matrix from CSV text, or MatrixError naming the line and what is wrong with it."""
    rows = [
        (number, next(csv.reader([line])))
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not rows:
        raise MatrixError(1, "no header row")
    header_line, header = rows[0]
    regions = tuple(cell.strip() for cell in header[1:])
    if not regions:
        raise MatrixError(header_line, "the header names no regions")
    if len(regions) > MAX_REGIONS:
        raise MatrixError(header_line, f"{len(regions)} regions, at most {MAX_REGIONS}")
    for region in regions:
        if not _REGION.match(region):
            raise MatrixError(header_line, f"bad region name {region!r}")
    if len(set(regions)) != len(regions):
        raise MatrixError(header_line, "a region is named twice")
    delays: dict[tuple[str, str], int] = {}
    seen: set[str] = set()
    for line, row in rows[1:]:
        source = row[0].strip()
        if source not in regions:
            raise MatrixError(line, f"row region {source!r} is not in the header")
        if source in seen:
            raise MatrixError(line, f"a second row for {source!r}")
        seen.add(source)
        if len(row) != len(regions) + 1:
            raise MatrixError(line, f"{len(row) - 1} delays for {len(regions)} regions")
        for destination, cell in zip(regions, row[1:], strict=True):
            delays[(source, destination)] = _parse_delay(line, cell.strip())
    missing = [region for region in regions if region not in seen]
    if missing:
        raise MatrixError(rows[-1][0], f"no row for {', '.join(missing)}")
    return Matrix(regions, delays)


def _parse_delay(line: int, cell: str) -> int:
    match = _DELAY.match(cell)
    if not match:
        raise MatrixError(line, f"delay {cell!r} is not a number of milliseconds")
    whole, fraction = match.group(1), (match.group(2) or "").ljust(3, "0")
    micro_units = int(whole) * 1000 + int(fraction)
    return (micro_units + 500) // 1000


def load_matrix(path: Path) -> Matrix:
    return parse_matrix(path.read_text())


def default_matrix() -> Matrix:
    return load_matrix(DEFAULT_MATRIX_PATH)


def link_shapes(
    matrix: Matrix, placement: Mapping[str, str], *, kbytes_per_s: int | None = None
) -> dict[tuple[str, str], Shape]:
    """(host A, host B) -> the Shape of bytes from A to B, for every ordered pair of hosts.

    `placement` maps each host to its region; jitter is 5 % of each delay.
    """
    for region in placement.values():
        if region not in matrix.regions:
            raise UnknownRegion(region, matrix.regions)
    return {
        (source, destination): Shape.from_latency(
            matrix.delay_ms(placement[source], placement[destination]), kbytes_per_s=kbytes_per_s
        )
        for source in placement
        for destination in placement
        if source != destination
    }
