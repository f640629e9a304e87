"""examples/prefix_cache_demo.py against a real kvnoded: equal logits, shorter second prefill."""

import os
import sys

import pytest

from conftest import ROOT, running_daemon

for _p in (os.path.join(ROOT, "python"), os.path.join(ROOT, "examples")):
    if _p not in sys.path:
        sys.path.insert(0, _p)


@pytest.fixture
def daemon(tmp_path):
    with running_daemon(str(tmp_path), str(tmp_path / "s.sock")) as sock:
        yield sock


@pytest.mark.parametrize("via", ["client", "sglang"])
def test_demo_reuses_prefix(daemon, via):
    import prefix_cache_demo

    r = prefix_cache_demo.run_demo(daemon, small=True, via=via)
    print(r)
    assert r["matched_blocks"] == r["prefix_tokens"] // r["block_tokens"]
    assert r["loaded_blocks"] == r["matched_blocks"]
    assert r["computed_tokens_b"] < r["block_tokens"]
    assert r["equal"], "logits differ from a full recompute: max |diff| %g" % r["max_abs_logit_diff"]
    assert r["max_abs_logit_diff"] <= 1e-5
    assert r["prefill_b_s"] < r["prefill_a_s"], r
