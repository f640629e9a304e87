"""What vLLM v1 does with a KV connector, without vLLM (written from its interfaces, no code
of theirs): the configs the connector reads, the factory's construction by
``kv_connector_module_path``, paged KV caches as CPU torch tensors in the attention backends'
shapes (backend "flash_attn": K/V split (2, blocks, tokens, heads, dim); "flashinfer": stacked
(blocks, 2, tokens, heads, dim); "packed": vLLM's newer K|V-packed FlashAttention/FlashInfer
layout (blocks, heads, tokens, 2 x dim), NHD in memory; "mla": (blocks, tokens, latent);
"flash_attn_hnd": K/V split in HND order; "flashinfer_hnd": stacked in FlashInfer's HND
stride order (blocks, 2, heads, tokens, dim) in memory, seen as (blocks, 2, tokens, heads,
dim); "dim_strided": K/V split whose head vectors are not one run of memory, which the
connector cannot move; "+cross": one cross-layer tensor), the request's chained block
hashes, and an engine whose scheduler and model runner call the connector in vLLM's order:

scheduler ``schedule()``: running requests first (preempting the last running one when no
block is free: its blocks freed, its computed tokens 0, back to the head of the waiting
queue), then waiting ones: ``get_num_new_matched_tokens(request, local)`` -> blocks allocated
for matched + new tokens -> ``update_state_after_alloc(request, blocks, external)``; then
``build_connector_meta(output)`` and the computed tokens advanced.
model runner, per worker (one per TP rank): ``bind_connector_metadata``, ``start_load_kv``
(before the forward when the step has synchronous loads, after it otherwise), per layer
``wait_for_layer_load`` / KV written / ``save_kv_layer``, then ``wait_for_save``,
``get_transfer_results(finished_req_ids)`` (``get_finished`` with ``transfer_results=False``,
as older vLLM), ``get_block_ids_with_load_errors``,
``get_kv_connector_stats``, ``clear_connector_metadata``. In a step with nothing scheduled
older vLLM's ``kv_connector_no_forward`` skips ``wait_for_save``
(``no_forward_wait_for_save=False``); with ``defer_finalize`` (a draft model's forward after
the target's) ``wait_for_save`` comes after the results, just before
``clear_connector_metadata`` (vLLM's ``finalize_kv_connector``).
scheduler ``update_from_output``: invalid blocks truncate the affected requests' computed
tokens at the first invalid block (their sampled token dropped), finished requests go to
``request_finished(request, block_ids)`` (blocks held when it returns True), then
``update_connector_output`` and the blocks of requests every worker reported in
``finished_sending`` are freed.

The "model": a token's K and V in layer l are pseudo-random values drawn from a hash of the
tokens up to it (so the same prefix gives the same bytes in every engine); a sampled token is
a hash of the request's KV as the paged cache holds it, so a block loaded wrong changes the
output."""
import dataclasses
import hashlib
import importlib
import pickle
import time

import torch

MODEL = "fake/vllm-model"


@dataclasses.dataclass
class KVTransferConfig:
    kv_connector: str = "KvnodeConnector"
    kv_connector_module_path: str = "kvnode.vllm"
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict = dataclasses.field(default_factory=dict)
    kv_load_failure_policy: str = "fail"        # vLLM's default


@dataclasses.dataclass
class ModelConfig:
    model: str = MODEL
    revision: str = None


@dataclasses.dataclass
class CacheConfig:
    block_size: int = 16


@dataclasses.dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    rank: int = 0


@dataclasses.dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    parallel_config: ParallelConfig
    kv_transfer_config: KVTransferConfig


@dataclasses.dataclass
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype


class MLAAttentionSpec(FullAttentionSpec):
    pass


@dataclasses.dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: FullAttentionSpec


@dataclasses.dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_groups: list


class KVCacheBlocks:
    def __init__(self, block_ids):
        self._ids = list(block_ids)

    def get_block_ids(self):
        return (list(self._ids),)


@dataclasses.dataclass
class SchedulerOutput:
    num_scheduled_tokens: dict
    start: dict                 # request id -> first position computed this step
    block_tables: dict
    token_ids: dict
    finished_req_ids: set
    preempted_req_ids: set
    has_sync_kv_loads: bool = False
    kv_connector_metadata: object = None


@dataclasses.dataclass
class KVConnectorOutput:
    finished_sending: set = None
    finished_recving: set = None
    invalid_block_ids: set = dataclasses.field(default_factory=set)
    kv_connector_stats: object = None


