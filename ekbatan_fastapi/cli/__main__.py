"""``python -m ekbatan_fastapi.cli``: the same as ``ekbatan-jobs``."""

from __future__ import annotations

import sys

from . import main

sys.exit(main())
