"""Benchmark a training input pipeline against its peers, as a user choosing one would (issue 36).

The same samples (a 16 KiB payload and an int label each; 3,200 by default, about 50 MiB)
are written in each system's own format in ~3 MiB shards: tar shards with their SHA256SUMS
and block manifest for this project (``ShardWriter``) and webdataset 1.0.2, MDS for MosaicML
streaming 0.13.0, litdata 0.2.76 chunks. They lie in a moto S3 bucket (a process of its own)
behind ``pacing_proxy.py`` (25 MB/s per connection, +20 ms per connection and per request).
Every system reads them through a torch ``DataLoader`` (2 workers, batch 16) in a fresh
process of its own: a cold epoch (empty local cache), then a warm one (what the cold epoch
left in its cache; webdataset streams and caches nothing), and, where the system can resume,
a loader that saved its state at 60% of the epoch and a new one that loads it (time to its
first batch). CPU counts the process and its reaped DataLoader workers (``getrusage``).
Every system must deliver every sample exactly once per epoch (and the rest exactly after a
resume), or the benchmark fails.

litdata and streaming are installed in their own venv (``benchmarks/.peers-venv``) by
``benchmarks/install_peers.sh``; a peer that is not installed there is skipped with the
reason. Each system is measured as installed: the peers' packages (site-packages, the venv)
hold their bytecode as pip wrote it, so this project's package is compiled (``compileall``
into its ``__pycache__``, as pip does for a wheel) before the timed children run; Python
reads that bytecode even where ``PYTHONDONTWRITEBYTECODE`` is set, which would otherwise
make every fresh process of an editable checkout compile each of its modules. Rounds
alternate the systems' order; the table gives medians and each peer's median over ours
(above 1: ours is faster or cheaper).

    bash benchmarks/install_peers.sh      # once
    python benchmarks/bench_peers.py [--rounds 3] [--samples 3200] [--quick]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = HERE / ".peers-venv"
BUCKET = "peers"
KEY, SECRET = "testing", "testing"
PAYLOAD = 16 * 1024
PER_SHARD = 180  # ~3 MiB of samples per shard
BATCH, WORKERS = 16, 2
SYSTEMS = ("ours", "webdataset", "litdata", "streaming")
METRICS = (
    "cold_first_batch_s",
    "cold_epoch_s",
    "cold_epoch_cpu_s",
    "warm_epoch_s",
    "warm_epoch_cpu_s",
    "resume_first_batch_s",
)


# --- in the child: one system's epochs -----------------------------------------------------


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def _labels(batch) -> list[int]:
    """The int labels of a batch, whatever shape each system's collate gives them."""
    labels = batch["cls"] if isinstance(batch, dict) else [sample["cls"] for sample in batch]
    return [int(label) for label in labels]


def _epoch(make_loader, expected: int) -> dict[str, float]:
    """One epoch through a new loader: first batch, wall, CPU; every label once."""
    cpu, started = _cpu(), time.perf_counter()
    loader = make_loader()
    batches = iter(loader)
    labels = _labels(next(batches))
    first = time.perf_counter() - started
    for batch in batches:
        labels.extend(_labels(batch))
    del batches
    wall = time.perf_counter() - started
    if sorted(labels) != list(range(expected)):
        raise RuntimeError(f"an epoch delivered {len(labels)} samples, not each of {expected}")
    return {"first_batch_s": first, "epoch_s": wall, "epoch_cpu_s": _cpu() - cpu}


def _resume(make_loader, expected: int) -> float:
    """Save a loader's state at 60% of an epoch; a new loader loads it: the time to its first
    batch. The samples before and after are each of the epoch once."""
    loader = make_loader()
    batches = iter(loader)
    labels: list[int] = []
    stop = int(0.6 * expected) // BATCH
    for _ in range(stop):
        labels.extend(_labels(next(batches)))
    state = loader.state_dict()
    del batches, loader
    started = time.perf_counter()
    loader = make_loader()
    loader.load_state_dict(state)
    batches = iter(loader)
    labels.extend(_labels(next(batches)))
    first = time.perf_counter() - started
    for batch in batches:
        labels.extend(_labels(batch))
    if sorted(labels) != list(range(expected)):
        raise RuntimeError(f"a resumed epoch delivered {len(labels)} samples, not each once")
    return first


