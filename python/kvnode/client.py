"""The connection to kvnoded: :class:`Client` (connecting, closing, and the synchronous calls:
match, get, put, delete, stats, prefault, the zero-copy read/write leases of leases.py; its
batched and asynchronous calls come from async_calls.py) and :func:`version`."""

import ctypes
import json
import os
import threading

from ._lib import (_CONNECT_READER, _CTiers, _P, _PREFAULT_WAIT, _SIZE, _block_bytes, _close,
                   _connect_device, _connect_error, _connect_flags, _connect_revision, _delete,
                   _delete_checked, _deployment_id, _purge,
                   _free, _get, _get_batch_checked, _get_inline, _get_inline_checked,
                   _has_check_words, _is_reader, _last_error, _lib_path, _match, _match_checked,
                   _prefault, _prefault_progress, _put, _put_batch_checked, _put_inline,
                   _put_inline_checked, _s, _set_timeout, _stats_json, _strerror, _version)
from .async_calls import _AsyncCalls
from .datatypes import TIER_HOST
from .errors import Closed, InvalidArgument, StateError, TimedOut, _raise
from .keys import _checks_array, _keys_array
from .leases import ReadLease, WriteLease


def purge_layouts(socket_path, layouts, timeout_ms=None):
    """Purge the deployment of each of ``layouts`` once (a connection per layout, closed
    after; layouts of one deployment share a purge): ``(blocks, deployments)`` dropped. What
    the adapters' ``clear()`` does."""
    purged, blocks = set(), 0
    for lay in layouts:
        with Client(socket_path, lay, timeout_ms) as c:
            if c.deployment_id in purged:
                continue
            blocks += c.purge()[1]
            purged.add(c.deployment_id)
    return blocks, len(purged)


def version():
    """libkvnode's protocol and library version string."""
    return _s(_version())


def _connect_now(fn, args):
    """A libkvnode connect call on this thread: the handle, or raises its error."""
    h = _P()
    rc = fn(*args, ctypes.byref(h))
    if rc != 0:
        _raise(rc, _s(_connect_error()))
    return h.value


class _ConnectThread:
    """One libkvnode connect on a thread of its own, which a caller may stop waiting for:
    libkvnode bounds a connect by its own timeout (10 s, or $KVNODE_TIMEOUT_MS), not by
    the client's. An abandoned connect that succeeds later is closed by its thread."""

    def __init__(self, fn, args):
        self._fn, self._args = fn, args
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._abandoned = False
        self.rc, self.error, self.handle = 0, "", None
        threading.Thread(target=self._run, name="kvnode-connect", daemon=True).start()

    def _run(self):
        h = _P()
        rc = self._fn(*self._args, ctypes.byref(h))
        error = _s(_connect_error()) if rc != 0 else ""   # thread-local in libkvnode
        with self._lock:
            self.rc, self.error = rc, error
            if rc == 0 and self._abandoned:
                _close(h.value)
            elif rc == 0:
                self.handle = h.value
            self._done.set()

    def wait(self, timeout_s):
        """True when the connect has ended (rc, error, handle are set); False after
        timeout_s, and the connect is then abandoned (closed by its thread if it succeeds)."""
        if self._done.wait(timeout_s):
            return True
        with self._lock:
            if self._done.is_set():
                return True
            self._abandoned = True
            return False


def _connect_within(fn, args, timeout_ms, socket_path):
    """A libkvnode connect that the calling thread waits for at most timeout_ms."""
    attempt = _ConnectThread(fn, args)
    if not attempt.wait(timeout_ms / 1000.0):
        where = socket_path or os.environ.get("KVNODE_SOCKET") or "/run/kvnode/kvnode.sock"
        raise TimedOut(TimedOut.CODE, "connect %s: kvnoded did not answer within timeout_ms=%d"
                       % (where, timeout_ms), _s(_strerror(-TimedOut.CODE)))
    if attempt.rc != 0:
        _raise(attempt.rc, attempt.error)
    return attempt.handle


