""":class:`AsyncClient`: the asynchronous calls of a :class:`Client` whose submits never wait
for kvnoded. It owns the binding's connect thread (connect and reconnect happen there, never
on a submitting thread), the submits waiting for a connection, its own tickets and the one
event fd it is polled on for its whole life. For engines that submit from their own locks
(LMCache's L2 adapter does)."""

import collections
import ctypes
import itertools
import os
import select
import threading
import time
import weakref

from ._lib import _s, _set_timeout, _strerror
from .client import Client
from .datatypes import Completion
from .errors import (Closed, ConnectError, Error, IOFailure, ProtocolError, ShuttingDown,
                     TimedOut)
from .keys import _checks_array, _keys_array
from .pages import _Pages

# A connection that failed with one of these is gone: the client is retired and the
# binding's thread connects again.
_GONE = (Closed, ConnectError, TimedOut, ShuttingDown, IOFailure, ProtocolError)
_MATCH, _GET, _PUT, _DELETE = "submit_match", "submit_get", "submit_put", "submit_delete"
_DEFAULT_TIMEOUT_MS = 10000     # libkvnode's


def _env_timeout_ms():
    try:
        v = int(os.environ.get("KVNODE_TIMEOUT_MS", ""))
    except ValueError:
        return _DEFAULT_TIMEOUT_MS
    return v if v > 0 else _DEFAULT_TIMEOUT_MS


def _new_error(cls, message):
    return cls(cls.CODE, message, _s(_strerror(-cls.CODE)))


class _Job:
    """One submit: its ticket, the call and its arguments (keys, check words and pages
    held until the ticket completes), and when it stops waiting for a connection."""
    __slots__ = ("ticket", "op", "keys", "checks", "pages", "device", "deadline")

    def __init__(self, ticket, op, keys, checks, pages, device, deadline):
        self.ticket, self.op, self.keys, self.checks = ticket, op, keys, checks
        self.pages, self.device, self.deadline = pages, device, deadline

    def keep_arguments(self):
        """Copy keys and check words (a caller's ctypes arrays are taken without a copy)."""
        self.keys = (type(self.keys)).from_buffer_copy(self.keys)
        if self.checks is not None:
            self.checks = (type(self.checks)).from_buffer_copy(self.checks)

    def release(self):
        if self.pages is not None:
            self.pages.release()
            self.pages = None


