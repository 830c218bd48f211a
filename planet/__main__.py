"""`python -m planet ...`: the `planet` command without its console script (the way every
process the devnet and the tests start runs it). Exits without the interpreter's teardown
(`node.procs.exit_process`)."""

from node.procs import exit_process
from planet.main import main

exit_process(main)
