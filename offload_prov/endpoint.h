// off_tandem's fid_ep: the offload twin of one owner (tandem) RDM endpoint, carrying the
// owner's traffic to peers on the same node over shared memory.
//
// Each endpoint owns a segment (/dev/shm, mode 0600) named after the owner endpoint's
// address, holding its inbox: a lock-free multi-producer ring of 8 KiB cells
// (wire::LocalHeader + the sender's name + body). A sender finds a peer's segment from the
// peer's address in the shared AV and pushes cells into its inbox:
//  - messages that fit a cell go inline (Eager);
//  - larger ones are read by the receiver straight from the sender's buffers with
//    process_vm_readv (Rts, answered by Fin) where the kernel permits cross-memory attach,
//    and otherwise staged through the ring in Frag cells;
//  - RMA writes and reads resolve the target key through the owner's endpoint
//    (peer::OwnerOps) and copy with CMA (or WriteFrag / ReadData cells without it);
//  - device memory (FI_HMEM) goes peer to peer where the policy lets it (IpcRts: the receiver
//    maps the sender's IPC handles and its device copies), and is otherwise staged through
//    cells by the device's own copies; the CPU never touches it.
// Receives are the owner's: an arriving message asks the owner's SRX for a buffer
// (get_msg / get_tag); a message that finds none is queued with the owner and held here until
// the owner starts or discards it. When the owner is tandem, it reads our inbox itself
// (Channel::owner_reads): it decodes the Short and Eager cells and hands us the others (take_cell),
// keeping a sender's cells behind a split write of theirs (the channel's shm::SenderHold,
// which our RMA target sets and lifts). Completions go to the owner's CQ (fid_peer_cq); those
// of sends that complete when posted are written at the next progress
// call, so that the owner is never re-entered from inside its own send.
#pragma once

#include "common/coarse_clock.h"
#include "common/fid_adaptor.h"
#include "common/ring_queue.h"
#include "common/short_cell.h"
#include "common/wire.h"
#include "hmem/atomic.h"
#include "hmem/ipc_cache.h"
#include "hmem/p2p_policy.h"
#include "offload_prov/coll/engine.h"
#include "common/shm_ring.h"
#include "main_prov/shm/channel.h"
#include "main_prov/shm/single_copy.h"
#include "peer/offload_ops.h"
#include "peer/peer_abi.h"
#include "peer/peer_cq.h"

#include <rdma/fi_atomic.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem::off {

class Domain;
class Cq;
class Av;
class Srx;
class Eq;

// Largest message or RMA an endpoint takes (ep_attr->max_msg_size).
inline constexpr uint64_t kMaxMessage = 1ull << 31;

class Endpoint;

// A send or RMA captured from the owner's call (the prepare step): checked, with its lists and
// where each buffer lives copied, so that issuing it does not depend on the caller's arrays.
struct LocalRequest {
    iovec iov[wire::kLocalMaxIov];
    hmem::MemRef mem[wire::kLocalMaxIov];  // valid when device
    size_t count = 0;
    size_t len = 0;
    bool device = false;
    fi_addr_t peer = FI_ADDR_UNSPEC;
    void *context = nullptr;
    uint64_t flags = 0;
    uint64_t data = 0;
    uint64_t tag = 0;  // sends
    bool tagged = false;
    fi_rma_iov rma{};  // RMA
    bool write = false;
};

// What an endpoint holds for a message the owner queued (fi_peer_rx_entry::peer_context).
struct HeldMessage {
    Endpoint *ep = nullptr;
    wire::LocalHeader hdr{};
    std::string sender;                        // the sender's key (to answer Fin)
    std::vector<uint8_t> data;                 // Eager / assembled Frag payload
    wire::LocalIov iov[wire::kLocalMaxIov]{};  // Rts: the sender's buffers
    wire::LocalIpc ipc[wire::kLocalMaxIov]{};  // IpcRts: the sender's device buffers
    fi_addr_t src = FI_ADDR_NOTAVAIL;
};

class Endpoint : public FidObject<Endpoint, fid_ep> {
  public:
    Endpoint(Domain *domain, const fi_info *info, fi_peer_transfer_context *transfer);
    ~Endpoint();

