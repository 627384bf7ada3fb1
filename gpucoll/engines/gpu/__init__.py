"""GPU collectives for the ranks of one host: CUDA IPC, NVRTC kernels, NCCL's stream contract.

Any buffer with `__cuda_array_interface__` or `__dlpack__` (CuPy arrays, torch CUDA tensors)
passed to a communicator's buffer methods takes this path. A call is enqueued on a CUDA
stream (the `stream=` argument, else the caller's current CuPy or torch stream) and returns
once enqueued; `I*` calls return requests backed by CUDA events.

    import cupy as cp, gpucoll
    comm = gpucoll.COMM_WORLD
    x = cp.ones(1 << 20, cp.float32)
    comm.Allreduce(gpucoll.IN_PLACE, x)            # on cupy's current stream

Layers: buffers.py (adapters), streams.py (stream arguments), kernels.py (NVRTC + disk
cache), team.py (IPC memory of a communicator), dispatch.py (algorithm choice and
launches), request.py (event-backed requests); the driver binding is gpucoll._native.cuda.
"""
