/* The CUDA driver API, loaded with dlopen("libcuda.so.1") at first use.
 *
 * Nothing here needs CUDA to build: the few types the driver API uses are declared below
 * with their ABI, and every entry point is looked up by name the first time gc_cuda_load()
 * runs. gpucoll/_native/cuda (cython_src/cuda.pyx) is the only user.
 *
 * The launch path (gc_launch) keeps a kernel's parameters packed: a team block that is fixed
 * for a communicator (staging and flag pointers of every rank) and an argument block that the
 * caller rewrites in place before each launch, so one collective costs one cuLaunchKernel.
 * The layout of gc_team, gc_args and gc_multi is mirrored in gpucoll/kernels/coll.cu: change both.
 */
#ifndef GC_CUDA_H
#define GC_CUDA_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char reserved[64]; } CUipcEventHandle;

#define GC_CU_IPC_LAZY_ENABLE_PEER_ACCESS 1
#define GC_CU_EVENT_DISABLE_TIMING 2
#define GC_CU_EVENT_INTERPROCESS 4
#define GC_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define GC_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define GC_CU_DEVICE_ATTRIBUTE_CC_MAJOR 75
#define GC_CU_DEVICE_ATTRIBUTE_CC_MINOR 76
#define GC_CUDA_ERROR_NOT_READY 600
#define GC_CU_MEMHOSTALLOC_PORTABLE 1
#define GC_CU_MEMHOSTALLOC_DEVICEMAP 2
/* Not a driver status: gc_launch_go found the team's error word set (a kernel timed out). */
#define GC_ERR_DEVICE_TIMEOUT (-1000)

#define GC_MAXRANKS 8

/* Constant for a communicator: every rank's staging and flag memory, mapped here. */
typedef struct {
    unsigned long long stage[GC_MAXRANKS];
    unsigned long long flags[GC_MAXRANKS];
    unsigned long long sync;        /* this rank's epoch / done counter / error word */
    unsigned long long slot;        /* bytes of one staging slot */
    int rank;
    int nranks;
    long long timeout_ns;
    unsigned long long err;         /* device address of the mapped host error word, or 0 */
    unsigned long long seq;         /* host sequence number of the operation (error reports) */
} gc_team;

/* Rewritten before each launch. */
typedef struct {
    unsigned long long send;
    unsigned long long recv;
    unsigned long long count;       /* elements (bytes for the copy kernels) */
    unsigned long long stride;      /* block stride of blocked layouts, same unit */
    unsigned long long psend[GC_MAXRANKS];   /* registered buffers of every rank (direct kernels) */
    unsigned long long precv[GC_MAXRANKS];
    int op;
    int root;
    int nvalues;                    /* AVG divisor */
    int pad;
} gc_args;

/* Fused launches (ar_oneshot_multi): one entry per all-reduce of a group. */
#define GC_MAXFUSE 64
typedef struct {
    unsigned long long send[GC_MAXFUSE];
    unsigned long long recv[GC_MAXFUSE];
    unsigned long long count[GC_MAXFUSE];
    unsigned long long offset[GC_MAXFUSE];  /* bytes into the staging slot */
    int op[GC_MAXFUSE];
    int n;
    int pad;
} gc_multi;

/* Point-to-point launches (p2p_slots): one entry per small GPU message of a call or group. */
#define GC_MAXMSGS 64
typedef struct {
    unsigned long long data[GC_MAXMSGS];   /* the caller's buffer: source of a put, target of a get */
    unsigned long long slot[GC_MAXMSGS];   /* the slot's header as mapped here; the bytes follow */
    unsigned long long count[GC_MAXMSGS];  /* the message's bytes */
    unsigned long long copy[GC_MAXMSGS];   /* bytes a get copies out (0: the receive refused it) */
    unsigned long long seq[GC_MAXMSGS];
    unsigned long long peer[GC_MAXMSGS];   /* the other rank, named in a timeout */
    int mode[GC_MAXMSGS];                  /* GC_SLOT_* steps (gpucoll/kernels/coll.cu) */
    int n;
    int nslots;
} gc_msgs;

