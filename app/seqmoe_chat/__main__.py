"""``python -m seqmoe_chat``: the same as the ``seqmoe-chat`` command, with a console."""

import sys

from .main import main

sys.exit(main())
