// The node-local channel of one endpoint: its own inbox (the segment it publishes, the wake
// FIFO, the claim table of its split copies, its heartbeat), the peers it has opened and how
// they are found (by a destination's fi_addr_t, by the address key, by the sender a cell
// names), who writes its cells (a Sender), and the liveness check that buries a peer whose
// process is gone. Protocol decisions (which cells an operation sends, what waits on a peer)
// are the endpoint's; this class keeps the channel's state and its caches.
//
// Built by tandem's endpoint over its own AV (LocalPath) and lent to its offload twin
// (peer::OffloadOps::attach), which opens the inbox on it (with its settings, FI_OFF_TANDEM_*)
// and sends its own cells (RMA, atomics, answers) through it; tandem reads the inbox, writes
// its messages' cells through the peers' Outboxes and sleeps on its wake
// (docs/architecture.md, step 3).
#pragma once

#include "main_prov/shm/inbox_segment.h"
#include "main_prov/shm/peer_inbox.h"
#include "main_prov/shm/shm_segment.h"
#include "main_prov/shm/sender_hold.h"
#include "main_prov/shm/split_claims.h"
#include "main_prov/shm/wake.h"
#include "common/coarse_clock.h"
#include "common/short_cell.h"

#include <rdma/fabric.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem::shm {

// The address vector as the channel reads it: the address stored at an fi_addr_t (to find a
// destination's inbox) and the reverse (a cell's sender as an fi_addr_t). Answers are kept
// while the version word stays the same.
class AddressBook {
  public:
    // Moves whenever an entry is inserted or removed, valid as long as the AV; nullptr: every
    // lookup is a new version (nothing is kept). Asked once, when the inbox opens.
    virtual const std::atomic<uint64_t> *version_word() const = 0;
    // fi_av_lookup's answer: 0, *addrlen in: room, out: the address's length.
    virtual int lookup(fi_addr_t addr, void *buf, size_t *addrlen) const = 0;
    // The fi_addr_t of an address; FI_ADDR_NOTAVAIL when it is not inserted.
    virtual fi_addr_t addr_of(const void *addr, size_t addrlen) const = 0;

  protected:
    ~AddressBook() = default;
};

class Channel {
  public:
    // The inbox's shape and who we say we are in it.
    struct InboxShape {
        uint32_t cells = 0;
        uint32_t cell_size = 0;
        InboxIdentity identity{};
    };

    // sender: who writes our cells (its producer, name and Short line are the endpoint's);
    // book: the endpoint's AV.
    Channel(Sender &sender, const AddressBook &book)
        : sender_(sender), book_(book), pid_(getpid()) {}
    Channel(const Channel &) = delete;
    Channel &operator=(const Channel &) = delete;

    // Creates and publishes our inbox under `key` (what dead processes left in /dev/shm goes
    // first) and its wake FIFO. Throws ShmError (an inbox of a live owner under the key:
    // EEXIST). Without it the channel reaches no peer (FI_OPT_SHARED_MEMORY_PERMITTED false).
    // policy: who is a peer of ours, and whether single copy may be tried with them.
    void open_inbox(const std::string &key, const InboxShape &shape, const PeerPolicy &policy);
    bool has_inbox() const { return segment_.has_value(); }
    // Without an inbox: only the wake, with no FIFO (InboxWake::NoFifo), so that a sleeper
    // still wakes for its own checks.
    void open_wake_only() { wake_.emplace(InboxWake::NoFifo{}); }

