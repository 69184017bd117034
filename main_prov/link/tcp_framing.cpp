// The TCP link's frames on the socket (tcp_link.h, wire::TcpFrame): queued frames leave in
// batches of one sendmsg; incoming frames are read, checked, placed and finished. This is the
// per-message path: the helpers of its functions stay beside them, where they can be inlined.
#include "main_prov/link/tcp_link.h"
#include "main_prov/link/tcp_link_internal.h"

#include "common/coarse_clock.h"
#include "common/iov.h"
#include "common/log.h"
#include "common/test_hook.h"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tandem {

namespace {

constexpr size_t kDirectReadThreshold = 16 * 1024;
constexpr size_t kMaxSendIov = 64;
constexpr uint64_t kMaxCmPayload = sizeof(wire::TcpCmHello) + 4096;

bool op_has_extension(wire::TcpOp op) {
    return op == wire::TcpOp::Write || op == wire::TcpOp::ReadReq;
}

bool op_is_wr(wire::TcpOp op) {
    return op == wire::TcpOp::Send || op == wire::TcpOp::Write || op == wire::TcpOp::ReadReq;
}

WcStatus status_from_wire(uint8_t status) {
    switch (static_cast<wire::TcpStatus>(status)) {
        case wire::TcpStatus::Ok:
            return WcStatus::Success;
        case wire::TcpStatus::RemoteAccess:
            return WcStatus::RemoteAccessError;
        case wire::TcpStatus::SourceFault:
        case wire::TcpStatus::TargetFault:
            return WcStatus::RemoteOpError;
        default:
            return WcStatus::RemoteInvalid;
    }
}

}  // namespace

// One sendmsg's scatter list over the front frames of the queue.
struct TcpConnection::SendBatch {
    iovec iov[kMaxSendIov];  // (left uninitialized: only the first n are written and read)
    size_t n = 0;
    size_t bytes = 0;  // what the list holds
    size_t skip = 0;   // bytes of the frame being added that went out already

    // Adds what of [base, base + len) is not among the `skip` bytes already sent.
    void push(void *base, size_t len) {
        if (skip >= len) {
            skip -= len;
            return;
        }
        iov[n++] = {static_cast<char *>(base) + skip, len - skip};
        bytes += len - skip;
        skip = 0;
    }
};

// Fills `batch` with the unsent bytes of the queue's front frames, up to the first whose
// payload leaves another way: through the bounce buffer (its next chunk only, as one frame
// owns the buffer at a time) or by splice (splice_payload, after its header). Rebuild: a
// device frame's copy failed and it became an empty fault frame; Failed: the connection did.
TcpConnection::BatchResult TcpConnection::build_batch(SendBatch &batch) {
    for (auto &frame : outq_) {
        OutFrame &f = *frame;
        if (batch.n + 2 + f.iov_count > kMaxSendIov) break;
        batch.skip = f.sent;
        batch.push(&f.hdr, sizeof f.hdr);
        if (f.has_ext) batch.push(&f.ext, sizeof f.ext);
        if (f.device) {
            size_t k = push_staged(f, &batch.iov[batch.n]);
            if (k == SIZE_MAX) {
                if (f.sent == 0 && end_with_fault(f)) return BatchResult::Rebuild;
                fail_connection("device memory could not be copied for sending", EIO);
                return BatchResult::Failed;
            }
            batch.n += k;
            if (k) batch.bytes += batch.iov[batch.n - 1].iov_len;
            break;
        }
        if (spliceable(f)) break;  // its payload follows its header by splice_payload()
        for (size_t k = 0; k < f.iov_count; ++k) batch.push(f.iov[k].iov_base, f.iov[k].iov_len);
    }
    return BatchResult::Ready;
}

// `sent` bytes of the queue's front frames left: frames sent whole are retired.
void TcpConnection::account_sent(size_t sent) {
    while (sent && !outq_.empty()) {
        auto &f = *outq_.front();
        size_t take = std::min(sent, f.total - f.sent);
        f.sent += take;
        sent -= take;
        if (f.sent == f.total) retire_sent();
    }
    if (!outq_.empty() && outq_.front()->sent) stop_at("link.frame_partly_sent");
}

