"""Shared by the Python suites: start a kvnoded of this build on a socket in a
temporary directory, stop it afterwards (its log is shown when it fails to
start), and a per-test SIGALRM timeout so a hang fails instead of blocking
`make check`."""
import contextlib
import os
import signal
import socket
import subprocess
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TEST_TIMEOUT_S = 60


def kvnoded_binary():
    binary = os.environ.get("KVNODED") or os.path.join(ROOT, "build", "kvnoded")
    if not os.access(binary, os.X_OK):
        pytest.fail("kvnoded not found at %s (run `make all` or set KVNODED)" % binary)
    return binary


@contextlib.contextmanager
def running_daemon(directory, sock, *options):
    """kvnoded serving on sock (its log in directory), with a small host tier
    of ordinary pages, no store and no admin port; options are extra
    `-s key=value` settings."""
    # huge_pages off: the same pages whatever the machine offers, and none
    # taken from a hugetlb pool a C suite reserved for itself meanwhile.
    opts = ["server.socket_path=" + sock, "memory.host_bytes=64MiB", "memory.pin_host=off",
            "memory.huge_pages=off", "persist.backend=off", "admin.listen=off",
            "log.level=info"] + list(options)
    argv = [kvnoded_binary()]
    for o in opts:
        argv += ["-s", o]
    with open(os.path.join(directory, "kvnoded.log"), "w+") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=directory)
        try:
            deadline = time.monotonic() + 20
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    pytest.fail("kvnoded exited with %d:\n%s" % (proc.returncode, log.read()))
                try:
                    with socket.socket(socket.AF_UNIX) as s:
                        s.connect(sock)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        pytest.fail("kvnoded socket %s not connectable in 20 s" % sock)
                    time.sleep(0.02)
            yield sock
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(autouse=True)
def _timeout():
    def on_alarm(signum, frame):
        raise TimeoutError("test exceeded %d s (daemon or test hung)" % TEST_TIMEOUT_S)
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TEST_TIMEOUT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
