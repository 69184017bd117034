// fid_av: endpoint names (socket addresses of RDM endpoints) and the fi_addr_t values the
// application uses for them. FI_AV_MAP and FI_AV_TABLE both hand out stable indices; a
// reverse map answers "who sent this" for FI_SOURCE and directed receives.
#pragma once

#include "common/fid_adaptor.h"
#include "main_prov/types.h"
#include "peer/peer_av.h"

#include <rdma/fi_domain.h>

#include <sys/types.h>

#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem {

class Av;
class Domain;
class Eq;

// What an importer of an AV is answered (fi_peer(3) "PEER AV"). Two
// kinds of importer reach it: tandem's own offload twin, which runs only inside tandem's calls
// and so holds the domain lock, and a provider tandem did not build (fi_export_fid), which
// does not. Each gets its own fid_peer_av, which knows which kind it serves.
class PeerAvAnswers final : public peer::AvOwner {
  public:
    PeerAvAnswers(Av &av, bool twin_calls);
    peer::ExportedAv &exported() { return exported_; }
    int peer_query(fi_av_attr *attr) override;
    fi_addr_t peer_ep_addr(fid_ep *ep) override;

  private:
    Av &av_;
    bool twin_calls_;
    peer::ExportedAv exported_{*this};
};

class Av final : public FidObject<Av, fid_av> {
  public:
    Av(Domain *domain, const fi_av_attr &attr, void *context);
    ~Av();

    int close();
    int bind(struct fid *bfid, uint64_t flags);
    int control(int command, void *arg);
    int insert(const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *context);
    int insertsvc(const char *node, const char *service, fi_addr_t *fi_addr, uint64_t flags,
                  void *context);
    int insertsym(const char *node, size_t nodecnt, const char *service, size_t svccnt,
                  fi_addr_t *fi_addr, uint64_t flags, void *context);
    int remove(fi_addr_t *fi_addr, size_t count, uint64_t flags);
    int lookup(fi_addr_t fi_addr, void *addr, size_t *addrlen);
    const char *straddr(const void *addr, char *buf, size_t *len);
    int av_set(fi_av_set_attr *attr, fid_av_set **set, void *context);
    int set_user_id_of(fi_addr_t fi_addr, fi_addr_t user_id, uint64_t flags);

    // Inside tandem, with the domain lock held.
    const EndpointName *name_of(FabricAddr addr) const;
    FabricAddr addr_of(const EndpointName &name) const;
    size_t addrlen() const { return addrlen_; }
    // What a completion reports as the source addr (FI_AV_USER_ID, fi_av(3)): the user ID it
    // was inserted with, or addr itself.
    fi_addr_t reported(fi_addr_t addr) const {
        if (!ids_in_use_) [[likely]]
            return addr;
        return reported_slow(addr);
    }
    // Bumped on every insert/remove so endpoints can refresh cached translations.
    uint64_t version() const;
    // The fid_peer_av tandem's offload twin imports (fi_peer(3)), made on first use.
    peer::ExportedAv &exported_to_twin();
    // With the domain lock held: fi_av_lookup, what PeerAvAnswers::peer_query answers, and
    // the fi_addr_t of an address given as bytes (FI_ADDR_NOTAVAIL when it is not here).
    int lookup_locked(fi_addr_t fi_addr, void *addr, size_t *addrlen) const;
    void query_locked(fi_av_attr &attr) const;
    fi_addr_t addr_of_bytes(const void *addr, size_t addrlen) const;
    // The word version() reads, which the node-local channel reads without our lock.
    const std::atomic<uint64_t> *version_word_ptr() const { return &version_word(); }
    Domain *domain() const { return domain_; }
    // A named AV's map_addr: a table whose entry i is the fi_addr_t of the i-th address
    // inserted under the name, by any process (fi_addr_t values of a named AV are the same in
    // every process that opens it, so the table is the identity).
    void *map_addr() { return map_table_.data(); }
    void hold() { ++refs_; }
    void release() { --refs_; }

  private:
    struct SharedSegment;
    int finish_insert(int done, size_t count, uint64_t flags, void *context);
    void open_shared(const fi_av_attr &attr);
    void join_shared(int fd);
    bool create_shared(size_t capacity);
    // Named AVs: refresh the local view from the shared segment when another process
    // changed it.
    void sync_shared() const;
    FabricAddr append(const EndpointName &name);
    void set_user_id(FabricAddr fa, fi_addr_t user_id);
    fi_addr_t reported_slow(fi_addr_t addr) const;

    Domain *domain_;
    fi_av_type type_;
    size_t addrlen_;
    uint32_t addr_format_;
    mutable std::vector<EndpointName> names_;
    mutable std::vector<bool> valid_;
    mutable std::unordered_map<std::string, FabricAddr> reverse_;
    std::set<FabricAddr> free_;  // removed indices, reused lowest first (fi_av(3))
    // An address inserted again while present keeps its fi_addr_t, and each insert beyond the
    // first is counted here: fi_av_remove gives back one insert, and the entry goes with the
    // last. fi_av(3) leaves duplicates to the provider, but MPI relies on this (Open MPI
    // inserts an intercommunicator's remote group again, then posts receives directed at the
    // second fi_addr_t) and libfabric's util AV, under tcp;ofi_rxm, behaves so.
    std::unordered_map<FabricAddr, uint32_t> extra_inserts_;
    // FI_AV_USER_ID: by fi_addr_t, the user ID its insert named (FI_ADDR_NOTAVAIL: none).
    std::vector<fi_addr_t> user_ids_;
    bool ids_from_set_ = false;  // opened with FI_AV_USER_ID: IDs by fi_av_set_user_id only
    bool ids_in_use_ = false;    // either way: completions ask reported_slow
    Eq *eq_ = nullptr;
    // Opened with FI_EVENT: every insert is asynchronous (fi_av(3)), reported on eq_.
    bool async_ = false;
    std::vector<fi_addr_t> map_table_;
    // Bumped by every insert and remove of a private AV; read without our lock
    // (version_word_ptr).
    std::atomic<uint64_t> version_{0};
    // version_, or the shared segment's word for FI_SHARED_AV: what version() reads.
    const std::atomic<uint64_t> &version_word() const;
    SharedSegment *shared_ = nullptr;  // FI_SHARED_AV: entries in a named shm segment
    size_t shared_size_ = 0;
    std::string shared_name_;
    bool shared_owner_ = false;
    std::pair<dev_t, ino_t> shared_file_{};  // the file this process published under the name
    bool read_only_ = false;
    mutable uint64_t shared_seen_ = 0;
    int refs_ = 0;
    // The fid_peer_av of fi_export_fid (a provider tandem did not build), and the twin's.
    std::unique_ptr<PeerAvAnswers> exported_, twin_exported_;
};

}  // namespace tandem
