#include "main_prov/shm/peer_inbox.h"

#include "common/log.h"
#include "common/wire.h"
#include "main_prov/shm/cma.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tandem::shm {

namespace {

// Whether some socket of our network namespace holds addr (a TCP address and port): then
// that address names that socket's endpoint here, whatever segment another namespace made
// under the same name. A bind that fails with EADDRINUSE says so; any other outcome (bound,
// or the address is not ours at all) leaves the segment's owner as the one meant.
bool address_taken_here(std::string_view addr) {
    sockaddr_storage ss{};
    if (addr.size() > sizeof ss || addr.size() < sizeof(sa_family_t)) return false;
    memcpy(&ss, addr.data(), addr.size());
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    bool taken = bind(fd, reinterpret_cast<sockaddr *>(&ss), socklen_t(addr.size())) != 0 &&
                 errno == EADDRINUSE;
    close(fd);
    return taken;
}

}  // namespace

std::optional<PeerInbox> open_peer(const std::string &key, std::string_view addr,
                                   const PeerPolicy &policy) {
    std::optional<InboxSegment> seg = InboxSegment::open(key, wire::kLocalCellSize);
    if (!seg) return std::nullopt;
    const SegmentInfo *info = seg->info;
    // Another authorization key: the owner's link then tries it, and is refused there too.
    if (info->auth != policy.auth) {
        TANDEM_INFO(FI_LOG_EP_CTRL, "%s: another authorization key: not a node-local peer\n",
                    key.c_str());
        return std::nullopt;
    }
    static const uint64_t our_net_ns = own_net_namespace();
    if (info->net_ns && our_net_ns && info->net_ns != our_net_ns && address_taken_here(addr)) {
        TANDEM_INFO(FI_LOG_EP_CTRL,
                    "%s: the segment is another network namespace's; the address is taken here\n",
                    key.c_str());
        return std::nullopt;
    }
    // (Taken before the segment moves into the PeerInbox; its mapping stays where it is.)
    const std::atomic<uint32_t> *state = seg->segment.ready_word();
    // Named members: PeerInbox grows, and a positional {} once landed in a descriptor.
    PeerInbox peer{.key = key,
                   .segment = std::move(seg->segment),
                   .out = Outbox(seg->ring, key, state),
                   .split_claims = seg->split_claims,
                   .info = info,
                   .pid = info->pid};
    // Single copy needs the peer's pid to mean the peer here (one pid namespace, or the pid
    // would name another process) and the kernel's permission, which the probe finds out by
    // reading a random word the peer published: reading it proves both. Staged otherwise.
    peer.same_pid_ns = peer.segment.owner_shares_pid_namespace();
    const char *why = "";
    if (!policy.cma)
        why = policy.cma_off;
    else if (!peer.same_pid_ns)
        why = " (another pid namespace)";
    else if (info->job != policy.job)
        why = " (another job)";
    else if (!(peer.cma = cma_probe(peer.pid, reinterpret_cast<const void *>(info->probe_addr),
                                    info->probe_value)))
        why = " (the kernel refused the probe read)";
    TANDEM_INFO(FI_LOG_EP_CTRL, "node-local peer %s (pid %d), single copy by CMA: %s%s\n",
                key.c_str(), peer.pid, peer.cma ? "yes" : "no", why);
    return peer;
}

}  // namespace tandem::shm
