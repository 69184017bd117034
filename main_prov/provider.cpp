// The provider entry point (fi_prov_ini), its parameters, and fi_getinfo.
#include "common/auth_key.h"
#include "common/fabric_error.h"
#include "common/log.h"
#include "common/params.h"
#include "hmem/hmem.h"
#include "main_prov/config.h"
#include "main_prov/endpoint.h"
#include "main_prov/fabric.h"
#include "main_prov/interfaces.h"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <rdma/providers/fi_prov.h>

#include <netdb.h>

#include <cstdlib>
#include <cstring>
#include <strings.h>

namespace tandem {

namespace {

// The core passes this bit in fi_getinfo flags when it looks for offload providers
// (OFI_OFFLOAD_PROV_ONLY in libfabric's sources; not in the installed headers). The main
// provider is not one.
constexpr uint64_t kOffloadProvOnly = 1ull << 61;

constexpr uint32_t kProviderVersion = FI_VERSION(0, 1);
constexpr uint32_t kApiVersion = FI_VERSION(1, 17);
constexpr uint64_t kMaxMsgSize = 1ull << 31;
constexpr size_t kMaxCqData = 8;

constexpr uint64_t kRdmCaps =
    FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_SEND | FI_RECV | FI_READ | FI_WRITE |
    FI_REMOTE_READ | FI_REMOTE_WRITE | FI_MULTI_RECV | FI_SOURCE | FI_DIRECTED_RECV | FI_RMA_EVENT |
    FI_LOCAL_COMM | FI_REMOTE_COMM | FI_SHARED_AV | FI_TRIGGER | FI_COLLECTIVE;
constexpr uint64_t kMsgCaps = FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_SEND | FI_RECV |
                              FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE |
                              FI_MULTI_RECV | FI_RMA_EVENT | FI_LOCAL_COMM | FI_REMOTE_COMM;
// Every operation of one endpoint towards one peer rides one in-order path (a connection, or
// the peer's node-local ring), and the target executes atomics in arrival order.
constexpr uint64_t kMsgOrder = FI_ORDER_SAS | FI_ORDER_RAR | FI_ORDER_RAW | FI_ORDER_WAR |
                               FI_ORDER_WAW | FI_ORDER_SAR | FI_ORDER_SAW | FI_ORDER_ATOMIC_RAR |
                               FI_ORDER_ATOMIC_RAW | FI_ORDER_ATOMIC_WAR | FI_ORDER_ATOMIC_WAW;
constexpr uint64_t kMrModeSupported = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_HMEM;

// FI_HMEM only where a device exists, and only with FI_MR_HMEM: device buffers then come
// with the descriptor of their registration, which names their iface and device, so no
// transfer has to guess where its memory lives. An application that cannot pass
// descriptors (no FI_MR_HMEM in its hints) gets tandem without FI_HMEM.
// The hints are looked at first: an application that did not ask for device memory does not
// pay for loading the CUDA driver (cuInit alone takes a good part of a second on a GPU node).
uint64_t hmem_caps(const fi_info *hints) {
    if (hints && hints->caps && !(hints->caps & FI_HMEM)) return 0;
    if (hints && hints->domain_attr && !(hints->domain_attr->mr_mode & FI_MR_HMEM)) return 0;
    return hmem::Registry::instance().any_device() ? FI_HMEM : 0;
}

int tandem_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
                   const fi_info *hints, fi_info **info) noexcept;
int tandem_fabric(fi_fabric_attr *attr, fid_fabric **fabric, void *context) noexcept;
void tandem_cleanup() noexcept {}

fi_provider g_provider = {
    .version = kProviderVersion,
    .fi_version = kApiVersion,
    .context = {},
    .name = "tandem",
    .getinfo = tandem_getinfo,
    .fabric = tandem_fabric,
    .cleanup = tandem_cleanup,
};

bool resolve(const char *node, const char *service, int family, bool passive, EndpointName &out) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    if (passive) hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(node, service ? service : "0", &hints, &res) != 0 || !res) return false;
    bool ok = EndpointName::from_bytes(res->ai_addr, res->ai_addrlen, out);
    freeaddrinfo(res);
    return ok;
}

