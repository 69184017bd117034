#include "main_prov/shm/cma.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>

namespace tandem {

namespace {

#ifdef IOV_MAX
constexpr size_t kIovMax = IOV_MAX;
#else
constexpr size_t kIovMax = 1024;  // Linux's UIO_MAXIOV
#endif
// Ranges handed to one system call per side. The kernel takes up to IOV_MAX; fewer keeps
// the two arrays small enough for any thread's stack, at one extra call per 256 ranges.
constexpr size_t kBatch = std::min<size_t>(kIovMax, 256);

using TransferCall = ssize_t (*)(pid_t, const iovec *, unsigned long, const iovec *, unsigned long,
                                 unsigned long);

// A position within an array of ranges: which range, and how far into it.
class IovCursor {
  public:
    IovCursor(const iovec *iov, size_t count) : iov_(iov), count_(count) {}

    // Up to kBatch ranges from the position on, empty ones left out (a batch of nothing
    // but empty ranges would make the kernel copy nothing and the loop spin).
    size_t gather(iovec *out) const {
        size_t n = 0;
        size_t offset = offset_;
        for (size_t i = index_; i < count_ && n < kBatch; ++i, offset = 0) {
            if (iov_[i].iov_len == offset) continue;
            out[n].iov_base = static_cast<char *>(iov_[i].iov_base) + offset;
            out[n].iov_len = iov_[i].iov_len - offset;
            ++n;
        }
        return n;
    }

    void advance(size_t bytes) {
        while (bytes > 0 && index_ < count_) {
            size_t left = iov_[index_].iov_len - offset_;
            if (bytes < left) {
                offset_ += bytes;
                return;
            }
            bytes -= left;
            ++index_;
            offset_ = 0;
        }
    }

  private:
    const iovec *iov_;
    size_t count_;
    size_t index_ = 0;
    size_t offset_ = 0;
};

// The sum of the lengths, or -1 when it exceeds what the system calls (and our return
// value) can express.
ssize_t total_length(const iovec *iov, size_t count) {
    size_t total = 0;
    for (size_t i = 0; i < count; ++i) {
        if (iov[i].iov_len > size_t(SSIZE_MAX) - total) return -1;
        total += iov[i].iov_len;
    }
    return ssize_t(total);
}

ssize_t transfer(TransferCall call, pid_t pid, const iovec *local, size_t nlocal,
                 const iovec *remote, size_t nremote) {
    ssize_t local_total = total_length(local, nlocal);
    ssize_t remote_total = total_length(remote, nremote);
    if (local_total < 0 || remote_total < 0) return -EINVAL;
    size_t wanted = size_t(std::min(local_total, remote_total));

    IovCursor local_at(local, nlocal), remote_at(remote, nremote);
    iovec local_batch[kBatch], remote_batch[kBatch];
    size_t done = 0;
    while (done < wanted) {
        size_t nl = local_at.gather(local_batch);
        size_t nr = remote_at.gather(remote_batch);
        ssize_t n = call(pid, local_batch, nl, remote_batch, nr, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        // The kernel reports a fault on the first byte of a call as an error and a later
        // one as a short count; nothing copied with bytes left to copy is neither, so it
        // cannot be retried usefully.
        if (n == 0) return -EFAULT;
        // A short count (a later range faulted, or one side's batch ran out) just moves
        // the cursors; the next call either continues or reports the fault.
        done += size_t(n);
        local_at.advance(size_t(n));
        remote_at.advance(size_t(n));
    }
    return ssize_t(done);
}

}  // namespace

ssize_t cma_read(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote,
                 size_t nremote) {
    return transfer(::process_vm_readv, pid, local, nlocal, remote, nremote);
}

ssize_t cma_write(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote,
                  size_t nremote) {
    return transfer(::process_vm_writev, pid, local, nlocal, remote, nremote);
}

bool cma_probe(pid_t pid, const void *remote_addr, uint64_t expected) {
    uint64_t word = 0;
    iovec local{&word, sizeof word};
    iovec remote{const_cast<void *>(remote_addr), sizeof word};
    return cma_read(pid, &local, 1, &remote, 1) == ssize_t(sizeof word) && word == expected;
}

}  // namespace tandem
