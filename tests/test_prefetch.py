"""Prefetching the next shards of a consumer's order, and what its errors and its end do."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from fsspec_shards import ShardDataset
from fsspec_shards.iteration.prefetch import (
    AUTO_BEHIND,
    AUTO_DEEPEN_AFTER,
    AUTO_DEPTHS,
    ShardPrefetcher,
    behind,
)
from tests.shardmaker import write_shards

PROTOCOL = "prefetchrecorder"


class RecordingFileSystem(LocalFileSystem):
    """Local files with a ``prefetch`` that records its calls, can fail, and can be held."""

    protocol = PROTOCOL
    calls: list[str] = []
    threads: list[threading.Thread] = []
    failing: set[str] = set()
    gate = threading.Event()

    def prefetch(self, path):
        self.calls.append(path)
        self.threads.append(threading.current_thread())
        if not self.gate.wait(60):
            raise TimeoutError("test gate never opened")
        if path in self.failing:
            raise FileNotFoundError(f"prefetch failed for {path}")


@pytest.fixture
def recorded(tmp_path):
    fsspec.register_implementation(PROTOCOL, RecordingFileSystem, clobber=True)
    RecordingFileSystem.calls = []
    RecordingFileSystem.threads = []
    RecordingFileSystem.failing = set()
    RecordingFileSystem.gate = threading.Event()
    RecordingFileSystem.gate.set()
    paths = write_shards(tmp_path, 6, 5)
    yield paths, [f"{PROTOCOL}://{path}" for path in paths]
    RecordingFileSystem.gate.set()


def wait_for(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("fsspec-shards-prefetch")]


def test_the_next_shards_are_prefetched_while_one_is_read(recorded):
    paths, urls = recorded
    iterator = iter(ShardDataset(urls, shuffle_shards=False, prefetch=2))
    next(iterator)
    wait_for(lambda: len(RecordingFileSystem.calls) == 2)
    assert sorted(RecordingFileSystem.calls) == paths[1:3]
    for _ in range(5):
        next(iterator)  # the first sample of shard 1
    wait_for(lambda: len(RecordingFileSystem.calls) == 3)
    assert RecordingFileSystem.calls[2] == paths[3]
    assert len(list(iterator)) == 24
    assert sorted(RecordingFileSystem.calls) == paths[1:]


def test_quick_prefetches_share_a_waiting_thread(recorded):
    """A prefetch that ends at once (a cached shard) leaves its thread waiting for the next
    one: a stream does not start a thread per shard, and its end ends the thread."""
    paths, urls = recorded
    assert len(list(ShardDataset(urls, shuffle_shards=False, prefetch=1))) == 30
    assert RecordingFileSystem.calls == paths[1:]
    assert len({id(thread) for thread in RecordingFileSystem.threads}) < len(paths) - 1
    wait_for(lambda: not prefetch_threads())


def test_prefetch_follows_this_consumers_order(recorded, monkeypatch):
    paths, urls = recorded
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dataset = ShardDataset(urls, seed=5, prefetch=1)
    mine = [
        url.removeprefix(f"{PROTOCOL}://")
        for url in (dataset.urls[s.shard] for s in dataset.plan(0, dataset.consumer()).segments)
    ]
    list(dataset)
    assert RecordingFileSystem.calls == mine[1:]


def test_no_prefetch_when_disabled(recorded):
    _, urls = recorded
    assert len(list(ShardDataset(urls, prefetch=0))) == 30
    assert RecordingFileSystem.calls == []


def test_a_failed_prefetch_goes_through_the_handler_at_its_shard(recorded):
    paths, urls = recorded
    RecordingFileSystem.failing = {paths[2]}
    dataset = ShardDataset(urls, shuffle_shards=False, handler="skip")
    result = [sample["__key__"] for sample in dataset]
    assert len(result) == 25 and not any(key.startswith("s0002_") for key in result)
    assert isinstance(dataset.stats()["failures"][0][1], FileNotFoundError)

    delivered = []
    with pytest.raises(FileNotFoundError, match="prefetch failed"):
        for sample in ShardDataset(urls, shuffle_shards=False, handler="raise"):
            delivered.append(sample)
    assert len(delivered) == 10


@pytest.mark.parametrize("ending", ["close", "garbage collection"])
def test_ending_the_iterator_stops_prefetching(recorded, ending):
    _, urls = recorded
    RecordingFileSystem.gate.clear()
    iterator = iter(ShardDataset(urls, shuffle_shards=False, prefetch=2))
    next(iterator)
    wait_for(lambda: len(RecordingFileSystem.calls) == 2)
    if ending == "close":
        iterator.close()
    else:
        del iterator
        gc.collect()
    RecordingFileSystem.gate.set()
    wait_for(lambda: not prefetch_threads())
    assert len(RecordingFileSystem.calls) == 2


def test_queued_prefetches_are_cancelled_on_close(recorded):
    paths, urls = recorded
    RecordingFileSystem.gate.clear()
    prefetcher = ShardPrefetcher(urls, lambda url: fsspec.core.url_to_fs(url), depth=1)
    prefetcher.advance(0)
    wait_for(lambda: len(RecordingFileSystem.calls) == 1)
    prefetcher.depth = 3
    prefetcher.advance(0)  # shards 2 and 3 queue behind the one held thread
    prefetcher.close()
    RecordingFileSystem.gate.set()
    wait_for(lambda: not prefetch_threads())
    assert RecordingFileSystem.calls == [paths[1]]


def test_auto_depth_grows_when_the_reader_reaches_a_shard_still_fetching(recorded):
    """Under "auto" two shards are fetched ahead while the fetches keep up; a reader that
    waits AUTO_DEEPEN_AFTER or more for one makes the prefetcher take the next step."""
    _, urls = recorded
    many = urls + urls[:4]
    first, second = AUTO_DEPTHS[:2]
    RecordingFileSystem.gate.clear()
    prefetcher = ShardPrefetcher(many, lambda url: fsspec.core.url_to_fs(url), depth="auto")
    assert prefetcher.depth == first
    prefetcher.advance(0)
    wait_for(lambda: len(RecordingFileSystem.calls) == first)
    waiting = threading.Thread(target=prefetcher.wait, args=(1,))
    waiting.start()  # the reader at shard 1, whose fetch is held
    time.sleep(AUTO_DEEPEN_AFTER * 1.5)
    assert prefetcher.depth == first
    RecordingFileSystem.gate.set()
    waiting.join()
    assert prefetcher.depth == second
    # the first step's rate is the fetch waited for: 2 at once, over the time it was held
    assert 0 < prefetcher._rates[0] <= first / (AUTO_DEEPEN_AFTER * 1.5)
    prefetcher.advance(1)  # shards 2 to 1 + second
    wait_for(lambda: len(RecordingFileSystem.calls) == 1 + second)
    assert RecordingFileSystem.calls[first:] == [
        url.removeprefix(f"{PROTOCOL}://") for url in many[first + 1 : second + 2]
    ]
    prefetcher.close()


def test_auto_depth_stays_where_the_reader_is_only_a_little_behind(recorded):
    """A reader that waits AUTO_DEEPEN_AFTER or more, but for a fetch that took under
    AUTO_BEHIND times its read of the shard before, stays at the first step."""
    _, urls = recorded
    RecordingFileSystem.gate.clear()
    prefetcher = ShardPrefetcher(urls, lambda url: fsspec.core.url_to_fs(url), depth="auto")
    prefetcher.advance(0)
    wait_for(lambda: len(RecordingFileSystem.calls) == AUTO_DEPTHS[0])
    time.sleep(AUTO_DEEPEN_AFTER * 3)  # reading shard 0: a third of the fetch or more
    waiting = threading.Thread(target=prefetcher.wait, args=(1,))
    waiting.start()
    time.sleep(AUTO_DEEPEN_AFTER * 1.5)
    RecordingFileSystem.gate.set()
    waiting.join()
    assert prefetcher.depth == AUTO_DEPTHS[0]
    prefetcher.close()


@pytest.mark.parametrize(
    ("waited", "took", "read", "deepens"),
    [
        # a link paced per connection: a 3 MiB shard fetched in 0.25 s, read in 0.045 s
        (0.2, 0.25, 0.045, True),
        # a link capped as a whole at the start of a stream: the first two fetches split
        # it (0.47 s each, one alone takes about 0.3 s), a shard is read in 0.21 s
        (0.25, 0.47, 0.21, False),
        (AUTO_DEEPEN_AFTER / 2, 1.0, 0.01, False),  # a short wait: the fills' own work
        (0.2, 0.25, None, True),  # no read known: the wait alone
    ],
)
def test_auto_deepens_only_where_the_reader_could_take_the_step(waited, took, read, deepens):
    """The second step needs a wait of AUTO_DEEPEN_AFTER or more for a fetch of AUTO_BEHIND
    (3) times the reader's time on a shard: only then could the reader take the 1.5x fetches
    per second the step must bring to be kept."""
    assert AUTO_BEHIND == 3
    assert behind(waited, took, read) is deepens


def test_auto_depth_stays_while_the_fetches_keep_up(recorded):
    paths, urls = recorded
    prefetcher = ShardPrefetcher(urls, lambda url: fsspec.core.url_to_fs(url), depth="auto")
    for index in range(len(urls)):
        if index:
            wait_for(lambda: prefetcher._futures[index].done())  # noqa: B023
            assert prefetcher.wait(index) is None
        prefetcher.advance(index)
    assert prefetcher.depth == AUTO_DEPTHS[0]
    assert RecordingFileSystem.calls == paths[1:]
    prefetcher.close()


def run_step(prefetcher: ShardPrefetcher, step: int, seconds: float) -> None:
    """Under ``"auto"`` at ``step``: as many fetches as its depth start at once, and the first
    one ends after ``seconds`` (a planned timing, not a slept one); at the first step, the
    reader waited for it (what sets the first step's rate, as :meth:`wait` does)."""
    if step == 0:
        prefetcher._rates[0] = AUTO_DEPTHS[0] / seconds
        return
    prefetcher._step = step
    prefetcher.depth = AUTO_DEPTHS[step]
    running = [prefetcher._started() for _ in range(AUTO_DEPTHS[step])]
    prefetcher._ended(running[0], time.perf_counter() - seconds)
    for peak in running[1:]:
        prefetcher._peaks.remove(peak)


@pytest.mark.parametrize(
    ("four_seconds", "eight_seconds", "depth"),
    [
        (0.4, 0.4, 8),  # capped per connection: each fetch takes as long however many run
        (0.8, None, 2),  # capped as a whole: 4 at once take twice as long, no more per second
        (0.4, 1.0, 4),  # the rate grows up to 4 fetches at once, hardly beyond
    ],
)
def test_auto_keeps_each_step_only_where_it_adds_fetches_per_second(
    four_seconds, eight_seconds, depth
):
    """2 at once, 0.4 s each: 5 fetches per second. A step whose first fetch brings under
    1 + AUTO_GROWTH * (its depth / the depth below - 1) times the step below's rate goes
    back one step for good; one that does takes the next step at once."""
    assert AUTO_DEPTHS == (2, 4, 8)
    prefetcher = ShardPrefetcher(["a"], lambda url: (None, url), depth="auto")
    run_step(prefetcher, 0, 0.4)
    assert prefetcher.depth == 2
    run_step(prefetcher, 1, four_seconds)  # 0.4 s: 10 per second, over 1.5x 5
    if eight_seconds is not None:
        assert prefetcher.depth == 8
        assert not prefetcher._settled
        run_step(prefetcher, 2, eight_seconds)  # 1.0 s: 8 per second, under 1.5x 10
    assert prefetcher.depth == depth
    assert prefetcher._settled


def test_a_fetch_no_deeper_than_the_step_below_says_nothing_of_its_step():
    """A fetch that started at the second step but ran beside only one other (the reader
    kept up) does not decide the step."""
    prefetcher = ShardPrefetcher(["a"], lambda url: (None, url), depth="auto")
    run_step(prefetcher, 0, 0.4)
    prefetcher._step = 1
    prefetcher.depth = AUTO_DEPTHS[1]
    running = [prefetcher._started() for _ in range(AUTO_DEPTHS[0])]
    prefetcher._ended(running[0], time.perf_counter() - 10.0)
    assert prefetcher.depth == AUTO_DEPTHS[1]
    assert not prefetcher._settled


def test_the_first_steps_rate_is_the_fetch_waited_for_not_the_fastest():
    """A first-step fetch that ended fast (it ran beside another only for a moment: 2 over
    0.14 s reads 14 per second where 2 at once give 7) does not set the rate the second step
    must beat; the fetch whose wait takes the second step does."""
    prefetcher = ShardPrefetcher(["a"], lambda url: (None, url), depth="auto")
    running = [prefetcher._started() for _ in range(AUTO_DEPTHS[0])]
    prefetcher._ended(running[0], time.perf_counter() - 0.14)
    prefetcher._ended(running[1], time.perf_counter() - 0.28)
    assert prefetcher._rates[0] == 0.0


def test_prefetch_is_auto_or_a_non_negative_int():
    with pytest.raises(ValueError, match='prefetch must be "auto" or an int >= 0'):
        ShardDataset(["file:///nowhere.tar"], prefetch="deep")
    with pytest.raises(ValueError, match="prefetch"):
        ShardDataset(["file:///nowhere.tar"], prefetch=-1)
    assert ShardDataset(["file:///nowhere.tar"]).prefetch == "auto"


def test_an_unreachable_url_is_reported_when_its_shard_is_reached():
    def locate(url):
        raise ValueError(f"unknown protocol in {url}")

    prefetcher = ShardPrefetcher(["a", "bogus://b"], locate, depth=1)
    prefetcher.advance(0)
    assert isinstance(prefetcher.wait(1), ValueError)
    assert prefetcher.wait(1) is None


def test_with_the_wds_filesystem_prefetched_shards_are_read_from_its_cache(tmp_path):
    paths = write_shards(tmp_path, 6, 5)
    options = {"wds": {"cache_dir": str(tmp_path / "cache")}}
    urls = [f"wds::file://{path}" for path in paths]
    iterator = iter(ShardDataset(urls, storage_options=options, shuffle_shards=False))
    next(iterator)
    fs, _ = fsspec.core.url_to_fs(urls[0], **options)
    wait_for(lambda: fs.cache_stats()["cached_files"] == 3)
    assert len(list(iterator)) == 29
    stats = fs.cache_stats()
    assert stats["misses"] == 6 and stats["cached_files"] == 6
    assert stats["hits"] == 0  # reading what the prefetch brought in is the same lookup


EXIT_WITH_ITERATORS_ALIVE = """
import json, sys
setup = sys.argv[2]
if setup != "plain":
    import torch
from fsspec_shards import ShardDataset
urls, cache = json.loads(sys.argv[1])
dataset = ShardDataset(urls, storage_options={"wds": {"cache_dir": cache}}, shuffle_buffer=3)
alive = iter(dataset)
next(alive)
if setup == "workers":
    from torch.utils.data import DataLoader
    loader = iter(DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=list))
    next(loader)
print("exiting")
"""


@pytest.mark.parametrize("setup", ["plain", "torch", "workers"])
def test_exiting_with_iterators_alive_prints_nothing(tmp_path, setup):
    if setup != "plain":
        pytest.importorskip("torch")
    paths = write_shards(tmp_path, 6, 5)
    arguments = json.dumps([[f"wds::file://{path}" for path in paths], str(tmp_path / "cache")])
    result = subprocess.run(
        [sys.executable, "-c", EXIT_WITH_ITERATORS_ALIVE, arguments, setup],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "exiting\n", "")


EXIT_WHILE_PREFETCHING = """
import json, sys, time
import fsspec
from fsspec.implementations.local import LocalFileSystem

class Stalled(LocalFileSystem):
    protocol = "stalledprefetch"

    def prefetch(self, path):
        time.sleep(600)

fsspec.register_implementation("stalledprefetch", Stalled, clobber=True)
from fsspec_shards import ShardDataset
dataset = ShardDataset(json.loads(sys.argv[1]), shuffle_shards=False)
if sys.argv[2] == "workers":
    from torch.utils.data import DataLoader
    alive = iter(DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=list))
else:
    alive = iter(dataset)
next(alive)
"""


@pytest.mark.parametrize("setup", ["main", "workers"])
def test_exiting_does_not_wait_for_a_running_prefetch(tmp_path, setup):
    if setup == "workers":
        pytest.importorskip("torch")
    urls = [f"stalledprefetch://{path}" for path in write_shards(tmp_path, 6, 5)]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", EXIT_WHILE_PREFETCHING, json.dumps(urls), setup],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert time.monotonic() - started < 60  # a prefetch takes 600 s
