"""kvnode.sglang's gathered pages (layer_first, issue 31) move in one libkvnode call per batch
(kvnode_gather into the blocks a put lends, kvnode_scatter out of those a get lends), byte
for byte for every SGLang host layout; the copy in Python (a libkvnode without those calls)
stores the same blocks; a copy that fails ends the put's lease (nothing stored) and a get's
(nothing read)."""
import pytest

import kvnode._lib
import kvnode.sglang
from test_sglang_engine import (LAYOUTS, backend, daemon, fill_, indices, keys_for,  # noqa: F401
                                make_pool, raw)
import torch


def slots_indices(slots):
    """Host token indices of the page slots `slots`, in that order."""
    return torch.cat([indices(s, 1) for s in slots])


@pytest.fixture
def calls(monkeypatch):
    """Counts kvnode_put_gather_checked / kvnode_get_scatter_checked calls; the Python copy
    must not run."""
    seen = {"gather": 0, "scatter": 0}

    def spy(name, fn):
        def call(*args):
            seen[name] += 1
            return fn(*args)
        return call
    monkeypatch.setattr(kvnode._lib, "_put_gather", spy("gather", kvnode._lib._put_gather))
    monkeypatch.setattr(kvnode._lib, "_get_scatter", spy("scatter", kvnode._lib._get_scatter))

    def no_python_copy(*args):
        raise AssertionError("the gathered pages were copied in Python")
    monkeypatch.setattr(kvnode.sglang._Plan, "_gather_python", no_python_copy)
    return seen


@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_every_layout_byte_exact_one_call_per_batch(daemon, calls, kind, layout):
    """8 pages from slots out of order, 2 of them stored before from other bytes (their
    blocks are skipped: the first bytes stay), read back into other slots with a missing
    tail: every destination byte is right; layer_first made one kvnode_gather per put and
    one kvnode_scatter per get, the zero-copy layouts none."""
    src, dst = make_pool(kind, layout, pages=12), make_pool(kind, layout, pages=12)
    fill_(src.kv_buffer, seed=31)
    writer = backend(daemon, is_mla_model=kind == "mla", model_name="copy-" + layout)
    reader = backend(daemon, is_mla_model=kind == "mla", model_name="copy-" + layout)
    writer.register_mem_pool_host(src)
    reader.register_mem_pool_host(dst)
    keys = keys_for(11, 8)
    order = [0, 1, 5, 4, 6, 7, 9, 10]
    assert writer.batch_set_v1(keys[2:4], slots_indices([2, 3])) == [True] * 2
    assert writer.batch_set_v1(keys, slots_indices(order)) == [True] * 8
    back = [11, 3, 2, 8, 0, 1, 4, 5]
    assert reader.batch_get_v1(keys + keys_for(12, 2), slots_indices(back + [6, 7])) == \
        [True] * 8 + [False] * 2
    stored = [0, 1, 2, 3, 6, 7, 9, 10]      # keys 2 and 3 hold slots 2 and 3's bytes
    for s, d in zip(stored, back):
        assert raw(dst.page(d)) == raw(src.page(s)), (kind, layout, s, d)
    for d in (6, 7, 9, 10):                 # slots the get did not name stay zero
        assert not any(raw(dst.page(d)))
    # the flat page (SGLang's get_data_page order: every K, then every V) is the block
    assert bytes(reader.batch_get(keys[:1])[0]) == raw(src.page(order[0]))
    gathered = layout == "layer_first"
    assert calls == {"gather": 2 if gathered else 0, "scatter": 1 if gathered else 0}
    writer.close()
    reader.close()


@pytest.mark.parametrize("ops", ["torch", "numpy", "none"])
@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_python_copy_stores_the_same_blocks(daemon, monkeypatch, kind, ops):
    """Without kvnode_gather (an older libkvnode) the Python copy runs (each of its ways):
    pages it stores read back byte-exact through kvnode_scatter, and the C copy's pages
    through it; both store the same block for the same page."""
    src, dst = make_pool(kind, "layer_first", pages=8), make_pool(kind, "layer_first", pages=8)
    fill_(src.kv_buffer, seed=7)
    engine = backend(daemon, is_mla_model=kind == "mla", model_name="copy-py-" + ops)
    engine.register_mem_pool_host(src)
    reader = backend(daemon, is_mla_model=kind == "mla", model_name="copy-py-" + ops)
    reader.register_mem_pool_host(dst)
    by_c, by_python = keys_for(21, 3), keys_for(22, 3)
    assert engine.batch_set_v1(by_c, indices(0, 3)) == [True] * 3
    with monkeypatch.context() as m:
        for name in ("_gather", "_scatter", "_put_gather", "_get_scatter"):
            m.setattr(kvnode._lib, name, None)
        m.setattr(kvnode.sglang, "_ops",
                  [kvnode.sglang.ARRAY_OPS[ops]() if ops != "none" else None])
        assert engine.batch_set_v1(by_python, indices(0, 3)) == [True] * 3
        assert reader.batch_get_v1(by_c, indices(5, 3)) == [True] * 3    # Python reads C's
    assert reader.batch_get_v1(by_python, indices(2, 3)) == [True] * 3   # C reads Python's
    for i in range(3):
        assert raw(dst.page(5 + i)) == raw(src.page(i))
        assert raw(dst.page(2 + i)) == raw(src.page(i))
    assert [bytes(b) for b in reader.batch_get(by_c)] == \
        [bytes(b) for b in reader.batch_get(by_python)]
    engine.close()
    reader.close()


