#!/usr/bin/env python3
"""gpu-check.sh's vllm behaviour: kvnode.vllm's device path. For each pair of KV cache
layouts, two "engines" in this process, each a scheduler-side and a worker-side
KvnodeConnector (built by the factory's rule, called in vLLM's order), each worker with its
paged KV cache in GPU memory (cudaMalloc) in one of vLLM's CUDA layouts: "cross", one
cross-layer tensor shaped as vLLM's FlashAttention cross-layer cache (blocks outermost,
every layer's K and V of a block in one run: libkvnode's device get/put of whole blocks);
"nhd", per-layer K/V split tensors (2, blocks, tokens, heads, dim) as FlashAttention's;
"hnd", per-layer stacked tensors (blocks, 2, tokens, heads, dim) in FlashInfer's HND
stride order (heads before tokens in memory); "packed", per-layer K|V-packed tensors
(blocks, heads, tokens, 2 x dim), token, head, K|V in memory (newer FlashAttention's);
"pcross", a K|V-packed cross-layer tensor (block, layer, token, head, K|V in memory). All but
"cross" move by libkvnode's device gathered calls (kvnode_put_gather_stream /
kvnode_get_scatter_stream). Engine A saves
--blocks blocks (request_finished, build_connector_meta, start_load_kv, get_finished),
engine B matches them and loads them into other blocks of its cache
(get_num_new_matched_tokens, update_state_after_alloc, start_load_kv); both caches are read
back with cudaMemcpy and each block's bytes in kvnode's order (every layer's K then V,
token-major) must agree: the pairs nhd -> hnd and hnd -> nhd show an NHD and an HND engine
sharing blocks byte-exact. Under --sim (FAKECUDA_DIR set) one more load with libkvnode's
device copy failing (the fake's cudaMemcpyAsync) must report every block as a load error:
the fake's device memory is host-addressable, so only this tells a device copy from a host
one there. Then each load's bandwidth next to one cudaMemcpy host-to-device of the same
bytes from pinned memory.

The CUDA runtime is the process's libcudart (the strict fake under --sim, through
LD_LIBRARY_PATH); torch is used for the caches' geometry only (meta tensors; no CUDA torch
needed). Prints one "RESULT PASS|FAIL|SKIP: ..." line; exit 0, 1, or 3 (SKIP: no torch)."""
import argparse
import ctypes
import hashlib
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "python")]

LAYERS, BLOCK_TOKENS, HEADS, HEAD_DIM = 4, 16, 2, 64     # bfloat16: 32 KiB blocks
H2D, D2H = 1, 2


def result(verdict, text, status):
    print("RESULT %s: %s" % (verdict, text))
    sys.exit(status)


