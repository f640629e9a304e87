"""Issue 31, item 2: model revisions and purge, for every Python door, against a real kvnoded.

- the binding: ``Layout(revision=...)`` makes two revisions of a layout two deployments that
  do not see each other's blocks; no revision is the deployment (id and blocks) a client
  without revisions had; ``Client.purge()`` drops a deployment (every TP rank) and leaves
  the others byte-exact, an observer purges by deployment id or model, and naming another
  tenant from an engine connection is refused;
- SGLang: ``clear()`` (what the cache controller's ``clear_storage_backend`` calls) makes
  ``exists()`` False for every page it stored, on every TP rank, and leaves another
  deployment's pages; extra_config ``model_revision`` keeps two revisions apart, and
  without it the pages written before stay found;
- LMCache: ``clear()`` makes exists False for every chunk (every object size), other
  connectors' chunks stay; ``model_revision`` keeps revisions apart.
"""
import importlib
import select
import threading

import pytest

import kvnode
import kvnode.sglang
from conftest import running_daemon
from fake_sglang import HostPool, StorageConfig, chained_keys, create_dynamic_backend, host_indices

PAGE = 16
CHUNK = 64 * 1024


@pytest.fixture
def daemon(tmp_path):
    with running_daemon(str(tmp_path), str(tmp_path / "s.sock")) as sock:
        yield sock


def layout(model="purge-test", rank=0, size=1, revision=None, block_bytes=4096):
    return kvnode.Layout(model=model, dtype="bf16", block_tokens=16, block_bytes=block_bytes,
                         num_layers=2, kv_heads=2, head_dim=64, tp_size=size, tp_rank=rank,
                         revision=revision)


def block(key, seed):
    return bytes(((key * 7 + seed * 13 + i) * 2654435761 >> 11) & 0xFF for i in range(4096))


# ---------------------------------------------------------------- the binding


def test_revisions_do_not_meet_and_none_is_the_old_identity(daemon):
    keys = list(range(1000, 1008))
    with kvnode.Client(daemon, layout()) as plain, \
            kvnode.Client(daemon, layout(revision="")) as empty, \
            kvnode.Client(daemon, layout(revision="sha-a")) as a, \
            kvnode.Client(daemon, layout(revision="sha-b")) as b:
        assert empty.deployment_id == plain.deployment_id
        assert len({plain.deployment_id, a.deployment_id, b.deployment_id}) == 3
        plain.put(keys, [block(k, 1) for k in keys])
        assert a.match(keys) == 0 and b.match(keys) == 0
        a.put(keys, [block(k, 2) for k in keys])
        assert b.match(keys) == 0
        assert [bytes(x) for x in a.get(keys)] == [block(k, 2) for k in keys]
        assert [bytes(x) for x in empty.get(keys)] == [block(k, 1) for k in keys]
    with pytest.raises(kvnode.LayoutError, match="revision"):
        kvnode.Client(daemon, layout(revision="bad\nrev"))


def test_purge_drops_every_rank_and_keeps_the_rest(daemon):
    keys = list(range(2000, 2016))
    r0, r1 = kvnode.Client(daemon, layout(rank=0, size=2)), kvnode.Client(daemon, layout(rank=1, size=2))
    other = kvnode.Client(daemon, layout(model="purge-other"))
    rev = kvnode.Client(daemon, layout(revision="r1"))
    for c, seed in ((r0, 1), (r1, 2), (other, 3), (rev, 4)):
        c.put(keys, [block(k, seed) for k in keys])
    assert r1.purge() == (2, 2 * len(keys))
    assert r0.match(keys) == 0 and r1.match(keys) == 0
    assert r0.exists(keys) == [False] * len(keys)
    assert [bytes(x) for x in other.get(keys)] == [block(k, 3) for k in keys]
    assert [bytes(x) for x in rev.get(keys)] == [block(k, 4) for k in keys]
    # another tenant, from an engine connection: refused, nothing purged
    with pytest.raises(kvnode.Denied, match="only its own tenant"):
        other.purge(tenant="someone-else")
    assert other.match(keys) == len(keys)
    # an observer (this test runs as the daemon's user): by deployment id, then by model
    with kvnode.Client(daemon) as obs:
        assert obs.deployment_id == ""
        assert obs.purge(deployment_id=other.deployment_id) == (1, len(keys))
        assert other.match(keys) == 0
        with pytest.raises(kvnode.InvalidArgument):
            obs.purge()
        assert obs.purge(model="purge-test") == (3, len(keys))   # rank 0, rank 1, r1
    assert rev.match(keys) == 0
    for c in (r0, r1, other, rev):
        c.close()


# ---------------------------------------------------------------- SGLang


def sglang_backend(sock, tp_rank=0, tp_size=1, model="sgl-purge", **extra):
    cfg = StorageConfig(tp_rank=tp_rank, tp_size=tp_size, model_name=model,
                        extra_config=dict(backend_name="kvnode", module_path="kvnode.sglang",
                                          class_name="KvnodeHiCacheStorage", interface_v1=1,
                                          socket_path=sock, **extra))
    return create_dynamic_backend(cfg)


def tokens(seed, npages):
    return [seed * 100003 + t for t in range(npages * PAGE)]


