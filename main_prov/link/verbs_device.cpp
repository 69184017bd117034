// The verbs link's device (verbs_link.h): an RDMA device port opened through rdma_cm's
// context for it, its protection domain, and the memory registered there.
#include "main_prov/link/verbs_link.h"
#include "main_prov/link/verbs_link_internal.h"

#include "common/log.h"

#include <rdma/fi_errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace tandem {

using verbs_detail::kMaxConnectData;

namespace {

int ibv_access_of(uint64_t fi_access) {
    int a = 0;
    if (fi_access & FI_REMOTE_WRITE) a |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    if (fi_access & FI_REMOTE_READ) a |= IBV_ACCESS_REMOTE_READ;
    return a;
}

class VerbsRegion final : public LinkRegion {
  public:
    VerbsRegion(const VerbsApi &api, ibv_mr *mr) : api_(api), mr_(mr) { key = mr->rkey; }
    ~VerbsRegion() override { api_.dereg_mr(mr_); }

  private:
    const VerbsApi &api_;
    ibv_mr *mr_;
};

}  // namespace

int VerbsDevice::open(const VerbsApi *api, const std::string &name, const VerbsLinkConfig &config,
                      std::shared_ptr<VerbsDevice> &out, std::string *why) {
    std::shared_ptr<VerbsDevice> d(new VerbsDevice());
    d->api_ = api;
    d->config_ = config;
    d->name_ = name;
    int n = 0;
    d->cm_devices_ = api->get_devices(&n);
    if (!d->cm_devices_) {
        *why = std::string("rdma_get_devices: ") + strerror(errno);
        return -FI_ENODEV;
    }
    for (int i = 0; i < n && !d->ctx_; ++i)
        if (name == api->get_device_name(d->cm_devices_[i]->device)) d->ctx_ = d->cm_devices_[i];
    if (!d->ctx_) {
        *why = "rdma_cm has no device " + name;
        return -FI_ENODEV;
    }
    if (api->query_device(d->ctx_, &d->attr_) != 0) {
        *why = "ibv_query_device failed on " + name;
        return -FI_ENODEV;
    }
    // rdma_cm puts each connection on the port its address routes through: the device is
    // usable while one of its ports is active, and its limits are the smallest of those.
    bool active = false;
    size_t max_msg = 0;
    for (int p = 1; p <= std::max<int>(d->attr_.phys_port_cnt, 1); ++p) {
        ibv_port_attr port{};
        if (api->query_port(d->ctx_, static_cast<uint8_t>(p), &port) != 0 ||
            port.state != IBV_PORT_ACTIVE)
            continue;
        if (!active || port.max_msg_sz < max_msg) max_msg = port.max_msg_sz;
        active = true;
    }
    if (!active) {
        *why = "no port of " + name + " is active";
        return -FI_ENODEV;
    }
    d->pd_ = api->alloc_pd(d->ctx_);
    if (!d->pd_) {
        *why = "ibv_alloc_pd failed on " + name;
        return -FI_ENOMEM;
    }
    LinkCaps &c = d->caps_;  // message sizes are each transport's
    c.max_rdma_size = max_msg ? max_msg : (size_t{1} << 31);
    c.max_sge = std::min<size_t>({size_t(std::max(d->attr_.max_sge, 1)), LocalPieces::kMax});
    c.rdma_read = c.rdma_write = true;
    c.remote_access_events = false;
    c.device_p2p = config.device_p2p && api->reg_dmabuf_mr != nullptr;
    c.access_error_ends_connection = true;
    c.peer_loss_times_out = true;
    c.link_keys = true;
    c.max_connect_data = kMaxConnectData;
    out = std::move(d);
    return 0;
}

VerbsDevice::~VerbsDevice() {
    if (pd_) api_->dealloc_pd(pd_);
    if (cm_devices_) api_->free_devices(cm_devices_);
}

ibv_mr *VerbsDevice::register_local(void *addr, size_t len, hmem::MemRef mem, int access) {
    ibv_mr *mr = nullptr;
    if (mem.on_host()) {
        mr = api_->reg_mr(pd_, addr, len, access);
        if (!mr)
            TANDEM_WARN(FI_LOG_MR, "%s: ibv_reg_mr of %zu bytes at %p: %s\n", name_.c_str(), len,
                        addr, strerror(errno));
        return mr;
    }
    if (!caps_.device_p2p) return nullptr;
    const hmem::IfaceOps *ops = hmem::Registry::instance().ops(mem.iface);
    int fd = -1;
    uint64_t offset = 0;
    if (!ops || !ops->dmabuf || ops->dmabuf(addr, len, &fd, &offset) != 0) return nullptr;
    mr = api_->reg_dmabuf_mr(pd_, offset, len, reinterpret_cast<uint64_t>(addr), fd, access);
    int err = errno;
    close(fd);  // the registration holds the dma-buf
    if (!mr)
        TANDEM_INFO(FI_LOG_MR, "%s: ibv_reg_dmabuf_mr of %zu bytes of device memory: %s\n",
                    name_.c_str(), len, strerror(err));
    return mr;
}

int VerbsDevice::register_region(const iovec &iov, hmem::MemRef mem, uint64_t access,
                                 std::unique_ptr<LinkRegion> &out) {
    // Local write too: the NIC writes a read response's target and remote writes alike.
    int ibv_access = ibv_access_of(access) | IBV_ACCESS_LOCAL_WRITE;
    ibv_mr *mr = register_local(iov.iov_base, iov.iov_len, mem, ibv_access);
    if (!mr) return mem.on_host() ? -FI_EINVAL : -FI_EOPNOTSUPP;
    out = std::make_unique<VerbsRegion>(*api_, mr);
    return 0;
}

// ibv_reg_dmabuf_mr of the application's own DMA-buf (its fd stays the application's); where
// the library has no ibv_reg_dmabuf_mr, the range by address as any other region.
int VerbsDevice::register_dmabuf_region(const iovec &iov, hmem::MemRef mem, int fd, uint64_t offset,
                                        uint64_t access, std::unique_ptr<LinkRegion> &out) {
    if (!api_->reg_dmabuf_mr) return register_region(iov, mem, access, out);
    int ibv_access = ibv_access_of(access) | IBV_ACCESS_LOCAL_WRITE;
    ibv_mr *mr = api_->reg_dmabuf_mr(pd_, offset, iov.iov_len,
                                     reinterpret_cast<uint64_t>(iov.iov_base), fd, ibv_access);
    if (!mr) {
        TANDEM_WARN(FI_LOG_MR, "%s: ibv_reg_dmabuf_mr of the application's DMA-buf: %s\n",
                    name_.c_str(), strerror(errno));
        return -FI_EINVAL;
    }
    out = std::make_unique<VerbsRegion>(*api_, mr);
    return 0;
}

std::unique_ptr<LinkTransport> VerbsDevice::transport(RemoteKeyResolver *resolver,
                                                      size_t max_send_size) {
    return std::make_unique<VerbsTransport>(shared_from_this(), resolver, max_send_size);
}

}  // namespace tandem
