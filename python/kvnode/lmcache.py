"""LMCache multiprocess (MP) server L2 adapter on kvnode: a ``native_plugin`` connector.

Load it in the LMCache MP server with::

    --l2-adapter '{"type": "native_plugin", "module_path": "kvnode.lmcache",
                   "class_name": "KvnodeL2Connector",
                   "adapter_params": {"socket_path": "/run/kvnode/kvnode.sock",
                                      "model": "Qwen/Qwen3-8B", "block_bytes": 2097152}}'

LMCache builds it as ``KvnodeL2Connector(**adapter_params)`` and calls, from several
threads (under its own lock), ``submit_batch_get(keys, memoryviews)``,
``submit_batch_set(keys, memoryviews)``, ``submit_batch_exists(keys)`` and
``submit_batch_delete(keys)`` (each returns a future id at once), polls ``event_fd()`` and
collects ``drain_completions()``: a list of ``(future_id, ok, error, per_key)``. Pure Python
(no torch): the memoryviews (ctypes byte arrays over LMCache's L1 objects) go to libkvnode's
batched asynchronous calls by address, without a copy in Python.

adapter_params (any other key raises ``TypeError`` naming the valid ones):
``socket_path`` (default ``$KVNODE_SOCKET``, else libkvnode's), ``model`` (default
``"lmcache"``), ``block_bytes`` (an object size, or a list of them; see below),
``timeout_ms`` (per call, and how long a batch waits for a connect; default libkvnode's
10 s), ``reconnect_interval_s`` (default 1), ``tp_rank``/``tp_size`` (default 0/1),
``dtype`` and ``extra`` (layout discriminators, default ``"lmcache"``), ``model_revision``
(the weights revision, e.g. a commit hash; default None: none): part of the kvnode namespace
identity when set, so the chunks of two revisions never meet, while without one the
namespaces (and stored chunks) are those of earlier versions.

Clearing: LMCache removes what it stored key by key (``submit_batch_delete``, from its
eviction and its controller's clear). ``clear()`` goes further: it drops every chunk of this
connector's kvnode deployments -- every object size it knows, every TP rank -- from
kvnoded's memory and persistent store (``kvnode.Client.purge``), also those stored before
LMCache (re)started and which it therefore cannot name; it blocks until kvnoded has done it
and returns the number of chunks dropped (raises on failure). Call it when the model's
weights change under the same name (or give a new ``model_revision``).

Per-key answers, as LMCache's connector interface defines them: exists gives one bool per
key (stored or not; ``[stored, missing, stored]`` -> ``[True, False, True]``), get one per
key (copied into its memoryview or not), delete one per key (True: this call deleted it,
False: not found), which LMCache's adapter uses to give back the key's bytes of its L2
usage (``max_capacity_gb``). set answers for the whole batch (``per_key`` None: LMCache's
adapter reads only ``ok`` there). exists and delete send one request per batch (and
object size), answered per key by kvnoded (``Client.submit_exists``,
``Client.submit_delete_each``). kvnode's GET answers the longest stored prefix, so a get
asks the keys after the first miss in one more GET. Against a kvnoded that predates
per-key answers (``Client.has_per_key`` False), exists asks one MATCH per key after the
first miss (all pipelined, one round trip) and delete sends one DELETE per key. A batch that fails (kvnoded gone, a timeout) is ``ok`` False with the error
and ``per_key`` None.

Object sizes: any. Each size is a kvnode namespace of its own (one connection each): the
size given as ``block_bytes`` (the first one when it is a list; when absent, the first
size a get or set brings) uses the layout ``extra`` as given -- the namespace earlier
versions used, so the chunks they stored stay found -- and every other size S the extra
``<extra>;lmcache_object_bytes=<S>``. A batch of mixed sizes (other object groups,
alignment-padded buffers) is split per size. A key lives in the namespace of the size it
was stored with, so exists and delete ask every size known: those listed in
``block_bytes`` and those seen since the connector started (list every size LMCache
uses, so that a restarted connector finds them before its first set). At most 32 sizes.

Keys are the strings LMCache's native connector adapter makes of an ObjectKey,
``<model_name>@<kv_rank as 8 hex digits>@<object_group_id in hex>@<chunk_hash in hex>``
with ``@<cache_salt>`` appended when the key is salted; the connector does not parse them.
They are folded to kvnode's 64-bit keys as :func:`kvnode.fold_digests` folds them (the
whole batch in one call into libkvnode, ``kvnode_fold_text``: such a string is not a hex
digest, so key and check word come from its SHA-256, as :func:`kvnode.fold_key` does);
exists and delete fold into arrays each submitting thread reuses (libkvnode copies the keys
at submit). The check word is sent beside the key
whenever kvnoded honours check words (``kvnode.Client.has_check_words``): a chunk stored
under another key whose 64-bit fold collides is then a miss (counted by the daemon in
``keys.check_mismatches_total``), never served in its place. Against an older daemon
only the keys are sent, with the collision chance of ``kvnode.sglang``'s docstring (about
n²/2⁶⁵ for n stored chunks).

Never blocking: a submit only hands requests to libkvnode's asynchronous calls (which
send without waiting) and never connects. A connect (the first use of a size, or after
kvnoded went away) runs on a thread of its own; the batches that need it wait for it
at most ``timeout_ms`` and then complete with ok False (libkvnode's connect itself is
bounded by its default timeout or ``$KVNODE_TIMEOUT_MS``, not by ``timeout_ms``: until
it ends, new batches for that size fail at once). A submit against a paused (SIGSTOPped)
kvnoded returns at once; its completion comes through ``event_fd`` when ``timeout_ms``
has passed. When kvnoded goes away, the batches in flight complete with ok False and the
error, and the connector reconnects by itself (at most once per ``reconnect_interval_s``);
``event_fd()`` stays the same descriptor.
"""

