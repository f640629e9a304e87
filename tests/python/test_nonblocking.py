"""Never blocking on the daemon (issue 31, item 10): against a kvnoded paused with SIGSTOP
(its socket accepts, nothing answers) a fresh kvnode.AsyncClient's submits return at once and
complete with a timeout within about timeout_ms; kvnode.Client's connect is bounded by its
timeout_ms (before: libkvnode's 10 s, whatever timeout_ms said); after SIGCONT the next
submits succeed, byte-exact. The daemon is always resumed before it is stopped."""
import contextlib
import hashlib
import os
import select
import signal
import socket
import struct
import time

import pytest

import kvnode
from conftest import running_daemon

BB = 4096
TIMEOUT_MS = 400
# A submit does no I/O: 50 ms is the bound for "at once" (a paused daemon held
# the first submit of a fresh connector 10.01 s before).
AT_ONCE_S = 0.05
# A constructor starts threads and a background connect but waits for nothing: half of
# TIMEOUT_MS, so one that waited for the paused daemon (0.4 s at least) fails while a loaded
# 2-core machine's scheduling delays (constructor and two submits: 62 ms seen at load 6) do not.
CONSTRUCT_AT_ONCE_S = TIMEOUT_MS / 1000 / 2
# A connect bounded by TIMEOUT_MS ends long before libkvnode's default 10 s.
BOUNDED_S = 5.0


def layout(model="nonblocking"):
    return kvnode.Layout(model=model, dtype="u8", block_tokens=4, block_bytes=BB,
                         num_layers=1, kv_heads=1, head_dim=1)


def daemon_pid(sock):
    """The pid of the process serving on sock (SO_PEERCRED of a connection to it)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(sock)
        pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                     struct.calcsize("3i")))
    return pid


@contextlib.contextmanager
def daemon_with_pid(tmp_path):
    with running_daemon(str(tmp_path), str(tmp_path / "s.sock")) as sock:
        yield sock, daemon_pid(sock)


@contextlib.contextmanager
def paused(pid):
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_completions(c, want, limit_s=20):
    """Drain c until `want` completions came (polling its event_fd)."""
    done = []
    deadline = time.monotonic() + limit_s
    while len(done) < want:
        left = deadline - time.monotonic()
        assert left > 0, "only %d of %d completions in %d s" % (len(done), want, limit_s)
        select.select([c.event_fd], [], [], left)
        done += c.drain()
    return done


def keys_of(seed, n):
    return kvnode.hash_tokens([seed * 7919 + t for t in range(4 * n)], 4)


def test_client_connect_is_bounded_by_timeout_ms(tmp_path):
    with daemon_with_pid(tmp_path) as (sock, pid):
        with paused(pid):
            t0 = time.monotonic()
            with pytest.raises(kvnode.TimedOut) as e:
                kvnode.Client(sock, layout(), timeout_ms=TIMEOUT_MS)
            took = time.monotonic() - t0
        assert took < BOUNDED_S, "connect took %.2f s with timeout_ms=%d" % (took, TIMEOUT_MS)
        assert str(TIMEOUT_MS) in str(e.value)
        with kvnode.Client(sock, layout(), timeout_ms=TIMEOUT_MS) as c:   # resumed: fine
            c.put(keys_of(1, 1), [b"\x01" * BB])
            assert c.get(keys_of(1, 1)) == [b"\x01" * BB]


def test_bounded_connect_keeps_the_errors(tmp_path):
    """A connect run on the binding's thread fails as a direct one does: same class, the
    daemon's message."""
    with pytest.raises(kvnode.ConnectError) as e:
        kvnode.Client(str(tmp_path / "nope.sock"), layout(), timeout_ms=TIMEOUT_MS)
    assert "nope.sock" in e.value.message
    with daemon_with_pid(tmp_path) as (sock, pid):
        with kvnode.Client(sock, layout(), timeout_ms=TIMEOUT_MS):
            bad = kvnode.Layout(**dict(vars(layout()), block_bytes=2 * BB))
            with pytest.raises(kvnode.LayoutError) as e:
                kvnode.Client(sock, bad, timeout_ms=TIMEOUT_MS)
        assert "already registered with block_bytes %d" % BB in e.value.message


