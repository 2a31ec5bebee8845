"""``python -m exgrpo.cli``: the ``exgrpo`` command."""

import sys

from exgrpo.cli import main

sys.exit(main())
