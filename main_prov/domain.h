// fid_domain: one IP interface of the TCP fabric. Owns the lock every object of the domain
// shares (docs/architecture.md, "Threads and progress"), the memory-region table that
// checks remote keys, and the list of endpoints whose progress a CQ or counter read drives.
#pragma once

#include "main_prov/coll_group.h"
#include "common/fid_adaptor.h"
#include "common/wait_fd.h"
#include "main_prov/lock_order.h"
#include "main_prov/mr.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_trigger.h>

#include <atomic>
#include <memory>
#include <unordered_set>
#include <mutex>
#include <string>
#include <vector>

namespace tandem {

class Av;
class Fabric;
class Engine;
class Cntr;
class OffloadDomain;
class ProgressThread;
struct PreparedWork;
struct TriggeredOp;
namespace peer {
struct TriggerWork;
}

class Domain : public FidObject<Domain, fid_domain> {
  public:
    Domain(Fabric *fabric, const fi_info *info, void *context);
    ~Domain();

    // libfabric entry points (fi_domain(3) and friends).
    int close();
    int bind(struct fid *bfid, uint64_t flags);
    int control(int command, void *arg);
    int ops_open(const char *name, uint64_t flags, void **ops, void *context);
    int av_open(fi_av_attr *attr, fid_av **av, void *context);
    int cq_open(fi_cq_attr *attr, fid_cq **cq, void *context);
    int endpoint(fi_info *info, fid_ep **ep, void *context);
    int scalable_ep(fi_info *info, fid_ep **sep, void *context);
    int cntr_open(fi_cntr_attr *attr, fid_cntr **cntr, void *context);
    int poll_open(fi_poll_attr *attr, fid_poll **pollset);
    int stx_ctx(fi_tx_attr *attr, fid_stx **stx, void *context);
    int srx_ctx(fi_rx_attr *attr, fid_ep **rx_ep, void *context);
    int query_atomic(enum fi_datatype datatype, enum fi_op op, fi_atomic_attr *attr,
                     uint64_t flags);
    int query_collective(enum fi_collective_op coll, fi_collective_attr *attr, uint64_t flags);
    int mr_reg(const void *buf, size_t len, uint64_t access, uint64_t offset,
               uint64_t requested_key, uint64_t flags, fid_mr **mr, void *context);
    int mr_regv(const iovec *iov, size_t count, uint64_t access, uint64_t offset,
                uint64_t requested_key, uint64_t flags, fid_mr **mr, void *context);
    int mr_regattr(const fi_mr_attr *attr, uint64_t flags, fid_mr **mr);

    // Inside tandem: the domain's lock (DomainLock, main_prov/lock_order.h), first in the lock
    // order. Skipped under FI_THREAD_DOMAIN until an endpoint of the domain is bound to an EQ.
    using Lock = DomainLock;
    Lock &lock() { return mutex_; }
    // Drives every endpoint of the domain; the caller holds lock().
    void progress();
    // Work that only more passes move, which no descriptor announces (automatic progress
    // does not sleep on it, and an application call that leaves it wakes the thread). The
    // caller holds lock().
    bool work_pending() const;
    // After an application's call: whether a sleeping progress thread should look again
    // (work_pending, or a twin with something going: its arm() then says whether it needs
    // passes). The caller holds lock().
    bool worth_a_look() const;
    // Triggers waiting for a value a device writes (XPU): automatic progress polls them.
    bool device_triggers_waiting() const { return device_triggers_waiting_; }
    // How long a blocking call (fi_cq_sread, fi_cntr_wait, fi_wait, fi_eq_sread through an
    // endpoint) or the progress thread may sleep on the descriptors of watch_fds before it
    // must pass again: -1, until one wakes it, unless work waits that no descriptor announces:
    // 1 ms while passes move it (work_pending), the poll interval while XPU triggers wait,
    // until an endpoint's link has timed work (Engine::next_timer_ms: a stalled connection
    // request's time). The caller holds lock().
    int sleep_limit_ms() const;
    void add_endpoint(Engine *ep);
    void remove_endpoint(Engine *ep);
    // av gained addresses or user IDs: its endpoints tell an SRX owner the sources it now
    // knows (Engine::tell_owner_new_sources). The caller holds lock().
    void av_learnt_sources(const Av *av);
    // Puts the descriptors of every endpoint into the wait set (before an application sleeps).
    void watch_fds(WaitSet &set);
    MrTable &mr_table() { return mr_table_; }
    // The link of this domain's endpoints: an RDMA device's (verbs) or TCP.
    LinkDomain &link() { return *link_; }
    // RMA the target's protocol carries out (wire::ProtoOp::RmaReq) instead of the NIC: a
    // link with keys of its own (verbs) in a domain whose regions cannot be the NIC's, because
    // the application counts remote accesses (FI_RMA_EVENT) or names its keys or offsets
    // (mr_mode without FI_MR_PROV_KEY | FI_MR_VIRT_ADDR).
    bool rma_served() const { return rma_served_; }
    Fabric *fabric() const { return fabric_; }
    const fi_info *info() const { return info_; }
    uint64_t mr_mode() const { return mr_mode_; }
    // off_tandem's peer domain, opened on first use; nullptr when it is not available or the
    // local path is turned off. The caller holds lock().
    OffloadDomain *offload();
    fi_threading threading() const { return threading_; }

