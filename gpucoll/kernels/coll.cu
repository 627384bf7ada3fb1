// gpucoll's collective kernels for the ranks of one host (CUDA IPC over NVLink or PCIe P2P).
//
// Compiled with NVRTC for the device's own architecture (gpucoll/engines/gpu/kernels.py), once per
// element type: -DGC_T=<type> builds the reducing kernels for that type, -DGC_COPY the
// byte-copying ones. No header is included, so NVRTC needs nothing but this file.
//
// Memory every rank owns and every other rank maps (gpucoll/engines/gpu/team.py):
//   flags  [src rank][block]  u64, written by rank `src` with st.release.sys, read here with
//                             ld.acquire.sys; a value is op * 4 + phase, so flags never need
//                             resetting and only grow;
//   sync   [0] the last finished op, [1] blocks done with the current op, [2] error word
//          (local only; every block reads the op number at start, the last block to finish
//          advances it, so it lives on the device and CUDA-graph replays stay in step);
//   stage  [parity][phase][src rank][slot]: peers push into our staging, parity = op & 1.
// Double buffering by parity is safe because every kernel makes each rank wait for a signal
// of the same op from every other rank, so a rank can be at most one op ahead of any peer.
//
// Blocks synchronise with the same block index on the peers: block b of every rank handles
// the same slice of the data, so no grid-wide barrier is needed. Results are reduced in rank
// order by every rank with the same code: bitwise identical everywhere. float16/bfloat16
// accumulate in float32 and round once.

typedef unsigned long long u64;
typedef long long i64;
#define MAXR 8
#define MAXB 256

// Mirrors gc_team / gc_args in cython_src/include/gc_cuda.h.
struct Team {
    u64 stage[MAXR];
    u64 flags[MAXR];
    u64 sync;
    u64 slot;
    int rank;
    int nranks;
    i64 timeout_ns;
    u64 err;        // pinned host words mapped for the device (0: none): the error word, then
                    // the abort word (see wait_word)
    u64 seq;        // the host's sequence number of the operation this launch belongs to
};

struct Args {
    u64 send;
    u64 recv;
    u64 count;
    u64 stride;
    u64 psend[MAXR];
    u64 precv[MAXR];
    int op;
    int root;
    int nvalues;
    int pad;
};

// Mirrors gc_multi: the all-reduces of one group, fused into one launch.
#define MAXFUSE 64
struct Multi {
    u64 send[MAXFUSE];
    u64 recv[MAXFUSE];
    u64 count[MAXFUSE];
    u64 offset[MAXFUSE];  // bytes into the staging slot
    int op[MAXFUSE];
    int n;
    int pad;
};

#define KERNEL extern "C" __global__ void __launch_bounds__(512)

