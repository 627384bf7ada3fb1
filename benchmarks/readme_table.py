"""A table of docs/benchmarks.md (Markdown) from the JSON a benchmark target wrote: median
[min-max] per row.

    python benchmarks/readme_table.py bench-results/allreduce-mpi-np2.json
    python benchmarks/readme_table.py bench-results/p2p.json
    python benchmarks/readme_table.py first/allreduce-mpi-np2.json again/allreduce-mpi-np2.json
    python benchmarks/readme_table.py --check new/p2p.json first/p2p.json again/p2p.json
    python benchmarks/readme_table.py first/launch.json again/launch.json

Several files of the same command (separate invocations) are pooled: every run of every file
counts, so the ranges show the spread between invocations too, not only within one. --check
asks whether a new invocation reproduces the table the others make: each row's median ratio
(the launch table: each peer's time / gpurun's, round by round) in the new file against the
pooled range of the others; it lists the rows outside and exits 1 if there is one.
--check-printed does the same against the ranges docs/benchmarks.md prints, read from its Markdown:

    python benchmarks/readme_table.py --check-printed docs/benchmarks.md '**2 ranks vs Open MPI**' new.json

--matrix prints one table per rank count of the collective sweeps given (make bench-many's files,
any number of invocations pooled): a row per size, a column per collective, each cell the ratio
peer time / gpucoll time, median [min-max] over every run:

    python benchmarks/readme_table.py --matrix first/many-*.json again/many-*.json
"""
import json
import re
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
    """One line per size from every run of the pooled files (gpucoll-bench --json)."""
    peer = doc["settings"]["peer_label"].split(" through ")[0]
    lines = [f"| size | gpucoll time (us) | gpucoll busbw (GB/s) | {peer} time (us) | {peer} time / gpucoll time |",
             "|---:|---:|---:|---:|---:|"]
    for i, row in enumerate(doc["rows"]):
        ours = [run["gpucoll"][i] for run in doc["runs"]]
        theirs = [run["peer"][i] for run in doc["runs"]]
        t, p = [r["time_us"] for r in ours], [r["time_us"] for r in theirs]
        wrong = any(r["wrong"] for r in ours + theirs)
        ratios = [b / a for a, b in zip(t, p)]
        ratio = "- (wrong)" if wrong else _span(_median(ratios), min(ratios), max(ratios), _ratio)
        busbw = _median([r["busbw"] for r in ours])
        lines.append(f"| {_size(row['size'])} | {_span(_median(t), min(t), max(t))} | {busbw:.2f} "
                     f"| {_span(_median(p), min(p), max(p))} | {ratio} |")
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


def _is_launch(doc):
    return bool(doc["rows"]) and "launcher" in doc["rows"][0]


def launch_table(doc):
    """bench_launch.py's rows: seconds per launcher and rank count, and time / gpurun's time of the
    same round (gpurun's own rows: 1 by definition)."""
    lines = ["| launcher | ranks | seconds | time / gpurun's |", "|---|---:|---:|---:|"]
    for r in doc["rows"]:
        t, x = r["runs"], r["vs_gpurun_runs"]
        ratio = "1" if r["launcher"] == "gpurun" else _span(_median(x), min(x), max(x), _ratio) if x else "-"
        lines.append(f"| {r['launcher']} | {r['ranks']} | {_span(_median(t), min(t), max(t), lambda v: f'{v:.3f}')} "
                     f"| {ratio} |")
    return lines


def pooled(paths):
    """The first file's document with the runs (and, for point to point, the per-run lists) of all."""
    docs = []
    for path in paths:
        with open(path) as f:
            docs.append(json.load(f))
    doc = docs[0]
    if _is_launch(doc):  # rows matched by launcher and rank count
        for key in ("runs", "vs_gpurun_runs"):
            runs = {}
            for d in docs:
                for r in d["rows"]:
                    runs.setdefault((r["launcher"], r["ranks"]), []).extend(r[key] or [])
            for r in doc["rows"]:
                r[key] = runs[(r["launcher"], r["ranks"])]
        return doc, [d["settings"]["date"] for d in docs]
    doc["runs"] = [run for d in docs for run in d.get("runs", [])]  # bench_vector keeps its runs in rows
    if "peer_label" not in doc["settings"]:
        for rows in zip(*(d["rows"] for d in docs)):
            for key in ("gpucoll", "peer", "ratio"):
                rows[0][key] = [v for r in rows for v in r[key]]
    return doc, [d["settings"]["date"] for d in docs]


def ratios(doc):
    """{row label: [ratio of each run]} of a pooled document, wrong rows left out (the launch
    table: each peer's time / gpurun's; gpurun's own times drift with the machine)."""
    out = {}
    if _is_launch(doc):
        return {f"{r['launcher']} {r['ranks']}": r["vs_gpurun_runs"] for r in doc["rows"]
                if r["launcher"] != "gpurun" and r["vs_gpurun_runs"]}
    if "peer_label" in doc["settings"]:
        for i, row in enumerate(doc["rows"]):
            pairs = [(run["gpucoll"][i], run["peer"][i]) for run in doc["runs"]]
            if not any(a["wrong"] or b["wrong"] for a, b in pairs):
                out[_size(row["size"])] = [b["time_us"] / a["time_us"] for a, b in pairs]
    else:
        for row in doc["rows"]:
            if row["ratio"] and not (row["gpucoll_wrong"] or row["peer_wrong"]):
                out[f"{row['test']} {_size(row['size'])}"] = row["ratio"]
    return out


