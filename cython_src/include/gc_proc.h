/* Process liveness: the one rule every waiter of this host uses (gc_direct.h, gc_shmchan.h, and
 * gpucoll/transports/shm.py through gpucoll._native.direct.pid_dead).
 *
 * A process is dead once kill(pid, 0) says ESRCH, or once /proc/<pid>/stat says it is a zombie
 * (Z: it has exited and waits for its parent to reap it) or dead (X): kill(pid, 0) still
 * succeeds on a zombie, and a rank whose parent is slow to reap it must not be waited for until
 * the deadline. A pid of 0 or less (unknown), a process we may not signal whose stat cannot be
 * read, or a stat that cannot be parsed is never judged dead: the deadline decides.
 * A pid only means something in its own pid namespace: callers compare namespaces first.
 */
#ifndef GC_PROC_H
#define GC_PROC_H
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static inline int gc_pid_dead(int32_t pid)
{
    if (pid <= 0)
        return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return 1;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* "pid (comm) S ...": comm may itself hold ')' or spaces */
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* Cross-memory attach: move n bytes between local memory and address remote of process pid
 * (write: into pid's), every one of them (gc_p2p.h's rendezvous, gc_direct.h's single-copy
 * all-to-all): 0, or the errno that stopped it. */
static inline int gc_cma_move(pid_t pid, char *local, uint64_t remote, uint64_t n, int write)
{
    while (n) {
        struct iovec l = {local, (size_t)n};
        struct iovec r = {(void *)(uintptr_t)remote, (size_t)n};
        ssize_t k = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (k > 0) {
            local += k;
            remote += (uint64_t)k;
            n -= (uint64_t)k;
        } else if (k == 0 || errno != EINTR) {
            return k == 0 ? EFAULT : errno;
        }
    }
    return 0;
}

#endif
