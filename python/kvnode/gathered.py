"""Blocks whose bytes lie in pieces over the caller's memory, moved through a :class:`Client`
in one libkvnode call per batch (KVNODE_0.8: ``kvnode_put_gather_checked`` /
``kvnode_get_scatter_checked``; pieces in GPU memory: ``kvnode_put_gather_stream`` /
``kvnode_get_scatter_stream``): the lease, every piece's copy and the lease's end.

A :class:`PieceMap` says where the pieces of one block lie: piece j is ``sizes[j]`` bytes at
``base + at[j]`` in the caller's memory (``base``: one address per block, e.g. the block's
first piece in layer 0 of a paged KV cache; ``at[j]`` may be negative) and at
``offsets[j]`` in the kvnode block; the pieces tile the block. Used by kvnode.vllm (a vLLM
block is one piece per layer, or two: K and V)."""

import array
import ctypes

from . import _lib
from .keys import _checks_array, _keys_array

_ADDRESS = "Q" if ctypes.sizeof(ctypes.c_void_p) == 8 else "L"
_DISTANCE = "q" if ctypes.sizeof(ctypes.c_void_p) == 8 else "l"
_SIZES = "Q" if ctypes.sizeof(ctypes.c_size_t) == 8 else "L"


def available():
    """True when the loaded libkvnode has the gathered calls (KVNODE_0.8)."""
    return _lib._put_gather is not None


def device_available():
    """True when the loaded libkvnode has their device form (pieces in GPU memory)."""
    return _lib._put_gather_stream is not None


class PieceMap:
    """Where the m pieces of a block lie (see the module docstring)."""

    def __init__(self, at, sizes, offsets=None):
        at, sizes = list(at), list(sizes)
        if not at or len(at) != len(sizes):
            raise ValueError("PieceMap: %d distances but %d sizes" % (len(at), len(sizes)))
        if offsets is None:
            offsets, pos = [], 0
            for s in sizes:
                offsets.append(pos)
                pos += s
        offsets = list(offsets)
        if len(offsets) != len(sizes):
            raise ValueError("PieceMap: %d sizes but %d offsets" % (len(sizes), len(offsets)))
        self.m = len(sizes)
        #: Bytes of the block the pieces tile.
        self.block_bytes = sum(sizes)
        self._at = array.array(_DISTANCE, at)
        self._sizes = array.array(_SIZES, sizes)
        self._offsets = array.array(_SIZES, offsets)

    def _args(self):
        return (self._at.buffer_info()[0], self.m, self._sizes.buffer_info()[0],
                self._offsets.buffer_info()[0])


def _need(client, device=False):
    if not available() or (device and not device_available()):
        raise _lib_error(device)
    return client._handle()


def _lib_error(device=False):
    from .errors import InvalidArgument
    return InvalidArgument(InvalidArgument.CODE, "gathered blocks%s need a libkvnode with the "
                           "KVNODE_0.8 calls%s; %s has none"
                           % (" in GPU memory" if device else "",
                              " (kvnode_put_gather_stream)" if device else "", _lib._lib_path),
                           "invalid argument")


def put_gathered(client, keys, bases, pieces, checks=None, device=False, stream=None):
    """Store block i of ``keys`` from its pieces at ``bases[i]`` (see :class:`PieceMap`) in
    one call; keys already stored are left as they are. Raises the call's error (a copy
    that fails aborts its lease: nothing of it is stored). ``device``: the pieces are GPU
    memory of the client's CUDA device, copied on ``stream`` (a cudaStream_t as an int;
    None: the legacy default stream), complete on return."""
    h = _need(client, device)
    karr, n = _keys_array(keys)
    if len(bases) != n:
        raise ValueError("%d keys but %d block bases" % (n, len(bases)))
    if n == 0:
        return
    base = array.array(_ADDRESS, bases)
    at, m, sizes, offsets = pieces._args()
    if device:
        client._check(_lib._put_gather_stream(h, karr, _checks_array(checks, n), n,
                                              base.buffer_info()[0], at, m, sizes, offsets,
                                              _lib._BATCH_DEVICE, stream))
        return
    client._check(_lib._put_gather(h, karr, _checks_array(checks, n), n, base.buffer_info()[0],
                                   at, m, sizes, offsets))


def get_scattered(client, keys, bases, pieces, checks=None, device=False, stream=None):
    """Copy the longest stored prefix of ``keys`` into the pieces of block i at ``bases[i]``
    in one call; return how many blocks were copied (blocks past that prefix untouched).
    ``device`` and ``stream`` as for :func:`put_gathered`."""
    h = _need(client, device)
    karr, n = _keys_array(keys)
    if len(bases) != n:
        raise ValueError("%d keys but %d block bases" % (n, len(bases)))
    if n == 0:
        return 0
    base = array.array(_ADDRESS, bases)
    at, m, sizes, offsets = pieces._args()
    got = _lib._SIZE(0)
    if device:
        client._check(_lib._get_scatter_stream(h, karr, _checks_array(checks, n), n,
                                               base.buffer_info()[0], at, m, sizes, offsets,
                                               _lib._BATCH_DEVICE, stream, ctypes.byref(got)))
        return got.value
    client._check(_lib._get_scatter(h, karr, _checks_array(checks, n), n,
                                    base.buffer_info()[0], at, m, sizes, offsets,
                                    ctypes.byref(got)))
    return got.value
