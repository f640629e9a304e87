"""kvnode.vllm driven the way vLLM v1 drives a KV connector (issue 34), against a real
kvnoded: the scheduler's and the model runner's calls in their order (fake_vllm.py), with
torch CPU tensors as paged KV caches in the attention backends' shapes."""
import concurrent.futures
import dataclasses
import hashlib
import multiprocessing
import os
import subprocess
import sys
import threading

import pytest
import torch

import kvnode
import kvnode.vllm
from conftest import running_daemon
import fake_vllm
from fake_vllm import Engine, expected_block, run_engine

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PREFIX = list(range(1000, 1032))            # 8 blocks of 4 tokens


def extra(sock, **kw):
    cfg = {"socket_path": sock, "connect_wait_ms": 5000, "reconnect_interval_s": 0,
           "timeout_ms": 3000}
    cfg.update(kw)
    return cfg


@pytest.fixture
def daemon(tmp_path):
    with running_daemon(str(tmp_path), str(tmp_path / "s.sock")) as sock:
        yield sock


def other_process(fn, *args):
    """fn(*args) in a process of its own (spawned: a second vLLM instance)."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result(timeout=50)


def reference(prompts, engine_kwargs=None, max_tokens=2, sock="/nonexistent/kvnode.sock"):
    """What an engine computes with nothing loaded (no kvnoded there)."""
    return run_engine(extra(sock, connect_wait_ms=0), prompts, engine_kwargs, max_tokens)


def check_loaded(engine, req, nblocks, ranks=(0,)):
    """The first nblocks of req in each rank's paged cache are the prefix's bytes."""
    for r in ranks:
        w = engine.workers[r]
        for i in range(nblocks):
            assert w.block_bytes(req.block_ids[i]) == \
                expected_block(engine, req.all_token_ids, i, r), "rank %d block %d" % (r, i)


def test_module_imports_without_vllm():
    assert kvnode.vllm.HAVE_VLLM is False and "vllm" in kvnode.vllm.VLLM_IMPORT_ERROR
    assert issubclass(kvnode.vllm.KvnodeConnector, kvnode.vllm.KVConnectorBase_V1)
    assert kvnode.vllm.KvnodeConnector.get_required_kvcache_layout(None) == "NHD"


@pytest.mark.parametrize("first,second", [("flash_attn", "flash_attn"),
                                          ("flash_attn", "flashinfer"), ("mla", "mla"),
                                          ("flash_attn+cross", "flashinfer"),
                                          ("flashinfer", "flash_attn+cross"),
                                          ("mla+cross", "mla+cross"),
                                          ("packed", "flash_attn"), ("flashinfer", "packed"),
                                          ("packed+cross", "flash_attn"),
                                          ("flash_attn+cross", "packed+cross"),
                                          ("flash_attn", "flashinfer_hnd"),
                                          ("flashinfer_hnd", "flash_attn_hnd"),
                                          ("flash_attn_hnd", "packed"),
                                          ("flashinfer_hnd", "flash_attn+cross")])
def test_two_engines_share_a_prefix(daemon, first, second):
    """Engine A (another process) serves prefix+a; engine B, prefix+b, loads A's 8 prefix
    blocks byte-exact and computes only its suffix; its output is what it computes alone."""
    a = other_process(run_engine, extra(daemon), {"a": PREFIX + [1, 2, 3, 4, 5, 6]},
                      {"backend": first})
    assert a["counters"][0]["blocks_saved"] == 9 and a["computed"]["a"] == 39
    # a cross-layer cache moves whole blocks, but for the K|V-packed one (pieces)
    mover = {True: "_WholeBlocks", False: "_GatheredBlocks"}
    assert a["movers"] == [mover["+cross" in first and "packed" not in first]]
    prompt = PREFIX + [7, 8, 9]
    e = Engine(extra(daemon), backend=second)
    try:
        assert type(e.workers[0].connector._mover).__name__ == \
            mover["+cross" in second and "packed" not in second]
        req = e.add("b", prompt)
        seen = {}

        def after(i):
            if i == 0:
                check_loaded(e, req, 8)
                seen["ok"] = True
        e.run(between=after)
        assert seen == {"ok": True}
        assert e.computed["b"] == len(prompt) - 32 + 1     # the suffix, then one decode step
        assert req.num_cached_tokens == 32 and not e.invalid_seen
        assert e.workers[0].connector.counters["blocks_loaded"] == 8
        assert sum(s.get("blocks_loaded", 0) for s in e.stats) == 8
        outputs = req.output_token_ids
    finally:
        e.shutdown()
    assert outputs == reference({"b": prompt}, {"backend": second})["outputs"]["b"]


@pytest.mark.parametrize("tp,transfer_results", [(1, True), (2, True), (1, False)])
def test_asynchronous_load(daemon, tp, transfer_results):
    """async_load_min_blocks 4: an 8-block hit loads on the workers' threads while the
    request waits (vLLM's WAITING_FOR_REMOTE_KVS); get_transfer_results (older vLLM:
    get_finished) reports it from every worker, then the request computes only its
    suffix; the bytes are the first engine's."""
    run_engine(extra(daemon), {"a": PREFIX + [1, 2]},
               {"tp": tp, "transfer_results": transfer_results})
    prompt = PREFIX + [7, 8, 9]
    e = Engine(extra(daemon, async_load_min_blocks=4), tp=tp, transfer_results=transfer_results)
    try:
        req = e.add("b", prompt)
        assert e.connector.get_num_new_matched_tokens(req, 0) == (32, True)
        out = e.step()
        assert out.num_scheduled_tokens == {} and req.waiting_for_remote
        assert not out.has_sync_kv_loads
        e.run(between=lambda i: i == 0 and check_loaded(e, req, 8, ranks=range(tp)))
        assert e.computed["b"] == len(prompt) - 32 + 1 and not e.invalid_seen
        assert [w.connector.counters["blocks_loaded"] for w in e.workers] == [8] * tp
        got = req.output_token_ids
    finally:
        e.shutdown()
    assert got == reference({"b": prompt}, {"tp": tp})["outputs"]["b"]


