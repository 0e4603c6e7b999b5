"""Group commit: many threads share one durable write transaction (one fsync)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from xce_resize_plugin.errors import JournalError
from xce_resize_plugin.journal.closing import Closing
from xce_resize_plugin.journal.entries import Entry
from xce_resize_plugin.journal.journal import Journal
from xce_resize_plugin.journal.lmdb_env import failed_write

log = logging.getLogger(__name__)

#: Told of every committed transaction: its duration in seconds (the write and its
#: fsync) and how many entries shared it. Called by the thread that wrote it (the
#: writer thread, or a caller writing its own entry); must be cheap.
CommitObserver = Callable[[float, int], None]


class Ticket:
    """One submitter's rendezvous with the writer thread.

    A bare lock, taken at creation and released by the writer once the outcome is set:
    far cheaper than a Future (no condition variable), which matters with many threads
    each waiting a fraction of a millisecond.
    """

    __slots__ = ("_lead", "_lock", "error", "seqs")

    def __init__(self, lead: Callable[[Ticket], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.seqs: list[int] = []
        self.error: BaseException | None = None
        # The committer's offer to write this ticket's batch in the waiting thread.
        self._lead = lead

    @property
    def done(self) -> bool:
        """Whether the outcome is set (``wait`` would not block)."""
        return not self._lock.locked()

    def finish(self, seqs: list[int] | None = None, error: BaseException | None = None) -> None:
        self.seqs = seqs or []
        self.error = error
        self._lock.release()

    def wait(self) -> list[int]:
        lead = self._lead
        if lead is not None and self._lock.locked():
            lead(self)
        self._lock.acquire()
        if self.error is not None:
            # The same exception object for every caller of the batch, as
            # concurrent.futures does.
            raise self.error
        return self.seqs


class GroupCommitter(Closing):
    """Group commit: many threads call submit(); a single writer thread takes everything
    queued, writes it in ONE transaction (one fsync) and then wakes all those callers.
    No caller returns before its fsync returned.

    Batches form by themselves: while one transaction is being flushed, new submissions
    queue up and go together into the next one, so there is no added delay when the
    load is light and one flush per batch when it is heavy. ``max_batch`` bounds a batch.

    **A failed transaction fails everything after it.** Entries are queued in the order
    their submitters decided them, and a later entry may have been decided on a state
    that includes an earlier one (its submitter released its lock before the fsync).
    So once a transaction fails, every entry still queued and every later submission
    fails with the same exception, and nothing is written again: the journal's owner
    must start again from what is on disk.
    **A lone request is written by its own thread.** Handing an entry to the writer
    thread and the outcome back costs two thread switches, about a fifth of an
    uncontended durable commit (docs/performance.md, "Commit latency: a lone request
    writes its own"). So a caller that waits on its ticket while nothing is being
    written, and the last batch had one entry (no concurrency seen), writes the queued
    entries itself. Under concurrency the writer thread batches as described above.
    Either way one transaction is written at a time, in queue order.

    ``observe``, when given, is told of each committed transaction (for metrics); without
    it a transaction costs no clock read.
    """

    def __init__(
        self, journal: Journal, max_batch: int = 1024, observe: CommitObserver | None = None
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self._journal = journal
        self._max_batch = max_batch
        self._observe = observe
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[tuple[Entry, Ticket]] = deque()
        self._closed = False
        self._failed: BaseException | None = None
        # A transaction is being written, by the writer thread or by a waiting caller
        # (_lead): never two at once, so that batches are written in queue order.
        self._writing = False
        self._transactions = 0
        self._entries = 0
        self._last_batch = 0
        self._thread = threading.Thread(
            target=self._run, name=f"journal-group-commit:{journal.path}", daemon=True
        )
        self._thread.start()

    @property
    def transactions(self) -> int:
        """Write transactions made so far (failed ones included)."""
        return self._transactions

    @property
    def entries(self) -> int:
        """Entries written so far (committed successfully)."""
        return self._entries

    def submit(self, entry: Entry) -> list[int]:
        """Commit ``entry`` with whatever else is queued; block until it is durable.

        Returns the sequence numbers of the entry's facts. If the batch's transaction
        fails (e.g. :class:`FencedError`), every caller of that batch gets the exception.
        """
        return self.enqueue(entry, will_wait=True).wait()

    def enqueue(self, entry: Entry, *, will_wait: bool = False) -> Ticket:
        """Queue ``entry`` and return at once; ``.wait()`` on the result blocks until it
        is durable (returning its sequence numbers) or raises the batch's error.

        Lets a caller fix its place in the commit order while holding its own lock and
        wait for the fsync after releasing it, so that concurrent callers share fsyncs.

        ``will_wait``: the caller promises to wait on the ticket (as :meth:`submit`
        does). A lone entry is then not handed to the writer thread, whose wake-up
        would compete with the caller for the interpreter; the caller writes it when
        it waits (the class docstring). If such a ticket is never waited on, its entry
        goes with the next batch, or at :meth:`close`. Without ``will_wait`` the writer
        thread writes the entry at once.
        """
        if not isinstance(entry, Entry):
            # Checked here so that a bad entry fails its own caller, not a whole batch.
            raise TypeError(f"submit() takes an Entry, not {type(entry).__name__}")
        waiter = Ticket(self._lead)
        with self._cond:
            if self._failed is not None:
                waiter.finish(error=self._failed)  # see the class docstring
                return waiter
            if self._closed:
                # Closed after its writer failed: as that write, a failing disk.
                raise failed_write(
                    JournalError(f"{self._journal.path}: the group committer is closed")
                )
            self._queue.append((entry, waiter))
            if not (will_wait and self._may_lead()):
                self._cond.notify()
        return waiter

    def close(self) -> None:
        """Write what is queued, then stop the writer thread. Idempotent.

        The journal itself stays open: it belongs to the caller.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                if self._last_batch > 1:
                    # Under concurrency the callers just woken are about to submit again:
                    # let them run before taking the next batch (releasing the GIL for a
                    # moment), so that more of them share its fsync. Alone, no yield.
                    time.sleep(0)
                with self._cond:
                    while self._writing or (not self._queue and not self._closed):
                        self._cond.wait()
                    if not self._queue:
                        return  # closed and drained
                    batch = self._take()
                self._write(batch)
        finally:
            # Only reached early if the thread itself dies: never leave a caller waiting.
            with self._cond:
                self._closed = True
                left = list(self._queue)
                self._queue.clear()
            for _, waiter in left:
                waiter.finish(
                    error=JournalError(f"{self._journal.path}: the group commit writer stopped")
                )

    def _lead(self, ticket: Ticket) -> None:
        """Write the queue's first batch in the calling thread, which waits on
        ``ticket``, when nothing is being written and no concurrency was seen (see the
        class docstring); else leave it to the writer thread."""
        with self._cond:
            if not self._may_lead() or not self._queue or ticket.done:
                return
            batch = self._take()
        self._write(batch)

    def _may_lead(self) -> bool:
        """Whether a waiting caller would write the next batch itself: nothing is being
        written and the last batch had one entry. Called holding ``_cond``."""
        return not self._writing and self._last_batch <= 1 and not self._closed

    def _take(self) -> list[tuple[Entry, Ticket]]:
        """The next batch, marked as being written. Called holding ``_cond``."""
        take = min(len(self._queue), self._max_batch)
        self._writing = True
        return [self._queue.popleft() for _ in range(take)]

    def _write(self, batch: list[tuple[Entry, Ticket]]) -> None:
        try:
            self._write_batch(batch)
        finally:
            with self._cond:
                self._writing = False
                if self._queue or self._closed:
                    self._cond.notify()  # the writer thread: entries queued meanwhile

    def _write_batch(self, batch: list[tuple[Entry, Ticket]]) -> None:
        self._transactions += 1
        observe = self._observe
        began = time.perf_counter() if observe is not None else 0.0
        try:
            seqs = self._journal.commit([entry for entry, _ in batch])
        except BaseException as exc:
            with self._cond:
                # What is queued may rest on this batch: it fails too, as does
                # whatever comes later (the class docstring).
                self._failed = exc
                batch += self._queue
                self._queue.clear()
            for _, waiter in batch:
                waiter.finish(error=exc)
            if not isinstance(exc, Exception):
                raise
            return
        elapsed = time.perf_counter() - began if observe is not None else 0.0
        self._entries += len(batch)
        self._last_batch = len(batch)
        start = 0
        for entry, waiter in batch:
            end = start + len(entry.facts)
            waiter.finish(seqs[start:end])
            start = end
        if observe is not None:
            try:
                observe(elapsed, len(batch))
            except Exception:  # a broken observer must not stop the writer
                log.exception("the commit observer failed")
