// The peer API's structures, from wherever this libfabric keeps them, and the few values the
// two providers agree on that libfabric does not name publicly.
//
// libfabric 1.17 declares the peer structures in <rdma/fi_ext.h>. Where the header and
// fi_peer(3) differ, the header is the ABI (fi_ops_srx_peer callbacks take a
// fi_peer_rx_entry *, whose field is owner_context). Against the headers of 1.19 or later
// (cmake -DTANDEM_LIBFABRIC_PREFIX) the two providers keep 1.17's structures between them
// (peer/peer_api_1_17.h, in place of <rdma/providers/fi_peer.h>), unless a file that compares
// those headers' layouts with tandem's included theirs first (tests/unit/abi_layouts_2x.cpp).
#pragma once

#include <atomic>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#if FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION) >= FI_VERSION(1, 19)
#ifndef FI_PEER_H
#include "peer/peer_api_1_17.h"
#endif
#elif __has_include(<rdma/providers/fi_peer.h>)
#include <rdma/providers/fi_peer.h>
#endif
#include <rdma/fi_ext.h>

#include <sys/uio.h>

#include <cstdint>

#include "common/short_cell.h"
#include "hmem/hmem.h"
#include "peer/ep_diag.h"

namespace tandem::shm {
class Channel;
}

