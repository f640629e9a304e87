"""kvnode.sglang held against SGLang's real shapes (issue 31): torch host pools built as
SGLang's pool_host builds them (MHA and MLA in every host layout, Mamba and DSA-indexer
sidecar pools), driven in the order SGLang's cache controllers call a storage backend
(register_mem_pool_host, register_mem_host_pool_v2 per pool entry, batch_exists /
batch_exists_v2, batch_get_v1 / batch_get_v2 on the prefetch thread, batch_set_v2 then
batch_set_v1 on the backup thread, get_stats when storage metrics are on), against a real
kvnoded: byte-exact round trips of every layout, CP ranks and heterogeneous TP, the v2 calls,
the metrics. The pool classes reproduce SGLang's buffer shapes and the addresses its
get_page_buffer_meta gives (facts read from sglang/srt/mem_cache/pool_host/{mha,mla,mamba,
dsa}.py); none of its code is here."""
import ctypes
import dataclasses
import enum
import logging
import sys

import pytest
import torch

import kvnode.sglang
from conftest import running_daemon
from fake_sglang import StorageConfig, chained_keys, create_dynamic_backend

PAGE = 4


class PoolName(str, enum.Enum):
    """SGLang's pool names (hicache_storage.PoolName), the ones used here."""
    KV = "kv"
    MAMBA = "mamba"
    INDEXER = "indexer"


class PoolHitPolicy(str, enum.Enum):
    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


@dataclasses.dataclass
class PoolTransfer:
    """The fields of SGLang's PoolTransfer."""
    name: PoolName
    host_indices: torch.Tensor = None
    device_indices: torch.Tensor = None
    keys: list = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: list = None
    indices_from_pool: PoolName = None


@dataclasses.dataclass
class EngineConfig(StorageConfig):
    """HiCacheStorageConfig's fields beyond those of fake_sglang.StorageConfig."""
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    enable_storage_metrics: bool = True
    is_page_first_layout: bool = True
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: int = None
    should_split_heads: bool = False


def count_pool_hits(results):
    """hicache_storage.count_pool_hits: the leading run of successes per pool."""
    return {name: (rs.index(False) if False in rs else len(rs)) for name, rs in results.items()}


class MHAHost:
    """MHATokenToKVPoolHost's buffer: kv_buffer of
    layer_first (2, layers, size, heads, dim), page_first (2, size, layers, heads, dim),
    page_first_direct (2, pages, layers, page, heads, dim), page_head (2, pages, heads, page,
    layers, dim); get_page_buffer_meta: layer_first one K and one V pointer per layer
    (K0, V0, K1, V1, ...), the others a K and a V pointer per page."""

    def __init__(self, layout, pages=8, page_size=PAGE, layers=3, heads=4, head_dim=8,
                 dtype=torch.bfloat16):
        self.layout, self.page_size, self.page_num = layout, page_size, pages
        self.size = pages * page_size
        self.layer_num, self.head_num, self.head_dim, self.dtype = layers, heads, head_dim, dtype
        dims = {"layer_first": (2, layers, self.size, heads, head_dim),
                "page_first": (2, self.size, layers, heads, head_dim),
                "page_first_direct": (2, pages, layers, page_size, heads, head_dim),
                "page_head": (2, pages, heads, page_size, layers, head_dim)}[layout]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)
        self.itemsize = self.kv_buffer.element_size()

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        base, idx = self.kv_buffer.data_ptr(), indices.tolist()
        tok = self.head_num * self.head_dim * self.itemsize
        v_offset = self.layer_num * self.size * tok
        ptrs = []
        if self.layout == "layer_first":
            for i in range(0, len(idx), self.page_size):
                for layer in range(self.layer_num):
                    k = base + idx[i] * tok + layer * self.size * tok
                    ptrs += [k, k + v_offset]
            return ptrs, [self.page_size * tok] * len(ptrs)
        for i in range(0, len(idx), self.page_size):
            k = base + idx[i] * self.layer_num * tok
            ptrs += [k, k + v_offset]
        return ptrs, [self.layer_num * self.page_size * tok] * len(ptrs)

    def get_split_heads_page_buffer_meta(self, indices, split_factor):
        assert self.layout == "page_head" and self.head_num % split_factor == 0
        base, idx = self.kv_buffer.data_ptr(), indices.tolist()
        tok = self.head_num * self.head_dim * self.itemsize
        v_offset = self.layer_num * self.size * tok
        ptrs = []
        for i in range(0, len(idx), self.page_size):
            for head in range(0, self.head_num, self.head_num // split_factor):
                k = (base + idx[i] * self.layer_num * tok
                     + head * self.page_size * self.layer_num * self.head_dim * self.itemsize)
                ptrs += [k, k + v_offset]
        size = self.layer_num * self.page_size * tok // split_factor
        return ptrs, [size] * len(ptrs)

    def page(self, slot):
        """The page at page slot `slot`, as the pool holds it (K and V)."""
        p, i = self.page_size, slot * self.page_size
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, i:i + p]
        if self.layout == "page_first":
            return self.kv_buffer[:, i:i + p]
        return self.kv_buffer[:, slot]


