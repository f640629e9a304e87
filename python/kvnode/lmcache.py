"""LMCache multiprocess (MP) server L2 adapter on kvnode: a ``native_plugin`` connector.

Load it in the LMCache MP server with::

    --l2-adapter '{"type": "native_plugin", "module_path": "kvnode.lmcache",
                   "class_name": "KvnodeL2Connector",
                   "adapter_params": {"socket_path": "/run/kvnode/kvnode.sock",
                                      "model": "Qwen/Qwen3-8B", "block_bytes": 2097152}}'

LMCache builds it as ``KvnodeL2Connector(**adapter_params)`` and calls, from several
threads, ``submit_batch_get(keys, memoryviews)``, ``submit_batch_set(keys, memoryviews)``,
``submit_batch_exists(keys)``, ``submit_batch_delete(keys)`` (each returns a future id at
once), polls ``event_fd()`` and collects ``drain_completions()``: a list of
``(future_id, ok, error, per_key)``. Pure Python (no torch): the memoryviews go to
libkvnode's batched asynchronous calls by address, without a copy in Python.

Every submit returns at once: get, set, exists and delete all go to libkvnode's asynchronous
calls (exists is a MATCH, delete a DELETE), so a slow or hung kvnoded never holds up the thread
that submits; their completions come through ``event_fd``.

Per-key results: exists and get answer a *prefix* (kvnode's MATCH / batched get): keys
after the first miss read as missing even when stored (safe: LMCache recomputes them; its
chunks of one request are a prefix chain anyway). set and delete give ``None``.

``block_bytes`` (bytes of one LMCache chunk object) sets the kvnode namespace's block size;
when absent it is taken from the first get/set's memoryviews (exists before that answers
all-missing). A memoryview of another size fails its batch (ok False, the error says why).

Keys are folded to kvnode's 64-bit keys by :func:`kvnode.fold_digests` (the whole batch in one
call into libkvnode: an LMCache key ``model@rank@hash`` is folded from its SHA-256, as
:func:`kvnode.fold_key` does). The next 64 bits of the digest are the key's check word, sent
beside it whenever kvnoded honours check words (``kvnode.Client.has_check_words``): a chunk
stored under another key whose 64-bit fold collides is then a miss (counted by the daemon in
``keys.check_mismatches_total``), never served in its place. Against an older daemon only the
keys are sent, with the collision chance of ``kvnode.sglang``'s docstring (about n²/2⁶⁵ for n
stored chunks).

When kvnoded goes away, the batches in flight complete with ok False and the error; new
ones fail at once (never raise) until it is back; the connector reconnects by itself (at
most once per ``reconnect_interval_s``) and ``event_fd()`` stays the same descriptor.
Other adapter_params: ``timeout_ms`` (per call), ``dtype`` and ``extra`` (layout
discriminators), ``tp_rank``/``tp_size`` (default 0/1).
"""

import itertools
import logging
import operator
import os
import select
import threading
import time

import kvnode

__all__ = ["KvnodeL2Connector"]

logger = logging.getLogger(__name__)

_DISCONNECTED = (kvnode.Closed, kvnode.ConnectError, kvnode.TimedOut, kvnode.ShuttingDown,
                 kvnode.IOFailure, kvnode.ProtocolError)
_GET, _SET, _EXISTS, _DELETE = "get", "set", "exists", "delete"


_nbytes = operator.attrgetter("nbytes")


def _sizes(views):
    """The set of the byte sizes of views (memoryviews, or buffers)."""
    if set(map(type, views)) == {memoryview}:
        return set(map(_nbytes, views))
    return {memoryview(v).nbytes for v in views}


