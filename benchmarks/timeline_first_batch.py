"""Where a cold first batch's time goes: each request beside each process's marks (issue 36).

The ``bench_peers.py`` setting (the same samples and shards, moto behind the pacing proxy,
a torch ``DataLoader`` with 2 workers and batch 16, an empty cache), for this project and
webdataset only. The proxy logs every connection, request and answer
(``pacing_proxy.py --log``); each fresh child process marks when the dataset was made,
each worker's start and first sample and the first batch, and every full (generation 2) garbage
collection in any of its processes. All on one clock (``time.perf_counter``), from the
moment the child starts making its dataset.

Printed per round and system: the merged timeline, then one summary line (dataset made,
the full collections in the window, first request, first answer, first sample, first batch,
requests before the first sample). ``--collect-first`` runs ``gc.collect()`` in each child
before its clock starts, so that no system pays a collection that the process's earlier
allocations made due (after ``import torch`` the next ~8,000 new objects set one off).

    python benchmarks/timeline_first_batch.py [--rounds 2] [--samples 3200] [--collect-first]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import bench_peers  # noqa: E402
from bench_cold import moto_process  # noqa: E402
from pacing_proxy import DEFAULT_LATENCY, DEFAULT_RATE, paced  # noqa: E402

CHILD = r"""
import gc, json, os, sys, time
import torch
from torch.utils.data import DataLoader

system, where, cache, collect_first = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
if system == "ours":
    from fsspec_shards import ShardDataset
else:
    import webdataset

started = [0.0]
collections = []


def collected(phase, info):
    if phase == "start":
        collected.at = time.perf_counter()
    elif info["generation"] == 2:
        print(json.dumps(["gc", os.getpid(), collected.at, time.perf_counter() - collected.at]),
              flush=True)


def mark(sample):
    if not mark.done:
        mark.done = True
        print(json.dumps(["first sample", os.getpid(), time.perf_counter()]), flush=True)
    return sample


mark.done = False
gc.callbacks.append(collected)
if collect_first == "1":
    gc.collect()
started[0] = time.perf_counter()
print(json.dumps(["start", os.getpid(), started[0]]), flush=True)
if system == "ours":
    options = {
        "s3": {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": where["s3"]}},
        "wds": {"cache_dir": cache, "checksums": where["tar_sums"]},
    }
    dataset = ShardDataset(where["tar_urls"], storage_options=options, shuffle_shards=False,
                           transforms=[lambda sample: mark({"cls": int(sample["cls"])})])
else:
    dataset = (
        webdataset.WebDataset(where["http_urls"], shardshuffle=False,
                              workersplitter=webdataset.split_by_worker)
        .to_tuple("cls").map(lambda fields: mark({"cls": int(fields[0])}))
    )
print(json.dumps(["dataset made", os.getpid(), time.perf_counter()]), flush=True)
def started_worker(_):
    print(json.dumps(["worker started", os.getpid(), time.perf_counter()]), flush=True)


loader = DataLoader(dataset, batch_size=16, num_workers=2, worker_init_fn=started_worker)
batches = iter(loader)
next(batches)
print(json.dumps(["first batch", os.getpid(), time.perf_counter()]), flush=True)
for _ in batches:
    pass
"""


def run_child(system: str, where: dict, cache: str, collect_first: bool) -> list[list]:
    """The child's marks (``[what, pid, t, ...]``)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            system,
            json.dumps(where),
            cache,
            "1" if collect_first else "0",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(HERE.parent)),
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the {system} child failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]


def timeline(marks: list[list], log: str) -> tuple[list[tuple[float, str]], dict[str, float]]:
    """The merged events (seconds from the start) and the summary of one child."""
    start = next(m[2] for m in marks if m[0] == "start")
    events = []
    for what, pid, at, *rest in marks:
        if what == "gc":
            events.append((at - start, f"pid {pid} full collection ({rest[0] * 1000:.0f} ms)"))
        elif what != "start":
            events.append((at - start, f"pid {pid} {what}"))
    with open(log) as lines:
        for line in lines:
            at, connection, what, *rest = json.loads(line)
            if at >= start:
                detail = " ".join(str(part) for part in rest if part != "")
                events.append((at - start, f"connection {connection} {what} {detail}".rstrip()))
    events.sort()
    first_sample = min(t for t, e in events if e.endswith("first sample"))
    summary = {
        "made_s": next(t for t, e in events if e.endswith("dataset made")),
        "collections_s": sum(
            m[3] for m in marks if m[0] == "gc" and 0 <= m[2] - start < first_sample
        ),
        "first_request_s": next((t for t, e in events if " request " in e), float("nan")),
        "first_answer_s": next((t for t, e in events if " answer " in e), float("nan")),
        "first_sample_s": first_sample,
        "first_batch_s": next(t for t, e in events if e.endswith("first batch")),
        "requests_before_first_sample": sum(
            1 for t, e in events if " request " in e and t < first_sample
        ),
    }
    return events, summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=3200)
    parser.add_argument("--collect-first", action="store_true")
    parser.add_argument("--until", type=float, default=0.4, help="print events up to this (s)")
    arguments = parser.parse_args(argv)
    compileall.compile_dir(HERE.parent / "fsspec_shards", quiet=1)  # as bench_peers does
    with tempfile.TemporaryDirectory() as workdir, moto_process(workdir) as endpoint:
        host, port = endpoint.rsplit("//", 1)[1].split(":")
        log = os.path.join(workdir, "requests.jsonl")
        with paced((host, int(port)), DEFAULT_RATE, DEFAULT_LATENCY, log=log) as proxy:
            proxy_url = f"http://{proxy.host}:{proxy.port}"
            where = bench_peers.prepare(endpoint, proxy_url, workdir, arguments.samples, {})
            for round_number in range(arguments.rounds):
                for system in ("webdataset", "ours"):
                    open(log, "w").close()  # this child's requests only
                    cache = tempfile.mkdtemp(prefix=f"{system}-cache-", dir=workdir)
                    marks = run_child(system, where, cache, arguments.collect_first)
                    events, summary = timeline(marks, log)
                    print(f"--- {system}, round {round_number + 1}")
                    for at, event in events:
                        if at <= arguments.until:
                            print(f"{at:8.4f}  {event}")
                    print(system, json.dumps({k: round(v, 4) for k, v in summary.items()}))


if __name__ == "__main__":
    main()