// ---- synchronisation ------------------------------------------------------------------------
__device__ __forceinline__ u64 ld_acquire_sys(const u64 *p)
{
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_sys(u64 *p, u64 v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ u64 now_ns()
{
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u64 op_begin(const Team &t)
{
    __shared__ u64 s_op;
    if (threadIdx.x == 0)
        s_op = *(volatile u64 *)t.sync + 1;
    __syncthreads();
    return s_op;
}

__device__ __forceinline__ u64 *flag_at(const Team &t, u64 owner_flags, int src)
{
    return (u64 *)owner_flags + (u64)src * MAXB + blockIdx.x;
}

// Tell every peer's block blockIdx.x that this block reached `value` (all earlier writes of
// the block, local or remote, are visible to whoever sees the flag).
__device__ __forceinline__ void signal_all(const Team &t, u64 value)
{
    __syncthreads();
#pragma unroll
    for (int p = 0; p < MAXR; p++)
        if (p < t.nranks && p != t.rank && threadIdx.x == p)
            st_release_sys(flag_at(t, t.flags[p], t.rank), value);
}

// The abort word, next to the error word in mapped host memory (t.err + 8), lets the host release
// waits that can never end: bit 63 releases every wait (the communicator was revoked, or a rank of
// a collective's team died), bit (peer % 63) the waits on that peer (a point-to-point partner
// died). Read over PCIe, so only every ABORT_POLL_NS of a wait that has not ended at once.
#define ABORT_POLL_NS 10000ull
#define ABORT_ALL (1ull << 63)
#define RELEASED (1ull << 62)

__device__ __forceinline__ bool released(const Team &t, u64 peer)
{
    if (!t.err)
        return false;
    u64 a = ((volatile u64 *)t.err)[1];
    return (a & (ABORT_ALL | (1ull << (peer % 63)))) != 0;
}

// Spin until *f >= value; false after t.timeout_ns, or once the host's abort word releases the
// wait. The host reads the error word without synchronising: (seq << 8) | (1 + peer), with
// RELEASED (bit 62) set when the abort word ended the wait.
__device__ __forceinline__ bool wait_word(const Team &t, const u64 *f, u64 value, u64 peer)
{
    if (ld_acquire_sys(f) >= value)
        return true;
    u64 t0 = now_ns(), poll = t0 + ABORT_POLL_NS;
    while (ld_acquire_sys(f) < value) {
        u64 now = now_ns();
        bool out = now - t0 > (u64)t.timeout_ns;
        bool abort = !out && now >= poll && released(t, peer);
        if (now >= poll)
            poll = now + ABORT_POLL_NS;
        if (out || abort) {
            if (t.sync && out)
                atomicExch((u64 *)t.sync + 2, 1ull + peer);
            if (t.err) {
                *(volatile u64 *)t.err = (t.seq << 8) | (abort ? RELEASED : 0) | (1ull + peer);
                __threadfence_system();
            }
            return false;
        }
    }
    return true;
}

// Wait until every peer's block blockIdx.x signalled `value`.
__device__ __forceinline__ void wait_all(const Team &t, u64 value)
{
    int p = threadIdx.x;
    if (p < t.nranks && p != t.rank)
        wait_word(t, flag_at(t, t.flags[t.rank], p), value, p);
    __syncthreads();
}

__device__ __forceinline__ void sync_all(const Team &t, u64 value)
{
    signal_all(t, value);
    wait_all(t, value);
}

__device__ __forceinline__ void op_end(const Team &t, u64 op)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 *s = (u64 *)t.sync;
        __threadfence();
        u64 prev = atomicAdd(s + 1, 1ull);
        if (prev == gridDim.x - 1) {
            s[1] = 0;
            __threadfence();
            *(volatile u64 *)s = op;
        }
    }
}

__device__ __forceinline__ char *stage(const Team &t, u64 owner_stage, u64 op, int phase, int src)
{
    return (char *)owner_stage + (u64)(((op & 1) * 2 + phase) * t.nranks + src) * t.slot;
}

// ---- slicing and copying --------------------------------------------------------------------
struct Rg {
    u64 lo, hi;
};

// Part `part` of `parts` equal parts of [0, len), multiples of `vec` units.
__device__ __forceinline__ Rg slice_of(u64 len, u64 vec, u64 part, u64 parts)
{
    u64 per = (len + parts - 1) / parts;
    per = (per + vec - 1) / vec * vec;
    u64 lo = part * per;
    if (lo > len)
        lo = len;
    u64 hi = lo + per;
    if (hi > len)
        hi = len;
    Rg r = {lo, hi};
    return r;
}

// This block's part of [0, len).
__device__ __forceinline__ Rg slice(u64 len, u64 vec) { return slice_of(len, vec, blockIdx.x, gridDim.x); }

__device__ __forceinline__ u64 umin(u64 a, u64 b) { return a < b ? a : b; }

// dst[lo:hi] = src[lo:hi], bytes, by this block; 16-byte accesses when both are aligned.
__device__ __forceinline__ void copy_bytes(char *dst, const char *src, u64 lo, u64 hi)
{
    if (dst == src || hi <= lo)
        return;
    dst += lo;
    src += lo;
    const u64 n = hi - lo, st = blockDim.x;
    if ((((u64)dst | (u64)src) & 15) == 0) {
        const u64 nv = n >> 4;
        uint4 *d = (uint4 *)dst;
        const uint4 *s = (const uint4 *)src;
        u64 i = threadIdx.x;
        for (; i + 3 * st < nv; i += 4 * st) {
            uint4 a = s[i], b = s[i + st], c = s[i + 2 * st], e = s[i + 3 * st];
            d[i] = a;
            d[i + st] = b;
            d[i + 2 * st] = c;
            d[i + 3 * st] = e;
        }
        for (; i < nv; i += st)
            d[i] = s[i];
        for (u64 j = (nv << 4) + threadIdx.x; j < n; j += st)
            dst[j] = src[j];
    } else if ((((u64)dst | (u64)src) & 3) == 0) {
        const u64 nw = n >> 2;
        for (u64 i = threadIdx.x; i < nw; i += st)
            ((unsigned *)dst)[i] = ((const unsigned *)src)[i];
        for (u64 j = (nw << 2) + threadIdx.x; j < n; j += st)
            dst[j] = src[j];
    } else {
        for (u64 j = threadIdx.x; j < n; j += st)
            dst[j] = src[j];
    }
}

#ifdef GC_T
// ---- element types and operations -----------------------------------------------------------
struct h16 {
    unsigned short x;
};
struct b16 {
    unsigned short x;
};

template <class T> struct Acc {
    typedef T type;
};
template <> struct Acc<h16> {
    typedef float type;
};
template <> struct Acc<b16> {
    typedef float type;
};

template <class T> __device__ __forceinline__ typename Acc<T>::type up(T v) { return v; }
template <> __device__ __forceinline__ float up<h16>(h16 v)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
    return f;
}
template <> __device__ __forceinline__ float up<b16>(b16 v) { return __uint_as_float((unsigned)v.x << 16); }

