"""Fit the GPU rows of the cost table (gpucoll/algorithms/selector.py) on this machine's GPUs.

    python benchmarks/calibrate_gpu.py [--np N] [--out DIR]      # make calibrate-gpu NP=4

For each GPU algorithm of the table it runs gpucoll-bench with the algorithm forced
(GPUCOLL_ALGO, every row checked), then fits the table's model, time = alpha * steps(p) +
bytes * beta * volume(p), to the measured times by least squares, and prints the fitted
alpha and bandwidth beside the table's and the crossovers the fitted rows give. The table is
fitted to 2 x H200; run this on 4- and 8-GPU hosts and carry the figures into the table.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from gpucoll.algorithms import selector  # noqa: E402

# (collective, algorithm, bytes from, bytes to, settings that let the algorithm run at those sizes)
RUNS = (
    ("allreduce", "one-shot", 8, 32 << 20, {"GPUCOLL_GPU_ONESHOT_MAX": "32M"}),
    ("allreduce", "two-shot", 64 << 10, 64 << 20, {}),
    ("allreduce", "registered", 1 << 20, 512 << 20, {"GPUCOLL_GPU_STAGE_MAX": "4K"}),
    ("allgather", "staged", 8 << 10, 64 << 20, {}),
    ("allgather", "registered", 1 << 20, 512 << 20, {"GPUCOLL_GPU_STAGE_MAX": "4K"}),
    ("bcast", "staged", 8 << 10, 64 << 20, {}),
    ("reduce_scatter", "staged", 8 << 10, 64 << 20, {}),
)


def fit(points, steps, volume):
    """(alpha, beta) minimising the relative error of alpha*steps + n*beta*volume over
    points [(bytes, seconds)]; relative, so that small and large sizes weigh alike."""
    n = np.array([p[0] for p in points], float)
    t = np.array([p[1] for p in points], float)
    design = np.stack([np.full_like(n, steps), n * volume], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return float(alpha), float(beta)


def entry(collective, algorithm):
    name = selector.canonical(collective)
    return next(e for e in selector.GPU_TABLE if e.collective == name and e.algorithm == algorithm)


def measure_rows(collective, lo, hi, settings, nranks, path, gpu):
    """[(bytes, seconds)] of `collective` from lo to hi bytes (factor 4) on nranks ranks, GPU or
    host buffers, with the environment variables `settings`, the JSON kept at `path`. A run that
    fails, whose forced choice does not apply (gpucoll.bench says so), or with a wrong row ends
    the calibration: a fit of the wrong algorithm or of wrong results is worse than none."""
    env = dict(os.environ, **settings)
    cmd = [sys.executable, "-m", "gpucoll.bench", "-np", str(nranks), "-g" if gpu else "--no-gpu", "-o", collective,
           "-b", str(lo), "-e", str(hi), "-f", "4", "-n", "50", "-w", "5", "-c", "1", "--json", path]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or "does not apply" in proc.stderr:
        raise SystemExit(f"{' '.join(cmd)} ({settings}) failed or fell back:\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-2000:]}")
    with open(path) as f:
        rows = json.load(f)["rows"]
    if any(r.get("wrong") for r in rows):
        raise SystemExit(f"{collective} on {nranks} ranks ({settings}) gave wrong results: {path}")
    return [(r["size"], r["time_us"] * 1e-6) for r in rows]


def measure(collective, algorithm, lo, hi, settings, nranks, out):
    path = os.path.join(out, f"{collective}-{algorithm}-np{nranks}.json")
    return measure_rows(collective, lo, hi, dict(GPUCOLL_ALGO=algorithm, **settings), nranks, path, gpu=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=None, help="ranks (default: one per GPU)")
    parser.add_argument("--out", default="bench-results/calibrate")
    args = parser.parse_args()
    if args.np is None:
        from gpucoll._native import cuda

        args.np = cuda.device_count()
    os.makedirs(args.out, exist_ok=True)
    terms = selector._terms(args.np)
    print(f"# GPU cost-table rows fitted on {args.np} ranks; alpha in us, bandwidth = 1/beta in GB/s")
    print(f"# {'collective':<15} {'algorithm':<10} {'alpha':>8} {'table':>8} {'GB/s':>8} {'table':>8}  worst fit")
    for collective, algorithm, lo, hi, settings in RUNS:
        row = entry(collective, algorithm)
        steps, volume = (selector._evaluate(x, terms) for x in (row.steps, row.volume))
        points = measure(collective, algorithm, lo, hi, settings, args.np, args.out)
        alpha, beta = fit(points, steps, volume)
        worst = max(abs(alpha * steps + n * beta * volume - t) / t for n, t in points)
        print(f"  {collective:<15} {algorithm:<10} {alpha * 1e6:8.2f} {row.alpha * 1e6:8.2f} "
              f"{1 / beta / 1e9:8.1f} {1 / row.beta / 1e9:8.1f}  {worst:.0%}")


if __name__ == "__main__":
    main()