    // Our inbox's ring (nullptr without one), its wake (nullptr before open_inbox or
    // open_wake_only), the claim table of our split copies, and the senders whose cells wait
    // behind a split write of theirs (which the ring's reader keeps and replays).
    ShmRing *inbox() const { return inbox_; }
    InboxWake *wake() { return wake_ ? &*wake_ : nullptr; }
    SplitClaims &claims() { return claims_; }
    SenderHold &holds() { return holds_; }
    // Our heartbeat (SegmentInfo::heartbeat): the coarse clock (coarse_now_ms) of a recent
    // pass, which peers read to tell whether we poll.
    void beat(int64_t now) {
        if (heartbeat_) __atomic_store_n(heartbeat_, uint32_t(now), __ATOMIC_RELAXED);
    }
    Sender &sender() const { return sender_; }
    // Set by tandem while operations of its own wait on a peer (a send's Fin, a split copy's
    // WriteDone, a staged message's fragments: Engine::note_owner_waits): the twin's
    // liveness check then runs as for its own waits (every pass, and a timer while asleep),
    // so that a peer's death ends them.
    bool owner_waits = false;
    // Set by tandem once it reads this inbox itself (LocalPath::open, after the twin opened
    // it): the twin's passes then leave the ring alone and handle only the cells tandem hands
    // it (OffloadOps::take_cell). An owner that does not set it leaves the reading to the twin.
    bool owner_reads = false;
    // Set by the twin at the end of a pass that leaves nothing for another (no backlog,
    // operation, held completion, held sender or collective: only a cell can bring it work),
    // cleared by the twin when a call brings work and by tandem when it leaves the twin some
    // (a cell of its own kept in a full ring's backlog, which the twin's pass flushes). tandem
    // drives the twin's passes while it is clear, and every few empty passes while it is set.
    bool twin_quiet = false;
    // The long header of a cell we send to a peer (our name's length, our pid), for `op` of
    // operation msg_id: the answers (Fin, Cts, WriteDone) the channel's readers write.
    wire::LocalHeader header(wire::LocalOp op, uint64_t msg_id) const;
    // A Fin (status: 0 or a positive FI_* code) for the sender's operation msg_id, through the
    // sender's Outbox (kept in its backlog when the ring is full: flush sends it); false, with
    // nothing sent, when the sender is gone (nobody waits for the answer).
    bool answer(std::string_view sender, uint64_t msg_id, int status);

    // The peer at a destination of the AV, opened on first use and remembered per fi_addr_t
    // until the AV changes (an address removed and another inserted may reuse it); nullptr
    // when it is not a node-local peer (see open_peer) or we have no inbox. May be dead.
    PeerInbox *peer_at(fi_addr_t addr) {
        if (addr == last_addr_ && last_peer_ && last_peer_->reachable() &&
            book_version() == peers_version_)
            return last_peer_;
        return find_peer_at(addr);
    }
    // The peer the key names (addr: the address bytes it was made from), opened on first use.
    // May be dead or closed: then, every kReopenEveryMs at most, a new endpoint at that
    // address (a server restarted on its port, or an endpoint reopened there by the same
    // process) is looked for, and takes the key once it has an inbox. sent_us: a cell from
    // that address is being read, which says that an endpoint may live there: looked for
    // then whenever the last look was.
    PeerInbox *peer_of(const std::string &key, std::string_view addr, bool sent_us = false);
    // The peer that sent a cell (named by its address bytes), if it lives.
    PeerInbox *sender_peer(std::string_view sender);
    // Whether a cell names a process we are to read from or write into (cross-memory attach),
    // or whose device memory we are to map: its pid field then matters (vouch_for_process).
    static bool names_process(const wire::LocalHeader &hdr);
    // The pid a cell gives is only the sender's word. The process we read from or write into
    // is the one that owns the sender's segment (where its name leads), and cross-memory
    // attach to it must be allowed (the same job, pid namespace and the kernel's permission:
    // PeerInbox::cma): otherwise a local process could have us copy a third process's memory
    // into a receive, or our data into a third process. The sender's peer, with hdr.pid set
    // to its process; nullptr for a cell that fails this (logged), which is answered as
    // refused when the sender has a segment, so that a sender that meant it does not wait for
    // ever (a Cts by a WriteDone with FI_EIO: the receiver copies that part itself; anything
    // else by a Fin with FI_EACCES).
    PeerInbox *vouch_for_process(wire::LocalHeader &hdr, std::string_view sender);
    // The sender's fi_addr_t in the AV (FI_ADDR_NOTAVAIL: not inserted). Kept per sender and
    // AV version: a receive completion must not pay a reverse lookup. (Inline: every cell
    // asks; the last sender is compared word by word, LastSender.)
    fi_addr_t source_of(std::string_view sender) {
        if (version_word_ &&
            last_source_.matches(sender, version_word_->load(std::memory_order_acquire)))
            return last_source_.addr;
        return find_source(sender);
    }