bool TcpConnection::flush_send() {
    if (fd_ < 0 || state_ == State::Connecting || state_ == State::Closed) return false;
    while (!outq_.empty()) {
        OutFrame &front = *outq_.front();
        if (front.sent >= front.head() && spliceable(front)) {
            switch (splice_payload(front)) {
                case SpliceResult::Sent:
                    retire_sent();
                    continue;
                case SpliceResult::Refused:
                    front.no_splice = true;  // sendmsg copies it below
                    break;
                case SpliceResult::Blocked:
                case SpliceResult::Failed:
                    return false;
            }
        }
        SendBatch batch;
        const BatchResult built = build_batch(batch);
        if (built == BatchResult::Failed) return false;
        if (built == BatchResult::Rebuild) continue;  // its header changed: build it again
        if (batch.n == 0) break;
        msghdr msg{};
        msg.msg_iov = batch.iov;
        msg.msg_iovlen = batch.n;
        ssize_t sent = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
            if (errno == EINTR) continue;
            fail_connection("send failed", errno);
            return false;
        }
        account_sent(static_cast<size_t>(sent));
        if (static_cast<size_t>(sent) < batch.bytes) return false;  // socket buffer full
    }
    return true;
}

// Large host payloads leave by vmsplice (the pipe takes references to the pages) and splice
// (the socket takes them from the pipe): the sending CPU copies nothing, and on loopback the
// receiver's recv is the only copy. The pages must not change until the peer has read them,
// which the link guarantees: a work request completes only when the peer acknowledges it
// after placing its payload; a rendezvous source, read by the receiver, is the sender's
// until the receiver's Fin. Responses to reads of an application's registrations are not
// spliced (the target may reuse that memory as soon as its FI_REMOTE_READ counter says the
// read is over).
bool TcpConnection::spliceable(const OutFrame &f) const {
    size_t min = transport_->config().splice_min;
    return min && f.hdr.length >= min && !f.device && !f.no_splice && f.inline_copy.empty() &&
           pipe_[0] != -2;
}

bool TcpConnection::fill_rx(size_t want) {
    while (rx_tail_ - rx_head_ < want) {
        if (rx_head_ == rx_tail_) {
            rx_head_ = rx_tail_ = 0;
        } else if (rx_tail_ == rxbuf_.size() || rxbuf_.size() - rx_head_ < want) {
            memmove(rxbuf_.data(), rxbuf_.data() + rx_head_, rx_tail_ - rx_head_);
            rx_tail_ -= rx_head_;
            rx_head_ = 0;
        }
        if (!recv_allowed_) return false;
        size_t space = rxbuf_.size() - rx_tail_;
        ssize_t got = recv(fd_, rxbuf_.data() + rx_tail_, space, MSG_DONTWAIT);
        if (got > 0) {
            if (state_ == State::AwaitingRequest && request_started_ms_ < 0)
                request_started_ms_ = coarse_now_ms();
            rx_tail_ += static_cast<size_t>(got);
            // A short read drained the socket: do not ask again in this pass.
            if (static_cast<size_t>(got) < space) recv_allowed_ = false;
            continue;
        }
        recv_allowed_ = false;
        if (got == 0) {
            fail_connection(nullptr, 0);  // orderly close by the peer
            return false;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) fail_connection("receive failed", errno);
        return false;
    }
    return true;
}

// A Send's payload goes to the oldest posted receive buffer. False: none is posted (stall),
// or the connection failed.
bool TcpConnection::begin_send() {
    dropping_send_ = (cur_.flags & wire::kTcpIfWriteOk) && !last_write_ok_;
    if (dropping_send_) {
        dst_discard_ = true;  // read and dropped: it belonged to the failed write
        return true;
    }
    TcpTransport::PostedRecv posted;
    if (!transport_->take_posted(posted)) return false;
    if (cur_.length > posted.len) {
        // The peer broke the size it was told: a protocol error, as on a verbs QP.
        transport_->post_recv(posted.buf, posted.len, posted.wr_id);
        fail_connection("message larger than the posted receive buffer", EMSGSIZE);
        return false;
    }
    posted_buf_ = posted.buf;
    posted_len_ = posted.len;
    posted_wr_id_ = posted.wr_id;
    dst_iov_.push_back({posted.buf, cur_.length});
    return true;
}

