// fi_peer(3)'s structures as libfabric 1.17 declares them (in <rdma/fi_ext.h>), for a build
// against newer headers (cmake -DTANDEM_LIBFABRIC_PREFIX=..., docs/compatibility.md).
//
// tandem and off_tandem share their objects through these structures, and they are built
// together, so the layout between them does not depend on a release: it stays 1.17's whatever
// headers the build uses ("between tandem and off_tandem, nothing changes"). The headers of
// 1.19 and later change some of them (peer/peer_abi_versions.h lists what changed), and
// those headers declare the peer API in <rdma/providers/fi_peer.h>, which no other public
// header includes: peer/peer_abi.h includes this file instead of it there. A provider tandem
// did not build (shm, lnx) speaks the layout of its core, which tandem handles with the
// structures of peer/peer_abi_versions.h, as in the default build.
//
// Only peer/peer_abi.h includes this file, and only for headers of 1.19 or later.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

extern "C" {

// --- address vector and AV set: the owner answers queries from its peers -------------------
struct fid_peer_av;
struct fi_ops_av_owner {
    size_t size;
    int (*query)(struct fid_peer_av *av, struct fi_av_attr *attr);
    fi_addr_t (*ep_addr)(struct fid_peer_av *av, struct fid_ep *ep);
};
struct fid_peer_av {
    struct fid fid;
    struct fi_ops_av_owner *owner_ops;
};
// (1.17 names the pointer's type fi_peer_av, a structure it never declares: the pointer is
// what counts, and an importer reads it as a fid_peer_av.)
struct fi_peer_av_context {
    size_t size;
    struct fi_peer_av *av;
};

struct fid_peer_av_set;
struct fi_ops_av_set_owner {
    size_t size;
    int (*members)(struct fid_peer_av_set *av, fi_addr_t *addr, size_t *count);
};
struct fid_peer_av_set {
    struct fid fid;
    struct fi_ops_av_set_owner *owner_ops;
};
struct fi_peer_av_set_context {
    size_t size;
    struct fi_peer_av_set *av_set;
};

// --- completion queue: a peer writes its completions through the owner's ops ---------------
struct fid_peer_cq;
struct fi_ops_cq_owner {
    size_t size;
    ssize_t (*write)(struct fid_peer_cq *cq, void *context, uint64_t flags, size_t len, void *buf,
                     uint64_t data, uint64_t tag, fi_addr_t src);
    ssize_t (*writeerr)(struct fid_peer_cq *cq, const struct fi_cq_err_entry *err_entry);
};
struct fid_peer_cq {
    struct fid fid;
    struct fi_ops_cq_owner *owner_ops;
};
struct fi_peer_cq_context {
    size_t size;
    struct fid_peer_cq *cq;
};

// --- domain and event queue: what a peer opens its own over ---------------------------------
struct fi_peer_domain_context {
    size_t size;
    struct fid_domain *domain;
};
struct fi_peer_eq_context {
    size_t size;
    struct fid_eq *eq;
};

// --- shared receive context: the owner matches, the peer moves the data ---------------------
struct fid_peer_srx;
// 1.17's entry still leads with the links an owner may keep it on (removed in 2.3).
struct fi_peer_rx_entry {
    struct fi_peer_rx_entry *next;
    struct fi_peer_rx_entry *prev;
    struct fid_peer_srx *srx;
    fi_addr_t addr;
    size_t size;
    uint64_t tag;
    uint64_t flags;
    void *context;
    size_t count;
    void **desc;
    void *peer_context;
    void *owner_context;
    struct iovec *iov;
};
// 1.17's owner ops: no foreach_unspec_addr (1.19), get_* by value (a match attr from 2.0).
struct fi_ops_srx_owner {
    size_t size;
    int (*get_msg)(struct fid_peer_srx *srx, fi_addr_t addr, size_t size,
                   struct fi_peer_rx_entry **entry);
    int (*get_tag)(struct fid_peer_srx *srx, fi_addr_t addr, uint64_t tag,
                   struct fi_peer_rx_entry **entry);
    int (*queue_msg)(struct fi_peer_rx_entry *entry);
    int (*queue_tag)(struct fi_peer_rx_entry *entry);
    void (*free_entry)(struct fi_peer_rx_entry *entry);
};
struct fi_ops_srx_peer {
    size_t size;
    int (*start_msg)(struct fi_peer_rx_entry *entry);
    int (*start_tag)(struct fi_peer_rx_entry *entry);
    int (*discard_msg)(struct fi_peer_rx_entry *entry);
    int (*discard_tag)(struct fi_peer_rx_entry *entry);
};
struct fid_peer_srx {
    struct fid_ep ep_fid;
    struct fi_ops_srx_owner *owner_ops;
    struct fi_ops_srx_peer *peer_ops;
};
struct fi_peer_srx_context {
    size_t size;
    struct fid_peer_srx *srx;
};

// --- peer transfers (FI_PEER_TRANSFER): a peer's own traffic over the owner's endpoint ------
// (2.x keeps these with the source by value; 1.17 passes a pointer to it.)
struct fi_peer_transfer_context;
struct fi_ops_transfer_peer {
    size_t size;
    ssize_t (*complete)(struct fid_ep *ep, struct fi_cq_tagged_entry *buf, fi_addr_t *src_addr);
    ssize_t (*comperr)(struct fid_ep *ep, struct fi_cq_err_entry *buf);
};
struct fi_peer_transfer_context {
    size_t size;
    struct fi_info *info;
    struct fid_ep *ep;
    struct fi_ops_transfer_peer *peer_ops;
};

}  // extern "C"