bool subset(uint64_t want, uint64_t have) {
    return (want & ~have) == 0;
}

// Decides whether one (interface, endpoint type) pair can satisfy the hints; fills info.
bool fill_info(const fi_info *hints, fi_ep_type type, const Interface &itf, uint32_t format,
               fi_info *fi) {
    const Config &cfg = Config::get();
    const bool verbs = !itf.rdma_device.empty();
    uint64_t caps = (type == FI_EP_RDM ? kRdmCaps : kMsgCaps) | hmem_caps(hints);
    // A device domain moves RMA with the NIC's keys, by virtual address, and the NIC tells
    // the target nothing. An application that counts remote accesses (FI_RMA_EVENT) or names
    // its keys (mr_mode without FI_MR_PROV_KEY | FI_MR_VIRT_ADDR, as Open MPI's mtl ofi asks)
    // gets RMA that the target's protocol serves (Domain::rma_served): FI_RMA_EVENT, a
    // secondary capability, is therefore reported only when asked for, as it costs the NIC
    // path.
    const bool want_rma_event = hints && (hints->caps & FI_RMA_EVENT);
    if (verbs && !want_rma_event) caps &= ~uint64_t(FI_RMA_EVENT);
    const uint64_t want_mr_mode =
        hints && hints->domain_attr ? uint64_t(hints->domain_attr->mr_mode) : 0;
    const bool nic_keys = verbs && !want_rma_event &&
                          (!hints || !hints->domain_attr || want_mr_mode == FI_MR_BASIC ||
                           (want_mr_mode != FI_MR_SCALABLE &&
                            subset(FI_MR_PROV_KEY | FI_MR_VIRT_ADDR, want_mr_mode)));
    // XPU triggers: an RDM endpoint's triggered operations started by a device's write.
    if (type == FI_EP_RDM && (caps & FI_HMEM)) caps |= FI_XPU_TRIGGER;
    if (hints) {
        if (hints->caps && !subset(hints->caps, caps)) return false;
        if (hints->ep_attr) {
            const fi_ep_attr &e = *hints->ep_attr;
            if (e.max_msg_size > kMaxMsgSize) return false;
            if (e.tx_ctx_cnt > 1 && e.tx_ctx_cnt != FI_SHARED_CONTEXT) return false;
            if (e.rx_ctx_cnt > 1 && e.rx_ctx_cnt != FI_SHARED_CONTEXT) return false;
            if (e.protocol != FI_PROTO_UNSPEC &&
                e.protocol != (verbs ? FI_PROTO_RDMA_CM_IB_RC : FI_PROTO_SOCK_TCP))
                return false;
            if (e.auth_key_size > kMaxAuthKeySize || (e.auth_key_size && !e.auth_key)) return false;
        }
        if (hints->domain_attr) {
            const fi_domain_attr &d = *hints->domain_attr;
            if (d.name && strcmp(d.name, itf.name.c_str()) != 0) return false;
            if (d.control_progress == FI_PROGRESS_AUTO || d.data_progress == FI_PROGRESS_AUTO)
                return false;  // progress is driven by the application's calls
            if (d.cq_data_size > kMaxCqData || d.mr_key_size > 8) return false;
            if (d.av_type != FI_AV_UNSPEC && d.av_type != FI_AV_MAP && d.av_type != FI_AV_TABLE)
                return false;
            // Shared AVs are an RDM matter: a MSG endpoint has no AV.
            if (d.caps && !subset(d.caps, FI_LOCAL_COMM | FI_REMOTE_COMM |
                                              (type == FI_EP_RDM ? FI_SHARED_AV : 0)))
                return false;
            if (d.auth_key_size > kMaxAuthKeySize || (d.auth_key_size && !d.auth_key)) return false;
        }
        if (hints->fabric_attr && hints->fabric_attr->name &&
            strcmp(hints->fabric_attr->name, itf.fabric_name.c_str()) != 0)
            return false;
        for (const fi_tx_attr *t : {hints->tx_attr}) {
            if (!t) continue;
            if (t->caps && !subset(t->caps, caps)) return false;
            if (!subset(t->msg_order, kMsgOrder)) return false;
            if (t->comp_order & ~uint64_t(FI_ORDER_NONE)) return false;
            if (t->inject_size > cfg.inject_size || t->size > cfg.tx_size) return false;
            if (t->iov_limit > kMaxIov || t->rma_iov_limit > 1) return false;
        }
        if (const fi_rx_attr *r = hints->rx_attr) {
            if (r->caps && !subset(r->caps, caps)) return false;
            if (!subset(r->msg_order, kMsgOrder)) return false;
            if (r->comp_order & ~uint64_t(FI_ORDER_NONE)) return false;
            if (r->size > cfg.rx_size || r->iov_limit > kMaxIov) return false;
            if (r->total_buffered_recv > 0 && false) return false;
        }
    }
    uint64_t out_caps = hints && hints->caps ? hints->caps : caps;
    // A request for a primary capability without direction implies both directions.
    fi->caps = out_caps;
    fi->mode = 0;
    fi->addr_format = format;

    fi_tx_attr &tx = *fi->tx_attr;
    // The transmit and receive attributes carry their own direction's capabilities only; the
    // domain-level ones (FI_LOCAL_COMM, FI_REMOTE_COMM, FI_SHARED_AV) stay in caps and
    // domain_attr->caps.
    constexpr uint64_t kDomainCaps = FI_LOCAL_COMM | FI_REMOTE_COMM | FI_SHARED_AV;
    tx.caps = out_caps & ~uint64_t(FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_MULTI_RECV |
                                   FI_SOURCE | FI_DIRECTED_RECV | FI_RMA_EVENT | kDomainCaps);
    tx.mode = 0;
    tx.op_flags = hints && hints->tx_attr ? hints->tx_attr->op_flags : 0;
    tx.msg_order = kMsgOrder;
    tx.comp_order = FI_ORDER_NONE;
    tx.inject_size = cfg.inject_size;
    // A queue depth the hints ask for is what the endpoint gets (fi_endpoint(3): a smaller
    // size consumes fewer resources). It matters above all to ofi_rxm, which asks for 128
    // and sizes its per-connection buffer pools from the answer (with 4096: 68 MB and, where
    // page faults are slow, a fifth of a second per connection).
    tx.size = hints && hints->tx_attr && hints->tx_attr->size ? hints->tx_attr->size : cfg.tx_size;
    tx.iov_limit = kMaxIov;
    tx.rma_iov_limit = 1;

    fi_rx_attr &rx = *fi->rx_attr;
    rx.caps = out_caps & ~uint64_t(FI_SEND | FI_READ | FI_WRITE | kDomainCaps);
    rx.mode = 0;
    rx.op_flags = hints && hints->rx_attr ? hints->rx_attr->op_flags : 0;
    rx.msg_order = kMsgOrder;
    rx.comp_order = FI_ORDER_NONE;
    rx.total_buffered_recv = 0;
    rx.size = hints && hints->rx_attr && hints->rx_attr->size ? hints->rx_attr->size : cfg.rx_size;
    rx.iov_limit = kMaxIov;

    fi_ep_attr &ep = *fi->ep_attr;
    ep.type = type;
    ep.protocol = verbs ? FI_PROTO_RDMA_CM_IB_RC : FI_PROTO_SOCK_TCP;
    ep.protocol_version = wire::kProtoVersion;
    ep.max_msg_size = kMaxMsgSize;
    ep.msg_prefix_size = 0;
    ep.max_order_raw_size = kMaxMsgSize;
    ep.max_order_war_size = kMaxMsgSize;
    ep.max_order_waw_size = kMaxMsgSize;
    ep.mem_tag_format = hints && hints->ep_attr && hints->ep_attr->mem_tag_format
                            ? hints->ep_attr->mem_tag_format
                            : 0xAAAAAAAAAAAAAAAAull;  // FI_TAG_GENERIC: all 64 bits usable
    ep.tx_ctx_cnt = hints && hints->ep_attr && hints->ep_attr->tx_ctx_cnt == FI_SHARED_CONTEXT
                        ? FI_SHARED_CONTEXT
                        : 1;
    ep.rx_ctx_cnt = hints && hints->ep_attr && hints->ep_attr->rx_ctx_cnt == FI_SHARED_CONTEXT
                        ? FI_SHARED_CONTEXT
                        : 1;

    fi_domain_attr &d = *fi->domain_attr;
    free(d.name);
    d.name = strdup(itf.name.c_str());
    d.threading = hints && hints->domain_attr && hints->domain_attr->threading != FI_THREAD_UNSPEC
                      ? hints->domain_attr->threading
                      : FI_THREAD_SAFE;
    d.control_progress = FI_PROGRESS_MANUAL;
    d.data_progress = FI_PROGRESS_MANUAL;
    d.resource_mgmt = FI_RM_ENABLED;
    d.av_type = hints && hints->domain_attr ? hints->domain_attr->av_type : FI_AV_UNSPEC;
    uint64_t want_mr = hints && hints->domain_attr ? hints->domain_attr->mr_mode : 0;
    if (want_mr == FI_MR_BASIC || want_mr == FI_MR_SCALABLE)
        d.mr_mode = static_cast<int>(want_mr);  // the pre-1.5 enumeration
    else if (nic_keys)
        d.mr_mode =
            static_cast<int>((want_mr & kMrModeSupported) | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR);
    else
        d.mr_mode = static_cast<int>(want_mr & kMrModeSupported &
                                     (cfg.mr_virt_addr ? ~0ull : ~uint64_t(FI_MR_VIRT_ADDR)));
    if (out_caps & FI_HMEM)
        d.mr_mode |= FI_MR_HMEM;
    else
        d.mr_mode &= ~FI_MR_HMEM;
    d.mr_key_size = 8;
    d.cq_data_size = kMaxCqData;
    d.cq_cnt = 1024;
    d.ep_cnt = 1024;
    d.tx_ctx_cnt = 1024;
    d.rx_ctx_cnt = 1024;
    d.max_ep_tx_ctx = 1;
    d.max_ep_rx_ctx = 1;
    d.max_ep_stx_ctx = 1;
    d.max_ep_srx_ctx = 1;
    d.cntr_cnt = 1024;
    d.mr_iov_limit = nic_keys ? 1 : kMaxIov;  // a NIC registers one range per key
    d.caps = FI_LOCAL_COMM | FI_REMOTE_COMM | (type == FI_EP_RDM ? FI_SHARED_AV : 0);
    d.mode = 0;
    d.max_err_data = wire::kMaxCmPrivate;
    d.mr_cnt = 1 << 20;
    // Authorization keys are honoured (common/auth_key.h): the hints' keys come back, as the
    // keys of the domain and of endpoints opened with this info.
    if (hints && hints->domain_attr && hints->domain_attr->auth_key_size) {
        d.auth_key = copy_auth_key(hints->domain_attr->auth_key, hints->domain_attr->auth_key_size);
        if (!d.auth_key) return false;
        d.auth_key_size = hints->domain_attr->auth_key_size;
    }
    if (hints && hints->ep_attr && hints->ep_attr->auth_key_size) {
        ep.auth_key = copy_auth_key(hints->ep_attr->auth_key, hints->ep_attr->auth_key_size);
        if (!ep.auth_key) return false;
        ep.auth_key_size = hints->ep_attr->auth_key_size;
    }

    fi_fabric_attr &f = *fi->fabric_attr;
    free(f.name);
    f.name = strdup(itf.fabric_name.c_str());
    f.prov_version = kProviderVersion;
    f.api_version = kApiVersion;
    return true;
}

