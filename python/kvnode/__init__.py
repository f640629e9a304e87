"""Python binding of libkvnode, the client library of kvnoded (node-local KV-cache daemon).

Stdlib only (``ctypes``), no build step: the package loads ``libkvnode.so.0`` at import
time: ``$KVNODE_LIBRARY``, else the source tree next to the package (``build/`` of the
repository), else the ``lib/`` that ``make install`` put it beside, else the system loader.
``pip install ./python`` installs it as a package.

Typical use from an inference engine (``kv_pages``: its host copies of the KV pages, one
numpy array of ``block_bytes`` bytes per block)::

    import numpy
    import kvnode

    layout = kvnode.Layout(model="qwen2-7b", dtype="bf16", block_tokens=16,
                           block_bytes=2 * 28 * 4 * 128 * 16 * 2,
                           num_layers=28, kv_heads=4, head_dim=128)
    with kvnode.Client("/run/kvnode/kvnode.sock", layout) as c:
        keys = kvnode.hash_tokens(prompt_token_ids, layout.block_tokens)
        with c.read(keys) as blocks:          # longest cached prefix, zero-copy
            for i, view in enumerate(blocks):
                kv_pages[i][:] = numpy.frombuffer(view, dtype=kv_pages[i].dtype)  # copy out
        ...
        with c.write(new_keys) as slots:      # zero-copy slots, None = already stored
            for slot, page in zip(slots, new_pages):
                if slot is not None:          # a slot is bytes: view it as the page's dtype
                    numpy.frombuffer(slot, dtype=page.dtype)[:] = page
                                              # commit on normal exit, abort on exception

The keys of one call form a chain (``keys[i-1]`` is the parent of ``keys[i]``);
``match``, ``read`` and ``get`` answer with the longest cached prefix.

A :class:`Client` may be used from several threads at once (libkvnode pipelines
their requests over the one connection), except :meth:`Client.close`,
:meth:`Client.prefault` and the ``with`` blocks' lease bookkeeping of one lease.

Asynchronous calls (``submit_match``, ``submit_get``, ``submit_put``,
``submit_delete``) return a ticket at once; :meth:`Client.drain` collects the
:class:`Completion` of finished ones without blocking, and :attr:`Client.event_fd`
polls readable while some wait::

    t = c.submit_get(keys, pages)             # pages: writable buffers or addresses
    select.select([c.event_fd], [], [])
    for done in c.drain():
        ...                                   # done.ticket, done.count, done.error
"""

import ctypes
import dataclasses
import hashlib
import json
import os
import struct
import threading

#: Version of this package; equals the kvnode release it belongs to (Makefile VERSION).
__version__ = "0.1.0"

__all__ = [
    "Layout", "Client", "ReadLease", "WriteLease", "hash_tokens", "fold_key", "fold_keys", "version", "library_path",
    "__version__",
    "TIER_HOST", "TIER_HBM",
    "Error", "InvalidArgument", "OutOfMemory", "NoSpace", "NoLease", "LayoutError",
    "VersionError", "ProtocolError", "TooBig", "TimedOut", "ConnectError", "Closed",
    "IOFailure", "StateError", "LimitReached", "Denied", "InternalError", "ShuttingDown",
    "LeaseEnded", "Completion", "Tiers", "RemoteMatch",
    "OP_MATCH", "OP_GET", "OP_PUT", "OP_DELETE",
]

#: Host-memory tier (``KVNODE_TIER_HOST``).
TIER_HOST = 1
#: GPU-memory tier (``KVNODE_TIER_HBM``).
TIER_HBM = 2


# ---------------------------------------------------------------- errors

class Error(Exception):
    """A failed libkvnode call.

    ``code`` is the positive ``KVNODE_E*`` number, ``name`` the library's short
    description of it (``kvnode_strerror``), ``message`` the daemon's (or
    library's) message for the failure (``kvnode_last_error``).
    """

    #: KVNODE_E* code of this class (0 for the base class).
    CODE = 0

    def __init__(self, code, message="", name=""):
        self.code = code
        self.message = message
        self.name = name
        text = name or "kvnode error %d" % code
        if message:
            text = "%s: %s" % (text, message)
        super().__init__(text)


