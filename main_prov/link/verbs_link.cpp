// The verbs link (verbs_link.h).
#include "main_prov/link/verbs_link.h"

#include "common/iov.h"
#include "common/log.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <rdma/fi_errno.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace tandem {
namespace {

// Receive work requests carry their slot with this bit set; send work requests carry the
// index of their record.
constexpr uint64_t kRecvBit = uint64_t{1} << 63;
// IB CM rejection reason "consumer defined": the peer's application refused (rdma_reject),
// as opposed to nobody listening (invalid service id) or a timeout.
constexpr int kConsumerReject = 28;
// rdma_cm private data over IB/RoCE: what a REQ, REP and REJ carry. The peer is handed the
// whole fixed-size field, so the link puts the length of its data in the first byte.
constexpr size_t kMaxConnectData = 56 - 1;
constexpr size_t kMaxAcceptData = 196 - 1;
constexpr size_t kMaxRejectData = 148 - 1;

std::vector<uint8_t> framed(const void *priv, size_t len) {
    std::vector<uint8_t> out(1 + len);
    out[0] = static_cast<uint8_t>(len);
    if (len) memcpy(out.data() + 1, priv, len);
    return out;
}

std::vector<uint8_t> unframed(const void *data, size_t len) {
    const auto *p = static_cast<const uint8_t *>(data);
    if (!p || len == 0 || p[0] > len - 1) return {};
    return std::vector<uint8_t>(p + 1, p + 1 + p[0]);
}
// How often a progress pass looks at the rdma_cm and completion channels when nothing is
// being connected (each look is a system call; the CQ itself is polled on every pass).
constexpr unsigned kChannelEvery = 16;

WcStatus status_of(ibv_wc_status s) {
    switch (s) {
        case IBV_WC_SUCCESS:
            return WcStatus::Success;
        case IBV_WC_REM_ACCESS_ERR:
            return WcStatus::RemoteAccessError;
        case IBV_WC_REM_INV_REQ_ERR:
        case IBV_WC_REM_INV_RD_REQ_ERR:
            return WcStatus::RemoteInvalid;
        case IBV_WC_REM_OP_ERR:
        case IBV_WC_REM_ABORT_ERR:
            return WcStatus::RemoteOpError;
        case IBV_WC_WR_FLUSH_ERR:
            return WcStatus::Flushed;
        case IBV_WC_RETRY_EXC_ERR:
        case IBV_WC_RNR_RETRY_EXC_ERR:
        case IBV_WC_RESP_TIMEOUT_ERR:
            return WcStatus::Timeout;
        default:  // LOC_LEN, LOC_QP_OP, LOC_PROT, LOC_ACCESS, MW_BIND, BAD_RESP, FATAL, ...
            return WcStatus::LocalFault;
    }
}

int ibv_access_of(uint64_t fi_access) {
    int a = 0;
    if (fi_access & FI_REMOTE_WRITE) a |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
    if (fi_access & FI_REMOTE_READ) a |= IBV_ACCESS_REMOTE_READ;
    return a;
}

int fi_errno_of(int err) {
    switch (err) {
        case EADDRINUSE:
            return -FI_EADDRINUSE;
        case EADDRNOTAVAIL:
        case ENODEV:
            return -FI_EADDRNOTAVAIL;
        case ENOMEM:
            return -FI_ENOMEM;
        case EINVAL:
            return -FI_EINVAL;
        default:
            return err > 0 ? -err : -FI_EIO;
    }
}

void set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

sockaddr_storage copy_addr(const sockaddr *sa) {
    sockaddr_storage ss{};
    if (sa && (sa->sa_family == AF_INET || sa->sa_family == AF_INET6))
        memcpy(&ss, sa, sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
    return ss;
}

uint8_t *map_slab(size_t bytes) {
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t *>(p);
}

// An index of `slots` free for use: one given back earlier, else a new slot at the end. (The
// send-queue records and the posted receives are both found again by index from a CQE.)
template <class T>
uint32_t take_index(std::vector<T> &slots, std::vector<uint32_t> &free) {
    if (!free.empty()) {
        uint32_t index = free.back();
        free.pop_back();
        return index;
    }
    slots.emplace_back();
    return static_cast<uint32_t>(slots.size() - 1);
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

// ---- device ----------------------------------------------------------------------------------

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

std::unique_ptr<LinkTransport> VerbsDevice::transport(RemoteKeyResolver *resolver,
                                                      size_t max_send_size) {
    return std::make_unique<VerbsTransport>(shared_from_this(), resolver, max_send_size);
}

// ---- connection ------------------------------------------------------------------------------

VerbsConnection::VerbsConnection(VerbsTransport *transport, rdma_cm_id *id, State state)
    : transport_(transport), api_(&transport->api_), id_(id), state_(state) {
    if (id_) id_->context = this;
}

VerbsConnection::~VerbsConnection() {
    if (qp_) api_->destroy_qp(id_);
    if (id_) api_->destroy_id(id_);
}

sockaddr_storage VerbsConnection::peer_address() const {
    return id_ ? copy_addr(rdma_get_peer_addr(id_)) : sockaddr_storage{};
}

sockaddr_storage VerbsConnection::local_address() const {
    return id_ ? copy_addr(rdma_get_local_addr(id_)) : sockaddr_storage{};
}

int VerbsConnection::create_qp() {
    VerbsDevice &dev = transport_->device();
    if (id_->verbs != dev.context()) {
        TANDEM_WARN(FI_LOG_EP_CTRL, "a connection reached %s through another RDMA device\n",
                    dev.name().c_str());
        return -FI_EADDRNOTAVAIL;
    }
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = transport_->cq_;
    a.srq = transport_->srq_;
    a.qp_type = IBV_QPT_RC;
    a.sq_sig_all = 1;
    a.cap.max_send_wr = std::min<uint32_t>(dev.config().sq_depth, dev.attr().max_qp_wr);
    a.cap.max_send_sge = dev.caps().max_sge;
    a.cap.max_recv_wr = 1;
    a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = dev.config().max_inline;
    ibv_qp_init_attr want = a;
    if (transport_->api_.create_qp(id_, dev.pd(), &a) != 0) {
        // Some devices offer no inline data at all.
        a = want;
        a.cap.max_inline_data = 0;
        if (transport_->api_.create_qp(id_, dev.pd(), &a) != 0) {
            int err = errno;
            TANDEM_WARN(FI_LOG_EP_CTRL, "%s: rdma_create_qp: %s\n", dev.name().c_str(),
                        strerror(err));
            return fi_errno_of(err);
        }
    }
    qp_ = id_->qp;
    max_inline_ = a.cap.max_inline_data;
    max_sge_ = std::max<uint32_t>(a.cap.max_send_sge, 1);
    sq_depth_ = std::max<uint32_t>(a.cap.max_send_wr, 1);
    transport_->watch_qp(this);
    return 0;
}

namespace {
rdma_conn_param conn_param(const VerbsDevice &dev, const void *priv, size_t len) {
    rdma_conn_param p{};
    p.private_data = priv;
    p.private_data_len = static_cast<uint8_t>(len);
    // RDMA reads in flight: the device's limit, enough for rendezvous pipelines.
    int rd = std::min({dev.attr().max_qp_rd_atom, dev.attr().max_qp_init_rd_atom, 16});
    p.responder_resources = p.initiator_depth = static_cast<uint8_t>(std::max(rd, 1));
    p.retry_count = dev.config().retry;
    p.rnr_retry_count = dev.config().rnr_retry;
    return p;
}
}  // namespace

int VerbsConnection::accept(const void *priv, size_t len) {
    if (state_ != State::RequestReceived) return -FI_EINVAL;
    if (len > kMaxAcceptData) return -FI_EINVAL;
    if (int ret = create_qp()) return ret;
    std::vector<uint8_t> data = framed(priv, len);
    rdma_conn_param p = conn_param(transport_->device(), data.data(), data.size());
    if (transport_->api_.accept(id_, &p) != 0) return fi_errno_of(errno);
    // Accepted is established for the protocol (as on the TCP link, and as fabtests expect
    // of fi_accept): what it posts before the peer's RTU makes the queue pair ready to send
    // waits here, deferred, and goes when rdma_cm says ESTABLISHED.
    state_ = State::Accepting;
    transport_->report({CmEventType::Established, this, {}});
    return 0;
}

// An owner's reject gives the connection up: nothing above names it again, and the link lets
// it go at its next pass (bury_rejected). disconnect and destroy refuse a request through
// send_reject, as the owner still holds the connection then.
int VerbsConnection::reject(const void *priv, size_t len) {
    int ret = send_reject(priv, len);
    if (ret == 0) {
        rejected_ = true;
        transport_->rejected_waiting_ = true;
    }
    return ret;
}

int VerbsConnection::send_reject(const void *priv, size_t len) {
    if (state_ != State::RequestReceived) return -FI_EINVAL;
    if (len > kMaxRejectData) return -FI_EINVAL;
    std::vector<uint8_t> data = framed(priv, len);
    if (transport_->api_.reject(id_, data.data(), static_cast<uint8_t>(data.size())) != 0)
        return fi_errno_of(errno);
    state_ = State::Closed;
    reported_down_ = true;  // the protocol knows: it rejected
    return 0;
}

void VerbsConnection::disconnect() {
    switch (state_) {
        case State::RequestReceived:
            send_reject(nullptr, 0);
            return;
        case State::Resolving:
            fail(nullptr);
            return;
        case State::Connecting:
        case State::Accepting:
        case State::Established:
            // Orderly: what was posted goes first (rdma_disconnect moves the queue pair to the
            // error state, which would flush it), as a TCP FIN follows the data before it.
            state_ = State::Closing;
            if (!outstanding_.empty() || !deferred_.empty())
                disconnect_pending_ = true;
            else
                transport_->api_.disconnect(id_);
            return;
        case State::Closing:
        case State::Closed:
            return;
    }
}

// The queue pair cannot go on: it is moved to the error state (the NIC flushes what it holds),
// the peer is told, and the protocol hears of it once.
void VerbsConnection::fail(const char *why) {
    if (state_ == State::Closed) return;
    State was = state_;
    state_ = State::Closed;
    if (why)
        TANDEM_WARN(FI_LOG_EP_DATA, "%s: connection to the peer fails: %s\n",
                    transport_->device().name().c_str(), why);
    if (qp_) {
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_ERR;
        transport_->api_.modify_qp(qp_, &attr, IBV_QP_STATE);
    }
    if (id_ && (was == State::Established || was == State::Connecting || was == State::Accepting))
        transport_->api_.disconnect(id_);
    if (!reported_down_) {
        reported_down_ = true;
        bool connected =
            was == State::Established || was == State::Closing || was == State::Accepting;
        transport_->report(
            {connected ? CmEventType::Disconnected : CmEventType::Unreachable, this, {}});
    }
    if (outstanding_.empty()) flush_deferred();
}

// Work requests the NIC never saw complete as flushed after those it held (posting order).
void VerbsConnection::flush_deferred() {
    while (!deferred_.empty()) {
        Deferred &d = deferred_.front();
        transport_->complete({d.wr_id, this, d.opcode, WcStatus::Flushed, false, 0, 0});
        deferred_.pop_front();
    }
}

int VerbsConnection::post_send(const iovec *iov, size_t count, const uint32_t *imm, uint64_t wr_id,
                               bool /*if_write_ok*/) {
    // if_write_ok needs nothing here: a failed RDMA write moves the queue pair to the error
    // state, and the send posted after it is flushed, never delivered.
    if (!established()) return -FI_ENOTCONN;
    const LinkCaps &caps = transport_->caps();
    if (count > caps.max_sge) return -FI_EINVAL;
    if (iov_length(iov, count) > caps.max_send_size) return -FI_EMSGSIZE;
    Deferred wr{WcOpcode::Send, {iov, iov + count}, {}, {}, imm != nullptr, imm ? *imm : 0, wr_id};
    return submit(std::move(wr));
}

int VerbsConnection::post_write(const iovec *iov, const hmem::MemRef *mem, size_t count,
                                RemoteRegion dst, const uint32_t *imm, uint64_t wr_id) {
    if (!established()) return -FI_ENOTCONN;
    const LinkCaps &caps = transport_->caps();
    if (count > caps.max_sge) return -FI_EINVAL;
    if (iov_length(iov, count) > caps.max_rdma_size) return -FI_EMSGSIZE;
    Deferred wr{WcOpcode::Write, {iov, iov + count}, {},   dst,
                imm != nullptr,  imm ? *imm : 0,     wr_id};
    if (mem) wr.mem.assign(mem, mem + count);
    return submit(std::move(wr));
}

int VerbsConnection::post_read(const iovec *iov, const hmem::MemRef *mem, size_t count,
                               RemoteRegion src, uint64_t wr_id) {
    if (!established()) return -FI_ENOTCONN;
    const LinkCaps &caps = transport_->caps();
    if (count > caps.max_sge) return -FI_EINVAL;
    if (iov_length(iov, count) > caps.max_rdma_size) return -FI_EMSGSIZE;
    Deferred wr{WcOpcode::Read, {iov, iov + count}, {}, src, false, 0, wr_id};
    if (mem) wr.mem.assign(mem, mem + count);
    return submit(std::move(wr));
}

int VerbsConnection::submit(Deferred &&wr) {
    if (deferred_.empty() && ready_) {
        int ret = issue(wr);
        if (ret != 0) return ret < 0 ? ret : 0;
    }
    deferred_.push_back(std::move(wr));
    transport_->deferred_work_ = true;
    return 0;
}

// A send for issue(): its payload inline in the work request where the queue pair takes it
// so, else copied into a registered send slot. 1: ready; 0: no slot free (it stays deferred).
int VerbsConnection::fill_send(const Deferred &wr, size_t len, uint32_t record, ibv_send_wr &w) {
    VerbsTransport &t = *transport_;
    w.opcode = wr.has_imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
    if (len <= max_inline_ && wr.iov.size() <= max_sge_) {
        for (const iovec &v : wr.iov)
            if (v.iov_len)
                w.sg_list[w.num_sge++] = {reinterpret_cast<uint64_t>(v.iov_base),
                                          static_cast<uint32_t>(v.iov_len), 0};
        w.send_flags |= IBV_SEND_INLINE;
        return 1;
    }
    int slot = t.take_send_slot();
    if (slot < 0) return 0;
    t.records_[record].slot = slot;
    uint8_t *at = t.send_slot(slot);
    for (const iovec &v : wr.iov) {
        memcpy(at, v.iov_base, v.iov_len);
        at += v.iov_len;
    }
    w.sg_list[0] = {reinterpret_cast<uint64_t>(t.send_slot(slot)), static_cast<uint32_t>(len),
                    t.send_mr_->lkey};
    w.num_sge = 1;
    return 1;
}

// An RDMA write or read for issue(): the remote region, and the local pieces registered for
// this one work request (or staged through host memory where the NIC cannot reach them).
// 1: ready; <0: refused.
int VerbsConnection::fill_rdma(const Deferred &wr, size_t len, uint32_t record, ibv_send_wr &w) {
    VerbsTransport &t = *transport_;
    VerbsTransport::Record &rec = t.records_[record];
    bool write = wr.opcode == WcOpcode::Write;
    w.opcode =
        write ? (wr.has_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE) : IBV_WR_RDMA_READ;
    // A verbs rkey is 32 bits (beside the owner's bit); a larger key is no key of this
    // link (0 is none either).
    const uint64_t rkey = wr.remote.key & ~kLinkKeyOwnerBit;
    w.wr.rdma.rkey = rkey <= UINT32_MAX ? static_cast<uint32_t>(rkey) : 0;
    w.wr.rdma.remote_addr = wr.remote.addr;
    int access = write ? 0 : IBV_ACCESS_LOCAL_WRITE;
    const hmem::MemRef *mem = wr.mem.empty() ? nullptr : wr.mem.data();
    for (size_t i = 0; i < wr.iov.size(); ++i) {
        const iovec &v = wr.iov[i];
        if (!v.iov_len) continue;
        hmem::MemRef m = mem ? mem[i] : hmem::kHost;
        if (!m.on_host() && !t.device_p2p_)
            return stage_rdma(wr, len, record, w);  // FI_HMEM_P2P_DISABLED: through host memory
        ibv_mr *mr = t.device().register_local(v.iov_base, v.iov_len, m, access);
        if (!mr) {
            if (m.on_host()) return -FI_EFAULT;
            // Device memory the NIC cannot reach: through host memory.
            return stage_rdma(wr, len, record, w);
        }
        rec.mrs.push_back(mr);
        w.sg_list[w.num_sge++] = {reinterpret_cast<uint64_t>(v.iov_base),
                                  static_cast<uint32_t>(v.iov_len), mr->lkey};
    }
    return 1;
}

// An RDMA write or read of device memory the NIC does not reach goes through a registered host
// buffer instead of the pieces fill_rdma registered: a write's source is copied there now, a
// read lands there and is copied out when it completes (poll_cq). 1: ready; <0: refused.
int VerbsConnection::stage_rdma(const Deferred &wr, size_t len, uint32_t record, ibv_send_wr &w) {
    VerbsTransport &t = *transport_;
    VerbsTransport::Record &rec = t.records_[record];
    for (ibv_mr *mr : rec.mrs) t.api_.dereg_mr(mr);
    rec.mrs.clear();
    w.num_sge = 0;
    rec.bounce.resize(std::max<size_t>(len, 1));
    if (wr.opcode == WcOpcode::Write) {
        const hmem::MemRef *mem = wr.mem.empty() ? nullptr : wr.mem.data();
        if (hmem::gather(rec.bounce.data(), wr.iov.data(), mem, wr.iov.size(), 0, len) !=
            ssize_t(len))
            return -FI_EIO;
    } else {
        rec.scatter_iov = wr.iov;
        rec.scatter_mem = wr.mem;
    }
    ibv_mr *mr = t.device().register_local(rec.bounce.data(), rec.bounce.size(), hmem::kHost,
                                           IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return -FI_ENOMEM;
    rec.mrs.push_back(mr);
    w.sg_list[0] = {reinterpret_cast<uint64_t>(rec.bounce.data()), static_cast<uint32_t>(len),
                    mr->lkey};
    w.num_sge = len ? 1 : 0;
    return 1;
}

int VerbsConnection::issue(Deferred &wr) {
    if (outstanding_.size() >= sq_depth_) return 0;
    VerbsTransport &t = *transport_;
    uint32_t index = t.new_record();
    VerbsTransport::Record &rec = t.records_[index];
    rec.conn = this;
    rec.wr_id = wr.wr_id;
    rec.opcode = wr.opcode;

    ibv_sge sge[LocalPieces::kMax];
    ibv_send_wr w{};
    w.wr_id = index;
    w.sg_list = sge;
    w.send_flags = IBV_SEND_SIGNALED;
    size_t len = iov_length(wr.iov.data(), wr.iov.size());
    int ready =
        wr.opcode == WcOpcode::Send ? fill_send(wr, len, index, w) : fill_rdma(wr, len, index, w);
    if (ready <= 0) {  // 0: no send slot free (it stays deferred); <0: refused
        t.free_record(index);
        return ready;
    }
    if (wr.has_imm) w.imm_data = htonl(wr.imm);

    ibv_send_wr *bad = nullptr;
    int err = ibv_post_send(qp_, &w, &bad);
    if (err) {
        t.free_record(index);
        if (err == ENOMEM) return 0;  // send queue full after all: stays deferred
        // The queue pair refused: it is in the error state. The work request was accepted
        // (it is deferred, so it completes as flushed, after what the NIC holds).
        fail(strerror(err));
        return 0;
    }
    outstanding_.push_back(index);
    return 1;
}

// ---- transport -------------------------------------------------------------------------------

VerbsTransport::VerbsTransport(std::shared_ptr<VerbsDevice> device, RemoteKeyResolver *resolver,
                               size_t max_send_size)
    : device_(std::move(device)), api_(device_->api()), resolver_(resolver) {
    caps_ = device_->caps();
    // Every send above the queue pair's inline size is copied into a registered send buffer:
    // the protocol never has to keep a send's source.
    caps_.max_send_size = caps_.max_inline = max_send_size;
    const VerbsLinkConfig &cfg = device_->config();
    ibv_context *ctx = device_->context();
    auto failed = [&](const char *what) {
        int err = errno;
        TANDEM_WARN(FI_LOG_EP_CTRL, "%s: %s: %s\n", device_->name().c_str(), what, strerror(err));
        status_ = fi_errno_of(err ? err : EIO);
    };
    channel_ = api_.create_event_channel();
    if (!channel_) {
        failed("rdma_create_event_channel");
        return;
    }
    set_nonblocking(channel_->fd);
    comp_channel_ = api_.create_comp_channel(ctx);
    if (!comp_channel_) {
        failed("ibv_create_comp_channel");
        return;
    }
    set_nonblocking(comp_channel_->fd);
    int cqe = static_cast<int>(std::min<uint32_t>(cfg.cq_depth, device_->attr().max_cqe));
    cq_ = api_.create_cq(ctx, cqe, this, comp_channel_, 0);
    if (!cq_) {
        failed("ibv_create_cq");
        return;
    }
    ibv_req_notify_cq(cq_, 0);
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = std::min<uint32_t>(cfg.srq_depth, device_->attr().max_srq_wr);
    sa.attr.max_sge = 1;
    srq_ = api_.create_srq(device_->pd(), &sa);
    if (!srq_) {
        failed("ibv_create_srq");
        return;
    }
    slot_size_ = max_send_size;
    send_slab_ = map_slab(slot_size_ * cfg.send_slots);
    if (!send_slab_) {
        failed("mmap of the link's send buffers");
        return;
    }
    send_mr_ =
        api_.reg_mr(device_->pd(), send_slab_, slot_size_ * cfg.send_slots, IBV_ACCESS_LOCAL_WRITE);
    if (!send_mr_) {
        failed("ibv_reg_mr of the link's send buffers");
        return;
    }
    for (uint32_t i = cfg.send_slots; i-- > 0;) free_send_slots_.push_back(int32_t(i));
}

VerbsTransport::~VerbsTransport() {
    // Queue pairs before the queues they use; the NIC touches no record's memory once its
    // queue pair is gone.
    conns_.clear();
    graveyard_.clear();
    if (listen_id_) api_.destroy_id(listen_id_);
    for (Record &r : records_)
        for (ibv_mr *mr : r.mrs) api_.dereg_mr(mr);
    if (srq_) api_.destroy_srq(srq_);
    if (cq_) {
        if (unacked_cq_events_) api_.ack_cq_events(cq_, unacked_cq_events_);
        api_.destroy_cq(cq_);
    }
    if (comp_channel_) api_.destroy_comp_channel(comp_channel_);
    if (send_mr_) api_.dereg_mr(send_mr_);
    for (auto &[buf, mr] : recv_mrs_) api_.dereg_mr(mr);
    const VerbsLinkConfig &cfg = device_->config();
    if (send_slab_) munmap(send_slab_, slot_size_ * cfg.send_slots);
    if (channel_) api_.destroy_event_channel(channel_);
}

uint8_t *VerbsTransport::send_slot(int32_t slot) const {
    return send_slab_ + slot * slot_size_;
}
int VerbsTransport::take_send_slot() {
    if (free_send_slots_.empty()) return -1;
    int32_t slot = free_send_slots_.back();
    free_send_slots_.pop_back();
    return slot;
}

ibv_mr *VerbsTransport::recv_registration(void *buf, size_t len) {
    auto it = recv_mrs_.find(buf);
    if (it != recv_mrs_.end()) {
        if (it->second->length >= len) return it->second;
        api_.dereg_mr(it->second);  // the same address posted longer: registered again
        recv_mrs_.erase(it);
    }
    ibv_mr *mr = device_->register_local(buf, len, hmem::kHost, IBV_ACCESS_LOCAL_WRITE);
    if (mr) recv_mrs_[buf] = mr;
    return mr;
}

uint32_t VerbsTransport::new_record() {
    return take_index(records_, free_records_);
}

void VerbsTransport::free_record(uint32_t index) {
    Record &r = records_[index];
    for (ibv_mr *mr : r.mrs) api_.dereg_mr(mr);
    if (r.slot >= 0) free_send_slots_.push_back(r.slot);
    r = Record{};
    free_records_.push_back(index);
}

void VerbsTransport::watch_qp(VerbsConnection *conn) {
    by_qp_[conn->qp_num()] = conn;
}

void VerbsTransport::unwatch_qp(VerbsConnection *conn) {
    auto it = by_qp_.find(conn->qp_num());
    if (it != by_qp_.end() && it->second == conn) by_qp_.erase(it);
}

VerbsConnection *VerbsTransport::by_qp(uint32_t qp_num) const {
    auto it = by_qp_.find(qp_num);
    return it == by_qp_.end() ? nullptr : it->second;
}

VerbsConnection *VerbsTransport::find(const LinkConnection *conn) const {
    for (auto &c : conns_)
        if (c.get() == conn) return c.get();
    return nullptr;
}

int VerbsTransport::listen(const sockaddr *addr, socklen_t, int backlog) {
    if (status_) return status_;
    if (listen_id_) return -FI_EINVAL;
    if (api_.create_id(channel_, &listen_id_, nullptr, RDMA_PS_TCP) != 0) return fi_errno_of(errno);
    auto undo = [&](int err) {
        api_.destroy_id(listen_id_);
        listen_id_ = nullptr;
        return err;
    };
    if (api_.bind_addr(listen_id_, const_cast<sockaddr *>(addr)) != 0)
        return undo(fi_errno_of(errno));
    if (listen_id_->verbs && listen_id_->verbs != device_->context())
        return undo(-FI_EADDRNOTAVAIL);  // the address belongs to another device
    if (api_.listen(listen_id_, backlog) != 0) return undo(fi_errno_of(errno));
    return 0;
}

sockaddr_storage VerbsTransport::name() const {
    return listen_id_ ? copy_addr(rdma_get_local_addr(listen_id_)) : sockaddr_storage{};
}

LinkConnection *VerbsTransport::connect(const sockaddr *dst, socklen_t, const void *priv,
                                        size_t priv_len, const sockaddr *src, socklen_t) {
    rdma_cm_id *id = nullptr;
    if (status_ == 0 && api_.create_id(channel_, &id, nullptr, RDMA_PS_TCP) != 0) id = nullptr;
    auto conn = std::make_unique<VerbsConnection>(this, id, VerbsConnection::State::Resolving);
    VerbsConnection *c = conn.get();
    conns_.push_back(std::move(conn));
    if (!id) {
        c->fail("no rdma_cm id");
        return c;
    }
    if (priv_len > kMaxConnectData) {
        TANDEM_WARN(FI_LOG_EP_CTRL,
                    "%s: %zu bytes of connection data, rdma_cm carries at most %zu\n",
                    device_->name().c_str(), priv_len, kMaxConnectData);
        c->fail(nullptr);
        return c;
    }
    c->connect_priv_ = framed(priv, priv_len);
    if (api_.resolve_addr(id, const_cast<sockaddr *>(src), const_cast<sockaddr *>(dst),
                          device_->config().resolve_timeout_ms) != 0)
        c->fail(strerror(errno));
    ++transitional_;
    // Take the resolution as far as it has come: where rdma_cm answers at once, the request
    // leaves within this call, as a TCP connect's SYN does, not at the next progress call.
    read_cm_events();
    return c;
}

void VerbsTransport::process_cm_event(rdma_cm_event *ev) {
    using State = VerbsConnection::State;
    rdma_cm_id *id = ev->id;
    auto private_data = [&] {
        return unframed(ev->param.conn.private_data, ev->param.conn.private_data_len);
    };
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
        auto conn = std::make_unique<VerbsConnection>(this, id, State::RequestReceived);
        VerbsConnection *c = conn.get();
        conns_.push_back(std::move(conn));
        report({CmEventType::ConnectRequest, c, private_data()});
        return;
    }
    if (ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
        TANDEM_WARN(FI_LOG_EP_CTRL, "%s: the RDMA device was removed\n", device_->name().c_str());
        for (auto &c : conns_) c->fail(nullptr);
        status_ = -FI_ENODEV;
        return;
    }
    if (id == listen_id_) return;
    VerbsConnection *c = find(static_cast<LinkConnection *>(id->context));
    if (!c) return;  // destroyed or handed to another transport
    switch (ev->event) {
        case RDMA_CM_EVENT_ADDR_RESOLVED:
            if (api_.resolve_route(id, device_->config().resolve_timeout_ms) != 0)
                c->fail(strerror(errno));
            return;
        case RDMA_CM_EVENT_ROUTE_RESOLVED: {
            if (c->state_ != State::Resolving) return;
            if (c->create_qp() != 0) {
                c->fail(nullptr);
                return;
            }
            rdma_conn_param p =
                conn_param(*device_, c->connect_priv_.data(), c->connect_priv_.size());
            if (api_.connect(id, &p) != 0) {
                c->fail(strerror(errno));
                return;
            }
            c->state_ = State::Connecting;
            return;
        }
        case RDMA_CM_EVENT_ESTABLISHED:
            c->ready_ = c->state_ != State::Closed;
            deferred_work_ = true;
            if (c->state_ == State::Accepting) c->state_ = State::Established;  // reported
            if (c->state_ != State::Connecting) return;
            c->state_ = State::Established;
            report({CmEventType::Established, c, private_data()});
            return;
        case RDMA_CM_EVENT_REJECTED:
            if (c->state_ == State::Closed) return;
            c->state_ = State::Closed;
            c->reported_down_ = true;
            if (ev->status == kConsumerReject)
                report({CmEventType::Rejected, c, private_data()});
            else
                report({CmEventType::Unreachable, c, {}});
            if (c->outstanding_.empty()) c->flush_deferred();
            return;
        case RDMA_CM_EVENT_ADDR_ERROR:
        case RDMA_CM_EVENT_ROUTE_ERROR:
        case RDMA_CM_EVENT_UNREACHABLE:
        case RDMA_CM_EVENT_CONNECT_ERROR:
            c->fail(nullptr);
            return;
        case RDMA_CM_EVENT_DISCONNECTED:
            // What the peer sent before it disconnected is in the CQ already: collect it
            // first, so that the protocol reads it before it hears of the disconnection.
            poll_cq();
            if (c->state_ == State::Closing) c->state_ = State::Established;  // as fail() expects
            c->fail(nullptr);
            return;
        default:  // TIMEWAIT_EXIT, ADDR_CHANGE, ...
            return;
    }
}

void VerbsTransport::poll_cq() {
    ibv_wc wc[32];
    int n;
    while ((n = ibv_poll_cq(cq_, 32, wc)) > 0) {
        for (int i = 0; i < n; ++i) {
            const ibv_wc &w = wc[i];
            if (w.wr_id & kRecvBit) {
                auto index = static_cast<uint32_t>(w.wr_id & ~kRecvBit);
                PostedRecv p = posted_[index];
                free_posted_.push_back(index);
                VerbsConnection *c = by_qp(w.qp_num);
                WcStatus st = status_of(w.status);
                if (w.status != IBV_WC_SUCCESS && w.status != IBV_WC_WR_FLUSH_ERR)
                    TANDEM_WARN(FI_LOG_EP_DATA, "%s: a receive failed: %s\n",
                                device_->name().c_str(), api_.wc_status_str(w.status));
                bool imm = w.wc_flags & IBV_WC_WITH_IMM;
                bool write_imm = w.opcode == IBV_WC_RECV_RDMA_WITH_IMM;
                complete({p.wr_id, st == WcStatus::Success ? c : nullptr,
                          write_imm ? WcOpcode::RecvWriteImm : WcOpcode::Recv, st, imm,
                          imm ? ntohl(w.imm_data) : 0,
                          st == WcStatus::Success && !write_imm ? w.byte_len : 0});
                continue;
            }
            auto index = static_cast<uint32_t>(w.wr_id);
            Record &r = records_[index];
            VerbsConnection *c = r.conn;
            auto &out = c->outstanding_;
            if (!out.empty() && out.front() == index)
                out.pop_front();
            else
                out.erase(std::remove(out.begin(), out.end(), index), out.end());
            if (!r.reported) {
                WcStatus st = status_of(w.status);
                if (st == WcStatus::Success && !r.scatter_iov.empty()) {
                    size_t len = iov_length(r.scatter_iov.data(), r.scatter_iov.size());
                    if (hmem::scatter(r.scatter_iov.data(),
                                      r.scatter_mem.empty() ? nullptr : r.scatter_mem.data(),
                                      r.scatter_iov.size(), 0, r.bounce.data(),
                                      len) != ssize_t(len))
                        st = WcStatus::LocalFault;
                }
                complete({r.wr_id, c, r.opcode, st, false, 0, 0});
                if (w.status != IBV_WC_SUCCESS && w.status != IBV_WC_WR_FLUSH_ERR)
                    TANDEM_WARN(FI_LOG_EP_DATA, "%s: work request failed: %s (vendor error %u)\n",
                                device_->name().c_str(), api_.wc_status_str(w.status),
                                w.vendor_err);
                // Any failure, a flush included, means the queue pair is in the error state.
                if (w.status != IBV_WC_SUCCESS) c->fail(nullptr);
            }
            free_record(index);
            if (c->failed() && out.empty()) c->flush_deferred();
            if (c->disconnect_pending_ && out.empty() && c->deferred_.empty()) {
                c->disconnect_pending_ = false;
                api_.disconnect(c->id_);
            }
        }
    }
    if (n < 0 && !cq_failed_) {
        cq_failed_ = true;
        TANDEM_WARN(FI_LOG_EP_DATA, "%s: ibv_poll_cq failed (CQ overrun?)\n",
                    device_->name().c_str());
    }
}

void VerbsTransport::retry_deferred() {
    if (!deferred_work_) return;
    deferred_work_ = false;
    for (auto &c : conns_) {
        while (!c->deferred_.empty() && c->ready_ && !c->failed()) {
            int ret = c->issue(c->deferred_.front());
            if (ret == 0) break;
            if (ret < 0)  // accepted earlier, refused now (its memory cannot be registered)
                complete({c->deferred_.front().wr_id, c.get(), c->deferred_.front().opcode,
                          WcStatus::LocalFault, false, 0, 0});
            c->deferred_.pop_front();
        }
        if (!c->deferred_.empty()) deferred_work_ = true;
    }
}

void VerbsTransport::reap_graveyard() {
    if (graveyard_.empty() || !completions_.empty()) return;  // a completion may name one
    std::erase_if(graveyard_, [&](std::unique_ptr<VerbsConnection> &c) {
        if (!c->outstanding_.empty()) return false;
        unwatch_qp(c.get());
        return true;
    });
}

// Rejected connections go to the graveyard, where they wait for nothing (no work request was
// ever posted on them) and are reaped with the others.
void VerbsTransport::bury_rejected() {
    rejected_waiting_ = false;
    for (auto it = conns_.begin(); it != conns_.end();) {
        if (!(*it)->rejected_) {
            ++it;
            continue;
        }
        (*it)->context = nullptr;
        graveyard_.push_back(std::move(*it));
        it = conns_.erase(it);
    }
}

void VerbsTransport::read_cm_events() {
    rdma_cm_event *ev = nullptr;
    while (channel_ && api_.get_cm_event(channel_, &ev) == 0) {
        process_cm_event(ev);
        api_.ack_cm_event(ev);
    }
}

void VerbsTransport::progress() {
    if (status_ && !channel_) return;
    if (rejected_waiting_) bury_rejected();
    reap_graveyard();
    if (transitional_ > 0 || ++passes_ % kChannelEvery == 0) {
        read_cm_events();
        transitional_ = 0;
        for (auto &c : conns_)
            if (c->state_ == VerbsConnection::State::Resolving ||
                c->state_ == VerbsConnection::State::Connecting ||
                c->state_ == VerbsConnection::State::Accepting ||
                c->state_ == VerbsConnection::State::Closing)
                ++transitional_;
        // Re-arm the CQ after each notification, then poll it: nothing that arrived before
        // the arm is missed, and what arrives after it wakes a waiter.
        ibv_cq *cq = nullptr;
        void *ctx = nullptr;
        while (api_.get_cq_event(comp_channel_, &cq, &ctx) == 0) {
            if (++unacked_cq_events_ >= 64) {
                api_.ack_cq_events(cq_, unacked_cq_events_);
                unacked_cq_events_ = 0;
            }
            ibv_req_notify_cq(cq_, 0);
        }
    }
    poll_cq();
    retry_deferred();
}

int VerbsTransport::poll(WorkCompletion *wc, int max) {
    progress();
    int n = 0;
    while (n < max && !completions_.empty()) {
        wc[n++] = completions_.front();
        completions_.pop_front();
    }
    return n;
}

bool VerbsTransport::poll_cm(CmEvent &event) {
    // Completions go first: a receive that arrived before a disconnection is the protocol's
    // before the disconnection is.
    if (!completions_.empty()) return false;
    if (cm_events_.empty()) {
        ++transitional_;  // look at the channel now
        progress();
    }
    if (cm_events_.empty()) return false;
    event = std::move(cm_events_.front());
    cm_events_.pop_front();
    return true;
}

void VerbsTransport::wait_fds(std::vector<int> &out) const {
    if (channel_) out.push_back(channel_->fd);
    if (comp_channel_) out.push_back(comp_channel_->fd);
}

int VerbsTransport::post_recv(void *buf, size_t len, uint64_t wr_id) {
    if (status_) return status_;
    ibv_mr *mr = recv_registration(buf, len);
    if (!mr) return -FI_EFAULT;
    uint32_t index = take_index(posted_, free_posted_);
    posted_[index] = {wr_id, len};
    ibv_sge sge{reinterpret_cast<uint64_t>(buf), static_cast<uint32_t>(len), mr->lkey};
    ibv_recv_wr w{};
    w.wr_id = kRecvBit | index;
    w.sg_list = &sge;
    w.num_sge = 1;
    ibv_recv_wr *bad = nullptr;
    if (int err = ibv_post_srq_recv(srq_, &w, &bad)) {
        free_posted_.push_back(index);
        TANDEM_WARN(FI_LOG_EP_DATA, "%s: ibv_post_srq_recv: %s\n", device_->name().c_str(),
                    strerror(err));
        return fi_errno_of(err);
    }
    return 0;
}

bool VerbsTransport::idle() const {
    return conns_.empty() && graveyard_.empty() && completions_.empty() && cm_events_.empty();
}

bool VerbsTransport::busy() const {
    if (deferred_work_ || transitional_ || !graveyard_.empty() || !completions_.empty() ||
        !cm_events_.empty())
        return true;
    for (auto &c : conns_)
        if (!c->outstanding_.empty()) return true;
    return false;
}

void VerbsTransport::destroy(LinkConnection *conn) {
    auto it =
        std::find_if(conns_.begin(), conns_.end(), [&](const auto &c) { return c.get() == conn; });
    if (it == conns_.end()) return;
    std::unique_ptr<VerbsConnection> c = std::move(*it);
    conns_.erase(it);
    c->reported_down_ = true;  // the protocol gave it up: no event for it any more
    c->context = nullptr;      // nor a message that was already in the CQ
    if (c->state_ == VerbsConnection::State::RequestReceived)
        c->send_reject(nullptr, 0);
    else
        c->fail(nullptr);
    graveyard_.push_back(std::move(c));
}

void VerbsTransport::disconnect_all() {
    for (auto &c : conns_) c->disconnect();
    transitional_ = 1;
}

bool VerbsTransport::drain(int timeout_ms) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        ++transitional_;
        progress();
        bool open = false;
        for (auto &c : conns_) open |= c->state_ != VerbsConnection::State::Closed;
        if (!open) return true;
        if (std::chrono::steady_clock::now() >= end) return false;
        sched_yield();
    }
}

void VerbsTransport::abort_all() {
    auto abort = [&](VerbsConnection &c) {
        c.reported_down_ = true;
        c.fail(nullptr);
        // Complete now what the NIC still holds; its flush completions are dropped later.
        for (uint32_t index : c.outstanding_) {
            Record &r = records_[index];
            if (r.reported) continue;
            r.reported = true;
            complete({r.wr_id, &c, r.opcode, WcStatus::Flushed, false, 0, 0});
        }
        c.flush_deferred();
    };
    for (auto &c : conns_) abort(*c);
    for (auto &c : graveyard_) abort(*c);
}

std::unique_ptr<LinkConnection> VerbsTransport::release(LinkConnection *conn) {
    auto it =
        std::find_if(conns_.begin(), conns_.end(), [&](const auto &c) { return c.get() == conn; });
    if (it == conns_.end()) return nullptr;
    std::unique_ptr<VerbsConnection> c = std::move(*it);
    conns_.erase(it);
    unwatch_qp(c.get());
    return c;
}

void VerbsTransport::adopt(std::unique_ptr<LinkConnection> conn) {
    auto *c = dynamic_cast<VerbsConnection *>(conn.get());
    if (!c) {
        TANDEM_WARN(FI_LOG_EP_CTRL, "%s: a connection of another link cannot be adopted\n",
                    device_->name().c_str());
        return;
    }
    conn.release();
    std::unique_ptr<VerbsConnection> owned(c);
    if (c->id_ && api_.migrate_id(c->id_, channel_) != 0)
        TANDEM_WARN(FI_LOG_EP_CTRL, "%s: rdma_migrate_id: %s\n", device_->name().c_str(),
                    strerror(errno));
    c->transport_ = this;
    if (c->qp_) watch_qp(c);
    conns_.push_back(std::move(owned));
}

}  // namespace tandem