def test_asynchronous_load_error(daemon):
    """An asynchronous load missing block 5: blocks 5-7 reported with the request's
    finished_recving; vLLM computes from block 5 on."""
    run_engine(extra(daemon), {"a": PREFIX + [1, 2]})
    prompt = PREFIX + [3]
    e = Engine(extra(daemon, async_load_min_blocks=1))
    try:
        req = e.add("b", prompt)
        out = e.schedule()
        assert req.waiting_for_remote
        ids = list(req.block_ids)
        with kvnode.Client(daemon, e.connector._link.layout) as c:
            keys, checks = kvnode.fold_digests([h.hex() for h in req.block_hashes[:8]])
            assert c.delete_each([keys[5]], checks=[checks[5]]) == [True]
        e.update_from_output(out, [w.execute(out) for w in e.workers])
        e.run(between=lambda i: i == 0 and check_loaded(e, req, 5))
        assert e.invalid_seen == set(ids[5:8])
        assert e.computed["b"] == len(prompt) - 20 + 1
        got = req.output_token_ids
    finally:
        e.shutdown()
    assert got == reference({"b": prompt})["outputs"]["b"]


def test_match_never_covers_the_last_prompt_token(daemon):
    """A prompt stored whole: vLLM must still compute its last token (one block less)."""
    prompt = PREFIX[:16]
    run_engine(extra(daemon), {"a": prompt}, max_tokens=4)
    e = Engine(extra(daemon))
    try:
        req = e.add("b", prompt)
        ext, load_async = e.connector.get_num_new_matched_tokens(req, 0)
        assert (ext, load_async) == (12, False)
        assert e.connector.get_num_new_matched_tokens(req, 12) == (0, False)
        assert e.connector.get_num_new_matched_tokens(req, 0) == (12, False)   # no side effect
    finally:
        e.shutdown()


