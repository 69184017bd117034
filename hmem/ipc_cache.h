// Caches of IPC handles, so that a buffer used again costs neither a handle export nor a
// mapping:
//  - IpcExportCache (the side that owns the memory): the handle of each allocation, keyed by
//    its base and checked against the allocation's buffer id on every use, so memory freed
//    and allocated again at the same address gets a fresh handle.
//  - IpcImportCache (the side that maps a peer's memory): the mappings it opened, keyed by
//    the peer and the allocation's buffer id (a new allocation of the peer has a new id,
//    so a stale mapping is never used for it), at most `capacity` of them, least recently
//    used closed first, and all of a peer's closed when it goes away.
#pragma once

#include "common/wire.h"
#include "hmem/hmem.h"

#include <cstdint>
#include <list>
#include <map>
#include <mutex>

namespace tandem::hmem {

// What a receiver needs to reach a range of a peer's device memory.
struct IpcExport {
    IpcHandle handle;
    MemRef mem;
    uint64_t buffer_id = 0;
    uint64_t offset = 0;  // of the address in its allocation
    uint64_t alloc_len = 0;
};

class IpcExportCache {
  public:
    // The handle for [addr, addr+len) of memory `mem`: 0 or a negative errno
    // (-FI_EOPNOTSUPP where the interface or the driver gives no IPC).
    int get(MemRef mem, const void *addr, size_t len, IpcExport *out);

  private:
    struct Entry {
        IpcHandle handle;
        uint64_t buffer_id;
        uint64_t length;
    };
    std::mutex mu_;
    std::map<uintptr_t, Entry> by_base_;
};

class IpcImportCache {
  public:
    explicit IpcImportCache(size_t capacity = 256) : capacity_(capacity) {}
    ~IpcImportCache();
    IpcImportCache(const IpcImportCache &) = delete;
    IpcImportCache &operator=(const IpcImportCache &) = delete;

    // The local address of `len` bytes at ex.offset of the exported allocation (mapping it on
    // `device` on a miss). The range must lie in what the handle really maps, whatever the
    // peer claims ex.alloc_len to be: -FI_EINVAL otherwise.
    int map(uint64_t peer, uint64_t device, const IpcExport &ex, size_t len, void **addr);
    void forget_peer(uint64_t peer);
    size_t size() const;

  private:
    struct Key {
        uint64_t peer, buffer_id, device;
        auto operator<=>(const Key &) const = default;
    };
    struct Entry {
        MemRef mem;  // the local device it is mapped on
        void *base;
        size_t length;  // of the mapping, as the interface reports it
        IpcHandle handle;
        std::list<Key>::iterator lru;
    };
    void close_entry(const Entry &e);

    size_t capacity_;
    mutable std::mutex mu_;
    std::map<Key, Entry> entries_;
    std::list<Key> lru_;  // front: most recently used
};

// One of a peer's device buffers as the node-local protocol names it (wire::LocalIpc: the
// allocation's handle, where the buffer lies in it, on which interface and device), mapped
// here through `cache` on `local_device` (UINT64_MAX: the peer's device). Every field comes
// from another process and is checked: 0 with *addr and *mem set, -FI_EINVAL for an entry
// that contradicts itself or the allocation its handle maps, -FI_EOPNOTSUPP (or the
// interface's error) when it cannot be mapped here.
// Whether the entry names an interface that has IPC here and a buffer inside the allocation it
// claims (the first checks of import_ipc_entry; a peer in our own process needs no more).
bool ipc_entry_consistent(const wire::LocalIpc &e);

int import_ipc_entry(IpcImportCache &cache, uint64_t peer, uint64_t local_device,
                     const wire::LocalIpc &e, void **addr, MemRef *mem);

}  // namespace tandem::hmem
