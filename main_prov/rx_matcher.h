// Receive-side matching: posted receives and unexpected messages, tagged and untagged kept
// apart. One RxMatcher belongs to an endpoint, or to a shared receive context (srx.cpp) that
// several endpoints feed. It holds no locks (the domain lock covers it) and knows nothing of
// links or completion queues, so it can be tested alone.
#pragma once

#include "common/wire.h"
#include "hmem/hmem.h"

#include <rdma/fabric.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <string>
#include <type_traits>
#include <vector>

namespace tandem {

namespace peer {
struct OwnerRxEntry;
}
class Engine;
class Cntr;
class LinkConnection;

inline constexpr size_t kMaxIov = 4;

// The buffers of a receive: only the first `count` entries mean anything, and they are
// written when it is posted. Left uninitialized on purpose: zeroing ~290 bytes per receive
// was a measurable share of a small message's cost.
struct RxBuffers {
    iovec iov[kMaxIov];
    // Where the buffers live (FI_MR_HMEM descriptors), and the descriptors themselves for a
    // peer provider that fills this receive.
    hmem::MemRef mem[kMaxIov];
    void *desc[kMaxIov];
};

struct RxOp;

// What a new receive starts with: zero, but src (FI_ADDR_UNSPEC). A base of RxOp of its own, so
// that RxOp::reset clears exactly these bytes, a size the compiler knows.
struct RxState {
    void *context;
    uint64_t op_flags;
    size_t count;
    size_t total;
    fi_addr_t src;
    uint64_t tag, ignore;
    Cntr *work_cntr;  // deferred work: completes on work_cntr (DeferredDone)
    size_t consumed;  // FI_MULTI_RECV: bytes of it matched so far
    RxOp *parent;     // a multi-receive slice's buffer
    // The completion, held until every message that arrived before it from the same peer has
    // completed: a rendezvous still reading delays the eager messages sent after it, so
    // completions come in the order the peer sent (what FI_ORDER_SAS users like ofi_rxm's
    // segmentation rely on).
    std::deque<RxOp *> *order_queue;
    int children;  // FI_MULTI_RECV: slices whose completion is still to come
    int error;     // rendezvous: the first failure
    bool device;
    bool tagged;
    bool deferred;
    bool multi;    // FI_MULTI_RECV
    bool retired;  // no more messages will be matched into it
    bool done;     // completed, held in order_queue until the ones before it are
    bool posted;   // among the matcher's posted receives (RxMatcher::PostedQueue)
    bool owned;    // a buffer a peer SRX owner gave (owner_entry): freed with it when done
};

// reset() clears the RxState; the other fields are written before they are read: by
// start_rendezvous (the rendezvous state), rx_complete (done_*) and post (posted_prev /
// posted_next).
struct RxOp : RxState, RxBuffers {
    // Its place among the matcher's posted receives.
    RxOp *posted_prev, *posted_next;
    // Rendezvous in progress.
    LinkConnection *conn;
    uint64_t msg_id;
    size_t msg_len;   // the sender's length
    size_t recv_len;  // what fits
    uint64_t cq_data;
    uint64_t msg_tag;
    uint8_t proto_flags;
    fi_addr_t msg_src;
    int reads;
    // The completion held (done).
    size_t done_len, done_olen;
    uint64_t done_tag, done_data;
    uint8_t done_proto_flags;
    fi_addr_t done_src;
    int done_err;
    // owned: the entry of the SRX owner whose buffer this is (engine_owner_srx.cpp).
    void *owner_entry;

    RxOp() { reset(); }
    // The state of a new receive, buffers aside (those are written when it is posted): one
    // clear, where assigning a fresh RxOp wrote every field (a tenth of a small node-local
    // receive's instructions).
    void reset() {
        // Word stores, written out: gcc turns a clear of this size (an assignment of RxState{},
        // a memset, a loop) into `rep stos`, whose start-up costs more than the stores.
        static_assert(sizeof(RxState) == 13 * sizeof(uint64_t));
        auto *w = reinterpret_cast<unsigned char *>(static_cast<RxState *>(this));
        const uint64_t zero = 0;
#define TANDEM_CLEAR_WORD(i) memcpy(w + 8 * (i), &zero, 8)
        TANDEM_CLEAR_WORD(0), TANDEM_CLEAR_WORD(1), TANDEM_CLEAR_WORD(2), TANDEM_CLEAR_WORD(3);
        TANDEM_CLEAR_WORD(4), TANDEM_CLEAR_WORD(5), TANDEM_CLEAR_WORD(6), TANDEM_CLEAR_WORD(7);
        TANDEM_CLEAR_WORD(8), TANDEM_CLEAR_WORD(9), TANDEM_CLEAR_WORD(10), TANDEM_CLEAR_WORD(11);
        TANDEM_CLEAR_WORD(12);
#undef TANDEM_CLEAR_WORD
        src = FI_ADDR_UNSPEC;
    }

