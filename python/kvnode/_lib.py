"""ctypes declarations of libkvnode for the kvnode package: where the library is looked
for, its structures and functions. Internal: use what kvnode exports."""

import ctypes
import ctypes.util
import os

# ---------------------------------------------------------------- library

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    """Places to look for libkvnode, in order: $KVNODE_LIBRARY; the copy a wheel carries
    (kvnode/libkvnode.so.0, the library `pip install` built the package with); the source
    tree's build/; the LIBDIR `make install` put it in (else the lib/ of the prefix it put this
    package under); the system."""
    out = []
    env = os.environ.get("KVNODE_LIBRARY")
    if env:
        out.append(env)
    out.append(os.path.join(_HERE, "libkvnode.so.0"))
    build = os.path.normpath(os.path.join(_HERE, "..", "..", "build"))
    for name in ("libkvnode.so.0", "libkvnode.so"):
        out.append(os.path.join(build, name))
    # The LIBDIR `make install` put libkvnode in (its _installed.py, relative to this
    # package), else <prefix>/lib/python3/dist-packages/kvnode -> <prefix>/lib (the
    # loader may not know these folders before ldconfig has run).
    try:
        from . import _installed
        out.append(os.path.normpath(os.path.join(_HERE, _installed.LIBDIR, "libkvnode.so.0")))
    except ImportError:
        pass
    out.append(os.path.normpath(os.path.join(_HERE, "..", "..", "..", "libkvnode.so.0")))
    found = ctypes.util.find_library("kvnode")
    if found:
        out.append(found)
    out.append("libkvnode.so.0")
    return out


def _load():
    tried = []
    for cand in _candidates():
        if os.sep in cand and not os.path.exists(cand):
            tried.append("%s (not found)" % cand)
            continue
        try:
            return ctypes.CDLL(cand), cand
        except OSError as e:
            tried.append("%s (%s)" % (cand, e))
    raise ImportError("kvnode: cannot load libkvnode; looked for: " + "; ".join(tried) +
                      ". Build it with `make all` in the source tree and `pip install ./python` "
                      "(the wheel carries it), install it (`make install`), "
                      "or set KVNODE_LIBRARY to its path.")


_lib, _lib_path = _load()


def library_path():
    """Path (or loader name) of the libkvnode that this package loaded: $KVNODE_LIBRARY,
    the copy inside the package (a pip-installed wheel's), the source tree's build/, the
    `make install` prefix's lib/, or the system loader's name."""
    return _lib_path


def _s(b):
    """A C string (bytes or None) as text."""
    return b.decode("utf-8", "replace") if b else ""


class _CLayout(ctypes.Structure):
    _fields_ = [
        ("model", ctypes.c_char_p), ("dtype", ctypes.c_char_p),
        ("block_tokens", ctypes.c_uint32), ("block_bytes", ctypes.c_uint64),
        ("num_layers", ctypes.c_uint32), ("kv_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32), ("tp_size", ctypes.c_uint32),
        ("tp_rank", ctypes.c_uint32), ("extra", ctypes.c_char_p),
    ]


class _CLoc(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("tier", ctypes.c_int), ("device", ctypes.c_int)]


_P = ctypes.c_void_p
_KEYS = ctypes.POINTER(ctypes.c_int64)
_SIZE = ctypes.c_size_t
_LEASE = ctypes.c_uint64


def _fn(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


# A Python client reads blocks through memoryviews, so it declares no GPU
# (device -1): it is never lent GPU memory, whatever KVNODE_CUDA_DEVICE says.
_connect_device = _fn("kvnode_connect_device", ctypes.c_int, ctypes.c_char_p,
                      ctypes.POINTER(_CLayout), ctypes.c_int, ctypes.POINTER(_P))
# Readers (KVNODE_CONNECT_READER) came with libkvnode's KVNODE_0.1 symbols; an
# older library still loads, and only Client(reader=True) then fails.
_connect_flags = (_fn("kvnode_connect_flags", ctypes.c_int, ctypes.c_char_p,
                      ctypes.POINTER(_CLayout), ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_P))
                  if hasattr(_lib, "kvnode_connect_flags") else None)
_is_reader = (_fn("kvnode_is_reader", ctypes.c_int, _P)
              if hasattr(_lib, "kvnode_is_reader") else None)
_CONNECT_READER = 1
# kvnode_prefault came with KVNODE_0.2; Client.prefault needs it.
_prefault = (_fn("kvnode_prefault", ctypes.c_int, _P, ctypes.c_uint)
             if hasattr(_lib, "kvnode_prefault") else None)
_prefault_progress = (_fn("kvnode_prefault_progress", ctypes.c_int, _P,
                          ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64))
                      if hasattr(_lib, "kvnode_prefault") else None)
