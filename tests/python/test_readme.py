"""The README's Python example runs as written: its first ```python block after
"## Using kvnode from Python", unchanged, in a directory whose run/kvnode.sock
is a real kvnoded (as after `make run` at the top of the tree; the package
comes from PYTHONPATH instead of the example's relative sys.path entry).
Below: every command block of the README runs as written, in a copy of the
tree, against the daemon of its `make run` block (issue 33), and the C
snippet is a part of examples/five_lines.c."""
import os
import subprocess
import sys

from conftest import ROOT, running_daemon


def readme_example():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.index("## Using kvnode from Python")
    start = text.index("```python\n", section) + len("```python\n")
    return text[start:text.index("```\n", start)]


def test_readme_example_runs_as_written(tmp_path):
    code = readme_example()
    assert 'kvnode.Client("run/kvnode.sock"' in code
    os.mkdir(tmp_path / "run")
    with running_daemon(str(tmp_path), str(tmp_path / "run" / "kvnode.sock")):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        r = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env,
                           capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, "README example failed:\n%s%s" % (r.stdout, r.stderr)
    # 4 blocks of 64 KiB were stored and matched.
    assert r.stdout.startswith("4 blocks cached; 262144 bytes in use"), r.stdout


def readme_blocks():
    """Every ```python block of the section, in order."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("## Using kvnode from Python"):text.index("## SGLang HiCache")]
    blocks, at = [], 0
    while "```python\n" in section[at:]:
        start = section.index("```python\n", at) + len("```python\n")
        end = section.index("```\n", start)
        blocks.append(section[start:end])
        at = end
    return blocks


def test_readme_async_example_runs_after_the_first(tmp_path):
    blocks = readme_blocks()
    assert len(blocks) == 2 and "submit_get" in blocks[1]
    os.mkdir(tmp_path / "run")
    with running_daemon(str(tmp_path), str(tmp_path / "run" / "kvnode.sock")):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        r = subprocess.run([sys.executable, "-c", blocks[0] + blocks[1]], cwd=str(tmp_path),
                           env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, "README async example failed:\n%s%s" % (r.stdout, r.stderr)
    assert "Tiers(matched=4, hbm=0, host=4, store=0)" in r.stdout, r.stdout


# ---------------------------------------------------------------------------
# Every command block of the README, as written (issue 33).
#
# A fenced block is a command block when its language is `sh` or `python`; `c`
# and `ini` blocks are code and configuration, not commands (the "libkvnode in
# five lines" snippet is checked against examples/five_lines.c below, and the
# README's next block builds and runs that program). Every other language, or
# a fence without one, fails the test, so that no block is left out unseen.
# An HTML comment on the line before a fence says how the test treats it:
#   <!-- readme-test: skip: REASON -->  not run here (GPU, root, systemd, a
#                                       network install, `make test` itself);
#                                       the reason is required;
#   <!-- readme-test: daemon: ... -->   it runs kvnoded in the foreground: it is
#                                       started in the background first, every
#                                       other block runs against it, then it is
#                                       stopped (SIGTERM to its process group);
#   <!-- readme-test: continues ... --> a python block that continues the one
#                                       before it: both run as one program.
# The blocks run in order in a copy of the tree in a temporary directory (a
# link to each of the tree's entries; `build` links to this build, $BUILD;
# run/ and var/ are the copy's own), sh blocks with `bash -e -o pipefail`,
# python blocks with /usr/bin/python3, the python3 the README tells the user
# to run them with. Under a sanitizer build `cc` is given the sanitizer (the
# archive needs its runtime). Each block has a timeout; so does the whole test.

import re
import shutil
import signal
import time

BLOCK_TIMEOUT_S = 120
COMMAND_LANGS = ("sh", "python")
OTHER_LANGS = ("c", "ini")
MARK = re.compile(r"^<!-- readme-test: (skip|daemon|continues)\b:?\s*(.*?)\s*-->$")


def readme_fences():
    """[(line number, language, marker, reason, text)] of every fenced block."""
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang = lines[i][3:].strip()
            m = MARK.match(lines[i - 1]) if i > 0 else None
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            out.append((i + 1, lang, m.group(1) if m else None, m.group(2) if m else "",
                        "\n".join(lines[i + 1:j]) + "\n"))
            i = j + 1
        else:
            i += 1
    return out


def test_every_fence_is_classified():
    fences = readme_fences()
    assert len(fences) >= 10
    for line, lang, mark, reason, _ in fences:
        assert lang in COMMAND_LANGS + OTHER_LANGS, \
            "README.md:%d: a ``` block of language %r: give it sh, python, c or ini" % (line, lang)
        if mark == "skip":
            assert reason, "README.md:%d: a readme-test skip must say why" % line
        if mark:
            assert lang in COMMAND_LANGS, "README.md:%d: a readme-test marker on a %s block" % (line, lang)
    assert [f[2] for f in fences].count("daemon") == 1


def test_five_lines_snippet_is_cut_from_the_example():
    """The README's "libkvnode in five lines" is, line for line, part of examples/five_lines.c."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    at = text.index("## libkvnode in five lines")
    start = text.index("```c\n", at) + len("```c\n")
    snippet = text[start:text.index("```\n", start)]
    assert snippet.count("\n") >= 5 and "kvnode_connect(" in snippet and "kvnode_match(" in snippet
    with open(os.path.join(ROOT, "examples", "five_lines.c")) as f:
        program = f.read()
    assert snippet in program, "the README's snippet is not a part of examples/five_lines.c"
    # The README shows the link line that works before glibc 2.34, and make check uses it.
    assert "-lprotobuf-c -ldl -lpthread" in text[at:text.index("\n## ", at + 3)]


