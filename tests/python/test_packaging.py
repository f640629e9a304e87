"""The binding installs as a package: `pip install --no-index --no-build-isolation`
of a copy of python/ into a fresh venv (--system-site-packages: Debian's pip runs
the package's own stdlib build backend, offline; the build takes the library from
KVNODE_LIBRARY, which the suite sets), then, outside the source tree, the installed
package is the one imported, its version is the release's (Makefile VERSION),
and it round-trips a block with a real kvnoded."""
import os
import re
import shutil
import subprocess
import sys

from conftest import ROOT, running_daemon

PIP_TIMEOUT_S = 50


def makefile_version():
    with open(os.path.join(ROOT, "Makefile")) as f:
        m = re.search(r"^VERSION\s*:=\s*(\S+)", f.read(), re.M)
    assert m, "Makefile has no VERSION"
    return m.group(1)


def test_pip_install_into_a_venv(tmp_path):
    venv = tmp_path / "venv"
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    # --without-pip: the venv runs Debian's pip from the system site (installing
    # into the venv); seeding the venv with its own pip (ensurepip) is what
    # took minutes on a loaded machine.
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True, timeout=PIP_TIMEOUT_S)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation",
                        "--disable-pip-version-check", "-q", str(src)],
                       env=env, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    assert r.returncode == 0, "pip install failed:\n%s%s" % (r.stdout, r.stderr)

    probe = ("import sys, kvnode, kvnode.sglang, kvnode.lmcache\n"
             "print(kvnode.__file__)\n"
             "print(kvnode.__version__)\n"
             "lay = kvnode.Layout(model='pkg', dtype='u8', block_tokens=4, block_bytes=4096,\n"
             "                    num_layers=1, kv_heads=1, head_dim=1)\n"
             "with kvnode.Client(sys.argv[1], lay) as c:\n"
             "    keys = kvnode.hash_tokens(list(range(8)), 4)\n"
             "    c.put(keys, [bytes([i + 1]) * 4096 for i in range(2)])\n"
             "    got = c.get(keys)\n"
             "    assert [bytes(g) for g in got] == [bytes([i + 1]) * 4096 for i in range(2)], got\n"
             "assert all(m.__file__.startswith(sys.prefix) for m in (kvnode.sglang, kvnode.lmcache))\n"
             "print('round trip ok')\n")
    with running_daemon(str(tmp_path), str(tmp_path / "kvnode.sock")) as sock:
        r = subprocess.run([py, "-c", probe, sock], cwd=str(tmp_path), env=env,
                           capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, "installed package failed:\n%s%s" % (r.stdout, r.stderr)
    where, version, result = r.stdout.split("\n")[:3]
    assert where.startswith(str(venv)), "imported %s, not the installed package" % where
    assert version == makefile_version()
    assert result == "round trip ok"


def test_package_version_is_the_release():
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import kvnode
    assert kvnode.__version__ == makefile_version()
