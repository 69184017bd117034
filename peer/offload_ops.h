// The one private extension between tandem and its offload twin: what off_tandem does for
// tandem that fi_peer(3)'s objects (CQ, EQ, AV, SRX, domain) have no call for.
//
// tandem opens it once per domain, with fi_open_ops(kOffloadOpsName) on off_tandem's peer
// domain, and refuses it (node-local path, triggers and collectives off, with the reason
// logged) unless it is at least as large as tandem's and was built with tandem's channel. The
// entries come in three groups, each with its reason below:
//  - the node-local path of one endpoint (the twin endpoint as fid): tandem's channel lent to
//    the twin with the owner's answers the twin needs (attach), the cells of the inbox tandem
//    reads that are the twin's (take_cell), device memory mapped or exported through the
//    twin's IPC caches (copy_ipc, export_ipc);
//  - collectives (the twin endpoint): join, post, leave;
//  - triggered operations and deferred work (off_tandem's domain): its trigger queue.
// The other way, the twin asks tandem about remote keys through OwnerOps, which tandem hands
// with attach: no extension is opened on tandem's objects.
//
// Every entry is called under tandem's serialisation (its domain lock, or the application's
// under FI_THREAD_DOMAIN); the twin calls back (OwnerOps, the trigger and collective
// callbacks) only from inside those calls.
#pragma once

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/shm_ring.h"
#include "common/wire.h"
#include "hmem/hmem.h"
#include "peer/peer_coll.h"
#include "peer/peer_trigger.h"

namespace tandem::shm {
class Channel;
}

namespace tandem::peer {

// fi_open_ops name, on off_tandem's domain, of the table below.
inline constexpr const char *kOffloadOpsName = "off_tandem_ops_v1";

// The owner's answers about its memory registrations, for RMA and atomics that arrive over
// the node-local path and target regions registered with tandem: the twin checks the key,
// bounds and access through the owner (as an RNIC checks an rkey) and reports the access for
// FI_RMA_EVENT counters. `ep` is the owner's endpoint (the twin's fi_peer_transfer_context).
struct OwnerOps {
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

struct OffloadOps {
    size_t size;
    // sizeof(shm::Channel) as the twin was built: the owner's channel is shared as a C++
    // object, which both providers must lay out alike (they are built together; an owner
    // built apart refuses the table).
    size_t channel_bytes;

    // --- The node-local path (ep: the twin endpoint). The owner drives the twin's progress
    // through its CQ, as fi_peer(3) says; before it sleeps on the channel's wake descriptor
    // (shm::InboxWake::fd) it calls fi_trywait on the twin's CQ (off_tandem's fabric): the
    // twin's endpoints ask senders to signal that descriptor and set their liveness timers
    // while their operations wait on peers, and it answers -FI_EAGAIN when work is pending.

    // Why: the twin serves node-local RMA, atomics and its own transfers on the owner's
    // channel, built over the owner's AV (fi_peer(3)'s AV gives a peer no way to read an
    // entry, and the channel finds a peer's inbox by its address), and checks remote keys
    // with the owner (owner_ops; null: it refuses RMA and atomics that target it).
    // Before fi_enable, once; the channel outlives the twin endpoint and is used under the
    // owner's lock. When enabled the twin opens its inbox on it (shape and policy are the
    // twin's settings, FI_OFF_TANDEM_*; FI_OPT_SHARED_MEMORY_PERMITTED false: the wake only,
    // no inbox), names the channel's Sender (its producer id, the owner endpoint's name and
    // Short line; itself as the listener of every stream) and sends all its cells through the
    // peers' Outboxes; the owner writes its cells through them too (Outbox::claim / publish)
    // and sleeps on the channel's wake descriptor. Without it (an owner tandem did not build)
    // the twin makes a channel of its own that looks no address up: it receives, and reaches
    // no peer. -FI_EOPBADSTATE after fi_enable or a second time.
    int (*attach)(fid_ep *ep, shm::Channel *channel, const OwnerOps *owner_ops);
    // Why: the cells of the twin's own operations (RMA targets, atomics, answers to its
    // transfers) are the twin's to handle. Once the twin is enabled, the owner reads the inbox
    // the twin opened on its channel (and says so: Channel::owner_reads); it decodes every
    // Short, Eager, Frag, Rts and IpcRts cell itself, keeps a sender's cells while the channel
    // holds that sender (shm::SenderHold, set and lifted by the twin's RMA target) and replays
    // them once the hold is lifted, and hands every other cell here, releasing it from the
    // ring afterwards. It drives the twin's passes while Channel::twin_quiet is clear, and
    // every few of its empty passes while it is set (checks, heartbeat).
    void (*take_cell)(fid_ep *ep, const uint8_t *cell);
    // Why: mapped device memory is the twin's (its cache of imported handles and device
    // engines). The owner's receive of a node-local device message (an IpcRts the owner
    // decoded and matched): `len` bytes of the sender's device buffers (`count` entries, of
    // process `pid`, which the owner vouched for through the channel) mapped by the twin and
    // copied into `to` (where `to_mem` says; all host when null). 0; FI_EOPNOTSUPP when a
    // buffer cannot be mapped here (the owner answers so, and the sender restages the message
    // in Frag cells); another positive FI_* code when a copy fails.
    int (*copy_ipc)(fid_ep *ep, pid_t pid, const wire::LocalIpc *ipc, size_t count, const iovec *to,
                    const hmem::MemRef *to_mem, size_t nto, size_t len);
    // Why: exported device memory is the twin's too (its cache of exports, the driver's
    // calls). The owner's send of a node-local device message peer to peer (the owner encodes
    // the IpcRts): the IPC handles of its `count` buffers (`mem` says where each lives),
    // written to `out` as the IpcRts carries them (kLocalMaxIov entries at most; empty buffers
    // left out). The number of entries; -FI_EOPNOTSUPP when a buffer is host memory or the
    // driver gives it no handle (the owner stages the message instead, or fails it under
    // FI_HMEM_P2P_REQUIRED).
    int (*export_ipc)(fid_ep *ep, const iovec *iov, const hmem::MemRef *mem, size_t count,
                      wire::LocalIpc *out);