def _loaders(system: str, where: dict, cache: str):
    """``(make_loader, make_resumable_loader or None)`` of ``system``."""
    from torch.utils.data import DataLoader

    if system == "ours":
        from torchdata.stateful_dataloader import StatefulDataLoader

        from fsspec_shards import ShardDataset

        options = {
            "s3": {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": where["s3"]}},
            "wds": {"cache_dir": cache, "checksums": where["tar_sums"]},
        }

        def dataset():
            return ShardDataset(
                where["tar_urls"],
                storage_options=options,
                shuffle_shards=False,
                transforms=[lambda sample: {"cls": int(sample["cls"])}],
            )

        return (
            lambda: DataLoader(dataset(), batch_size=BATCH, num_workers=WORKERS),
            lambda: StatefulDataLoader(dataset(), batch_size=BATCH, num_workers=WORKERS),
        )
    if system == "webdataset":
        import webdataset

        def loader():
            dataset = (
                webdataset.WebDataset(
                    where["http_urls"],
                    shardshuffle=False,
                    workersplitter=webdataset.split_by_worker,
                )
                .to_tuple("cls")
                .map(lambda fields: {"cls": int(fields[0])})
            )
            return DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)

        return loader, None
    if system == "litdata":
        import litdata
        from litdata.streaming import downloader

        # litdata's obstore path takes no option for a plain-http endpoint (a local S3
        # server such as moto): its client options are a module dict, so they allow it here.
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True

        def dataset():
            return litdata.StreamingDataset(
                where["litdata"], cache_dir=cache, max_cache_size="10GB", shuffle=False
            )

        def loader():
            return litdata.StreamingDataLoader(dataset(), batch_size=BATCH, num_workers=WORKERS)

        return loader, loader
    if system == "streaming":
        import streaming

        def loader():
            dataset = streaming.StreamingDataset(
                remote=where["mds"], local=cache, batch_size=BATCH, shuffle=False
            )
            return streaming.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)

        return loader, loader
    raise ValueError(f"unknown system {system!r}")


def child(system: str, where: dict, expected: int, workdir: str) -> dict[str, float]:
    """Cold epoch, warm epoch, resume: the metrics of one system in this fresh process."""
    cache = tempfile.mkdtemp(prefix=f"{system}-cache-", dir=workdir)
    make, resumable = _loaders(system, where, cache)
    cold = _epoch(make, expected)
    warm = _epoch(make, expected)
    result = {
        "cold_first_batch_s": cold["first_batch_s"],
        "cold_epoch_s": cold["epoch_s"],
        "cold_epoch_cpu_s": cold["epoch_cpu_s"],
        "warm_epoch_s": warm["epoch_s"],
        "warm_epoch_cpu_s": warm["epoch_cpu_s"],
    }
    if resumable is not None:
        result["resume_first_batch_s"] = _resume(resumable, expected)
    return result


# --- in the parent: the bucket, the formats, the rounds -------------------------------------


def peer_python(system: str) -> tuple[str | None, str]:
    """The interpreter that runs ``system`` and, when none can, why."""
    if system in ("ours", "webdataset"):
        return sys.executable, ""
    status = VENV / f"status-{system}.txt"
    if not status.exists():
        return None, "not installed: run benchmarks/install_peers.sh"
    text = status.read_text().strip()
    if text != "ok":
        return None, text
    return str(VENV / "bin" / "python"), ""


def _write_local(system: str, python: str, out: str, samples: int) -> None:
    """Write the samples in ``system``'s format under ``out`` (in its own interpreter)."""
    script = {
        "litdata": (
            "import os, sys, litdata\n"
            "def make(i): return {'bin': bytes([i % 251]) * PAYLOAD, 'cls': i}\n"
            "if __name__ == '__main__':\n"
            "    litdata.optimize(fn=make, inputs=list(range(SAMPLES)), output_dir=OUT,\n"
            "                     chunk_bytes='3MB', num_workers=1, mode='overwrite')\n"
        ),
        "streaming": (
            "from streaming import MDSWriter\n"
            "with MDSWriter(out=OUT, columns={'bin': 'bytes', 'cls': 'int'},\n"
            "               size_limit=3 << 20) as writer:\n"
            "    for i in range(SAMPLES):\n"
            "        writer.write({'bin': bytes([i % 251]) * PAYLOAD, 'cls': i})\n"
        ),
    }[system]
    header = f"PAYLOAD, SAMPLES, OUT = {PAYLOAD}, {samples}, {out!r}\n"
    path = Path(out).parent / f"write_{system}.py"
    path.write_text(header + script)
    subprocess.run([python, str(path)], check=True, capture_output=True, cwd=Path(out).parent)


def _upload(client, directory: str, prefix: str) -> list[str]:
    names = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            client.upload_file(path, BUCKET, f"{prefix}/{name}")
            names.append(name)
    return names


