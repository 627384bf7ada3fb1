"""A README table (Markdown) from the JSON a benchmark target wrote: median [min-max] per row.

    python benchmarks/readme_table.py bench-results/allreduce-mpi-np2.json
    python benchmarks/readme_table.py bench-results/p2p.json
"""
import json
import sys


def _size(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _num(x):
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _span(med, lo, hi, fmt=_num):
    return f"{fmt(med)} [{fmt(lo)}-{fmt(hi)}]"


def _ratio(x):
    return f"{x:.2f}"


def _median(values):
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def collective_table(doc):
    peer = doc["settings"]["peer_label"].split(" through ")[0]
    lines = [f"| size | gpucoll time (us) | gpucoll busbw (GB/s) | {peer} time (us) | {peer} time / gpucoll time |",
             "|---:|---:|---:|---:|---:|"]
    for row in doc["rows"]:
        ratio = _span(row["ratio"], row["ratio_min"], row["ratio_max"], _ratio) if row.get("ratio") else "- (wrong)"
        lines.append(f"| {_size(row['size'])} | {_span(row['time_us'], row['time_min_us'], row['time_max_us'])} "
                     f"| {row['busbw']:.2f} | {_span(row['peer_time_us'], row['peer_time_min_us'], row['peer_time_max_us'])} "
                     f"| {ratio} |")
    return lines


def p2p_table(doc):
    """bench_p2p.py's rows (test latency, bw, bibw per size): one line per size."""
    by_size = {}
    for row in doc["rows"]:
        by_size.setdefault(row["size"], {})[row["test"]] = row
    lines = ["| size | one-way gpucoll (us) | one-way Open MPI (us) | ratio | bw gpucoll (GB/s) | bw Open MPI (GB/s) "
             "| bw ratio | bibw ratio |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for size, tests in sorted(by_size.items()):
        cells = []
        lat, bw, bibw = (tests.get(t) for t in ("latency", "bw", "bibw"))
        for row, keys in ((lat, ("gpucoll", "peer", "ratio")), (bw, ("gpucoll", "peer", "ratio")), (bibw, ("ratio",))):
            for key in keys:
                v = row[key] if row else None
                fmt = _ratio if key == "ratio" else _num
                if not v:
                    cells.append("-")
                elif row is bw and key != "ratio":  # bandwidth: the median (ranges in the JSON)
                    cells.append(_num(_median(v)))
                else:
                    cells.append(_span(_median(v), min(v), max(v), fmt))
        lines.append(f"| {_size(size)} | " + " | ".join(cells) + " |")
    return lines


def main(path):
    with open(path) as f:
        doc = json.load(f)
    settings = doc["settings"]
    lines = collective_table(doc) if "peer_label" in settings else p2p_table(doc)
    print(f"`{settings['command']}`, {settings['date']}, {settings['machine']['cpus']} CPUs "
          f"({settings['machine']['processor']}), #wrong 0 on every row unless marked\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
