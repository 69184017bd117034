// The symbols NCCL looks up: ncclNetPlugin_v12 down to _v6, each a table of thin adaptors onto
// Plugin and its devices (which take the newest version's arguments). The tables are writable,
// as NCCL declares them.
#include "nccl_plugin/nccl_net_abi.h"
#include "nccl_plugin/plugin.h"

#include <algorithm>

namespace tandem::nccl {
namespace {

constexpr const char *kName = "tandem";

Plugin &plugin() {
    return Plugin::instance();
}

// ---- v12 and v11 (one table, but for the properties and makeVDevice's argument) -------------

Result init_v11(void **ctx, uint64_t, CommConfig *config, Logger logger, ProfilerCallback) {
    return plugin().init(ctx, config, logger);
}
Result finalize_v11(void *ctx) {
    return plugin().finalize(ctx);
}
Result devices(int *n) {
    return plugin().devices(n);
}
Result properties_v12(int dev, PropertiesV12 *props) {
    return plugin().properties(dev, props);
}
// makeVDevice: v12 fuses up to 8 devices, v9 to v11 up to 4 (their props hold no more).
Result make_vdevice_v12(int *dev, VirtualDevicePropsV12 *props) {
    if (!props) return plugin().make_vdevice(dev, nullptr, 0, kMaxDevsPerNicV12);
    return plugin().make_vdevice(dev, props->devs, props->ndevs, kMaxDevsPerNicV12);
}
Result make_vdevice_v9(int *dev, VirtualDeviceProps *props) {
    if (!props) return plugin().make_vdevice(dev, nullptr, 0, kMaxDevsPerNic);
    return plugin().make_vdevice(dev, props->devs, props->ndevs, kMaxDevsPerNic);
}

Result listen_v11(void *, int dev, void *handle, void **listen_comm) {
    Device *d = plugin().device(dev, "listen");
    return d ? d->listen(handle, listen_comm) : kInternalError;
}
Result connect_v11(void *, int dev, void *handle, void **send_comm, DeviceHandle **) {
    Device *d = plugin().device(dev, "connect");
    return d ? d->connect(handle, send_comm) : kInternalError;
}
Result accept_v11(void *listen_comm, void **recv_comm, DeviceHandle **) {
    Device *d = plugin().device_of(listen_comm, "accept");
    return d ? d->accept(listen_comm, recv_comm) : kInvalidUsage;
}
Result reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
    Device *d = plugin().device_of(comm, "regMr");
    return d ? d->reg_mr(comm, data, size, type, mhandle) : kInvalidUsage;
}
Result reg_mr_int(void *comm, void *data, int size, int type, void **mhandle) {
    if (size < 0) return kInternalError;
    return reg_mr(comm, data, size_t(size), type, mhandle);
}
Result reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                     void **mhandle) {
    Device *d = plugin().device_of(comm, "regMrDmaBuf");
    return d ? d->reg_mr_dmabuf(comm, data, size, type, offset, fd, mhandle) : kInvalidUsage;
}
Result dereg_mr(void *comm, void *mhandle) {
    Device *d = plugin().device_of(mhandle, "deregMr");
    return d ? d->dereg_mr(comm, mhandle) : kInvalidUsage;
}
Result isend_v11(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *,
                 void **request) {
    Device *d = plugin().device_of(send_comm, "isend");
    return d ? d->isend(send_comm, data, size, tag, mhandle, request) : kInvalidUsage;
}
Result irecv_v11(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                 void **, void **request) {
    Device *d = plugin().device_of(recv_comm, "irecv");
    return d ? d->irecv(recv_comm, n, data, sizes, tags, mhandles, request) : kInvalidUsage;
}
Result iflush(void *recv_comm, int n, void **, int *, void **mhandles, void **request) {
    Device *d = plugin().device_of(recv_comm, "iflush");
    return d ? d->iflush(recv_comm, n, mhandles, request) : kInvalidUsage;
}
Result test(void *request, int *done, int *sizes) {
    Device *d = plugin().device_of(request, "test");
    return d ? d->test(request, done, sizes) : kInvalidUsage;
}
Result close_send(void *comm) {
    Device *d = plugin().device_of(comm, "closeSend");
    return d ? d->close_send(comm) : kInvalidUsage;
}
Result close_recv(void *comm) {
    Device *d = plugin().device_of(comm, "closeRecv");
    return d ? d->close_recv(comm) : kInvalidUsage;
}
Result close_listen(void *comm) {
    Device *d = plugin().device_of(comm, "closeListen");
    return d ? d->close_listen(comm) : kInvalidUsage;
}
// No device-side networking (netDeviceType HOST): nothing to hand to device code.
Result get_device_mr(void *, void *, void **dptr_mhandle) {
    if (dptr_mhandle) *dptr_mhandle = nullptr;
    return kSuccess;
}
// Only device-side receives (the UNPACK offload) are consumed this way; none exist here.
Result irecv_consumed(void *, int, void *) {
    return kSuccess;
}
// tandem has no per-communicator flow or peer limits to apply.
Result set_net_attr(void *, NetAttr *) {
    return kSuccess;
}

