"""`python -m spotrl`: the same command line as `spotrl`."""

import sys

from spotrl.cli.main import main

sys.exit(main())
