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
    """Counts kvnode_gather / kvnode_scatter calls; the Python copy must not run."""
    seen = {"gather": 0, "scatter": 0}

    def spy(name, fn):
        def call(*args):
            seen[name] += 1
            return fn(*args)
        return call
    monkeypatch.setattr(kvnode._lib, "_gather", spy("gather", kvnode._lib._gather))
    monkeypatch.setattr(kvnode._lib, "_scatter", spy("scatter", kvnode._lib._scatter))

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
        m.setattr(kvnode._lib, "_gather", None)
        m.setattr(kvnode._lib, "_scatter", None)
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
