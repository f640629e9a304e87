#!/usr/bin/env python3
"""Warm restarts (issue 33 item 2), with this script playing systemd's part.

  launcher.py BUILD_DIR [--figures]

It owns a NOTIFY_SOCKET (a datagram socket it reads with SCM_RIGHTS, keeping
the FDSTORE=1 descriptors under their FDNAME= and dropping them on
FDSTOREREMOVE=1), starts kvnoded with the kept descriptors as systemd does
(LISTEN_FDS, LISTEN_PID = the child's pid, set after fork and before exec,
LISTEN_FDNAMES), and checks, each step bounded in time:

  1. blocks put, SIGTERM: the daemon exits 0 and hands over the snapshot and
     its host memfd;
  2. a start with them: MATCH of every block hits at once, GET byte-exact,
     STATS says adopted N (warm_restart), nothing recovered from a store;
  3. a corrupted copy of the snapshot (one byte flipped, sealed again):
     cold start, the reason (checksum) logged and in STATS, nothing served;
     the same for an unsealed copy, a truncated one, host memory without
     its snapshot, and another memory.slab_bytes;
  4. a changed memory.host_bytes: cold start, the reason says so; an fd
     store too small for the hand-over ($FDSTORE) gets nothing;
  5. with the file store: adopted blocks are not read from the store nor
     indexed by its scan (counters), and a cold start from the store alone
     still serves every block byte-exact (the store stayed consistent);
  6. `kvnoded --takeover SOCKET` without systemd: the old daemon exits 0,
     the new one serves every block byte-exact (adopted, source takeover);
     as root, a takeover from uid 65534 is refused (SO_PEERCRED) and the
     old daemon goes on serving.
  7. KVCM (tests/sim's kvcm-sim): the stop that hands over sends no
     HOST_DOWN, and the warm-started daemon's publisher snapshots the adopted
     blocks as present without any engine connecting.

--figures prints blocks, bytes and the time from start to the first MATCH
hit for the warm restart and for a cold restart from the file store.
Every daemon it starts is stopped. Exit 0 ok, 1 a check failed.
"""
import array
import fcntl
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
FIGURES = "--figures" in sys.argv
KVNODED = os.path.abspath(os.path.join(BUILD, "kvnoded"))
CTL = os.path.abspath(os.path.join(BUILD, "kvnodectl"))
BLOCK = 64 * 1024
# --figures: WARM_BLOCKS blocks (default 48) in a host tier twice their size.
NBLOCKS = int(os.environ.get("WARM_BLOCKS", "48"))
HOST = "%dMiB" % max(64, 2 * NBLOCKS * BLOCK >> 20)
LAYOUT = ["--model", "warm-test", "--block-bytes", str(BLOCK)]
failures = []


def fail(msg):
    failures.append(msg)
    print("warm: FAIL: " + msg, file=sys.stderr)


class FakeSystemd:
    """NOTIFY_SOCKET and the fd store."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.store = {}          # name -> fd (ours)
        self.messages = []
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.busy = False
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        fdsize = array.array("i").itemsize
        while not self.stop:
            try:
                msg, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(64 * fdsize))
            except socket.timeout:
                continue
            except OSError:
                return
            self.busy = True
            fds = []
            for level, typ, data in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(data[: len(data) - (len(data) % fdsize)])
                    fds.extend(a)
            fields = dict(l.split("=", 1) for l in msg.decode().splitlines() if "=" in l)
            with self.lock:
                self.messages.append(fields)
                if fields.get("FDSTORE") == "1":
                    name = fields.get("FDNAME", "stored")
                    for fd in fds:
                        old = self.store.pop(name, None)
                        if old is not None:
                            os.close(old)
                        self.store[name] = fd
                    fds = []
                elif fields.get("FDSTOREREMOVE") == "1":
                    old = self.store.pop(fields.get("FDNAME", ""), None)
                    if old is not None:
                        os.close(old)
                if fields.get("READY") == "1":
                    self.ready.set()
            for fd in fds:
                os.close(fd)
            self.busy = False

    def take(self):
        """The stored fds (name -> fd), now the caller's, once every message
        sent so far is read (the daemon has exited)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (self.busy or select.select([self.sock], [], [], 0)[0]):
            time.sleep(0.02)
        with self.lock:
            s, self.store = self.store, {}
        return s

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()
        for fd in self.store.values():
            os.close(fd)


