"""Repeated runs of one plan, folded into one row per (collective, size): median and range.

    runs = [{"gpucoll": records, "peer": peer_records}, ...]     # one entry per repeat
    rows = summarize(runs, "mpi")

Each row keeps the record's columns (size, count, type, ...) with time_us the median over
the runs, time_min_us / time_max_us the range, algbw and busbw from the median time, and
wrong the elements counted wrong over all runs (-1: not checked). With a peer, the same
columns prefixed peer_, and the ratio peer time / gpucoll time taken run by run (each run
measures both back to back): ratio is its median, ratio_min / ratio_max its range. A row on
which either library got a wrong result has no ratio: a wrong result is not a speed.
"""
import statistics

from . import table

_KEY_COLUMNS = ("collective", "nranks", "size", "count", "type", "redop", "root")


def _fold(records, bus):
    """median/min/max time, bandwidths from the median, wrong summed over records of one row."""
    times = [r["time_us"] for r in records if r.get("time_us") is not None]
    checked = [r["wrong"] for r in records if r.get("wrong", -1) >= 0]
    errors = sorted({r["error"] for r in records if r.get("error")})
    out = dict(time_us=None, time_min_us=None, time_max_us=None, algbw=None, busbw=None,
               wrong=sum(checked) if checked else -1, error="; ".join(errors) or None)
    if times and len(times) == len(records):  # a row that failed in any run has no time
        median = statistics.median(times)
        algbw = records[0]["size"] / (median * 1e-6) / 1e9 if median > 0 else 0.0
        out.update(time_us=median, time_min_us=min(times), time_max_us=max(times), algbw=algbw, busbw=algbw * bus)
    return out


def summarize(runs, peer=None):
    """One row per (collective, size) of the first run, folded over every run (see above)."""
    first = runs[0]["gpucoll"]
    rows = []
    for i, rec in enumerate(first):
        key = (rec["collective"], rec["size"])
        ours = [run["gpucoll"][i] for run in runs]
        assert all((r["collective"], r["size"]) == key for r in ours), "runs of different plans"
        bus = table.bus_factor(rec["collective"], rec["nranks"])
        row = {k: rec[k] for k in _KEY_COLUMNS}
        row.update(_fold(ours, bus), runs=len(runs), peer=peer)
        if peer:
            theirs = [_find(run.get("peer"), key) for run in runs]
            found = [t for t in theirs if t is not None]
            folded = _fold(found, bus) if len(found) == len(theirs) else _fold([], bus)
            row.update({f"peer_{k}": v for k, v in folded.items()})
            ratios = None
            if row["wrong"] <= 0 and row["peer_wrong"] <= 0 and row["time_us"] and row["peer_time_us"]:
                ratios = [t["time_us"] / o["time_us"] for o, t in zip(ours, theirs) if o["time_us"] > 0]
            ratios = ratios if ratios and len(ratios) == len(runs) else None
            row.update(ratio=statistics.median(ratios) if ratios else None,
                       ratio_min=min(ratios) if ratios else None, ratio_max=max(ratios) if ratios else None)
        rows.append(row)
    return rows


def _find(records, key):
    for r in records or ():
        if (r["collective"], r["size"]) == key:
            return r
    return None


def wrong_total(rows, prefix=""):
    """Elements counted wrong over every row (unchecked rows count 0)."""
    return sum(max(r.get(prefix + "wrong", -1), 0) for r in rows)


def status(runs):
    """The exit status: 1 when any run counted a wrong element, gpucoll's or the peer's."""
    return int(any(r.get("wrong", -1) > 0 for run in runs for side in ("gpucoll", "peer")
                   for r in run.get(side) or ()))


def spread(values):
    """(median, min, max) of repeated measurements."""
    return statistics.median(values), min(values), max(values)


def spread_text(values, fmt="{:.2f}"):
    """'median [min-max]' of repeated measurements, e.g. '1.91 [1.82-2.03]'."""
    mid, lo, hi = spread(values)
    return f"{fmt.format(mid)} [{fmt.format(lo)}-{fmt.format(hi)}]"
