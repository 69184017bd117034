// The node-local path of an RDM endpoint: its offload twin in off_tandem and the peer objects
// the twin imports (fi_peer(3)).
//
// OffloadDomain opens off_tandem once per tandem domain: fi_getinfo with the core's
// offload-only flag and FI_PEER_TRANSFER in the mode, then fi_domain2(FI_PEER) handing it
// tandem's domain. LocalPath opens, for one endpoint, the twin's CQ (FI_PEER: completions
// come back through the callbacks below), AV (FI_PEER: the endpoint's AV, so an fi_addr_t is
// the same in both), SRX (FI_PEER: the endpoint's receive matcher) and endpoint
// (fi_endpoint2 with FI_PEER_TRANSFER). A peer whose address the twin finds on this node
// (its inbox segment exists) is sent to over the twin, every other one over a link; the
// choice is made once per peer so one peer's operations keep one order.
//
// The twin's completions carry tandem's own operation (TxOp / RxOp) as context and are
// completed here as link completions are: counters, selective completion, multi-receive
// slices and the application's CQ all stay tandem's business.
#pragma once

#include "main_prov/owner_face.h"
#include "main_prov/peer_rx_queue.h"
#include "main_prov/shm/channel.h"
#include "peer/offload_ops.h"
#include "peer/peer_abi.h"
#include "peer/peer_cq.h"

#include <rdma/fi_endpoint.h>

#include <memory>
#include <vector>

namespace tandem {

class Av;
class Domain;
class Engine;
struct TxOp;
struct AtomicCall;

class OffloadDomain {
  public:
    // nullptr (with the reason logged) when off_tandem is not installed or refuses.
    static std::unique_ptr<OffloadDomain> open(Domain &owner);
    ~OffloadDomain();
    fid_domain *domain() const { return domain_; }
    fid_fabric *fabric() const { return fabric_; }
    fi_info *info() const { return info_; }
    // off_tandem's one private extension (peer/offload_ops.h): its node-local path, trigger
    // queue and collectives. nullptr when it gave none tandem can use (the reason logged).
    const peer::OffloadOps *ops() const { return ops_; }

  private:
    OffloadDomain() = default;
    void open_ops();
    const peer::OffloadOps *ops_ = nullptr;
    fi_info *info_ = nullptr;
    fid_fabric *fabric_ = nullptr;
    fid_domain *domain_ = nullptr;
};

class LocalPath final : public peer::CqOwner {
  public:
    // nullptr (logged) when the twin cannot be set up: the endpoint then uses links only.
    static std::unique_ptr<LocalPath> open(Engine &ep, OffloadDomain &off, Av &av, RxMatcher &rx,
                                           fid_eq *eq);
    ~LocalPath();

    // Post an operation; its completion arrives through peer_write / peer_writeerr with the
    // op as context. A negative errno when the twin refused it (nothing will complete).
    // The largest message a lane's Short cell takes.
    size_t inject_limit() const { return inject_limit_; }
    int rma(TxOp *op, const iovec *iov, void **desc, size_t count, fi_addr_t peer, uint64_t addr,
            uint64_t key, uint64_t flags, uint64_t data, bool write);
    // An atomic operation for the twin to carry to the peer's twin, which executes it; the
    // previous values land in the call's result buffers before the completion.
    int atomic(TxOp *op, const AtomicCall &a);
    // The twin's CQ: fi_peer(3)'s owner drives the peer's progress with fi_cq_read(cq, NULL, 0)
    // on it (Engine::progress).
    fid_cq *twin_cq() const { return cq_; }
    // The twin's handler of the cells of the inbox that are its own.
    void (*take_cell_entry() const)(fid_ep *, const uint8_t *) { return ops_->take_cell; }
    // The endpoint's node-local channel, built over its AV and lent to the twin
    // (peer::OffloadOps::attach), which opens its inbox on it.
    shm::Channel *channel() { return &channel_; }
    // A node-local device message's bytes (an IpcRts the endpoint matched), mapped and copied
    // by the twin: 0, or a positive FI_* code (peer::OffloadOps::copy_ipc).
    int copy_ipc(pid_t pid, const wire::LocalIpc *ipc, size_t count, const iovec *to,
                 const hmem::MemRef *to_mem, size_t nto, size_t len) {
        return ops_->copy_ipc(twin_, pid, ipc, count, to, to_mem, nto, len);
    }
    // The IPC handles of a node-local device send's buffers, exported by the twin (its cache):
    // the number of entries written to `out`, or -FI_EOPNOTSUPP (peer::OffloadOps::export_ipc).
    int export_ipc(const iovec *iov, const hmem::MemRef *mem, size_t count, wire::LocalIpc *out) {
        return ops_->export_ipc(twin_, iov, mem, count, out);
    }
    // The endpoint's FI_OPT_FI_HMEM_P2P, which the twin applies to its transfers.
    void set_p2p(int mode);
    // Before the application sleeps: the twin's wake descriptor, armed.
    void wait_fds(std::vector<WaitFd> &out);