    int close();
    int bind(struct fid *bfid, uint64_t flags);
    int control(int command, void *arg);
    ssize_t sendmsg(const fi_msg *msg, uint64_t flags);
    ssize_t tsendmsg(const fi_msg_tagged *msg, uint64_t flags);
    int setopt(int level, int optname, const void *optval, size_t optlen);
    int getopt(int level, int optname, void *optval, size_t *optlen);
    ssize_t writemsg(const fi_msg_rma *msg, uint64_t flags);
    ssize_t readmsg(const fi_msg_rma *msg, uint64_t flags);
    // Atomics (ep/atomic.cpp): the owner posts the *msg forms.
    ssize_t atomicmsg(const fi_msg_atomic *msg, uint64_t flags);
    ssize_t fetch_atomicmsg(const fi_msg_atomic *msg, fi_ioc *resultv, void **result_desc,
                            size_t result_count, uint64_t flags);
    ssize_t compare_atomicmsg(const fi_msg_atomic *msg, const fi_ioc *comparev, void **compare_desc,
                              size_t compare_count, fi_ioc *resultv, void **result_desc,
                              size_t result_count, uint64_t flags);
    static fi_ops_atomic *atomic_ops();

    // Called by the owner, under its serialisation.
    void progress();
    [[gnu::noinline]] void progress_all(bool counted, bool check_due = false);
    int reachable(fi_addr_t addr);
    // What a sleeper watches is the channel's wake descriptor: readable when a peer woke us
    // (the FIFO) or a liveness check of the peers our operations wait on is due (a timer
    // armed by arm()). 1 when work is pending (the descriptor made readable already).
    // Through fi_trywait on our CQ (Cq::trywait).
    int arm();
    // peer::OffloadOps::attach: the owner's node-local channel, which we open our inbox on
    // when enabled and send through, and its answers about remote keys (null: none, RMA and
    // atomics that target us are refused). Before fi_enable, once.
    int attach(shm::Channel *channel, const peer::OwnerOps *owner_ops);
    // peer::OffloadOps::take_cell: a cell of ours the owner read (ep/progress.cpp).
    void take_cell(const uint8_t *cell);
    // Peer transfer completions from the owner (fi_ops_transfer_peer).
    void transfer_complete(const fi_cq_tagged_entry &entry, fi_addr_t src);
    void transfer_error(const fi_cq_err_entry &err);
    static int start_held(fi_peer_rx_entry *entry);
    // `len` bytes of a node-local peer's device buffers (`count` IpcRts entries of process
    // `pid`, vouched for), mapped here (cached) and copied into `to` (where `to_mem` says; all
    // host when null) by the devices' engines: 0, FI_EOPNOTSUPP when a buffer cannot be mapped
    // here (the sender may restage it), another FI_* code when a copy fails (ep/receive.cpp;
    // peer::OffloadOps::copy_ipc for the owner's receives).
    int copy_from_ipc(pid_t pid, const wire::LocalIpc *ipc, size_t count, const iovec *to,
                      const hmem::MemRef *to_mem, size_t nto, size_t len);
    // The IPC handles of `count` device buffers (our cache of exports), as an IpcRts carries
    // them: the number of entries written to `out` (empty buffers are left out), or
    // -FI_EOPNOTSUPP when a buffer is host memory or the driver gives it no handle
    // (peer::OffloadOps::export_ipc for the owner's sends; post_ipc for ours).
    int export_ipc(const iovec *iov, const hmem::MemRef *mem, size_t count, wire::LocalIpc *out);
    static int discard_held(fi_peer_rx_entry *entry);
    // (The owner's collective calls come through here: they bring work.)
    coll::Engine &coll() {
        note_work();
        return coll_;
    }

  private:
    // The public calls above live with their job: sendmsg, tsendmsg in ep/send.cpp;
    // writemsg, readmsg in ep/rma.cpp; the atomics in ep/atomic.cpp; progress in
    // ep/progress.cpp; reachable in ep/peer_links.cpp; arm in ep/cell_send.cpp; start_held,
    // discard_held in ep/receive.cpp; the rest in endpoint.cpp.

