"""What SGLang's HiCache does with a storage backend, without SGLang or torch: the storage
config, the `dynamic` factory's construction, a numpy host KV pool offering the page-buffer
metadata of SGLang's MHA / MLA host pools (page_first layout), and the chained SHA-256 keys."""
import dataclasses
import hashlib
import importlib

import numpy


@dataclasses.dataclass
class StorageConfig:
    """The fields of SGLang's HiCacheStorageConfig the backend reads."""
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    is_mla_model: bool = False
    model_name: str = "fake-model"
    extra_config: dict = None


def create_dynamic_backend(storage_config):
    """StorageBackendFactory._create_dynamic_backend: import module_path, take class_name,
    call it as backend_class(storage_config, kwargs)."""
    extra = storage_config.extra_config
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    return cls(storage_config, {})


class HostPool:
    """A host KV pool: kv_buffer[2, tokens, layers, heads, head_dim] (page_first), or
    [tokens, layers, 1, kv_lora] for MLA (one buffer per page)."""

    def __init__(self, pages, page_size=16, layers=4, heads=2, head_dim=64, mla=False,
                 dtype=numpy.float16):
        self.page_size = page_size
        self.size = pages * page_size
        self.mla = mla
        shape = ((self.size, layers, 1, heads * head_dim) if mla
                 else (2, self.size, layers, heads, head_dim))
        self.kv_buffer = numpy.zeros(shape, dtype=dtype)
        self.token_bytes = layers * heads * head_dim * numpy.dtype(dtype).itemsize

    def get_page_buffer_meta(self, indices):
        """(pointers, sizes): per page K then V (MHA) or one pointer (MLA), as SGLang's pools."""
        indices = indices.tolist()
        assert len(indices) % self.page_size == 0
        base = self.kv_buffer.ctypes.data
        v_offset = self.size * self.token_bytes
        ptrs = []
        for i in range(0, len(indices), self.page_size):
            k = base + indices[i] * self.token_bytes
            ptrs += [k] if self.mla else [k, k + v_offset]
        return ptrs, [self.page_size * self.token_bytes] * len(ptrs)

    def page(self, index):
        """Copy of page `index` (token index of its first token): flat K then V bytes."""
        sl = slice(index, index + self.page_size)
        if self.mla:
            return self.kv_buffer[sl].tobytes()
        return self.kv_buffer[0, sl].tobytes() + self.kv_buffer[1, sl].tobytes()

    def fill(self, index, seed):
        sl = slice(index, index + self.page_size)
        rng = numpy.random.default_rng(seed)
        view = self.kv_buffer[sl] if self.mla else self.kv_buffer[:, sl]
        view[...] = rng.standard_normal(view.shape).astype(self.kv_buffer.dtype)


def host_indices(first_page, npages, page_size):
    """Token indices of npages consecutive pages (what the cache controller passes)."""
    return numpy.arange(first_page * page_size, (first_page + npages) * page_size)


def chained_keys(token_ids, page_size, prior=None):
    """SGLang's get_hash_str chain: sha256(prior digest, each token as 4 little-endian bytes)."""
    keys = []
    for i in range(0, len(token_ids) - len(token_ids) % page_size, page_size):
        h = hashlib.sha256()
        if prior:
            h.update(bytes.fromhex(prior))
        for t in token_ids[i:i + page_size]:
            h.update(int(t).to_bytes(4, "little", signed=False))
        prior = h.hexdigest()
        keys.append(prior)
    return keys
