// The link interface: what tandem's protocol needs from a transport, shaped like verbs RC so
// that a verbs link fits behind it without touching the protocol (docs/architecture.md maps
// every operation onto its verbs call).
//
//  LinkTransport  ~ one protection domain + completion queue + shared receive queue +
//                   rdma_cm listener of one endpoint. Receive buffers are posted to it, not to a
//                   connection, and every connection draws from them (SRQ semantics: a message
//                   that finds no posted buffer waits, like an RNR retry).
//  LinkConnection ~ one RC queue pair. Work requests complete in the order they were posted;
//                   a send completes when the peer's link has placed it in a posted buffer,
//                   an RDMA write when the data is in the target region, a read when the data
//                   is in the local buffer.
//
// The protocol asks a transport what it can do (LinkCaps) and chooses eager, rendezvous by
// RDMA read, or bounce buffers from the answer, never from the transport's name.
#pragma once

#include "common/wait_fd.h"
#include "hmem/hmem.h"

#include <rdma/fi_errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace tandem {

struct LinkCaps {
    size_t max_inline = 0;     // bytes a send may carry without keeping the source buffer
    size_t max_send_size = 0;  // largest two-sided message (the posted buffer size)
    size_t max_send_now = 0;   // largest send post_send_now takes (0: none)
    size_t max_rdma_size = 0;  // largest single RDMA read or write
    size_t max_sge = 0;        // scatter/gather entries per work request
    bool rdma_read = false;
    bool rdma_write = false;
    bool remote_access_events = false;  // the target's link reports remote reads/writes
    // Device memory (FI_HMEM) moves between the wire and the device without host staging:
    // a NIC reading and writing it through a dma-buf or peer-memory registration. A link
    // without it still accepts device buffers and stages them through host bounce buffers.
    bool device_p2p = false;
    // A remote access error (bad key, bounds, access) ends the connection: a verbs RC queue
    // pair moves to the error state and flushes what follows. The TCP link refuses the one
    // request and the connection goes on.
    bool access_error_ends_connection = false;
    // A request outstanding when the peer vanished completes Timeout (RC: the transport's
    // retries ran out), those after it Flushed. TCP: all Flushed.
    bool peer_loss_times_out = false;
    // Remote memory is named by keys the link makes (LinkDomain::register_region: a NIC's
    // rkeys), not by the domain's own through the RemoteKeyResolver.
    bool link_keys = false;
    // Bytes of private data a connection request carries (rdma_cm: 56); 0: what the protocol
    // sends.
    size_t max_connect_data = 0;
};

// A bit of a key that a link with keys of its own (LinkCaps::link_keys) ignores: the keys'
// owner may set it to tell apart the keys it made through the link (the MR table marks its
// internal registrations with it).
inline constexpr uint64_t kLinkKeyOwnerBit = uint64_t{1} << 63;

// Remote memory as the link sees it: an address in the peer's key space and its key.
struct RemoteRegion {
    uint64_t addr;
    uint64_t key;
};

// The local memory behind a remote range: one piece, or several for a region registered
// from several iovecs.
struct LocalPieces {
    static constexpr size_t kMax = 16;
    iovec iov[kMax];
    hmem::MemRef mem[kMax];  // where each piece lives
    size_t count = 0;
    // An application's registration (its remote accesses are events it counts), rather than
    // a buffer the protocol exposed for one rendezvous.
    bool application = true;
};

// Resolves a remote key at the target, with bounds and access checks, the way an RNIC checks
// an rkey. Implemented by the domain's memory-region table.
class RemoteKeyResolver {
  public:
    virtual ~RemoteKeyResolver() = default;
    // The local memory of [addr, addr+len) under key with the given FI_REMOTE_* access; false
    // if the key is unknown, the range out of bounds or access denied.
    virtual bool resolve(uint64_t key, uint64_t addr, size_t len, uint64_t access,
                         LocalPieces &out) noexcept = 0;
    // Called after a remote write/read completed into a region (for FI_RMA_EVENT counters).
    virtual void remote_access_done(uint64_t key, uint64_t access) noexcept = 0;
};

enum class WcOpcode : uint8_t { Send, Recv, RecvWriteImm, Write, Read };