_PREFAULT_WAIT = 1
# Revisions and purges came with KVNODE_0.7; an older library still loads, and only
# Layout(revision=...) and Client.purge then fail (naming the library).
if hasattr(_lib, "kvnode_purge"):
    _connect_revision = _fn("kvnode_connect_revision", ctypes.c_int, ctypes.c_char_p,
                            ctypes.POINTER(_CLayout), ctypes.c_char_p, ctypes.c_int, ctypes.c_uint,
                            ctypes.POINTER(_P))
    _purge = _fn("kvnode_purge", ctypes.c_int, _P, ctypes.c_char_p, ctypes.c_char_p,
                 ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64))
    _deployment_id = _fn("kvnode_deployment_id", ctypes.c_char_p, _P)
else:
    _connect_revision = _purge = _deployment_id = None
_connect_error = _fn("kvnode_connect_error", ctypes.c_char_p)
_close = _fn("kvnode_close", None, _P)
_block_bytes = _fn("kvnode_block_bytes", ctypes.c_uint64, _P)
_match = _fn("kvnode_match", ctypes.c_int, _P, _KEYS, _SIZE, ctypes.POINTER(_SIZE))
_get_begin = _fn("kvnode_get_begin", ctypes.c_int, _P, _KEYS, _SIZE, ctypes.POINTER(_LEASE),
                 ctypes.POINTER(_CLoc), ctypes.POINTER(_SIZE))
_get_end = _fn("kvnode_get_end", ctypes.c_int, _P, _LEASE)
_put_begin = _fn("kvnode_put_begin", ctypes.c_int, _P, _KEYS, _SIZE, ctypes.c_int,
                 ctypes.POINTER(_LEASE), ctypes.POINTER(_CLoc))
_put_commit = _fn("kvnode_put_commit", ctypes.c_int, _P, _LEASE)
_put_abort = _fn("kvnode_put_abort", ctypes.c_int, _P, _LEASE)
# KVNODE_0.8: kvnode_get_end sends the end without waiting for its reply (an error
# surfaces on a later call). The binding ends read leases with kvnode_get_end_wait: what
# was read counts only once the daemon said the pin held (its TTL had not passed); an
# older library's kvnode_get_end waits itself.
_get_end_wait = (_fn("kvnode_get_end_wait", ctypes.c_int, _P, _LEASE)
                 if hasattr(_lib, "kvnode_get_end_wait") else _get_end)
_get = _fn("kvnode_get", ctypes.c_int, _P, _KEYS, _SIZE, ctypes.POINTER(_P), ctypes.POINTER(_SIZE))
_put = _fn("kvnode_put", ctypes.c_int, _P, _KEYS, _SIZE, ctypes.POINTER(_P))
_get_inline = _fn("kvnode_get_inline", ctypes.c_int, _P, _KEYS, _SIZE, ctypes.POINTER(_P),
                  ctypes.POINTER(_SIZE))
_put_inline = _fn("kvnode_put_inline", ctypes.c_int, _P, _KEYS, _SIZE, ctypes.POINTER(_P))
_delete = _fn("kvnode_delete", ctypes.c_int, _P, _KEYS, _SIZE, ctypes.POINTER(_SIZE))
_stats_json = _fn("kvnode_stats_json", ctypes.c_int, _P, ctypes.POINTER(_P))
_hash = _fn("kvnode_hash_tokens", _SIZE, _KEYS, _SIZE, ctypes.c_uint32, _KEYS, _SIZE)
_strerror = _fn("kvnode_strerror", ctypes.c_char_p, ctypes.c_int)
_last_error = _fn("kvnode_last_error", ctypes.c_char_p, _P)
_set_timeout = _fn("kvnode_set_timeout", None, _P, ctypes.c_int)
_version = _fn("kvnode_version", ctypes.c_char_p)

_TICKET = ctypes.c_uint64


class _CCompletion(ctypes.Structure):
    _fields_ = [("ticket", _TICKET), ("op", ctypes.c_int), ("rc", ctypes.c_int),
                ("count", _SIZE), ("user", _P), ("error", ctypes.c_char * 256)]


class _CTiers(ctypes.Structure):
    _fields_ = [("matched", _SIZE), ("hbm", _SIZE), ("host", _SIZE), ("store", _SIZE)]


class _CPeer(ctypes.Structure):
    _fields_ = [("host_ip_port", ctypes.c_char * 128), ("matched", _SIZE)]


class _CRemoteMatch(ctypes.Structure):
    _fields_ = [("matched", _SIZE), ("remote_ok", ctypes.c_int), ("why", ctypes.c_char * 192),
                ("npeers", _SIZE), ("peers", _CPeer * 64)]