class MLAHost:
    """MLATokenToKVPoolHost's kv_buffer: layer_first (layers, size, 1, dim), page_first
    (size, layers, 1, dim), page_first_direct (pages, layers, page, 1, dim);
    get_page_buffer_meta: layer_first one pointer per layer, the others one per page."""

    def __init__(self, layout, pages=8, page_size=PAGE, layers=3, dim=40, dtype=torch.bfloat16):
        self.layout, self.page_size, self.page_num = layout, page_size, pages
        self.size = pages * page_size
        self.layer_num, self.kv_cache_dim, self.dtype = layers, dim, dtype
        dims = {"layer_first": (layers, self.size, 1, dim),
                "page_first": (self.size, layers, 1, dim),
                "page_first_direct": (pages, layers, page_size, 1, dim)}[layout]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)
        self.itemsize = self.kv_buffer.element_size()

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        base, idx = self.kv_buffer.data_ptr(), indices.tolist()
        tok = self.kv_cache_dim * self.itemsize
        ptrs = []
        if self.layout == "layer_first":
            for i in range(0, len(idx), self.page_size):
                ptrs += [base + idx[i] * tok + layer * self.size * tok
                         for layer in range(self.layer_num)]
            return ptrs, [self.page_size * tok] * len(ptrs)
        for i in range(0, len(idx), self.page_size):
            ptrs.append(base + idx[i] * self.layer_num * tok)
        return ptrs, [self.layer_num * self.page_size * tok] * len(ptrs)

    def page(self, slot):
        p, i = self.page_size, slot * self.page_size
        if self.layout == "layer_first":
            return self.kv_buffer[:, i:i + p]
        if self.layout == "page_first":
            return self.kv_buffer[i:i + p]
        return self.kv_buffer[slot]


class MambaHost:
    """MambaPoolHost (page_first): page_size 1, temporal (size, layers, 1, *temporal) in
    float32 and conv states (size, layers, 1, *conv) in bfloat16; get_page_buffer_meta per
    index: the temporal state's pointer, then each conv state's."""

    layout = "page_first"
    page_size = 1

    def __init__(self, size=8, layers=2, temporal=(2, 3, 4), convs=((5, 3), (2, 3))):
        self.size, self.num_mamba_layers = size, layers
        self.temporal_buffer = torch.zeros((size, layers, 1) + temporal, dtype=torch.float32)
        self.conv_buffer = [torch.zeros((size, layers, 1) + c, dtype=torch.bfloat16)
                            for c in convs]

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for i in indices.tolist():
            for buf in [self.temporal_buffer] + self.conv_buffer:
                ptrs.append(buf[i].data_ptr())
                sizes.append(buf[i].numel() * buf.element_size())
        return ptrs, sizes

    def state(self, slot):
        return [buf[slot].clone() for buf in [self.temporal_buffer] + self.conv_buffer]