enum class WcStatus : uint8_t {
    Success,
    RemoteAccessError,  // bad key, out of bounds, access denied at the target
    RemoteInvalid,      // malformed request rejected by the target
    RemoteOpError,      // the target failed to carry it out (its device memory faulted)
    LocalFault,         // our own memory could not be read for it (a device copy failed)
    Flushed,            // the connection went down before the request completed
    Timeout,            // the peer did not answer within the link's retries (verbs RC
                        // transport or RNR retries exhausted: gone, or no buffer for too long)
};

// Memory a peer reaches by RDMA under a key the link made (a verbs memory region's rkey).
// Destroying it deregisters the memory.
class LinkRegion {
  public:
    virtual ~LinkRegion() = default;
    uint64_t key = 0;
};

// What one kind of link has per libfabric domain, shared by the domain's transports: the
// device and its protection domain (verbs), or nothing (TCP).
class LinkDomain {
  public:
    virtual ~LinkDomain() = default;
    virtual const char *kind() const = 0;  // "tcp", "verbs"
    virtual const LinkCaps &caps() const = 0;
    // Registers [iov) for remote access (FI_REMOTE_READ / FI_REMOTE_WRITE) by the peers of
    // every transport of this domain. 0 with out left empty where the link has no keys of its
    // own and asks the transport's RemoteKeyResolver at the target (TCP); a negative fabric
    // errno when the memory cannot be registered.
    virtual int register_region(const iovec &iov, hmem::MemRef mem, uint64_t access,
                                std::unique_ptr<LinkRegion> &out) = 0;
    // The same for a region the application also names by a DMA-buf (FI_MR_DMABUF: its fd,
    // and where in it iov starts): a link whose NIC maps device memory maps that DMA-buf, the
    // others register iov as above.
    virtual int register_dmabuf_region(const iovec &iov, hmem::MemRef mem, int fd, uint64_t offset,
                                       uint64_t access, std::unique_ptr<LinkRegion> &out) {
        (void)fd;
        (void)offset;
        return register_region(iov, mem, access, out);
    }
    // A transport of this domain for one endpoint, not listening yet, whose sends carry up to
    // max_send_size bytes (the size of the buffers the protocol posts).
    virtual std::unique_ptr<class LinkTransport> transport(RemoteKeyResolver *resolver,
                                                           size_t max_send_size) = 0;
};

class LinkConnection;

struct WorkCompletion {
    uint64_t wr_id;
    LinkConnection *conn;
    WcOpcode opcode;
    WcStatus status;
    bool has_imm;
    uint32_t imm;
    size_t byte_len;  // for receives: bytes placed in the posted buffer
};

enum class CmEventType : uint8_t {
    ConnectRequest,
    Established,
    Rejected,
    Unreachable,
    Disconnected
};

struct CmEvent {
    CmEventType type;
    LinkConnection *conn;
    std::vector<uint8_t> private_data;
};

class LinkConnection {
  public:
    virtual ~LinkConnection() = default;

    // Ownership of a work request: a post that returns 0 took it, and exactly one
    // WorkCompletion will name its wr_id (Flushed when the connection fails, even when it
    // fails inside that very post); a post that returns an error took nothing and nothing will
    // ever name it. The caller's state behind wr_id lives until that completion, not longer.
    // if_write_ok: the send is delivered only if the write posted just before it on this
    // connection succeeded (the protocol's WriteNotify, fi_writedata's remote CQ data; on a
    // verbs QP a failed write flushes what follows it anyway). Otherwise it completes here as
    // sent and the peer drops it.
    virtual int post_send(const iovec *iov, size_t count, const uint32_t *imm, uint64_t wr_id,
                          bool if_write_ok = false) = 0;
    // A small send taken whole before the call returns (its bytes written to the wire or
    // copied), so the caller's buffers are free again and no queue of the link holds them: the
    // same work request as post_send otherwise. -FI_EAGAIN: the link cannot take it so now
    // (earlier work queued, no room, not established); nothing was taken, post_send it.
    virtual int post_send_now(const iovec *iov, size_t count, uint64_t wr_id) {
        (void)iov;
        (void)count;
        (void)wr_id;
        return -FI_EAGAIN;
    }
    // `mem` says where each local iovec lives (null: all host memory); sends always come
    // from host memory (the protocol's own buffers).
    virtual int post_write(const iovec *iov, const hmem::MemRef *mem, size_t count,
                           RemoteRegion dst, const uint32_t *imm, uint64_t wr_id) = 0;
    virtual int post_read(const iovec *iov, const hmem::MemRef *mem, size_t count, RemoteRegion src,
                          uint64_t wr_id) = 0;

