"""Free slots per host, kept as counts for the scheduler and in host order for placing.

:class:`FreeSlots` answers the questions a scheduling pass asks without looking at
every host:

- ``total``: free slots on all hosts together;
- :meth:`~FreeSlots.capacity`: how many tasks of a job with at most ``ptile`` tasks per
  host fit now, from the *classes* of hosts: hosts with the same number of free slots
  are alike, so the answer is a sum over the distinct free counts (a handful), not over
  hosts;
- :meth:`~FreeSlots.place`: the concrete hosts, chosen greedily in host order (the
  first hosts with free slots, at most ``ptile`` tasks each), reading only the hosts it
  uses: the hosts with free slots sit in a two-level bitmap (64 hosts per word, and one
  bit per non-empty word), so finding the next one skips full hosts a word at a time.

A host may be taken out (:meth:`~FreeSlots.disable`: closed or failed): it then counts
0 free slots whatever it holds, slots given back to it are not counted, and it leaves
its class as any host whose free slots drop to 0 does; :meth:`~FreeSlots.enable` puts
it back. Both are O(1), like a change of one host's free slots. :meth:`~FreeSlots.draft` gives a
copy-on-write child for a scheduling pass to try starts on: it costs nothing to make,
and changes to it never reach its parent. A parent must not change while a draft of
it is in use (the draft reads the parent for every host it did not change itself).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, MutableSequence, Sequence
from itertools import compress, groupby, repeat
from operator import ge, sub, xor

__all__ = ["FreeSlots", "Placement"]

#: ``(host, tasks)`` pairs in allocation order.
Placement = tuple[tuple[str, int], ...]

_WORD = 64  # hosts per word of the bitmap (positions: i >> 6, i & 63)
_FULL = (1 << _WORD) - 1  # a word whose 64 hosts all have free slots
#: From this many hosts on, a change goes through :meth:`FreeSlots._apply_bulk`, whose
#: per-host work runs in C (maps, counters) instead of one Python loop iteration each.
_BULK = 24
_word_of = (6).__rrshift__  # i -> i >> 6, as a C callable
_bit_of = (63).__and__  # i -> i & 63
_power = (1).__lshift__  # b -> 1 << b


class _Overlay(dict[int, int]):
    """A list's copy-on-write stand-in: reads fall through to ``base`` until written
    (a dict, so that reads of written entries and every write stay in C)."""

    __slots__ = ("base",)

    def __init__(self, base: _Slots) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, i: int) -> int:
        return self.base[i]


_Slots = MutableSequence[int] | _Overlay


def _read_at(free: _Slots, idx: Sequence[int]) -> list[int]:
    """``free[i]`` for each position of ``idx``, in C (an overlay's misses included)."""
    if isinstance(free, _Overlay):
        return list(map(free.get, idx, _read_at(free.base, idx)))
    return list(map(free.__getitem__, idx))


def _read_run(free: _Slots, start: int, n: int) -> list[int]:
    """``free[start:start + n]`` as a list, in C (an overlay's misses included)."""
    if isinstance(free, _Overlay):
        return list(map(free.get, range(start, start + n), _read_run(free.base, start, n)))
    return list(free[start : start + n])


class FreeSlots:
    """Free slots of the hosts ``names`` (in host order); see the module docstring."""

    __slots__ = ("_free", "_hist", "_names", "_off", "_pos", "_top", "_words", "total")

    def __init__(self, names: Sequence[str], free: Sequence[int]) -> None:
        if len(names) != len(free):
            raise ValueError("one free count per host")
        self._names: Sequence[str] = tuple(names)
        self._pos: Mapping[str, int] = {h: i for i, h in enumerate(self._names)}
        self._free: _Slots = [0] * len(self._names)
        #: Free count -> how many hosts have exactly that many free slots (counts > 0).
        self._hist: dict[int, int] = {}
        self._words: _Slots = [0] * (len(self._names) // _WORD + 1)
        self._top = 0
        self.total = 0
        #: Positions of the hosts taken out (see the module docstring); few or none.
        self._off: frozenset[int] = frozenset()
        for i, n in enumerate(free):
            if n < 0:
                raise ValueError(f"host {self._names[i]!r}: negative free slots {n}")
        self._apply(enumerate(free))

    @classmethod
    def of(cls, free: Mapping[str, int]) -> FreeSlots:
        """From a ``host -> free slots`` mapping in host order."""
        return cls(list(free), list(free.values()))

    def draft(self) -> FreeSlots:
        """A copy-on-write child (see the module docstring)."""
        child = FreeSlots.__new__(FreeSlots)
        child._names, child._pos, child._off = self._names, self._pos, self._off
        child._free, child._words = _Overlay(self._free), _Overlay(self._words)
        child._hist = dict(self._hist)
        child._top, child.total = self._top, self.total
        return child

    # -- reading -----------------------------------------------------------------------

    def __contains__(self, host: object) -> bool:
        return host in self._pos

    def free(self, host: str) -> int:
        """Free slots on ``host`` (0 for a host it does not know)."""
        i = self._pos.get(host)
        return 0 if i is None else self._free[i]

    def capacity(self, ptile: int | None) -> int:
        """How many tasks fit now with at most ``ptile`` per host (``None``: no limit)."""
        if ptile is None:
            return self.total
        return sum(hosts * (c if c < ptile else ptile) for c, hosts in self._hist.items())

    def open_hosts(self) -> Iterator[tuple[str, int]]:
        """``(host, free)`` of the hosts with free slots, in host order; lazy."""
        names, free = self._names, self._free
        for i in self._open():
            yield names[i], free[i]

    def as_dict(self) -> dict[str, int]:
        """Every host's free slots, in host order (O(hosts): views and checks only)."""
        free = self._free
        return {h: free[i] for i, h in enumerate(self._names)}

    def problems(self) -> list[str]:
        """Disagreements between the counts, the bitmap and the per-host values."""
        free = [self._free[i] for i in range(len(self._names))]
        hist: dict[int, int] = {}
        for n in free:
            if n:
                hist[n] = hist.get(n, 0) + 1
        out = []
        if hist != self._hist:
            out.append("free-slot classes disagree with the hosts' free slots")
        if self.total != sum(free):
            out.append("free-slot total disagrees with the hosts' free slots")
        if list(self._open()) != [i for i, n in enumerate(free) if n]:
            out.append("the hosts with free slots disagree with the counters")
        return out

    def place(
        self, min_tasks: int, max_tasks: int, ptile: int | None, headroom: int | None = None
    ) -> Placement | None:
        """Greedy placement in host order: as many tasks as fit up to ``max_tasks``, at
        most ``ptile`` per host and ``headroom`` in all; ``None`` if fewer than
        ``min_tasks`` fit. Reads only the hosts it returns."""
        cap = max_tasks if headroom is None else min(max_tasks, headroom)
        if cap < min_tasks or cap <= 0 or self.capacity(ptile) < min_tasks:
            return None
        names, free = self._names, self._free
        out: list[tuple[str, int]] = []
        total = 0
        for base, n in self._open_runs():
            if n == 1:  # one host (a word not all free): as the plain loop did
                take = free[base]
                if ptile is not None and take > ptile:
                    take = ptile
                if take > cap - total:
                    take = cap - total
                out.append((names[base], take))
                total += take
                if total >= cap:
                    break
                continue
            # A whole word of hosts with free slots, all taken up to ptile; the last
            # is cut to what is still wanted below.
            takes = _read_run(free, base, n)
            if ptile is not None:
                takes = list(map(min, takes, repeat(ptile)))
            got = sum(takes)
            if total + got < cap:
                out.extend(zip(names[base : base + n], takes, strict=True))
                total += got
                continue
            for i, take in enumerate(takes):
                if take > cap - total:
                    take = cap - total
                out.append((names[base + i], take))
                total += take
                if total >= cap:
                    break
            break
        return tuple(out)

    # -- changing ----------------------------------------------------------------------

    def take(self, placement: Iterable[tuple[str, int]]) -> None:
        """Take these slots; a host with fewer free slots raises :class:`ValueError`
        (after the hosts before it were taken: callers place first)."""
        pairs = placement if isinstance(placement, (tuple, list)) else tuple(placement)
        pos, free = self._pos, self._free
        if len(pairs) >= _BULK:
            hosts, counts = zip(*pairs, strict=True)
            idx = list(map(pos.__getitem__, hosts))
            left = list(map(sub, _read_at(free, idx), counts))
            if len(set(idx)) == len(idx) and all(map(ge, left, repeat(0))):
                self._apply_bulk(idx, left)
                return
        changes = []
        for host, n in pairs:
            i = pos[host]
            left_i = free[i] - n
            if left_i < 0:
                raise ValueError(f"host {host!r}: {n} slots taken, {free[i]} free")
            changes.append((i, left_i))
        self._apply(changes)

    def give(self, hosts: Iterable[tuple[str, int]]) -> int:
        """Give these slots back (hosts it does not know and hosts taken out are
        skipped); return how many."""
        pos, free, off = self._pos, self._free, self._off
        changes = []
        n_given = 0
        for host, n in hosts:
            i = pos.get(host)
            if i is not None and i not in off:
                changes.append((i, free[i] + n))
                n_given += n
        self._apply(changes)
        return n_given

    def set(self, host: str, n: int) -> None:
        """Set ``host``'s free slots to ``n`` (>= 0; a host taken out stays at 0)."""
        i = self._pos[host]
        self._apply(((i, 0 if i in self._off else n),))

    def set_many(self, hosts: Iterable[tuple[str, int]]) -> None:
        """:meth:`set` for each ``(host, free)``."""
        pos, off = self._pos, self._off
        pairs = hosts if isinstance(hosts, (tuple, list)) else tuple(hosts)
        if len(pairs) >= _BULK and not off:
            names, news = zip(*pairs, strict=True)
            idx = list(map(pos.__getitem__, names))
            if len(set(idx)) == len(idx):
                self._apply_bulk(idx, news)
                return
        self._apply([(i, 0 if i in off else n) for h, n in pairs for i in (pos[h],)])

    def disable(self, host: str) -> None:
        """Take ``host`` out: it counts no free slot until :meth:`enable`."""
        i = self._pos[host]
        self._off = self._off | {i}
        self._apply(((i, 0),))

    def enable(self, host: str, n: int) -> None:
        """Put ``host`` back with ``n`` free slots."""
        i = self._pos[host]
        self._off = self._off - {i}
        self._apply(((i, n),))

    def enabled(self, host: str) -> bool:
        """Whether ``host`` is known and not taken out."""
        i = self._pos.get(host)
        return i is not None and i not in self._off

    # -- internals ---------------------------------------------------------------------

    def _apply(self, changes: Iterable[tuple[int, int]]) -> None:
        """Set the free slots of positions; the classes and the bitmap follow. One
        loop for a job's hosts: this is what starting and ending jobs cost."""
        free, hist, words = self._free, self._hist, self._words
        top, total = self._top, self.total
        for i, new in changes:
            old = free[i]
            if new == old:
                continue
            free[i] = new
            total += new - old
            if old:
                left = hist[old] - 1
                if left:
                    hist[old] = left
                else:
                    del hist[old]
            if new:
                hist[new] = hist.get(new, 0) + 1
                if old:
                    continue
            w = i >> 6
            bit = 1 << (i & 63)
            word = words[w] ^ bit
            words[w] = word
            if new and word == bit:
                top |= 1 << w  # the word's first host with free slots
            elif not word:
                top &= ~(1 << w)
        self._top, self.total = top, total

    def _apply_bulk(self, idx: Sequence[int], news: Sequence[int]) -> None:
        """:meth:`_apply` for many distinct positions at once (``idx``, each set to the
        matching ``news``), with the per-host work in C: the same result as the loop."""
        free, hist = self._free, self._hist
        n = len(idx)
        first = idx[0]
        # Consecutive hosts (the common case: placed in host order): read and written
        # as slices.
        run = idx[-1] - first + 1 == n and idx == list(range(first, first + n))
        olds = _read_run(free, first, n) if run else _read_at(free, idx)
        self.total += sum(news) - sum(olds)
        for v, c in Counter(olds).items():
            if v:
                left = hist[v] - c
                if left:
                    hist[v] = left
                else:
                    del hist[v]
        for v, c in Counter(news).items():
            if v:
                hist[v] = hist.get(v, 0) + c
        if run and isinstance(free, list):
            free[first : first + n] = news
        else:
            deque(map(free.__setitem__, idx, news), maxlen=0)
        # Hosts whose free slots went from none to some or back flip their bit.
        if run and ((all(olds) and not any(news)) or (not any(olds) and all(news))):
            self._flip_run(first, first + n)
            return
        flips = compress(idx, map(xor, map(bool, olds), map(bool, news)))
        top = self._top
        for w, group in groupby(flips, _word_of):
            top = self._flip_word(top, w, sum(map(_power, map(_bit_of, group))))
        self._top = top

    def _flip_run(self, start: int, stop: int) -> None:
        """Flip the bits of the positions ``start..stop-1`` (a word at a time)."""
        top = self._top
        w = start >> 6
        while start < stop:
            end = min(stop, (w + 1) * _WORD)
            mask = ((1 << (end - start)) - 1) << (start & 63)
            top = self._flip_word(top, w, mask)
            start = end
            w += 1
        self._top = top

    def _flip_word(self, top: int, w: int, mask: int) -> int:
        """Flip ``mask`` in word ``w``; return ``top`` with the word's bit updated."""
        words = self._words
        word = words[w] ^ mask
        words[w] = word
        return top | (1 << w) if word else top & ~(1 << w)

    def _open_runs(self) -> Iterator[tuple[int, int]]:
        """``(first position, hosts)`` runs of hosts with free slots, in order: a word
        whose 64 hosts all have some is one run (no per-host step), else one host each."""
        top, words = self._top, self._words
        while top:
            low = top & -top
            top ^= low
            w = low.bit_length() - 1
            word = words[w]
            base = w * _WORD
            if word == _FULL:
                yield base, _WORD
                continue
            while word:
                bit = word & -word
                word ^= bit
                yield base + bit.bit_length() - 1, 1

    def _open(self) -> Iterator[int]:
        """Positions of the hosts with free slots, in order (a snapshot of the words)."""
        for base, n in self._open_runs():
            yield from range(base, base + n)
