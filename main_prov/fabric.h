// fid_fabric: the TCP fabric of tandem. Opens domains, passive endpoints, EQs and wait sets.
#pragma once

#include "common/fid_adaptor.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>

#include <atomic>
#include <string>

namespace tandem {

class Fabric : public FidObject<Fabric, fid_fabric> {
  public:
    Fabric(const fi_fabric_attr &attr, void *context);

    int close();
    int control(int command, void *arg);
    int domain(fi_info *info, fid_domain **dom, void *context);
    int domain2(fi_info *info, fid_domain **dom, uint64_t flags, void *context);
    int passive_ep(fi_info *info, fid_pep **pep, void *context);
    int eq_open(fi_eq_attr *attr, fid_eq **eq, void *context);
    int wait_open(fi_wait_attr *attr, fid_wait **waitset);
    int trywait(struct fid **fids, int count);

    const std::string &name() const { return name_; }
    void hold() { ++refs_; }
    void release() { --refs_; }

  private:
    std::string name_;
    std::atomic<int> refs_{0};
};

}  // namespace tandem
