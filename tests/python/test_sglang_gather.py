"""kvnode.sglang's gathered layouts (layer_first: a page's per-layer pieces copied into one
block): byte-exact through each way the copy is made (torch or numpy strided views, one copy
per run of pages; piece by piece without either), with host indices out of order (runs of
one page), pages already stored (slots skipped) and a get that reads a prefix."""
import pytest

import kvnode.sglang
from test_sglang_engine import (MHAHost, MLAHost, backend, daemon, fill_, indices,  # noqa: F401
                                keys_for, raw)
import torch

PAGE = 4


@pytest.fixture(params=["torch", "numpy", "none"])
def copy_ops(request, monkeypatch):
    ops = kvnode.sglang.ARRAY_OPS[request.param]() if request.param != "none" else None
    monkeypatch.setattr(kvnode.sglang, "_ops", [ops])
    return request.param


def slots_indices(slots):
    """Host token indices of the page slots `slots`, in that order."""
    return torch.cat([indices(s, 1) for s in slots])


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_layer_first_gather_byte_exact(daemon, copy_ops, kind):
    make = (lambda: MHAHost("layer_first", pages=12)) if kind == "mha" else \
        (lambda: MLAHost("layer_first", pages=12))
    src, dst = make(), make()
    fill_(src.kv_buffer, seed=5)
    writer = backend(daemon, is_mla_model=kind == "mla", model_name="gather-" + copy_ops)
    reader = backend(daemon, is_mla_model=kind == "mla", model_name="gather-" + copy_ops)
    writer.register_mem_pool_host(src)
    reader.register_mem_pool_host(dst)
    plan = writer._plans[kvnode.sglang.KV_POOL]
    assert plan.grid is not None        # SGLang's layer_first pieces sit on a grid
    keys = keys_for(7, 8)
    # pages 2..3 first, then all 8 from slots out of order: 2 already stored (skipped)
    order = [0, 1, 5, 4, 6, 7, 9, 10]
    assert writer.batch_set_v1(keys[2:4], slots_indices(order[2:4])) == [True] * 2
    assert writer.batch_set_v1(keys, slots_indices(order)) == [True] * 8
    # read back into other slots, also out of order, with a missing tail
    back = [11, 3, 2, 8, 0, 1, 4, 5]
    more = keys_for(8, 2)
    assert reader.batch_get_v1(keys + more, slots_indices(back + [6, 7])) == [True] * 8 + \
        [False] * 2
    for s, d in zip(order, back):
        assert raw(dst.page(d)) == raw(src.page(s)), (s, d)
    # the flat page (SGLang's get_data_page order: every K, then every V) is the block
    assert bytes(reader.batch_get(keys[:1])[0]) == raw(src.page(order[0]))
    writer.close()
    reader.close()
