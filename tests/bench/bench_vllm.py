"""The vLLM rows of bench_adapters.py: kvnode.vllm's connector moving 64 blocks of 64 KiB
(16 tokens, --layers layers of K and V, bfloat16, FlashAttention's K/V split paged cache as
tests/python/fake_vllm.py builds it) and answering a 256-block request (64 stored), next to
the C API doing the same work.

Through the connector, as vLLM calls it: save = the scheduler's request_finished and
build_connector_meta, the worker's bind_connector_metadata / start_load_kv / wait_for_save
(which makes the save: 4 MiB, within the default inline_save_bytes) / get_finished (which
must report the request) / clear_connector_metadata;
load = the worker's bind_connector_metadata / start_load_kv (kvnode_get_scatter_checked
into the paged blocks) and get_block_ids_with_load_errors; MATCH = the scheduler's
get_num_new_matched_tokens of a request seen for the first time (its 256 block hashes
folded, then one MATCH). The C API: the same 32-byte block hashes folded in one call
(kvnode_fold_digests), then kvnode_put_gather_checked / kvnode_get_scatter_checked of the
same pieces of a cache of the same geometry (addresses computed once, before timing) and
kvnode_match_checked."""
import ctypes
import hashlib

import torch

import kvnode
from fake_vllm import Engine, KVCacheBlocks, Request

PAGES, EXIST_KEYS = 64, 256
BLOCK_TOKENS, HEADS, HEAD_DIM = 16, 2, 64        # with 8 layers: 64 KiB blocks
_lib = kvnode._lib._lib


def _hashes(tag, n):
    return [hashlib.sha256(b"%s-%d" % (tag, i)).digest() for i in range(n)]


def _request(rid, hashes):
    r = Request(rid, list(range(len(hashes) * BLOCK_TOKENS + 1)), 1)
    r.block_size, r.block_hashes = BLOCK_TOKENS, list(hashes)
    r.num_computed_tokens = len(hashes) * BLOCK_TOKENS
    return r


class _Cache:
    """An engine of the bench's geometry: blocks 0-63 the source (random), 64-127 the
    destination of loads."""

    def __init__(self, sock, layers, model):
        self.engine = Engine({"socket_path": sock, "connect_wait_ms": 10000, "model": model},
                             num_blocks=2 * PAGES, block_size=BLOCK_TOKENS, layers=layers,
                             heads=HEADS, head_dim=HEAD_DIM)
        self.worker = self.engine.workers[0]
        for t in self.worker.caches.values():
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(5))
                    .to(t.dtype))
        self.src, self.dst = list(range(PAGES)), list(range(PAGES, 2 * PAGES))
        # numpy views of the caches' bytes for the checks: torch's own ops would wake its
        # OpenMP threads, whose spinning afterwards slows whatever path runs next
        self.arrays = [t.view(torch.uint8).numpy() for t in self.worker.caches.values()]
        self.expect = self.blocks(self.src)
        self.zero_dst()

    def blocks(self, ids):
        return [b"".join(a[0, b].tobytes() + a[1, b].tobytes() for a in self.arrays)
                for b in ids]

    def zero_dst(self):
        for a in self.arrays:
            a[:, PAGES:] = 0

    def check_dst(self, what):
        if self.blocks(self.dst) != self.expect:
            raise RuntimeError("%s: wrong bytes loaded" % what)
        self.zero_dst()


