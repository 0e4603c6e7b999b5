"""``FinishedJobs`` (controllers/finished_jobs.py) against a plain model: what is due,
each user's oldest, the counts, and heaps that stay bounded by the jobs kept."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from xce_resize_plugin.controllers import finished_jobs
from xce_resize_plugin.controllers.finished_jobs import FinishedJobs

USERS = ["alice", "bob", "cat"]

_op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 50), st.integers(0, 40), st.sampled_from(USERS)),
    st.tuples(st.just("due"), st.integers(0, 50)),
    st.tuples(st.just("oldest"), st.sampled_from([*USERS, "nobody"])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=120))
@example(
    [
        ("add", 1, 1, "cat"),
        ("add", 2, 0, "cat"),
        ("due", 1),
        ("add", 1, 1, "alice"),
        ("oldest", "cat"),
    ]
)  # a leftover in cat's heap of a job kept again for alice
def test_finished_jobs_behave_as_a_sorted_model(ops: list[tuple[object, ...]]) -> None:
    real = FinishedJobs()
    model: dict[str, tuple[float, str]] = {}  # job id -> (end, user)
    for op in ops:
        if op[0] == "add":
            _, end, n, user = op
            job_id = f"{n:03d}"
            real.add(float(end), job_id, str(user))  # type: ignore[arg-type]
            model.setdefault(job_id, (float(end), str(user)))  # type: ignore[arg-type]
        elif op[0] == "due":
            before = float(op[1])  # type: ignore[arg-type]
            due = sorted((e, j) for j, (e, _) in model.items() if e <= before)
            got = real.pop_due(before)
            assert got == (due[0] if due else None)
            if got is not None:
                del model[got[1]]
        else:
            user = str(op[1])
            mine = sorted((e, j) for j, (e, u) in model.items() if u == user)
            got = real.pop_oldest(user)
            assert got == (mine[0] if mine else None)
            if got is not None:
                del model[got[1]]
        assert len(real) == len(model)
        for user in USERS:
            assert real.count(user) == sum(1 for _, u in model.values() if u == user)
        assert real.users_over(0) == sorted({u for _, u in model.values()})


def test_heaps_stay_bounded_by_the_jobs_kept_under_churn() -> None:
    """Jobs taken out through one heap leave leftovers in the other; a churn of jobs
    (one user's, through its own heap) does not grow the other heap without bound."""
    real = FinishedJobs()
    real.add(0.0, "keep", "bob")
    for n in range(20 * finished_jobs._SLACK):
        real.add(float(n + 1), f"j{n}", "alice")
        assert real.pop_oldest("alice") == (float(n + 1), f"j{n}")
        assert len(real._heap) <= 2 * len(real) + finished_jobs._SLACK + 1
    assert len(real) == 1 and real.pop_due(0.0) == (0.0, "keep")
    # And the other way round: jobs aged out leave leftovers in their user's heap.
    for n in range(20 * finished_jobs._SLACK):
        real.add(float(n), f"k{n}", "cat")
        real.add(float(n), f"x{n}", "dan")
        assert real.pop_due(float(n)) is not None and real.pop_due(float(n)) is not None
        real.add(float(n) + 0.5, f"c{n}", "cat")
        assert all(
            len(heap) <= 2 * real.count(user) + finished_jobs._SLACK + 1
            for user, heap in real._by_user.items()
        )
