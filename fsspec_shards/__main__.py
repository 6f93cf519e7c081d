"""``python -m fsspec_shards``: the same command line as ``fsspec-shards``.

Guarded, so that worker processes started by ``spawn`` (``--dask local:N``), which import
this module as ``__mp_main__``, do not run the command again.
"""

import sys

from fsspec_shards.cli import main

if __name__ == "__main__":
    sys.exit(main())
