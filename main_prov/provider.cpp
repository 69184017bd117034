// The provider entry point (fi_prov_ini), its parameters, and fi_getinfo.
#include "common/auth_key.h"
#include "common/fabric_compat.h"
#include "common/fabric_error.h"
#include "common/log.h"
#include "common/params.h"
#include "hmem/hmem.h"
#include "main_prov/config.h"
#include "main_prov/progress_thread.h"
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
// The core calls it before it unloads the provider (fi_fini at exit): a domain the
// application left open must not have its progress thread run on in unmapped code.
void tandem_cleanup() noexcept {
    ProgressThread::stop_all();
}

fi_provider g_provider = {
    .version = kProviderVersion,
    .fi_version = compat::kNewestApi,
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

// What an endpoint of this type on this interface offers: its capabilities before the hints
// narrow them. A device domain moves RMA with the NIC's keys, by virtual address, and the NIC
// tells the target nothing. An application that counts remote accesses (FI_RMA_EVENT) or names
// its keys (mr_mode without FI_MR_PROV_KEY | FI_MR_VIRT_ADDR, as Open MPI's mtl ofi asks) gets
// RMA that the target's protocol serves (Domain::rma_served): FI_RMA_EVENT, a secondary
// capability, is therefore reported only when asked for, as it costs the NIC path.
uint64_t offered_caps(const fi_info *hints, fi_ep_type type, bool verbs, uint32_t version) {
    uint64_t caps = (type == FI_EP_RDM ? kRdmCaps : kMsgCaps) | hmem_caps(hints);
    const bool want_rma_event = hints && (hints->caps & FI_RMA_EVENT);
    if (verbs && !want_rma_event) caps &= ~uint64_t(FI_RMA_EVENT);
    // XPU triggers: an RDM endpoint's triggered operations started by a device's write; a
    // capability bit of their own up to API 1.20 (later, FI_TRIGGER with FI_HMEM grants them).
    if (type == FI_EP_RDM && (caps & FI_HMEM) && version < compat::kApi1_21)
        caps |= compat::kXpuTriggerCap;
    return caps;
}

// Capabilities of API 2.0 that change how receives match (fi_getinfo(3)): granted when asked
// for, never offered unasked, since each narrows what an application that did not name it may
// do. FI_TAGGED_DIRECTED_RECV: only tagged receives match by source; FI_EXACT_DIRECTED_RECV:
// a directed receive must name its source. FI_TAGGED_MULTI_RECV (tagged multi-receive
// buffers) goes with them: it narrows nothing, but tandem offers no 2.0 bit unasked. Likewise, at
// every version, what only a provider linking tandem asks for (lnx): FI_PEER, tandem as the peer of
// that provider's CQ and SRX, and FI_AV_USER_ID, completions naming sources by the IDs their
// addresses were inserted with.
constexpr uint64_t kPeerProviderCaps = FI_PEER | FI_AV_USER_ID;
uint64_t asked_only_caps(fi_ep_type type, uint32_t version) {
    if (type != FI_EP_RDM) return 0;
    if (version < compat::kApi2_0) return kPeerProviderCaps;
    return kPeerProviderCaps | compat::kTaggedDirectedRecv | compat::kExactDirectedRecv |
           compat::kTaggedMultiRecv;
}

// Whether RMA moves with the NIC's keys (see offered_caps): a device domain, unless the
// application asked for FI_RMA_EVENT or for keys of its own choosing.
bool uses_nic_keys(const fi_info *hints, bool verbs) {
    const bool want_rma_event = hints && (hints->caps & FI_RMA_EVENT);
    const uint64_t want_mr_mode =
        hints && hints->domain_attr ? uint64_t(hints->domain_attr->mr_mode) : 0;
    return verbs && !want_rma_event &&
           (!hints || !hints->domain_attr || want_mr_mode == compat::kMrBasic ||
            (want_mr_mode != compat::kMrScalable &&
             subset(FI_MR_PROV_KEY | FI_MR_VIRT_ADDR, want_mr_mode)));
}

bool ep_hints_fit(const fi_ep_attr &e, bool verbs) {
    if (e.max_msg_size > kMaxMsgSize) return false;
    if (e.tx_ctx_cnt > 1 && e.tx_ctx_cnt != FI_SHARED_CONTEXT) return false;
    if (e.rx_ctx_cnt > 1 && e.rx_ctx_cnt != FI_SHARED_CONTEXT) return false;
    if (e.protocol != FI_PROTO_UNSPEC &&
        e.protocol != (verbs ? FI_PROTO_RDMA_CM_IB_RC : FI_PROTO_SOCK_TCP))
        return false;
    return !(e.auth_key_size > kMaxAuthKeySize || (e.auth_key_size && !e.auth_key));
}

bool domain_hints_fit(const fi_domain_attr &d, fi_ep_type type, const Interface &itf) {
    if (d.name && strcmp(d.name, itf.name.c_str()) != 0) return false;
    if (d.cq_data_size > kMaxCqData || d.mr_key_size > 8) return false;
    if (d.av_type != FI_AV_UNSPEC && d.av_type != FI_AV_MAP && d.av_type != FI_AV_TABLE)
        return false;
    // Shared AVs are an RDM matter: a MSG endpoint has no AV.
    if (d.caps && !subset(d.caps, FI_LOCAL_COMM | FI_REMOTE_COMM |
                                      (type == FI_EP_RDM ? FI_SHARED_AV | kPeerProviderCaps : 0)))
        return false;
    return !(d.auth_key_size > kMaxAuthKeySize || (d.auth_key_size && !d.auth_key));
}

bool tx_hints_fit(const fi_tx_attr &t, uint64_t caps) {
    const Config &cfg = Config::get();
    if (t.caps && !subset(t.caps, caps)) return false;
    if (!subset(t.msg_order, kMsgOrder)) return false;
    if (t.comp_order & ~uint64_t(compat::kOrderNone)) return false;
    if (t.inject_size > cfg.inject_size || t.size > cfg.tx_size) return false;
    return !(t.iov_limit > kMaxIov || t.rma_iov_limit > 1);
}

bool rx_hints_fit(const fi_rx_attr &r, uint64_t caps) {
    const Config &cfg = Config::get();
    if (r.caps && !subset(r.caps, caps)) return false;
    if (!subset(r.msg_order, kMsgOrder)) return false;
    if (r.comp_order & ~uint64_t(compat::kOrderNone)) return false;
    return !(r.size > cfg.rx_size || r.iov_limit > kMaxIov);
}

// The capabilities granted for those asked: a primary capability asked for without any of its
// directions comes with every direction tandem has for it (fi_getinfo(3): FI_READ, FI_WRITE,
// FI_REMOTE_READ and FI_REMOTE_WRITE restrict FI_RMA and FI_ATOMIC; FI_SEND and FI_RECV
// FI_MSG and FI_TAGGED), spelled out as the core's utility providers spell them: programs
// such as fabtests 2.x bind counters by the directions they find there.
uint64_t granted_caps(uint64_t asked, uint64_t offered) {
    constexpr uint64_t kMsgDirections = FI_SEND | FI_RECV;
    constexpr uint64_t kRmaDirections = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    uint64_t caps = asked;
    if ((caps & (FI_MSG | FI_TAGGED)) && !(caps & kMsgDirections)) caps |= offered & kMsgDirections;
    if ((caps & (FI_RMA | FI_ATOMIC)) && !(caps & kRmaDirections)) caps |= offered & kRmaDirections;
    return caps;
}

// Whether the hints (when given) ask for nothing this endpoint type on itf cannot give.
bool hints_fit(const fi_info *hints, fi_ep_type type, const Interface &itf, uint64_t caps,
               uint32_t version) {
    if (!hints) return true;
    const bool verbs = !itf.rdma_device.empty();
    caps |= asked_only_caps(type, version);
    if (hints->caps && !subset(hints->caps, caps)) return false;
    if (hints->ep_attr && !ep_hints_fit(*hints->ep_attr, verbs)) return false;
    if (hints->domain_attr && !domain_hints_fit(*hints->domain_attr, type, itf)) return false;
    if (hints->fabric_attr && hints->fabric_attr->name &&
        strcmp(hints->fabric_attr->name, itf.fabric_name.c_str()) != 0)
        return false;
    if (hints->tx_attr && !tx_hints_fit(*hints->tx_attr, caps)) return false;
    return !(hints->rx_attr && !rx_hints_fit(*hints->rx_attr, caps));
}

// The transmit and receive attributes carry their own direction's capabilities only; the
// domain-level ones stay in caps and domain_attr->caps.
constexpr uint64_t kDomainCaps =
    FI_LOCAL_COMM | FI_REMOTE_COMM | FI_SHARED_AV | FI_PEER | FI_AV_USER_ID;

// A queue depth the hints ask for is what the endpoint gets (fi_endpoint(3): a smaller size
// consumes fewer resources). It matters above all to ofi_rxm, which asks for 128 and sizes its
// per-connection buffer pools from the answer (with 4096: 68 MB and, where page faults are
// slow, a fifth of a second per connection).
void fill_tx_attr(fi_tx_attr &tx, const fi_info *hints, uint64_t caps, uint32_t version) {
    const Config &cfg = Config::get();
    const uint64_t rx_only_v2 =
        version >= compat::kApi2_0
            ? compat::kTaggedDirectedRecv | compat::kExactDirectedRecv | compat::kTaggedMultiRecv
            : 0;
    tx.caps =
        caps & ~uint64_t(FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_MULTI_RECV | FI_SOURCE |
                         FI_DIRECTED_RECV | FI_RMA_EVENT | kDomainCaps | rx_only_v2);
    tx.mode = 0;
    tx.op_flags = hints && hints->tx_attr ? hints->tx_attr->op_flags : 0;
    tx.msg_order = kMsgOrder;
    tx.comp_order = compat::kOrderNone;
    tx.inject_size = cfg.inject_size;
    tx.size = hints && hints->tx_attr && hints->tx_attr->size ? hints->tx_attr->size : cfg.tx_size;
    tx.iov_limit = kMaxIov;
    tx.rma_iov_limit = 1;
}

void fill_rx_attr(fi_rx_attr &rx, const fi_info *hints, uint64_t caps) {
    const Config &cfg = Config::get();
    rx.caps = caps & ~uint64_t(FI_SEND | FI_READ | FI_WRITE | kDomainCaps);
    rx.mode = 0;
    rx.op_flags = hints && hints->rx_attr ? hints->rx_attr->op_flags : 0;
    rx.msg_order = kMsgOrder;
    rx.comp_order = compat::kOrderNone;
    rx.total_buffered_recv = 0;
    rx.size = hints && hints->rx_attr && hints->rx_attr->size ? hints->rx_attr->size : cfg.rx_size;
    rx.iov_limit = kMaxIov;
}

void fill_ep_attr(fi_ep_attr &ep, const fi_info *hints, fi_ep_type type, bool verbs) {
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
}

// The domain's mr_mode: the pre-1.5 enumeration as asked, the NIC's keys by virtual address
// (see uses_nic_keys), else what was asked of what tandem supports; FI_MR_HMEM with FI_HMEM.
int domain_mr_mode(const fi_info *hints, uint64_t caps, bool nic_keys) {
    uint64_t want_mr = hints && hints->domain_attr ? hints->domain_attr->mr_mode : 0;
    int mr_mode;
    if (want_mr == compat::kMrBasic || want_mr == compat::kMrScalable)
        mr_mode = static_cast<int>(want_mr);  // the pre-1.5 enumeration
    else if (nic_keys)
        mr_mode = static_cast<int>((want_mr & kMrModeSupported) | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR);
    else
        mr_mode =
            static_cast<int>(want_mr & kMrModeSupported &
                             (Config::get().mr_virt_addr ? ~0ull : ~uint64_t(FI_MR_VIRT_ADDR)));
    if (caps & FI_HMEM)
        mr_mode |= FI_MR_HMEM;
    else
        mr_mode &= ~FI_MR_HMEM;
    return mr_mode;
}

void fill_domain_attr(fi_domain_attr &d, const fi_info *hints, fi_ep_type type,
                      const Interface &itf, uint64_t caps, bool nic_keys) {
    free(d.name);
    d.name = strdup(itf.name.c_str());
    d.threading = hints && hints->domain_attr && hints->domain_attr->threading != FI_THREAD_UNSPEC
                      ? hints->domain_attr->threading
                      : FI_THREAD_SAFE;
    // Manual unless asked for automatic (a thread per domain: main_prov/progress_thread.h).
    const fi_domain_attr *hd = hints ? hints->domain_attr : nullptr;
    d.control_progress =
        hd && hd->control_progress == FI_PROGRESS_AUTO ? FI_PROGRESS_AUTO : FI_PROGRESS_MANUAL;
    d.data_progress =
        hd && hd->data_progress == FI_PROGRESS_AUTO ? FI_PROGRESS_AUTO : FI_PROGRESS_MANUAL;
    d.resource_mgmt = FI_RM_ENABLED;
    d.av_type = hints && hints->domain_attr ? hints->domain_attr->av_type : FI_AV_UNSPEC;
    d.mr_mode = domain_mr_mode(hints, caps, nic_keys);
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
    d.caps = FI_LOCAL_COMM | FI_REMOTE_COMM | (type == FI_EP_RDM ? FI_SHARED_AV : 0) |
             (caps & kPeerProviderCaps);
    d.mode = 0;
    d.max_err_data = wire::kMaxCmPrivate;
    d.mr_cnt = 1 << 20;
}

// Authorization keys are honoured (common/auth_key.h): the hints' keys come back, as the keys
// of the domain and of endpoints opened with this info. False when a copy fails.
bool copy_hint_auth_keys(const fi_info *hints, fi_info *fi) {
    if (hints && hints->domain_attr && hints->domain_attr->auth_key_size) {
        fi_domain_attr &d = *fi->domain_attr;
        d.auth_key = copy_auth_key(hints->domain_attr->auth_key, hints->domain_attr->auth_key_size);
        if (!d.auth_key) return false;
        d.auth_key_size = hints->domain_attr->auth_key_size;
    }
    if (hints && hints->ep_attr && hints->ep_attr->auth_key_size) {
        fi_ep_attr &ep = *fi->ep_attr;
        ep.auth_key = copy_auth_key(hints->ep_attr->auth_key, hints->ep_attr->auth_key_size);
        if (!ep.auth_key) return false;
        ep.auth_key_size = hints->ep_attr->auth_key_size;
    }
    return true;
}

// Decides whether one (interface, endpoint type) pair can satisfy the hints; fills info.
bool fill_info(const fi_info *hints, fi_ep_type type, const Interface &itf, uint32_t format,
               uint32_t version, fi_info *fi) {
    const bool verbs = !itf.rdma_device.empty();
    const uint64_t caps = offered_caps(hints, type, verbs, version);
    const bool nic_keys = uses_nic_keys(hints, verbs);
    if (!hints_fit(hints, type, itf, caps, version)) return false;
    uint64_t out_caps = hints && hints->caps ? granted_caps(hints->caps, caps) : caps;
    fi->caps = out_caps;
    fi->mode = 0;
    fi->addr_format = format;
    fill_tx_attr(*fi->tx_attr, hints, out_caps, version);
    fill_rx_attr(*fi->rx_attr, hints, out_caps);
    fill_ep_attr(*fi->ep_attr, hints, type, verbs);
    fill_domain_attr(*fi->domain_attr, hints, type, itf, out_caps, nic_keys);
    if (!copy_hint_auth_keys(hints, fi)) return false;
    fi_fabric_attr &f = *fi->fabric_attr;
    free(f.name);
    f.name = strdup(itf.fabric_name.c_str());
    f.prov_version = kProviderVersion;
    f.api_version = version;  // (the core sets it too: what the endpoint reads its caps by)
    return true;
}

// The address format the hints ask for (FI_SOCKADDR_IN when they name none); false for one
// tandem does not speak.
bool addr_format_of(const fi_info *hints, uint32_t &format) {
    format = FI_SOCKADDR_IN;
    if (!hints) return true;
    switch (hints->addr_format) {
        case FI_FORMAT_UNSPEC:
        case FI_SOCKADDR:
        case FI_SOCKADDR_IN:
            return true;
        case FI_SOCKADDR_IN6:
            format = FI_SOCKADDR_IN6;
            return true;
        default:
            return false;
    }
}

// The source and destination fi_getinfo names, each when it names one.
struct Addresses {
    EndpointName src, dst;
    bool have_src = false, have_dst = false;
};

// node/service name the source with FI_SOURCE (or when only service is given), the
// destination otherwise; the hints' addresses fill in what they do not name. False when an
// address does not resolve, or is not of `family`.
bool resolve_addresses(const char *node, const char *service, uint64_t flags, const fi_info *hints,
                       int family, Addresses &a) {
    if (node || service) {
        bool source = (flags & FI_SOURCE) || !node;
        EndpointName name;
        if (!resolve(node, service, family, source, name)) return false;
        if (source) {
            a.src = name;
            a.have_src = true;
        } else {
            a.dst = name;
            a.have_dst = true;
        }
    }
    if (hints && hints->src_addr && !a.have_src) {
        if (!EndpointName::from_bytes(hints->src_addr, hints->src_addrlen, a.src)) return false;
        a.have_src = true;
    }
    if (hints && hints->dest_addr && !a.have_dst) {
        if (!EndpointName::from_bytes(hints->dest_addr, hints->dest_addrlen, a.dst)) return false;
        a.have_dst = true;
    }
    return !((a.have_src && a.src.ss.ss_family != family) ||
             (a.have_dst && a.dst.ss.ss_family != family));
}

// A source address picks its interface (the wildcard fits every one).
bool source_fits(const Interface &itf, const EndpointName &src, int family) {
    EndpointName probe = src;
    bool wildcard = false;
    if (family == AF_INET)
        wildcard = reinterpret_cast<sockaddr_in *>(&probe.ss)->sin_addr.s_addr == 0;
    else
        wildcard = IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<sockaddr_in6 *>(&probe.ss)->sin6_addr);
    if (wildcard) return true;
    EndpointName a = itf.address, b = src;
    if (family == AF_INET)
        return reinterpret_cast<sockaddr_in *>(&a.ss)->sin_addr.s_addr ==
               reinterpret_cast<sockaddr_in *>(&b.ss)->sin_addr.s_addr;
    return memcmp(&reinterpret_cast<sockaddr_in6 *>(&a.ss)->sin6_addr,
                  &reinterpret_cast<sockaddr_in6 *>(&b.ss)->sin6_addr, 16) == 0;
}

