"""`python -m launcher.cli`: the command line, as the `verl-launch` script runs it."""

import sys

from . import main

sys.exit(main())
