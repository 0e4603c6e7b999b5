"""Site policy: grows pack onto the fullest hosts that still have room (best fit).

Why a site wants it: the default spreads a grow over the emptiest hosts, which keeps
breaking up whole hosts that wide jobs in the queue are waiting for. Packing keeps empty
hosts empty. The job's own hosts still come first (fewer hosts per job, less traffic).

Enable with ``[resize] policy_files = ["hooks/pack_grow_hosts.py"]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from xce_resize_plugin import GrowHosts, GrowHostView, JobInfo, hookimpl


def _order(job: JobInfo, hosts: GrowHostView) -> Iterator[str]:
    own = [] if job.grow_hosts is GrowHosts.NEW_ONLY else list(hosts.job_hosts())
    yield from own
    taken = set(own)
    # Fewest free slots first, then name: O(n log n) over the hosts with room, which a
    # site accepts for a packing policy (the default order is lazy instead).
    rest = sorted((hosts.free(h), h) for h in hosts if hosts.free(h) > 0 and h not in taken)
    for _, host in rest:
        yield host


@hookimpl
def xce_resize_order_grow_hosts(job: JobInfo, hosts: GrowHostView) -> Iterable[str] | None:
    return _order(job, hosts)
