"""What the commands print."""

from __future__ import annotations

from fsspec_shards.cli.report import print_table


def test_tables_pad_every_column_but_the_last(capsys):
    print_table(("shard", "check", "result"), [("a.tar", "size only", "ok"), ("bb.tar", "-", "x")])
    assert capsys.readouterr().out.splitlines() == [
        "shard   check      result",
        "a.tar   size only  ok",
        "bb.tar  -          x",
    ]
