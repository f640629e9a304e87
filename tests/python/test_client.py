"""pytest suite of the Python binding (python/kvnode) against a real kvnoded.

The fixture starts its own daemon in a temporary directory (conftest.py;
KVNODED names the binary, default build/kvnoded) and stops it at the end.
"""
import ctypes
import os
import struct
import tempfile
import time

import pytest

import kvnode
from conftest import running_daemon

BLOCK_BYTES = 4096
MAX_KEYS = 64

# tests/unit/test_hash.c: tokens 0..15, block_tokens 4.
GOLDEN_0_15 = [455111276453135508, 6713779586671547074, -1712794477054135035,
               6556265598806870907]


@pytest.fixture(scope="module")
def daemon():
    with tempfile.TemporaryDirectory(prefix="kvnode-py-") as d:
        with running_daemon(d, os.path.join(d, "kvnode.sock"),
                            "server.max_keys_per_request=%d" % MAX_KEYS) as sock:
            yield sock


_ns = [0]


def layout(**kw):
    """A fresh namespace per call (distinct model name) unless model is given."""
    _ns[0] += 1
    args = dict(model="pytest-%d-%d" % (os.getpid(), _ns[0]), dtype="bf16", block_tokens=4,
                block_bytes=BLOCK_BYTES, num_layers=2, kv_heads=2, head_dim=8)
    args.update(kw)
    return kvnode.Layout(**args)


@pytest.fixture
def client(daemon):
    with kvnode.Client(daemon, layout()) as c:
        yield c


def payload(seed, i):
    """Deterministic, position-dependent block bytes."""
    return bytes(((seed * 131 + i * 7 + j * 13) ^ (j >> 8)) & 0xFF for j in range(BLOCK_BYTES))


def chain(seed, n):
    return kvnode.hash_tokens([seed * 1000 + t for t in range(n * 4)], 4)


# ------------------------------------------------------------------ hashing

def test_hash_golden():
    assert kvnode.hash_tokens(range(16), 4) == GOLDEN_0_15
    assert kvnode.hash_tokens(range(18), 4) == GOLDEN_0_15      # partial block: no key
    assert kvnode.hash_tokens([1, 2, 3], 4) == []


def test_hash_equals_c_library():
    lib = ctypes.CDLL(kvnode.library_path())
    f = lib.kvnode_hash_tokens
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t, ctypes.c_uint32,
                  ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t]
    cases = [(list(range(16)), 4), ([-1, -2, -100, -2**63], 2), ([7] * 33, 16),
             ([2**63 - 1, 0, 151643, 42, 9] * 8, 5), (list(range(1000, 1064)), 1)]
    for toks, b in cases:
        n = len(toks)
        t = (ctypes.c_int64 * n)(*toks)
        k = (ctypes.c_int64 * n)()
        got = f(t, n, b, k, n)
        assert kvnode.hash_tokens(toks, b) == list(k[:got])
        assert len(kvnode.hash_tokens(toks, b)) == n // b


# ------------------------------------------------------------------ round trips

def test_zero_copy_round_trip(client):
    keys = chain(1, 5)
    data = [payload(1, i) for i in range(5)]
    assert client.match(keys) == 0
    with client.write(keys) as slots:
        assert len(slots) == 5
        for s, d in zip(slots, data):
            assert s is not None and not s.readonly and s.nbytes == BLOCK_BYTES
            s[:] = d
    assert client.match(keys) == 5
    with client.read(keys) as blocks:
        assert len(blocks) == 5
        for b, d in zip(blocks, data):
            assert b.readonly and b.format == "B"
            assert b.tobytes() == d
    # copying path reads what zero-copy wrote
    assert client.get(keys) == data


def test_copying_round_trip(client):
    keys = chain(2, 4)
    data = [payload(2, i) for i in range(4)]
    client.put(keys, data)
    assert client.match(keys) == 4
    assert client.get(keys) == data
    with client.read(keys) as blocks:
        assert [b.tobytes() for b in blocks] == data


def test_longest_prefix_and_already_stored(client):
    keys = chain(3, 4)
    client.put(keys[:2], [payload(3, 0), payload(3, 1)])
    assert client.match(keys) == 2
    assert len(client.get(keys)) == 2
    with client.read(keys) as blocks:
        assert len(blocks) == 2
    with client.write(keys) as slots:
        assert slots[0] is None and slots[1] is None
        assert slots[2] is not None and slots[3] is not None
        slots[2][:] = payload(3, 2)
        slots[3][:] = payload(3, 3)
    assert client.get(keys) == [payload(3, i) for i in range(4)]


def test_delete_and_stats(client):
    keys = chain(4, 3)
    client.put(keys, [payload(4, i) for i in range(3)])
    st = client.stats()
    assert isinstance(st, dict) and "namespaces" in st
    assert client.delete(keys[1:]) == 2
    assert client.match(keys) == 1


