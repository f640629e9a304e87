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
import operator
import os
import struct
import threading

#: Version of this package; equals the kvnode release it belongs to (Makefile VERSION).
__version__ = "0.1.0"

__all__ = [
    "Layout", "Client", "ReadLease", "WriteLease", "hash_tokens", "fold_key", "fold_keys", "fold_digests", "prefix", "version", "library_path",
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
    _fold_digests, _fold_text, _has_check_words, _match_checked, _get_begin_checked, _put_begin_checked,
    _get_batch_checked, _put_batch_checked, _get_inline, _put_inline, _get_inline_checked,
    _put_inline_checked, _delete_checked, _submit_match_checked, _submit_delete_checked,
    _submit_get_checked, _submit_put_checked, _get_batch_stream, _put_batch_stream,
)

def _s(b):
    return b.decode("utf-8", "replace") if b else ""


def _raise(rc, message):
    code = -rc
    cls = _ERRORS.get(code, Error)
    raise cls(code, message, _s(_strerror(rc)))


_KEY_TYPES = (ctypes.c_int64, ctypes.c_longlong)
_CHECK_TYPES = (ctypes.c_uint64, ctypes.c_ulonglong)


def _keys_array(keys):
    """keys as (a ctypes int64 array, n). A ctypes array of c_int64 (as :func:`fold_digests`
    gives) goes as it is, without a copy; any other iterable of ints is copied into one."""
    if isinstance(keys, ctypes.Array) and keys._type_ in _KEY_TYPES:
        return keys, len(keys)
    keys = list(keys)
    arr = (ctypes.c_int64 * max(len(keys), 1))(*keys)
    return arr, len(keys)


def _checks_array(checks, n):
    """checks (None, a ctypes c_uint64 array, or n ints) as what a _checked call takes."""
    if checks is None:
        return None
    if not (isinstance(checks, ctypes.Array) and checks._type_ in _CHECK_TYPES):
        checks = list(checks)
        if len(checks) != n:
            raise ValueError("%d keys but %d check words: give one per key" % (n, len(checks)))
        return (ctypes.c_uint64 * max(n, 1))(*checks)
    if len(checks) != n:
        raise ValueError("%d keys but %d check words: give one per key" % (n, len(checks)))
    return checks


def prefix(array, n):
    """The first ``n`` items of a ctypes array (keys or check words) as an array over the
    same memory (no copy): what a call on a prefix of a folded batch takes."""
    if not 0 <= n <= len(array):
        raise ValueError("prefix of %d items of an array of %d" % (n, len(array)))
    return (array._type_ * n).from_buffer(array)


def _hexlike(key):
    """fold_key's test for a hex digest: at least 16 hex digits, an even number."""
    return len(key) >= 16 and len(key) % 2 == 0 and key.isascii() and key.isalnum()


