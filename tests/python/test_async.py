"""The binding's batched and asynchronous calls (libkvnode KVNODE_0.3) against a real kvnoded:
byte-exact round trips through buffers and addresses, an eventfd poll loop, cancel, errors."""
import ctypes
import os
import select
import tempfile
import threading

import numpy
import pytest

import kvnode
from conftest import running_daemon

BLOCK = 4096


@pytest.fixture(scope="module")
def daemon():
    with tempfile.TemporaryDirectory(prefix="kvnode-pyasync-") as d:
        with running_daemon(d, os.path.join(d, "kvnode.sock")) as sock:
            yield sock


_ns = [0]


@pytest.fixture
def client(daemon):
    _ns[0] += 1
    lay = kvnode.Layout(model="pyasync-%d-%d" % (os.getpid(), _ns[0]), dtype="bf16",
                        block_tokens=4, block_bytes=BLOCK)
    with kvnode.Client(daemon, lay) as c:
        yield c


def pages(seed, n):
    rng = numpy.random.default_rng(seed)
    return [rng.integers(0, 256, BLOCK, dtype=numpy.uint8) for _ in range(n)]


def keys(seed, n):
    return [seed * 1000 + i + 1 for i in range(n)]


def wait_all(c, tickets, timeout=10):
    """Poll the eventfd and drain until every ticket completed; return {ticket: Completion}."""
    done = {}
    while set(tickets) - set(done):
        r, _, _ = select.select([c.event_fd], [], [], timeout)
        assert r, "eventfd not readable within %s s; pending %d" % (timeout, c.pending)
        for comp in c.drain():
            done[comp.ticket] = comp
    return done


def test_batch_round_trip_numpy_and_addresses(client):
    src = pages(1, 8)
    client.put_batch(keys(1, 8), src)
    dst = [numpy.zeros(BLOCK, numpy.uint8) for _ in range(8)]
    assert client.get_batch(keys(1, 8), dst) == 8
    assert all(numpy.array_equal(a, b) for a, b in zip(src, dst))
    # addresses (as an engine's page pointers) and a partial prefix
    raw = (ctypes.c_uint8 * (BLOCK * 10))()
    addrs = [ctypes.addressof(raw) + i * BLOCK for i in range(10)]
    assert client.get_batch(keys(1, 8) + [99999, 99998], addrs) == 8
    assert bytes(raw[:8 * BLOCK]) == b"".join(p.tobytes() for p in src)
    assert bytes(raw[8 * BLOCK:]) == bytes(2 * BLOCK)
    # bytes (read-only) are accepted for put, refused for get
    client.put_batch([5], [bytes(range(256)) * 16])
    out = bytearray(BLOCK)
    assert client.get_batch([5], [memoryview(out)]) == 1 and out == bytes(range(256)) * 16
    with pytest.raises(ValueError, match="writable"):
        client.get_batch([5], [bytes(BLOCK)])


def test_batch_argument_errors(client):
    with pytest.raises(ValueError, match="2 keys but 1 pages"):
        client.put_batch([1, 2], [bytes(BLOCK)])
    with pytest.raises(ValueError, match="has 100 bytes"):
        client.put_batch([1], [bytes(100)])
    with pytest.raises(ValueError, match="device=True"):
        client.put_batch([1], [bytes(BLOCK)], device=True)
    # device pages on a client that declared no GPU: libkvnode refuses (ESTATE)
    with pytest.raises(kvnode.StateError):
        client.put_batch([1], [ctypes.addressof((ctypes.c_char * BLOCK)())], device=True)


def test_batch_on_a_stream(client):
    """stream= takes the _stream calls (KVNODE_0.5): host pages need no CUDA, so the round
    trip works on a client without a GPU; device pages still need one (ESTATE)."""
    src = pages(7, 3)
    client.put_batch(keys(7, 3), src, stream=0)
    dst = [numpy.zeros(BLOCK, numpy.uint8) for _ in range(3)]
    assert client.get_batch(keys(7, 3), dst, stream=0) == 3
    assert all(numpy.array_equal(a, b) for a, b in zip(src, dst))
    with pytest.raises(kvnode.InvalidArgument, match="stream and checks"):
        client.get_batch(keys(7, 3), dst, stream=0, checks=[1, 2, 3])
    with pytest.raises(kvnode.StateError):
        client.put_batch([1], [ctypes.addressof((ctypes.c_char * BLOCK)())], device=True,
                         stream=0)


def test_match_tiers_and_remote(client):
    client.put_batch(keys(3, 5), pages(3, 5))
    t = client.match_tiers(keys(3, 5) + [1])
    assert (t.matched, t.host, t.hbm, t.store) == (5, 5, 0, 0)
    r = client.match_remote(keys(3, 5))
    assert r.matched == 5 and r.remote_ok is False and r.why and r.peers == []


def test_async_poll_loop(client):
    src = pages(4, 16)
    tput = client.submit_put(keys(4, 16), src)
    assert tput > 0
    assert wait_all(client, [tput])[tput].count == 16
    dsts = [numpy.zeros(BLOCK, numpy.uint8) for _ in range(16)]
    tickets = [client.submit_get(keys(4, 16)[i:i + 4], dsts[i:i + 4]) for i in range(0, 16, 4)]
    tm = client.submit_match(keys(4, 16) + [7])
    tmiss = client.submit_match([424242])
    done = wait_all(client, tickets + [tm, tmiss])
    assert client.pending == 0
    assert [done[t].count for t in tickets] == [4, 4, 4, 4]
    assert all(done[t].ok and done[t].op == kvnode.OP_GET for t in tickets)
    assert done[tm].count == 16 and done[tm].op == kvnode.OP_MATCH and done[tmiss].count == 0
    assert all(numpy.array_equal(a, b) for a, b in zip(src, dsts))
    td = client.submit_delete(keys(4, 16)[8:])
    assert wait_all(client, [td])[td].count == 8
    assert client.match(keys(4, 16)) == 8


