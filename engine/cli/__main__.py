"""`python -m engine.cli COMMAND ...`: the headless commands, with no UI loaded (what torchrun runs)."""

import sys

from engine.cli import main

sys.exit(main())