def test_match_starts_past_the_local_prefix(daemon):
    """vLLM's own prefix cache holds the first blocks: the MATCH asks about the blocks past
    them only, so kvnode need not hold those (block 0 deleted: still 4 blocks matched)."""
    run_engine(extra(daemon), {"a": PREFIX + [1]})
    e = Engine(extra(daemon))
    try:
        req = e.add("b", PREFIX + [2])
        assert e.connector.get_num_new_matched_tokens(req, 16) == (16, False)
        with kvnode.Client(daemon, e.connector._link.layout) as c:
            keys, checks = kvnode.fold_digests([h.hex() for h in req.block_hashes[:1]])
            assert c.delete_each(keys, checks=checks) == [True]
        assert e.connector.get_num_new_matched_tokens(req, 0) == (0, False)
        assert e.connector.get_num_new_matched_tokens(req, 16) == (16, False)
        e.connector.update_state_after_alloc(req, fake_vllm.KVCacheBlocks(range(8)), 16)
        loads = e.connector.build_connector_meta(None).loads
        assert [(ld.block_ids, len(ld.keys)) for ld in loads] == [([4, 5, 6, 7], 4)]
    finally:
        e.shutdown()


def test_tp2_workers_keep_their_own_heads(daemon):
    """TP 2: each rank saves and loads its half of the heads, in its own namespace."""
    a = other_process(run_engine, extra(daemon), {"a": PREFIX + [1, 2]}, {"tp": 2})
    assert [c["blocks_saved"] for c in a["counters"]] == [8, 8]
    prompt = PREFIX + [5, 6, 7]
    e = Engine(extra(daemon), tp=2)
    try:
        req = e.add("b", prompt)
        e.run(between=lambda i: i == 0 and check_loaded(e, req, 8, ranks=(0, 1)))
        assert e.computed["b"] == len(prompt) - 32 + 1
        assert [w.connector.counters["blocks_loaded"] for w in e.workers] == [8, 8]
        outputs = req.output_token_ids
    finally:
        e.shutdown()
    assert outputs == reference({"b": prompt}, {"tp": 2})["outputs"]["b"]


def test_match_is_what_every_tp_rank_holds(daemon):
    """TP 2 with rank 1 missing block 5: the scheduler matches 5 blocks (the prefix both
    ranks hold), so no worker reports a load error."""
    run_engine(extra(daemon), {"a": PREFIX + [1, 2]}, {"tp": 2})
    prompt = PREFIX + [3]
    e = Engine(extra(daemon), tp=2)
    try:
        req = e.add("b", prompt)
        with kvnode.Client(daemon, e.workers[1].connector._link.layout) as c:
            keys, checks = kvnode.fold_digests([h.hex() for h in req.block_hashes[:8]])
            assert c.delete_each([keys[5]], checks=[checks[5]]) == [True]
        e.run()
        assert req.num_cached_tokens == 20 and not e.invalid_seen
        assert [w.connector.counters["blocks_loaded"] for w in e.workers] == [5, 5]
        assert e.computed["b"] == len(prompt) - 20 + 1
        got = req.output_token_ids
    finally:
        e.shutdown()
    assert got == reference({"b": prompt}, {"tp": 2})["outputs"]["b"]


def test_load_error_is_reported_and_recomputed(daemon):
    """A block gone between the scheduler's MATCH and the worker's load: it and the blocks
    after it are reported (vLLM recomputes from there), never left half-written."""
    run_engine(extra(daemon), {"a": PREFIX + [1, 2]})
    prompt = PREFIX + [3]
    e = Engine(extra(daemon))
    try:
        req = e.add("b", prompt)
        out = e.schedule()
        assert out.has_sync_kv_loads and req.num_external_computed_tokens == 32
        with kvnode.Client(daemon, e.connector._link.layout) as c:
            keys, checks = kvnode.fold_digests([h.hex() for h in req.block_hashes[:8]])
            assert c.delete_each([keys[5]], checks=[checks[5]]) == [True]
        w = e.workers[0]
        before = [w.block_bytes(b) for b in req.block_ids[5:8]]
        outputs = [w.execute(out) for w in e.workers]
        assert outputs[0].invalid_block_ids == set(req.block_ids[5:8])
        assert [w.block_bytes(b) for b in req.block_ids[5:8]] == before     # untouched
        check_loaded(e, req, 5)
        e.update_from_output(out, outputs)
        assert req.num_computed_tokens == 20 and req.output_token_ids == []
        e.run()
        assert e.computed["b"] == (len(prompt) - 32) + (len(prompt) - 20) + 1
        assert w.connector.counters["load_error_blocks"] == 3
        got = req.output_token_ids
    finally:
        e.shutdown()
    assert got == reference({"b": prompt})["outputs"]["b"]


