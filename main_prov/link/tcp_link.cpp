// The TCP link's connection (tcp_link.h): construction, the frame pool, work requests posted
// by the protocol, acknowledgements, a progress pass over one socket, and failure. Beside it:
// tcp_framing.cpp (frames to and from the socket), tcp_served_rma.cpp (RMA at the target),
// tcp_splice.cpp and tcp_device_staging.cpp (payload by splice, device memory through bounce
// buffers), tcp_connect.cpp (connection requests and answers, disconnection, the transport's
// connections), tcp_listener.cpp (accepting them) and tcp_transport.cpp (the transport).
#include "main_prov/link/tcp_link.h"
#include "main_prov/link/tcp_link_internal.h"

#include "common/coarse_clock.h"
#include "common/iov.h"
#include "common/log.h"
#include "common/test_hook.h"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tandem {

namespace {

constexpr size_t kRxBufferSize = 64 * 1024;
constexpr uint32_t kAckEvery = 32;
constexpr uint32_t kAckIdlePasses = 4;

}  // namespace

TcpConnection::TcpConnection(TcpTransport *transport, int fd, State state)
    : transport_(transport), fd_(fd), state_(state), rxbuf_(kRxBufferSize) {
    if (state == State::AwaitingRequest) {
        unannounced_ = true;
        accepted_ms_ = coarse_now_ms();
    }
}

TcpConnection::~TcpConnection() {
    if (fd_ >= 0) close(fd_);
    close_pipe();
}

sockaddr_storage TcpConnection::peer_address() const {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (fd_ >= 0) getpeername(fd_, reinterpret_cast<sockaddr *>(&ss), &len);
    return ss;
}

sockaddr_storage TcpConnection::local_address() const {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (fd_ >= 0) getsockname(fd_, reinterpret_cast<sockaddr *>(&ss), &len);
    return ss;
}

// Frames are reused: one is as large as its scatter lists (about 1 KiB), and a new one per
// message would cost an allocation and a kilobyte of zeroing on the latency path.
TcpConnection::FramePtr TcpConnection::new_frame() {
    if (spare_frames_.empty()) return std::make_unique<OutFrame>();
    FramePtr f = std::move(spare_frames_.back());
    spare_frames_.pop_back();
    f->reset();
    return f;
}

// The front frame has left entirely (not dropped by a failed connection).
void TcpConnection::retire_sent() {
    const OutFrame &f = *outq_.front();
    if (f.counts_remote_read)
        transport_->resolver()->remote_access_done(f.read_key, FI_REMOTE_READ);
    retire_front();
}

void TcpConnection::retire_front() {
    if (spare_frames_.size() < kSpareFrames) spare_frames_.push_back(std::move(outq_.front()));
    outq_.pop_front();
}

TcpConnection::FramePtr TcpConnection::make_frame(wire::TcpOp op, const iovec *iov,
                                                  const hmem::MemRef *mem, size_t count,
                                                  bool copy_payload) {
    FramePtr frame = new_frame();
    OutFrame &f = *frame;
    f.hdr.op = static_cast<uint8_t>(op);
    size_t len = iov_length(iov, count);
    f.hdr.length = len;
    // (Device payload is never copied here: it is staged chunk by chunk as it is sent.)
    if (copy_payload && len && hmem::all_host(mem, count)) {
        f.inline_copy.resize(len);
        iov_gather(f.inline_copy.data(), iov, count, 0, len);
        f.iov[f.iov_count++] = {f.inline_copy.data(), len};
    } else {
        for (size_t i = 0; i < count; ++i) {
            if (!iov[i].iov_len) continue;
            if (mem && !mem[i].on_host()) f.device = true;
            f.mem[f.iov_count] = mem ? mem[i] : hmem::kHost;
            f.iov[f.iov_count++] = iov[i];
        }
    }
    if (f.device) f.serial = next_serial_++;
    return frame;
}

// The acknowledgement a frame carries is fixed when it is queued: a Nak or ReadResp queued
// while handling request s then carries ack = s, so the initiator learns the outcome of s
// before any acknowledgement that covers it.
void TcpConnection::queue_frame(FramePtr frame) {
    frame->hdr.ack = rx_count_;
    acked_sent_ = rx_count_;
    frame->total = frame->head() + frame->hdr.length;
    outq_.push_back(std::move(frame));
}

int TcpConnection::queue_wr(FramePtr frame, uint64_t wr_id, WcOpcode opcode,
                            std::vector<iovec> read_iov, std::vector<hmem::MemRef> read_mem,
                            size_t length) {
    if (state_ != State::Established) return -FI_ENOTCONN;
    frame->counts_as_wr = true;
    PendingWr wr;
    wr.wr_id = wr_id;
    wr.seq = next_seq_++;
    wr.opcode = opcode;
    wr.read_iov = std::move(read_iov);
    wr.read_mem = std::move(read_mem);
    wr.length = length;
    pending_.push_back(std::move(wr));
    queue_frame(std::move(frame));
    // Send right away when the queue was empty: the common case of a latency-bound exchange.
    if (outq_.size() == 1) flush_send();
    return FI_SUCCESS;
}