class InvalidArgument(Error):
    """KVNODE_EINVAL: invalid argument or request."""
    CODE = 1


class OutOfMemory(Error):
    """KVNODE_ENOMEM: out of memory (process)."""
    CODE = 2


class NoSpace(Error):
    """KVNODE_ENOSPC: tier full, nothing evictable."""
    CODE = 3


class NoLease(Error):
    """KVNODE_ENOLEASE: unknown, expired or foreign lease."""
    CODE = 4


class LayoutError(Error):
    """KVNODE_ELAYOUT: layout invalid or conflicts with a registered one."""
    CODE = 5


class VersionError(Error):
    """KVNODE_EVERSION: no common protocol version."""
    CODE = 6


class ProtocolError(Error):
    """KVNODE_EPROTO: malformed frame or message."""
    CODE = 7


class TooBig(Error):
    """KVNODE_ETOOBIG: frame, key count or block over a limit."""
    CODE = 8


class TimedOut(Error):
    """KVNODE_ETIMEDOUT: the call's timeout passed."""
    CODE = 9


class ConnectError(Error):
    """KVNODE_ECONNECT: cannot connect to the daemon."""
    CODE = 10


class Closed(Error):
    """KVNODE_ECLOSED: the daemon closed the connection (or the client was closed)."""
    CODE = 11


class IOFailure(Error):
    """KVNODE_EIO: a system call failed."""
    CODE = 12


class StateError(Error):
    """KVNODE_ESTATE: operation not valid now."""
    CODE = 13


class LimitReached(Error):
    """KVNODE_ELIMIT: a per-client limit was reached."""
    CODE = 14


class Denied(Error):
    """KVNODE_EDENIED: refused by access control."""
    CODE = 15


class InternalError(Error):
    """KVNODE_EINTERNAL: daemon bug, please report."""
    CODE = 16


class ShuttingDown(Error):
    """KVNODE_ESHUTDOWN: the daemon is shutting down."""
    CODE = 17


class LeaseEnded(Error):
    """A view still had a buffer exported directly from it when its lease ended.

    Raised on leaving a ``with`` block when a yielded memoryview could not be
    released because some object still holds a buffer on it (for example a
    ``struct.iter_unpack`` iterator). A read lease is ended anyway;
    a write lease is aborted. Such objects must not be used afterwards.

    Not every wrapper is detected: ``numpy.frombuffer`` takes its own view of
    the memory, so an array made from a yielded view must be dropped or copied
    inside the ``with`` block; after it the memory may be reused by the daemon.
    """
    CODE = 4


_ERRORS = {cls.CODE: cls for cls in (
    InvalidArgument, OutOfMemory, NoSpace, NoLease, LayoutError, VersionError, ProtocolError,
    TooBig, TimedOut, ConnectError, Closed, IOFailure, StateError, LimitReached, Denied,
    InternalError, ShuttingDown)}


from ._lib import (  # the ctypes layer (kvnode/_lib.py)
    OP_DELETE, OP_GET, OP_MATCH, OP_PUT, _BATCH_DEVICE, _CCompletion, _CLayout, _CLoc,
    _CONNECT_READER, _CRemoteMatch, _CTiers, _HAVE_ASYNC, _LEASE, _P,
    _PREFAULT_WAIT, _SIZE, _TICKET, _block_bytes, _cancel,
    _close, _connect_device, _connect_error, _connect_flags, _delete, _drain,
    _event_fd, _free, _get, _get_batch, _get_begin, _get_end, _hash, _is_reader,
    _last_error, _lib_path, _match, _match_remote, _match_tiers,
    _pending, _prefault, _prefault_progress, _put, _put_abort, _put_batch,
    _put_begin, _put_commit, _set_timeout, _stats_json, _strerror, _submit_delete, _submit_get,
    _submit_match, _submit_put, _version, _view, library_path,
)

def _s(b):
    return b.decode("utf-8", "replace") if b else ""


def _raise(rc, message):
    code = -rc
    cls = _ERRORS.get(code, Error)
    raise cls(code, message, _s(_strerror(rc)))