    // --- Collectives (fi_collective(3); ep: the twin endpoint). Why: the mission gives them
    // to the offload provider, and libfabric 1.17's peer API has no collective object. tandem
    // keeps what the application sees (the fid_mc, the EQ's FI_JOIN_COMPLETE, the CQ
    // entries); the twin runs the groups (offload_prov/coll/) over peer transfers on tandem's
    // endpoint and reports through the callbacks in CollJoin and CollWork.

    // 0 (the joined callback follows from progress), or a negative fabric errno.
    int (*coll_join)(fid_ep *ep, const CollJoin *join, uint64_t *group);
    // 0 (done follows from progress), -FI_EAGAIN, or a negative fabric errno.
    int (*coll_post)(fid_ep *ep, uint64_t group, const CollWork *work);
    // The group goes: 0, or -FI_EBUSY while its join or operations are still running.
    int (*coll_leave)(fid_ep *ep, uint64_t group);

    // --- Triggered operations and deferred work (fi_trigger(3); domain: off_tandem's).
    // Why: the mission gives them to the offload provider, and libfabric 1.17's peer API has
    // no trigger object. tandem captures the work and hands it here (peer/peer_trigger.h says
    // how it starts and who owns what).

    // 0, or -FI_EINVAL (no condition, unknown variable), -FI_ENOMEM.
    int (*trigger_queue)(fid_domain *domain, const TriggerWork *work);
    // Starts what is due; the number started. Cheap when nothing waits (pending == 0).
    size_t (*trigger_progress)(fid_domain *domain);
    // The work waiting; *device (may be null) gets how much of it waits for a value a device
    // writes (XPU triggers), which only polling notices (the owner's automatic progress then
    // wakes on a timer).
    size_t (*trigger_pending)(fid_domain *domain, size_t *device);
    // The work of group queued with this match key: discarded (reported), 0; -FI_ENOENT when
    // none waits (never queued, or already started).
    int (*trigger_cancel)(fid_domain *domain, const void *group, const void *match);
    // Discards (reported) every work of group triggered by cntr (every work of group when
    // cntr is null); the number discarded.
    size_t (*trigger_flush)(fid_domain *domain, const void *group, fid_cntr *cntr);
    // Discards every work that names cntr in any role (before the counter closes; reported).
    size_t (*trigger_flush_counter)(fid_domain *domain, fid_cntr *cntr);
    // Discards every work of group without reports (its endpoint closes).
    size_t (*trigger_discard_group)(fid_domain *domain, const void *group);
    // XPU triggers: the trigger variable of group on the device (iface, device), created on
    // first use in that device's memory, and the value the device writes to start the next
    // work queued on it. 0, or -FI_EOPNOTSUPP (no such device, or it cannot host one).
    int (*trigger_xpu_variable)(fid_domain *domain, const void *group, int iface, int device,
                                uint64_t *var, void **addr, uint64_t *value);
};

}  // namespace tandem::peer
