"""``python -m petting_env`` is ``python -m petting_env.host``."""

import sys

from .host import main

sys.exit(main())
