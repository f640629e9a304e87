"""The batched and asynchronous calls of :class:`Client` (libkvnode's KVNODE_0.3 calls):
``get_batch`` / ``put_batch`` over the caller's pages, ``match_tiers``, ``match_remote``, and
the tickets of ``submit_*`` with ``drain``, ``event_fd``, ``pending`` and ``cancel``. It owns
the tickets in flight and the pages they hold until drained.

``_AsyncCalls`` is a mixin of :class:`Client` (client.py): it uses the client's
``_handle()``, ``_check(rc)``, ``_checked(fn, what)`` and ``_block_bytes``."""

import ctypes
import threading

from ._lib import (_BATCH_DEVICE, _CCompletion, _CRemoteMatch, _CTiers, _HAVE_ASYNC, _SIZE,
                   _TICKET, _cancel, _drain, _event_fd, _get_batch, _get_batch_checked,
                   _get_batch_stream, _lib_path, _match_checked, _match_remote, _match_tiers,
                   _pending, _put_batch, _put_batch_checked, _put_batch_stream, _s,
                   _submit_delete, _submit_delete_checked, _submit_get, _submit_get_checked,
                   _submit_match, _submit_match_checked, _submit_put, _submit_put_checked)
from .datatypes import Completion, RemoteMatch, Tiers
from .errors import InvalidArgument, _error
from .keys import _checks_array, _keys_array
from .pages import _Pages
from ._lib import (_delete_each, _exists, _has_per_key, _submit_delete_each, _submit_exists)


#: Drained per-key answer arrays a client keeps for reuse.
_SPARE_ANSWERS = 4