// A read response's payload goes where the read it answers asked for it. False: the
// connection failed (no such read, or the wrong length).
bool TcpConnection::begin_read_response() {
    PendingWr *wr = answered_read();
    if (!wr) {
        fail_connection("read response without a request", EPROTO);
        return false;
    }
    // The response's frames together carry the whole read, the last without
    // kTcpMore; an error status ends it early, with no payload.
    const size_t left = wr->length - wr->read_got;
    const bool more = cur_.flags & wire::kTcpMore;
    bool fits = cur_.status == 0 ? (more ? cur_.length && cur_.length < left : cur_.length == left)
                                 : (cur_.length == 0 && !more);
    if (!fits) {
        fail_connection("read response of the wrong length", EPROTO);
        return false;
    }
    slice_pieces(wr->read_iov.data(), wr->read_mem.empty() ? nullptr : wr->read_mem.data(),
                 wr->read_iov.size(), wr->read_got, cur_.length, dst_iov_, dst_mem_);
    return true;
}

// Decides where the payload of the frame in cur_ goes. Returns false to stall (no posted
// receive buffer yet: the RNR case) without consuming anything more.
bool TcpConnection::begin_frame() {
    dst_iov_.clear();
    dst_mem_.clear();
    dst_discard_ = false;
    payload_done_ = 0;
    cur_status_ = wire::TcpStatus::Ok;
    switch (static_cast<wire::TcpOp>(cur_.op)) {
        case wire::TcpOp::Send:
            return begin_send();
        case wire::TcpOp::Write:
            return begin_write();
        case wire::TcpOp::ReadReq:
            return true;
        case wire::TcpOp::ReadResp:
            return begin_read_response();
        case wire::TcpOp::CmRequest:
        case wire::TcpOp::CmAccept:
        case wire::TcpOp::CmReject:
            if (cur_.length > kMaxCmPayload) {
                fail_connection("oversized connection data", EPROTO);
                return false;
            }
            cm_payload_.resize(cur_.length);
            dst_iov_.push_back({cm_payload_.data(), cur_.length});
            return true;
        case wire::TcpOp::Nak:
        case wire::TcpOp::Ack:
        case wire::TcpOp::Disconnect:
            if (cur_.length != 0) {
                fail_connection("control frame with payload", EPROTO);
                return false;
            }
            return true;
    }
    fail_connection("unknown frame", EPROTO);
    return false;
}

bool TcpConnection::read_payload() {
    const size_t total = cur_.length;
    while (payload_done_ < total) {
        size_t buffered = rx_tail_ - rx_head_;
        size_t remaining = total - payload_done_;
        if (!dst_mem_.empty() && !dst_discard_) {
            if (!receive_staged(remaining)) return false;  // more to come, or failed
            continue;
        }
        if (buffered) {
            size_t take = std::min(buffered, remaining);
            if (!dst_discard_)
                iov_scatter(dst_iov_.data(), dst_iov_.size(), payload_done_,
                            rxbuf_.data() + rx_head_, take);
            rx_head_ += take;
            payload_done_ += take;
            continue;
        }
        if (remaining >= kDirectReadThreshold && !dst_discard_) {
            // Large payload: straight from the socket into its destination.
            iovec iov[kMaxSendIov];
            size_t n = iov_slice(dst_iov_.data(), dst_iov_.size(), payload_done_, remaining, iov,
                                 kMaxSendIov);
            msghdr msg{};
            msg.msg_iov = iov;
            msg.msg_iovlen = n;
            if (!recv_allowed_) return false;
            ssize_t got = recvmsg(fd_, &msg, MSG_DONTWAIT);
            if (got > 0) {
                payload_done_ += static_cast<size_t>(got);
                if (static_cast<size_t>(got) < remaining) recv_allowed_ = false;
                continue;
            }
            recv_allowed_ = false;
            if (got == 0) {
                fail_connection(nullptr, 0);
                return false;
            }
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) fail_connection("receive failed", errno);
            return false;
        }
        if (!fill_rx(1)) return false;
    }
    return true;
}

// A Send has arrived whole: its receive completes (unless it was dropped).
void TcpConnection::finish_send() {
    if (dropping_send_) {
        dropping_send_ = false;
        return;
    }
    WorkCompletion wc{posted_wr_id_,
                      this,
                      WcOpcode::Recv,
                      WcStatus::Success,
                      (cur_.flags & wire::kTcpHasImm) != 0,
                      cur_.imm,
                      cur_.length};
    posted_buf_ = nullptr;
    transport_->push_completion(wc);
}

