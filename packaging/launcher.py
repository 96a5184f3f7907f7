"""The bundles' entry script: the same as the ``seqmoe-chat`` command.

In a bundle ``sys.executable`` is this program, not a Python interpreter, yet the app starts
its child processes (downloads, calibration) as ``sys.executable -m MODULE ARGS``: so ``-m``
runs one of the bundled modules as Python would.
"""

import runpy
import sys

if len(sys.argv) > 2 and sys.argv[1] == "-m":
    module = sys.argv[2]
    sys.argv = [sys.argv[0], *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    from seqmoe_chat.main import main

    sys.exit(main())
