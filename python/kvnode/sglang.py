"""SGLang HiCache L3 storage backend on kvnode.

Load it in SGLang with the ``dynamic`` storage backend::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvnode",
            "module_path": "kvnode.sglang", "class_name": "KvnodeHiCacheStorage",
            "interface_v1": 1, "socket_path": "/run/kvnode/kvnode.sock"}'

SGLang's factory builds it as ``KvnodeHiCacheStorage(storage_config, kwargs)``, one instance
per (TP, CP, PP) rank (each in its scheduler process), then calls ``register_mem_pool_host``
with the host KV pool (for hybrid models the pool group, whose anchor pool it serves) and,
for hybrid models, ``register_mem_host_pool_v2`` with each pool of the group (Mamba/SWA
states, the DSA indexer). The methods follow ``HiCacheStorage``
(``python/sglang/srt/mem_cache/hicache_storage.py``): ``batch_exists`` is the length of the
cached prefix (kvnode's MATCH); ``batch_get_v1`` / ``batch_set_v1(keys, host_indices)`` move
pages between the host pool and kvnode by the addresses the pool's ``get_page_buffer_meta``
gives, one batched call per namespace; ``batch_exists_v2`` / ``batch_get_v2`` /
``batch_set_v2`` do the same for sidecar pools. Neither sglang nor torch is needed to import
it: host pools are duck-typed (``page_size``, ``layout``, ``get_page_buffer_meta``).

Host layouts. ``get_page_buffer_meta`` gives, per page, the pieces of that page:

- ``page_first``, ``page_first_direct``, ``page_head`` (MHA): two pieces, K and V, each one
  contiguous run of the page's bytes; MLA (``page_first``, ``page_first_direct``): one piece.
  Each piece goes to a kvnode namespace of its own (component ``k``, ``v``; ``kv`` for MLA)
  straight from the pool's memory, without a copy in Python.
- ``layer_first``: one piece per layer (K and V of each layer, 2 x layers pieces for MHA;
  layers pieces for MLA), scattered over the pool. A page is one kvnode block (component
  ``page``): a put copies the pieces into the block's slot in the daemon's shared memory (a
  ``write`` lease), a get copies them out of the pinned block (a ``read`` lease) - one copy
  each way, as the zero-copy layouts, made for the whole batch, with the lease, by one
  libkvnode call (``kvnode_put_gather_checked`` / ``kvnode_get_scatter_checked``). The
  pieces' addresses: SGLang's layer_first pools hold their pages in one ``kv_buffer`` at a
  fixed step, so a batch takes each page's first token index and the distances of its
  pieces (found at registration from pages 0 and 1), and asks ``get_page_buffer_meta``
  only about its first and last page, as a check; a pool that does not show that model
  (no ``kv_buffer``, pages 0 and 1 not at one step, a page outside ``kv_buffer``) or that
  stops agreeing with it is asked about every page of every batch. With a libkvnode older
  than KVNODE_0.8, where the pieces sit on a grid (K and V of each layer at fixed
  distances) the copy is one strided torch (else numpy) copy per run of pages at a
  constant step; with neither installed, or pieces off a grid, one ``memmove`` per piece.
- Sidecar pools: each piece of a page (Mamba's temporal and conv states, ...) its own
  namespace (components ``0``, ``1``, ...), or one block when a page has more than
  four pieces or the pool is ``layer_first``. Zero-byte pieces are skipped.

The layout is part of the namespace: pages written under one layout are never read under
another (their bytes are ordered differently). Namespace ``extra``:
``sglang/<component>`` for the KV pool in ``page_first`` (what earlier releases used, so
their blocks stay found), ``sglang/<component>@<layout>`` for the others,
``sglang/<pool>/<component>[@<layout>]`` for sidecar pools; then ``/pp<rank>-<size>`` under
pipeline parallelism and ``/cp<rank>-<size>`` under attention context parallelism
(``attn_cp_rank`` / ``attn_cp_size``: each CP rank holds a different slice of every page,
so each keeps its own bytes). A page counts as cached when every namespace of its pool
holds it.

Tensor parallelism. Non-MLA KV gets a namespace set per TP rank (``tp_rank``/``tp_size``);
MLA KV, the same on every rank, shares rank 0's (SGLang writes it from TP rank 0 only).
Sidecar pools of an MLA model share rank 0's too, except ``mamba`` (TP-sharded, written by
every rank); an MHA model's sidecars are per rank. Heterogeneous TP (``tp_lcm_size`` in the
extra config): with ``should_split_heads`` (SGLang sets it for MHA ``page_head`` pools when
``tp_lcm_size > tp_size``) each page is stored as ``tp_lcm_size // tp_size`` head groups
(``get_split_heads_page_buffer_meta``), each in the namespace of TP rank
``tp_rank * split + j`` of ``tp_lcm_size``, so deployments of different TP sizes share
pages. ``should_split_heads`` with a pool that cannot split heads (not ``page_head``, no
``get_split_heads_page_buffer_meta``, heads not divisible) is refused by
``register_mem_pool_host`` with a ``ValueError`` naming the reason. Without it, ranks of
different TP sizes keep separate namespaces (MLA excepted), never each other's bytes.
Attention-DP ranks (``dp_rank``) share namespaces: the same prefix has the same KV on each.

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
``_v1`` lists of False, ``_v2`` per-pool lists of False and a ``PoolTransferResult`` of 0),
logs one warning, and reconnects on a later call (at most once per
``reconnect_interval_s``). No call waits for the daemon to connect: the connect starts when a
pool is registered (and again when one is due), on a thread of its own, each namespace's
bounded by ``timeout_ms``; a call that finds it under way waits at most ``connect_wait_ms``
(default 20), then answers the miss and logs (a paused daemon holds no SGLang thread). A v2 transfer naming a pool that was never registered, or with
host indices that do not cover its keys, answers False for its keys and logs. Leases live only
for the duration of one batched copy; an engine process that dies mid-copy has its leases ended
by the daemon when its connection closes.

Metrics. ``get_stats()`` returns SGLang's ``StorageMetrics`` (its own class when sglang is
importable, so ``--enable-storage-metrics`` logs it): ``prefetch_pgs`` / ``backup_pgs`` (pages
per ``batch_get_v1`` / ``batch_set_v1`` call) and ``prefetch_bandwidth`` /
``backup_bandwidth`` (GB/s per call) since the previous ``get_stats``, plus kvnode's counters
since start as attributes: ``hits`` / ``misses`` (pages ``batch_exists`` found / did not),
``pages_read`` / ``pages_written``, ``bytes_read`` / ``bytes_written``, ``failed_calls``, and
the latencies (ms) since the previous call in ``exists_latency_ms``, ``get_latency_ms``,
``set_latency_ms``. At most 4096 samples of each list are kept between two calls.

Options (the extra-config JSON, or the factory's ``kwargs``): ``socket_path`` (default
``$KVNODE_SOCKET``, else ``/run/kvnode/kvnode.sock``), ``timeout_ms`` (per call, default
libkvnode's 10 s; also bounds each connect), ``reconnect_interval_s`` (default 1.0),
``connect_wait_ms`` (default 20), ``model`` (default the storage
config's ``model_name``), ``dtype`` (a layout discriminator, default ``"sglang"``),
``model_revision`` (the weights revision, e.g. a commit hash; default none): part of every
namespace's identity when set, so pages of two revisions of a model never meet; without it
the namespaces are those of earlier versions and their stored pages stay found.

``clear()`` (SGLang's ``/clear_hicache_storage_backend``, through the cache controller's
``clear_storage_backend``) drops every page of this deployment -- every registered pool's
namespaces, every TP rank -- from kvnoded's memory, GPU memory and persistent store
(``kvnode.Client.purge``), and returns once kvnoded has done it; on failure it raises, which
SGLang logs and reports as a failed clear.
"""

