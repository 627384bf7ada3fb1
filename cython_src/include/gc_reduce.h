/* Element-wise reductions on host memory: the combine step of every host collective.
 *
 *   gc_reduce(dst, src, n, dt, op)        dst[i] = dst[i] OP src[i]
 *   gc_reduce2(dst, a, b, n, dt, op)      dst[i] = a[i] OP b[i]   (dst may be a; no other overlap)
 *   gc_scale_avg(buf, n, dt, nranks)      finish AVG: floats divide, integers floor-divide (numpy //)
 *   gc_op_valid(dt, op)                   1 when the pair is supported, else 0
 *   gc_dtype_size(dt)                     bytes per element, 0 for an unknown code
 *
 * Semantics follow NumPy so that results can be checked against it bit for bit:
 *  - integers wrap (computed in the unsigned type of the same width: no signed-overflow UB);
 *  - float MAX/MIN propagate NaN like numpy.maximum/minimum;
 *  - float16/bfloat16 are widened to float32 exactly, combined, and rounded back to nearest even
 *    once per element per call (NaN stays NaN, quieted; overflow gives inf);
 *  - complex: SUM/PROD/AVG only, PROD with the textbook formula (re = ar*br - ai*bi, im =
 *    ar*bi + ai*br), unfused and without C99 Annex G inf/nan recovery (an out-of-line call):
 *    NumPy's SIMD loop may fuse with FMA on some CPUs and then differ in the last bit, while
 *    this stays the same on every rank;
 *  - bool: logical values (any non-zero byte is true, results are 0/1): SUM/MAX/BOR are OR,
 *    PROD/MIN/BAND are AND, BXOR is XOR; AVG is not defined for bool;
 *  - AVG reduces as SUM; gc_scale_avg divides once at the end.
 * An unsupported (dtype, op) pair leaves dst untouched: callers check gc_op_valid first.
 *
 * Every loop is one simple indexed loop over restrict pointers with a branch-free body, so that
 * gcc -O3 vectorizes it (the half-precision conversions included). One function is generated per
 * dtype x op by macro, in an in-place and a three-operand form: the restrict promise does not
 * hold when dst == a, so that case goes to the in-place form instead of relying on luck.
 */
#ifndef GC_REDUCE_H
#define GC_REDUCE_H
#include <stdint.h>
#include <string.h>
#include "gc_types.h"

static inline size_t gc_dtype_size(gc_dtype dt)
{
    switch (dt) {
    case GC_INT8: case GC_UINT8: case GC_BOOL: return 1;
    case GC_INT16: case GC_UINT16: case GC_FLOAT16: case GC_BFLOAT16: return 2;
    case GC_INT32: case GC_UINT32: case GC_FLOAT32: return 4;
    case GC_INT64: case GC_UINT64: case GC_FLOAT64: case GC_COMPLEX64: return 8;
    case GC_COMPLEX128: return 16;
    default: return 0;
    }
}

static inline int gc_op_valid(gc_dtype dt, gc_op op)
{
    if ((unsigned)op >= GC_NUM_OPS || (unsigned)dt >= GC_NUM_DTYPES)
        return 0;
    switch (dt) {
    case GC_INT8: case GC_UINT8: case GC_INT16: case GC_UINT16:
    case GC_INT32: case GC_UINT32: case GC_INT64: case GC_UINT64:
        return 1;
    case GC_FLOAT16: case GC_BFLOAT16: case GC_FLOAT32: case GC_FLOAT64:
        return op <= GC_AVG;
    case GC_COMPLEX64: case GC_COMPLEX128:
        return op == GC_SUM || op == GC_PROD || op == GC_AVG;
    case GC_BOOL:
        return op != GC_AVG;
    default:
        return 0;
    }
}

/* ---- half-precision conversions (portable, branch-free so that they vectorize) ---------- */

static inline uint32_t gc__f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float gc__u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* The conversions below pick between results with bit masks rather than ?: on purpose: gcc
 * turns a ?: whose arm holds float arithmetic into a branch, and then (trapping math) will not
 * vectorize the loop. Masks keep every lane's work unconditional. */