class VllmPath:
    """kvnode.vllm's connector as vLLM's scheduler and model runner call it."""
    OPS = ("put", "get", "exists")

    def __init__(self, sock, rounds, layers):
        self.c = _Cache(sock, layers, "bench-vllm")
        self.deleter = kvnode.Client(sock, self.c.worker.connector._link.layout)
        self.sched, self.conn = self.c.engine.connector, self.c.worker.connector
        self.fresh = [_hashes(b"vllm-put-%d" % r, PAGES) for r in range(rounds)]
        stored = _hashes(b"vllm-exists", EXIST_KEYS)
        self.stored = stored
        self.n = 0
        self._save(_request(self._rid(), stored[:PAGES]))
        self.load_meta = self._load_meta(stored[:PAGES])
        self.answer = self.asked = None
        # The requests vLLM hands the connector exist before its calls and outlive them: made
        # before timing, dropped after it (freeing a request's 4097 token ids is ~20 us that
        # vLLM's scheduler spends elsewhere, not in the connector). One per save, and one
        # seen for the first time per MATCH.
        self.put_reqs = [_request(self._rid(), h) for h in self.fresh]
        self.asks = [_request(self._rid(), stored) for _ in range(rounds + 1)]

    def _rid(self):
        self.n += 1
        return "r%d" % self.n

    def _save(self, req):
        rid = req.request_id
        hold, _ = self.sched.request_finished(req, self.c.src)
        if not hold:
            raise RuntimeError("vllm: request_finished planned no save")
        meta = self.sched.build_connector_meta(None)
        conn = self.conn
        conn.bind_connector_metadata(meta)
        conn.start_load_kv(None)
        conn.wait_for_save()
        done, _ = conn.get_finished({rid})
        conn.clear_connector_metadata()
        if done is None and rid in conn._pending_saves:
            # a save over inline_save_bytes, on the worker's thread: vLLM asks get_finished
            # once a step; here the wait is on the thread's condition (a busy poll would hold
            # the GIL the thread needs)
            with conn._save_wake:
                if not conn._save_wake.wait_for(lambda: rid in conn._saved, 10):
                    raise RuntimeError("vllm: save not done in 10 s")
            done, _ = conn.get_finished(set())
        if done != {rid}:
            raise RuntimeError("vllm: get_finished said %r" % (done,))

    def _load_meta(self, hashes):
        req = _request(self._rid(), hashes + [b"x" * 32])
        req.all_token_ids.append(0)
        got, _ = self.sched.get_num_new_matched_tokens(req, 0)
        if got != PAGES * BLOCK_TOKENS:
            raise RuntimeError("vllm: matched %d tokens, %d stored" % (got, PAGES * BLOCK_TOKENS))
        self.sched.update_state_after_alloc(req, KVCacheBlocks(self.c.dst), got)
        return self.sched.build_connector_meta(None)

    def put(self, r):
        self._save(self.put_reqs[r])

    def after_put(self, r):
        self.conn.bind_connector_metadata(self._load_meta(self.fresh[r]))
        self.conn.start_load_kv(None)
        self.conn.clear_connector_metadata()
        self.after_get()

    def forget(self, r):
        keys, checks = kvnode.fold_digests([h.hex() for h in self.fresh[r]])
        self.deleter.delete(keys, checks=checks)

    def get(self):
        self.conn.bind_connector_metadata(self.load_meta)
        self.conn.start_load_kv(None)
        errors = self.conn.get_block_ids_with_load_errors()
        self.conn.clear_connector_metadata()
        if errors:
            raise RuntimeError("vllm: load errors %s" % sorted(errors))

    def after_get(self):
        self.c.check_dst("vllm")

    def exists(self):
        self.asked = self.asks.pop()
        self.answer, _ = self.sched.get_num_new_matched_tokens(self.asked, 0)

    def after_exists(self):
        self.sched._plans.pop(self.asked.request_id, None)
        self.asked = None
        if self.answer != PAGES * BLOCK_TOKENS:
            raise RuntimeError("vllm: matched %r tokens, %d stored" % (self.answer,
                                                                     PAGES * BLOCK_TOKENS))

    def close(self):
        self.deleter.close()
        self.c.engine.shutdown()


