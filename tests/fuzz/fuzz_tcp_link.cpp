// Fuzz target: the TCP link's frame parser and connection state machine
// (main_prov/link/tcp_framing.cpp, tcp_connect.cpp, tcp_link.cpp; the RMA it serves in
// tcp_served_rma.cpp), driven the way a rogue peer drives it: a raw TCP client
// connects to a listening TcpTransport and sends the input's bytes. The harness plays the
// endpoint above the link: it accepts (or rejects) connection requests, keeps receive
// buffers posted, destroys connections that go down, and offers one 4 KiB region (key
// kRegionKey) for the peer's RDMA writes and reads. Checks, on top of the sanitizers: the
// link closes the rogue's connection or keeps it, but never writes outside the region, never
// stops answering, and frees what each connection held.
#include "main_prov/link/tcp_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace {

using namespace tandem;

constexpr uint64_t kRegionKey = 0x1badcafe;  // the seeds' writes and reads name it
constexpr size_t kRegionSize = 4096;
constexpr size_t kRecvSize = 1024;  // smaller than a frame may be: the "too large" path
constexpr size_t kPosted = 4;
constexpr uint8_t kGuard = 0xa5;

// The region, with guard bytes on both sides that no access may reach.
struct Region final : RemoteKeyResolver {
    uint8_t bytes[kRegionSize + 2 * 64];
    uint8_t *mem() { return bytes + 64; }
    bool resolve(uint64_t key, uint64_t addr, size_t len, uint64_t access,
                 LocalPieces &out) noexcept override {
        (void)access;
        if (key != kRegionKey || addr > kRegionSize || len > kRegionSize - addr) return false;
        out.count = 1;
        out.iov[0] = {mem() + addr, len};
        out.mem[0] = hmem::kHost;
        out.application = true;
        return true;
    }
    void remote_access_done(uint64_t, uint64_t) noexcept override {}
    bool guards_intact() const {
        for (size_t i = 0; i < 64; ++i)
            if (bytes[i] != kGuard || bytes[64 + kRegionSize + i] != kGuard) return false;
        return true;
    }
};

struct Harness {
    Region region;
    std::unique_ptr<TcpTransport> transport;
    sockaddr_in addr{};
    std::vector<uint8_t> buffers = std::vector<uint8_t>(kPosted * kRecvSize);

    Harness() {
        memset(region.bytes, kGuard, sizeof region.bytes);
        TcpLinkConfig cfg;
        cfg.max_send_size = kRecvSize;
        cfg.max_inline = 0;
        cfg.timeout_ms = 0;
        transport = std::make_unique<TcpTransport>(&region, cfg);
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (transport->listen(reinterpret_cast<sockaddr *>(&addr), sizeof addr, 64)) abort();
        sockaddr_storage name = transport->name();
        memcpy(&addr, &name, sizeof addr);
        for (size_t i = 0; i < kPosted; ++i)
            transport->post_recv(buffers.data() + i * kRecvSize, kRecvSize, i);
    }

    // One pass of the endpoint above the link. accept: what to answer connection requests.
    void drive(bool accept) {
        transport->progress_now();
        CmEvent ev;
        while (transport->poll_cm(ev)) {
            switch (ev.type) {
                case CmEventType::ConnectRequest:
                    if (accept)
                        ev.conn->accept(nullptr, 0);
                    else
                        ev.conn->reject(nullptr, 0);
                    break;
                case CmEventType::Disconnected:
                case CmEventType::Rejected:
                case CmEventType::Unreachable:
                    transport->destroy(ev.conn);
                    break;
                case CmEventType::Established:
                    break;
            }
        }
        WorkCompletion wc[8];
        int n;
        while ((n = transport->poll(wc, 8)) > 0)
            for (int i = 0; i < n; ++i)
                if (wc[i].opcode == WcOpcode::Recv || wc[i].opcode == WcOpcode::RecvWriteImm) {
                    if (wc[i].byte_len > kRecvSize) abort();
                    transport->post_recv(buffers.data() + wc[i].wr_id * kRecvSize, kRecvSize,
                                         wc[i].wr_id);
                }
    }
};

Harness &harness() {
    static Harness *h = new Harness;  // lives for the process: the fuzzer never exits cleanly
    return *h;
}

}  // namespace

// Input: one control byte (bit 0: accept connection requests, else reject them), then the
// bytes the rogue sends.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    Harness &h = harness();
    const bool accept = data[0] & 1;
    ++data;
    --size;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    // Closed with a reset once done (its FIN went with shutdown): a connection that waited in
    // TIME_WAIT for every input would use up the ephemeral ports within a minute.
    linger reset{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    if (fd < 0) abort();
    // (libFuzzer's timer interrupts system calls: an interrupted connect goes on by itself.)
    while (connect(fd, reinterpret_cast<sockaddr *>(&h.addr), sizeof h.addr) != 0) {
        if (errno == EISCONN) break;
        if (errno != EINTR && errno != EALREADY) {
            perror("fuzz_tcp_link: connect to the link's listener");
            abort();
        }
    }
    size_t sent = 0;
    bool peer_closed = false, write_shut = false;
    uint8_t sink[4096];
    // Sends and drives in turn (the link answers as it reads: its writes must be drained),
    // until the link has seen everything and closed, or a bound of passes: a link that keeps
    // a half-closed connection open is allowed (it may still owe answers).
    for (int pass = 0; pass < 4000 && !(peer_closed && write_shut); ++pass) {
        if (sent < size) {
            ssize_t w = send(fd, data + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w > 0) sent += size_t(w);
            if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) sent = size;  // reset by tandem
        }
        if (sent == size && !write_shut) {
            shutdown(fd, SHUT_WR);
            write_shut = true;
        }
        h.drive(accept);
        for (;;) {
            ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
            if (r > 0) continue;
            if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) peer_closed = true;
            break;
        }
    }
    close(fd);
    // The link sees the close and lets the connection go.
    for (int pass = 0; pass < 64 && !h.transport->idle(); ++pass) h.drive(accept);
    if (!h.transport->idle()) abort();  // a connection outlived its socket
    if (!h.region.guards_intact()) abort();
    return 0;
}