def test_sglang_clear_empties_the_deployment(daemon):
    pools = [HostPool(8, PAGE) for _ in range(3)]
    ranks = [sglang_backend(daemon, tp_rank=r, tp_size=2) for r in range(2)]
    other = sglang_backend(daemon, model="sgl-other")
    for s, p in zip(ranks + [other], pools):
        s.register_mem_pool_host(p)
        p.fill(0, seed=5)
    keys = chained_keys(tokens(7, 4), PAGE)
    for s in ranks + [other]:
        assert s.batch_set_v1(keys, host_indices(0, 4, PAGE)) == [True] * 4
        assert s.batch_exists(keys) == 4
    # SGLang's controller: hasattr(storage_backend, "clear") -> storage_backend.clear()
    assert hasattr(ranks[0], "clear")
    ranks[0].clear()
    for s in ranks:
        assert s.batch_exists(keys) == 0
        assert not any(s.exists(k) for k in keys)
    assert other.batch_exists(keys) == 4
    assert other.batch_get_v1(keys, host_indices(4, 4, PAGE)) == [True] * 4
    assert [pools[2].page((4 + p) * PAGE) for p in range(4)] == \
        [pools[2].page(p * PAGE) for p in range(4)]
    for s in ranks + [other]:
        s.close()


def test_sglang_model_revision(daemon):
    keys = chained_keys(tokens(8, 3), PAGE)
    old = sglang_backend(daemon)
    pool = HostPool(8, PAGE)
    old.register_mem_pool_host(pool)
    pool.fill(0, seed=6)
    assert old.batch_set_v1(keys, host_indices(0, 3, PAGE)) == [True] * 3
    new = sglang_backend(daemon, model_revision="weights-v2")
    new.register_mem_pool_host(HostPool(8, PAGE))
    assert new.batch_exists(keys) == 0
    # the same config without a revision finds what was written before
    again = sglang_backend(daemon)
    again.register_mem_pool_host(HostPool(8, PAGE))
    assert again.batch_exists(keys) == 3
    # clearing the new revision leaves the old one
    new.clear()
    assert again.batch_exists(keys) == 3
    with pytest.raises(ValueError, match="model_revision"):
        sglang_backend(daemon, model_revision="a\tb")
    for s in (old, new, again):
        s.close()


# ---------------------------------------------------------------- LMCache


def lmcache_connector(sock, **params):
    cls = getattr(importlib.import_module("kvnode.lmcache"), "KvnodeL2Connector")
    return cls(socket_path=sock, **params)


def run(conn, fid, timeout=10.0):
    """LMCache's side: poll event_fd until future fid completes; (ok, error, per_key)."""
    fd = conn.event_fd()
    deadline = threading.Event()
    timer = threading.Timer(timeout, deadline.set)
    timer.start()
    try:
        while not deadline.is_set():
            r, _, _ = select.select([fd], [], [], 0.05)
            if r:
                for f, ok, err, per_key in conn.drain_completions():
                    if f == fid:
                        return ok, err, per_key
        raise AssertionError("future %d never completed" % fid)
    finally:
        timer.cancel()


def lmc_keys(seed, n):
    return ["lmc-purge@%08x@0@%064x" % (0, seed * 1000 + i) for i in range(n)]


def test_lmcache_clear_and_revision(daemon):
    conn = lmcache_connector(daemon, model="lmc-purge", block_bytes=[CHUNK, CHUNK // 2])
    keep = lmcache_connector(daemon, model="lmc-keep", block_bytes=CHUNK)
    rev = lmcache_connector(daemon, model="lmc-purge", block_bytes=CHUNK, model_revision="v2")
    big, small = lmc_keys(1, 4), lmc_keys(2, 3)
    data = [bytearray([i + 1]) * CHUNK for i in range(4)]
    halves = [bytearray([i + 9]) * (CHUNK // 2) for i in range(3)]
    assert run(conn, conn.submit_batch_set(big + small, [memoryview(b) for b in data + halves]))[0]
    assert run(keep, keep.submit_batch_set(big, [memoryview(b) for b in data]))[0]
    ok, _, per_key = run(conn, conn.submit_batch_exists(big + small))
    assert ok and per_key == [True] * 7
    # another revision of the same model does not see them
    ok, _, per_key = run(rev, rev.submit_batch_exists(big))
    assert ok and per_key == [False] * 4
    assert run(rev, rev.submit_batch_set(big, [memoryview(b) for b in data]))[0]

    assert conn.clear() == 7
    ok, _, per_key = run(conn, conn.submit_batch_exists(big + small))
    assert ok and per_key == [False] * 7
    ok, _, per_key = run(keep, keep.submit_batch_exists(big))
    assert ok and per_key == [True] * 4
    ok, _, per_key = run(rev, rev.submit_batch_exists(big))
    assert ok and per_key == [True] * 4
    back = [bytearray(CHUNK) for _ in range(4)]
    ok, _, per_key = run(keep, keep.submit_batch_get(big, [memoryview(b) for b in back]))
    assert ok and per_key == [True] * 4 and back == data
    with pytest.raises(ValueError, match="model_revision"):
        lmcache_connector(daemon, model_revision=5)
    for c in (conn, keep, rev):
        c.close()
