"""One GPU per rank for the GPU test scripts: gpucoll runs a rank's collectives on the GPU of its
buffers, so a script that wants local rank k on GPU k (modulo the count) selects it itself."""
import cupy as cp


def one_gpu_per_rank(comm):
    device = comm.local_rank % cp.cuda.runtime.getDeviceCount()
    cp.cuda.Device(device).use()
    return device
