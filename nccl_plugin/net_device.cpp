// NetDevice: its libfabric objects opened at the first listen or connect and closed at shut
// down, the memory registrations, and the closing of comms. Connection set-up is in
// net_device_connect.cpp, sends, receives and their completions in net_device_data.cpp.
#include "nccl_plugin/net_device.h"

#include "common/fabric_compat.h"
#include "hmem/hmem.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sys/stat.h>

namespace tandem::nccl {

NetDevice::NetDevice(uint8_t index, const fi_info *info, DeviceDescription description,
                     const Options &options)
    : index_(index),
      info_(fi_dupinfo(info)),
      description_(std::move(description)),
      options_(options),
      listens_(HandleKind::Listen, index),
      sends_(HandleKind::Send, index),
      recvs_(HandleKind::Recv, index),
      requests_(HandleKind::Request, index),
      memory_(HandleKind::Memory, index) {}

NetDevice::~NetDevice() {
    close_locked();
    fi_freeinfo(info_);
}

Result NetDevice::fabric_error(const char *call, int ret) {
    WARN_RETURN(kSystemError, "NET/tandem %s: %s failed: %s (%d)", description_.name.c_str(), call,
                fi_strerror(-ret), ret);
}

Result NetDevice::open_locked() {
    if (ep_) return kSuccess;
    if (!info_) WARN_RETURN(kSystemError, "NET/tandem: no fi_info for device %d", index_);
    int ret = fi_fabric(info_->fabric_attr, &fabric_, nullptr);
    if (ret) return fabric_error("fi_fabric", ret);
    if ((ret = fi_domain(fabric_, info_, &domain_, nullptr))) {
        close_locked();
        return fabric_error("fi_domain", ret);
    }
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.size = 16384;
    if ((ret = fi_av_open(domain_, &av_attr, &av_, nullptr)) ||
        (ret = fi_cq_open(domain_, &cq_attr, &cq_, nullptr)) ||
        (ret = fi_endpoint(domain_, info_, &ep_, nullptr)) ||
        (ret = fi_ep_bind(ep_, &av_->fid, 0)) ||
        (ret = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV))) {
        close_locked();
        return fabric_error("opening the endpoint", ret);
    }
    if (options_.p2p >= 0) {
        int mode = options_.p2p;
        if ((ret = fi_setopt(&ep_->fid, FI_OPT_ENDPOINT, FI_OPT_FI_HMEM_P2P, &mode, sizeof mode))) {
            close_locked();
            return fabric_error("fi_setopt(FI_OPT_FI_HMEM_P2P)", ret);
        }
    }
    size_t len = name_.size();
    if ((ret = fi_enable(ep_)) || (ret = fi_getname(&ep_->fid, name_.data(), &len))) {
        close_locked();
        return fabric_error("enabling the endpoint", ret);
    }
    name_len_ = len;
    virt_addr_ = (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
    NCCL_TANDEM_INFO("NET/tandem %s: endpoint open (%s, eager limit %zu B)",
                     description_.name.c_str(), info_->fabric_attr->name, options_.eager_max);
    return kSuccess;
}

// Endpoint first: nothing completes after it, so the operations still posted can be freed.
void NetDevice::close_locked() {
    if (ep_) fi_close(&ep_->fid);
    ep_ = nullptr;
    for (Op *op : ops_) delete op;
    ops_.clear();
    for (Op *op : spare_ops_) delete op;
    spare_ops_.clear();
    cts_pending_.clear();
    memory_.for_each([](MemHandle &m) {
        if (m.mr) fi_close(&m.mr->fid);
        m.mr = nullptr;
    });
    if (cq_) fi_close(&cq_->fid);
    if (av_) fi_close(&av_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    cq_ = nullptr;
    av_ = nullptr;
    domain_ = nullptr;
    fabric_ = nullptr;
    control_.clear();
    writes_.clear();
    peers_.clear();
}

void NetDevice::shut_down() {
    std::lock_guard lk(mu_);
    close_locked();
    listens_.clear();
    sends_.clear();
    recvs_.clear();
    requests_.clear();
    memory_.clear();
    numbers_.clear();
}

size_t NetDevice::open_comms() {
    std::lock_guard lk(mu_);
    return listens_.live() + sends_.live() + recvs_.live();
}

// Comm numbers go round before one is reused, so that a message late for a closed comm finds
// no comm rather than its successor.
uint32_t NetDevice::take_number() {
    for (uint32_t tries = 0; tries < wire::kNcclMaxComms; ++tries) {
        uint32_t n = next_number_;
        next_number_ = next_number_ == wire::kNcclMaxComms ? 1 : next_number_ + 1;
        if (numbers_.insert(n).second) return n;
    }
    return 0;
}

// ---- memory ------------------------------------------------------------------------------------

Result NetDevice::reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
    return register_memory(comm, data, size, type, nullptr, mhandle);
}

// `dmabuf`, when given, names the same bytes as data/size by a DMA-buf: tandem registers it with
// FI_MR_DMABUF, which its verbs link maps with ibv_reg_dmabuf_mr (no nvidia-peermem needed).
Result NetDevice::register_memory(void *comm, void *data, size_t size, int type,
                                  const compat::MrDmabuf *dmabuf, void **mhandle) {
    if (!mhandle) WARN_RETURN(kInternalError, "NET/tandem: regMr without an output");
    std::lock_guard lk(mu_);
    if (!sends_.find(comm) && !recvs_.find(comm))
        WARN_RETURN(kInvalidUsage, "NET/tandem: regMr: %p is no send or receive comm", comm);
    if (type != kPtrHost && type != kPtrCuda)
        WARN_RETURN(kInternalError, "NET/tandem: regMr: unknown pointer type %d", type);
    fi_hmem_iface iface = FI_HMEM_SYSTEM;
    uint64_t device = 0;
    if (type == kPtrCuda) {
        if (!description_.hmem)
            WARN_RETURN(kInvalidUsage,
                        "NET/tandem %s: regMr of CUDA memory, but tandem offers no "
                        "FI_HMEM here (%s)",
                        description_.name.c_str(),
                        hmem::Registry::instance().missing_reason(FI_HMEM_CUDA));
        const hmem::IfaceOps *cuda = hmem::Registry::instance().ops(FI_HMEM_CUDA);
        hmem::AddrInfo where;
        if (!cuda || cuda->query(data, &where) != 1)
            WARN_RETURN(kInvalidUsage, "NET/tandem: regMr: %p is no CUDA memory", data);
        if (uintptr_t(data) + size > where.base + where.length)
            WARN_RETURN(kInvalidUsage,
                        "NET/tandem: regMr: %zu B at %p run past their CUDA allocation", size,
                        data);
        iface = FI_HMEM_CUDA;
        device = where.mem.device;
    }
    auto m = std::make_unique<MemHandle>();
    m->base = uintptr_t(data);
    m->size = size;
    if (size) {
        iovec iov{data, size};
        fi_mr_attr attr{};
        // FI_MR_DMABUF puts a struct fi_mr_dmabuf where the iovecs are (a union from 1.20).
        attr.mr_iov = dmabuf ? reinterpret_cast<const iovec *>(dmabuf) : &iov;
        attr.iov_count = 1;
        attr.access = FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ;
        attr.iface = iface;
        attr.device.cuda = int(device);
        int ret = fi_mr_regattr(domain_, &attr, dmabuf ? compat::kMrDmabuf : 0, &m->mr);
        if (ret) return fabric_error("fi_mr_regattr", ret);
        m->desc = fi_mr_desc(m->mr);
        m->key = fi_mr_key(m->mr);
    }
    *mhandle = reinterpret_cast<void *>(memory_.add(std::move(m)));
    return kSuccess;
}

// NCCL gives the buffer's address too, and the fd's offset of it: the DMA-buf starts at
// data - offset. tandem reads FI_MR_DMABUF whatever the core's release (fi_mr_regattr goes
// straight to the provider), so this holds under 1.17 as under 2.x. NCCL closes the fd once this
// returns; the registration does not need it any more (verbs holds the DMA-buf itself).
Result NetDevice::reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle) {
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        WARN_RETURN(kInvalidUsage, "NET/tandem: regMrDmaBuf: fd %d is not open", fd);
    if (type != kPtrCuda) return reg_mr(comm, data, size, type, mhandle);  // host: by address
    if (offset > uintptr_t(data))
        WARN_RETURN(kInvalidUsage, "NET/tandem: regMrDmaBuf: offset %#lx is past %p",
                    (unsigned long)offset, data);
    compat::MrDmabuf dmabuf{fd, offset, size, static_cast<uint8_t *>(data) - offset};
    return register_memory(comm, data, size, type, &dmabuf, mhandle);
}

