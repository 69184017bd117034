#include "hmem/hmem.h"

#include "common/iov.h"
#include "common/log.h"
#include "hmem/iface_tables.h"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

namespace tandem::hmem {
namespace {

struct Loaded {
    bool cuda = false;
    int cuda_devices = 0;
    const char *cuda_why = "not loaded";
};

Loaded &loaded() {
    static Loaded l = [] {
        Loaded x;
        x.cuda = cuda_load(&x.cuda_devices, &x.cuda_why);
        if (x.cuda) x.cuda_why = "";
        return x;
    }();
    return l;
}

}  // namespace

Counters &counters() {
    static Counters c;
    return c;
}

Registry &Registry::instance() {
    static Registry r;
    return r;
}

Registry::Registry() {
    loaded();
}

bool Registry::available(fi_hmem_iface iface) const {
    switch (iface) {
        case FI_HMEM_SYSTEM:
            return true;
        case FI_HMEM_CUDA:
            return loaded().cuda;
        default:
            return false;
    }
}

bool Registry::any_device() const {
    return loaded().cuda;
}

int Registry::device_count(fi_hmem_iface iface) const {
    return iface == FI_HMEM_CUDA && loaded().cuda ? loaded().cuda_devices : 0;
}

const IfaceOps *Registry::ops(fi_hmem_iface iface) const {
    switch (iface) {
        case FI_HMEM_SYSTEM:
            return &kSystemOps;
        case FI_HMEM_CUDA:
            return loaded().cuda ? &kCudaOps : nullptr;
        default:
            return nullptr;
    }
}

const char *Registry::missing_reason(fi_hmem_iface iface) const {
    switch (iface) {
        case FI_HMEM_SYSTEM:
            return "";
        case FI_HMEM_CUDA:
            return loaded().cuda_why;
        default:
            return "tandem has no interface for this FI_HMEM iface";
    }
}

MemRef detect(const void *addr) {
    if (!loaded().cuda) return kHost;
    AddrInfo info;
    return kCudaOps.query(addr, &info) == 1 ? info.mem : kHost;
}

int check_range(MemRef mem, const void *addr, size_t len) {
    const IfaceOps *ops = Registry::instance().ops(mem.iface);
    if (!ops) {
        TANDEM_WARN(FI_LOG_MR, "FI_HMEM iface %d is not available: %s\n", mem.iface,
                    Registry::instance().missing_reason(mem.iface));
        return -FI_EINVAL;
    }
    if (mem.on_host()) return 0;
    if (mem.device >= static_cast<uint64_t>(Registry::instance().device_count(mem.iface))) {
        TANDEM_WARN(FI_LOG_MR, "%s device %lu does not exist\n", ops->name,
                    static_cast<unsigned long>(mem.device));
        return -FI_EINVAL;
    }
    AddrInfo info;
    int ret = ops->query(addr, &info);
    if (ret < 0) return ret;
    auto a = reinterpret_cast<uintptr_t>(addr);
    if (ret == 0 || info.mem != mem || a + len > info.base + info.length) {
        TANDEM_WARN(FI_LOG_MR, "%p+%zu is not %s memory of device %lu\n", addr, len, ops->name,
                    static_cast<unsigned long>(mem.device));
        return -FI_EINVAL;
    }
    return 0;
}

int copy(MemRef dst_mem, void *dst, MemRef src_mem, const void *src, size_t len) {
    if (!len) return 0;
    if (dst_mem.on_host() && src_mem.on_host()) {
        memcpy(dst, src, len);
        return 0;
    }
    const IfaceOps *ops =
        Registry::instance().ops(dst_mem.on_host() ? src_mem.iface : dst_mem.iface);
    if (!ops) return -FI_EINVAL;
    if (dst_mem.on_host()) return ops->copy_to_host(src_mem, dst, src, len);
    if (src_mem.on_host()) return ops->copy_from_host(dst_mem, dst, src, len);
    if (dst_mem.iface != src_mem.iface) return -FI_EOPNOTSUPP;
    return ops->copy_device(dst_mem, dst, src_mem, src, len);
}

// Entry i of the list is memory mem[i]; host entries are memcpy'd, device ones copied by
// their interface (and counted as staged bytes: they went through a host buffer).
ssize_t gather(void *dst, const iovec *iov, const MemRef *mem, size_t count, size_t offset,
               size_t len) {
    auto *to = static_cast<uint8_t *>(dst);
    int err = 0;
    size_t done = iov_walk(iov, count, offset, len, [&](size_t i, const uint8_t *p, size_t n) {
        MemRef m = mem ? mem[i] : kHost;
        if ((err = copy(kHost, to, m, p, n))) return false;
        if (!m.on_host()) counters().staged_bytes.fetch_add(n, std::memory_order_relaxed);
        to += n;
        return true;
    });
    return err ? err : static_cast<ssize_t>(done);
}

ssize_t scatter(const iovec *iov, const MemRef *mem, size_t count, size_t offset, const void *src,
                size_t len) {
    auto *from = static_cast<const uint8_t *>(src);
    int err = 0;
    size_t done = iov_walk(iov, count, offset, len, [&](size_t i, uint8_t *p, size_t n) {
        MemRef m = mem ? mem[i] : kHost;
        if ((err = copy(m, p, kHost, from, n))) return false;
        if (!m.on_host()) counters().staged_bytes.fetch_add(n, std::memory_order_relaxed);
        from += n;
        return true;
    });
    return err ? err : static_cast<ssize_t>(done);
}

}  // namespace tandem::hmem
