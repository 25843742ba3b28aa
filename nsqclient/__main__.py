"""``python -m nsqclient``: the ``nsqclient`` command (see :mod:`nsqclient.cli`)."""

import sys

from nsqclient.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
