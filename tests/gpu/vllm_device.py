#!/usr/bin/env python3
"""gpu-check.sh's vllm behaviour: kvnode.vllm's device path. Two "engines" in this process,
each a scheduler-side and a worker-side KvnodeConnector (built by the factory's rule, called
in vLLM's order), each worker with a cross-layer KV cache in GPU memory (cudaMalloc; shaped
as vLLM's FlashAttention cross-layer cache: blocks outermost, every layer's K and V of a
block in one run). Engine A saves --blocks blocks (request_finished, build_connector_meta,
start_load_kv, get_finished: libkvnode's device put), engine B matches them and loads them
into other blocks of its cache (get_num_new_matched_tokens, update_state_after_alloc,
start_load_kv: libkvnode's device get); both caches are read back with cudaMemcpy and must
agree byte for byte, with no load error reported. Under --sim (FAKECUDA_DIR set) one more
load with libkvnode's device copy failing (the fake's cudaMemcpyAsync) must report every
block as a load error: the fake's device memory is host-addressable, so only this tells a
device copy from a host one there. Then the load's bandwidth next to one cudaMemcpy
host-to-device of the same bytes from pinned memory.

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


class DeviceCache:
    """What the connector reads of a torch CUDA tensor (shape, strides, element size,
    select, is_contiguous, device, data_ptr), over cudaMalloc'd memory: the geometry is a
    meta tensor's."""

    def __init__(self, torch, meta, ptr, device):
        self._meta, self._ptr = meta, ptr
        self.device = torch.device("cuda", device)

    def __getattr__(self, name):
        return getattr(self._meta, name)

    @property
    def shape(self):
        return self._meta.shape

    def data_ptr(self):
        return self._ptr


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--device", type=int, required=True)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--salt", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        result("SKIP", "torch is not installed (%s): the connector reads tensors" % e, 3)
    import kvnode
    import kvnode.vllm
    import fake_vllm as f

    n = args.blocks
    nb = 2 * n
    cuda = Cuda(args.device)
    meta = torch.empty((nb, LAYERS, 2, BLOCK_TOKENS, HEADS, HEAD_DIM), dtype=torch.bfloat16,
                       device="meta").permute(1, 2, 0, 3, 4, 5)
    block_bytes = LAYERS * 2 * BLOCK_TOKENS * HEADS * HEAD_DIM * 2
    names = ["model.layers.%d.self_attn.attn" % i for i in range(LAYERS)]
    kv_config = f.KVCacheConfig(nb, [f.KVCacheGroupSpec(names, f.FullAttentionSpec(
        BLOCK_TOKENS, HEADS, HEAD_DIM, torch.bfloat16))])
    config = f.VllmConfig(f.ModelConfig(model="gpu-check-vllm-%d" % args.salt),
                          f.CacheConfig(BLOCK_TOKENS), f.ParallelConfig(),
                          f.KVTransferConfig(kv_load_failure_policy="recompute",
                                             kv_connector_extra_config={
                              "socket_path": args.socket, "connect_wait_ms": 10000,
                              "timeout_ms": 10000}))
    engines = []
    for _ in range(2):
        sched = f.create_connector(config, "SCHEDULER", kv_config)
        worker = f.create_connector(config, "WORKER", kv_config)
        if not worker.prefer_cross_layer_blocks:
            result("FAIL", "the connector does not prefer cross-layer blocks", 1)
        ptr = cuda.malloc(nb * block_bytes)
        worker.register_cross_layers_kv_cache(DeviceCache(torch, meta, ptr, args.device), None)
        if type(worker._mover).__name__ != "_WholeBlocks" or worker._mover.device != args.device:
            result("FAIL", "register_cross_layers_kv_cache did not take the device cache "
                   "(see the log)", 1)
        engines.append((sched, worker, ptr))
    (sched_a, worker_a, ptr_a), (sched_b, worker_b, ptr_b) = engines

    host = cuda.malloc(nb * block_bytes, host=True)
    src = os.urandom(n * block_bytes)
    ctypes.memmove(host, src, len(src))
    cuda.copy(ptr_a, host, len(src), H2D)           # engine A computed blocks 0..n-1

    hashes = [hashlib.sha256(b"%d-%d" % (args.salt, i)).digest() for i in range(n)]
    req = f.Request("a", list(range(n * BLOCK_TOKENS + 1)), 1)
    req.block_size, req.block_hashes, req.num_computed_tokens = BLOCK_TOKENS, hashes, \
        n * BLOCK_TOKENS
    hold, _ = sched_a.request_finished(req, list(range(n)))
    if not hold:
        result("FAIL", "request_finished planned no save", 1)
    worker_a.bind_connector_metadata(sched_a.build_connector_meta(None))
    worker_a.start_load_kv(None)
    worker_a.clear_connector_metadata()
    deadline, ask = time.monotonic() + 30, {"a"}
    while True:
        done, _ = worker_a.get_finished(ask)
        ask = set()
        if done == {"a"}:
            break
        if time.monotonic() > deadline:
            result("FAIL", "the save was not reported by get_finished in 30 s", 1)
        time.sleep(0.001)
    if worker_a.counters["blocks_saved"] != n:
        result("FAIL", "saved %d blocks of %d (dropped %d)"
               % (worker_a.counters["blocks_saved"], n, worker_a.counters["saves_dropped_blocks"]),
               1)

    times = []
    for r in range(args.rounds):
        req_b = f.Request("b%d" % r, list(range(n * BLOCK_TOKENS + 2)), 1)
        req_b.block_size, req_b.block_hashes = BLOCK_TOKENS, hashes
        ext, _ = sched_b.get_num_new_matched_tokens(req_b, 0)
        if ext != n * BLOCK_TOKENS:
            result("FAIL", "engine B matched %d tokens, %d saved" % (ext, n * BLOCK_TOKENS), 1)
        sched_b.update_state_after_alloc(req_b, f.KVCacheBlocks(range(n, 2 * n)), ext)
        meta_b = sched_b.build_connector_meta(None)
        t0 = time.perf_counter()
        worker_b.bind_connector_metadata(meta_b)
        worker_b.start_load_kv(None)
        errors = worker_b.get_block_ids_with_load_errors()
        worker_b.clear_connector_metadata()
        times.append(time.perf_counter() - t0)
        if errors:
            result("FAIL", "load errors on blocks %s" % sorted(errors), 1)
        out = ctypes.create_string_buffer(n * block_bytes)
        cuda.copy(ctypes.addressof(out), ptr_b + n * block_bytes, n * block_bytes, D2H)
        if out.raw != src:
            bad = next(i for i in range(n) if out.raw[i * block_bytes:(i + 1) * block_bytes]
                       != src[i * block_bytes:(i + 1) * block_bytes])
            result("FAIL", "round %d: block %d loaded into engine B differs from engine A's"
                   % (r, bad), 1)
        ctypes.memset(ctypes.addressof(out), 0, len(out))
        cuda.copy(ptr_b + n * block_bytes, ctypes.addressof(out), n * block_bytes, H2D)
    fake = os.environ.get("FAKECUDA_DIR")
    if fake:
        # --sim: the fake's device memory is host-addressable, so a host copy would pass
        # the checks above; with libkvnode's device copy failing (cudaMemcpyAsync), a load
        # through the device path must report every block of it as a load error
        req_b = f.Request("fail", list(range(n * BLOCK_TOKENS + 2)), 1)
        req_b.block_size, req_b.block_hashes = BLOCK_TOKENS, hashes
        ext, _ = sched_b.get_num_new_matched_tokens(req_b, 0)
        sched_b.update_state_after_alloc(req_b, f.KVCacheBlocks(range(n, 2 * n)), ext)
        meta_b = sched_b.build_connector_meta(None)
        with open(os.path.join(fake, "fail"), "w") as fail:
            fail.write("cudaMemcpyAsync\n")
        try:
            worker_b.bind_connector_metadata(meta_b)
            worker_b.start_load_kv(None)
            errors = worker_b.get_block_ids_with_load_errors()
            worker_b.clear_connector_metadata()
        finally:
            os.unlink(os.path.join(fake, "fail"))
        if errors != set(range(n, 2 * n)):
            result("FAIL", "with the device copy failing, load errors %s, not blocks %d-%d: "
                   "was the load a device copy?" % (sorted(errors), n, 2 * n - 1), 1)
    copies = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        cuda.copy(ptr_b + n * block_bytes, host, n * block_bytes, H2D)
        copies.append(time.perf_counter() - t0)
    mib = n * block_bytes / 2 ** 20
    load, memcpy = min(times), min(copies)
    for w in (worker_a, worker_b):
        w.shutdown()
    for s in (sched_a, sched_b):
        s.shutdown()
    result("PASS", "%d blocks of %d KiB saved from GPU %d and loaded into another engine's "
           "cache byte-exact%s; load %.0f MiB/s, cudaMemcpy of the same bytes %.0f MiB/s "
           "(%.2fx)" % (n, block_bytes // 1024, args.device,
                        ", a failed device copy reported as load errors" if fake else "",
                        mib / load, mib / memcpy, load / memcpy), 0)


if __name__ == "__main__":
    main()
