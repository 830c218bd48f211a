"""The calibrated constants the verifier runs with, read from `calibration.json`.

    cal = load_calibration()            # the table shipped next to this file
    cal.credibility_map.credibility(gap) -> int in [0, 10**6]
    cal.tolerance("int8") -> protocol.fingerprint.Tolerance

`calibration.json` is written by `python -m node.verifier.calibrate` from measurements (see that
module for how each number is chosen); edit it only by re-running that command.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from node.verifier.scoring import CredibilityMap
from protocol.errors import ConfigError
from protocol.fingerprint import Tolerance

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")


@dataclass(frozen=True)
class Calibration:
    credibility_map: CredibilityMap
    tolerances: dict[str, Tolerance]

    def tolerance(self, quant: str) -> Tolerance:
        try:
            return self.tolerances[quant]
        except KeyError:
            raise ConfigError(
                f"no fingerprint tolerance calibrated for quant {quant!r}",
                hint="re-run python -m node.verifier.calibrate",
            ) from None


def parse_calibration(table: dict) -> Calibration:
    try:
        mapping = table["credibility_map"]
        credibility_map = CredibilityMap(
            full_micro=int(mapping["full_micro"]), zero_micro=int(mapping["zero_micro"])
        )
        tolerances = {
            quant: Tolerance(
                max_ulp=int(entry["max_ulp"]),
                min_match_per_mille=int(entry["min_match_per_mille"]),
                max_mean_ulp_milli=int(entry["max_mean_ulp_milli"]),
            )
            for quant, entry in table["fingerprint_tolerances"].items()
        }
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(f"calibration table is malformed: {error}") from error
    return Calibration(credibility_map, tolerances)


@lru_cache(maxsize=4)
def load_calibration(path: Path = CALIBRATION_FILE) -> Calibration:
    try:
        table = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"cannot read calibration {path}: {error}") from error
    return parse_calibration(table)
