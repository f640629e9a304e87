"""kvnode.sglang (HiCache storage backend) driven as SGLang's cache controller drives it, over a
numpy host pool, against a real kvnoded: byte-exact round trips, batch_exists prefix
semantics, TP namespaces, a daemon restart mid-run, a killed engine holding leases, threads."""
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import kvnode
import kvnode.sglang
from conftest import ROOT, running_daemon
from fake_sglang import HostPool, StorageConfig, chained_keys, create_dynamic_backend, host_indices

PAGE = 16


def backend(sock, tp_rank=0, tp_size=1, mla=False, model="sgl-test", **extra):
    cfg = StorageConfig(tp_rank=tp_rank, tp_size=tp_size, is_mla_model=mla, model_name=model,
                        extra_config=dict(backend_name="kvnode", module_path="kvnode.sglang",
                                          class_name="KvnodeHiCacheStorage", interface_v1=1,
                                          socket_path=sock, **extra))
    cfg.extra_config.setdefault("connect_wait_ms", 10000)   # the first call waits for the connect
    return create_dynamic_backend(cfg)


@pytest.fixture
def daemon(tmp_path):
    with running_daemon(str(tmp_path), str(tmp_path / "s.sock")) as sock:
        yield sock


def tokens(seed, npages):
    return [seed * 100003 + t for t in range(npages * PAGE)]


def test_fold_key_deterministic():
    h = "ab" * 32
    assert kvnode.sglang.fold_key(h) == int.from_bytes(bytes.fromhex(h[:16]), "big", signed=True)
    assert kvnode.sglang.fold_key("not-hex") == kvnode.sglang.fold_key("not-hex")
    assert kvnode.sglang.fold_key("ff" * 32) == -1
    # the batch form agrees with the single one on every kind of key
    mixed = chained_keys(tokens(9, 40), PAGE) + ["lmc@m@0@%d" % i for i in range(5)] + \
        ["0x" + "ab" * 31, "ab" * 8, "abcdefgh" * 2 + "-x", "é" * 20, b"raw", "AB" * 32]
    assert kvnode.fold_keys(mixed) == [kvnode.fold_key(k) for k in mixed]
    hexes = chained_keys(tokens(9, 40), PAGE)
    assert kvnode.fold_keys(hexes) == [int(h[:16], 16) - (1 << 64) * (int(h[:16], 16) >> 63)
                                       for h in hexes]
    assert len(set(kvnode.fold_keys(hexes))) == 40


@pytest.mark.parametrize("mla", [False, True])
def test_v1_round_trip_and_prefix(daemon, mla):
    pool = HostPool(32, PAGE, mla=mla)
    store = backend(daemon, mla=mla)
    store.register_mem_pool_host(pool)
    assert store.component_bytes == ([pool.page_size * pool.token_bytes] * (1 if mla else 2))
    keys = chained_keys(tokens(1, 8), PAGE)
    for p in range(8):
        pool.fill(p * PAGE, seed=p)
    src = [pool.page(p * PAGE) for p in range(8)]
    assert store.batch_exists(keys) == 0
    assert store.batch_set_v1(keys, host_indices(0, 8, PAGE)) == [True] * 8
    assert store.batch_exists(keys) == 8
    assert store.batch_exists(keys + chained_keys(tokens(2, 2), PAGE)) == 8
    other = chained_keys(tokens(3, 1), PAGE)
    assert store.batch_exists(keys[:3] + other + keys[4:]) == 3
    assert store.exists(keys[5]) and not store.exists(other[0])
    # read into pages 16..23 of the pool: byte-exact
    got = store.batch_get_v1(keys + other, host_indices(16, 9, PAGE))
    assert got == [True] * 8 + [False]
    assert [pool.page((16 + p) * PAGE) for p in range(8)] == src
    # flat-page paths (get/set, batch_get/batch_set)
    assert store.set(other[0], bytearray(src[0]))
    assert bytes(store.get(other[0])) == src[0]
    assert store.batch_get(keys[:2] + ["00" * 32]) [2] is None
    assert [bytes(b) for b in store.batch_get(keys[:2])] == src[:2]
    store.close()


