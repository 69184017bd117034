// off_tandem's fid_domain: always the peer of an owner's domain (fi_domain2 with FI_PEER).
// Memory is registered through the owner's domain, so a key means the same region in both
// providers. It holds the owner's triggered operations and deferred work (trigger/).
#pragma once

#include "common/fid_adaptor.h"
#include "offload_prov/trigger/trigger_queue.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <atomic>

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

    // Triggered operations and deferred work of the owner's domain (peer::TriggerOps).
    TriggerQueue &triggers() { return triggers_; }
    int xpu_variable(const void *group, int iface, int device, uint64_t *var, void **addr,
                     uint64_t *value);

    fid_domain *owner() const { return owner_; }
    const fi_info *info() const { return info_; }
    void hold() { ++refs_; }
    void release() { --refs_; }

  private:
    Fabric *fabric_;
    fi_info *info_;
    fid_domain *owner_;
    std::atomic<int> refs_{0};
    TriggerQueue triggers_;
};

}  // namespace tandem::off
