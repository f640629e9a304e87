"""SGLang HiCache L3 storage backend on kvnode.

Load it in SGLang with the ``dynamic`` storage backend::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvnode",
            "module_path": "kvnode.sglang", "class_name": "KvnodeHiCacheStorage",
            "interface_v1": 1, "socket_path": "/run/kvnode/kvnode.sock"}'

SGLang's factory builds it as ``KvnodeHiCacheStorage(storage_config, kwargs)``, one instance
per TP rank (each in its scheduler process), then calls ``register_mem_pool_host`` with the
host KV pool. The methods follow ``HiCacheStorage``
(``python/sglang/srt/mem_cache/hicache_storage.py``): ``batch_exists`` is the length of the
cached prefix (kvnode's MATCH); ``batch_get_v1`` / ``batch_set_v1(keys, host_indices)`` move
pages straight between the host pool's page buffers (``get_page_buffer_meta``: one pointer
per page for MLA, two — K and V — otherwise) and kvnode, one batched call per component
without a copy in Python. Neither sglang nor torch is needed to import it: the host pool is
duck-typed (``page_size`` and ``get_page_buffer_meta``).

Namespaces. A page's K and V halves are separate buffers in SGLang's host pool, and a kvnode
block is one contiguous buffer: each component gets its own kvnode namespace (layout
``extra`` ``"sglang/k"``, ``"sglang/v"``; ``"sglang/kv"`` for MLA), so both move zero-copy.
Non-MLA models get one namespace set per TP rank (``tp_rank``/``tp_size`` of the storage
config); MLA models, whose ranks hold the same KV, share rank 0's. A page counts as cached
when every component holds it.

Keys. SGLang's keys are chained SHA-256 hex strings; kvnode keys are signed 64-bit
integers. :func:`kvnode.fold_digests` folds a batch in one call into libkvnode: the key is the
first 64 bits of the digest (what :func:`fold_key` gives; of the key's SHA-256 when the key is
not hex), the check word the next 64. With a kvnoded that honours check words (every current
one: ``kvnode.Client.has_check_words``) each call sends the words beside the keys, and a page
stored under another digest that shares the first 64 bits is a miss (counted by the daemon in
``keys.check_mismatches_total``), never the other prefix's KV. Against an older daemon the
backend sends keys only, and two prefixes whose digests share 64 bits would be served each
other's KV without notice: with random digests about n²/2⁶⁵ for n stored pages (one in 10⁷
at 2·10⁶ pages). Pages stored without words (by an older daemon or backend) are misses once
words are sent, and age out of the cache.

Failures never raise into the engine. While the daemon is down (or restarting) every call
answers "not cached" / "not stored" (``batch_exists`` 0, ``get`` None, ``set`` False,
``_v1`` lists of False), logs one warning, and reconnects on a later call (at most once per
``reconnect_interval_s``). Leases live only for the duration of one batched copy; an engine
process that dies mid-copy has its leases ended by the daemon when its connection closes.

Options (the extra-config JSON, or the factory's ``kwargs``): ``socket_path`` (default
``$KVNODE_SOCKET``, else ``/run/kvnode/kvnode.sock``), ``timeout_ms`` (per call, default
libkvnode's 10 s), ``reconnect_interval_s`` (default 1.0), ``model`` (default the storage
config's ``model_name``), ``dtype`` (a layout discriminator, default ``"sglang"``).
"""

import logging
import os
import threading
import time

import kvnode

try:  # subclass SGLang's base when it is there (its factory may check it)
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # noqa: BLE001 - no sglang (or a broken one): duck-type
    _Base = object

__all__ = ["KvnodeHiCacheStorage", "fold_key"]

logger = logging.getLogger(__name__)

_DISCONNECTED = (kvnode.Closed, kvnode.ConnectError, kvnode.TimedOut, kvnode.ShuttingDown,
                 kvnode.IOFailure, kvnode.ProtocolError)
fold_key = kvnode.fold_key


