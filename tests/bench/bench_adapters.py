#!/usr/bin/env python3
"""Adapters vs the C API: batch put/get throughput of 64 pages of 64 KiB and batch_exists
latency for 256 keys, through kvnode.sglang (MLA: one 64 KiB buffer per page; MHA: K and V
of 32 KiB each), kvnode.lmcache (submit + eventfd poll + drain), and libkvnode's
kvnode_put_batch / kvnode_get_batch / kvnode_match called straight through ctypes with
arrays built beforehand, all against one kvnoded started here. Prints the medians and the
ratio adapter time / C time (1.0: no overhead). Not part of `make test` (no timed asserts).

    make bench-adapters [BENCH_ADAPTERS_ARGS="--rounds 50"]
"""
import argparse
import ctypes
import hashlib
import os
import select
import statistics
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "python")]

import numpy  # noqa: E402

import kvnode  # noqa: E402
import kvnode.lmcache  # noqa: E402
import kvnode.sglang  # noqa: E402
from conftest import running_daemon  # noqa: E402
from fake_sglang import HostPool, StorageConfig, host_indices  # noqa: E402

PAGES, PAGE_BYTES, EXIST_KEYS = 64, 64 * 1024, 256
_lib = kvnode._lib._lib


def median_s(fn, rounds, cleanup=None):
    """Median seconds of fn(r); cleanup(r) (untimed) after each, e.g. deleting what a put
    stored, so that every put lands in memory the daemon has already touched."""
    fn(0)
    if cleanup:
        cleanup(0)
    times = []
    for r in range(rounds):
        t0 = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - t0)
        if cleanup:
            cleanup(r)
    return statistics.median(times)


class CApi:
    """kvnode_put_batch / kvnode_get_batch / kvnode_match with prepared arrays."""

    def __init__(self, sock, block_bytes, tag=""):
        self.client = kvnode.Client(sock, kvnode.Layout(model="bench-c-%d%s" % (block_bytes, tag),
                                                        dtype="u8", block_tokens=16,
                                                        block_bytes=block_bytes))
        self.h = self.client._c
        self.pages = numpy.random.default_rng(1).integers(0, 255, (PAGES, block_bytes), numpy.uint8)
        self.out = numpy.zeros_like(self.pages)
        self.src = (ctypes.c_void_p * PAGES)(*[self.pages[i].ctypes.data for i in range(PAGES)])
        self.dst = (ctypes.c_void_p * PAGES)(*[self.out[i].ctypes.data for i in range(PAGES)])
        self.got = ctypes.c_size_t(0)

    def keys(self, base, n=PAGES):
        return (ctypes.c_int64 * n)(*range(base, base + n))

    def put(self, keys):
        assert _lib.kvnode_put_batch(ctypes.c_void_p(self.h), keys, PAGES, self.src, 0) == 0

    def get(self, keys):
        assert _lib.kvnode_get_batch(ctypes.c_void_p(self.h), keys, PAGES, self.dst, 0,
                                     ctypes.byref(self.got)) == 0 and self.got.value == PAGES

    def match(self, keys):
        assert _lib.kvnode_match(ctypes.c_void_p(self.h), keys, EXIST_KEYS,
                                 ctypes.byref(self.got)) == 0


