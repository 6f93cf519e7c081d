"""The examples of docs/training-loop.md, read from the page and run: DDP over two ranks
(gloo) with an LR schedule sized by len(loader), a checkpoint and an exact resume; the
torchdata.nodes loader; the Lightning example under a real Trainer, resumed from checkpoints
taken in the middle of epoch 0 and of epoch 1."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from tests.shardmaker import write_shards

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")

PAGE = Path(__file__).resolve().parent.parent / "docs" / "training-loop.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
COUNTS = [20, 17, 25, 9, 30, 14]
EPOCHS = 2


def page(*blocks: int, **extra) -> dict:
    """The namespace the page's code blocks ``blocks`` (in order) make."""
    namespace: dict = {"__name__": "training_loop_page", **extra}
    for index in blocks:
        exec(compile(BLOCKS[index], f"{PAGE}:block{index}", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    urls = write_shards(tmp_path_factory.mktemp("loop"), len(COUNTS), COUNTS)
    return urls, dict(zip(urls, COUNTS, strict=True))


def _rank(rank, port, urls, counts, directory, results):
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        train = page(0, 1)["train"]
        whole = train(urls, counts, f"{directory}/whole", EPOCHS)
        resumed = []
        for cut in (8, 11):  # at the end of epoch 0, and inside epoch 1
            head = train(urls, counts, f"{directory}/cut{cut}", EPOCHS, stop_after=cut)
            resumed.append(head + train(urls, counts, f"{directory}/cut{cut}", EPOCHS))
        results.put((rank, whole, resumed, None))
    except BaseException as exc:  # reported to the test, which fails with it
        results.put((rank, None, None, repr(exc)))
    finally:
        dist.destroy_process_group()


def test_ddp_with_a_schedule_sized_by_len_loader_resumes_exactly(data, tmp_path):
    import multiprocessing

    urls, counts = data
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    ranks = [
        context.Process(target=_rank, args=(rank, port, urls, counts, tmp_path, results))
        for rank in range(2)
    ]
    for process in ranks:
        process.start()
    outcome = sorted(results.get(timeout=240) for _ in ranks)
    for process in ranks:
        process.join(timeout=60)
    assert [error for *_, error in outcome] == [None, None]
    (_, whole0, resumed0, _), (_, whole1, resumed1, _) = outcome
    # 115 samples over 2 ranks: 58 each, 8 whole batches of 8 per epoch; OneCycleLR
    # (sized by len(loader)) took every step without raising.
    assert len(whole0) == len(whole1) == EPOCHS * 8 * 8
    assert resumed0 == [whole0, whole0] and resumed1 == [whole1, whole1]
    assert set(whole0[:64]) | set(whole1[:64]) == {
        f"s{shard:04d}_{index:05d}" for shard, n in enumerate(COUNTS) for index in range(n)
    }


def test_the_torchdata_nodes_loader_resumes_mid_epoch(data):
    urls, counts = data
    nodes_loader = page(0, 2)["nodes_loader"]
    dataset, loader = nodes_loader(urls, counts)
    dataset.set_epoch(1)
    whole = [batch["__key__"] for batch in loader]
    assert len(whole) == len(dataset) // 8 == 15
    dataset, loader = nodes_loader(urls, counts)
    dataset.set_epoch(1)
    iterator = iter(loader)
    head = [next(iterator)["__key__"] for _ in range(6)]
    state = loader.state_dict()
    dataset, loader = nodes_loader(urls, counts)
    dataset.set_epoch(1)
    loader.load_state_dict(state)
    assert head + [batch["__key__"] for batch in loader] == whole


def test_the_lightning_example_resumes_exactly_from_mid_epoch_checkpoints(data, tmp_path):
    pytest.importorskip("lightning")
    urls, counts = data
    namespace = page(3, 4, urls=urls, counts=counts, directory=str(tmp_path))  # asserts itself
    whole, fit = namespace["whole"], namespace["fit"]
    assert len(whole) == 2 * 15 and len({key for batch in whole for key in batch}) == 115
    assert whole[:15] != whole[15:]  # each epoch its own order
    rest = fit(urls, counts, tmp_path / "cut", ckpt_path=tmp_path / "cut/epoch=0-step=10.ckpt")
    assert namespace["head"][:10] + rest == whole  # from the middle of epoch 0
