// The message engine behind one FI_EP_MSG or FI_EP_RDM endpoint: transmit operations,
// matching, rendezvous, completions and progress, over its channels (the link, a connection
// per peer; the node-local path through the offload twin). It knows the application only
// through the generic posts (post_send, post_recv, post_rma, post_atomic, post_collective) and
// the configuration calls of its fid_ep adapter (main_prov/endpoint.h): the ops tables, the
// forms of each call, options and binds are the adapter's.
//
// Eager messages for small payloads, rendezvous by RDMA read for large ones, tag matching with
// unexpected-message queues, RMA straight onto the link. An MSG endpoint has one connection
// made through fi_connect/fi_accept; an RDM endpoint makes one per peer on demand, named by
// the peer's listening address.
#pragma once

#include "common/short_cell.h"
#include "main_prov/cq.h"
#include "main_prov/eq.h"
#include "main_prov/link/link.h"
#include "main_prov/rx_matcher.h"
#include "main_prov/shm/peer_inbox.h"
#include "main_prov/shm/sender_hold.h"
#include "main_prov/shm/single_copy.h"
#include "main_prov/trigger.h"
#include "peer/foreign_srx.h"
#include "peer/peer_abi.h"
#include "peer/peer_trigger.h"
#include "main_prov/tx_request.h"
#include "main_prov/types.h"
#include "common/wire.h"
#include "hmem/p2p_policy.h"

#include "hmem/atomic.h"

#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_trigger.h>

#include <chrono>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace tandem {

class Domain;
class Av;
class Cntr;
class LocalPath;

struct TxOp;
struct TriggeredOp;

struct Peer {
    EndpointName name;               // RDM: the peer's listening address
    LinkConnection *conn = nullptr;  // the connection we send on
    bool established = false;
    std::deque<TxOp *> waiting;          // posted before the connection was up
    FabricAddr addr = FI_ADDR_NOTAVAIL;  // in our AV, refreshed when the AV changes
    uint64_t av_version = ~0ull;
    std::deque<RxOp *> rx_order;  // matched messages from this peer, completions in order
    // RDM: how operations to this peer travel, decided at the first one and then kept, so
    // that the order of one peer's operations is one path's order.
    enum class Route : uint8_t { Undecided, Link, Local } route = Route::Undecided;
    // Local: the peer as the twin's node-local channel holds it, whose Outbox is the lane
    // small sends go straight into its ring through (send_by_lane), or nullptr.
    shm::PeerInbox *lane = nullptr;
    // Over a link, atomics sent whose answer has not come, and the operations posted behind
    // one that must not overtake it (see Engine::submit), in order.
    uint32_t atomics_out = 0;
    std::deque<TxOp *> held;
};

struct TxOp {
    // Atomic: inject_copy holds the request (wire::AtomicBody + operands), iov / mem the
    // result buffers of a fetch or compare operation; it completes at the target's answer.
    enum class Kind : uint8_t { Send, Write, Read, Atomic } kind = Kind::Send;
    void *context = nullptr;
    uint64_t cq_flags = 0;      // flags of the completion entry
    uint64_t op_flags = 0;      // FI_* flags the operation was posted with
    bool report = true;         // write a CQ entry on success
    bool inject_level = false;  // complete once posted: the payload is our own copy
    bool completed_early = false;
    size_t len = 0;
    Peer *peer = nullptr;
    LinkConnection *conn = nullptr;
    uint64_t id = 0;
    wire::ProtoHeader hdr{};
    wire::RtsBody rts{};
    wire::WriteNotifyBody notify{};
    std::vector<iovec> iov;
    std::vector<hmem::MemRef> mem;     // where each of iov lives (empty: all host memory)
    std::vector<uint8_t> inject_copy;  // fi_inject: the payload, owned
    std::vector<uint64_t> internal_keys;
    RemoteRegion remote{};
    uint64_t data = 0;
    bool peer_transfer = false;  // the offload twin's (FI_PEER_TRANSFER): reported to it
    bool fenced = false;         // an atomic counted in its peer's atomics_out
    bool deferred = false;       // deferred work: completes on work_cntr (DeferredDone)
    Cntr *work_cntr = nullptr;
    int link_wrs = 0;           // link work requests not completed yet
    bool await_remote = false;  // rendezvous Fin or DeliveryAck pending
    // RMA the target serves (Domain::rma_served): sent as an RmaReq naming served_target,
    // the local buffers exposed in rts; stage_back: a read of device memory lands in
    // inject_copy and is copied to iov/mem when the Fin comes.
    bool served = false;
    bool stage_back = false;
    wire::RmaReqTarget served_target{};
    int error = 0;

    // Back to the state of a new op, keeping the vectors' capacity: ops are recycled, and
    // assigning a whole fresh TxOp cost a tenth of a node-local message's software time.
    void reset() {
        kind = Kind::Send;
        context = nullptr;
        cq_flags = op_flags = 0;
        report = true;
        inject_level = completed_early = false;
        len = 0;
        peer = nullptr;
        conn = nullptr;
        id = 0;
        hdr = {};
        rts.iov_count = 0;  // the entries are written as they are counted
        notify = {};
        iov.clear();
        mem.clear();
        inject_copy.clear();
        internal_keys.clear();
        remote = {};
        data = 0;
        peer_transfer = false;
        fenced = false;
        deferred = false;
        work_cntr = nullptr;
        link_wrs = 0;
        await_remote = false;
        served = stage_back = false;
        served_target = {};
        error = 0;
    }
};
// A new field must be reset above: this fails when the layout changes.
static_assert(sizeof(TxOp) == 416, "TxOp changed: update TxOp::reset()");

class Engine : public CmSource, public RemoteKeyResolver, public shm::StreamListener {
  public:
    // self: the adapter's fid_ep, which connection events name and the twin is opened for.
    Engine(Domain *domain, fi_info *info, fid_ep *self);
    ~Engine() override;