class IndexerHost:
    """DSAIndexerPoolHost (page_first): index_k_with_scale_buffer (pages, layers, 1, stride)
    uint8 on the KV pool's page indices; get_page_buffer_meta one pointer per page."""

    layout = "page_first"

    def __init__(self, pages=8, page_size=PAGE, layers=3, stride=PAGE * 36):
        self.page_size, self.layer_num, self.stride = page_size, layers, stride
        self.buf = torch.zeros((pages, layers, 1, stride), dtype=torch.uint8)

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()
        step = self.layer_num * self.stride
        ptrs = [self.buf.data_ptr() + (idx[i] // self.page_size) * step
                for i in range(0, len(idx), self.page_size)]
        return ptrs, [step] * len(ptrs)


def raw(tensor):
    """A tensor's bytes (byte-exact comparisons, whatever its dtype)."""
    t = tensor.contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def same(a, b):
    return a.shape == b.shape and raw(a) == raw(b)


def fill_(tensor, seed):
    g = torch.Generator().manual_seed(seed)
    if tensor.dtype == torch.uint8:
        tensor.copy_(torch.randint(0, 256, tensor.shape, generator=g, dtype=torch.uint8))
    else:
        tensor.copy_(torch.randn(tensor.shape, generator=g).to(tensor.dtype))


def indices(first_slot, npages, page_size=PAGE):
    """Host token indices of npages pages from page slot first_slot (what the controller
    passes: a CPU int64 tensor)."""
    return torch.arange(first_slot * page_size, (first_slot + npages) * page_size,
                        dtype=torch.int64)


def keys_for(seed, npages, page_size=PAGE):
    return chained_keys([seed * 7919 + t for t in range(npages * page_size)], page_size)


def backend(sock, **config):
    # connect_wait_ms: the first call waits for the connect (under load it
    # can take more than the default 20 ms; test_sglang_nonblocking tests that)
    extra = dict(backend_name="kvnode", module_path="kvnode.sglang",
                 class_name="KvnodeHiCacheStorage", interface_v1=1, socket_path=sock,
                 connect_wait_ms=10000)
    config.setdefault("model_name", "engine-test")
    return create_dynamic_backend(EngineConfig(extra_config=extra, **config))


@pytest.fixture
def daemon(tmp_path):
    with running_daemon(str(tmp_path), str(tmp_path / "s.sock")) as sock:
        yield sock


LAYOUTS = [("mha", "layer_first"), ("mha", "page_first"), ("mha", "page_first_direct"),
           ("mha", "page_head"), ("mla", "layer_first"), ("mla", "page_first"),
           ("mla", "page_first_direct")]


def make_pool(kind, layout, **kw):
    return (MHAHost if kind == "mha" else MLAHost)(layout, **kw)


@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_every_host_layout_round_trips(daemon, kind, layout):
    """Item 1: write 4 pages from one engine's pool, read them into other slots of a second
    engine's pool: every byte of the destination pool is what it should be."""
    src, dst = make_pool(kind, layout), make_pool(kind, layout)
    writer = backend(daemon, is_mla_model=kind == "mla")
    reader = backend(daemon, is_mla_model=kind == "mla")
    writer.register_mem_pool_host(src)
    reader.register_mem_pool_host(dst)
    keys = keys_for(1, 4)
    for slot in range(1, 5):
        fill_(src.page(slot), seed=10 * slot)
    assert writer.batch_set_v1(keys, indices(1, 4)) == [True] * 4
    assert reader.batch_exists(keys + keys_for(2, 2)) == 4
    more = keys + keys_for(3, 2)
    assert reader.batch_get_v1(more, indices(2, 6)) == [True] * 4 + [False] * 2
    expected = make_pool(kind, layout)
    for i in range(4):
        expected.page(2 + i).copy_(src.page(1 + i))
    assert raw(dst.kv_buffer) == raw(expected.kv_buffer)
    # the flat-page path (the controller's generic get) sees the bytes in SGLang's flat-page
    # order (get_data_page): the same block
    assert bytes(reader.batch_get(keys[:1])[0]) == raw(src.page(1))
    # the layout is part of the namespace: a page_first engine of the same model reads these
    # pages only when they are page_first's
    other = backend(daemon, is_mla_model=kind == "mla")
    other.register_mem_pool_host(make_pool(kind, "page_first"))
    assert other.batch_exists(keys) == (4 if layout == "page_first" else 0)
    other.close()
    # a page that is already stored is not rewritten, and is still read back the same
    assert writer.batch_set_v1(keys[:2], indices(1, 2)) == [True] * 2
    assert reader.batch_get_v1(keys[:1], indices(7, 1)) == [True]
    assert same(dst.page(7), src.page(1))
    writer.close()
    reader.close()


def test_layouts_keep_their_own_namespaces(daemon):
    """Item 1: a page's bytes are ordered by its layout; an engine with another layout must
    miss them, never read them as its own."""
    a, b = MHAHost("page_head"), MHAHost("page_first")
    sa, sb = backend(daemon), backend(daemon)
    sa.register_mem_pool_host(a)
    sb.register_mem_pool_host(b)
    keys = keys_for(4, 3)
    fill_(a.kv_buffer, 5)
    assert sa.batch_set_v1(keys, indices(0, 3)) == [True] * 3
    assert sa.batch_exists(keys) == 3
    assert sb.batch_exists(keys) == 0
    assert sb.batch_get_v1(keys, indices(0, 3)) == [False] * 3
    extras = {lay.extra for lay in sa._layouts()} | {lay.extra for lay in sb._layouts()}
    assert extras == {"sglang/k@page_head", "sglang/v@page_head", "sglang/k", "sglang/v"}
    sa.close()
    sb.close()


def test_cp_ranks_keep_their_own_bytes(daemon):
    """Item 2: under attention context parallelism each CP rank holds a different slice of
    every page (DeepSeek-V3.2-style MLA): both ranks store under the same keys and each
    reads back its own bytes."""
    ranks = [backend(daemon, is_mla_model=True, attn_cp_rank=r, attn_cp_size=2)
             for r in range(2)]
    pools = [MLAHost("page_first") for _ in range(2)]
    for s, p in zip(ranks, pools):
        s.register_mem_pool_host(p)
    keys = keys_for(5, 3)
    for r, p in enumerate(pools):
        fill_(p.kv_buffer[:3 * PAGE], seed=100 + r)
    want = [p.kv_buffer[:3 * PAGE].clone() for p in pools]
    for s in ranks:
        assert s.batch_set_v1(keys, indices(0, 3)) == [True] * 3
    for r, (s, p) in enumerate(zip(ranks, pools)):
        p.kv_buffer.zero_()
        assert s.batch_get_v1(keys, indices(0, 3)) == [True] * 3
        assert same(p.kv_buffer[:3 * PAGE], want[r]), "CP rank %d got other bytes" % r
    assert ranks[0]._layouts()[0].extra == "sglang/kv/cp0-2"
    with pytest.raises(ValueError, match="attn_cp_rank 2 with attn_cp_size 2"):
        backend(daemon, attn_cp_rank=2, attn_cp_size=2)
    for s in ranks:
        s.close()


def test_heterogeneous_tp_split_heads(daemon):
    """Item 2: tp_lcm_size with should_split_heads (SGLang sets it for MHA page_head pools
    when tp_lcm_size > tp_size): a TP-1 deployment's pages, stored as head groups, are read
    by the two ranks of a TP-2 deployment (tp_lcm_size 2), each its own heads."""
    one = backend(daemon, tp_size=1, tp_lcm_size=2, should_split_heads=True)
    pool1 = MHAHost("page_head", heads=4)
    one.register_mem_pool_host(pool1)
    keys = keys_for(6, 2)
    fill_(pool1.kv_buffer, 7)
    assert one.batch_set_v1(keys, indices(0, 2)) == [True] * 2
    for r in range(2):
        rank = backend(daemon, tp_rank=r, tp_size=2, tp_lcm_size=2)
        pool = MHAHost("page_head", heads=2)
        rank.register_mem_pool_host(pool)
        assert rank.batch_exists(keys) == 2
        assert rank.batch_get_v1(keys, indices(3, 2)) == [True] * 2
        for i in range(2):
            # page_head: (2, pages, heads, page, layers, dim): rank r holds heads 2r, 2r+1
            assert same(pool.kv_buffer[:, 3 + i], pool1.kv_buffer[:, i, 2 * r:2 * r + 2])
        rank.close()
    one.close()


def test_split_heads_refused_where_it_cannot_work(daemon):
    """Item 2: should_split_heads with a pool that cannot split heads is refused at attach
    (register_mem_pool_host), naming the reason."""
    s = backend(daemon, tp_size=1, tp_lcm_size=2, should_split_heads=True)
    with pytest.raises(ValueError, match="needs the page_head host layout"):
        s.register_mem_pool_host(MHAHost("page_first"))
    with pytest.raises(ValueError, match="3 heads do not split in 2"):
        s.register_mem_pool_host(MHAHost("page_head", heads=3))
    with pytest.raises(ValueError, match="MLA"):
        backend(daemon, is_mla_model=True, tp_lcm_size=2, should_split_heads=True)
    with pytest.raises(ValueError, match="tp_lcm_size 3 is not a multiple of tp_size 2"):
        backend(daemon, tp_size=2, tp_lcm_size=3)


@dataclasses.dataclass
class PoolEntry:
    """The fields of SGLang's PoolEntry used here."""
    name: PoolName
    host_pool: object
    is_primary_index_anchor: bool = False


class HostPoolGroup:
    """SGLang's HostPoolGroup as a storage backend sees it: the hybrid controller's host
    pool (what register_mem_pool_host gets), an allocation facade over its entries with the
    anchor's layout and page_size; it has no get_page_buffer_meta of its own."""

    def __init__(self, entries):
        self.entries = entries
        self.entry_map = {e.name: e for e in entries}
        self.anchor_entry = next(e for e in entries if e.is_primary_index_anchor)
        self.layout = self.anchor_entry.host_pool.layout
        self.page_size = self.anchor_entry.host_pool.page_size


def hybrid_engine(daemon, mla=False, **config):
    """A hybrid model's backend as HybridCacheController attaches it: the factory, then
    register_mem_pool_host(the pool group), then register_mem_host_pool_v2(entry.host_pool,
    entry.name) for every entry of the group."""
    store = backend(daemon, is_mla_model=mla, **config)
    kv = MLAHost("page_first") if mla else MHAHost("page_first")
    pools = {PoolName.KV: kv, PoolName.MAMBA: MambaHost(), PoolName.INDEXER: IndexerHost()}
    group = HostPoolGroup([PoolEntry(name, pool, name == PoolName.KV)
                           for name, pool in pools.items()])
    store.register_mem_pool_host(group)
    for entry in group.entries:
        store.register_mem_host_pool_v2(entry.host_pool, entry.name)
    return store, pools


@pytest.mark.parametrize("mla", [False, True])
def test_hybrid_pools_round_trip_through_v2(daemon, mla):
    """Item 3: backup (batch_set_v2 of the sidecars, then batch_set_v1 of KV), prefetch
    (batch_exists_v2, batch_get_v1, batch_get_v2) as HybridCacheController does them:
    Mamba state (trailing page) and DSA indexer (every page, on KV's indices) byte-exact."""
    writer, wp = hybrid_engine(daemon, mla)
    reader, rp = hybrid_engine(daemon, mla)
    keys = keys_for(8, 4)
    fill_(wp[PoolName.KV].kv_buffer, 1)
    fill_(wp[PoolName.INDEXER].buf, 2)
    mamba_w = wp[PoolName.MAMBA]
    for buf in [mamba_w.temporal_buffer] + mamba_w.conv_buffer:
        fill_(buf, 3)
    backup = [PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([5]), keys=keys[-1:],
                           hit_policy=PoolHitPolicy.TRAILING_PAGES),
              PoolTransfer(PoolName.INDEXER, host_indices=indices(0, 4), keys=keys,
                           indices_from_pool=PoolName.KV)]
    assert writer.batch_set_v2(backup) == {PoolName.MAMBA: [True],
                                           PoolName.INDEXER: [True] * 4}
    assert writer.batch_set_v1(keys, indices(0, 4)) == [True] * 4
    # prefetch: the hit query, then KV, then the sidecars
    query = [PoolTransfer(PoolName.MAMBA, keys=["x"], hit_policy=PoolHitPolicy.TRAILING_PAGES),
             PoolTransfer(PoolName.INDEXER, indices_from_pool=PoolName.KV)]
    hit = reader.batch_exists_v2(keys + keys_for(9, 1), query)
    assert hit.kv_hit_pages == 4
    assert hit.extra_pool_hit_pages == {"kv": 4, PoolName.MAMBA: 4, PoolName.INDEXER: 4}
    assert reader.batch_get_v1(keys, indices(2, 4)) == [True] * 4
    load = [PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([1]), keys=keys[-1:],
                         hit_policy=PoolHitPolicy.TRAILING_PAGES),
            PoolTransfer(PoolName.INDEXER, host_indices=indices(2, 4), keys=keys)]
    results = reader.batch_get_v2(load)
    assert count_pool_hits(results) == {PoolName.MAMBA: 1, PoolName.INDEXER: 4}
    assert same(rp[PoolName.INDEXER].buf[2:6], wp[PoolName.INDEXER].buf[0:4])
    for got, want in zip(rp[PoolName.MAMBA].state(1), mamba_w.state(5)):
        assert same(got, want)
    assert same(rp[PoolName.KV].kv_buffer[2 * PAGE:6 * PAGE] if mla else
                       rp[PoolName.KV].kv_buffer[:, 2 * PAGE:6 * PAGE],
                       wp[PoolName.KV].kv_buffer[:4 * PAGE] if mla else
                       wp[PoolName.KV].kv_buffer[:, :4 * PAGE])
    writer.close()
    reader.close()