def cuda_runtime():
    for name in ("libcudart.so", "libcudart.so.12", "libcudart.so.11.0"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    result("FAIL", "no CUDA runtime (libcudart.so) on the loader's path", 1)


class Cuda:
    def __init__(self, device):
        self.rt = cuda_runtime()
        self.rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.rt.cudaMallocHost.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_int]
        self.rt.cudaFree.argtypes = self.rt.cudaFreeHost.argtypes = [ctypes.c_void_p]
        self.check(self.rt.cudaSetDevice(device), "cudaSetDevice(%d)" % device)

    def check(self, rc, what):
        if rc != 0:
            result("FAIL", "%s returned %d" % (what, rc), 1)

    def malloc(self, n, host=False):
        p = ctypes.c_void_p()
        fn = self.rt.cudaMallocHost if host else self.rt.cudaMalloc
        self.check(fn(ctypes.byref(p), n), "cudaMalloc%s(%d)" % ("Host" if host else "", n))
        return p.value

    def copy(self, dst, src, n, kind):
        """cudaMemcpy, landed when this returns (from pageable memory cudaMemcpy may return
        before the copy lands; libkvnode's copies run on streams of their own)."""
        self.check(self.rt.cudaMemcpy(dst, src, n, kind), "cudaMemcpy")
        self.check(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


class DeviceTensor:
    """What the connector reads of a torch CUDA tensor (shape, strides, element size,
    views, is_contiguous, device, data_ptr), over cudaMalloc'd memory: the geometry is a
    meta tensor's, each view's address the base plus its storage offset."""

    def __init__(self, torch, meta, ptr, device):
        self._torch, self._meta, self._ptr, self._device = torch, meta, ptr, device
        self.device = torch.device("cuda", device)

    def _wrap(self, value):
        if isinstance(value, self._torch.Tensor):
            return DeviceTensor(self._torch, value, self._ptr, self._device)
        return value

    def __getattr__(self, name):
        attr = getattr(self._meta, name)
        if callable(attr):
            return lambda *a, **kw: self._wrap(attr(*a, **kw))
        return attr

    def __getitem__(self, key):
        return self._wrap(self._meta[key])

    @property
    def shape(self):
        return self._meta.shape

    @property
    def dtype(self):
        return self._meta.dtype

    def data_ptr(self):
        return self._ptr + self._meta.storage_offset() * self._meta.element_size()


def physical(kind, nb):
    """One layer's (or, cross, the whole cache's) shape in memory and the permutation that
    gives vLLM's logical view of it."""
    if kind == "cross":
        return (nb, LAYERS, 2, BLOCK_TOKENS, HEADS, HEAD_DIM), (1, 2, 0, 3, 4, 5)
    if kind == "pcross":    # K|V-packed cross-layer: block, layer, token, head, K|V in memory
        return (nb, LAYERS, BLOCK_TOKENS, HEADS, 2 * HEAD_DIM), (1, 0, 3, 2, 4)
    if kind == "nhd":
        return (2, nb, BLOCK_TOKENS, HEADS, HEAD_DIM), (0, 1, 2, 3, 4)
    if kind == "packed":    # (blocks, heads, tokens, 2 x dim), token, head, K|V in memory
        return (nb, BLOCK_TOKENS, HEADS, 2 * HEAD_DIM), (0, 2, 1, 3)
    return (nb, 2, HEADS, BLOCK_TOKENS, HEAD_DIM), (0, 1, 3, 2, 4)      # hnd


def canonical(torch, kind, raw, nb):
    """The caches' bytes (raw, as in GPU memory) as kvnode blocks: per block, every layer's
    K then V, each (tokens, heads, dim)."""
    shape, order = physical(kind, nb)
    t = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16)
    if kind == "cross":
        return [bytes(raw[b * BLOCK_BYTES:(b + 1) * BLOCK_BYTES]) for b in range(nb)]
    if kind == "pcross":
        phys = t.view(shape)
        return [b"".join(phys[b, li, :, :, half].contiguous().view(torch.uint8).numpy()
                         .tobytes() for li in range(LAYERS)
                         for half in (slice(0, HEAD_DIM), slice(HEAD_DIM, None)))
                for b in range(nb)]
    layers = t.view(LAYERS, -1)
    out = [[] for _ in range(nb)]
    for li in range(LAYERS):
        lt = layers[li].view(shape).permute(*order)
        for b in range(nb):
            if kind == "packed":
                kv = (lt[b, :, :, :HEAD_DIM].permute(1, 0, 2),
                      lt[b, :, :, HEAD_DIM:].permute(1, 0, 2))
            else:
                kv = (lt[0, b], lt[1, b]) if kind == "nhd" else (lt[b, 0], lt[b, 1])
            out[b] += [x.contiguous().view(torch.uint8).numpy().tobytes() for x in kv]
    return [b"".join(parts) for parts in out]


LAYER_BYTES_PER_BLOCK = 2 * BLOCK_TOKENS * HEADS * HEAD_DIM * 2
BLOCK_BYTES = LAYERS * LAYER_BYTES_PER_BLOCK


