"""The LSF release specification: grammar, resolution against an allocation, errors."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.core.models import Task
from xce_resize_plugin.core.releasespec import (
    MAX_COUNT,
    ReleaseSpec,
    format_release_spec,
    parse_release_spec,
    resolve_host_counts,
    resolve_release,
    resolve_task_ids,
)
from xce_resize_plugin.errors import (
    BadHost,
    BadReleaseHostSpec,
    BadSlots,
    HostNotInAlloc,
    InvalidRequest,
    ReleaseFirstHost,
    ReleaseNoop,
    ResizeError,
)


def alloc(*hosts: str) -> tuple[Task, ...]:
    """An allocation in allocation order: task i on hosts[i]."""
    return tuple(Task(i, h) for i, h in enumerate(hosts))


# hostA (first host): tasks 0, 1; hostB: 2, 3, 6; hostC: 4, 5 (ids 6 came from a grow).
JOB = alloc("hostA", "hostA", "hostB", "hostB", "hostC", "hostC", "hostB")


# --- parsing -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hostB", ReleaseSpec(all=False, hosts=(("hostB", None),))),
        ("2*hostB", ReleaseSpec(all=False, hosts=(("hostB", 2),))),
        ("all", ReleaseSpec(all=True)),
        ("all ~hostB ~1*hostC", ReleaseSpec(all=True, hosts=(("hostB", None), ("hostC", 1)))),
        ("hostA 2*hostB", ReleaseSpec(all=False, hosts=(("hostA", None), ("hostB", 2)))),
        ("  all\t~hostB\n", ReleaseSpec(all=True, hosts=(("hostB", None),))),
        ("002*node-1.cluster_x", ReleaseSpec(all=False, hosts=(("node-1.cluster_x", 2),))),
        ("7node", ReleaseSpec(all=False, hosts=(("7node", None),))),
        ("ALL", ReleaseSpec(all=False, hosts=(("ALL", None),))),  # the keyword is lowercase
        (f"{MAX_COUNT}*h", ReleaseSpec(all=False, hosts=(("h", MAX_COUNT),))),
    ],
)
def test_parse_valid(text: str, expected: ReleaseSpec) -> None:
    assert parse_release_spec(text) == expected


def test_quoted_and_separate_arguments_parse_the_same() -> None:
    one = parse_release_spec(["all ~hostB ~1*hostC"])
    several = parse_release_spec(["all", "~hostB", "~1*hostC"])
    mixed = parse_release_spec(["all ~hostB", "~1*hostC"])
    assert one == several == mixed == parse_release_spec("all ~hostB ~1*hostC")


@pytest.mark.parametrize(
    ("text", "error", "names"),
    [
        ("", BadReleaseHostSpec, "empty release specification"),
        ("   ", BadReleaseHostSpec, "empty release specification"),
        ("~hostB", BadReleaseHostSpec, "~hostB"),
        ("hostA ~hostB", BadReleaseHostSpec, "~hostB"),
        ("all all", BadReleaseHostSpec, "all"),
        ("hostA all", BadReleaseHostSpec, "all"),
        ("all hostB", BadReleaseHostSpec, "hostB"),
        ("hostB*2", BadReleaseHostSpec, "hostB*2"),
        ("hostB 1*hostB", BadReleaseHostSpec, "1*hostB"),
        ("all ~hostB ~2*hostB", BadReleaseHostSpec, "~2*hostB"),
        ("~all", BadReleaseHostSpec, "~all"),
        ("2*all", BadReleaseHostSpec, "2*all"),
        ("0*hostA", BadSlots, "0*hostA"),
        ("000*hostA", BadSlots, "000*hostA"),
        ("-1*h", BadSlots, "-1*h"),
        ("*h", BadSlots, "*h"),
        ("x*h", BadSlots, "x*h"),
        ("+2*h", BadSlots, "+2*h"),
        ("٣*h", BadSlots, "٣*h"),  # an Arabic-Indic digit: int() would take it
        (f"{MAX_COUNT + 1}*h", BadSlots, f"{MAX_COUNT + 1}*h"),
        ("9" * 5000 + "*h", BadSlots, "9999"),
        ("all ~0*hostB", BadSlots, "~0*hostB"),
        ("2*", BadHost, "2*"),
        ("~", BadReleaseHostSpec, "~"),
        ("all ~", BadHost, "~"),
        ("host!", BadHost, "host!"),
        ("-h", BadHost, "-h"),
        (".hidden", BadHost, ".hidden"),
        ("2*a*b", BadHost, "2*a*b"),
        ("all ~~hostB", BadHost, "~~hostB"),
        ("hôte", BadHost, "hôte"),
        ("h" * 256, BadHost, "hhhh"),
        # Blanks are ASCII blanks, as in a shell: a no-break space or \x1c was a separator,
        # so "hA\xa0hB" released from two hosts.
        ("hA\xa0hB", BadHost, r"'hA\xa0hB'"),
        ("hA\x1chB", BadHost, r"'hA\x1chB'"),
    ],
)
def test_parse_errors(text: str, error: type[ResizeError], names: str) -> None:
    with pytest.raises(error) as info:
        parse_release_spec(text)
    # Exact class, not a subclass: the LSF code is what scripts check.
    assert type(info.value) is error
    assert info.value.code == error.code
    assert info.value.detail is not None and names in info.value.detail


def test_error_codes_are_lsfs() -> None:
    for text, number in [("~h", 358), ("0*h", 667), ("h!", 372)]:
        with pytest.raises(ResizeError) as info:
            parse_release_spec(text)
        assert info.value.lsf_number == number


def test_first_error_in_written_order_wins() -> None:
    with pytest.raises(BadSlots, match="0"):
        parse_release_spec("0*a b!")
    with pytest.raises(BadHost, match="b!"):
        parse_release_spec("a b! 0*c")


# --- resolving -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "released"),
    [
        ("hostB", (2, 3, 6)),
        ("2*hostB", (3, 6)),  # newest first
        ("1*hostB", (6,)),
        ("1*hostA", (1,)),
        ("all", (1, 2, 3, 4, 5, 6)),
        ("all ~hostB", (1, 4, 5)),
        ("all ~hostB ~1*hostC", (1, 5)),  # keep the oldest on hostC
        ("all ~1*hostA", (1, 2, 3, 4, 5, 6)),  # task 0 counts toward N on the first host
        ("all ~2*hostA", (2, 3, 4, 5, 6)),
        ("all ~hostA", (2, 3, 4, 5, 6)),
        ("all ~2*hostB", (1, 4, 5, 6)),
        ("hostC 1*hostB", (4, 5, 6)),
    ],
)
def test_resolve(text: str, released: tuple[int, ...]) -> None:
    assert resolve_release(parse_release_spec(text), JOB) == released


@pytest.mark.parametrize(
    ("text", "error", "names"),
    [
        ("hostZ", HostNotInAlloc, "hostZ"),
        ("hostB 2*hostZ", HostNotInAlloc, "hostZ"),
        ("all ~hostZ", HostNotInAlloc, "hostZ"),
        ("all ~1*hostZ", HostNotInAlloc, "hostZ"),
        ("4*hostB", BadSlots, "4*hostB"),
        ("3*hostC", BadSlots, "3*hostC"),
        ("all ~3*hostC", BadSlots, "~3*hostC"),
        ("2*hostA", ReleaseFirstHost, "2*hostA"),  # N = all of the first host's tasks
        # The first execution host cannot be named as a whole (LSF refuses it too).
        ("hostA", ReleaseFirstHost, "'hostA': hostA is the first execution host"),
        ("hostB hostA", ReleaseFirstHost, "'hostA'"),
        ("3*hostA", BadSlots, "3*hostA"),  # more than there are: the count is wrong
        ("all ~hostA ~hostB ~hostC", ReleaseNoop, "all"),
        ("all ~2*hostA ~3*hostB ~hostC", ReleaseNoop, "all"),
    ],
)
def test_resolve_errors(text: str, error: type[ResizeError], names: str) -> None:
    with pytest.raises(error) as info:
        resolve_release(parse_release_spec(text), JOB)
    assert type(info.value) is error
    assert info.value.detail is not None and names in info.value.detail


def test_first_host_with_only_the_head_task() -> None:
    job = alloc("hostA", "hostB", "hostB")
    with pytest.raises(ReleaseFirstHost, match="hostA") as info:
        resolve_release(parse_release_spec("hostA"), job)
    assert info.value.lsf_number == 666
    with pytest.raises(ReleaseFirstHost):
        resolve_release(parse_release_spec("1*hostA"), job)
    with pytest.raises(ReleaseNoop) as noop:
        resolve_release(parse_release_spec("all"), alloc("hostA"))
    assert noop.value.lsf_number == 668


def test_head_task_is_tasks_zero_not_lowest_id_elsewhere() -> None:
    # After shrinks and grows the ids are sparse and hosts interleave; ordering by id
    # within a host still decides "newest" and "oldest".
    job = (Task(0, "a"), Task(9, "b"), Task(4, "b"), Task(7, "a"), Task(12, "b"))
    assert resolve_release(parse_release_spec("2*b"), job) == (9, 12)
    assert resolve_release(parse_release_spec("all ~1*b"), job) == (7, 9, 12)
    assert resolve_release(parse_release_spec("1*a"), job) == (7,)
    with pytest.raises(ReleaseFirstHost, match="keeps the head task \\(task 0\\)"):
        resolve_release(parse_release_spec("a"), job)


def test_empty_hand_built_spec_releases_nothing() -> None:
    with pytest.raises(ReleaseNoop):
        resolve_release(ReleaseSpec(all=False), JOB)


def test_format_round_trips_the_examples() -> None:
    for text in ["hostB", "2*hostB", "all", "all ~hostB ~1*hostC", "a 3*b c"]:
        assert format_release_spec(parse_release_spec(text)) == text


# --- the REST forms ------------------------------------------------------------------


def test_resolve_host_counts() -> None:
    assert resolve_host_counts({"hostB": 2, "hostC": None}, JOB) == (3, 4, 5, 6)
    assert resolve_host_counts({"hostA": 1}, JOB) == (1,)


@pytest.mark.parametrize(
    ("hosts", "error", "names"),
    [
        ({}, BadReleaseHostSpec, "empty release specification"),
        ({"host!": 1}, BadHost, "host!"),
        ({"": None}, BadHost, "missing host name"),
        ({"all": None}, BadReleaseHostSpec, "all"),
        ({"hostB": 0}, BadSlots, "hostB"),
        ({"hostB": -1}, BadSlots, "hostB"),
        ({"hostB": True}, BadSlots, "hostB"),
        ({"hostB": MAX_COUNT + 1}, BadSlots, "hostB"),
        ({"hostZ": 1}, HostNotInAlloc, "hostZ"),
        ({"hostB": 4}, BadSlots, "4*hostB"),
        ({"hostA": 2}, ReleaseFirstHost, "2*hostA"),
        ({"hostA": None}, ReleaseFirstHost, "hostA"),
    ],
)
def test_resolve_host_counts_errors(
    hosts: dict[str, int | None], error: type[ResizeError], names: str
) -> None:
    with pytest.raises(error) as info:
        resolve_host_counts(hosts, JOB)
    assert type(info.value) is error
    assert info.value.detail is not None and names in info.value.detail


def test_resolve_task_ids() -> None:
    assert resolve_task_ids([6, 1, 3], JOB) == (1, 3, 6)
    assert resolve_task_ids(iter([5]), JOB) == (5,)


@pytest.mark.parametrize(
    ("ids", "error", "detail"),
    [
        ([], ReleaseNoop, "no task ids"),
        ([0], ReleaseFirstHost, "task 0"),
        ([3, 0], ReleaseFirstHost, "task 0"),
        ([42], InvalidRequest, "task 42 is not part of the job's allocation"),
        ([-1], InvalidRequest, "task -1 is not part of the job's allocation"),
        ([3, 3], InvalidRequest, "task 3 is listed more than once"),
    ],
)
def test_resolve_task_ids_errors(ids: list[int], error: type[ResizeError], detail: str) -> None:
    with pytest.raises(error) as info:
        resolve_task_ids(ids, JOB)
    assert type(info.value) is error
    assert info.value.detail is not None and detail in info.value.detail


# --- properties ----------------------------------------------------------------------

HOSTS = ["h0", "h1", "h2", "h3", "h4"]


@st.composite
def allocations(draw: st.DrawFn) -> tuple[Task, ...]:
    """A job's allocation: task 0 first, then the rest with sparse ascending ids."""
    hosts = draw(st.lists(st.sampled_from(HOSTS), min_size=1, max_size=12))
    rest = draw(st.sets(st.integers(1, 60), min_size=len(hosts) - 1, max_size=len(hosts) - 1))
    ids = [0, *sorted(rest)]
    return tuple(Task(i, h) for i, h in zip(ids, hosts, strict=True))


