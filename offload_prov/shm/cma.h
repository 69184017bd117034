// Cross-memory attach: copying straight between this process and a peer on the same node
// (process_vm_readv/writev), one copy instead of two through a shared segment.
//
// The kernel allows it only where ptrace would be allowed (same user and, under Yama,
// ptrace_scope permitting) and containers often filter the system calls out, so the
// provider probes a peer once with cma_probe() and copies through the segment otherwise.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>

namespace tandem {

// Copies min(total of local, total of remote) bytes from the peer's `remote` ranges into
// the `local` ranges (cma_read), or from `local` to `remote` (cma_write). Any number of
// ranges and partial transfers are handled. Returns the bytes copied, or a negative errno:
// -EFAULT for a bad local or remote range (some bytes may have been copied before it),
// -ESRCH when the peer is gone, -EPERM/-ENOSYS when CMA is not permitted, -EINVAL when a
// total exceeds SSIZE_MAX.
ssize_t cma_read(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote, size_t nremote);
ssize_t cma_write(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote,
                  size_t nremote);

// Whether CMA with `pid` works: reads one byte at `remote_addr`, an address the caller knows
// is readable in the peer (the peer tells it, e.g. in its hello message). False when the
// kernel refuses (EPERM, ENOSYS) and also whenever the read cannot confirm it (bad address,
// peer gone): the caller then uses the fallback, which always works.
bool cma_probe(pid_t pid, const void *remote_addr);

}  // namespace tandem