def bench_c(sock, rounds, parts=1):
    """The C API moving the same bytes: parts=2 is K and V as two batches of half pages
    (as the SGLang MHA path does)."""
    cs = [CApi(sock, PAGE_BYTES // parts, "-%d" % i) for i in range(parts)]
    fresh = [cs[0].keys(10_000_000 + r * PAGES) for r in range(rounds)]

    def put(r):
        for c in cs:
            c.put(fresh[r])
    put_s = median_s(put, rounds, cleanup=lambda r: [c.client.delete(fresh[r]) for c in cs])
    k = cs[0].keys(1)
    for c in cs:
        c.put(k)

    def get(r):
        for c in cs:
            c.get(k)
    get_s = median_s(get, rounds)
    assert all(numpy.array_equal(c.pages, c.out) for c in cs)
    ek = cs[0].keys(1, EXIST_KEYS)

    def match(r):
        for c in cs:
            c.match(ek)
    exists_s = median_s(match, rounds)
    for c in cs:
        c.client.close()
    return put_s, get_s, exists_s


def bench_sglang(sock, rounds, mla):
    comp = PAGE_BYTES if mla else PAGE_BYTES // 2
    pool = HostPool(2 * PAGES, page_size=16, layers=1, heads=1, head_dim=comp // 16 // 2,
                    mla=mla)
    assert pool.page_size * pool.token_bytes == comp
    for p in range(PAGES):
        pool.fill(p * 16, seed=p)
    store = kvnode.sglang.KvnodeHiCacheStorage(StorageConfig(
        is_mla_model=mla, model_name="bench-sgl-%s" % ("mla" if mla else "mha"),
        extra_config=dict(socket_path=sock)), {})
    store.register_mem_pool_host(pool)
    src, dst = host_indices(0, PAGES, 16), host_indices(PAGES, PAGES, 16)
    fresh = [[hashlib.sha256(b"%d-%d" % (r, i)).hexdigest() for i in range(PAGES)] for r in range(rounds)]
    fold = [kvnode.fold_keys(f) for f in fresh]

    def forget(r):
        conn = store._acquire()
        for c in conn.clients:
            c.delete(fold[r])
        store._release(conn)
    put = median_s(lambda r: store.batch_set_v1(fresh[r], src), rounds, forget)
    keys = [hashlib.sha256(b"exists-%d" % i).hexdigest() for i in range(EXIST_KEYS)]
    assert store.batch_set_v1(keys[:PAGES], src) == [True] * PAGES
    get = median_s(lambda r: store.batch_get_v1(keys[:PAGES], dst), rounds)
    assert pool.page(PAGES * 16) == pool.page(0)
    exists = median_s(lambda r: store.batch_exists(keys), rounds)
    store.close()
    return put, get, exists


def bench_lmcache(sock, rounds):
    conn = kvnode.lmcache.KvnodeL2Connector(socket_path=sock, model="bench-lmc",
                                            block_bytes=PAGE_BYTES)
    fd = conn.event_fd()
    pages = numpy.random.default_rng(2).integers(0, 255, (PAGES, PAGE_BYTES), numpy.uint8)
    out = numpy.zeros_like(pages)
    src = [memoryview(pages[i]) for i in range(PAGES)]
    dst = [memoryview(out[i]) for i in range(PAGES)]

    def wait(fid):
        while True:
            select.select([fd], [], [], 10)
            for f, ok, err, _ in conn.drain_completions():
                assert ok, err
                if f == fid:
                    return

    fresh = [["bench-%d-%d" % (r, i) for i in range(PAGES)] for r in range(rounds)]
    put = median_s(lambda r: wait(conn.submit_batch_set(fresh[r], src)), rounds,
                   lambda r: wait(conn.submit_batch_delete(fresh[r])))
    keys = ["bench-exists-%d" % i for i in range(EXIST_KEYS)]
    wait(conn.submit_batch_set(keys[:PAGES], src))
    get = median_s(lambda r: wait(conn.submit_batch_get(keys[:PAGES], dst)), rounds)
    assert numpy.array_equal(pages, out)
    exists = median_s(lambda r: wait(conn.submit_batch_exists(keys)), rounds)
    conn.close()
    return put, get, exists


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    mib = PAGES * PAGE_BYTES / 2 ** 20
    with tempfile.TemporaryDirectory(prefix="kvnode-bench-adapters-") as d:
        with running_daemon(d, os.path.join(d, "s.sock"), "memory.host_bytes=1GiB") as sock:
            c1 = bench_c(sock, args.rounds)
            c2 = bench_c(sock, args.rounds, parts=2)
            rows = [("C API, 64 KiB blocks", c1, c1),
                    ("sglang MLA (1 x 64 KiB)", bench_sglang(sock, args.rounds, True), c1),
                    ("lmcache (64 KiB chunks)", bench_lmcache(sock, args.rounds), c1),
                    ("C API, 2 x 32 KiB blocks", c2, c2),
                    ("sglang MHA (K+V 32 KiB)", bench_sglang(sock, args.rounds, False), c2)]
    print("%d pages of %d KiB (%.0f MiB) per batch, batch_exists of %d keys; medians of %d rounds"
          % (PAGES, PAGE_BYTES // 1024, mib, EXIST_KEYS, args.rounds))
    print("%-28s %11s %11s %13s   %s" % ("path", "put MiB/s", "get MiB/s", "exists us",
                                         "time ratio to the C API row above (put/get/exists)"))
    for name, (put, get, ex), base in rows:
        print("%-28s %11.0f %11.0f %13.1f   %.2f / %.2f / %.2f"
              % (name, mib / put, mib / get, ex * 1e6, put / base[0], get / base[1], ex / base[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
