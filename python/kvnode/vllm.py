"""vLLM v1 KV connector on kvnode: ``kvnode.vllm.KvnodeConnector``.

Load it in vLLM with::

    vllm serve Qwen/Qwen3-8B --kv-transfer-config '{"kv_connector": "KvnodeConnector",
        "kv_connector_module_path": "kvnode.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket_path": "/run/kvnode/kvnode.sock"}}'

vLLM's factory imports ``kv_connector_module_path``, takes ``kv_connector`` from it and builds
one instance in the scheduler process (role SCHEDULER) and one in each worker (role WORKER,
one per TP and PP rank) as ``KvnodeConnector(vllm_config, role, kv_cache_config)``. When vLLM
is importable the class subclasses its ``KVConnectorBase_V1``; when it is not, a stand-in
base with the same worker-side plumbing (``bind_connector_metadata`` ...), so the module
imports without vLLM (``HAVE_VLLM`` says which, ``VLLM_IMPORT_ERROR`` why).

What runs where:

- Scheduler: ``get_num_new_matched_tokens`` MATCHes the request's block keys (the
  publishable block hashes past the prefix vLLM holds itself - kvnode need not hold that
  prefix - short of the block holding the prompt's last token: vLLM computes at least one
  token) in each rank's namespace (every TP rank and PP stage; MLA: the one its TP ranks
  share), each MATCH asking only the prefix the ranks before it hold, so every worker can
  load what it answers. It stores nothing in kvnode and answers 0 when kvnoded is down,
  slow or a call fails. ``update_state_after_alloc`` turns
  a match into a load of the blocks vLLM allocated for it; ``build_connector_meta`` hands this
  step's loads and saves to the workers (block ids and words: picklable).
  ``request_finished`` plans a save of the request's full, publishable blocks and returns
  True: vLLM keeps the blocks until the workers report the save done (``get_finished``); a
  request with nothing to save returns False. ``reset_cache`` purges the deployment (every
  TP rank and PP stage) from kvnoded's memory and store (``kvnode.purge_layouts``); True
  when done, False on failure.
- Workers: ``register_kv_caches`` takes the per-layer paged KV caches in vLLM's shapes, CPU
  or CUDA torch tensors (one device per worker): K/V split ``(2, num_blocks, block_size,
  heads, head_dim)`` (FlashAttention before the packed layout, most backends), stacked
  ``(num_blocks, 2, block_size, heads, head_dim)`` (FlashInfer before it), K|V-packed
  ``(num_blocks, heads, block_size, 2 * head_dim)`` (newer FlashAttention and FlashInfer: K
  the first half of the last dimension) and MLA ``(num_blocks, block_size, head_dim)``, each
  in NHD or HND memory order (FlashInfer's ``get_kv_cache_stride_order``: heads before
  tokens; any order whose head vectors are runs of memory). A vLLM block is one kvnode
  block: for each layer in order, K then V of its ``block_size`` tokens, token-major (NHD
  order; MLA: the latent), whatever the cache's layout, so split, stacked, packed, NHD and
  HND caches share blocks byte-exact (a cache whose K of a block is not one run moves in
  pieces of one head vector, put in that order). CPU tensors move by the host gathered
  calls, CUDA tensors by their device form (``kvnode_put_gather_stream`` /
  ``kvnode_get_scatter_stream``: cudaMemcpyAsync per run of memory, loads on the legacy
  default stream, saves on a non-blocking torch stream, complete before the call returns;
  an HND block's runs go whole through pinned host memory and the CPU puts the head
  vectors in order). ``get_required_kvcache_layout``
  still asks for NHD, whose blocks move with the fewest copies. ``prefer_cross_layer_blocks``
  is True (extra config ``cross_layer_blocks``): for models with uniform layers vLLM then
  allocates one tensor for every layer and calls ``register_cross_layers_kv_cache``; each
  block of it lies in one run of memory in that same order (checked) and moves whole
  (``kvnode_get_batch`` / ``kvnode_put_batch``; CUDA tensors by libkvnode's device copies,
  the client declaring the tensor's device; a K|V-packed cross-layer cache moves in pieces,
  on a GPU by the device gathered calls). The device paths run against the strict fake CUDA
  in ``scripts/gpu-check.sh --sim`` and the Python suite, not yet on a GPU.
  ``start_load_kv`` copies each
  load straight from kvnoded's shared memory into the paged blocks (one
  ``kvnode_get_scatter_checked`` per request: every piece of every block, lease included);
  a block it could not load is reported by ``get_block_ids_with_load_errors`` (vLLM then
  recomputes from it under ``kv_load_failure_policy`` ``recompute``, fails the request under
  its default ``fail``: a block is never taken as loaded unless its copy completed).
  ``wait_for_layer_load`` returns at once (loads are done when ``start_load_kv`` returns).
  With ``async_load_min_blocks`` N > 0, a hit of at least N blocks loads asynchronously
  (``get_num_new_matched_tokens`` answers True): vLLM parks the request
  (WAITING_FOR_REMOTE_KVS), the worker's thread makes the load, and ``get_finished``
  reports the request (its failed blocks reported by then) in its second set.
  Saves copy blocks vLLM holds for them (``kvnode_put_gather_checked``, blocks already
  stored skipped; the digests folded to keys in the same step): a step's saves of at most
  ``inline_save_bytes`` in all are made on vLLM's thread in ``wait_for_save``, after the
  forward is launched (no save reads a block the forward writes), or in ``get_finished``
  when vLLM asks that first (a draft model's forward between them) or without
  ``wait_for_save`` (older vLLM, a step with nothing to compute); the step's other saves
  run on the worker's thread. ``get_finished`` reports a request once its save has ended
  and vLLM has named it finished (``get_transfer_results``, which newer vLLM asks instead,
  gives the same sets): a save made on vLLM's thread in the step that carried it. A worker
  whose caches it cannot move drops its saves (counted) and still reports them;
  ``save_kv_layer`` has nothing to do. ``get_kv_connector_stats`` gives the counters of the
  interval since the previous call; ``shutdown`` makes the saves kept and queued (at most
  ``timeout_ms`` each) and disconnects.

Keys: vLLM's block hashes (``request.block_hashes``: ``BlockHash``, a NewType of bytes; only
the first ``request.num_publishable_block_hashes``, as vLLM requires of content-addressed
connectors, where vLLM has that count) folded by :func:`kvnode.fold_digests` (key: the hash's
first 64 bits, check word: the next 64, sent beside the key whenever kvnoded honours check
words). vLLM seeds its hash chain from ``PYTHONHASHSEED`` (the first block's parent is the
hash function of that string; without it 32 random bytes): instances that are to share
blocks must run with the same ``PYTHONHASHSEED`` and ``--prefix-caching-hash-algo``
(without ``PYTHONHASHSEED`` each vLLM process finds only its own blocks).

Namespaces: one per (model, revision, KV geometry and dtype, TP rank, PP stage): ``model``
(default the served model), ``model_revision`` (default vLLM's ``--revision``),
``block_tokens`` vLLM's ``block_size``, ``block_bytes`` layers x (2 or 1) x block_size x heads
x head_dim x element size, extra ``vllm/kv`` (``vllm/mla``), plus ``/pp<rank>-<size>`` under
pipeline parallelism. MLA caches are the same on every TP rank: rank 0 saves and every rank
loads rank 0's. Layers per stage are vLLM's split (``get_pp_indices``).

Never raising into vLLM: every method catches and logs (once per kind of failure), and
answers what means "nothing": no match, the load's blocks reported as errors, a save dropped
(counted in ``saves_dropped_blocks``, the request still reported finished). Connections are
made on a thread of their own (a call waits at most ``connect_wait_ms`` for one under way),
remade after kvnoded went away (at most once per ``reconnect_interval_s``); every call is
bounded by ``timeout_ms``.

``kv_connector_extra_config`` keys (any other is refused with a ``ValueError`` naming the
valid ones): ``socket_path`` (default ``$KVNODE_SOCKET``, else libkvnode's),
``timeout_ms`` (default 2000), ``connect_wait_ms`` (default 20), ``reconnect_interval_s``
(default 1), ``model``, ``model_revision``, ``cross_layer_blocks`` (default true),
``async_load_min_blocks`` (default 0: every load synchronous), ``inline_save_bytes``
(default 8 MiB, about a millisecond of copying: a step's saves up to that many bytes are made
on vLLM's thread as the step ends; the others, and all with 0, on the worker's thread).
"""