template <class T> __device__ __forceinline__ T down(typename Acc<T>::type a) { return a; }
template <> __device__ __forceinline__ h16 down<h16>(float f)
{
    h16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
    return r;
}
template <> __device__ __forceinline__ b16 down<b16>(float f)
{
    b16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
    return r;
}

template <class A> struct IsInt {
    enum { value = 0 };
};
#define GC_INT(T)                                                                                  \
    template <> struct IsInt<T> {                                                                  \
        enum { value = 1 };                                                                        \
    };
GC_INT(signed char)
GC_INT(unsigned char)
GC_INT(short)
GC_INT(unsigned short)
GC_INT(int)
GC_INT(unsigned)
GC_INT(long long)
GC_INT(unsigned long long)

// gc_op: SUM 0, PROD 1, MAX 2, MIN 3, AVG 4 (as SUM, divided at the end), BAND 5, BOR 6, BXOR 7
template <class A> __device__ __forceinline__ A apply(int op, A a, A b)
{
    switch (op) {
    case 1:
        return (A)(a * b);
    case 2:
        return b > a ? b : a;
    case 3:
        return b < a ? b : a;
    case 5:
        if constexpr (IsInt<A>::value)
            return (A)(a & b);
        else
            return a + b;
    case 6:
        if constexpr (IsInt<A>::value)
            return (A)(a | b);
        else
            return a + b;
    case 7:
        if constexpr (IsInt<A>::value)
            return (A)(a ^ b);
        else
            return a + b;
    default:
        return (A)(a + b);
    }
}

// AVG: floats divide, integers floor-divide (numpy's //).
template <class A> __device__ __forceinline__ A finish(int op, A a, int n)
{
    if (op != 4)
        return a;
    if constexpr (IsInt<A>::value) {
        A d = (A)n;
        A q = (A)(a / d);
        if ((A)-1 < (A)0 && (A)(a % d) != (A)0 && a < (A)0)
            q = (A)(q - 1);
        return q;
    } else {
        return a / (A)n;
    }
}

