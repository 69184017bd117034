#include "main_prov/shm/send_choice.h"

#include "common/coarse_clock.h"
#include "main_prov/shm/copy_costs.h"

#include <algorithm>
#include <chrono>

namespace tandem::shm {

bool peer_polls(const PeerInbox &peer) {
    uint32_t beat = __atomic_load_n(&peer.info->heartbeat, __ATOMIC_RELAXED);
    return uint32_t(coarse_now_ms()) - beat < kPeerPollMs;
}

// Staged: our memcpy into cells and the receiver's out of them, and each cell's handling
// (kCellNs a side); the send completes once the last cell is in the receiver's ring. Single
// copy: the receiver's CMA read (from kLocalSplitMin split between both sides, each copying
// half); the send completes at the receiver's Fin, so it waits for the receiver to have a
// core. A receiver that has not polled lately (no core: more processes than cores) gets the
// message staged when it fits the room left in its ring, so that the send completes without
// it; otherwise the cheaper of the two.
bool stages_better(PeerInbox &peer, size_t len, double *rts_ns) {
    const CopyCosts &costs = CopyCosts::get();
    if (!costs.cma_measured()) return true;
    constexpr double kCellNs = 100;
    const size_t cells = (len + wire::kLocalBodyRoom - 1) / wire::kLocalBodyRoom;
    const double staged = 2 * costs.memcpy_ns(len) + 2 * kCellNs * double(cells);
    *rts_ns = len >= wire::kLocalSplitMin ? costs.cma_ns(len / 2) : costs.cma_ns(len);
    const bool fits = peer.out.free_cells() >= cells;
    if (fits && (!peer_polls(peer) || staged < *rts_ns + peer.lateness.ns)) {
        // Staged now: what we learnt of the receiver's lateness fades, so that single copy
        // is tried again once in a while (otherwise the estimate could never come down).
        peer.lateness.ns *= 0.875;
        return true;
    }
    return false;
}

DeviceSend device_send(const hmem::P2pPolicy &p2p, size_t len, size_t eager, bool cma) {
    if (!len) return DeviceSend::Eager;
    switch (p2p.decide(true, len, eager)) {
        case hmem::P2pDecision::PeerToPeer:
            return DeviceSend::PeerToPeer;
        case hmem::P2pDecision::Fail:
            return DeviceSend::Refuse;
        case hmem::P2pDecision::Stage:
            break;
    }
    return device_send_staged(p2p, len, eager, cma);
}

DeviceSend device_send_staged(const hmem::P2pPolicy &p2p, size_t len, size_t eager, bool cma) {
    if (len && p2p.mode() == FI_HMEM_P2P_REQUIRED) return DeviceSend::Refuse;
    if (len <= eager) return DeviceSend::Eager;
    return cma && len <= kDeviceBounceMax ? DeviceSend::HostBounce : DeviceSend::Frag;
}

void count_device_send(DeviceSend how, size_t len) {
    hmem::Counters &c = hmem::counters();
    switch (how) {
        case DeviceSend::PeerToPeer:
            c.p2p_transfers.fetch_add(1, std::memory_order_relaxed);
            return;
        case DeviceSend::Refuse:
            c.refused_transfers.fetch_add(1, std::memory_order_relaxed);
            return;
        default:
            if (len) c.staged_transfers.fetch_add(1, std::memory_order_relaxed);
    }
}

void learn_lateness(PeerInbox &peer, int64_t posted_ns, double expected_ns) {
    peer.lateness.learn(posted_ns, expected_ns);
}

// The receiver reads the cells of one sender in the order they were sent: an Rts posted
// while earlier ones of ours were still being read waits for them, which is our own traffic's
// cost, not the receiver's lateness (staging it would wait behind them too, and cost both
// sides a copy more). So its wait counts from the previous Fin when that came after it was
// posted. A stream of large messages to a receiver that keeps up teaches no lateness; one
// that is off its core still does (the gap between two Fins is then its absence).
void RtsLateness::learn(int64_t posted_ns, double expected_ns) {
    const int64_t now = now_ns();
    const int64_t since = std::max(posted_ns, last_fin_ns);
    last_fin_ns = now;
    const double late = std::max(0.0, double(now - since) - expected_ns);
    ns += (late - ns) / 4;
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace tandem::shm
