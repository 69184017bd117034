// off_tandem's fid_domain: always the peer of an owner's domain (fi_domain2 with FI_PEER).
// Memory is registered through the owner's domain, so a key means the same region in both
// providers. It holds the owner's triggered operations and deferred work (trigger/).
#pragma once

#include "common/fid_adaptor.h"
#include "hmem/hmem.h"
#include "offload_prov/trigger/trigger_queue.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <atomic>
#include <map>
#include <utility>

namespace tandem::off {

class Fabric;

class Domain : public FidObject<Domain, fid_domain> {
  public:
    Domain(Fabric *fabric, const fi_info *info, fid_domain *owner);
    ~Domain();

    int close();
    int av_open(fi_av_attr *attr, fid_av **av, void *context);
    int cq_open(fi_cq_attr *attr, fid_cq **cq, void *context);
    int endpoint(fi_info *info, fid_ep **ep, void *context);
    int endpoint2(fi_info *info, fid_ep **ep, uint64_t flags, void *context);
    int srx_ctx(fi_rx_attr *attr, fid_ep **rx_ep, void *context);
    int mr_reg(const void *buf, size_t len, uint64_t access, uint64_t offset, uint64_t key,
               uint64_t flags, fid_mr **mr, void *context);
    int mr_regv(const iovec *iov, size_t count, uint64_t access, uint64_t offset, uint64_t key,
                uint64_t flags, fid_mr **mr, void *context);
    int mr_regattr(const fi_mr_attr *attr, uint64_t flags, fid_mr **mr);
    int ops_open(const char *name, uint64_t flags, void **ops, void *context);

    // Triggered operations and deferred work of the owner's domain (peer::OffloadOps, its
    // trigger_* entries).
    TriggerQueue &triggers() { return triggers_; }
    int xpu_variable(const void *group, int iface, int device, uint64_t *var, void **addr,
                     uint64_t *value);
    // Discards a group's work and frees its trigger variables (its endpoint closes).
    size_t discard_group(const void *group);

    fid_domain *owner() const { return owner_; }
    const fi_info *info() const { return info_; }
    void hold() { ++refs_; }
    void release() { --refs_; }

  private:
    // The XPU trigger variable of one group (an owner endpoint) on one device: hmem's signal,
    // the last value read from it, and the value the next work queued on it waits for.
    struct XpuVariable {
        const void *group = nullptr;
        const hmem::IfaceOps *ops = nullptr;
        void *state = nullptr;
        void *word = nullptr;
        uint64_t seen = 0;
        uint64_t next = 0;
    };
    bool xpu_read(uint64_t var, uint64_t *value);
    void close_variables(const void *group);

    Fabric *fabric_;
    fi_info *info_;
    fid_domain *owner_;
    std::atomic<int> refs_{0};
    std::map<uint64_t, XpuVariable> xpu_vars_;  // by handle
    std::map<std::pair<const void *, std::pair<int, int>>, uint64_t> xpu_by_owner_;
    uint64_t next_xpu_var_ = 1;
    TriggerQueue triggers_;  // last: its destructor discards work, whose variables are above
};

}  // namespace tandem::off