int tandem_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
                   const fi_info *hints, fi_info **info) noexcept try {
    *info = nullptr;
    if (flags & kOffloadProvOnly) return -FI_ENODATA;
    if (version < FI_VERSION(1, 5)) return -FI_ENODATA;
    if (hints && hints->mode & ~uint64_t(0)) {
        // We need no mode bits: any mode the application supports is fine.
    }
    uint32_t format = FI_SOCKADDR_IN;
    if (hints) {
        switch (hints->addr_format) {
            case FI_FORMAT_UNSPEC:
            case FI_SOCKADDR:
            case FI_SOCKADDR_IN:
                break;
            case FI_SOCKADDR_IN6:
                format = FI_SOCKADDR_IN6;
                break;
            default:
                return -FI_ENODATA;
        }
    }
    int family = format == FI_SOCKADDR_IN6 ? AF_INET6 : AF_INET;

    // Addresses: node/service name the source with FI_SOURCE (or when only service is
    // given), the destination otherwise.
    EndpointName src, dst;
    bool have_src = false, have_dst = false;
    if (node || service) {
        bool source = (flags & FI_SOURCE) || !node;
        EndpointName name;
        if (!resolve(node, service, family, source, name)) return -FI_ENODATA;
        if (source) {
            src = name;
            have_src = true;
        } else {
            dst = name;
            have_dst = true;
        }
    }
    if (hints && hints->src_addr && !have_src) {
        if (!EndpointName::from_bytes(hints->src_addr, hints->src_addrlen, src)) return -FI_ENODATA;
        have_src = true;
    }
    if (hints && hints->dest_addr && !have_dst) {
        if (!EndpointName::from_bytes(hints->dest_addr, hints->dest_addrlen, dst))
            return -FI_ENODATA;
        have_dst = true;
    }
    if ((have_src && src.ss.ss_family != family) || (have_dst && dst.ss.ss_family != family))
        return -FI_ENODATA;

    std::vector<fi_ep_type> types;
    fi_ep_type want = hints && hints->ep_attr ? hints->ep_attr->type : FI_EP_UNSPEC;
    if (want == FI_EP_UNSPEC || want == FI_EP_RDM) types.push_back(FI_EP_RDM);
    if (want == FI_EP_UNSPEC || want == FI_EP_MSG) types.push_back(FI_EP_MSG);
    if (types.empty()) return -FI_ENODATA;

    fi_info *head = nullptr, **tail = &head;
    for (const Interface &itf : usable_interfaces(family)) {
        if (have_src) {
            // A source address picks its interface (the wildcard fits every one).
            EndpointName probe = src;
            bool wildcard = false;
            if (family == AF_INET)
                wildcard = reinterpret_cast<sockaddr_in *>(&probe.ss)->sin_addr.s_addr == 0;
            else
                wildcard = IN6_IS_ADDR_UNSPECIFIED(
                    &reinterpret_cast<sockaddr_in6 *>(&probe.ss)->sin6_addr);
            if (!wildcard) {
                EndpointName a = itf.address, b = src;
                if (family == AF_INET) {
                    if (reinterpret_cast<sockaddr_in *>(&a.ss)->sin_addr.s_addr !=
                        reinterpret_cast<sockaddr_in *>(&b.ss)->sin_addr.s_addr)
                        continue;
                } else if (memcmp(&reinterpret_cast<sockaddr_in6 *>(&a.ss)->sin6_addr,
                                  &reinterpret_cast<sockaddr_in6 *>(&b.ss)->sin6_addr, 16) != 0) {
                    continue;
                }
            }
        }
        // A destination picks the link too: a device's domain only where the device serves
        // the route to it.
        if (have_dst && !reaches(itf, dst)) {
            TANDEM_INFO(FI_LOG_CORE, "%s does not serve the route to the destination\n",
                        itf.name.c_str());
            continue;
        }
        for (fi_ep_type type : types) {
            fi_info *fi = fi_allocinfo();
            if (!fi) break;
            if (!fill_info(hints, type, itf, format, fi)) {
                fi_freeinfo(fi);
                continue;
            }
            // Every entry names its source: the one asked for, else the interface's address
            // (port 0, any free one). Callers rely on it, ofi_rxm among them: for a wildcard
            // listen with a service it asks its core provider without the service and sets
            // the port in each answer's src_addr.
            const EndpointName &source = have_src ? src : itf.address;
            fi->src_addr = malloc(source.length());
            if (!fi->src_addr) {
                fi_freeinfo(fi);
                break;
            }
            memcpy(fi->src_addr, &source.ss, source.length());
            fi->src_addrlen = source.length();
            if (have_dst) {
                fi->dest_addr = malloc(dst.length());
                memcpy(fi->dest_addr, &dst.ss, dst.length());
                fi->dest_addrlen = dst.length();
            }
            // fi_getinfo(3): a passive endpoint in hints->handle comes back in info->handle,
            // for an active endpoint that takes over its address (fi_endpoint(3)).
            if (hints && hints->handle && hints->handle->fclass == FI_CLASS_PEP)
                fi->handle = hints->handle;
            *tail = fi;
            tail = &fi->next;
        }
    }
    if (!head) return -FI_ENODATA;
    *info = head;
    return 0;
} catch (...) {
    return current_exception_errno();
}