    // --- Configuration, by the adapter (main_prov/endpoint.cpp) ---------------------------
    // fi_close: -FI_EBUSY while collective groups joined are open; else everything the
    // endpoint holds is released (operations out, connections, the twin, bindings).
    int close();
    // fi_ep_bind of each class of object, before the endpoint is enabled, after the adapter
    // checked the flags (bind_av checks its own: an MSG endpoint, or an AV bound already,
    // refuses it whatever the flags). Domain lock held, except for bind_eq (see
    // DomainLock::require).
    int bind_eq(Eq *eq);
    int bind_cq(Cq *cq, uint64_t flags);
    int bind_cntr(Cntr *cntr, uint64_t flags);
    int bind_av(Av *av, uint64_t flags);
    int bind_srx(struct fid *srx);
    // The peer ops tandem installs in an SRX another provider owns (engine_owner_srx.cpp).
    static fi_ops_srx_peer *owner_peer_ops();
    // The AV this endpoint reports sources by learnt addresses (fi_av_insert, and
    // fi_av_set_user_id): messages queued with an SRX owner while their sender was unknown
    // get their source now, before the application's next receive looks for them there.
    void tell_owner_new_sources(const Av *av);
    int bind_stx(struct fid *stx);
    bool enabled() const { return enabled_; }
    int enable_locked();  // fi_enable; also implied by fi_connect / fi_accept (fi_cm(3))
    // What the options (fi_setopt / fi_getopt) set, after the adapter checked their form.
    size_t min_multi_recv() const { return rx_->min_multi_recv; }
    void set_min_multi_recv(size_t size) { rx_->min_multi_recv = size; }
    size_t cm_data_size() const { return cm_data_size_; }
    int set_cm_data_size(size_t size);
    int p2p_mode() const { return p2p_.mode(); }
    int set_p2p(int mode);
    // FI_OPT_SHARED_MEMORY_PERMITTED (1.21), before fi_enable: false keeps this endpoint off
    // shared memory both ways (its twin makes no segment, so node-local peers reach it over
    // the link too). -FI_EOPBADSTATE once enabled.
    int set_shared_memory(bool permitted);
    // FI_OPT_MAX_{MSG,TAGGED,RMA,ATOMIC}_SIZE and FI_OPT_INJECT_*_SIZE (1.22): the size limits
    // of each kind of operation, at most max_msg_size and inject_size; an application may
    // lower them. 0, or -FI_ENOPROTOOPT (no such option), -FI_EINVAL (above the attribute).
    int size_limit(int optname, size_t *value) const;
    int set_size_limit(int optname, size_t value);
    uint64_t caps() const { return caps_; }
    // fi_getopt(FI_OPT_XPU_TRIGGER): how many variables an XPU trigger of that device needs.
    int xpu_trigger_shape(fi_trigger_xpu *xpu, size_t *optlen);
    // EpDiagOps::peer_path: a peer::PeerPath or a negative errno.
    int peer_path(fi_addr_t addr);

    // --- fi_ops_ep and fi_ops_cm ----------------------------------------------------------
    ssize_t cancel(void *context);
    ssize_t rx_size_left();
    ssize_t tx_size_left();
    int setname(void *addr, size_t addrlen);
    int getname(void *addr, size_t *addrlen);
    int getpeer(void *addr, size_t *addrlen);
    int connect(const void *addr, const void *param, size_t paramlen);
    int accept(const void *param, size_t paramlen);
    int shutdown(uint64_t flags);
    // fi_join_collective (engine_coll.cpp).
    int join(const void *addr, uint64_t flags, fid_mc **mc, void *context);

    // --- The posts every data call of the adapter maps onto -------------------------------
    struct SendArgs {
        const iovec *iov;
        void **desc;
        size_t count;
        fi_addr_t dest;
        void *context;
        uint64_t flags;
        uint64_t tag;
        uint64_t data;
        bool tagged;
    };
    struct RecvArgs {
        const iovec *iov;
        void **desc;
        size_t count;
        fi_addr_t src;
        void *context;
        uint64_t flags;
        uint64_t tag;
        uint64_t ignore;
        bool tagged;
    };
    struct RmaArgs {
        const iovec *iov;
        void **desc;
        size_t count;
        fi_addr_t peer;
        uint64_t addr;
        uint64_t key;
        void *context;
        uint64_t flags;
        uint64_t data;
        bool write;
    };
    // A collective call of any form (fi_collective(3)).
    struct CollCall {
        int coll = FI_BARRIER;
        const void *buf = nullptr;
        void *desc = nullptr;
        void *result = nullptr;
        void *result_desc = nullptr;
        size_t count = 0;
        fi_addr_t coll_addr = FI_ADDR_NOTAVAIL;
        fi_addr_t root = FI_ADDR_NOTAVAIL;
        int datatype = FI_VOID;
        int op = FI_NOOP;
        uint64_t flags = 0;
        void *context = nullptr;
    };
    // Each transmit is prepared (checked, its lists copied into a request: tx_request.h) and
    // then issued, at once or, with FI_TRIGGER, when off_tandem's trigger queue starts it.
    ssize_t post_send(const SendArgs &a);
    ssize_t post_recv(const RecvArgs &a);
    // fi_trecvmsg with FI_PEEK or FI_CLAIM.
    ssize_t peek_or_claim(const RecvArgs &a);
    ssize_t post_rma(const RmaArgs &a);
    ssize_t post_atomic(const AtomicCall &a);  // any form of atomic (tx_request.h)
    ssize_t post_collective(const CollCall &c);
    // The small-message paths of the one-buffer calls (endpoint_data.cpp, inline there): a
    // send complete when it returns 0 (to a node-local peer through its lane, Peer::lane; to a
    // peer over the link when the connection takes it at once, send_by_link), and a receive
    // posted where no unexpected message waits; kNotTaken when the call needs the general post.
    static constexpr ssize_t kNotTaken = 1;
    inline ssize_t send_direct(const void *buf, size_t len, void *desc, fi_addr_t dest,
                               void *context, uint64_t flags, uint64_t tag, uint64_t data,
                               bool tagged);
    ssize_t recv_one(void *buf, size_t len, void *desc, fi_addr_t src, uint64_t tag,
                     uint64_t ignore, void *context, uint64_t flags, bool tagged);

