// fid_mr and the table that resolves remote keys, with bounds and access checks, for the
// link (RemoteKeyResolver). Registrations the protocol makes for itself (rendezvous sources)
// live in the same table under keys the application can never ask for.
#pragma once

#include "common/fid_adaptor.h"
#include "main_prov/link/link.h"
#include "peer/peer_abi.h"

#include <rdma/fi_domain.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace tandem {

class Domain;
class Cntr;

class MemoryRegion : public FidObject<MemoryRegion, fid_mr> {
  public:
    MemoryRegion(Domain *domain, const fi_mr_attr &attr, uint64_t flags);
    ~MemoryRegion();

    int close();
    int bind(struct fid *bfid, uint64_t flags);
    int control(int command, void *arg);

    uint64_t key() const { return key_; }
    hmem::MemRef mem() const { return desc_.mem; }
    uint64_t access() const { return access_; }
    // The local pieces of the remote range [addr, addr+len); false when it is not inside.
    // The region is the concatenation of its iovecs, addressed from the first one's address
    // (FI_MR_VIRT_ADDR) or from the registration offset.
    bool translate(uint64_t addr, size_t len, LocalPieces &out) const;
    void count_remote_access(uint64_t access);
    bool enabled() const { return enabled_; }

  private:
    friend class MrTable;
    Domain *domain_;
    peer::MrDesc desc_;  // what fi_mr_desc() gives the application
    std::vector<iovec> iov_;
    uint64_t access_;
    uint64_t offset_;  // the application's base when FI_MR_VIRT_ADDR is off
    uint64_t key_ = 0;
    uint64_t total_ = 0;  // bytes of all iovecs
    bool virt_addr_;
    bool enabled_ = true;
    Cntr *cntr_ = nullptr;                    // FI_RMA_EVENT counter bound with fi_mr_bind
    std::unique_ptr<LinkRegion> registered_;  // with the link, where it has keys (verbs)
};

class MrTable {
  public:
    // Inserts with the application's key (or a provider key when prov_key). -FI_ENOKEY when
    // taken.
    int insert(MemoryRegion *mr, uint64_t requested_key, bool prov_key);
    void erase(MemoryRegion *mr);
    MemoryRegion *find(uint64_t key) const;

    // The link whose peers reach this table's memory, where it has keys of its own (verbs
    // rkeys, LinkCaps::link_keys). The protocol's own buffers are registered with it; the
    // application's regions too when `application` (their keys are then the link's), else
    // they keep the domain's keys and the target serves their RMA itself (a domain with
    // remote-access events or keys of the application's choosing: Domain::rma_served).
    void set_link(LinkDomain *link, bool application) {
        link_ = link;
        link_names_regions_ = link && application;
    }
    LinkDomain *link() const { return link_; }
    // The link an application region registers with and takes its key from (null: none).
    LinkDomain *region_link() const { return link_names_regions_ ? link_ : nullptr; }

    // Protocol-internal registration of a local buffer for the peer's remote access
    // (FI_REMOTE_READ: a rendezvous source or the source of a served write; FI_REMOTE_WRITE:
    // the destination of a served read); 0 when the link cannot register it. Its key carries
    // kInternalBit, so it never meets an application's key; a link's own key is its low 32
    // bits.
    uint64_t insert_internal(const iovec &iov, hmem::MemRef mem = hmem::kHost,
                             uint64_t access = FI_REMOTE_READ);
    void erase_internal(uint64_t key);

    // Resolves a remote access (addr, len) under key with the given access bit.
    bool resolve(uint64_t key, uint64_t addr, size_t len, uint64_t access, LocalPieces &out) const;

    // Counts the keys that stopped resolving as they did (a region closed, a rendezvous
    // source released): who keeps a resolution may use it while this has not moved.
    const std::atomic<uint64_t> *generation() const { return &generation_; }

  private:
    static uint64_t random_key();
    static constexpr uint64_t kInternalBit = kLinkKeyOwnerBit;
    std::unordered_map<uint64_t, MemoryRegion *> regions_;
    struct Internal {
        iovec iov;
        hmem::MemRef mem;
        uint64_t access;                         // FI_REMOTE_READ or FI_REMOTE_WRITE
        std::unique_ptr<LinkRegion> registered;  // the link's registration, if it has keys
    };
    LinkDomain *link_ = nullptr;
    bool link_names_regions_ = false;
    std::unordered_map<uint64_t, Internal> internal_;
    std::atomic<uint64_t> generation_{0};
};

}  // namespace tandem
