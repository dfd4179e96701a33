"""`python -m draftsmith` (and `accelerate launch -m draftsmith`) runs the CLI."""

import sys

from draftsmith.cli import main

if __name__ == "__main__":
    sys.exit(main())