int TcpConnection::post_send(const iovec *iov, size_t count, const uint32_t *imm, uint64_t wr_id,
                             bool if_write_ok) {
    size_t len = iov_length(iov, count);
    if (len > transport_->caps().max_send_size || count > transport_->caps().max_sge)
        return count > transport_->caps().max_sge ? -FI_EINVAL : -FI_EMSGSIZE;
    FramePtr f =
        make_frame(wire::TcpOp::Send, iov, nullptr, count, len <= transport_->caps().max_inline);
    if (imm) {
        f->hdr.flags |= wire::kTcpHasImm;
        f->hdr.imm = *imm;
    }
    if (if_write_ok) f->hdr.flags |= wire::kTcpIfWriteOk;
    return queue_wr(std::move(f), wr_id, WcOpcode::Send, {}, {}, len);
}

// A small send on an idle connection goes to the socket from the caller's buffers in one
// sendmsg, before any frame is made: no copy, no queue. What the socket does not take at once
// (rare: a full send buffer) is copied into a frame that waits at the head of the queue, as
// the rest of a frame flush_send had begun. The work request is the peer's to acknowledge
// like any other.
int TcpConnection::post_send_now(const iovec *iov, size_t count, uint64_t wr_id) {
    constexpr size_t kMaxNowIov = 4;
    if (state_ != State::Established || !outq_.empty() || count > kMaxNowIov) return -FI_EAGAIN;
    const size_t len = iov_length(iov, count);
    if (len > transport_->caps().max_send_now) return -FI_EAGAIN;
    wire::TcpFrame hdr{};
    hdr.op = static_cast<uint8_t>(wire::TcpOp::Send);
    hdr.ack = rx_count_;
    hdr.length = len;
    // A small frame goes as one contiguous buffer: each iovec costs the kernel more than
    // copying a few hundred bytes here.
    constexpr size_t kGatherMax = 256;
    alignas(8) uint8_t gathered[sizeof hdr + kGatherMax];
    iovec out[1 + kMaxNowIov];
    msghdr msg{};
    msg.msg_iov = out;
    if (len <= kGatherMax) {
        memcpy(gathered, &hdr, sizeof hdr);
        iov_gather(gathered + sizeof hdr, iov, count, 0, len);
        out[0] = {gathered, sizeof hdr + len};
        msg.msg_iovlen = 1;
    } else {
        out[0] = {&hdr, sizeof hdr};
        std::copy(iov, iov + count, out + 1);
        msg.msg_iovlen = 1 + count;
    }
    const ssize_t sent = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    // Nothing sent (a full socket, a signal, a failed connection): the ordinary path queues
    // the frame and meets the same condition in flush_send, which handles each.
    if (sent <= 0) return -FI_EAGAIN;
    acked_sent_ = rx_count_;
    PendingWr wr;
    wr.wr_id = wr_id;
    wr.seq = next_seq_++;
    wr.opcode = WcOpcode::Send;
    wr.length = len;
    pending_.push_back(std::move(wr));
    if (static_cast<size_t>(sent) < sizeof hdr + len) {
        FramePtr f = make_frame(wire::TcpOp::Send, iov, nullptr, count, true);
        f->hdr = hdr;
        f->counts_as_wr = true;
        f->total = f->head() + len;
        f->sent = static_cast<size_t>(sent);
        outq_.push_back(std::move(f));
        stop_at("link.frame_partly_sent");
    }
    return FI_SUCCESS;
}

int TcpConnection::post_write(const iovec *iov, const hmem::MemRef *mem, size_t count,
                              RemoteRegion dst, const uint32_t *imm, uint64_t wr_id) {
    size_t len = iov_length(iov, count);
    if (len > transport_->caps().max_rdma_size || count > transport_->caps().max_sge)
        return -FI_EMSGSIZE;
    if (!hmem::all_host(mem, count)) return post_device_write(iov, mem, count, dst, imm, wr_id);
    FramePtr f =
        make_frame(wire::TcpOp::Write, iov, mem, count, len <= transport_->caps().max_inline);
    f->has_ext = true;
    f->ext = {dst.addr, dst.key, len};
    if (imm) {
        f->hdr.flags |= wire::kTcpHasImm;
        f->hdr.imm = *imm;
    }
    return queue_wr(std::move(f), wr_id, WcOpcode::Write, {}, {}, len);
}

