"""Check words (issue 19 item 2) through the binding and both adapters, against a real kvnoded:
kvnode.fold_digests derives a key and a word from each foreign key; two keys whose 64-bit
keys collide but whose words differ never read each other's block (a miss, counted in the
daemon's keys.check_mismatches_total), and the round trips stay byte-exact."""
import ctypes
import hashlib
import select

import pytest

import kvnode
import kvnode.sglang
from conftest import running_daemon
from fake_sglang import HostPool, StorageConfig, create_dynamic_backend, host_indices
from test_lmcache import CHUNK, Loop, chunks, connector

PAGE = 16


@pytest.fixture
def daemon(tmp_path):
    with running_daemon(str(tmp_path), str(tmp_path / "s.sock")) as sock:
        yield sock


def colliding(tag, n=2):
    """n SHA-256 hex digests sharing their first 8 bytes (one folded key), the next 8
    bytes different (distinct check words)."""
    head = hashlib.sha256(b"head-" + tag).hexdigest()[:16]
    return [head + hashlib.sha256(b"%s-%d" % (tag, i)).hexdigest()[16:] for i in range(n)]


def mismatches(sock):
    with kvnode.Client(sock) as observer:
        return observer.stats()["keys"]["check_mismatches_total"]


def test_fold_digests_words():
    a, b = colliding(b"fold")
    keys, checks = kvnode.fold_digests([a, b])
    assert isinstance(keys, ctypes.Array) and isinstance(checks, ctypes.Array)
    assert keys[0] == keys[1] == kvnode.fold_key(a) == kvnode.fold_key(b)
    assert checks[0] == int(a[16:32], 16) and checks[1] == int(b[16:32], 16)
    assert checks[0] != checks[1]
    # any string (LMCache's "model@rank@hash"): key and word from its SHA-256
    s = "Qwen/Qwen3-8B@00000000@" + a
    d = hashlib.sha256(s.encode()).digest()
    k, w = kvnode.fold_digests([s])
    assert k[0] == int.from_bytes(d[:8], "big", signed=True) == kvnode.fold_key(s)
    assert w[0] == int.from_bytes(d[8:16], "big")
    # bytes keys (per key in Python) and a key with a NUL agree with fold_key too
    mixed = [a, b"raw-bytes", "with\0nul", s]
    k, w = kvnode.fold_digests(mixed)
    assert list(k) == [kvnode.fold_key(x) for x in mixed]
    assert w[1] == int.from_bytes(hashlib.sha256(b"raw-bytes").digest()[8:16], "big")
    assert len(kvnode.fold_digests([])[0]) == 0
    # prefix: a view of the first items, no copy
    p = kvnode.prefix(k, 2)
    assert list(p) == list(k[:2]) and ctypes.addressof(p) == ctypes.addressof(k)
    with pytest.raises(ValueError):
        kvnode.prefix(k, 5)


def test_client_checked_calls(daemon):
    a, b = colliding(b"client")
    keys, checks = kvnode.fold_digests([a, b])
    ka, kb = kvnode.prefix(keys, 1), (ctypes.c_int64 * 1)(keys[1])
    wa, wb = kvnode.prefix(checks, 1), (ctypes.c_uint64 * 1)(checks[1])
    layout = kvnode.Layout(model="cw", dtype="u8", block_tokens=16, block_bytes=4096)
    with kvnode.Client(daemon, layout) as c:
        assert c.has_check_words
        page = bytearray(b"A" * 4096)
        c.put_batch(ka, [page], checks=wa)
        before = mismatches(daemon)
        assert c.match(ka, wa) == 1
        assert c.match_tiers(ka, wa).matched == 1
        assert c.match(kb, wb) == 0                 # same key, other word: a miss
        assert c.match(ka) == 0                     # no word: a miss too
        out = bytearray(4096)
        assert c.get_batch(kb, [out], checks=wb) == 0 and out == bytearray(4096)
        assert c.get(kb, checks=wb) == [] and c.get(kb, checks=wb, inline=True) == []
        assert mismatches(daemon) >= before + 5
        assert c.get_batch(ka, [out], checks=wa) == 1 and out == page
        assert c.get(ka, checks=[checks[0]]) == [bytes(page)]
        with c.read(ka, checks=wa) as views:
            assert len(views) == 1 and bytes(views[0]) == bytes(page)
        with c.read(kb, checks=wb) as views:
            assert views == []
        # the other word can neither overwrite nor delete it
        c.put(kb, [b"B" * 4096], checks=wb)
        assert c.get(ka, checks=wa) == [bytes(page)]
        assert c.delete(kb, wb) == 0 and c.match(ka, wa) == 1
        # asynchronous forms
        t = c.submit_match(kb, wb)
        t2 = c.submit_get(ka, [out], checks=wa)
        done = {}
        while len(done) < 2:
            select.select([c.event_fd], [], [], 5)
            done.update({x.ticket: x for x in c.drain()})
        assert done[t].ok and done[t].count == 0
        assert done[t2].ok and done[t2].count == 1
        assert c.delete(ka, wa) == 1 and c.match(ka, wa) == 0
        with pytest.raises(ValueError):
            c.match(keys, [1])                      # one word per key


