// The fid_ep adapter's control calls: creation, fi_close, fi_ep_bind, fi_control (enable,
// operation flags, aliases), options, and the tables of fi_ops, fi_ops_ep and fi_ops_cm. The
// data calls and their tables: endpoint_data.cpp (fi_msg, fi_tagged), endpoint_calls.cpp (RMA,
// atomics, collectives). What each call sets or starts is the engine's (main_prov/engine.h).
#include "main_prov/endpoint.h"

#include "common/fabric_compat.h"
#include "common/log.h"
#include "common/unsupported_ops.h"
#include "main_prov/av.h"
#include "main_prov/cntr.h"
#include "main_prov/cq.h"
#include "main_prov/domain.h"
#include "main_prov/endpoint_alias.h"
#include "main_prov/eq.h"

#include <rdma/fi_errno.h>

#include <cstring>

namespace tandem {

fi_ops alias_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&EndpointAlias::close>::call<fid>,
    .bind = enosys<decltype(fi_ops::bind)>,
    .control = enosys<decltype(fi_ops::control)>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

namespace {

int diag_peer_path(fid_ep *fid, fi_addr_t addr) noexcept try {
    return Endpoint::of(fid)->engine().peer_path(addr);
} catch (...) {
    return current_exception_errno();
}

peer::EpDiagOps ep_diag_ops = {sizeof(peer::EpDiagOps), diag_peer_path};

fi_ops ep_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&Endpoint::close>::call<fid>,
    .bind = &Trampoline<&Endpoint::bind>::call<fid>,
    .control = &Trampoline<&Endpoint::control>::call<fid>,
    .ops_open = &Trampoline<&Endpoint::ops_open>::call<fid>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_ep ep_ops = fid_ep_ops(
    &Trampoline<&Endpoint::cancel>::call<struct fid>, &Trampoline<&Endpoint::getopt>::call<fid>,
    &Trampoline<&Endpoint::setopt>::call<fid>, &Trampoline<&Endpoint::rx_size_left>::call<fid_ep>,
    &Trampoline<&Endpoint::tx_size_left>::call<fid_ep>);

fi_ops_cm ep_cm_ops = {
    .size = sizeof(fi_ops_cm),
    .setname = &Trampoline<&Endpoint::setname>::call<fid>,
    .getname = &Trampoline<&Endpoint::getname>::call<fid>,
    .getpeer = &Trampoline<&Endpoint::getpeer>::call<fid_ep>,
    .connect = &Trampoline<&Endpoint::connect>::call<fid_ep>,
    .listen = enosys<decltype(fi_ops_cm::listen)>,
    .accept = &Trampoline<&Endpoint::accept>::call<fid_ep>,
    .reject = enosys<decltype(fi_ops_cm::reject)>,
    .shutdown = &Trampoline<&Endpoint::shutdown>::call<fid_ep>,
    .join = &Trampoline<&Endpoint::join>::call<fid_ep>,
};

fi_ops_ep alias_ep_ops = fid_ep_ops();

}  // namespace

Endpoint::Endpoint(Domain *domain, fi_info *info, void *context) : engine_(domain, info, fid()) {
    defaults_.tx = info->tx_attr ? info->tx_attr->op_flags : 0;
    defaults_.rx = info->rx_attr ? info->rx_attr->op_flags : 0;
    init_fid(FI_CLASS_EP, context, &ep_fi_ops);
    fid()->ops = &ep_ops;
    fid()->cm = &ep_cm_ops;
    fid()->msg = &ep_msg_ops;
    fid()->tagged = &ep_tagged_ops;
    fid()->rma = &ep_rma_ops;
    fid()->atomic = &ep_atomic_ops;
    if (info->ep_attr->type == FI_EP_RDM) fid()->collective = &ep_coll_ops;
    complete_ep_tables(*fid());  // MSG endpoints: no collectives (-FI_EOPNOTSUPP)
}

Engine *engine_of(fid_ep *ep) {
    if (!ep) return nullptr;
    if (ep->fid.ops == &alias_fi_ops) return &EndpointAlias::of(ep)->parent->engine();
    if (ep->fid.ops == &ep_fi_ops) return &Endpoint::of(ep)->engine();
    return nullptr;
}

int Endpoint::close() {
    {
        std::lock_guard guard(engine_.domain()->lock());
        if (aliases_) return -FI_EBUSY;  // close the aliases first
    }
    if (int ret = engine_.close()) return ret;
    delete this;
    return 0;
}

int Endpoint::bind(struct fid *bfid, uint64_t flags) {
    if (!bfid) return -FI_EINVAL;
    if (bfid->fclass == FI_CLASS_EQ) return engine_.bind_eq(Eq::of(bfid));
    std::lock_guard guard(engine_.domain()->lock());
    if (engine_.enabled()) return -FI_EOPBADSTATE;
    switch (bfid->fclass) {
        case FI_CLASS_CQ:
            if (flags & ~uint64_t(FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION))
                return -FI_EBADFLAGS;
            if (!(flags & (FI_TRANSMIT | FI_RECV))) return -FI_EBADFLAGS;
            return engine_.bind_cq(Cq::of(bfid), flags);
        case FI_CLASS_CNTR: {
            constexpr uint64_t all =
                FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
            if (!flags || (flags & ~all)) return -FI_EBADFLAGS;
            return engine_.bind_cntr(Cntr::of(bfid), flags);
        }
        case FI_CLASS_AV:
            return engine_.bind_av(Av::of(bfid), flags);
        case FI_CLASS_SRX_CTX:
            if (flags) return -FI_EBADFLAGS;
            return engine_.bind_srx(bfid);
        case FI_CLASS_STX_CTX:
            if (flags) return -FI_EBADFLAGS;
            return engine_.bind_stx(bfid);
        default:
            return -FI_EINVAL;
    }
}

int Endpoint::control(int command, void *arg) {
    switch (command) {
        case FI_ENABLE: {
            std::lock_guard guard(engine_.domain()->lock());
            return engine_.enable_locked();
        }
        case FI_GETOPSFLAG:
        case FI_SETOPSFLAG: {
            if (!arg) return -FI_EINVAL;
            auto *flags = static_cast<uint64_t *>(arg);
            bool tx = *flags & FI_TRANSMIT, rx = *flags & FI_RECV;
            if (tx == rx) return -FI_EINVAL;
            uint64_t &which = tx ? defaults_.tx : defaults_.rx;
            if (command == FI_GETOPSFLAG) {
                *flags = which | (tx ? FI_TRANSMIT : FI_RECV);
            } else {
                which = *flags & ~uint64_t(FI_TRANSMIT | FI_RECV);
            }
            return 0;
        }
        case FI_ALIAS:
            return open_alias(static_cast<struct fi_alias *>(arg));
        default:
            return -FI_ENOSYS;
    }
}

// fi_control(FI_ALIAS): another fid_ep on this endpoint, with its own default flags for one
// direction (fi_endpoint(3)).
int Endpoint::open_alias(struct fi_alias *alias) {
    if (!alias || !alias->fid) return -FI_EINVAL;
    bool tx = alias->flags & FI_TRANSMIT, rx = alias->flags & FI_RECV;
    if (tx == rx) return -FI_EINVAL;  // one direction per alias
    std::lock_guard guard(engine_.domain()->lock());
    OpDefaults d = defaults_;
    (tx ? d.tx : d.rx) = alias->flags & ~uint64_t(FI_TRANSMIT | FI_RECV);
    auto *a = new EndpointAlias(this, d);
    a->init_fid(FI_CLASS_EP, base_fid()->context, &alias_fi_ops);
    a->fid()->ops = &alias_ep_ops;
    a->fid()->msg = &ep_msg_ops;
    a->fid()->tagged = &ep_tagged_ops;
    a->fid()->rma = &ep_rma_ops;
    a->fid()->atomic = &ep_atomic_ops;
    a->fid()->collective = fid()->collective;
    complete_ep_tables(*a->fid());  // no connection management of its own
    *alias->fid = a->base_fid();
    return 0;
}

int Endpoint::ops_open(const char *name, uint64_t, void **ops, void *) {
    if (!name || !ops) return -FI_EINVAL;
    if (strcmp(name, peer::kEpDiagOpsName) == 0) {
        *ops = &ep_diag_ops;
        return 0;
    }
    return -FI_ENOSYS;
}

int Endpoint::getopt(int level, int optname, void *optval, size_t *optlen) {
    if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
    if (!optval || !optlen) return -FI_EINVAL;
    auto give = [&](auto value) {
        if (*optlen < sizeof value) return -FI_ETOOSMALL;
        std::memcpy(optval, &value, sizeof value);
        *optlen = sizeof value;
        return 0;
    };
    switch (optname) {
        case FI_OPT_MIN_MULTI_RECV:
            return give(engine_.min_multi_recv());
        case FI_OPT_CM_DATA_SIZE:
            return give(engine_.cm_data_size());
        case FI_OPT_FI_HMEM_P2P:
            return give(engine_.p2p_mode());
        case FI_OPT_XPU_TRIGGER:
            return engine_.xpu_trigger_shape(static_cast<fi_trigger_xpu *>(optval), optlen);
        default: {  // the size options (1.22), or none
            size_t limit;
            if (int ret = engine_.size_limit(optname, &limit)) return ret;
            return give(limit);
        }
    }
}

int Endpoint::setopt(int level, int optname, const void *optval, size_t optlen) {
    if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
    if (!optval) return -FI_EINVAL;
    switch (optname) {
        case FI_OPT_MIN_MULTI_RECV:
            if (optlen != sizeof(size_t)) return -FI_EINVAL;
            engine_.set_min_multi_recv(*static_cast<const size_t *>(optval));
            return 0;
        case FI_OPT_CM_DATA_SIZE:
            if (optlen != sizeof(size_t)) return -FI_EINVAL;
            return engine_.set_cm_data_size(*static_cast<const size_t *>(optval));
        case FI_OPT_FI_HMEM_P2P: {
            if (optlen != sizeof(int)) return -FI_EINVAL;
            std::lock_guard guard(engine_.domain()->lock());
            return engine_.set_p2p(*static_cast<const int *>(optval));
        }
        case compat::kOptSharedMemoryPermitted: {  // 1.21
            if (optlen != sizeof(bool)) return -FI_EINVAL;
            std::lock_guard guard(engine_.domain()->lock());
            return engine_.set_shared_memory(*static_cast<const bool *>(optval));
        }
        case compat::kOptCudaApiPermitted:  // 1.18 (common/fabric_compat.h)
            // fi_endpoint(3): -FI_EINVAL when the CUDA library or a device is missing. Where
            // CUDA is present every path of tandem moves CUDA memory with CUDA calls (the
            // device's copy engine, IPC handles; the TCP link stages through them), so it
            // cannot promise to make none: false gives -FI_EOPNOTSUPP.
            if (optlen != sizeof(bool)) return -FI_EINVAL;
            if (!(engine_.caps() & FI_HMEM) || !hmem::Registry::instance().available(FI_HMEM_CUDA))
                return -FI_EINVAL;
            return *static_cast<const bool *>(optval) ? 0 : -FI_EOPNOTSUPP;
        default: {  // the size options (1.22), or none
            size_t probe;
            if (int ret = engine_.size_limit(optname, &probe)) return ret;
            if (optlen != sizeof(size_t)) return -FI_EINVAL;
            std::lock_guard guard(engine_.domain()->lock());
            return engine_.set_size_limit(optname, *static_cast<const size_t *>(optval));
        }
    }
}

}  // namespace tandem
