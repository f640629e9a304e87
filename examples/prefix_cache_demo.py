#!/usr/bin/env python3
"""Prefix caching with kvnode: a tiny numpy transformer that reuses another request's KV pages.

What it does
------------
A small decoder-only transformer (random weights from a fixed seed, RMSNorm, grouped-query
multi-head attention, a ReLU MLP, learned absolute positions; everything float32) keeps its
KV cache in *pages* of ``block_tokens`` tokens, the way vLLM's / SGLang's paged attention does:
a pool ``kv_pages[num_pages, 2, num_layers, block_tokens, kv_heads, head_dim]`` plus a block
table per request.  One page is exactly one kvnode block, so

    block_bytes = 2 * num_layers * block_tokens * kv_heads * head_dim * 4   (float32)

Two requests share a long prefix (a "system prompt") and differ in a few trailing tokens:

1. Request A arrives at a cold engine: it prefills its whole prompt, then saves the pages of its
   full blocks to kvnode (``client.write``: numpy writes each page straight into the daemon's
   shared memory; the write commits when the ``with`` block ends).
2. Request B hashes its prompt (``kvnode.hash_tokens``), asks how long a prefix is cached
   (``client.match``), reads those pages (``client.read``: ``np.frombuffer`` over each read-only
   memoryview, copied into the pages its block table points at) and prefills only the tokens
   after the cached prefix.

It prints both prefill times and checks request B's logits against a full recompute of B
without the cache.  Prefill runs in page-aligned chunks of ``block_tokens`` tokens, so every
token's K/V is computed by the same float32 operations, with the same shapes, in the same order
whether or not the prefix came from kvnode: the pages read back are bit-identical to what a
recompute produces, and the logits are expected to be *exactly* equal (``np.array_equal``).
The check that is required to pass is the looser ``np.allclose(rtol=1e-5, atol=1e-5)``; both
results are reported.

How this maps onto a real engine's KV-cache connector
-----------------------------------------------------
vLLM's KV connector API (and SGLang's HiCache / storage backends) split the work into a
scheduler side and a worker side.  The same kvnode calls go there:

* ``get_num_new_matched_tokens(request, num_computed_tokens)`` (scheduler) ->
  ``keys = kvnode.hash_tokens(request.prompt_token_ids, block_tokens)`` and
  ``client.match(keys) * block_tokens`` (leave at least one token to compute, as
  ``cached_prefix_blocks`` below does).  The scheduler then allocates pages for the request.
* ``start_load_kv`` / ``wait_for_layer_load`` (worker, "load_kv") ->
  ``with client.read(keys[:n]) as blocks:`` and copy each memoryview into the request's
  allocated pages (on a GPU: ``torch.frombuffer(mv, dtype=torch.uint8)`` into a pinned staging
  buffer, then ``page.copy_(..., non_blocking=True)``; with kvnode's HBM tier the block may
  already be device memory).  Here: ``load_pages``.
* ``save_kv_layer`` / ``wait_for_save`` (worker, "save_kv") ->
  ``with client.write(keys) as slots:`` and copy each finished page into its slot (``None``
  means another request already stored that block: skip it).  Here: ``save_pages``.
* With tensor parallelism every rank opens its own ``Client`` with its ``tp_rank`` in the
  layout and moves only its heads' slice of each page; the keys are the same on all ranks.

Running it
----------
It needs numpy and the kvnode package: Debian's ``/usr/bin/python3`` with ``python3-numpy``
(``make deps`` installs it) finds the package in the tree's ``python/`` by itself; another
``python3`` (a venv) needs ``pip install './python[numpy]'`` first. Start a daemon (``make run``;
it listens on ``run/kvnode.sock``), then, from the top of the tree::

    /usr/bin/python3 examples/prefix_cache_demo.py [--socket run/kvnode.sock] [--small]

``--via sglang`` goes through kvnode's SGLang HiCache storage backend instead
(``kvnode.sglang.KvnodeHiCacheStorage``, built as SGLang's ``dynamic`` factory builds it): the
page pool stands in for SGLang's host KV pool (``get_page_buffer_meta``: K and V pointer of
each page), keys are SGLang's chained SHA-256 strings, and the calls are the cache
controller's: ``batch_exists`` (prefix), ``batch_set_v1`` / ``batch_get_v1`` (zero-copy pages).

Request A never looks the prefix up (it plays the cold engine), so rerunning the demo against
a daemon that still holds the blocks gives the same result; its ``write`` just gets ``None`` slots.
"""

