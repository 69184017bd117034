// fid_mc of a collective group (fi_collective(3)): what fi_join_collective hands back. The
// group's members are its AV set's at the time of the join, in the set's order (which numbers
// the ranks); the group runs in the endpoint's off_tandem twin (peer::OffloadOps, its
// coll_* entries), which reports the join (FI_JOIN_COMPLETE on the endpoint's EQ) and each
// operation's end back here.
//
// Collective addresses: fi_av_set_addr and fi_mc_addr hand out handles the domain keeps
// (CollAddresses), never pointers, so an address that names nothing, or a group of another
// endpoint, is refused with -FI_EINVAL instead of being dereferenced.
#pragma once

#include "common/fid_adaptor.h"

#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tandem {

class AvSet;
class Engine;

// Which collectives tandem runs: datatype (the 14 fi_collective(3) names, not FI_VOID) and,
// for reductions, op (FI_MIN .. FI_BXOR where fi_atomic(3) defines the pair; FI_ATOMIC_READ
// and FI_ATOMIC_WRITE reduce nothing). 0, -FI_EOPNOTSUPP, or -FI_EINVAL for values that are
// no collective, datatype or operation at all.
int coll_supported(int coll, int datatype, int op);
bool coll_reduces(int coll);

class CollGroup final : public FidObject<CollGroup, fid_mc> {
  public:
    CollGroup(Engine *ep, std::vector<fi_addr_t> members, uint32_t rank, void *context);
    ~CollGroup();
    int close();

    Engine *endpoint() const { return ep_; }
    const std::vector<fi_addr_t> &members() const { return members_; }
    uint32_t rank() const { return rank_; }
    bool joined() const { return joined_; }
    uint64_t handle = 0;  // the twin's

    // The twin's peer::CollJoin::joined callback: FI_JOIN_COMPLETE (or the error) on the EQ.
    static void on_joined(void *arg, int err);
    // The rank of an fi_addr of the endpoint's AV among the members; -1 when not one.
    int rank_of(fi_addr_t addr) const;

  private:
    Engine *ep_;
    std::vector<fi_addr_t> members_;
    uint32_t rank_;
    void *context_;
    bool joined_ = false, join_done_ = false;
};

// A domain's collective addresses: handles of AV sets (fi_av_set_addr) and of joined groups
// (fi_mc_addr). Called under the domain lock.
class CollAddresses {
  public:
    fi_addr_t add(AvSet *set) { return add(set, kSetTag); }
    fi_addr_t add(CollGroup *group) { return add(group, kGroupTag); }
    void remove(fi_addr_t addr) {
        table_.erase(addr);
        last_addr_ = FI_ADDR_NOTAVAIL;
    }
    AvSet *set_at(fi_addr_t addr) const { return at<AvSet>(addr, kSetTag); }
    CollGroup *group_at(fi_addr_t addr) const { return at<CollGroup>(addr, kGroupTag); }

  private:
    // High bits no AV index reaches, different for sets and groups.
    static constexpr uint64_t kSetTag = 0xc5ull << 56, kGroupTag = 0xc6ull << 56;
    fi_addr_t add(void *obj, uint64_t tag) {
        fi_addr_t a = tag | next_++;
        table_.emplace(a, obj);
        return a;
    }
    template <class T>
    T *at(fi_addr_t addr, uint64_t tag) const {
        if ((addr & (0xffull << 56)) != tag) return nullptr;
        if (addr == last_addr_) return static_cast<T *>(last_obj_);  // a loop on one group
        auto it = table_.find(addr);
        if (it == table_.end()) return nullptr;
        last_addr_ = addr;
        last_obj_ = it->second;
        return static_cast<T *>(it->second);
    }
    std::unordered_map<fi_addr_t, void *> table_;
    mutable fi_addr_t last_addr_ = FI_ADDR_NOTAVAIL;
    mutable void *last_obj_ = nullptr;
    uint64_t next_ = 1;
};

}  // namespace tandem
