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

Then every SGLang host layout (layer_first, page_first, page_first_direct, page_head; MHA
and MLA where SGLang has them, MLA has no page_head): torch host pools built as SGLang's
pool_host builds them (tests/python/test_sglang_engine.py: 16-token pages of 64 KiB in
bfloat16, --layers layers), moved by batch_set_v1 / batch_get_v1 / batch_exists, next to the
C API doing the same work from the same key strings: kvnode_fold_text, then, per namespace
the adapter uses for that layout (K and V, one MLA buffer, one gathered page for
layer_first) and with the same block sizes, kvnode_put_batch_checked /
kvnode_get_batch_checked from / into contiguous page buffers and kvnode_match_checked. For
layer_first the C API also copies the same per-layer pieces, from a pool of the same layout
(kvnode_put_gather_checked, kvnode_get_scatter_checked: lease, copy and lease end in one call):
the ratio is to that row, the one to contiguous pages is printed beside it. The adapter's time includes the pool's own get_page_buffer_meta (SGLang's
Python, printed apart; for layer_first asked about two pages of each batch, the check of the
adapter's page-base model) and, for layer_first, the gather of each page's per-layer pieces
into / out of its block. The paths take turns in an order shuffled anew every round.

Correctness: every put is read back and every get compared byte for byte (untimed, in
every round, the destination zeroed before each get), every exists must find the stored
prefix; a wrong byte or count stops the bench with an error.

    make bench-adapters [BENCH_ADAPTERS_ARGS="--rounds 50 --layers 8"]
"""
import argparse
import ctypes
import hashlib
import os
import random
import select
import statistics
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "python")]

import numpy  # noqa: E402
import torch  # noqa: E402

import kvnode  # noqa: E402
import kvnode.lmcache  # noqa: E402
import kvnode.sglang  # noqa: E402
from conftest import running_daemon  # noqa: E402
from fake_sglang import HostPool, StorageConfig, host_indices  # noqa: E402
from test_sglang_engine import MHAHost, MLAHost, indices, raw  # noqa: E402

PAGES, PAGE_BYTES, EXIST_KEYS = 64, 64 * 1024, 256
PAGE_TOKENS = 16
# (layout, MLA) as SGLang's host pools offer them (MLA has no page_head)
SGLANG_LAYOUTS = [("layer_first", False), ("page_first", False), ("page_first_direct", False),
                  ("page_head", False), ("layer_first", True), ("page_first", True),
                  ("page_first_direct", True)]
LIMIT = 1.5             # issue 31: each adapter within 1.5x of the C API
# The SGLang stores' first batch_set_v1 (untimed setup) waits this long for their connect,
# not the 20 ms default: on a loaded machine the connect (on the adapter's thread) took
# longer, the set answered "not stored" and the bench stopped with WrongBytes. Connected
# before any timed call, the calls measured never wait for a connect either way.
SETUP_CONNECT_WAIT_MS = 10000
_lib = kvnode._lib._lib


class WrongBytes(RuntimeError):
    """A correctness check of the bench failed (never an assert: python -O keeps it)."""


def need(ok, what):
    if not ok:
        raise WrongBytes(what)


def sha_keys(tag, n):
    return [hashlib.sha256(b"%s-%d" % (tag, i)).hexdigest() for i in range(n)]


class CApi:
    """kvnode_put_batch / kvnode_get_batch / kvnode_match with prepared arrays."""

    def __init__(self, sock, block_bytes, tag="", seed=1):
        self.client = kvnode.Client(sock, kvnode.Layout(model="bench-c-%d%s" % (block_bytes, tag),
                                                        dtype="u8", block_tokens=16,
                                                        block_bytes=block_bytes))
        self.h = self.client._c
        self.pages = numpy.random.default_rng(seed).integers(0, 256, (PAGES, block_bytes),
                                                             numpy.uint8)
        self.out = numpy.zeros_like(self.pages)
        self.src = (ctypes.c_void_p * PAGES)(*[self.pages[i].ctypes.data for i in range(PAGES)])
        self.dst = (ctypes.c_void_p * PAGES)(*[self.out[i].ctypes.data for i in range(PAGES)])
        self.got = ctypes.c_size_t(0)

    def keys(self, base, n=PAGES):
        return (ctypes.c_int64 * n)(*range(base, base + n))

    def put(self, keys):
        need(_lib.kvnode_put_batch(ctypes.c_void_p(self.h), keys, PAGES, self.src, 0) == 0,
             "C put_batch failed")

    def get(self, keys):
        need(_lib.kvnode_get_batch(ctypes.c_void_p(self.h), keys, PAGES, self.dst, 0,
                                   ctypes.byref(self.got)) == 0 and self.got.value == PAGES,
             "C get_batch read %d of %d" % (self.got.value, PAGES))

    def match(self, keys):
        need(_lib.kvnode_match(ctypes.c_void_p(self.h), keys, EXIST_KEYS,
                               ctypes.byref(self.got)) == 0 and self.got.value == PAGES,
             "C match found %d, %d stored" % (self.got.value, PAGES))

    def verify(self, what):
        """out holds exactly pages (byte for byte); then zeroed for the next read."""
        need(numpy.array_equal(self.pages, self.out), "%s: wrong bytes read back" % what)
        self.out[...] = 0


class Path:
    """One way through: put(r) stores fresh keys of round r (forget(r) deletes them again,
    untimed, so every put lands in memory the daemon has touched), get() reads 64 stored
    pages, exists() asks about 256 keys (64 stored). Untimed: after_put(r) reads round r's
    pages back and compares them, after_get() compares the pages read, after_exists() the
    answer; each raises WrongBytes on a difference. close()."""
    OPS = ("put", "get", "exists")

    def forget(self, r):
        pass

    def after_put(self, r):
        pass

    def after_get(self):
        pass

    def after_exists(self):
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

    def after_put(self, r):
        for c in self.cs:
            c.get(self.fresh[r])
            c.verify("C put")

    def forget(self, r):
        for c in self.cs:
            c.client.delete(list(self.fresh[r]))

    def get(self):
        for c in self.cs:
            c.get(self.stored)

    def after_get(self):
        for c in self.cs:
            c.verify("C get")

    def exists(self):
        for c in self.cs:
            c.match(self.ek)

    def close(self):
        for c in self.cs:
            c.client.close()


class CFoldPath(Path):
    """batch_exists through the C API from the same key strings an adapter gets: fold them
    (kvnode_fold_text), then match with check words, synchronously (one MATCH per part, as
    SGLang's two namespaces) or asynchronously (submit, poll the event fd, drain)."""
    OPS = ("exists",)

    def __init__(self, sock, keys, parts=1, asynchronous=False):
        self.cs = [CApi(sock, PAGE_BYTES // parts, "-fold-%d" % i) for i in range(parts)]
        self.text = "\0".join(keys).encode("utf-8")
        self.n = len(keys)
        self.karr, self.carr = (ctypes.c_int64 * self.n)(), (ctypes.c_uint64 * self.n)()
        need(_lib.kvnode_fold_text(self.text, len(self.text), self.n, self.karr,
                                   self.carr) == self.n, "kvnode_fold_text")
        for c in self.cs:      # the first PAGES keys stored, as in the adapters' runs
            need(_lib.kvnode_put_batch_checked(ctypes.c_void_p(c.h), self.karr, self.carr,
                                               PAGES, c.src, 0) == 0, "C put_batch_checked")
        self.asynchronous = asynchronous
        self.tiers = kvnode._lib._CTiers()
        self.ticket = ctypes.c_uint64(0)
        self.comp = (kvnode._lib._CCompletion * 4)()
        self.fd = _lib.kvnode_event_fd(ctypes.c_void_p(self.cs[0].h))
        # per key, as the LMCache adapter asks (KVNODE_0.6), else the prefix MATCH
        self.per_key = (ctypes.c_bool * self.n)() if hasattr(_lib, "kvnode_submit_exists") \
            else None

    def exists(self):
        need(_lib.kvnode_fold_text(self.text, len(self.text), self.n, self.karr,
                                   self.carr) == self.n, "kvnode_fold_text")
        if self.asynchronous:
            h = ctypes.c_void_p(self.cs[0].h)
            if self.per_key is not None:
                need(_lib.kvnode_submit_exists(h, self.karr, self.carr, ctypes.c_size_t(self.n),
                                               self.per_key, None,
                                               ctypes.byref(self.ticket)) == 0, "submit_exists")
            else:
                need(_lib.kvnode_submit_match_checked(h, self.karr, self.carr, self.n, None,
                                                      ctypes.byref(self.ticket)) == 0,
                     "submit_match_checked")
            while True:
                select.select([self.fd], [], [], 10)
                if _lib.kvnode_drain(h, self.comp, 4):
                    need(self.comp[0].rc == 0 and self.comp[0].count == PAGES,
                         "C async exists: rc %d, %d found" % (self.comp[0].rc,
                                                              self.comp[0].count))
                    return
        for c in self.cs:
            need(_lib.kvnode_match_checked(ctypes.c_void_p(c.h), self.karr, self.carr, self.n,
                                           ctypes.byref(self.tiers)) == 0
                 and self.tiers.matched == PAGES, "C match_checked")

    def after_exists(self):
        if self.asynchronous and self.per_key is not None:
            need(list(self.per_key) == [True] * PAGES + [False] * (self.n - PAGES),
                 "C exists: wrong per-key answers")

    def close(self):
        for c in self.cs:
            c.client.close()


class CAsyncPath(Path):
    """LMCache's work through the C API: the same key strings folded (kvnode_fold_text),
    then kvnode_submit_put_checked / kvnode_submit_get_checked / kvnode_submit_exists of
    64 KiB chunks, a poll of the event fd and kvnode_drain: what the LMCache connector does
    below its Python (the row its put/get/exists are measured against)."""

    def __init__(self, sock, rounds, exist_keys):
        self.c = CApi(sock, PAGE_BYTES, "-async", seed=2)
        self.h = ctypes.c_void_p(self.c.h)
        self.fd = _lib.kvnode_event_fd(self.h)
        self.fresh = [self._text(["bench-async-%d-%d" % (r, i) for i in range(PAGES)])
                      for r in range(rounds)]
        self.stored = self._text(exist_keys[:PAGES])
        self.exist = self._text(exist_keys)
        self.karr = (ctypes.c_int64 * EXIST_KEYS)()
        self.carr = (ctypes.c_uint64 * EXIST_KEYS)()
        self.per_key = (ctypes.c_bool * EXIST_KEYS)()
        self.ticket = ctypes.c_uint64(0)
        self.comp = (kvnode._lib._CCompletion * 4)()
        self._put(self.stored)

    @staticmethod
    def _text(keys):
        return ("\0".join(keys).encode("utf-8"), len(keys))

    def _fold(self, text):
        t, n = text
        need(_lib.kvnode_fold_text(t, len(t), n, self.karr, self.carr) == n, "kvnode_fold_text")
        return n

    def _wait(self, what, want):
        while True:
            select.select([self.fd], [], [], 10)
            if _lib.kvnode_drain(self.h, self.comp, 4):
                need(self.comp[0].rc == 0 and self.comp[0].count == want,
                     "C async %s: rc %d, count %d" % (what, self.comp[0].rc, self.comp[0].count))
                return

    def _put(self, text):
        n = self._fold(text)
        need(_lib.kvnode_submit_put_checked(self.h, self.karr, self.carr, ctypes.c_size_t(n),
                                            self.c.src, 0, None, ctypes.byref(self.ticket)) == 0,
             "submit_put_checked")
        self._wait("put", n)

    def _get(self, text):
        n = self._fold(text)
        need(_lib.kvnode_submit_get_checked(self.h, self.karr, self.carr, ctypes.c_size_t(n),
                                            self.c.dst, 0, None, ctypes.byref(self.ticket)) == 0,
             "submit_get_checked")
        self._wait("get", n)

    def put(self, r):
        self._put(self.fresh[r])

    def after_put(self, r):
        self._get(self.fresh[r])
        self.c.verify("C async put")

    def forget(self, r):
        n = self._fold(self.fresh[r])
        need(_lib.kvnode_delete_checked(self.h, self.karr, self.carr, ctypes.c_size_t(n),
                                        ctypes.byref(self.c.got)) == 0, "delete_checked")

    def get(self):
        self._get(self.stored)

    def after_get(self):
        self.c.verify("C async get")

    def exists(self):
        n = self._fold(self.exist)
        need(_lib.kvnode_submit_exists(self.h, self.karr, self.carr, ctypes.c_size_t(n),
                                       self.per_key, None, ctypes.byref(self.ticket)) == 0,
             "submit_exists")
        self._wait("exists", PAGES)

    def after_exists(self):
        need(list(self.per_key) == [True] * PAGES + [False] * (EXIST_KEYS - PAGES),
             "C async exists: wrong per-key answers")

    def close(self):
        self.c.client.close()


class SGLangPath(Path):
    """kvnode.sglang over fake_sglang's numpy page_first pool (the rows of earlier runs)."""

    def __init__(self, sock, rounds, mla):
        comp = PAGE_BYTES if mla else PAGE_BYTES // 2
        self.mla = mla
        self.pool = HostPool(2 * PAGES, page_size=16, layers=1, heads=1,
                             head_dim=comp // 16 // 2, mla=mla)
        need(self.pool.page_size * self.pool.token_bytes == comp, "pool geometry")
        for p in range(PAGES):
            self.pool.fill(p * 16, seed=p)
        self.store = kvnode.sglang.KvnodeHiCacheStorage(StorageConfig(
            is_mla_model=mla, model_name="bench-sgl-%s" % ("mla" if mla else "mha"),
            extra_config=dict(socket_path=sock, connect_wait_ms=SETUP_CONNECT_WAIT_MS)), {})
        self.store.register_mem_pool_host(self.pool)
        self.src, self.dst = host_indices(0, PAGES, 16), host_indices(PAGES, PAGES, 16)
        self.fresh = [sha_keys(b"%d" % r, PAGES) for r in range(rounds)]
        self.keys = sha_keys(b"exists", EXIST_KEYS)
        need(self.store.batch_set_v1(self.keys[:PAGES], self.src) == [True] * PAGES,
             "sglang set")

    def put(self, r):
        need(self.store.batch_set_v1(self.fresh[r], self.src) == [True] * PAGES, "sglang put")

    def after_put(self, r):
        need(self.store.batch_get_v1(self.fresh[r], self.dst) == [True] * PAGES,
             "sglang: round %d's pages not read back" % r)
        self.after_get()

    def forget(self, r):
        forget_sglang(self.store, self.fresh[r])

    def get(self):
        need(self.store.batch_get_v1(self.keys[:PAGES], self.dst) == [True] * PAGES,
             "sglang get")

    def after_get(self):
        need(all(self.pool.page((PAGES + p) * 16) == self.pool.page(p * 16)
                 for p in range(PAGES)), "sglang: wrong bytes read back")
        dst = slice(PAGES * 16, None)
        if self.mla:
            self.pool.kv_buffer[dst] = 0
        else:
            self.pool.kv_buffer[:, dst] = 0

    def exists(self):
        need(self.store.batch_exists(self.keys) == PAGES, "sglang batch_exists")

    def close(self):
        self.store.close()


def forget_sglang(store, keys):
    conn = store._acquire()
    folded, checks = kvnode.fold_digests(keys)
    for c in conn.clients:
        c.delete(folded, conn.words(checks))
    store._release(conn)


def host_pool(layout, mla, layers):
    """SGLang's host pool of 2 x PAGES pages of 64 KiB (PAGE_TOKENS tokens, bfloat16)."""
    if mla:
        return MLAHost(layout, pages=2 * PAGES, page_size=PAGE_TOKENS, layers=layers,
                       dim=PAGE_BYTES // (PAGE_TOKENS * 2 * layers))
    return MHAHost(layout, pages=2 * PAGES, page_size=PAGE_TOKENS, layers=layers, heads=4,
                   head_dim=PAGE_BYTES // (2 * PAGE_TOKENS * 2 * layers * 4))


def pool_pages(pool, first, n):
    """The pool's pages [first, first + n) as one view of its buffer."""
    t = slice(first * pool.page_size, (first + n) * pool.page_size)
    mla = isinstance(pool, MLAHost)
    if pool.layout == "layer_first":
        return pool.kv_buffer[:, t] if mla else pool.kv_buffer[:, :, t]
    if pool.layout == "page_first":
        return pool.kv_buffer[t] if mla else pool.kv_buffer[:, t]
    return pool.kv_buffer[first:first + n] if mla else pool.kv_buffer[:, first:first + n]


class SGLangLayoutPath(Path):
    """kvnode.sglang over a torch host pool of one SGLang layout: pages 0..63 are the
    source, 64..127 the destination (the cache controller's host indices)."""

    def __init__(self, sock, rounds, layout, mla, layers):
        self.pool = host_pool(layout, mla, layers)
        self.pool.kv_buffer.view(-1).copy_(torch.randn(self.pool.kv_buffer.numel(),
                                                       generator=torch.Generator().manual_seed(7))
                                           .to(self.pool.kv_buffer.dtype))
        pool_pages(self.pool, PAGES, PAGES).zero_()
        self.store = kvnode.sglang.KvnodeHiCacheStorage(StorageConfig(
            is_mla_model=mla, model_name="bench-sgl-%s-%s" % (layout, "mla" if mla else "mha"),
            extra_config=dict(socket_path=sock, connect_wait_ms=SETUP_CONNECT_WAIT_MS)), {})
        self.store.register_mem_pool_host(self.pool)
        self.component_bytes = list(self.store.component_bytes)
        need(sum(self.component_bytes) == PAGE_BYTES, "%s: pages of %d bytes"
             % (layout, sum(self.component_bytes)))
        self.pieces = self.store._plans[kvnode.sglang.KV_POOL].pieces
        self.src, self.dst = indices(0, PAGES, PAGE_TOKENS), indices(PAGES, PAGES, PAGE_TOKENS)
        self.expect = raw(pool_pages(self.pool, 0, PAGES))
        tag = ("%s-%s" % (layout, mla)).encode()
        self.fresh = [sha_keys(b"%s-%d" % (tag, r), PAGES) for r in range(rounds)]
        self.keys = sha_keys(b"exists-" + tag, EXIST_KEYS)
        need(self.store.batch_set_v1(self.keys[:PAGES], self.src) == [True] * PAGES,
             "sglang %s set" % layout)

    def meta_seconds(self, times=20):
        """The pool's own get_page_buffer_meta for one batch (SGLang's code, not kvnode's)."""
        t = []
        for _ in range(times):
            t0 = time.perf_counter()
            self.pool.get_page_buffer_meta(self.src)
            t.append(time.perf_counter() - t0)
        return statistics.median(t)

    def put(self, r):
        need(self.store.batch_set_v1(self.fresh[r], self.src) == [True] * PAGES,
             "sglang %s put" % self.pool.layout)

    def after_put(self, r):
        need(self.store.batch_get_v1(self.fresh[r], self.dst) == [True] * PAGES,
             "sglang %s: round %d's pages not read back" % (self.pool.layout, r))
        self.after_get()

    def forget(self, r):
        forget_sglang(self.store, self.fresh[r])

    def get(self):
        need(self.store.batch_get_v1(self.keys[:PAGES], self.dst) == [True] * PAGES,
             "sglang %s get" % self.pool.layout)

    def after_get(self):
        got = pool_pages(self.pool, PAGES, PAGES)
        need(raw(got) == self.expect, "sglang %s: wrong bytes read back" % self.pool.layout)
        got.zero_()

    def exists(self):
        need(self.store.batch_exists(self.keys) == PAGES, "sglang %s batch_exists"
             % self.pool.layout)

    def close(self):
        self.store.close()


class CLayoutPath(Path):
    """The C API doing a layout's work from the same key strings: kvnode_fold_text, then per
    namespace of the adapter (block sizes component_bytes) kvnode_put_batch_checked /
    kvnode_get_batch_checked (each next namespace reading what the previous one found, as
    the adapter) and kvnode_match_checked (likewise)."""

    def __init__(self, sock, rounds, tag, component_bytes, fresh, keys):
        self.cs = [CApi(sock, nb, "-%s-%d" % (tag, i), seed=11 + i)
                   for i, nb in enumerate(component_bytes)]
        self.fresh = [self.prepare(k) for k in fresh]
        self.stored = self.prepare(keys[:PAGES])
        self.ek = self.prepare(keys)
        self.tiers = kvnode._lib._CTiers()
        self.put_keys(self.stored)

    @staticmethod
    def prepare(keys):
        text = "\0".join(keys).encode("utf-8")
        n = len(keys)
        return text, n, (ctypes.c_int64 * n)(), (ctypes.c_uint64 * n)()

    @staticmethod
    def fold(k):
        text, n, karr, carr = k
        need(_lib.kvnode_fold_text(text, len(text), n, karr, carr) == n, "kvnode_fold_text")
        return n, karr, carr

    def put_keys(self, k):
        n, karr, carr = self.fold(k)
        for c in self.cs:
            need(_lib.kvnode_put_batch_checked(ctypes.c_void_p(c.h), karr, carr, n, c.src, 0)
                 == 0, "C put_batch_checked")

    def get_keys(self, k):
        n, karr, carr = self.fold(k)
        hit = n
        for c in self.cs:
            need(_lib.kvnode_get_batch_checked(ctypes.c_void_p(c.h), karr, carr, hit, c.dst, 0,
                                               ctypes.byref(c.got)) == 0, "C get_batch_checked")
            hit = c.got.value
        need(hit == PAGES, "C get_batch_checked read %d of %d" % (hit, PAGES))

    def put(self, r):
        self.put_keys(self.fresh[r])

    def after_put(self, r):
        self.get_keys(self.fresh[r])
        self.after_get()

    def forget(self, r):
        n, karr, carr = self.fold(self.fresh[r])
        for c in self.cs:
            c.client.delete(karr, carr)

    def get(self):
        self.get_keys(self.stored)

    def after_get(self):
        for c in self.cs:
            c.verify("C layout get")

    def exists(self):
        n, karr, carr = self.fold(self.ek)
        hit = n
        for c in self.cs:
            need(_lib.kvnode_match_checked(ctypes.c_void_p(c.h), karr, carr, hit,
                                           ctypes.byref(self.tiers)) == 0, "C match_checked")
            hit = self.tiers.matched
        need(hit == PAGES, "C match_checked found %d, %d stored" % (hit, PAGES))

    def close(self):
        for c in self.cs:
            c.client.close()


class CGatherPath(CLayoutPath):
    """The C API doing layer_first's strided work, as a C engine with that host pool would:
    from the same key strings (kvnode_fold_text), kvnode_put_gather_checked of every page's
    per-layer pieces from a pool of the same layout, kvnode_get_scatter_checked into the
    destination pages: lease, copy and lease end in one call each. Its pool's piece addresses
    are computed once, before timing (a C engine computes them from its pool's geometry); the
    blocks hold the pieces in the adapter's order (every layer's K, then every V)."""

    def __init__(self, sock, rounds, tag, plan, layout, mla, layers, fresh, keys):
        self.pool = host_pool(layout, mla, layers)
        self.pool.kv_buffer.view(-1).copy_(torch.randn(self.pool.kv_buffer.numel(),
                                                       generator=torch.Generator().manual_seed(9))
                                           .to(self.pool.kv_buffer.dtype))
        pool_pages(self.pool, PAGES, PAGES).zero_()
        self.expect = raw(pool_pages(self.pool, 0, PAGES))
        m = self.m = plan.pieces
        src = self.pool.get_page_buffer_meta(indices(0, PAGES, PAGE_TOKENS))[0]
        dst = self.pool.get_page_buffer_meta(indices(PAGES, PAGES, PAGE_TOKENS))[0]
        self.src, self.dst = (ctypes.c_void_p * (PAGES * m))(*src), \
            (ctypes.c_void_p * (PAGES * m))(*dst)
        self.sizes = (ctypes.c_size_t * m)(*plan.piece_sizes)
        self.offsets = (ctypes.c_size_t * m)(*plan.piece_offsets)
        self.got = ctypes.c_size_t(0)
        super().__init__(sock, rounds, tag, [plan.page_bytes], fresh, keys)

    def put_keys(self, k):
        n, karr, carr = self.fold(k)
        need(_lib.kvnode_put_gather_checked(ctypes.c_void_p(self.cs[0].h), karr, carr,
                                            ctypes.c_size_t(n), self.src, None,
                                            ctypes.c_size_t(self.m), self.sizes,
                                            self.offsets) == 0, "C put_gather_checked")

    def get_keys(self, k):
        n, karr, carr = self.fold(k)
        need(_lib.kvnode_get_scatter_checked(ctypes.c_void_p(self.cs[0].h), karr, carr,
                                             ctypes.c_size_t(n), self.dst, None,
                                             ctypes.c_size_t(self.m), self.sizes, self.offsets,
                                             ctypes.byref(self.got)) == 0
             and self.got.value == PAGES, "C get_scatter_checked read %d of %d"
             % (self.got.value, PAGES))

    def after_get(self):
        got = pool_pages(self.pool, PAGES, PAGES)
        need(raw(got) == self.expect, "C gather: wrong bytes read back")
        got.zero_()


class LMCachePath(Path):
    def __init__(self, sock, rounds):
        self.conn = kvnode.lmcache.KvnodeL2Connector(socket_path=sock, model="bench-lmc",
                                                     block_bytes=PAGE_BYTES)
        self.fd = self.conn.event_fd()
        self.pages = numpy.random.default_rng(2).integers(0, 256, (PAGES, PAGE_BYTES),
                                                          numpy.uint8)
        self.out = numpy.zeros_like(self.pages)
        self.src = [memoryview(self.pages[i]) for i in range(PAGES)]
        self.dst = [memoryview(self.out[i]) for i in range(PAGES)]
        self.fresh = [["bench-%d-%d" % (r, i) for i in range(PAGES)] for r in range(rounds)]
        self.keys = ["bench-exists-%d" % i for i in range(EXIST_KEYS)]
        self.answer = None
        self.wait(self.conn.submit_batch_set(self.keys[:PAGES], self.src))

    def wait(self, fid):
        """LMCache's side: poll event_fd, drain until fid completed."""
        while True:
            select.select([self.fd], [], [], 10)
            for f, ok, err, per_key in self.conn.drain_completions():
                need(ok, "lmcache: %s" % err)
                if f == fid:
                    return per_key

    def put(self, r):
        self.wait(self.conn.submit_batch_set(self.fresh[r], self.src))

    def after_put(self, r):
        need(self.wait(self.conn.submit_batch_get(self.fresh[r], self.dst)) == [True] * PAGES,
             "lmcache: round %d's chunks not read back" % r)
        self.after_get()

    def forget(self, r):
        self.wait(self.conn.submit_batch_delete(self.fresh[r]))

    def get(self):
        need(self.wait(self.conn.submit_batch_get(self.keys[:PAGES], self.dst)) == [True] * PAGES,
             "lmcache get")

    def after_get(self):
        need(numpy.array_equal(self.pages, self.out), "lmcache: wrong bytes read back")
        self.out[...] = 0

    def exists(self):
        self.answer = self.wait(self.conn.submit_batch_exists(self.keys))

    def after_exists(self):
        need(list(self.answer) == [True] * PAGES + [False] * (EXIST_KEYS - PAGES),
             "lmcache exists: wrong per-key answers %r" % (self.answer,))

    def close(self):
        self.conn.close()


def measure(paths, rounds):
    """Median seconds of each operation of each path; the paths take turns within every
    round (in an order shuffled anew each round, seeded), so a busy machine slows them
    alike. Every operation is followed (untimed) by its path's byte-exact check."""
    times = {name: {"put": [], "get": [], "exists": []} for name in paths}
    names = list(paths)
    shuffle = random.Random(31).shuffle
    for r in range(-1, rounds):          # round -1 warms up, untimed
        # a new order every round: no path always runs right after the same one (an
        # asynchronous path's I/O thread still winding down slows whatever comes next)
        order = list(names)
        shuffle(order)
        for op in ("put", "get", "exists"):
            for name in order:
                p = paths[name]
                if op not in p.OPS:
                    continue
                t0 = time.perf_counter()
                p.put(max(r, 0)) if op == "put" else getattr(p, op)()
                dt = time.perf_counter() - t0
                if op == "put":
                    p.after_put(max(r, 0))
                    p.forget(max(r, 0))
                else:
                    getattr(p, "after_" + op)()
                if r >= 0:
                    times[name][op].append(dt)
    return {name: tuple(statistics.median(t[op]) if t[op] else None
                        for op in ("put", "get", "exists"))
            for name, t in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--layers", type=int, default=8,
                    help="layers of the SGLang host pools (a divisor of 64; more layers, "
                         "smaller layer_first pieces)")
    args = ap.parse_args()
    if args.layers < 1 or 64 % args.layers:
        ap.error("--layers must divide 64")
    mib = PAGES * PAGE_BYTES / 2 ** 20
    with tempfile.TemporaryDirectory(prefix="kvnode-bench-adapters-") as d:
        with running_daemon(d, os.path.join(d, "s.sock"), "memory.host_bytes=1GiB") as sock:
            sgl_keys = sha_keys(b"exists", EXIST_KEYS)
            lmc_keys = ["bench-exists-%d" % i for i in range(EXIST_KEYS)]
            paths = {"C API, 64 KiB blocks": CPath(sock, args.rounds),
                     "sglang MLA (1 x 64 KiB)": SGLangPath(sock, args.rounds, True),
                     "lmcache (64 KiB chunks)": LMCachePath(sock, args.rounds),
                     "C API, 2 x 32 KiB blocks": CPath(sock, args.rounds, parts=2),
                     "sglang MHA (K+V 32 KiB)": SGLangPath(sock, args.rounds, False),
                     "C fold+match, sglang keys": CFoldPath(sock, sgl_keys),
                     "C fold+match, 2 parts": CFoldPath(sock, sgl_keys, parts=2),
                     "C fold+async, lmcache keys": CFoldPath(sock, lmc_keys, asynchronous=True),
                     "C async, lmcache's work": CAsyncPath(sock, args.rounds, lmc_keys)}
            layouts = []
            for layout, mla in SGLANG_LAYOUTS:
                name = "%s %s" % ("MLA" if mla else "MHA", layout)
                sp = SGLangLayoutPath(sock, args.rounds, layout, mla, args.layers)
                cp = CLayoutPath(sock, args.rounds, name.replace(" ", "-"), sp.component_bytes,
                                 sp.fresh, sp.keys)
                paths["sglang " + name], paths["C " + name] = sp, cp
                plan = sp.store._plans[kvnode.sglang.KV_POOL]
                if plan.gather:
                    paths["C strided " + name] = CGatherPath(
                        sock, args.rounds, name.replace(" ", "-") + "-strided", plan, layout,
                        mla, args.layers, sp.fresh, sp.keys)
                layouts.append((name, sp))
            got = measure(paths, args.rounds)
            meta = {name: sp.meta_seconds() for name, sp in layouts}
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
    ca, la = got["C async, lmcache's work"], got["lmcache (64 KiB chunks)"]
    print("LMCache's work through the C API (the same key strings folded, submit, event fd, drain):")
    print("%-28s %11.0f %11.0f %13.1f   lmcache (64 KiB chunks): %.2f / %.2f / %.2f%s"
          % ("C async, lmcache's work", mib / ca[0], mib / ca[1], ca[2] * 1e6,
             la[0] / ca[0], la[1] / ca[1], la[2] / ca[2],
             "" if max(la[i] / ca[i] for i in range(3)) <= LIMIT else " *"))
    print("SGLang host layouts (torch pools, %d layers, bfloat16, %d-token pages of %d KiB) next "
          "to the C API from the same key strings (fold, check words, the same namespaces):"
          % (args.layers, PAGE_TOKENS, PAGE_BYTES // 1024))
    print("%-44s %11s %11s %13s   %-20s %s" % ("layout (pieces/page, blocks)", "put MiB/s",
                                               "get MiB/s", "exists us", "ratio put/get/exists",
                                               "pool meta us"))
    over = []
    for name, sp in layouts:
        a, c = got["sglang " + name], got["C " + name]
        # the same work: a gathered layout's C row copies the same strided pieces; the C
        # API on contiguous pages is printed below it, with the adapter's ratio to it
        same = got.get("C strided " + name, c)
        ratios = [a[i] / same[i] for i in range(3)]
        blocks = "+".join("%dK" % (nb // 1024) for nb in sp.component_bytes)
        rows = [("sglang %s (%d, %s)" % (name, sp.pieces, blocks), a),
                ("  C API, same work" + (" (same pieces)" if same is not c else ""), same)]
        if same is not c:
            rows.append(("  C API, contiguous pages", c))
        for label, t in rows:
            extra = ""
            if t is a:
                extra = "   %.2f / %.2f / %.2f%s %11.1f" % (
                    tuple(ratios) + ("" if max(ratios) <= LIMIT else " *", meta[name] * 1e6))
            elif t is c and same is not c:
                extra = "   (sglang: %.2f / %.2f / %.2f of this)" % tuple(a[i] / c[i]
                                                                     for i in range(3))
            print("%-44s %11.0f %11.0f %13.1f" % (label, mib / t[0], mib / t[1], t[2] * 1e6)
                  + extra)
        if max(ratios) > LIMIT:
            over.append(name)
    print("within %.1fx of the C API: %s" % (LIMIT, "every layout" if not over else
                                             "all but %s (*)" % ", ".join(over)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
