"""What ``xce_sched_cycle`` sees of the embedded controller's cluster: its free slots as
offered to grows (all of them, or with ``protect_reservation`` only those a blocked
queue head does not need at its shadow time) and the blocked head itself.

Apart from the controller because it is the one part of the scheduler's state the
plugin reads, through :class:`~xce_resize_plugin.host.ClusterView`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from xce_resize_plugin.controllers.cluster import Cluster
from xce_resize_plugin.controllers.scheduler import Reservation
from xce_resize_plugin.controllers.slots import FreeSlots
from xce_resize_plugin.core.placement import SparseFree
from xce_resize_plugin.core.reclaim import QueueHead


class SimClusterView:
    """The ``cluster`` handed to ``xce_sched_cycle``: free slots per host, in host
    order, read live (slots the plugin reserves during the cycle disappear from it).

    With ``protect`` (the controller's ``protect_reservation`` option) and a blocked
    queue head, only the slots the head does not need at its shadow time are offered,
    so a grow cannot delay the head (see :func:`offered_total`): the reservation's
    extra slots, less those taken since the pass (``taken_at_pass`` is the cluster's
    :attr:`~.cluster.Cluster.taken_count` then), on the first hosts with free slots in
    host order; for a head with ``ptile``, per host the slots beyond what the head can
    use there.
    """

    def __init__(
        self,
        cluster: Cluster,
        reservation: Reservation | None = None,
        taken_at_pass: int = 0,
        *,
        head: Callable[[], QueueHead | None] | None = None,
    ) -> None:
        self._cluster = cluster
        self._reservation = reservation
        self._taken_at_pass = taken_at_pass
        self._head = head

    def blocked_head(self) -> QueueHead | None:
        """The pass's blocked head (see
        :meth:`.sim_controller.EmbeddedController.queue_head`), whether or not the
        reservation is protected; ``None`` for a view made without one."""
        return self._head() if self._head is not None else None

    def free_slots(self) -> Mapping[str, int]:
        """Every host's free slots as offered now; read as its hosts with free slots
        (:class:`~xce_resize_plugin.core.placement.SparseFree`), without a step per
        host of the cluster."""
        cluster = self._cluster
        res = self._reservation
        open_now = cluster.open_slots()
        offered: list[tuple[str, int]]
        if res is None:
            offered = list(open_now)
        elif res.ptile is not None:
            offered = [(h, k) for h, n in open_now if (k := _offered(h, n, res)) > 0]
        else:
            budget = _budget(cluster, res, self._taken_at_pass)
            offered = []
            for host, n in open_now:
                if budget <= 0:
                    break
                give = n if n < budget else budget
                offered.append((host, give))
                budget -= give
        return _OfferedSlots(cluster.free_counts(), offered)


class _OfferedSlots(SparseFree):
    """:meth:`SimClusterView.free_slots`: the slots offered per host as of the call;
    the hosts without any are 0 (a dict of every host is made only if read whole)."""

    __slots__ = ("_all", "_counts", "_offered")

    def __init__(self, counts: FreeSlots, offered: list[tuple[str, int]]) -> None:
        self._counts = counts
        self._offered = offered
        self._all: dict[str, int] | None = None

    def open_items(self) -> Iterable[tuple[str, int]]:
        return self._offered

    def host_order(self) -> Sequence[str]:
        return self._counts.names

    def _whole(self) -> dict[str, int]:
        if self._all is None:
            self._all = dict.fromkeys(self._counts.names, 0)
            self._all.update(self._offered)
        return self._all

    def __getitem__(self, host: str) -> int:
        return self._whole()[host]

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts.names)

    def __len__(self) -> int:
        return len(self._counts.names)

    def __contains__(self, host: object) -> bool:
        return host in self._counts


def _budget(cluster: Cluster, res: Reservation, taken_at_pass: int) -> int:
    """The extra slots of a head without ``ptile`` that nobody took since the pass."""
    return max(0, res.extra - (cluster.taken_count - taken_at_pass))


def _offered(host: str, free: int, res: Reservation) -> int:
    """How many of ``host``'s ``free`` slots a grow may take without delaying a blocked
    queue head with ``ptile`` (reservation ``res``)."""
    excess, at_pass = res.excess.get(host, (0, free))
    # Slots taken since the pass already came out of the excess.
    return max(0, min(free, excess - max(0, at_pass - free)))


def offered_total(cluster: Cluster, res: Reservation | None, taken_at_pass: int) -> int:
    """What :meth:`SimClusterView.free_slots` offers in all, without listing every host."""
    if res is None:
        return cluster.free_total
    if res.ptile is None:
        return min(cluster.free_total, _budget(cluster, res, taken_at_pass))
    return sum(_offered(h, n, res) for h, n in cluster.open_slots())