def fold_key(key):
    """kvnode's 64-bit key for a foreign key (an engine's digest string or bytes):
    deterministic across processes and machines. A hex digest (at least 16 hex
    digits, as SGLang's chained SHA-256 keys) gives its first 64 bits; any other
    string or bytes the first 64 bits of its SHA-256. Two keys whose 64 bits agree
    would read each other's block (about n**2 / 2**65 for n stored blocks of random
    digests) unless a check word tells them apart: see :func:`fold_digests`."""
    if isinstance(key, str):
        # isascii + isalnum leave int() only hex digits to accept (or reject), bar "0x"
        if _hexlike(key) and key[1] not in "xX":
            try:
                value = int(key, 16) >> (4 * (len(key) - 16))
                return value - (1 << 64) if value >= (1 << 63) else value
            except ValueError:
                pass
        key = key.encode("utf-8")
    digest = hashlib.sha256(bytes(key)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _digest16(key):
    """16 bytes for one foreign key: fold_key's 64 bits, then those of its check word."""
    if isinstance(key, str):
        if _hexlike(key):
            try:
                raw = bytes.fromhex(key)
            except ValueError:
                raw = None
            if raw is not None:
                if len(raw) >= 16:
                    return raw[:16]
                return raw[:8] + hashlib.sha256(key.encode("ascii")).digest()[8:16]
        key = key.encode("utf-8")
    return hashlib.sha256(bytes(key)).digest()[:16]


def _digests(keys):
    """(digests laid end to end, digest_len) for a list of foreign keys: one hex decode for
    a batch of 64-hex-digit strings (SGLang's keys), else 16 bytes per key (_digest16)."""
    n = len(keys)
    if n and type(keys[0]) is str and len(keys[0]) == 64:
        try:
            joined = "".join(keys)
        except TypeError:           # not all strings
            joined = ""
        if len(joined) == 64 * n and set(map(len, keys)) == {64}:
            try:
                raw = bytes.fromhex(joined)
            except ValueError:      # some key is not hex
                raw = b""
            if len(raw) == 32 * n:  # (fromhex skips whitespace: a key with some is not hex)
                return raw, 32
    return b"".join(map(_digest16, keys)), 16


def fold_digests(keys):
    """Fold a batch of foreign keys (an engine's digest strings or bytes) into kvnode keys
    and check words: ``(keys_array, checks_array)``, a ctypes ``c_int64`` and a ``c_uint64``
    array of ``len(keys)`` items, which every :class:`Client` method taking keys and
    ``checks`` accepts as they are (no conversion; :func:`prefix` cuts them).

    Each key is seen as a digest: a string of 64 hex digits (SGLang's chained SHA-256) is
    its 32 bytes, another hex string of at least 32 digits its first 16 bytes; any other
    string or bytes (LMCache's keys) its SHA-256 (for a hex string of 16 to 31 digits, the
    key part comes from the hex digits and the check part from its SHA-256). The key is the
    digest's first 8 bytes, big-endian, signed (what :func:`fold_key` gives, unchanged since
    before check words); the check word is the next 8 bytes (0 becomes 1: 0 means "no
    word"). A batch of strings is folded in one call into libkvnode (``kvnode_fold_text``),
    without per-key work in Python; bytes keys (or a libkvnode without that call) are hashed
    per key here, then folded by ``kvnode_fold_digests``. A block stored with a word is
    found only with that word: one stored without (by an older daemon or client) is a miss
    for calls that send words.

    With a daemon that honours check words (:attr:`Client.has_check_words`), pass the words
    as ``checks``: two keys whose 64-bit keys collide then miss each other's block instead
    of reading it."""
    if type(keys) is not list:
        keys = list(keys)
    n = len(keys)
    karr, carr = (ctypes.c_int64 * n)(), (ctypes.c_uint64 * n)()
    if n == 0:
        return karr, carr
    if _fold_text is not None:
        # Strings (SGLang's and LMCache's keys): one call folds them all, SHA-256 included.
        try:
            joined = "\0".join(keys)
        except TypeError:           # not all strings
            joined = None
        if joined is not None:      # (0 back: a key holds a NUL, which the C side counts)
            text = joined.encode("utf-8")
            if _fold_text(text, len(text), n, karr, carr) == n:
                return karr, carr
    raw, dlen = _digests(keys)
    if _fold_digests is not None:
        _fold_digests(raw, n, dlen, karr, carr)
        return karr, carr
    fmt = struct.Struct(">qQ%dx" % (dlen - 16))    # libkvnode before KVNODE_0.4
    for i, (k, w) in enumerate(fmt.iter_unpack(raw)):
        karr[i], carr[i] = k, (w or 1)
    return karr, carr


def fold_keys(keys):
    """``[fold_key(k) for k in keys]`` (a list of ints), faster for a batch: see
    :func:`fold_digests`, whose key array the Client methods take without a copy."""
    return list(fold_digests(keys)[0])


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

    def __init__(self, client, keys, checks=None):
        self._client = client
        self._keys, self._n = _keys_array(keys)
        self._checks = _checks_array(checks, self._n)
        self._lease = 0
        self._views = []

    def __enter__(self):
        c = self._client
        arr, n = self._keys, self._n
        locs = (_CLoc * max(n, 1))()
        lease = _LEASE(0)
        got = _SIZE(0)
        if self._checks is None:
            c._check(_get_begin(c._handle(), arr, n, ctypes.byref(lease), locs, ctypes.byref(got)))
        else:
            c._check(c._checked(_get_begin_checked, "read")(
                c._handle(), arr, self._checks, n, ctypes.byref(lease), locs, ctypes.byref(got)))
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

    def __init__(self, client, keys, tier, checks=None):
        self._client = client
        self._keys, self._n = _keys_array(keys)
        self._checks = _checks_array(checks, self._n)
        self._tier = tier
        self._lease = 0
        self._views = []

    def __enter__(self):
        c = self._client
        arr, n = self._keys, self._n
        locs = (_CLoc * max(n, 1))()
        lease = _LEASE(0)
        if self._checks is None:
            c._check(_put_begin(c._handle(), arr, n, self._tier, ctypes.byref(lease), locs))
        else:
            c._check(c._checked(_put_begin_checked, "write")(
                c._handle(), arr, self._checks, n, self._tier, ctypes.byref(lease), locs))
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


_char_from_buffer = ctypes.c_char.from_buffer
_nbytes = operator.attrgetter("nbytes")


class _Pages:
    """The addresses of a batch's pages, with the buffers exported from the
    caller's objects held (so they cannot be resized or freed) until release().

    A page is an int (an address: the caller keeps the memory valid), an
    object with ``data_ptr()`` (a torch tensor: its storage must be contiguous
    and stay alive), or any C-contiguous buffer (bytes, bytearray, memoryview,
    numpy array) of at least ``block_bytes`` bytes, writable when ``writable``.
    """

    def __init__(self, pages, n, block_bytes, writable, device):
        self._held = []
        self._views = None
        if isinstance(pages, ctypes.Array) and pages._type_ is _P:
            # Addresses already in a ctypes void* array: taken as they are, as ints are.
            if len(pages) != n:
                raise ValueError("%d keys but %d pages: give one page per key" % (n, len(pages)))
            self.objects, self.array, self.bare = pages, pages, True
            return
        pages = list(pages)
        if len(pages) != n:
            raise ValueError("%d keys but %d pages: give one page per key" % (n, len(pages)))
        self.objects = pages
        if n and set(map(type, pages)) == {int}:      # addresses (SGLang's page buffers)
            if min(pages) <= 0:
                i = next(i for i, p in enumerate(pages) if p <= 0)
                raise ValueError("page %d: address %d is not a pointer" % (i, pages[i]))
            self.array, self.bare = (_P * n)(*pages), True
            return
        self.bare = False       # objects to keep alive (and buffers held) until released
        if n and set(map(type, pages)) == {memoryview}:
            # LMCache's pages: ctypes views hold them (released with the views), far cheaper
            # than a buffer request per page; read-only ones take the general way below.
            try:
                self._views = list(map(_char_from_buffer, pages))
            except TypeError:       # read-only or not contiguous
                self._views = None
            if self._views is not None:
                short = [i for i, nb in enumerate(map(_nbytes, pages)) if nb < block_bytes]
                if short:
                    self.release()
                    raise ValueError("page %d has %d bytes, a block is %d"
                                     % (short[0], pages[short[0]].nbytes, block_bytes))
                self.array = (_P * n)(*map(ctypes.addressof, self._views))
                return
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
        self._views = None      # (the ctypes views' buffers go with them)
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
        # ticket -> _Pages of a GET/PUT whose page objects are held until it is drained
        # (libkvnode copies keys and page addresses at submit, not the pages).
        self._inflight = {}
        self._inflight_lock = threading.Lock()
        self._drain_space = threading.local()
        self._block_bytes = 0
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
        inflight = getattr(self, "_inflight", None)
        if inflight:
            for pages in list(inflight.values()):
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

    # ------------------------------------------------------------ batched, asynchronous

    def _need_async(self, what):
        if not _HAVE_ASYNC:
            raise InvalidArgument(InvalidArgument.CODE, "%s needs a libkvnode with the KVNODE_0.3 "
                                  "calls; %s has none" % (what, _lib_path), "invalid argument")
        return self._handle()

    def match_tiers(self, keys, checks=None):
        """:meth:`match` that also says where the matched blocks are: a :class:`Tiers`."""
        h = self._need_async("match_tiers")
        arr, n = _keys_array(keys)
        t = _CTiers()
        if checks is None:
            self._check(_match_tiers(h, arr, n, ctypes.byref(t)))
        else:
            self._check(self._checked(_match_checked, "match_tiers")(
                h, arr, _checks_array(checks, n), n, ctypes.byref(t)))
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

    def _stream_fn(self, fn, what, stream, checks):
        """The _stream variant of a batch call (stream: a cudaStream_t as an int, 0 for the
        legacy default stream), or an error saying why there is none."""
        if checks is not None:
            raise InvalidArgument(InvalidArgument.CODE, "%s: stream and checks cannot be "
                                  "combined" % what, "invalid argument")
        if fn is None:
            raise InvalidArgument(InvalidArgument.CODE, "%s with a stream needs a libkvnode "
                                  "with the KVNODE_0.5 calls; %s has none" % (what, _lib_path),
                                  "invalid argument")
        return fn

    def get_batch(self, keys, pages, device=False, checks=None, stream=None):
        """Copy the longest cached prefix of ``keys`` into ``pages`` (one per key: a writable
        buffer, an address, a tensor, or a ctypes ``c_void_p`` array of addresses) in one
        call; return how many were copied. ``device`` True: the pages are GPU memory of this
        client's CUDA device, complete when the call returns. ``stream``: a CUDA stream of
        that device (its address as an int, e.g. ``torch.cuda.current_stream().cuda_stream``;
        0: the legacy default stream) the copies are queued on, after the work already
        there (``kvnode_get_batch_stream``). ``checks``: check words, as for :meth:`match`
        (not with ``stream``)."""
        h = self._need_async("get_batch")
        arr, n = _keys_array(keys)
        gs = None if stream is None else self._stream_fn(_get_batch_stream, "get_batch",
                                                        stream, checks)
        pg = _Pages(pages, n, self._block_bytes, True, device)
        try:
            got = _SIZE(0)
            flags = _BATCH_DEVICE if device else 0
            if gs is not None:
                rc = gs(h, arr, n, pg.array, flags, ctypes.c_void_p(int(stream) or None),
                        ctypes.byref(got))
            elif checks is None:
                rc = _get_batch(h, arr, n, pg.array, flags, ctypes.byref(got))
            else:
                rc = self._checked(_get_batch_checked, "get_batch")(
                    h, arr, _checks_array(checks, n), n, pg.array, flags, ctypes.byref(got))
            self._check(rc)
            return got.value
        finally:
            pg.release()

    def put_batch(self, keys, pages, device=False, checks=None, stream=None):
        """Store ``pages[i]`` (a buffer, an address, a tensor, or a ctypes ``c_void_p`` array
        of addresses: :attr:`block_bytes` bytes each) under ``keys[i]`` in one call; keys
        already stored are left as they are. ``device`` and ``stream`` as for
        :meth:`get_batch` (with ``stream`` the copies follow the work queued there, e.g. the
        kernel that wrote the pages). ``checks``: the blocks' check words."""
        h = self._need_async("put_batch")
        arr, n = _keys_array(keys)
        ps = None if stream is None else self._stream_fn(_put_batch_stream, "put_batch",
                                                        stream, checks)
        pg = _Pages(pages, n, self._block_bytes, False, device)
        try:
            flags = _BATCH_DEVICE if device else 0
            if ps is not None:
                rc = ps(h, arr, n, pg.array, flags, ctypes.c_void_p(int(stream) or None))
            elif checks is None:
                rc = _put_batch(h, arr, n, pg.array, flags)
            else:
                rc = self._checked(_put_batch_checked, "put_batch")(
                    h, arr, _checks_array(checks, n), n, pg.array, flags)
            self._check(rc)
        finally:
            pg.release()

    @property
    def event_fd(self):
        """The completion eventfd: readable while :meth:`drain` has something (poll it;
        do not read or close it)."""
        return _event_fd(self._need_async("event_fd"))

    def _submit_keys(self, fn, fn_checked, what, keys, checks):
        """A MATCH or DELETE submit: libkvnode copies the keys (and words), nothing is held."""
        h = self._need_async(what)
        arr, n = _keys_array(keys)
        t = _TICKET(0)
        if checks is None:
            rc = fn(h, arr, n, None, ctypes.byref(t))
        else:
            rc = self._checked(fn_checked, what)(h, arr, _checks_array(checks, n), n, None,
                                                 ctypes.byref(t))
        if rc != 0:
            self._check(rc)
        return t.value

    def _submit_pages(self, fn, fn_checked, what, keys, checks, pages, writable, device):
        """A GET or PUT submit: the pages' buffers are held until the ticket is drained."""
        h = self._need_async(what)
        arr, n = _keys_array(keys)
        cw = _checks_array(checks, n)
        if cw is not None:
            self._checked(fn_checked, what)
        pg = _Pages(pages, n, self._block_bytes, writable, device)
        flags = _BATCH_DEVICE if device else 0
        t = _TICKET(0)
        with self._inflight_lock:   # drain must not see the ticket before it is registered
            if cw is None:
                rc = fn(h, arr, n, pg.array, flags, None, ctypes.byref(t))
            else:
                rc = fn_checked(h, arr, cw, n, pg.array, flags, None, ctypes.byref(t))
            if rc == 0 and not pg.bare:
                self._inflight[t.value] = pg
        if rc != 0:
            pg.release()
            self._check(rc)
        return t.value

    def submit_match(self, keys, checks=None):
        """Start a :meth:`match`; return its ticket (the count is the prefix matched)."""
        return self._submit_keys(_submit_match, _submit_match_checked, "submit_match", keys,
                                 checks)

    def submit_delete(self, keys, checks=None):
        """Start a :meth:`delete`; return its ticket (the count is the keys deleted)."""
        return self._submit_keys(_submit_delete, _submit_delete_checked, "submit_delete", keys,
                                 checks)

    def submit_get(self, keys, pages, device=False, checks=None):
        """Start a :meth:`get_batch` into ``pages``; return its ticket. The pages must stay
        valid and untouched until the ticket is drained (buffers are held till then)."""
        return self._submit_pages(_submit_get, _submit_get_checked, "submit_get", keys, checks,
                                  pages, True, device)

    def submit_put(self, keys, pages, device=False, checks=None):
        """Start a :meth:`put_batch` from ``pages``; return its ticket (pages held as for
        :meth:`submit_get`)."""
        return self._submit_pages(_submit_put, _submit_put_checked, "submit_put", keys, checks,
                                  pages, False, device)

    def drain(self, max_completions=64):
        """The finished tickets, as a list of :class:`Completion`; never blocks (empty
        when none is waiting). The pages of a drained GET/PUT are free to reuse."""
        h = self._need_async("drain")
        want = max(int(max_completions), 1)
        # One completion array per thread, reused: a fresh one is 300 bytes per slot zeroed.
        out = getattr(self._drain_space, "out", None)
        if out is None or len(out) < want:
            out = self._drain_space.out = (_CCompletion * want)()
        got = _drain(h, out, want)
        if not got:
            return []
        done = []
        inflight = self._inflight
        for i in range(got):
            c = out[i]
            ticket, rc = c.ticket, c.rc
            with self._inflight_lock:
                pages = inflight.pop(ticket, None)
            if pages is not None:
                pages.release()
            done.append(Completion(ticket, c.op, c.count,
                                   _error(rc, _s(c.error)) if rc != 0 else None))
        return done

    @property
    def pending(self):
        """Tickets submitted and not yet drained."""
        return int(_pending(self._need_async("pending")))

    def cancel(self):
        """End the connection now: every ticket in flight completes with :class:`Closed`
        (drain them), and later calls raise it. :meth:`close` is still needed."""
        _cancel(self._need_async("cancel"))