def test_preemption_while_a_save_holds_blocks(daemon):
    """R1 finishes and its save (on the worker's thread: inline_save_bytes 0) is slow: vLLM
    holds R1's blocks until get_finished reports it, so R2 (decoding, out of blocks) is
    preempted rather than given R1's blocks; R2 re-matches when readmitted; R1's saved
    blocks are its own bytes."""
    release = threading.Event()
    e = Engine(extra(daemon, inline_save_bytes=0), num_blocks=12)
    try:
        w = e.workers[0]
        real_save = w.connector._save

        def slow_save(save):
            assert release.wait(20)
            real_save(save)
        w.connector._save = slow_save
        r1 = e.add("r1", PREFIX[:20], max_tokens=1)
        r2 = e.add("r2", PREFIX[:16] + list(range(2000, 2006)), max_tokens=8)

        def between(*_):
            if "r2" in e.preempted:     # preempted: R1's blocks stay held; the save may end
                release.set()
        e.run(between=between, on_idle=between)
        assert "r2" in e.preempted and r2.num_preemptions == 1
        assert w.connector.counters["blocks_saved"] == 5 + 7
        r1_tokens = r1.all_token_ids
    finally:
        release.set()
        e.shutdown()
    e = Engine(extra(daemon))
    try:
        req = e.add("b", r1_tokens[:20] + [77])
        e.run(between=lambda i: i == 0 and check_loaded(e, req, 5))
        assert e.workers[0].connector.counters["blocks_loaded"] == 5
    finally:
        e.shutdown()


def record_steps(engine):
    """Make engine.step log, per step, the request ids whose saves its metadata carried and
    those its workers reported in finished_sending (every worker's)."""
    log = []

    def step():
        out = engine.schedule()
        outputs = [w.execute(out) for w in engine.workers]
        log.append(({t.req_id for t in out.kv_connector_metadata.saves},
                    set.intersection(*[set(o.finished_sending or ()) for o in outputs])))
        engine.update_from_output(out, outputs)
        return out
    engine.step = step
    return log


def record_save_threads(connector):
    """[(request id, the thread that made its save)] as the connector makes them."""
    made, real_save = [], connector._save

    def save(transfer):
        made.append((transfer.req_id, threading.current_thread()))
        real_save(transfer)
    connector._save = save
    return made


@pytest.mark.parametrize("mode", [{}, {"no_forward_wait_for_save": False},
                                  {"defer_finalize": True}])