def test_async_from_threads(client):
    errors = []

    def worker(seed):
        try:
            src = pages(seed, 4)
            t = client.submit_put(keys(seed, 4), src)
            # another thread may drain our completion: wait for the data instead
            for _ in range(2000):
                if client.match(keys(seed, 4)) == 4:
                    break
                select.select([], [], [], 0.005)
            dst = [numpy.zeros(BLOCK, numpy.uint8) for _ in range(4)]
            assert client.get_batch(keys(seed, 4), dst) == 4, "thread %d ticket %d" % (seed, t)
            assert all(numpy.array_equal(a, b) for a, b in zip(src, dst))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(10 + i,)) for i in range(8)]
    for th in threads:
        th.start()
    drained = 0
    while any(th.is_alive() for th in threads):
        select.select([client.event_fd], [], [], 0.05)
        drained += sum(1 for d in client.drain() if d.ok)
    for th in threads:
        th.join()
    drained += sum(1 for d in client.drain() if d.ok)
    assert errors == []
    assert drained == 8


def test_cancel_completes_in_flight_with_closed(client):
    src = pages(5, 32)
    tickets = [client.submit_put([50000 + i], [src[i]]) for i in range(32)]
    client.cancel()
    done = wait_all(client, tickets)
    failed = [d for d in done.values() if not d.ok]
    assert all(isinstance(d.error, kvnode.Closed) for d in failed)
    assert client.pending == 0
    with pytest.raises(kvnode.Closed):
        client.submit_match([1])
    with pytest.raises(kvnode.Closed):
        client.match([1])


def test_closed_client_raises(daemon):
    c = kvnode.Client(daemon, kvnode.Layout(model="pyasync-closed", dtype="bf16",
                                            block_tokens=4, block_bytes=BLOCK))
    t = c.submit_put([1], [bytes(BLOCK)])
    assert t > 0
    c.close()          # drops the undrained ticket, releases its page
    with pytest.raises(kvnode.Closed):
        c.event_fd
    with pytest.raises(kvnode.Closed):
        c.get_batch([1], [bytearray(BLOCK)])


def test_cuda_device_client(daemon):
    """A client that declares a CUDA device: no memoryview leases (its blocks may be device
    memory); device=True batches need a working CUDA runtime and driver: on a machine without
    a GPU they fail with the library's reason (ESTATE: no runtime, EIO: CUDA's error)."""
    lay = kvnode.Layout(model="pyasync-cuda", dtype="bf16", block_tokens=4, block_bytes=BLOCK)
    with pytest.raises(ValueError, match="cuda_device"):
        kvnode.Client(daemon, lay, cuda_device=-2)
    with kvnode.Client(daemon, lay, cuda_device=0) as c:
        assert c.cuda_device == 0
        with pytest.raises(kvnode.StateError, match="get_batch/put_batch"):
            c.read([1])
        with pytest.raises(kvnode.StateError, match="get_batch/put_batch"):
            c.write([1])
        c.put_batch([1, 2], pages(6, 2))                # host pages still work
        out = [bytearray(BLOCK) for _ in range(2)]
        assert c.get_batch([1, 2], out) == 2 and out[1] == pages(6, 2)[1].tobytes()
        if not os.path.exists("/dev/nvidia0"):
            with pytest.raises((kvnode.StateError, kvnode.IOFailure), match="CUDA"):
                c.get_batch([1], [ctypes.addressof((ctypes.c_char * BLOCK)())], device=True)


def test_memoryview_pages_held_until_drained(client):
    """Pages given as memoryviews (LMCache's) stay exported while their ticket is in flight
    (the memoryview cannot be released) and are let go when it is drained; short or
    read-only ones are checked as other buffers are."""
    src = [bytearray(bytes(pages(21, 1)[0])) for _ in range(3)]
    mvs = [memoryview(b) for b in src]
    client.put_batch(keys(21, 3), mvs)
    dst = [bytearray(BLOCK) for _ in range(3)]
    views = [memoryview(b) for b in dst]
    t = client.submit_get(keys(21, 3), views)
    for v in views:                     # the caller lets go of its views...
        try:
            v.release()
        except BufferError:
            pass
    with pytest.raises(BufferError):
        dst[0].extend(b"x")             # ...but the batch holds the memory in place
    done = wait_all(client, [t])
    assert done[t].ok and done[t].count == 3 and dst == src
    for v in views + mvs:
        v.release()
    dst[0].extend(b"x")                 # drained: nothing holds it any more
    with pytest.raises(ValueError, match="page 1 has 100 bytes"):
        client.get_batch(keys(21, 2), [memoryview(bytearray(BLOCK)), memoryview(bytearray(100))])
    ro = [memoryview(bytes(src[i])) for i in range(3)]
    client.put_batch(keys(22, 3), ro)       # read-only views: the general way
    assert client.get(keys(22, 3)) == [bytes(b) for b in src]
