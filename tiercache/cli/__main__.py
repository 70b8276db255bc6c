"""`python -m tiercache.cli …`: the `tiercache` command."""

import sys

from tiercache.cli import main

sys.exit(main())