class Daemon:
    def __init__(self, tmp, name, opts, fds=None, env_extra=None, argv_extra=None):
        self.log_path = os.path.join(tmp, name + ".log")
        self.sd = FakeSystemd(os.path.join(tmp, name + ".notify"))
        argv = [KVNODED] + (argv_extra or [])
        for o in opts:
            argv += ["-s", o]
        env = dict(os.environ, NOTIFY_SOCKET=self.sd.path)
        env.pop("LISTEN_FDS", None)
        env.pop("LISTEN_PID", None)
        env.pop("LISTEN_FDNAMES", None)
        env.update(env_extra or {})
        fds = fds or {}
        names = list(fds.keys())
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                # Out of the way of 3.., then into place: as systemd does.
                high = [os.dup(fds[n]) for n in names]
                high = [fcntl.fcntl(f, fcntl.F_DUPFD, 100 + i) for i, f in enumerate(high)]
                for i, f in enumerate(high):
                    os.dup2(f, 3 + i, inheritable=True)
                os.dup2(log, 1)
                os.dup2(log, 2)
                if names:
                    env["LISTEN_FDS"] = str(len(names))
                    env["LISTEN_PID"] = str(os.getpid())
                    env["LISTEN_FDNAMES"] = ":".join(names)
                os.closerange(3 + len(names), 4096)
                os.execve(KVNODED, argv, env)
            finally:
                os._exit(127)
        os.close(log)
        self.pid = pid
        self.rc = None

    def wait_ready(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sd.ready.wait(0.1):
                return True
            if self.poll() is not None:
                return False
        return False

    def poll(self):
        if self.rc is None:
            p, status = os.waitpid(self.pid, os.WNOHANG)
            if p == self.pid:
                self.rc = os.waitstatus_to_exitcode(status)
        return self.rc

    def stop(self, timeout=60):
        """SIGTERM, wait; the exit code (killed after timeout: -9)."""
        if self.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.poll() is None:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                self.rc = -9
        return self.rc

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def close(self):
        """Stop it (if still running); every daemon here must exit 0 (a
        sanitizer build's report makes it fail)."""
        if self.stop() != 0:
            fail("%s exited %s:\n%s" % (os.path.basename(self.log_path), self.rc, self.log()[-4000:]))
        self.sd.close()


def ctl(sock, *args, check=True):
    r = subprocess.run([CTL, "-S", sock, "-t", "10000"] + list(args), capture_output=True, timeout=60)
    if check and r.returncode != 0:
        raise RuntimeError("kvnodectl %s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr.decode()))
    return r


def stats(sock):
    return json.loads(ctl(sock, "--json", "stats").stdout)


def match_len(sock, keys):
    r = ctl(sock, "--json", *(["match"] + LAYOUT + ["--keys-file", keys]), check=False)
    if r.returncode not in (0, 3):
        raise RuntimeError("match: exit %d: %s" % (r.returncode, r.stderr.decode()))
    doc = json.loads(r.stdout)
    return doc.get("matched", doc.get("prefix", 0)) if isinstance(doc, dict) else 0


def first_hit(sock, keys, t0, timeout=30):
    """Seconds from t0 to the first MATCH that finds every block; None if never."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if match_len(sock, keys) == NBLOCKS:
                return time.monotonic() - t0
        except RuntimeError:
            pass
        time.sleep(0.005)
    return None


def get_exact(sock, keys, want, out):
    ctl(sock, *(["get"] + LAYOUT + ["-o", out, "--keys-file", keys]))
    with open(out, "rb") as f:
        return f.read() == want


def opts_for(tmp, store=None, host=HOST):
    o = ["server.socket_path=" + os.path.join(tmp, "kvnode.sock"), "memory.host_bytes=" + host,
         "memory.slab_bytes=1MiB", "memory.huge_pages=off", "memory.pin_host=off", "hbm.backend=none",
         "admin.listen=off", "kvcm.enabled=off", "log.level=info"]
    if store:
        o += ["persist.backend=file", "persist.path=" + store, "persist.fsync=never"]
    else:
        o += ["persist.backend=off"]
    return o


def close_all(fds):
    for fd in fds.values():
        os.close(fd)


def copy_fds(fds):
    return {n: os.dup(fd) for n, fd in fds.items()}


def corrupt_copy(fd, at, seal=True):
    """A memfd with fd's bytes, byte `at` flipped (at None: none), sealed
    as the daemon seals it unless seal is False."""
    data = bytearray(os.pread(fd, os.fstat(fd).st_size, 0))
    if at is not None:
        data[at % len(data)] ^= 0x5A
    m = os.memfd_create("corrupt", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(m, bytes(data))
    if seal:
        fcntl.fcntl(m, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return m


def refused_start(tmp, name, fds, keys, want_reason, opts=None):
    """A start given fds (taken) is cold: refused, saying want_reason, nothing served."""
    sock = os.path.join(tmp, "kvnode.sock")
    d = Daemon(tmp, name, opts or opts_for(tmp), fds=fds)
    close_all(fds)
    try:
        if not d.wait_ready():
            fail("%s: the daemon did not start:\n%s" % (name, d.log()))
            return
        w = stats(sock).get("warm_restart", {})
        if w.get("state") != "refused" or want_reason not in w.get("reason", ""):
            fail("%s: warm_restart is %s, expected refused (%s)" % (name, w, want_reason))
        if "warm restart refused" not in d.log():
            fail("%s: no log line saying why:\n%s" % (name, d.log()))
        if match_len(sock, keys) != 0:
            fail("%s: blocks are served after a cold start" % name)
    finally:
        d.close()


def step(name):
    print("warm: " + name, flush=True)


def put_blocks(tmp, sock):
    rng = random.Random(33)
    payload = b"".join(rng.randbytes(BLOCK) for _ in range(NBLOCKS))
    data = os.path.join(tmp, "blocks.bin")
    keys = os.path.join(tmp, "keys.txt")
    with open(data, "wb") as f:
        f.write(payload)
    ctl(sock, *(["put"] + LAYOUT + [data, "--keys-out", keys]))
    return payload, keys


def run_memory_only(tmp, figures):
    sock = os.path.join(tmp, "kvnode.sock")
    step("1. cold start, put %d blocks of %d bytes, SIGTERM" % (NBLOCKS, BLOCK))
    d = Daemon(tmp, "a", opts_for(tmp))
    try:
        if not d.wait_ready():
            fail("the first daemon did not start:\n" + d.log())
            return
        payload, keys = put_blocks(tmp, sock)
        if match_len(sock, keys) != NBLOCKS:
            fail("the blocks just put do not match")
        rc = d.stop()
        if rc != 0:
            fail("the daemon exited %s on SIGTERM" % rc)
        handed = d.sd.take()
    finally:
        d.close()
    want = {"kvnode-warm-snapshot", "kvnode-warm-host-default"}
    if set(handed) != want:
        fail("handed over %s, expected %s" % (sorted(handed), sorted(want)))
        close_all(handed)
        return
    step("2. warm start with the handed-over fds")
    keep = copy_fds(handed)
    d = Daemon(tmp, "b", opts_for(tmp), fds=handed)
    try:
        ready = d.wait_ready()
        hit = first_hit(sock, keys, d.t0) if ready else None
        if not ready or hit is None:
            fail("the warm start does not match every block:\n" + d.log())
        else:
            st = stats(sock)
            w = st.get("warm_restart", {})
            if w.get("state") != "adopted" or w.get("adopted_blocks") != NBLOCKS or \
               w.get("adopted_bytes") != NBLOCKS * BLOCK:
                fail("stats warm_restart is %s, expected adopted %d blocks" % (w, NBLOCKS))
            if "persist" in st and st["persist"].get("recovery", {}).get("indexed", 0):
                fail("blocks were recovered from a store that is off")
            if not get_exact(sock, keys, payload, os.path.join(tmp, "out.bin")):
                fail("GET after the warm restart is not byte-exact")
            if figures:
                print("figure: warm restart (systemd fd store): %d blocks, %d bytes, first MATCH hit of every "
                      "block %.1f ms after exec (reading, checking and adopting the hand-over: %.1f ms)"
                      % (NBLOCKS, NBLOCKS * BLOCK, hit * 1000, w.get("seconds", 0) * 1000))
        if d.stop() != 0:
            fail("the warm-started daemon did not exit 0")
        if "FDSTOREREMOVE" not in "".join("%s" % m for m in d.sd.messages):
            fail("the warm-started daemon did not remove the adopted fds from the store")
        handed_b = d.sd.take()
    finally:
        d.close()
    close_all(handed_b)

    step("3. a corrupted snapshot: cold start, reason logged, nothing served")
    fds = copy_fds(keep)
    good = fds["kvnode-warm-snapshot"]
    fds["kvnode-warm-snapshot"] = corrupt_copy(good, os.fstat(good).st_size // 2)
    os.close(good)
    d = Daemon(tmp, "c", opts_for(tmp), fds=fds)
    close_all(fds)
    try:
        if not d.wait_ready():
            fail("the daemon given a corrupted snapshot did not start:\n" + d.log())
        else:
            w = stats(sock).get("warm_restart", {})
            if w.get("state") != "refused" or "checksum" not in w.get("reason", ""):
                fail("corrupted snapshot: warm_restart is %s, expected refused (checksum)" % w)
            if "warm restart refused" not in d.log() or "checksum" not in d.log():
                fail("corrupted snapshot: no log line saying why:\n" + d.log())
            if match_len(sock, keys) != 0:
                fail("corrupted snapshot: blocks are served after a cold start")
        if d.stop() != 0:
            fail("the cold-started daemon (corrupted snapshot) did not exit 0:\n" + d.log())
    finally:
        d.close()

    step("3b. an unsealed, a truncated snapshot, no snapshot at all, another memory.slab_bytes: cold start")
    fds = copy_fds(keep)
    good = fds["kvnode-warm-snapshot"]
    fds["kvnode-warm-snapshot"] = corrupt_copy(good, None, seal=False)
    os.close(good)
    refused_start(tmp, "c2", fds, keys, "sealed")
    fds = copy_fds(keep)
    good = fds["kvnode-warm-snapshot"]
    data = os.pread(good, os.fstat(good).st_size - 8, 0)
    os.close(good)
    m = os.memfd_create("short", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(m, data)
    fcntl.fcntl(m, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    fds["kvnode-warm-snapshot"] = m
    refused_start(tmp, "c3", fds, keys, "size")
    fds = copy_fds(keep)
    os.close(fds.pop("kvnode-warm-snapshot"))
    refused_start(tmp, "c4", fds, keys, "without its snapshot")
    o = [x for x in opts_for(tmp) if not x.startswith("memory.slab_bytes=")] + ["memory.slab_bytes=2MiB"]
    refused_start(tmp, "c5", copy_fds(keep), keys, "memory.slab_bytes", opts=o)

    step("4. memory.host_bytes changed: cold start")
    fds = copy_fds(keep)
    d = Daemon(tmp, "d", opts_for(tmp, host="%dMiB" % ((int(HOST[:-3]) // 2))), fds=fds)
    close_all(fds)
    try:
        if not d.wait_ready():
            fail("the daemon with another memory.host_bytes did not start:\n" + d.log())
        else:
            w = stats(sock).get("warm_restart", {})
            if w.get("state") != "refused" or "host tier" not in w.get("reason", ""):
                fail("changed host_bytes: warm_restart is %s, expected refused (host tier)" % w)
            if match_len(sock, keys) != 0:
                fail("changed host_bytes: blocks are served after a cold start")
        if d.stop() != 0:
            fail("the cold-started daemon (changed host_bytes) did not exit 0:\n" + d.log())
    finally:
        d.close()
    close_all(keep)

    step("4b. a unit whose fd store is too small ($FDSTORE, systemd 254+): nothing handed over, logged")
    d = Daemon(tmp, "d2", opts_for(tmp), env_extra={"FDSTORE": "1"})
    try:
        if not d.wait_ready():
            fail("the daemon with FDSTORE=1 did not start:\n" + d.log())
        else:
            if d.stop() != 0:
                fail("the daemon with FDSTORE=1 did not exit 0:\n" + d.log())
            left = d.sd.take()
            if left or "raise FileDescriptorStoreMax=" not in d.log():
                fail("FDSTORE=1: handed over %s, log without the reason" % sorted(left))
            close_all(left)
    finally:
        d.close()


def run_with_store(tmp, figures):
    sock = os.path.join(tmp, "kvnode.sock")
    store = os.path.join(tmp, "store")
    step("5. with the file store: put, SIGTERM, warm start")
    d = Daemon(tmp, "e", opts_for(tmp, store))
    try:
        if not d.wait_ready():
            fail("the daemon with a store did not start:\n" + d.log())
            return
        payload, keys = put_blocks(tmp, sock)
        d.stop()
        handed = d.sd.take()
    finally:
        d.close()
    d = Daemon(tmp, "f", opts_for(tmp, store), fds=handed)
    close_all(handed)
    try:
        hit = first_hit(sock, keys, d.t0) if d.wait_ready() else None
        if hit is None:
            fail("warm start with a store: the blocks do not match:\n" + d.log())
        else:
            t = time.monotonic()
            if not get_exact(sock, keys, payload, os.path.join(tmp, "out2.bin")):
                fail("warm start with a store: GET is not byte-exact")
            get_s = time.monotonic() - t
            deadline = time.monotonic() + 30
            st = stats(sock)
            while not st["persist"]["recovery"].get("complete") and time.monotonic() < deadline:
                time.sleep(0.05)
                st = stats(sock)
            p = st["persist"]
            w = st["warm_restart"]
            if w.get("adopted_blocks") != NBLOCKS:
                fail("warm start with a store: adopted %s, expected %d" % (w.get("adopted_blocks"), NBLOCKS))
            if p["recovery"].get("indexed") != 0:
                fail("warm start with a store: the scan indexed %s blocks, expected 0 (all adopted)"
                     % p["recovery"].get("indexed"))
            if p.get("promotions_total") != 0:
                fail("warm start with a store: %s promotions, expected 0 (no block read from the store)"
                     % p.get("promotions_total"))
            if figures:
                print("figure: warm restart with the file store: %d blocks, %d bytes, first MATCH hit of every "
                      "block %.1f ms after exec; GET of all of them %.1f ms (from memory)"
                      % (NBLOCKS, NBLOCKS * BLOCK, hit * 1000, get_s * 1000))
        d.stop()
        close_all(d.sd.take())
    finally:
        d.close()
    step("5b. cold start from the store alone: every block byte-exact")
    d = Daemon(tmp, "g", opts_for(tmp, store))
    try:
        hit = first_hit(sock, keys, d.t0) if d.wait_ready() else None
        if hit is None:
            fail("cold start from the store: the blocks do not match:\n" + d.log())
        else:
            t = time.monotonic()
            if not get_exact(sock, keys, payload, os.path.join(tmp, "out3.bin")):
                fail("cold start from the store: GET is not byte-exact")
            get_s = time.monotonic() - t
            w = stats(sock)["warm_restart"]
            if w.get("state") != "none" or w.get("adopted_blocks") != 0:
                fail("cold start: warm_restart is %s" % w)
            if figures:
                print("figure: cold restart from the file store: %d blocks, %d bytes, first MATCH hit of every "
                      "block %.1f ms after exec (found by the scan, in the store only); GET of all of them %.1f ms "
                      "(read back from disk)" % (NBLOCKS, NBLOCKS * BLOCK, hit * 1000, get_s * 1000))
        d.stop()
        close_all(d.sd.take())
    finally:
        d.close()


def run_takeover(tmp, figures):
    sock = os.path.join(tmp, "kvnode.sock")
    step("6. kvnoded --takeover: the old daemon hands over and exits 0")
    old = Daemon(tmp, "h", opts_for(tmp))
    new = None
    try:
        if not old.wait_ready():
            fail("the daemon to take over from did not start:\n" + old.log())
            return
        payload, keys = put_blocks(tmp, sock)
        if os.geteuid() == 0:
            step("6a. a takeover from uid 65534 is refused, the daemon goes on")
            os.chmod(tmp, 0o755)
            os.chmod(sock + ".takeover", 0o666)
            argv = [KVNODED, "--takeover", sock]
            for o in opts_for(tmp):
                argv += ["-s", o]

            def as_nobody():
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            r = subprocess.run(argv, capture_output=True, timeout=60, preexec_fn=as_nobody)
            err = r.stderr.decode() + r.stdout.decode()
            if r.returncode != 1 or "may not take over" not in err:
                fail("takeover from uid 65534: exit %d, expected 1 saying 'may not take over':\n%s"
                     % (r.returncode, err))
            if old.poll() is not None or match_len(sock, keys) != NBLOCKS:
                fail("after a refused takeover the old daemon is gone or lost its blocks")
            os.chmod(tmp, 0o700)
        else:
            print("warm: SKIP the other-uid takeover check: not root")
        new = Daemon(tmp, "i", opts_for(tmp), argv_extra=["--takeover", sock])
        deadline = time.monotonic() + 60
        while old.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if old.poll() != 0:
            fail("the daemon taken over from exited %s, expected 0:\n%s" % (old.poll(), old.log()))
        hit = first_hit(sock, keys, new.t0) if new.wait_ready() else None
        if hit is None:
            fail("after --takeover the blocks do not match:\n" + new.log())
            return
        w = stats(sock)["warm_restart"]
        if w.get("state") != "adopted" or w.get("source") != "takeover" or w.get("adopted_blocks") != NBLOCKS:
            fail("after --takeover warm_restart is %s, expected %d adopted from takeover" % (w, NBLOCKS))
        if not get_exact(sock, keys, payload, os.path.join(tmp, "out4.bin")):
            fail("after --takeover GET is not byte-exact")
        if figures:
            print("figure: --takeover: %d blocks, %d bytes, first MATCH hit %.1f ms after the new daemon's exec "
                  "(includes the old daemon's stop)" % (NBLOCKS, NBLOCKS * BLOCK, hit * 1000))
        if new.stop() != 0:
            fail("the daemon that took over did not exit 0")
    finally:
        old.close()
        if new:
            new.close()


def sim_state(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/state" % port, timeout=5) as r:
        return json.loads(r.read())


def sim_blocks(port):
    """(blocks held, snapshots taken, HOST_DOWNs applied) over every reporter."""
    st = sim_state(port)
    reps = st.get("reporters", {}).values()
    return (sum(r.get("block_count", 0) for r in reps), sum(r.get("snapshots", 0) for r in reps),
            sum(r.get("events", {}).get("HOST_DOWN", 0) for r in reps))


def wait_for(cond, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def run_kvcm(tmp, figures):
    sim_bin = os.path.join(BUILD, "kvcm-sim")
    if not os.access(sim_bin, os.X_OK):
        print("warm: SKIP the KVCM check: %s is not built" % sim_bin)
        return
    step("7. KVCM: no HOST_DOWN at a stop that hands over; the adopted blocks are published as present")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    sim_log = open(os.path.join(tmp, "kvcm-sim.log"), "w")
    sim = subprocess.Popen([sim_bin, "--http", "127.0.0.1:%d" % port], stdout=sim_log, stderr=subprocess.STDOUT)
    sock = os.path.join(tmp, "kvnode.sock")
    opts = opts_for(tmp) + ["kvcm.enabled=on", "kvcm.endpoints=http://127.0.0.1:%d" % port,
                            "kvcm.host_ip_port=10.9.8.7:7000", "kvcm.flush_interval=10ms"]
    opts.remove("kvcm.enabled=off")
    try:
        if not wait_for(lambda: sim_state(port) is not None, 10):
            fail("kvcm-sim did not start")
            return
        a = Daemon(tmp, "j", opts)
        try:
            if not a.wait_ready():
                fail("the daemon with KVCM did not start:\n" + a.log())
                return
            payload, keys = put_blocks(tmp, sock)
            if not wait_for(lambda: sim_blocks(port)[0] == NBLOCKS):
                fail("KVCM never got the %d blocks put: %s" % (NBLOCKS, sim_blocks(port)))
                return
            a.stop()
            handed = a.sd.take()
        finally:
            a.close()
        held, snaps, downs = sim_blocks(port)
        if downs != 0 or held != NBLOCKS:
            fail("after a stop that handed over, KVCM holds %d blocks and got %d HOST_DOWN (expected %d, 0)"
                 % (held, downs, NBLOCKS))
        b = Daemon(tmp, "k", opts, fds=handed)
        close_all(handed)
        try:
            if not b.wait_ready():
                fail("the warm start with KVCM did not start:\n" + b.log())
                return
            if not wait_for(lambda: sim_blocks(port)[1] > snaps and sim_blocks(port)[0] == NBLOCKS):
                fail("the warm-started daemon did not snapshot the %d adopted blocks to KVCM: %s\n%s"
                     % (NBLOCKS, sim_blocks(port), b.log()))
            b.stop()
            close_all(b.sd.take())
        finally:
            b.close()
    finally:
        sim.terminate()
        try:
            sim.wait(10)
        except subprocess.TimeoutExpired:
            sim.kill()
            sim.wait()
        sim_log.close()


def main():
    for b in (KVNODED, CTL):
        if not os.access(b, os.X_OK):
            print("warm: %s is not built (make all)" % b, file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory(prefix="kvnode-warm.") as tmp:
        try:
            run_memory_only(tmp, FIGURES)
            run_with_store(tmp, FIGURES)
            run_takeover(tmp, FIGURES)
            run_kvcm(tmp, FIGURES)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            import traceback
            traceback.print_exc()
            fail("%s: %s" % (type(e).__name__, e))
    if failures:
        print("warm: %d check(s) failed" % len(failures), file=sys.stderr)
        return 1
    print("warm: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