def test_v2_hit_policies_clamp_the_prefix(daemon):
    """Item 3: trailing_pages needs only the last len(keys) pages of the prefix; all_pages
    every page: a sidecar missing pages shrinks the usable prefix."""
    store, pools = hybrid_engine(daemon)
    keys = keys_for(11, 4)
    assert store.batch_set_v1(keys, indices(0, 4)) == [True] * 4
    # the Mamba state exists for the prefix ending at page 1 only; the indexer for pages 0-2
    assert store.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([0]),
                                            keys=keys[1:2])]) == {PoolName.MAMBA: [True]}
    assert store.batch_set_v2([PoolTransfer(PoolName.INDEXER, host_indices=indices(0, 3),
                                            keys=keys[:3])]) == {PoolName.INDEXER: [True] * 3}
    trailing = PoolTransfer(PoolName.MAMBA, keys=["k"], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    every = PoolTransfer(PoolName.INDEXER)
    r = store.batch_exists_v2(keys, [trailing])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (2, {"kv": 4, PoolName.MAMBA: 2})
    r = store.batch_exists_v2(keys, [every])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (3, {"kv": 4, PoolName.INDEXER: 3})
    r = store.batch_exists_v2(keys, [every, trailing])
    assert r.kv_hit_pages == 2
    two = PoolTransfer(PoolName.MAMBA, keys=["a", "b"], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    assert store.batch_exists_v2(keys, [two]).kv_hit_pages == 0
    store.close()


def test_v2_never_raises_into_the_controller(tmp_path, caplog):
    """Item 3: a pool never registered, host indices that do not cover the keys, a daemon
    that is gone: misses and False, logged, never an exception (one on the prefetch thread
    disables L3 for the life of the process)."""
    sock = str(tmp_path / "v2.sock")
    with running_daemon(str(tmp_path), sock):
        store, pools = hybrid_engine(sock)
        keys = keys_for(12, 2)
        caplog.set_level(logging.WARNING, logger="kvnode.sglang")
        assert store.batch_get_v2([PoolTransfer("swa", host_indices=indices(0, 2), keys=keys)]) \
            == {"swa": [False, False]}
        assert store.batch_set_v2([PoolTransfer(PoolName.INDEXER, host_indices=indices(0, 1),
                                                keys=keys)]) == {PoolName.INDEXER: [False] * 2}
        store._next_error_log = 0
        assert store.batch_get_v2([PoolTransfer(PoolName.INDEXER, host_indices=None,
                                                keys=keys)]) == {PoolName.INDEXER: [False] * 2}
        assert "swa" in caplog.text and "host indices" in caplog.text
        r = store.batch_exists_v2(keys, [PoolTransfer("swa")])
        assert r.kv_hit_pages == 0
    # the daemon is gone
    assert store.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([0]),
                                            keys=keys[:1])]) == {PoolName.MAMBA: [False]}
    assert store.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([0]),
                                            keys=keys[:1])]) == {PoolName.MAMBA: [False]}
    r = store.batch_exists_v2(keys, [PoolTransfer(PoolName.MAMBA)])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (0, {})
    store.close()