// Whether itf can serve the addresses: the source's interface and, for a destination, a link
// to it (a device's domain only where the device serves the route to it).
bool interface_serves(const Interface &itf, const Addresses &a, int family) {
    if (a.have_src && !source_fits(itf, a.src, family)) return false;
    if (a.have_dst && !reaches(itf, a.dst)) {
        TANDEM_INFO(FI_LOG_CORE, "%s does not serve the route to the destination\n",
                    itf.name.c_str());
        return false;
    }
    return true;
}

// Every entry names its source: the one asked for, else the interface's address (port 0, any
// free one). Callers rely on it, ofi_rxm among them: for a wildcard listen with a service it
// asks its core provider without the service and sets the port in each answer's src_addr.
// False when out of memory.
bool name_addresses(fi_info *fi, const Interface &itf, const Addresses &a) {
    const EndpointName &source = a.have_src ? a.src : itf.address;
    fi->src_addr = malloc(source.length());
    if (!fi->src_addr) return false;
    memcpy(fi->src_addr, &source.ss, source.length());
    fi->src_addrlen = source.length();
    if (a.have_dst) {
        fi->dest_addr = malloc(a.dst.length());
        memcpy(fi->dest_addr, &a.dst.ss, a.dst.length());
        fi->dest_addrlen = a.dst.length();
    }
    return true;
}