class CVllmPath:
    """The C API doing the connector's work on a cache of the same geometry."""
    OPS = ("put", "get", "exists")

    def __init__(self, sock, rounds, layers):
        self.c = _Cache(sock, layers, "bench-vllm-c")
        conn = self.c.worker.connector
        layout = conn._link.layout
        self.client = kvnode.Client(sock, layout)
        self.h = ctypes.c_void_p(self.client._c)
        pieces, base, step = conn._mover.pieces, conn._mover.base, conn._mover.step
        self.at, self.m, self.sizes, self.offsets = pieces._args()
        self.src = (ctypes.c_void_p * PAGES)(*[base + b * step for b in self.c.src])
        self.dst = (ctypes.c_void_p * PAGES)(*[base + b * step for b in self.c.dst])
        self.fresh = [b"".join(_hashes(b"vllm-put-%d" % r, PAGES)) for r in range(rounds)]
        self.stored = b"".join(_hashes(b"vllm-exists", EXIST_KEYS))
        self.got = ctypes.c_size_t(0)
        self.keys, self.checks = (ctypes.c_int64 * EXIST_KEYS)(), (ctypes.c_uint64 * EXIST_KEYS)()
        self._put(self.stored, PAGES)
        self.answer = None
        conn.shutdown()

    def _fold(self, raw, n):
        _lib.kvnode_fold_digests(raw, ctypes.c_size_t(n), ctypes.c_size_t(32), self.keys,
                                 self.checks)

    def _put(self, raw, n):
        self._fold(raw, n)
        if _lib.kvnode_put_gather_checked(self.h, self.keys, self.checks, ctypes.c_size_t(n),
                                          self.src, ctypes.c_void_p(self.at),
                                          ctypes.c_size_t(self.m), ctypes.c_void_p(self.sizes),
                                          ctypes.c_void_p(self.offsets)) != 0:
            raise RuntimeError("C put_gather_checked failed")

    def _get(self, raw):
        self._fold(raw, PAGES)
        rc = _lib.kvnode_get_scatter_checked(self.h, self.keys, self.checks, ctypes.c_size_t(PAGES),
                                             self.dst, ctypes.c_void_p(self.at),
                                             ctypes.c_size_t(self.m), ctypes.c_void_p(self.sizes),
                                             ctypes.c_void_p(self.offsets), ctypes.byref(self.got))
        if rc != 0 or self.got.value != PAGES:
            raise RuntimeError("C get_scatter_checked read %d of %d" % (self.got.value, PAGES))

    def put(self, r):
        self._put(self.fresh[r], PAGES)

    def after_put(self, r):
        self._get(self.fresh[r])
        self.after_get()

    def forget(self, r):
        self._fold(self.fresh[r], PAGES)
        self.client.delete(kvnode.prefix(self.keys, PAGES),
                           checks=kvnode.prefix(self.checks, PAGES))

    def get(self):
        self._get(self.stored[:PAGES * 32])

    def after_get(self):
        self.c.check_dst("C vllm")

    def exists(self):
        self._fold(self.stored, EXIST_KEYS)
        t = kvnode._lib._CTiers()
        if _lib.kvnode_match_checked(self.h, self.keys, self.checks, ctypes.c_size_t(EXIST_KEYS),
                                     ctypes.byref(t)) != 0:
            raise RuntimeError("C match_checked failed")
        self.answer = t.matched

    def after_exists(self):
        if self.answer != PAGES:
            raise RuntimeError("C vllm: matched %r, %d stored" % (self.answer, PAGES))

    def close(self):
        self.client.close()
        self.c.engine.shutdown()


def report(got, limit, layers):
    """Print the vLLM rows; True when the connector is within limit of the C API."""
    a, c = got["vllm connector"], got["C API, vllm's work"]
    block = layers * 2 * BLOCK_TOKENS * HEADS * HEAD_DIM * 2
    mib = PAGES * block / 2 ** 20
    ratios = [a[i] / c[i] for i in range(3)]
    print("vLLM's connector (%d blocks of %d KiB: K/V split paged cache, %d layers; MATCH of a "
          "%d-block request, %d stored) next to the C API doing its work (fold, gathered "
          "copies, match_checked):" % (PAGES, block // 1024, layers, EXIST_KEYS, PAGES))
    print("%-28s %11.0f %11.0f %13.1f   %.2f / %.2f / %.2f%s"
          % ("vllm connector", mib / a[0], mib / a[1], a[2] * 1e6, ratios[0], ratios[1],
             ratios[2], "" if max(ratios) <= limit else " *"))
    print("%-28s %11.0f %11.0f %13.1f" % ("C API, vllm's work", mib / c[0], mib / c[1],
                                          c[2] * 1e6))
    return max(ratios) <= limit