def test_get_stats_in_the_controllers_shape(daemon):
    """Item 5: get_stats gives StorageMetrics (prefetch_pgs, backup_pgs, prefetch_bandwidth,
    backup_bandwidth: per call since the previous get_stats, as StorageMetricsCollector
    logs them) with kvnode's hits, misses, bytes and latencies."""
    store = backend(daemon)
    pool = MHAHost("page_first")
    store.register_mem_pool_host(pool)
    page_bytes = 2 * pool.layer_num * PAGE * pool.head_num * pool.head_dim * pool.itemsize
    keys = keys_for(13, 3)
    fill_(pool.kv_buffer, 4)
    assert store.batch_set_v1(keys, indices(0, 3)) == [True] * 3
    assert store.batch_exists(keys + keys_for(14, 2)) == 3
    assert store.batch_get_v1(keys[:2], indices(4, 2)) == [True] * 2
    m = store.get_stats()
    seen = {}
    for field in ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth"):
        seen[field] = [v for v in getattr(m, field)]    # what log_storage_metrics iterates
    assert seen["prefetch_pgs"] == [2] and seen["backup_pgs"] == [3]
    assert all(isinstance(v, float) and v > 0 for v in
               seen["prefetch_bandwidth"] + seen["backup_bandwidth"])
    assert (m.hits, m.misses) == (3, 2)
    assert (m.pages_read, m.bytes_read) == (2, 2 * page_bytes)
    assert (m.pages_written, m.bytes_written) == (3, 3 * page_bytes)
    assert len(m.exists_latency_ms) == 1 and len(m.get_latency_ms) == 1
    assert len(m.set_latency_ms) == 1 and m.failed_calls == 0
    again = store.get_stats()       # samples drained, counters kept
    assert again.prefetch_pgs == [] and again.get_latency_ms == [] and again.hits == 3
    store.close()