import array
import collections
import ctypes
import dataclasses
import importlib
import logging
import os
import _thread
import threading
import time

import kvnode
from . import _lib as _clib
from .keys import _checks_array, _keys_array

try:  # subclass SGLang's base when it is there (its factory may check it)
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # noqa: BLE001 - no sglang (or a broken one): duck-type
    _Base = object

__all__ = ["KvnodeHiCacheStorage", "fold_key"]

logger = logging.getLogger(__name__)

_DISCONNECTED = (kvnode.Closed, kvnode.ConnectError, kvnode.TimedOut, kvnode.ShuttingDown,
                 kvnode.IOFailure, kvnode.ProtocolError)
fold_key = kvnode.fold_key

KV_POOL = "kv"                   # SGLang's PoolName.KV
DEFAULT_LAYOUT = "page_first"    # the layout whose namespaces carry no layout suffix
MAX_ZERO_COPY_PIECES = 4         # more pieces per page than this: one gathered block
MAX_SAMPLES = 4096               # metric samples kept between two get_stats calls


class _Indices(list):
    """Token indices for get_page_buffer_meta when probing the pool (torch-free)."""

    def tolist(self):
        return list(self)

    def numel(self):
        return len(self)


def _name(value):
    """A pool name or hit policy as its string (SGLang's are str enums)."""
    return str(getattr(value, "value", value))


def _numel(indices):
    numel = getattr(indices, "numel", None)
    return int(numel()) if callable(numel) else len(indices)


def _sizes(sizes, count):
    """get_page_buffer_meta's sizes as a list (some pools give one int for all)."""
    if isinstance(sizes, int):
        return [sizes] * count
    return [int(s) for s in sizes]


def _slice(array, lo, hi):
    """Items [lo, hi) of a ctypes array, over the same memory."""
    return (array._type_ * (hi - lo)).from_buffer(array, lo * ctypes.sizeof(array._type_))


_ADDRESS = "Q" if ctypes.sizeof(ctypes.c_void_p) == 8 else "I"    # array code of an address


def _piece_arrays(where):
    """gathered_pieces' answer as arrays of addresses and distances (at None: every piece's
    address); the caller holds them while libkvnode reads them."""
    pieces, at = where
    if type(pieces) is not array.array:
        pieces = array.array(_ADDRESS, pieces)
    return pieces, at


def _address(arr):
    """The address of an array's items (None for None)."""
    return arr.buffer_info()[0] if arr is not None else None


def _get(obj, name, default=None):
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


_sglang_classes = {}


def _sglang_class(module, name):
    """SGLang's module.name, or None without sglang (looked up once)."""
    key = (module, name)
    if key not in _sglang_classes:
        try:
            _sglang_classes[key] = getattr(importlib.import_module(module), name)
        except Exception:  # noqa: BLE001 - no sglang: our own stand-in
            _sglang_classes[key] = None
    return _sglang_classes[key]


@dataclasses.dataclass
class PoolTransferResult:
    """Stand-in for SGLang's PoolTransferResult when sglang is not importable."""
    kv_hit_pages: int
    extra_pool_hit_pages: dict


@dataclasses.dataclass
class StorageMetrics:
    """Stand-in for SGLang's StorageMetrics when sglang is not importable."""
    prefetch_pgs: list = dataclasses.field(default_factory=list)
    backup_pgs: list = dataclasses.field(default_factory=list)
    prefetch_bandwidth: list = dataclasses.field(default_factory=list)
    backup_bandwidth: list = dataclasses.field(default_factory=list)


def _result_class():
    return _sglang_class("sglang.srt.mem_cache.hicache_storage",
                         "PoolTransferResult") or PoolTransferResult


def _metrics_class():
    for module in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
        cls = _sglang_class(module, "StorageMetrics")
        if cls is not None:
            return cls
    return StorageMetrics


def _span(shape, strides):
    """Bytes from the first to past the last byte of a strided view (byte strides >= 0)."""
    return sum((n - 1) * st for n, st in zip(shape, strides)) + 1


