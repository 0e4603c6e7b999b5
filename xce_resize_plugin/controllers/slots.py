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
  bit per non-empty word, and one per word whose hosts all have free slots), so finding
  the next one skips full hosts a word at a time, and a stretch of hosts that all have
  free slots is read in one step, however many words it spans.

A host may be taken out (:meth:`~FreeSlots.disable`: closed or failed): it then counts
0 free slots whatever it holds, slots given back to it are not counted, and it leaves
its class as any host whose free slots drop to 0 does; :meth:`~FreeSlots.enable` puts
it back. Both are O(1), like a change of one host's free slots. :meth:`~FreeSlots.draft` gives a
copy-on-write child for a scheduling pass to try starts on: it costs nothing to make,
copies its parent's per-host list at its first change (a block copy, far cheaper than
the per-host steps of the starts it tries), and changes to it never reach its parent.
A parent must not change while a draft of it is in use.

A :class:`~.placement_runs.Placement` made by :meth:`~FreeSlots.place` is held as runs
of consecutive hosts (:mod:`.placement_runs`).
"""

from __future__ import annotations

import weakref
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import compress, groupby, repeat
from operator import ge, sub, xor

from xce_resize_plugin.controllers.placement_runs import Placement, Run

__all__ = ["FreeSlots"]


_WORD = 64  # hosts per word of the bitmap (positions: i >> 6, i & 63)
_FULL = (1 << _WORD) - 1  # a word whose 64 hosts all have free slots
#: From this many hosts on, a change goes through :meth:`FreeSlots._apply_bulk`, whose
#: per-host work runs in C (maps, counters) instead of one Python loop iteration each.
_BULK = 24
_word_of = (6).__rrshift__  # i -> i >> 6, as a C callable
_bit_of = (63).__and__  # i -> i & 63
_power = (1).__lshift__  # b -> 1 << b


class FreeSlots:
    """Free slots of the hosts ``names`` (in host order); see the module docstring."""

    __slots__ = (
        "_free",
        "_fulls",
        "_hist",
        "_log",
        "_logged_n",
        "_names",
        "_off",
        "_own",
        "_pos",
        "_top",
        "_undo",
        "_views",
        "_words",
        "total",
    )

    def __init__(self, names: Sequence[str], free: Sequence[int]) -> None:
        if len(names) != len(free):
            raise ValueError("one free count per host")
        self._names: Sequence[str] = tuple(names)
        self._pos: Mapping[str, int] = {h: i for i, h in enumerate(self._names)}
        self._free: list[int] = [0] * len(self._names)
        #: Free count -> how many hosts have exactly that many free slots (counts > 0).
        self._hist: dict[int, int] = {}
        self._words: list[int] = [0] * (len(self._names) // _WORD + 1)
        self._top = 0
        #: One bit per word whose 64 hosts all have free slots (``_FULL``).
        self._fulls = 0
        #: A scratch's changes to the per-host list it shares with its parent, as
        #: ``(first position or positions, old counts)``, for :meth:`restore`; ``None``
        #: for anything but a scratch.
        self._undo: list[tuple[int | Sequence[int], list[int]]] | None = None
        self.total = 0
        #: Positions of the hosts taken out (see the module docstring); few or none.
        self._off: frozenset[int] = frozenset()
        #: Whether ``_free`` and ``_words`` are this object's own (a draft shares its
        #: parent's until its first change).
        self._own = True
        #: While snapshots share the per-host list: every change since the oldest of
        #: them (see :meth:`snapshot`) as ``(first position or positions, old free
        #: counts)``, else ``None``; and how many positions it holds.
        self._log: list[tuple[int | Sequence[int], list[int]]] | None = None
        self._logged_n = 0
        self._views: list[weakref.ref[_FreeView]] = []
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
        child._free, child._words, child._own = self._free, self._words, False
        child._log, child._views = None, []
        child._hist = dict(self._hist)
        child._top, child._fulls, child.total = self._top, self._fulls, self.total
        child._undo = None
        return child

    def scratch(self) -> FreeSlots:
        """A child for one scheduling pass that writes into its parent's per-host list
        in place, logging what it overwrites, instead of copying the list (O(hosts)) at
        its first change as a draft does: a pass that starts a job costs in proportion
        to the hosts it changes. Until :meth:`restore` puts the parent's counts back
        (call it, in a ``finally``), the parent and its other drafts and snapshots must
        not be read or changed; drafts of the scratch itself are drafts as any."""
        child = self.draft()
        child._undo = []
        return child

    def restore(self) -> None:
        """Undo a :meth:`scratch`'s changes to its parent's list (in reverse order);
        the scratch is not to be used afterwards."""
        undo, free = self._undo, self._free
        assert undo is not None, "restore() is for a scratch"
        for where, olds in reversed(undo):
            if isinstance(where, int):
                free[where : where + len(olds)] = olds
            else:
                deque(map(free.__setitem__, where, olds), maxlen=0)
        self._undo = None

    def _mine(self) -> list[int]:
        """The per-host list, made this object's own first (a draft's first change; a
        scratch keeps writing its parent's, logging, and copies only the bitmap)."""
        if not self._own:
            if self._undo is None:
                self._free = list(self._free)
            self._words = list(self._words)
            self._own = True
        return self._free

    # -- reading -----------------------------------------------------------------------

    @property
    def names(self) -> Sequence[str]:
        """The hosts in position order (the order of a placement's runs)."""
        return self._names

    @property
    def off(self) -> frozenset[int]:
        """Positions of the hosts taken out."""
        return self._off

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

    def most_free(self) -> int:
        """The most free slots any host has (0 when none has any), from the classes."""
        return max(self._hist, default=0)

    def capacity_after(self, placement: Iterable[tuple[str, int]], ptile: int | None) -> int:
        """:meth:`capacity` once ``placement`` (each host once, as :meth:`place` makes
        it; it must fit) is taken, without taking it: each host's part of the sum is
        its free slots up to ``ptile``, so only the placement's hosts change it. A
        backfill tried against a reservation with ``ptile`` costs the job's hosts, not
        a copy of every host's free slots."""
        if ptile is None:
            return self.total - sum(n for _, n in placement)
        pos, free = self._pos, self._free
        lost = 0
        for host, n in placement:
            f = free[pos[host]]
            lost += (f if f < ptile else ptile) - (f - n if f - n < ptile else ptile)
        return self.capacity(ptile) - lost

    def open_hosts(self) -> Iterator[tuple[str, int]]:
        """``(host, free)`` of the hosts with free slots, in host order; lazy."""
        names, free = self._names, self._free
        for i in self._open():
            yield names[i], free[i]

    def snapshot(self) -> Mapping[str, int]:
        """The hosts with free slots -> their free slots, as of now.

        The blocked head's free slots are snapshotted at every change of the ledger
        while it waits, and hardly ever read host by host (a head without ``ptile`` is
        judged on the total). So a snapshot is not a copy: it shares the per-host list,
        and every later change logs the positions it changes with their old values
        (in C for a run or a bulk change), as long as a snapshot that needs them lives.
        A snapshot read host by host, or compared with one of another instant, is made
        from the list and the log; a log grown to the number of hosts turns the live
        snapshots into copies and starts again."""
        views = [ref for ref in self._views if (v := ref()) is not None and v._owner is self]
        if not views:
            self._log, self._logged_n = [], 0
        assert self._log is not None
        view = _FreeView(self, len(self._log))
        views.append(weakref.ref(view))
        self._views = views
        return view

    def _logged(self, where: int | Sequence[int], olds: list[int]) -> None:
        """Log the old counts of a change about to be written: of the positions from
        ``where`` on, or of the positions ``where`` (only while a snapshot shares the
        list: see :meth:`snapshot`). Once the log holds more positions than there are
        hosts, the snapshots it serves are made copies and it stops."""
        log = self._log
        assert log is not None
        log.append((where, olds))
        self._logged_n += len(olds)
        if self._logged_n > len(self._names):
            for ref in self._views:
                view = ref()
                if view is not None and view._owner is self:
                    view._freeze()
            self._views, self._log = [], None

    def as_dict(self) -> dict[str, int]:
        """Every host's free slots, in host order (O(hosts): views and checks only)."""
        return dict(zip(self._names, self._free, strict=True))

    def problems(self) -> list[str]:
        """Disagreements between the counts, the bitmap and the per-host values."""
        free = list(self._free)
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
        fulls = sum(1 << w for w, word in enumerate(self._words) if word == _FULL)
        if fulls != self._fulls:
            out.append("the words of hosts all with free slots disagree with the bitmap")
        if any(free[i] for i in self._off):
            out.append("a host taken out counts free slots")
        return out

    def fit(
        self, min_tasks: int, max_tasks: int, ptile: int | None, headroom: int | None = None
    ) -> int:
        """How many tasks :meth:`place` would place (0 for ``None``), from the counts:
        without reading a host."""
        cap = max_tasks if headroom is None else min(max_tasks, headroom)
        n = min(cap, self.capacity(ptile))
        return n if n >= min_tasks and n > 0 else 0

    def place(
        self, min_tasks: int, max_tasks: int, ptile: int | None, headroom: int | None = None
    ) -> Placement | None:
        """Greedy placement in host order: as many tasks as fit up to ``max_tasks``, at
        most ``ptile`` per host and ``headroom`` in all; ``None`` if fewer than
        ``min_tasks`` fit. Reads only the hosts it returns, a run of hosts with the
        same free slots at a time."""
        cap = max_tasks if headroom is None else min(max_tasks, headroom)
        if cap < min_tasks or cap <= 0 or self.capacity(ptile) < min_tasks:
            return None
        free = self._free
        runs: list[Run] = []
        total = 0
        for base, n in self._open_runs():
            if n == 1:
                groups: Iterable[tuple[int, int]] = ((free[base], 1),)
            else:
                values = free[base : base + n]
                v = values[0]
                if values.count(v) == n:  # alike hosts (always so for one-slot hosts)
                    groups = ((v, n),)
                else:
                    groups = ((v, sum(1 for _ in g)) for v, g in groupby(values))
            for v, k in groups:
                take = v if ptile is None or v < ptile else ptile
                want = cap - total
                full = want // take
                if full >= k:
                    _add_run(runs, base, k, take)
                    total += k * take
                    base += k
                    continue
                if full:
                    _add_run(runs, base, full, take)
                if want > full * take:
                    _add_run(runs, base + full, 1, want - full * take)
                total = cap
                break
            if total >= cap:
                break
        return Placement.of_runs(self._names, runs)

    # -- changing ----------------------------------------------------------------------

    def take(self, placement: Iterable[tuple[str, int]]) -> None:
        """Take these slots; a host with fewer free slots raises :class:`ValueError`
        (after the hosts before it were taken: callers place first)."""
        if (
            isinstance(placement, Placement)
            and placement.names is self._names
            and self._take_runs(placement.runs or ())
        ):
            return
        pairs = placement if isinstance(placement, (tuple, list)) else tuple(placement)
        pos = self._pos
        free = self._mine()
        if len(pairs) >= _BULK:
            hosts, counts = zip(*pairs, strict=True)
            idx = list(map(pos.__getitem__, hosts))
            left = list(map(sub, map(free.__getitem__, idx), counts))
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

    def _take_runs(self, runs: Sequence[Run]) -> bool:
        """:meth:`take` of runs whose hosts each have the same free slots (what
        :meth:`place` makes); ``False``, changing nothing, if one is not so or short."""
        free = self._free
        plan = []
        for first, n, take in runs:
            values = free[first : first + n]
            v = values[0]
            if values.count(v) != n or v < take:
                return False
            plan.append((first, n, v, v - take))
        for first, n, old, new in plan:
            self.set_run(first, n, old, new)
        return True

    def set_run(self, first: int, n: int, old: int, new: int) -> None:
        """Set the free slots of positions ``first..first+n-1``, each ``old`` now (the
        caller read them), to ``new``; none of them may be taken out."""
        if old == new:
            return
        free = self._mine()
        if self._log is not None:
            self._logged(first, free[first : first + n])
        if self._undo is not None:
            self._undo.append((first, free[first : first + n]))
        free[first : first + n] = [new] * n
        self.total += n * (new - old)
        hist = self._hist
        if old:
            _leave(hist, old, n)
        if new:
            hist[new] = hist.get(new, 0) + n
        if not old or not new:  # the hosts went from none to some free slots or back
            self._flip_run(first, first + n)

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
        free = self._mine()
        hist, words = self._hist, self._words
        top, fulls, total = self._top, self._fulls, self.total
        log, undo = self._log, self._undo
        for i, new in changes:
            old = free[i]
            if new == old:
                continue
            if log is not None:
                self._logged(i, [old])
                log = self._log
            if undo is not None:
                undo.append((i, [old]))
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
            if word == _FULL:
                fulls |= 1 << w  # its last host without
            elif not new and word == _FULL ^ bit:
                fulls &= ~(1 << w)
        self._top, self._fulls, self.total = top, fulls, total

    def _apply_bulk(self, idx: Sequence[int], news: Sequence[int]) -> None:
        """:meth:`_apply` for many distinct positions at once (``idx``, each set to the
        matching ``news``), with the per-host work in C: the same result as the loop."""
        free = self._mine()
        hist = self._hist
        n = len(idx)
        first = idx[0]
        # Consecutive hosts (the common case: placed in host order): read and written
        # as slices.
        run = idx[-1] - first + 1 == n and list(idx) == list(range(first, first + n))
        olds = free[first : first + n] if run else list(map(free.__getitem__, idx))
        self.total += sum(news) - sum(olds)
        for v, c in Counter(olds).items():
            if v:
                _leave(hist, v, c)
        for v, c in Counter(news).items():
            if v:
                hist[v] = hist.get(v, 0) + c
        if self._log is not None:
            self._logged(first if run else list(idx), olds)
        if self._undo is not None:
            self._undo.append((first if run else list(idx), olds))
        if run:
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
        """Flip the bits of the positions ``start..stop-1``: the words at both ends one
        by one, the whole words between them as one slice (a run's hosts all went from
        none to some free slots or back, so those words go from empty to full or back)."""
        top = self._top
        w = start >> 6
        if start & 63:  # the first word, partly
            end = min(stop, (w + 1) * _WORD)
            top = self._flip_word(top, w, ((1 << (end - start)) - 1) << (start & 63))
            start = end
            w += 1
        whole = (stop - start) >> 6
        if whole:
            words = self._words
            full = words[w] == 0  # all empty before, so all full after (or back)
            words[w : w + whole] = [_FULL if full else 0] * whole
            span = ((1 << whole) - 1) << w
            top = top | span if full else top & ~span
            self._fulls = self._fulls | span if full else self._fulls & ~span
            start += whole * _WORD
            w += whole
        if start < stop:  # the last word, partly
            top = self._flip_word(top, w, (1 << (stop - start)) - 1)
        self._top = top

    def _flip_word(self, top: int, w: int, mask: int) -> int:
        """Flip ``mask`` in word ``w`` (the words are this object's own: see
        :meth:`_mine`); return ``top`` with the word's bit updated."""
        words = self._words
        was = words[w]
        word = was ^ mask
        words[w] = word
        if word == _FULL:
            self._fulls |= 1 << w
        elif was == _FULL:
            self._fulls &= ~(1 << w)
        return top | (1 << w) if word else top & ~(1 << w)

    def _open_runs(self) -> Iterator[tuple[int, int]]:
        """``(first position, hosts)`` maximal runs of consecutive hosts with free
        slots, in order: the stretches of :meth:`_open_stretches`, joined where one
        goes on from the last."""
        first = end = -1  # the run not yet given: positions first..end-1
        for start, stop in self._open_stretches():
            if start == end:
                end = stop
                continue
            if first >= 0:
                yield first, end - first
            first, end = start, stop
        if first >= 0:
            yield first, end - first

    def _open_stretches(self) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` of stretches of consecutive hosts with free slots, in order,
        a word at a time (the full words after a full one as one stretch), no per-host
        step; a stretch may go on from the one before (across a word's end)."""
        top, words, fulls = self._top, self._words, self._fulls
        while top:
            low = top & -top
            top ^= low
            w = low.bit_length() - 1
            word = words[w]
            base = w * _WORD
            if word == _FULL:
                # This word and the full ones after it: one stretch, read at once.
                f = fulls >> w
                k = (f ^ (f + 1)).bit_length() - 1  # how many full words from w on
                top &= ~(((1 << k) - 1) << w)
                yield base, base + k * _WORD
                continue
            while word:
                low = word & -word
                run = word & ~(word + low)  # the carry of + low runs through the ones
                word ^= run
                yield base + low.bit_length() - 1, base + run.bit_length()

    def _open(self) -> Iterator[int]:
        """Positions of the hosts with free slots, in order (a snapshot of the words)."""
        for base, n in self._open_runs():
            yield from range(base, base + n)


class _FreeView(Mapping[str, int]):
    """:meth:`FreeSlots.snapshot`: the hosts with free slots in host order.

    Linked to its :class:`FreeSlots` (``_owner``) while that one logs its changes:
    its counts are the owner's with the changes logged from ``_at`` on undone. Made
    its own copy (``_free``) when read host by host or when the log is reset."""

    __slots__ = ("__weakref__", "_at", "_free", "_names", "_owner", "_pos", "_total")

    def __init__(self, owner: FreeSlots, at: int) -> None:
        self._names, self._pos = owner._names, owner._pos
        self._total = owner.total  # the sum of the counts, known without adding them
        self._owner: FreeSlots | None = owner
        self._at = at  # the owner's log position when taken
        self._free: list[int] | None = None

    def _counts(self) -> list[int]:
        """The counts as of the snapshot (made now, and kept, if still linked)."""
        if self._free is None:
            self._freeze()
        assert self._free is not None
        return self._free

    def _freeze(self) -> None:
        owner = self._owner
        assert owner is not None and owner._log is not None
        counts = list(owner._free)
        # Undone newest first, so that the oldest value logged since the snapshot wins.
        for where, olds in reversed(owner._log[self._at :]):
            if isinstance(where, int):
                counts[where : where + len(olds)] = olds
            else:
                deque(map(counts.__setitem__, where, olds), maxlen=0)
        self._free, self._owner = counts, None

    def __getitem__(self, host: str) -> int:
        i = self._pos.get(host)
        n = 0 if i is None else self._counts()[i]
        if not n:
            raise KeyError(host)
        return n

    def __iter__(self) -> Iterator[str]:
        return compress(self._names, self._counts())

    def __len__(self) -> int:
        counts = self._counts()
        return len(counts) - counts.count(0)

    def __eq__(self, other: object) -> bool:
        # The blocked head is compared with the last one at every cycle.
        if isinstance(other, _FreeView) and other._names is self._names:
            if self._total != other._total:
                return False  # most changes change the total: no count is compared
            owner = self._owner
            if owner is not None and other._owner is owner and self._at == other._at:
                return True  # taken with no change in between
            return self._counts() == other._counts()
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{dict(self)!r}"


def _leave(hist: dict[int, int], free: int, hosts: int) -> None:
    """``hosts`` hosts leave the class of ``free`` free slots."""
    left = hist[free] - hosts
    if left:
        hist[free] = left
    else:
        del hist[free]


def _add_run(runs: list[Run], first: int, n: int, take: int) -> None:
    """Append a run, joined to the last one when it goes on from it with the same take."""
    if runs:
        f, k, t = runs[-1]
        if t == take and f + k == first:
            runs[-1] = (f, k + n, take)
            return
    runs.append((first, n, take))
