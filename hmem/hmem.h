// Memory interfaces (FI_HMEM): one table of operations per fi_hmem_iface, the registry that
// loads them once per process, and copies between host buffers and scatter lists whose
// entries may live in device memory. Both providers move every payload that may be device
// memory through here; device memory is never read or written by the CPU.
#pragma once

#include <rdma/fi_domain.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tandem::hmem {

// Where a buffer lives. Host memory is {FI_HMEM_SYSTEM, 0}; the iface comes from the
// memory region the application registered (FI_MR_HMEM), never from guessing.
struct MemRef {
    fi_hmem_iface iface = FI_HMEM_SYSTEM;
    uint64_t device = 0;
    constexpr bool on_host() const { return iface == FI_HMEM_SYSTEM; }
    friend constexpr bool operator==(const MemRef &, const MemRef &) = default;
};
inline constexpr MemRef kHost{};

// What an interface knows about an address inside one of its allocations.
struct AddrInfo {
    MemRef mem;
    uintptr_t base = 0;      // start of the allocation
    size_t length = 0;       // its size
    uint64_t buffer_id = 0;  // unique per allocation: a freed and reallocated buffer differs
};

// An interface's IPC handle for one allocation (CUDA: CUipcMemHandle), opaque to tandem.
struct IpcHandle {
    uint8_t bytes[64];
};

// One memory interface. Every call returns 0 or a negative fabric errno.
struct IfaceOps {
    fi_hmem_iface iface;
    const char *name;
    // 1 when addr lies in memory of this interface (info filled), 0 when it does not.
    int (*query)(const void *addr, AddrInfo *info);
    // Copies; `mem` says where the device side lives.
    int (*copy_to_host)(MemRef mem, void *dst, const void *src, size_t len);
    int (*copy_from_host)(MemRef mem, void *dst, const void *src, size_t len);
    int (*copy_device)(MemRef dst_mem, void *dst, MemRef src_mem, const void *src, size_t len);
    // IPC: a handle for the allocation holding addr; a mapping of a peer's handle on `device`.
    int (*ipc_get)(const void *addr, IpcHandle *out);
    int (*ipc_open)(uint64_t device, const IpcHandle &handle, void **mapped);
    int (*ipc_close)(uint64_t device, void *mapped);
    // A NIC registration handle (dma-buf fd and the offset of addr in it); -FI_EOPNOTSUPP
    // where the device gives none.
    int (*dmabuf)(const void *addr, size_t len, int *fd, uint64_t *offset);
    // Can memory of `peer` be reached from `device` directly (peer access)?
    bool (*can_access_peer)(uint64_t device, uint64_t peer);
    // Ordering: every copy is issued on the interface's own stream of the device and waited
    // for, so copies of one device complete in issue order.
    int (*synchronize)(uint64_t device);
    // XPU triggers (fi_trigger(3)): a 64-bit word of the device's memory that the device writes
    // (cuStreamWriteValue64 on a stream, or a kernel's store) and the host watches.
    // signal_open allocates one on `device`, zeroed, and what watching it takes (*state).
    // signal_poll never waits: 1 with *value set when a read of the word has finished since
    // the last call (the next one is started then), 0 while one is under way.
    int (*signal_open)(uint64_t device, void **word, void **state);
    int (*signal_poll)(void *state, uint64_t *value);
    void (*signal_close)(void *state);
};

// How often each mechanism moved data in this process: tests assert on these, and
// EpDiagOps reports them.
struct Counters {
    std::atomic<uint64_t> device_copies{0};      // copies made by a device's copy engine
    std::atomic<uint64_t> staged_bytes{0};       // device bytes that went through host bounce
    std::atomic<uint64_t> ipc_exports{0};        // IPC handles we created (cache misses)
    std::atomic<uint64_t> ipc_imports{0};        // IPC handles we opened (cache misses)
    std::atomic<uint64_t> ipc_hits{0};           // opened handles found in the cache
    std::atomic<uint64_t> p2p_transfers{0};      // transfers done peer to peer
    std::atomic<uint64_t> staged_transfers{0};   // transfers that staged device memory
    std::atomic<uint64_t> refused_transfers{0};  // REQUIRED transfers that could not be p2p
};
Counters &counters();

// The interfaces of this process, loaded on first use (CUDA through dlopen of the driver).
class Registry {
  public:
    static Registry &instance();
    // Usable: the interface loaded and has at least one device (FI_HMEM_SYSTEM always).
    bool available(fi_hmem_iface iface) const;
    bool any_device() const;
    int device_count(fi_hmem_iface iface) const;
    // The operations of an available interface; nullptr otherwise.
    const IfaceOps *ops(fi_hmem_iface iface) const;
    // Why an interface is missing (for logs and skipped tests).
    const char *missing_reason(fi_hmem_iface iface) const;

  private:
    Registry();
};

// The memory of an address, asked of every loaded interface: only for the calls that carry
// no descriptor (fi_inject and friends). Host memory when no device interface is loaded.
MemRef detect(const void *addr);

// Validates that [addr, addr+len) is memory of `mem` (a registration's iface and device):
// 0, or -FI_EINVAL with a log line naming what is wrong.
int check_range(MemRef mem, const void *addr, size_t len);

// Copies between a contiguous host buffer and a list whose entry i lives in mem[i] (mem may
// be null: all host). Host entries are memcpy'd, device entries go through their interface.
// Returns the bytes copied or a negative fabric errno.
ssize_t gather(void *dst, const iovec *iov, const MemRef *mem, size_t count, size_t offset,
               size_t len);
ssize_t scatter(const iovec *iov, const MemRef *mem, size_t count, size_t offset, const void *src,
                size_t len);
// One buffer to another, any memory on either side.
int copy(MemRef dst_mem, void *dst, MemRef src_mem, const void *src, size_t len);

inline bool all_host(const MemRef *mem, size_t count) {
    if (!mem) return true;
    for (size_t i = 0; i < count; ++i)
        if (!mem[i].on_host()) return false;
    return true;
}

}  // namespace tandem::hmem
