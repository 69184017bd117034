// fid_av_set (fi_av_set(3)): an ordered set of an AV's addresses, the group a collective runs
// over. tandem keeps the members; the collectives themselves are the offload provider's, which
// reads the members through the exported fid_peer_av_set (fi_peer(3)) or, for tandem's own
// endpoints, is handed them at fi_join_collective. fi_av_set_addr gives the set's collective
// address (a handle of the domain's CollAddresses), the parent of a first join.
#pragma once

#include "common/fid_adaptor.h"
#include "peer/peer_av.h"

#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>

#include <memory>
#include <vector>

namespace tandem {

class Av;

class AvSet final : public FidObject<AvSet, fid_av_set>, public peer::AvSetOwner {
  public:
    AvSet(Av *av, const fi_av_set_attr &attr, void *context);
    ~AvSet();

    int close();
    int control(int command, void *arg);
    int set_union(const fid_av_set *src);
    int intersect(const fid_av_set *src);
    int diff(const fid_av_set *src);
    int insert(fi_addr_t addr);
    int remove(fi_addr_t addr);
    int addr(fi_addr_t *coll_addr);

    int peer_members(fi_addr_t *addr, size_t *count) override;
    const std::vector<fi_addr_t> &members() const { return members_; }
    Av *av() const { return av_; }
    const std::vector<uint8_t> &comm_key() const { return comm_key_; }
    static constexpr size_t kMaxCommKey = 256;
    // The tandem AV set behind a fid_av_set, or nullptr for anything else.
    static AvSet *from(const fid_av_set *set);

  private:
    const AvSet *other(const fid_av_set *src) const;

    Av *av_;
    size_t capacity_;
    std::vector<fi_addr_t> members_;  // in insertion order, no duplicates
    std::unique_ptr<peer::ExportedAvSet> exported_;
    fi_addr_t coll_addr_ = FI_ADDR_NOTAVAIL;  // once fi_av_set_addr asked
    std::vector<uint8_t> comm_key_;
};

}  // namespace tandem
