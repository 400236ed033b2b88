"""``python -m tbmem``: the ``tbmem`` command, where its console script is not on PATH."""

import sys

from tbmem._internal.cli import main

if __name__ == "__main__":
    sys.exit(main())