// One entry per endpoint type the hints allow on itf, appended at tail; the new tail.
fi_info **append_infos(const fi_info *hints, const std::vector<fi_ep_type> &types,
                       const Interface &itf, uint32_t format, uint32_t version, const Addresses &a,
                       fi_info **tail) {
    for (fi_ep_type type : types) {
        fi_info *fi = fi_allocinfo();
        if (!fi) break;
        if (!fill_info(hints, type, itf, format, version, fi)) {
            fi_freeinfo(fi);
            continue;
        }
        if (!name_addresses(fi, itf, a)) {
            fi_freeinfo(fi);
            break;
        }
        // fi_getinfo(3): a passive endpoint in hints->handle comes back in info->handle,
        // for an active endpoint that takes over its address (fi_endpoint(3)).
        if (hints && hints->handle && hints->handle->fclass == FI_CLASS_PEP)
            fi->handle = hints->handle;
        *tail = fi;
        tail = &fi->next;
    }
    return tail;
}

int tandem_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
                   const fi_info *hints, fi_info **info) noexcept try {
    *info = nullptr;
    if (flags & kOffloadProvOnly) return -FI_ENODATA;
    if (version < FI_VERSION(1, 5)) return -FI_ENODATA;
    // tandem needs no mode bits: any mode the application supports is fine.
    uint32_t format;
    if (!addr_format_of(hints, format)) return -FI_ENODATA;
    int family = format == FI_SOCKADDR_IN6 ? AF_INET6 : AF_INET;
    Addresses a;
    if (!resolve_addresses(node, service, flags, hints, family, a)) return -FI_ENODATA;

    std::vector<fi_ep_type> types;
    fi_ep_type want = hints && hints->ep_attr ? hints->ep_attr->type : FI_EP_UNSPEC;
    if (want == FI_EP_UNSPEC || want == FI_EP_RDM) types.push_back(FI_EP_RDM);
    if (want == FI_EP_UNSPEC || want == FI_EP_MSG) types.push_back(FI_EP_MSG);
    if (types.empty()) return -FI_ENODATA;

    fi_info *head = nullptr, **tail = &head;
    for (const Interface &itf : usable_interfaces(family))
        if (interface_serves(itf, a, family))
            tail = append_infos(hints, types, itf, format, version, a, tail);
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
