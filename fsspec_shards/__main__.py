"""``python -m fsspec_shards``: the same command line as ``fsspec-shards``."""

import sys

from fsspec_shards.cli import main

sys.exit(main())