def _torch_ops():
    import torch
    types = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}

    def strided(addr, shape, strides, itemsize):
        """A view of raw memory; shape in items, strides in bytes (multiples of itemsize)."""
        raw = (ctypes.c_uint8 * (_span(shape, strides) + itemsize - 1)).from_address(addr)
        return torch.frombuffer(raw, dtype=types[itemsize]).as_strided(
            shape, [st // itemsize for st in strides])

    def copy(dst, src):
        dst.copy_(src)
    return strided, copy


def _numpy_ops():
    import numpy
    from numpy.lib.stride_tricks import as_strided
    types = {8: numpy.uint64, 4: numpy.uint32, 2: numpy.uint16, 1: numpy.uint8}

    def strided(addr, shape, strides, itemsize):
        raw = (ctypes.c_uint8 * (_span(shape, strides) + itemsize - 1)).from_address(addr)
        return as_strided(numpy.frombuffer(raw, types[itemsize]), shape, strides)
    return strided, numpy.copyto


ARRAY_OPS = {"torch": _torch_ops, "numpy": _numpy_ops}    # torch copies faster
_ops = []       # [(strided, copy) or None], found on first use


def _array_ops():
    """(strided view of raw memory, copy) from torch, else numpy; None with neither (the
    gathered layouts then copy piece by piece)."""
    if not _ops:
        found = None
        for make in ARRAY_OPS.values():
            try:
                found = make()
                break
            except Exception:  # noqa: BLE001 - not installed (or broken): the next one
                continue
        _ops.append(found)
    return _ops[0]


class _Grid:
    """Where a gathered page's pieces sit, when they sit on a grid: piece j is (a, b) =
    divmod(j, g), pa * a + pb * b bytes after the page's first piece in the pool and
    o0 + oa * a + ob * b into the block; every piece the same size. SGLang's MHA
    layer_first: g = 2 (K, V of each layer); MLA: g = 1."""

    def __init__(self, rel, dims, pa, pb, o0, oa, ob):
        self.rel, self.dims = rel, dims         # dims: (pieces // g, g, piece bytes)
        self.pa, self.pb, self.o0, self.oa, self.ob = pa, pb, o0, oa, ob

        self.itemsize = 8     # the widest item dividing every distance and the piece size
        while (pa | pb | o0 | oa | ob | dims[2]) % self.itemsize:
            self.itemsize //= 2

    def shape(self, pages, itemsize):
        """A run of pages as (b, a, page, item)."""
        a_n, g, size = self.dims
        return (g, a_n, pages, size // itemsize)

    @classmethod
    def of(cls, ptrs, sizes, offs):
        m, size = len(ptrs), sizes[0]
        if size <= 0 or any(x != size for x in sizes):
            return None
        rel = [p - ptrs[0] for p in ptrs]
        for g in (1, 2):
            if m % g:
                continue
            a_n = m // g
            pa, oa = (rel[g], offs[g] - offs[0]) if a_n > 1 else (0, 0)
            pb, ob = (rel[1], offs[1] - offs[0]) if g > 1 else (0, 0)
            if min(pa, pb, oa, ob) < 0:
                continue
            if all(rel[j] == (j // g) * pa + (j % g) * pb
                   and offs[j] - offs[0] == (j // g) * oa + (j % g) * ob for j in range(m)):
                return cls(rel, (a_n, g, size), pa, pb, offs[0], oa, ob)
        return None


class _PageBases:
    """Where a gathered pool's pages lie without asking the pool for every piece: piece j of
    the page whose first token index is t at first[j] + t * step, inside the pool's
    kv_buffer. SGLang's layer_first host pools are one buffer with pages at a fixed step (its
    get_page_buffer_meta computes exactly that, in Python, one pointer per piece - more time
    than the copy of the batch's bytes), so a batch needs only each page's first index. The
    model is taken only when the pool shows it (pages 0 and 1 at one step, every piece inside
    kv_buffer) and checked on every batch: every page inside kv_buffer, and the pool's own
    addresses of the batch's first and last page; a batch that disagrees is answered by the
    pool, and so is every later one."""

    def __init__(self, plan, first, step, lo, hi, span):
        self.plan, self.first, self.step, self.lo, self.hi = plan, first, step, lo, hi
        self.base = first[0]
        self.at = array.array("q", [p - first[0] for p in first])
        self.low = min(first)                                   # bytes a page spans from
        self.end = max(p + s for p, s in zip(first, span))      # ... and to, at t = 0

    @classmethod
    def of(cls, plan, first, sizes):
        buf = getattr(plan.pool, "kv_buffer", None)
        try:
            lo = int(buf.data_ptr())
            hi = lo + int(buf.numel()) * int(buf.element_size())
            second = [int(p) for p in plan.meta(_Indices(range(plan.page_size,
                                                               2 * plan.page_size)))[0]]
        except Exception:  # noqa: BLE001 - no kv_buffer, or a pool of one page: ask the pool
            return None
        first = [int(p) for p in first]
        step, ps = (second[0] - first[0]) if second else 0, plan.page_size
        if (len(second) != len(first) or step <= 0 or step % ps
                or any(b - a != step for a, b in zip(first, second))):
            return None
        model = cls(plan, first, step // ps, lo, hi, sizes)
        if not (lo <= model.low and model.end + step <= hi):
            return None
        return model

    def of_batch(self, host_indices):
        """The batch's page bases (an array of addresses), or None when the pool disagrees."""
        ps = self.plan.page_size
        starts = host_indices[::ps]
        starts = starts.tolist() if hasattr(starts, "tolist") else list(starts)
        t_lo, t_hi = min(starts), max(starts)
        if t_lo < 0 or self.low + t_lo * self.step < self.lo \
                or self.end + t_hi * self.step > self.hi:
            return None
        # the pool's own answer for the first and last page (token runs, as the probes)
        got = self.plan.meta(_Indices([*range(starts[0], starts[0] + ps),
                                       *range(starts[-1], starts[-1] + ps)]))[0]
        m = len(self.at)
        want = [p + t * self.step for t in (starts[0], starts[-1]) for p in self.first]
        if len(got) != 2 * m or [int(p) for p in got] != want:
            logger.warning("kvnode.sglang: pool %r: get_page_buffer_meta no longer gives "
                           "pages at one step; asking it for every batch", self.plan.name)
            return None
        base, step = self.base, self.step
        return array.array(_ADDRESS, [base + t * step for t in starts])


class _Plan:
    """How one host pool's pages map onto kvnode namespaces: the pieces
    get_page_buffer_meta gives per page, and which namespace (component) each goes to."""

    def __init__(self, pool_name, host_pool, ranks, split=1, mla=False):
        self.name = pool_name
        self.pool = host_pool
        self.page_size = int(host_pool.page_size)
        if self.page_size <= 0:
            raise ValueError("kvnode.sglang: pool %r has page_size %d"
                             % (pool_name, self.page_size))
        self.layout = str(getattr(host_pool, "layout", None) or DEFAULT_LAYOUT)
        self.split = split
        try:
            ptrs, sizes = self.meta(_Indices(range(self.page_size)))
            sizes = _sizes(sizes, len(ptrs))
        except Exception as e:  # noqa: BLE001 - e.g. SGLang's own "Unsupported layout"
            raise ValueError("kvnode.sglang: host pool %r (layout %s) gives no page addresses: "
                             "%s: %s" % (pool_name, self.layout, type(e).__name__, e)) from e
        self.pieces = len(ptrs)         # per page
        if self.pieces == 0 or len(sizes) != self.pieces or min(sizes) < 0:
            raise ValueError("kvnode.sglang: pool %r (%s) gave %d pointers and %d sizes for one "
                             "page" % (pool_name, self.layout, len(ptrs), len(sizes)))
        if sum(sizes) == 0:
            raise ValueError("kvnode.sglang: pool %r (%s) has pages of 0 bytes"
                             % (pool_name, self.layout))
        self.piece_sizes = sizes
        self.gather = self.layout == "layer_first" or self.pieces > MAX_ZERO_COPY_PIECES
        if self.gather:
            # The block holds the pieces in SGLang's flat-page order (get_data_page): for MHA
            # every layer's K, then every layer's V (the pool gives K0, V0, K1, V1, ...).
            order = list(range(self.pieces))
            if pool_name == KV_POOL and not mla and self.pieces % 2 == 0:
                order = order[0::2] + order[1::2]
            offs, total = [0] * self.pieces, 0
            for j in order:
                offs[j] = total
                total += sizes[j]
            self.piece_offsets = offs
            self._c_sizes = (ctypes.c_size_t * self.pieces)(*sizes)
            self._c_offsets = (ctypes.c_size_t * self.pieces)(*offs)
            self.bases = _PageBases.of(self, ptrs, sizes)
            self.grid = _Grid.of(ptrs, sizes, offs)
            self.used = []
            self.components = [("page", total) + ranks[0]]
            self.flat_offsets = [0]
        else:
            self.used = [j for j, s in enumerate(sizes) if s > 0]    # zero-byte pieces skipped
            if pool_name == KV_POOL and split > 1:
                names = ["k", "v"] * split
            elif pool_name == KV_POOL and self.pieces == 1:
                names = ["kv"]
            elif pool_name == KV_POOL and self.pieces == 2:
                names = ["k", "v"]
            else:
                names = [str(j) for j in range(self.pieces)]
            self.components = [(names[j], sizes[j]) + ranks[j * len(ranks) // self.pieces]
                               for j in self.used]
            # Where each component sits in SGLang's flat page (get_data_page): in order, but
            # with split heads all K head groups come before all V ones.
            order = self.used
            if split > 1:
                order = [j for j in self.used if j % 2 == 0] + [j for j in self.used if j % 2]
            at, total = {}, 0
            for j in order:
                at[j] = total
                total += sizes[j]
            self.flat_offsets = [at[j] for j in self.used]

    def meta(self, indices):
        if self.split > 1:
            return self.pool.get_split_heads_page_buffer_meta(indices, self.split)
        return self.pool.get_page_buffer_meta(indices)

    @property
    def page_bytes(self):
        return sum(self.piece_sizes)

    def layouts(self, model, dtype, suffix):
        pool = "" if self.name == KV_POOL else self.name + "/"
        at = "" if self.layout == DEFAULT_LAYOUT else "@" + self.layout
        return [kvnode.Layout(model=model, dtype=dtype, block_tokens=self.page_size,
                              block_bytes=nbytes, tp_size=size, tp_rank=rank,
                              extra="sglang/%s%s%s%s" % (pool, comp, at, suffix))
                for comp, nbytes, size, rank in self.components]

    def pointers(self, n, host_indices):
        """The page addresses at host_indices (n pages): a flat list, pieces per page."""
        if _numel(host_indices) != n * self.page_size:
            raise ValueError("kvnode.sglang: pool %r: %d keys but %d host indices (page size %d)"
                             % (self.name, n, _numel(host_indices), self.page_size))
        ptrs, _ = self.meta(host_indices)
        if len(ptrs) != n * self.pieces:
            raise ValueError("kvnode.sglang: pool %r: %d keys but %d page pointers (%d per page)"
                             % (self.name, n, len(ptrs), self.pieces))
        return ptrs if type(ptrs) is list else list(ptrs)

    # Each takes the clients of this pool's namespaces (one per component), the folded keys
    # and the connection's check words (None when it sends none).

    def match(self, clients, folded, words):
        n = hit = len(folded)
        for c in clients:       # each next namespace: of what the previous ones hold
            if hit == n and words is not None:  # the whole batch: the arrays as they are
                tiers = _clib._CTiers()
                c._check(_clib._match_checked(c._handle(), folded, words, n,
                                              ctypes.byref(tiers)))
                hit = tiers.matched
            else:
                hit = c.match(kvnode.prefix(folded, hit), words and kvnode.prefix(words, hit))
            if hit == 0:
                break
        return hit

    def gathered_pieces(self, n, host_indices):
        """Where the gathered pages' pieces lie: (page bases, distances) from the page-base
        model when it holds, else (every piece's address, None) from the pool."""
        if self.bases is not None and _clib._put_gather is not None:
            if _numel(host_indices) != n * self.page_size:
                raise ValueError("kvnode.sglang: pool %r: %d keys but %d host indices (page "
                                 "size %d)" % (self.name, n, _numel(host_indices),
                                               self.page_size))
            bases = self.bases.of_batch(host_indices)
            if bases is not None:
                return bases, self.bases.at
            self.bases = None       # the pool is not what the model said: ask it from now on
        return self.pointers(n, host_indices), None

    def get(self, clients, folded, words, host_indices):
        """Read the cached prefix into the pages; how many pages were read."""
        n = len(folded)
        if self.gather:
            return self._gather_get(clients[0], folded, words,
                                    self.gathered_pieces(n, host_indices))
        ptrs = self.pointers(n, host_indices)
        hit = n
        for c, j in zip(clients, self.used):
            p = ptrs[j::self.pieces]
            hit = c.get_batch(kvnode.prefix(folded, hit), p if hit == n else p[:hit],
                              checks=words and kvnode.prefix(words, hit))
            if hit == 0:
                break
        return hit

    def put(self, clients, folded, words, host_indices):
        if self.gather:
            return self._gather_put(clients[0], folded, words,
                                    self.gathered_pieces(len(folded), host_indices))
        ptrs = self.pointers(len(folded), host_indices)
        for c, j in zip(clients, self.used):
            c.put_batch(folded, ptrs[j::self.pieces], checks=words)

    # One libkvnode call per batch (KVNODE_0.8: kvnode_put_gather_checked /
    # kvnode_get_scatter_checked) takes the lease, copies every piece and ends the lease.
    # With an older libkvnode the lease calls are made from here (not Client.read / write:
    # those lend a memoryview per block) and the pieces copied in Python.

    def _gather_get(self, client, folded, words, where):
        keys, n = _keys_array(folded)
        checks = _checks_array(words, n)
        if _clib._get_scatter is not None:
            got = _clib._SIZE(0)
            pieces, at = _piece_arrays(where)
            client._check(_clib._get_scatter(client._handle(), keys, checks, n,
                                             _address(pieces), _address(at), self.pieces,
                                             self._c_sizes, self._c_offsets,
                                             ctypes.byref(got)))
            return got.value
        locs, lease, got, h = (_clib._CLoc * max(n, 1))(), _clib._LEASE(0), _clib._SIZE(0), \
            client._handle()
        if checks is None:
            client._check(_clib._get_begin(h, keys, n, ctypes.byref(lease), locs,
                                           ctypes.byref(got)))
        else:
            client._check(client._checked(_clib._get_begin_checked, "read")(
                h, keys, checks, n, ctypes.byref(lease), locs, ctypes.byref(got)))
        got = got.value
        try:
            if got:
                self._gather_python(where[0], [locs[i].ptr for i in range(got)], False)
        finally:
            if lease.value:
                rc = _clib._get_end_wait(h, lease.value)    # the copy counts once the pin held
        if lease.value:
            client._check(rc)
        return got

    def _gather_put(self, client, folded, words, where):
        keys, n = _keys_array(folded)
        checks = _checks_array(words, n)
        if _clib._put_gather is not None:
            pieces, at = _piece_arrays(where)
            client._check(_clib._put_gather(client._handle(), keys, checks, n,
                                            _address(pieces), _address(at), self.pieces,
                                            self._c_sizes, self._c_offsets))
            return
        locs, lease, h = (_clib._CLoc * max(n, 1))(), _clib._LEASE(0), client._handle()
        if checks is None:
            client._check(_clib._put_begin(h, keys, n, kvnode.TIER_HOST, ctypes.byref(lease),
                                           locs))
        else:
            client._check(client._checked(_clib._put_begin_checked, "write")(
                h, keys, checks, n, kvnode.TIER_HOST, ctypes.byref(lease), locs))
        if not lease.value:
            return
        try:        # a slot of None: that key is already stored
            self._gather_python(where[0], [locs[i].ptr for i in range(n)], True)
        except BaseException:
            _clib._put_abort(h, lease.value)
            raise
        client._check(_clib._put_commit(h, lease.value))

    def _gather_python(self, ptrs, blocks, to_blocks):
        """Copy each page's pieces between the pool (ptrs, pieces per page) and its block
        (blocks[i]; None: skipped), into the blocks when to_blocks, with a libkvnode older
        than KVNODE_0.8. Where the pieces of every page sit on one grid (SGLang's
        layer_first: K and V per layer at fixed distances), runs of pages at a constant step
        on both sides move in one strided copy (numpy or torch, C speed); otherwise one
        memmove per piece."""
        grid, m, n = self.grid, self.pieces, len(blocks)
        ops = _array_ops() if grid is not None else None
        if ops is not None:
            strided, copy = ops
            rel = grid.rel
            bases = [ptrs[i * m] for i in range(n)]
            if all([ptrs[i * m:i * m + m] == [bases[i] + r for r in rel] for i in range(n)]):
                i = 0
                while i < n:
                    if blocks[i] is None:
                        i += 1
                        continue
                    c = 1
                    if i + 1 < n and blocks[i + 1] is not None:
                        pstep, bstep = bases[i + 1] - bases[i], blocks[i + 1] - blocks[i]
                        if pstep > 0 and bstep > 0:
                            while (i + c < n and blocks[i + c] is not None
                                   and bases[i + c] - bases[i + c - 1] == pstep
                                   and blocks[i + c] - blocks[i + c - 1] == bstep):
                                c += 1
                    if c == 1:
                        pstep = bstep = 0
                    # pages innermost: each piece's run of pages is contiguous in the pool;
                    # the widest item every address and distance allows (copies run faster)
                    w = grid.itemsize
                    while (bases[i] | blocks[i] | pstep | bstep) % w:
                        w //= 2
                    shape = grid.shape(c, w)
                    pool = strided(bases[i], shape, (grid.pb, grid.pa, pstep, w), w)
                    block = strided(blocks[i] + grid.o0, shape, (grid.ob, grid.oa, bstep, w), w)
                    if to_blocks:
                        copy(block, pool)
                    else:
                        copy(pool, block)
                    i += c
                return
        sizes, offs, memmove = self.piece_sizes, self.piece_offsets, ctypes.memmove
        for i, addr in enumerate(blocks):
            if addr is None:
                continue
            base = i * m
            for j in range(m):
                if sizes[j]:
                    if to_blocks:
                        memmove(addr + offs[j], ptrs[base + j], sizes[j])
                    else:
                        memmove(ptrs[base + j], addr + offs[j], sizes[j])


class _Conn:
    """The clients of one connection generation: per pool, one per namespace."""

    def __init__(self, pools):
        self.pools = pools              # pool name -> [Client]
        self.clients = pools.get(KV_POOL, [])     # the KV pool's
        self.users = 0
        self.retired = False
        every = [c for cs in pools.values() for c in cs]
        # Check words go with every key when the daemon honours them (all clients share it).
        self.checks = all(c.has_check_words for c in every)

    def words(self, checks):
        """checks (a batch's check words) when this connection sends them, else None."""
        return checks if self.checks else None

    def close(self):
        for cs in self.pools.values():
            for c in cs:
                c.close()


class _Stats:
    """What get_stats reports: SGLang's per-call samples (drained by each get_stats) and
    kvnode's counters since start."""

    def __init__(self):
        self.lock = threading.Lock()
        self.samples = {k: collections.deque(maxlen=MAX_SAMPLES) for k in (
            "prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth",
            "exists_latency_ms", "get_latency_ms", "set_latency_ms")}
        self.counters = dict(hits=0, misses=0, pages_read=0, pages_written=0, bytes_read=0,
                             bytes_written=0, failed_calls=0)

    def exists(self, hit, n, seconds):
        with self.lock:
            self.counters["hits"] += hit
            self.counters["misses"] += n - hit
            self.samples["exists_latency_ms"].append(seconds * 1e3)

    def moved(self, kind, pages, nbytes, seconds, v1):
        """kind "get" or "set"; v1: a KV-pool page call (what SGLang's histograms show)."""
        with self.lock:
            self.counters["pages_read" if kind == "get" else "pages_written"] += pages
            self.counters["bytes_read" if kind == "get" else "bytes_written"] += nbytes
            self.samples[kind + "_latency_ms"].append(seconds * 1e3)
            if v1:
                pre = "prefetch" if kind == "get" else "backup"
                self.samples[pre + "_pgs"].append(pages)
                self.samples[pre + "_bandwidth"].append(nbytes / max(seconds, 1e-9) / 1e9)

    def failed(self):
        with self.lock:
            self.counters["failed_calls"] += 1

    def drain(self, cls):
        with self.lock:
            lists = {k: list(v) for k, v in self.samples.items()}
            for v in self.samples.values():
                v.clear()
            counters = dict(self.counters)
        metrics = cls(prefetch_pgs=lists.pop("prefetch_pgs"), backup_pgs=lists.pop("backup_pgs"),
                      prefetch_bandwidth=lists.pop("prefetch_bandwidth"),
                      backup_bandwidth=lists.pop("backup_bandwidth"))
        for k, v in list(counters.items()) + list(lists.items()):
            setattr(metrics, k, v)
        return metrics


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
        self.connect_wait_s = float(opts.get("connect_wait_ms", 20)) / 1000.0
        if self.connect_wait_s < 0:
            raise ValueError("connect_wait_ms must be >= 0, got %r"
                             % opts.get("connect_wait_ms"))
        if self.reconnect_interval_s < 0:
            raise ValueError("reconnect_interval_s must be >= 0, got %r" % self.reconnect_interval_s)
        self.model = str(opts.get("model") or _get(storage_config, "model_name") or "sglang")
        self.dtype = str(opts.get("dtype") or "sglang")
        rev = opts.get("model_revision")
        if rev is not None and (not isinstance(rev, str) or len(rev.encode()) > 127
                                or any(ord(ch) < 0x20 or ord(ch) == 0x7f for ch in rev)):
            raise ValueError("kvnode.sglang: model_revision must be a string of at most 127 bytes "
                             "without control characters, got %r" % (rev,))
        self.model_revision = rev or None
        self.is_mla = bool(_get(storage_config, "is_mla_model", False))
        self.tp_rank = int(_get(storage_config, "tp_rank", 0) or 0)
        self.tp_size = int(_get(storage_config, "tp_size", 1) or 1)
        self.pp_rank = int(_get(storage_config, "pp_rank", 0) or 0)
        self.pp_size = int(_get(storage_config, "pp_size", 1) or 1)
        self.cp_rank = int(_get(storage_config, "attn_cp_rank", 0) or 0)
        self.cp_size = int(_get(storage_config, "attn_cp_size", 1) or 1)
        self.tp_lcm_size = _get(storage_config, "tp_lcm_size")
        self.should_split_heads = bool(_get(storage_config, "should_split_heads", False))
        for what, rank, size in (("tp", self.tp_rank, self.tp_size),
                                 ("pp", self.pp_rank, self.pp_size),
                                 ("attn_cp", self.cp_rank, self.cp_size)):
            if size < 1 or not 0 <= rank < size:
                raise ValueError("kvnode.sglang: %s_rank %d with %s_size %d: the rank must be in "
                                 "[0, size)" % (what, rank, what, size))
        if self.tp_lcm_size is not None:
            self.tp_lcm_size = int(self.tp_lcm_size)
            if self.tp_lcm_size < 1 or self.tp_lcm_size % self.tp_size:
                raise ValueError("kvnode.sglang: tp_lcm_size %d is not a multiple of tp_size %d"
                                 % (self.tp_lcm_size, self.tp_size))
        if self.should_split_heads and self.is_mla:
            raise ValueError("kvnode.sglang: should_split_heads with an MLA model: MLA KV is the "
                             "same on every TP rank and has no heads to split")
        if self.should_split_heads and not self.tp_lcm_size:
            raise ValueError("kvnode.sglang: should_split_heads needs tp_lcm_size")
        self.mem_pool_host = None
        self.registered_pools = {}
        self._plans = {}                # pool name -> _Plan, the KV pool first
        self.page_size = 0
        self.component_bytes = []       # bytes of each KV namespace's block, in order
        self._lock = threading.Lock()
        self._conn = None
        self._connecting = None         # the in-flight connect's Event, or None
        self._gen = 0                   # connect generation: a stale connect is dropped
        self._retry_at = 0.0
        self._warned = False
        self._next_error_log = 0.0
        self._stats = _Stats()
        self._metrics_cls = None

    # ------------------------------------------------------------ pools and connection

    def _ranks(self, pool_name, split):
        """(tp_size, tp_rank) of each namespace group of a pool's pages."""
        if pool_name == KV_POOL and split > 1:
            return [(self.tp_lcm_size, self.tp_rank * split + j) for j in range(split)]
        replicated = self.is_mla and pool_name != "mamba"     # Mamba state is TP-sharded
        return [(1, 0) if replicated else (self.tp_size, self.tp_rank)]

    def _plan(self, pool_name, host_pool):
        split = 1
        if pool_name == KV_POOL and self.should_split_heads:
            split = self.tp_lcm_size // self.tp_size
            layout = getattr(host_pool, "layout", None)
            if layout != "page_head":
                raise ValueError("kvnode.sglang: should_split_heads (tp_lcm_size %d, tp_size %d) "
                                 "needs the page_head host layout, the pool is %r"
                                 % (self.tp_lcm_size, self.tp_size, layout))
            if not callable(getattr(host_pool, "get_split_heads_page_buffer_meta", None)):
                raise ValueError("kvnode.sglang: should_split_heads, but the host pool (%s) has "
                                 "no get_split_heads_page_buffer_meta"
                                 % type(host_pool).__name__)
            heads = getattr(host_pool, "head_num", None)
            if heads is not None and int(heads) % split:
                raise ValueError("kvnode.sglang: should_split_heads: %d heads do not split in %d "
                                 "groups (tp_lcm_size %d / tp_size %d)"
                                 % (heads, split, self.tp_lcm_size, self.tp_size))
        ranks = self._ranks(pool_name, split)
        plan = _Plan(pool_name, host_pool, ranks, split, self.is_mla)
        if pool_name == KV_POOL and not plan.gather and plan.pieces == 1:
            # One piece per page is MLA's shape: ranks share rank 0's namespace.
            self.is_mla = True
            plan = _Plan(pool_name, host_pool, self._ranks(pool_name, split), split, True)
        return plan

    def _install(self, pool_name, plan):
        """Make plan the pool's; a connection (or connect) made without it is retired, and
        a connect with every namespace starts now, on its own thread, so the engine's first
        call finds it made."""
        close = None
        with self._lock:
            self._plans[pool_name] = plan
            if pool_name == KV_POOL:    # the KV pool first
                self._plans = dict([(KV_POOL, plan)] + [(k, v) for k, v in self._plans.items()
                                                          if k != KV_POOL])
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.retired = True
                close = conn if conn.users == 0 else None
            self._retry_at = 0.0
            self._start_connect()
        if close is not None:
            close.close()

    def register_mem_pool_host(self, mem_pool_host):
        """Take the host KV pool; its page geometry and layout set the kvnode namespaces.
        Raises ValueError (refusing the attach) for a pool or TP setup it cannot serve.
        A hybrid model's pool group (HostPoolGroup: ``anchor_entry``, ``entries``) stands
        for its anchor pool here; the others come through register_mem_host_pool_v2."""
        anchor = getattr(getattr(mem_pool_host, "anchor_entry", None), "host_pool", None)
        plan = self._plan(KV_POOL, anchor if anchor is not None else mem_pool_host)
        self.mem_pool_host = mem_pool_host
        self.page_size = plan.page_size
        self.component_bytes = [nbytes for _, nbytes, _, _ in plan.components]
        self._install(KV_POOL, plan)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """Take a host pool the v2 calls name (SGLang registers each of the hybrid pool's
        entries, the KV pool among them)."""
        name = _name(host_pool_name)
        self.registered_pools[host_pool_name] = host_pool
        if name == KV_POOL:
            if self.mem_pool_host is None:
                self.register_mem_pool_host(host_pool)
            return
        self._install(name, self._plan(name, host_pool))

    def _layouts(self):
        """Every namespace's layout, the KV pool's first."""
        return [lay for lays in self._pool_layouts().values() for lay in lays]

    def _pool_layouts(self):
        suffix = ""
        if self.pp_size > 1:
            suffix += "/pp%d-%d" % (self.pp_rank, self.pp_size)
        if self.cp_size > 1:
            suffix += "/cp%d-%d" % (self.cp_rank, self.cp_size)
        return {name: [dataclasses.replace(lay, revision=self.model_revision)
                       for lay in plan.layouts(self.model, self.dtype, suffix)]
                for name, plan in self._plans.items()}

    def _acquire(self):
        """The current connection, counted as in use; None while the daemon cannot be
        reached. A connect runs on a thread of its own (_start_connect), never under the
        lock or on the caller's thread: the caller waits for it at most connect_wait_ms,
        then answers a miss (SGLang calls from its controller's threads, holding its locks)."""
        with self._lock:
            if self._conn is None:
                if self._connecting is None:
                    if not self._plans or time.monotonic() < self._retry_at:
                        return None
                    self._start_connect()
                pending = self._connecting
            else:
                self._conn.users += 1
                return self._conn
        pending.wait(self.connect_wait_s)
        with self._lock:
            if self._conn is None:
                self._warn("kvnoded has not answered the connect within %d ms (it goes on, "
                           "bounded by timeout_ms, on a thread of its own)"
                           % (self.connect_wait_s * 1000))
                return None
            self._conn.users += 1
            return self._conn

    def _start_connect(self):
        """Connect every namespace on a new thread. Lock held. _thread, not threading.Thread,
        whose start() waits until the new thread runs (the caller must not wait)."""
        self._gen += 1
        self._connecting = threading.Event()
        _thread.start_new_thread(self._connect, (self._gen, self._connecting,
                                                 self._pool_layouts()))

    def _connect(self, gen, done, layouts):
        """One connect attempt (each client's connect bounded by timeout_ms)."""
        clients, err = {}, None
        try:
            for name, lays in layouts.items():
                clients[name] = []
                for lay in lays:
                    clients[name].append(kvnode.Client(self.socket_path, lay, self.timeout_ms))
        except Exception as e:  # noqa: BLE001 - reported as a warning; calls answer misses
            err = e
        try:
            with self._lock:
                current = gen == self._gen
                if current:
                    self._connecting = None
                    if err is not None:
                        self._retry_at = time.monotonic() + self.reconnect_interval_s
                    else:
                        self._conn = _Conn(clients)
                        if self._warned:
                            logger.warning("kvnode.sglang: reconnected to kvnoded")
                        self._warned = False
            if err is not None:
                self._warn("cannot connect to kvnoded: %s: %s" % (type(err).__name__, err))
            if err is not None or not current:      # failed, or pools changed meanwhile
                for cs in clients.values():
                    for c in cs:
                        c.close()
        finally:
            done.set()

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
                for cs in conn.pools.values():
                    for c in cs:
                        try:
                            c.cancel()
                        except kvnode.Error:
                            pass
            close = conn.retired and conn.users == 0
        if error is not None:
            self._stats.failed()
        if isinstance(error, _DISCONNECTED):
            self._warn("%s: %s" % (type(error).__name__, error))
        elif error is not None:     # e.g. NoSpace: this call failed, the connection is fine
            self._log_error("a call failed (%s: %s); it answered 'not cached' / 'not stored'"
                            % (type(error).__name__, error))
        if close:
            conn.close()

    def _log_error(self, text):
        now = time.monotonic()
        if now >= self._next_error_log:
            self._next_error_log = now + 10.0
            logger.warning("kvnode.sglang: %s (logged at most every 10 s)", text)

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
        """Disconnect (also at interpreter exit, through the clients' finalisers); a
        connect under way is dropped when it ends."""
        with self._lock:
            self._gen += 1
            self._connecting = None
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.retired = True
                close = conn.users == 0
        if conn is not None and close:
            conn.close()

    # ------------------------------------------------------------ prefix

    def batch_exists(self, keys, extra_info=None):
        """Length of the cached prefix of ``keys`` (every KV namespace holding it)."""
        if not keys:
            return 0
        t0 = time.perf_counter()
        try:
            folded, checks = kvnode.fold_digests(keys)
        except Exception as e:  # noqa: BLE001 - nothing may escape into the engine
            self._log_error("batch_exists: %s" % e)
            return 0
        plan = self._plans.get(KV_POOL)
        if plan is None:
            return 0
        hit = self._run(lambda conn: plan.match(conn.pools[KV_POOL], folded,
                                                conn.words(checks)), 0)
        self._stats.exists(hit, len(keys), time.perf_counter() - t0)
        return hit

    def exists(self, key):
        return self.batch_exists([key]) == 1

    # ------------------------------------------------------------ zero-copy page paths

    def _transfer(self, kind, pool_name, keys, host_indices, v1):
        """get or set the pages of keys at host_indices of one pool; how many pages (a
        prefix for get; all or none for set). Never raises."""
        n = len(keys)
        plan = self._plans.get(pool_name)
        if plan is None:
            self._log_error("no host pool %r registered; its %d pages answer False"
                            % (pool_name, n))
            return 0
        t0 = time.perf_counter()
        try:
            folded, checks = kvnode.fold_digests(keys)
        except Exception as e:  # noqa: BLE001
            self._log_error("%s: %s" % (kind, e))
            return 0

        def get(conn):
            return plan.get(conn.pools[pool_name], folded, conn.words(checks), host_indices)

        def put(conn):
            plan.put(conn.pools[pool_name], folded, conn.words(checks), host_indices)
            return n
        done = self._run(get if kind == "get" else put, 0)
        if done:
            self._stats.moved(kind, done, done * plan.page_bytes, time.perf_counter() - t0, v1)
        return done

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Read the cached prefix of ``keys`` into the host pool pages at ``host_indices``;
        a list of bools (True for the pages read: a prefix)."""
        n = len(keys)
        if n == 0:
            return []
        hit = self._transfer("get", KV_POOL, keys, host_indices, True)
        return [True] * hit + [False] * (n - hit)

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Store the host pool pages at ``host_indices`` under ``keys``; a list of bools."""
        n = len(keys)
        if n == 0:
            return []
        return [self._transfer("set", KV_POOL, keys, host_indices, True) == n] * n

    # ------------------------------------------------------------ v2: hybrid pools

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The usable prefix of ``keys``: KV pages present, clamped by each transfer's pool
        (``all_pages``: every page of the prefix; ``trailing_pages``: the last
        ``len(transfer.keys)`` pages of it). A ``PoolTransferResult``; never raises."""
        result = _result_class()
        try:
            kv_hit = self.batch_exists(keys, extra_info) if keys else 0
            hits = {self._kv_name(): kv_hit} if kv_hit else {}
            final = kv_hit
            for transfer in pool_transfers or []:
                if final == 0:
                    break
                boundary = self._pool_boundary(transfer, keys, kv_hit)
                if boundary:
                    hits[transfer.name] = boundary
                final = min(final, boundary)
            return result(final, hits)
        except Exception as e:  # noqa: BLE001 - nothing may escape into the engine
            self._log_error("batch_exists_v2: %s: %s" % (type(e).__name__, e))
            return result(0, {})

    @staticmethod
    def _kv_name():
        enum = _sglang_class("sglang.srt.mem_cache.hicache_storage", "PoolName")
        return enum.KV if enum is not None else KV_POOL

    def _pool_boundary(self, transfer, keys, kv_hit):
        """How much of the KV prefix keys[:kv_hit] transfer's pool can serve."""
        name = _name(transfer.name)
        plan = self._plans.get(name)
        if plan is None:
            self._log_error("batch_exists_v2: no host pool %r registered" % name)
            return 0
        folded, checks = kvnode.fold_digests(keys[:kv_hit])

        def present(conn, lo, hi):       # pages [lo, hi) all there
            words = conn.words(checks)
            return plan.match(conn.pools[name], _slice(folded, lo, hi),
                              words and _slice(words, lo, hi)) == hi - lo

        if _name(transfer.hit_policy) != "trailing_pages":
            return self._run(lambda conn: plan.match(conn.pools[name], folded,
                                                     conn.words(checks)), 0)
        trailing = max(1, len(transfer.keys) if transfer.keys else 1)

        def longest(conn):
            for end in range(kv_hit, 0, -1):
                if present(conn, max(0, end - trailing), end):
                    return end
            return 0
        return self._run(longest, 0)

    def _batch_v2(self, kind, transfers):
        results = {}
        for transfer in transfers or []:
            keys = list(transfer.keys or [])
            n = len(keys)
            try:
                name = _name(transfer.name)
                indices = transfer.host_indices
                plan = self._plans.get(name)
                if indices is None or (plan is not None
                                       and _numel(indices) != n * plan.page_size):
                    self._log_error("batch_%s_v2: pool %r: %d keys but %s host indices"
                                    % (kind, name, n, None if indices is None else
                                       _numel(indices)))
                    done = 0
                elif n == 0:
                    done = 0
                else:
                    done = self._transfer(kind, name, keys, indices, False)
            except Exception as e:  # noqa: BLE001 - nothing may escape into the engine
                self._log_error("batch_%s_v2: %s: %s" % (kind, type(e).__name__, e))
                done = 0
            if kind == "set":
                done = n if done == n else 0
            results[transfer.name] = [True] * done + [False] * (n - done)
        return results

    def batch_get_v2(self, transfers, extra_info=None):
        """Read each transfer's pages (its pool's pages at its host indices); per pool name,
        a list of bools (a prefix of True). Never raises."""
        return self._batch_v2("get", transfers)

    def batch_set_v2(self, transfers, extra_info=None):
        """Store each transfer's pages; per pool name, a list of bools. Never raises."""
        return self._batch_v2("set", transfers)

    # ------------------------------------------------------------ flat-page paths

    def _components(self, page):
        """The per-component pieces of one flat page (K bytes then V bytes): addresses for
        an int or a tensor, memoryview slices for a buffer."""
        offs = self._plans[KV_POOL].flat_offsets
        total = sum(self.component_bytes)
        if isinstance(page, int):
            return [page + o for o in offs]
        if callable(getattr(page, "data_ptr", None)):
            return [int(page.data_ptr()) + o for o in offs]
        mv = memoryview(page).cast("B")
        if mv.nbytes < total:
            raise ValueError("a page of %d bytes, expected %d" % (mv.nbytes, total))
        return [mv[o:o + nb] for o, nb in zip(offs, self.component_bytes)]

    def _flat_clients(self, conn):
        return conn.pools[KV_POOL]

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
            for j, c in enumerate(self._flat_clients(conn)):
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
            for j, c in enumerate(self._flat_clients(conn)):
                c.put_batch(folded, [p[j] for p in pieces], checks=words)
            return True
        return self._run(put, False)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        page = value if value is not None else target_location
        return self.batch_set([key], [page]) if page is not None else False

    # ------------------------------------------------------------ rest of HiCacheStorage

    def delete(self, key):
        """Remove one page (every namespace of every pool)."""
        folded, checks = kvnode.fold_digests([key])
        self._run(lambda conn: [c.delete(folded, conn.words(checks))
                                for cs in conn.pools.values() for c in cs], None)

    def clear(self):
        """Drop every page of this deployment from kvnoded (see the module docstring): one
        purge per deployment of the registered pools, on connections of its own. Raises on
        failure (SGLang logs it and answers that the clear failed)."""
        with self._lock:
            layouts = [lay for lays in self._pool_layouts().values() for lay in lays]
        if not layouts:
            raise RuntimeError("kvnode.sglang: clear() before a host pool was registered: the "
                               "deployment to clear is not known yet")
        blocks, deployments = kvnode.purge_layouts(self.socket_path, layouts, self.timeout_ms)
        logger.info("kvnode.sglang: clear() dropped %d pages' blocks of %d kvnode deployments",
                    blocks, deployments)

    def get_stats(self):
        """SGLang's StorageMetrics of the calls since the previous get_stats, with kvnode's
        counters as attributes (see the module docstring). Never raises."""
        try:
            if self._metrics_cls is None:
                self._metrics_cls = _metrics_class()
            return self._stats.drain(self._metrics_cls)
        except Exception as e:  # noqa: BLE001
            self._log_error("get_stats: %s: %s" % (type(e).__name__, e))
            return None