// dst[d][lo:hi] = src[0] op src[1] op ... op src[n-1] (element units), for d < ndst. Every
// source is read before any destination is written, element by element, so a destination may
// alias a source.
template <class T>
__device__ __forceinline__ void reduce_into(int op, int nvalues, int n, const char *const *src,
                                            char *const *dst, int ndst, u64 lo, u64 hi)
{
    typedef typename Acc<T>::type A;
    constexpr int V = 16 / sizeof(T);
    constexpr int U = 4;
    union Vec {
        uint4 u;
        T e[V];
    };
    bool aligned = true;
#pragma unroll
    for (int q = 0; q < MAXR; q++) {
        if (q < n)
            aligned = aligned && ((u64)src[q] & 15) == 0;
        if (q < ndst)
            aligned = aligned && ((u64)dst[q] & 15) == 0;
    }
    const u64 st = blockDim.x;
    const u64 vlo = lo / V, vhi = aligned ? hi / V : vlo;
    for (u64 i = vlo + threadIdx.x; i < vhi; i += U * st) {
        A acc[U][V];
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 k = i + u * st;
            if (k < vhi) {
                Vec x;
                x.u = ((const uint4 *)src[0])[k];
#pragma unroll
                for (int e = 0; e < V; e++)
                    acc[u][e] = up<T>(x.e[e]);
            }
        }
#pragma unroll
        for (int q = 1; q < MAXR; q++) {
            if (q < n) {
                Vec x[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (i + u * st < vhi)
                        x[u].u = ((const uint4 *)src[q])[i + u * st];
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (i + u * st < vhi)
#pragma unroll
                        for (int e = 0; e < V; e++)
                            acc[u][e] = apply<A>(op, acc[u][e], up<T>(x[u].e[e]));
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            u64 k = i + u * st;
            if (k < vhi) {
                Vec y;
#pragma unroll
                for (int e = 0; e < V; e++)
                    y.e[e] = down<T>(finish<A>(op, acc[u][e], nvalues));
#pragma unroll
                for (int d = 0; d < MAXR; d++)
                    if (d < ndst)
                        ((uint4 *)dst[d])[k] = y.u;
            }
        }
    }
    // The scalar tail starts at lo, not below it: an empty slice of a length that is not a
    // multiple of V (lo == hi == len) has vhi * V < lo, and must not touch the element there.
    for (u64 j = (vhi * V > lo ? vhi * V : lo) + threadIdx.x; j < hi; j += st) {
        A acc = up<T>(((const T *)src[0])[j]);
#pragma unroll
        for (int q = 1; q < MAXR; q++)
            if (q < n)
                acc = apply<A>(op, acc, up<T>(((const T *)src[q])[j]));
        T y = down<T>(finish<A>(op, acc, nvalues));
#pragma unroll
        for (int d = 0; d < MAXR; d++)
            if (d < ndst)
                ((T *)dst[d])[j] = y;
    }
}

typedef GC_T T;
#define E ((u64)sizeof(T))
#define VE ((u64)(16 / sizeof(T)))

// All-reduce, one shot (small): push the whole input to every peer, then every rank reduces.
KERNEL ar_oneshot(Team t, Args a)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks;
    Rg s = slice(a.count, VE);
#pragma unroll
    for (int p = 0; p < MAXR; p++)
        if (p < n && p != r)
            copy_bytes(stage(t, t.stage[p], op, 0, r), (const char *)a.send, s.lo * E, s.hi * E);
    sync_all(t, op * 4 + 1);
    const char *src[MAXR];
    char *dst[MAXR];
#pragma unroll
    for (int q = 0; q < MAXR; q++) {
        src[q] = q == r ? (const char *)a.send : stage(t, t.stage[r], op, 0, q);
        dst[q] = (char *)a.recv;
    }
    reduce_into<T>(a.op, a.nvalues, n, src, dst, 1, s.lo, s.hi);
    op_end(t, op);
}

