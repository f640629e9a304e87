"""The PEP 517 build backend of the kvnode Python package: stdlib only, so that `pip install
./python` works from any Python >= 3.10 with nothing to fetch (no setuptools, no wheel package:
pyproject.toml's build requirements are empty, which an isolated build satisfies offline).

A wheel carries the package's modules and the libkvnode it was built with, as
kvnode/libkvnode.so.0 (kvnode._lib loads it when $KVNODE_LIBRARY is not set). The library is,
in order: $KVNODE_LIBRARY; the build/ of the kvnode source tree this directory sits in (made
with `make` there first when missing); else the build fails, naming what it looked for.
KVNODE_WHEEL_LIBRARY=none builds a wheel without one (it loads the system's libkvnode).
The wheel is tagged for this platform (py3-none-<platform>): the library needs the shared
libraries it was linked with (libprotobuf-c, libc) on the machine that installs it.

Hooks: build_wheel, build_sdist, build_editable (a .pth pointing at this directory; the
library then comes from the source tree's build/ as for the uninstalled package), and the
metadata ones."""

import base64
import hashlib
import io
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile

_HERE = os.path.dirname(os.path.abspath(__file__))
_SRC = os.path.dirname(_HERE)                    # python/
_TREE = os.path.dirname(_SRC)                    # the kvnode source tree, when there is one
_PACKAGE = os.path.join(_SRC, "kvnode")
_LIBRARY = "libkvnode.so.0"

NAME = "kvnode"
SUMMARY = ("Python binding of libkvnode, the client library of kvnoded "
           "(node-local KV-cache daemon)")
# os.eventfd (AsyncClient, kvnode.lmcache) came with Python 3.10.
REQUIRES_PYTHON = ">=3.10"
# numpy: the README's and the docstrings' examples (the package itself is stdlib only).
EXTRAS = {"numpy": ["numpy"]}


def _version():
    with open(os.path.join(_PACKAGE, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("kvnode/__init__.py has no __version__")
    return m.group(1)


def _metadata():
    lines = ["Metadata-Version: 2.1", "Name: " + NAME, "Version: " + _version(),
             "Summary: " + SUMMARY, "Requires-Python: " + REQUIRES_PYTHON]
    for extra, reqs in EXTRAS.items():
        lines.append("Provides-Extra: " + extra)
        lines += ['Requires-Dist: %s; extra == "%s"' % (r, extra) for r in reqs]
    readme = os.path.join(_SRC, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return ("\n".join(lines) + "\n\n" + body).encode("utf-8")


def _tag(with_library):
    if not with_library:
        return "py3-none-any"
    return "py3-none-" + re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())


def _dist_info():
    return "%s-%s.dist-info" % (NAME, _version())


def _library():
    """The libkvnode file to put in the wheel, or None (KVNODE_WHEEL_LIBRARY=none)."""
    if os.environ.get("KVNODE_WHEEL_LIBRARY", "").lower() == "none":
        return None
    env = os.environ.get("KVNODE_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError("kvnode build: KVNODE_LIBRARY=%s is not a file" % env)
        return env
    built = os.path.join(_TREE, "build", _LIBRARY)
    makefile = os.path.join(_TREE, "Makefile")
    if not os.path.exists(built) and os.path.exists(makefile) and \
            os.path.exists(os.path.join(_TREE, "lib", "kvnode.h")):
        print("kvnode build: no %s yet; running make in %s" % (built, _TREE), file=sys.stderr)
        subprocess.run(["make", "-C", _TREE, "build/" + _LIBRARY], check=True,
                       stdout=sys.stderr)
    if os.path.exists(built):
        return built
    raise RuntimeError(
        "kvnode build: no libkvnode to put in the wheel: set KVNODE_LIBRARY to a "
        "libkvnode.so.0 (looked for it in %s too), build it with `make` at the top of the kvnode "
        "source tree, or set KVNODE_WHEEL_LIBRARY=none for a wheel that loads the system's "
        "libkvnode" % built)


def _modules():
    return sorted(n for n in os.listdir(_PACKAGE) if n.endswith(".py"))


class _Wheel:
    """A wheel being written: files with their RECORD lines."""

    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
        self.record = []

    def add(self, name, data, mode=0o644):
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.record.append("%s,sha256=%s,%d" % (name, digest, len(data)))

    def close(self, dist_info):
        self.record.append(dist_info + "/RECORD,,")
        self.zip.writestr(zipfile.ZipInfo(dist_info + "/RECORD", date_time=(1980, 1, 1, 0, 0, 0)),
                          "\n".join(self.record) + "\n")
        self.zip.close()


def _wheel_file(pure):
    return ("Wheel-Version: 1.0\nGenerator: kvnode_build\nRoot-Is-Purelib: %s\nTag: %s\n"
            % ("true" if pure else "false", _tag(not pure))).encode()


def _write_dist_info(wheel, pure):
    di = _dist_info()
    wheel.add(di + "/METADATA", _metadata())
    wheel.add(di + "/WHEEL", _wheel_file(pure))
    wheel.add(di + "/top_level.txt", (NAME + "\n").encode())
    return di


def _name(with_library):
    return "%s-%s-%s.whl" % (NAME, _version(), _tag(with_library))


# ------------------------------------------------------------ PEP 517 / 660 hooks

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    di = os.path.join(metadata_directory, _dist_info())
    os.makedirs(di, exist_ok=True)
    with open(os.path.join(di, "METADATA"), "wb") as f:
        f.write(_metadata())
    return _dist_info()


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    lib = _library()
    name = _name(lib is not None)
    wheel = _Wheel(os.path.join(wheel_directory, name))
    try:
        for mod in _modules():
            with open(os.path.join(_PACKAGE, mod), "rb") as f:
                wheel.add("kvnode/" + mod, f.read())
        if lib is not None:
            with open(lib, "rb") as f:
                wheel.add("kvnode/" + _LIBRARY, f.read(), 0o755)
        wheel.close(_write_dist_info(wheel, pure=lib is None))
    except BaseException:
        wheel.zip.close()
        os.unlink(os.path.join(wheel_directory, name))
        raise
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = _name(False)
    wheel = _Wheel(os.path.join(wheel_directory, name))
    wheel.add("kvnode.pth", (_SRC + "\n").encode())
    wheel.close(_write_dist_info(wheel, pure=True))
    return name


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (NAME, _version())
    name = base + ".tar.gz"
    files = ["pyproject.toml", "README.md", "build_backend/kvnode_build.py"] + \
        ["kvnode/" + m for m in _modules()]
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            tar.add(os.path.join(_SRC, rel), arcname=base + "/" + rel)
        data = _metadata()
        info = tarfile.TarInfo(base + "/PKG-INFO")
        info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(data))
    return name


__all__ = ["build_wheel", "build_sdist", "build_editable", "get_requires_for_build_wheel",
           "get_requires_for_build_sdist", "get_requires_for_build_editable",
           "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable"]
