// The verbs link's connection (verbs_link.h): one RC queue pair, and the work requests the
// protocol posts on it, from the post to the NIC's send queue (deferred while the queue pair
// cannot take them), with the send slots and records of the transport they use. Its rdma_cm
// side is in verbs_cm.cpp.
#include "main_prov/link/verbs_link.h"
#include "main_prov/link/verbs_link_internal.h"

#include "common/iov.h"
#include "common/log.h"

#include <arpa/inet.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

namespace tandem {

using verbs_detail::copy_addr;
using verbs_detail::take_index;

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

// ---- the transport's send slots and records, taken by issue() ------------------------------

uint8_t *VerbsTransport::send_slot(int32_t slot) const {
    return send_slab_ + slot * slot_size_;
}

int VerbsTransport::take_send_slot() {
    if (free_send_slots_.empty()) return -1;
    int32_t slot = free_send_slots_.back();
    free_send_slots_.pop_back();
    return slot;
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

}  // namespace tandem