class KvnodeL2Connector:
    """LMCache ``native_plugin`` connector backed by kvnoded (see the module docstring)."""

    def __init__(self, socket_path=None, model="lmcache", block_bytes=None, timeout_ms=None,
                 reconnect_interval_s=1.0, dtype="lmcache", extra="lmcache", tp_rank=0,
                 tp_size=1, **_future_params):
        if block_bytes is not None and int(block_bytes) <= 0:
            raise ValueError("kvnode.lmcache: block_bytes must be > 0, got %r" % block_bytes)
        if float(reconnect_interval_s) < 0:
            raise ValueError("kvnode.lmcache: reconnect_interval_s must be >= 0")
        self.socket_path = socket_path or os.environ.get("KVNODE_SOCKET")
        self.model, self.dtype, self.extra = str(model), str(dtype), str(extra)
        self.tp_rank, self.tp_size = int(tp_rank), int(tp_size)
        self.block_bytes = int(block_bytes) if block_bytes is not None else None
        self.timeout_ms = timeout_ms
        self.reconnect_interval_s = float(reconnect_interval_s)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()          # client swaps, submits, ticket map
        self._client = None
        self._checks_on = False                # the daemon of _client honours check words
        self._retiring = []                    # cancelled clients still completing tickets
        self._tickets = {}                     # (client id, ticket) -> (future id, op, n)
        self._retry_at = 0.0
        self._warned = False
        self._done = []                        # completions made here (failed submits)
        self._done_lock = threading.Lock()
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
        return self._submit(_EXISTS, keys, None)

    def submit_batch_delete(self, keys):
        return self._submit(_DELETE, keys, None)

    def drain_completions(self):
        """Finished batches: [(future_id, ok, error, per_key or None)]; never blocks."""
        with self._drain_lock:
            try:
                os.eventfd_read(self._efd)
            except BlockingIOError:
                pass
            with self._lock:    # the current client only while it has tickets
                clients = ([self._client] if self._client and self._tickets else []) + \
                    list(self._retiring)
            for c in clients:
                self._drain_client(c)
            with self._done_lock:
                done, self._done = self._done, []
            return done

    def close(self):
        """Disconnect (batches in flight are dropped)."""
        if self._closing:
            return
        self._closing = True
        with self._drain_lock, self._lock:
            clients = [self._client] + self._retiring if self._client else list(self._retiring)
            self._client, self._retiring = None, []
        for c in clients:
            c.close()
        self._epoll.close()
        os.close(self._efd)

    # ------------------------------------------------------------ inside

    def _complete(self, fid, ok, error, per_key):
        with self._done_lock:
            self._done.append((fid, ok, error, per_key))
        os.eventfd_write(self._efd, 1)

    def _warn(self, text):
        if not self._warned:
            logger.warning("kvnode.lmcache: %s; batches fail until kvnoded is back", text)
            self._warned = True

    def _connected(self, nbytes):
        """The current client (connecting when due); None when kvnoded cannot be reached
        or the block size is not known yet. Called with self._lock held."""
        if self._client is not None:
            return self._client
        if self.block_bytes is None:
            if nbytes is None:
                return None
            self.block_bytes = nbytes
        if time.monotonic() < self._retry_at:
            return None
        lay = kvnode.Layout(model=self.model, dtype=self.dtype, block_tokens=1,
                            block_bytes=self.block_bytes, tp_size=self.tp_size,
                            tp_rank=self.tp_rank, extra=self.extra)
        try:
            self._client = kvnode.Client(self.socket_path, lay, self.timeout_ms)
        except kvnode.Error as e:
            self._retry_at = time.monotonic() + self.reconnect_interval_s
            self._warn("cannot connect to kvnoded: %s" % e)
            raise
        if self._warned:
            logger.warning("kvnode.lmcache: reconnected to kvnoded")
        self._warned = False
        self._checks_on = self._client.has_check_words
        self._epoll.register(self._client.event_fd, select.EPOLLIN)
        return self._client

    def _retire(self, client):
        """Stop using client (its connection is gone); called with self._lock held."""
        if client is self._client:
            self._client = None
            self._retry_at = time.monotonic() + self.reconnect_interval_s
            try:
                client.cancel()
            except kvnode.Error:
                pass
            self._retiring.append(client)

    def _submit(self, op, keys, views):
        fid = next(self._ids)
        n = len(keys)
        if self._closing:
            self._complete(fid, False, "kvnode.lmcache: the connector was closed", None)
            return fid
        nbytes = None
        if views is not None:
            views = list(views)
            if len(views) != n:
                self._complete(fid, False, "kvnode.lmcache: %d keys but %d memoryviews"
                               % (n, len(views)), None)
                return fid
            if views:
                nbytes = memoryview(views[0]).nbytes
        if n == 0:
            self._complete(fid, True, "", [] if op in (_GET, _EXISTS) else None)
            return fid
        folded, checks = kvnode.fold_digests(keys)
        with self._lock:
            try:
                c = self._connected(nbytes)
            except kvnode.Error as e:
                self._complete(fid, False, "kvnoded unreachable: %s" % e, None)
                return fid
            if c is None:
                if op == _EXISTS and self.block_bytes is None:   # nothing stored yet
                    self._complete(fid, True, "", [False] * n)
                else:
                    self._complete(fid, False, "kvnoded unreachable (retrying)", None)
                return fid
            if views is not None and _sizes(views) != {self.block_bytes}:
                self._complete(fid, False, "kvnode.lmcache: memoryviews must have block_bytes=%d "
                               "bytes each (set adapter_params.block_bytes to LMCache's chunk "
                               "size)" % self.block_bytes, None)
                return fid
            if not self._checks_on:
                checks = None
            try:
                if op == _GET:
                    t = c.submit_get(folded, views, checks=checks)
                elif op == _SET:
                    t = c.submit_put(folded, views, checks=checks)
                elif op == _EXISTS:
                    t = c.submit_match(folded, checks=checks)
                else:
                    t = c.submit_delete(folded, checks=checks)
            except Exception as e:  # noqa: BLE001 - reported through the completion
                if isinstance(e, _DISCONNECTED):
                    self._retire(c)
                self._complete(fid, False, "%s: %s" % (type(e).__name__, e), None)
                return fid
            self._tickets[(id(c), t)] = (fid, op, n)
            return fid

    def _drain_client(self, c):
        """Turn c's kvnode completions into LMCache's; close c once retired and drained."""
        try:
            done = c.drain()
        except kvnode.Error:
            return
        for comp in done:
            with self._lock:
                fid, op, n = self._tickets.pop((id(c), comp.ticket), (None, None, 0))
                if comp.error is not None and isinstance(comp.error, _DISCONNECTED):
                    self._retire(c)
            if fid is None:
                continue
            if comp.error is not None:
                if isinstance(comp.error, _DISCONNECTED):
                    self._warn(str(comp.error))
                item = (fid, False, "%s: %s" % (type(comp.error).__name__, comp.error), None)
            elif op in (_GET, _EXISTS):
                hit = min(comp.count, n)
                item = (fid, True, "", [True] * hit + [False] * (n - hit))
            else:
                item = (fid, True, "", None)
            with self._done_lock:
                self._done.append(item)
        with self._lock:
            if c in self._retiring and c.pending == 0:
                self._retiring.remove(c)
                self._epoll.unregister(c.event_fd)
                c.close()