    // The twin's table (peer::OffloadOps): its collectives (coll_*) are called with twin().
    const peer::OffloadOps &ops() const { return *ops_; }
    fid_ep *twin() const { return twin_; }

    // Peer transfers (FI_PEER_TRANSFER): the twin posts its own traffic to remote twins on
    // tandem's endpoint; their completions are queued here and handed to the twin's
    // complete / comperr callbacks by flush_transfers(), at the end of a progress pass, so
    // that the twin is never called back from inside one of its own calls into tandem.
    void transfer_done(const fi_cq_tagged_entry &entry, int err, size_t olen, fi_addr_t src);
    void flush_transfers() {
        if (!transfers_done_.empty()) flush_transfers_now();  // (inline: called on every pass)
    }

    ssize_t peer_write(void *context, uint64_t flags, size_t len, void *buf, uint64_t data,
                       uint64_t tag, fi_addr_t src) override;
    ssize_t peer_writeerr(const fi_cq_err_entry &err) override;

  private:
    LocalPath(Engine &ep, RxMatcher &rx, Av &av);
    // The twin endpoint (fi_endpoint2 with FI_PEER_TRANSFER).
    int open_twin(OffloadDomain &off);
    void flush_transfers_now();
    // The descriptors the twin gets: the application's with FI_HMEM, none without.
    void **descs(void **desc) const { return hmem_ ? desc : nullptr; }
    Engine &ep_;
    bool hmem_ = false;
    // What the twin is given of the endpoint and its objects: calls that expect the domain
    // lock held (the twin runs only inside tandem's calls).
    OwnerFace face_;
    peer::ExportedCq cq_export_{*this};
    PeerRxQueue rx_queue_;
    fi_peer_transfer_context transfer_{};
    fid_fabric *twin_fabric_ = nullptr;
    fid_cq *cq_ = nullptr;
    fid_eq *eq_ = nullptr;
    fid_av *av_ = nullptr;
    fid_ep *srx_ = nullptr;
    fid_ep *twin_ = nullptr;
    const peer::OffloadOps *ops_ = nullptr;
    size_t inject_limit_ = 0;
    // The AV as the channel reads it, inside tandem's calls (the domain lock held).
    class AvBook final : public shm::AddressBook {
      public:
        explicit AvBook(const Av &av) : av_(av) {}
        const std::atomic<uint64_t> *version_word() const override;
        int lookup(fi_addr_t addr, void *buf, size_t *addrlen) const override;
        fi_addr_t addr_of(const void *addr, size_t addrlen) const override;

      private:
        const Av &av_;
    };
    AvBook book_;
    shm::Sender sender_;  // named by the twin when it is enabled
    shm::Channel channel_{sender_, book_};
    struct TransferDone {
        fi_cq_tagged_entry entry;
        int err;
        size_t olen;
        fi_addr_t src;
    };
    std::vector<TransferDone> transfers_done_, transfers_flushing_;
};

}  // namespace tandem
