#include "main_prov/link/tcp_link.h"

#include "common/fabric_error.h"
#include "common/coarse_clock.h"
#include "common/iov.h"
#include "common/log.h"
#include "common/test_hook.h"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <ctime>

namespace tandem {

namespace {

constexpr size_t kRxBufferSize = 64 * 1024;
constexpr size_t kDirectReadThreshold = 16 * 1024;
constexpr size_t kMaxSendIov = 64;
// Device payload moves through host bounce buffers in chunks of this size: the copy of one
// chunk overlaps the socket sending the one before.
constexpr size_t kStageChunk = 256 * 1024;
// Frames kept for reuse per connection (beyond, finished frames are freed).
constexpr size_t kSpareFrames = 64;
constexpr uint32_t kAckEvery = 32;
constexpr uint32_t kAckIdlePasses = 4;
// Up to this many connections a pass tries recv() on each; beyond, one epoll_wait tells
// which sockets are readable.
constexpr size_t kDirectPollConnections = 2;
constexpr uint64_t kListenerCheckPasses = 1024;
constexpr uint64_t kMaxCmPayload = sizeof(wire::TcpCmHello) + 4096;

bool op_has_extension(wire::TcpOp op) {
    return op == wire::TcpOp::Write || op == wire::TcpOp::ReadReq;
}

bool op_is_wr(wire::TcpOp op) {
    return op == wire::TcpOp::Send || op == wire::TcpOp::Write || op == wire::TcpOp::ReadReq;
}

void set_socket_options(int fd, const TcpLinkConfig &config) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (config.socket_buffer) {
        int size = static_cast<int>(config.socket_buffer);
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    }
    // A peer host that vanishes (power, cable, a partition) sends no reset: without a bound
    // the kernel retransmits for about 15 minutes, and an idle connection, on which the other
    // side may still owe us a rendezvous read or an acknowledgement, never fails at all. Data
    // unacknowledged for timeout_ms fails the socket (ETIMEDOUT); an idle one is probed from
    // timeout/2 on, and the same bound applies to the probes (Linux counts TCP_USER_TIMEOUT
    // against unanswered keepalives too). The peer's kernel answers both whatever its
    // application is doing, so a process that simply makes no progress calls is not failed.
    if (config.timeout_ms) {
        unsigned timeout = config.timeout_ms;
        int idle = std::max(1u, timeout / 2000), interval = std::max(1u, timeout / 4000), count = 4;
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, sizeof timeout);
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    }
}

// The two ends of a connected socket are in this host (and network namespace): the peer is
// a loopback address, or the kernel gave the connection the peer's own address as its source.
bool same_host(int fd) {
    sockaddr_storage self{}, peer{};
    socklen_t self_len = sizeof self, peer_len = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&self), &self_len) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &peer_len) != 0 ||
        self.ss_family != peer.ss_family)
        return false;
    if (peer.ss_family == AF_INET) {
        auto &a = reinterpret_cast<const sockaddr_in &>(self).sin_addr;
        auto &b = reinterpret_cast<const sockaddr_in &>(peer).sin_addr;
        return (ntohl(b.s_addr) >> 24) == IN_LOOPBACKNET || a.s_addr == b.s_addr;
    }
    if (peer.ss_family == AF_INET6) {
        auto &a = reinterpret_cast<const sockaddr_in6 &>(self).sin6_addr;
        auto &b = reinterpret_cast<const sockaddr_in6 &>(peer).sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(&b) || memcmp(&a, &b, sizeof a) == 0;
    }
    return false;
}

