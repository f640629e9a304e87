"""The README's Python example runs as written: its first ```python block after
"## Using kvnode from Python", unchanged, in a directory whose run/kvnode.sock
is a real kvnoded (as after `make run` at the top of the tree; the package
comes from PYTHONPATH instead of the example's relative sys.path entry)."""
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