_PTRS = ctypes.POINTER(_P)
# The batched and asynchronous calls came with KVNODE_0.3; an older library
# still loads, and only those methods then fail (naming the library).
_HAVE_ASYNC = hasattr(_lib, "kvnode_submit_get")
if _HAVE_ASYNC:
    _match_tiers = _fn("kvnode_match_tiers", ctypes.c_int, _P, _KEYS, _SIZE, ctypes.POINTER(_CTiers))
    _match_remote = _fn("kvnode_match_remote", ctypes.c_int, _P, _KEYS, _SIZE, _SIZE,
                        ctypes.POINTER(_CRemoteMatch))
    _get_batch = _fn("kvnode_get_batch", ctypes.c_int, _P, _KEYS, _SIZE, _PTRS, ctypes.c_uint,
                     ctypes.POINTER(_SIZE))
    _put_batch = _fn("kvnode_put_batch", ctypes.c_int, _P, _KEYS, _SIZE, _PTRS, ctypes.c_uint)
    _event_fd = _fn("kvnode_event_fd", ctypes.c_int, _P)
    _submit_match = _fn("kvnode_submit_match", ctypes.c_int, _P, _KEYS, _SIZE, _P,
                        ctypes.POINTER(_TICKET))
    _submit_delete = _fn("kvnode_submit_delete", ctypes.c_int, _P, _KEYS, _SIZE, _P,
                         ctypes.POINTER(_TICKET))
    _submit_get = _fn("kvnode_submit_get", ctypes.c_int, _P, _KEYS, _SIZE, _PTRS, ctypes.c_uint,
                      _P, ctypes.POINTER(_TICKET))
    _submit_put = _fn("kvnode_submit_put", ctypes.c_int, _P, _KEYS, _SIZE, _PTRS, ctypes.c_uint,
                      _P, ctypes.POINTER(_TICKET))
    _drain = _fn("kvnode_drain", _SIZE, _P, ctypes.POINTER(_CCompletion), _SIZE)
    _pending = _fn("kvnode_pending", _SIZE, _P)
    _cancel = _fn("kvnode_cancel", None, _P)
_BATCH_DEVICE = 1

_CHECKS = ctypes.POINTER(ctypes.c_uint64)
# kvnode_fold_digests came with KVNODE_0.4; without it the package folds keys in Python.
_fold_digests = (_fn("kvnode_fold_digests", _SIZE, ctypes.c_char_p, _SIZE, _SIZE, _KEYS, _CHECKS)
                 if hasattr(_lib, "kvnode_fold_digests") else None)
# kvnode_fold_text (KVNODE_0.4): a batch of key strings folded in C (hex digits, SHA-256).
_fold_text = (_fn("kvnode_fold_text", _SIZE, ctypes.c_char_p, _SIZE, _SIZE, _KEYS, _CHECKS)
              if hasattr(_lib, "kvnode_fold_text") else None)
