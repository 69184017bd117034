// The TCP link: LinkTransport/LinkConnection over non-blocking stream sockets, driven by the
// owner's progress calls (no thread of its own). Verbs RC semantics are kept where the
// protocol can observe them: in-order completion per connection, send completion once the
// peer's link has placed the message (acknowledgements piggy-backed on the reverse traffic),
// remote keys checked at the target with bounds and access, RNR-like stalls when the
// receiver has no posted buffer.
#pragma once

#include "main_prov/link/link.h"
#include "common/ring_queue.h"
#include "common/wire.h"

#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace tandem {

class TcpTransport;

struct TcpLinkConfig {
    size_t max_send_size = 16384;  // posted receive buffer size the protocol uses
    size_t max_inline = 256;
    size_t socket_buffer = 0;  // SO_SNDBUF/SO_RCVBUF when non-zero
    // Host payloads of at least this many bytes go to the socket by vmsplice + splice (the
    // kernel takes references to the pages instead of copying them); 0: always sendmsg.
    size_t splice_min = 0;
    // TCP congestion control of the link's sockets: "auto" (reno between two sockets of this
    // host, the system's default otherwise), "system" (always the system's default) or the
    // name of an algorithm the kernel offers.
    std::string congestion = "auto";
    // A connection whose peer's host stops answering fails after this many milliseconds
    // (TCP_USER_TIMEOUT for data in flight, keepalive probes when idle); 0: the kernel's
    // defaults (about 15 minutes of retransmissions, no keepalive).
    unsigned timeout_ms = 30000;
};

class TcpConnection final : public LinkConnection {
  public:
    enum class State : uint8_t {
        Connecting,       // active: connect() in progress
        RequestSent,      // active: CmRequest sent, waiting for accept / reject
        AwaitingRequest,  // passive: accepted socket, CmRequest not read yet
        RequestReceived,  // passive: reported ConnectRequest, waiting for accept()/reject()
        Established,
        Closed,  // disconnected or failed; everything flushed
    };

    TcpConnection(TcpTransport *transport, int fd, State state);
    ~TcpConnection() override;

    int post_send(const iovec *iov, size_t count, const uint32_t *imm, uint64_t wr_id,
                  bool if_write_ok = false) override;
    int post_send_now(const iovec *iov, size_t count, uint64_t wr_id) override;
    int post_write(const iovec *iov, const hmem::MemRef *mem, size_t count, RemoteRegion dst,
                   const uint32_t *imm, uint64_t wr_id) override;
    int post_read(const iovec *iov, const hmem::MemRef *mem, size_t count, RemoteRegion src,
                  uint64_t wr_id) override;

    int accept(const void *priv, size_t len) override;
    int reject(const void *priv, size_t len) override;
    void disconnect() override;
    // Closes the socket now; pending work requests complete as flushed (a QP moved to error).
    void abort() { fail_connection(nullptr, 0); }

    bool established() const override { return state_ == State::Established; }
    bool failed() const override { return state_ == State::Closed; }
    sockaddr_storage peer_address() const override;
    sockaddr_storage local_address() const override;
    int wait_fd() const override { return fd_; }

    State state() const { return state_; }
    void set_transport(TcpTransport *t) { transport_ = t; }
    // One progress pass: connect, write queued frames, read and dispatch incoming frames.
    // readable: the socket may have data (one recv is allowed); buffered frames are parsed
    // either way.
    void progress(bool readable);
    bool wants_write() const { return !outq_.empty() || state_ == State::Connecting; }
    // The acknowledgement of every frame received so far, now (before the application sleeps:
    // progress would have sent it only after kAckIdlePasses passes).
    void acknowledge_all();
    void send_cm_request(const void *priv, size_t len);
    // A connection nobody above holds: accepted and its request not reported yet, or rejected
    // (reject: no event names it again). When it fails it is dropped without an event.
    bool unowned() const { return unannounced_ || rejected_; }
    bool rejected() const { return rejected_; }
    // Accepted and still to identify itself: since when (ms, coarse clock), and since when its
    // request's first bytes arrived (-1: none yet).
    int64_t accepted_ms() const { return accepted_ms_; }
    int64_t request_started_ms() const { return request_started_ms_; }
    void close_stranger(const char *why) { fail_connection(why, ETIMEDOUT); }