Result NetDevice::dereg_mr(void *comm, void *mhandle) {
    std::lock_guard lk(mu_);
    (void)comm;  // registrations are the domain's; any comm of the device may release them
    MemHandle *m = memory_.find(mhandle);
    if (!m) WARN_RETURN(kInvalidUsage, "NET/tandem: deregMr: %p is no memory handle", mhandle);
    if (m->users > 0)
        WARN_RETURN(kInvalidUsage,
                    "NET/tandem: deregMr: %d operations still use the region at %#lx (%zu B)",
                    m->users, (unsigned long)m->base, m->size);
    if (m->mr) {
        int ret = fi_close(&m->mr->fid);
        if (ret) return fabric_error("fi_close (memory region)", ret);
    }
    memory_.remove(uint64_t(reinterpret_cast<uintptr_t>(mhandle)));
    return kSuccess;
}

// ---- closing -----------------------------------------------------------------------------------

// Receives still posted are cancelled; their completions (FI_ECANCELED) free them later.
void NetDevice::cancel_posted(std::vector<Op *> &posted) {
    for (Op *op : posted) fi_cancel(&ep_->fid, &op->ctx);
    posted.clear();
}

// The requests of a closed comm: their handles go stale (test refuses them); their operations
// still under way find no request when they end.
void NetDevice::drop_requests(uint64_t comm) {
    std::vector<uint64_t> orphans;
    requests_.for_each_handle([&](uint64_t rh, Request &r) {
        if (r.comm == comm) orphans.push_back(rh);
    });
    for (uint64_t rh : orphans) requests_.remove(rh, true);
}