// Bytes [from, from + len) of a scatter list, with where each piece lives when `mem` is given
// (out_mem stays empty otherwise: host memory).
void slice_pieces(const iovec *iov, const hmem::MemRef *mem, size_t count, size_t from, size_t len,
                  std::vector<iovec> &out_iov, std::vector<hmem::MemRef> &out_mem) {
    out_iov.clear();
    out_mem.clear();
    iov_walk(iov, count, from, len, [&](size_t i, uint8_t *ptr, size_t n) {
        out_iov.push_back({ptr, n});
        if (mem) out_mem.push_back(mem[i]);
        return true;
    });
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

// ----------------------------------------------------------------------------------------
// TcpConnection

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

// A write from device memory goes, like a read response from it, in frames of at most one
// bounce chunk, each copied to the host before its header leaves: Write frames to
// consecutive ranges of the target, all but the last with kTcpMore, the immediate data on
// the last. Together they are one work request. Should a copy fail, the frame that could not
// be filled ends the write empty, with SourceFault (end_with_fault).
int TcpConnection::post_device_write(const iovec *iov, const hmem::MemRef *mem, size_t count,
                                     RemoteRegion dst, const uint32_t *imm, uint64_t wr_id) {
    if (state_ != State::Established) return -FI_ENOTCONN;
    const size_t length = iov_length(iov, count);
    std::vector<FramePtr> frames = device_chunks(wire::TcpOp::Write, iov, mem, count, length);
    size_t offset = 0;
    for (auto &f : frames) {
        f->has_ext = true;
        f->ext = {dst.addr + offset, dst.key, length - offset};
        f->wr_seq = next_seq_;
        offset += f->hdr.length;
    }
    FramePtr last = std::move(frames.back());
    frames.pop_back();
    if (imm) {
        last->hdr.flags |= wire::kTcpHasImm;
        last->hdr.imm = *imm;
    }
    for (auto &f : frames) queue_frame(std::move(f));
    return queue_wr(std::move(last), wr_id, WcOpcode::Write, {}, {}, length);
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

void TcpConnection::send_cm_request(const void *priv, size_t len) {
    wire::TcpCmHello hello{wire::kTcpMagic, wire::kTcpVersion, 0, static_cast<uint32_t>(len), 0};
    iovec iov[2] = {{&hello, sizeof hello}, {const_cast<void *>(priv), len}};
    queue_frame(make_frame(wire::TcpOp::CmRequest, iov, nullptr, len ? 2 : 1, true));
}

int TcpConnection::accept(const void *priv, size_t len) {
    if (state_ != State::RequestReceived) return -FI_EINVAL;
    if (len > wire::kMaxCmPrivate) return -FI_EINVAL;
    iovec iov{const_cast<void *>(priv), len};
    queue_frame(make_frame(wire::TcpOp::CmAccept, &iov, nullptr, len ? 1 : 0, true));
    state_ = State::Established;
    flush_send();
    transport_->push_cm({CmEventType::Established, this, {}});
    return FI_SUCCESS;
}

int TcpConnection::reject(const void *priv, size_t len) {
    if (state_ != State::RequestReceived) return -FI_EINVAL;
    if (len > wire::kMaxCmPrivate) return -FI_EINVAL;
    iovec iov{const_cast<void *>(priv), len};
    queue_frame(make_frame(wire::TcpOp::CmReject, &iov, nullptr, len ? 1 : 0, true));
    disconnect_requested_ = true;
    reported_down_ = true;  // the application already knows: it rejected
    rejected_ = true;
    transport_->note_rejected();
    flush_send();
    return FI_SUCCESS;
}

void TcpConnection::disconnect() {
    if (state_ == State::Closed || disconnect_requested_) return;
    if (state_ == State::Established) {
        queue_frame(make_frame(wire::TcpOp::Disconnect, nullptr, nullptr, 0, false));
        flush_send();
    }
    disconnect_requested_ = true;
    reported_down_ = true;  // the local side asked for it: no Disconnected event to itself
    if (state_ != State::Established && state_ != State::RequestReceived)
        fail_connection(nullptr, 0);
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

// A read response from device memory goes in frames of at most one bounce chunk, each copied
// to the host before its header leaves: should a copy fail, the frames sent so far are whole
// and the next one can still say so (end_with_fault), where a single frame would
// have announced bytes it cannot deliver and left only failing the connection.
void TcpConnection::queue_device_read_response(const LocalPieces &pieces, uint64_t key,
                                               size_t length) {
    std::vector<FramePtr> frames =
        device_chunks(wire::TcpOp::ReadResp, pieces.iov, pieces.mem, pieces.count, length);
    // The remote read is over, for the counter, when its last frame has left.
    if (pieces.application) {
        frames.back()->counts_remote_read = true;
        frames.back()->read_key = key;
    }
    for (auto &f : frames) queue_frame(std::move(f));
}

// Frames `op` of at most one bounce chunk each over bytes [0, length) of a scatter list in
// device memory, all but the last with kTcpMore, sharing one number (OutFrame::response).
std::vector<TcpConnection::FramePtr> TcpConnection::device_chunks(wire::TcpOp op, const iovec *iov,
                                                                  const hmem::MemRef *mem,
                                                                  size_t count, size_t length) {
    const uint64_t group = next_serial_++;
    std::vector<FramePtr> frames;
    size_t offset = 0;
    do {
        size_t len = std::min(kStageChunk, length - offset);
        FramePtr frame = new_frame();
        OutFrame &f = *frame;
        f.hdr.op = static_cast<uint8_t>(op);
        f.hdr.length = len;
        if (offset + len < length) f.hdr.flags |= wire::kTcpMore;
        iov_walk(iov, count, offset, len, [&](size_t i, uint8_t *ptr, size_t n) {
            f.mem[f.iov_count] = mem[i];
            f.iov[f.iov_count++] = {ptr, n};
            return true;
        });
        f.device = !hmem::all_host(f.mem, f.iov_count);
        f.serial = next_serial_++;
        f.response = group;
        frames.push_back(std::move(frame));
        offset += len;
    } while (offset < length);
    return frames;
}

// The device copy for frame `f` of a read response or a write failed before any of it was
// sent: it becomes the last frame of its response or write, empty, with SourceFault, and the
// frames of it behind go. The reader's read fails; our write fails here, and the target
// counts it as a work request that wrote what its earlier frames carried.
bool TcpConnection::end_with_fault(OutFrame &f) {
    const auto op = static_cast<wire::TcpOp>(f.hdr.op);
    if ((op != wire::TcpOp::ReadResp && op != wire::TcpOp::Write) || f.response == 0) return false;
    TANDEM_WARN(FI_LOG_EP_DATA, "device memory could not be copied for %s\n",
                op == wire::TcpOp::Write ? "a write: it fails"
                                         : "a read response: the reader's read fails");
    if (op == wire::TcpOp::Write) {
        for (auto &wr : pending_)
            if (wr.seq == f.wr_seq) wr.status = WcStatus::LocalFault;
        f.hdr.flags &= ~wire::kTcpHasImm;
        f.ext.length = 0;
    }
    const uint64_t response = f.response;
    for (auto it = outq_.begin(); it != outq_.end();) {
        OutFrame &later = **it;
        if (&later != &f && later.response == response) {
            if (spare_frames_.size() < kSpareFrames) spare_frames_.push_back(std::move(*it));
            it = outq_.erase(it);
        } else {
            ++it;
        }
    }
    f.hdr.status = static_cast<uint8_t>(wire::TcpStatus::SourceFault);
    f.hdr.flags &= ~wire::kTcpMore;
    f.hdr.length = 0;
    f.iov_count = 0;
    f.device = f.counts_remote_read = false;
    f.total = f.head();
    return true;
}

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

// Moves the payload of the front frame (its header is sent) into the socket. Sent: all of
// it is in the socket; Blocked: the socket is full (the rest waits in the pipe or the
// frame); Failed: the connection failed; Refused: vmsplice cannot take these pages (nothing
// of the frame is in the pipe then), the caller sends them by copy.
TcpConnection::SpliceResult TcpConnection::splice_payload(OutFrame &f) {
    if (pipe_[0] < 0) {
        if (pipe2(pipe_, O_NONBLOCK | O_CLOEXEC) != 0) {
            TANDEM_INFO(FI_LOG_EP_DATA, "no pipe for splice (%s): payloads are copied\n",
                        strerror(errno));
            pipe_[0] = pipe_[1] = -2;  // do not try again on this connection
            return SpliceResult::Refused;
        }
        // The pipe keeps its default capacity (64 KiB): 256 KiB and 1 MiB measured no faster
        // on loopback, and the user's pipe quota counts capacity across all connections.
    }
    const size_t head = f.head();
    while (f.sent < f.total) {
        if (pipe_bytes_ == 0) {
            iovec iov[OutFrame::kMaxPayloadIov];
            size_t n = iov_slice(f.iov, f.iov_count, f.sent - head, f.total - f.sent, iov,
                                 OutFrame::kMaxPayloadIov);
            ssize_t got = vmsplice(pipe_[1], iov, n, SPLICE_F_NONBLOCK);
            if (got <= 0) {
                if (got < 0 && errno == EINTR) continue;
                // Pages vmsplice cannot pin (say, a special mapping): copy them instead, once
                // this frame's bytes are out of the pipe (none are: it was empty).
                TANDEM_DEBUG(FI_LOG_EP_DATA, "vmsplice refused %zu bytes (%s): copying\n",
                             f.total - f.sent, got < 0 ? strerror(errno) : "no progress");
                return SpliceResult::Refused;
            }
            pipe_bytes_ = static_cast<size_t>(got);
        }
        ssize_t moved =
            splice(pipe_[0], nullptr, fd_, nullptr, pipe_bytes_, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (moved < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return SpliceResult::Blocked;
            fail_connection("splice to the socket failed", errno);
            return SpliceResult::Failed;
        }
        pipe_bytes_ -= static_cast<size_t>(moved);
        f.sent += static_cast<size_t>(moved);
    }
    return SpliceResult::Sent;
}

// Drops whatever page references the pipe still holds (the connection is gone).
void TcpConnection::close_pipe() {
    for (int &fd : pipe_) {
        if (fd >= 0) close(fd);
        fd = -1;
    }
    pipe_bytes_ = 0;
}

// The next chunk of a device frame's payload, copied to the bounce buffer unless it is there
// already (a previous sendmsg took part of it): 1 iovec, 0 when the payload is all sent, or
// SIZE_MAX when the device copy failed.
size_t TcpConnection::push_staged(OutFrame &f, iovec *out) {
    size_t head = f.head();
    size_t done = f.sent > head ? f.sent - head : 0;
    if (done >= f.hdr.length) return 0;
    if (stage_owner_ != f.serial || done < f.stage_begin || done >= f.stage_end) {
        size_t n = std::min(kStageChunk, static_cast<size_t>(f.hdr.length) - done);
        if (stage_tx_.size() < n) stage_tx_.resize(kStageChunk);
        if (hmem::gather(stage_tx_.data(), f.iov, f.mem, f.iov_count, done, n) !=
            static_cast<ssize_t>(n))
            return SIZE_MAX;
        stage_owner_ = f.serial;
        f.stage_begin = done;
        f.stage_end = done + n;
    }
    *out = {stage_tx_.data() + (done - f.stage_begin), f.stage_end - done};
    return 1;
}

// A device destination: a chunk from the socket into the bounce buffer, then to the device.
bool TcpConnection::receive_staged(size_t remaining) {
    size_t want = std::min(kStageChunk, remaining);
    if (stage_rx_.size() < want) stage_rx_.resize(kStageChunk);
    size_t got = 0;
    // Bytes already buffered first, then the socket.
    size_t buffered = std::min(rx_tail_ - rx_head_, want);
    memcpy(stage_rx_.data(), rxbuf_.data() + rx_head_, buffered);
    rx_head_ += buffered;
    got = buffered;
    while (got < want && recv_allowed_) {
        ssize_t r = recv(fd_, stage_rx_.data() + got, want - got, MSG_DONTWAIT);
        if (r > 0) {
            got += static_cast<size_t>(r);
            continue;
        }
        recv_allowed_ = false;
        if (r == 0) {
            fail_connection(nullptr, 0);
            return false;
        }
        if (errno == EINTR) {
            recv_allowed_ = true;
            continue;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            fail_connection("receive failed", errno);
            return false;
        }
    }
    if (got && hmem::scatter(dst_iov_.data(), dst_mem_.data(), dst_iov_.size(), payload_done_,
                             stage_rx_.data(), got) != static_cast<ssize_t>(got)) {
        if (cur_.op != static_cast<uint8_t>(wire::TcpOp::Write)) {
            fail_connection("received data could not be copied to device memory", EIO);
            return false;
        }
        // A write into our device memory whose copy failed: the rest of it is read and
        // dropped, and the initiator is answered with a Nak (its write fails with FI_EIO,
        // as IBV_WC_REM_OP_ERR); the connection stays up.
        TANDEM_WARN(FI_LOG_EP_DATA, "a write could not be copied to device memory\n");
        cur_status_ = wire::TcpStatus::TargetFault;
        dst_discard_ = true;
    }
    payload_done_ += got;
    return got == want;
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

// A write's frame: checked whole, then its payload goes to the region its key names (or is
// discarded, refused). False: no receive buffer for its immediate data yet (stall), or the
// connection failed.
bool TcpConnection::begin_write() {
    // ext.length is the rest of the write from ext.addr: this frame's payload, or
    // more when further frames (kTcpMore) follow.
    const bool fault = cur_.status == static_cast<uint8_t>(wire::TcpStatus::SourceFault);
    const bool more = cur_.flags & wire::kTcpMore;
    bool well_formed =
        fault ? !cur_.length && !cur_ext_.length &&
                    !(cur_.flags & (wire::kTcpMore | wire::kTcpHasImm))
              : cur_.status == 0 && (more ? cur_.length && cur_.length < cur_ext_.length &&
                                                !(cur_.flags & wire::kTcpHasImm)
                                          : cur_.length == cur_ext_.length);
    if (!well_formed) {
        fail_connection("malformed write", EPROTO);
        return false;
    }
    stop_at("link.write_received");
    if (fault) {
        cur_status_ = wire::TcpStatus::SourceFault;
        dst_discard_ = true;
        return true;
    }
    if (cur_.flags & wire::kTcpHasImm) {
        TcpTransport::PostedRecv posted;
        if (!transport_->take_posted(posted)) return false;
        posted_buf_ = posted.buf;
        posted_len_ = posted.len;
        posted_wr_id_ = posted.wr_id;
    }
    // The whole rest of the write is checked, so that a write refused anywhere
    // writes nothing, and once a frame of it is refused the rest is discarded.
    LocalPieces pieces;
    if (write_status_ != wire::TcpStatus::Ok) {
        cur_status_ = write_status_;
        dst_discard_ = true;
    } else if (!transport_->resolver()->resolve(cur_ext_.key, cur_ext_.addr, cur_ext_.length,
                                                FI_REMOTE_WRITE, pieces)) {
        cur_status_ = wire::TcpStatus::RemoteAccess;
        dst_discard_ = true;
    } else {
        bool host = hmem::all_host(pieces.mem, pieces.count);
        slice_pieces(pieces.iov, host ? nullptr : pieces.mem, pieces.count, 0, cur_.length,
                     dst_iov_, dst_mem_);
    }
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

void TcpConnection::handle_cm_frame() {
    auto op = static_cast<wire::TcpOp>(cur_.op);
    if (op == wire::TcpOp::CmRequest) {
        wire::TcpCmHello hello{};
        if (state_ != State::AwaitingRequest || cm_payload_.size() < sizeof hello) {
            fail_connection("unexpected connection request", EPROTO);
            return;
        }
        memcpy(&hello, cm_payload_.data(), sizeof hello);
        if (hello.magic != wire::kTcpMagic || hello.version != wire::kTcpVersion ||
            hello.priv_len != cm_payload_.size() - sizeof hello) {
            fail_connection("connection request from an incompatible peer", EPROTO);
            return;
        }
        stop_at("link.request_received");
        state_ = State::RequestReceived;
        unannounced_ = false;
        transport_->push_cm(
            {CmEventType::ConnectRequest, this,
             std::vector<uint8_t>(cm_payload_.begin() + sizeof hello, cm_payload_.end())});
        return;
    }
    if (state_ != State::RequestSent) {
        fail_connection("unexpected connection answer", EPROTO);
        return;
    }
    if (op == wire::TcpOp::CmAccept) {
        state_ = State::Established;
        transport_->push_cm({CmEventType::Established, this, cm_payload_});
        return;
    }
    // CmReject
    transport_->push_cm({CmEventType::Rejected, this, cm_payload_});
    reported_down_ = true;
    fail_connection(nullptr, 0);
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

// A write's frame has arrived whole. A write in several frames (from device memory) is one
// work request: its earlier frames only place bytes (or note that the target refused them),
// and this returns false for them; its last frame ends it (true): answered with a Nak if it
// was refused, completed with its immediate data if it carries some.
bool TcpConnection::finish_write() {
    write_bytes_ += cur_.length;
    if (cur_status_ != wire::TcpStatus::Ok && write_status_ == wire::TcpStatus::Ok)
        write_status_ = cur_status_;
    if (cur_.flags & wire::kTcpMore) return false;
    cur_status_ = write_status_;
    write_status_ = wire::TcpStatus::Ok;
    last_write_ok_ = cur_status_ == wire::TcpStatus::Ok;
    write_ended_ = true;
    if (cur_status_ == wire::TcpStatus::SourceFault) {
        // The initiator could not copy the rest of its source and knows it failed:
        // nothing to answer, nothing to report here.
        TANDEM_INFO(FI_LOG_EP_DATA, "a peer's write ended early: its source faulted\n");
    } else if (cur_status_ != wire::TcpStatus::Ok) {
        FramePtr nak = make_frame(wire::TcpOp::Nak, nullptr, nullptr, 0, false);
        nak->hdr.status = static_cast<uint8_t>(cur_status_);
        nak->hdr.imm = rx_count_;
        queue_frame(std::move(nak));
        if (posted_buf_) transport_->post_recv(posted_buf_, posted_len_, posted_wr_id_);
        posted_buf_ = nullptr;
        TANDEM_WARN(FI_LOG_EP_DATA, "remote write rejected: key 0x%lx addr 0x%lx len %lu\n",
                    (unsigned long)cur_ext_.key, (unsigned long)cur_ext_.addr,
                    (unsigned long)cur_.length);
    } else {
        transport_->resolver()->remote_access_done(cur_ext_.key, FI_REMOTE_WRITE);
        if (cur_.flags & wire::kTcpHasImm) {
            WorkCompletion wc{posted_wr_id_,     this, WcOpcode::RecvWriteImm,
                              WcStatus::Success, true, cur_.imm,
                              write_bytes_};
            posted_buf_ = nullptr;
            transport_->push_completion(wc);
        }
    }
    write_bytes_ = 0;
    return true;
}

// A read request has arrived: its response is queued, from the region its key names, or
// refused with RemoteAccess.
void TcpConnection::serve_read_request() {
    stop_at("link.read_requested");
    LocalPieces pieces;
    bool ok = transport_->resolver()->resolve(cur_ext_.key, cur_ext_.addr, cur_ext_.length,
                                              FI_REMOTE_READ, pieces);
    if (ok && !hmem::all_host(pieces.mem, pieces.count)) {
        queue_device_read_response(pieces, cur_ext_.key, cur_ext_.length);
        return;
    }
    FramePtr frame = new_frame();
    OutFrame &resp = *frame;
    resp.hdr.op = static_cast<uint8_t>(wire::TcpOp::ReadResp);
    if (!ok) {
        resp.hdr.status = static_cast<uint8_t>(wire::TcpStatus::RemoteAccess);
        TANDEM_WARN(FI_LOG_EP_DATA, "remote read rejected: key 0x%lx addr 0x%lx len %lu\n",
                    (unsigned long)cur_ext_.key, (unsigned long)cur_ext_.addr,
                    (unsigned long)cur_ext_.length);
    } else {
        resp.hdr.length = cur_ext_.length;
        for (size_t k = 0; k < pieces.count; ++k) {
            if (!pieces.iov[k].iov_len) continue;
            resp.mem[resp.iov_count] = pieces.mem[k];
            resp.iov[resp.iov_count++] = pieces.iov[k];
        }
        if (pieces.application) {
            // The target's FI_REMOTE_READ counter moves once the bytes have left (see
            // retire_sent), and they leave copied, not spliced: an application that
            // sees the counter may change its memory, which must not alter what is
            // in flight. (A rendezvous source stays the sender's until the reader's
            // Fin, so it may be spliced.)
            resp.counts_remote_read = true;
            resp.read_key = cur_ext_.key;
            resp.no_splice = true;
        }
    }
    queue_frame(std::move(frame));
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

void TcpConnection::maybe_send_ack() {
    if (state_ != State::Established || !outq_.empty()) return;
    if (rx_count_ == acked_sent_) return;
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

// ----------------------------------------------------------------------------------------
// TcpTransport

TcpTransport::TcpTransport(RemoteKeyResolver *resolver, const TcpLinkConfig &config)
    : resolver_(resolver), config_(config), epfd_(epoll_create1(EPOLL_CLOEXEC)) {
    if (epfd_ < 0) fail(errno, "epoll_create1");
    caps_ = caps_for(config);
}

LinkCaps TcpTransport::caps_for(const TcpLinkConfig &config) {
    LinkCaps caps;
    caps.max_inline = config.max_inline;
    caps.max_send_size = config.max_send_size;
    caps.max_send_now = config.max_send_size;  // (copied only if the socket is full)
    caps.max_rdma_size = size_t{1} << 40;
    caps.max_sge = 16;
    caps.rdma_read = true;
    caps.rdma_write = true;
    caps.remote_access_events = true;
    return caps;
}

TcpTransport::~TcpTransport() {
    if (listen_fd_ >= 0) close(listen_fd_);
    close(epfd_);
}

int TcpTransport::listen(const sockaddr *addr, socklen_t len, int backlog) {
    int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, addr, len) < 0 || ::listen(fd, backlog) < 0) {
        int err = errno;
        close(fd);
        return err == EADDRINUSE ? -FI_EADDRINUSE : -err;
    }
    listen_fd_ = fd;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
    return FI_SUCCESS;
}

sockaddr_storage TcpTransport::name() const {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (listen_fd_ >= 0) getsockname(listen_fd_, reinterpret_cast<sockaddr *>(&ss), &len);
    return ss;
}

LinkConnection *TcpTransport::connect(const sockaddr *dst, socklen_t len, const void *priv,
                                      size_t priv_len, const sockaddr *src, socklen_t src_len) {
    if (priv_len > wire::kMaxCmPrivate + 64) fail(FI_EINVAL, "connection data too large");
    int fd = socket(dst->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) fail(errno, "socket");
    set_socket_options(fd, config_);
    if (src) {
        // The address was reserved by the application (a passive endpoint's, or setname):
        // SO_REUSEADDR lets the connection take it while a socket that held it lingers.
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, src, src_len) != 0) {
            int err = errno;
            ::close(fd);
            fail(err, "cannot bind the connection to its source address");
        }
    }
    auto conn = std::make_unique<TcpConnection>(this, fd, TcpConnection::State::Connecting);
    if (::connect(fd, dst, len) < 0 && errno != EINPROGRESS) {
        int err = errno;
        TANDEM_INFO(FI_LOG_EP_CTRL, "connect: %s\n", strerror(err));
        // Report it like a late failure so callers have one path.
        conns_.push_back(std::move(conn));
        conns_.back()->send_cm_request(priv, priv_len);
        conns_.back()->progress(false);
        watch(conns_.back().get());
        return conns_.back().get();
    }
    conn->send_cm_request(priv, priv_len);
    conns_.push_back(std::move(conn));
    watch(conns_.back().get());
    return conns_.back().get();
}

void TcpTransport::adopt(std::unique_ptr<LinkConnection> conn) {
    auto *tcp = static_cast<TcpConnection *>(conn.release());
    tcp->set_transport(this);
    conns_.emplace_back(tcp);
    watch(tcp);
}

std::unique_ptr<LinkConnection> TcpTransport::release(LinkConnection *conn) {
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
        if (it->get() == conn) {
            unwatch(it->get());
            std::unique_ptr<LinkConnection> out(it->release());
            conns_.erase(it);
            return out;
        }
    }
    return nullptr;
}

void TcpTransport::disconnect_all() {
    for (auto &c : conns_) c->disconnect();
}

void TcpTransport::abort_all() {
    for (auto &c : conns_) c->abort();
    for (auto &c : graveyard_) c->abort();
}

bool TcpTransport::drain(int timeout_ms) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        bool busy = false;
        for (auto &c : conns_) busy |= !c->failed();
        for (auto &c : graveyard_) busy |= !c->failed();
        if (!busy) return true;
        if (std::chrono::steady_clock::now() >= end) return false;
        progress();
    }
}

void TcpTransport::destroy(LinkConnection *conn) {
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
        if (it->get() != conn) continue;
        conn->context = nullptr;
        (*it)->disconnect();
        // Completions already queued for it still name it: keep it until they are read.
        graveyard_.push_back(std::move(*it));
        conns_.erase(it);
        break;
    }
}

int TcpTransport::post_recv(void *buf, size_t len, uint64_t wr_id) {
    posted_.push_back({buf, len, wr_id});
    return FI_SUCCESS;
}

bool TcpTransport::take_posted(PostedRecv &out) {
    if (posted_.empty()) return false;
    out = posted_.front();
    posted_.pop_front();
    return true;
}

void TcpTransport::accept_new() {
    if (listen_fd_ < 0) return;
    for (;;) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            return;
        }
        set_socket_options(fd, config_);
        choose_congestion(fd);
        conns_.push_back(
            std::make_unique<TcpConnection>(this, fd, TcpConnection::State::AwaitingRequest));
        watch(conns_.back().get());
        ++strangers_;
        check_strangers();
    }
}

