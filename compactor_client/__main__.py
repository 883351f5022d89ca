"""``python -m compactor_client run ...``: the same as the ``compactor`` command."""

import sys

from compactor_client.cli import main

sys.exit(main())
