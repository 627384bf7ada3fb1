import time, numpy as np, cupy as cp, gpucoll
comm = gpucoll.COMM_WORLD; rank = comm.rank; peer = 1 - rank
for nbytes in (8, 4096, 65536, 1 << 20, 16 << 20):
    a = cp.arange(nbytes, dtype=cp.uint8); b = cp.empty(nbytes, cp.uint8)
    n = 200 if nbytes <= 65536 else 50
    ts = []
    for i in range(n + 10):
        cp.cuda.Stream.null.synchronize(); comm.Barrier() if i % 50 == 0 else None
        t0 = time.perf_counter()
        if rank == 0:
            comm.Send(a, peer, 1); comm.Recv(b, peer, 1)
        else:
            comm.Recv(b, peer, 1); comm.Send(b, peer, 1)
        cp.cuda.Stream.null.synchronize()
        if i >= 10: ts.append(time.perf_counter() - t0)
    ts.sort()
    if rank == 0: print(f"gpu p2p one-way {nbytes:>9} B: {ts[len(ts)//2]/2*1e6:8.1f} us  ok={bool((a==b).all())}", flush=True)