    using StreamEnd = shm::StreamEnd;
    // The end of each of our streams (finish_stream): we name ourselves the channel's
    // listener (shm::Sender::streams), every stream being ours.
    struct StreamEnds final : shm::StreamListener {
        Endpoint *ep = nullptr;
        void stream_ended(const shm::Stream &stream, int status) override {
            ep->finish_stream(stream, status);
        }
    };
    // A node-local peer, as the channel opened it (its inbox, our Outbox to it, ...).
    // (The application's operations are refused, -FI_EAGAIN, while anything waits in its
    // Outbox's backlog or the ring is full, so the backlog holds at most one of theirs, a
    // message whose room another producer took first, besides our answers to the peer's own
    // operations, bounded by its transmit queue.)
    using PeerLink = shm::PeerInbox;
    // A channel of our own, for an owner that lends none (a provider tandem did not build):
    // fi_peer(3)'s AV gives no way to read an entry, so it looks no address up. It receives
    // (its inbox is published under the owner's address) and reaches no peer.
    struct NoAddresses final : shm::AddressBook {
        const std::atomic<uint64_t> *version_word() const override { return nullptr; }
        int lookup(fi_addr_t, void *, size_t *) const override { return -FI_ENOSYS; }
        fi_addr_t addr_of(const void *, size_t) const override { return FI_ADDR_NOTAVAIL; }
    };
    struct OwnChannel {
        shm::Sender sender;
        NoAddresses book;
        shm::Channel channel{sender, book};
    };
    // An operation waiting for the target's Fin (Rts, RMA) or for ReadData cells.
    struct Pending {
        void *context = nullptr;
        uint64_t flags = 0;
        size_t len = 0;
        PeerLink *link = nullptr;
        std::vector<iovec> iov{};  // a read's destination, a send's source (for Cts)
        size_t received = 0;
        std::vector<hmem::MemRef> mem{};  // where iov lives (empty: host memory)
        bool ipc = false;                 // an IpcRts or IpcWrite: refused, it goes again staged
        bool rma_write = false;           // an IpcWrite: where it goes, for the staged copy
        uint64_t rma_addr = 0, rma_key = 0;
        bool ack = false;               // FI_DELIVERY_COMPLETE: then the staged copy too
        std::vector<uint8_t> bounce{};  // staged device memory the receiver reads (Rts)
        uint64_t tag = 0, data = 0;
        uint8_t hdr_flags = 0;
        // A host Rts: when it was posted, and what its copy was expected to take (the Fin's
        // lateness beyond that is the receiver's, stages_better).
        int64_t posted_ns = 0;
        double expected_ns = 0;
    };
    using PendingMap = std::unordered_map<uint64_t, Pending>;
    struct Staged {  // a Frag message being assembled
        wire::LocalHeader hdr{};
        std::vector<uint8_t> data;  // what arrived so far, in order
    };

    // endpoint.cpp: the rest of the lifecycle.
    void enable();

    // ep/peer_links.cpp: peers (the channel's) by fi_addr_t or by sender, and their liveness.
    PeerLink *link_for(fi_addr_t addr) { return channel_->peer_at(addr); }
    PeerLink *link_to(std::string_view sender) { return channel_->sender_peer(sender); }
    fi_addr_t source_of(std::string_view sender) { return channel_->source_of(sender); }
    bool check_peers();
    // Whether operations wait on a peer (its answer, a split copy's other half, an atomic's
    // result, a restaged copy): its liveness is then checked (progress_all), and a sleeper
    // wakes for the checks (arm_liveness_timer).
    bool waiting_on_peers() const {
        return atomics_pending_ || !pending_.empty() || !splits_.empty() || !restaging_.empty() ||
               (channel_ && channel_->owner_waits);
    }
    void bury(PeerLink &link);

    // ep/cell_send.cpp: what a stream's end does, answers, and the sleep (arm). The cells
    // themselves go through each link's shm::Outbox (main_prov/shm/outbox.h).
    void finish_stream(const shm::Stream &stream, int status);
    void answer(std::string_view sender, uint64_t msg_id, int status);

    // ep/send.cpp: messages (Eager, Rts, Frag, IpcRts), and the end of a pending operation.
    // Sends and RMA are prepared (checked, their lists copied into a LocalRequest) and then
    // issued.
    int prepare(const iovec *iov, void **desc, size_t count, fi_addr_t peer, void *context,
                uint64_t flags, uint64_t data, LocalRequest &r) const;
    ssize_t issue_send(LocalRequest &r);
    wire::LocalHeader message_header(size_t len, uint64_t tag, uint64_t data, uint64_t flags,
                                     bool tagged);
    void send_rts(PeerLink &link, wire::LocalHeader hdr, Pending p);
    bool post_ipc(PeerLink &link, wire::LocalHeader hdr, const iovec *iov, const hmem::MemRef *mem,
                  size_t count, Pending p, wire::LocalOp op = wire::LocalOp::IpcRts);
    // A staged send's end: at the receiver's Fin (FI_DELIVERY_COMPLETE), else when sent.
    static StreamEnd send_end(bool ack, void *context, uint64_t flags) {
        if (ack) return {.kind = StreamEnd::Kind::FailPending};
        return {.kind = StreamEnd::Kind::CompleteTx, .context = context, .flags = flags};
    }
    void finish_pending(uint64_t msg_id, int status);
    void finish_pending(PendingMap::iterator it, int status);
    // Our operation an answer (Fin, ReadData, Cts) is for, when its sender is the peer the
    // operation went to; pending_.end() otherwise (ep/progress.cpp).
    PendingMap::iterator answered_by(const wire::LocalHeader &hdr, std::string_view sender);

