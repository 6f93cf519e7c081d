"""The chain walk of :mod:`fsspec_shards.exception_chain`: cause before context, a hidden
context only on request, each link once."""

from __future__ import annotations

import pytest

from fsspec_shards.exception_chain import links


def _raised(make):
    try:
        make()
    except BaseException as error:  # noqa: BLE001 - the test wants whatever was raised
        return error
    raise AssertionError("nothing raised")


def test_a_lone_exception_is_its_own_chain():
    error = ValueError("alone")
    assert list(links(error)) == [error]


def test_the_context_of_an_exception_raised_while_handling_another_is_followed():
    def make():
        try:
            raise KeyError("first")
        except KeyError:
            raise OSError("second")  # noqa: B904 - the implicit context is the point

    error = _raised(make)
    assert [type(link) for link in links(error)] == [OSError, KeyError]


def test_an_explicit_cause_wins_over_the_context():
    cause = ConnectionError("cause")

    def make():
        try:
            raise KeyError("context")
        except KeyError:
            raise OSError("outer") from cause

    chain = list(links(_raised(make)))
    assert chain[1] is cause and len(chain) == 2


def test_a_context_hidden_by_from_none_ends_the_chain_unless_asked_for():
    def make():
        try:
            raise KeyError("hidden")
        except KeyError:
            raise OSError("outer") from None

    error = _raised(make)
    assert [type(link) for link in links(error)] == [OSError]
    assert [type(link) for link in links(error, follow_suppressed=True)] == [OSError, KeyError]


def test_asked_for_every_link_the_context_behind_an_explicit_cause_is_walked_too():
    cause = ConnectionError("cause")

    def make():
        try:
            raise KeyError("handled")
        except KeyError:
            raise OSError("outer") from cause

    error = _raised(make)
    assert [type(link) for link in links(error)] == [OSError, ConnectionError]
    reachable = [type(link) for link in links(error, follow_suppressed=True)]
    assert reachable == [OSError, ConnectionError, KeyError]


def test_a_cyclic_chain_yields_each_link_once_and_ends():
    first, second = ValueError("a"), ValueError("b")
    first.__cause__, second.__cause__ = second, first
    assert list(links(first)) == [first, second]
    first.__cause__ = first
    assert list(links(first)) == [first]


@pytest.mark.parametrize("follow_suppressed", [False, True])
def test_a_long_chain_is_walked_to_its_end(follow_suppressed):
    errors = [OSError(str(n)) for n in range(50)]
    for outer, inner in zip(errors, errors[1:], strict=False):
        outer.__context__ = inner
    assert list(links(errors[0], follow_suppressed=follow_suppressed)) == errors