# The _checked calls (check words beside keys) and kvnode_has_check_words came with KVNODE_0.4
# too; without them a call given check words fails, naming the library.
_HAVE_CHECKED = hasattr(_lib, "kvnode_match_checked")
if _HAVE_CHECKED:
    _has_check_words = _fn("kvnode_has_check_words", ctypes.c_int, _P)
    _match_checked = _fn("kvnode_match_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                         ctypes.POINTER(_CTiers))
    _get_begin_checked = _fn("kvnode_get_begin_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                             ctypes.POINTER(_LEASE), ctypes.POINTER(_CLoc), ctypes.POINTER(_SIZE))
    _put_begin_checked = _fn("kvnode_put_begin_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                             ctypes.c_int, ctypes.POINTER(_LEASE), ctypes.POINTER(_CLoc))
    _get_batch_checked = _fn("kvnode_get_batch_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                             _PTRS, ctypes.c_uint, ctypes.POINTER(_SIZE))
    _put_batch_checked = _fn("kvnode_put_batch_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                             _PTRS, ctypes.c_uint)
    _get_inline_checked = _fn("kvnode_get_inline_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                              _PTRS, ctypes.POINTER(_SIZE))
    _put_inline_checked = _fn("kvnode_put_inline_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                              _PTRS)
    _delete_checked = _fn("kvnode_delete_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                          ctypes.POINTER(_SIZE))
    _submit_match_checked = _fn("kvnode_submit_match_checked", ctypes.c_int, _P, _KEYS, _CHECKS,
                                _SIZE, _P, ctypes.POINTER(_TICKET))
    _submit_delete_checked = _fn("kvnode_submit_delete_checked", ctypes.c_int, _P, _KEYS, _CHECKS,
                                 _SIZE, _P, ctypes.POINTER(_TICKET))
    _submit_get_checked = _fn("kvnode_submit_get_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                              _PTRS, ctypes.c_uint, _P, ctypes.POINTER(_TICKET))
    _submit_put_checked = _fn("kvnode_submit_put_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                              _PTRS, ctypes.c_uint, _P, ctypes.POINTER(_TICKET))
else:
    _has_check_words = _match_checked = _get_begin_checked = _put_begin_checked = None
    _get_batch_checked = _put_batch_checked = _get_inline_checked = _put_inline_checked = None
    _delete_checked = _submit_match_checked = _submit_delete_checked = None
    _submit_get_checked = _submit_put_checked = None

# The _stream batch calls (the caller's CUDA stream) came with KVNODE_0.5.
if hasattr(_lib, "kvnode_get_batch_stream"):
    _get_batch_stream = _fn("kvnode_get_batch_stream", ctypes.c_int, _P, _KEYS, _SIZE, _PTRS,
                            ctypes.c_uint, _P, ctypes.POINTER(_SIZE))
    _put_batch_stream = _fn("kvnode_put_batch_stream", ctypes.c_int, _P, _KEYS, _SIZE, _PTRS,
                            ctypes.c_uint, _P)
else:
    _get_batch_stream = _put_batch_stream = None

#: Operation of a :class:`Completion` (``KVNODE_OP_*``).
OP_MATCH, OP_GET, OP_PUT, OP_DELETE = 1, 2, 3, 4
#: ... of the per-key calls (KVNODE_0.6): submit_exists, submit_delete_each.
OP_EXISTS, OP_DELETE_EACH = 5, 6

# Per-key MATCH and DELETE (KVNODE_0.6): one request, one bool per key.
_BOOLS = ctypes.POINTER(ctypes.c_bool)
if hasattr(_lib, "kvnode_exists"):
    _has_per_key = _fn("kvnode_has_per_key", ctypes.c_int, _P)
    _exists = _fn("kvnode_exists", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE, _BOOLS,
                  ctypes.POINTER(_SIZE))
    _delete_each = _fn("kvnode_delete_each", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE, _BOOLS,
                       ctypes.POINTER(_SIZE))
    _submit_exists = _fn("kvnode_submit_exists", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE, _BOOLS,
                         _P, ctypes.POINTER(_TICKET))
    _submit_delete_each = _fn("kvnode_submit_delete_each", ctypes.c_int, _P, _KEYS, _CHECKS,
                              _SIZE, _BOOLS, _P, ctypes.POINTER(_TICKET))
else:
    _has_per_key = _exists = _delete_each = _submit_exists = _submit_delete_each = None

# Blocks gathered from / scattered to pieces of the caller's memory (KVNODE_0.8): one call
# per batch for kvnode.sglang's layer_first pages; without them it copies in Python.
if hasattr(_lib, "kvnode_gather"):
    _gather = _fn("kvnode_gather", ctypes.c_int, _P, _SIZE, _SIZE, _P, _P, _SIZE, _P, _P)
    _scatter = _fn("kvnode_scatter", ctypes.c_int, _P, _SIZE, _SIZE, _P, _P, _SIZE, _P, _P)
    _put_gather = _fn("kvnode_put_gather_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE, _P,
                      _P, _SIZE, _P, _P)
    _get_scatter = _fn("kvnode_get_scatter_checked", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                       _P, _P, _SIZE, _P, _P, ctypes.POINTER(_SIZE))
else:
    _gather = _scatter = _put_gather = _get_scatter = None
# ... their device form (issue 34): pieces in GPU memory, copies on a CUDA stream.
if hasattr(_lib, "kvnode_put_gather_stream"):
    _put_gather_stream = _fn("kvnode_put_gather_stream", ctypes.c_int, _P, _KEYS, _CHECKS, _SIZE,
                             _P, _P, _SIZE, _P, _P, ctypes.c_uint, _P)
    _get_scatter_stream = _fn("kvnode_get_scatter_stream", ctypes.c_int, _P, _KEYS, _CHECKS,
                              _SIZE, _P, _P, _SIZE, _P, _P, ctypes.c_uint, _P,
                              ctypes.POINTER(_SIZE))
else:
    _put_gather_stream = _get_scatter_stream = None

_libc = ctypes.CDLL(None)
_free = _libc.free
_free.restype = None
_free.argtypes = [_P]

_mv_from_memory = ctypes.pythonapi.PyMemoryView_FromMemory
_mv_from_memory.restype = ctypes.py_object
_mv_from_memory.argtypes = [_P, ctypes.c_ssize_t, ctypes.c_int]
_PyBUF_READ, _PyBUF_WRITE = 0x100, 0x200


def _view(ptr, n, writable):
    """A flat unsigned-byte memoryview over n bytes at ptr (no copy)."""
    return _mv_from_memory(ptr, n, _PyBUF_WRITE if writable else _PyBUF_READ)


