// Large host payloads of the TCP link (tcp_link.h) leave by vmsplice + splice: the kernel
// takes references to the pages instead of copying them (which frames may: spliceable, in
// tcp_framing.cpp beside flush_send, which asks on every frame).
#include "main_prov/link/tcp_link.h"

#include "common/iov.h"
#include "common/log.h"

#include <rdma/fabric.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tandem {

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

}  // namespace tandem
