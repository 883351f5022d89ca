"""``python -m verify.reliability``: see :mod:`verify.reliability.run`."""

import sys

from .run import main

sys.exit(main())
