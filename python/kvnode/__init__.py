"""Python binding of libkvnode, the client library of kvnoded (node-local KV-cache daemon).

Stdlib only (``ctypes``), Python >= 3.10. The package loads ``libkvnode.so.0`` at import
time: ``$KVNODE_LIBRARY``, else the copy inside the package (``pip install ./python`` puts the
library it was built with into the wheel), else the source tree next to the package
(``build/`` of the repository), else the ``lib/`` that ``make install`` put it beside, else the
system loader; :func:`library_path` says which. The examples use numpy (the ``numpy`` extra).

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


# The package by concern (each module imports only those above it):
#   _lib.py         ctypes declarations of libkvnode, where it is loaded from
#   errors.py       Error and its KVNODE_E* subclasses
#   datatypes.py    Layout, the tiers, Tiers, RemoteMatch, Completion
#   keys.py         hash_tokens, fold_key/fold_keys/fold_digests, prefix
#   leases.py       ReadLease, WriteLease (Client.read / Client.write)
#   pages.py        caller pages as addresses (batched and asynchronous calls)
#   async_calls.py  Client's batched and asynchronous calls, the tickets in flight
#   client.py       Client, version()
#   async_client.py AsyncClient: submits that never wait for the daemon (the binding's
#                   connect thread, reconnects, its own tickets and event fd)
#   gathered.py     blocks in pieces of the caller's memory (KVNODE_0.8 gathered calls)
# sglang.py, lmcache.py and vllm.py, the engine adapters, use what this package exports
# (vllm.py also kvnode.gathered).

#: Version of this package; equals the kvnode release it belongs to (Makefile VERSION).
__version__ = "0.1.0"

__all__ = [
    "Layout", "Client", "AsyncClient", "ReadLease", "WriteLease", "hash_tokens", "fold_key", "fold_keys", "fold_digests", "prefix", "version", "library_path", "purge_layouts",
    "__version__",
    "TIER_HOST", "TIER_HBM",
    "Error", "InvalidArgument", "OutOfMemory", "NoSpace", "NoLease", "LayoutError",
    "VersionError", "ProtocolError", "TooBig", "TimedOut", "ConnectError", "Closed",
    "IOFailure", "StateError", "LimitReached", "Denied", "InternalError", "ShuttingDown",
    "LeaseEnded", "Completion", "Tiers", "RemoteMatch",
    "OP_MATCH", "OP_GET", "OP_PUT", "OP_DELETE", "OP_EXISTS", "OP_DELETE_EACH",
]

from ._lib import (OP_DELETE, OP_DELETE_EACH, OP_EXISTS, OP_GET, OP_MATCH, OP_PUT,
                   library_path)
from .async_client import AsyncClient
from .client import Client, purge_layouts, version
from .datatypes import TIER_HBM, TIER_HOST, Completion, Layout, RemoteMatch, Tiers
from .errors import (Closed, ConnectError, Denied, Error, InternalError, InvalidArgument,
                     IOFailure, LayoutError, LeaseEnded, LimitReached, NoLease, NoSpace,
                     OutOfMemory, ProtocolError, ShuttingDown, StateError, TimedOut, TooBig,
                     VersionError)
from .keys import fold_digests, fold_key, fold_keys, hash_tokens, prefix
from .leases import ReadLease, WriteLease