void TcpTransport::check_strangers() {
    size_t awaiting = 0;
    size_t rejected_open = 0;
    TcpConnection *oldest = nullptr;
    int64_t now = -1;
    for (auto &c : conns_) {
        if (c->rejected() && !c->failed()) ++rejected_open;
        if (c->state() != TcpConnection::State::AwaitingRequest) continue;
        if (c->request_started_ms() >= 0) {
            if (now < 0) now = coarse_now_ms();
            if (now - c->request_started_ms() > kRequestTimeoutMs) {
                c->close_stranger("connection request not completed in time (slowloris?)");
                continue;
            }
        }
        ++awaiting;
        if (!oldest || c->accepted_ms() < oldest->accepted_ms()) oldest = c.get();
    }
    if (awaiting > kMaxAwaiting && oldest) {
        oldest->close_stranger("too many connections waiting to identify themselves");
        --awaiting;
    }
    strangers_ = awaiting;
    rejected_open_ = rejected_open;
    // What failed before its request was reported, or after it was rejected, is nobody's: it
    // goes now. (Nothing refers to it: no work request was posted on it, no event is queued.)
    std::erase_if(conns_, [](const std::unique_ptr<TcpConnection> &c) {
        return c->failed() && c->unowned();
    });
}

// Congestion control matters where there is a network to share. Between two sockets of one
// host there is none, and a pacing algorithm only costs: under BBR (the system default on
// some distributions) every burst waits for a pacing timer, and 1 MiB transfers over loopback
// measured half as fast as under reno. So "auto" picks reno there (which the kernel lets any
// process choose) and leaves connections to other hosts to the system's choice.
void TcpTransport::choose_congestion(int fd) {
    const std::string &setting = config_.congestion;
    if (setting.empty() || setting == "system") return;
    const bool automatic = setting == "auto";
    if (automatic && !same_host(fd)) return;
    const std::string name = automatic ? "reno" : setting;
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                   static_cast<socklen_t>(name.size())) == 0)
        return;
    int err = errno;
    if (automatic || congestion_refused_) {
        TANDEM_DEBUG(FI_LOG_EP_CTRL, "congestion control %s refused: %s\n", name.c_str(),
                     strerror(err));
        return;
    }
    congestion_refused_ = true;
    TANDEM_WARN(FI_LOG_EP_CTRL,
                "congestion control %s refused (%s): links keep the system's default; see "
                "/proc/sys/net/ipv4/tcp_allowed_congestion_control\n",
                name.c_str(), strerror(err));
}

