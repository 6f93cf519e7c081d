"""How many of our modules one cold read passes through (issue 30's measure of the layers).

Starts moto's S3 server on loopback, puts one small object, then follows
``fsspec.open("wds::s3://bucket/key").read()`` with an empty cache: every call into a module of
``fsspec_shards`` (on every thread) is recorded, and the script prints the modules visited,
the number of stays (a run of calls in one module) and how many stays return to a module
already left. Not a timing: the figure is the same on any machine.

    python benchmarks/trace_cold_read.py [--transport auto|fsspec|obstore] [--first] [--list]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import threading

PACKAGE = "fsspec_shards"


class Trail:
    """The modules of ``fsspec_shards`` entered, in order, per thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: dict[int, str] = {}
        self.stays: list[str] = []
        self.returns = 0
        self.seen: list[str] = []
        self.stopped = False
        """Set when the read returned: threads started during it keep this profile, and what
        they do afterwards (a timer's flush, a sync, the cache removed under them) is not the
        read's."""

    def profile(self, frame, event, arg):  # noqa: ANN001 - the sys.setprofile signature
        if self.stopped or event not in ("call", "return"):
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(PACKAGE):
            return
        if event == "return":
            caller = frame.f_back
            if caller is None:
                return
            module = caller.f_globals.get("__name__", "")
            if not module.startswith(PACKAGE):
                return
        thread = threading.get_ident()
        with self.lock:
            if self.last.get(thread) == module:
                return
            self.last[thread] = module
            if module in self.seen:
                self.returns += 1
            else:
                self.seen.append(module)
            self.stays.append(module)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", default="auto", choices=("auto", "fsspec", "obstore"))
    parser.add_argument("--list", action="store_true", help="print the modules in order")
    parser.add_argument(
        "--first",
        action="store_true",
        help="trace the process's first read (the cache opened and the transport built on the "
        "way); by default another object is read cold first, so the trace is one cold read",
    )
    args = parser.parse_args()

    import fsspec
    from moto.server import ThreadedMotoServer

    import fsspec_shards  # noqa: F401 - imported before the trace: imports are not the read

    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint},
    }
    store = fsspec.filesystem("s3", **options)
    store.mkdir("trace")
    store.pipe("trace/shard.tar", b"x" * (1 << 20))
    store.pipe("trace/before.tar", b"y" * (1 << 20))
    cache = tempfile.mkdtemp(prefix="trace-cold-read-")
    try:
        url = "wds::s3://trace/shard.tar"
        layered = {"wds": {"cache_dir": cache, "transport": args.transport}, "s3": options}
        opened = fsspec.open(url, **layered)
        if not args.first:
            with fsspec.open("wds::s3://trace/before.tar", **layered) as handle:
                handle.read()
        trail = Trail()
        threading.setprofile(trail.profile)
        sys.setprofile(trail.profile)
        try:
            with opened as handle:
                handle.read()
        finally:
            trail.stopped = True
            sys.setprofile(None)
            threading.setprofile(None)
    finally:
        # the cache's background threads may still be writing: removed, not waited for
        shutil.rmtree(cache, ignore_errors=True)
    server.stop()
    print(
        f"cold read of {url} (transport={args.transport}): {len(trail.seen)} modules, "
        f"{len(trail.stays)} stays, {trail.returns} returns to a module already left"
    )
    if args.list:
        for module in trail.seen:
            print("  ", module)


if __name__ == "__main__":
    main()
