"""Keys of the kvnode package: the block keys of a token sequence (:func:`hash_tokens`),
foreign keys (an engine's digests) folded into kvnode keys and check words (:func:`fold_key`,
:func:`fold_keys`, :func:`fold_digests`), :func:`prefix`, and the ctypes arrays of keys and
check words every call takes (``_keys_array``, ``_checks_array``)."""

import ctypes
import hashlib
import struct

from ._lib import _fold_digests, _fold_text, _hash

_KEY_TYPES = (ctypes.c_int64, ctypes.c_longlong)
_CHECK_TYPES = (ctypes.c_uint64, ctypes.c_ulonglong)


def _keys_array(keys):
    """keys as (a ctypes int64 array, n). A ctypes array of c_int64 (as :func:`fold_digests`
    gives) goes as it is, without a copy; any other iterable of ints is copied into one."""
    if isinstance(keys, ctypes.Array) and keys._type_ in _KEY_TYPES:
        return keys, len(keys)
    keys = list(keys)
    arr = (ctypes.c_int64 * max(len(keys), 1))(*keys)
    return arr, len(keys)


def _checks_array(checks, n):
    """checks (None, a ctypes c_uint64 array, or n ints) as what a _checked call takes."""
    if checks is None:
        return None
    if not (isinstance(checks, ctypes.Array) and checks._type_ in _CHECK_TYPES):
        checks = list(checks)
        if len(checks) != n:
            raise ValueError("%d keys but %d check words: give one per key" % (n, len(checks)))
        return (ctypes.c_uint64 * max(n, 1))(*checks)
    if len(checks) != n:
        raise ValueError("%d keys but %d check words: give one per key" % (n, len(checks)))
    return checks


def prefix(array, n):
    """The first ``n`` items of a ctypes array (keys or check words) as an array over the
    same memory (no copy): what a call on a prefix of a folded batch takes."""
    if not 0 <= n <= len(array):
        raise ValueError("prefix of %d items of an array of %d" % (n, len(array)))
    return (array._type_ * n).from_buffer(array)


def _hexlike(key):
    """fold_key's test for a hex digest: at least 16 hex digits, an even number."""
    return len(key) >= 16 and len(key) % 2 == 0 and key.isascii() and key.isalnum()


def fold_key(key):
    """kvnode's 64-bit key for a foreign key (an engine's digest string or bytes):
    deterministic across processes and machines. A hex digest (at least 16 hex
    digits, as SGLang's chained SHA-256 keys) gives its first 64 bits; any other
    string or bytes the first 64 bits of its SHA-256. Two keys whose 64 bits agree
    would read each other's block (about n**2 / 2**65 for n stored blocks of random
    digests) unless a check word tells them apart: see :func:`fold_digests`."""
    if isinstance(key, str):
        # isascii + isalnum leave int() only hex digits to accept (or reject), bar "0x"
        if _hexlike(key) and key[1] not in "xX":
            try:
                value = int(key, 16) >> (4 * (len(key) - 16))
                return value - (1 << 64) if value >= (1 << 63) else value
            except ValueError:
                pass
        key = key.encode("utf-8")
    digest = hashlib.sha256(bytes(key)).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _digest16(key):
    """16 bytes for one foreign key: fold_key's 64 bits, then those of its check word."""
    if isinstance(key, str):
        if _hexlike(key):
            try:
                raw = bytes.fromhex(key)
            except ValueError:
                raw = None
            if raw is not None:
                if len(raw) >= 16:
                    return raw[:16]
                return raw[:8] + hashlib.sha256(key.encode("ascii")).digest()[8:16]
        key = key.encode("utf-8")
    return hashlib.sha256(bytes(key)).digest()[:16]


