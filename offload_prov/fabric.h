// off_tandem's fid_fabric: opens peer domains and peer EQs, and answers fi_trywait on its CQs
// for their owner; nothing an application would use.
#pragma once

#include "common/fid_adaptor.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>

#include <atomic>

namespace tandem::off {

class Fabric : public FidObject<Fabric, fid_fabric> {
  public:
    explicit Fabric(void *context);
    int close();
    int domain(fi_info *info, fid_domain **dom, void *context);
    int domain2(fi_info *info, fid_domain **dom, uint64_t flags, void *context);
    int eq_open(fi_eq_attr *attr, fid_eq **eq, void *context);
    // fi_trywait(3) on CQs of ours (Cq::trywait): -FI_EAGAIN when one has work pending,
    // -FI_EINVAL for a fid that is not one of our CQs.
    int trywait(struct fid **fids, int count);
    void hold() { ++refs_; }
    void release() { --refs_; }

  private:
    std::atomic<int> refs_{0};
};

}  // namespace tandem::off
