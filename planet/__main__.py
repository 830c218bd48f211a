"""`python -m planet ...`: the `planet` command without its console script."""

import sys

from planet.main import main

sys.exit(main())