def test_reader_reads_and_may_not_write(daemon):
    lo = layout()
    keys = chain(40, 3)
    data = [payload(40, i) for i in range(3)]
    with kvnode.Client(daemon, lo) as writer, kvnode.Client(daemon, lo, reader=True) as reader:
        assert writer.reader is False and reader.reader is True
        writer.put(keys, data)
        assert reader.match(keys) == 3
        assert reader.get(keys) == data
        with reader.read(keys) as blocks:
            assert [b.tobytes() for b in blocks] == data
        for attempt in (lambda: reader.put(keys, data), lambda: reader.delete(keys)):
            with pytest.raises(kvnode.Denied) as ei:
                attempt()
            assert "declared itself a reader" in ei.value.message
        with pytest.raises(kvnode.Denied):
            with reader.write(chain(41, 1)):
                pass
        assert writer.match(keys) == 3
        assert writer.delete(keys[2:]) == 1


def test_prefault(daemon):
    lo = layout()
    with kvnode.Client(daemon, lo) as writer, kvnode.Client(daemon, lo, reader=True) as reader:
        keys, data = chain(51, 2), [payload(51, i) for i in range(2)]
        writer.put(keys, data)
        assert writer.prefault_progress() == (0, 0, False)
        writer.prefault(wait=True)
        done, total, ended = writer.prefault_progress()
        assert ended and total > 0 and done == total
        reader.prefault()
        for _ in range(2000):
            if reader.prefault_progress()[2]:
                break
            time.sleep(0.005)
        assert reader.prefault_progress() == (total, total, True)
        assert reader.get(keys) == data
    with kvnode.Client(daemon, None) as observer:
        with pytest.raises(kvnode.StateError):
            observer.prefault()


def test_numpy_frombuffer_zero_copy(client):
    np = pytest.importorskip("numpy")
    keys = chain(5, 2)
    src = np.arange(BLOCK_BYTES // 4, dtype=np.float32)
    with client.write(keys) as slots:
        for s in slots:
            np.frombuffer(s, dtype=np.float32)[:] = src
    with client.read(keys) as blocks:
        for b in blocks:
            a = np.frombuffer(b, dtype=np.float32)
            assert np.array_equal(a, src)
            del a


# ------------------------------------------------------------------ lease lifetime

def test_view_after_read_lease_raises(client):
    keys = chain(6, 2)
    client.put(keys, [payload(6, 0), payload(6, 1)])
    with client.read(keys) as blocks:
        kept = blocks[0]
        assert kept[0] == payload(6, 0)[0]
    with pytest.raises(ValueError):
        kept[0]
    with pytest.raises(ValueError):
        kept.tobytes()
    with pytest.raises(ValueError):
        bytes(blocks[1])


def test_view_after_write_lease_raises(client):
    keys = chain(7, 1)
    with client.write(keys) as slots:
        kept = slots[0]
        kept[:] = payload(7, 0)
    with pytest.raises(ValueError):
        kept[0] = 1
    assert client.get(keys) == [payload(7, 0)]


def test_exported_slot_at_lease_end_aborts(client):
    keys = chain(8, 1)
    with pytest.raises(kvnode.LeaseEnded):
        with client.write(keys) as slots:
            slots[0][:] = payload(8, 0)
            held = struct.Struct('B').iter_unpack(slots[0])  # holds a buffer on the view
    del held
    assert client.match(keys) == 0


def test_exception_in_write_aborts(client):
    keys = chain(9, 3)

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with client.write(keys) as slots:
            for i, s in enumerate(slots):
                s[:] = payload(9, i)
            raise Boom()
    assert client.match(keys) == 0
    assert client.get(keys) == []
    # the slots were freed: a later write succeeds and commits
    with client.write(keys) as slots:
        assert all(s is not None for s in slots)
        for i, s in enumerate(slots):
            s[:] = payload(9, i)
    assert client.match(keys) == 3


# ------------------------------------------------------------------ errors

def test_layout_conflict_carries_daemon_message(daemon):
    lay = layout()
    with kvnode.Client(daemon, lay):
        bad = kvnode.Layout(**dict(vars(lay), block_bytes=BLOCK_BYTES * 2))
        with pytest.raises(kvnode.LayoutError) as ei:
            kvnode.Client(daemon, bad)
    e = ei.value
    assert isinstance(e, kvnode.Error)
    assert e.code == 5
    assert "already registered with block_bytes %d" % BLOCK_BYTES in e.message
    assert e.message in str(e)


def test_invalid_layout_error(daemon):
    with pytest.raises(kvnode.LayoutError) as ei:
        kvnode.Client(daemon, layout(tp_size=2, tp_rank=3))
    assert ei.value.code == 5 and "tp_rank" in ei.value.message


def test_too_many_keys(client):
    keys = list(range(1, MAX_KEYS + 2))
    with pytest.raises(kvnode.TooBig) as ei:
        client.match(keys)
    assert ei.value.code == 8
    assert str(MAX_KEYS) in ei.value.message
    with pytest.raises(kvnode.TooBig):
        with client.read(keys):
            pass


def test_connect_error(tmp_path):
    with pytest.raises(kvnode.ConnectError) as ei:
        kvnode.Client(str(tmp_path / "nope.sock"), layout())
    assert ei.value.code == 10 and ei.value.message


def test_closed_client_raises(daemon):
    c = kvnode.Client(daemon, layout())
    c.close()
    c.close()
    with pytest.raises(kvnode.Closed):
        c.match([1])


def test_put_wrong_size(client):
    with pytest.raises(ValueError):
        client.put([1], [b"short"])