def test_failed_copy_stores_and_reads_nothing(daemon, monkeypatch):
    """kvnode_gather refusing the pieces (here: two placed over each other) aborts the put:
    batch_set_v1 answers False, no page is stored; kvnode_scatter refusing them leaves the
    destination untouched and the get answers False; the backend works on afterwards."""
    src, dst = make_pool("mha", "layer_first"), make_pool("mha", "layer_first")
    fill_(src.kv_buffer, seed=3)
    engine = backend(daemon, model_name="copy-fail")
    engine.register_mem_pool_host(src)
    reader = backend(daemon, model_name="copy-fail")
    reader.register_mem_pool_host(dst)
    keys = keys_for(31, 3)
    plan = engine._plans[kvnode.sglang.KV_POOL]
    good = plan._c_offsets
    bad = (type(good))(*good)
    bad[1] = bad[0]
    monkeypatch.setattr(plan, "_c_offsets", bad)
    assert engine.batch_set_v1(keys, indices(0, 3)) == [False] * 3
    assert engine.batch_exists(keys) == 0
    monkeypatch.setattr(plan, "_c_offsets", good)
    assert engine.batch_set_v1(keys, indices(0, 3)) == [True] * 3
    rplan = reader._plans[kvnode.sglang.KV_POOL]
    monkeypatch.setattr(rplan, "_c_offsets", bad)
    assert reader.batch_get_v1(keys, indices(1, 3)) == [False] * 3
    assert not any(raw(dst.kv_buffer))
    monkeypatch.setattr(rplan, "_c_offsets", good)
    assert reader.batch_get_v1(keys, indices(1, 3)) == [True] * 3
    for i in range(3):
        assert raw(dst.page(1 + i)) == raw(src.page(i))
    engine.close()
    reader.close()


def test_batches_over_max_keys_go_in_chunks(tmp_path):
    """A daemon taking 3 keys per request: an 8-page batch goes as leases of 3, 3 and 2 pages,
    every byte where it belongs; a get of a batch with a missing tail reads the prefix."""
    from conftest import running_daemon
    with running_daemon(str(tmp_path), str(tmp_path / "s.sock"),
                        "server.max_keys_per_request=3") as sock:
        src, dst = make_pool("mha", "layer_first", pages=12), \
            make_pool("mha", "layer_first", pages=12)
        fill_(src.kv_buffer, seed=41)
        engine = backend(sock, model_name="copy-chunks")
        engine.register_mem_pool_host(src)
        reader = backend(sock, model_name="copy-chunks")
        reader.register_mem_pool_host(dst)
        keys = keys_for(41, 8)
        assert engine.batch_set_v1(keys[:7], slots_indices([3, 0, 1, 2, 7, 6, 5])) == [True] * 7
        assert reader.batch_get_v1(keys, slots_indices([11, 10, 9, 8, 4, 3, 2, 1])) == \
            [True] * 7 + [False]
        for s, d in zip([3, 0, 1, 2, 7, 6, 5], [11, 10, 9, 8, 4, 3, 2]):
            assert raw(dst.page(d)) == raw(src.page(s)), (s, d)
        assert not any(raw(dst.page(1)))
        engine.close()
        reader.close()


