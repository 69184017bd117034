// FI_HMEM_SYSTEM: host memory. Copies are memcpy; there is no device, no IPC handle and no
// NIC registration handle (the node-local path reaches host memory by cross-memory attach).
#include "hmem/iface_tables.h"

#include <rdma/fi_errno.h>

#include <cstring>

namespace tandem::hmem {
namespace {

int query(const void *, AddrInfo *) {
    return 0;
}
int copy_host(MemRef, void *dst, const void *src, size_t len) {
    memcpy(dst, src, len);
    return 0;
}
int copy_device(MemRef, void *dst, MemRef, const void *src, size_t len) {
    memcpy(dst, src, len);
    return 0;
}
int ipc_get(const void *, IpcHandle *) {
    return -FI_EOPNOTSUPP;
}
int ipc_open(uint64_t, const IpcHandle &, void **) {
    return -FI_EOPNOTSUPP;
}
int ipc_close(uint64_t, void *) {
    return -FI_EOPNOTSUPP;
}
int dmabuf(const void *, size_t, int *, uint64_t *) {
    return -FI_EOPNOTSUPP;
}
bool can_access_peer(uint64_t, uint64_t) {
    return true;
}
int synchronize(uint64_t) {
    return 0;
}

// The host needs no trigger variable: it has its own calls (fi_cntr_add).
int signal_open(uint64_t, void **, void **) {
    return -FI_EOPNOTSUPP;
}
int signal_poll(void *, uint64_t *) {
    return -FI_EOPNOTSUPP;
}
void signal_close(void *) {}

}  // namespace

const IfaceOps kSystemOps = {
    FI_HMEM_SYSTEM,  "system",    query,       copy_host,   copy_host,
    copy_device,     ipc_get,     ipc_open,    ipc_close,   dmabuf,
    can_access_peer, synchronize, signal_open, signal_poll, signal_close,
};

}  // namespace tandem::hmem
