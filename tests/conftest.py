"""Settings every test needs before any storage client is imported."""

import os

# gcsfs otherwise probes for hierarchical-namespace buckets over gRPC on every operation,
# which waits out a 60 s time-out against an emulator.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
