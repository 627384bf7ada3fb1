"""GPU collectives for the ranks of one host: CUDA IPC, NVRTC kernels, NCCL's stream contract.

Any buffer with `__cuda_array_interface__` or `__dlpack__` (CuPy arrays, torch CUDA tensors)
passed to a communicator's buffer methods takes this path. A call is enqueued on a CUDA
stream (the `stream=` argument, else the caller's current CuPy or torch stream) and returns
once enqueued; `I*` calls return requests backed by CUDA events.

    import cupy as cp, gpucoll
    comm = gpucoll.COMM_WORLD
    x = cp.ones(1 << 20, cp.float32)
    comm.Allreduce(gpucoll.IN_PLACE, x)            # on cupy's current stream

Modules: streams.py (stream arguments), kernels.py (NVRTC + disk cache), ipc.py (CUDA IPC
handles, exported and opened once), team.py (IPC memory of a communicator), engine.py
(algorithm choice and launches), staged.py (calls through host memory), request.py
(event-backed requests). The driver binding, gpucoll._native.cuda, is imported at the top of
each module like any other: importing it never fails and costs little, since it loads
libcuda.so.1 only at its first call.
"""
