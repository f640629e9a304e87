"""examples/prefix_cache_demo.py against a real kvnoded: equal logits, shorter second prefill."""

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
for _p in (os.path.join(ROOT, "python"), os.path.join(ROOT, "examples")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

TIMEOUT_S = 60


def _on_alarm(signum, frame):
    raise TimeoutError("test_demo: no result within %d s (daemon or demo hung)" % TIMEOUT_S)


@pytest.fixture
def daemon(tmp_path):
    binary = os.environ.get("KVNODED") or os.path.join(ROOT, "build", "kvnoded")
    if not os.access(binary, os.X_OK):
        pytest.fail("kvnoded not found at %s (run `make all` or set KVNODED)" % binary)
    sock = str(tmp_path / "s.sock")
    log = open(tmp_path / "kvnoded.log", "w+")
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(TIMEOUT_S)
    proc = subprocess.Popen(
        [binary,
         "-s", "server.socket_path=" + sock,
         "-s", "memory.host_bytes=64MiB",
         "-s", "memory.pin_host=off",
         "-s", "persist.backend=off",
         "-s", "admin.listen=off"],
        stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail("kvnoded exited with %s:\n%s" % (proc.returncode, log.read()))
            if time.monotonic() > deadline:
                pytest.fail("kvnoded did not create %s within 10 s" % sock)
            time.sleep(0.02)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        log.close()


def test_demo_reuses_prefix(daemon):
    import prefix_cache_demo

    r = prefix_cache_demo.run_demo(daemon, small=True)
    print(r)
    assert r["matched_blocks"] == r["prefix_tokens"] // r["block_tokens"]
    assert r["loaded_blocks"] == r["matched_blocks"]
    assert r["computed_tokens_b"] < r["block_tokens"]
    assert r["equal"], "logits differ from a full recompute: max |diff| %g" % r["max_abs_logit_diff"]
    assert r["max_abs_logit_diff"] <= 1e-5
    assert r["prefill_b_s"] < r["prefill_a_s"], r
