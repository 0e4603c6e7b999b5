"""How a site hook's answer of task ids is read (policy.py ``_task_ids``): plain ints
taken as they are, other integers converted, anything else refused naming the hook."""

from __future__ import annotations

import pytest

from xce_resize_plugin.errors import PolicyRejected
from xce_resize_plugin.policy import _task_ids


class Index:
    """An integer of another kind (numpy's integers behave so)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_plain_ints_are_taken_in_their_order() -> None:
    assert _task_ids("h", [5, 3, 9], 10) == (5, 3, 9)
    assert _task_ids("h", (i for i in range(4000, 0, -1)), 4000) == tuple(range(4000, 0, -1))
    assert _task_ids("h", [], 3) == ()


def test_other_integers_are_converted_to_int() -> None:
    ids = _task_ids("h", [7, Index(4), 2], 10)
    assert ids == (7, 4, 2) and all(type(i) is int for i in ids)


@pytest.mark.parametrize("answer", [[1, True], [2.0], [1, "3"], [None]])
def test_anything_else_is_refused_naming_the_hook(answer: list[object]) -> None:
    with pytest.raises(
        PolicyRejected,
        match=r"^Rejected by site policy: xce_hook returned .* task ids are integers$",
    ):
        _task_ids("xce_hook", answer, 10)


def test_more_ids_than_could_be_chosen_are_refused() -> None:
    with pytest.raises(PolicyRejected, match="more than 3 task ids"):
        _task_ids("h", [1, 2, 3, 4], 3)