import _thread
import array
import ctypes
import dataclasses
import enum
import logging
import os
import queue
import threading
import time

import kvnode
from kvnode import _lib as _clib
from kvnode import gathered

__all__ = ["KvnodeConnector", "KvnodeConnectorMetadata", "KvnodeConnectorStats", "HAVE_VLLM"]

logger = logging.getLogger(__name__)

try:    # vLLM's base class when vLLM is there; any failure of its import leaves the stand-in
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: F401
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
    HAVE_VLLM, VLLM_IMPORT_ERROR = True, None
except Exception as _e:     # noqa: BLE001 - ImportError, or vLLM failing to import
    HAVE_VLLM, VLLM_IMPORT_ERROR = False, "%s: %s" % (type(_e).__name__, _e)

    class KVConnectorRole(enum.Enum):
        """Stand-in for vLLM's (same members and values)."""
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:
        """Stand-in for vLLM's (an empty base)."""

    class KVConnectorBase_V1:
        """Stand-in for vLLM's base class: its constructor's state and the worker side's
        metadata plumbing, which vLLM's model runner calls around every step."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self):
            return self._connector_metadata is not None

    logger.info("kvnode.vllm: vLLM is not importable (%s); KvnodeConnector uses a stand-in "
                "base class", VLLM_IMPORT_ERROR)

try:    # what newer vLLM's model runner asks of a worker each step instead of get_finished
    from vllm.distributed.kv_transfer.kv_connector.v1.base import \
        KVConnectorTransferResults  # noqa: F401
except Exception:       # noqa: BLE001 - no vLLM, or one that calls get_finished
    @dataclasses.dataclass
    class KVConnectorTransferResults:
        """Stand-in for vLLM's (the fields the connector fills)."""
        finished_sending: set = dataclasses.field(default_factory=set)
        finished_recving: set = dataclasses.field(default_factory=set)
        failed_recving: set = dataclasses.field(default_factory=set)

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import \
        KVConnectorStats as _StatsBase
except Exception:       # noqa: BLE001 - no vLLM, or one without connector stats
    _StatsBase = object

_DISCONNECTED = (kvnode.Closed, kvnode.ConnectError, kvnode.TimedOut, kvnode.ShuttingDown,
                 kvnode.IOFailure, kvnode.ProtocolError)

#: kv_connector_extra_config keys and their defaults (any other key is refused).
PARAMS = {"socket_path": None, "timeout_ms": 2000, "connect_wait_ms": 20,
          "reconnect_interval_s": 1.0, "model": None, "model_revision": None,
          "cross_layer_blocks": True, "async_load_min_blocks": 0,
          "inline_save_bytes": 8 << 20}

_COUNTERS = ("blocks_loaded", "load_error_blocks", "blocks_saved", "saves_dropped_blocks",
             "bytes_loaded", "bytes_saved", "load_calls", "save_calls")


@dataclasses.dataclass
class KvnodeConnectorStats(_StatsBase):
    """The workers' counters of one interval (``data``: name -> number), in the shape of
    vLLM's ``KVConnectorStats`` (reset, aggregate, reduce, is_empty)."""

    data: dict = dataclasses.field(default_factory=dict)

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        for k, v in (other.data or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self):
        return dict(self.data)

    def is_empty(self):
        return not any(self.data.values())


def _words(code, ctypes_array, start=0):
    """The items of a ctypes array of 64-bit keys or check words from start on, as an
    array.array (picklable, as the metadata must be; the worker's call takes it back
    without a copy: _ctypes_words). One copy."""
    words = array.array(code)
    words.frombytes(memoryview(ctypes_array).cast("B")[start * 8:])
    return words


def _tail(ctypes_array, start):
    """The items of a ctypes array from start on, over the same memory (no copy)."""
    n = len(ctypes_array) - start
    return (ctypes_array._type_ * n).from_buffer(ctypes_array, start * ctypes.sizeof(
        ctypes_array._type_))


def _fold_words(hashes):
    """_fold_hashes into array.array words (the metadata's own, picklable): folded in place
    when the hashes are raw digests, no copy after the fold."""
    n = len(hashes)
    if n and type(hashes[0]) is bytes and len(hashes[0]) >= 16 and \
            _clib._fold_digests is not None:
        size = len(hashes[0])
        raw = b"".join(hashes)
        if len(raw) == size * n and len(hashes[-1]) == size:
            keys, checks = array.array("q", [0]) * n, array.array("Q", [0]) * n
            if _clib._fold_digests(raw, n, size, (ctypes.c_int64 * n).from_buffer(keys),
                                   (ctypes.c_uint64 * n).from_buffer(checks)) == n:
                return keys, checks
    keys, checks = _fold_hashes(hashes)
    return _words("q", keys), _words("Q", checks)


def _ctypes_words(ctype, words):
    return (ctype * len(words)).from_buffer(words) if len(words) else (ctype * 0)()


@dataclasses.dataclass
class _Transfer:
    """One request's blocks to load or save: vLLM block ids and their folded keys and check
    words (array.array of 64-bit words), or (a save) the blocks' raw digests, digest_size
    bytes each, which the worker folds into the call's arrays (_transfer_words)."""
    req_id: str
    block_ids: list
    keys: list
    checks: list
    asynchronous: bool = False      # a load the worker's thread makes (get_finished says)
    digests: bytes = None
    digest_size: int = 0


def _transfer_words(transfer, n):
    """The transfer's n keys and check words as ctypes arrays for libkvnode: its digests
    folded in one call (kvnode_fold_digests), or its words without a copy."""
    if transfer.digests is None:
        return _ctypes_words(ctypes.c_int64, transfer.keys), \
            _ctypes_words(ctypes.c_uint64, transfer.checks)
    keys, checks = (ctypes.c_int64 * n)(), (ctypes.c_uint64 * n)()
    if _clib._fold_digests(transfer.digests, n, transfer.digest_size, keys, checks) != n:
        raise ValueError("%d digests of %d bytes do not fold into %d keys"
                         % (len(transfer.digests) // max(transfer.digest_size, 1),
                            transfer.digest_size, n))
    return keys, checks


