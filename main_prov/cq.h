// fid_cq: completions of one domain's endpoints. Entries are kept in the widest form and
// copied out in the format the application chose; the queue grows rather than drop a
// completion ("overflow that loses nothing"). Reading drives the domain's progress.
#pragma once

#include "common/fid_adaptor.h"
#include "common/idle_yield.h"
#include "common/ring_queue.h"
#include "common/wait_fd.h"
#include "main_prov/wait.h"
#include "peer/peer_cq.h"

#include <rdma/fi_eq.h>

#include <deque>
#include <memory>

namespace tandem {

class Domain;
class WaitObject;

// An endpoint's receive side, as the CQ sees it: how many of its completions (and errors)
// the CQ holds that the application has not read yet.
struct CompletionOwner {
    size_t queued = 0;
};

struct Completion {
    void *op_context;
    uint64_t flags;
    size_t len;
    void *buf;
    uint64_t data;
    uint64_t tag;
    fi_addr_t src;
    // The endpoint receive side that wrote it (nullptr for transmit completions): counted
    // until read, and discarded if that endpoint closes first (Cq::discard_receives_of).
    CompletionOwner *owner = nullptr;
};

struct CompletionError {
    fi_cq_err_entry entry;
    fi_addr_t src;
    CompletionOwner *owner = nullptr;  // as in Completion
};

class Cq final : public FidObject<Cq, fid_cq>, public peer::CqOwner {
  public:
    Cq(Domain *domain, const fi_cq_attr &attr, void *context);
    ~Cq();

    int close();
    int control(int command, void *arg);
    ssize_t read(void *buf, size_t count);
    ssize_t readfrom(void *buf, size_t count, fi_addr_t *src_addr);
    ssize_t readerr(fi_cq_err_entry *buf, uint64_t flags);
    ssize_t sread(void *buf, size_t count, const void *cond, int timeout);
    ssize_t sreadfrom(void *buf, size_t count, fi_addr_t *src_addr, const void *cond, int timeout);
    int signal();
    const char *strerror(int prov_errno, const void *err_data, char *buf, size_t len);

    // Inside tandem, with the domain lock held.
    void write(const Completion &c) {
        push(c.op_context, c.flags, c.len, c.buf, c.data, c.tag, c.src, c.owner);
    }
    // The same from its fields, built in the queue's slot (always inline: a completion of
    // every small message, and eight arguments).
    [[gnu::always_inline]] void push(void *context, uint64_t flags, size_t len, void *buf,
                                     uint64_t data, uint64_t tag, fi_addr_t src,
                                     CompletionOwner *owner) {
        if (owner_cq_.valid()) [[unlikely]] {
            forward(context, flags, len, buf, data, tag, src);
            return;
        }
        if (owner) ++owner->queued;
        Completion &c = entries_.push_slot();
        c.op_context = context;
        c.flags = flags;
        c.len = len;
        c.buf = buf;
        c.data = data;
        c.tag = tag;
        c.src = src;
        c.owner = owner;
        if (armed_) signal_sleeper();
    }
    void write_error(const CompletionError &e);
    bool has_entries() const { return !entries_.empty() || !errors_.empty(); }
    // fi_close of an endpoint: its receive completions not read yet are dropped, as
    // fi_endpoint(3) allows and verbs does. ofi_rxm relies on it: it closes a connection's
    // MSG endpoint, then reads the CQ and reposts each completed receive buffer on the
    // endpoint the completion came from. Transmit completions stay: they tell the
    // application its sends are done.
    void discard_receives_of(CompletionOwner *owner);
    // fi_trywait: 0 when it is safe to sleep, -FI_EAGAIN when entries are ready.
    int trywait();
    WaitSet *wait_set() const { return wait_.set(); }
    Domain *domain() const { return domain_; }
    void hold() { ++refs_; }
    void release() { --refs_; }

    // fi_export_fid (fi_control FI_EXPORT_FID): a peer provider writes into this CQ.
    ssize_t peer_write(void *context, uint64_t flags, size_t len, void *buf, uint64_t data,
                       uint64_t tag, fi_addr_t src) override;
    ssize_t peer_writeerr(const fi_cq_err_entry &err) override;

    // Opened with FI_PEER (fi_peer(3), "PEER CQ"): another provider owns the queue, and every
    // completion is written through its owner ops; reading only drives progress.
    bool imported() const { return owner_cq_.valid(); }

  private:
    [[gnu::noinline]] void forward(void *context, uint64_t flags, size_t len, void *buf,
                                   uint64_t data, uint64_t tag, fi_addr_t src);
    // A reader may sleep on the wait set: the eventfd is written (not inline: it is rare).
    void signal_sleeper();
    ssize_t read_locked(void *buf, size_t count, fi_addr_t *src_addr);
    // Up to count entries out (there is at least one, and no error before them).
    ssize_t take(void *buf, size_t count, fi_addr_t *src_addr);
    void copy_out(const Completion &c, void *dst) const;
    void drain_signal_if_empty();

    Domain *domain_;
    fi_cq_format format_;
    size_t entry_size_;
    RingQueue<Completion> entries_;
    std::deque<CompletionError> errors_;
    WaitBinding wait_;
    bool signalled_ = false;
    bool signal_pending_ = false;  // the eventfd holds a count to drain
    bool armed_ = false;  // a reader may sleep on the wait set: signal the eventfd on write
    IdleYield idle_;      // fi_cq_read / readfrom finding nothing
    int refs_ = 0;        // endpoints bound to this CQ
    // fi_cq_readerr's err_data must stay valid until the next readerr: keep the last one.
    std::unique_ptr<uint8_t[]> last_err_data_;
    // The fid_peer_cq handed out by FI_EXPORT_FID; the importer's CQ must be closed first.
    std::unique_ptr<peer::ExportedCq> exported_;
    // FI_PEER: the owner's CQ (see imported()).
    peer::ImportedCq owner_cq_;
};

}  // namespace tandem