    // The caller holds the domain lock.
    ssize_t issue_collective(CollRequest &r);
    void report_join(fid_t mc, void *context, int err);
    int leave_group(CollGroup &g);
    void coll_group_opened() { ++coll_groups_; }
    void coll_group_closed() { --coll_groups_; }

    // CmSource
    void progress_cm() override;
    void cm_watch(WaitSet &set) override;
    int sleep_limit_ms() override;
    // RemoteKeyResolver
    bool resolve(uint64_t key, uint64_t addr, size_t len, uint64_t access,
                 LocalPieces &out) noexcept override;
    void remote_access_done(uint64_t key, uint64_t access) noexcept override;

    // Inside tandem, with the domain lock held. (Inline: every poll of every CQ of the domain
    // comes through here; the twin's progress is called straight through its ops table.)
    void progress() {
        if (twin_quiet_) {
            // We read our channel's inbox (Channel::owner_reads): our cells with our decoders,
            // every other cell by the twin, a held sender's kept (shm::SenderHold). The twin
            // runs after, while it has work, and every kTwinEvery empty passes (its checks and
            // heartbeat).
            const void *cell = inbox_ring_->peek();
            if (cell)
                read_inbox(static_cast<const uint8_t *>(cell));
            else if (holds_->has_released()) [[unlikely]]
                read_inbox(nullptr);  // a hold lifted by the twin's own pass
            if (!*twin_quiet_ || (!cell && (++express_passes_ & (kTwinEvery - 1)) == 0))
                drive_twin();
        } else if (twin_cq_) {
            drive_twin();
        }
        // The link's side of the pass only when due (see progress_link): most passes of an
        // endpoint whose traffic is node-local end here.
        if (--link_countdown_ > 0) return;
        progress_link();
    }
    // Work for the link (or completions of the twin's transfers to report): the next pass
    // polls it, however long the link was idle or quiet.
    void poll_link_soon() const { link_countdown_ = 1; }
    // The link's descriptors, for a sleeper (a CQ's wait_fds, an EQ's cm_watch): what the link
    // owes its peers goes first (LinkTransport::before_sleep), and what wakes the sleeper is
    // polled at the next pass, the link counting as busy again.
    void link_fds(std::vector<WaitFd> &out);
    // The link's descriptors and the node-local path's (which arms the twin).
    void wait_fds(std::vector<WaitFd> &out);
    // Work of this endpoint that only more passes move, announced by no descriptor: bytes or
    // events its link holds (LinkTransport::busy), a shutdown held back. The caller holds the
    // domain lock.
    bool work_pending() const { return shutdown_held_ || transport_->busy(); }
    // When a pass of this endpoint has timed work (LinkTransport::next_timer_ms); -1: none.
    int64_t next_timer_ms() const { return transport_->next_timer_ms(); }
    // The twin has something going (no backlog, operation, held completion... : not quiet).
    // Whether it needs passes rather than a peer's cell is the twin's arm() to say (wait_fds):
    // a sleeper woken for this re-arms and learns it.
    bool twin_busy() const { return twin_quiet_ && !*twin_quiet_; }
    // Passive side of an MSG connection: the request this endpoint answers with fi_accept.
    void adopt_request(std::unique_ptr<LinkConnection> conn);
    // The receive operations, on any matcher; completions that belong to no arrived message
    // (FI_ENOMSG, cancel) are reported on report_ep. The caller holds the domain lock, and has
    // made a.src FI_ADDR_UNSPEC where its receives are not directed.
    static ssize_t post_recv_on(RxMatcher &m, Engine *report_ep, uint64_t caps, const RecvArgs &a,
                                const DeferredDone &done = {});
    static ssize_t peek_or_claim_on(RxMatcher &m, Engine *report_ep, const RecvArgs &a);
    static ssize_t cancel_on(RxMatcher &m, Engine *report_ep, void *context);
    Domain *domain() const { return domain_; }

    // Triggered operations and deferred work (trigger.cpp). The caller holds the domain lock.
    // An FI_TRIGGER operation, prepared: handed to off_tandem's trigger queue.
    ssize_t queue_triggered(TriggeredRequest &&r);
    // Deferred work on this endpoint (the domain's FI_QUEUE_WORK).
    int queue_deferred(TriggeredRequest &&r, Cntr *trigger, uint64_t threshold, const void *match);
    int start_triggered(TriggeredOp &op);
    void discard_triggered(TriggeredOp &op, int err, bool report);
    // The queue's group of this endpoint's deferred work (FI_FLUSH_WORK flushes it), apart
    // from its FI_TRIGGER operations (group: the endpoint itself).
    const void *work_group() const { return &work_group_; }

  private:
    // FI_OPT_FI_HMEM_P2P: whether some path of the endpoint can go peer to peer, and the
    // policy it starts with (FI_TANDEM_HMEM_P2P).
    bool can_p2p() const;
    void apply_default_p2p(int mode);
    friend class LocalPath;
    friend class OwnerFace;  // the twin's calls: the *_locked entries below
    friend class PeerRxQueue;
    friend class Domain;  // prepares deferred work (FI_QUEUE_WORK) for its endpoints