def create_connector(vllm_config, role_name, kv_cache_config):
    """KVConnectorFactory: import kv_connector_module_path, take kv_connector from it."""
    ktc = vllm_config.kv_transfer_config
    module = importlib.import_module(ktc.kv_connector_module_path)
    cls = getattr(module, ktc.kv_connector)
    return cls(vllm_config, getattr(module.KVConnectorRole, role_name), kv_cache_config)


SPLIT = ("flash_attn", "flash_attn_hnd", "dim_strided")     # backends with K/V split caches

def sha256(value):
    """vLLM's default block hash function (--prefix-caching-hash-algo sha256): SHA-256 of the
    value pickled with the highest protocol."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


# The parent of a request's first block: the hash function of PYTHONHASHSEED's string
# (these engines run with PYTHONHASHSEED=0; unset, vLLM takes 32 random bytes)
NONE_HASH = sha256("0")


class Request:
    def __init__(self, request_id, prompt, max_tokens):
        self.request_id, self.max_tokens = request_id, max_tokens
        self.prompt_token_ids = list(prompt)
        self.all_token_ids = list(prompt)
        self.output_token_ids = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1
        self.num_external_computed_tokens = 0
        self.num_preemptions = 0
        self.block_hashes = []
        self.block_ids = []
        self.finished = False
        self.block_size = None
        self.waiting_for_remote = False

    @property
    def num_tokens(self):
        return len(self.all_token_ids)

    @property
    def num_publishable_block_hashes(self):
        return len(self.block_hashes)

    def update_hashes(self):
        """vLLM's chained block hash of each new full block: the hash function of (parent
        hash, the block's token ids as a tuple, extra keys: None without LoRA, multimodal
        inputs, prompt embeddings or a cache salt), raw digest bytes."""
        bs = self.block_size
        while (len(self.block_hashes) + 1) * bs <= self.num_tokens:
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if self.block_hashes else NONE_HASH
            self.block_hashes.append(sha256(
                (parent, tuple(self.all_token_ids[i * bs:(i + 1) * bs]), None)))


def token_kv(tokens, layers, heads, head_dim, mla, dtype):
    """The K/V of the last of tokens in every layer: (layers, 2, heads, dim), MLA (layers, dim)."""
    seed = int.from_bytes(hashlib.sha256(repr(list(tokens)).encode()).digest()[:7], "little")
    g = torch.Generator().manual_seed(seed)
    shape = (layers, head_dim) if mla else (layers, 2, heads, head_dim)
    return torch.randn(shape, generator=g).to(dtype)


class Worker:
    """One model-runner process of a TP rank: its paged KV cache and its connector."""

    def __init__(self, engine, rank):
        self.engine, self.rank = engine, rank
        e = engine
        cfg = dataclasses.replace(e.config, parallel_config=dataclasses.replace(
            e.config.parallel_config, rank=rank))
        self.connector = create_connector(cfg, "WORKER", e.kv_cache_config)
        g = torch.Generator().manual_seed(1000 + rank)
        h = e.heads // e.tp
        self.caches = {}
        # noise: a block nobody wrote is never mistaken for the right bytes
        if e.cross_layer and self.connector.prefer_cross_layer_blocks:
            # one tensor for every layer, blocks outermost in memory, seen with num_layers
            # first and each layer's view in its backend's shape
            nl, nb, bs, d = len(e.layer_names), e.num_blocks, e.block_size, e.head_dim
            if e.mla:
                phys, order = (nb, nl, bs, d), (1, 0, 2, 3)
            elif e.backend == "flash_attn":
                phys, order = (nb, nl, 2, bs, h, d), (1, 2, 0, 3, 4, 5)
            elif e.backend == "packed":
                phys, order = (nb, nl, bs, h, 2 * d), (1, 0, 3, 2, 4)
            else:
                phys, order = (nb, nl, 2, bs, h, d), (1, 0, 2, 3, 4, 5)
            cross = torch.randn(phys, generator=g).to(e.dtype).permute(*order)
            for i, name in enumerate(e.layer_names):
                self.caches[name] = cross[i]
            self.connector.register_cross_layers_kv_cache(cross, None)
            return
        for name in e.layer_names:
            if e.backend == "flash_attn":
                shape = (2, e.num_blocks, e.block_size, h, e.head_dim)
            elif e.backend == "flashinfer":
                shape = (e.num_blocks, 2, e.block_size, h, e.head_dim)
            elif e.backend == "flash_attn_hnd":     # K/V split, HND in memory
                self.caches[name] = torch.randn((2, e.num_blocks, h, e.block_size, e.head_dim),
                                                generator=g).to(e.dtype).permute(0, 1, 3, 2, 4)
                continue
            elif e.backend == "flashinfer_hnd":     # stacked, HND in memory (FlashInfer's)
                self.caches[name] = torch.randn((e.num_blocks, 2, h, e.block_size, e.head_dim),
                                                generator=g).to(e.dtype).permute(0, 1, 3, 2, 4)
                continue
            elif e.backend == "dim_strided":        # head vectors strided: not movable
                self.caches[name] = torch.randn((2, e.num_blocks, e.head_dim, e.block_size, h),
                                                generator=g).to(e.dtype).permute(0, 1, 3, 4, 2)
                continue
            elif e.backend == "packed":     # (blocks, heads, tokens, 2 x dim), NHD in memory
                self.caches[name] = torch.randn((e.num_blocks, e.block_size, h, 2 * e.head_dim),
                                                generator=g).to(e.dtype).permute(0, 2, 1, 3)
                continue
            else:
                shape = (e.num_blocks, e.block_size, e.head_dim)
            self.caches[name] = torch.randn(shape, generator=g).to(e.dtype)
        self.connector.register_kv_caches(self.caches)

    def write(self, layer, name, block, off, kv):
        """Token's KV (layers, 2, heads_total, dim) into this rank's slot."""
        e, t = self.engine, self.caches[name]
        if e.mla:
            t[block, off] = kv[layer]
            return
        h = e.heads // e.tp
        part = kv[layer, :, self.rank * h:(self.rank + 1) * h]
        if e.backend in SPLIT:
            t[0, block, off], t[1, block, off] = part[0], part[1]
        elif e.backend == "packed":
            d = e.head_dim
            t[block, :, off, :d], t[block, :, off, d:] = part[0], part[1]
        else:
            t[block, 0, off], t[block, 1, off] = part[0], part[1]

    def block_bytes(self, block):
        """This rank's bytes of a block, layer by layer: K then V (MLA: latent)."""
        e, out = self.engine, []
        for name in e.layer_names:
            t = self.caches[name]
            if e.backend in SPLIT:
                out += [t[0, block].contiguous(), t[1, block].contiguous()]
            elif e.backend == "packed":     # K then V, each (tokens, heads, dim)
                d = e.head_dim
                out += [t[block, :, :, :d].permute(1, 0, 2).contiguous(),
                        t[block, :, :, d:].permute(1, 0, 2).contiguous()]
            else:
                out.append(t[block].contiguous())
        return b"".join(x.view(torch.uint8).numpy().tobytes() for x in out)

    def execute(self, out):
        e, conn = self.engine, self.connector
        out = pickle.loads(pickle.dumps(out))   # as vLLM's executor hands it to each worker
        conn.bind_connector_metadata(out.kv_connector_metadata)
        if out.has_sync_kv_loads:
            conn.start_load_kv(None)
        try:
            if out.num_scheduled_tokens:
                for li, name in enumerate(e.layer_names):
                    conn.wait_for_layer_load(name)
                    for rid, n in out.num_scheduled_tokens.items():
                        toks, table = out.token_ids[rid], out.block_tables[rid]
                        for p in range(out.start[rid], out.start[rid] + n):
                            kv = e.kv_of(toks[:p + 1])
                            self.write(li, name, table[p // e.block_size], p % e.block_size, kv)
                    conn.save_kv_layer(name, self.caches[name], None)
        finally:
            if not out.has_sync_kv_loads:
                conn.start_load_kv(None)
            if not e.defer_finalize and (out.num_scheduled_tokens or
                                         e.no_forward_wait_for_save):
                conn.wait_for_save()
            if e.transfer_results:  # newer vLLM: get_transfer_results; older: get_finished
                done = conn.get_transfer_results(out.finished_req_ids)
                sending, recving = done.finished_sending, done.finished_recving
            else:
                sending, recving = conn.get_finished(out.finished_req_ids)
            result = KVConnectorOutput(sending, recving, conn.get_block_ids_with_load_errors(),
                                       conn.get_kv_connector_stats())
            if e.defer_finalize:
                conn.wait_for_save()
            conn.clear_connector_metadata()
        return result


class Engine:
    """One vLLM instance: a scheduler (with its connector) and tp workers."""

    def __init__(self, extra_config, backend="flash_attn", tp=1, num_blocks=24, block_size=4,
                 layers=3, heads=4, head_dim=8, dtype=torch.bfloat16, budget=64,
                 long_prefill=0, kv_role="kv_both", hybrid=False, failure_policy="recompute",
                 transfer_results=True, no_forward_wait_for_save=True, defer_finalize=False):
        # "<backend>+cross": a cross-layer cache (vLLM allocates one when the connector
        # prefers it and the backend can)
        backend, _, cross = backend.partition("+")
        self.cross_layer = cross == "cross"
        self.backend, self.tp, self.num_blocks, self.block_size = backend, tp, num_blocks, \
            block_size
        self.mla = backend == "mla"
        self.heads = 1 if self.mla else heads
        self.head_dim, self.dtype, self.budget = head_dim, dtype, budget
        self.long_prefill = long_prefill
        self.transfer_results = transfer_results
        self.no_forward_wait_for_save = no_forward_wait_for_save
        self.defer_finalize = defer_finalize
        self.layer_names = ["model.layers.%d.self_attn.attn" % i for i in range(layers)]
        self.config = VllmConfig(ModelConfig(), CacheConfig(block_size),
                                 ParallelConfig(tensor_parallel_size=tp),
                                 KVTransferConfig(kv_role=kv_role,
                                                  kv_connector_extra_config=dict(extra_config),
                                                  kv_load_failure_policy=failure_policy))
        spec_cls = MLAAttentionSpec if self.mla else FullAttentionSpec
        spec = spec_cls(block_size, self.heads // tp if not self.mla else 1, head_dim, dtype)
        # hybrid: two groups (as full and sliding-window attention layers of one model)
        groups = [self.layer_names[0::2], self.layer_names[1::2]] if hybrid else \
            [self.layer_names]
        self.kv_cache_config = KVCacheConfig(num_blocks, [KVCacheGroupSpec(g, spec)
                                                          for g in groups])
        self.connector = create_connector(self.config, "SCHEDULER", self.kv_cache_config)
        self.workers = [Worker(self, r) for r in range(tp)]
        self.free = list(range(num_blocks))
        self.requests, self.waiting, self.running = {}, [], []
        self.finished_req_ids = set()
        self.computed = {}          # request id -> tokens whose KV the forward computed
        self.invalid_seen = set()
        self.sending_counts = {}
        self.recving_counts = {}
        self.finished_recving, self.failed_recving = set(), set()
        self.preempted = []
        self.stats = []
        self._kv_cache = {}

    def kv_of(self, tokens):
        key = tuple(tokens)
        kv = self._kv_cache.get(key)
        if kv is None:
            kv = self._kv_cache[key] = token_kv(tokens, len(self.layer_names), self.heads,
                                                self.head_dim, self.mla, self.dtype)
        return kv

    def add(self, request_id, prompt, max_tokens=2):
        r = Request(request_id, prompt, max_tokens)
        r.block_size = self.block_size
        r.update_hashes()
        self.requests[request_id] = r
        self.waiting.append(r)
        self.computed[request_id] = 0
        return r

    # ---------------------------------------------------------------- scheduler

    def _allocate(self, req, tokens):
        need = -(-tokens // self.block_size) - len(req.block_ids)
        if need > len(self.free):
            return False
        for _ in range(max(need, 0)):
            req.block_ids.append(self.free.pop(0))
        return True

    def _free_blocks(self, req):
        self.free += reversed(req.block_ids)    # freed blocks go to the queue's tail
        req.block_ids = []

    def _preempt(self, req):
        self._free_blocks(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.insert(0, req)
        self.preempted.append(req.request_id)

    def _chunk(self, req, computed):
        n = min(req.num_tokens - computed, self.budget)
        return min(n, self.long_prefill) if self.long_prefill else n

    def schedule(self):
        scheduled, start, preempted, sync_loads = {}, {}, set(), False
        budget = self.budget
        for req in list(self.running):
            if budget <= 0 or req not in self.running:
                continue
            n = min(self._chunk(req, req.num_computed_tokens), budget)
            if n <= 0:
                continue
            while not self._allocate(req, req.num_computed_tokens + n):
                victim = self.running.pop()
                if scheduled.pop(victim.request_id, None) is not None:
                    start.pop(victim.request_id)
                self._preempt(victim)
                preempted.add(victim.request_id)
                if victim is req:
                    break
            if req.request_id in preempted:
                continue
            scheduled[req.request_id], start[req.request_id] = n, req.num_computed_tokens
            budget -= n
        skipped = []
        while not preempted and self.waiting and budget > 0:
            req = self.waiting[0]
            if req.waiting_for_remote:
                if req.request_id not in self.finished_recving:
                    skipped.append(self.waiting.pop(0))     # still loading
                    continue
                # its asynchronous load ended: its blocks count as computed (all but the
                # last token), unless a load error cut them already
                self.finished_recving.discard(req.request_id)
                req.waiting_for_remote = False
                if req.request_id in self.failed_recving:
                    self.failed_recving.discard(req.request_id)
                else:
                    req.num_computed_tokens = min(len(req.block_ids) * self.block_size,
                                                  req.num_tokens - 1)
            ext, load_async = 0, False
            if req.num_computed_tokens == 0:
                local = 0       # no local prefix cache in this engine: every hit is kvnode's
                ext, load_async = self.connector.get_num_new_matched_tokens(req, local)
                assert ext is not None and (ext > 0 or not load_async)
                assert local + ext < req.num_tokens, "the connector matched every token"
                computed = local + ext
            else:
                computed = req.num_computed_tokens      # after an asynchronous load
            if load_async:
                # the blocks for the load only; the request waits until it is reported
                if not self._allocate(req, computed):
                    break
                self.connector.update_state_after_alloc(req, KVCacheBlocks(req.block_ids), ext)
                req.waiting_for_remote = True
                req.num_external_computed_tokens = ext
                skipped.append(self.waiting.pop(0))
                continue
            n = min(self._chunk(req, computed), budget)
            if not self._allocate(req, computed + n):
                break
            self.connector.update_state_after_alloc(req, KVCacheBlocks(req.block_ids), ext)
            self.waiting.pop(0)
            self.running.append(req)
            req.num_computed_tokens = computed
            req.num_external_computed_tokens = ext
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = computed
            sync_loads |= ext > 0
            scheduled[req.request_id], start[req.request_id] = n, computed
            budget -= n
        self.waiting[:0] = skipped
        out = SchedulerOutput(scheduled, start,
                              {rid: list(self.requests[rid].block_ids) for rid in scheduled},
                              {rid: list(self.requests[rid].all_token_ids) for rid in scheduled},
                              self.finished_req_ids, preempted, sync_loads)
        self.finished_req_ids = set()
        out.kv_connector_metadata = self.connector.build_connector_meta(out)
        for rid, n in scheduled.items():
            self.requests[rid].num_computed_tokens += n
            self.computed[rid] += n
        return out

    def _invalid(self, invalid):
        """Requests whose loaded blocks failed: computed tokens cut at the first one
        (a request still loading asynchronously: remembered as failed)."""
        affected = set()
        for req in self.waiting:
            if not req.waiting_for_remote:
                continue
            for idx, b in enumerate(req.block_ids):
                if b in invalid:
                    req.num_computed_tokens = idx * self.block_size
                    req.num_external_computed_tokens = req.num_computed_tokens
                    self.failed_recving.add(req.request_id)
                    break
        for req in self.running:
            nblocks = -(-max(req.num_cached_tokens, 0) // self.block_size)
            for idx, b in enumerate(req.block_ids[:nblocks]):
                if b in invalid:
                    cut = idx * self.block_size
                    req.num_external_computed_tokens -= req.num_cached_tokens - cut
                    req.num_computed_tokens = cut
                    affected.add(req.request_id)
                    break
        return affected

    def sample(self, req):
        """The next token: a hash of the request's KV as the rank-0 paged cache holds it
        (every computed token's slot in every layer)."""
        w, h, bs = self.workers[0], hashlib.sha256(), self.block_size
        for name in self.layer_names:
            t = w.caches[name]
            for p in range(req.num_computed_tokens):
                b, off = req.block_ids[p // bs], p % bs
                # (packed: t[b, :, off] is (heads, K|V))
                slot = t[b, off] if t.dim() == 3 else (t[:, b, off] if t.shape[0] == 2 and
                                                       self.backend in SPLIT
                                                       else t[b, :, off])
                h.update(slot.contiguous().view(torch.uint8).numpy().tobytes())
        return int.from_bytes(h.digest()[:2], "little")

    def update_from_output(self, out, outputs):
        invalid = set().union(*[o.invalid_block_ids or set() for o in outputs])
        self.invalid_seen |= invalid
        affected = self._invalid(invalid) if invalid else set()
        for rid in out.num_scheduled_tokens:
            req = self.requests[rid]
            if rid in affected or req.num_computed_tokens < req.num_tokens:
                continue
            req.all_token_ids.append(self.sample(req))
            req.output_token_ids.append(req.all_token_ids[-1])
            req.update_hashes()
            if len(req.output_token_ids) >= req.max_tokens:
                self._finish(req)
        finished_sending, finished_recving = set(), set()
        for o in outputs:           # KVOutputAggregator: done when every worker said so
            for rid in o.finished_sending or ():
                self.sending_counts[rid] = self.sending_counts.get(rid, 0) + 1
                if self.sending_counts[rid] == len(outputs):
                    finished_sending.add(rid)
            for rid in o.finished_recving or ():
                self.recving_counts[rid] = self.recving_counts.get(rid, 0) + 1
                if self.recving_counts[rid] == len(outputs):
                    del self.recving_counts[rid]
                    finished_recving.add(rid)
            if o.kv_connector_stats is not None:
                self.stats.append(o.kv_connector_stats.data)
        self.connector.update_connector_output(KVConnectorOutput(finished_sending,
                                                                 finished_recving, invalid))
        self.finished_recving |= finished_recving
        for rid in finished_sending:
            self._free_blocks(self.requests.pop(rid))

    def _finish(self, req):
        req.finished = True
        self.running.remove(req)
        hold, _ = self.connector.request_finished(req, list(req.block_ids))
        self.finished_req_ids.add(req.request_id)
        if not hold:
            self._free_blocks(self.requests.pop(req.request_id))

    def step(self):
        out = self.schedule()
        outputs = [w.execute(out) for w in self.workers]
        self.update_from_output(out, outputs)
        return out

    def run(self, max_steps=200, between=None, idle_s=20.0, on_idle=None):
        """Step until every request is done and its blocks freed; between(i) after each
        step that computed something. Steps with nothing to compute (waiting for saves to
        be reported, as vLLM's engine core keeps stepping) do not count, for idle_s; on_idle()
        after each of them."""
        i, deadline = 0, time.monotonic() + idle_s
        while self.requests:
            out = self.step()
            if not out.num_scheduled_tokens:
                if time.monotonic() > deadline:
                    raise AssertionError("requests %s idle for %g s" % (list(self.requests),
                                                                        idle_s))
                if on_idle is not None:
                    on_idle()
                time.sleep(0.001)
                continue
            if between is not None:
                between(i)
            i += 1
            if i >= max_steps:
                raise AssertionError("requests still unfinished after %d steps: %s"
                                     % (max_steps, list(self.requests)))
        return i

    def shutdown(self):
        for w in self.workers:
            w.connector.shutdown()
        self.connector.shutdown()


def expected_block(engine, tokens, index, rank=0):
    """The bytes rank's cache must hold for block index of a request with these tokens."""
    e, bs = engine, engine.block_size
    kvs = [e.kv_of(tokens[:p + 1]) for p in range(index * bs, (index + 1) * bs)]
    out = []
    for li in range(len(e.layer_names)):
        if e.mla:
            out.append(torch.stack([kv[li] for kv in kvs]))
            continue
        h = e.heads // e.tp
        for kvi in (0, 1):
            out.append(torch.stack([kv[li, kvi, rank * h:(rank + 1) * h] for kv in kvs]))
    return b"".join(x.contiguous().view(torch.uint8).numpy().tobytes() for x in out)


def run_engine(extra_config, prompts, engine_kwargs=None, max_tokens=2):
    """One engine run to completion in this process: what a test compares (also the body of
    the other process of the two-engine cases)."""
    e = Engine(extra_config, **(engine_kwargs or {}))
    try:
        for rid, prompt in prompts.items():
            e.add(rid, prompt, max_tokens)
        reqs = dict(e.requests)
        e.run()
        return {"outputs": {rid: r.output_token_ids for rid, r in reqs.items()},
                "computed": dict(e.computed), "stats": e.stats,
                "counters": [w.connector.counters for w in e.workers],
                "movers": [type(w.connector._mover).__name__ for w in e.workers]}
    finally:
        e.shutdown()