static inline uint32_t gc__mask(int cond) { return (uint32_t)0 - (uint32_t)(cond != 0); }

/* IEEE binary16 -> float32, exact (F. Giesen's half_to_float_fast5): scaling by 2^112
 * rebiases the exponent and renormalises subnormals in one exact multiply. */
static inline float gc_half_to_float(uint16_t h)
{
    uint32_t bits = ((uint32_t)h & 0x7fffu) << 13;        /* exponent and mantissa in place */
    uint32_t o = gc__f2u(gc__u2f(bits) * gc__u2f((254u - 15u) << 23));
    o |= gc__mask(bits >= 0x0f800000u) & 0x7f800000u;     /* inf/nan: exponent all ones */
    return gc__u2f(o | (((uint32_t)h & 0x8000u) << 16));
}

/* float32 -> IEEE binary16, round to nearest even (after F. Giesen's float_to_half_fast3_rtne);
 * NaN stays NaN (quieted, sign and top payload bits kept, as the F16C instruction does),
 * overflow gives inf. */
static inline uint16_t gc_float_to_half(float f)
{
    uint32_t u = gc__f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    /* normal results: rebias, add the rounding bias (0xfff plus the lowest kept bit for ties
     * to even), take the top bits; a carry into the exponent is exactly the right rounding */
    uint32_t normal = (a + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    /* subnormal results: adding 0.5 aligns the 10 mantissa bits at the bottom of the float and
     * the FPU rounds to nearest even for us (the sum is garbage, and unused, for big inputs) */
    const uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t subn = gc__f2u(gc__u2f(a & 0x3fffffffu) + gc__u2f(magic)) - magic;
    uint32_t infnan = 0x7c00u | (gc__mask(a > 0x7f800000u) & (0x200u | ((a >> 13) & 0x3ffu)));
    uint32_t is_sub = gc__mask(a < (113u << 23));
    uint32_t is_big = gc__mask(a >= ((127u + 16u) << 23));
    uint32_t o = (subn & is_sub) | (normal & ~is_sub);
    o = (infnan & is_big) | (o & ~is_big);
    return (uint16_t)(o | sign);
}

static inline float gc_bf16_to_float(uint16_t h) { return gc__u2f((uint32_t)h << 16); }

/* float32 -> bfloat16, round to nearest even; NaN stays NaN (quiet bit set). */
static inline uint16_t gc_float_to_bf16(float f)
{
    uint32_t u = gc__f2u(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = gc__mask((u & 0x7fffffffu) > 0x7f800000u);
    return (uint16_t)((((u >> 16) | 0x40u) & nan) | (rounded & ~nan));
}

/* ---- the loops ----------------------------------------------------------------------------- */

/* NaN-propagating max/min with numpy's choice (the first operand wins on ties and when it is NaN). */
#define GC__FMAX(x, y) (((x) >= (y) || (x) != (x)) ? (x) : (y))
#define GC__FMIN(x, y) (((x) <= (y) || (x) != (x)) ? (x) : (y))

/* One function pair per (name, storage type, expression of x and y). */
#define GC__LOOP(name, T, EXPR)                                                              \
    static void gc__ip_##name(T *restrict d, const T *restrict s, size_t n)                 \
    {                                                                                          \
        for (size_t i = 0; i < n; i++) { T x = d[i], y = s[i]; d[i] = (T)(EXPR); }          \
    }                                                                                          \
    static void gc__3_##name(T *restrict d, const T *restrict a, const T *restrict b,        \
                             size_t n)                                                         \
    {                                                                                          \
        for (size_t i = 0; i < n; i++) { T x = a[i], y = b[i]; d[i] = (T)(EXPR); }          \
    }

/* Integers: U is the unsigned type of the same width; arithmetic there wraps with no UB. */
#define GC__INT_LOOPS(tag, T, U)                                                             \
    GC__LOOP(tag##_sum, T, (U)((U)x + (U)y))                                                  \
    GC__LOOP(tag##_prod, T, (U)((U)x * (U)y))                                                 \
    GC__LOOP(tag##_max, T, x > y ? x : y)                                                     \
    GC__LOOP(tag##_min, T, x < y ? x : y)                                                     \
    GC__LOOP(tag##_band, T, x & y)                                                            \
    GC__LOOP(tag##_bor, T, x | y)                                                             \
    GC__LOOP(tag##_bxor, T, x ^ y)

GC__INT_LOOPS(i8, int8_t, uint8_t)
GC__INT_LOOPS(u8, uint8_t, uint8_t)
GC__INT_LOOPS(i16, int16_t, uint16_t)
GC__INT_LOOPS(u16, uint16_t, uint16_t)
GC__INT_LOOPS(i32, int32_t, uint32_t)
GC__INT_LOOPS(u32, uint32_t, uint32_t)
GC__INT_LOOPS(i64, int64_t, uint64_t)
GC__INT_LOOPS(u64, uint64_t, uint64_t)

#define GC__FLOAT_LOOPS(tag, T)                                                              \
    GC__LOOP(tag##_sum, T, x + y)                                                             \
    GC__LOOP(tag##_prod, T, x * y)                                                            \
    GC__LOOP(tag##_max, T, GC__FMAX(x, y))                                                    \
    GC__LOOP(tag##_min, T, GC__FMIN(x, y))

GC__FLOAT_LOOPS(f32, float)
GC__FLOAT_LOOPS(f64, double)

/* Half types: widen, combine in float32, round back once. */
#define GC__HALF_LOOPS(tag, TOF, FROMF)                                                      \
    GC__LOOP(tag##_sum, uint16_t, FROMF(TOF(x) + TOF(y)))                                     \
    GC__LOOP(tag##_prod, uint16_t, FROMF(TOF(x) * TOF(y)))                                    \
    GC__LOOP(tag##_max, uint16_t, FROMF(GC__FMAX(TOF(x), TOF(y))))                            \
    GC__LOOP(tag##_min, uint16_t, FROMF(GC__FMIN(TOF(x), TOF(y))))

GC__HALF_LOOPS(f16, gc_half_to_float, gc_float_to_half)
GC__HALF_LOOPS(bf16, gc_bf16_to_float, gc_float_to_bf16)

/* bool: normalise to 0/1 so that garbage non-zero bytes still read as true. */
GC__LOOP(b_or, uint8_t, (x != 0) | (y != 0))
GC__LOOP(b_and, uint8_t, (x != 0) & (y != 0))
GC__LOOP(b_xor, uint8_t, (x != 0) ^ (y != 0))

/* Complex product on interleaved (re, im) pairs. */
#define GC__CPROD(tag, T)                                                                    \
    static void gc__ip_##tag##_prod(T *restrict d, const T *restrict s, size_t n)           \
    {                                                                                          \
        for (size_t i = 0; i < n; i++) {                                                      \
            T ar = d[2 * i], ai = d[2 * i + 1], br = s[2 * i], bi = s[2 * i + 1];             \
            d[2 * i] = ar * br - ai * bi;                                                     \
            d[2 * i + 1] = ar * bi + ai * br;                                                 \
        }                                                                                      \
    }                                                                                          \
    static void gc__3_##tag##_prod(T *restrict d, const T *restrict a, const T *restrict b,  \
                                   size_t n)                                                   \
    {                                                                                          \
        for (size_t i = 0; i < n; i++) {                                                      \
            T ar = a[2 * i], ai = a[2 * i + 1], br = b[2 * i], bi = b[2 * i + 1];             \
            d[2 * i] = ar * br - ai * bi;                                                     \
            d[2 * i + 1] = ar * bi + ai * br;                                                 \
        }                                                                                      \
    }
GC__CPROD(c64, float)
GC__CPROD(c128, double)

#undef GC__LOOP
#undef GC__INT_LOOPS
#undef GC__FLOAT_LOOPS
#undef GC__HALF_LOOPS
#undef GC__CPROD

/* Dispatch. `a == NULL` means in place (dst OP= b). */
#define GC__CALL(name, T, nn)                                                                \
    do {                                                                                       \
        if (a == NULL) gc__ip_##name((T *)dst, (const T *)b, (nn));                          \
        else gc__3_##name((T *)dst, (const T *)a, (const T *)b, (nn));                      \
        return;                                                                                \
    } while (0)

#define GC__INT_CASE(DT, tag, T)                                                             \
    case DT:                                                                                   \
        switch (op) {                                                                          \
        case GC_SUM: case GC_AVG: GC__CALL(tag##_sum, T, n);                                  \
        case GC_PROD: GC__CALL(tag##_prod, T, n);                                             \
        case GC_MAX: GC__CALL(tag##_max, T, n);                                               \
        case GC_MIN: GC__CALL(tag##_min, T, n);                                               \
        case GC_BAND: GC__CALL(tag##_band, T, n);                                             \
        case GC_BOR: GC__CALL(tag##_bor, T, n);                                               \
        case GC_BXOR: GC__CALL(tag##_bxor, T, n);                                             \
        default: return;                                                                       \
        }

#define GC__FLOAT_CASE(DT, tag, T)                                                           \
    case DT:                                                                                   \
        switch (op) {                                                                          \
        case GC_SUM: case GC_AVG: GC__CALL(tag##_sum, T, n);                                  \
        case GC_PROD: GC__CALL(tag##_prod, T, n);                                             \
        case GC_MAX: GC__CALL(tag##_max, T, n);                                               \
        case GC_MIN: GC__CALL(tag##_min, T, n);                                               \
        default: return;                                                                       \
        }

static inline void gc__reduce_any(void *dst, const void *a, const void *b, size_t n,
                                  gc_dtype dt, gc_op op)
{
    switch (dt) {
    GC__INT_CASE(GC_INT8, i8, int8_t)
    GC__INT_CASE(GC_UINT8, u8, uint8_t)
    GC__INT_CASE(GC_INT16, i16, int16_t)
    GC__INT_CASE(GC_UINT16, u16, uint16_t)
    GC__INT_CASE(GC_INT32, i32, int32_t)
    GC__INT_CASE(GC_UINT32, u32, uint32_t)
    GC__INT_CASE(GC_INT64, i64, int64_t)
    GC__INT_CASE(GC_UINT64, u64, uint64_t)
    GC__FLOAT_CASE(GC_FLOAT16, f16, uint16_t)
    GC__FLOAT_CASE(GC_BFLOAT16, bf16, uint16_t)
    GC__FLOAT_CASE(GC_FLOAT32, f32, float)
    GC__FLOAT_CASE(GC_FLOAT64, f64, double)
    case GC_COMPLEX64:
        switch (op) {
        case GC_SUM: case GC_AVG: GC__CALL(f32_sum, float, 2 * n);
        case GC_PROD: GC__CALL(c64_prod, float, n);
        default: return;
        }
    case GC_COMPLEX128:
        switch (op) {
        case GC_SUM: case GC_AVG: GC__CALL(f64_sum, double, 2 * n);
        case GC_PROD: GC__CALL(c128_prod, double, n);
        default: return;
        }
    case GC_BOOL:
        switch (op) {
        case GC_SUM: case GC_MAX: case GC_BOR: GC__CALL(b_or, uint8_t, n);
        case GC_PROD: case GC_MIN: case GC_BAND: GC__CALL(b_and, uint8_t, n);
        case GC_BXOR: GC__CALL(b_xor, uint8_t, n);
        default: return;
        }
    default:
        return;
    }
}
#undef GC__CALL
#undef GC__INT_CASE
#undef GC__FLOAT_CASE

/* dst[i] = dst[i] OP src[i]; dst and src must not overlap unless equal. */
static inline void gc_reduce(void *dst, const void *src, size_t count, gc_dtype dt, gc_op op)
{
    gc__reduce_any(dst, NULL, src, count, dt, op);
}

/* dst[i] = a[i] OP b[i]; dst may be a (then it is gc_reduce(a, b)); no other overlap. */
static inline void gc_reduce2(void *dst, const void *a, const void *b, size_t count, gc_dtype dt,
                              gc_op op)
{
    if (dst == a) {
        gc__reduce_any(dst, NULL, b, count, dt, op);
    } else if (dst == b) {
        /* Not the documented contract, but cheap to make safe: stage b through a small stack
         * block so the operand order (which decides NaN payloads and MAX/MIN ties) is kept. */
        unsigned char tmp[4096] __attribute__((aligned(64)));
        size_t sz = gc_dtype_size(dt), per = sz ? sizeof tmp / sz : 0;
        for (size_t i = 0; i < count && per; i += per) {
            size_t k = count - i < per ? count - i : per;
            memcpy(tmp, (const char *)b + i * sz, k * sz);
            gc__reduce_any((char *)dst + i * sz, (const char *)a + i * sz, tmp, k, dt, op);
        }
    } else {
        gc__reduce_any(dst, a, b, count, dt, op);
    }
}

/* ---- AVG finish ------------------------------------------------------------------------------ */

/* Floor division by a positive n, as numpy's // (the quotient rounds toward -inf). Done in
 * 64 bits so that a rank count wider than the element type still divides correctly. */
#define GC__SDIV_LOOP(T)                                                                     \
    do {                                                                                       \
        T *p = (T *)buf;                                                                       \
        const int64_t dv = nranks;                                                            \
        for (size_t i = 0; i < count; i++) {                                                  \
            int64_t x = p[i], q = x / dv, r = x % dv;                                         \
            p[i] = (T)(q - (r < 0));                                                           \
        }                                                                                      \
    } while (0)
#define GC__UDIV_LOOP(T)                                                                     \
    do {                                                                                       \
        T *p = (T *)buf;                                                                       \
        const uint64_t dv = (uint64_t)nranks;                                                 \
        for (size_t i = 0; i < count; i++) p[i] = (T)((uint64_t)p[i] / dv);                  \
    } while (0)
#define GC__FDIV_LOOP(T, nn)                                                                 \
    do {                                                                                       \
        T *p = (T *)buf;                                                                       \
        const T dv = (T)nranks;                                                               \
        for (size_t i = 0; i < (nn); i++) p[i] = p[i] / dv;                                   \
    } while (0)
#define GC__HDIV_LOOP(TOF, FROMF)                                                            \
    do {                                                                                       \
        uint16_t *p = (uint16_t *)buf;                                                         \
        const float dv = (float)nranks;                                                       \
        for (size_t i = 0; i < count; i++) p[i] = FROMF(TOF(p[i]) / dv);                      \
    } while (0)

/* Divide the reduced sum by nranks (> 0): floats divide (half types in float32, rounded back),
 * integers floor-divide like numpy //, complex divides both parts; bool is left alone. */
static inline void gc_scale_avg(void *buf, size_t count, gc_dtype dt, int nranks)
{
    if (nranks <= 1)
        return;
    switch (dt) {
    case GC_INT8: GC__SDIV_LOOP(int8_t); break;
    case GC_INT16: GC__SDIV_LOOP(int16_t); break;
    case GC_INT32: GC__SDIV_LOOP(int32_t); break;
    case GC_INT64: GC__SDIV_LOOP(int64_t); break;
    case GC_UINT8: GC__UDIV_LOOP(uint8_t); break;
    case GC_UINT16: GC__UDIV_LOOP(uint16_t); break;
    case GC_UINT32: GC__UDIV_LOOP(uint32_t); break;
    case GC_UINT64: GC__UDIV_LOOP(uint64_t); break;
    case GC_FLOAT16: GC__HDIV_LOOP(gc_half_to_float, gc_float_to_half); break;
    case GC_BFLOAT16: GC__HDIV_LOOP(gc_bf16_to_float, gc_float_to_bf16); break;
    case GC_FLOAT32: GC__FDIV_LOOP(float, count); break;
    case GC_FLOAT64: GC__FDIV_LOOP(double, count); break;
    case GC_COMPLEX64: GC__FDIV_LOOP(float, 2 * count); break;
    case GC_COMPLEX128: GC__FDIV_LOOP(double, 2 * count); break;
    default: break;
    }
}
#undef GC__SDIV_LOOP
#undef GC__UDIV_LOOP
#undef GC__FDIV_LOOP
#undef GC__HDIV_LOOP

#endif