    // The bodies of post_send, post_recv, cancel and getname, with the domain lock held: the
    // application's calls take the lock and come here, the twin's (OwnerFace) come here under
    // the lock it runs in.
    ssize_t post_send_locked(const SendArgs &a, SendRequest &r);
    ssize_t post_recv_locked(const RecvArgs &a);
    ssize_t cancel_locked(void *context);
    int getname_locked(void *addr, size_t *addrlen) const;
    inline ssize_t send_by_lane(shm::PeerInbox *lane, const void *buf, size_t len, void *context,
                                uint64_t flags, uint64_t tag, uint64_t data, bool tagged);
    ssize_t send_by_link(Peer *peer, const void *buf, size_t len, void *context, uint64_t flags,
                         uint64_t tag, uint64_t data, bool tagged);
    // peer_for, without a call while the sends go to one peer.
    Peer *peer_of(fi_addr_t addr) {
        if (addr == last_peer_addr_ && last_peer_ && type_ == FI_EP_RDM &&
            peer_cache_version_ == av_version_word_->load(std::memory_order_acquire))
            return last_peer_;
        return peer_for(addr);
    }
    int prepare_send(const SendArgs &a, SendRequest &r) const;
    int prepare_rma(const RmaArgs &a, RmaRequest &r) const;
    int prepare_atomic(const AtomicCall &a, AtomicRequest &r) const;
    bool make_tx_room();
    ssize_t issue_send(SendRequest &r);
    // issue_send's ways: into a node-local peer's ring at once (kNotTaken: not a message for
    // its lane), through the offload twin, or over the link as an Eager message or an Rts.
    ssize_t inject_local(const SendRequest &r, Peer *peer, bool device);
    ssize_t lane_refused(const SendRequest &r, Peer *peer);
    bool relane(Peer *peer, fi_addr_t dest);
    TxOp *new_send_op(const SendRequest &r, Peer *peer);
    // engine_local_send.cpp: a node-local message that is no Short cell, as an Eager cell, an
    // Rts or a Frag stream through the peer's Outbox; what ends it. engine_local_ipc.cpp: one
    // of device memory, peer to peer (an IpcRts) or staged by the device's copies.
    ssize_t send_local(SendRequest &r, Peer *peer, const hmem::MemRef *mem);
    wire::LocalHeader local_header(const TxOp *op, wire::LocalOp kind);
    void send_local_eager(TxOp *op, shm::PeerInbox &to, const wire::LocalHeader &hdr,
                          const iovec *iov, size_t count, const hmem::MemRef *mem);
    void send_local_rts(TxOp *op, shm::PeerInbox &to, wire::LocalHeader hdr, int64_t posted_ns,
                        double rts_ns);
    void send_local_frag(TxOp *op, shm::PeerInbox &to, wire::LocalHeader hdr, const iovec *iov,
                         size_t count, const hmem::MemRef *mem);
    void send_local_device(TxOp *op, shm::PeerInbox &to, wire::LocalHeader hdr);
    bool send_local_ipc(TxOp *op, shm::PeerInbox &to, wire::LocalHeader hdr);
    void await_local(TxOp *op, shm::PeerInbox &to, int64_t posted_ns, double expected_ns,
                     bool ipc = false);
    [[gnu::noinline]] void receive_fin(const uint8_t *cell);
    [[gnu::noinline]] void receive_cts(const uint8_t *cell);
    void stream_ended(const shm::Stream &stream, int status) override;
    void fail_sends_to_dead();
    // Our node-local operations waiting for an answer (a Fin), by id (with kLocalOwnerOp): the
    // peer, for an Rts when it was posted and what its copy was expected to take, and whether
    // it is an IpcRts (restaged when the receiver cannot map it).
    struct LocalSend {
        TxOp *op = nullptr;
        shm::PeerInbox *to = nullptr;
        int64_t posted_ns = 0;
        double expected_ns = 0;
        bool ipc = false;
    };
    using LocalSendMap = std::unordered_map<uint64_t, LocalSend>;
    LocalSendMap local_sends_;
    void finish_local_send(uint64_t msg_id, int status);
    void finish_local_send(LocalSendMap::iterator it, int status);
    LocalSendMap::iterator local_send_to(uint64_t msg_id, const shm::PeerInbox *from);
    bool restage_local_send(const LocalSend &s);
    ssize_t send_over_link(TxOp *op, const SendRequest &r, bool device, const hmem::MemRef *mem);
    int prepare_eager(TxOp *op, const SendRequest &r, bool device, const hmem::MemRef *mem);
    int prepare_rts(TxOp *op, const SendRequest &r, bool device, const hmem::MemRef *mem,
                    hmem::P2pDecision decision);
    ssize_t issue_rma(RmaRequest &r);
    ssize_t issue_atomic(AtomicRequest &r);
    // issue_atomic's operands and compare values as byte ranges, and where they live.
    struct AtomicOperands {
        size_t elem = 0;   // bytes per element
        size_t count = 0;  // elements
        iovec operand[kMaxIov], compare[kMaxIov];
        hmem::MemRef operand_mem[kMaxIov], compare_mem[kMaxIov];
        bool device = false;  // some of them in device memory
    };
    ssize_t atomic_through_twin(TxOp *op, const AtomicCall &a, const AtomicOperands &in);
    ssize_t atomic_over_link(TxOp *op, const AtomicCall &a, AtomicOperands &in);
    ssize_t issue_recv(RecvRequest &r);
    int hand_over(TriggeredRequest &&r, peer::TriggerWork &work, const void *match);
    ssize_t queue_xpu(TriggeredRequest &&r, fi_triggered_context *ctx, peer::TriggerWork &work);
    int own_inject_payload(TriggeredOp &op);
    void report_unstarted(const TriggeredOp &op, int err);
    // The target's side of an atomic that came over a link, and the initiator's of its answer.
    void serve_atomic(LinkConnection *conn, const wire::ProtoHeader &hdr, const uint8_t *body,
                      size_t len);
    bool finish_atomic(const wire::ProtoHeader &hdr, const uint8_t *body, size_t len);
    // RMA the target serves (Domain::rma_served; main_prov/engine_served_rma.cpp): the
    // initiator's request, and the target's side of it.
    ssize_t issue_served_rma(TxOp *op, const RmaRequest &r, const hmem::MemRef *mem, bool stage);
    int expose(TxOp *op, const iovec *iov, const hmem::MemRef *mem, size_t count, uint64_t access);
    bool serve_rma(LinkConnection *conn, const wire::ProtoHeader &hdr, const uint8_t *body,
                   size_t len);
    struct ServedRma;
    // One of a job's reads or writes completed; the last one finishes it.
    void served_done(ServedRma *job, WcStatus status);
    void finish_served(ServedRma *job);
    // Whether messages from conn wait behind a served RMA (then buf is kept for later).
    bool hold_behind_served(LinkConnection *conn, const uint8_t *buf, size_t len);
    void resume_connection(LinkConnection *conn);
    // A connection about to be destroyed: served RMA on it answers nobody, nothing waits.
    void forget_served(LinkConnection *conn);
    void discard_served();
    void deliver_unexpected(RxOp *rx, Unexpected &ux);
    static void deliver_unexpected_any(RxOp *rx, Unexpected &ux);
    void check_tx_ready(uint64_t cap) const;
    void check_rx_ready(uint64_t cap) const;
    Peer *peer_for(fi_addr_t addr);
    void submit(TxOp *op);
    void release_held(Peer *peer);
    void start_tx(TxOp *op);
    void issue_tx(TxOp *op);
    void finish_tx(TxOp *op);
    void fail_tx(TxOp *op, int err);
    // finish_tx, or fail_tx with status (an FI_* code) when it is not 0.
    void settle_tx(TxOp *op, int status) { status ? fail_tx(op, status) : finish_tx(op); }
    void tx_report(TxOp *op);
    void complete_injected(const SendRequest &r);
    // Whether a transmit posted with these flags writes a CQ entry (fi_inject and friends
    // never do; under FI_SELECTIVE_COMPLETION, or as deferred work, only those asking for
    // FI_COMPLETION).
    bool tx_reports(uint64_t flags, const DeferredDone &done = {}) const {
        return !(flags & kNoCompletion) &&
               (!(tx_selective_ || done.deferred) || (flags & FI_COMPLETION));
    }
    TxOp *alloc_tx();
    void retire_tx(TxOp *op);
    Cntr *counter_for(const TxOp &op) const;
    Cntr *tx_counter(uint64_t cq_flags) const;
    static int take_payload(TxOp *op, const iovec *iov, const hmem::MemRef *mem, size_t count,
                            size_t len, bool copy);
    bool memory_of(const iovec *iov, void **desc, size_t count, uint64_t flags,
                   hmem::MemRef *mem) const;
    // A transfer of device memory over a link: what the P2P policy says (counted).
    // How device memory of a transfer of len bytes crosses the link (and the counters); `small`:
    // what FI_HMEM_P2P_ENABLED stages anyway (messages up to the eager limit).
    hmem::P2pDecision link_decision(size_t len, size_t small = 0);
    void free_tx(TxOp *op);
    void send_control(LinkConnection *conn, wire::ProtoOp op, const void *body, size_t len,
                      uint64_t msg_id);