def test_small_saves_are_made_on_vllms_thread(daemon, mode):
    """A save within inline_save_bytes (default 8 MiB) is made on vLLM's thread when the
    step ends (wait_for_save; get_finished when vLLM asks it first, after a draft model's
    forward, or without wait_for_save, as older vLLM in a step with nothing to compute), so
    the step that carried it reports it; its blocks load byte-exact in another engine."""
    e = Engine(extra(daemon), **mode)
    try:
        made = record_save_threads(e.workers[0].connector)
        log = record_steps(e)
        e.add("r1", PREFIX[:20], max_tokens=1)
        if not mode.get("no_forward_wait_for_save", True):
            e.run(idle_s=5)     # nothing else runs: the save's step has no forward
            want, blocks = ["r1"], 5
        else:
            # r2 decodes meanwhile (its 13 computed tokens: 3 blocks saved when it ends)
            e.add("r2", list(range(3000, 3010)), max_tokens=4)
            e.run()
            want, blocks = ["r1", "r2"], 5 + 3
        assert made == [(rid, threading.main_thread()) for rid in want]
        carried = [(saves, sent) for saves, sent in log if saves]
        assert [rid for saves, _ in carried for rid in sorted(saves)] == want, log
        assert all(saves <= sent for saves, sent in carried), log
        assert e.workers[0].connector.counters["blocks_saved"] == blocks
    finally:
        e.shutdown()
    e = Engine(extra(daemon))
    try:
        req = e.add("b", PREFIX[:20] + [9])
        e.run(between=lambda i: i == 0 and check_loaded(e, req, 5))
        assert e.workers[0].connector.counters["blocks_loaded"] == 5
    finally:
        e.shutdown()


def test_saves_over_inline_save_bytes_go_to_the_workers_thread(daemon):
    """Two requests finish in one step, inline_save_bytes holding one's blocks: the first
    save is made on vLLM's thread, the second on the worker's; both are stored and
    reported."""
    probe = Engine(extra(daemon))
    block_bytes = probe.workers[0].connector._mover.block_bytes
    probe.shutdown()
    e = Engine(extra(daemon, inline_save_bytes=5 * block_bytes))
    try:
        w = e.workers[0].connector
        made = record_save_threads(w)
        e.add("r1", PREFIX[:20], max_tokens=1)
        e.add("r2", PREFIX[12:32], max_tokens=1)
        e.run()
        assert [rid for rid, _ in made] == ["r1", "r2"]
        assert made[0][1] is threading.main_thread()
        assert made[1][1] is not threading.main_thread() and made[1][1].name == "kvnode-vllm-io"
        assert w.counters["blocks_saved"] == 10 and not e.requests
    finally:
        e.shutdown()


def test_preemption_while_an_inline_save_holds_blocks(daemon):
    """R1 finishes when no block is free: vLLM holds its blocks through the next step, whose
    save is made on vLLM's thread, so R2 (decoding, out of blocks in that step) is
    preempted rather than given R1's blocks; readmitted, R2 loads the 4 blocks it shares
    with R1 and computes what R1 did not."""
    prompt2 = PREFIX[:16] + list(range(2000, 2008))
    e = Engine(extra(daemon), num_blocks=11)
    try:
        made = record_save_threads(e.workers[0].connector)
        e.add("r1", PREFIX[:20], max_tokens=1)
        r2 = e.add("r2", prompt2, max_tokens=3)
        seen = {}

        def between(i):
            if r2.num_preemptions and r2.num_external_computed_tokens and "ok" not in seen:
                check_loaded(e, r2, 4)
                seen["ok"] = True
        e.run(between=between)
        assert "r2" in e.preempted and r2.num_preemptions == 1
        assert made[0] == ("r1", threading.main_thread())
        assert seen == {"ok": True} and r2.num_external_computed_tokens == 16
        got = r2.output_token_ids
    finally:
        e.shutdown()
    assert got == reference({"r2": prompt2}, {"num_blocks": 11}, max_tokens=3)["outputs"]["r2"]


def test_daemon_restart_mid_request(tmp_path):
    """kvnoded restarts while a request runs: nothing raises, the save to the old daemon is
    dropped and counted or lands in the new one, and the connector reconnects by itself:
    the next request's save lands, a third loads it."""
    sock = str(tmp_path / "s.sock")
    prompt = PREFIX + [1, 2]
    e = Engine(extra(sock), long_prefill=8)
    stack = [running_daemon(str(tmp_path), sock)]
    stack[0].__enter__()
    try:
        e.add("r1", prompt)

        def restart(i):
            if i == 1:
                stack[0].__exit__(None, None, None)
                stack[0] = running_daemon(str(tmp_path), sock)
                stack[0].__enter__()
        e.run(between=restart)
        w = e.workers[0].connector
        assert w.counters["blocks_saved"] + w.counters["saves_dropped_blocks"] == 8
        e.add("r2", prompt)
        e.run()
        e.add("r3", prompt + [3])
        e.run()
        assert e.computed["r3"] == len(prompt) + 1 - 32 + 1
        assert w.counters["blocks_loaded"] == 8
    finally:
        e.shutdown()
        stack[0].__exit__(None, None, None)


