"""comm.group() on GPU buffers: fused small all-reduces, checked bit for bit.

    GPUCOLL_DEBUG=INFO GPUCOLL_DEBUG_SUBSYS=COLL gpurun -np 2 python gpu_group.py

Inside one group: 150 small all-reduces of mixed sizes, ops, dtypes and in-place/out-of-place
(more than MAXFUSE of one dtype: several fused launches), one large all-reduce (not fused), an Iallreduce whose
request is waited on after the group, and a Send/Recv pair; two streams joined around a fused
launch; a group captured in a CUDA graph and replayed. Every result is compared with the same
calls made one by one outside a group (bitwise) and with NumPy. Output: "RESULT {json}".
"""
import json
import sys
import traceback

import numpy as np

import cupy as cp
import gpucoll
from gpu_device import one_gpu_per_rank
from gpucoll import IN_PLACE

comm = gpucoll.COMM_WORLD
N, RANK = comm.size, comm.rank
one_gpu_per_rank(comm)
failures, checked = [], [0]
OPS = (gpucoll.SUM, gpucoll.MAX, gpucoll.MIN, gpucoll.PROD)


def inputs(rank, i, count, dtype):
    rng = np.random.default_rng(1000 * i + rank)
    if dtype == np.int32:
        return rng.integers(-50, 50, count).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def reference(i, count, dtype, op):
    fn = {gpucoll.SUM: np.add, gpucoll.MAX: np.maximum, gpucoll.MIN: np.minimum, gpucoll.PROD: np.multiply}[op]
    acc = inputs(0, i, count, dtype)
    for r in range(1, N):
        acc = fn(acc, inputs(r, i, count, dtype)).astype(dtype)
    return acc


def check(name, got, want):
    checked[0] += 1
    if got.shape != want.shape or got.tobytes() != want.tobytes():
        failures.append(f"{name}: differs ({np.count_nonzero(got != want) if got.shape == want.shape else 'shape'})")


def specs():
    out = []
    for i in range(150):  # 130 float32 (three fused launches: 64, 64, 2), 10 float64, 10 int32
        dtype = np.float32 if i < 130 else (np.float64, np.int32)[i % 2]
        out.append((i, 1 + (i * 37) % 3000, dtype, OPS[i % 4], i % 2 == 0))
    return out


def run(spec_list, grouped):
    """Issue the all-reduces of spec_list (inside one group when grouped); their outputs."""
    outs = []
    calls = []
    for i, count, dtype, op, inplace in spec_list:
        x = cp.asarray(inputs(RANK, i, count, dtype))
        y = x if inplace else cp.full(count, 7, dtype)
        calls.append((x, y, op, inplace))
        outs.append(y)
    if grouped:
        with comm.group():
            for x, y, op, inplace in calls:
                comm.Allreduce(IN_PLACE if inplace else x, y, op=op)
    else:
        for x, y, op, inplace in calls:
            comm.Allreduce(IN_PLACE if inplace else x, y, op=op)
    cp.cuda.Device().synchronize()
    return [cp.asnumpy(y) for y in outs]


def fused_equals_single():
    s = specs()
    grouped, single = run(s, True), run(s, False)
    for (i, count, dtype, op, _), g, o in zip(s, grouped, single):
        check(f"fused {i} vs single", g, o)
        check(f"fused {i} vs numpy", g, reference(i, count, dtype, op))


def mixed_group():
    big = cp.asarray(inputs(RANK, 900, 9_000_000, np.float32))
    small = cp.asarray(inputs(RANK, 901, 100, np.float32))
    other = cp.asarray(inputs(RANK, 902, 100, np.float32))
    peer_in, peer_out = cp.zeros(200_000, cp.float32), cp.asarray(inputs(RANK, 903, 200_000, np.float32))
    with comm.group():
        comm.Allreduce(IN_PLACE, big)            # above a staging slot: two-shot, not fused
        comm.Allreduce(IN_PLACE, small)
        req = comm.Iallreduce(IN_PLACE, other)
        try:
            req.Wait()
            failures.append("Wait inside a group: no error")
        except gpucoll.InvalidUsageError:
            checked[0] += 1
        if N == 2:
            comm.Send(peer_out, 1 - RANK, tag=4)  # blocking send: completes at the end of the group
            comm.Recv(peer_in, 1 - RANK, tag=4)
    req.Wait()
    cp.cuda.Device().synchronize()
    check("group: large", cp.asnumpy(big), reference(900, 9_000_000, np.float32, gpucoll.SUM))
    check("group: small", cp.asnumpy(small), reference(901, 100, np.float32, gpucoll.SUM))
    check("group: request", cp.asnumpy(other), reference(902, 100, np.float32, gpucoll.SUM))
    if N == 2:
        check("group: send/recv", cp.asnumpy(peer_in), inputs(1 - RANK, 903, 200_000, np.float32))
        comm.Sendrecv(small, 1 - RANK, 5, other, 1 - RANK, 5)  # raises a slot timeout recorded above, if any


def two_streams():
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    a = cp.asarray(inputs(RANK, 910, 500, np.float32))
    b = cp.asarray(inputs(RANK, 911, 700, np.float32))
    cp.cuda.Device().synchronize()
    with comm.group():
        comm.Allreduce(IN_PLACE, a, stream=s1)
        comm.Allreduce(IN_PLACE, b, stream=s2)
    with s2:
        b2 = b * 2  # s2 waits for the fused launch that went on s1
    s2.synchronize()
    check("streams: first", cp.asnumpy(a), reference(910, 500, np.float32, gpucoll.SUM))
    check("streams: joined", cp.asnumpy(b2), reference(911, 700, np.float32, gpucoll.SUM) * 2)


def captured_group():
    gs = cp.cuda.Stream(non_blocking=True)
    with gs:
        xs = [cp.ones(64 + 8 * k, cp.float32) for k in range(10)]
        with comm.group():  # warm-up outside the capture
            for x in xs:
                comm.Allreduce(IN_PLACE, x)
        gs.synchronize()
        gs.begin_capture()
        with comm.group():
            for x in xs:
                comm.Allreduce(IN_PLACE, x)
        graph = gs.end_capture()
        for x in xs:
            x.fill(1)
        for _ in range(3):
            graph.launch(gs)
    gs.synchronize()
    for k, x in enumerate(xs):
        check(f"graph {k}", cp.asnumpy(x), np.full(64 + 8 * k, float(N) ** 3, np.float32))


for name, fn in (("fused", fused_equals_single), ("mixed", mixed_group), ("streams", two_streams),
                 ("graph", captured_group)):
    try:
        fn()
    except Exception as exc:
        failures.append(f"{name}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")
    comm.Barrier()
st = comm.stats()
print("RESULT " + json.dumps({"checked": checked[0], "failures": failures[:20], "nfail": len(failures),
                              "fused": [st["fused_launches"], st["fused_calls"]]}), flush=True)
sys.exit(1 if failures else 0)