    // ep/rma.cpp: RMA at the initiator.
    ssize_t issue_rma(LocalRequest &r);
    bool stage_device_rma(PeerLink &link, const LocalRequest &r, const wire::LocalHeader &hdr,
                          Pending &p);
    void push_rma_write(PeerLink &link, wire::LocalHeader hdr, const LocalRequest &r,
                        const wire::LocalIov *body, size_t n, bool cma);

    // ep/rma_target.cpp: RMA at the target.
    int resolve(uint64_t key, uint64_t addr, size_t len, uint64_t access, iovec *iov,
                hmem::MemRef *mem, size_t *count);
    void handle_rma(const wire::LocalHeader &hdr, std::string_view sender, const uint8_t *body);
    struct RmaRegion;
    bool drop_failed_fragment(const wire::LocalHeader &hdr, std::string_view sender, bool last);
    int rma_write(const wire::LocalHeader &hdr, std::string_view sender, const uint8_t *body,
                  const RmaRegion &region);
    int rma_read(const wire::LocalHeader &hdr, std::string_view sender, const uint8_t *body,
                 const RmaRegion &region);
    void finish_rma(const wire::LocalHeader &hdr, std::string_view sender, int status);

    // ep/split_copy.cpp: copies by both sides (Cts, WriteDone): the sender's part, and the end
    // of a split of ours (the write finished, or the message delivered).
    struct Split;
    void end_split(const Split &split, std::string_view sender);
    void handle_cts(const wire::LocalHeader &hdr, std::string_view sender, const uint8_t *body);
    void handle_write_done(const wire::LocalHeader &hdr, std::string_view sender);

    // ep/receive.cpp: a message into the owner's receive buffer, or held for one.
    void handle_message(const wire::LocalHeader &hdr, std::string_view sender, fi_addr_t src,
                        const uint8_t *data, const wire::LocalIov *rts_iov,
                        std::vector<uint8_t> *owned, const wire::LocalIpc *ipc = nullptr);
    // The same once the owner's SRX answered (ret and entry as its get_tag / get_msg).
    void place_message(int ret, fi_peer_rx_entry *entry, const wire::LocalHeader &hdr,
                       std::string_view sender, fi_addr_t src, const uint8_t *data,
                       const wire::LocalIov *rts_iov, std::vector<uint8_t> *owned,
                       const wire::LocalIpc *ipc);
    void deliver(fi_peer_rx_entry *entry, const wire::LocalHeader &hdr, std::string_view sender,
                 const uint8_t *data, const wire::LocalIov *iov, fi_addr_t src,
                 const wire::LocalIpc *ipc = nullptr);
    int map_ipc(pid_t pid, const wire::LocalIpc *ipc, size_t count, uint64_t local_device,
                iovec *remote, hmem::MemRef *rmem);
    void complete_rx(fi_peer_rx_entry *entry, const wire::LocalHeader &hdr, size_t n, int err,
                     fi_addr_t src);

    // ep/progress.cpp: cells dispatched by op, and completions to the owner's CQ.
    void complete_tx(void *context, uint64_t flags, size_t len, int err);
    void handle_cell(const uint8_t *cell);
    void handle_short(const uint8_t *cell);
    [[gnu::noinline]] void place_short(const uint8_t *cell, fi_addr_t src, int ret,
                                       fi_peer_rx_entry *entry);
    struct CqWrite;
    void write_cq(const CqWrite &w);
    bool try_write_cq(const CqWrite &w);

    // ep/progress.cpp: handle_cell's parts, a cell under the long header by its op.
    void handle_long_cell(const wire::LocalHeader &hdr, std::string_view sender,
                          const uint8_t *body);
    void handle_frag(const wire::LocalHeader &hdr, std::string_view sender, const uint8_t *body);
    void abandon_staged(const std::pair<std::string, uint64_t> &id, const wire::LocalHeader &hdr,
                        std::string_view sender);
    void handle_read_data(PendingMap::iterator it, const wire::LocalHeader &hdr,
                          const uint8_t *body);

