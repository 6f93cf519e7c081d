"""benchmarks/bench_gpu.py in its small CPU mode: every loader and the training step run,
on what the test extra installs (PIL decode, a small conv net when torchvision is absent)."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("webdataset")

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_the_gpu_benchmark_runs_small_on_cpu(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench_gpu = importlib.import_module("bench_gpu")
    results = bench_gpu.run(rounds=1, size="small", device="cpu")
    assert set(results) == {"images_loader", "token_rows_loader", "training_step"}
    for case in ("images_loader", "token_rows_loader"):
        for reader in ("ours_paths", "ours_warm", "ours_cold", "wds"):
            assert results[case][f"{reader}_per_s"] > 0
            assert results[case][f"{reader}_first_batch_s"] > 0
    training = results["training_step"]
    assert training["synthetic_images_per_s"] > 0
    for reader in ("ours_cold", "ours_warm", "wds", "wds_drop_last"):
        assert training[f"{reader}_vs_synthetic"] > 0 and 0 <= training[f"{reader}_wait_pct"] <= 100
    # 200 images over 2 workers in batches of 16: webdataset ends each worker's 100 with a
    # batch of 4, which drop_last drops (ours, made with batch_size=16, has whole batches).
    assert math.isclose(training["wds_drop_last_dropped_pct"], 4.0)
