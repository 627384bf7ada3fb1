"""Fit the host rows of the cost table (gpucoll/algorithms/selector.py) on this machine, per rank count.

    python benchmarks/calibrate_host.py [--np 2 4 8 16] [--out DIR]      # make calibrate-host

For each rank count (default: 2, 4, 8, ... up to this machine's CPUs) it runs gpucoll-bench's
host all-reduce (CPU ranks, every row checked) with each algorithm forced: the direct engine
one-shot (every rank reads every rank's input) and two-shot (reduce-scatter, then all-gather,
through the segment), and the ring and recursive-halving schedules over shared-memory channels.
It fits time = alpha * steps(p) + bytes * beta * volume(p) to each by least squares (the fit of
calibrate_gpu.py) and prints the fitted alpha and bandwidth beside the table's, the size where
two-shot starts to beat one-shot beside the engine's default (gc_direct_oneshot_default:
GPUCOLL_HOST_ONESHOT_MAX sets it), and the first size at which a schedule would beat the
direct engine. Many ranks on a many-core host differ from 2 on 2 cores: fit them where they run.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from calibrate_gpu import fit, measure_rows  # noqa: E402
from gpucoll.algorithms import selector  # noqa: E402

# The direct engine's two modes (cython_src/include/gc_direct.h): one-shot synchronises once and
# reads p inputs; two-shot synchronises three times and moves about three times the bytes.
DIRECT_MODES = {"one-shot": ("1", "p"), "two-shot": ("3", "3")}
# (name, GPUCOLL_* settings, bytes from, bytes to): sizes 8 * 4**k, so that the runs share sizes
RUNS = (
    ("one-shot", {"GPUCOLL_ALGO": "direct", "GPUCOLL_HOST_ONESHOT_MAX": "1G"}, 8, 512 << 10),
    ("two-shot", {"GPUCOLL_ALGO": "direct", "GPUCOLL_HOST_ONESHOT_MAX": "0"}, 512, 8 << 20),
    ("ring", {"GPUCOLL_ALGO": "ring"}, 32 << 10, 8 << 20),
    ("rhd", {"GPUCOLL_ALGO": "rhd"}, 32 << 10, 8 << 20),
)
# gc_direct_oneshot_default: 64 KiB up to 4 ranks, then 256 KiB / ranks^2
ONESHOT_DEFAULT = (64 << 10, 4, 256 << 10)


def oneshot_default(nranks):
    small, upto, traffic = ONESHOT_DEFAULT
    return small if nranks <= upto else traffic // (nranks * nranks)


def measure(name, settings, lo, hi, nranks, out):
    """[(bytes, seconds)] of the all-reduce with `settings`, every row checked."""
    return measure_rows("allreduce", lo, hi, settings, nranks, os.path.join(out, f"allreduce-{name}-np{nranks}.json"),
                        gpu=False)


def model(name, nranks):
    """(steps, volume, table alpha, table beta) of a run's row at this rank count."""
    terms = selector._terms(nranks)
    if name in DIRECT_MODES:
        steps, volume = DIRECT_MODES[name]
        row = next(e for e in selector.TABLE if e.collective == "allreduce" and e.algorithm == "direct")
        alpha, beta = row.alpha, row.beta
    else:
        row = next(e for e in selector.TABLE if e.collective == "allreduce" and e.algorithm == name)
        steps, volume = row.steps, row.volume
        alpha, beta = selector.LINKS["shm"].alpha, selector.LINKS["shm"].beta
    return selector._evaluate(steps, terms), selector._evaluate(volume, terms), alpha, beta


def first_win(a, b, top=1 << 32):
    """The first power-of-two size at which line b = (alpha, beta, steps, volume) is below line a."""
    n = 8
    while n <= top:
        if b[0] * b[2] + n * b[1] * b[3] < a[0] * a[2] + n * a[1] * a[3]:
            return n
        n *= 2
    return None


def human(n):
    if n is None:
        return "never"
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


def measured_switch(slow_first, fast_later):
    """The smallest size both runs measured from which `fast_later` took less time at every
    size both measured; None if it never did."""
    common = sorted(set(slow_first) & set(fast_later))
    switch = None
    for n in reversed(common):
        if fast_later[n] >= slow_first[n]:
            break
        switch = n
    return switch


def calibrate(nranks, out):
    fitted, times = {}, {}
    print(f"\n# {nranks} ranks: all-reduce float32, CPU ranks; alpha in us, bandwidth = 1/beta in GB/s")
    print(f"# {'algorithm':<10} {'alpha':>8} {'table':>8} {'GB/s':>8} {'table':>8}  worst fit")
    for name, settings, lo, hi in RUNS:
        steps, volume, table_alpha, table_beta = model(name, nranks)
        points = measure(name, settings, lo, hi, nranks, out)
        times[name] = dict(points)
        alpha, beta = fit(points, steps, volume)
        worst = max(abs(alpha * steps + n * beta * volume - t) / t for n, t in points)
        fitted[name] = (alpha, beta, steps, volume)
        print(f"  {name:<10} {alpha * 1e6:8.2f} {table_alpha * 1e6:8.2f} {1 / beta / 1e9:8.1f} "
              f"{1 / table_beta / 1e9:8.1f}  {worst:.0%}")
    cross = first_win(fitted["one-shot"], fitted["two-shot"])
    seen = measured_switch(times["one-shot"], times["two-shot"])
    print(f"  two-shot beats one-shot from {human(seen)} as measured, {human(cross)} by the fitted rows (the engine "
          f"switches above {human(oneshot_default(nranks))}; GPUCOLL_HOST_ONESHOT_MAX sets it)")
    best_direct = [fitted["one-shot"], fitted["two-shot"]]
    for schedule in ("ring", "rhd"):
        wins = [first_win(d, fitted[schedule]) for d in best_direct]
        at = max((w for w in wins if w is not None), default=None) if all(wins) else None
        print(f"  {schedule} beats both direct modes from {human(at)}")
    return fitted


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cpus = len(os.sched_getaffinity(0))
    default = [p for p in (2, 4, 8, 16, 32, 64, 128) if p <= cpus] or [2]
    parser.add_argument("--np", type=int, nargs="+", default=default, help=f"rank counts (here: {default})")
    parser.add_argument("--out", default="bench-results/calibrate-host")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"# host cost-table rows fitted on this machine ({cpus} CPUs)")
    for nranks in args.np:
        calibrate(nranks, args.out)


if __name__ == "__main__":
    main()
