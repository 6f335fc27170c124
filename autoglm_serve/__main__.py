"""`python -m autoglm_serve ...` is the `autoglm-serve` command."""
import sys

from autoglm_serve.cli import main

sys.exit(main())