class CountingMeta:
    """Wraps a pool's get_page_buffer_meta: how many pages each call asked about."""

    def __init__(self, pool):
        self.pool, self.inner, self.pages = pool, pool.get_page_buffer_meta, []
        pool.get_page_buffer_meta = self

    def __call__(self, indices):
        self.pages.append(len(indices) // self.pool.page_size)
        return self.inner(indices)


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_page_bases_ask_the_pool_about_two_pages_per_batch(daemon, kind):
    """SGLang's layer_first pools (one kv_buffer, pages at one step): a batch of 8 pages asks
    get_page_buffer_meta about its first and last page only (the check of the model), not
    every piece of every page; the bytes are exact."""
    src, dst = make_pool(kind, "layer_first", pages=12), make_pool(kind, "layer_first", pages=12)
    fill_(src.kv_buffer, seed=51)
    engine = backend(daemon, is_mla_model=kind == "mla", model_name="copy-bases")
    engine.register_mem_pool_host(src)
    reader = backend(daemon, is_mla_model=kind == "mla", model_name="copy-bases")
    reader.register_mem_pool_host(dst)
    assert engine._plans[kvnode.sglang.KV_POOL].bases is not None
    asked, read = CountingMeta(src), CountingMeta(dst)
    keys = keys_for(51, 8)
    assert engine.batch_set_v1(keys, slots_indices([9, 1, 0, 4, 5, 6, 10, 2])) == [True] * 8
    assert reader.batch_get_v1(keys, slots_indices([3, 2, 1, 0, 11, 10, 9, 8])) == [True] * 8
    assert asked.pages == [2] and read.pages == [2]
    for s, d in zip([9, 1, 0, 4, 5, 6, 10, 2], [3, 2, 1, 0, 11, 10, 9, 8]):
        assert raw(dst.page(d)) == raw(src.page(s))
    engine.close()
    reader.close()


def test_a_pool_that_moved_is_asked_for_every_piece(daemon, caplog):
    """The pool's buffer replaced after registration (its pages elsewhere): the check of the
    batch's first and last page disagrees, so that batch and every later one take every
    address from get_page_buffer_meta (logged once); the bytes come from the new buffer."""
    src, dst = make_pool("mha", "layer_first", pages=12), make_pool("mha", "layer_first", pages=12)
    engine = backend(daemon, model_name="copy-moved")
    engine.register_mem_pool_host(src)
    reader = backend(daemon, model_name="copy-moved")
    reader.register_mem_pool_host(dst)
    plan = engine._plans[kvnode.sglang.KV_POOL]
    assert plan.bases is not None
    old = src.kv_buffer
    src.kv_buffer = torch.zeros_like(old)
    fill_(src.kv_buffer, seed=61)
    asked = CountingMeta(src)
    keys = keys_for(61, 4)
    assert engine.batch_set_v1(keys, indices(2, 4)) == [True] * 4
    assert plan.bases is None
    assert asked.pages == [2, 4]             # the check, then the whole batch
    assert "no longer gives pages at one step" in caplog.text
    assert engine.batch_set_v1(keys_for(62, 2), indices(0, 2)) == [True] * 2
    assert asked.pages == [2, 4, 2]          # the whole batch (of 2 pages), no check
    assert reader.batch_get_v1(keys, indices(5, 4)) == [True] * 4
    for i in range(4):
        assert raw(dst.page(5 + i)) == raw(src.page(2 + i))
    assert any(raw(src.kv_buffer)) and not any(raw(old))
    engine.close()
    reader.close()


def test_pools_off_the_model_are_asked_for_every_piece(daemon):
    """A layer_first pool without a kv_buffer, or whose pages 0 and 1 are not at one step,
    gets no page-base model: every batch asks get_page_buffer_meta about every page."""
    class NoBuffer:
        def __init__(self, pool):
            self.pool = pool
            self.layout, self.page_size = pool.layout, pool.page_size

        def get_page_buffer_meta(self, idx):
            return self.pool.get_page_buffer_meta(idx)

    class Swapped(NoBuffer):        # pages 0 and 1 trade places
        def __init__(self, pool):
            super().__init__(pool)
            self.kv_buffer = pool.kv_buffer

        def get_page_buffer_meta(self, idx):
            ps = self.page_size
            moved = torch.tensor([(t + ps if t < ps else t - ps if t < 2 * ps else t)
                                  for t in idx.tolist()], dtype=torch.int64)
            return self.pool.get_page_buffer_meta(moved)

    for make in (NoBuffer, Swapped):
        src = make(make_pool("mha", "layer_first", pages=8))
        fill_(src.pool.kv_buffer, seed=71)
        engine = backend(daemon, model_name="copy-off-" + make.__name__)
        engine.register_mem_pool_host(src)
        assert engine._plans[kvnode.sglang.KV_POOL].bases is None
        asked = CountingMeta(src)
        keys = keys_for(71, 3)
        assert engine.batch_set_v1(keys, indices(0, 3)) == [True] * 3
        assert asked.pages == [3]
        got = engine.batch_get(keys)
        expect = [0 + 1, 0, 2] if make is Swapped else [0, 1, 2]
        for i, page in enumerate(got):
            assert bytes(page) == raw(src.pool.page(expect[i]))
        engine.close()
