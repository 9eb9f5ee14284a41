"""``python -m atomic_ckpt.cli``."""

import sys

from atomic_ckpt.cli.main import main

sys.exit(main())