class Engine:
    """A scheduler-side and a worker-side connector with a KV cache of `kind` in GPU
    memory (nb blocks)."""

    def __init__(self, f, torch, config, kv_config, cuda, kind, nb, device):
        self.kind, self.nb = kind, nb
        self.sched = f.create_connector(config, "SCHEDULER", kv_config)
        self.worker = f.create_connector(config, "WORKER", kv_config)
        self.ptr = cuda.malloc(nb * BLOCK_BYTES)
        shape, order = physical(kind, nb)
        if kind in ("cross", "pcross"):
            if not self.worker.prefer_cross_layer_blocks:
                result("FAIL", "the connector does not prefer cross-layer blocks", 1)
            meta = torch.empty(shape, dtype=torch.bfloat16, device="meta").permute(*order)
            self.worker.register_cross_layers_kv_cache(
                DeviceTensor(torch, meta, self.ptr, device), None)
            want = "_WholeBlocks" if kind == "cross" else "_GatheredBlocks"
        else:
            caches = {}
            for i, name in enumerate(kv_config.kv_cache_groups[0].layer_names):
                meta = torch.empty(shape, dtype=torch.bfloat16, device="meta").permute(*order)
                caches[name] = DeviceTensor(torch, meta, self.ptr + i * nb *
                                            LAYER_BYTES_PER_BLOCK, device)
            self.worker.register_kv_caches(caches)
            want = "_GatheredBlocks"
        mover = self.worker._mover
        if type(mover).__name__ != want or mover.device != device:
            result("FAIL", "%s cache: the worker did not take the device cache (mover %s; "
                   "see the log)" % (kind, type(mover).__name__), 1)

    def shutdown(self):
        self.worker.shutdown()
        self.sched.shutdown()


def run_pair(args, torch, f, cuda, kind_a, kind_b, salt):
    """Engine A (kind_a) saves n blocks, engine B (kind_b) loads them: (load seconds,
    memcpy seconds)."""
    n = args.blocks
    nb = 2 * n
    names = ["model.layers.%d.self_attn.attn" % i for i in range(LAYERS)]
    kv_config = f.KVCacheConfig(nb, [f.KVCacheGroupSpec(names, f.FullAttentionSpec(
        BLOCK_TOKENS, HEADS, HEAD_DIM, torch.bfloat16))])
    config = f.VllmConfig(f.ModelConfig(model="gpu-check-vllm-%d-%d" % (args.salt, salt)),
                          f.CacheConfig(BLOCK_TOKENS), f.ParallelConfig(),
                          f.KVTransferConfig(kv_load_failure_policy="recompute",
                                             kv_connector_extra_config={
                              "socket_path": args.socket, "connect_wait_ms": 10000,
                              "timeout_ms": 10000}))
    a = Engine(f, torch, config, kv_config, cuda, kind_a, nb, args.device)
    b = Engine(f, torch, config, kv_config, cuda, kind_b, nb, args.device)
    what = "%s -> %s" % (kind_a, kind_b)
    total = nb * BLOCK_BYTES
    host = cuda.malloc(total, host=True)
    src = os.urandom(total)
    ctypes.memmove(host, src, total)
    cuda.copy(a.ptr, host, total, H2D)            # engine A computed its blocks
    want = canonical(torch, kind_a, src, nb)[:n]

    hashes = [hashlib.sha256(b"%d-%d-%d" % (args.salt, salt, i)).digest() for i in range(n)]
    req = f.Request("a", list(range(n * BLOCK_TOKENS + 1)), 1)
    req.block_size, req.block_hashes, req.num_computed_tokens = BLOCK_TOKENS, hashes, \
        n * BLOCK_TOKENS
    hold, _ = a.sched.request_finished(req, list(range(n)))
    if not hold:
        result("FAIL", "%s: request_finished planned no save" % what, 1)
    a.worker.bind_connector_metadata(a.sched.build_connector_meta(None))
    a.worker.start_load_kv(None)
    a.worker.clear_connector_metadata()
    deadline, ask = time.monotonic() + 30, {"a"}
    while True:
        done, _ = a.worker.get_finished(ask)
        ask = set()
        if done == {"a"}:
            break
        if time.monotonic() > deadline:
            result("FAIL", "%s: the save was not reported by get_finished in 30 s" % what, 1)
        time.sleep(0.001)
    if a.worker.counters["blocks_saved"] != n:
        result("FAIL", "%s: saved %d blocks of %d (dropped %d)"
               % (what, a.worker.counters["blocks_saved"], n,
                  a.worker.counters["saves_dropped_blocks"]), 1)

    def load(rid):
        req_b = f.Request(rid, list(range(n * BLOCK_TOKENS + 2)), 1)
        req_b.block_size, req_b.block_hashes = BLOCK_TOKENS, hashes
        ext, _ = b.sched.get_num_new_matched_tokens(req_b, 0)
        if ext != n * BLOCK_TOKENS:
            result("FAIL", "%s: engine B matched %d tokens, %d saved"
                   % (what, ext, n * BLOCK_TOKENS), 1)
        b.sched.update_state_after_alloc(req_b, f.KVCacheBlocks(range(n, 2 * n)), ext)
        meta_b = b.sched.build_connector_meta(None)
        t0 = time.perf_counter()
        b.worker.bind_connector_metadata(meta_b)
        b.worker.start_load_kv(None)
        errors = b.worker.get_block_ids_with_load_errors()
        b.worker.clear_connector_metadata()
        return time.perf_counter() - t0, errors

    times = []
    zero = ctypes.create_string_buffer(total)
    for r in range(args.rounds):
        cuda.copy(b.ptr, ctypes.addressof(zero), total, H2D)
        t, errors = load("b%d" % r)
        times.append(t)
        if errors:
            result("FAIL", "%s: load errors on blocks %s" % (what, sorted(errors)), 1)
        out = ctypes.create_string_buffer(total)
        cuda.copy(ctypes.addressof(out), b.ptr, total, D2H)
        got = canonical(torch, kind_b, out.raw, nb)
        for i in range(n):
            if got[n + i] != want[i]:
                result("FAIL", "%s round %d: block %d loaded into engine B differs from "
                       "engine A's" % (what, r, i), 1)
        if any(got[i] != bytes(BLOCK_BYTES) for i in range(n)):
            result("FAIL", "%s round %d: the load wrote blocks outside its own" % (what, r), 1)
    fake = os.environ.get("FAKECUDA_DIR")
    if fake:
        # --sim: the fake's device memory is host-addressable, so a host copy would pass
        # the checks above; with libkvnode's device copy failing (cudaMemcpyAsync), a load
        # through the device path must report every block of it as a load error
        with open(os.path.join(fake, "fail"), "w") as fail:
            fail.write("cudaMemcpyAsync\n")
        try:
            _, errors = load("fail")
        finally:
            os.unlink(os.path.join(fake, "fail"))
        if errors != set(range(n, 2 * n)):
            result("FAIL", "%s: with the device copy failing, load errors %s, not blocks "
                   "%d-%d: was the load a device copy?" % (what, sorted(errors), n,
                                                           2 * n - 1), 1)
    copies = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        cuda.copy(b.ptr + n * BLOCK_BYTES, host, n * BLOCK_BYTES, H2D)
        copies.append(time.perf_counter() - t0)
    a.shutdown()
    b.shutdown()
    return min(times), min(copies)