int TcpConnection::post_read(const iovec *iov, const hmem::MemRef *mem, size_t count,
                             RemoteRegion src, uint64_t wr_id) {
    size_t len = iov_length(iov, count);
    if (len > transport_->caps().max_rdma_size || count > transport_->caps().max_sge)
        return -FI_EMSGSIZE;
    FramePtr f = make_frame(wire::TcpOp::ReadReq, nullptr, nullptr, 0, false);
    f->has_ext = true;
    f->ext = {src.addr, src.key, len};
    std::vector<hmem::MemRef> read_mem;
    if (!hmem::all_host(mem, count)) read_mem.assign(mem, mem + count);
    return queue_wr(std::move(f), wr_id, WcOpcode::Read, std::vector<iovec>(iov, iov + count),
                    std::move(read_mem), len);
}

// A local disconnect closes gracefully: once everything queued (the Disconnect frame last) is
// written, the sending half is shut and the connection keeps reading until the peer closes
// too. Closing at once could reset the connection and lose frames the peer has not read yet
// (a rendezvous Fin, say).
void TcpConnection::finish_disconnect() {
    if (!disconnect_requested_ || !outq_.empty() || fd_ < 0) return;
    if (!write_shut_) {
        shutdown(fd_, SHUT_WR);
        write_shut_ = true;
    }
}

void TcpConnection::maybe_send_ack() {
    if (state_ != State::Established || !outq_.empty()) return;
    if (rx_count_ == acked_sent_) return;
    queue_frame(make_frame(wire::TcpOp::Ack, nullptr, nullptr, 0, false));
    flush_send();
}

void TcpConnection::acknowledge_all() {
    if (state_ != State::Established || rx_count_ == acked_sent_) return;
    // Behind frames already queued if need be: they carry the acknowledgement of when they
    // were queued, older than this one.
    queue_frame(make_frame(wire::TcpOp::Ack, nullptr, nullptr, 0, false));
    flush_send();
}

void TcpConnection::progress(bool readable) {
    if (state_ == State::Closed) return;
    if (state_ == State::Connecting) {
        pollfd pfd{fd_, POLLOUT, 0};
        if (::poll(&pfd, 1, 0) <= 0) return;
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            fail_connection("connect failed", err);
            return;
        }
        state_ = State::RequestSent;
        transport_->choose_congestion(fd_);
    }
    if (!outq_.empty()) flush_send();
    uint32_t before = rx_count_;
    recv_allowed_ = readable;
    if (readable || rx_tail_ > rx_head_ || phase_ != RxPhase::Header) read_frames();
    if (state_ == State::Closed) return;
    idle_passes_ = rx_count_ == before ? idle_passes_ + 1 : 0;
    // Acknowledgements ride on our own traffic. Send one explicitly when many are owed, or
    // when the peer has sent nothing for a few passes (it may be waiting for them).
    if (rx_count_ != acked_sent_ &&
        (rx_count_ - acked_sent_ >= kAckEvery || idle_passes_ >= kAckIdlePasses))
        maybe_send_ack();
    // A write's acknowledgement leaves in the pass that ended it, behind frames already queued
    // if need be: an application that received what it waited for (the message announcing the
    // write, say) may stop calling, and the initiator would wait for ever. One frame per pass.
    if (write_ended_ && rx_count_ != acked_sent_ && state_ == State::Established)
        queue_frame(make_frame(wire::TcpOp::Ack, nullptr, nullptr, 0, false));
    write_ended_ = false;
    if (!outq_.empty()) flush_send();
    finish_disconnect();
}

void TcpConnection::flush_pending() {
    for (auto &wr : pending_)
        transport_->push_completion({wr.wr_id, this, wr.opcode, WcStatus::Flushed, false, 0, 0});
    pending_.clear();
    while (!outq_.empty()) retire_front();
    if (posted_buf_) {
        transport_->post_recv(posted_buf_, posted_len_, posted_wr_id_);
        posted_buf_ = nullptr;
    }
}

void TcpConnection::fail_connection(const char *why, int err) {
    if (state_ == State::Closed) return;
    State was = state_;
    if (why) TANDEM_WARN(FI_LOG_EP_CTRL, "connection closed: %s: %s\n", why, strerror(err));
    state_ = State::Closed;
    if (fd_ >= 0) {
        shutdown(fd_, SHUT_RDWR);
        close(fd_);
        fd_ = -1;
    }
    if (pipe_[0] >= 0) close_pipe();
    flush_pending();
    if (reported_down_) return;
    reported_down_ = true;
    switch (was) {
        case State::Connecting:
        case State::RequestSent:
            transport_->push_cm({CmEventType::Unreachable, this, {}});
            break;
        case State::Established:
        case State::RequestReceived:
            transport_->push_cm({CmEventType::Disconnected, this, {}});
            break;
        default:
            break;
    }
}

}  // namespace tandem