// ---- older versions ----------------------------------------------------------------------------

Result init_v10(Logger logger, ProfilerCallback) {
    return plugin().init(nullptr, nullptr, logger);
}
Result init_v9(Logger logger) {
    return plugin().init(nullptr, nullptr, logger);
}

Result listen_old(int dev, void *handle, void **listen_comm) {
    return listen_v11(nullptr, dev, handle, listen_comm);
}
Result connect_v10(int dev, CommConfig *, void *handle, void **send_comm, DeviceHandle **dh) {
    return connect_v11(nullptr, dev, handle, send_comm, dh);
}
Result connect_v9(int dev, void *handle, void **send_comm, DeviceHandle **dh) {
    return connect_v11(nullptr, dev, handle, send_comm, dh);
}
Result connect_v6(int dev, void *handle, void **send_comm) {
    return connect_v11(nullptr, dev, handle, send_comm, nullptr);
}
Result accept_v6(void *listen_comm, void **recv_comm) {
    return accept_v11(listen_comm, recv_comm, nullptr);
}

Result isend_v10(void *send_comm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                 void **request) {
    return isend_v11(send_comm, data, size, tag, mhandle, phandle, request);
}
Result isend_v9(void *send_comm, void *data, size_t size, int tag, void *mhandle, void **request) {
    return isend_v11(send_comm, data, size, tag, mhandle, nullptr, request);
}
Result isend_int(void *send_comm, void *data, int size, int tag, void *mhandle, void **request) {
    if (size < 0) return kInternalError;
    return isend_v11(send_comm, data, size_t(size), tag, mhandle, nullptr, request);
}
Result irecv_v9(void *recv_comm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                void **request) {
    return irecv_v11(recv_comm, n, data, sizes, tags, mhandles, nullptr, request);
}
Result irecv_int(void *recv_comm, int n, void **data, int *sizes, int *tags, void **mhandles,
                 void **request) {
    if (n < 1 || n > kMaxRecvs || !sizes)
        return irecv_v11(recv_comm, n, data, nullptr, tags, mhandles, nullptr, request);
    size_t wide[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
        if (sizes[i] < 0) return kInternalError;
        wide[i] = size_t(sizes[i]);
    }
    return irecv_v11(recv_comm, n, data, wide, tags, mhandles, nullptr, request);
}

// Older property layouts are v12's with fields left out: each field the layout has is copied.
// v9-v11's vProps hold 4 devices: a virtual NIC made through them has no more.
template <typename P>
Result properties_old(int dev, P *props) {
    PropertiesV12 v;
    if (Result r = properties_v12(dev, &v)) return r;
    *props = {};
    props->name = v.name;
    props->pci_path = v.pci_path;
    props->guid = v.guid;
    props->ptr_support = v.ptr_support;
    props->speed = v.speed;
    props->port = v.port;
    props->latency = v.latency;
    props->max_comms = v.max_comms;
    props->max_recvs = v.max_recvs;
    if constexpr (requires { props->device_type; }) {
        props->device_type = v.device_type;
        props->device_version = v.device_version;
    }
    if constexpr (requires { props->reg_is_global; }) props->reg_is_global = v.reg_is_global;
    if constexpr (requires { props->force_flush; }) {
        props->force_flush = v.force_flush;
        props->vprops.ndevs = std::min(v.vprops.ndevs, kMaxDevsPerNic);
        std::copy_n(v.vprops.devs, props->vprops.ndevs, props->vprops.devs);
        props->max_p2p_bytes = v.max_p2p_bytes;
        props->max_coll_bytes = v.max_coll_bytes;
    }
    if constexpr (requires { props->max_multi_request_size; })
        props->max_multi_request_size = v.max_multi_request_size;
    return kSuccess;
}

}  // namespace
}  // namespace tandem::nccl