@pytest.mark.parametrize("mla", [False, True])
def test_sglang_colliding_keys_miss(daemon, mla):
    """Two SGLang keys with one folded key: storing one and reading the other is a miss,
    never the other's bytes; the daemon counts the mismatches."""
    pool = HostPool(8, PAGE, mla=mla)
    store = create_dynamic_backend(StorageConfig(
        is_mla_model=mla, model_name="sgl-cw",
        extra_config=dict(backend_name="kvnode", module_path="kvnode.sglang",
                          class_name="KvnodeHiCacheStorage", interface_v1=1, socket_path=daemon,
                          connect_wait_ms=10000)))
    store.register_mem_pool_host(pool)
    a, b = colliding(b"sglang-%d" % mla)
    pool.fill(0, seed=1)
    stored = pool.page(0)
    assert store.batch_set_v1([a], host_indices(0, 1, PAGE)) == [True]
    before = mismatches(daemon)
    assert store.batch_exists([b]) == 0 and not store.exists(b)
    assert store.batch_get_v1([b], host_indices(2, 1, PAGE)) == [False]
    assert pool.page(2 * PAGE) != stored and pool.page(2 * PAGE) == bytes(len(stored))
    assert store.get(b) is None
    assert mismatches(daemon) >= before + 3
    # the stored one reads back byte-exact, b's write does not replace it
    assert store.batch_exists([a]) == 1
    assert store.batch_get_v1([a], host_indices(3, 1, PAGE)) == [True]
    assert pool.page(3 * PAGE) == stored
    pool.fill(4 * PAGE, seed=2)
    store.batch_set_v1([b], host_indices(4, 1, PAGE))
    assert store.batch_get_v1([a], host_indices(5, 1, PAGE)) == [True]
    assert pool.page(5 * PAGE) == stored
    store.close()


def test_lmcache_colliding_keys_miss(daemon):
    """The same through the LMCache connector (keys that are hex digests sharing 8 bytes)."""
    loop = Loop(connector(daemon))
    try:
        a, b = colliding(b"lmcache")
        page = chunks(3, 1)
        ok, err, _ = loop.wait(loop.conn.submit_batch_set([a], [memoryview(page[0])]))
        assert ok, err
        before = mismatches(daemon)
        ok, err, per_key = loop.wait(loop.conn.submit_batch_exists([b]))
        assert ok and per_key == [False]
        out = bytearray(CHUNK)
        ok, err, per_key = loop.wait(loop.conn.submit_batch_get([b], [memoryview(out)]))
        assert ok and per_key == [False] and out == bytearray(CHUNK)
        assert mismatches(daemon) >= before + 2
        ok, err, per_key = loop.wait(loop.conn.submit_batch_exists([a]))
        assert ok and per_key == [True]
        ok, err, per_key = loop.wait(loop.conn.submit_batch_get([a], [memoryview(out)]))
        assert ok and per_key == [True] and out == page[0]
    finally:
        loop.close()
