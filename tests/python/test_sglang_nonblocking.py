"""kvnode.sglang never blocks on the daemon (issue 31, item 10, SGLang's side): SGLang calls
the backend from its cache controller's threads while holding its own locks, so against a
kvnoded paused with SIGSTOP (its socket accepts, nothing answers) a fresh backend's first
batch_exists / batch_get_v1 answer a miss at once (before: each waited for a connect bounded
only by timeout_ms per page component, K and V, under the backend's lock) while the connect
runs on a thread of its own; after SIGCONT the calls succeed, byte-exact."""
import logging
import time

from fake_sglang import create_dynamic_backend
from test_nonblocking import TIMEOUT_MS, AT_ONCE_S, daemon_with_pid, paused
from test_sglang_engine import EngineConfig, MHAHost, fill_, indices, keys_for, raw

LIMIT_S = 20


def backend(sock, **extra):
    extra.update(backend_name="kvnode", module_path="kvnode.sglang",
                 class_name="KvnodeHiCacheStorage", interface_v1=1, socket_path=sock)
    return create_dynamic_backend(EngineConfig(extra_config=extra, model_name="nb-sgl"))


def test_sglang_first_calls_on_a_paused_daemon_return_at_once(tmp_path, caplog):
    with daemon_with_pid(tmp_path) as (sock, pid):
        src, dst = MHAHost("page_first"), MHAHost("page_first")
        for slot in range(1, 3):
            fill_(src.page(slot), seed=slot)
        # The writer only prepares the blocks: it may wait for its connect (under ASan on
        # a loaded machine the 20 ms default ran out and the set answered [False, False]).
        writer = backend(sock, connect_wait_ms=10000)
        writer.register_mem_pool_host(src)
        keys = keys_for(3, 2)
        assert writer.batch_set_v1(keys, indices(1, 2)) == [True] * 2
        writer.close()
        with paused(pid), caplog.at_level(logging.WARNING, logger="kvnode.sglang"):
            store = backend(sock, timeout_ms=TIMEOUT_MS)
            store.register_mem_pool_host(dst)
            t0 = time.monotonic()
            hit = store.batch_exists(keys)
            took_exists = time.monotonic() - t0
            t0 = time.monotonic()
            got = store.batch_get_v1(keys, indices(4, 2))
            took_get = time.monotonic() - t0
        assert hit == 0 and got == [False] * 2
        assert took_exists < AT_ONCE_S, "the first batch_exists took %.3f s" % took_exists
        assert took_get < AT_ONCE_S, "the first batch_get_v1 took %.3f s" % took_get
        assert any("kvnode.sglang" in r.getMessage() for r in caplog.records), \
            "no log of the miss"
        # resumed: the connect (or a retry) completes and the calls succeed, byte-exact
        deadline = time.monotonic() + LIMIT_S
        while store.batch_exists(keys) != 2:
            assert time.monotonic() < deadline, "no connection %d s after SIGCONT" % LIMIT_S
            time.sleep(0.05)
        assert store.batch_get_v1(keys, indices(4, 2)) == [True] * 2
        for i in range(2):
            assert raw(dst.page(4 + i)) == raw(src.page(1 + i))
        store.close()