def _keys_array(keys):
    keys = list(keys)
    arr = (ctypes.c_int64 * max(len(keys), 1))(*keys)
    return arr, len(keys)


def fold_key(key):
    """kvnode's 64-bit key for a foreign key (an engine's digest string or bytes):
    deterministic across processes and machines. A hex digest (at least 16 hex
    digits, as SGLang's chained SHA-256 keys) gives its first 64 bits; any other
    string or bytes the first 64 bits of its SHA-256. Two keys whose 64 bits agree
    would read each other's block: with random digests about n**2 / 2**65 for n
    stored blocks (kvnode's per-key check word, issue 19 item 2, is not built yet)."""
    if isinstance(key, str):
        # isascii + isalnum leave int() only hex digits to accept (or reject), bar "0x"
        if (len(key) >= 16 and len(key) % 2 == 0 and key.isascii() and key.isalnum()
                and key[1] not in "xX"):
            try:
                value = int(key, 16) >> (4 * (len(key) - 16))
                return value - (1 << 64) if value >= (1 << 63) else value
            except ValueError:
                pass
        key = key.encode("utf-8")
    digest = hashlib.sha256(bytes(key)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


_FOLD64 = {}


def fold_keys(keys):
    """``[fold_key(k) for k in keys]``, faster for the common batch of SHA-256 hex digests
    (one hex decode and one unpack for the whole batch)."""
    keys = list(keys)
    n = len(keys)
    if n and all(type(k) is str and len(k) == 64 for k in keys):
        try:
            raw = bytes.fromhex("".join(keys))
        except ValueError:
            raw = b""
        if len(raw) == 32 * n and all(k[1] not in "xX" for k in keys):
            fmt = _FOLD64.get(n)
            if fmt is None:
                fmt = _FOLD64[n] = struct.Struct(">" + "q24x" * n)
            return list(fmt.unpack(raw))
    sha256, from_bytes, out = hashlib.sha256, int.from_bytes, []
    for k in keys:      # fold_key inlined for plain strings (LMCache's keys): half the time
        if type(k) is str and not (len(k) >= 16 and k.isascii() and k.isalnum()):
            out.append(from_bytes(sha256(k.encode("utf-8")).digest()[:8], "big", signed=True))
        else:
            out.append(fold_key(k))
    return out


def version():
    """libkvnode's protocol and library version string."""
    return _s(_version())


def hash_tokens(token_ids, block_tokens):
    """Block keys of a token sequence: the rtp-llm / KVCM chained hash of libkvnode.

    One key (a signed 64-bit int) per *full* block of ``block_tokens`` tokens;
    a trailing partial block gets no key.
    """
    if block_tokens <= 0:
        raise ValueError("block_tokens must be > 0")
    toks = list(token_ids)
    n = len(toks)
    nkeys = n // block_tokens
    if nkeys == 0:
        return []
    t = (ctypes.c_int64 * n)(*toks)
    k = (ctypes.c_int64 * nkeys)()
    got = _hash(t, n, block_tokens, k, nkeys)
    return list(k[:got])


# ---------------------------------------------------------------- layout

@dataclasses.dataclass(frozen=True)
class Layout:
    """The KV-cache layout of one engine rank (mirrors ``kvnode_layout``).

    Clients with the same layout share a namespace in the daemon.
    ``block_bytes`` is the size of one block as held by this rank.
    """

    model: str
    dtype: str
    block_tokens: int
    block_bytes: int
    num_layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    tp_size: int = 1
    tp_rank: int = 0
    extra: str = None

    def _to_c(self):
        return _CLayout(
            self.model.encode(), self.dtype.encode(), self.block_tokens, self.block_bytes,
            self.num_layers, self.kv_heads, self.head_dim, self.tp_size, self.tp_rank,
            self.extra.encode() if self.extra is not None else None)


# ---------------------------------------------------------------- leases

class ReadLease:
    """Context manager returned by :meth:`Client.read`.

    Entering pins the longest cached prefix of the keys and yields a list of
    read-only ``memoryview`` objects, one per block. Leaving releases the views
    (using one afterwards raises ``ValueError``) and ends the lease.
    """

    def __init__(self, client, keys):
        self._client = client
        self._keys = keys
        self._lease = 0
        self._views = []

    def __enter__(self):
        c = self._client
        arr, n = _keys_array(self._keys)
        locs = (_CLoc * max(n, 1))()
        lease = _LEASE(0)
        got = _SIZE(0)
        c._check(_get_begin(c._handle(), arr, n, ctypes.byref(lease), locs, ctypes.byref(got)))
        self._lease = lease.value
        bb = c.block_bytes
        self._views = [_view(locs[i].ptr, bb, False) for i in range(got.value)]
        return list(self._views)

    def __exit__(self, exc_type, exc, tb):
        exported = _release_all(self._views)
        self._views = []
        lease, self._lease = self._lease, 0
        if lease:
            rc = _get_end(self._client._handle(), lease)
            if rc != 0 and exc_type is None:
                self._client._check(rc)
        if exported and exc_type is None:
            raise LeaseEnded(LeaseEnded.CODE, "%d view(s) still had a buffer exported when the "
                             "read lease ended; drop or copy such objects inside the with block"
                             % exported, "lease ended")
        return False


class WriteLease:
    """Context manager returned by :meth:`Client.write`.

    Entering reserves a slot per key and yields a list with a writable
    ``memoryview`` per key, or ``None`` for keys already stored. Leaving
    normally commits (the blocks become visible); leaving by an exception
    aborts (nothing becomes visible). The views are released either way.
    """

    def __init__(self, client, keys, tier):
        self._client = client
        self._keys = keys
        self._tier = tier
        self._lease = 0
        self._views = []

    def __enter__(self):
        c = self._client
        arr, n = _keys_array(self._keys)
        locs = (_CLoc * max(n, 1))()
        lease = _LEASE(0)
        c._check(_put_begin(c._handle(), arr, n, self._tier, ctypes.byref(lease), locs))
        self._lease = lease.value
        bb = c.block_bytes
        self._views = [_view(locs[i].ptr, bb, True) if locs[i].ptr else None for i in range(n)]
        return list(self._views)

    def __exit__(self, exc_type, exc, tb):
        exported = _release_all(self._views)
        self._views = []
        lease, self._lease = self._lease, 0
        if not lease:
            return False
        h = self._client._handle()
        if exc_type is not None or exported:
            rc = _put_abort(h, lease)
            if exc_type is None:
                self._client._check(rc)
                raise LeaseEnded(LeaseEnded.CODE, "%d slot view(s) were still exported when the "
                                 "write lease ended; the write was aborted" % exported,
                                 "lease ended")
            return False
        self._client._check(_put_commit(h, lease))
        return False


def _release_all(views):
    """Release every view; return how many could not be released (still exported)."""
    exported = 0
    for v in views:
        if v is None:
            continue
        try:
            v.release()
        except BufferError:
            exported += 1
    return exported


# ---------------------------------------------------------------- pages by address

class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", _P), ("obj", _P), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p), ("shape", _P),
                ("strides", _P), ("suboffsets", _P), ("internal", _P)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.restype = ctypes.c_int
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.restype = None
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_PyBUF_SIMPLE, _PyBUF_WRITABLE = 0, 1


class _Pages:
    """The addresses of a batch's pages, with the buffers exported from the
    caller's objects held (so they cannot be resized or freed) until release().

    A page is an int (an address: the caller keeps the memory valid), an
    object with ``data_ptr()`` (a torch tensor: its storage must be contiguous
    and stay alive), or any C-contiguous buffer (bytes, bytearray, memoryview,
    numpy array) of at least ``block_bytes`` bytes, writable when ``writable``.
    """

    def __init__(self, pages, n, block_bytes, writable, device):
        pages = list(pages)
        if len(pages) != n:
            raise ValueError("%d keys but %d pages: give one page per key" % (n, len(pages)))
        self._held = []
        self.objects = pages
        self.array = (_P * max(n, 1))()
        try:
            for i, page in enumerate(pages):
                self.array[i] = self._address(i, page, block_bytes, writable, device)
        except BaseException:
            self.release()
            raise

    def _address(self, i, page, block_bytes, writable, device):
        if isinstance(page, int):
            if page <= 0:
                raise ValueError("page %d: address %d is not a pointer" % (i, page))
            return page
        data_ptr = getattr(page, "data_ptr", None)
        if callable(data_ptr):
            nbytes = page.numel() * page.element_size() if hasattr(page, "numel") else None
            if nbytes is not None and nbytes < block_bytes:
                raise ValueError("page %d has %d bytes, a block is %d" % (i, nbytes, block_bytes))
            return int(data_ptr())
        if device:
            raise ValueError("page %d: device=True takes device addresses (int) or tensors with "
                             "data_ptr(), not %s" % (i, type(page).__name__))
        view = _PyBuffer()
        flags = _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE
        try:
            _get_buffer(page, ctypes.byref(view), flags)
        except (BufferError, TypeError) as e:
            raise ValueError("page %d (%s) is not a %scontiguous buffer: %s"
                             % (i, type(page).__name__, "writable " if writable else "", e)) from None
        self._held.append(view)
        if view.len < block_bytes:
            raise ValueError("page %d has %d bytes, a block is %d" % (i, view.len, block_bytes))
        return view.buf

    def release(self):
        held, self._held = self._held, []
        for view in held:
            _release_buffer(ctypes.byref(view))


@dataclasses.dataclass(frozen=True)
class Completion:
    """A finished asynchronous call, as :meth:`Client.drain` returns it.

    ``count``: MATCH the prefix matched, GET the blocks copied (a prefix), PUT
    the blocks stored, DELETE the keys deleted. ``error`` is None on success,
    else the :class:`Error` (subclass) the call would have raised.
    """

    ticket: int
    op: int
    count: int
    error: Error = None

    @property
    def ok(self):
        return self.error is None


@dataclasses.dataclass(frozen=True)
class Tiers:
    """Where a matched prefix is (:meth:`Client.match_tiers`)."""

    matched: int
    hbm: int
    host: int
    store: int


@dataclasses.dataclass(frozen=True)
class RemoteMatch:
    """:meth:`Client.match_remote`: the local prefix and peers' (host:port, matched), best first.
    ``remote_ok`` False means the KV Cache Manager was not asked or did not answer (``why``)."""

    matched: int
    remote_ok: bool
    why: str
    peers: list


def _error(rc, message):
    return _ERRORS.get(-rc, Error)(-rc, message, _s(_strerror(rc)))


# ---------------------------------------------------------------- client

class Client:
    """A connection to kvnoded bound to the namespace of ``layout``.

    ``socket_path`` None means ``$KVNODE_SOCKET`` or ``/run/kvnode/kvnode.sock``.
    ``layout`` None gives an observer client that may only call :meth:`stats`.
    ``timeout_ms`` sets the per-call timeout (default: libkvnode's, 10 s).
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
        # ticket -> (keys array, _Pages or None): what libkvnode points at until completion.
        self._inflight = {}
        self._inflight_lock = threading.Lock()
        self._clayout = layout._to_c() if layout is not None else None
        h = _P()
        sp = os.fsencode(socket_path) if socket_path is not None else None
        lp = ctypes.byref(self._clayout) if self._clayout is not None else None
        if reader:
            if _connect_flags is None:
                raise InvalidArgument(InvalidArgument.CODE, "reader=True needs a libkvnode with "
                                      "kvnode_connect_flags; %s has none" % _lib_path,
                                      "invalid argument")
            rc = _connect_flags(sp, lp, cuda_device, _CONNECT_READER, ctypes.byref(h))
        else:
            rc = _connect_device(sp, lp, cuda_device, ctypes.byref(h))
        if rc != 0:
            _raise(rc, _s(_connect_error()))
        self._c = h.value
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
        inflight = getattr(self, "_inflight", None)
        if inflight:
            for _, pages in list(inflight.values()):
                if pages is not None:
                    pages.release()
            inflight.clear()

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
        return int(_block_bytes(self._handle()))

    def match(self, keys):
        """Length of the longest cached prefix of ``keys`` (every tier)."""
        arr, n = _keys_array(keys)
        m = _SIZE(0)
        self._check(_match(self._handle(), arr, n, ctypes.byref(m)))
        return m.value

    def delete(self, keys):
        """Remove ``keys``; return how many were deleted."""
        arr, n = _keys_array(keys)
        d = _SIZE(0)
        self._check(_delete(self._handle(), arr, n, ctypes.byref(d)))
        return d.value

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

    def read(self, keys):
        """Zero-copy read: ``with client.read(keys) as blocks:``.

        ``blocks`` is a list of read-only memoryviews (format ``'B'``, one per
        block of the longest cached prefix) over the daemon's shared memory;
        ``numpy.frombuffer`` / ``torch.frombuffer`` wrap them without a copy.
        The lease ends when the block exits; a view used afterwards raises
        ``ValueError``. Arrays wrapping a view (``numpy.frombuffer``) are not
        invalidated: drop or copy them inside the block (see :class:`LeaseEnded`).
        """
        self._need_host_views("read")
        return ReadLease(self, list(keys))

    def write(self, keys, tier=TIER_HOST):
        """Zero-copy write: ``with client.write(keys) as slots:``.

        ``slots[i]`` is a writable memoryview of :attr:`block_bytes` bytes for
        ``keys[i]``, or ``None`` when that key is already stored. Fill every
        slot; a normal exit commits, an exception aborts. ``tier`` is
        :data:`TIER_HOST` or :data:`TIER_HBM` (falls back to host).
        """
        self._need_host_views("write")
        return WriteLease(self, list(keys), tier)

    def get(self, keys):
        """Copy out the longest cached prefix of ``keys``: a list of ``bytes``."""
        arr, n = _keys_array(keys)
        bb = self.block_bytes
        bufs = [ctypes.create_string_buffer(bb) for _ in range(n)]
        ptrs = (_P * max(n, 1))(*[ctypes.addressof(b) for b in bufs])
        got = _SIZE(0)
        self._check(_get(self._handle(), arr, n, ptrs, ctypes.byref(got)))
        return [bufs[i].raw for i in range(got.value)]

    def put(self, keys, blocks):
        """Store ``blocks[i]`` (bytes-like, :attr:`block_bytes` bytes each) under ``keys[i]``.

        Keys already stored are left as they are.
        """
        keys = list(keys)
        blocks = list(blocks)
        if len(keys) != len(blocks):
            raise ValueError("put: %d keys but %d blocks" % (len(keys), len(blocks)))
        bb = self.block_bytes
        keep = []
        for i, b in enumerate(blocks):
            mv = memoryview(b).cast("B")
            if mv.nbytes != bb:
                raise ValueError("put: block %d has %d bytes, the layout's block_bytes is %d"
                                 % (i, mv.nbytes, bb))
            keep.append(ctypes.create_string_buffer(mv.tobytes(), bb))
        arr, n = _keys_array(keys)
        ptrs = (_P * max(n, 1))(*[ctypes.addressof(b) for b in keep])
        self._check(_put(self._handle(), arr, n, ptrs))

    # ------------------------------------------------------------ batched, asynchronous

    def _need_async(self, what):
        if not _HAVE_ASYNC:
            raise InvalidArgument(InvalidArgument.CODE, "%s needs a libkvnode with the KVNODE_0.3 "
                                  "calls; %s has none" % (what, _lib_path), "invalid argument")
        return self._handle()

    def match_tiers(self, keys):
        """:meth:`match` that also says where the matched blocks are: a :class:`Tiers`."""
        h = self._need_async("match_tiers")
        arr, n = _keys_array(keys)
        t = _CTiers()
        self._check(_match_tiers(h, arr, n, ctypes.byref(t)))
        return Tiers(t.matched, t.hbm, t.host, t.store)

    def match_remote(self, keys, max_hosts=0):
        """The local prefix and which peer nodes hold how much of it (asked of the KV Cache
        Manager): a :class:`RemoteMatch`. KVCM trouble never raises (``remote_ok`` False)."""
        h = self._need_async("match_remote")
        arr, n = _keys_array(keys)
        r = _CRemoteMatch()
        self._check(_match_remote(h, arr, n, int(max_hosts), ctypes.byref(r)))
        peers = [(_s(r.peers[i].host_ip_port), r.peers[i].matched)
                 for i in range(min(r.npeers, 64))]
        return RemoteMatch(r.matched, bool(r.remote_ok), _s(r.why), peers)

    def get_batch(self, keys, pages, device=False):
        """Copy the longest cached prefix of ``keys`` into ``pages`` (one per key: a writable
        buffer, an address, or a tensor) in one call; return how many were copied.
        ``device`` True: the pages are GPU memory of this client's CUDA device."""
        h = self._need_async("get_batch")
        arr, n = _keys_array(keys)
        pg = _Pages(pages, n, self.block_bytes, True, device)
        try:
            got = _SIZE(0)
            self._check(_get_batch(h, arr, n, pg.array, _BATCH_DEVICE if device else 0,
                                   ctypes.byref(got)))
            return got.value
        finally:
            pg.release()

    def put_batch(self, keys, pages, device=False):
        """Store ``pages[i]`` (a buffer, an address or a tensor of :attr:`block_bytes` bytes)
        under ``keys[i]`` in one call; keys already stored are left as they are."""
        h = self._need_async("put_batch")
        arr, n = _keys_array(keys)
        pg = _Pages(pages, n, self.block_bytes, False, device)
        try:
            self._check(_put_batch(h, arr, n, pg.array, _BATCH_DEVICE if device else 0))
        finally:
            pg.release()

    @property
    def event_fd(self):
        """The completion eventfd: readable while :meth:`drain` has something (poll it;
        do not read or close it)."""
        return _event_fd(self._need_async("event_fd"))

    def _submit(self, fn, what, keys, pages=None, writable=False, device=False):
        h = self._need_async(what)
        arr, n = _keys_array(keys)
        pg = None
        if pages is not None:
            pg = _Pages(pages, n, self.block_bytes, writable, device)
        t = _TICKET(0)
        with self._inflight_lock:
            if pg is None:
                rc = fn(h, arr, n, None, ctypes.byref(t))
            else:
                rc = fn(h, arr, n, pg.array, _BATCH_DEVICE if device else 0, None, ctypes.byref(t))
            if rc == 0:
                self._inflight[t.value] = (arr, pg)
        if rc != 0:
            if pg is not None:
                pg.release()
            self._check(rc)
        return t.value

    def submit_match(self, keys):
        """Start a :meth:`match`; return its ticket (the count is the prefix matched)."""
        return self._submit(_submit_match, "submit_match", keys)

    def submit_delete(self, keys):
        """Start a :meth:`delete`; return its ticket (the count is the keys deleted)."""
        return self._submit(_submit_delete, "submit_delete", keys)

    def submit_get(self, keys, pages, device=False):
        """Start a :meth:`get_batch` into ``pages``; return its ticket. The pages must stay
        valid and untouched until the ticket is drained (buffers are held till then)."""
        return self._submit(_submit_get, "submit_get", keys, pages, True, device)

    def submit_put(self, keys, pages, device=False):
        """Start a :meth:`put_batch` from ``pages``; return its ticket (pages held as for
        :meth:`submit_get`)."""
        return self._submit(_submit_put, "submit_put", keys, pages, False, device)

    def drain(self, max_completions=64):
        """The finished tickets, as a list of :class:`Completion`; never blocks (empty
        when none is waiting). The pages of a drained GET/PUT are free to reuse."""
        h = self._need_async("drain")
        out = (_CCompletion * max(int(max_completions), 1))()
        got = _drain(h, out, max(int(max_completions), 1))
        done = []
        for i in range(got):
            c = out[i]
            with self._inflight_lock:
                entry = self._inflight.pop(c.ticket, None)
            if entry is not None and entry[1] is not None:
                entry[1].release()
            err = _error(c.rc, _s(c.error)) if c.rc != 0 else None
            done.append(Completion(c.ticket, c.op, c.count, err))
        return done

    @property
    def pending(self):
        """Tickets submitted and not yet drained."""
        return int(_pending(self._need_async("pending")))

    def cancel(self):
        """End the connection now: every ticket in flight completes with :class:`Closed`
        (drain them), and later calls raise it. :meth:`close` is still needed."""
        _cancel(self._need_async("cancel"))