// Connection sockets join the epoll set only once there are more of them than a pass reads
// directly (conns_ counts the new one already). A socket in an epoll set costs every segment
// that arrives a callback into epoll, run by the sending side on loopback before its sendmsg
// returns: 3-4% of an 8-byte round trip, measured. (Waiting on a wait set polls the sockets
// themselves: wait_fds.)
void TcpTransport::watch(TcpConnection *conn) {
    if (conns_.size() <= kDirectPollConnections && !conns_watched_) return;
    auto add = [this](TcpConnection *c) {
        if (c->wait_fd() < 0) return;
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.ptr = c;
        epoll_ctl(epfd_, EPOLL_CTL_ADD, c->wait_fd(), &ev);
    };
    if (conns_watched_) {
        add(conn);
        return;
    }
    conns_watched_ = true;
    for (auto &c : conns_) add(c.get());
}

void TcpTransport::unwatch(TcpConnection *conn) {
    if (conns_watched_ && conn->wait_fd() >= 0)
        epoll_ctl(epfd_, EPOLL_CTL_DEL, conn->wait_fd(), nullptr);
}

// One pass over the sockets. With few connections, a recv() on each is the cheapest way to
// find data (one system call per idle connection); the listener and larger sets (whose
// sockets are then in the epoll set: watch) are checked with one epoll_wait.
void TcpTransport::progress(bool check_all) {
    ++passes_;
    // The listener (and every socket) is checked by epoll at least every kListenerCheckPasses
    // passes and, as the clock is read every 16th pass, about every millisecond of a busy
    // poll. (Cheap as it is, the clock read on every pass was a measurable share of a
    // node-local ping-pong.) Passes far apart would stretch that to seconds: who progresses
    // rarely asks for the check (check_all, progress_now).
    int64_t now_ms = last_full_ms_;
    if (passes_ % 16 == 0) now_ms = coarse_now_ms();
    bool full = check_all || conns_.size() > kDirectPollConnections ||
                passes_ % kListenerCheckPasses == 0 || now_ms != last_full_ms_;
    bool direct = !full;
    if (full) last_full_ms_ = now_ms;
    // Only the listener to watch (every peer so far is node-local, or none yet): it waits for
    // the next check rather than cost a system call on every pass.
    if (direct && conns_.empty() && graveyard_.empty()) return;
    if (direct) {
        for (size_t i = 0; i < conns_.size(); ++i) conns_[i]->progress(true);
    } else {
        epoll_event ev[64];
        int n = epoll_wait(epfd_, ev, 64, 0);
        std::vector<TcpConnection *> ready;
        for (int i = 0; i < n; ++i) {
            if (ev[i].data.ptr == nullptr)
                accept_new();
            else
                ready.push_back(static_cast<TcpConnection *>(ev[i].data.ptr));
        }
        for (size_t i = 0; i < conns_.size(); ++i) {
            TcpConnection *c = conns_[i].get();
            bool readable =
                !conns_watched_ || std::find(ready.begin(), ready.end(), c) != ready.end();
            c->progress(readable);
        }
    }
    for (auto &c : graveyard_) c->progress(true);
    if (full && has_strangers()) check_strangers();
}

int TcpTransport::poll(WorkCompletion *wc, int max) {
    if (completions_.empty()) progress();
    int n = 0;
    while (n < max && !completions_.empty()) {
        wc[n++] = completions_.front();
        completions_.pop_front();
    }
    if (completions_.empty() && cm_events_.empty()) {
        // Nothing can name a destroyed connection any more.
        std::erase_if(graveyard_, [](auto &c) { return c->failed(); });
    }
    return n;
}

// Connection events are produced by the progress pass of poll(); this only hands them out.
bool TcpTransport::poll_cm(CmEvent &event) {
    if (cm_events_.empty()) return false;
    event = std::move(cm_events_.front());
    cm_events_.pop_front();
    return true;
}

void TcpTransport::wait_fds(std::vector<int> &out) const {
    if (listen_fd_ >= 0) out.push_back(listen_fd_);
    for (auto &c : conns_)
        if (c->wait_fd() >= 0) out.push_back(c->wait_fd());
}

}  // namespace tandem