namespace tandem::peer {

// What fi_mr_desc() of a tandem memory region points at: where the registered memory lives,
// in a plain structure both providers read. tandem hands the application's descriptors to
// its offload twin unchanged, so the twin knows a buffer's iface and device without asking.
inline constexpr uint64_t kMrDescMagic = 0x74616e64656d4d52ull;  // "tandemMR"
struct MrDesc {
    uint64_t magic = kMrDescMagic;
    hmem::MemRef mem;
    void *owner = nullptr;  // tandem's memory region
};

// The memory of a descriptor the application passed (null or foreign: host memory).
inline hmem::MemRef mem_of(const void *desc) {
    auto *d = static_cast<const MrDesc *>(desc);
    return d && d->magic == kMrDescMagic ? d->mem : hmem::kHost;
}
// Fills mem[0..count) from descriptors; false when every buffer is host memory.
inline bool mems_of(void *const *desc, size_t count, hmem::MemRef *mem) {
    bool device = false;
    for (size_t i = 0; i < count; ++i) {
        mem[i] = desc ? mem_of(desc[i]) : hmem::kHost;
        device |= !mem[i].on_host();
    }
    return device;
}

// The core hides providers named off_* unless fi_getinfo's flags carry this core-internal
// bit (OFI_OFFLOAD_PROV_ONLY in libfabric's sources; not in any installed header).
inline constexpr uint64_t kOffloadProvOnly = 1ull << 61;
// The core filters fi_getinfo's answers by FI_PROVIDER once the providers answered, which
// drops off_tandem's entries when the user names only tandem; with this core-internal bit
// (OFI_GETINFO_INTERNAL, used by the core's own utility providers) it skips that filter.
inline constexpr uint64_t kGetinfoInternal = 1ull << 58;

// The offload provider's name: the "off_" prefix is what makes the core hide it.
inline constexpr const char *kOffloadProvName = "off_tandem";

// fi_open_ops name of tandem's endpoint extension for its offload twin: RMA that arrives over
// the node-local path targets regions registered with tandem, so the offload provider checks
// the key, bounds and access through the owner (as an RNIC checks an rkey), and reports the
// access for FI_RMA_EVENT counters.
inline constexpr const char *kPeerEpOpsName = "tandem_peer_ep_v1";

struct PeerEpOps {
    size_t size;
    // *count in: room in iov (and mem), out: pieces. mem (may be null): where each piece
    // lives. 0, or -FI_EACCES / -FI_EINVAL / -FI_ETOOSMALL.
    int (*resolve)(fid_ep *ep, uint64_t key, uint64_t addr, size_t len, uint64_t access, iovec *iov,
                   hmem::MemRef *mem, size_t *count);
    void (*access_done)(fid_ep *ep, uint64_t key, uint64_t access);
    // A word that moves whenever a key of the owner's domain stops resolving as it did (a
    // region closed): a resolution kept while it has not moved is still the owner's answer.
    const std::atomic<uint64_t> *(*mr_generation)(fid_ep *ep);
};

// The twin's inbox once the owner reads it (LocalPathOps::take_inbox): the ring, of which the
// owner is then the only reader, and whether the twin is quiet (no backlog, no operation
// waiting, no completion held, no sender held behind a split write). The owner decodes every
// Short and Eager cell itself and hands every other cell to take_cell; it keeps
// a sender's cells while the channel holds that sender (shm::SenderHold, set and lifted by the
// twin's RMA target) and replays them through the same dispatch once the hold is lifted. The
// owner calls the twin's progress for its other work while it is not quiet, and every few
// passes while it is (checks, heartbeat).
struct InboxView {
    ShmRing *ring;
    // The owner clears it when it leaves the twin work: a cell of its own pushed into a
    // peer's full ring waits in that peer's Outbox backlog, which the twin's pass flushes.
    bool *quiet;
};

// fi_open_ops name of off_tandem's endpoint extension: the node-local path as its owner uses
// it (the owner's channel, which the twin opens its inbox on and sends through), the twin's
// inbox, and the twin's sleep. (The owner drives the twin's progress through its CQ, as
// fi_peer(3) says.)
// Before it sleeps on the channel's wake descriptor (shm::InboxWake::fd), the owner calls
// fi_trywait on the twin's CQ (off_tandem's fabric): its endpoints ask senders to signal that
// descriptor and set their liveness timers while their operations wait on peers, and it
// answers -FI_EAGAIN when work is pending (the descriptor is then readable at once).
inline constexpr const char *kLocalPathOpsName = "off_tandem_local_v17";

struct LocalPathOps {
    size_t size;
    // sizeof(shm::Channel) as the twin was built: the owner's channel is shared as a C++
    // object, which both providers must lay out alike (they are built together; an owner
    // built apart refuses the table).
    size_t channel_bytes;
    // The owner's receive of a node-local device message (an IpcRts the owner decoded and
    // matched): `len` bytes of the sender's device buffers (`count` entries, of process `pid`,
    // which the owner vouched for through the channel) mapped by the twin, whose cache of
    // imported handles and device engines they are, and copied into `to` (where `to_mem` says;
    // all host when null). 0; FI_EOPNOTSUPP when a buffer cannot be mapped here (the owner
    // answers so, and the sender restages the message in Frag cells); another positive FI_*
    // code when a copy fails.
    int (*copy_ipc)(fid_ep *ep, pid_t pid, const wire::LocalIpc *ipc, size_t count, const iovec *to,
                    const hmem::MemRef *to_mem, size_t nto, size_t len);
    // The owner's send of a node-local device message peer to peer (the owner encodes the
    // IpcRts): the IPC handles of its `count` buffers (`mem` says where each lives), from the
    // twin's cache of exports, whose driver calls they are, written to `out` as the IpcRts
    // carries them (kLocalMaxIov entries at most; empty buffers left out). The number of
    // entries; -FI_EOPNOTSUPP when a buffer is host memory or the driver gives it no handle
    // (the owner stages the message instead, or fails it under FI_HMEM_P2P_REQUIRED).
    int (*export_ipc)(fid_ep *ep, const iovec *iov, const hmem::MemRef *mem, size_t count,
                      wire::LocalIpc *out);
    // The owner's node-local channel (main_prov/shm/channel.h), built over the owner's AV
    // (fi_peer(3)'s AV gives a peer no way to read an entry, and the channel finds a peer's
    // inbox by its address). Before fi_enable, once; it outlives the twin endpoint and is used
    // under the owner's lock. When enabled the twin opens its inbox on it (shape and policy are
    // the twin's settings, FI_OFF_TANDEM_*; FI_OPT_SHARED_MEMORY_PERMITTED false: the wake
    // only, no inbox), names the channel's Sender (its producer id, the owner endpoint's name
    // and Short line; itself as the listener of every stream) and sends all its cells through
    // the peers' Outboxes; the owner writes its Short cells through them too (Outbox::claim /
    // publish) and sleeps on the channel's wake descriptor. Without it (an owner tandem did
    // not build) the twin makes a channel of its own that looks no address up: it receives,
    // and reaches no peer. -FI_EOPBADSTATE after fi_enable or a second time.
    int (*use_channel)(fid_ep *ep, shm::Channel *channel);
    // The owner becomes the reader of the twin's inbox (see InboxView). Its own twin only;
    // once, after the twin is enabled.
    InboxView (*take_inbox)(fid_ep *ep);
    // A cell the owner read off the inbox that is the twin's to handle (see InboxView); the
    // owner releases it from the ring afterwards.
    void (*take_cell)(fid_ep *ep, const uint8_t *cell);
};

// fid ops for the fids an owner exports: the peer uses only their owner ops, so fi_close and
// friends on them answer -FI_ENOSYS (closing an exported object is the owner's business).
fi_ops *exported_fid_ops();

}  // namespace tandem::peer
