"""`python -m gated ...`: the same command line as the `gated` script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
