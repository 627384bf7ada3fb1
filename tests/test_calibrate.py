"""benchmarks/calibrate_gpu.py's fit: it recovers the cost model's alpha and beta from times that
follow it, noisy ones included; and every run it makes names a row of the GPU cost table."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import calibrate_gpu  # noqa: E402


def test_fit_recovers_alpha_and_beta():
    alpha, beta, steps, volume = 6.5e-6, 1 / 320e9, 2, 1.5
    sizes = [8 << k for k in range(0, 26, 2)]
    exact = [(n, alpha * steps + n * beta * volume) for n in sizes]
    assert calibrate_gpu.fit(exact, steps, volume) == pytest.approx((alpha, beta), rel=1e-9)
    rng = np.random.default_rng(3)
    noisy = [(n, t * (1 + rng.uniform(-0.03, 0.03))) for n, t in exact]
    got = calibrate_gpu.fit(noisy, steps, volume)
    assert got == pytest.approx((alpha, beta), rel=0.05)


def test_every_run_is_a_row_of_the_gpu_table():
    for collective, algorithm, lo, hi, _ in calibrate_gpu.RUNS:
        row = calibrate_gpu.entry(collective, algorithm)
        assert row.alpha > 0 and row.beta > 0 and lo < hi
