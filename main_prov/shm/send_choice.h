// How a node-local host message of more than a cell travels: staged through the peer's ring a
// cell at a time (Frag), or by single copy (an Rts whose buffers the receiver reads with
// cross-memory attach), from what copying costs here and what this receiver's Fins taught us.
// Both providers' senders ask it (tandem for its messages, off_tandem for an owner that is not
// tandem), so a peer is judged one way.
#pragma once

#include "hmem/p2p_policy.h"
#include "main_prov/shm/peer_inbox.h"

#include <cstddef>
#include <cstdint>

namespace tandem::shm {

// A device message staged by the sender's device (no IPC handle, or the policy stages it) of
// more than a cell and up to this size goes through one host bounce that the receiver reads
// with cross-memory attach (an Rts); larger ones through cells, so that no sender holds a
// bounce of unbounded size. Both providers' senders of device memory use it.
inline constexpr size_t kDeviceBounceMax = 64u << 20;

// How a node-local message of device memory goes, one decision for both providers' senders
// (tandem's Engine::send_local_device, off_tandem's send_device for an owner that is not
// tandem), which also move the hmem counters by it (count_device_send):
enum class DeviceSend {
    PeerToPeer,  // an IpcRts naming the buffers' IPC handles (the receiver's device copies)
    Refuse,      // FI_EOPNOTSUPP: the policy (FI_HMEM_P2P_REQUIRED) forbids staging it
    Eager,       // one cell, the device copying into it (an empty message moves no device memory)
    HostBounce,  // one host copy by the device, which the receiver reads like a host Rts
    Frag,        // cells, the device copying into each
};
// The first choice: as the endpoint's P2P policy decides (up to `eager` bytes ENABLED stages),
// then by size; `cma`: the receiver may read us by cross-memory attach.
DeviceSend device_send(const hmem::P2pPolicy &p2p, size_t len, size_t eager, bool cma);
// When peer to peer found no IPC handle (or the receiver could not map it): staged, unless
// the policy requires peer to peer.
DeviceSend device_send_staged(const hmem::P2pPolicy &p2p, size_t len, size_t eager, bool cma);
// The hmem counters of a device send that went as `how` (PeerToPeer: once its IpcRts is sent).
void count_device_send(DeviceSend how, size_t len);
// The whole decision, counted: `peer_to_peer()` sends the IpcRts when the first choice is peer
// to peer and answers whether it could (false: no IPC handle, nothing sent). The answer is how
// the message goes (PeerToPeer: sent already; Refuse: the caller fails it FI_EOPNOTSUPP).
template <class PeerToPeer>
DeviceSend decide_device_send(const hmem::P2pPolicy &p2p, size_t len, size_t eager, bool cma,
                              PeerToPeer &&peer_to_peer) {
    DeviceSend how = device_send(p2p, len, eager, cma);
    if (how == DeviceSend::PeerToPeer && !peer_to_peer())
        how = device_send_staged(p2p, len, eager, cma);
    count_device_send(how, len);
    return how;
}

// Whether the peer has polled within the last kPeerPollMs, as far as its heartbeat (of the
// coarse clock, a tick or so behind) tells.
inline constexpr uint32_t kPeerPollMs = 6;
bool peer_polls(const PeerInbox &peer);

// True: staged. False: single copy, *rts_ns its expected cost (what the Fin's lateness is
// measured against, learn_lateness). Only for a peer we may read with CMA (peer.cma).
bool stages_better(PeerInbox &peer, size_t len, double *rts_ns);

// An Rts's Fin came (posted at posted_ns, expected to take expected_ns): how much later it
// came than its copy's cost is the receiver's lateness, averaged into the peer's.
void learn_lateness(PeerInbox &peer, int64_t posted_ns, double expected_ns);

int64_t now_ns();  // the steady clock

}  // namespace tandem::shm
