#!/usr/bin/env python3
"""unit-families.py: the systemd unit allows exactly the socket families kvnoded opens (issue 30).

Usage: unit-families.py ROOT [UNIT]      (UNIT: default ROOT/systemd/kvnoded.service)
       unit-families.py --needed ROOT    (print the families the daemon needs, one a line)

The families the daemon needs are
  - the first argument of every socket()/socketpair() call in ROOT/daemon and
    ROOT/lib (*.c, *.h; comments and string literals ignored; PF_X counts as
    AF_X). A call whose family is not an AF_/PF_ constant must say which it can
    be in a comment on its line or the two above: /* unit-families: AF_INET AF_INET6 */
  - the families of the libc calls in LIBC_CALLS that open a socket of their
    own (getifaddrs, if_nameindex: AF_NETLINK)
  - those of the libraries kvnoded links (DAEMON_PKGS in ROOT/Makefile), from
    LIBRARY_FAMILIES below; a library missing from that table is an error.
The unit's RestrictAddressFamilies= (allow list; ~ deny lists and resets read
as systemd.exec(5) says) must allow every one of them, and nothing else.
Prints what is wrong, naming the family and where it is opened; exits 1.
"""
import os
import re
import sys

# What each library kvnoded links opens, and why. Families a library can open
# but falls back without are not listed: glibc's getaddrinfo(AI_ADDRCONFIG)
# asks AF_NETLINK (NETLINK_ROUTE) for the host's addresses and assumes both
# IPv4 and IPv6 when refused. The CUDA driver (libcuda.so.1, loaded at run
# time, not linked) reaches the MPS control daemon, when MPS is used, over
# AF_UNIX, which the daemon needs anyway.
LIBRARY_FAMILIES = {
    # evhttp_bind_socket_with_handle: the [admin] and [kvs_server] HTTP listeners
    # on host:port (either family, as the host resolves); evconnlistener on the
    # unix sockets (ours), and evutil's internal notify pipe falls back to
    # socketpair(AF_UNIX) where eventfd/pipe2 fail.
    "libevent": {"AF_INET", "AF_INET6", "AF_UNIX"},
    # The KVCM client (daemon/kvcm/) and the v6d store's HTTP (daemon/persist/kvs/v6d.c)
    # connect to host:port; the threaded resolver and multi wake-up use socketpair(AF_UNIX).
    "libcurl": {"AF_INET", "AF_INET6", "AF_UNIX"},
    # redisConnectWithTimeout to the persist.redis nodes (host:port, IPv4 or IPv6).
    "hiredis": {"AF_INET", "AF_INET6"},
    # sd_notify: a datagram to $NOTIFY_SOCKET (READY, STATUS, WATCHDOG). sd_listen_fds opens nothing.
    "libsystemd": {"AF_UNIX"},
    # No sockets.
    "libprotobuf-c": set(),
    "jansson": set(),
    "inih": set(),
}

# libc calls that open a socket of their own and fail without it.
LIBC_CALLS = {
    "getifaddrs": "AF_NETLINK",      # glibc asks NETLINK_ROUTE for the interfaces and addresses
    "if_nameindex": "AF_NETLINK",    # likewise
}

CALL = re.compile(r"(?<![\w.>])(socket|socketpair)\s*\(\s*([^,()]*)")
FAMILY = re.compile(r"^(?:AF|PF)_([A-Z0-9_]+)$")
LIBC_CALL = re.compile(r"(?<![\w.>])(%s)\s*\(" % "|".join(LIBC_CALLS))
NOTE = re.compile(r"unit-families:\s*((?:AF_[A-Z0-9_]+[\s,]*)+)")