// The all-reduces of a group in one shot: every entry is pushed to every peer at its offset in
// the slot, one signal for all of them, then every rank reduces each entry in rank order (the
// same arithmetic as ar_oneshot, so fused and single results are bitwise equal).
KERNEL ar_oneshot_multi(Team t, Args a, const __grid_constant__ Multi m)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks;
    for (int j = 0; j < m.n; j++) {
        Rg s = slice(m.count[j], VE);
#pragma unroll
        for (int p = 0; p < MAXR; p++)
            if (p < n && p != r)
                copy_bytes(stage(t, t.stage[p], op, 0, r) + m.offset[j], (const char *)m.send[j], s.lo * E, s.hi * E);
    }
    sync_all(t, op * 4 + 1);
    for (int j = 0; j < m.n; j++) {
        Rg s = slice(m.count[j], VE);
        const char *src[MAXR];
        char *dst[MAXR];
#pragma unroll
        for (int q = 0; q < MAXR; q++) {
            src[q] = q == r ? (const char *)m.send[j] : stage(t, t.stage[r], op, 0, q) + m.offset[j];
            dst[q] = (char *)m.recv[j];
        }
        reduce_into<T>(m.op[j], a.nvalues, n, src, dst, 1, s.lo, s.hi);
    }
    op_end(t, op);
}

__device__ __forceinline__ u64 chunk_elems(u64 count, int n)
{
    u64 c = (count + n - 1) / n;
    return (c + VE - 1) / VE * VE;
}

__device__ __forceinline__ u64 chunk_len(u64 count, u64 C, int q)
{
    u64 b = (u64)q * C;
    return b >= count ? 0 : umin(C, count - b);
}

// All-reduce, two shot through staging (medium): chunk p of the input goes to rank p, which
// reduces it and pushes the result back to everyone.
KERNEL ar_twoshot(Team t, Args a)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks;
    const u64 C = chunk_elems(a.count, n);
    Rg s = slice(C, VE);
    const char *send = (const char *)a.send;
    char *recv = (char *)a.recv;
#pragma unroll
    for (int p = 0; p < MAXR; p++)
        if (p < n && p != r) {
            u64 L = chunk_len(a.count, C, p);
            copy_bytes(stage(t, t.stage[p], op, 0, r), send + p * C * E, umin(s.lo, L) * E, umin(s.hi, L) * E);
        }
    sync_all(t, op * 4 + 1);
    const char *src[MAXR];
    char *dst[MAXR];
#pragma unroll
    for (int q = 0; q < MAXR; q++) {
        src[q] = q == r ? send + r * C * E : stage(t, t.stage[r], op, 0, q);
        dst[q] = q == r ? recv + r * C * E : stage(t, t.stage[q], op, 1, r);
    }
    u64 L = chunk_len(a.count, C, r);
    reduce_into<T>(a.op, a.nvalues, n, src, dst, n, umin(s.lo, L), umin(s.hi, L));
    sync_all(t, op * 4 + 2);
#pragma unroll
    for (int p = 0; p < MAXR; p++)
        if (p < n && p != r) {
            u64 Lp = chunk_len(a.count, C, p);
            copy_bytes(recv + p * C * E, stage(t, t.stage[r], op, 1, p), umin(s.lo, Lp) * E, umin(s.hi, Lp) * E);
        }
    op_end(t, op);
}

// All-reduce, two shot on registered buffers (large): rank r reads chunk r of every rank's
// input over NVLink and writes the result into every rank's output.
KERNEL ar_registered(Team t, Args a)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks;
    const u64 C = chunk_elems(a.count, n);
    Rg s = slice(C, VE);
    sync_all(t, op * 4 + 1);  // every peer's kernel has started: its buffers are ready
    const char *src[MAXR];
    char *dst[MAXR];