class _Indices(list):
    """Token indices for get_page_buffer_meta when probing the pool (torch-free)."""

    def tolist(self):
        return list(self)


class _Conn:
    """The clients of one connection generation (one per page component)."""

    def __init__(self, clients):
        self.clients = clients
        self.users = 0
        self.retired = False
        # Check words go with every key when the daemon honours them (all clients share it).
        self.checks = all(c.has_check_words for c in clients)

    def words(self, checks):
        """checks (a batch's check words) when this connection sends them, else None."""
        return checks if self.checks else None

    def close(self):
        for c in self.clients:
            c.close()


def _get(obj, name, default=None):
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


class KvnodeHiCacheStorage(_Base):
    """HiCacheStorage backed by kvnoded (see the module docstring)."""

    def __init__(self, storage_config=None, kwargs=None, **more):
        opts = {}
        opts.update(_get(storage_config, "extra_config") or {})
        opts.update(kwargs if isinstance(kwargs, dict) else {})
        opts.update(more)
        self.storage_config = storage_config
        self.socket_path = opts.get("socket_path") or os.environ.get("KVNODE_SOCKET")
        self.timeout_ms = opts.get("timeout_ms")
        self.reconnect_interval_s = float(opts.get("reconnect_interval_s", 1.0))
        if self.reconnect_interval_s < 0:
            raise ValueError("reconnect_interval_s must be >= 0, got %r" % self.reconnect_interval_s)
        self.model = str(opts.get("model") or _get(storage_config, "model_name") or "sglang")
        self.dtype = str(opts.get("dtype") or "sglang")
        self.is_mla = bool(_get(storage_config, "is_mla_model", False))
        self.tp_rank = int(_get(storage_config, "tp_rank", 0) or 0)
        self.tp_size = int(_get(storage_config, "tp_size", 1) or 1)
        self.pp_rank = int(_get(storage_config, "pp_rank", 0) or 0)
        self.pp_size = int(_get(storage_config, "pp_size", 1) or 1)
        self.mem_pool_host = None
        self.page_size = 0
        self.component_bytes = []   # bytes of each component of one page (K, V) or (KV,)
        self._lock = threading.Lock()
        self._conn = None
        self._retry_at = 0.0
        self._warned = False
        self._next_error_log = 0.0

    # ------------------------------------------------------------ pool and connection

    def register_mem_pool_host(self, mem_pool_host):
        """Take the host pool; its page geometry sets the kvnode layouts."""
        self.mem_pool_host = mem_pool_host
        self.page_size = int(mem_pool_host.page_size)
        ptrs, sizes = mem_pool_host.get_page_buffer_meta(_Indices(range(self.page_size)))
        if len(ptrs) not in (1, 2) or len(sizes) != len(ptrs):
            raise ValueError("kvnode.sglang: get_page_buffer_meta gave %d pointers and %d sizes "
                             "for one page; expected 1 (MLA) or 2 (K, V)" % (len(ptrs), len(sizes)))
        self.component_bytes = [int(s) for s in sizes]
        if len(ptrs) == 1:
            self.is_mla = True

    def _layouts(self):
        names = ["kv"] if len(self.component_bytes) == 1 else ["k", "v"]
        rank, size = (0, 1) if self.is_mla else (self.tp_rank, self.tp_size)
        extra = "sglang/%s" + ("/pp%d-%d" % (self.pp_rank, self.pp_size) if self.pp_size > 1 else "")
        return [kvnode.Layout(model=self.model, dtype=self.dtype, block_tokens=self.page_size,
                              block_bytes=nbytes, tp_size=size, tp_rank=rank, extra=extra % name)
                for name, nbytes in zip(names, self.component_bytes)]

    def _acquire(self):
        """The current connection (connecting when due), counted as in use; None while the
        daemon cannot be reached."""
        with self._lock:
            if self._conn is None:
                if not self.component_bytes or time.monotonic() < self._retry_at:
                    return None
                clients = []
                try:
                    for lay in self._layouts():
                        clients.append(kvnode.Client(self.socket_path, lay, self.timeout_ms))
                except kvnode.Error as e:
                    for c in clients:
                        c.close()
                    self._retry_at = time.monotonic() + self.reconnect_interval_s
                    self._warn("cannot connect to kvnoded: %s" % e)
                    return None
                self._conn = _Conn(clients)
                if self._warned:
                    logger.warning("kvnode.sglang: reconnected to kvnoded")
                self._warned = False
            self._conn.users += 1
            return self._conn

    def _release(self, conn, error=None):
        """Give back conn; an error that means the connection is gone retires it (closed
        when its last user is done) so the next call reconnects."""
        close = False
        with self._lock:
            conn.users -= 1
            if isinstance(error, _DISCONNECTED) and conn is self._conn:
                self._conn = None
                conn.retired = True
                self._retry_at = time.monotonic() + self.reconnect_interval_s
                for c in conn.clients:
                    try:
                        c.cancel()
                    except kvnode.Error:
                        pass
            close = conn.retired and conn.users == 0
        if isinstance(error, _DISCONNECTED):
            self._warn("%s: %s" % (type(error).__name__, error))
        elif error is not None:     # e.g. NoSpace: this call failed, the connection is fine
            now = time.monotonic()
            if now >= self._next_error_log:
                self._next_error_log = now + 10.0
                logger.warning("kvnode.sglang: a call failed (%s: %s); it answered 'not cached' "
                               "/ 'not stored' (logged at most every 10 s)",
                               type(error).__name__, error)
        if close:
            conn.close()

    def _warn(self, text):
        if not self._warned:
            logger.warning("kvnode.sglang: %s; answering 'not cached' until kvnoded is back", text)
            self._warned = True

    def _run(self, fn, failed):
        """fn(conn) under a held connection; failed when there is none or fn raises."""
        conn = self._acquire()
        if conn is None:
            return failed
        try:
            result = fn(conn)
        except Exception as e:  # noqa: BLE001 - nothing may escape into the engine
            self._release(conn, e)
            return failed
        self._release(conn)
        return result

    def close(self):
        """Disconnect (also at interpreter exit, through the clients' finalisers)."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.retired = True
                close = conn.users == 0
        if conn is not None and close:
            conn.close()

    # ------------------------------------------------------------ prefix

    def batch_exists(self, keys, extra_info=None):
        """Length of the cached prefix of ``keys`` (every component present)."""
        if not keys:
            return 0
        folded, checks = kvnode.fold_digests(keys)

        def match(conn):
            words = conn.words(checks)
            first, *rest = conn.clients
            hit = first.match(folded, words)
            for c in rest:          # V of what K holds (a prefix of a prefix)
                if hit == 0:
                    break
                hit = c.match(kvnode.prefix(folded, hit), words and kvnode.prefix(words, hit))
            return hit
        return self._run(match, 0)

    def exists(self, key):
        return self.batch_exists([key]) == 1

    # ------------------------------------------------------------ zero-copy page paths

    def _page_pointers(self, keys, host_indices):
        """Per component, the page addresses (a list of ints) of the pool at host_indices."""
        ptrs, _ = self.mem_pool_host.get_page_buffer_meta(host_indices)
        ncomp = len(self.component_bytes)
        if len(ptrs) != len(keys) * ncomp:
            raise ValueError("kvnode.sglang: %d keys but %d page pointers (%d per page)"
                             % (len(keys), len(ptrs), ncomp))
        if ncomp == 1:
            return [ptrs if type(ptrs) is list else list(ptrs)]
        return [list(ptrs[j::ncomp]) for j in range(ncomp)]

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Read the cached prefix of ``keys`` into the host pool pages at ``host_indices``;
        a list of bools (True for the pages read: a prefix)."""
        n = len(keys)
        if n == 0:
            return []
        folded, checks = kvnode.fold_digests(keys)

        def get(conn):
            words = conn.words(checks)
            hit = n
            for c, ptrs in zip(conn.clients, self._page_pointers(keys, host_indices)):
                if hit < n:         # the next component reads what the previous one had
                    hit = c.get_batch(kvnode.prefix(folded, hit), ptrs[:hit],
                                      checks=words and kvnode.prefix(words, hit))
                else:
                    hit = c.get_batch(folded, ptrs, checks=words)
                if hit == 0:
                    break
            return [True] * hit + [False] * (n - hit)
        return self._run(get, [False] * n)

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Store the host pool pages at ``host_indices`` under ``keys``; a list of bools."""
        n = len(keys)
        if n == 0:
            return []
        folded, checks = kvnode.fold_digests(keys)

        def put(conn):
            words = conn.words(checks)
            for c, ptrs in zip(conn.clients, self._page_pointers(keys, host_indices)):
                c.put_batch(folded, ptrs, checks=words)
            return [True] * n
        return self._run(put, [False] * n)

    # ------------------------------------------------------------ flat-page paths

    def _components(self, page):
        """The per-component pieces of one flat page (K bytes then V bytes): addresses for
        an int or a tensor, memoryview slices for a buffer."""
        offs, total = [], 0
        for nbytes in self.component_bytes:
            offs.append(total)
            total += nbytes
        if isinstance(page, int):
            return [page + o for o in offs]
        if callable(getattr(page, "data_ptr", None)):
            return [int(page.data_ptr()) + o for o in offs]
        mv = memoryview(page).cast("B")
        if mv.nbytes < total:
            raise ValueError("a page of %d bytes, expected %d" % (mv.nbytes, total))
        return [mv[o:o + nb] for o, nb in zip(offs, self.component_bytes)]

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Pages of ``keys`` (a prefix): each into ``target_locations[i]`` (a flat page
        buffer, tensor or address) and returned, or as a new bytearray when no target is
        given; None for pages not read."""
        n = len(keys)
        if n == 0:
            return []
        if target_locations is None:
            target_locations = [bytearray(sum(self.component_bytes)) for _ in range(n)]
        targets = list(target_locations)
        folded, checks = kvnode.fold_digests(keys)

        def get(conn):
            words = conn.words(checks)
            pieces = [self._components(t) for t in targets]
            hit = n
            for j, c in enumerate(conn.clients):
                hit = c.get_batch(kvnode.prefix(folded, hit), [p[j] for p in pieces[:hit]],
                                  checks=words and kvnode.prefix(words, hit))
                if hit == 0:
                    break
            return hit
        hit = self._run(get, 0)
        return [targets[i] if i < hit else None for i in range(n)]

    def get(self, key, target_location=None, target_sizes=None):
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Store flat pages (``values``, or ``target_locations`` as addresses) under ``keys``;
        True when all were stored."""
        pages = values if values is not None else target_locations
        if pages is None:
            return False
        pages = list(pages)
        if len(pages) != len(keys):
            logger.warning("kvnode.sglang: batch_set got %d keys and %d pages", len(keys), len(pages))
            return False
        if not keys:
            return True
        folded, checks = kvnode.fold_digests(keys)

        def put(conn):
            words = conn.words(checks)
            pieces = [self._components(p) for p in pages]
            for j, c in enumerate(conn.clients):
                c.put_batch(folded, [p[j] for p in pieces], checks=words)
            return True
        return self._run(put, False)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        page = value if value is not None else target_location
        return self.batch_set([key], [page]) if page is not None else False

    # ------------------------------------------------------------ rest of HiCacheStorage

    def delete(self, key):
        """Remove one page (every component)."""
        folded, checks = kvnode.fold_digests([key])
        self._run(lambda conn: [c.delete(folded, conn.words(checks)) for c in conn.clients], None)

    def clear(self):
        """kvnode has no per-namespace wipe: blocks stay until evicted or deleted."""
        logger.info("kvnode.sglang: clear() leaves kvnode's blocks in place (evicted by the daemon)")

    def get_stats(self):
        return None
