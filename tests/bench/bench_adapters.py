#!/usr/bin/env python3
"""Adapters vs the C API: batch put/get throughput of 64 pages of 64 KiB and batch_exists
latency for 256 keys, through kvnode.sglang (MLA: one 64 KiB buffer per page; MHA: K and V
of 32 KiB each), kvnode.lmcache (submit + eventfd poll + drain), and libkvnode's
kvnode_put_batch / kvnode_get_batch / kvnode_match called straight through ctypes with
arrays built beforehand, all against one kvnoded started here. Prints the medians and the
ratio adapter time / C time (1.0: no overhead). Not part of `make test` (no timed asserts).

The adapters are handed their engine's key strings and send check words; the C rows above
them are handed ready 64-bit keys and send none. So batch_exists is also measured through
the C API given the same key strings, doing what a C engine would: kvnode_fold_text, then
kvnode_match_checked (synchronous, as SGLang's batch_exists: a prefix) or
kvnode_submit_exists, a poll of the event fd and kvnode_drain (asynchronous and per key, as
LMCache's exists; kvnode_submit_match_checked with a library older than KVNODE_0.6). Both
ratios are printed.

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


class Path:
    """One way through: put(r) stores fresh keys of round r (forget(r) deletes them again,
    untimed, so every put lands in memory the daemon has touched), get() reads 64 stored
    pages, exists() asks about 256 keys, check() verifies the bytes read, close()."""
    OPS = ("put", "get", "exists")

    def forget(self, r):
        pass

    def check(self):
        pass


class CPath(Path):
    """The C API moving the same bytes: parts=2 is K and V as two batches of half pages
    (as the SGLang MHA path does)."""

    def __init__(self, sock, rounds, parts=1):
        self.cs = [CApi(sock, PAGE_BYTES // parts, "-%d" % i) for i in range(parts)]
        self.fresh = [self.cs[0].keys(10_000_000 + r * PAGES) for r in range(rounds)]
        self.stored = self.cs[0].keys(1)
        self.ek = self.cs[0].keys(1, EXIST_KEYS)
        for c in self.cs:
            c.put(self.stored)

    def put(self, r):
        for c in self.cs:
            c.put(self.fresh[r])

    def forget(self, r):
        for c in self.cs:
            c.client.delete(list(self.fresh[r]))

    def get(self):
        for c in self.cs:
            c.get(self.stored)

    def exists(self):
        for c in self.cs:
            c.match(self.ek)

    def check(self):
        assert all(numpy.array_equal(c.pages, c.out) for c in self.cs)

    def close(self):
        for c in self.cs:
            c.client.close()


class CFoldPath(Path):
    OPS = ("exists",)

    """batch_exists through the C API from the same key strings an adapter gets: fold them
    (kvnode_fold_text), then match with check words, synchronously (one MATCH per part, as
    SGLang's two namespaces) or asynchronously (submit, poll the event fd, drain)."""

    def __init__(self, sock, keys, parts=1, asynchronous=False):
        self.cs = [CApi(sock, PAGE_BYTES // parts, "-fold-%d" % i) for i in range(parts)]
        self.text = "\0".join(keys).encode("utf-8")
        self.n = len(keys)
        self.karr, self.carr = (ctypes.c_int64 * self.n)(), (ctypes.c_uint64 * self.n)()
        assert _lib.kvnode_fold_text(self.text, len(self.text), self.n, self.karr,
                                     self.carr) == self.n
        for c in self.cs:      # the first PAGES keys stored, as in the adapters' runs
            assert _lib.kvnode_put_batch_checked(ctypes.c_void_p(c.h), self.karr, self.carr,
                                                 PAGES, c.src, 0) == 0
        self.asynchronous = asynchronous
        self.tiers = kvnode._lib._CTiers()
        self.ticket = ctypes.c_uint64(0)
        self.comp = (kvnode._lib._CCompletion * 4)()
        self.fd = _lib.kvnode_event_fd(ctypes.c_void_p(self.cs[0].h))
        # per key, as the LMCache adapter asks (KVNODE_0.6), else the prefix MATCH
        self.per_key = (ctypes.c_bool * self.n)() if hasattr(_lib, "kvnode_submit_exists") \
            else None

    def exists(self):
        assert _lib.kvnode_fold_text(self.text, len(self.text), self.n, self.karr,
                                     self.carr) == self.n
        if self.asynchronous:
            h = ctypes.c_void_p(self.cs[0].h)
            if self.per_key is not None:
                assert _lib.kvnode_submit_exists(h, self.karr, self.carr, ctypes.c_size_t(self.n),
                                                 self.per_key, None,
                                                 ctypes.byref(self.ticket)) == 0
            else:
                assert _lib.kvnode_submit_match_checked(h, self.karr, self.carr, self.n, None,
                                                        ctypes.byref(self.ticket)) == 0
            while True:
                select.select([self.fd], [], [], 10)
                if _lib.kvnode_drain(h, self.comp, 4):
                    assert self.comp[0].rc == 0 and self.comp[0].count == PAGES
                    return
        for c in self.cs:
            assert _lib.kvnode_match_checked(ctypes.c_void_p(c.h), self.karr, self.carr, self.n,
                                             ctypes.byref(self.tiers)) == 0
            assert self.tiers.matched == PAGES

    def close(self):
        for c in self.cs:
            c.client.close()


class SGLangPath(Path):
    def __init__(self, sock, rounds, mla):
        comp = PAGE_BYTES if mla else PAGE_BYTES // 2
        self.pool = HostPool(2 * PAGES, page_size=16, layers=1, heads=1,
                             head_dim=comp // 16 // 2, mla=mla)
        assert self.pool.page_size * self.pool.token_bytes == comp
        for p in range(PAGES):
            self.pool.fill(p * 16, seed=p)
        self.store = kvnode.sglang.KvnodeHiCacheStorage(StorageConfig(
            is_mla_model=mla, model_name="bench-sgl-%s" % ("mla" if mla else "mha"),
            extra_config=dict(socket_path=sock)), {})
        self.store.register_mem_pool_host(self.pool)
        self.src, self.dst = host_indices(0, PAGES, 16), host_indices(PAGES, PAGES, 16)
        self.fresh = [[hashlib.sha256(b"%d-%d" % (r, i)).hexdigest() for i in range(PAGES)]
                      for r in range(rounds)]
        self.keys = [hashlib.sha256(b"exists-%d" % i).hexdigest() for i in range(EXIST_KEYS)]
        assert self.store.batch_set_v1(self.keys[:PAGES], self.src) == [True] * PAGES

    def put(self, r):
        assert self.store.batch_set_v1(self.fresh[r], self.src) == [True] * PAGES

    def forget(self, r):
        conn = self.store._acquire()
        keys, checks = kvnode.fold_digests(self.fresh[r])
        for c in conn.clients:
            c.delete(keys, conn.words(checks))
        self.store._release(conn)

    def get(self):
        assert self.store.batch_get_v1(self.keys[:PAGES], self.dst) == [True] * PAGES

    def exists(self):
        assert self.store.batch_exists(self.keys) == PAGES

    def check(self):
        assert all(self.pool.page((PAGES + p) * 16) == self.pool.page(p * 16) for p in range(PAGES))

    def close(self):
        self.store.close()


class LMCachePath(Path):
    def __init__(self, sock, rounds):
        self.conn = kvnode.lmcache.KvnodeL2Connector(socket_path=sock, model="bench-lmc",
                                                     block_bytes=PAGE_BYTES)
        self.fd = self.conn.event_fd()
        self.pages = numpy.random.default_rng(2).integers(0, 255, (PAGES, PAGE_BYTES), numpy.uint8)
        self.out = numpy.zeros_like(self.pages)
        self.src = [memoryview(self.pages[i]) for i in range(PAGES)]
        self.dst = [memoryview(self.out[i]) for i in range(PAGES)]
        self.fresh = [["bench-%d-%d" % (r, i) for i in range(PAGES)] for r in range(rounds)]
        self.keys = ["bench-exists-%d" % i for i in range(EXIST_KEYS)]
        self.wait(self.conn.submit_batch_set(self.keys[:PAGES], self.src))

    def wait(self, fid):
        """LMCache's side: poll event_fd, drain until fid completed."""
        while True:
            select.select([self.fd], [], [], 10)
            for f, ok, err, per_key in self.conn.drain_completions():
                assert ok, err
                if f == fid:
                    return per_key

    def put(self, r):
        self.wait(self.conn.submit_batch_set(self.fresh[r], self.src))

    def forget(self, r):
        self.wait(self.conn.submit_batch_delete(self.fresh[r]))

    def get(self):
        assert self.wait(self.conn.submit_batch_get(self.keys[:PAGES], self.dst)) == [True] * PAGES

    def exists(self):
        self.wait(self.conn.submit_batch_exists(self.keys))

    def check(self):
        assert numpy.array_equal(self.pages, self.out)

    def close(self):
        self.conn.close()


def measure(paths, rounds):
    """Median seconds of each operation of each path; the paths take turns within every
    round (in a rotating order), so a busy machine slows them alike."""
    times = {name: {"put": [], "get": [], "exists": []} for name in paths}
    names = list(paths)
    for r in range(-1, rounds):          # round -1 warms up, untimed
        order = names[r % len(names):] + names[:r % len(names)]
        for op in ("put", "get", "exists"):
            for name in order:
                p = paths[name]
                if op not in p.OPS:
                    continue
                t0 = time.perf_counter()
                p.put(max(r, 0)) if op == "put" else getattr(p, op)()
                dt = time.perf_counter() - t0
                if op == "put":
                    p.forget(max(r, 0))
                if r >= 0:
                    times[name][op].append(dt)
    for p in paths.values():
        p.check()
    return {name: tuple(statistics.median(t[op]) if t[op] else None
                        for op in ("put", "get", "exists"))
            for name, t in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    mib = PAGES * PAGE_BYTES / 2 ** 20
    with tempfile.TemporaryDirectory(prefix="kvnode-bench-adapters-") as d:
        with running_daemon(d, os.path.join(d, "s.sock"), "memory.host_bytes=1GiB") as sock:
            sgl_keys = [hashlib.sha256(b"exists-%d" % i).hexdigest() for i in range(EXIST_KEYS)]
            lmc_keys = ["bench-exists-%d" % i for i in range(EXIST_KEYS)]
            paths = {"C API, 64 KiB blocks": CPath(sock, args.rounds),
                     "sglang MLA (1 x 64 KiB)": SGLangPath(sock, args.rounds, True),
                     "lmcache (64 KiB chunks)": LMCachePath(sock, args.rounds),
                     "C API, 2 x 32 KiB blocks": CPath(sock, args.rounds, parts=2),
                     "sglang MHA (K+V 32 KiB)": SGLangPath(sock, args.rounds, False),
                     "C fold+match, sglang keys": CFoldPath(sock, sgl_keys),
                     "C fold+match, 2 parts": CFoldPath(sock, sgl_keys, parts=2),
                     "C fold+async, lmcache keys": CFoldPath(sock, lmc_keys, asynchronous=True)}
            got = measure(paths, args.rounds)
            for p in paths.values():
                p.close()
    c1, c2 = got["C API, 64 KiB blocks"], got["C API, 2 x 32 KiB blocks"]
    print("%d pages of %d KiB (%.0f MiB) per batch, batch_exists of %d keys; medians of %d rounds"
          % (PAGES, PAGE_BYTES // 1024, mib, EXIST_KEYS, args.rounds))
    print("%-28s %11s %11s %13s   %s" % ("path", "put MiB/s", "get MiB/s", "exists us",
                                         "time ratio to the C API (put/get/exists)"))
    for name, base in (("C API, 64 KiB blocks", c1), ("sglang MLA (1 x 64 KiB)", c1),
                       ("lmcache (64 KiB chunks)", c1), ("C API, 2 x 32 KiB blocks", c2),
                       ("sglang MHA (K+V 32 KiB)", c2)):
        put, get, ex = got[name]
        print("%-28s %11.0f %11.0f %13.1f   %.2f / %.2f / %.2f"
              % (name, mib / put, mib / get, ex * 1e6, put / base[0], get / base[1], ex / base[2]))
    print("batch_exists from the same key strings through the C API (fold, check words):")
    for name, adapter in (("C fold+match, sglang keys", "sglang MLA (1 x 64 KiB)"),
                          ("C fold+async, lmcache keys", "lmcache (64 KiB chunks)"),
                          ("C fold+match, 2 parts", "sglang MHA (K+V 32 KiB)")):
        ex, aex = got[name][2], got[adapter][2]
        print("%-28s %11s %11s %13.1f   %s: %.2f" % (name, "-", "-", ex * 1e6, adapter, aex / ex))
    return 0


if __name__ == "__main__":
    sys.exit(main())