class KvnodeConnectorMetadata(KVConnectorMetadata):
    """What the scheduler side hands the workers each step (picklable: lists of ints)."""

    def __init__(self, loads=(), saves=()):
        self.loads = list(loads)
        self.saves = list(saves)


class _Geometry:
    """The KV cache of one worker as kvnode sees it: block tokens, heads, head size, the
    element type, MLA or not, and the layer names (all stages)."""

    def __init__(self, block_size, heads, head_dim, dtype, elem_size, mla, layers):
        self.block_size, self.heads, self.head_dim = int(block_size), int(heads), int(head_dim)
        self.dtype, self.elem_size, self.mla = dtype, int(elem_size), bool(mla)
        self.layers = list(layers)

    def layer_bytes(self):
        """Bytes of one layer of one block: K and V (MLA: the latent)."""
        return (1 if self.mla else 2) * self.block_size * self.heads * self.head_dim * \
            self.elem_size


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _elem_size(dtype):
    size = getattr(dtype, "itemsize", None)
    if size is None:
        import torch
        size = torch.empty((), dtype=dtype).element_size()
    return int(size)


def _spec_geometry(kv_cache_config):
    """The geometry vLLM's KVCacheConfig gives (one KV cache group: no hybrid models)."""
    groups = list(kv_cache_config.kv_cache_groups)
    if len(groups) != 1:
        raise ValueError("kvnode.vllm: %d KV cache groups (a hybrid model); this connector "
                         "serves models with one" % len(groups))
    spec = groups[0].kv_cache_spec
    mla = "MLA" in type(spec).__name__ or bool(getattr(spec, "use_mla", False))
    return _Geometry(spec.block_size, spec.num_kv_heads, spec.head_size,
                     _dtype_name(spec.dtype), _elem_size(spec.dtype), mla,
                     groups[0].layer_names)


