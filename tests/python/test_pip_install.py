"""pip alone gives a working package (issue 31, item 11): `pip install ./python` into a fresh
venv of a Python as engine users have it: the venv's own pip (ensurepip's), no system site
packages, so no setuptools beyond ensurepip's and no `wheel` package, and no network
(--no-index). Then, outside the source tree, with no KVNODE_LIBRARY and no `make install`:
`import kvnode` loads the libkvnode the wheel carries (kvnode.library_path() says so, and it
is byte for byte the library the build was given), and a block round-trips through a real
kvnoded, synchronously and through AsyncClient.

Interpreters: Debian's /usr/bin/python3 (CI has it), and a non-Debian one when the machine has
one (pyenv's, or $KVNODE_TEST_PYTHON): Python >= 3.10, the package's requires-python."""
import filecmp
import glob
import os
import subprocess
import sys

import pytest

from conftest import ROOT, running_daemon

STEP_TIMEOUT_S = 40


def non_debian_python():
    """A Python >= 3.10 that is not Debian's, or None."""
    found = [os.environ.get("KVNODE_TEST_PYTHON")] if os.environ.get("KVNODE_TEST_PYTHON") else []
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[0-9]*/bin/python3")))
    for py in found:
        try:
            r = subprocess.run([py, "-c", "import sys, venv, ensurepip; "
                                "print(sys.version_info >= (3, 10))"],
                               capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and r.stdout.strip() == "True":
            return py
    return None


def library_under_test():
    lib = os.environ.get("KVNODE_LIBRARY") or os.path.join(ROOT, "build", "libkvnode.so.0")
    if not os.path.isfile(lib):
        pytest.fail("no libkvnode at %s (run `make all` or set KVNODE_LIBRARY)" % lib)
    return lib


PROBE = r"""
import os, select, sys
import kvnode, kvnode.sglang, kvnode.lmcache
print(kvnode.library_path())
lay = kvnode.Layout(model="pip", dtype="u8", block_tokens=4, block_bytes=4096,
                    num_layers=1, kv_heads=1, head_dim=1)
keys = kvnode.hash_tokens(list(range(8)), 4)
blocks = [bytes([i + 1]) * 4096 for i in range(2)]
with kvnode.Client(sys.argv[1], lay) as c:
    c.put(keys, blocks)
    assert c.get(keys) == blocks
with kvnode.AsyncClient(sys.argv[1], lay, timeout_ms=5000) as a:
    out = [bytearray(4096) for _ in keys]
    t = a.submit_get(keys, out)
    done = []
    while not done:
        select.select([a.event_fd], [], [], 5)
        done = a.drain()
    assert done[0].ticket == t and done[0].error is None and done[0].count == 2, done
    assert out == blocks
print("round trip ok")
"""


@pytest.mark.parametrize("which", ["debian", "non-debian"])
def test_pip_install_alone_gives_a_working_package(tmp_path, which):
    py = "/usr/bin/python3" if which == "debian" else non_debian_python()
    if py is None:
        pytest.skip("no non-Debian Python >= 3.10 on this machine (pyenv's, or "
                    "$KVNODE_TEST_PYTHON); the Debian case runs the same steps")
    lib = library_under_test()
    venv = tmp_path / "venv"
    # A plain venv: its own pip from ensurepip, nothing from the system's site-packages.
    subprocess.run([py, "-m", "venv", str(venv)], check=True, timeout=STEP_TIMEOUT_S)
    vpy = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "KVNODE_LIBRARY", "PIP_FIND_LINKS")}
    r = subprocess.run([vpy, "-c", "import importlib.util as u; print(u.find_spec('wheel'))"],
                       env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    assert r.stdout.strip() == "None", "the venv has a wheel package: %s" % r.stdout

    # The build is given the library under test; pip builds in isolation, offline.
    r = subprocess.run([vpy, "-m", "pip", "install", "--no-index", "--disable-pip-version-check",
                        "-q", os.path.join(ROOT, "python")],
                       env=dict(env, KVNODE_LIBRARY=lib), cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    assert r.returncode == 0, "pip install ./python failed:\n%s%s" % (r.stdout, r.stderr)

    r = subprocess.run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                       env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    site = r.stdout.strip()
    packaged = os.path.join(site, "kvnode", "libkvnode.so.0")
    assert filecmp.cmp(packaged, lib, shallow=False), "the wheel's libkvnode is not the build's"
    with open(glob.glob(os.path.join(site, "kvnode-*.dist-info", "METADATA"))[0]) as f:
        meta = f.read()
    assert "Requires-Python: >=3.10" in meta
    assert 'Requires-Dist: numpy; extra == "numpy"' in meta

    with running_daemon(str(tmp_path), str(tmp_path / "kvnode.sock")) as sock:
        r = subprocess.run([vpy, "-c", PROBE, sock], cwd=str(tmp_path), env=env,
                           capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    assert r.returncode == 0, "the installed package failed:\n%s%s" % (r.stdout, r.stderr)
    loaded, result = r.stdout.split("\n")[:2]
    assert loaded == packaged, "loaded %s, not the wheel's library" % loaded
    assert result == "round trip ok"


def test_build_backend_finds_the_trees_library(tmp_path):
    """Without KVNODE_LIBRARY the wheel carries build/libkvnode.so.0 of the source tree the
    package sits in; KVNODE_WHEEL_LIBRARY=none gives a wheel without one (tagged any)."""
    import zipfile
    built = os.path.join(ROOT, "build", "libkvnode.so.0")
    if not os.path.isfile(built):
        pytest.skip("no %s (this run's library is elsewhere: %s)" % (built, library_under_test()))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import kvnode_build as b; "
            "print(b.build_wheel(sys.argv[2]))")
    env = {k: v for k, v in os.environ.items() if k not in ("KVNODE_LIBRARY", "PYTHONPATH")}
    backend = os.path.join(ROOT, "python", "build_backend")
    for setting, want_lib in ((None, True), ("none", False)):
        out = tmp_path / ("with" if want_lib else "without")
        out.mkdir()
        e = dict(env, KVNODE_WHEEL_LIBRARY=setting) if setting else env
        r = subprocess.run([sys.executable, "-B", "-c", code, backend, str(out)], env=e,
                           capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
        assert r.returncode == 0, r.stderr
        name = r.stdout.strip()
        with zipfile.ZipFile(str(out / name)) as z:
            names = z.namelist()
            assert ("kvnode/libkvnode.so.0" in names) == want_lib, names
            if want_lib:
                with open(built, "rb") as f:
                    assert z.read("kvnode/libkvnode.so.0") == f.read()
        assert name.endswith("-py3-none-any.whl") != want_lib, name
