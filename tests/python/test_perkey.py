"""Per-key exists and delete in one request (issue 31, items 6, 7): the binding's
``Client.exists`` / ``delete_each`` and their ``submit_`` forms, and kvnode.lmcache's
``submit_batch_exists`` / ``submit_batch_delete`` sending one MATCH / DELETE per batch and
size (counted by kvnoded in its stats: ``requests.match.ok``, ``requests.delete.ok``),
with per-key answers, check words included."""
import select

import pytest

import kvnode
import kvnode.lmcache
from conftest import running_daemon

BB = 4096


@pytest.fixture
def daemon(tmp_path):
    with running_daemon(str(tmp_path), str(tmp_path / "s.sock")) as sock:
        yield sock


def requests_ok(sock, op):
    with kvnode.Client(sock) as obs:
        return obs.stats().get("requests", {}).get(op, {}).get("ok", 0)


def layout(model="perkey", extra=""):
    return kvnode.Layout(model=model, dtype="bf16", block_tokens=16, block_bytes=BB,
                         num_layers=1, kv_heads=1, head_dim=BB // 2, extra=extra)


def test_client_exists_and_delete_each(daemon):
    keys = list(range(1000, 1012))
    held = [i % 3 != 1 for i in range(12)]
    checks = [0x1000 + i for i in range(12)]
    with kvnode.Client(daemon, layout()) as c:
        assert c.has_per_key
        for k, h, w in zip(keys, held, checks):
            if h:
                c.put([k], [bytes([k & 0xFF]) * BB], checks=[w])
        m0 = requests_ok(daemon, "match")
        assert c.exists(keys, checks=checks) == held
        assert requests_ok(daemon, "match") == m0 + 1
        assert c.match(keys, checks=checks) == 1            # the prefix, as before
        assert c.exists(keys) == [False] * 12               # word 0 is another word
        wrong = list(checks)
        wrong[3] = 7
        assert c.exists(keys, checks=wrong) == [h and i != 3 for i, h in enumerate(held)]
        assert c.exists([]) == []
        # asynchronous: the per-key answer comes with the completion
        t = c.submit_exists(keys, checks=checks)
        done = []
        while not done:
            select.select([c.event_fd], [], [], 5)
            done = c.drain()
        assert done[0].ticket == t and done[0].error is None and done[0].op == kvnode.OP_EXISTS
        assert done[0].count == sum(held) and done[0].per_key == held
        d0 = requests_ok(daemon, "delete")
        assert c.delete_each(keys, checks=wrong) == [h and i != 3 for i, h in enumerate(held)]
        assert requests_ok(daemon, "delete") == d0 + 1
        t = c.submit_delete_each(keys, checks=checks)
        done = []
        while not done:
            select.select([c.event_fd], [], [], 5)
            done = c.drain()
        assert done[0].per_key == [i == 3 for i in range(12)] and done[0].count == 1
        assert done[0].op == kvnode.OP_DELETE_EACH
        assert c.exists(keys, checks=checks) == [False] * 12


class Connector:
    """kvnode.lmcache's connector with a blocking call per op (the poll of its event_fd,
    as LMCache's demux thread does)."""

    def __init__(self, sock, **params):
        self.conn = kvnode.lmcache.KvnodeL2Connector(socket_path=sock, model="m", **params)
        self.results = {}

    def call(self, op, keys, views=None):
        f = getattr(self.conn, "submit_batch_" + op)
        fid = f(keys, views) if views is not None else f(keys)
        while fid not in self.results:
            select.select([self.conn.event_fd()], [], [], 5)
            for r in self.conn.drain_completions():
                self.results[r[0]] = r[1:]
        return self.results.pop(fid)


def test_adapter_sends_one_request_per_batch(daemon):
    n = 64
    keys = ["m@00000000@0@%064x" % i for i in range(n)]
    stored = [i % 4 == 0 for i in range(n)]           # 48 misses, the first after key 0
    bufs = [bytearray(bytes([i]) * BB) for i in range(n)]
    c = Connector(daemon, block_bytes=BB)
    try:
        ok, err, _ = c.call("set", [k for k, s in zip(keys, stored) if s],
                            [memoryview(b) for b, s in zip(bufs, stored) if s])
        assert ok, err
        m0 = requests_ok(daemon, "match")
        assert c.call("exists", keys) == (True, "", stored)
        assert requests_ok(daemon, "match") == m0 + 1
        d0 = requests_ok(daemon, "delete")
        gone = [i % 8 == 0 for i in range(n)]
        assert c.call("delete", [k for k, g in zip(keys, gone) if g] + keys[1:3]) == \
            (True, "", [True] * (n // 8) + [False, False])
        assert requests_ok(daemon, "delete") == d0 + 1
        assert c.call("exists", keys)[2] == [s and not g for s, g in zip(stored, gone)]
        assert requests_ok(daemon, "match") == m0 + 2
    finally:
        c.conn.close()


def test_adapter_against_a_daemon_without_per_key(daemon, monkeypatch):
    """An older kvnoded (its HELLO offers no per-key answers): the connector falls back to
    one MATCH per key after the first miss and one DELETE per key, with the same answers."""
    monkeypatch.setattr(kvnode.Client, "has_per_key", property(lambda self: False))
    n = 16
    keys = ["m@00000000@0@%064x" % (1000 + i) for i in range(n)]
    stored = [i % 4 == 1 for i in range(n)]
    bufs = [bytearray(bytes([i]) * BB) for i in range(n)]
    c = Connector(daemon, block_bytes=BB)
    try:
        assert c.call("set", [k for k, s in zip(keys, stored) if s],
                      [memoryview(b) for b, s in zip(bufs, stored) if s])[0]
        m0 = requests_ok(daemon, "match")
        assert c.call("exists", keys) == (True, "", stored)
        assert requests_ok(daemon, "match") == m0 + n    # the first, then one per key after it
        d0 = requests_ok(daemon, "delete")
        assert c.call("delete", keys[:4]) == (True, "", stored[:4])
        assert requests_ok(daemon, "delete") == d0 + 4
    finally:
        c.conn.close()
