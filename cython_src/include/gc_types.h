/* Shared enums and status codes of gpucoll's native layer.
 * The numeric values are mirrored in gpucoll/base/dtypes.py and gpucoll/base/ops.py: change both together. */
#ifndef GC_TYPES_H
#define GC_TYPES_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum {
    GC_INT8 = 0, GC_UINT8 = 1, GC_INT16 = 2, GC_UINT16 = 3,
    GC_INT32 = 4, GC_UINT32 = 5, GC_INT64 = 6, GC_UINT64 = 7,
    GC_FLOAT16 = 8, GC_BFLOAT16 = 9, GC_FLOAT32 = 10, GC_FLOAT64 = 11,
    GC_COMPLEX64 = 12, GC_COMPLEX128 = 13, GC_BOOL = 14,
    GC_NUM_DTYPES = 15
} gc_dtype;

/* AVG is reduced as SUM and divided by the rank count once at the end. */
typedef enum {
    GC_SUM = 0, GC_PROD = 1, GC_MAX = 2, GC_MIN = 3, GC_AVG = 4,
    GC_BAND = 5, GC_BOR = 6, GC_BXOR = 7,
    GC_NUM_OPS = 8
} gc_op;

/* Status codes: 0 is success, negative values are failures. */
#define GC_OK            0
#define GC_ERR_TIMEOUT  -1   /* a wait passed its deadline */
#define GC_ERR_PEER     -2   /* the peer closed the connection or its process is gone */
#define GC_ERR_IO       -3   /* an OS call failed (errno is kept) */
#define GC_ERR_USAGE    -4   /* arguments that cannot work (caught earlier in Python, kept as a guard) */
#define GC_ERR_NOMEM    -5
#define GC_ERR_MISMATCH -6   /* ranks called the same collective with different counts, dtypes, ops or roots */
#define GC_ERR_REVOKED  -7   /* the communicator was revoked (fault tolerance: gpucoll/api/fault.py) */

/* What a shared-memory segment file holds, judged from its header by the creator that finds its
 * name taken and by the clean-up of leftovers (gpucoll/transports/shm_segment.py). */
enum {
    GC_SEG_UNKNOWN = 0,   /* not a segment of this format, or not formatted yet */
    GC_SEG_FOREIGN = 1,   /* a segment whose token is not the one expected: another job made it */
    GC_SEG_IN_USE = 2,    /* a process that may still use it is alive (or cannot be judged) */
    GC_SEG_LEFTOVER = 3   /* every process that could use it is gone */
};

#endif