class Client(_AsyncCalls):
    """A connection to kvnoded bound to the namespace of ``layout``.

    ``socket_path`` None means ``$KVNODE_SOCKET`` or ``/run/kvnode/kvnode.sock``.
    ``layout`` None gives an observer client that may only call :meth:`stats`.
    ``timeout_ms`` sets the per-call timeout (default: libkvnode's, 10 s, or
    ``$KVNODE_TIMEOUT_MS``); it bounds the connect too: the constructor raises
    :class:`TimedOut` when kvnoded has not answered within it (the connect then goes on
    on a thread of the binding, and is closed if it ever succeeds).
    ``reader`` True declares a client that only reads (``KVNODE_CONNECT_READER``):
    the daemon lends it memory read-only (a write through a view of
    :meth:`read` cannot happen: the views are read-only and the mapping
    faults), and :meth:`write`, :meth:`put` and :meth:`delete` raise
    :class:`Denied`. :attr:`reader` says whether the daemon granted it.
    ``cuda_device`` (an ordinal; default -1, none) declares the engine's GPU: the daemon
    may then lend it GPU memory, and ``get_batch`` / ``put_batch`` / ``submit_get`` /
    ``submit_put`` with ``device=True`` copy to and from device pointers (needs a CUDA
    runtime in the process). Such a client's blocks may be device memory, which a
    memoryview cannot show: :meth:`read` and :meth:`write` raise :class:`StateError` on it.
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, socket_path=None, layout=None, timeout_ms=None, reader=False,
                 cuda_device=-1):
        self.layout = layout
        self._c = None
        if not isinstance(cuda_device, int) or cuda_device < -1:
            raise ValueError("cuda_device must be a CUDA device ordinal or -1 (none), not %r"
                             % (cuda_device,))
        #: The CUDA device this client declared (-1: none); see the class docstring.
        self.cuda_device = cuda_device
        self._init_tickets()
        self._block_bytes = 0
        self._clayout = layout._to_c() if layout is not None else None
        sp = os.fsencode(socket_path) if socket_path is not None else None
        lp = ctypes.byref(self._clayout) if self._clayout is not None else None
        revision = getattr(layout, "revision", None) if layout is not None else None
        if revision:
            if _connect_revision is None:
                raise InvalidArgument(InvalidArgument.CODE, "Layout(revision=...) needs a libkvnode "
                                      "with kvnode_connect_revision (KVNODE_0.7); %s has none"
                                      % _lib_path, "invalid argument")
            fn, args = _connect_revision, (sp, lp, str(revision).encode(), cuda_device,
                                           _CONNECT_READER if reader else 0)
        elif reader:
            if _connect_flags is None:
                raise InvalidArgument(InvalidArgument.CODE, "reader=True needs a libkvnode with "
                                      "kvnode_connect_flags; %s has none" % _lib_path,
                                      "invalid argument")
            fn, args = _connect_flags, (sp, lp, cuda_device, _CONNECT_READER)
        else:
            fn, args = _connect_device, (sp, lp, cuda_device)
        if timeout_ms is not None and int(timeout_ms) > 0:
            self._c = _connect_within(fn, args, int(timeout_ms), socket_path)
        else:
            self._c = _connect_now(fn, args)
        self._block_bytes = int(_block_bytes(self._c))
        if timeout_ms is not None:
            _set_timeout(self._c, int(timeout_ms))

    def _handle(self):
        if not self._c:
            raise Closed(Closed.CODE, "the client was closed", "client closed")
        return self._c

    def _check(self, rc):
        if rc != 0:
            _raise(rc, _s(_last_error(self._c)))

    def close(self):
        """Disconnect (the daemon ends this client's outstanding leases). Idempotent.

        Tickets not yet drained complete and are dropped; their pages are released."""
        if self._c:
            _close(self._c)
            self._c = None
        self._drop_tickets()

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

    @property
    def reader(self):
        """True when the daemon holds this client to reading (``reader=True`` was granted)."""
        h = self._handle()
        return bool(_is_reader(h)) if _is_reader is not None else False

    def _need_prefault(self):
        if _prefault is None:
            raise InvalidArgument(InvalidArgument.CODE, "prefault needs a libkvnode with "
                                  "kvnode_prefault; %s has none" % _lib_path, "invalid argument")

    def prefault(self, wait=False):
        """Populate this process's mapping of the host tier (``kvnode_prefault``), so
        that the first reads and writes over it take no page faults.

        Runs on a background thread owned by the client (stopped by :meth:`close`);
        ``wait`` True returns when it has ended. See libkvnode(3) for when it pays.
        """
        self._need_prefault()
        self._check(_prefault(self._handle(), _PREFAULT_WAIT if wait else 0))

    def prefault_progress(self):
        """``(done_bytes, total_bytes, ended)`` of :meth:`prefault` (``(0, 0, False)``
        before it was called); raises :class:`IOFailure` when the walk failed."""
        self._need_prefault()
        done, total = ctypes.c_uint64(0), ctypes.c_uint64(0)
        rc = _prefault_progress(self._handle(), ctypes.byref(done), ctypes.byref(total))
        if rc < 0:
            _raise(rc, "prefault stopped on an error; prefault(wait=True) names it")
        return done.value, total.value, rc == 1

    @property
    def block_bytes(self):
        """Bytes of one block of this client's namespace (0 for an observer)."""
        self._handle()
        return self._block_bytes

    @property
    def has_check_words(self):
        """True when the daemon honours check words (``kvnode_has_check_words``): calls may
        then pass ``checks`` (see :func:`fold_digests`). False with an older daemon or
        libkvnode, where a call given ``checks`` raises."""
        h = self._handle()
        return bool(_has_check_words(h)) if _has_check_words is not None else False

    def _checked(self, fn, what):
        """The _checked variant fn of a call, or an error naming the library without it."""
        if fn is None:
            raise InvalidArgument(InvalidArgument.CODE, "%s with check words needs a libkvnode "
                                  "with the KVNODE_0.4 calls; %s has none" % (what, _lib_path),
                                  "invalid argument")
        return fn

    def match(self, keys, checks=None):
        """Length of the longest cached prefix of ``keys`` (every tier). ``checks``: one check
        word per key (see :func:`fold_digests`); a block stored with another word is a miss."""
        arr, n = _keys_array(keys)
        if checks is None:
            m = _SIZE(0)
            self._check(_match(self._handle(), arr, n, ctypes.byref(m)))
            return m.value
        t = _CTiers()
        self._check(self._checked(_match_checked, "match")(
            self._handle(), arr, _checks_array(checks, n), n, ctypes.byref(t)))
        return t.matched

    def delete(self, keys, checks=None):
        """Remove ``keys``; return how many were deleted. With ``checks``, a block stored
        with another check word is not deleted."""
        arr, n = _keys_array(keys)
        d = _SIZE(0)
        if checks is None:
            self._check(_delete(self._handle(), arr, n, ctypes.byref(d)))
        else:
            self._check(self._checked(_delete_checked, "delete")(
                self._handle(), arr, _checks_array(checks, n), n, ctypes.byref(d)))
        return d.value

    @property
    def deployment_id(self):
        """The deployment id of this client's namespace (``<model>-<fingerprint hex>``), ""
        for an observer."""
        h = self._handle()
        return _s(_deployment_id(h)) if _deployment_id is not None else ""

    def purge(self, deployment_id=None, model=None, tenant=None):
        """Drop every block of a deployment from the daemon's host memory, GPU memory and
        persistent store (``kvnode_purge``): ``deployment_id`` names one (every TP rank of it),
        ``model`` every deployment of that model (any layout, any revision), neither this
        client's own deployment. ``tenant`` (None: this client's) may name another tenant only
        from an observer client of root or the daemon's user (else :class:`Denied`).

        Returns ``(namespaces, blocks)`` purged, once memory is cleared and the store has
        carried out the deletes. A block leased to a reader stays readable until that lease
        ends; a put begun before the purge and committed after it stores nothing."""
        if _purge is None:
            raise InvalidArgument(InvalidArgument.CODE, "purge needs a libkvnode with kvnode_purge "
                                  "(KVNODE_0.7); %s has none" % _lib_path, "invalid argument")
        ns, blocks = ctypes.c_uint32(0), ctypes.c_uint64(0)
        enc = (lambda v: v.encode() if v else None)
        self._check(_purge(self._handle(), enc(tenant), enc(deployment_id), enc(model),
                           ctypes.byref(ns), ctypes.byref(blocks)))
        return ns.value, blocks.value

    def stats(self):
        """The daemon's statistics, parsed from its JSON document."""
        p = _P()
        self._check(_stats_json(self._handle(), ctypes.byref(p)))
        try:
            return json.loads(ctypes.string_at(p.value).decode("utf-8"))
        finally:
            _free(p.value)

    def _need_host_views(self, what):
        if self.cuda_device >= 0:
            raise StateError(StateError.CODE, "%s gives memoryviews, and a client that declared "
                             "CUDA device %d may be lent GPU memory; use get_batch/put_batch "
                             "(device=True for device pages) or a client without cuda_device"
                             % (what, self.cuda_device), "operation not valid now")

    def read(self, keys, checks=None):
        """Zero-copy read: ``with client.read(keys) as blocks:``.

        ``blocks`` is a list of read-only memoryviews (format ``'B'``, one per
        block of the longest cached prefix) over the daemon's shared memory;
        ``numpy.frombuffer`` / ``torch.frombuffer`` wrap them without a copy.
        The lease ends when the block exits; a view used afterwards raises
        ``ValueError``. Arrays wrapping a view (``numpy.frombuffer``) are not
        invalidated: drop or copy them inside the block (see :class:`LeaseEnded`).
        ``checks``: check words, as for :meth:`match`.
        """
        self._need_host_views("read")
        return ReadLease(self, keys, checks)

    def write(self, keys, tier=TIER_HOST, checks=None):
        """Zero-copy write: ``with client.write(keys) as slots:``.

        ``slots[i]`` is a writable memoryview of :attr:`block_bytes` bytes for
        ``keys[i]``, or ``None`` when that key is already stored. Fill every
        slot; a normal exit commits, an exception aborts. ``tier`` is
        :data:`TIER_HOST` or :data:`TIER_HBM` (falls back to host). ``checks``:
        the blocks' check words (stored with them; see :func:`fold_digests`).
        """
        self._need_host_views("write")
        return WriteLease(self, keys, tier, checks)

    def get(self, keys, checks=None, inline=False):
        """Copy out the longest cached prefix of ``keys``: a list of ``bytes``. ``inline``
        True has the bytes travel in the messages (``kvnode_get_inline``) instead of
        through shared memory. ``checks``: check words, as for :meth:`match`."""
        arr, n = _keys_array(keys)
        bb = self.block_bytes
        bufs = [ctypes.create_string_buffer(bb) for _ in range(n)]
        ptrs = (_P * max(n, 1))(*[ctypes.addressof(b) for b in bufs])
        got = _SIZE(0)
        h = self._handle()
        if checks is None:
            rc = (_get_inline if inline else _get)(h, arr, n, ptrs, ctypes.byref(got))
        elif inline:
            rc = self._checked(_get_inline_checked, "get")(h, arr, _checks_array(checks, n), n,
                                                           ptrs, ctypes.byref(got))
        else:
            rc = self._checked(_get_batch_checked, "get")(h, arr, _checks_array(checks, n), n,
                                                          ptrs, 0, ctypes.byref(got))
        self._check(rc)
        return [bufs[i].raw for i in range(got.value)]

    def put(self, keys, blocks, checks=None, inline=False):
        """Store ``blocks[i]`` (bytes-like, :attr:`block_bytes` bytes each) under ``keys[i]``.

        Keys already stored are left as they are. ``inline`` and ``checks`` as for :meth:`get`.
        """
        arr, n = _keys_array(keys)
        blocks = list(blocks)
        if n != len(blocks):
            raise ValueError("put: %d keys but %d blocks" % (n, len(blocks)))
        bb = self.block_bytes
        keep = []
        for i, b in enumerate(blocks):
            mv = memoryview(b).cast("B")
            if mv.nbytes != bb:
                raise ValueError("put: block %d has %d bytes, the layout's block_bytes is %d"
                                 % (i, mv.nbytes, bb))
            keep.append(ctypes.create_string_buffer(mv.tobytes(), bb))
        ptrs = (_P * max(n, 1))(*[ctypes.addressof(b) for b in keep])
        h = self._handle()
        if checks is None:
            rc = (_put_inline if inline else _put)(h, arr, n, ptrs)
        elif inline:
            rc = self._checked(_put_inline_checked, "put")(h, arr, _checks_array(checks, n), n,
                                                           ptrs)
        else:
            rc = self._checked(_put_batch_checked, "put")(h, arr, _checks_array(checks, n), n,
                                                          ptrs, 0)
        self._check(rc)
