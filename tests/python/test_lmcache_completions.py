"""kvnode.lmcache's completion path (issue 31, bench-adapters' exists row): event_fd is
readable exactly while drain_completions has something (one signal for several batches
finished inside the connector, none left behind once drained, so LMCache's poll loop
never spins), per-key exists answers through it ([stored, missing, stored] and a batch
over two object sizes), and a submit after close() completes without writing to the
closed event fd (whose number another descriptor may have taken by then)."""
import os
import select

import pytest

import kvnode.lmcache
from conftest import running_daemon

BB = 4096


@pytest.fixture
def daemon(tmp_path):
    with running_daemon(str(tmp_path), str(tmp_path / "s.sock")) as sock:
        yield sock


def readable(fd):
    return bool(select.select([fd], [], [], 0)[0])


def wait_for(conn, fid, got):
    """Poll event_fd and drain (LMCache's demux loop) until fid has completed."""
    for _ in range(100):
        if fid in got:
            return got.pop(fid)
        select.select([conn.event_fd()], [], [], 0.1)
        for r in conn.drain_completions():
            assert r[0] not in got, "future %d completed twice" % r[0]
            got[r[0]] = r[1:]
    raise AssertionError("future %d never completed" % fid)


def test_event_fd_readable_exactly_while_completions_wait(daemon):
    conn = kvnode.lmcache.KvnodeL2Connector(socket_path=daemon, model="cmpl", block_bytes=BB)
    try:
        fd = conn.event_fd()
        assert not readable(fd) and conn.drain_completions() == []
        # batches finished inside the connector (no request): one drain takes both
        a, b = conn.submit_batch_exists([]), conn.submit_batch_delete([])
        assert readable(fd)
        assert sorted(conn.drain_completions()) == [(a, True, "", []), (b, True, "", [])]
        assert not readable(fd) and conn.drain_completions() == []
        got = {}
        keys = ["cmpl@00000000@0@%x" % i for i in range(3)]
        pages = [memoryview(bytearray(bytes([i + 1]) * BB)) for i in range(3)]
        ok, err, _ = wait_for(conn, conn.submit_batch_set([keys[0], keys[2]],
                                                          [pages[0], pages[2]]), got)
        assert ok, err
        assert wait_for(conn, conn.submit_batch_exists(keys), got) == \
            (True, "", [True, False, True])
        assert wait_for(conn, conn.submit_batch_exists(keys[1:2]), got) == (True, "", [False])
        # a size of its own for the middle key: exists asks both sizes, answers per key
        other = memoryview(bytearray(b"\7" * (2 * BB)))
        assert wait_for(conn, conn.submit_batch_set(keys[1:2], [other]), got)[0]
        assert wait_for(conn, conn.submit_batch_exists(keys + ["cmpl@none"]), got) == \
            (True, "", [True, True, True, False])
        assert wait_for(conn, conn.submit_batch_delete(keys[:2]), got) == \
            (True, "", [True, True])
        assert wait_for(conn, conn.submit_batch_exists(keys), got) == \
            (True, "", [False, False, True])
        assert got == {}
        assert conn.drain_completions() == [] and not readable(fd)
    finally:
        conn.close()


def test_submit_after_close_writes_no_descriptor(daemon):
    conn = kvnode.lmcache.KvnodeL2Connector(socket_path=daemon, model="cmpl", block_bytes=BB)
    conn.close()
    # the closed connector's descriptor numbers are free: another eventfd may take one
    others = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(4)]
    try:
        conn.submit_batch_exists(["cmpl@after-close"])
        assert not any(readable(fd) for fd in others), "wrote to another descriptor"
    finally:
        for fd in others:
            os.close(fd)


def test_batches_waiting_for_the_connect_keep_their_own_keys(daemon):
    """Keys are folded into the submitting thread's scratch arrays: two exists submitted
    back to back by one thread before the connection is up (both wait for it) must each
    be asked with their own keys; then batches of growing and shrinking sizes."""
    keys = ["wait@00000000@0@%x" % i for i in range(300)]
    first = kvnode.lmcache.KvnodeL2Connector(socket_path=daemon, model="cmpl", block_bytes=BB)
    got = {}
    try:
        stored = [i % 3 == 0 for i in range(len(keys))]
        ok, err, _ = wait_for(first, first.submit_batch_set(
            [k for k, s in zip(keys, stored) if s],
            [memoryview(bytearray(BB)) for s in stored if s]), got)
        assert ok, err
    finally:
        first.close()
    conn = kvnode.lmcache.KvnodeL2Connector(socket_path=daemon, model="cmpl", block_bytes=BB)
    try:
        a = conn.submit_batch_exists(keys[:3])             # stored, missing, missing
        b = conn.submit_batch_exists(keys[1:4])            # missing, missing, stored
        assert wait_for(conn, a, got) == (True, "", [True, False, False])
        assert wait_for(conn, b, got) == (True, "", [False, False, True])
        for lo, hi in ((0, 1), (0, 300), (5, 7), (2, 130), (299, 300)):
            assert wait_for(conn, conn.submit_batch_exists(keys[lo:hi]), got) == \
                (True, "", stored[lo:hi])
        # keys that are not all strings are folded apart (bytes: the same SHA-256)
        assert wait_for(conn, conn.submit_batch_exists([keys[0].encode(), keys[1]]), got) == \
            (True, "", [True, False])
    finally:
        conn.close()


def test_client_per_key_answers_reuse_no_stale_bools(daemon):
    """The binding reuses the bool arrays of drained per-key tickets: answers of every
    length, two tickets in flight at once, each exact (no item of an earlier answer)."""
    lay = kvnode.Layout(model="cmpl-client", dtype="u8", block_tokens=1, block_bytes=BB)
    with kvnode.Client(daemon, lay) as c:
        keys = list(range(5000, 5200))
        held = [k % 2 == 0 for k in keys]
        c.put([k for k, h in zip(keys, held) if h], [bytes(BB)] * sum(held))

        def answers(*tickets):
            got = {}
            for _ in range(100):
                if len(got) == len(tickets):
                    return [got[t] for t in tickets]
                select.select([c.event_fd], [], [], 0.1)
                for d in c.drain():
                    assert d.error is None, d.error
                    got[d.ticket] = d.per_key
            raise AssertionError("tickets never completed")

        for lo, hi in ((0, 200), (0, 3), (1, 4), (0, 1), (3, 150)):
            assert answers(c.submit_exists(keys[lo:hi])) == [held[lo:hi]]
        a, b = c.submit_exists(keys[:100]), c.submit_exists(keys[1:5])
        assert answers(a, b) == [held[:100], held[1:5]]
        assert answers(c.submit_delete_each(keys[:4])) == [held[:4]]
        assert answers(c.submit_exists(keys[:6])) == [[False] * 4 + held[4:6]]