#pragma unroll
    for (int q = 0; q < MAXR; q++) {
        src[q] = (q == r ? (const char *)a.send : (const char *)a.psend[q]) + r * C * E;
        dst[q] = (q == r ? (char *)a.recv : (char *)a.precv[q]) + r * C * E;
    }
    u64 L = chunk_len(a.count, C, r);
    reduce_into<T>(a.op, a.nvalues, n, src, dst, n, umin(s.lo, L), umin(s.hi, L));
    sync_all(t, op * 4 + 2);  // peers are done with our buffers
    op_end(t, op);
}

// Reduce-scatter through staging: block p of the input (stride elements apart) goes to rank p.
KERNEL rs_staged(Team t, Args a)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks;
    Rg s = slice(a.count, VE);
    const char *send = (const char *)a.send;
#pragma unroll
    for (int p = 0; p < MAXR; p++)
        if (p < n && p != r)
            copy_bytes(stage(t, t.stage[p], op, 0, r), send + p * a.stride * E, s.lo * E, s.hi * E);
    sync_all(t, op * 4 + 1);
    const char *src[MAXR];
    char *dst[MAXR];
#pragma unroll
    for (int q = 0; q < MAXR; q++) {
        src[q] = q == r ? send + r * a.stride * E : stage(t, t.stage[r], op, 0, q);
        dst[q] = (char *)a.recv;
    }
    reduce_into<T>(a.op, a.nvalues, n, src, dst, 1, s.lo, s.hi);
    op_end(t, op);
}

// Reduce-scatter on registered inputs (distinct send and receive buffers).
KERNEL rs_registered(Team t, Args a)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks;
    Rg s = slice(a.count, VE);
    sync_all(t, op * 4 + 1);
    const char *src[MAXR];
    char *dst[MAXR];
#pragma unroll
    for (int q = 0; q < MAXR; q++) {
        src[q] = (q == r ? (const char *)a.send : (const char *)a.psend[q]) + r * a.stride * E;
        dst[q] = (char *)a.recv;
    }
    reduce_into<T>(a.op, a.nvalues, n, src, dst, 1, s.lo, s.hi);
    sync_all(t, op * 4 + 2);
    op_end(t, op);
}

// Reduce to the root through staging.
KERNEL red_staged(Team t, Args a)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks, root = a.root;
    Rg s = slice(a.count, VE);
    if (r != root)
        copy_bytes(stage(t, t.stage[root], op, 0, r), (const char *)a.send, s.lo * E, s.hi * E);
    sync_all(t, op * 4 + 1);
    if (r == root) {
        const char *src[MAXR];
        char *dst[MAXR];
#pragma unroll
        for (int q = 0; q < MAXR; q++) {
            src[q] = q == r ? (const char *)a.send : stage(t, t.stage[r], op, 0, q);
            dst[q] = (char *)a.recv;
        }
        reduce_into<T>(a.op, a.nvalues, n, src, dst, 1, s.lo, s.hi);
    }
    op_end(t, op);
}
#endif  // GC_T

#ifdef GC_COPY
// Byte-moving collectives. count and stride are in bytes.

// Synchronise every rank (one block).
KERNEL barrier(Team t, Args a)
{
    const u64 op = op_begin(t);
    sync_all(t, op * 4 + 1);
    op_end(t, op);
}

// All-gather and all-to-all differ only in what each peer gets: the same block (send_stride
// 0) or block p of the input for rank p (send_stride = stride).
__device__ __forceinline__ void exchange_staged(const Team &t, const Args &a, u64 send_stride)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks;
    Rg s = slice(a.count, 16);
    const char *send = (const char *)a.send;
    char *recv = (char *)a.recv;
#pragma unroll
    for (int p = 0; p < MAXR; p++)
        if (p < n && p != r)
            copy_bytes(stage(t, t.stage[p], op, 0, r), send + p * send_stride, s.lo, s.hi);
    copy_bytes(recv + r * a.stride, send + r * send_stride, s.lo, s.hi);
    sync_all(t, op * 4 + 1);
#pragma unroll
    for (int q = 0; q < MAXR; q++)
        if (q < n && q != r)
            copy_bytes(recv + q * a.stride, stage(t, t.stage[r], op, 0, q), s.lo, s.hi);
    op_end(t, op);
}