void TcpConnection::finish_frame() {
    auto op = static_cast<wire::TcpOp>(cur_.op);
    switch (op) {
        case wire::TcpOp::Send:
            finish_send();
            break;
        case wire::TcpOp::Write:
            if (!finish_write()) {  // more frames of it to come: no work request yet
                complete_acked(cur_.ack);
                return;
            }
            break;
        case wire::TcpOp::ReadReq:
            serve_read_request();
            break;
        case wire::TcpOp::ReadResp:
            if (PendingWr *wr = answered_read()) {  // (begin_frame found it)
                wr->read_got += cur_.length;
                if (cur_.status != 0 || !(cur_.flags & wire::kTcpMore)) {
                    wr->read_done = true;
                    wr->status = status_from_wire(cur_.status);
                }
            }
            break;
        case wire::TcpOp::Nak:
            for (auto &wr : pending_) {
                if (wr.seq == cur_.imm) {
                    wr.status = status_from_wire(cur_.status);
                    if (wr.status == WcStatus::Success) wr.status = WcStatus::RemoteInvalid;
                    break;
                }
            }
            break;
        case wire::TcpOp::Ack:
            break;
        case wire::TcpOp::Disconnect:
            complete_acked(cur_.ack);  // what the peer received before it left did arrive
            fail_connection(nullptr, 0);
            return;
        case wire::TcpOp::CmRequest:
        case wire::TcpOp::CmAccept:
        case wire::TcpOp::CmReject:
            handle_cm_frame();
            return;
    }
    if (op_is_wr(op)) ++rx_count_;
    complete_acked(cur_.ack);
}

// The read a ReadResp answers: the oldest one whose response is not complete (responses come
// in posting order).
TcpConnection::PendingWr *TcpConnection::answered_read() {
    for (auto &wr : pending_)
        if (wr.opcode == WcOpcode::Read && !wr.read_done) return &wr;
    return nullptr;
}

void TcpConnection::complete_acked(uint32_t ack) {
    while (!pending_.empty()) {
        PendingWr &wr = pending_.front();
        if (wr.opcode == WcOpcode::Read) {
            if (!wr.read_done) break;
        } else if (static_cast<int32_t>(ack - wr.seq) <= 0) {
            break;
        }
        transport_->push_completion({wr.wr_id, this, wr.opcode, wr.status, false, 0, wr.length});
        pending_.pop_front();
    }
}

void TcpConnection::read_frames() {
    bool stalled = false;
    while (state_ != State::Closed && !stalled) {
        switch (phase_) {
            case RxPhase::Header: {
                if (!fill_rx(sizeof cur_)) return;
                memcpy(&cur_, rxbuf_.data() + rx_head_, sizeof cur_);
                rx_head_ += sizeof cur_;
                auto op = static_cast<wire::TcpOp>(cur_.op);
                if (cur_.op < static_cast<uint8_t>(wire::TcpOp::Send) ||
                    cur_.op > static_cast<uint8_t>(wire::TcpOp::Disconnect)) {
                    fail_connection("unknown frame type", EPROTO);
                    return;
                }
                bool cm = op == wire::TcpOp::CmRequest || op == wire::TcpOp::CmAccept ||
                          op == wire::TcpOp::CmReject;
                if (cm != (state_ == State::AwaitingRequest || state_ == State::RequestSent)) {
                    fail_connection("frame out of connection order", EPROTO);
                    return;
                }
                phase_ = op_has_extension(op) ? RxPhase::Extension : RxPhase::Payload;
                if (phase_ == RxPhase::Payload && !begin_frame()) {
                    phase_ = RxPhase::Extension;  // re-run begin_frame when a buffer comes
                    cur_ext_ = {};
                    stalled = true;
                    dst_iov_.clear();
                    // Mark that the extension is already consumed.
                    pending_ext_consumed_ = true;
                }
                break;
            }
            case RxPhase::Extension: {
                if (!pending_ext_consumed_) {
                    if (!fill_rx(sizeof cur_ext_)) return;
                    memcpy(&cur_ext_, rxbuf_.data() + rx_head_, sizeof cur_ext_);
                    rx_head_ += sizeof cur_ext_;
                    pending_ext_consumed_ = true;
                }
                if (!begin_frame()) {
                    stalled = true;
                    break;
                }
                pending_ext_consumed_ = false;
                phase_ = RxPhase::Payload;
                break;
            }
            case RxPhase::Payload:
                if (!read_payload()) return;
                phase_ = RxPhase::Header;
                finish_frame();
                break;
        }
    }
}

}  // namespace tandem