  private:
    struct OutFrame {
        wire::TcpFrame hdr{};
        wire::TcpRdma ext{};
        bool has_ext = false;
        bool counts_as_wr = false;  // Send, Write, ReadReq: acknowledged by the peer
        static constexpr size_t kMaxPayloadIov = 18;
        iovec iov[kMaxPayloadIov];  // payload (may point into `inline_copy`)
        hmem::MemRef mem[kMaxPayloadIov];
        size_t iov_count = 0;
        // Device payload: sent through the connection's bounce buffer, which holds payload
        // bytes [stage_begin, stage_end) of the frame numbered `serial` (see flush_send).
        bool device = false;
        uint64_t serial = 0;
        size_t stage_begin = 0, stage_end = 0;
        std::vector<uint8_t> inline_copy;
        size_t total = 0;  // head() + payload bytes
        size_t head() const { return sizeof hdr + (has_ext ? sizeof ext : 0); }
        size_t sent = 0;
        bool no_splice = false;  // vmsplice refused these pages: sendmsg copies them
        // A read response: once it is sent, the read of region `read_key` is over for the
        // target's FI_REMOTE_READ counter.
        bool counts_remote_read = false;
        uint64_t read_key = 0;
        // The frames of one read response or one write from device memory share a number
        // (0: none); a write's also carry its work request's number.
        uint64_t response = 0;
        uint32_t wr_seq = 0;

        // For reuse: everything but the scatter lists, whose first iov_count entries are
        // always written before they are read.
        void reset() {
            hdr = {};
            ext = {};
            has_ext = counts_as_wr = device = no_splice = counts_remote_read = false;
            read_key = response = 0;
            wr_seq = 0;
            iov_count = 0;
            serial = stage_begin = stage_end = total = sent = 0;
            inline_copy.clear();
        }
    };
    using FramePtr = std::unique_ptr<OutFrame>;
    struct PendingWr {
        uint64_t wr_id = 0;
        uint32_t seq = 0;
        WcOpcode opcode = WcOpcode::Send;
        WcStatus status = WcStatus::Success;
        bool read_done = false;
        size_t read_got = 0;                 // reads: response bytes received so far
        std::vector<iovec> read_iov;         // reads: where the response lands
        std::vector<hmem::MemRef> read_mem;  // and where each piece lives (empty: host)
        size_t length = 0;
    };
    enum class RxPhase : uint8_t { Header, Extension, Payload };

    int queue_wr(FramePtr frame, uint64_t wr_id, WcOpcode opcode, std::vector<iovec> read_iov,
                 std::vector<hmem::MemRef> read_mem, size_t length);
    void queue_frame(FramePtr frame);
    FramePtr new_frame();
    void retire_front();
    void retire_sent();
    FramePtr make_frame(wire::TcpOp op, const iovec *iov, const hmem::MemRef *mem, size_t count,
                        bool copy_payload);
    size_t push_staged(OutFrame &f, iovec *out);
    void queue_device_read_response(const LocalPieces &pieces, uint64_t key, size_t length);
    std::vector<FramePtr> device_chunks(wire::TcpOp op, const iovec *iov, const hmem::MemRef *mem,
                                        size_t count, size_t length);
    bool end_with_fault(OutFrame &f);
    PendingWr *answered_read();
    int post_device_write(const iovec *iov, const hmem::MemRef *mem, size_t count, RemoteRegion dst,
                          const uint32_t *imm, uint64_t wr_id);
    bool spliceable(const OutFrame &f) const;
    enum class SpliceResult : uint8_t { Sent, Blocked, Failed, Refused };
    SpliceResult splice_payload(OutFrame &f);
    void close_pipe();
    bool receive_staged(size_t remaining);
    struct SendBatch;
    enum class BatchResult : uint8_t { Ready, Rebuild, Failed };
    // flush_send's helpers, defined beside it (tcp_framing.cpp) and inlined there.
    inline BatchResult build_batch(SendBatch &batch);
    inline void account_sent(size_t sent);
    bool flush_send();
    void read_frames();
    bool fill_rx(size_t want);
    bool begin_send();
    bool begin_write();
    bool begin_read_response();
    bool begin_frame();
    bool read_payload();
    void finish_send();
    bool finish_write();
    void serve_read_request();
    void finish_frame();
    void handle_cm_frame();
    void complete_acked(uint32_t ack);
    void fail_connection(const char *why, int err);
    void flush_pending();
    void maybe_send_ack();
    void finish_disconnect();

