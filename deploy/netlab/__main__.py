"""`python -m deploy.netlab check | list | down [--run ID]`: the lab's checks and teardown.

check   can this process make hosts and run the proxies? (exit 1 if not, with the reason)
list    the lab runs whose namespaces, interfaces or records exist, and whether live
down    remove the leftovers of runs whose owner process is gone (or of --run ID, live or not)
"""

from __future__ import annotations

import argparse
import sys

from deploy.netlab.hosts import can_make_hosts, down_run, down_stale, leftovers, owner_alive
from deploy.netlab.toxiproxy import can_run_proxies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.netlab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="can hosts and shaped links be made here?")
    commands.add_parser("list", help="runs with something left on this machine")
    down = commands.add_parser("down", help="remove leftovers of crashed runs")
    down.add_argument("--run", metavar="ID", help="remove this run (6 hex digits), even if live")
    args = parser.parse_args(argv)
    if args.command == "check":
        hosts_ok, hosts_reason = can_make_hosts()
        proxies_ok, proxies_reason = can_run_proxies()
        print(f"hosts: {'yes' if hosts_ok else 'no'}: {hosts_reason}")
        print(f"links: {'yes' if proxies_ok else 'no'}: {proxies_reason}")
        return 0 if hosts_ok and proxies_ok else 1
    if args.command == "list":
        for run_id, names in sorted(leftovers().items()):
            state = "live" if owner_alive(run_id) else "stale"
            print(f"{run_id} {state}: {' '.join(sorted(names))}")
        return 0
    if args.run is not None:
        found = leftovers()
        if args.run not in found:
            print(f"error: no run {args.run!r} on this machine", file=sys.stderr)
            print("hint: `python -m deploy.netlab list` shows the runs", file=sys.stderr)
            return 2
        print(f"{args.run}: removed {len(down_run(args.run))} items")
        return 0
    stale = down_stale()
    print(f"removed {len(stale)} stale run(s){': ' + ' '.join(stale) if stale else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
