// The producer side of the node-local channel: one peer's inbox as we write it. Every cell we
// send a peer goes into its ring through its Outbox, or into the Outbox's backlog while the
// ring is full or something waits there already (order): built cells, and payloads streamed
// through as many cells as they take (Frag, WriteFrag, ReadData), cut into cells from their
// own buffers as room appears (memory for one payload in flight, not a copy of it), drained
// in order by flush(). After a publish whose claim found the peer asleep, the Outbox wakes it.
//
// One Outbox per peer and endpoint, in the channel's PeerInbox (main_prov/shm/channel.h):
// off_tandem's cells go through it, and tandem's Short cells through claim and publish while
// nothing waits in the backlog; step 3b of issue 36 makes every cell tandem's
// (docs/architecture.md).
#pragma once

#include "common/shm_ring.h"
#include "common/short_cell.h"
#include "common/wire.h"
#include "hmem/hmem.h"
#include "main_prov/shm/shm_segment.h"
#include "main_prov/shm/wake.h"

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace tandem::shm {

class StreamListener;

// What happens when the last cell of a Stream is in the ring (status 0), when a device copy
// failed (FI_EIO: an empty last cell with that status ended the payload instead), or when the
// peer died first (FI_ECONNRESET). The Outbox hands it back to its Sender untouched.
struct StreamEnd {
    enum class Kind : uint8_t {
        None,
        CompleteTx,   // a send nobody waits a Fin for: its completion, with the status
        FailPending,  // an operation waiting for an answer (hdr.msg_id): fails on an error
        ReadAccess,   // ReadData: the target's FI_REMOTE_READ access, on success only
    } kind = Kind::None;
    void *context = nullptr;  // CompleteTx
    uint64_t flags = 0;       // CompleteTx
    uint64_t rma_key = 0;     // ReadAccess
    // Who is told (the provider whose operation the stream carries); nullptr: the Sender's
    // listener.
    StreamListener *to = nullptr;
};

// A payload in as many cells as it takes.
struct Stream {
    wire::LocalHeader hdr{};  // of its next cell (hdr.offset: where that cell starts)
    std::vector<iovec> iov{};
    std::vector<hmem::MemRef> mem{};  // empty: host memory
    size_t len = 0;
    StreamEnd end{};
};

// Who is told that a stream ended: the provider whose operation it carries.
class StreamListener {
  public:
    virtual void stream_ended(const Stream &stream, int status) = 0;

  protected:
    ~StreamListener() = default;
};

// Who writes, the same for every Outbox of one endpoint: our claimant id in peers' rings and
// our name as every cell carries it; how many of our Outboxes hold a backlog (so that
// progress flushes only when one does); and who hears of a stream's end that names nobody
// (StreamEnd::to). The channel that tandem builds holds one; the twin names itself its
// listener, and tandem's streams name tandem.
class Sender {
  public:
    uint32_t producer = 0;                  // own_process_token()
    const uint8_t *name = nullptr;          // wire::kLocalNameRoom bytes, zero-padded
    const ShortLine *short_line = nullptr;  // our Short cells' first line
    size_t backlogged = 0;                  // Outboxes whose backlog is not empty
    StreamListener *streams = nullptr;      // nobody: a stream's end is dropped (logged)
    void stream_ended(const Stream &stream, int status);
};

class Outbox {
  public:
    Outbox() = default;  // writes nowhere (ring nullptr) until assigned one that does
    // peer_state: the `ready` word of the peer's segment (ShmSegment::ready_word), which says
    // when its endpoint closed (nullptr: a ring of no segment, never closed).
    Outbox(ShmRing *ring, const std::string &key, const std::atomic<uint32_t> *peer_state = nullptr)
        : ring_(ring), peer_state_(peer_state ? peer_state : &kNoState), wake_(key) {}

    // Whether a new operation's cell could go now: nothing waits and the ring has a free cell
    // (another producer may take it first).
    bool admits() { return backlog_.empty() && ring_->has_room(view); }
    // Free cells as far as our view knows, none while something waits.
    size_t free_cells() { return backlog_.empty() ? ring_->free_cells(view) : 0; }

    // A cell: hdr, our name, then len bytes of the list from offset (or of staged, when not
    // nullptr). An Eager cell nobody waits a Fin for goes as a Short cell
    // (wire::LocalShortHeader).
    void push(Sender &s, const wire::LocalHeader &hdr, const void *body, size_t len);
    // The same from a list, device memory when mem is not nullptr: its bytes go through a
    // bounce first, so that a failed copy never reaches the receiver as data. False when the
    // device copy failed, and nothing was pushed.
    bool push_gather(Sender &s, const wire::LocalHeader &hdr, const iovec *iov, size_t count,
                     size_t offset, size_t len, const hmem::MemRef *mem = nullptr);
    // A cell under a LocalShortHeader: the header, our name when h.name_len says so, then len
    // bytes of body.
    void push_compact(Sender &s, const wire::LocalShortHeader &h, const void *body, size_t len);
    // A cell built by the caller, n bytes.
    void push_cell(Sender &s, const uint8_t *cell, size_t n);
    // A payload in as many cells as it takes: each carries its offset, the last one
    // kLocalLast (an empty payload still sends that one cell). The cells that fit go now;
    // the rest follow from the payload's own buffers as the ring makes room (flush), behind
    // whatever waited before. `end` goes to s.stream_ended once it is all sent.
    void push_stream(Sender &s, wire::LocalHeader hdr, const iovec *iov, size_t count, size_t len,
                     const hmem::MemRef *mem, StreamEnd end);
    // The backlog into the ring while it has room, in order. True when it is empty.
    bool flush(Sender &s);
    // The peer died: nothing more goes, and the backlog goes (its streams end with
    // FI_ECONNRESET).
    void close_dead(Sender &s);

    // A cell of the ring for a cell its caller builds (tandem's Short cells), or nullptr:
    // something waits in the backlog (the cell would overtake it), the peer is dead or its
    // endpoint closed (nobody reads the ring: a new endpoint may be at its address), or the
    // ring is full. producer: the writer's claimant id (Sender::producer).
    [[gnu::always_inline]] void *claim(uint32_t producer) {
        if (blocked || peer_state_->load(std::memory_order_relaxed) == ShmSegmentHeader::kClosed)
            [[unlikely]]
            return nullptr;
        return ring_->try_reserve(producer, view);
    }
    // The claimed cell, written, to the peer (woken if the claim found it asleep).
    [[gnu::always_inline]] void publish(void *cell) {
        ring_->publish(cell);
        notify();
    }

    ShmRing *ring() const { return ring_; }
    // Ours of the peer's ring, and why a claim gets no cell: kBacklog (something waits
    // here), kDead (the peer died: the caller's send fails).
    static constexpr uint8_t kBacklog = 1, kDead = 2;
    ShmRing::ProducerView view{};
    uint8_t blocked = 0;
    // After a publish whose claim found the peer asleep (view.wake): wakes it.
    void wake() {
        view.wake = false;
        if (ring_->take_wake()) wake_.wake();
    }

  private:
    // Waiting for room in the ring, in order: a built cell, or a stream.
    struct Outgoing {
        std::vector<uint8_t> cell{};
        std::unique_ptr<Stream> stream{};
    };
    // The cell straight into the ring, if it can go now: nothing waits before it and the ring
    // has a free cell. False, with nothing written, otherwise.
    bool try_push(Sender &s, const wire::LocalHeader &hdr, const iovec *iov, size_t count,
                  size_t offset, size_t len, const uint8_t *staged);
    void fill_cell(const Sender &s, uint8_t *cell, const wire::LocalHeader &hdr, const iovec *iov,
                   size_t count, size_t offset, size_t len, const uint8_t *staged) const;
    // The stream's next cells into the ring while it has room: true when it ended, with
    // *status 0 (its last cell went) or FI_EIO (a device copy failed: an empty last cell
    // with that status ends the payload instead, and the receiver drops what it assembled).
    bool pump(Sender &s, Stream &stream, int *status);
    // A built cell into the ring if it has room (false, nothing written, otherwise).
    bool write_now(Sender &s, const uint8_t *cell, size_t n);
    void keep(Sender &s, Outgoing outgoing);
    void pop(Sender &s);
    // After a publish: wakes the peer if our claim found it asleep (inline: every cell).
    void notify() {
        if (view.wake) wake();
    }

    ShmRing *ring_ = nullptr;
    static constexpr std::atomic<uint32_t> kNoState{ShmSegmentHeader::kReady};
    const std::atomic<uint32_t> *peer_state_ = &kNoState;
    PeerWake wake_{};
    std::deque<Outgoing> backlog_{};
};

}  // namespace tandem::shm
