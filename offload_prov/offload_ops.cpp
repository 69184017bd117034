// peer::OffloadOps (peer/offload_ops.h), the one private extension off_tandem gives tandem:
// thin C entry points onto the endpoint (node-local path, collectives) and the domain (trigger
// queue). Each catches what the C++ below may throw and answers with a fabric errno.
#include "offload_prov/offload_ops.h"

#include "common/fabric_error.h"
#include "main_prov/shm/channel.h"
#include "offload_prov/domain.h"
#include "offload_prov/endpoint.h"

namespace tandem::off {

namespace {

int local_attach(fid_ep *ep, shm::Channel *channel, const peer::OwnerOps *owner_ops) noexcept {
    if (!ep || !channel) return -FI_EINVAL;
    if (owner_ops && owner_ops->size < sizeof(peer::OwnerOps)) return -FI_EINVAL;
    return Endpoint::of(ep)->attach(channel, owner_ops);
}

void local_take_cell(fid_ep *ep, const uint8_t *cell) noexcept try {
    Endpoint::of(ep)->take_cell(cell);
} catch (...) {
}

int local_copy_ipc(fid_ep *ep, pid_t pid, const wire::LocalIpc *ipc, size_t count, const iovec *to,
                   const hmem::MemRef *to_mem, size_t nto, size_t len) noexcept try {
    if (!ep || (count && !ipc) || (nto && !to)) return FI_EINVAL;
    return Endpoint::of(ep)->copy_from_ipc(pid, ipc, count, to, to_mem, nto, len);
} catch (...) {
    return -current_exception_errno();
}

int local_export_ipc(fid_ep *ep, const iovec *iov, const hmem::MemRef *mem, size_t count,
                     wire::LocalIpc *out) noexcept try {
    if (!ep || (count && (!iov || !mem || !out))) return -FI_EINVAL;
    return Endpoint::of(ep)->export_ipc(iov, mem, count, out);
} catch (...) {
    return current_exception_errno();
}

int coll_join(fid_ep *ep, const peer::CollJoin *join, uint64_t *group) noexcept try {
    if (!ep || !join) return -FI_EINVAL;
    return Endpoint::of(ep)->coll().join(*join, group);
} catch (...) {
    return current_exception_errno();
}

int coll_post(fid_ep *ep, uint64_t group, const peer::CollWork *work) noexcept try {
    if (!ep || !work) return -FI_EINVAL;
    return Endpoint::of(ep)->coll().post(group, *work);
} catch (...) {
    return current_exception_errno();
}

int coll_leave(fid_ep *ep, uint64_t group) noexcept try {
    if (!ep) return -FI_EINVAL;
    return Endpoint::of(ep)->coll().leave(group);
} catch (...) {
    return current_exception_errno();
}

TriggerQueue &queue_of(fid_domain *d) {
    return Domain::of(d)->triggers();
}

int trigger_queue(fid_domain *d, const peer::TriggerWork *w) noexcept try {
    return queue_of(d).queue(*w);
} catch (...) {
    return -FI_ENOMEM;
}

size_t trigger_progress(fid_domain *d) noexcept {
    return queue_of(d).progress();
}

size_t trigger_pending(fid_domain *d, size_t *device) noexcept {
    if (device) *device = queue_of(d).device_pending();
    return queue_of(d).pending();
}

int trigger_cancel(fid_domain *d, const void *group, const void *match) noexcept {
    return queue_of(d).cancel(group, match);
}

size_t trigger_flush(fid_domain *d, const void *group, fid_cntr *cntr) noexcept {
    return queue_of(d).flush(group, cntr);
}

size_t trigger_flush_counter(fid_domain *d, fid_cntr *cntr) noexcept {
    return queue_of(d).flush_counter(cntr);
}

size_t trigger_discard_group(fid_domain *d, const void *group) noexcept {
    return Domain::of(d)->discard_group(group);
}

int trigger_xpu_variable(fid_domain *d, const void *group, int iface, int device, uint64_t *var,
                         void **addr, uint64_t *value) noexcept {
    return Domain::of(d)->xpu_variable(group, iface, device, var, addr, value);
}

const peer::OffloadOps offload_ops_table = {
    .size = sizeof(peer::OffloadOps),
    .channel_bytes = sizeof(shm::Channel),
    .attach = local_attach,
    .take_cell = local_take_cell,
    .copy_ipc = local_copy_ipc,
    .export_ipc = local_export_ipc,
    .coll_join = coll_join,
    .coll_post = coll_post,
    .coll_leave = coll_leave,
    .trigger_queue = trigger_queue,
    .trigger_progress = trigger_progress,
    .trigger_pending = trigger_pending,
    .trigger_cancel = trigger_cancel,
    .trigger_flush = trigger_flush,
    .trigger_flush_counter = trigger_flush_counter,
    .trigger_discard_group = trigger_discard_group,
    .trigger_xpu_variable = trigger_xpu_variable,
};

}  // namespace

const peer::OffloadOps &offload_ops() {
    return offload_ops_table;
}

}  // namespace tandem::off
