// Device memory over the TCP link (tcp_link.h), which cannot reach it: payload goes out and
// comes in through host bounce buffers in chunks, so that copies and the socket overlap; a
// device copy that fails ends its write or read response early (end_with_fault).
#include "main_prov/link/tcp_link.h"
#include "main_prov/link/tcp_link_internal.h"

#include "common/iov.h"
#include "common/log.h"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tandem {

namespace {

// Device payload moves through host bounce buffers in chunks of this size: the copy of one
// chunk overlaps the socket sending the one before.
constexpr size_t kStageChunk = 256 * 1024;

}  // namespace

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

}  // namespace tandem