    // The liveness check: cells of our inbox claimed by processes that died are skipped, and
    // each peer whose process is gone is judged (DeathVerdict). A peer found dead is marked
    // so, its backlog's streams end (FI_ECONNRESET, through the Sender), and bury(peer) is
    // called for what else waits on it. True while a verdict waits for our inbox to be read
    // (the caller checks again soon).
    template <class Bury>
    bool check_peers(Bury &&bury) {
        skip_dead_claims();
        bool waiting = false;
        for (auto &[key, peer] : peers_)
            if (!peer->dead) waiting |= judge(*peer, bury) == DeathVerdict::State::kDraining;
        // Closed peers a new endpoint at their address replaced (peer_of).
        for (auto it = retiring_.begin(); it != retiring_.end();) {
            const DeathVerdict::State state = judge(**it, bury);
            waiting |= state == DeathVerdict::State::kDraining;
            if (state != DeathVerdict::State::kDead) {
                ++it;
                continue;
            }
            buried_.push_back(std::move(*it));
            it = retiring_.erase(it);
        }
        return waiting;
    }
    // The peers found dead so far, in that order (mark_dead): their key and the process that
    // died, so that what an endpoint keeps of a sender's cells (tandem's staged messages) goes
    // with it. Grows by one per death, as peers_ keeps the dead.
    struct Death {
        std::string key;
        pid_t pid = 0;
        // A new endpoint of the same process took the key (PeerInbox::succeeded_in_process):
        // what is kept by sender address and pid may be that one's.
        bool succeeded_in_process = false;
    };
    const std::vector<Death> &deaths() const { return deaths_; }
    // Writes what waits in the peers' backlogs (the Sender counts the backlogged Outboxes).
    void flush() {
        if (sender_.backlogged) flush_all();
    }

  private:
    uint64_t book_version() const {
        return version_word_ ? version_word_->load(std::memory_order_acquire) : ++uncached_;
    }
    PeerInbox *find_peer_at(fi_addr_t addr);
    static constexpr int64_t kReopenEveryMs = 100;
    bool reopen_due(PeerInbox &gone);
    // One peer's verdict; marked dead and buried when it is kDead.
    template <class Bury>
    DeathVerdict::State judge(PeerInbox &peer, Bury &bury) {
        const DeathVerdict::State state = peer.verdict.judge(peer.segment, inbox_);
        if (state == DeathVerdict::State::kDead) {
            mark_dead(peer);
            bury(peer);
        }
        return state;
    }
    void forget_lookups();
    fi_addr_t find_source(std::string_view sender);
    void skip_dead_claims();
    void mark_dead(PeerInbox &peer);
    void flush_all();

    Sender &sender_;
    const AddressBook &book_;
    const pid_t pid_;  // ours, in the headers of our answers (header)
    PeerPolicy policy_{};
    const std::atomic<uint64_t> *version_word_ = nullptr;  // the AV's (open_inbox)

    // Our inbox.
    std::optional<InboxSegment> segment_;
    ShmRing *inbox_ = nullptr;
    uint32_t *heartbeat_ = nullptr;
    SplitClaims claims_;
    SenderHold holds_;
    // The FIFO peers wake us through, and our liveness timer.
    std::optional<InboxWake> wake_;
    // Who claimed a cell of our inbox and never published it: still running, or dead?
    ProcessWatch claimants_{segment_prefix()};

    // Peers, by key (they live as long as the channel), and the caches of the lookups.
    std::unordered_map<std::string, std::unique_ptr<PeerInbox>> peers_;
    // Dead peers whose key a new endpoint took: kept, as peers_ keeps the dead, for what still
    // holds them (operations that waited on them).
    std::vector<std::unique_ptr<PeerInbox>> buried_;
    // Closed peers whose key a new endpoint took, until their verdict (check_peers).
    std::vector<std::unique_ptr<PeerInbox>> retiring_;
    std::vector<Death> deaths_;
    std::unordered_map<fi_addr_t, PeerInbox *> peer_by_addr_;
    fi_addr_t last_addr_ = FI_ADDR_NOTAVAIL;
    PeerInbox *last_peer_ = nullptr;
    uint64_t peers_version_ = ~0ull;
    mutable uint64_t uncached_ = 0;
    std::vector<std::pair<std::string, fi_addr_t>> sources_;  // sender address -> fi_addr
    uint64_t sources_version_ = ~0ull;
    LastSender last_source_;
    // The last sender sender_peer() found: a run of cells from one peer that need answers
    // skips building its key.
    std::string last_sender_;
    PeerInbox *last_sender_peer_ = nullptr;
};

}  // namespace tandem::shm
