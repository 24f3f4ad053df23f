"""``python -m tests.chaos SCENARIO [--short] [--url URL]``: see ``tests/chaos/run.py``."""

import sys

from tests.chaos.run import main

sys.exit(main())