class LayerFirstIndexerHost(IndexerHost):
    """DSAIndexerPoolHost in layer_first: SGLang's get_page_buffer_meta refuses it."""

    layout = "layer_first"

    def get_page_buffer_meta(self, indices):
        raise ValueError("Unsupported layout: %s" % self.layout)


def test_sidecar_pool_without_addresses_refused_at_attach(daemon):
    """Item 3: a sidecar pool that gives no page addresses (SGLang's DSA indexer pool in
    layer_first) is refused when it is registered, naming the pool and its layout."""
    store = backend(daemon, is_mla_model=True)
    store.register_mem_pool_host(MLAHost("layer_first"))
    with pytest.raises(ValueError, match=r"host pool 'indexer' \(layout layer_first\) gives no "
                                         r"page addresses: ValueError: Unsupported layout"):
        store.register_mem_host_pool_v2(LayerFirstIndexerHost(), PoolName.INDEXER)
    store.close()


def test_get_stats_is_sglangs_storage_metrics_when_sglang_is_there(daemon, tmp_path,
                                                                    monkeypatch):
    """Item 5: SGLang's StorageMetricsCollector asserts isinstance(m, StorageMetrics): with
    sglang importable, get_stats returns its class (a stand-in module with the dataclass's
    fields, at the path current SGLang keeps it) and PoolTransferResult likewise."""
    pkg = tmp_path / "sglang" / "srt"
    for d in (pkg / "observability", pkg / "mem_cache"):
        d.mkdir(parents=True)
        (d / "__init__.py").write_text("")
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "observability" / "metrics_collector.py").write_text(
        "import dataclasses\n"
        "@dataclasses.dataclass\n"
        "class StorageMetrics:\n"
        "    prefetch_pgs: list = dataclasses.field(default_factory=list)\n"
        "    backup_pgs: list = dataclasses.field(default_factory=list)\n"
        "    prefetch_bandwidth: list = dataclasses.field(default_factory=list)\n"
        "    backup_bandwidth: list = dataclasses.field(default_factory=list)\n")
    (pkg / "mem_cache" / "hicache_storage.py").write_text(
        "import dataclasses\n"
        "@dataclasses.dataclass\n"
        "class PoolTransferResult:\n"
        "    kv_hit_pages: int\n"
        "    extra_pool_hit_pages: dict\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(kvnode.sglang, "_sglang_classes", {}, raising=False)
    try:
        from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
        from sglang.srt.observability.metrics_collector import StorageMetrics
        store = backend(daemon)
        store.register_mem_pool_host(MHAHost("page_first"))
        keys = keys_for(15, 2)
        assert store.batch_set_v1(keys, indices(0, 2)) == [True] * 2
        m = store.get_stats()
        assert isinstance(m, StorageMetrics) and m.backup_pgs == [2] and m.misses == 0
        assert isinstance(store.batch_exists_v2(keys, []), PoolTransferResult)
        store.close()
    finally:
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            del sys.modules[name]
