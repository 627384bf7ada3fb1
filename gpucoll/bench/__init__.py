"""gpucoll-bench: nccl-tests-compatible tables for gpucoll's collectives, with a peer beside them.

    gpucoll-bench -np 4 -b 8 -e 64M -f 2 --vs mpi     (or python -m gpucoll.bench ...)

Modules: sizes (the -b/-e/-f sweep), table (nccl-tests' columns and busbw factors),
runner (the timing loop each rank runs), peers (Open MPI, gloo), torch_peer (torch.distributed,
for gloo and nccl), gpu (GPU buffers, NCCL and torch beside), cli (the command).
"""
