"""The epoch number shared with DataLoader workers: set in the owner, followed elsewhere."""

from __future__ import annotations

import copy
import logging
import multiprocessing
import pickle

from fsspec_shards.iteration import epoch as epoch_module
from fsspec_shards.iteration.epoch import EpochNumber


def follow_in_child(epoch: EpochNumber, queue, published) -> None:
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("fsspec_shards.dataset").addHandler(Keep())
    published.wait(60)
    first = epoch.follow()
    epoch.set(first + 100)  # a worker's own epoch (a mixture's round) stays its own
    own = epoch.follow()
    queue.put((first, own, epoch.follow(), records))


def run_child(context: str, epoch: EpochNumber, publish: int | None = None) -> tuple:
    """What a child started with ``epoch`` follows, after the owner publishes ``publish``."""
    ctx = multiprocessing.get_context(context)
    queue, published = ctx.Queue(), ctx.Event()
    process = ctx.Process(target=follow_in_child, args=(epoch, queue, published))
    process.start()
    if publish is not None:
        epoch.set(publish)
    published.set()
    result = queue.get(timeout=60)
    process.join(timeout=60)
    return result


def test_a_spawned_worker_follows_the_epoch_published_after_it_was_made():
    assert run_child("spawn", EpochNumber(), publish=7) == (7, 107, 107, [])


def test_a_forked_worker_sees_the_owner_set_epoch_and_keeps_its_own_after():
    epoch = EpochNumber()
    first, own, again, records = run_child("fork", epoch, publish=3)
    assert (first, own, again, records) == (3, 103, 103, [])
    assert epoch.follow() == 3  # the owner's epoch is its own


def test_pickled_other_than_to_start_a_worker_the_copy_keeps_its_epoch_and_shares_nothing():
    epoch = EpochNumber(4)
    for copied in (pickle.loads(pickle.dumps(epoch)), copy.deepcopy(epoch)):
        copied.set(9)
        assert copied.follow() == 9 and epoch.follow() == 4


def test_without_shared_memory_a_worker_repeating_an_epoch_warns(monkeypatch):
    def no_shared_memory(*args):
        raise OSError("no shared memory here")

    monkeypatch.setattr(multiprocessing, "RawValue", no_shared_memory)
    monkeypatch.setattr(epoch_module, "in_dataloader_worker", lambda: True)  # the forked child
    epoch = EpochNumber(2)
    first, own, again, records = run_child("fork", epoch)
    assert (first, own) == (2, 102)
    assert len(records) == 1 and "starts epoch 102 again" in records[0]


def follow_in_grandchild(epoch: EpochNumber, queue, published) -> None:
    published.wait(60)
    queue.put(epoch.follow())


def trainer(epoch: EpochNumber, queue) -> None:
    """A process the epoch was handed to (``torch.multiprocessing.spawn(train, args=(ds,))``):
    its set_epoch must reach the workers it forks, persistent ones too."""
    epoch.set(0)
    ctx = multiprocessing.get_context("fork")
    published = ctx.Event()
    worker = ctx.Process(target=follow_in_grandchild, args=(epoch, queue, published))
    worker.start()
    epoch.set(5)
    published.set()
    worker.join(timeout=60)


def test_a_trainer_given_the_epoch_by_spawn_reaches_its_own_persistent_workers():
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=trainer, args=(EpochNumber(), queue))
    process.start()
    assert queue.get(timeout=60) == 5  # was 0: only the process that made it published
    process.join(timeout=60)
