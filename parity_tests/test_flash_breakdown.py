"""The flash kernel's measuring tools at a tiny size: ``python -m benchmarks.flash_breakdown``'s
instrumented copy of the kernel's loops still computes what the kernel computes and its floor
comparison times every case; ``python -m benchmarks.flash_kernel --against REV`` loads the kernel
of a git revision with the package it was written against."""

import math

import numpy as np
import pytest

import numpy_attn.kernels.flash_attention as fa
from benchmarks import flash_breakdown, flash_kernel


@pytest.fixture
def tiny(monkeypatch):
    """B=1, nh=2, T=96, hs=64: the tool's sizes are module constants."""
    for name, value in (("B", 1), ("NH", 2), ("T", 96)):
        monkeypatch.setattr(flash_breakdown, name, value)


@pytest.mark.parametrize("is_causal", [False, True])
def test_instrumented_copy_computes_what_the_kernel_computes(tiny, is_causal):
    res = flash_breakdown.instrumented(is_causal, 32, 64)
    # T=96 in rows of 32 against keys in tiles of 64: 3 x 2 tiles per slice; causal, rows 0-31
    # and 32-63 see one tile of keys and rows 64-95 two.
    tiles_per_slice = 4 if is_causal else 6
    assert res["forward"]["tiles"] == 2 * tiles_per_slice
    assert max(res["max_abs_error_vs_kernel"].values()) < 1e-4
    for part in ("forward", "backward"):
        assert res[part]["total"] >= sum(res[part]["groups"].values())


def test_floor_times_every_case_against_sdpa_in_the_same_rounds(tiny):
    res = flash_breakdown.floor(2, 32, 32)
    assert {"F.sdpa forward", "NumPy tiles, 2 matmuls", "kernel forward",
            "F.sdpa forward+backward", "kernel forward+backward"} <= set(res)
    for r in res.values():
        assert len(r["times_s"]) == 2 and min(r["times_s"]) > 0
        assert math.isfinite(r["over_sdpa"]) and r["over_sdpa"] > 0
    assert res["F.sdpa forward"]["over_sdpa"] == 1.0


def test_flash_kernel_loads_a_revisions_kernel_under_its_own_package_name():
    old = flash_kernel._load_revision("HEAD")
    assert old.__name__ == "numpy_attn_at_HEAD.kernels.flash_attention"
    assert old is not fa and old.check_attention_inputs is not fa.check_attention_inputs
    q, k, v = (np.random.default_rng(i).standard_normal((2, 5, 4)).astype(np.float32) for i in range(3))
    out_old, _ = old.flash_attention_forward(q, k, v, block_q=2, block_k=3)
    out_new, _ = fa.flash_attention_forward(q, k, v, block_q=2, block_k=3)
    # Both are correct kernels: the same attention to float32 rounding, whatever the edits between.
    assert np.allclose(out_old, out_new, rtol=1e-5, atol=1e-6)
