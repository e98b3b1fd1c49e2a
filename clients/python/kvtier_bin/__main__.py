"""``python -m kvtier_bin kvtierd|kvtier [args...]``: runs a bundled binary."""

import sys

from . import main

sys.exit(main())
