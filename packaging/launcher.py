"""The bundles' entry script: the same as the ``seqmoe-chat`` command."""

import sys

from seqmoe_chat.main import main

sys.exit(main())