def test_async_client_submits_at_once_on_a_paused_daemon(tmp_path):
    with daemon_with_pid(tmp_path) as (sock, pid):
        keys = keys_of(2, 3)
        pages = [bytearray([i + 1]) * BB for i in range(3)]
        with paused(pid):
            t0 = time.monotonic()
            c = kvnode.AsyncClient(sock, layout(), timeout_ms=TIMEOUT_MS)
            t1 = time.monotonic()
            t_match = c.submit_match(keys)
            t_put = c.submit_put(keys, pages)
            took = time.monotonic() - t1
            assert t1 - t0 < CONSTRUCT_AT_ONCE_S, "the constructor took %.3f s" % (t1 - t0)
            assert took < AT_ONCE_S, "two submits took %.3f s" % took
            assert c.pending == 2
            done = wait_completions(c, 2)
            waited = time.monotonic() - t0
        assert waited < BOUNDED_S, "timeouts came after %.2f s (timeout_ms=%d)" % (
            waited, TIMEOUT_MS)
        assert sorted(d.ticket for d in done) == sorted([t_match, t_put])
        for d in done:
            assert isinstance(d.error, kvnode.TimedOut), d.error
            assert str(TIMEOUT_MS) in str(d.error)
        assert c.pending == 0
        # resumed: the connect (still on the binding's thread) completes; submits succeed
        try:
            t = c.submit_put(keys, pages)
            (d,) = wait_completions(c, 1)
            assert d.ticket == t and d.error is None, d.error
            out = [bytearray(BB) for _ in range(3)]
            t = c.submit_get(keys, out)
            t2 = c.submit_match(keys)
            done = {d.ticket: d for d in wait_completions(c, 2)}
            assert done[t].error is None and done[t].count == 3
            assert out == pages
            assert done[t2].count == 3
            assert c.connected
        finally:
            c.close()


def test_async_client_pause_after_connect(tmp_path):
    """A connected AsyncClient whose daemon pauses: submits still return at once and
    complete with the per-call timeout; after SIGCONT it reconnects by itself."""
    with daemon_with_pid(tmp_path) as (sock, pid):
        keys = keys_of(3, 2)
        pages = [bytes([9]) * BB, bytes([8]) * BB]
        with kvnode.AsyncClient(sock, layout(), timeout_ms=TIMEOUT_MS,
                                reconnect_interval_s=0.05) as c:
            t = c.submit_put(keys, pages)
            (d,) = wait_completions(c, 1)
            assert d.error is None
            with paused(pid):
                t0 = time.monotonic()
                tickets = [c.submit_match(keys) for _ in range(3)]
                took = time.monotonic() - t0
                assert took < AT_ONCE_S, "three submits took %.3f s" % took
                done = wait_completions(c, 3)
            assert sorted(d.ticket for d in done) == sorted(tickets)
            assert all(d.error is not None for d in done), done
            deadline = time.monotonic() + 10
            while True:      # the next submits succeed (after a reconnect if one was needed)
                t = c.submit_match(keys)
                (d,) = wait_completions(c, 1)
                if d.error is None:
                    break
                assert time.monotonic() < deadline, d.error
                time.sleep(0.05)
            assert d.count == 2


def test_async_client_daemon_down_fails_at_once_and_recovers(tmp_path):
    """No daemon at all: submits complete with ConnectError (never raise, never block);
    when a daemon comes up on the socket the client connects by itself."""
    sock = str(tmp_path / "s.sock")
    with kvnode.AsyncClient(sock, layout(), timeout_ms=TIMEOUT_MS,
                            reconnect_interval_s=0.05) as c:
        t0 = time.monotonic()
        t = c.submit_match(keys_of(4, 1))
        assert time.monotonic() - t0 < AT_ONCE_S
        (d,) = wait_completions(c, 1)
        assert d.ticket == t and isinstance(d.error, (kvnode.ConnectError, kvnode.TimedOut)), d
        with running_daemon(str(tmp_path), sock):
            deadline = time.monotonic() + 10
            while True:
                t = c.submit_put(keys_of(4, 1), [b"\x05" * BB])
                (d,) = wait_completions(c, 1)
                if d.error is None:
                    break
                assert time.monotonic() < deadline, d.error
                time.sleep(0.05)
            out = [bytearray(BB)]
            c.submit_get(keys_of(4, 1), out)
            (d,) = wait_completions(c, 1)
            assert d.error is None and d.count == 1 and out[0] == b"\x05" * BB


