"""`python -m autoglm_serve.bench bench serve ...` / `... tune ...`: the bench commands standalone."""

import sys

from autoglm_serve.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