class _AsyncCalls:
    """Batched and asynchronous calls, mixed into :class:`Client`."""

    def _init_tickets(self):
        """No ticket in flight yet (called by Client.__init__ before it connects)."""
        # ticket -> _Pages of a GET/PUT whose page objects are held until it is drained
        # (libkvnode copies keys and page addresses at submit, not the pages).
        self._inflight = {}
        self._inflight_lock = threading.Lock()
        # bool arrays of drained per-key tickets, reused by the next ones (libkvnode fills
        # the first n items of one whole when its ticket completes, nothing before)
        self._spare_answers = []
        # the ticket a per-key submit gets back, written and read under _inflight_lock
        self._ticket_out = _TICKET(0)
        self._ticket_ref = ctypes.byref(self._ticket_out)
        self._drain_space = threading.local()

    def _drop_tickets(self):
        """Release the pages of every ticket not yet drained (the connection is gone)."""
        inflight = getattr(self, "_inflight", None)
        if inflight:
            for pages in list(inflight.values()):
                pages.release()
            inflight.clear()

    def _need_async(self, what):
        if not _HAVE_ASYNC:
            raise InvalidArgument(InvalidArgument.CODE, "%s needs a libkvnode with the KVNODE_0.3 "
                                  "calls; %s has none" % (what, _lib_path), "invalid argument")
        return self._handle()

    def match_tiers(self, keys, checks=None):
        """:meth:`match` that also says where the matched blocks are: a :class:`Tiers`."""
        h = self._need_async("match_tiers")
        arr, n = _keys_array(keys)
        t = _CTiers()
        if checks is None:
            self._check(_match_tiers(h, arr, n, ctypes.byref(t)))
        else:
            self._check(self._checked(_match_checked, "match_tiers")(
                h, arr, _checks_array(checks, n), n, ctypes.byref(t)))
        return Tiers(t.matched, t.hbm, t.host, t.store)

    def match_remote(self, keys, max_hosts=0):
        """The local prefix and which peer nodes hold how much of it (asked of the KV Cache
        Manager): a :class:`RemoteMatch`. KVCM trouble never raises (``remote_ok`` False)."""
        h = self._need_async("match_remote")
        arr, n = _keys_array(keys)
        r = _CRemoteMatch()
        self._check(_match_remote(h, arr, n, int(max_hosts), ctypes.byref(r)))
        peers = [(_s(r.peers[i].host_ip_port), r.peers[i].matched)
                 for i in range(min(r.npeers, 64))]
        return RemoteMatch(r.matched, bool(r.remote_ok), _s(r.why), peers)

    def _stream_fn(self, fn, what, stream, checks):
        """The _stream variant of a batch call (stream: a cudaStream_t as an int, 0 for the
        legacy default stream), or an error saying why there is none."""
        if checks is not None:
            raise InvalidArgument(InvalidArgument.CODE, "%s: stream and checks cannot be "
                                  "combined" % what, "invalid argument")
        if fn is None:
            raise InvalidArgument(InvalidArgument.CODE, "%s with a stream needs a libkvnode "
                                  "with the KVNODE_0.5 calls; %s has none" % (what, _lib_path),
                                  "invalid argument")
        return fn

    def get_batch(self, keys, pages, device=False, checks=None, stream=None):
        """Copy the longest cached prefix of ``keys`` into ``pages`` (one per key: a writable
        buffer, an address, a tensor, or a ctypes ``c_void_p`` array of addresses) in one
        call; return how many were copied. ``device`` True: the pages are GPU memory of this
        client's CUDA device, complete when the call returns. ``stream``: a CUDA stream of
        that device (its address as an int, e.g. ``torch.cuda.current_stream().cuda_stream``;
        0: the legacy default stream) the copies are queued on, after the work already
        there (``kvnode_get_batch_stream``). ``checks``: check words, as for :meth:`match`
        (not with ``stream``)."""
        h = self._need_async("get_batch")
        arr, n = _keys_array(keys)
        gs = None if stream is None else self._stream_fn(_get_batch_stream, "get_batch",
                                                        stream, checks)
        pg = _Pages(pages, n, self._block_bytes, True, device)
        try:
            got = _SIZE(0)
            flags = _BATCH_DEVICE if device else 0
            if gs is not None:
                rc = gs(h, arr, n, pg.array, flags, ctypes.c_void_p(int(stream) or None),
                        ctypes.byref(got))
            elif checks is None:
                rc = _get_batch(h, arr, n, pg.array, flags, ctypes.byref(got))
            else:
                rc = self._checked(_get_batch_checked, "get_batch")(
                    h, arr, _checks_array(checks, n), n, pg.array, flags, ctypes.byref(got))
            self._check(rc)
            return got.value
        finally:
            pg.release()

    def put_batch(self, keys, pages, device=False, checks=None, stream=None):
        """Store ``pages[i]`` (a buffer, an address, a tensor, or a ctypes ``c_void_p`` array
        of addresses: :attr:`block_bytes` bytes each) under ``keys[i]`` in one call; keys
        already stored are left as they are. ``device`` and ``stream`` as for
        :meth:`get_batch` (with ``stream`` the copies follow the work queued there, e.g. the
        kernel that wrote the pages). ``checks``: the blocks' check words."""
        h = self._need_async("put_batch")
        arr, n = _keys_array(keys)
        ps = None if stream is None else self._stream_fn(_put_batch_stream, "put_batch",
                                                        stream, checks)
        pg = _Pages(pages, n, self._block_bytes, False, device)
        try:
            flags = _BATCH_DEVICE if device else 0
            if ps is not None:
                rc = ps(h, arr, n, pg.array, flags, ctypes.c_void_p(int(stream) or None))
            elif checks is None:
                rc = _put_batch(h, arr, n, pg.array, flags)
            else:
                rc = self._checked(_put_batch_checked, "put_batch")(
                    h, arr, _checks_array(checks, n), n, pg.array, flags)
            self._check(rc)
        finally:
            pg.release()

    @property
    def event_fd(self):
        """The completion eventfd: readable while :meth:`drain` has something (poll it;
        do not read or close it)."""
        return _event_fd(self._need_async("event_fd"))

    def _submit_keys(self, fn, fn_checked, what, keys, checks):
        """A MATCH or DELETE submit: libkvnode copies the keys (and words), nothing is held."""
        h = self._need_async(what)
        arr, n = _keys_array(keys)
        t = _TICKET(0)
        if checks is None:
            rc = fn(h, arr, n, None, ctypes.byref(t))
        else:
            rc = self._checked(fn_checked, what)(h, arr, _checks_array(checks, n), n, None,
                                                 ctypes.byref(t))
        if rc != 0:
            self._check(rc)
        return t.value

    def _submit_pages(self, fn, fn_checked, what, keys, checks, pages, writable, device):
        """A GET or PUT submit: the pages' buffers are held until the ticket is drained."""
        h = self._need_async(what)
        arr, n = _keys_array(keys)
        cw = _checks_array(checks, n)
        if cw is not None:
            self._checked(fn_checked, what)
        pg = _Pages(pages, n, self._block_bytes, writable, device)
        flags = _BATCH_DEVICE if device else 0
        t = _TICKET(0)
        with self._inflight_lock:   # drain must not see the ticket before it is registered
            if cw is None:
                rc = fn(h, arr, n, pg.array, flags, None, ctypes.byref(t))
            else:
                rc = fn_checked(h, arr, cw, n, pg.array, flags, None, ctypes.byref(t))
            if rc == 0 and not pg.bare:
                self._inflight[t.value] = pg
        if rc != 0:
            pg.release()
            self._check(rc)
        return t.value

    def submit_match(self, keys, checks=None):
        """Start a :meth:`match`; return its ticket (the count is the prefix matched)."""
        return self._submit_keys(_submit_match, _submit_match_checked, "submit_match", keys,
                                 checks)

    def submit_delete(self, keys, checks=None):
        """Start a :meth:`delete`; return its ticket (the count is the keys deleted)."""
        return self._submit_keys(_submit_delete, _submit_delete_checked, "submit_delete", keys,
                                 checks)

    def submit_get(self, keys, pages, device=False, checks=None):
        """Start a :meth:`get_batch` into ``pages``; return its ticket. The pages must stay
        valid and untouched until the ticket is drained (buffers are held till then)."""
        return self._submit_pages(_submit_get, _submit_get_checked, "submit_get", keys, checks,
                                  pages, True, device)

    def submit_put(self, keys, pages, device=False, checks=None):
        """Start a :meth:`put_batch` from ``pages``; return its ticket (pages held as for
        :meth:`submit_get`)."""
        return self._submit_pages(_submit_put, _submit_put_checked, "submit_put", keys, checks,
                                  pages, False, device)

    def drain(self, max_completions=64):
        """The finished tickets, as a list of :class:`Completion`; never blocks (empty
        when none is waiting). The pages of a drained GET/PUT are free to reuse."""
        return [Completion(*c) for c in self._drain_tuples(max(int(max_completions), 1))]

    def _drain_tuples(self, want):
        """:meth:`drain`'s work (want: an int >= 1), each completion a tuple (ticket, op,
        count, error, per_key) instead of a :class:`Completion` (kvnode.lmcache's
        completion path, which turns them into LMCache's tuples at once)."""
        h = self._c
        if not h or not _HAVE_ASYNC:
            h = self._need_async("drain")   # raises
        # One completion array per thread, reused: a fresh one is 300 bytes per slot zeroed.
        out = getattr(self._drain_space, "out", None)
        if out is None or len(out) < want:
            out = self._drain_space.out = (_CCompletion * want)()
        got = _drain(h, out, want)
        if not got:
            return []
        # A submit holds the lock from its call into libkvnode until its ticket is in
        # _inflight: once it is taken here, every ticket drained above is there.
        with self._inflight_lock:
            pass
        done = []
        inflight, spare = self._inflight, self._spare_answers
        for i in range(got):
            c = out[i]
            ticket = c.ticket
            held = inflight.pop(ticket, None)
            rc, per_key = c.rc, None
            if type(held) is _PerKey:
                if rc == 0:
                    per_key = held[0][:held[1]]
                if len(spare) < _SPARE_ANSWERS:
                    spare.append(held[0])
            elif held is not None:
                held.release()
            done.append((ticket, c.op, c.count, _error(rc, _s(c.error)) if rc else None,
                         per_key))
        return done

    @property
    def pending(self):
        """Tickets submitted and not yet drained."""
        return int(_pending(self._need_async("pending")))

    def cancel(self):
        """End the connection now: every ticket in flight completes with :class:`Closed`
        (drain them), and later calls raise it. :meth:`close` is still needed."""
        _cancel(self._need_async("cancel"))

    # --- per-key answers (KVNODE_0.6) ---------------------------------------------------

    @property
    def has_per_key(self):
        """True when kvnoded answers exists / delete per key (its HELLO offers it)."""
        h = self._handle()
        return bool(_has_per_key(h)) if _has_per_key is not None else False

    def _per_key(self, what):
        if _exists is None:
            raise InvalidArgument(InvalidArgument.CODE, "%s needs a libkvnode with the "
                                  "KVNODE_0.6 calls; %s has none" % (what, _lib_path),
                                  "invalid argument")
        return self._handle()

    def exists(self, keys, checks=None):
        """Whether each key is held (in memory or the store), in one request: a list of
        bools, not a prefix (:meth:`match`). ``checks``: check words, as for :meth:`match`."""
        h = self._per_key("exists")
        arr, n = _keys_array(keys)
        out, held = (ctypes.c_bool * max(n, 1))(), _SIZE(0)
        self._check(_exists(h, arr, _checks_array(checks, n), n, out, ctypes.byref(held)))
        return list(out)[:n]

    def delete_each(self, keys, checks=None):
        """:meth:`delete`, saying per key whether this call deleted it (a list of bools;
        False: not held, being written, or held under another check word)."""
        h = self._per_key("delete_each")
        arr, n = _keys_array(keys)
        out, count = (ctypes.c_bool * max(n, 1))(), _SIZE(0)
        self._check(_delete_each(h, arr, _checks_array(checks, n), n, out, ctypes.byref(count)))
        return list(out)[:n]

    def _submit_per_key(self, fn, what, keys, checks):
        if fn is None:
            self._per_key(what)         # raises, naming the library
        arr, n = _keys_array(keys)
        return self._submit_each(fn, arr, _checks_array(checks, n), n)

    def _submit_each(self, fn, keys, checks, n):
        """A per-key submit (fn: _submit_exists or _submit_delete_each, not None) of ready
        arrays: keys a ``c_int64`` array, checks a ``c_uint64`` one or None, n items each
        (as :func:`fold_digests` gives them; kvnode.lmcache calls this with its batch's
        arrays, without the conversions of :meth:`submit_exists`)."""
        h = self._c
        if not h:
            self._handle()              # raises Closed
        try:
            answer = self._spare_answers.pop()
        except IndexError:
            answer = None
        if answer is None or len(answer) < n:
            answer = (ctypes.c_bool * max(n, 64))()
        with self._inflight_lock:   # drain must not see the ticket before it is registered
            rc = fn(h, keys, checks, n, answer, None, self._ticket_ref)
            if rc == 0:
                t = self._ticket_out.value
                self._inflight[t] = _PerKey((answer, n))
        if rc != 0:
            self._check(rc)
        return t

    def submit_exists(self, keys, checks=None):
        """Start an :meth:`exists`; return its ticket. Its :class:`Completion` carries the
        answer in ``per_key`` (``count``: the keys held)."""
        return self._submit_per_key(_submit_exists, "submit_exists", keys, checks)

    def submit_delete_each(self, keys, checks=None):
        """Start a :meth:`delete_each`; return its ticket (``per_key`` of its
        :class:`Completion`: deleted or not, ``count``: how many were)."""
        return self._submit_per_key(_submit_delete_each, "submit_delete_each", keys, checks)


class _PerKey(tuple):
    """(bool array, n): the array a per-key submit fills, held until its ticket is drained
    (a tuple: made without a Python call)."""

    __slots__ = ()

    def release(self):
        pass