def test_daemon_down_never_raises(tmp_path):
    """No kvnoded at all: no match, every save dropped and counted, requests still finish."""
    e = Engine(extra(str(tmp_path / "none.sock"), connect_wait_ms=50))
    try:
        e.add("r1", PREFIX + [1])
        e.run()
        assert e.computed["r1"] == 33 + 1
        assert e.workers[0].connector.counters["saves_dropped_blocks"] == 8
        assert e.connector.reset_cache() is False
    finally:
        e.shutdown()


def test_reset_cache_purges_the_deployment(daemon):
    run_engine(extra(daemon), {"a": PREFIX + [1]}, {"tp": 2})
    e = Engine(extra(daemon), tp=2)
    try:
        req = e.add("b", PREFIX + [2])
        assert e.connector.get_num_new_matched_tokens(req, 0) == (32, False)
        assert e.connector.reset_cache() is True
        assert e.connector.get_num_new_matched_tokens(req, 0) == (0, False)
    finally:
        e.shutdown()


def test_failure_policy_fail_is_warned_about(daemon, caplog):
    for policy, warned in (("fail", True), ("recompute", False)):
        caplog.clear()
        Engine(extra(daemon), failure_policy=policy).shutdown()
        assert ('kv_load_failure_policy is "fail"' in caplog.text) is warned, policy


def test_unknown_extra_config_refused(daemon):
    with pytest.raises(ValueError, match="unknown kv_connector_extra_config keys 'sock'"):
        Engine({"sock": daemon})


def test_model_revision_keeps_namespaces_apart(daemon):
    run_engine(extra(daemon, model_revision="r1"), {"a": PREFIX + [1]})
    for rev, want in (("r2", 0), ("r1", 32)):
        e = Engine(extra(daemon, model_revision=rev))
        try:
            req = e.add("b", PREFIX + [2])
            assert e.connector.get_num_new_matched_tokens(req, 0) == (want, False)
        finally:
            e.shutdown()


def test_block_hashes_fold_as_fold_digests_of_their_hex():
    """The raw-bytes fold of vLLM's SHA-256 block hashes gives kvnode.fold_digests' keys
    and check words of their hex digits (any hash length folds the same way)."""
    for size in (32, 16, 8):
        hashes = [hashlib.sha256(b"%d" % i).digest()[:size] for i in range(5)]
        k1, c1 = kvnode.vllm._fold_hashes(hashes)
        k2, c2 = kvnode.fold_digests([h.hex() for h in hashes])
        assert (list(k1), list(c1)) == (list(k2), list(c2)), size


def test_unmovable_cache_drops_saves_and_finishes(daemon, caplog):
    """A worker whose KV cache the connector cannot move (here a head's vector is not one
    run of memory) still reports the saves the scheduler planned (dropped, counted), so vLLM
    frees their blocks and the requests finish; nothing is stored."""
    prompts = {"a": PREFIX + [1, 2, 3, 4, 5, 6]}
    a = run_engine(extra(daemon), prompts, {"backend": "dim_strided"})
    assert a["outputs"] == reference(prompts, {"backend": "dim_strided"})["outputs"]
    assert a["movers"] == ["NoneType"]
    assert a["counters"][0]["saves_dropped_blocks"] == 9
    assert a["counters"][0]["blocks_saved"] == 0
    assert "register_kv_caches failed" in caplog.text and \
        "not one run of memory" in caplog.text