typedef struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DeviceCanAccessPeer)(int *, CUdevice, CUdevice);
    CUresult (*DeviceGetPCIBusId)(char *, int, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned int);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
    CUresult (*IpcCloseMemHandle)(CUdeviceptr);
    CUresult (*IpcGetEventHandle)(CUipcEventHandle *, CUevent);
    CUresult (*IpcOpenEventHandle)(CUevent *, CUipcEventHandle);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
    CUresult (*EventCreate)(CUevent *, unsigned int);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamIsCapturing)(CUstream, int *);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*GetErrorName)(CUresult, const char **);
} gc_cuda_api;

static gc_cuda_api gc_cu;
static int gc_cu_state = 0;            /* 0 not tried, 1 loaded, -1 failed */
static char gc_cu_error[256];

static void *gc_cu_sym(void *lib, const char *a, const char *b)
{
    void *p = dlsym(lib, a);
    if (!p && b)
        p = dlsym(lib, b);
    return p;
}

/* 0 when the driver is loaded and initialised; otherwise -1 and gc_cu_error says why. */
static int gc_cuda_load(void)
{
    if (gc_cu_state)
        return gc_cu_state > 0 ? 0 : -1;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        snprintf(gc_cu_error, sizeof gc_cu_error, "cannot load libcuda.so.1 (%s)", dlerror());
        gc_cu_state = -1;
        return -1;
    }
