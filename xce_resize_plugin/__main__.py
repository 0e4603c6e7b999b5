"""``python -m xce_resize_plugin`` is ``xce-resize``."""

import sys

from .cli import main

sys.exit(main())