def _stage_layers(nlayers, pp_rank, pp_size):
    """How many of nlayers layers PP stage pp_rank holds (vLLM's get_pp_indices)."""
    if pp_size == 1:
        return nlayers
    try:
        from vllm.distributed.utils import get_pp_indices
        start, end = get_pp_indices(nlayers, pp_rank, pp_size)
        return end - start
    except Exception:       # noqa: BLE001 - no vLLM: its default split
        parts = [nlayers // pp_size] * pp_size
        for i in range(2, nlayers % pp_size + 2):
            parts[-i] += 1
        return parts[pp_rank]


def _fold_hashes(hashes):
    """kvnode.fold_digests of the hashes' hex digits (keys and check words), in one call
    into libkvnode on the raw bytes when every hash is bytes of one length of at least 16
    (vLLM's SHA-256 hashes: 32): the same words, without a hex string per block."""
    n = len(hashes)
    if n and type(hashes[0]) is bytes and len(hashes[0]) >= 16 and \
            _clib._fold_digests is not None:
        size = len(hashes[0])
        raw = b"".join(hashes)
        if len(raw) == size * n and len(hashes[-1]) == size:    # (one hash function)
            keys, checks = (ctypes.c_int64 * n)(), (ctypes.c_uint64 * n)()
            if _clib._fold_digests(raw, n, size, keys, checks) == n:
                return keys, checks
    return kvnode.fold_digests([_hex(h) for h in hashes])


def _hex(block_hash):
    """A vLLM block hash (bytes; an int, or an object with ``hash_value`` in older
    releases) as hex digits for kvnode.fold_digests."""
    if isinstance(block_hash, (bytes, bytearray, memoryview)):
        return bytes(block_hash).hex()
    value = getattr(block_hash, "hash_value", block_hash)
    return "%064x" % (int(value) & ((1 << 256) - 1))


def _packed_pieces(base, layers, tokens, heads, half):
    """Where the pieces of one block of a K|V-packed cache lie (address, size), in kvnode's
    block order: for each layer, K of every (token, head) then V of each; in memory layer,
    token, head, then K and V of half bytes each (vLLM's packed layouts under NHD)."""
    ptrs = []
    for layer in range(layers):
        first = [base + ((layer * tokens + i) * heads + h) * 2 * half
                 for i in range(tokens) for h in range(heads)]
        ptrs += first + [p + half for p in first]
    return ptrs, [half] * len(ptrs)


def _tensor_device(t, what):
    """The CUDA ordinal of a tensor's device, -1 for the CPU; other devices refused."""
    if t.device.type == "cuda":
        return t.device.index if t.device.index is not None else 0
    if t.device.type != "cpu":
        raise ValueError("%s is a %s tensor: kvnode moves CPU and CUDA memory"
                         % (what, t.device.type))
    return -1


def _device_name(device):
    return "cpu" if device < 0 else "cuda:%d" % device


def _need_gathered(device):
    if not gathered.available():
        raise ValueError("libkvnode %s has no gathered calls (KVNODE_0.8)"
                         % kvnode.library_path())
    if device >= 0 and not gathered.device_available():
        raise ValueError("libkvnode %s has no gathered calls for GPU memory "
                         "(kvnode_put_gather_stream)" % kvnode.library_path())


def _view_pieces(v, es, name):
    """The pieces of one layer's K (or V, or MLA latent) of a block, a (tokens, heads, dim)
    view, in kvnode's order (token-major, NHD): one when the view is one run of memory
    (NHD caches), else one per (token, head) (HND caches: FlashInfer's stride order, heads
    before tokens in memory; K|V-packed caches). libkvnode merges pieces that lie end to
    end and, on a GPU, copies an HND block's runs whole through pinned host memory."""
    if v.stride(2) != 1 and v.shape[2] > 1:
        raise ValueError("layer %s: a head's vector is not one run of memory (strides %s)"
                         % (name, v.stride()))
    row = v.shape[2] * es
    if v.is_contiguous():
        return [v.data_ptr()], [v.numel() * es]
    base, st, sh = v.data_ptr(), v.stride(0) * es, v.stride(1) * es
    ptrs = [base + i * st + h * sh for i in range(v.shape[0]) for h in range(v.shape[1])]
    return ptrs, [row] * len(ptrs)


class _GatheredBlocks:
    """A vLLM block in pieces over per-layer caches (K and V of each layer): moved by
    kvnode_put_gather_checked / kvnode_get_scatter_checked, one call per batch; pieces in
    GPU memory (device: the CUDA ordinal, -1 for host memory) by their device form,
    kvnode_put_gather_stream / kvnode_get_scatter_stream, complete on return: loads on the
    legacy default stream (after the model's work on the device's blocking streams), saves
    on a non-blocking stream of torch's where torch has CUDA (a save reads blocks whose
    writes vLLM has finished, and must not hold up the next forward), else the legacy one."""

    def __init__(self, base, step, pieces, device=-1):
        self.base, self.step, self.pieces, self.device = base, step, pieces, device
        self.block_bytes = pieces.block_bytes
        self._pieces = pieces._args()
        self._save_stream = None        # (torch stream, its handle), made on the first save

    def _saves_on(self):
        if self._save_stream is None:
            self._save_stream = (None, None)
            try:
                import torch
                if torch.cuda.is_available():
                    st = torch.cuda.Stream(device=self.device)
                    self._save_stream = (st, st.cuda_stream)
            except Exception:   # noqa: BLE001 - no CUDA torch: the legacy default stream
                pass
        return self._save_stream[1]

    def _bases(self, block_ids):
        base, step = self.base, self.step
        return array.array(gathered._ADDRESS, [base + b * step for b in block_ids])

    def load(self, c, keys, block_ids, checks):
        """gathered.get_scattered, its arguments made once per call (keys and checks: the
        metadata's arrays, len(block_ids) of each)."""
        n = len(block_ids)
        if not n:
            return 0
        got, bases = _clib._SIZE(0), self._bases(block_ids)     # (bases: alive until it ends)
        if self.device >= 0:
            c._check(_clib._get_scatter_stream(c._handle(), keys, checks, n,
                                               bases.buffer_info()[0], *self._pieces,
                                               _clib._BATCH_DEVICE, None, ctypes.byref(got)))
        else:
            c._check(_clib._get_scatter(c._handle(), keys, checks, n, bases.buffer_info()[0],
                                        *self._pieces, ctypes.byref(got)))
        return got.value

    def save(self, c, keys, block_ids, checks):
        """gathered.put_gathered, likewise."""
        n = len(block_ids)
        if n:
            bases = self._bases(block_ids)
            if self.device >= 0:
                c._check(_clib._put_gather_stream(c._handle(), keys, checks, n,
                                                  bases.buffer_info()[0], *self._pieces,
                                                  _clib._BATCH_DEVICE, self._saves_on()))
            else:
                c._check(_clib._put_gather(c._handle(), keys, checks, n,
                                           bases.buffer_info()[0], *self._pieces))


class _WholeBlocks:
    """A vLLM block as one run of memory (a cross-layer cache: every layer's K and V of the
    block together): moved by kvnode_get_batch / kvnode_put_batch, on a GPU by libkvnode's
    device copies (device: the CUDA ordinal, -1 for host memory)."""

    def __init__(self, base, step, block_bytes, device):
        self.base, self.step, self.block_bytes, self.device = base, step, block_bytes, device

    def load(self, c, keys, block_ids, checks):
        return c.get_batch(keys, [self.base + b * self.step for b in block_ids],
                           device=self.device >= 0, checks=checks)

    def save(self, c, keys, block_ids, checks):
        c.put_batch(keys, [self.base + b * self.step for b in block_ids],
                    device=self.device >= 0, checks=checks)


class _Link:
    """The connection to one kvnode namespace, made on a thread of its own (never on a
    caller's) and remade after kvnoded went away, at most once per reconnect interval.
    acquire() lends the client (or None) to a call; a client found broken is retired and
    closed once its last borrower gives it back."""

    def __init__(self, socket_path, layout, timeout_ms, reconnect_interval_s, what,
                 cuda_device=-1):
        self.socket_path, self.layout, self.timeout_ms = socket_path, layout, timeout_ms
        self.cuda_device = cuda_device
        self.reconnect_interval_s, self.what = reconnect_interval_s, what
        self._lock = threading.Lock()
        self._client = None
        self._connecting = False
        self._connected = threading.Event()
        self._retry_at = 0.0
        self._users = {}
        self._retired = []
        self._warned = False
        self._closed = False
        self.checks_on = False

    def start(self):
        with self._lock:
            self._start_locked()

    def _start_locked(self):
        if self._client is not None or self._connecting or self._closed or \
                time.monotonic() < self._retry_at:
            return
        self._connecting = True
        self._connected = threading.Event()
        _thread.start_new_thread(self._connect, (self._connected,))

    def _connect(self, done):
        c, err = None, None
        try:
            c = kvnode.Client(self.socket_path, self.layout, self.timeout_ms,
                              cuda_device=self.cuda_device)
        except Exception as e:  # noqa: BLE001 - logged; the calls answer "nothing"
            err = e
        with self._lock:
            self._connecting = False
            if self._closed:
                if c is not None:
                    c.close()
            elif c is None:
                self._retry_at = time.monotonic() + self.reconnect_interval_s
                if not self._warned:
                    logger.warning("kvnode.vllm: %s: cannot connect to kvnoded (%s: %s); "
                                   "no loads or saves until it is back", self.what,
                                   type(err).__name__, err)
                    self._warned = True
            else:
                if self._warned:
                    logger.warning("kvnode.vllm: %s: reconnected to kvnoded", self.what)
                self._warned = False
                self._client, self.checks_on = c, c.has_check_words
        done.set()

    def acquire(self, wait_s):
        """The client (lent until release()), or None: not connected (a connect is then
        started when due, and waited for at most wait_s when under way)."""
        with self._lock:
            c = self._client
            if c is not None:
                self._users[id(c)] = self._users.get(id(c), 0) + 1
                return c
            self._start_locked()
            done = self._connected if self._connecting else None
        if done is None or wait_s <= 0 or not done.wait(wait_s):
            return None
        with self._lock:
            c = self._client
            if c is None:
                return None
            self._users[id(c)] = self._users.get(id(c), 0) + 1
        return c

    def release(self, c, error=None):
        """Give c back; error (the call's exception) retires it when it says the
        connection is gone."""
        close = None
        with self._lock:
            if isinstance(error, _DISCONNECTED) and self._client is c:
                self._client = None
                self._retry_at = time.monotonic() + self.reconnect_interval_s
                self._retired.append(c)
                if not self._warned:
                    logger.warning("kvnode.vllm: %s: lost kvnoded (%s: %s); reconnecting in "
                                   "the background", self.what, type(error).__name__, error)
                    self._warned = True
            left = self._users.get(id(c), 1) - 1
            if left:
                self._users[id(c)] = left
            else:
                self._users.pop(id(c), None)
                if c in self._retired:
                    self._retired.remove(c)
                    close = c
        if close is not None:
            close.close()

    def lost(self, c, error):
        """A call on c, made without acquire() (the scheduler's, from its one thread),
        failed with error: c is retired as release() retires it."""
        with self._lock:
            self._users[id(c)] = self._users.get(id(c), 0) + 1
        self.release(c, error)

    def close(self):
        with self._lock:
            self._closed = True
            clients = [c for c in [self._client] + self._retired
                       if c is not None and id(c) not in self._users]
            self._client = None
        for c in clients:
            c.close()


class KvnodeConnector(KVConnectorBase_V1):
    """vLLM v1 KV connector backed by kvnoded (see the module docstring)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:       # vLLM releases whose base takes (vllm_config, role)
            super().__init__(vllm_config, role)
        ktc = vllm_config.kv_transfer_config
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        unknown = sorted(set(extra) - set(PARAMS))
        if unknown:
            raise ValueError("kvnode.vllm: unknown kv_connector_extra_config keys %s; the valid "
                             "ones are %s" % (", ".join(map(repr, unknown)), ", ".join(PARAMS)))
        p = dict(PARAMS, **extra)
        self.socket_path = p["socket_path"] or os.environ.get("KVNODE_SOCKET")
        self.timeout_ms = int(p["timeout_ms"])
        self.connect_wait_s = max(0, int(p["connect_wait_ms"])) / 1000.0
        self.reconnect_interval_s = float(p["reconnect_interval_s"])
        self._cross_layer = bool(p["cross_layer_blocks"])
        self.async_load_min_blocks = int(p["async_load_min_blocks"])
        if self.async_load_min_blocks < 0:
            raise ValueError("kvnode.vllm: async_load_min_blocks must be >= 0 (0: never)")
        self.inline_save_bytes = int(p["inline_save_bytes"])
        if self.inline_save_bytes < 0:
            raise ValueError("kvnode.vllm: inline_save_bytes must be >= 0 (0: every save on "
                             "the worker's thread)")
        if self.timeout_ms <= 0 or self.reconnect_interval_s < 0:
            raise ValueError("kvnode.vllm: timeout_ms must be > 0 and reconnect_interval_s >= 0")
        mc = vllm_config.model_config
        self.model = str(p["model"] or getattr(mc, "served_model_name", None) or mc.model)
        if isinstance(getattr(mc, "served_model_name", None), (list, tuple)):
            self.model = str(p["model"] or mc.served_model_name[0])
        if len(self.model.encode()) > 127:
            raise ValueError("kvnode.vllm: model name %r is over 127 bytes: give a shorter "
                             "\"model\" in kv_connector_extra_config" % self.model)
        self.revision = p["model_revision"] or getattr(mc, "revision", None) or None
        if self.revision is not None and (not isinstance(self.revision, str) or
                                          len(self.revision.encode()) > 127):
            raise ValueError("kvnode.vllm: model_revision must be a string of at most 127 "
                             "bytes, got %r" % (self.revision,))
        role_name = getattr(ktc, "kv_role", None) or "kv_both"
        self.loads_on = role_name in ("kv_both", "kv_consumer")
        self.saves_on = role_name in ("kv_both", "kv_producer")
        self.block_size = int(vllm_config.cache_config.block_size)
        pc = vllm_config.parallel_config
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
        self.pp_size = int(getattr(pc, "pipeline_parallel_size", 1) or 1)
        self._geometry, self._spec_error = None, None
        if kv_cache_config is not None:
            try:
                self._geometry = _spec_geometry(kv_cache_config)
            except Exception as e:  # noqa: BLE001 - vLLM runs on, without the connector
                self._spec_error = e
                logger.error("kvnode.vllm: %s; the connector neither loads nor saves", e)
        self._failures = set()          # kinds of failure logged once
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self._interval = dict.fromkeys(_COUNTERS, 0)
        self._count_lock = threading.Lock()
        self._link = None
        self._is_scheduler = role == KVConnectorRole.SCHEDULER or \
            getattr(role, "name", None) == "SCHEDULER"
        if self._is_scheduler:
            if getattr(ktc, "kv_load_failure_policy", "recompute") == "fail":
                logger.warning("kvnode.vllm: kv_load_failure_policy is \"fail\": a block "
                               "evicted from kvnoded between the MATCH and the load fails its "
                               "request; give \"recompute\" to have vLLM recompute it")
            self._plans = {}            # request id -> (local blocks, matched blocks)
            self._matching = None       # what a MATCH needs, in one tuple (see below)
            self._loads, self._saves = [], []
            self._saving = set()
            self._links = []
            if self._geometry is not None:
                # every rank's namespace (MLA: one): a prefix counts when all hold it
                ranks = [(0, pp) if self._geometry.mla else (tp, pp)
                         for pp in range(self.pp_size) for tp in range(self.tp_size)]
                self._links = [self._new_link(self._layout(tp, pp), "scheduler (tp%d pp%d)"
                                              % (tp, pp)) for tp, pp in sorted(set(ranks))]
                self._link = self._links[0]
                if self.loads_on:
                    # MATCH's state in one place: the plans, the links, the block size, the
                    # fold arrays (a list: [capacity, keys, checks], grown when short), the
                    # kvnode_tiers / size_t answers with their byref()s, async_load_min_blocks
                    tiers, count = _clib._CTiers(), _clib._SIZE(0)
                    self._matching = (self._plans, self._links, self.block_size, [0, None, None],
                                      tiers, ctypes.byref(tiers), count, ctypes.byref(count),
                                      self.async_load_min_blocks)
            elif self._spec_error is None:
                logger.error("kvnode.vllm: this vLLM gives the connector no KVCacheConfig; the "
                             "scheduler side cannot name the namespace and matches nothing")
        else:
            self.tp_rank, self.pp_rank = self._ranks(pc)
            self._mover = None          # _GatheredBlocks or _WholeBlocks, once registered
            self._load_errors = set()
            # the worker's thread takes its work from a SimpleQueue (None: stop) and says
            # what ended under _save_wake (a Condition over _loaded and _saved); the other
            # sets are vLLM's thread's own (start_load_kv, wait_for_save, get_finished)
            self._save_queue = queue.SimpleQueue()
            self._save_wake = threading.Condition()
            self._loaded = set()         # request ids whose asynchronous load has ended
            self._saved = set()          # ... whose save on the worker's thread has ended
            self._pending_saves = set()  # request ids with a save queued, kept or done
            self._saved_here = set()     # ... whose save vLLM's thread made
            self._named_finished = set()  # ... that vLLM has named finished
            self._saver = None
            self._mla_follower = False
            self._inline = []   # this step's saves made on vLLM's thread (wait_for_save)

    # ------------------------------------------------------------------ shared

    def _ranks(self, pc):
        try:
            from vllm.distributed.parallel_state import get_pp_group, get_tp_group
            return get_tp_group().rank_in_group, get_pp_group().rank_in_group
        except Exception:   # noqa: BLE001 - no vLLM (or not initialised): the config's rank
            rank = int(getattr(pc, "rank", 0) or 0)
            return rank % self.tp_size, (rank // self.tp_size) % self.pp_size

    def _layout(self, tp_rank, pp_rank):
        geo = self._geometry
        nlayers = _stage_layers(len(geo.layers), pp_rank, self.pp_size)
        extra = "vllm/mla" if geo.mla else "vllm/kv"
        if self.pp_size > 1:
            extra += "/pp%d-%d" % (pp_rank, self.pp_size)
        tp_size, tp_rank = (1, 0) if geo.mla else (self.tp_size, tp_rank)
        return kvnode.Layout(model=self.model, dtype=geo.dtype, block_tokens=geo.block_size,
                             block_bytes=nlayers * geo.layer_bytes(), num_layers=nlayers,
                             kv_heads=geo.heads, head_dim=geo.head_dim, tp_size=tp_size,
                             tp_rank=tp_rank, extra=extra, revision=self.revision)

    def _new_link(self, layout, what, cuda_device=-1):
        link = _Link(self.socket_path, layout, self.timeout_ms, self.reconnect_interval_s, what,
                     cuda_device)
        link.start()
        return link

    def _failed(self, kind, error):
        """Log a failure that vLLM does not see: once per kind, then at debug level."""
        if kind not in self._failures:
            self._failures.add(kind)
            logger.error("kvnode.vllm: %s failed (%s: %s); answering \"nothing\" (logged once)",
                         kind, type(error).__name__, error,
                         exc_info=None if isinstance(error, kvnode.Error) else error)
        else:
            logger.debug("kvnode.vllm: %s failed: %s", kind, error)

    def _count(self, **deltas):
        with self._count_lock:
            for k, v in deltas.items():
                self.counters[k] += v
                self._interval[k] += v

    @property
    def requires_kv_delivery(self):
        """False: a best-effort cache (a dropped save is a later miss), so vLLM need not
        recompute a request preempted while a save of its is pending."""
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """NHD: a block's K (V) of one layer is then one run of memory in every backend."""
        return "NHD"

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvnodeConnectorStats(data=dict(data or {}))

    # ------------------------------------------------------------------ scheduler side

    def _fold(self, request, n):
        """Keys and check words of the request's first n blocks (arrays of n)."""
        hashes = request.block_hashes
        return _fold_hashes(hashes if len(hashes) == n else hashes[:n])

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """Tokens past num_computed_tokens whose blocks kvnoded holds (a MATCH per rank),
        and whether they load asynchronously (at least async_load_min_blocks blocks, when
        that is set); (0, False) whenever kvnoded cannot answer."""
        # One frame, few calls: this runs for every new request, between other work. vLLM
        # calls the scheduler side from its scheduler thread only: the fold arrays, the
        # tiers and the links' clients are used without a lock (a client that fails is
        # handed to _Link.lost, which retires it as release() would).
        try:
            matching = self._matching
            if matching is None:
                return 0, False
            plans, links, bs, scratch, tiers, tiers_ref, count, count_ref, async_min = matching
            rid = request.request_id
            if rid in plans:
                del plans[rid]
            hashes = request.block_hashes
            # Never the block of the prompt's last token: vLLM computes at least one token.
            n = (request.num_tokens - 1) // bs
            if len(hashes) < n:
                n = len(hashes)
            publishable = getattr(request, "num_publishable_block_hashes", None)
            if publishable is not None and publishable < n:
                n = int(publishable)
            local = num_computed_tokens // bs
            if n <= local:
                return 0, False
            cap, keys, checks = scratch
            if cap < n:
                cap = max(n, 2 * cap, 256)
                keys, checks = (ctypes.c_int64 * cap)(), (ctypes.c_uint64 * cap)()
                scratch[:] = cap, keys, checks
            first, fold = hashes[0], _clib._fold_digests
            size = len(first)
            if type(first) is not bytes or size < 16 or fold is None or \
                    len(hashes[n - 1]) != size or \
                    fold(b"".join(hashes if len(hashes) == n else hashes[:n]), n, size, keys,
                         checks) != n:
                keys, checks = kvnode.fold_digests([_hex(h) for h in hashes[:n]])
            if local:   # the blocks past vLLM's own prefix (kvnode keys are not chained)
                keys, checks = _tail(keys, local), _tail(checks, local)
            more = n - local
            for link in links:   # each rank's MATCH asks only what the ranks before found
                c = link._client
                borrowed = c is None
                if borrowed:
                    c = link.acquire(self.connect_wait_s)
                    if c is None:
                        return 0, False
                error = None
                try:
                    if link.checks_on:
                        rc = _clib._match_checked(c._c, keys, checks, more, tiers_ref)
                        more = tiers.matched
                    else:
                        rc = _clib._match(c._c, keys, more, count_ref)
                        more = count.value
                    if rc:
                        c._check(rc)
                except kvnode.Error as e:
                    error, more = e, 0
                    self._failed("MATCH", e)
                finally:
                    if borrowed:
                        link.release(c, error)
                if error is not None and not borrowed:
                    link.lost(c, error)
                if more <= 0:
                    return 0, False
            plans[rid] = (local, local + more)
            return more * bs, bool(async_min) and more >= async_min
        except Exception as e:  # noqa: BLE001 - never into vLLM's scheduler
            self._failed("get_num_new_matched_tokens", e)
            return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """A load of the matched blocks into those vLLM allocated for them."""
        try:
            plan = self._plans.pop(request.request_id, None)
            if num_external_tokens <= 0 or plan is None:
                return
            local, matched = plan
            count = num_external_tokens // self.block_size
            block_ids = list(blocks.get_block_ids()[0])[local:local + count]
            keys, checks = self._fold(request, local + count)
            self._loads.append(_Transfer(
                request.request_id, block_ids, _words("q", keys, local),
                _words("Q", checks, local),
                bool(self.async_load_min_blocks and count >= self.async_load_min_blocks)))
        except Exception as e:  # noqa: BLE001
            self._failed("update_state_after_alloc", e)

    def build_connector_meta(self, scheduler_output):
        """This step's loads and saves, for the workers; the lists start anew."""
        meta = KvnodeConnectorMetadata(self._loads, self._saves)
        self._loads, self._saves = [], []
        for rid in getattr(scheduler_output, "preempted_req_ids", None) or ():
            self._plans.pop(rid, None)
        return meta

    def request_finished(self, request, block_ids):
        """Save the request's full publishable blocks; True (vLLM holds the blocks) until a
        worker's get_finished reports the save done. Raw digests (vLLM's hashes) go to the
        workers as they are, joined: each folds them in the call that saves them."""
        rid = request.request_id
        try:
            self._plans.pop(rid, None)
            if not self.saves_on or self._geometry is None:
                return False, None
            hashes = request.block_hashes
            n = len(hashes)
            publishable = getattr(request, "num_publishable_block_hashes", None)
            if publishable is not None and publishable < n:
                n = int(publishable)
            n = min(n, request.num_computed_tokens // self.block_size, len(block_ids))
            if n <= 0:
                return False, None
            first = hashes[0]
            if type(first) is bytes and len(first) >= 16 and _clib._fold_digests is not None:
                size = len(first)
                raw = b"".join(hashes if len(hashes) == n else hashes[:n])
                if len(raw) == size * n and len(hashes[n - 1]) == size:    # one hash function
                    save = _Transfer(rid, list(block_ids[:n]) if type(block_ids) is not list
                                     else block_ids[:n], None, None, False, raw, size)
                else:
                    save = None
            else:
                save = None
            if save is None:
                keys, checks = _fold_words(hashes if len(hashes) == n else hashes[:n])
                save = _Transfer(rid, list(block_ids[:n]), keys, checks)
            self._saves.append(save)
            self._saving.add(rid)
            return True, None
        except Exception as e:  # noqa: BLE001
            self._failed("request_finished", e)
            return False, None

    def update_connector_output(self, connector_output):
        for rid in getattr(connector_output, "finished_sending", None) or ():
            self._saving.discard(rid)

    def reset_cache(self):
        """Purge this deployment (every TP rank, every PP stage) from kvnoded's memory and
        store; True when done, False when it failed (logged)."""
        try:
            if self._geometry is None:
                return False
            layouts = [self._layout(0, pp) for pp in range(self.pp_size)]
            blocks, deployments = kvnode.purge_layouts(self.socket_path, layouts,
                                                       self.timeout_ms)
            logger.info("kvnode.vllm: reset_cache dropped %d blocks of %d deployments", blocks,
                        deployments)
            return True
        except Exception as e:  # noqa: BLE001
            self._failed("reset_cache", e)
            return False

    # ------------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches):
        """Learn where every block's pieces lie (NHD or HND, CPU or CUDA) and connect to the
        rank's namespace (declaring the caches' CUDA device). A cache this release cannot
        move (neither on the CPU nor on CUDA, head vectors not runs of memory, layers of
        different shapes or devices) is logged: the worker then loads nothing (loads
        reported as errors) and drops its saves."""
        self._registered(self._register, dict(kv_caches), "register_kv_caches")

    @property
    def prefer_cross_layer_blocks(self):
        """True (unless ``cross_layer_blocks`` is false): a block of every layer in one run
        of memory moves in one copy, and on a GPU by libkvnode's device copies."""
        return self._cross_layer

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend=None):
        """One KV cache tensor for every layer (num_layers first), whose blocks each lie in
        one run of memory in the per-layer order (every layer's K then V; MLA: latents):
        moved whole, host or device (CUDA: the client declares the tensor's device)."""
        self._registered(self._register_cross, kv_cache, "register_cross_layers_kv_cache")

    def _registered(self, register, caches, what):
        try:
            register(caches)
        except Exception as e:  # noqa: BLE001
            self._mover = None
            self._failed(what, e)
        # the worker's thread runs even without a mover: the saves vLLM hands it are then
        # dropped (counted) and reported, so vLLM frees their blocks
        if self._saver is None:
            self._saver = threading.Thread(target=self._save_loop, name="kvnode-vllm-io",
                                           daemon=True)
            self._saver.start()

    def _register(self, kv_caches):
        if self._spec_error is not None:
            raise self._spec_error
        if not kv_caches:
            raise ValueError("no KV cache tensors")
        num_blocks = getattr(self._kv_cache_config, "num_blocks", None)
        layers, geo, device = [], None, None
        for name, t in kv_caches.items():
            this_device = _tensor_device(t, "layer %s" % name)
            if device is None:
                device = this_device
            elif this_device != device:
                raise ValueError("layer %s is on %s, the first layer on %s: one device per "
                                 "worker" % (name, _device_name(this_device), _device_name(device)))
            shape, es = tuple(t.shape), t.element_size()
            if t.dim() == 5 and shape[0] == 2 and (num_blocks is None or shape[1] == num_blocks):
                views = [t[0, 0], t[1, 0]]          # K/V split: (2, blocks, tokens, heads, dim)
                step, bs, heads, hd, mla = t.stride(1) * es, shape[2], shape[3], shape[4], False
            elif t.dim() == 5 and shape[1] == 2:
                views = [t[0, 0], t[0, 1]]          # stacked: (blocks, 2, tokens, heads, dim)
                step, bs, heads, hd, mla = t.stride(0) * es, shape[2], shape[3], shape[4], False
            elif t.dim() == 4 and shape[3] % 2 == 0:
                # K|V packed: (blocks, heads, tokens, 2 x dim); K the first half of the last
                block, hd = t[0].permute(1, 0, 2), shape[3] // 2
                views = [block[..., :hd], block[..., hd:]]
                step, bs, heads, mla = t.stride(0) * es, shape[2], shape[1], False
            elif t.dim() == 3:
                views = [t[0].unsqueeze(1)]         # MLA: (blocks, tokens, latent)
                step, bs, heads, hd, mla = t.stride(0) * es, shape[1], 1, shape[2], True
            else:
                raise ValueError("layer %s: KV cache shape %s is none of (2, blocks, tokens, "
                                 "heads, dim), (blocks, 2, tokens, heads, dim), (blocks, heads, "
                                 "tokens, 2 x dim), (blocks, tokens, dim)" % (name, shape))
            this = (bs, heads, hd, _dtype_name(t.dtype), es, mla)
            if geo is None:
                geo = this
            elif this != geo:
                raise ValueError("layer %s: geometry %s differs from the first layer's %s"
                                 % (name, this, geo))
            ptrs, sizes = [], []
            for v in views:
                p, n = _view_pieces(v, es, name)
                ptrs += p
                sizes += n
            layers.append((name, ptrs, step, sizes))
        if self._geometry is None:      # vLLM without kv_cache_config: the tensors say it
            self._geometry = _Geometry(geo[0], geo[1], geo[2], geo[3], geo[4], geo[5],
                                       [n for n, *_ in layers] * self.pp_size)
        spec = self._geometry
        if (spec.block_size, spec.heads, spec.head_dim, spec.mla) != geo[:3] + (geo[5],) or \
                spec.elem_size != geo[4] or spec.block_size != self.block_size:
            raise ValueError("the KV cache tensors (block_size, heads, head_dim, mla = %s) do "
                             "not match vLLM's KV cache spec (%s)"
                             % (geo[:3] + (geo[5],), (spec.block_size, spec.heads,
                                                      spec.head_dim, spec.mla)))
        layout = self._layout(self.tp_rank, self.pp_rank)
        step0 = layers[0][2]
        if any(step != step0 for _, _, step, _ in layers):
            raise ValueError("layers step from block to block by different distances")
        base0 = layers[0][1][0]
        at, sizes = [], []
        for _, ptrs, _, nbytes in layers:
            at += [p - base0 for p in ptrs]
            sizes += nbytes
        pieces = gathered.PieceMap(at, sizes)
        if pieces.block_bytes != layout.block_bytes:
            raise ValueError("a block has %d bytes in the tensors, %d by the spec (layers %d)"
                             % (pieces.block_bytes, layout.block_bytes, layout.num_layers))
        _need_gathered(device)
        self._start_moving(_GatheredBlocks(base0, step0, pieces, device), layout)

    def _start_moving(self, mover, layout):
        self._mover = mover
        self._mla_follower = self._geometry.mla and self.tp_rank != 0
        self._link = self._new_link(layout, "worker tp%d pp%d" % (self.tp_rank, self.pp_rank),
                                    mover.device)

    def _register_cross(self, t):
        if self._spec_error is not None:
            raise self._spec_error
        spec = self._geometry
        if spec is None:
            raise ValueError("a cross-layer cache needs vLLM's KVCacheConfig")
        num_blocks = getattr(self._kv_cache_config, "num_blocks", None)
        dims = [d for d in range(1, t.dim()) if num_blocks is None or t.shape[d] == num_blocks]
        if t.dim() < 3 or not dims:
            raise ValueError("cross-layer KV cache shape %s has no block dimension"
                             % (tuple(t.shape),))
        bdim = max(dims, key=t.stride)
        block = t.select(bdim, 0)
        nlayers = t.shape[0]
        want = (nlayers, spec.block_size, spec.head_dim) if spec.mla else \
            (nlayers, 2, spec.block_size, spec.heads, spec.head_dim)
        if block.dim() == 4 and not spec.mla:      # K|V packed: (layers, heads, tokens, 2 x dim)
            want = (nlayers, spec.heads, spec.block_size, 2 * spec.head_dim)
            if tuple(block.shape) == want and t.element_size() == spec.elem_size:
                return self._register_cross_packed(t, block, bdim)
        if tuple(block.shape) != want or t.element_size() != spec.elem_size:
            raise ValueError("a cross-layer block is %s of %d-byte elements, vLLM's spec says "
                             "%s of %d" % (tuple(block.shape), t.element_size(), want,
                                           spec.elem_size))
        if not block.is_contiguous():
            raise ValueError("a cross-layer block is not one run of memory in layer, K/V, "
                             "token, head order (strides %s)" % (t.stride(),))
        layout = self._layout(self.tp_rank, self.pp_rank)
        nbytes = block.numel() * t.element_size()
        if nbytes != layout.block_bytes:
            raise ValueError("a cross-layer block has %d bytes, the namespace's %d (layers %d)"
                             % (nbytes, layout.block_bytes, layout.num_layers))
        device = _tensor_device(t, "the cross-layer KV cache")
        self._start_moving(_WholeBlocks(t.data_ptr(), t.stride(bdim) * t.element_size(),
                                        nbytes, device), layout)

    def _register_cross_packed(self, t, block, bdim):
        """A cross-layer cache in vLLM's K|V-packed layout: a block is (layers, tokens,
        heads, K|V) in one run of memory under NHD; moved in pieces into kvnode's block
        order (every layer's K then V), so it shares blocks with every other layout."""
        spec, es = self._geometry, t.element_size()
        if not block.permute(0, 2, 1, 3).is_contiguous():
            raise ValueError("a K|V-packed cross-layer block is not one run of memory in "
                             "layer, token, head order (the cache is not NHD: strides %s)"
                             % (t.stride(),))
        device = _tensor_device(t, "a K|V-packed cross-layer cache")
        layout = self._layout(self.tp_rank, self.pp_rank)
        base = block.data_ptr()
        ptrs, sizes = _packed_pieces(base, t.shape[0], spec.block_size, spec.heads,
                                     spec.head_dim * es)
        pieces = gathered.PieceMap([p - base for p in ptrs], sizes)
        if pieces.block_bytes != layout.block_bytes:
            raise ValueError("a cross-layer block has %d bytes, the namespace's %d (layers %d)"
                             % (pieces.block_bytes, layout.block_bytes, layout.num_layers))
        _need_gathered(device)
        self._start_moving(_GatheredBlocks(base, t.stride(bdim) * es, pieces, device), layout)

    def start_load_kv(self, forward_context, **kwargs):
        """This step's synchronous loads, done when this returns (blocks that could not be
        loaded are reported by get_block_ids_with_load_errors); its asynchronous loads
        queued for the worker's thread; its saves kept for wait_for_save while they copy at
        most inline_save_bytes in all, the others queued for the worker's thread."""
        try:
            if not self.has_connector_metadata():
                return
            meta = self._get_connector_metadata()
            queued = []
            for load in meta.loads:
                if load.asynchronous:
                    queued.append(load)
                else:
                    self._load(load)
            saves = meta.saves
            if saves:
                self._pending_saves.update([save.req_id for save in saves])
                mover, budget = self._mover, self.inline_save_bytes
                block_bytes = 0 if mover is None or self._mla_follower else mover.block_bytes
                inline = self._inline
                for save in saves:
                    nbytes = len(save.block_ids) * block_bytes
                    if nbytes <= budget:
                        budget -= nbytes
                        inline.append(save)
                    else:
                        queued.append(save)
            put = self._save_queue.put
            for item in queued:
                put(item)
        except Exception as e:  # noqa: BLE001
            self._failed("start_load_kv", e)

    def _load(self, load):
        n, got, mover = len(load.block_ids), 0, self._mover
        c = None if mover is None else self._link.acquire(self.connect_wait_s)
        if c is not None:
            error = None
            try:
                got = mover.load(c, _ctypes_words(ctypes.c_int64, load.keys), load.block_ids,
                                 _ctypes_words(ctypes.c_uint64, load.checks)
                                 if self._link.checks_on else None)
            except Exception as e:  # noqa: BLE001 - every block of it is reported
                error, got = e, 0
                self._failed("load", e)
            finally:
                self._link.release(c, error)
        if got < n:
            with self._count_lock:
                self._load_errors.update(load.block_ids[got:])
        self._count(blocks_loaded=got, load_error_blocks=n - got, load_calls=1,
                    bytes_loaded=got * (mover.block_bytes if mover else 0))

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return None

    def wait_for_save(self):
        """This step's saves kept by start_load_kv, made here, on vLLM's thread: the forward
        is launched (its kernels still running on a GPU) and reads none of the blocks a
        save copies, which vLLM holds for it; get_finished then reports them."""
        try:
            if self._inline:
                self._save_inline()
        except Exception as e:  # noqa: BLE001
            self._failed("wait_for_save", e)

    def _save_inline(self):
        saves, self._inline = self._inline, []
        try:
            for save in saves:
                try:
                    self._save(save)
                except Exception as e:  # noqa: BLE001 - the request is still reported
                    self._failed("save", e)
        finally:
            self._saved_here.update([save.req_id for save in saves])

    def _save_loop(self):
        get = self._save_queue.get
        while True:
            item = get()
            if item is None:
                return
            try:
                (self._load if item.asynchronous else self._save)(item)
            except Exception as e:  # noqa: BLE001
                self._failed("load" if item.asynchronous else "save", e)
            finally:
                with self._save_wake:
                    (self._loaded if item.asynchronous else self._saved).add(item.req_id)
                    self._save_wake.notify_all()

    def _save(self, save):
        n, mover = len(save.block_ids), self._mover
        if mover is not None and self._mla_follower:
            return                      # MLA: TP rank 0 saves the blocks every rank holds
        link = self._link
        c = None if mover is None else link.acquire(self.connect_wait_s)
        if c is None:
            self._count(saves_dropped_blocks=n)
            return
        error = None
        try:
            keys, checks = _transfer_words(save, n)
            mover.save(c, keys, save.block_ids, checks if link.checks_on else None)
        except Exception as e:  # noqa: BLE001 - counted; the request is still reported
            error = e
            self._failed("save", e)
        finally:
            link.release(c, error)
        if error is not None:
            self._count(saves_dropped_blocks=n)
            return
        nbytes = n * mover.block_bytes
        with self._count_lock:
            for counts in (self.counters, self._interval):
                counts["blocks_saved"] += n
                counts["save_calls"] += 1
                counts["bytes_saved"] += nbytes

    def get_finished(self, finished_req_ids):
        """(requests whose save has ended and which vLLM named finished, requests whose
        asynchronous load has ended); None for an empty set. A load's failed blocks are in
        get_block_ids_with_load_errors by then (vLLM asks it after this, in the same step).
        Saves start_load_kv kept are made first when wait_for_save has not made them: vLLM
        asks this before wait_for_save (the draft model's forward between them) or without
        it (older vLLM, in a step without a forward)."""
        try:
            if self._inline:
                self._save_inline()
            named = self._named_finished
            if finished_req_ids:
                named |= self._pending_saves.intersection(finished_req_ids)
            done = self._saved_here & named
            loaded = None
            if self._saved or self._loaded:     # what the worker's thread has ended
                with self._save_wake:
                    thread_done = self._saved & named
                    self._saved -= thread_done
                    loaded, self._loaded = self._loaded, set()
                done |= thread_done
            if done:
                self._saved_here -= done
                named -= done
                self._pending_saves -= done
            return (done or None), (loaded or None)
        except Exception as e:  # noqa: BLE001
            self._failed("get_finished", e)
            return None, None

    def get_transfer_results(self, finished_req_ids=None):
        """get_finished's two sets as the KVConnectorTransferResults newer vLLM asks for
        (failed_recving stays empty: a load's failed blocks are reported by
        get_block_ids_with_load_errors, the request in finished_recving)."""
        sending, recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(finished_sending=sending or set(),
                                          finished_recving=recving or set())

    def get_block_ids_with_load_errors(self):
        with self._count_lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    def get_kv_connector_stats(self):
        with self._count_lock:
            data, self._interval = self._interval, dict.fromkeys(_COUNTERS, 0)
        if not any(data.values()):
            return None
        return KvnodeConnectorStats(data=data)

    def shutdown(self):
        """Finish the saves kept and queued (each bounded by timeout_ms), then disconnect."""
        try:
            if not self._is_scheduler and self._inline:
                self._save_inline()
            if not self._is_scheduler and self._saver is not None:
                pending = self._save_queue.qsize() + 1
                self._save_queue.put(None)
                self._saver.join(pending * self.timeout_ms / 1000.0)
            for link in getattr(self, "_links", None) or [self._link]:
                if link is not None:
                    link.close()
        except Exception as e:  # noqa: BLE001
            self._failed("shutdown", e)
