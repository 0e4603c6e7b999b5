"""``python -m xce_resize_plugin`` is ``xce-resize``."""

import sys

from xce_resize_plugin.cli.main import main

sys.exit(main())