def copy_of_tree(tmp_path, build):
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in os.listdir(ROOT):
        if name in ("run", "var", ".git") or name == "build" or name.startswith("build-"):
            continue
        os.symlink(os.path.join(ROOT, name), str(tree / name))
    os.symlink(os.path.join(ROOT, build), str(tree / "build"))
    return tree


def block_env(tmp_path):
    env = dict(os.environ)
    # The blocks' `make run` builds the tree's build/ (the link to $BUILD), not a
    # make of the caller's (no jobserver, no BUILD from `make check`).
    for k in ("BUILD", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHONPATH"):
        env.pop(k, None)
    if "libasan" in env.get("LD_PRELOAD", ""):
        bindir = tmp_path / "bin"
        bindir.mkdir()
        cc = bindir / "cc"
        cc.write_text('#!/bin/sh\nexec %s -fsanitize=address,undefined "$@"\n' % shutil.which("cc"))
        cc.chmod(0o755)
        env["PATH"] = "%s:%s" % (bindir, env["PATH"])
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "detect_leaks=0")
    return env


def run_block(lang, code, tree, env, line):
    argv = ["bash", "-e", "-o", "pipefail", "-c", code] if lang == "sh" else ["/usr/bin/python3", "-c", code]
    r = subprocess.run(argv, cwd=str(tree), env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert r.returncode == 0, "README.md:%d (%s block) exited %d:\n%s\n--- stdout\n%s--- stderr\n%s" % (
        line, lang, r.returncode, code, r.stdout, r.stderr)
    return r.stdout


def stop_group(proc):
    """SIGTERM to the daemon block's process group (make and kvnoded), and wait
    until none of it is left (make may exit before kvnoded has stopped); SIGKILL
    after 30 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while True:
        proc.poll()
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    proc.wait()


def test_every_command_block_runs_as_written(tmp_path):
    signal.alarm(8 * BLOCK_TIMEOUT_S)   # longer than conftest's per-test 60 s: many blocks
    fences = readme_fences()
    assert any("/usr/bin/python3" in f[4] for f in fences), \
        "the README no longer names the python3 its examples run with"
    tree = copy_of_tree(tmp_path, os.environ.get("BUILD", "build"))
    env = block_env(tmp_path)
    daemon = [f for f in fences if f[2] == "daemon"][0]
    log = open(str(tmp_path / "make-run.log"), "w+")
    proc = subprocess.Popen(["bash", "-e", "-c", daemon[4]], cwd=str(tree), env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    ran, prev_python = [], ""
    try:
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while subprocess.run([str(tree / "build" / "kvnodectl"), "-S", "run/kvnode.sock", "-t", "1000",
                              "ping"], cwd=str(tree), env=env, capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail("README.md:%d `%s` did not start a daemon (exit %s):\n%s"
                            % (daemon[0], daemon[4].strip(), proc.poll(), log.read()))
            time.sleep(0.1)
        for line, lang, mark, _, code in fences:
            if lang not in COMMAND_LANGS or mark in ("skip", "daemon"):
                continue
            if lang == "python":
                code = (prev_python if mark == "continues" else "") + code
                prev_python = code
            run_block(lang, code, tree, env, line)
            ran.append(line)
    finally:
        stop_group(proc)
        log.close()
    # The kvnodectl round trip, the C example, both Python examples and the demo at least.
    print("README blocks run, by line:", ran)
    assert len(ran) >= 5, ran
