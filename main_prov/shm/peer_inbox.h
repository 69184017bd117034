// A node-local peer as the channel holds it: its inbox segment (opened on first use), our
// Outbox to it, whether we may copy its memory with CMA, and its liveness. open_peer decides
// who is a peer at all (the same authorization key; in another network namespace, only while
// no socket here holds its address) and whether single copy works with it (probed once).
#pragma once

#include "main_prov/shm/death_verdict.h"
#include "main_prov/shm/inbox_segment.h"
#include "main_prov/shm/outbox.h"

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::shm {

// How late a receiver's Fins come beyond their copies' cost: a moving average (ns), and when
// the last Fin came (steady clock, ns), from which an Rts posted behind others of ours counts
// its wait (learn, in send_choice.cpp).
struct RtsLateness {
    double ns = 0;
    int64_t last_fin_ns = 0;
    void learn(int64_t posted_ns, double expected_ns);
};

// How a split copy from this sender is cut (shm::SingleCopy): the part it is asked to write, in
// 64ths of the message, at most half. Each time it had not begun its part by the time the
// reader's was read (the reader took it back and copied it too: the sender was still busy,
// with an earlier part or without a core), its next part is smaller; each time it had, one
// 64th larger again. Halves wasted a core whenever the sender's write and its handling of the
// next cells took a little longer than the reader's read: each message's Cts found it later,
// until one in four or so was taken back and copied by the reader alone.
struct SplitShare {
    static constexpr uint32_t kHalf = 32, kLeast = 8, kDown = 4;
    uint32_t sixty_fourths = kHalf;
    // Where the reader's part of an n-byte copy ends (page-aligned): the sender's starts there.
    size_t readers_part(size_t n) const { return (n - n / 64 * sixty_fourths) & ~size_t(4095); }
    void taken_back() {
        sixty_fourths = sixty_fourths > kLeast + kDown ? sixty_fourths - kDown : kLeast;
    }
    void in_time() {
        if (sixty_fourths < kHalf) ++sixty_fourths;
    }
};

struct PeerInbox {
    std::string key;
    ShmSegment segment;
    Outbox out{};                                   // its ring as we write it
    std::atomic<uint64_t> *split_claims = nullptr;  // its segment's (Cts it sends us)
    const SegmentInfo *info = nullptr;
    pid_t pid = 0;
    // Its pid names the same process here: CMA and device IPC may be tried.
    bool same_pid_ns = false;
    bool cma = false;  // single copy by CMA works with it (the probe read its word)
    bool dead = false;
    // Closed by its endpoint, and a new endpoint of the same process opened at the address
    // (Channel::peer_of): what is kept by sender address and pid is that one's as much as this
    // one's, so this one's burial leaves it be.
    bool succeeded_in_process = false;
    // Dead or closed: when the channel next looks for a new endpoint at its address
    // (Channel::peer_of).
    int64_t reopen_at_ms = 0;
    // Whether its process is gone, and then whether the cells it published before it died
    // (a Fin, a WriteDone) are read.
    DeathVerdict verdict{};
    // What our sends to it learned: how much later than their copies' cost our Rts got
    // their Fin lately, the cost of waiting for this receiver (shm::stages_better).
    RtsLateness lateness{};
    // What our reads of its split copies learned (SingleCopy::start).
    SplitShare split{};

    // Whether what we write into its ring is read: it lives and its endpoint is open. (Its
    // endpoint may close while its process runs on, and another open at the same address.)
    bool reachable() const { return !dead && !segment.closed(); }
};

// Whether an answer from `from` (the peer its sender's name leads to now) comes from where an
// operation sent to `to` went: the same address. Not the same PeerInbox only: an endpoint
// that answered and then closed, with a new one at its address, names the new one by then.
inline bool same_address(const PeerInbox *to, const PeerInbox *from) {
    return to == from || (to && from && to->key == from->key);
}

// Who may be a node-local peer of ours, and whether we may copy with CMA at all.
struct PeerPolicy {
    uint64_t auth = 0;  // our authorization key's digest: a peer's must be the same
    uint64_t job = 0;   // CMA only within one job
    bool cma = true;    // false: never single copy (cma_off says why, for the log)
    const char *cma_off = "";
};

// The peer `key` names (addr: the address bytes the key was made from), its inbox opened.
// nullopt when there is no live inbox of this layout under the key, when it has another
// authorization key (not a peer of ours at all, fi_endpoint(3)), or when it was made in
// another network namespace while a socket of ours holds the address (segments are named by
// address, and two namespaces that share /dev/shm may use the same one).
std::optional<PeerInbox> open_peer(const std::string &key, std::string_view addr,
                                   const PeerPolicy &policy);

}  // namespace tandem::shm
