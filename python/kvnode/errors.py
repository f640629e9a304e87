"""The exceptions of the kvnode package: :class:`Error` and one subclass per ``KVNODE_E*``
code, and how a libkvnode return code becomes one (``_raise``, ``_error``)."""

from ._lib import _s, _strerror


class Error(Exception):
    """A failed libkvnode call.

    ``code`` is the positive ``KVNODE_E*`` number, ``name`` the library's short
    description of it (``kvnode_strerror``), ``message`` the daemon's (or
    library's) message for the failure (``kvnode_last_error``).
    """

    #: KVNODE_E* code of this class (0 for the base class).
    CODE = 0

    def __init__(self, code, message="", name=""):
        self.code = code
        self.message = message
        self.name = name
        text = name or "kvnode error %d" % code
        if message:
            text = "%s: %s" % (text, message)
        super().__init__(text)


class InvalidArgument(Error):
    """KVNODE_EINVAL: invalid argument or request."""
    CODE = 1


class OutOfMemory(Error):
    """KVNODE_ENOMEM: out of memory (process)."""
    CODE = 2


class NoSpace(Error):
    """KVNODE_ENOSPC: tier full, nothing evictable."""
    CODE = 3


class NoLease(Error):
    """KVNODE_ENOLEASE: unknown, expired or foreign lease."""
    CODE = 4


class LayoutError(Error):
    """KVNODE_ELAYOUT: layout invalid or conflicts with a registered one."""
    CODE = 5


class VersionError(Error):
    """KVNODE_EVERSION: no common protocol version."""
    CODE = 6


class ProtocolError(Error):
    """KVNODE_EPROTO: malformed frame or message."""
    CODE = 7


class TooBig(Error):
    """KVNODE_ETOOBIG: frame, key count or block over a limit."""
    CODE = 8


class TimedOut(Error):
    """KVNODE_ETIMEDOUT: the call's timeout passed."""
    CODE = 9


class ConnectError(Error):
    """KVNODE_ECONNECT: cannot connect to the daemon."""
    CODE = 10


class Closed(Error):
    """KVNODE_ECLOSED: the daemon closed the connection (or the client was closed)."""
    CODE = 11


class IOFailure(Error):
    """KVNODE_EIO: a system call failed."""
    CODE = 12


class StateError(Error):
    """KVNODE_ESTATE: operation not valid now."""
    CODE = 13


class LimitReached(Error):
    """KVNODE_ELIMIT: a per-client limit was reached."""
    CODE = 14


class Denied(Error):
    """KVNODE_EDENIED: refused by access control."""
    CODE = 15


class InternalError(Error):
    """KVNODE_EINTERNAL: daemon bug, please report."""
    CODE = 16


class ShuttingDown(Error):
    """KVNODE_ESHUTDOWN: the daemon is shutting down."""
    CODE = 17


class LeaseEnded(Error):
    """A view still had a buffer exported directly from it when its lease ended.

    Raised on leaving a ``with`` block when a yielded memoryview could not be
    released because some object still holds a buffer on it (for example a
    ``struct.iter_unpack`` iterator). A read lease is ended anyway;
    a write lease is aborted. Such objects must not be used afterwards.

    Not every wrapper is detected: ``numpy.frombuffer`` takes its own view of
    the memory, so an array made from a yielded view must be dropped or copied
    inside the ``with`` block; after it the memory may be reused by the daemon.
    """
    CODE = 4


_ERRORS = {cls.CODE: cls for cls in (
    InvalidArgument, OutOfMemory, NoSpace, NoLease, LayoutError, VersionError, ProtocolError,
    TooBig, TimedOut, ConnectError, Closed, IOFailure, StateError, LimitReached, Denied,
    InternalError, ShuttingDown)}


def _raise(rc, message):
    code = -rc
    cls = _ERRORS.get(code, Error)
    raise cls(code, message, _s(_strerror(rc)))


def _error(rc, message):
    return _ERRORS.get(-rc, Error)(-rc, message, _s(_strerror(rc)))