// On registered receive buffers: push our block(s) into every rank's output.
__device__ __forceinline__ void exchange_registered(const Team &t, const Args &a, u64 send_stride)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks;
    Rg s = slice(a.count, 16);
    const char *send = (const char *)a.send;
    sync_all(t, op * 4 + 1);
#pragma unroll
    for (int p = 0; p < MAXR; p++)
        if (p < n && p != r)
            copy_bytes((char *)a.precv[p] + r * a.stride, send + p * send_stride, s.lo, s.hi);
    copy_bytes((char *)a.recv + r * a.stride, send + r * send_stride, s.lo, s.hi);
    sync_all(t, op * 4 + 2);
    op_end(t, op);
}

KERNEL ag_staged(Team t, Args a) { exchange_staged(t, a, 0); }

KERNEL ag_registered(Team t, Args a) { exchange_registered(t, a, 0); }

KERNEL bc_staged(Team t, Args a)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks, root = a.root;
    Rg s = slice(a.count, 16);
    if (r == root) {
#pragma unroll
        for (int p = 0; p < MAXR; p++)
            if (p < n && p != r)
                copy_bytes(stage(t, t.stage[p], op, 0, root), (const char *)a.recv, s.lo, s.hi);
    }
    sync_all(t, op * 4 + 1);
    if (r != root)
        copy_bytes((char *)a.recv, stage(t, t.stage[r], op, 0, root), s.lo, s.hi);
    op_end(t, op);
}

// Broadcast on registered buffers: the root writes into every rank's buffer.
KERNEL bc_registered(Team t, Args a)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks, root = a.root;
    Rg s = slice(a.count, 16);
    sync_all(t, op * 4 + 1);
    if (r == root) {
#pragma unroll
        for (int p = 0; p < MAXR; p++)
            if (p < n && p != r)
                copy_bytes((char *)a.precv[p], (const char *)a.recv, s.lo, s.hi);
    }
    sync_all(t, op * 4 + 2);
    op_end(t, op);
}

KERNEL a2a_staged(Team t, Args a) { exchange_staged(t, a, a.stride); }

// Distinct send and receive buffers only (the dispatcher's choice).
KERNEL a2a_registered(Team t, Args a) { exchange_registered(t, a, a.stride); }

KERNEL ga_staged(Team t, Args a)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks, root = a.root;
    Rg s = slice(a.count, 16);
    if (r != root)
        copy_bytes(stage(t, t.stage[root], op, 0, r), (const char *)a.send, s.lo, s.hi);
    else
        copy_bytes((char *)a.recv + r * a.stride, (const char *)a.send, s.lo, s.hi);
    sync_all(t, op * 4 + 1);
    if (r == root) {
#pragma unroll
        for (int q = 0; q < MAXR; q++)
            if (q < n && q != r)
                copy_bytes((char *)a.recv + q * a.stride, stage(t, t.stage[r], op, 0, q), s.lo, s.hi);
    }
    op_end(t, op);
}

KERNEL sc_staged(Team t, Args a)
{
    const u64 op = op_begin(t);
    const int r = t.rank, n = t.nranks, root = a.root;
    Rg s = slice(a.count, 16);
    if (r == root) {
#pragma unroll
        for (int p = 0; p < MAXR; p++)
            if (p < n && p != r)
                copy_bytes(stage(t, t.stage[p], op, 0, root), (const char *)a.send + p * a.stride, s.lo, s.hi);
        copy_bytes((char *)a.recv, (const char *)a.send + r * a.stride, s.lo, s.hi);
    }
    sync_all(t, op * 4 + 1);
    if (r != root)
        copy_bytes((char *)a.recv, stage(t, t.stage[r], op, 0, root), s.lo, s.hi);
    op_end(t, op);
}