host_specs = st.lists(
    st.tuples(st.sampled_from(HOSTS), st.one_of(st.none(), st.integers(1, 6))),
    max_size=5,
    unique_by=lambda hc: hc[0],
)
specs = st.builds(
    lambda all_, hosts: ReleaseSpec(all=all_ or not hosts, hosts=tuple(hosts)),
    st.booleans(),
    host_specs,
)


@settings(max_examples=300, deadline=None)
@given(allocations(), specs)
def test_resolve_release_properties(tasks: tuple[Task, ...], spec: ReleaseSpec) -> None:
    try:
        released = resolve_release(spec, tasks)
    except (HostNotInAlloc, BadSlots, ReleaseFirstHost, ReleaseNoop):
        return
    ids = {t.id for t in tasks}
    assert released, "an empty release must be ReleaseNoop"
    assert 0 not in released and tasks[0].id not in released
    assert set(released) <= ids
    assert list(released) == sorted(set(released))
    host_of = {t.id: t.host for t in tasks}
    per_host = Counter(host_of[i] for i in released)
    on_host = Counter(t.host for t in tasks)
    if spec.all:
        # Kept tasks per host match the exceptions exactly (plus the head on host 0).
        named = dict(spec.hosts)
        for host, total in on_host.items():
            kept = total - per_host[host]
            if host in named:
                count = named[host]
                expected = total if count is None else count
                if host == tasks[0].host:
                    expected = max(expected, 1)
            else:
                expected = 1 if host == tasks[0].host else 0
            assert kept == expected, host
    else:
        assert set(per_host) == {h for h, _ in spec.hosts}
        for host, count in spec.hosts:
            if count is None:
                assert per_host[host] == on_host[host] - (host == tasks[0].host)
            else:
                assert per_host[host] == count
                # Newest first: every released task there is newer than every kept one.
                there = sorted(t.id for t in tasks if t.host == host)
                assert {i for i in released if host_of[i] == host} == set(there[-count:])


@settings(max_examples=200, deadline=None)
@given(specs)
def test_format_parse_round_trip(spec: ReleaseSpec) -> None:
    assert parse_release_spec(format_release_spec(spec)) == spec


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="ab~*0123 -!.all\t", max_size=8), max_size=5))
def test_junk_specs_raise_only_resize_errors(tokens: list[str]) -> None:
    try:
        spec = parse_release_spec(tokens)
    except (BadReleaseHostSpec, BadSlots, BadHost):
        return
    assert parse_release_spec(format_release_spec(spec)) == spec
    with contextlib.suppress(HostNotInAlloc, BadSlots, ReleaseFirstHost, ReleaseNoop):
        resolve_release(spec, JOB)
