"""`python -m ptlab.watch SCRIPT ...`, the same as `python -m ptlab watch SCRIPT ...`."""
import sys

from . import main

sys.exit(main())
