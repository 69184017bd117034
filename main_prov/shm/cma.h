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
#include <cstdint>

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

// Whether CMA with `pid` works and reaches the peer meant: reads 8 bytes at `remote_addr`, an
// address the peer published, and compares them with `expected`, the value it published with
// it. False when the kernel refuses (EPERM, ENOSYS), and also whenever the read cannot confirm
// it (bad address, peer gone, another process under that pid): the caller then uses the
// fallback, which always works.
bool cma_probe(pid_t pid, const void *remote_addr, uint64_t expected);

}  // namespace tandem