    void handle_wc(const WorkCompletion &wc);
    void discard_link_work();
    void handle_cm_event(CmEvent &ev);
    // handle_cm_event's events: a peer's request, a connection up, refused, lost.
    void connect_requested(CmEvent &ev);
    void connection_up(Peer *peer, CmEvent &ev);
    void connection_refused(Peer *peer, CmEvent &ev);
    void connection_lost(Peer *peer, LinkConnection *conn);
    void post_held_shutdown();
    void handle_message(LinkConnection *conn, const uint8_t *buf, size_t len);
    // handle_message's kinds of message: false when it is malformed (nothing done).
    inline bool receive_eager(LinkConnection *conn, const wire::ProtoHeader &hdr,
                              const uint8_t *body, size_t body_len);
    bool receive_rts(LinkConnection *conn, const wire::ProtoHeader &hdr, const uint8_t *body,
                     size_t body_len);
    bool remote_done(const wire::ProtoHeader &hdr, const uint8_t *body, size_t body_len);
    bool receive_write_notify(LinkConnection *conn, const wire::ProtoHeader &hdr,
                              const uint8_t *body, size_t body_len);
    inline RxOp *match_from_link(const wire::ProtoHeader &hdr, fi_addr_t src);
    void keep_unexpected(LinkConnection *conn, Unexpected &&ux);
    // tandem as the peer of another provider's SRX (engine_owner_srx.cpp): a message no
    // receive of ours takes asks the owner for its buffer; kept, it is queued with the owner
    // in the entry the owner gave (unqueued_entry_), which the owner starts or discards later.
    [[gnu::noinline]] RxOp *match_with_owner(const wire::ProtoHeader &hdr, fi_addr_t src);
    RxOp *owned_receive(RxMatcher &m, void *entry, bool tagged);
    void queue_with_owner(Unexpected &kept);
    void owner_done(void *entry);
    int start_queued(Unexpected *kept, void *entry);
    int discard_queued(Unexpected *kept);
    static int owner_hands_back(fi_peer_rx_entry *entry, bool start);
    // foreach_unspec_addr's get_addr: an entry of this endpoint's (owner_queued_) its
    // message's source, any other one FI_ADDR_UNSPEC (lnx asks about its other peers' too).
    static fi_addr_t queued_source(void *entry);
    // What a completion and the owner are told of a source (FI_AV_USER_ID).
    fi_addr_t reported_source(fi_addr_t src) const;
    // The message's bytes into the receive, and its completion; the receive's error (0,
    // FI_ETRUNC, or the device's refusal or failure).
    int deliver_eager(RxOp *rx, LinkConnection *conn, const wire::ProtoHeader &hdr,
                      const uint8_t *payload, fi_addr_t src);
    // What an unexpected message discarded (FI_DISCARD) still owes its sender: the Fin of a
    // rendezvous over a link, or of a node-local message whose sender waits for one.
    void release_discarded(const Unexpected &ux);
    void keep_order(RxOp *rx, LinkConnection *conn);
    void report_rx(RxOp *rx);
    void start_rendezvous(RxOp *rx, LinkConnection *conn, const wire::ProtoHeader &hdr,
                          const wire::RtsBody &rts, fi_addr_t src);
    void finish_rendezvous(RxOp *rx);
    static RxOp *slice_for(RxMatcher &m, RxOp *rx, size_t len);
    void rx_complete(RxOp *rx, size_t len, uint64_t tag, uint64_t data, uint8_t proto_flags,
                     fi_addr_t src, int err, size_t olen);
    // A Short cell's message (the node-local path's small messages, common/short_cell.h) into
    // rx, a posted host-memory receive that is no multi-receive buffer: copied, and completed
    // as rx_complete would, with report_rx's common case inline (into receive_short, itself
    // inline into read_inbox: the calls with their arguments were a tenth of the delivering
    // read's instructions).
    inline void short_into(RxMatcher &m, RxOp *rx, const ShortView &v, fi_addr_t src);
    void release_rx(RxOp *rx);
    fi_addr_t source_of(LinkConnection *conn);
    RxMatcher &matcher_for(uint8_t proto_flags) {
        return (proto_flags & wire::kProtoPeer) ? peer_rx_ : *rx_;
    }
    // The matcher a receive of this endpoint was posted on.
    RxMatcher &matcher_of(const RxOp *rx) {
        return (rx->op_flags & FI_PEER_TRANSFER) ? peer_rx_ : *rx_;
    }
    static fi_addr_t source_of(const Unexpected &ux);
    bool goes_local(Peer *peer, fi_addr_t addr);
    void repost(void *buf);
    void fail_peer(Peer *peer, int err);

