// The verbs link's transport (verbs_link.h): its queues (CQ, SRQ, send slab) and channels, the
// protocol's receive buffers, completions, the progress pass, and the connections it holds.
// Beside it: verbs_device.cpp (the device), verbs_connection.cpp (a queue pair's work
// requests) and verbs_cm.cpp (connection management through rdma_cm).
#include "main_prov/link/verbs_link.h"
#include "main_prov/link/verbs_link_internal.h"

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

using verbs_detail::fi_errno_of;
using verbs_detail::take_index;

namespace {

// Receive work requests carry their slot with this bit set; send work requests carry the
// index of their record.
constexpr uint64_t kRecvBit = uint64_t{1} << 63;
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

void set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

uint8_t *map_slab(size_t bytes) {
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t *>(p);
}

}  // namespace

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

void VerbsTransport::wait_fds(std::vector<WaitFd> &out) const {
    if (channel_) out.push_back({channel_->fd, false});
    if (comp_channel_) out.push_back({comp_channel_->fd, false});
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