def test_tp_ranks_have_their_own_namespace(daemon):
    pools = [HostPool(8, PAGE) for _ in range(2)]
    ranks = [backend(daemon, tp_rank=r, tp_size=2) for r in range(2)]
    for r, s in enumerate(ranks):
        s.register_mem_pool_host(pools[r])
    keys = chained_keys(tokens(4, 4), PAGE)
    pools[0].fill(0, seed=9)
    assert ranks[0].batch_set_v1(keys, host_indices(0, 4, PAGE)) == [True] * 4
    assert ranks[0].batch_exists(keys) == 4
    assert ranks[1].batch_exists(keys) == 0
    # MLA: every rank shares rank 0's namespace
    mla = [backend(daemon, tp_rank=r, tp_size=2, mla=True) for r in range(2)]
    mpools = [HostPool(8, PAGE, mla=True) for _ in range(2)]
    for s, p in zip(mla, mpools):
        s.register_mem_pool_host(p)
    mpools[0].fill(0, seed=10)
    assert mla[0].batch_set_v1(keys, host_indices(0, 4, PAGE)) == [True] * 4
    assert mla[1].batch_get_v1(keys, host_indices(4, 4, PAGE)) == [True] * 4
    assert mpools[1].page(4 * PAGE) == mpools[0].page(0)
    for s in ranks + mla:
        s.close()


def test_daemon_restart_mid_run(tmp_path, caplog):
    sock = str(tmp_path / "r.sock")
    pool = HostPool(16, PAGE)
    for p in range(16):
        pool.fill(p * PAGE, seed=p)
    keys = chained_keys(tokens(5, 4), PAGE)
    store = backend(sock, reconnect_interval_s=0)
    store.register_mem_pool_host(pool)
    with running_daemon(str(tmp_path), sock):
        assert store.batch_set_v1(keys, host_indices(0, 4, PAGE)) == [True] * 4
        assert store.batch_exists(keys) == 4
    # daemon gone: no exception reaches the engine, everything reads as "not cached"
    with caplog.at_level(logging.WARNING, logger="kvnode.sglang"):
        assert store.batch_exists(keys) == 0
        assert store.batch_get_v1(keys, host_indices(8, 4, PAGE)) == [False] * 4
        assert store.batch_set_v1(keys, host_indices(0, 4, PAGE)) == [False] * 4
        assert store.get(keys[0]) is None and store.set(keys[0], pool.page(0)) is False
    assert any("answering 'not cached'" in r.getMessage() for r in caplog.records)
    with running_daemon(str(tmp_path), sock):
        # a fresh daemon (no store): the cache is empty, the adapter reconnects by itself
        assert store.batch_exists(keys) == 0
        assert store.batch_set_v1(keys, host_indices(0, 4, PAGE)) == [True] * 4
        assert store.batch_get_v1(keys, host_indices(8, 4, PAGE)) == [True] * 4
        assert [pool.page((8 + p) * PAGE) for p in range(4)] == [pool.page(p * PAGE) for p in range(4)]
    store.close()


ENGINE = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [sys.argv[2], sys.argv[3]]
    import kvnode, kvnode.sglang
    from fake_sglang import HostPool, StorageConfig, chained_keys, create_dynamic_backend, host_indices
    store = create_dynamic_backend(StorageConfig(model_name="sgl-killed", extra_config=dict(
        module_path="kvnode.sglang", class_name="KvnodeHiCacheStorage", socket_path=sys.argv[1],
        connect_wait_ms=10000)))
    pool = HostPool(128, 16)
    store.register_mem_pool_host(pool)
    keys = chained_keys(list(range(64 * 16)), 16)
    assert store.batch_set_v1(keys, host_indices(0, 64, 16)) == [True] * 64
    lay = store._layouts()[0]
    c = kvnode.Client(sys.argv[1], lay)
    words = c.has_check_words                        # as the backend stored them
    folded, checks = kvnode.fold_digests(keys)
    lease = c.read(folded, checks=checks if words else None)   # held until the process dies
    views = lease.__enter__()
    folded, checks = kvnode.fold_digests(chained_keys(list(range(5000, 5000 + 4 * 16)), 16))
    w = c.write(folded, checks=checks if words else None)
    w.__enter__()
    print("ready", len(views), flush=True)
    while True:                   # the engine keeps copying pages when it is killed
        store.batch_get_v1(keys, host_indices(64, 64, 16))