PAIRS = {"cross": ("cross", "cross"), "nhd": ("nhd", "nhd"), "hnd": ("hnd", "hnd"),
         "nhd-hnd": ("nhd", "hnd"), "hnd-nhd": ("hnd", "nhd"), "packed-hnd": ("packed", "hnd"),
         "nhd-packed": ("nhd", "packed"), "pcross-hnd": ("pcross", "hnd")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--device", type=int, required=True)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--salt", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pairs", default="cross,nhd-hnd,hnd-nhd",
                    help="comma list of %s (engine A's cache, then B's)" % ", ".join(PAIRS))
    args = ap.parse_args()
    pairs = args.pairs.split(",")
    bad = [p for p in pairs if p not in PAIRS]
    if bad:
        ap.error("unknown pairs %s" % ", ".join(bad))
    try:
        import torch
    except ImportError as e:
        result("SKIP", "torch is not installed (%s): the connector reads tensors" % e, 3)
    import kvnode.vllm  # noqa: F401 - the connector fake_vllm's factory builds
    import fake_vllm as f

    cuda = Cuda(args.device)
    n, mib = args.blocks, args.blocks * BLOCK_BYTES / 2 ** 20
    rates = []
    for i, name in enumerate(pairs):
        load, memcpy = run_pair(args, torch, f, cuda, PAIRS[name][0], PAIRS[name][1], i)
        rates.append("%s %.0f MiB/s (%.2fx)" % (name, mib / load, load / memcpy))
        memcpy_rate = mib / memcpy
    fake = os.environ.get("FAKECUDA_DIR")
    result("PASS", "%d blocks of %d KiB saved from GPU %d and loaded into another engine's "
           "cache byte-exact for %s%s; loads: %s; cudaMemcpy of the same bytes %.0f MiB/s"
           % (n, BLOCK_BYTES // 1024, args.device, ", ".join(pairs),
              ", a failed device copy reported as load errors" if fake else "",
              "; ".join(rates), memcpy_rate), 0)


if __name__ == "__main__":
    main()
