"""The zero-copy leases of :meth:`Client.read` and :meth:`Client.write`: context managers
that pin blocks (or reserve slots), lend memoryviews over the daemon's shared memory, and
end, commit or abort the lease when the ``with`` block is left."""

import ctypes

from ._lib import (_CLoc, _LEASE, _SIZE, _get_begin, _get_begin_checked, _get_end_wait,
                   _put_abort, _put_begin, _put_begin_checked, _put_commit, _view)
from .errors import LeaseEnded
from .keys import _checks_array, _keys_array


class ReadLease:
    """Context manager returned by :meth:`Client.read`.

    Entering pins the longest cached prefix of the keys and yields a list of
    read-only ``memoryview`` objects, one per block. Leaving releases the views
    (using one afterwards raises ``ValueError``) and ends the lease.
    """

    def __init__(self, client, keys, checks=None):
        self._client = client
        self._keys, self._n = _keys_array(keys)
        self._checks = _checks_array(checks, self._n)
        self._lease = 0
        self._views = []

    def __enter__(self):
        c = self._client
        arr, n = self._keys, self._n
        locs = (_CLoc * max(n, 1))()
        lease = _LEASE(0)
        got = _SIZE(0)
        if self._checks is None:
            c._check(_get_begin(c._handle(), arr, n, ctypes.byref(lease), locs, ctypes.byref(got)))
        else:
            c._check(c._checked(_get_begin_checked, "read")(
                c._handle(), arr, self._checks, n, ctypes.byref(lease), locs, ctypes.byref(got)))
        self._lease = lease.value
        bb = c.block_bytes
        self._views = [_view(locs[i].ptr, bb, False) for i in range(got.value)]
        return list(self._views)

    def __exit__(self, exc_type, exc, tb):
        exported = _release_all(self._views)
        self._views = []
        lease, self._lease = self._lease, 0
        if lease:
            rc = _get_end_wait(self._client._handle(), lease)   # the reads held: wait
            if rc != 0 and exc_type is None:
                self._client._check(rc)
        if exported and exc_type is None:
            raise LeaseEnded(LeaseEnded.CODE, "%d view(s) still had a buffer exported when the "
                             "read lease ended; drop or copy such objects inside the with block"
                             % exported, "lease ended")
        return False


class WriteLease:
    """Context manager returned by :meth:`Client.write`.

    Entering reserves a slot per key and yields a list with a writable
    ``memoryview`` per key, or ``None`` for keys already stored. Leaving
    normally commits (the blocks become visible); leaving by an exception
    aborts (nothing becomes visible). The views are released either way.
    """

    def __init__(self, client, keys, tier, checks=None):
        self._client = client
        self._keys, self._n = _keys_array(keys)
        self._checks = _checks_array(checks, self._n)
        self._tier = tier
        self._lease = 0
        self._views = []

    def __enter__(self):
        c = self._client
        arr, n = self._keys, self._n
        locs = (_CLoc * max(n, 1))()
        lease = _LEASE(0)
        if self._checks is None:
            c._check(_put_begin(c._handle(), arr, n, self._tier, ctypes.byref(lease), locs))
        else:
            c._check(c._checked(_put_begin_checked, "write")(
                c._handle(), arr, self._checks, n, self._tier, ctypes.byref(lease), locs))
        self._lease = lease.value
        bb = c.block_bytes
        self._views = [_view(locs[i].ptr, bb, True) if locs[i].ptr else None for i in range(n)]
        return list(self._views)

    def __exit__(self, exc_type, exc, tb):
        exported = _release_all(self._views)
        self._views = []
        lease, self._lease = self._lease, 0
        if not lease:
            return False
        h = self._client._handle()
        if exc_type is not None or exported:
            rc = _put_abort(h, lease)
            if exc_type is None:
                self._client._check(rc)
                raise LeaseEnded(LeaseEnded.CODE, "%d slot view(s) were still exported when the "
                                 "write lease ended; the write was aborted" % exported,
                                 "lease ended")
            return False
        self._client._check(_put_commit(h, lease))
        return False


def _release_all(views):
    """Release every view; return how many could not be released (still exported)."""
    exported = 0
    for v in views:
        if v is None:
            continue
        try:
            v.release()
        except BufferError:
            exported += 1
    return exported
