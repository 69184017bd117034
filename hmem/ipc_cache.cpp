#include "hmem/ipc_cache.h"

#include "common/log.h"

#include <rdma/fi_errno.h>

#include <cstring>

namespace tandem::hmem {

int IpcExportCache::get(MemRef mem, const void *addr, size_t len, IpcExport *out) {
    const IfaceOps *ops = Registry::instance().ops(mem.iface);
    if (!ops || mem.on_host()) return -FI_EOPNOTSUPP;
    AddrInfo info;
    int ret = ops->query(addr, &info);
    if (ret < 0) return ret;
    auto a = reinterpret_cast<uintptr_t>(addr);
    if (ret == 0 || a + len > info.base + info.length) return -FI_EINVAL;
    out->mem = info.mem;
    out->buffer_id = info.buffer_id;
    out->offset = a - info.base;
    out->alloc_len = info.length;
    std::lock_guard lock(mu_);
    auto it = by_base_.find(info.base);
    if (it != by_base_.end() && it->second.buffer_id == info.buffer_id &&
        it->second.length == info.length) {
        out->handle = it->second.handle;
        return 0;
    }
    // A miss, or memory freed and allocated again at the same base: a new handle.
    IpcHandle h;
    if ((ret = ops->ipc_get(reinterpret_cast<const void *>(info.base), &h))) return ret;
    counters().ipc_exports.fetch_add(1, std::memory_order_relaxed);
    by_base_[info.base] = {h, info.buffer_id, info.length};
    out->handle = h;
    return 0;
}

IpcImportCache::~IpcImportCache() {
    for (auto &[key, e] : entries_) close_entry(e);
}

void IpcImportCache::close_entry(const Entry &e) {
    if (const IfaceOps *ops = Registry::instance().ops(e.mem.iface))
        ops->ipc_close(e.mem.device, e.base);
}

int IpcImportCache::map(uint64_t peer, uint64_t device, const IpcExport &ex, size_t len,
                        void **addr) {
    const IfaceOps *ops = Registry::instance().ops(ex.mem.iface);
    if (!ops || ex.mem.on_host()) return -FI_EOPNOTSUPP;
    auto inside = [&](const Entry &e) {
        return ex.offset <= e.length && len <= e.length - ex.offset;
    };
    Key key{peer, ex.buffer_id, device};
    std::lock_guard lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && !memcmp(&it->second.handle, &ex.handle, sizeof ex.handle)) {
        if (!inside(it->second)) return -FI_EINVAL;
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        counters().ipc_hits.fetch_add(1, std::memory_order_relaxed);
        *addr = static_cast<uint8_t *>(it->second.base) + ex.offset;
        return 0;
    }
    if (it != entries_.end()) {
        close_entry(it->second);
        lru_.erase(it->second.lru);
        entries_.erase(it);
    }
    void *base = nullptr;
    int ret = ops->ipc_open(device, ex.handle, &base);
    if (ret) return ret;
    // How much the handle really maps: the peer's alloc_len is only its word for it.
    AddrInfo info;
    Entry entry{MemRef{ex.mem.iface, device}, base, 0, ex.handle, {}};
    if (ops->query(base, &info) != 1 || info.base != reinterpret_cast<uintptr_t>(base)) {
        TANDEM_WARN(FI_LOG_CORE, "a peer's IPC mapping cannot be sized: not used\n");
        close_entry(entry);
        return -FI_EINVAL;
    }
    entry.length = info.length;
    if (!inside(entry)) {
        close_entry(entry);
        return -FI_EINVAL;
    }
    counters().ipc_imports.fetch_add(1, std::memory_order_relaxed);
    lru_.push_front(key);
    entry.lru = lru_.begin();
    entries_[key] = entry;
    while (entries_.size() > capacity_) {
        auto victim = entries_.find(lru_.back());
        close_entry(victim->second);
        entries_.erase(victim);
        lru_.pop_back();
    }
    *addr = static_cast<uint8_t *>(base) + ex.offset;
    return 0;
}

void IpcImportCache::forget_peer(uint64_t peer) {
    std::lock_guard lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->first.peer != peer) {
            ++it;
            continue;
        }
        close_entry(it->second);
        lru_.erase(it->second.lru);
        it = entries_.erase(it);
    }
}

size_t IpcImportCache::size() const {
    std::lock_guard lock(mu_);
    return entries_.size();
}

bool ipc_entry_consistent(const wire::LocalIpc &e) {
    auto iface = static_cast<fi_hmem_iface>(e.iface);
    return e.iface <= FI_HMEM_SYNAPSEAI && iface != FI_HMEM_SYSTEM &&
           Registry::instance().available(iface) && e.offset <= e.alloc_len &&
           e.length <= e.alloc_len - e.offset;
}

int import_ipc_entry(IpcImportCache &cache, uint64_t peer, uint64_t local_device,
                     const wire::LocalIpc &e, void **addr, MemRef *mem) {
    if (!ipc_entry_consistent(e)) return -FI_EINVAL;
    Registry &reg = Registry::instance();
    auto iface = static_cast<fi_hmem_iface>(e.iface);
    uint64_t device = local_device != UINT64_MAX ? local_device : e.device;
    if (device >= static_cast<uint64_t>(reg.device_count(iface))) device = 0;
    IpcExport ex;
    memcpy(ex.handle.bytes, e.handle, sizeof ex.handle.bytes);
    ex.mem = {iface, e.device};
    ex.buffer_id = e.buffer_id;
    ex.offset = e.offset;
    ex.alloc_len = e.alloc_len;
    if (int ret = cache.map(peer, device, ex, e.length, addr)) return ret;
    *mem = {iface, device};
    return 0;
}

}  // namespace tandem::hmem