""")


def test_killed_engine_leases_freed(daemon):
    proc = subprocess.Popen([sys.executable, "-c", ENGINE, daemon, os.path.join(ROOT, "python"),
                             os.path.dirname(__file__)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().split() == ["ready", "64"]
        with kvnode.Client(daemon) as obs:
            held = obs.stats()["leases"]
            assert held["read"] >= 1 and held["write"] == 1, held
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            deadline = time.monotonic() + 10
            while True:
                leases = obs.stats()["leases"]
                if leases["read"] == 0 and leases["write"] == 0:
                    break
                assert time.monotonic() < deadline, "leases not freed: %s" % leases
                time.sleep(0.02)
        # the uncommitted write is gone; the committed pages are still served
        store = backend(daemon, model="sgl-killed")
        store.register_mem_pool_host(HostPool(128, 16))
        assert store.batch_exists(chained_keys(list(range(64 * 16)), 16)) == 64
        assert store.batch_exists(chained_keys(list(range(5000, 5000 + 4 * 16)), 16)) == 0
        store.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_threads(daemon):
    pool = HostPool(8 * 8 * 2, PAGE)
    store = backend(daemon)
    store.register_mem_pool_host(pool)
    errors = []

    def worker(t):
        try:
            first = t * 16
            for p in range(8):
                pool.fill((first + p) * PAGE, seed=1000 * t + p)
            keys = chained_keys(tokens(100 + t, 8), PAGE)
            for _ in range(5):
                assert store.batch_set_v1(keys, host_indices(first, 8, PAGE)) == [True] * 8
                assert store.batch_exists(keys) == 8
                assert store.batch_get_v1(keys, host_indices(first + 8, 8, PAGE)) == [True] * 8
                assert ([pool.page((first + 8 + p) * PAGE) for p in range(8)] ==
                        [pool.page((first + p) * PAGE) for p in range(8)])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    store.close()


def test_refused_put_fails_the_call_not_the_engine(tmp_path, caplog):
    """A put the daemon refuses (16 pages of 1 MiB, sent in chunks of 4 under the connection's
    reservation limit, each over memory.namespace_quota = 2 MiB) answers [False]*n, keeps the
    connection, logs the reason."""
    with running_daemon(str(tmp_path), str(tmp_path / "n.sock"), "memory.host_bytes=16MiB",
                        "memory.namespace_quota=2MiB") as sock:
        pool = HostPool(8, page_size=16, layers=1, heads=1, head_dim=65536, mla=True,
                        dtype="uint8")
        assert pool.page_size * pool.token_bytes == 1024 * 1024
        store = backend(sock, mla=True, model="sgl-full")
        store.register_mem_pool_host(pool)
        keys = chained_keys(tokens(7, 8), PAGE)
        with caplog.at_level(logging.WARNING, logger="kvnode.sglang"):
            small = [store.batch_set_v1(keys[0:2], host_indices(0, 2, PAGE))]
            big = store.batch_set_v1(chained_keys(tokens(8, 16), PAGE),
                                     host_indices(0, 16, PAGE) % (8 * PAGE))
        assert small == [[True, True]]
        assert big == [False] * 16
        assert any("namespace_quota" in r.getMessage() for r in caplog.records), caplog.text
        assert store.batch_exists(keys) == 2        # the connection is still there
        store.close()