def strip_c(text):
    """text with comments and string/char literals blanked, newlines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def code_families(root, errors):
    """{family: [where...]} of the socket calls under root/daemon and root/lib."""
    found = {}
    for top in ("daemon", "lib"):
        for d, _, files in sorted(os.walk(os.path.join(root, top))):
            for f in sorted(files):
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                lines = text.split("\n")
                for m in CALL.finditer(strip_c(text)):
                    line = text.count("\n", 0, m.start()) + 1
                    arg = m.group(2).strip()
                    where = "%s:%d (%s(%s, ...))" % (rel, line, m.group(1), arg)
                    fm = FAMILY.match(arg)
                    if fm:
                        fams = ["AF_" + fm.group(1)]
                    else:
                        note = NOTE.search("\n".join(lines[max(0, line - 3):line]))
                        if not note:
                            errors.append("%s: the family is not an AF_/PF_ constant; say which it can be in a "
                                          "comment on that line or the two above: /* unit-families: AF_... */"
                                          % where)
                            continue
                        fams = re.findall(r"AF_[A-Z0-9_]+", note.group(1))
                    for fam in fams:
                        found.setdefault(fam, []).append(where)
                for m in LIBC_CALL.finditer(strip_c(text)):
                    line = text.count("\n", 0, m.start()) + 1
                    found.setdefault(LIBC_CALLS[m.group(1)], []).append("%s:%d (%s())" % (rel, line, m.group(1)))
    return found


def linked_libraries(root, errors):
    """DAEMON_PKGS of root/Makefile (every := / = / += line)."""
    pkgs = []
    try:
        with open(os.path.join(root, "Makefile"), encoding="utf-8") as fh:
            for line in fh:
                m = re.match(r"^\s*DAEMON_PKGS\s*(?::=|\+=|=)(.*)$", line)
                if m:
                    pkgs += m.group(1).split("#")[0].split()
    except OSError as e:
        errors.append("cannot read the Makefile: %s" % e)
    if not pkgs:
        errors.append("Makefile: no DAEMON_PKGS (the libraries kvnoded links) found")
    return pkgs


def needed_families(root, errors):
    found = code_families(root, errors)
    for lib in linked_libraries(root, errors):
        if lib not in LIBRARY_FAMILIES:
            errors.append("kvnoded links %s, which LIBRARY_FAMILIES in scripts/unit-families.py does not "
                          "know: add it with the socket families it opens (or none)" % lib)
            continue
        for fam in LIBRARY_FAMILIES[lib]:
            found.setdefault(fam, []).append(lib)
    return found


def unit_allowed(unit_path, errors):
    """The families the unit's [Service] allows: a set, or None for all of them."""
    allowed, deny = None, False
    section, seen = None, False
    with open(unit_path, encoding="utf-8") as fh:
        text = re.sub(r"\\\n", " ", fh.read())
    for raw in text.split("\n"):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, value = line.partition("=")
        if section != "[Service]" or key.strip() != "RestrictAddressFamilies":
            continue
        seen = True
        value = value.strip()
        if not value:
            allowed, deny = None, False
        elif value == "none":
            allowed, deny = set(), False
        elif value.startswith("~"):
            fams = set(value[1:].split())
            if allowed is None:
                allowed, deny = fams, True
            elif deny:
                allowed |= fams
            else:
                allowed -= fams
        else:
            fams = set(value.split())
            if allowed is None:
                allowed, deny = fams, False
            elif deny:
                allowed -= fams
            else:
                allowed |= fams
    if not seen or allowed is None:
        errors.append("%s: no RestrictAddressFamilies= allow list: the unit must list the socket families "
                      "kvnoded opens, and only those" % unit_path)
        return None
    if deny:
        errors.append("%s: RestrictAddressFamilies= is a deny list (~): list the families kvnoded opens "
                      "instead" % unit_path)
        return None
    return allowed


def main(argv):
    errors = []
    if len(argv) == 3 and argv[1] == "--needed":
        needed = needed_families(argv[2], errors)
        for e in errors:
            print("unit-families: " + e, file=sys.stderr)
        print("\n".join(sorted(needed)))
        return 1 if errors else 0
    if len(argv) not in (2, 3):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    root = argv[1]
    unit = os.path.normpath(argv[2] if len(argv) == 3 else os.path.join(root, "systemd", "kvnoded.service"))
    needed = needed_families(root, errors)
    allowed = unit_allowed(unit, errors)
    if allowed is not None:
        for fam in sorted(set(needed) - allowed):
            errors.append("%s: RestrictAddressFamilies= does not allow %s, which kvnoded opens: %s; add it "
                          "(under the unit that socket() fails with EAFNOSUPPORT)"
                          % (unit, fam, ", ".join(needed[fam])))
        for fam in sorted(allowed - set(needed)):
            errors.append("%s: RestrictAddressFamilies= allows %s, which nothing kvnoded runs opens: remove "
                          "it (the unit allows only what the daemon needs)" % (unit, fam))
    for e in errors:
        print("unit-families: " + e, file=sys.stderr)
    if errors:
        return 1
    print("unit-families: %s allows %s: every socket family kvnoded opens, and only those"
          % (unit, " ".join(sorted(needed))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