import _thread
import ctypes
import itertools
import logging
import operator
import os
import select
import threading
import time

import kvnode
from kvnode._lib import _fold_text, _submit_delete_each, _submit_exists

__all__ = ["KvnodeL2Connector"]

logger = logging.getLogger(__name__)

_DISCONNECTED = (kvnode.Closed, kvnode.ConnectError, kvnode.TimedOut, kvnode.ShuttingDown,
                 kvnode.IOFailure, kvnode.ProtocolError)
_GET, _SET, _EXISTS, _DELETE = "get", "set", "exists", "delete"

#: adapter_params the connector takes, with their defaults (any other key is refused).
PARAMS = {"socket_path": None, "model": "lmcache", "block_bytes": None, "timeout_ms": None,
          "reconnect_interval_s": 1.0, "dtype": "lmcache", "extra": "lmcache", "tp_rank": 0,
          "tp_size": 1, "model_revision": None}
#: libkvnode's default per-call timeout, which also bounds its connect (ms).
_LIB_TIMEOUT_MS = 10000
#: Object sizes one connector serves (each is a kvnode namespace and a connection).
MAX_OBJECT_SIZES = 32

_nbytes = operator.attrgetter("nbytes")
_NO_TICKET = (None, None, None)
#: The indices of a request that is its whole batch (exists / delete of one size).
_WHOLE = "whole"
#: Completions taken from a kvnode client at a time.
_DRAIN_MAX = 256


def _sizes(views):
    """The byte sizes of views (memoryviews, or buffers), in order."""
    if set(map(type, views)) == {memoryview}:
        return list(map(_nbytes, views))
    return [memoryview(v).nbytes for v in views]


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError("kvnode.lmcache: %s must be a positive integer, got %r" % (name, value))
    return value


class _Batch:
    """One LMCache future: its keys (folded), buffers, per-key answers and the requests
    (kvnode tickets, or waiting for a connection) not yet finished."""

    __slots__ = ("fid", "op", "n", "folded", "checks", "views", "hits", "parts", "error")

    def __init__(self, fid, op, n, folded, checks, views):
        self.fid, self.op, self.n = fid, op, n
        self.folded, self.checks, self.views = folded, checks, views
        self.hits = None            # the per-key answers so far (None: no key found yet)
        self.parts = 0
        self.error = None