    // Counters open on this domain, by fid: a trigger or deferred work names only these
    // (a counter of another domain, or one closed, is -FI_EINVAL). The caller holds lock().
    void add_counter(Cntr *cntr);
    void remove_counter(Cntr *cntr);
    Cntr *counter_of(fid_cntr *cntr) const;
    // Triggered operations and deferred work (main_prov/trigger.cpp): held by off_tandem's
    // trigger queue, started from progress. The caller holds lock().
    bool triggers_waiting() const { return triggers_waiting_.load(std::memory_order_relaxed); }
    void start_triggers();
    void note_triggers();  // after work was queued or discarded: refresh triggers_waiting()
    int queue_trigger(std::unique_ptr<TriggeredOp> op, peer::TriggerWork &work);
    void hold() { ++refs_; }
    void release() { --refs_; }
    // Collective addresses (fi_av_set_addr, fi_mc_addr); the caller holds lock().
    CollAddresses &coll_addresses() { return coll_addresses_; }

  private:
    Fabric *fabric_;
    fi_info *info_;
    uint64_t mr_mode_;
    bool rma_served_ = false;
    fi_threading threading_;
    Lock mutex_;
    std::vector<Engine *> endpoints_;
    std::shared_ptr<LinkDomain> link_;  // before mr_table_: regions hold its registrations
    MrTable mr_table_;
    std::atomic<int> refs_{0};  // objects opened on this domain and not closed yet
    std::unique_ptr<OffloadDomain> offload_;
    bool offload_tried_ = false;
    std::unordered_set<fid_cntr *> counters_;
    std::atomic<bool> triggers_waiting_{false};
    bool device_triggers_waiting_ = false;  // written under the lock (note_triggers)
    CollAddresses coll_addresses_;
    // Last: it runs this domain's progress until it is stopped, first thing in ~Domain.
    std::unique_ptr<ProgressThread> progress_thread_;
    void start_progress_thread();
    // FI_QUEUE_WORK, FI_CANCEL_WORK, FI_FLUSH_WORK (trigger.cpp).
    int queue_work(const fi_deferred_work *work);
    // queue_work's parts: a counter operation queued, or an endpoint's operation prepared.
    int queue_counter_work(const fi_deferred_work &work, Cntr *trigger);
    int prepare_message_work(const fi_deferred_work &work, PreparedWork &out);
    int prepare_rma_work(const fi_deferred_work &work, PreparedWork &out);
    int prepare_atomic_work(const fi_deferred_work &work, PreparedWork &out);
    int cancel_work(const fi_deferred_work *work);
    int flush_work(const fi_deferred_work *work);
};

}  // namespace tandem