using namespace tandem::nccl;

#define TANDEM_NCCL_EXPORT __attribute__((visibility("default")))

extern "C" {

TANDEM_NCCL_EXPORT NetV12 ncclNetPlugin_v12 = {
    kName,        init_v11,     devices,       properties_v12, listen_v11,
    connect_v11,  accept_v11,   reg_mr,        reg_mr_dmabuf,  dereg_mr,
    isend_v11,    irecv_v11,    iflush,        test,           close_send,
    close_recv,   close_listen, get_device_mr, irecv_consumed, make_vdevice_v12,
    finalize_v11, set_net_attr,
};

TANDEM_NCCL_EXPORT NetV11 ncclNetPlugin_v11 = {
    kName,         init_v11,      devices,        properties_old<PropertiesV11>,
    listen_v11,    connect_v11,   accept_v11,     reg_mr,
    reg_mr_dmabuf, dereg_mr,      isend_v11,      irecv_v11,
    iflush,        test,          close_send,     close_recv,
    close_listen,  get_device_mr, irecv_consumed, make_vdevice_v9,
    finalize_v11,  set_net_attr,
};

TANDEM_NCCL_EXPORT NetV10 ncclNetPlugin_v10 = {
    kName,         init_v10,      devices,        properties_old<PropertiesV9>,
    listen_old,    connect_v10,   accept_v11,     reg_mr,
    reg_mr_dmabuf, dereg_mr,      isend_v10,      irecv_v11,
    iflush,        test,          close_send,     close_recv,
    close_listen,  get_device_mr, irecv_consumed, make_vdevice_v9,
};

TANDEM_NCCL_EXPORT NetV9 ncclNetPlugin_v9 = {
    kName,         init_v9,       devices,        properties_old<PropertiesV9>,
    listen_old,    connect_v9,    accept_v11,     reg_mr,
    reg_mr_dmabuf, dereg_mr,      isend_v9,       irecv_v9,
    iflush,        test,          close_send,     close_recv,
    close_listen,  get_device_mr, irecv_consumed, make_vdevice_v9,
};

TANDEM_NCCL_EXPORT NetV8 ncclNetPlugin_v8 = {
    kName,         init_v9,       devices,        properties_old<PropertiesV8>,
    listen_old,    connect_v9,    accept_v11,     reg_mr,
    reg_mr_dmabuf, dereg_mr,      isend_int,      irecv_int,
    iflush,        test,          close_send,     close_recv,
    close_listen,  get_device_mr, irecv_consumed,
};

TANDEM_NCCL_EXPORT NetV7 ncclNetPlugin_v7 = {
    kName,         init_v9,       devices,        properties_old<PropertiesV7>,
    listen_old,    connect_v9,    accept_v11,     reg_mr_int,
    reg_mr_dmabuf, dereg_mr,      isend_int,      irecv_int,
    iflush,        test,          close_send,     close_recv,
    close_listen,  get_device_mr, irecv_consumed,
};

TANDEM_NCCL_EXPORT NetV6 ncclNetPlugin_v6 = {
    kName,         init_v9,    devices,    properties_old<PropertiesV6>,
    listen_old,    connect_v6, accept_v6,  reg_mr_int,
    reg_mr_dmabuf, dereg_mr,   isend_int,  irecv_int,
    iflush,        test,       close_send, close_recv,
    close_listen,
};

// Test-only (tests/nccl): the bytes member `member` of virtual NIC `dev` has carried, sent and
// received, counted at each part's completion. 0 on success, -1 for no such member. Not part
// of NCCL's ABI.
TANDEM_NCCL_EXPORT int tandem_nccl_test_member_bytes(int dev, int member, uint64_t *sent,
                                                     uint64_t *received) {
    if (!sent || !received) return -1;
    return plugin().member_bytes(dev, member, sent, received) ? 0 : -1;
}

}  // extern "C"