def _digests(keys):
    """(digests laid end to end, digest_len) for a list of foreign keys: one hex decode for
    a batch of 64-hex-digit strings (SGLang's keys), else 16 bytes per key (_digest16)."""
    n = len(keys)
    if n and type(keys[0]) is str and len(keys[0]) == 64:
        try:
            joined = "".join(keys)
        except TypeError:           # not all strings
            joined = ""
        if len(joined) == 64 * n and set(map(len, keys)) == {64}:
            try:
                raw = bytes.fromhex(joined)
            except ValueError:      # some key is not hex
                raw = b""
            if len(raw) == 32 * n:  # (fromhex skips whitespace: a key with some is not hex)
                return raw, 32
    return b"".join(map(_digest16, keys)), 16


def fold_digests(keys):
    """Fold a batch of foreign keys (an engine's digest strings or bytes) into kvnode keys
    and check words: ``(keys_array, checks_array)``, a ctypes ``c_int64`` and a ``c_uint64``
    array of ``len(keys)`` items, which every :class:`Client` method taking keys and
    ``checks`` accepts as they are (no conversion; :func:`prefix` cuts them).

    Each key is seen as a digest: a string of 64 hex digits (SGLang's chained SHA-256) is
    its 32 bytes, another hex string of at least 32 digits its first 16 bytes; any other
    string or bytes (LMCache's keys) its SHA-256 (for a hex string of 16 to 31 digits, the
    key part comes from the hex digits and the check part from its SHA-256). The key is the
    digest's first 8 bytes, big-endian, signed (what :func:`fold_key` gives, unchanged since
    before check words); the check word is the next 8 bytes (0 becomes 1: 0 means "no
    word"). A batch of strings is folded in one call into libkvnode (``kvnode_fold_text``),
    without per-key work in Python; bytes keys (or a libkvnode without that call) are hashed
    per key here, then folded by ``kvnode_fold_digests``. A block stored with a word is
    found only with that word: one stored without (by an older daemon or client) is a miss
    for calls that send words.

    With a daemon that honours check words (:attr:`Client.has_check_words`), pass the words
    as ``checks``: two keys whose 64-bit keys collide then miss each other's block instead
    of reading it."""
    if type(keys) is not list:
        keys = list(keys)
    n = len(keys)
    karr, carr = (ctypes.c_int64 * n)(), (ctypes.c_uint64 * n)()
    if n == 0:
        return karr, carr
    if _fold_text is not None:
        # Strings (SGLang's and LMCache's keys): one call folds them all, SHA-256 included.
        try:
            joined = "\0".join(keys)
        except TypeError:           # not all strings
            joined = None
        if joined is not None:      # (0 back: a key holds a NUL, which the C side counts)
            text = joined.encode("utf-8")
            if _fold_text(text, len(text), n, karr, carr) == n:
                return karr, carr
    raw, dlen = _digests(keys)
    if _fold_digests is not None:
        _fold_digests(raw, n, dlen, karr, carr)
        return karr, carr
    fmt = struct.Struct(">qQ%dx" % (dlen - 16))    # libkvnode before KVNODE_0.4
    for i, (k, w) in enumerate(fmt.iter_unpack(raw)):
        karr[i], carr[i] = k, (w or 1)
    return karr, carr


def fold_keys(keys):
    """``[fold_key(k) for k in keys]`` (a list of ints), faster for a batch: see
    :func:`fold_digests`, whose key array the Client methods take without a copy."""
    return list(fold_digests(keys)[0])



def hash_tokens(token_ids, block_tokens):
    """Block keys of a token sequence: the rtp-llm / KVCM chained hash of libkvnode.

    One key (a signed 64-bit int) per *full* block of ``block_tokens`` tokens;
    a trailing partial block gets no key.
    """
    if block_tokens <= 0:
        raise ValueError("block_tokens must be > 0")
    toks = list(token_ids)
    n = len(toks)
    nkeys = n // block_tokens
    if nkeys == 0:
        return []
    t = (ctypes.c_int64 * n)(*toks)
    k = (ctypes.c_int64 * nkeys)()
    got = _hash(t, n, block_tokens, k, nkeys)
    return list(k[:got])