class AsyncClient:
    """A kvnoded connection for asynchronous calls only, whose submits return at once
    whatever the daemon's state (connecting, paused, gone, restarting).

    ``submit_match``, ``submit_get``, ``submit_put`` and ``submit_delete`` take what the
    :class:`Client` ones take and return a ticket; :meth:`drain` gives the
    :class:`Completion` of finished ones (never blocks) and :attr:`event_fd` (one
    descriptor for the object's life, across reconnects) polls readable while some wait.
    A submit raises only for the caller's mistakes (pages of the wrong size, a closed
    client); everything about the daemon comes back as the completion's ``error``.

    The constructor returns at once: the connect runs on the binding's thread
    (``kvnode-connect``). A submit made while the connection is not up waits there and is
    sent when it is; if it is not up within ``timeout_ms`` the ticket completes with
    :class:`TimedOut` (a paused daemon), and if the connect fails, with its error
    (:class:`ConnectError`: no daemon). A connection that fails (the daemon died, a call
    timed out) is dropped and its tickets complete with the error. The next connect is
    started by a submit, at most once per ``reconnect_interval_s``: within that interval
    of a failure a submit completes at once with the failure's error.

    ``timeout_ms``: the per-call timeout and the longest a submit waits for a connection
    (default libkvnode's: ``$KVNODE_TIMEOUT_MS`` or 10 s). ``checks`` given to a submit
    are sent when the connected daemon honours check words (:attr:`has_check_words`),
    else the keys go alone. ``layout`` is required (an observer has no asynchronous
    calls); ``reader`` and ``cuda_device`` as for :class:`Client`.
    """

    def __init__(self, socket_path=None, layout=None, timeout_ms=None, reconnect_interval_s=1.0,
                 reader=False, cuda_device=-1):
        if layout is None:
            raise ValueError("AsyncClient needs a layout")
        if timeout_ms is not None and int(timeout_ms) <= 0:
            raise ValueError("timeout_ms must be > 0, got %r" % (timeout_ms,))
        if float(reconnect_interval_s) < 0:
            raise ValueError("reconnect_interval_s must be >= 0, got %r" % (reconnect_interval_s,))
        if not isinstance(cuda_device, int) or cuda_device < -1:
            raise ValueError("cuda_device must be a CUDA device ordinal or -1 (none), not %r"
                             % (cuda_device,))
        self.socket_path, self.layout = socket_path, layout
        self.timeout_ms = int(timeout_ms) if timeout_ms is not None else None
        self._wait_s = (self.timeout_ms or _env_timeout_ms()) / 1000.0
        self.reconnect_interval_s = float(reconnect_interval_s)
        self.reader, self.cuda_device = bool(reader), cuda_device
        self._block_bytes = int(layout.block_bytes)
        self._tickets = itertools.count(1)
        # Reentrant: when the binding's thread drops the last reference, __del__ -> close()
        # runs on that thread inside its critical section.
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._client = None             # the connected Client, or None
        self._retiring = []             # dropped Clients still completing tickets
        self._sent = {}                 # (id(Client), its ticket) -> _Job
        self._waiting = collections.deque()     # _Jobs waiting for a connection
        self._done = []                 # Completions made here (failed or timed out)
        self._connecting = False
        self._last_error = None         # why the last connection failed or ended
        self._tried = False             # a connect was started (the first one at once)
        self._retry_at = 0.0
        self._closed = False
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll = select.epoll()    # this eventfd and the Clients' event fds
        self._epoll.register(self._efd, select.EPOLLIN)
        self._thread = threading.Thread(target=AsyncClient._run, args=(weakref.ref(self),),
                                        name="kvnode-connect", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the calls

    @property
    def event_fd(self):
        """Readable while :meth:`drain` has something (the same descriptor for the object's
        life; poll it, do not read or close it)."""
        return self._epoll.fileno()

    @property
    def connected(self):
        """True while a connection is up."""
        return self._client is not None

    @property
    def has_check_words(self):
        """True when the connected daemon honours check words (False while not connected)."""
        c = self._client
        return bool(c is not None and c.has_check_words)

    @property
    def block_bytes(self):
        """Bytes of one block (the layout's)."""
        return self._block_bytes

    @property
    def pending(self):
        """Tickets submitted and not yet drained."""
        with self._lock:
            return len(self._waiting) + len(self._sent) + len(self._done)

    def submit_match(self, keys, checks=None):
        """Start a MATCH; the ticket's count is the prefix matched."""
        return self._submit(_MATCH, keys, checks, None, False)

    def submit_delete(self, keys, checks=None):
        """Start a DELETE; the ticket's count is the keys deleted."""
        return self._submit(_DELETE, keys, checks, None, False)

    def submit_get(self, keys, pages, device=False, checks=None):
        """Start a batched get into ``pages`` (held until the ticket is drained)."""
        return self._submit(_GET, keys, checks, pages, device)

    def submit_put(self, keys, pages, device=False, checks=None):
        """Start a batched put from ``pages`` (held until the ticket is drained)."""
        return self._submit(_PUT, keys, checks, pages, device)

    def drain(self, max_completions=64):
        """The finished tickets, as a list of :class:`Completion`; never blocks."""
        want = max(int(max_completions), 1)
        try:
            os.eventfd_read(self._efd)
        except (BlockingIOError, OSError):
            pass
        with self._lock:
            if self._closed:
                return []
            clients = ([self._client] if self._client is not None else []) + self._retiring
        out = []
        for c in clients:
            if len(out) < want:
                out += self._drain_client(c, want - len(out))
        with self._lock:
            take = want - len(out)
            if take > 0 and self._done:
                out += self._done[:take]
                del self._done[:take]
            if self._done:
                os.eventfd_write(self._efd, 1)      # more than asked for: stay readable
        return out

    def close(self):
        """Disconnect; tickets not yet drained are dropped (their pages released). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            clients = ([self._client] if self._client is not None else []) + self._retiring
            self._client, self._retiring = None, []
            jobs = list(self._waiting) + list(self._sent.values())
            self._waiting.clear()
            self._sent.clear()
            self._done = []
            self._wake.notify_all()
        for c in clients:
            c.close()
        for j in jobs:
            j.release()
        self._epoll.close()
        os.close(self._efd)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------ inside

    def _submit(self, op, keys, checks, pages, device):
        if self._closed:
            raise Closed(Closed.CODE, "the client was closed", "client closed")
        arr, n = _keys_array(keys)
        cw = _checks_array(checks, n)
        pg = None
        if pages is not None:
            pg = _Pages(pages, n, self._block_bytes, op == _GET, device)
        ticket = next(self._tickets)
        job = _Job(ticket, op, arr, cw, pg, device, time.monotonic() + self._wait_s)
        if n == 0:
            self._finish(job, 0, None)
            return ticket
        with self._lock:
            if self._closed:
                job.release()
                raise Closed(Closed.CODE, "the client was closed", "client closed")
            if self._client is not None:
                self._send_locked(job)
            elif (self._connecting or not self._tried or self._last_error is None
                  or time.monotonic() >= self._retry_at):
                job.keep_arguments()    # the caller may reuse its arrays once we return
                self._waiting.append(job)   # sent once connected (a connect starts if due)
                self._wake.notify()
            else:       # the last connection failed and the next try is not due yet
                e = self._last_error
                self._finish_locked(job, 0, _new_error(type(e), "%s (reconnecting at most every "
                                                       "%g s)" % (e.message,
                                                                  self.reconnect_interval_s)))
        return ticket

    def _send_locked(self, job):
        """Submit job on the current client; a client found gone is retired and the job
        waits for the next connection."""
        c = self._client
        checks = job.checks if job.checks is not None and c.has_check_words else None
        pages = job.pages.array if job.pages is not None else None
        try:
            if job.op in (_MATCH, _DELETE):
                t = getattr(c, job.op)(job.keys, checks=checks)
            else:
                t = getattr(c, job.op)(job.keys, pages, device=job.device, checks=checks)
        except _GONE as e:
            self._retire_locked(c, e)
            self._finish_locked(job, 0, e)
            return
        except Error as e:
            self._finish_locked(job, 0, e)
            return
        self._sent[(id(c), t)] = job

    def _drain_client(self, c, want):
        try:
            got = c.drain(want)
        except Error:
            got = []
        out = []
        with self._lock:
            for comp in got:
                job = self._sent.pop((id(c), comp.ticket), None)
                if isinstance(comp.error, _GONE):
                    self._retire_locked(c, comp.error)
                if job is not None:
                    job.release()
                    out.append(Completion(job.ticket, comp.op, comp.count, comp.error))
            if c in self._retiring and c.pending == 0:
                self._retiring.remove(c)
                self._epoll.unregister(c.event_fd)
                c.close()
        return out

    def _retire_locked(self, c, error):
        """Stop using c (its connection is gone): its tickets complete with the error."""
        if c is self._client:
            self._client = None
            self._last_error = error
            self._retry_at = time.monotonic() + self.reconnect_interval_s
            try:
                c.cancel()
            except Error:
                pass
            self._retiring.append(c)
            self._wake.notify()

    def _finish(self, job, count, error):
        with self._lock:
            self._finish_locked(job, count, error)

    def _finish_locked(self, job, count, error):
        job.release()
        op = {_MATCH: 1, _GET: 2, _PUT: 3, _DELETE: 4}[job.op]
        self._done.append(Completion(job.ticket, op, count, error))
        if not self._closed:
            os.eventfd_write(self._efd, 1)

    @staticmethod
    def _run(ref):
        """The binding's thread: starts connects, times out the submits waiting for one.
        It holds its AsyncClient weakly (ref), so one dropped without close() is still
        collected; the thread then ends within a second."""
        while True:
            self = ref()
            if self is None:
                return
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                while self._waiting and self._waiting[0].deadline <= now:
                    self._expire_locked(self._waiting.popleft())
                if self._client is None and not self._connecting and now >= self._retry_at \
                        and (self._waiting or not self._tried):
                    self._connecting = self._tried = True
                    threading.Thread(target=self._connect, name="kvnode-connect",
                                     daemon=True).start()
                waits = [now + 1.0]
                if self._waiting:
                    waits.append(self._waiting[0].deadline)
                if self._client is None and not self._connecting and self._waiting:
                    waits.append(self._retry_at)
                wake, timeout = self._wake, max(min(waits) - now, 0.001)
                del self
                wake.wait(timeout)

    def _expire_locked(self, job):
        if self._last_error is not None and not self._connecting:
            err = self._last_error
        else:
            err = _new_error(TimedOut, "connect %s: kvnoded did not answer within timeout_ms=%d"
                             % (self._where(), self._wait_s * 1000))
        self._finish_locked(job, 0, err)

    def _where(self):
        return self.socket_path or os.environ.get("KVNODE_SOCKET") or "/run/kvnode/kvnode.sock"

    def _connect(self):
        """One connect (libkvnode's own timeout bounds it); on success the waiting
        submits are sent."""
        client, error = None, None
        try:
            client = Client(self.socket_path, self.layout, None, self.reader, self.cuda_device)
            if self.timeout_ms is not None:
                _set_timeout(client._c, self.timeout_ms)
        except Error as e:
            error = e
        with self._lock:
            self._connecting = False
            if self._closed:
                if client is not None:
                    client.close()
                return
            if client is None:
                self._last_error = error
                self._retry_at = time.monotonic() + self.reconnect_interval_s
                while self._waiting:    # the daemon is not there: they fail now
                    self._finish_locked(self._waiting.popleft(), 0, error)
            else:
                self._last_error = None
                self._client = client
                self._epoll.register(client.event_fd, select.EPOLLIN)
                while self._waiting and self._client is client:
                    self._send_locked(self._waiting.popleft())
            self._wake.notify()