    // ep/send.cpp: issue_send's parts, host or device memory.
    void send_host(const LocalRequest &r, PeerLink &link, wire::LocalHeader &hdr,
                   uint64_t cq_flags);
    void send_device(const LocalRequest &r, PeerLink &link, wire::LocalHeader &hdr,
                     uint64_t cq_flags);
    bool send_peer_to_peer(const LocalRequest &r, PeerLink &link, const wire::LocalHeader &hdr,
                           uint64_t cq_flags);
    void await_delivery(wire::LocalHeader &hdr, PeerLink &link, const LocalRequest &r,
                        uint64_t cq_flags);

    // ep/atomic.cpp: node-local atomics, at the initiator and at the target.
    ssize_t post_atomic(atomic::Kind kind, const fi_msg_atomic &msg, const fi_ioc *compare,
                        void **compare_desc, size_t ncompare, const fi_ioc *result,
                        void **result_desc, size_t nresult, uint64_t flags);
    // An atomic waiting for its AtomicResp: in a slot of atomics_ (no allocation per
    // operation), named on the wire by slot and generation (AtomicSlot::id).
    struct AtomicSlot {
        void *context = nullptr;
        uint64_t flags = 0;
        size_t len = 0;
        PeerLink *link = nullptr;  // nullptr: the slot is free
        uint32_t generation = 0;
        uint32_t nresult = 0;
        bool device = false;  // result buffers in device memory (mem says where)
        iovec result[wire::kLocalMaxIov]{};
        hmem::MemRef mem[wire::kLocalMaxIov]{};
        uint64_t id(uint32_t slot) const { return uint64_t(generation) << 32 | slot; }
    };
    AtomicSlot *atomic_slot(uint64_t id);
    void finish_atomic_slot(AtomicSlot &slot, int status);
    // The target's side of an Atomic cell, and the initiator's of its AtomicResp.
    void serve_atomic(const uint8_t *cell);
    void finish_atomic(const uint8_t *cell);

    // endpoint.cpp: what we are bound to, and our own inbox.
    Domain *domain_;
    fi_info *info_;
    fid_ep *owner_ep_;
    const peer::OwnerOps *owner_ep_ops_ = nullptr;
    Cq *cq_ = nullptr;
    Av *av_ = nullptr;
    Srx *srx_ = nullptr;
    bool enabled_ = false;

    uint64_t auth_ = 0;          // our owner's authorization key (digest): peers must have the same
    wire::LocalHeader proto_{};  // name_len filled
    uint8_t name_[wire::kLocalNameRoom]{};
    // Our Short cells' line (common/short_cell.h): the owner's carry it too (channel_->sender()).
    ShortLine short_line_;

    // The node-local channel (main_prov/shm/channel.h), the owner's (attach) or, without
    // one lent, our own: our inbox, its split-copy claims (ep/split_copy.cpp), the FIFO peers
    // wake us through and our liveness timer (a peer that dies writes nothing, so a sleeper
    // whose operations wait on peers must wake for the next check of them by itself:
    // arm_liveness_timer), and the peers. Set from enable on.
    shm::Channel *channel_ = nullptr;
    std::unique_ptr<OwnChannel> own_channel_;
    // The channel's sender, which we fill in at enable (ep/cell_send.cpp; ->backlogged: links
    // whose backlog is not empty), and the end of our streams.
    shm::Sender *sender_ = nullptr;
    StreamEnds stream_ends_{};
    void arm_liveness_timer();
    int64_t next_check_ms_ = 0;  // coarse_now_ms() of the next liveness check

    // ep/send.cpp, ep/rma.cpp
    PendingMap pending_;
    uint64_t next_id_ = 1;

    // ep/atomic.cpp
    std::vector<AtomicSlot> atomics_;
    // The last target an atomic resolved to through the owner (one piece), kept while the
    // owner's MR generation has not moved: a run of atomics on one word (a counter, a lock)
    // asks the owner once.
    struct ResolvedTarget {
        uint64_t generation = 0, key = 0, addr = 0, access = 0;
        size_t len = 0;
        iovec piece{};
        hmem::MemRef mem{};
        bool valid = false;
    };
    ResolvedTarget resolved_;
    const std::atomic<uint64_t> *mr_generation_ = nullptr;
    std::vector<uint32_t> free_atomics_;
    size_t atomics_pending_ = 0;