#define GC_SYM(field, a, b)                                                                  \
    do {                                                                                     \
        *(void **)&gc_cu.field = gc_cu_sym(lib, a, b);                                       \
        if (!gc_cu.field) {                                                                  \
            snprintf(gc_cu_error, sizeof gc_cu_error, "libcuda.so.1 has no %s", a);          \
            gc_cu_state = -1;                                                                \
            return -1;                                                                       \
        }                                                                                    \
    } while (0)
    GC_SYM(Init, "cuInit", NULL);
    GC_SYM(DriverGetVersion, "cuDriverGetVersion", NULL);
    GC_SYM(DeviceGet, "cuDeviceGet", NULL);
    GC_SYM(DeviceGetCount, "cuDeviceGetCount", NULL);
    GC_SYM(DeviceGetAttribute, "cuDeviceGetAttribute", NULL);
    GC_SYM(DeviceCanAccessPeer, "cuDeviceCanAccessPeer", NULL);
    GC_SYM(DeviceGetPCIBusId, "cuDeviceGetPCIBusId", NULL);
    GC_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL);
    GC_SYM(CtxSetCurrent, "cuCtxSetCurrent", NULL);
    GC_SYM(CtxGetCurrent, "cuCtxGetCurrent", NULL);
    GC_SYM(CtxSynchronize, "cuCtxSynchronize", NULL);
    GC_SYM(MemHostAlloc, "cuMemHostAlloc", NULL);
    GC_SYM(MemFreeHost, "cuMemFreeHost", NULL);
    GC_SYM(MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer");
    GC_SYM(MemAlloc, "cuMemAlloc_v2", "cuMemAlloc");
    GC_SYM(MemFree, "cuMemFree_v2", "cuMemFree");
    GC_SYM(MemsetD8, "cuMemsetD8_v2", "cuMemsetD8");
    GC_SYM(MemcpyAsync, "cuMemcpyAsync", NULL);
    GC_SYM(MemcpyDtoH, "cuMemcpyDtoH_v2", "cuMemcpyDtoH");
    GC_SYM(MemcpyHtoD, "cuMemcpyHtoD_v2", "cuMemcpyHtoD");
    GC_SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync");
    GC_SYM(MemGetAddressRange, "cuMemGetAddressRange_v2", "cuMemGetAddressRange");
    GC_SYM(PointerGetAttribute, "cuPointerGetAttribute", NULL);
    GC_SYM(IpcGetMemHandle, "cuIpcGetMemHandle", NULL);
    GC_SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle");
    GC_SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle", NULL);
    GC_SYM(IpcGetEventHandle, "cuIpcGetEventHandle", NULL);
    GC_SYM(IpcOpenEventHandle, "cuIpcOpenEventHandle", NULL);
    GC_SYM(ModuleLoadData, "cuModuleLoadData", NULL);
    GC_SYM(ModuleGetFunction, "cuModuleGetFunction", NULL);
    GC_SYM(LaunchKernel, "cuLaunchKernel", NULL);
    GC_SYM(EventCreate, "cuEventCreate", NULL);
    GC_SYM(EventDestroy, "cuEventDestroy_v2", "cuEventDestroy");
    GC_SYM(EventRecord, "cuEventRecord", NULL);
    GC_SYM(EventSynchronize, "cuEventSynchronize", NULL);
    GC_SYM(EventQuery, "cuEventQuery", NULL);
    GC_SYM(EventElapsedTime, "cuEventElapsedTime", "cuEventElapsedTime_v2");
    GC_SYM(StreamWaitEvent, "cuStreamWaitEvent", NULL);
    GC_SYM(StreamSynchronize, "cuStreamSynchronize", NULL);
    GC_SYM(StreamIsCapturing, "cuStreamIsCapturing", NULL);
    GC_SYM(StreamCreate, "cuStreamCreate", NULL);
    GC_SYM(StreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy");
    GC_SYM(GetErrorString, "cuGetErrorString", NULL);
    GC_SYM(GetErrorName, "cuGetErrorName", NULL);
#undef GC_SYM
    CUresult rc = gc_cu.Init(0);
    if (rc != 0) {
        snprintf(gc_cu_error, sizeof gc_cu_error, "cuInit failed with CUDA error %d", rc);
        gc_cu_state = -1;
        return -1;
    }
    gc_cu_state = 1;
    return 0;
}

static const char *gc_cuda_load_error(void) { return gc_cu_error; }

/* "CUDA_ERROR_X: text" for a driver status. */
static void gc_cuda_describe(CUresult rc, char *out, size_t len)
{
    const char *name = NULL, *text = NULL;
    if (gc_cu_state > 0) {
        gc_cu.GetErrorName(rc, &name);
        gc_cu.GetErrorString(rc, &text);
    }
    snprintf(out, len, "%s (%d): %s", name ? name : "CUDA error", rc, text ? text : "unknown");
}

/* One pre-packed kernel launch: params point into team and args, which live here.
 * err_host is the host side of team.err: a launch refuses to start once a kernel of the
 * team has recorded a timeout or a release there (the peers' epochs are out of step from
 * then on), or once the host has released every wait (err_host[1], the abort word: bit 63;
 * the other bits release the waits on one peer and let the rest go on). */
typedef struct {
    gc_team team;
    gc_args args;
    gc_multi multi;     /* third parameter of the fused kernel; the others read two */
    gc_msgs msgs;       /* third parameter of p2p_slots */
    void *params[3];
    void *msg_params[3];
    CUcontext ctx;
    volatile unsigned long long *err_host;
} gc_launch;

static void gc_launch_init(gc_launch *l)
{
    memset(l, 0, sizeof *l);
    l->params[0] = &l->team;
    l->params[1] = &l->args;
    l->params[2] = &l->multi;
    l->msg_params[0] = &l->team;
    l->msg_params[1] = &l->args;
    l->msg_params[2] = &l->msgs;
}

static inline CUresult gc_launch_make_current(gc_launch *l)
{
    CUcontext cur = NULL;
    CUresult rc = gc_cu.CtxGetCurrent(&cur);
    if (rc == 0 && cur != l->ctx)
        rc = gc_cu.CtxSetCurrent(l->ctx);
    return rc;
}

static inline CUresult gc_launch_with(gc_launch *l, CUfunction fn, unsigned grid, unsigned block,
                                      CUstream stream, void **params)
{
    if (l->err_host && (l->err_host[0] || (l->err_host[1] >> 63)))
        return GC_ERR_DEVICE_TIMEOUT;
    CUresult rc = gc_launch_make_current(l);
    if (rc != 0)
        return rc;
    return gc_cu.LaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params, NULL);
}

static inline CUresult gc_launch_go(gc_launch *l, CUfunction fn, unsigned grid, unsigned block,
                                    CUstream stream)
{
    return gc_launch_with(l, fn, grid, block, stream, l->params);
}

#endif