def test_async_client_checks_and_bad_pages(tmp_path):
    """Check words go with the keys when the daemon honours them; bad pages raise at
    submit (a caller's bug, not the daemon's state); close drops what is in flight."""
    with daemon_with_pid(tmp_path) as (sock, pid):
        with kvnode.AsyncClient(sock, layout(), timeout_ms=TIMEOUT_MS) as c:
            keys, checks = kvnode.fold_digests([hashlib.sha256(b"%d" % i).hexdigest()
                                                     for i in range(2)])
            c.submit_put(keys, [b"\x07" * BB] * 2, checks=checks)
            (d,) = wait_completions(c, 1)
            assert d.error is None
            c.submit_match(keys, checks=checks)
            (d,) = wait_completions(c, 1)
            assert d.count == 2
            if c.has_check_words:
                c.submit_match(keys, checks=[checks[0] ^ 1, checks[1]])
                (d,) = wait_completions(c, 1)
                assert d.count == 0
            with pytest.raises(ValueError):
                c.submit_put(keys, [b"\x07" * 10] * 2)
            with pytest.raises(ValueError):
                c.submit_get(keys, [bytearray(BB)])
            assert c.submit_match([]) and len(wait_completions(c, 1)) == 1
        with pytest.raises(kvnode.Closed):
            c.submit_match(keys)


def test_lmcache_connector_submit_on_a_paused_daemon(tmp_path):
    """LMCache's path: a fresh KvnodeL2Connector, its first submit while kvnoded is paused."""
    import kvnode.lmcache
    with daemon_with_pid(tmp_path) as (sock, pid):
        conn = kvnode.lmcache.KvnodeL2Connector(socket_path=sock, block_bytes=BB,
                                                timeout_ms=TIMEOUT_MS)
        try:
            with paused(pid):
                t0 = time.monotonic()
                conn.submit_batch_exists(["k%d" % i for i in range(3)])
                took = time.monotonic() - t0
            assert took < AT_ONCE_S, "the first submit took %.3f s" % took
        finally:
            conn.close()


def test_sglang_first_call_on_a_paused_daemon_is_bounded(tmp_path):
    """SGLang's path (synchronous calls): a fresh backend's first call while kvnoded is paused
    answers 'not cached' within about timeout_ms per page component, not libkvnode's 10 s."""
    from fake_sglang import HostPool, StorageConfig, create_dynamic_backend
    with daemon_with_pid(tmp_path) as (sock, pid):
        cfg = StorageConfig(tp_rank=0, tp_size=1, is_mla_model=False, model_name="nb",
                            extra_config=dict(backend_name="kvnode", module_path="kvnode.sglang",
                                              class_name="KvnodeHiCacheStorage", interface_v1=1,
                                              socket_path=sock, timeout_ms=TIMEOUT_MS))
        store = create_dynamic_backend(cfg)
        store.register_mem_pool_host(HostPool(8, 16))
        with paused(pid):
            t0 = time.monotonic()
            assert store.batch_exists(["ab" * 32]) == 0
            took = time.monotonic() - t0
        assert took < BOUNDED_S, "the first call took %.2f s with timeout_ms=%d" % (
            took, TIMEOUT_MS)
        store.close()


def test_async_client_threads_each_ticket_once(tmp_path):
    """Four threads submit while one drains: every ticket completes exactly once, every
    get reads back what its put stored."""
    import threading
    with daemon_with_pid(tmp_path) as (sock, pid):
        with kvnode.AsyncClient(sock, layout(), timeout_ms=5000) as c:
            submitted, lock, done = {}, threading.Lock(), []
            stop = threading.Event()

            def drainer():
                while not stop.is_set() or c.pending:
                    select.select([c.event_fd], [], [], 0.05)
                    done.extend(c.drain())

            def worker(w):
                for i in range(25):
                    keys = keys_of(1000 + w * 100 + i, 2)
                    pages = [bytes([w + 1, i + 1]) * (BB // 2)] * 2
                    t = c.submit_put(keys, pages)
                    with lock:
                        submitted[t] = ("put", None, None)
                    out = [bytearray(BB), bytearray(BB)]
                    t = c.submit_get(keys, out)
                    with lock:
                        submitted[t] = ("get", out, pages)
                    t = c.submit_match(keys)
                    with lock:
                        submitted[t] = ("match", None, None)

            d = threading.Thread(target=drainer)
            d.start()
            ws = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
            for w in ws:
                w.start()
            for w in ws:
                w.join()
            stop.set()
            d.join(30)
            assert not d.is_alive()
        tickets = [x.ticket for x in done]
        assert sorted(tickets) == sorted(submitted) and len(set(tickets)) == len(tickets)
        assert all(x.error is None for x in done), [x for x in done if x.error][:3]
        for x in done:      # a get submitted after its put may run first: a prefix, exact
            kind, out, pages = submitted[x.ticket]
            if kind == "get":
                assert out[:x.count] == [bytearray(p) for p in pages[:x.count]]
