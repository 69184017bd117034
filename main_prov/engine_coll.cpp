// fi_collective(3) on tandem's RDM endpoint: joining groups (fi_join_collective) and the
// collective calls. tandem checks each call and keeps what the application sees (the fid_mc,
// the EQ's FI_JOIN_COMPLETE, CQ entries); the twin runs the algorithms
// (offload_prov/coll/) over peer transfers on this endpoint (peer::OffloadOps, its coll_* entries).
#include "common/log.h"
#include "main_prov/av.h"
#include "main_prov/av_set.h"
#include "main_prov/cntr.h"
#include "main_prov/coll_group.h"
#include "main_prov/config.h"
#include "main_prov/cq.h"
#include "main_prov/domain.h"
#include "main_prov/engine.h"
#include "main_prov/eq.h"
#include "main_prov/local_path.h"
#include "main_prov/trigger.h"

#include <algorithm>

namespace tandem {

namespace {

// FNV-1a over bytes, continued from h.
uint64_t fnv(uint64_t h, const void *data, size_t len) {
    auto *p = static_cast<const uint8_t *>(data);
    for (size_t i = 0; i < len; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}
constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;

// The per-operation state the twin's done callback brings back.
struct CollCompletion {
    Engine *ep;
    void *context;
    uint64_t flags;
    DeferredDone done;
};

}  // namespace

// ------------------------------------------------------------------------------------------
// Joining

namespace {

// The parent of a group joined at coll_addr (the set's own address, or a group of this
// endpoint) holds every member of the new group.
bool parent_holds(Domain &domain, const Av *av, const Engine *ep, fi_addr_t coll_addr,
                  const std::vector<fi_addr_t> &members) {
    const std::vector<fi_addr_t> *parent = nullptr;
    if (AvSet *p = domain.coll_addresses().set_at(coll_addr); p && p->av() == av)
        parent = &p->members();
    else if (CollGroup *g = domain.coll_addresses().group_at(coll_addr);
             g && g->endpoint() == ep && g->joined())
        parent = &g->members();
    if (!parent) return false;
    for (fi_addr_t a : members)
        if (std::find(parent->begin(), parent->end(), a) == parent->end()) return false;
    return true;
}

// What every member computes alike from the set: its own rank, a key of the members in the
// set's order and one of the set whatever its order (both with the set's communication key),
// and the set's order sorted by member name.
struct JoinKeys {
    int rank = -1;
    uint64_t ordered = kFnvBasis;
    uint64_t set_key = 0;
    std::vector<uint32_t> order;
};

int join_keys(const Av &av, const std::vector<fi_addr_t> &members, const std::string &self_key,
              const std::vector<uint8_t> &comm_key, JoinKeys &out) {
    std::vector<uint64_t> names;
    for (size_t i = 0; i < members.size(); ++i) {
        const EndpointName *n = av.name_of(members[i]);
        if (!n) return -FI_EINVAL;
        const std::string k = n->key();
        if (k == self_key) out.rank = int(i);
        out.ordered = fnv(out.ordered, k.data(), k.size());
        names.push_back(fnv(kFnvBasis, k.data(), k.size()));
    }
    if (out.rank < 0) {
        TANDEM_WARN(FI_LOG_EP_CTRL,
                    "fi_join_collective: the endpoint is not a member of the set\n");
        return -FI_EINVAL;
    }
    out.order.resize(members.size());
    for (uint32_t i = 0; i < out.order.size(); ++i) out.order[i] = i;
    std::sort(out.order.begin(), out.order.end(),
              [&names](uint32_t a, uint32_t b) { return names[a] < names[b]; });
    std::sort(names.begin(), names.end());
    out.set_key = fnv(kFnvBasis, names.data(), names.size() * sizeof names[0]);
    out.set_key = fnv(out.set_key, comm_key.data(), comm_key.size());
    out.ordered = fnv(out.ordered, comm_key.data(), comm_key.size());
    return 0;
}

}  // namespace

// fi_join (fi_ops_cm::join): only collective groups (FI_COLLECTIVE); tandem offers no
// multicast (FI_MULTICAST), so a plain join is -FI_ENOSYS.
int Engine::join(const void *addr, uint64_t flags, fid_mc **mc, void *context) {
    if (!(flags & FI_COLLECTIVE)) return -FI_ENOSYS;
    if (!addr || !mc) return -FI_EINVAL;
    const auto *ca = static_cast<const fi_collective_addr *>(addr);
    std::lock_guard guard(domain_->lock());
    if (!(caps_ & FI_COLLECTIVE)) return -FI_EOPNOTSUPP;
    if (!enabled_) return -FI_EOPBADSTATE;
    if (!eq_) return -FI_ENOEQ;  // fi_collective(3): FI_JOIN_COMPLETE goes to the EQ
    if (!local_) {
        TANDEM_WARN(FI_LOG_EP_CTRL,
                    "fi_join_collective: no off_tandem twin, whose engine runs the groups\n");
        return -FI_EOPNOTSUPP;
    }
    const AvSet *set = AvSet::from(ca->set);
    if (!set || set->av() != av_) return -FI_EINVAL;
    const std::vector<fi_addr_t> &members = set->members();
    if (members.empty()) return -FI_EINVAL;
    // FI_ADDR_NOTAVAIL: membership the application manages, no exchange.
    const bool managed_here = ca->coll_addr != FI_ADDR_NOTAVAIL;
    if (managed_here && !parent_holds(*domain_, av_, this, ca->coll_addr, members))
        return -FI_EINVAL;
    // Ranks follow the set's order; this endpoint must be one of the members.
    EndpointName self;
    size_t len = sizeof self.ss;
    if (int ret = getname_locked(&self.ss, &len)) return ret;
    JoinKeys keys;
    if (int ret = join_keys(*av_, members, self.key(), set->comm_key(), keys)) return ret;
    const int rank = keys.rank;
    const uint64_t ordered = keys.ordered, set_key = keys.set_key;
    const std::vector<uint32_t> &order = keys.order;

    auto *g = new CollGroup(this, members, uint32_t(rank), context);
    peer::CollJoin j;
    j.members = g->members().data();
    j.count = g->members().size();
    j.rank = uint32_t(rank);
    j.ordered_key = ordered;
    j.set_key = set_key;
    j.set_order = order.data();
    j.handshake = managed_here;
    j.local_path = Config::get().local_path && shm_permitted_;
    j.arg = g;
    j.joined = &CollGroup::on_joined;
    if (int ret = local_->ops().coll_join(local_->twin(), &j, &g->handle)) {
        delete g;
        return ret;
    }
    *mc = g->fid();
    return 0;
}

void Engine::report_join(fid_t mc, void *context, int err) {
    if (!eq_) return;
    if (err) {
        eq_->post_error(mc, context, err, nullptr, 0, 0);
        return;
    }
    fi_eq_entry entry{mc, context, 0};
    eq_->post(FI_JOIN_COMPLETE, &entry, sizeof entry);
}

int Engine::leave_group(CollGroup &g) {
    if (!local_) return 0;
    return local_->ops().coll_leave(local_->twin(), g.handle);
}

// ------------------------------------------------------------------------------------------
// The calls

ssize_t Engine::post_collective(const CollCall &c) {
    std::lock_guard guard(domain_->lock());
    if (!(caps_ & FI_COLLECTIVE)) return -FI_EOPNOTSUPP;
    check_tx_ready(0);
    CollGroup *g = domain_->coll_addresses().group_at(c.coll_addr);
    if (!g || g->endpoint() != this || !g->joined()) return -FI_EINVAL;
    const int datatype = c.coll == FI_BARRIER ? int(FI_VOID) : c.datatype;
    if (int ret = coll_supported(c.coll, datatype, coll_reduces(c.coll) ? c.op : FI_NOOP))
        return ret;
    CollRequest r;
    r.group = g;
    r.context = c.context;
    r.flags = c.flags;
    peer::CollWork &w = r.work;
    w.coll = static_cast<fi_collective_op>(c.coll);
    w.datatype = datatype;
    w.op = coll_reduces(c.coll) ? c.op : FI_NOOP;
    w.count = c.coll == FI_BARRIER ? 0 : c.count;
    const size_t elem = c.coll == FI_BARRIER ? 0 : atomic::datatype_size(datatype);
    if (elem && w.count > peer::kCollMaxBytes / elem / g->members().size()) return -FI_EMSGSIZE;
    const bool rooted = c.coll == FI_BROADCAST || c.coll == FI_REDUCE || c.coll == FI_SCATTER ||
                        c.coll == FI_GATHER;
    bool root = false;
    if (rooted) {
        int rr = g->rank_of(c.root);
        if (rr < 0) return -FI_EINVAL;
        w.root = uint32_t(rr);
        root = w.root == g->rank();
    }
    // The buffers the call must give (a null one where bytes move is -FI_EINVAL).
    w.send = c.buf;
    w.send_desc = c.desc;
    w.recv = c.result;
    w.recv_desc = c.result_desc;
    const peer::CollIo io =
        peer::coll_io_bytes(c.coll, w.count * elem, uint32_t(g->members().size()), root);
    if ((io.send && !w.send) || (io.recv && !w.recv)) return -FI_EINVAL;
    // Collectives stage device buffers through host memory (the engine reduces there), which
    // FI_HMEM_P2P_REQUIRED forbids, as it forbids atomics on device memory.
    if (p2p_.mode() == FI_HMEM_P2P_REQUIRED && (peer::mem_of(w.send_desc).iface != FI_HMEM_SYSTEM ||
                                                peer::mem_of(w.recv_desc).iface != FI_HMEM_SYSTEM))
        return -FI_EOPNOTSUPP;
    // Without FI_HMEM the twin is handed no descriptors (they could be anything).
    if (!(caps_ & FI_HMEM)) w.send_desc = w.recv_desc = nullptr;
    if (r.flags & FI_TRIGGER) return queue_triggered(TriggeredRequest(std::move(r)));
    return issue_collective(r);
}

ssize_t Engine::issue_collective(CollRequest &r) {
    auto *done = new CollCompletion{this, r.context, r.flags, r.done};
    r.work.arg = done;
    r.work.done = &Engine::collective_done;
    int ret = local_->ops().coll_post(local_->twin(), r.group->handle, &r.work);
    if (ret) delete done;
    return ret;
}

// The twin's report (from its progress, under the domain lock): one completion, FI_COLLECTIVE.
void Engine::collective_done(void *arg, int err) {
    auto *c = static_cast<CollCompletion *>(arg);
    Engine *ep = c->ep;
    Cntr *cntr = c->done.deferred ? c->done.cntr : nullptr;
    if (err) {
        if (cntr) cntr->inc_err();
        if (!c->done.deferred || (c->flags & FI_COMPLETION))
            ep->write_tx_err(c->context, FI_COLLECTIVE, err, 0);
    } else {
        if (cntr) cntr->inc();
        if (ep->tx_cq_ && ep->tx_reports(c->flags, c->done))
            ep->tx_cq_->write({c->context, FI_COLLECTIVE, 0, nullptr, 0, 0, FI_ADDR_NOTAVAIL});
    }
    delete c;
}

}  // namespace tandem