    // rdma_cm side of a connection.
    virtual int accept(const void *priv, size_t len) = 0;
    // After a successful reject the connection is the link's: it goes once the requester has
    // the answer, with no event. The caller may destroy() it at once, and must not name it
    // after its next call into the transport.
    virtual int reject(const void *priv, size_t len) = 0;
    virtual void disconnect() = 0;

    virtual bool established() const = 0;
    virtual bool failed() const = 0;
    virtual sockaddr_storage peer_address() const = 0;
    virtual sockaddr_storage local_address() const = 0;

    // File descriptor that becomes readable when this connection has work (for wait sets),
    // or -1 when none.
    virtual int wait_fd() const = 0;

    void *context = nullptr;  // owned by the protocol (its peer / connection state)
};

class LinkTransport {
  public:
    virtual ~LinkTransport() = default;

    virtual const LinkCaps &caps() const = 0;

    // Listening address; port 0 picks one. After listen(), name() is the bound address.
    virtual int listen(const sockaddr *addr, socklen_t len, int backlog) = 0;
    virtual sockaddr_storage name() const = 0;

    // Starts a connection; completion is reported as a CmEvent (Established / Rejected /
    // Unreachable). The private data reaches the peer's ConnectRequest. src, when given, is
    // the connection's own address (one the application reserved: rdma_bind_addr before
    // rdma_resolve_addr on verbs, bind before connect on TCP); otherwise the system picks.
    virtual LinkConnection *connect(const sockaddr *dst, socklen_t len, const void *priv,
                                    size_t priv_len, const sockaddr *src = nullptr,
                                    socklen_t src_len = 0) = 0;
    // Adopts a connection created by another transport's listener (a passive endpoint's
    // connection request accepted on an active endpoint). Ownership moves here.
    virtual void adopt(std::unique_ptr<LinkConnection> conn) = 0;
    // Gives up a connection: flushes its work requests and frees it.
    virtual void destroy(LinkConnection *conn) = 0;

    virtual int post_recv(void *buf, size_t len, uint64_t wr_id) = 0;

    // Drives the link and returns up to max completions / one connection-manager event.
    virtual int poll(WorkCompletion *wc, int max) = 0;
    virtual bool poll_cm(CmEvent &event) = 0;

    // Descriptors that become readable when poll()/poll_cm() has work, each writable too
    // while bytes wait for room in it (WaitFd::writable).
    virtual void wait_fds(std::vector<WaitFd> &out) const = 0;
    // Before the application sleeps on those descriptors: what a peer waits for that this side
    // would send only at a later pass goes now (TCP's delayed acknowledgements, which complete
    // the peer's sends), since a sleeper makes no passes.
    virtual void before_sleep() {}
    // When (coarse_now_ms) a pass has timed work to do whatever the peers send (TCP: a
    // connection request that stalls is closed then); -1: none. A sleeper wakes for it.
    virtual int64_t next_timer_ms() const { return -1; }

    // One pass that looks at everything now (the listener, every connection), for callers
    // that progress rarely (a passive endpoint, from EQ reads): poll() may look at some
    // sources only every so many passes.
    virtual void progress_now() = 0;
    // Progress hints. idle: nothing but the listener to watch (no connection, live or
    // closing, and nothing waiting to be handed out). busy: something to do at the next poll
    // whatever the peers send (work to send, a connection being made or closed, a completion
    // or event not handed out).
    virtual bool idle() const = 0;
    virtual bool busy() const = 0;

    // Closing: disconnect_all() starts an orderly close of every connection; drain() keeps
    // progressing until all have closed, at most timeout_ms (true when all did); abort_all()
    // closes what is left at once, its work requests flushed.
    virtual void disconnect_all() = 0;
    virtual bool drain(int timeout_ms) = 0;
    virtual void abort_all() = 0;

    // Detaches a connection from this transport (a passive endpoint handing a connection
    // request to the endpoint that accepts it, whose transport adopt()s it).
    virtual std::unique_ptr<LinkConnection> release(LinkConnection *conn) = 0;

    // Whether device memory may go to the wire without host staging where the link can
    // (LinkCaps::device_p2p): off under FI_HMEM_P2P_DISABLED. A link that always stages
    // ignores it.
    virtual void set_device_p2p(bool allowed) { (void)allowed; }

    // A new transport of the same kind and settings, for the same resolver, not listening
    // (an endpoint given another address before it is enabled).
    virtual std::unique_ptr<LinkTransport> fresh() const = 0;
};

}  // namespace tandem