    TcpTransport *transport_;
    int fd_;
    State state_;
    bool disconnect_requested_ = false;
    bool write_shut_ = false;
    bool reported_down_ = false;

    std::deque<FramePtr> outq_;
    std::vector<FramePtr> spare_frames_;
    std::deque<PendingWr> pending_;
    uint32_t next_seq_ = 0;     // sequence number of the next work request we post
    uint32_t rx_count_ = 0;     // work requests of the peer received and processed
    uint32_t acked_sent_ = 0;   // last rx_count_ we told the peer about
    uint32_t idle_passes_ = 0;  // passes in a row that received no work request
    // A write ended in this pass: its initiator completes it only on our acknowledgement, and
    // the application here may make no further call (manual progress) to send one later.
    bool write_ended_ = false;
    bool recv_allowed_ = false;  // one recv() per pass unless the last one filled the buffer

    // Receive state.
    std::vector<uint8_t> rxbuf_;
    size_t rx_head_ = 0, rx_tail_ = 0;
    RxPhase phase_ = RxPhase::Header;
    wire::TcpFrame cur_{};
    wire::TcpRdma cur_ext_{};
    size_t payload_done_ = 0;
    // Destination of the current payload.
    std::vector<iovec> dst_iov_;
    std::vector<hmem::MemRef> dst_mem_;  // empty: all host memory
    bool dst_discard_ = false;
    // Host bounce buffers for device memory (the TCP link cannot reach it): payload goes
    // out and comes in through them in chunks, so copies and the socket overlap.
    std::vector<uint8_t> stage_tx_, stage_rx_;
    uint64_t stage_owner_ = 0;  // serial of the frame whose bytes stage_tx_ holds
    uint64_t next_serial_ = 1;
    // vmsplice → splice: the pipe holds page references of the front frame's payload,
    // pipe_bytes_ of them not yet moved into the socket (see splice_payload).
    int pipe_[2] = {-1, -1};
    size_t pipe_bytes_ = 0;
    std::vector<uint8_t> cm_payload_;
    void *posted_buf_ = nullptr;
    uint64_t posted_wr_id_ = 0;
    size_t posted_len_ = 0;
    wire::TcpStatus cur_status_ = wire::TcpStatus::Ok;
    // The write whose frames are arriving (several for one from device memory): its bytes so
    // far, and the first refusal or fault among them.
    uint64_t write_bytes_ = 0;
    wire::TcpStatus write_status_ = wire::TcpStatus::Ok;
    // Whether the last write received on this connection succeeded (kTcpIfWriteOk sends).
    bool last_write_ok_ = true;
    bool dropping_send_ = false;         // the Send arriving follows a failed write: dropped
    bool pending_ext_consumed_ = false;  // stalled frame: header and extension already read
    bool unannounced_ = false;
    bool rejected_ = false;
    int64_t accepted_ms_ = -1;
    int64_t request_started_ms_ = -1;
};

class TcpTransport final : public LinkTransport {
  public:
    TcpTransport(RemoteKeyResolver *resolver, const TcpLinkConfig &config);
    ~TcpTransport() override;

    static LinkCaps caps_for(const TcpLinkConfig &config);
    const LinkCaps &caps() const override { return caps_; }
    int listen(const sockaddr *addr, socklen_t len, int backlog) override;
    sockaddr_storage name() const override;
    LinkConnection *connect(const sockaddr *dst, socklen_t len, const void *priv, size_t priv_len,
                            const sockaddr *src = nullptr, socklen_t src_len = 0) override;
    void adopt(std::unique_ptr<LinkConnection> conn) override;
    void destroy(LinkConnection *conn) override;
    int post_recv(void *buf, size_t len, uint64_t wr_id) override;
    int poll(WorkCompletion *wc, int max) override;
    bool poll_cm(CmEvent &event) override;
    void wait_fds(std::vector<WaitFd> &out) const override;
    void before_sleep() override;
    int64_t next_timer_ms() const override;