    bool matches_tag(uint64_t t) const {
        return ((tag ^ t) & ~ignore) == 0;
    }
    bool matches_src(fi_addr_t s) const {
        return src == FI_ADDR_UNSPEC || src == s;
    }
};
// Recycled by reset() (RxMatcher::new_op), which clears it as bytes: nothing to destroy, and
// zero bytes are a valid value of every field.
static_assert(std::is_trivially_destructible_v<RxOp> && std::is_trivially_copyable_v<RxOp>);

// A message that arrived before a receive matched it: the eager payload, or for a
// rendezvous only the sender's buffer description.
// A node-local Rts (wire::LocalOp::Rts): the sender's buffers and its process (vouched for by
// the channel, shm::Channel::vouch_for_process), read with cross-memory attach.
// A node-local IpcRts (ipc): its process and count here, its handles (count wire::LocalIpc, 112
// bytes each) in Unexpected::data, out of line.
struct LocalRts {
    pid_t pid = 0;
    uint8_t count = 0;
    bool ipc = false;
    wire::LocalIov iov[wire::kLocalMaxIov]{};
};

struct Unexpected {
    Engine *ep = nullptr;            // the endpoint it arrived on (answers it, reports it)
    LinkConnection *conn = nullptr;  // nullptr: a node-local message (Short cell), from src
    fi_addr_t src = FI_ADDR_NOTAVAIL;
    // A node-local message from a sender not in the AV when it came: its name, looked up again
    // whenever a receive asks its source (the application may insert it meanwhile).
    std::string sender;
    // A node-local message whose sender waits for a Fin once it is delivered or discarded
    // (wire::kLocalAckReq; hdr.msg_id is the sender's id): the sender's name.
    std::string answer_to;
    wire::ProtoHeader hdr{};
    std::vector<uint8_t> data;
    wire::RtsBody rts{};
    LocalRts local_rts{};  // a node-local rendezvous (no conn): what its sender named
    bool claimed = false;
    void *claim_context = nullptr;
    // A message a peer provider holds (peer SRX, fi_peer(3)): hdr carries its tag, size and
    // flags; the peer delivers it once a receive is found (PeerRxQueue::start).
    peer::OwnerRxEntry *peer_entry = nullptr;
    // The other way round: tandem is the peer of another provider's SRX and has queued the
    // message with that owner in this entry of its (engine_owner_srx.cpp).
    void *owner_entry = nullptr;

    bool tagged() const { return hdr.flags & wire::kProtoTagged; }
    bool rendezvous() const { return hdr.op == static_cast<uint8_t>(wire::ProtoOp::Rts); }
};

class RxMatcher {
  public:
    ~RxMatcher();

    // A receive is allocated per posted buffer and freed at its completion: recycled here
    // (under the same serialisation as the matcher), so that path does not call malloc.
    RxOp *new_op() {
        if (spare_.empty()) return new RxOp;
        RxOp *rx = spare_.back();
        spare_.pop_back();
        rx->reset();
        return rx;
    }
    void free_op(RxOp *rx) {
        if (spare_.size() < kSpareMax) {
            spare_.push_back(rx);  // (within the capacity reserved at construction: no throw)
            return;
        }
        delete rx;
    }
    RxMatcher() { spare_.reserve(kSpareMax); }

    void post(RxOp *rx) { list_for(rx->tagged).push_back(rx); }
    // A receive taken off the queue, given back ahead of the rest (its place when it was
    // taken, as far as the receives posted since are concerned): a message it was to take
    // never arrived here (an endpoint fed by a shared context closed).
    void post_front(RxOp *rx) { list_for(rx->tagged).push_front(rx); }
    // A receive matched and never to complete (its endpoint closed under it): freed, and with
    // its last slice a multi-receive buffer already retired.
    void drop(RxOp *rx) {
        if (RxOp *parent = rx->parent) {
            free_op(rx);
            if (--parent->children == 0 && parent->retired) {
                --outstanding;
                free_op(parent);
            }
            return;
        }
        --outstanding;
        free_op(rx);
    }
    // The first posted receive for an arriving message; removed unless it is a multi-receive
    // buffer (which stays until retired).
    RxOp *match_posted(bool tagged, uint64_t tag, fi_addr_t src) {
        PostedQueue &q = list_for(tagged);
        for (RxOp *rx = q.front(); rx; rx = rx->posted_next) {
            if (tagged && !rx->matches_tag(tag)) continue;
            if (!rx->matches_src(src)) continue;
            if (!rx->multi) q.erase(rx);
            return rx;
        }
        return nullptr;
    }
    // match_posted for a message that only a plain receive may take (host memory, no
    // multi-receive buffer): the first posted receive the message matches, taken off the
    // queue when it is plain; nullptr (nothing taken) when there is none or it is not plain.
    RxOp *match_plain(bool tagged, uint64_t tag, fi_addr_t src) {
        PostedQueue &q = list_for(tagged);
        for (RxOp *rx = q.front(); rx; rx = rx->posted_next) {
            if (tagged && !rx->matches_tag(tag)) continue;
            if (!rx->matches_src(src)) continue;
            if (rx->device || rx->multi) return nullptr;
            q.erase(rx);
            return rx;
        }
        return nullptr;
    }
    void remove_posted(RxOp *rx) { list_for(rx->tagged).erase(rx); }
    Unexpected &push_unexpected(Unexpected &&ux) {
        auto &list = unexpected_for(ux.tagged());
        list.push_back(std::move(ux));
        return list.back();
    }
    bool has_unexpected(bool tagged) { return !unexpected_for(tagged).empty(); }
    template <class F>
    void for_each_unexpected(F &&f) {
        for (Unexpected &ux : unexpected_msg_) f(ux);
        for (Unexpected &ux : unexpected_tag_) f(ux);
    }