    void write_tx_cq(const Completion &c);
    void write_rx_cq(const Completion &c, fi_addr_t src);
    void write_tx_err(void *context, uint64_t flags, int err, size_t len);
    void write_rx_err(const RxOp *rx, uint64_t flags, int err, size_t len, size_t olen,
                      uint64_t tag, uint64_t data);
    // An error entry on the receive CQ (nothing else: the callers count it).
    void write_rx_error_entry(void *context, void *buf, uint64_t flags, int err, size_t len,
                              size_t olen, uint64_t tag, uint64_t data);

    Domain *domain_;
    fid_ep *self_;  // the adapter's
    fi_info *info_;
    fi_ep_type type_;
    uint64_t caps_;
    // What caps_ grants for receives and triggers, read by the API version the application
    // asked for (common/fabric_compat.h): whether a receive's source is matched, per kind
    // (index: tagged), whether a directed receive must name one, and XPU triggers.
    bool directed_[2] = {false, false};
    bool exact_source_ = false;
    bool xpu_trigger_ = false;
    bool shm_permitted_ = true;  // FI_OPT_SHARED_MEMORY_PERMITTED
    fi_addr_t rx_source(fi_addr_t src, bool tagged) const {
        return directed_[tagged] ? src : FI_ADDR_UNSPEC;
    }
    // Collectives: groups joined and not closed, operations with the twin.
    static void collective_done(void *arg, int err);
    size_t coll_groups_ = 0;
    bool enabled_ = false;
    bool closing_ = false;

    Cq *tx_cq_ = nullptr;
    Cq *rx_cq_ = nullptr;
    bool tx_selective_ = false;
    bool rx_selective_ = false;
    Cntr *send_cntr_ = nullptr, *recv_cntr_ = nullptr, *read_cntr_ = nullptr,
         *write_cntr_ = nullptr, *rread_cntr_ = nullptr, *rwrite_cntr_ = nullptr;
    Av *av_ = nullptr;
    const std::atomic<uint64_t> *av_version_word_ = nullptr;  // Av::version()'s word
    Eq *eq_ = nullptr;

    std::unique_ptr<LinkTransport> transport_;  // the link (the protocol sees LinkTransport only)
    void progress_link();
    // While the transport is idle (nothing but its listener to watch), progress polls it
    // every kIdleLinkPolls-th pass only (see progress_link()).
    static constexpr unsigned kIdleLinkPolls = 256;
    // Connections that have brought nothing for kQuietAfter polls in a row, with nothing to
    // write, are polled every kQuietLinkPolls-th pass only (see progress_link()).
    static constexpr unsigned kQuietAfter = 1024, kQuietLinkPolls = 64;
    mutable unsigned empty_link_polls_ = 0;
    mutable unsigned link_countdown_ = 1;  // passes until progress_link() is due
    std::unique_ptr<uint8_t[]> rx_slab_;   // link receive buffers
    size_t rx_buf_size_ = 0;
    size_t eager_limit_ = 0;
    size_t inject_size_ = 0;  // tx_attr->inject_size: what the protocol may send inline
    // The size options' limits, by kind of operation (engine.cpp, SizeKind), and what they
    // leave send_direct: the largest inject of a message, tagged or not.
    enum SizeKind : uint8_t { kMsgSize, kTaggedSize, kRmaSize, kAtomicSize, kSizeKinds };
    struct SizeLimits {
        size_t max[kSizeKinds];
        size_t inject[kSizeKinds];
    } limits_{};
    size_t direct_inject_ = 0;
    void apply_size_limits();
    // The largest send send_by_lane takes: the twin's cell or the endpoint's max_msg_size,
    // whichever is less; 0 without a twin.
    size_t lane_limit_ = 0;
    // Who our Short cells say wrote them: the claimant id and the Short line of the channel's
    // Sender (the twin's: one producer per process and peer ring), set with lane_limit_.
    uint32_t lane_producer_ = 0;
    const ShortLine *lane_line_ = nullptr;
    size_t link_direct_limit_ = 0;  // send_by_link's largest payload
    size_t direct_limit_ = 0;       // the larger of the two: send_direct's first check
    size_t direct_ceiling_ = 0;     // the same before the size options lowered it
    size_t cm_data_size_ = wire::kMaxCmPrivate;
    size_t cm_data_max_ = wire::kMaxCmPrivate;  // what the link's connection requests carry
    // Digest of the authorization key (fi_endpoint(3) auth_key; 0: none): connection
    // requests carry it, and only a request with the same one is accepted.
    uint64_t auth_ = 0;
    hmem::P2pPolicy p2p_;

    // Peers: RDM keyed by name; MSG has exactly one.
    std::unordered_map<std::string, std::unique_ptr<Peer>> peers_;
    std::unordered_map<fi_addr_t, Peer *> peer_by_addr_;
    uint64_t peer_cache_version_ = ~0ull;
    fi_addr_t last_peer_addr_ = FI_ADDR_NOTAVAIL;  // peer_for's last answer (same AV version)
    Peer *last_peer_ = nullptr;
    Peer *msg_peer_ = nullptr;
    EndpointName src_name_;  // bound / advertised address
    bool named_ = false;