import argparse
import os
import sys
import time

import numpy as np

try:
    import kvnode
except ImportError:  # running from the source tree without PYTHONPATH=python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import kvnode


# ----------------------------------------------------------------------------- the model


class TinyConfig:
    def __init__(self, small):
        self.vocab = 256
        self.block_tokens = 16
        if small:
            self.num_layers, self.d_model, self.n_heads, self.kv_heads, self.head_dim = 2, 64, 4, 2, 16
            self.d_ff = 128
            self.prefix_blocks = 32     # 512 shared tokens
        else:
            self.num_layers, self.d_model, self.n_heads, self.kv_heads, self.head_dim = 4, 128, 8, 4, 16
            self.d_ff = 256
            self.prefix_blocks = 64     # 1024 shared tokens
        self.suffix_tokens = 5          # tokens after the shared prefix in each request
        self.max_pos = (self.prefix_blocks + 4) * self.block_tokens
        self.page_shape = (2, self.num_layers, self.block_tokens, self.kv_heads, self.head_dim)

    @property
    def block_bytes(self):
        return 2 * self.num_layers * self.block_tokens * self.kv_heads * self.head_dim * 4


class TinyTransformer:
    """Decoder-only transformer, float32, paged KV cache, chunked prefill."""

    def __init__(self, cfg, seed=1234):
        self.cfg = cfg
        rng = np.random.default_rng(seed)
        f32 = np.float32

        def w(*shape):
            return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(f32)

        c = cfg
        self.tok_emb = (rng.standard_normal((c.vocab, c.d_model)) * 0.5).astype(f32)
        self.pos_emb = (rng.standard_normal((c.max_pos, c.d_model)) * 0.1).astype(f32)
        self.layers = []
        for _ in range(c.num_layers):
            self.layers.append(dict(
                wq=w(c.d_model, c.n_heads * c.head_dim),
                wk=w(c.d_model, c.kv_heads * c.head_dim),
                wv=w(c.d_model, c.kv_heads * c.head_dim),
                wo=w(c.n_heads * c.head_dim, c.d_model),
                w1=w(c.d_model, c.d_ff),
                w2=w(c.d_ff, c.d_model),
            ))
        self.lm_head = w(c.d_model, c.vocab)
        self.scale = f32(1.0 / np.sqrt(c.head_dim))

    @staticmethod
    def _rmsnorm(x):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(1e-6))

    def forward_chunk(self, tokens, start, kv_pages, table):
        """Run tokens at positions start.. (start % block_tokens == 0, len <= block_tokens).

        Writes their K/V into page table[start // block_tokens] and returns their logits.
        """
        c = self.cfg
        n = len(tokens)
        page = table[start // c.block_tokens]
        end = start + n
        group = c.n_heads // c.kv_heads
        x = self.tok_emb[np.asarray(tokens)] + self.pos_emb[start:end]
        # causal mask of the chunk against everything up to its last token
        qpos = np.arange(start, end)[:, None]
        kpos = np.arange(end)[None, :]
        mask = np.where(kpos <= qpos, np.float32(0), np.float32(-np.inf)).astype(np.float32)
        npages = (end + c.block_tokens - 1) // c.block_tokens
        for li, L in enumerate(self.layers):
            h = self._rmsnorm(x)
            q = (h @ L["wq"]).reshape(n, c.n_heads, c.head_dim)
            k = (h @ L["wk"]).reshape(n, c.kv_heads, c.head_dim)
            v = (h @ L["wv"]).reshape(n, c.kv_heads, c.head_dim)
            off = start % c.block_tokens
            kv_pages[page, 0, li, off:off + n] = k
            kv_pages[page, 1, li, off:off + n] = v
            # gather this request's K/V through its block table (paged attention, the slow way)
            K = kv_pages[table[:npages], 0, li].reshape(-1, c.kv_heads, c.head_dim)[:end]
            V = kv_pages[table[:npages], 1, li].reshape(-1, c.kv_heads, c.head_dim)[:end]
            K = np.repeat(K, group, axis=1)            # (end, n_heads, hd)
            V = np.repeat(V, group, axis=1)
            s = np.einsum("qhd,khd->hqk", q, K) * self.scale + mask
            s = s - s.max(axis=-1, keepdims=True)
            p = np.exp(s)
            p = p / p.sum(axis=-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", p, V).reshape(n, c.n_heads * c.head_dim)
            x = x + o @ L["wo"]
            h = self._rmsnorm(x)
            x = x + np.maximum(h @ L["w1"], np.float32(0)) @ L["w2"]
        return self._rmsnorm(x) @ self.lm_head

    def prefill(self, tokens, kv_pages, table, start=0):
        """Prefill tokens[start:] in page-aligned chunks; K/V of tokens[:start] must be in place."""
        bt = self.cfg.block_tokens
        assert start % bt == 0
        logits = []
        for s in range(start, len(tokens), bt):
            logits.append(self.forward_chunk(tokens[s:s + bt], s, kv_pages, table))
        return np.concatenate(logits, axis=0)       # logits of tokens[start:]


# ----------------------------------------------------------------------------- the connector


def cached_prefix_blocks(client, keys, ntokens, block_tokens):
    """get_num_new_matched_tokens: cached prefix length in blocks, leaving >= 1 token to compute."""
    matched = client.match(keys) if keys else 0
    return min(matched, (ntokens - 1) // block_tokens)


def load_pages(client, keys, kv_pages, table, page_shape):
    """load_kv: read the cached blocks for keys into the pages table[0..len(keys)).

    Returns the number of blocks actually loaded (the cache may have shrunk since match).
    """
    loaded = 0
    with client.read(keys) as blocks:
        for i, mv in enumerate(blocks):
            if i >= len(keys):
                break
            # np.frombuffer wraps the daemon's shared memory without a copy; the assignment is the
            # one copy into the engine's KV cache.  No reference to the view outlives the lease.
            kv_pages[table[i]] = np.frombuffer(mv, dtype=np.float32).reshape(page_shape)
            loaded += 1
    return loaded


def save_pages(client, keys, kv_pages, table):
    """save_kv: write the pages table[0..len(keys)) under keys; returns how many were new."""
    written = 0
    with client.write(keys) as slots:
        for i, slot in enumerate(slots):
            if slot is None:          # already stored (by this or another engine)
                continue
            np.frombuffer(slot, dtype=np.float32)[:] = kv_pages[table[i]].ravel()
            written += 1
    return written


# ----------------------------------------------------------------------------- through SGLang's backend


class DemoHostPool:
    """The demo's page pool as SGLang's host KV pool shows itself to a storage backend."""

    def __init__(self, kv_pages, block_tokens):
        self.kv_pages = kv_pages
        self.page_size = block_tokens

    def get_page_buffer_meta(self, indices):
        """Per page (token indices, page_size per page): K pointer, V pointer; their sizes."""
        indices = list(indices.tolist())
        base = self.kv_pages.ctypes.data
        page_bytes = self.kv_pages[0].nbytes
        ptrs = []
        for i in range(0, len(indices), self.page_size):
            k = base + (indices[i] // self.page_size) * page_bytes
            ptrs += [k, k + page_bytes // 2]
        return ptrs, [page_bytes // 2] * len(ptrs)


def sglang_keys(tokens, block_tokens):
    """SGLang's storage keys: chained SHA-256 over each page's token ids."""
    import hashlib
    keys, prior = [], None
    for i in range(0, len(tokens) - len(tokens) % block_tokens, block_tokens):
        h = hashlib.sha256()
        if prior:
            h.update(bytes.fromhex(prior))
        for t in tokens[i:i + block_tokens]:
            h.update(int(t).to_bytes(4, "little", signed=False))
        prior = h.hexdigest()
        keys.append(prior)
    return keys


class SGLangConnector:
    """match / load / save of the demo through kvnode.sglang.KvnodeHiCacheStorage."""

    def __init__(self, socket_path, model_name, kv_pages, block_tokens):
        from kvnode.sglang import KvnodeHiCacheStorage
        self.bt = block_tokens
        config = dict(tp_rank=0, tp_size=1, is_mla_model=False, model_name=model_name,
                      extra_config=dict(backend_name="kvnode", module_path="kvnode.sglang",
                                        class_name="KvnodeHiCacheStorage", interface_v1=1,
                                        socket_path=socket_path))
        self.store = KvnodeHiCacheStorage(config, {})
        self.store.register_mem_pool_host(DemoHostPool(kv_pages, block_tokens))

    def _indices(self, table):
        return np.concatenate([np.arange(p * self.bt, (p + 1) * self.bt) for p in table])

    def keys(self, tokens):
        return sglang_keys(tokens, self.bt)

    def match(self, keys):
        return self.store.batch_exists(keys)

    def load(self, keys, table):
        return sum(self.store.batch_get_v1(keys, self._indices(table[:len(keys)])))

    def save(self, keys, table):
        return sum(self.store.batch_set_v1(keys, self._indices(table[:len(keys)])))

    def close(self):
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ----------------------------------------------------------------------------- the demo


def run_demo(socket_path, small=False, via="client"):
    """Serve two requests sharing a prefix through kvnode; return timings and the logits check.

    ``via`` "client": kvnode.Client's zero-copy leases; "sglang": the SGLang HiCache backend.

    Returns a dict: prefill_a_s, prefill_b_s (seconds; B's includes hash + match + read),
    save_a_s, prefix_tokens, prompt_b_tokens, matched_blocks, loaded_blocks, computed_tokens_b,
    max_abs_logit_diff, exact_equal, allclose (rtol=1e-5, atol=1e-5), equal (== allclose).
    """
    cfg = TinyConfig(small)
    model = TinyTransformer(cfg)
    bt = cfg.block_tokens
    layout = kvnode.Layout(
        model="prefix-cache-demo-%s" % ("small" if small else "base"),
        dtype="fp32",
        block_tokens=bt,
        block_bytes=cfg.block_bytes,
        num_layers=cfg.num_layers,
        kv_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        tp_size=1,
        tp_rank=0,
    )
    rng = np.random.default_rng(7)
    prefix = rng.integers(0, cfg.vocab, cfg.prefix_blocks * bt).tolist()
    prompt_a = prefix + rng.integers(0, cfg.vocab, cfg.suffix_tokens).tolist()
    prompt_b = prefix + rng.integers(0, cfg.vocab, cfg.suffix_tokens).tolist()
    assert prompt_a[len(prefix):] != prompt_b[len(prefix):]

    num_pages = 2 * (len(prompt_a) // bt + 2)
    kv_pages = np.zeros((num_pages,) + cfg.page_shape, dtype=np.float32)
    free = list(range(num_pages))

    def alloc(ntokens):
        return [free.pop() for _ in range((ntokens + bt - 1) // bt)]

    if via == "sglang":
        conn = SGLangConnector(socket_path, layout.model + "-sglang", kv_pages, bt)
    elif via == "client":
        conn = None
    else:
        raise ValueError("via must be 'client' or 'sglang', not %r" % via)

    def hash_keys(tokens):
        return conn.keys(tokens) if conn else kvnode.hash_tokens(tokens, bt)

    with (kvnode.Client(socket_path, layout) if conn is None else conn) as client:
        # ---- request A: cold prefill, then save its full blocks
        table_a = alloc(len(prompt_a))
        t0 = time.perf_counter()
        model.prefill(prompt_a, kv_pages, table_a)
        prefill_a = time.perf_counter() - t0
        t0 = time.perf_counter()
        keys_a = hash_keys(prompt_a)
        if conn:
            conn.save(keys_a, table_a)
        else:
            save_pages(client, keys_a, kv_pages, table_a)
        save_a = time.perf_counter() - t0
        free.extend(table_a)                 # request A finished: its pages go back to the pool

        # ---- request B: hash, match, load the cached prefix, prefill the rest
        kv_pages[:] = np.float32(np.nan)      # so a page that was not loaded cannot pass silently
        table_b = alloc(len(prompt_b))
        t0 = time.perf_counter()
        keys_b = hash_keys(prompt_b)
        matched = cached_prefix_blocks(client, keys_b, len(prompt_b), bt)
        if not matched:
            loaded = 0
        elif conn:
            loaded = conn.load(keys_b[:matched], table_b)
        else:
            loaded = load_pages(client, keys_b[:matched], kv_pages, table_b, cfg.page_shape)
        start = loaded * bt
        logits_b = model.prefill(prompt_b, kv_pages, table_b, start=start)
        prefill_b = time.perf_counter() - t0

    # ---- reference: request B recomputed from scratch, no cache
    ref_pages = np.zeros_like(kv_pages)
    ref_table = list(range(len(table_b)))
    t0 = time.perf_counter()
    ref_logits = model.prefill(prompt_b, ref_pages, ref_table)[start:]
    recompute_b = time.perf_counter() - t0

    diff = float(np.max(np.abs(logits_b - ref_logits)))
    close = bool(np.allclose(logits_b, ref_logits, rtol=1e-5, atol=1e-5))
    return dict(
        prefill_a_s=prefill_a,
        save_a_s=save_a,
        prefill_b_s=prefill_b,
        recompute_b_s=recompute_b,
        block_tokens=bt,
        prefix_tokens=len(prefix),
        prompt_a_tokens=len(prompt_a),
        prompt_b_tokens=len(prompt_b),
        matched_blocks=matched,
        loaded_blocks=loaded,
        computed_tokens_b=len(prompt_b) - start,
        max_abs_logit_diff=diff,
        exact_equal=bool(np.array_equal(logits_b, ref_logits)),
        allclose=close,
        equal=close,
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default="run/kvnode.sock", help="kvnoded socket (default: %(default)s)")
    ap.add_argument("--small", action="store_true", help="smaller model and prefix")
    ap.add_argument("--via", choices=("client", "sglang"), default="client",
                    help="kvnode.Client leases, or the SGLang HiCache backend (default: %(default)s)")
    args = ap.parse_args(argv)
    r = run_demo(args.socket, small=args.small, via=args.via)
    print("request A: prefill %4d tokens  %8.2f ms  (then saved its blocks in %.2f ms)"
          % (r["prompt_a_tokens"], r["prefill_a_s"] * 1e3, r["save_a_s"] * 1e3))
    print("request B: matched %d blocks (%d tokens), loaded %d, computed %d tokens  %8.2f ms"
          % (r["matched_blocks"], r["matched_blocks"] * r["block_tokens"], r["loaded_blocks"],
             r["computed_tokens_b"], r["prefill_b_s"] * 1e3))
    print("           full recompute of B without the cache                    %8.2f ms"
          % (r["recompute_b_s"] * 1e3))
    print("speedup of B's prefill: %.1fx" % (r["prefill_a_s"] / r["prefill_b_s"]))
    print("logits of B vs full recompute: max |diff| = %g, exactly equal: %s, "
          "allclose(rtol=1e-5, atol=1e-5): %s"
          % (r["max_abs_logit_diff"], r["exact_equal"], r["allclose"]))
    return 0 if r["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