    // ep/receive.cpp (staged_: Frag cells, assembled in ep/progress.cpp)
    std::map<std::pair<std::string, uint64_t>, Staged> staged_;
    // IpcRts messages we could not map: the receive waits for the sender's staged copy.
    std::map<std::pair<std::string, uint64_t>, fi_peer_rx_entry *> restaging_;
    hmem::P2pPolicy p2p_;
    hmem::IpcExportCache ipc_export_;
    hmem::IpcImportCache ipc_import_;
    std::set<HeldMessage *> held_;

    // ep/rma_target.cpp, ep/split_copy.cpp
    // Pieces an RMA key resolves to through the owner, at most (its LocalPieces::kMax).
    static constexpr size_t kMaxRmaPieces = 16;
    // What an RMA key resolved to through the owner: the target region's pieces, where each
    // lives, and whether any is device memory (CMA cannot reach it).
    struct RmaRegion {
        iovec pieces[kMaxRmaPieces];
        hmem::MemRef mem[kMaxRmaPieces];
        size_t count = kMaxRmaPieces;
        bool device = false;
        int place(size_t at, const uint8_t *from, size_t k) const;
    };
    // Rts messages (for an owner that is not tandem) and RMA writes copied by both sides: the
    // receiver's (target's) half is done, the sender's (initiator's) pending.
    struct Split {
        fi_peer_rx_entry *entry;  // the receive; nullptr for an RMA write
        wire::LocalHeader hdr;
        fi_addr_t src;
        shm::SingleCopy copy;  // into the receive, or the write's target region
    };
    std::map<std::pair<std::string, uint64_t>, Split> splits_;
    // Staged writes (WriteFrag) whose fragment failed here, by initiator and id: the first
    // error, reported at their last fragment.
    std::map<std::pair<std::string, uint64_t>, int> failed_writes_;

    // ep/progress.cpp
    struct TxCompletion {
        void *context;
        uint64_t flags;
        size_t len;
        int err;
    };
    RingQueue<TxCompletion> tx_done_;
    // A completion for the owner's CQ (and a receive's entry to hand back once it is written).
    struct CqWrite {
        enum class Kind : uint8_t { Entry, Error, None /* only the entry goes back */ } kind;
        fi_cq_err_entry e{};  // the fields of either kind of completion
        fi_addr_t src = FI_ADDR_NOTAVAIL;
        fi_peer_rx_entry *entry = nullptr;
    };
    RingQueue<CqWrite> cq_backlog_;  // refused by the owner's CQ (-FI_EAGAIN), in order
    uint64_t passes_ = 0;
    // Our heartbeat in our segment (SegmentInfo::heartbeat): the coarse clock (ms) of one of
    // our last 64 passes, so that peers see whether we poll (the clock read costs a pass's
    // worth of instructions: once in 64). True when the same clock says the peers' liveness
    // check is due.
    bool beat() {
        const int64_t now = coarse_now_ms();
        if (channel_) channel_->beat(now);
        return now >= next_check_ms_;
    }
    // Nothing waits for a progress pass but what a cell may bring (no backlog, completion,
    // pending operation, collective): progress only peeks at the inbox. Kept in the channel
    // (Channel::twin_quiet), where an owner that reads the inbox sees it: set at the end of a
    // pass that leaves nothing behind; cleared by every call of the owner's that may bring
    // work (note_work). One that forgot to would only wait for the whole pass that comes every
    // 1024 passes.
    void note_work() {
        if (channel_) channel_->twin_quiet = false;
    }
    // FI_OPT_SHARED_MEMORY_PERMITTED (the owner's, handed on before fi_enable): false, and we
    // make no segment, have no inbox and reach no peer (link_for answers none).
    bool shm_permitted_ = true;
    // Passes in a row that found nothing while operations waited on a peer (progress_all).
    static constexpr unsigned kYieldAfter = 4;
    unsigned fruitless_passes_ = 0;
    // Our passes leave the ring alone: our own owner reads it (Channel::owner_reads; it
    // decodes every Short cell itself and hands us the cells that are ours through take_cell,
    // counted for the pass's yield decision), or we have none (shared memory not permitted).
    bool owner_reads() const { return channel_->owner_reads || !channel_->inbox(); }
    int cells_from_owner_ = 0;

    // coll/: the owner's collective groups and their operations (peer::OffloadOps, its coll_*
    // entries).
    coll::Engine coll_{owner_ep_, [this](fi_addr_t a) { return reachable(a) == 1; }};
};

}  // namespace tandem::off
