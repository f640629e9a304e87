"""The value types of the kvnode package: :class:`Layout` (an engine rank's KV layout, the
namespace a client binds to), the tiers a write may ask for, and what calls answer:
:class:`Tiers`, :class:`RemoteMatch`, :class:`Completion`."""

import dataclasses

from ._lib import _CLayout
from .errors import Error

#: Host-memory tier (``KVNODE_TIER_HOST``).
TIER_HOST = 1
#: GPU-memory tier (``KVNODE_TIER_HBM``).
TIER_HBM = 2


@dataclasses.dataclass(frozen=True)
class Layout:
    """The KV-cache layout of one engine rank (mirrors ``kvnode_layout``).

    Clients with the same layout share a namespace in the daemon.
    ``block_bytes`` is the size of one block as held by this rank.
    ``revision`` (a weights revision: commit hash, tag; None or "": none) is part of the
    namespace identity when set, so blocks of two revisions of a model never meet; without
    one the deployment (and its stored blocks) is the one it was before revisions existed.
    """

    model: str
    dtype: str
    block_tokens: int
    block_bytes: int
    num_layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    tp_size: int = 1
    tp_rank: int = 0
    extra: str = None
    revision: str = None

    def _to_c(self):
        return _CLayout(
            self.model.encode(), self.dtype.encode(), self.block_tokens, self.block_bytes,
            self.num_layers, self.kv_heads, self.head_dim, self.tp_size, self.tp_rank,
            self.extra.encode() if self.extra is not None else None)



@dataclasses.dataclass(frozen=True)
class Completion:
    """A finished asynchronous call, as :meth:`Client.drain` returns it.

    ``count``: MATCH the prefix matched, GET the blocks copied (a prefix), PUT
    the blocks stored, DELETE the keys deleted, EXISTS the keys held. ``error`` is
    None on success, else the :class:`Error` (subclass) the call would have raised.
    ``per_key``: of ``submit_exists`` / ``submit_delete_each``, one bool per key
    (held / deleted by this call) on success; None otherwise.
    """

    ticket: int
    op: int
    count: int
    error: Error = None
    per_key: list = None

    @property
    def ok(self):
        return self.error is None


@dataclasses.dataclass(frozen=True)
class Tiers:
    """Where a matched prefix is (:meth:`Client.match_tiers`)."""

    matched: int
    hbm: int
    host: int
    store: int


@dataclasses.dataclass(frozen=True)
class RemoteMatch:
    """:meth:`Client.match_remote`: the local prefix and peers' (host:port, matched), best first.
    ``remote_ok`` False means the KV Cache Manager was not asked or did not answer (``why``)."""

    matched: int
    remote_ok: bool
    why: str
    peers: list
