#include "main_prov/coll_group.h"

#include "hmem/atomic.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"

#include <algorithm>

namespace tandem {

namespace {

fi_ops coll_group_fi_ops = fid_ops(&Trampoline<&CollGroup::close>::call<fid>);

}  // namespace

bool coll_reduces(int coll) {
    return coll == FI_ALLREDUCE || coll == FI_REDUCE_SCATTER || coll == FI_REDUCE;
}

int coll_supported(int coll, int datatype, int op) {
    if (coll < FI_BARRIER || coll > FI_GATHER) return -FI_EINVAL;
    if (coll == FI_BARRIER) return datatype == FI_VOID ? 0 : -FI_EOPNOTSUPP;
    if (datatype == FI_VOID) return -FI_EOPNOTSUPP;  // only a barrier moves nothing
    if (datatype < FI_INT8 || datatype >= FI_DATATYPE_LAST) return -FI_EINVAL;
    if (!coll_reduces(coll)) return 0;
    if (op == FI_NOOP || op == FI_ATOMIC_READ || op == FI_ATOMIC_WRITE) return -FI_EOPNOTSUPP;
    if (op < FI_MIN || op >= FI_ATOMIC_OP_LAST) return -FI_EINVAL;
    if (op > FI_BXOR) return -FI_EOPNOTSUPP;  // compare operations reduce nothing
    return atomic::valid(atomic::Kind::Base, op, datatype) ? 0 : -FI_EOPNOTSUPP;
}

CollGroup::CollGroup(Engine *ep, std::vector<fi_addr_t> members, uint32_t rank, void *context)
    : ep_(ep), members_(std::move(members)), rank_(rank), context_(context) {
    init_fid(FI_CLASS_MC, context, &coll_group_fi_ops);
    fid()->fi_addr = ep_->domain()->coll_addresses().add(this);
    ep_->coll_group_opened();
}

CollGroup::~CollGroup() {
    ep_->domain()->coll_addresses().remove(fid()->fi_addr);
    ep_->coll_group_closed();
}

// fi_close: the twin lets the group go once nothing of it runs (-FI_EBUSY until then: its join
// or operations still use the members' transfers).
int CollGroup::close() {
    std::lock_guard guard(ep_->domain()->lock());
    if (int ret = ep_->leave_group(*this)) return ret;
    delete this;
    return 0;
}

void CollGroup::on_joined(void *arg, int err) {
    auto *g = static_cast<CollGroup *>(arg);
    g->joined_ = !err;
    g->join_done_ = true;
    g->ep_->report_join(g->base_fid(), g->context_, err);
}

int CollGroup::rank_of(fi_addr_t addr) const {
    auto it = std::find(members_.begin(), members_.end(), addr);
    return it == members_.end() ? -1 : int(it - members_.begin());
}

}  // namespace tandem
