// Peer transfers: their completions (the collectives' go to coll::Engine), and twins on
// different nodes introduce themselves over the owner's endpoint
// (wire::TwinHello, posted with FI_PEER_TRANSFER), and the owner asks which peers have one.
#include "offload_prov/endpoint.h"

#include "common/log.h"
#include "offload_prov/config.h"

namespace tandem::off {

// Posted at the first progress, not at enable: the owner accepts peer transfers only once
// its twin is in place.
void Endpoint::post_hello_receive() {
    iovec iov{&hello_in_, sizeof hello_in_};
    fi_msg_tagged msg{&iov, nullptr, 1, FI_ADDR_UNSPEC, wire::kTwinHelloTag, 0, &hello_rx_ctx_, 0};
    ssize_t ret = fi_trecvmsg(owner_ep_, &msg, FI_PEER_TRANSFER);
    if (ret == -FI_EAGAIN) return;  // try again at the next pass
    hello_posted_ = true;           // (on another error: no introductions, logged)
    if (ret)
        TANDEM_WARN(FI_LOG_EP_CTRL, "owner refused a peer transfer receive: %s\n",
                    fi_strerror(int(-ret)));
}

// What every twin of this process says (Config is read once per process), in storage that
// outlives every endpoint: the owner may still hold a hello it has not sent when this twin is
// closed (its link drains after the twin goes), so nothing per send is allocated or freed.
// (A hello allocated per send leaked when the endpoint closed before its completion.)
static wire::TwinHello &hello_out() {
    static wire::TwinHello hello{
        wire::kTwinMagic, 1, 0,
        wire::kTwinNodeLocal | (Config::get().cma ? uint64_t(wire::kTwinCma) : 0)};
    return hello;
}

void Endpoint::send_hellos() {
    std::vector<fi_addr_t> todo;
    todo.swap(introductions_);
    for (fi_addr_t addr : todo) {
        wire::TwinHello &hello = hello_out();
        iovec iov{&hello, sizeof hello};
        fi_msg_tagged msg{&iov, nullptr, 1, addr, wire::kTwinHelloTag, 0, &hello, 0};
        ssize_t ret = fi_tsendmsg(owner_ep_, &msg, FI_PEER_TRANSFER);
        if (ret == 0) continue;
        if (ret == -FI_EAGAIN)
            introductions_.push_back(addr);
        else
            TANDEM_INFO(FI_LOG_EP_CTRL, "could not introduce ourselves to fi_addr %lu: %s\n",
                        (unsigned long)addr, fi_strerror(int(-ret)));
    }
}

void Endpoint::transfer_complete(const fi_cq_tagged_entry &entry, fi_addr_t src) {
    note_work();
    if (entry.op_context != &hello_rx_ctx_ && coll::Engine::owns(entry.op_context)) {
        coll_.transfer_done(entry.op_context, 0);
        return;
    }
    if (entry.op_context == &hello_rx_ctx_) {
        if (entry.len != sizeof hello_in_ || hello_in_.magic != wire::kTwinMagic) {
            TANDEM_WARN(FI_LOG_EP_CTRL, "dropping a malformed twin hello (%zu bytes)\n", entry.len);
        } else if (src == FI_ADDR_NOTAVAIL) {
            // Its sender inserted us before we inserted it (fi_unexpected_msg does so): the
            // hello names no one here, and remote_twin does not know that twin.
            TANDEM_INFO(FI_LOG_EP_CTRL, "a twin hello from a sender not in the AV: ignored\n");
        } else {
            remote_twins_[src] = hello_in_.caps;
            TANDEM_INFO(FI_LOG_EP_CTRL,
                        "remote twin at fi_addr %lu introduced itself (caps %#lx)\n",
                        (unsigned long)src, (unsigned long)hello_in_.caps);
        }
        hello_posted_ = false;  // repost at the next pass
        return;
    }
    // One of our hellos went out (its storage is hello_out(): nothing to free).
}

void Endpoint::transfer_error(const fi_cq_err_entry &err) {
    note_work();
    if (err.op_context != &hello_rx_ctx_ && coll::Engine::owns(err.op_context)) {
        coll_.transfer_done(err.op_context, err.err ? err.err : FI_EIO);
        return;
    }
    if (err.op_context == &hello_rx_ctx_) {
        TANDEM_INFO(FI_LOG_EP_CTRL, "twin hello receive failed: %s\n", fi_strerror(err.err));
        hello_posted_ = err.err == FI_ECANCELED;  // repost, unless it was cancelled
        return;
    }
    TANDEM_INFO(FI_LOG_EP_CTRL, "twin hello not delivered: %s\n", fi_strerror(err.err));
}

int Endpoint::remote_twin(fi_addr_t addr, uint64_t *caps) const {
    auto it = remote_twins_.find(addr);
    if (it == remote_twins_.end()) return 0;
    if (caps) *caps = it->second;
    return 1;
}

}  // namespace tandem::off
