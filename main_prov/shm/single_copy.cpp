#include "main_prov/shm/single_copy.h"

#include "common/iov.h"
#include "common/test_hook.h"
#include "main_prov/shm/channel.h"
#include "main_prov/shm/cma.h"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>
#include <cerrno>
#include <iterator>
#include <vector>

namespace tandem::shm {

namespace {

// A short or failed cross-memory read as a fabric error: the process gone, or anything else.
int read_error(ssize_t got) {
    return got == -ESRCH ? FI_ECONNRESET : FI_EIO;
}

}  // namespace

void remote_iovecs(const uint8_t *body, size_t n, iovec *out) {
    for (size_t i = 0; i < n; ++i) {
        wire::LocalIov v;
        memcpy(&v, body + i * sizeof v, sizeof v);
        out[i] = {reinterpret_cast<void *>(v.addr), v.length};
    }
}

void SingleCopy::write_part(Channel &channel, const wire::LocalHeader &cts, std::string_view reader,
                            const uint8_t *body, const iovec *src, size_t nsrc) {
    stop_at("local.cts_arrived");
    PeerInbox *peer = channel.sender_peer(reader);
    if (cts.rma_key != wire::kLocalNoClaim &&
        !(peer && SplitClaims::take_for_sender(peer->split_claims, cts.rma_key)))
        return;
    stop_at("local.cts_claimed");
    int status = FI_EIO;
    if (src) {
        iovec part[wire::kLocalMaxIov];
        const size_t npart = iov_slice(src, nsrc, cts.offset, cts.total, part, wire::kLocalMaxIov);
        iovec to[wire::kLocalMaxIov];
        const size_t nto = std::min<size_t>(cts.iov_count, wire::kLocalMaxIov);
        remote_iovecs(body, nto, to);
        const ssize_t put = iov_length(part, npart) == cts.total
                                ? cma_write(cts.pid, part, npart, to, nto)
                                : -EINVAL;
        status = (put >= 0 && uint64_t(put) == cts.total) ? 0 : FI_EIO;
    }
    if (!peer) return;
    wire::LocalHeader done = channel.header(wire::LocalOp::WriteDone, cts.msg_id);
    done.status = status;
    peer->out.push(channel.sender(), done, nullptr, 0);
}

SingleCopy::SingleCopy(pid_t pid, const iovec *local, size_t nlocal, const iovec *remote,
                       size_t nremote, size_t n)
    : pid_(pid),
      nlocal_(std::min(nlocal, kMaxPieces)),
      nremote_(std::min(nremote, wire::kLocalMaxIov)),
      n_(n) {
    std::copy(local, local + nlocal_, local_);
    std::copy(remote, remote + nremote_, remote_);
}

bool SingleCopy::start(Channel &channel, PeerInbox *sender, uint64_t msg_id) {
    half_ = sender ? sender->split.readers_part(n_) : n_;  // (no sender: we read it all)
    if (!(n_ >= wire::kLocalSplitMin && sender && sender->cma &&
          send_cts(channel, *sender, msg_id))) {
        half_ = n_;
        read(0, n_);
        return true;
    }
    read(0, half_);
    // Ours is read: the sender's part too unless it has begun it (or a test makes us wait).
    if (!err_ && !test_split_wait() && channel.claims().take_back(claim_)) {
        sender->split.taken_back();
        finish(channel, FI_EAGAIN);
        return true;
    }
    sender->split.in_time();
    return false;
}

// Asks the sender to write bytes [half, n) of its buffers into ours: false, with nothing
// sent, when that part does not fit one Cts or no claim is free (we copy it all then).
bool SingleCopy::send_cts(Channel &channel, PeerInbox &sender, uint64_t msg_id) {
    iovec theirs_to_ours[wire::kLocalMaxIov];
    size_t count =
        iov_slice(local_, nlocal_, half_, n_ - half_, theirs_to_ours, wire::kLocalMaxIov);
    if (!count || iov_length(theirs_to_ours, count) != n_ - half_) return false;
    std::optional<ClaimId> opened = channel.claims().open();
    if (!opened) return false;
    claim_ = *opened;
    wire::LocalHeader cts = channel.header(wire::LocalOp::Cts, msg_id);
    cts.offset = half_;
    cts.total = n_ - half_;
    cts.iov_count = static_cast<uint8_t>(count);
    cts.rma_key = claim_;
    wire::LocalIov body[wire::kLocalMaxIov];
    for (size_t i = 0; i < count; ++i)
        body[i] = {reinterpret_cast<uint64_t>(theirs_to_ours[i].iov_base),
                   theirs_to_ours[i].iov_len};
    sender.out.push(channel.sender(), cts, body, count * sizeof(wire::LocalIov));
    return true;
}

void SingleCopy::finish(Channel &channel, int sender_status) {
    channel.claims().release(claim_);
    claim_ = wire::kLocalNoClaim;
    if (!err_ && sender_status != 0) read(half_, n_ - half_);
}

void SingleCopy::abandon(Channel &channel) {
    channel.claims().release(claim_);
    claim_ = wire::kLocalNoClaim;
    err_ = FI_ECONNRESET;
}

void SingleCopy::read(size_t from, size_t len) {
    if (err_ || !len) return;
    iovec ours[kMaxPieces], theirs[wire::kLocalMaxIov];
    size_t nours = iov_slice(local_, nlocal_, from, len, ours, std::size(ours));
    size_t ntheirs = iov_slice(remote_, nremote_, from, len, theirs, std::size(theirs));
    ssize_t got = cma_read(pid_, ours, nours, theirs, ntheirs);
    if (got < 0 || size_t(got) != len) err_ = read_error(got);
}

int SingleCopy::read_through_host(pid_t pid, const iovec *local, const hmem::MemRef *mem,
                                  size_t nlocal, const iovec *remote, size_t nremote, size_t n) {
    constexpr size_t kChunk = 1 << 20;
    std::vector<uint8_t> bounce(std::min(n, kChunk));
    for (size_t off = 0; off < n;) {
        size_t k = std::min(kChunk, n - off);
        iovec from[wire::kLocalMaxIov * 4];
        size_t nfrom = iov_slice(remote, nremote, off, k, from, std::size(from));
        iovec to{bounce.data(), k};
        ssize_t got = cma_read(pid, &to, 1, from, nfrom);
        if (got < 0 || size_t(got) != k) return read_error(got);
        if (hmem::scatter(local, mem, nlocal, off, bounce.data(), k) != ssize_t(k)) return FI_EIO;
        off += k;
    }
    return 0;
}

}  // namespace tandem::shm
