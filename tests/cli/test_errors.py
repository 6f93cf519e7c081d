"""The exit codes of :mod:`fsspec_shards.cli.errors`: distinct, and the help that lists
them says what the constants are."""

from __future__ import annotations

import re

from fsspec_shards.cli import errors

CODES = {name: value for name, value in vars(errors).items() if name.startswith("EXIT_")}
CODES.pop("EXIT_CODES_HELP")


def test_every_exit_code_is_distinct():
    assert len(set(CODES.values())) == len(CODES), CODES


def test_the_help_lists_every_exit_code_and_no_other():
    listed = {int(code) for code in re.findall(r"(\d+) [a-z]", errors.EXIT_CODES_HELP)}
    assert listed == set(CODES.values())