def check(new, olds):
    """The rows whose median ratio in `new` falls outside the pooled range of `olds`; prints all."""
    ranges = {label: (min(v), max(v)) for label, v in ratios(pooled(olds)[0]).items()}
    return _compare(new, ranges)


def check_printed(new, text, label):
    """check(), against the ranges a Markdown text (docs/benchmarks.md) prints in the first table
    after the line that starts with `label` (e.g. '**4 ranks vs Open MPI**', '### Host point to
    point'): no JSON needed. The new medians are rounded as the table rounds (2 decimals)."""
    return _compare(new, printed_ranges(text, label), digits=2)


def printed_ranges(text, label):
    """{row label, as ratios() names it: (min, max)} of the ratio columns of a printed table."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(label)), None)
    if start is None:
        raise SystemExit(f"no line starts with {label!r} (the measured tables are in docs/benchmarks.md)")
    table = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif table:
            break
    header, rows = table[0], table[2:]
    # point to point: the one-way, window and both-ways ratios; any other table: its last column
    columns = {"latency": 3, "bw": 6, "bibw": 7} if "bw ratio" in header else {"": len(header) - 1}
    out = {}
    for row in rows:
        name = f"{row[0]} {row[1]}" if header[0] == "launcher" else row[0]
        for test, col in columns.items():
            span = re.fullmatch(r"[\d.]+ \[([\d.]+)-([\d.]+)\]", row[col])
            if span:  # not gpurun's own rows (1), nor a wrong row
                out[f"{test} {name}".strip()] = (float(span.group(1)), float(span.group(2)))
    return out


def _compare(new, ranges, digits=None):
    fresh = ratios(pooled([new])[0])
    outside = []
    for label, (lo, hi) in ranges.items():
        got = fresh.get(label)
        if got is None:
            outside.append(label)
            print(f"{label:>18}: missing (or wrong) in {new}")
            continue
        med = _median(got)
        inside = lo <= (med if digits is None else round(med, digits)) <= hi
        outside += [] if inside else [label]
        print(f"{label:>18}: {med:.2f} in [{lo:.2f}-{hi:.2f}]" + ("" if inside else "  OUTSIDE"))
    print(f"{len(ranges) - len(outside)} of {len(ranges)} rows inside the printed ranges")
    return outside


def matrix_tables(paths):
    """Markdown lines: per rank count, size x collective, each cell the pooled ratio (files of
    the same command and rank count are invocations of one command)."""
    groups = {}
    for path in paths:
        with open(path) as f:
            settings, rows = (doc := json.load(f))["settings"], doc["rows"]
        nranks = settings.get("nranks", settings.get("np"))  # bench_vector.py says np
        groups.setdefault((nranks, rows[0].get("collective", "vector")), []).append(path)
    lines = []
    for nranks in sorted({n for n, _ in groups}):
        cells = {}
        for (n, _), group in groups.items():
            if n == nranks:
                cells.update(_columns(group))
        sizes = sorted({s for per in cells.values() for s in per}, key=_bytes)
        lines += [f"**{nranks} ranks** (Open MPI time / gpucoll time, median [min-max] of every run)", "",
                  "| size | " + " | ".join(cells) + " |", "|---:|" + "---:|" * len(cells)]
        for size in sizes:
            row = [_span(_median(per[size]), min(per[size]), max(per[size]), _ratio)
                   if size in per else "-" for per in cells.values()]
            lines.append(f"| {size} | " + " | ".join(row) + " |")
        lines.append("")
    return lines


def _columns(paths):
    """{collective: {size label: [ratio of each run]}} of invocations of one command: one
    collective for gpucoll-bench, one per test for bench_vector.py."""
    doc = pooled(paths)[0]
    if "peer_label" in doc["settings"]:
        return {doc["rows"][0]["collective"]: ratios(doc)}
    columns = {}
    for label, runs in ratios(doc).items():
        test, size = label.split(" ", 1)
        columns.setdefault(test, {})[size] = runs
    return columns


def _bytes(label):
    number, unit = label.split()
    return int(number) << {"B": 0, "KiB": 10, "MiB": 20, "GiB": 30}[unit]


def main(paths):
    if paths and paths[0] == "--matrix":
        print("\n".join(matrix_tables(paths[1:])))
        return
    if paths and paths[0] == "--check":
        sys.exit(1 if check(paths[1], paths[2:]) else 0)
    if paths and paths[0] == "--check-printed":
        doc, label, new = paths[1:4]
        with open(doc) as f:
            sys.exit(1 if check_printed(new, f.read(), label) else 0)
    doc, dates = pooled(paths)
    settings = doc["settings"]
    if _is_launch(doc):
        print(f"`{settings['command']}`, {', '.join(dates)} ({len(doc['rows'][0]['runs'])} runs of each)\n")
        print("\n".join(launch_table(doc)))
        return
    lines = collective_table(doc) if "peer_label" in settings else p2p_table(doc)
    print(f"`{settings['command']}`, {', '.join(dates)} ({len(doc['runs'])} runs), {settings['machine']['cpus']} "
          f"CPUs ({settings['machine']['processor']}), #wrong 0 on every row unless marked\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
