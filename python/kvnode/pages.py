"""Pages by address: the caller's pages of a batched or asynchronous call (addresses,
tensors, buffers) turned into the array of addresses libkvnode takes, with the buffers
exported from the caller's objects held until the call (or its ticket) is done."""

import ctypes
import operator

from ._lib import _P


class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", _P), ("obj", _P), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p), ("shape", _P),
                ("strides", _P), ("suboffsets", _P), ("internal", _P)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.restype = ctypes.c_int
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.restype = None
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_PyBUF_SIMPLE, _PyBUF_WRITABLE = 0, 1


_char_from_buffer = ctypes.c_char.from_buffer
_nbytes = operator.attrgetter("nbytes")


class _Pages:
    """The addresses of a batch's pages, with the buffers exported from the
    caller's objects held (so they cannot be resized or freed) until release().

    A page is an int (an address: the caller keeps the memory valid), an
    object with ``data_ptr()`` (a torch tensor: its storage must be contiguous
    and stay alive), or any C-contiguous buffer (bytes, bytearray, memoryview,
    numpy array) of at least ``block_bytes`` bytes, writable when ``writable``.
    """

    def __init__(self, pages, n, block_bytes, writable, device):
        self._held = []
        self._views = None
        if isinstance(pages, ctypes.Array) and pages._type_ is _P:
            # Addresses already in a ctypes void* array: taken as they are, as ints are.
            if len(pages) != n:
                raise ValueError("%d keys but %d pages: give one page per key" % (n, len(pages)))
            self.objects, self.array, self.bare = pages, pages, True
            return
        pages = list(pages)
        if len(pages) != n:
            raise ValueError("%d keys but %d pages: give one page per key" % (n, len(pages)))
        self.objects = pages
        if n and set(map(type, pages)) == {int}:      # addresses (SGLang's page buffers)
            if min(pages) <= 0:
                i = next(i for i, p in enumerate(pages) if p <= 0)
                raise ValueError("page %d: address %d is not a pointer" % (i, pages[i]))
            self.array, self.bare = (_P * n)(*pages), True
            return
        self.bare = False       # objects to keep alive (and buffers held) until released
        if n and set(map(type, pages)) == {memoryview}:
            # LMCache's pages: ctypes views hold them (released with the views), far cheaper
            # than a buffer request per page; read-only ones take the general way below.
            try:
                self._views = list(map(_char_from_buffer, pages))
            except TypeError:       # read-only or not contiguous
                self._views = None
            if self._views is not None:
                short = [i for i, nb in enumerate(map(_nbytes, pages)) if nb < block_bytes]
                if short:
                    self.release()
                    raise ValueError("page %d has %d bytes, a block is %d"
                                     % (short[0], pages[short[0]].nbytes, block_bytes))
                self.array = (_P * n)(*map(ctypes.addressof, self._views))
                return
        self.array = (_P * max(n, 1))()
        try:
            for i, page in enumerate(pages):
                self.array[i] = self._address(i, page, block_bytes, writable, device)
        except BaseException:
            self.release()
            raise

    def _address(self, i, page, block_bytes, writable, device):
        if isinstance(page, int):
            if page <= 0:
                raise ValueError("page %d: address %d is not a pointer" % (i, page))
            return page
        data_ptr = getattr(page, "data_ptr", None)
        if callable(data_ptr):
            nbytes = page.numel() * page.element_size() if hasattr(page, "numel") else None
            if nbytes is not None and nbytes < block_bytes:
                raise ValueError("page %d has %d bytes, a block is %d" % (i, nbytes, block_bytes))
            return int(data_ptr())
        if device:
            raise ValueError("page %d: device=True takes device addresses (int) or tensors with "
                             "data_ptr(), not %s" % (i, type(page).__name__))
        view = _PyBuffer()
        flags = _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE
        try:
            _get_buffer(page, ctypes.byref(view), flags)
        except (BufferError, TypeError) as e:
            raise ValueError("page %d (%s) is not a %scontiguous buffer: %s"
                             % (i, type(page).__name__, "writable " if writable else "", e)) from None
        self._held.append(view)
        if view.len < block_bytes:
            raise ValueError("page %d has %d bytes, a block is %d" % (i, view.len, block_bytes))
        return view.buf

    def release(self):
        held, self._held = self._held, []
        self._views = None      # (the ctypes views' buffers go with them)
        for view in held:
            _release_buffer(ctypes.byref(view))