// ---- point to point through outboxes (gpucoll/engines/p2p/outboxes.py) -------------------------------
// A rank's outbox for one peer is `nslots` slots in the sender's own memory: a header of
// SLOT_BLOCKS ready words and SLOT_BLOCKS free words, then room for a small message's bytes.
// Message n (numbered per pair) uses slot n % nslots, whatever its size. Each launch entry
// runs some of these steps, in this order, SLOT_BLOCKS blocks per entry:
//   WAIT_PREV  wait until every block of the slot's previous message was read out (the free
//              words; the two messages may be cut into different slices)
//   WAIT_FREE  wait until every block of this message was read out (a large send's end)
//   WAIT_READY wait for this block's ready word (the sender reached the message)
//   COPY_IN / COPY_OUT  this block's slice, into the slot / out of it over P2P
//   SET_READY / SET_FREE  release-store n + 1 in this block's ready / free word
// A small message is put (WAIT_PREV | COPY_IN | SET_READY) and got (WAIT_READY | COPY_OUT |
// SET_FREE); a large one stays in the sender's buffer and only uses the words: the sender
// announces it (WAIT_PREV | SET_READY) and later waits for WAIT_FREE; the receiver waits
// (WAIT_READY), copies on the copy engine, then frees (SET_FREE).
#define SLOT_BLOCKS 4
#define SLOT_FREE_WORDS 16  // free[] starts 128 bytes after ready[]: another cache line
#define SLOT_HEADER 256
#define MAXMSGS 64
#define WAIT_PREV 1
#define COPY_IN 2
#define SET_READY 4
#define WAIT_READY 8
#define COPY_OUT 16
#define SET_FREE 32
#define WAIT_FREE 64

// Mirrors gc_msgs in cython_src/include/gc_cuda.h.
struct Msgs {
    u64 data[MAXMSGS];   // the caller's buffer: source of a put, target of a get
    u64 slot[MAXMSGS];   // the slot's header as mapped here
    u64 count[MAXMSGS];  // the message's bytes
    u64 copy[MAXMSGS];   // bytes a get copies out: count, or 0 when the receive refused it
    u64 seq[MAXMSGS];
    u64 peer[MAXMSGS];   // the other rank, named in a timeout
    int mode[MAXMSGS];
    int n;
    int nslots;
};

KERNEL p2p_slots(Team t, Args a, Msgs m)
{
    const int e = blockIdx.x / SLOT_BLOCKS, b = blockIdx.x % SLOT_BLOCKS, mode = m.mode[e];
    u64 *ready = (u64 *)m.slot[e], *freed = ready + SLOT_FREE_WORDS;
    char *bytes = (char *)m.slot[e] + SLOT_HEADER;
    const u64 seq = m.seq[e];
    const Rg s = slice_of(m.count[e], 16, b, SLOT_BLOCKS);
    __shared__ int ok;
    if (threadIdx.x == 0)
        ok = 1;
    __syncthreads();
    u64 free_at = 0;
    if ((mode & WAIT_PREV) && seq >= (u64)m.nslots)
        free_at = seq - m.nslots + 1;
    if (mode & WAIT_FREE)
        free_at = seq + 1;
    if (free_at && threadIdx.x < SLOT_BLOCKS && !wait_word(t, freed + threadIdx.x, free_at, m.peer[e]))
        ok = 0;
    if ((mode & WAIT_READY) && threadIdx.x == 0 && !wait_word(t, ready + b, seq + 1, m.peer[e]))
        ok = 0;
    __syncthreads();
    if (!ok)
        return;
    if (mode & COPY_IN)
        copy_bytes(bytes, (const char *)m.data[e], s.lo, s.hi);
    if (mode & COPY_OUT)
        copy_bytes((char *)m.data[e], bytes, s.lo, umin(s.hi, m.copy[e]));
    __syncthreads();
    if ((mode & SET_READY) && threadIdx.x == 0)
        st_release_sys(ready + b, seq + 1);
    if ((mode & SET_FREE) && threadIdx.x == 0)
        st_release_sys(freed + b, seq + 1);
}
#endif  // GC_COPY
