"""``fsspec-shards prefetch``: filling the cache, resumably."""

from __future__ import annotations

import io

from tests.cli.running import run_cli, run_in_process


def test_prefetch_fills_the_cache_and_skips_cached_shards_on_rerun(dataset, cache):
    first = run_cli("prefetch", dataset.pattern, "--cache-dir", str(cache), "-j", "3", cache=cache)
    assert first.returncode == 0, first.stderr
    assert "prefetched 4 of 4 shards: 4 downloaded" in first.stdout
    second = run_cli("prefetch", dataset.pattern, "--cache-dir", str(cache), "-q", cache=cache)
    assert second.returncode == 0, second.stderr
    assert "0 downloaded" in second.stdout and "4 already cached" in second.stdout


def test_the_bar_counts_shards_and_shows_bytes_in_the_units_of_the_summary(
    dataset, cache, capsys, monkeypatch
):
    from tqdm import tqdm

    from fsspec_shards.cli import prefetch
    from fsspec_shards.fleet.report import format_bytes

    screen = io.StringIO()
    monkeypatch.setattr(
        prefetch, "progress", lambda args, **kwargs: tqdm(file=screen, disable=False, **kwargs)
    )
    code, out, _ = run_in_process(
        ["prefetch", dataset.pattern, "--cache-dir", str(cache), "-j", "2"], capsys
    )
    assert code == 0
    total = format_bytes(sum(path.stat().st_size for path in dataset.shards))
    assert f"4 downloaded ({total})" in out
    last = screen.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert "4/4" in last and " shards" in last and f"{total}, " in last and "iB/s" in last


def test_the_postfix_rate_is_bytes_over_seconds_in_binary_units():
    from fsspec_shards.cli.prefetch import bytes_postfix

    assert bytes_postfix(0, 0.0) == "0 B, 0 B/s"
    assert bytes_postfix(138_800_000, 2.0) == "132.4 MiB, 66.2 MiB/s"