class _Deadline:
    """fn(*args) after seconds unless cancelled first; its thread starts without the
    caller waiting for it."""

    def __init__(self, seconds, fn, args):
        self._cancelled = threading.Event()
        _thread.start_new_thread(self._run, (seconds, fn, args))

    def _run(self, seconds, fn, args):
        if not self._cancelled.wait(seconds):
            fn(*args)

    def cancel(self):
        self._cancelled.set()


class _Space:
    """One object size: its kvnode namespace and the connection bound to it."""

    __slots__ = ("size", "layout", "client", "checks_on", "per_key_on", "connecting", "stalled",
                 "gen", "timer", "retry_at", "queue")

    def __init__(self, size, layout):
        self.size, self.layout = size, layout
        self.client = None
        self.checks_on = False      # the daemon of client honours check words
        self.per_key_on = False     # ... and answers exists / delete per key
        self.connecting = False     # a connect runs on a thread of its own
        self.stalled = False        # ... and has not answered within timeout_ms
        self.gen = 0                # which connect attempt is the current one
        self.timer = None
        self.retry_at = 0.0
        self.queue = []             # (batch, indices) waiting for the connect


class KvnodeL2Connector:
    """LMCache ``native_plugin`` connector backed by kvnoded (see the module docstring)."""

    def __init__(self, **adapter_params):
        unknown = sorted(set(adapter_params) - set(PARAMS))
        if unknown:
            raise TypeError("kvnode.lmcache: unknown adapter_params %s; the valid ones are %s"
                            % (", ".join(map(repr, unknown)), ", ".join(PARAMS)))
        p = dict(PARAMS, **adapter_params)
        sizes = p["block_bytes"]
        if sizes is None:
            sizes = []
        elif isinstance(sizes, (list, tuple)):
            sizes = [_positive_int("block_bytes[%d]" % i, s) for i, s in enumerate(sizes)]
            if not sizes:
                raise ValueError("kvnode.lmcache: block_bytes is an empty list")
        else:
            sizes = [_positive_int("block_bytes", sizes)]
        if len(set(sizes)) > MAX_OBJECT_SIZES:
            raise ValueError("kvnode.lmcache: block_bytes names %d sizes; at most %d"
                             % (len(set(sizes)), MAX_OBJECT_SIZES))
        if p["timeout_ms"] is not None:
            _positive_int("timeout_ms", p["timeout_ms"])
        if float(p["reconnect_interval_s"]) < 0:
            raise ValueError("kvnode.lmcache: reconnect_interval_s must be >= 0")
        self.tp_rank, self.tp_size = int(p["tp_rank"]), int(p["tp_size"])
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError("kvnode.lmcache: need 0 <= tp_rank < tp_size, got tp_rank=%r "
                             "tp_size=%r" % (p["tp_rank"], p["tp_size"]))
        self.socket_path = p["socket_path"] or os.environ.get("KVNODE_SOCKET")
        self.model, self.dtype, self.extra = str(p["model"]), str(p["dtype"]), str(p["extra"])
        rev = p["model_revision"]
        if rev is not None and (not isinstance(rev, str) or len(rev.encode()) > 127
                                or any(ord(ch) < 0x20 or ord(ch) == 0x7f for ch in rev)):
            raise ValueError("kvnode.lmcache: model_revision must be a string of at most 127 "
                             "bytes without control characters, got %r" % (rev,))
        self.model_revision = rev or None
        #: The object size whose namespace has ``extra`` as given (None: the first size seen).
        self.block_bytes = sizes[0] if sizes else None
        self._more_sizes = sizes[1:]
        self.timeout_ms = p["timeout_ms"]
        self._timeout_s = (self.timeout_ms or _LIB_TIMEOUT_MS) / 1000.0
        self.reconnect_interval_s = float(p["reconnect_interval_s"])
        self._ids = itertools.count(1)
        self._lock = threading.Lock()          # spaces, clients, ticket map, batches
        self._spaces = {}                      # object size -> _Space
        self._retiring = []                    # cancelled clients still completing tickets
        self._tickets = {}                     # (client id, ticket) -> (batch, space, indices)
        #                                        or (future id, space, _WHOLE)
        self._warned = False
        self._known = None                     # spaces a key may be in (None: to list)
        self._fast = None                      # _fast_spaces() (None: to work out)
        self._scratch = threading.local()      # each submitting thread's fold arrays
        self._clients = ()                     # current and retiring clients, to drain
        self._done = []                        # finished batches not yet drained
        self._done_lock = threading.Lock()     # _done, _signalled, _efd_open
        self._drained = []                     # ... finished inside drain_completions
        self._signalled = False                # the eventfd was written and not read since
        self._efd_open = True
        self._drain_lock = threading.Lock()
        # event_fd() is an epoll set: readable while the local eventfd or the event fd of
        # a kvnode client (current or retiring) is. It stays the same across reconnects,
        # and no thread stands between libkvnode's completions and LMCache's poll loop.
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll = select.epoll()
        self._epoll.register(self._efd, select.EPOLLIN)
        self._closing = False

    # ------------------------------------------------------------ LMCache's interface

    def event_fd(self):
        """Readable while drain_completions() has something (the same fd for the adapter's life)."""
        return self._epoll.fileno()

    def submit_batch_get(self, keys, memoryviews):
        return self._submit(_GET, keys, memoryviews)

    def submit_batch_set(self, keys, memoryviews):
        return self._submit(_SET, keys, memoryviews)

    def submit_batch_exists(self, keys):
        return self._submit_keys(_EXISTS, keys)

    def submit_batch_delete(self, keys):
        return self._submit_keys(_DELETE, keys)

    def drain_completions(self):
        """Finished batches: [(future_id, ok, error, per_key or None)]; never blocks."""
        with self._drain_lock:
            # The eventfd is read only when written: most batches complete through a kvnode
            # client's event fd (and a read that finds nothing costs an exception). Read
            # without the lock, _signalled and _done may miss a batch finishing meanwhile:
            # its write keeps event_fd readable, and the next call takes it.
            if self._signalled:
                with self._done_lock:
                    if self._signalled:
                        self._signalled = False
                        try:
                            os.eventfd_read(self._efd)
                        except BlockingIOError:
                            pass
            for c in self._clients:     # their kvnode completions into LMCache's
                got = _DRAIN_MAX
                while got == _DRAIN_MAX:
                    try:
                        done = c._drain_tuples(_DRAIN_MAX)
                    except kvnode.Error:
                        break
                    got = len(done)
                    if got:
                        with self._lock:
                            for ticket, _, count, error, per_key in done:
                                self._finish(c, ticket, count, error, per_key)
            if self._retiring:
                self._close_retired()
            done, self._drained = self._drained, []
            if self._done:
                with self._done_lock:
                    done += self._done
                    self._done = []
            return done

    def clear(self):
        """Drop every chunk of this connector's deployments from kvnoded (memory and store;
        see the module docstring): one purge per object size known, on connections of its
        own (blocking, bounded by timeout_ms per call). Returns the chunks dropped."""
        with self._lock:
            layouts = [s.layout for s in self._known_spaces()]
        if not layouts:
            logger.info("kvnode.lmcache: clear() before any object size is known: nothing to name")
            return 0
        blocks, deployments = kvnode.purge_layouts(self.socket_path, layouts, self.timeout_ms)
        logger.info("kvnode.lmcache: clear() dropped %d chunks of %d deployments", blocks,
                    deployments)
        return blocks

    def close(self):
        """Disconnect (batches in flight are dropped)."""
        with self._drain_lock, self._lock:
            if self._closing:
                return
            self._closing = True
            clients = list(self._retiring)
            for s in self._spaces.values():
                if s.timer is not None:
                    s.timer.cancel()
                if s.client is not None:
                    clients.append(s.client)
                s.client, s.queue = None, []
            self._retiring, self._tickets, self._clients = [], {}, ()
            self._fast = ()
        with self._done_lock:
            self._efd_open = self._signalled = False
        for c in clients:
            c.close()
        self._epoll.close()
        os.close(self._efd)

    # ------------------------------------------------------------ inside

    def _complete(self, fid, ok, error, per_key):
        self._push((fid, ok, error, per_key))

    def _push(self, item):
        """A finished batch for drain_completions, and event_fd made readable: one write
        until drain_completions reads it (none once the fd is closed)."""
        with self._done_lock:
            self._done.append(item)
            if not self._signalled and self._efd_open:
                self._signalled = True
                os.eventfd_write(self._efd, 1)

    def _warn(self, text):
        if not self._warned:
            logger.warning("kvnode.lmcache: %s; batches fail until kvnoded is back", text)
            self._warned = True

    def _space(self, size):
        """The space of objects of size bytes (made on first use); None past
        MAX_OBJECT_SIZES. Called with self._lock held."""
        s = self._spaces.get(size)
        if s is None:
            if len(self._spaces) >= MAX_OBJECT_SIZES:
                return None
            if self.block_bytes is None:
                self.block_bytes = size
            extra = self.extra if size == self.block_bytes else \
                "%s;lmcache_object_bytes=%d" % (self.extra, size)
            lay = kvnode.Layout(model=self.model, dtype=self.dtype, block_tokens=1,
                                block_bytes=size, tp_size=self.tp_size, tp_rank=self.tp_rank,
                                extra=extra, revision=self.model_revision)
            s = self._spaces[size] = _Space(size, lay)
            self._known = self._fast = None
        return s

    def _known_spaces(self):
        """Every space a key may be in: the sizes of block_bytes and those seen so far
        (listed again only when a space was added). Lock held."""
        if self._known is None:
            for size in ([self.block_bytes] if self.block_bytes is not None else []) + \
                    self._more_sizes:
                self._space(size)
            self._known = list(self._spaces.values())
        return self._known

    def _set_clients(self):
        """The clients drain_completions drains: the spaces' and the retiring. Lock held."""
        self._clients = tuple(s.client for s in self._spaces.values()
                              if s.client is not None) + tuple(self._retiring)

    def _submit(self, op, keys, views):
        fid = next(self._ids)
        n = len(keys)
        if self._closing:
            self._complete(fid, False, "kvnode.lmcache: the connector was closed", None)
            return fid
        sizes = None
        if views is not None:
            views = list(views)
            if len(views) != n:
                self._complete(fid, False, "kvnode.lmcache: %d keys but %d memoryviews"
                               % (n, len(views)), None)
                return fid
            sizes = _sizes(views)
            if n and min(sizes) == 0:
                self._complete(fid, False, "kvnode.lmcache: memoryview %d has 0 bytes"
                               % sizes.index(0), None)
                return fid
        if n == 0:
            self._complete(fid, True, "", [])
            return fid
        folded, checks = kvnode.fold_digests(keys)
        batch = _Batch(fid, op, n, folded, checks, views)
        with self._lock:
            if len(set(sizes)) == 1:
                parts = [(self._space(sizes[0]), None)]
            else:
                groups = {}
                for i, size in enumerate(sizes):
                    groups.setdefault(size, []).append(i)
                parts = [(self._space(size), idx) for size, idx in groups.items()]
            if any(s is None for s, _ in parts):
                self._complete(fid, False, "kvnode.lmcache: more than %d object sizes"
                               % MAX_OBJECT_SIZES, None)
                return fid
            batch.parts = len(parts)
            for space, idx in parts:
                self._send(batch, space, idx)
        return fid

    def _submit_keys(self, op, keys):
        """exists / delete: every key to every size known. The keys are folded into this
        thread's scratch arrays (libkvnode copies them at submit); when every size's
        connection is up and answers per key (the usual case: _fast) each gets one
        request at once, else _send_keys takes the batch (with arrays of its own)."""
        fid = next(self._ids)
        n = len(keys)
        if self._closing:
            self._complete(fid, False, "kvnode.lmcache: the connector was closed", None)
            return fid
        if n == 0:
            self._complete(fid, True, "", [])
            return fid
        sc = self._scratch
        karr = getattr(sc, "keys", None)
        if karr is None or len(karr) < n:
            size = 1 << (n - 1).bit_length()
            karr = sc.keys = (ctypes.c_int64 * size)()
            sc.checks = (ctypes.c_uint64 * size)()
        carr = sc.checks
        try:
            text = "\0".join(keys).encode("utf-8")
        except TypeError:       # not all strings (bytes keys)
            text = None
        scratch = text is not None and _fold_text is not None and \
            _fold_text(text, len(text), n, karr, carr) == n
        if not scratch:         # (a NUL in a key, a libkvnode without kvnode_fold_text)
            karr, carr = kvnode.fold_digests(keys)
        fn = _submit_exists if op == _EXISTS else _submit_delete_each
        with self._lock:
            fast = self._fast if self._fast is not None else self._fast_spaces()
            if len(fast) == 1:  # one size: the request is the batch (no _Batch to track)
                space = fast[0]
                c = space.client
                try:
                    t = c._submit_each(fn, karr, carr if space.checks_on else None, n)
                except Exception as e:  # noqa: BLE001 - reported through the completion
                    if isinstance(e, _DISCONNECTED):
                        self._retire(space, c)
                    self._complete(fid, False, "%s: %s" % (type(e).__name__, e), None)
                    return fid
                self._tickets[(id(c), t)] = (fid, space, _WHOLE)
                return fid
            batch = _Batch(fid, op, n, karr, carr, None)
            if not fast:
                self._send_keys(batch, scratch)
                return fid
            batch.parts = len(fast)
            for space in fast:
                c = space.client
                try:
                    t = c._submit_each(fn, karr, carr if space.checks_on else None, n)
                except Exception as e:  # noqa: BLE001 - reported through the completion
                    self._submit_failed(batch, space, c, e)
                    continue
                self._tickets[(id(c), t)] = (batch, space, None)
            batch.folded = batch.checks = None      # sent (scratch: this thread's again)
        return fid

    def _fast_spaces(self):
        """The spaces an exists or delete is sent to at once, one request each answered
        per key: every known space when each is connected to a kvnoded that answers per
        key, else none (kept in _fast until a space or connection changes). Lock held."""
        spaces = self._known_spaces()
        ready = all(s.client is not None and s.per_key_on for s in spaces)
        self._fast = tuple(spaces) if ready else ()
        return self._fast

    def _send_keys(self, batch, scratch):
        """An exists or delete not sent at once: to each known space, waiting for its
        connect or one request per key (scratch: batch's arrays are this thread's
        scratch, copied here). Lock held."""
        spaces = self._known_spaces()
        if not spaces:          # no size known yet: nothing can be stored
            self._complete(batch.fid, True, "", [False] * batch.n)
            return
        if scratch:             # requests sent later: arrays of the batch's own
            n = batch.n
            batch.folded = (ctypes.c_int64 * n).from_buffer_copy(batch.folded)
            batch.checks = (ctypes.c_uint64 * n).from_buffer_copy(batch.checks)
        batch.parts = len(spaces)
        for space in spaces:
            self._send(batch, space, None)

    def _send(self, batch, space, idx):
        """Send the keys idx (None: all) of batch to space, or queue them while it connects
        (a connect runs on a thread of its own, never on the caller's). Lock held."""
        if space.client is not None:
            self._request(batch, space, space.client, idx)
        elif space.connecting:
            if space.stalled:
                self._part_done(batch, "kvnoded unreachable: the connect has not been "
                                "answered in %d ms" % (self._timeout_s * 1000))
            else:
                space.queue.append((batch, idx))
        elif time.monotonic() < space.retry_at:
            self._part_done(batch, "kvnoded unreachable (retrying)")
        else:
            space.queue.append((batch, idx))
            self._start_connect(space)

    def _start_connect(self, space):
        # _thread, not threading.Thread: Thread.start() waits until the new
        # thread runs, which on a loaded machine held the caller's submit
        # ~100 ms (the caller must not wait for anything).
        space.connecting, space.stalled = True, False
        space.gen += 1
        _thread.start_new_thread(self._connect, (space, space.gen))
        space.timer = _Deadline(self._timeout_s, self._stall, (space, space.gen))

    def _connect(self, space, gen):
        """A connect attempt (on its own thread: libkvnode's connect waits for the daemon)."""
        c, err = None, None
        try:
            c = kvnode.Client(self.socket_path, space.layout, self.timeout_ms)
        except Exception as e:  # noqa: BLE001 - reported through the batches waiting
            err = e
        with self._lock:
            if space.timer is not None:
                space.timer.cancel()
            space.connecting = space.stalled = False
            if self._closing or space.gen != gen:
                if c is not None:
                    c.close()
                return
            queue, space.queue = space.queue, []
            if c is None:
                space.retry_at = time.monotonic() + self.reconnect_interval_s
                self._warn("cannot connect to kvnoded: %s" % err)
                for batch, _ in queue:
                    self._part_done(batch, "kvnoded unreachable: %s: %s"
                                    % (type(err).__name__, err))
                return
            if self._warned:
                logger.warning("kvnode.lmcache: reconnected to kvnoded")
            self._warned = False
            space.client, space.checks_on = c, c.has_check_words
            space.per_key_on = getattr(c, "has_per_key", False)
            self._epoll.register(c.event_fd, select.EPOLLIN)
            self._set_clients()
            self._fast = None
            for batch, idx in queue:
                self._request(batch, space, c, idx)

    def _stall(self, space, gen):
        """timeout_ms after a connect began and it has not ended: fail what waits for it."""
        with self._lock:
            if space.gen != gen or not space.connecting or self._closing:
                return
            space.stalled = True
            queue, space.queue = space.queue, []
            for batch, _ in queue:
                self._part_done(batch, "kvnoded unreachable: the connect has not been "
                                "answered in %d ms" % (self._timeout_s * 1000))

    def _retire(self, space, client):
        """Stop using client (its connection is gone). Lock held."""
        if space.client is client:
            space.client = None
            self._fast = None
            space.retry_at = time.monotonic() + self.reconnect_interval_s
            try:
                client.cancel()
            except kvnode.Error:
                pass
            self._retiring.append(client)

    def _request(self, batch, space, c, idx, singles=False):
        """Submit batch's keys idx (None: all) to client c of space: one request (exists
        and delete answered per key by kvnoded), or, against a kvnoded that answers a
        prefix and a count only, one per key (a delete always, so that each key says
        whether it was deleted; the exists of keys after a miss). Lock held."""
        per_key = space.per_key_on and batch.op in (_EXISTS, _DELETE)
        if batch.op == _DELETE and not per_key:
            singles = True
        if singles:
            units = [[i] for i in (range(batch.n) if idx is None else idx)]
        else:
            units = [idx]
        batch.parts += len(units) - 1
        checks = batch.checks if space.checks_on else None
        for u in units:
            if u is None:
                keys, ch, pages = batch.folded, checks, batch.views
            else:
                keys = [batch.folded[i] for i in u]
                ch = None if checks is None else [checks[i] for i in u]
                pages = None if batch.views is None else [batch.views[i] for i in u]
            try:
                if batch.op == _GET:
                    t = c.submit_get(keys, pages, checks=ch)
                elif batch.op == _SET:
                    t = c.submit_put(keys, pages, checks=ch)
                elif per_key:
                    t = (c.submit_exists if batch.op == _EXISTS
                         else c.submit_delete_each)(keys, checks=ch)
                elif batch.op == _EXISTS:
                    t = c.submit_match(keys, checks=ch)
                else:
                    t = c.submit_delete(keys, checks=ch)
            except Exception as e:  # noqa: BLE001 - reported through the completion
                self._submit_failed(batch, space, c, e)
                continue
            self._tickets[(id(c), t)] = (batch, space, u)

    def _submit_failed(self, batch, space, c, e):
        """A submit of batch to client c raised e. Lock held."""
        if isinstance(e, _DISCONNECTED):
            self._retire(space, c)
        self._part_done(batch, "%s: %s" % (type(e).__name__, e))

    def _part_done(self, batch, error=None, signal=True):
        """One request of batch finished (with error, or None); the batch completes with
        its last one. Lock held; signal False: and drain_completions' (called from it)."""
        if error is not None and batch.error is None:
            batch.error = error
        batch.parts -= 1
        if batch.parts:
            return
        batch.views = None
        if batch.error is not None:
            item = (batch.fid, False, batch.error, None)
        elif batch.op == _SET:  # answers for the batch (LMCache's adapter reads only ok there)
            item = (batch.fid, True, "", None)
        else:
            hits = batch.hits
            item = (batch.fid, True, "", hits if hits is not None else [False] * batch.n)
        if signal:
            self._push(item)
        else:       # inside drain_completions (its lock held), which returns it
            self._drained.append(item)

    def _finish(self, c, ticket, count, error, per_key):
        """A kvnode completion of client c (drain's tuple, less its op): per-key answers,
        and the requests that follow a prefix answer (kvnode's MATCH and GET stop at the
        first miss). Lock held."""
        batch, space, u = self._tickets.pop((id(c), ticket), _NO_TICKET)
        if u is _WHOLE:     # a batch of one request answered per key; batch: its future id
            if per_key is not None:
                self._drained.append((batch, True, "", per_key))
                return
            if isinstance(error, _DISCONNECTED):
                self._retire(space, c)
                self._warn(str(error))
            self._drained.append((batch, False, "%s: %s" % (type(error).__name__, error)
                                  if error is not None else "no per-key answer", None))
            return
        if batch is None:
            return
        if per_key is not None and batch.parts == 1 and u is None and batch.hits is None \
                and batch.error is None:
            # the usual exists / delete: the batch's one request, answered per key
            batch.parts = 0
            self._drained.append((batch.fid, True, "", per_key))
            return
        if error is not None:
            if isinstance(error, _DISCONNECTED):
                self._retire(space, c)
                self._warn(str(error))
            self._part_done(batch, "%s: %s" % (type(error).__name__, error), False)
            return
        if batch.error is None and per_key is not None:
            # exists / delete answered per key (an older kvnoded answers a prefix or count)
            hits = batch.hits
            if u is None and hits is None:
                batch.hits = per_key                # the whole batch in one answer (ours)
            else:
                hits = self._hits(batch)
                for i, yes in zip(range(batch.n) if u is None else u, per_key):
                    if yes:
                        hits[i] = True
        elif batch.error is None:
            keys = range(batch.n) if u is None else u
            got = min(count, len(keys))
            hits = self._hits(batch)
            if batch.op == _DELETE:
                if got:
                    hits[keys[0]] = True
            elif u is None:
                hits[:got] = [True] * got
            else:
                for i in keys[:got]:
                    hits[i] = True
            rest = keys[got + 1:]
            if rest and batch.op in (_GET, _EXISTS):
                batch.parts += 1
                if space.client is c:
                    # exists: one MATCH per key left (one round trip, pipelined); get: the
                    # keys left in one GET again (a miss in a load is rare)
                    self._request(batch, space, c, list(rest), singles=batch.op == _EXISTS)
                else:
                    self._part_done(batch, "kvnoded connection lost", False)
        self._part_done(batch, None, False)

    @staticmethod
    def _hits(batch):
        """batch's per-key answers as a list of its own, made on first use."""
        if batch.hits is None:
            batch.hits = [False] * batch.n
        return batch.hits

    def _close_retired(self):
        """Close the retired clients whose tickets have all been drained."""
        with self._lock:
            for c in [c for c in self._retiring if c.pending == 0]:
                self._retiring.remove(c)
                self._set_clients()
                try:
                    self._epoll.unregister(c.event_fd)
                except (OSError, ValueError, kvnode.Error):
                    pass
                c.close()