def test_hybrid_model_runs_without_the_connector(daemon, caplog):
    """Two KV cache groups (a hybrid model): logged; no match, no save, nothing raised."""
    run_engine(extra(daemon), {"a": PREFIX + [1]})
    e = Engine(extra(daemon), hybrid=True)
    try:
        e.add("r1", PREFIX + [1])
        e.run()
        assert e.computed["r1"] == 34
        assert e.workers[0].connector.counters["blocks_saved"] == 0
        assert "2 KV cache groups" in caplog.text
    finally:
        e.shutdown()


def test_pipeline_stages_keep_their_own_namespaces(daemon):
    """PP 2 over 3 layers: stage 0 holds 2 (vLLM's split), stage 1 one; each stage's worker
    has a namespace of its own (extra /pp<rank>-2, its layer count), and the scheduler
    MATCHes in both."""
    f = fake_vllm
    e = Engine(extra(daemon), layers=3)
    try:
        cfg = e.config
        layouts = []
        for rank, names in ((0, e.layer_names[:2]), (1, e.layer_names[2:])):
            c = dataclasses.replace(cfg, parallel_config=f.ParallelConfig(
                tensor_parallel_size=1, pipeline_parallel_size=2, rank=rank))
            w = f.create_connector(c, "WORKER", e.kv_cache_config)
            w.register_kv_caches({n: torch.zeros(2, e.num_blocks, e.block_size, e.heads,
                                                  e.head_dim, dtype=e.dtype) for n in names})
            layouts.append(w._link.layout)
            w.shutdown()
        c = dataclasses.replace(cfg, parallel_config=f.ParallelConfig(
            tensor_parallel_size=1, pipeline_parallel_size=2))
        sched = f.create_connector(c, "SCHEDULER", e.kv_cache_config)
        assert [(lay.num_layers, lay.extra) for lay in layouts] == \
            [(2, "vllm/kv/pp0-2"), (1, "vllm/kv/pp1-2")]
        assert [link.layout for link in sched._links] == layouts     # MATCHes both stages
        assert layouts[0].block_bytes == 2 * layouts[1].block_bytes
        sched.shutdown()
    finally:
        e.shutdown()


@pytest.mark.parametrize("pairs", ["nhd-hnd", "hnd-nhd,cross", "packed-hnd,nhd-packed",
                                   "pcross-hnd"])
def test_device_caches_on_the_simulated_gpu(daemon, tmp_path, pairs):
    """Per-layer KV caches in GPU memory (FlashAttention's NHD split, FlashInfer's HND
    stacked, the K|V-packed one; and the cross-layer ones, whole and K|V-packed) on the
    strict fake CUDA: tests/gpu/vllm_device.py (the
    driver of scripts/gpu-check.sh's vllm behaviour) in a process of its own, whose loader
    finds the fake (LD_LIBRARY_PATH) and whose libkvnode declares the tensors' device. One
    engine saves from its cache, another loads into its own, byte-exact in kvnode's block
    order (an NHD and an HND engine share blocks), with libkvnode's device copies: a load
    with cudaMemcpyAsync failing reports every block as a load error."""
    lib = os.environ.get("KVNODE_LIBRARY") or os.path.join(ROOT, "build", "libkvnode.so.0")
    fake = os.path.join(os.path.dirname(os.path.abspath(lib)), "tests", "fakecuda")
    if not os.path.exists(os.path.join(fake, "libcudart.so")):
        pytest.fail("the strict fake CUDA is not built at %s (make all)" % fake)
    state = tmp_path / "fake"
    state.mkdir()
    env = dict(os.environ, FAKECUDA_DIR=str(state), KVNODE_LIBRARY=lib,
               LD_LIBRARY_PATH=fake + (":" + os.environ["LD_LIBRARY_PATH"]
                                       if os.environ.get("LD_LIBRARY_PATH") else ""))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gpu", "vllm_device.py"),
                          "--socket", daemon, "--device", "0", "--blocks", "4", "--rounds", "1",
                          "--pairs", pairs], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "RESULT PASS" in out.stdout, out.stdout + out.stderr
    violations = state / "violations"
    assert not violations.exists() or violations.read_text() == "", violations.read_text()