int tandem_fabric(fi_fabric_attr *attr, fid_fabric **fabric, void *context) noexcept try {
    if (!attr || !fabric) return -FI_EINVAL;
    auto *f = new Fabric(*attr, context);
    *fabric = f->fid();
    return 0;
} catch (...) {
    return current_exception_errno();
}

}  // namespace

// The core keeps its own record of each provider in fi_provider::context (struct
// ofi_prov_context in libfabric's include/ofi.h: the provider's type, then two flags). Its
// layout is the same in every release from 1.17 to 2.x; the core fills `type` when it
// registers the provider and only ever sets the flags, never clears them.
//
// disable_layering is the flag the core sets itself for shm, efa and psm3 (and, later, ucx
// and cxi): core providers with a native RDM endpoint over which a utility provider must not
// be stacked unless the user names the stack. tandem is one of them. Without it the core
// answers "tandem" with ofi_rxm over tandem's MSG endpoints first (ofi_rxm sorts before
// providers the core does not know), so an application naming tandem, by hints, FI_PROVIDER
// or Open MPI's prefix-matching include list, would never reach tandem's own RDM endpoint,
// its node-local path or its FI_HMEM options. "tandem;ofi_rxm", named, still works: the
// flag only stops the core from offering the stack unasked (ofi_layering_ok in fabric.c).
void refuse_implicit_layering(fi_provider &provider) {
    struct CoreProviderRecord {  // struct ofi_prov_context, libfabric 1.17 to 2.x
        int type;
        bool disable_logging;
        bool disable_layering;
    };
    static_assert(sizeof(CoreProviderRecord) <= sizeof(provider.context));
    CoreProviderRecord record;
    std::memcpy(&record, &provider.context, sizeof record);
    record.disable_layering = true;
    std::memcpy(&provider.context, &record, sizeof record);
}

fi_provider &tandem_provider() {
    return g_provider;
}

}  // namespace tandem

extern "C" __attribute__((visibility("default"))) fi_provider *fi_prov_ini(void) {
    tandem::set_log_provider(&tandem::g_provider);
    tandem::Config::load(&tandem::g_provider);
    tandem::refuse_implicit_layering(tandem::g_provider);
    return &tandem::g_provider;
}
