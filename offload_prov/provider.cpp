// The offload provider's entry point and fi_getinfo. off_tandem is never used by an
// application: the core hides providers named off_* unless the caller asks for offload
// providers only, and by convention it answers only hints whose mode has FI_PEER_TRANSFER
// (the owner, tandem, promising to hand it peer objects).
#include "common/fabric_compat.h"
#include "common/fabric_error.h"
#include "common/log.h"
#include "common/wire.h"
#include "offload_prov/config.h"
#include "offload_prov/endpoint.h"
#include "offload_prov/fabric.h"
#include "hmem/hmem.h"
#include "peer/peer_abi.h"

#include <rdma/fi_errno.h>
#include <rdma/providers/fi_prov.h>

#include <cstdlib>
#include <cstring>

namespace tandem::off {

namespace {

constexpr uint32_t kProviderVersion = FI_VERSION(0, 1);
constexpr uint32_t kApiVersion = FI_VERSION(1, 17);

constexpr uint64_t kCaps = FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_SEND | FI_RECV | FI_READ |
                           FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_MULTI_RECV | FI_SOURCE |
                           FI_DIRECTED_RECV | FI_RMA_EVENT | FI_LOCAL_COMM;
// One inbox per endpoint, read in order: what one sender posts arrives in order.
constexpr uint64_t kOrder = FI_ORDER_SAS | FI_ORDER_RAR | FI_ORDER_RAW | FI_ORDER_WAR |
                            FI_ORDER_WAW | FI_ORDER_SAR | FI_ORDER_SAW;

int off_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
                const fi_info *hints, fi_info **info) noexcept;
int off_fabric(fi_fabric_attr *attr, fid_fabric **fabric, void *context) noexcept;
void off_cleanup() noexcept {}

fi_provider g_provider = {
    .version = kProviderVersion,
    .fi_version = kApiVersion,
    .context = {},
    .name = peer::kOffloadProvName,
    .getinfo = off_getinfo,
    .fabric = off_fabric,
    .cleanup = off_cleanup,
};

int off_getinfo(uint32_t version, const char *, const char *, uint64_t, const fi_info *hints,
                fi_info **info) noexcept try {
    *info = nullptr;
    if (version < FI_VERSION(1, 17)) return -FI_ENODATA;
    if (!hints || !(hints->mode & FI_PEER_TRANSFER)) return -FI_ENODATA;
    // Device memory where an interface with a device is present (hmem/), as for tandem; the
    // driver is loaded only for hints that may want it.
    uint64_t caps = kCaps;
    if ((!hints->caps || (hints->caps & FI_HMEM)) && hmem::Registry::instance().any_device())
        caps |= FI_HMEM;
    if (hints->caps & ~caps) return -FI_ENODATA;
    if (hints->ep_attr && hints->ep_attr->type != FI_EP_UNSPEC && hints->ep_attr->type != FI_EP_RDM)
        return -FI_ENODATA;
    if (hints->domain_attr && (hints->domain_attr->control_progress == FI_PROGRESS_AUTO ||
                               hints->domain_attr->data_progress == FI_PROGRESS_AUTO))
        return -FI_ENODATA;
    fi_info *fi = fi_allocinfo();
    if (!fi) return -FI_ENOMEM;
    const Config &cfg = Config::get();
    fi->caps = hints->caps ? hints->caps : caps;
    fi->mode = FI_PEER_TRANSFER;
    // Addresses are the owner's: whatever format it uses.
    fi->addr_format = hints->addr_format ? hints->addr_format : uint32_t(FI_SOCKADDR_IN);
    fi->tx_attr->caps = fi->caps & ~uint64_t(FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE |
                                             FI_MULTI_RECV | FI_SOURCE | FI_DIRECTED_RECV);
    fi->tx_attr->msg_order = kOrder;
    fi->tx_attr->comp_order = compat::kOrderNone;
    fi->tx_attr->inject_size = cfg.eager_limit;
    fi->tx_attr->size = 4096;
    fi->tx_attr->iov_limit = wire::kLocalMaxIov;
    fi->tx_attr->rma_iov_limit = 1;
    fi->rx_attr->caps = fi->caps & ~uint64_t(FI_SEND | FI_READ | FI_WRITE);
    fi->rx_attr->msg_order = kOrder;
    fi->rx_attr->comp_order = compat::kOrderNone;
    fi->rx_attr->size = 4096;
    fi->rx_attr->iov_limit = wire::kLocalMaxIov;
    fi->ep_attr->type = FI_EP_RDM;
    fi->ep_attr->protocol = FI_PROTO_UNSPEC;
    fi->ep_attr->max_msg_size = off::kMaxMessage;
    fi->ep_attr->mem_tag_format = 0xAAAAAAAAAAAAAAAAull;
    fi->ep_attr->tx_ctx_cnt = 1;
    fi->ep_attr->rx_ctx_cnt = FI_SHARED_CONTEXT;  // receives come from the owner's SRX
    fi_domain_attr &d = *fi->domain_attr;
    d.name = strdup("local");
    // The owner serialises every call into its offload twin (it holds its domain lock).
    d.threading = FI_THREAD_DOMAIN;
    d.control_progress = FI_PROGRESS_MANUAL;
    d.data_progress = FI_PROGRESS_MANUAL;
    d.resource_mgmt = FI_RM_ENABLED;
    d.av_type = hints->domain_attr ? hints->domain_attr->av_type : FI_AV_UNSPEC;
    d.mr_mode = hints->domain_attr ? hints->domain_attr->mr_mode : 0;
    if (!(fi->caps & FI_HMEM)) d.mr_mode &= ~FI_MR_HMEM;
    d.mr_key_size = 8;
    d.cq_data_size = 8;
    d.ep_cnt = d.cq_cnt = d.tx_ctx_cnt = d.rx_ctx_cnt = 1024;
    d.max_ep_tx_ctx = d.max_ep_rx_ctx = d.max_ep_srx_ctx = 1;
    d.caps = FI_LOCAL_COMM;
    fi->fabric_attr->name = strdup(peer::kOffloadProvName);
    fi->fabric_attr->prov_version = kProviderVersion;
    fi->fabric_attr->api_version = kApiVersion;
    *info = fi;
    return 0;
} catch (...) {
    return current_exception_errno();
}

int off_fabric(fi_fabric_attr *attr, fid_fabric **fabric, void *context) noexcept try {
    if (!attr || !fabric) return -FI_EINVAL;
    *fabric = (new Fabric(context))->fid();
    return 0;
} catch (...) {
    return current_exception_errno();
}

}  // namespace

}  // namespace tandem::off

extern "C" __attribute__((visibility("default"))) fi_provider *fi_prov_ini(void) {
    tandem::set_log_provider(&tandem::off::g_provider);
    tandem::off::Config::load(&tandem::off::g_provider);
    return &tandem::off::g_provider;
}
