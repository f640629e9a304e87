"""kvnode.lmcache (LMCache MP native_plugin connector) driven as LMCache's native connector
adapter drives it: built from adapter_params, a poll loop on event_fd, memoryviews, against a
real kvnoded: round trips, exists, delete, a daemon restart, concurrent submitters."""
import importlib
import select
import threading
import time

import pytest

from conftest import running_daemon

CHUNK = 64 * 1024


def connector(sock, **params):
    """_create_native_plugin_l2_adapter: import module_path, class_name(**adapter_params),
    check the six methods."""
    cfg = {"type": "native_plugin", "module_path": "kvnode.lmcache",
           "class_name": "KvnodeL2Connector",
           "adapter_params": dict(socket_path=sock, model="lmc-test", block_bytes=CHUNK, **params)}
    cls = getattr(importlib.import_module(cfg["module_path"]), cfg["class_name"])
    conn = cls(**cfg["adapter_params"])
    for m in ("event_fd", "submit_batch_get", "submit_batch_set", "submit_batch_exists",
              "drain_completions", "close"):
        assert callable(getattr(conn, m))
    return conn


@pytest.fixture
def daemon(tmp_path):
    with running_daemon(str(tmp_path), str(tmp_path / "s.sock")) as sock:
        yield sock


class Loop:
    """LMCache's side: one thread polls event_fd and collects completions by future id."""

    def __init__(self, conn):
        self.conn = conn
        self.done = {}
        self.cv = threading.Condition()
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        fd = self.conn.event_fd()
        while not self.stop:
            r, _, _ = select.select([fd], [], [], 0.1)
            if r:
                items = self.conn.drain_completions()
                with self.cv:
                    for fid, ok, err, per_key in items:
                        assert fid not in self.done, "future %d completed twice" % fid
                        self.done[fid] = (ok, err, per_key)
                    self.cv.notify_all()

    def wait(self, fid, timeout=10):
        with self.cv:
            assert self.cv.wait_for(lambda: fid in self.done, timeout), "future %d never done" % fid
            return self.done.pop(fid)

    def close(self):
        self.stop = True
        self.thread.join()
        self.conn.close()


def chunks(seed, n):
    return [bytearray(((seed * 31 + i * 17 + j) * 2654435761 >> 13) & 0xFF
                      for j in range(256)) * (CHUNK // 256) for i in range(n)]


def keys(seed, n):
    return ["lmc@model@rank0@%d-%d" % (seed, i) for i in range(n)]


def test_round_trip_exists_delete(daemon):
    loop = Loop(connector(daemon))
    c = loop.conn
    src = chunks(1, 8)
    assert loop.wait(c.submit_batch_exists(keys(1, 8))) == (True, "", [False] * 8)
    ok, err, per_key = loop.wait(c.submit_batch_set(keys(1, 8), [memoryview(b) for b in src]))
    assert (ok, err, per_key) == (True, "", None)
    assert loop.wait(c.submit_batch_exists(keys(1, 8) + keys(2, 2)))[2] == [True] * 8 + [False] * 2
    dst = [bytearray(CHUNK) for _ in range(10)]
    ok, err, per_key = loop.wait(c.submit_batch_get(keys(1, 8) + keys(2, 2),
                                                    [memoryview(b) for b in dst]))
    assert ok and per_key == [True] * 8 + [False] * 2
    assert dst[:8] == src and dst[8:] == [bytearray(CHUNK)] * 2
    assert loop.wait(c.submit_batch_delete(keys(1, 8)[4:]))[:2] == (True, "")
    assert loop.wait(c.submit_batch_exists(keys(1, 8)))[2] == [True] * 4 + [False] * 4
    # an object of another size is stored in a namespace of its size (issue 31, item 8;
    # it failed its batch before: "memoryviews must have block_bytes=65536 bytes each")
    small = bytearray(range(100))
    assert loop.wait(c.submit_batch_set(keys(3, 1), [memoryview(small)]))[:2] == (True, "")
    back = bytearray(100)
    assert loop.wait(c.submit_batch_get(keys(3, 1), [memoryview(back)]))[2] == [True]
    assert back == small
    ok, err, _ = loop.wait(c.submit_batch_get(keys(3, 2), [memoryview(bytearray(CHUNK))]))
    assert not ok and "2 keys but 1 memoryviews" in err
    loop.close()


def test_block_bytes_from_first_set(daemon):
    conn = connector(daemon)
    conn.block_bytes = None          # as if adapter_params had no block_bytes
    loop = Loop(conn)
    assert loop.wait(conn.submit_batch_exists(keys(4, 2))) == (True, "", [False, False])
    assert loop.wait(conn.submit_batch_set(keys(4, 2), [memoryview(b) for b in chunks(4, 2)]))[0]
    assert conn.block_bytes == CHUNK
    assert loop.wait(conn.submit_batch_exists(keys(4, 2)))[2] == [True, True]
    loop.close()


def test_daemon_restart(tmp_path):
    sock = str(tmp_path / "r.sock")
    loop = Loop(connector(sock, reconnect_interval_s=0))
    c = loop.conn
    fd = c.event_fd()
    src = chunks(5, 4)
    with running_daemon(str(tmp_path), sock):
        assert loop.wait(c.submit_batch_set(keys(5, 4), [memoryview(b) for b in src]))[0]
        assert loop.wait(c.submit_batch_exists(keys(5, 4)))[2] == [True] * 4
    # daemon gone: batches fail with a reason, nothing raises
    for submit in (lambda: c.submit_batch_exists(keys(5, 4)),
                   lambda: c.submit_batch_get(keys(5, 4), [memoryview(bytearray(CHUNK))] * 4),
                   lambda: c.submit_batch_set(keys(5, 4), [memoryview(b) for b in src])):
        ok, err, per_key = loop.wait(submit())
        assert not ok and err and per_key is None
    with running_daemon(str(tmp_path), sock):
        assert c.event_fd() == fd
        deadline = time.monotonic() + 10
        while True:       # the first batch after the restart may still see the old connection
            ok, _, per_key = loop.wait(c.submit_batch_exists(keys(5, 4)))
            if ok:
                break
            assert time.monotonic() < deadline
        assert per_key == [False] * 4          # a fresh daemon without a store
        assert loop.wait(c.submit_batch_set(keys(5, 4), [memoryview(b) for b in src]))[0]
        dst = [bytearray(CHUNK) for _ in range(4)]
        assert loop.wait(c.submit_batch_get(keys(5, 4), [memoryview(b) for b in dst]))[2] == [True] * 4
        assert dst == src
    loop.close()


def test_concurrent_submitters(daemon):
    loop = Loop(connector(daemon))
    c = loop.conn
    errors = []

    def worker(t):
        try:
            src = chunks(100 + t, 4)
            for r in range(5):
                ks = keys(1000 * t + r, 4)
                assert loop.wait(c.submit_batch_set(ks, [memoryview(b) for b in src]))[0]
                assert loop.wait(c.submit_batch_exists(ks))[2] == [True] * 4
                dst = [bytearray(CHUNK) for _ in range(4)]
                assert loop.wait(c.submit_batch_get(ks, [memoryview(b) for b in dst]))[2] == [True] * 4
                assert dst == src
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    loop.close()