    bool drain(int timeout_ms) override;
    bool idle() const override {
        return conns_.empty() && graveyard_.empty() && completions_.empty() && cm_events_.empty();
    }
    bool busy() const override {
        if (!graveyard_.empty() || !completions_.empty() || !cm_events_.empty()) return true;
        for (auto &c : conns_)
            if (c->wants_write()) return true;
        return false;
    }
    void disconnect_all() override;
    void abort_all() override;
    std::unique_ptr<LinkConnection> release(LinkConnection *conn) override;
    std::unique_ptr<LinkTransport> fresh() const override {
        return std::make_unique<TcpTransport>(resolver_, config_);
    }

    // Used by connections.
    struct PostedRecv {
        void *buf;
        size_t len;
        uint64_t wr_id;
    };
    // (Here, to be inlined where frames are received: tcp_framing.cpp, tcp_served_rma.cpp.)
    bool take_posted(PostedRecv &out) {
        if (posted_.empty()) return false;
        out = posted_.front();
        posted_.pop_front();
        return true;
    }
    void push_completion(const WorkCompletion &wc) { completions_.push_back(wc); }
    void push_cm(CmEvent &&ev) { cm_events_.push_back(std::move(ev)); }
    // A rejected connection stays until its peer has read the answer and closed; the check
    // of strangers then drops it.
    void note_rejected() { ++rejected_open_; }
    RemoteKeyResolver *resolver() const { return resolver_; }
    const TcpLinkConfig &config() const { return config_; }
    void progress_now() override { progress(/*check_all=*/true); }
    // Sets a connected socket's congestion control as config().congestion says.
    void choose_congestion(int fd);

    // Strangers: an accepted connection must send its whole connection request within
    // kRequestTimeoutMs of its first byte, and at most kMaxAwaiting connections wait to
    // identify themselves (beyond, the one that waited longest is closed). A peer that
    // trickles bytes or opens connections and says nothing then holds neither a socket nor
    // memory for ever.
    static constexpr int64_t kRequestTimeoutMs = 5000;
    static constexpr size_t kMaxAwaiting = 64;

  private:
    void accept_new();
    void check_strangers();
    bool has_strangers() const { return strangers_ > 0 || rejected_open_ > 0; }
    void progress(bool check_all = false);
    void watch(TcpConnection *conn);
    void unwatch(TcpConnection *conn);

    RemoteKeyResolver *resolver_;
    TcpLinkConfig config_;
    LinkCaps caps_;
    int listen_fd_ = -1;
    int epfd_ = -1;  // listener and connection sockets, for readiness with many connections
    bool conns_watched_ = false;  // the connection sockets are in epfd_ (see watch)
    uint64_t passes_ = 0;
    int64_t last_full_ms_ = 0;
    bool congestion_refused_ = false;  // warned once that the named algorithm is not allowed
    size_t strangers_ = 0;      // accepted connections not identified at the last check (or since)
    size_t rejected_open_ = 0;  // rejected connections still open at the last check (or since)
    std::vector<std::unique_ptr<TcpConnection>> conns_;
    std::vector<std::unique_ptr<TcpConnection>> graveyard_;  // destroyed, completions unread
    std::deque<PostedRecv> posted_;
    RingQueue<WorkCompletion> completions_;
    std::deque<CmEvent> cm_events_;
};

// The TCP link's domain: nothing shared but the settings. Keys are the domain's own (the
// target's link asks its RemoteKeyResolver), so regions need no registration here.
class TcpLinkDomain final : public LinkDomain {
  public:
    explicit TcpLinkDomain(const TcpLinkConfig &config)
        : config_(config), caps_(TcpTransport::caps_for(config)) {}
    const char *kind() const override { return "tcp"; }
    const LinkCaps &caps() const override { return caps_; }
    int register_region(const iovec &, hmem::MemRef, uint64_t,
                        std::unique_ptr<LinkRegion> &out) override {
        out.reset();
        return 0;
    }
    std::unique_ptr<LinkTransport> transport(RemoteKeyResolver *resolver,
                                             size_t max_send_size) override {
        TcpLinkConfig cfg = config_;
        cfg.max_send_size = max_send_size;
        // The protocol keeps every buffer it posts until the link completes it (eager
        // payloads are already its own copies), so the link never needs to copy.
        cfg.max_inline = 0;
        return std::make_unique<TcpTransport>(resolver, cfg);
    }

  private:
    TcpLinkConfig config_;
    LinkCaps caps_;
};

}  // namespace tandem