    enum class MsgState : uint8_t { Idle, Connecting, Accepting, Connected, Shutdown };
    MsgState msg_state_ = MsgState::Idle;
    bool shutdown_held_ = false;      // FI_SHUTDOWN owed, after rx_completions_ are read
    CompletionOwner rx_completions_;  // this endpoint's receive completions in rx_cq_
    std::chrono::steady_clock::time_point shutdown_due_;  // ... or at the latest then
    static constexpr std::chrono::milliseconds kShutdownHold{1000};
    std::unique_ptr<LinkConnection> pending_request_;

    std::unique_ptr<LocalPath> local_;  // RDM: node-local peers through off_tandem
    // local_'s twin and its CQ (fi_cq_read(twin_cq_, NULL, 0) drives the twin, fi_peer(3)),
    // or null without local_.
    fid_cq *twin_cq_ = nullptr;
    fid_ep *twin_ep_ = nullptr;
    // Our channel's inbox, which we read (Channel::owner_reads): its ring and whether the
    // twin is quiet (Channel::twin_quiet; null without local_ or an inbox), the channel's holds
    // of senders behind a split write, the twin's handler of the cells that are not ours, the
    // passes since the twin last ran, and the last sender resolved.
    ShmRing *inbox_ring_ = nullptr;
    bool *twin_quiet_ = nullptr;
    shm::SenderHold *holds_ = nullptr;
    void (*twin_take_cell_)(fid_ep *, const uint8_t *) = nullptr;
    static constexpr unsigned kTwinEvery = 16;
    unsigned express_passes_ = 0;
    unsigned reading_passes_ = 0;  // passes that found a cell (read_inbox: the heartbeat)
    LastSender last_sender_;
    // The cells at the head of the twin's inbox, first `cell` (nullptr: only cells released
    // from a hold), up to a batch: each Short cell ours, every other one the twin's
    // (twin_take_cell_), a held sender's kept until its hold is lifted and then replayed
    // first, through the same dispatch (read_held).
    void read_inbox(const uint8_t *cell);
    [[gnu::noinline]] bool read_held(const uint8_t *cell);
    void dispatch_cell(const uint8_t *cell);
    // The decoder of Eager cells (a whole message under the long header): matched, delivered
    // and completed as a Short cell's message is, or kept as unexpected; a sender that asked
    // for delivery complete (wire::kLocalAckReq) gets its Fin once the message is in a
    // receive buffer, or discarded (answer_local).
    [[gnu::noinline]] void receive_eager_cell(const uint8_t *cell);
    // A node-local sender's fi_addr_t (FI_ADDR_NOTAVAIL: not in the AV): the last sender's
    // while the AV is unchanged (most cells come from the peer the one before came from),
    // else looked up and remembered. Inline: every Short cell asks it.
    [[gnu::always_inline]] fi_addr_t local_source(std::string_view sender) {
        const uint64_t version = av_version_word_->load(std::memory_order_acquire);
        if (last_sender_.matches(sender, version)) [[likely]]
            return last_sender_.addr;
        return local_source_lookup(sender, version);
    }
    fi_addr_t local_source_lookup(std::string_view sender, uint64_t version);
    // A Fin (status: 0 or a positive FI_* code) for the sender's operation msg_id, through
    // the sender's Outbox in the channel; nothing when the sender is gone.
    void answer_local(std::string_view sender, uint64_t msg_id, int status);
    // The one decoder of Short cells on our receive side (read_inbox, dispatch_cell). Matches,
    // copies and completes, or keeps the message as unexpected; a malformed cell is dropped
    // and logged.
    inline void receive_short(const uint8_t *cell);
    [[gnu::cold, gnu::noinline]] static void drop_malformed_short();
    // receive_short past a plain posted receive: a device or multi-receive buffer, or none
    // yet (unexpected).
    [[gnu::noinline]] void receive_short_slow(const uint8_t *cell, fi_addr_t src);
    void receive_local(const wire::ProtoHeader &hdr, std::string_view sender, const uint8_t *data,
                       fi_addr_t src, std::vector<uint8_t> *owned = nullptr);
    static wire::ProtoHeader proto_header_of(const wire::LocalHeader &lh);
    // The decoder of Frag cells: a staged message copied into the posted receive that took it
    // at its first fragment, or reassembled (staged_) and received whole.
    [[gnu::noinline]] void receive_frag(const uint8_t *cell);
    // A staged message under way. A plain host receive posted when its first fragment came
    // takes it then (into: each fragment is copied there as it comes, once, with nothing
    // allocated); otherwise what came so far is kept here, in order, and received whole.
    struct StagedMessage {
        wire::ProtoHeader hdr{};  // the message's (size: its total)
        pid_t pid = 0;            // the sender's process (its death ends the message)
        RxOp *into = nullptr;
        size_t placed = 0;          // into: the bytes that fit the receive
        uint64_t received = 0;      // bytes of it so far (the next fragment's offset)
        std::vector<uint8_t> data;  // without into
        // A device message the receiver could not map, sent again in cells (kLocalRestaged)
        // into the receive its IpcRts matched (restage_local_ipc); status: what that receive
        // completes with instead, its fragments not copied (FI_EOPNOTSUPP: a device receive
        // under FI_HMEM_P2P_REQUIRED takes no staged copy).
        bool restaged = false;
        int status = 0;
    };
    using StagedMap = std::map<std::pair<std::string, uint64_t>, StagedMessage>;  // sender, id
    StagedMap::iterator start_staged(std::pair<std::string, uint64_t> id,
                                     const wire::LocalHeader &lh, std::string_view sender);
    bool awaits_restaged(StagedMap::iterator it, const wire::LocalHeader &lh);
    void place_device_fragment(StagedMessage &m, uint64_t offset, const uint8_t *body,
                               uint32_t size);
    void finish_staged(StagedMap::iterator it);
    // The message will not come whole: a receive that took it fails with status (an FI_*
    // code), and what came of it goes.
    void end_staged(StagedMap::iterator it, int status);
    // The staged messages and split copies of senders the channel's liveness check found dead
    // (their receives fail with FI_ECONNRESET); deaths_seen_: how many of its deaths we
    // looked at.
    [[gnu::noinline]] void forget_dead_senders();
    StagedMap staged_;
    size_t deaths_seen_ = 0;
    // The decoder of Rts cells (engine_local_rts.cpp): the message read out of its sender's
    // memory (cross-memory attach, shm::SingleCopy) into the posted receive it matches, or kept
    // as unexpected with the sender's buffer list until one is posted; the sender's Fin once
    // it is read, or discarded.
    [[gnu::noinline]] void receive_rts_cell(const uint8_t *cell);
    // An Rts or IpcRts checked, its process vouched for (lh.pid): matched and started, or kept
    // as unexpected (an IpcRts's handles, entries, in its data) until a receive takes it
    // (deliver_unexpected ─ start_local_rendezvous).
    void receive_local_rendezvous(const wire::LocalHeader &lh, std::string_view sender,
                                  LocalRts rts, const uint8_t *entries);
    void start_local_rendezvous(RxOp *rx, const wire::ProtoHeader &hdr, std::string_view sender,
                                const LocalRts &rts, const uint8_t *entries, fi_addr_t src);
    void start_local_rts(RxOp *rx, const wire::ProtoHeader &hdr, std::string_view sender,
                         const LocalRts &rts, fi_addr_t src);
    void finish_local_rts(RxOp *rx, const wire::ProtoHeader &hdr, std::string_view sender,
                          fi_addr_t src, size_t n, int err);
    // The decoder of IpcRts cells (engine_local_ipc.cpp): a message in its sender's device
    // memory, mapped and copied by the twin (LocalPath::copy_ipc) into the posted receive it
    // matches, or kept as unexpected with the sender's handles (Unexpected::data) until one is
    // posted; the sender's Fin once it is copied, or FI_EOPNOTSUPP when it cannot be mapped
    // here: the sender then restages it into the receive (restage_local_ipc).
    [[gnu::noinline]] void receive_ipc_cell(const uint8_t *cell);
    void start_local_ipc(RxOp *rx, const wire::ProtoHeader &hdr, std::string_view sender,
                         const LocalRts &ipc, const uint8_t *entries, fi_addr_t src);
    void restage_local_ipc(RxOp *rx, const wire::ProtoHeader &hdr, std::string_view sender,
                           pid_t pid);
    // A WriteDone ending one of our split copies (false: not ours, the twin's RMA target's).
    [[gnu::noinline]] bool receive_write_done(const uint8_t *cell);
    // Split copies whose sender writes its part (by sender and id), until its WriteDone.
    struct LocalSplit {
        RxOp *rx = nullptr;
        wire::ProtoHeader hdr{};  // the message's (size: what the sender sends)
        fi_addr_t src = FI_ADDR_NOTAVAIL;
        shm::SingleCopy copy;
    };
    std::map<std::pair<std::string, uint64_t>, LocalSplit> local_splits_;
    // The channel's backlogs are the twin's pass to flush: after a push of ours (an answer,
    // a Cts) that waits in one, that pass must come.
    void flush_soon(shm::Channel &channel);
    // The twin's pass (fi_peer(3): a read of its CQ with no room for entries), then, while a
    // staged message or a split copy waits on its sender, what the channel's liveness check
    // (the twin's) found dead.
    void drive_twin() {
        fi_cq_read(twin_cq_, nullptr, 0);
        if (!staged_.empty() || !local_splits_.empty() || !local_sends_.empty()) [[unlikely]]
            wait_on_senders();
    }
    // What the liveness check found dead ends (forget_dead_senders), and while a split copy's
    // sender writes its part with nothing in our inbox, every kYieldEvery such passes give the
    // core away: the sender may be waiting for it (more processes than cores), as the twin
    // does for what waits on its peers.
    [[gnu::noinline]] void wait_on_senders();
    // Whether operations of ours wait on a node-local peer (a send's Fin, a split copy's
    // WriteDone, a staged message's next fragments): told to the twin, whose liveness check
    // then runs for them as for its own waits, on every pass and by a timer while we sleep
    // (shm::Channel::owner_waits). Called wherever one starts or ends.
    void note_owner_waits();
    static constexpr unsigned kYieldEvery = 4;
    unsigned split_waits_ = 0;
    // Whether a device receive refuses len bytes of a node-local message (deliver_eager).
    bool local_refuses_device(size_t len);
    // FI_PEER_TRANSFER: the twin's receives (its traffic never meets the application's).
    RxMatcher peer_rx_;
    RxMatcher own_rx_;
    RxMatcher *rx_ = &own_rx_;  // own_rx_, or the shared receive context's
    // Bound to an SRX another provider owns (FI_PEER): that owner; and the entry it gave for a
    // message keep_unexpected is about to keep.
    peer::ForeignOwnerSrx *owner_srx_ = nullptr;
    void *unqueued_entry_ = nullptr;
    // The entries messages are queued with the owner in, until it starts or discards them.
    std::unordered_set<void *> owner_queued_;
    struct fid *srx_ = nullptr;
    struct fid *stx_ = nullptr;
    std::unordered_map<uint64_t, TxOp *> await_remote_;
    // Served RMA in progress at this target, and the connections whose messages wait behind
    // it (copies, in arrival order).
    std::unordered_set<ServedRma *> served_;
    std::unordered_map<LinkConnection *, std::deque<std::vector<uint8_t>>> held_behind_served_;
    // Every TxOp this endpoint made, whatever holds it now (the link, the offload twin, a
    // peer's waiting list, the free list): all go with the endpoint, so closing it while
    // operations are still out loses none. As many as were ever outstanding at once.
    std::vector<std::unique_ptr<TxOp>> tx_ops_;
    std::vector<TxOp *> tx_free_;  // free list: no allocation per send in steady state
    uint64_t next_op_id_ = 1;
    size_t tx_outstanding_ = 0;
    // Triggered transmits and receives waiting in off_tandem's queue: they count against the
    // queue depths (tx_attr->size, rx_attr->size) as posted operations do.
    size_t tx_triggered_ = 0;
    size_t rx_triggered_ = 0;
    char work_group_ = 0;         // (its address names work_group())
    bool used_triggers_ = false;  // handed work to off_tandem's queue (discarded at close)
};

}  // namespace tandem