    // The oldest unclaimed unexpected message the receive matches, taken off the queue.
    // src_of(const Unexpected &) gives the message's source address.
    template <class SourceOf>
    bool take_unexpected(const RxOp &rx, SourceOf &&src_of, Unexpected &out);
    // FI_PEEK: the oldest unclaimed match, left in place (nullptr when none).
    template <class SourceOf>
    Unexpected *peek(bool tagged, uint64_t tag, uint64_t ignore, fi_addr_t src, SourceOf &&src_of);
    // FI_CLAIM: the message an earlier FI_PEEK|FI_CLAIM reserved for context.
    bool take_claimed(void *context, Unexpected &out);
    void erase_unexpected(Unexpected *ux);
    // fi_cancel: the posted receive with this context, removed; nullptr when none.
    RxOp *cancel(void *context);
    // Unexpected messages that arrived on an endpoint, dropped when it closes.
    void forget_endpoint(Engine *ep);
    // Every posted receive, freed unreported (their owner is going).
    void drop_posted();

    size_t outstanding = 0;  // receives posted and not completed
    size_t min_multi_recv = 0;

  private:
    static constexpr size_t kSpareMax = 1024;
    // Posted receives in posting order, linked through the receives themselves: posting and
    // matching allocate nothing, and a receive leaves from anywhere in the queue at once.
    class PostedQueue {
      public:
        RxOp *front() const { return head_; }
        void push_back(RxOp *rx) {
            rx->posted_prev = tail_;
            rx->posted_next = nullptr;
            (tail_ ? tail_->posted_next : head_) = rx;
            tail_ = rx;
            rx->posted = true;
        }
        void push_front(RxOp *rx) {
            rx->posted_prev = nullptr;
            rx->posted_next = head_;
            (head_ ? head_->posted_prev : tail_) = rx;
            head_ = rx;
            rx->posted = true;
        }
        void erase(RxOp *rx) {
            if (!rx->posted) return;
            (rx->posted_prev ? rx->posted_prev->posted_next : head_) = rx->posted_next;
            (rx->posted_next ? rx->posted_next->posted_prev : tail_) = rx->posted_prev;
            rx->posted_prev = rx->posted_next = nullptr;
            rx->posted = false;
        }

      private:
        RxOp *head_ = nullptr, *tail_ = nullptr;
    };

    PostedQueue &list_for(bool tagged) { return tagged ? posted_tag_ : posted_msg_; }
    std::list<Unexpected> &unexpected_for(bool tagged) {
        return tagged ? unexpected_tag_ : unexpected_msg_;
    }

    PostedQueue posted_msg_, posted_tag_;
    std::list<Unexpected> unexpected_msg_, unexpected_tag_;
    std::vector<RxOp *> spare_;  // completed receives, for new_op
};

template <class SourceOf>
bool RxMatcher::take_unexpected(const RxOp &rx, SourceOf &&src_of, Unexpected &out) {
    auto &list = unexpected_for(rx.tagged);
    for (auto it = list.begin(); it != list.end(); ++it) {
        if (it->claimed) continue;
        if (rx.tagged && !rx.matches_tag(it->hdr.tag)) continue;
        if (rx.src != FI_ADDR_UNSPEC && !rx.matches_src(src_of(*it))) continue;
        out = std::move(*it);
        list.erase(it);
        return true;
    }
    return false;
}

template <class SourceOf>
Unexpected *RxMatcher::peek(bool tagged, uint64_t tag, uint64_t ignore, fi_addr_t src,
                            SourceOf &&src_of) {
    for (auto &ux : unexpected_for(tagged)) {
        if (ux.claimed) continue;
        if (tagged && ((ux.hdr.tag ^ tag) & ~ignore) != 0) continue;
        if (src != FI_ADDR_UNSPEC && src_of(ux) != src) continue;
        return &ux;
    }
    return nullptr;
}

}  // namespace tandem