def _signed(proxy: str, key: str) -> str:
    """A presigned GET of ``key`` through the proxy (what webdataset's curl reads)."""
    import boto3

    signer = boto3.client(
        "s3",
        endpoint_url=proxy,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    return signer.generate_presigned_url(
        "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=86400
    )


def prepare(endpoint: str, proxy: str, workdir: str, samples: int, pythons: dict) -> dict:
    """Every system's shards in the bucket; where each system finds them (through the proxy)."""
    import boto3

    from fsspec_shards import ShardWriter

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    tar_dir = os.path.join(workdir, "tar")
    os.makedirs(tar_dir)
    with ShardWriter(os.path.join(tar_dir, "train-%04d.tar"), max_count=PER_SHARD) as writer:
        for index in range(samples):
            writer.write({"__key__": f"{index:06d}", "bin": bytes([index % 251]) * PAYLOAD,
                          "cls": index})  # fmt: skip
    shards = [name for name in _upload(client, tar_dir, "tar") if name.endswith(".tar")]
    where = {
        "s3": proxy,
        "tar_urls": [f"wds::s3://{BUCKET}/tar/{name}" for name in shards],
        "tar_sums": f"s3://{BUCKET}/tar/SHA256SUMS",
        "http_urls": [_signed(proxy, f"tar/{name}") for name in shards],
    }
    for system, key in (("litdata", "litdata"), ("streaming", "mds")):
        if pythons.get(system):
            out = os.path.join(workdir, key)
            _write_local(system, pythons[system], out, samples)
            _upload(client, out, key)
            where[key] = f"s3://{BUCKET}/{key}"
    return where


def _run_child(python: str, system: str, where: dict, expected: int, workdir: str) -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        AWS_ACCESS_KEY_ID=KEY,
        AWS_SECRET_ACCESS_KEY=SECRET,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=where["s3"],  # boto3 (litdata)
        S3_ENDPOINT_URL=where["s3"],  # MosaicML streaming
    )
    arguments = json.dumps([system, where, expected, workdir])
    done = subprocess.run(
        [python, str(Path(__file__).resolve()), "--child", arguments],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{system} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(rounds: int = 3, samples: int = 3200, systems=SYSTEMS) -> dict[str, dict[str, float]]:
    """Medians per system and metric, and each peer's median over ours (``X_vs_ours``)."""
    sys.path[:0] = [str(ROOT), str(HERE)]
    from bench_cold import moto_process
    from pacing_proxy import DEFAULT_LATENCY, DEFAULT_RATE, paced

    pythons, skipped = {}, {}
    for system in systems:
        python, reason = peer_python(system)
        if python is None:
            skipped[system] = reason
            print(f"skipping {system}: {reason}", file=sys.stderr)
        else:
            pythons[system] = python
    compileall.compile_dir(ROOT / "fsspec_shards", quiet=1)  # as a wheel install would
    results: dict[str, dict[str, list[float]]] = {system: {} for system in pythons}
    with tempfile.TemporaryDirectory() as workdir, moto_process(workdir) as endpoint:
        host, port = endpoint.rsplit("//", 1)[1].split(":")
        with paced((host, int(port)), rate=DEFAULT_RATE, latency=DEFAULT_LATENCY) as proxy:
            proxy_url = f"http://{proxy.host}:{proxy.port}"
            where = prepare(endpoint, proxy_url, workdir, samples, pythons)
            order = list(pythons)
            for number in range(rounds):
                for system in order if number % 2 == 0 else order[::-1]:
                    measured = _run_child(pythons[system], system, where, samples, workdir)
                    for metric, value in measured.items():
                        results[system].setdefault(metric, []).append(value)
    table = {
        system: {metric: statistics.median(values) for metric, values in metrics.items()}
        for system, metrics in results.items()
    }
    ours = table.get("ours", {})
    for system, metrics in table.items():
        if system != "ours":
            for metric in METRICS:
                if metric in metrics and ours.get(metric):
                    metrics[f"{metric}_vs_ours"] = metrics[metric] / ours[metric]
    for system, reason in skipped.items():
        print(f"{system}: skipped ({reason})")
    return table


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="default 3")
    parser.add_argument("--samples", type=int, default=3200, help="default 3200")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--quick", action="store_true", help="1 round of 800 samples")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.child:
        system, where, expected, workdir = json.loads(arguments.child)
        print(json.dumps(child(system, where, expected, workdir)))
        return {}
    rounds, samples = (1, 800) if arguments.quick else (arguments.rounds, arguments.samples)
    table = run(rounds, samples, arguments.systems)
    for system, metrics in table.items():
        print(system)
        for name, value in metrics.items():
            print(f"  {name:34s} {value:10.3f}")
    return table


if __name__ == "__main__":
    main()