Result NetDevice::close_send(void *send_comm) {
    std::lock_guard lk(mu_);
    SendComm *s = sends_.find(send_comm);
    if (!s) WARN_RETURN(kInvalidUsage, "NET/tandem: closeSend: %p is no send comm", send_comm);
    uint64_t h = reinterpret_cast<uintptr_t>(send_comm);
    for (auto &[key, send] : s->waiting) release_mr(send.mr);
    cancel_posted(s->posted);
    numbers_.erase(s->number);
    drop_requests(h);
    sends_.remove(h);
    progress_locked();
    return kSuccess;
}

Result NetDevice::close_recv(void *recv_comm) {
    std::lock_guard lk(mu_);
    RecvComm *c = recvs_.find(recv_comm);
    if (!c) WARN_RETURN(kInvalidUsage, "NET/tandem: closeRecv: %p is no receive comm", recv_comm);
    uint64_t h = reinterpret_cast<uintptr_t>(recv_comm);
    cancel_posted(c->posted);
    numbers_.erase(c->number);
    drop_requests(h);
    recvs_.remove(h);
    progress_locked();
    return kSuccess;
}

Result NetDevice::close_listen(void *listen_comm) {
    std::lock_guard lk(mu_);
    ListenComm *l = listens_.find(listen_comm);
    if (!l)
        WARN_RETURN(kInvalidUsage, "NET/tandem: closeListen: %p is no listen comm", listen_comm);
    if (l->posted) fi_cancel(&ep_->fid, &l->posted->ctx);
    numbers_.erase(l->number);
    listens_.remove(reinterpret_cast<uintptr_t>(listen_comm));
    progress_locked();
    return kSuccess;
}
}  // namespace tandem::nccl
