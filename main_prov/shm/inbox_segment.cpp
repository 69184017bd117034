// Where node-local endpoints meet in /dev/shm (inbox_segment.h): inbox segments made and
// opened, the key an endpoint's address maps to, the names made from that key, and the
// removal of what dead processes left there.
#include "main_prov/shm/inbox_segment.h"

#include "common/coarse_clock.h"
#include "common/log.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

namespace tandem::shm {

size_t InboxSegment::bytes(uint32_t cells, uint32_t cell_size) {
    return sizeof(SegmentInfo) + ShmRing::bytes_for(cells, cell_size) +
           kSplitClaims * sizeof(uint64_t);
}

namespace {

// The claim table of a segment whose ring is `ring`, or nullptr when the segment has none.
std::atomic<uint64_t> *split_claims_of(const ShmSegment &segment, const ShmRing &ring) {
    auto *info = static_cast<const SegmentInfo *>(segment.data());
    size_t at = sizeof(SegmentInfo) + ShmRing::bytes_for(ring.cells(), ring.cell_size());
    if (info->split_claims != kSplitClaims ||
        segment.data_size() < at + kSplitClaims * sizeof(uint64_t))
        return nullptr;
    return reinterpret_cast<std::atomic<uint64_t> *>(static_cast<uint8_t *>(segment.data()) + at);
}

}  // namespace

InboxSegment InboxSegment::create(const std::string &key, uint32_t cells, uint32_t cell_size,
                                  const InboxIdentity &identity) {
    InboxSegment inbox{ShmSegment::create(segment_name(key), bytes(cells, cell_size))};
    auto *info = static_cast<SegmentInfo *>(inbox.segment.data());
    *info = {};
    info->pid = getpid();
    info->cell_size = cell_size;
    info->probe_addr = identity.probe_addr;
    info->probe_value = identity.probe_value;
    info->net_ns = own_net_namespace();
    info->auth = identity.auth;
    info->job = identity.job;
    info->heartbeat = uint32_t(coarse_now_ms());
    // (A segment just created: its memory is zero, and no cell is touched before use.)
    inbox.ring = ShmRing::init(reinterpret_cast<uint8_t *>(info + 1), cells, cell_size,
                               /*zeroed=*/true);
    if (!inbox.ring) throw ShmError(-EINVAL, "inbox ring shape");
    info->split_claims = kSplitClaims;  // (all free: the memory is zero)
    inbox.split_claims = split_claims_of(inbox.segment, *inbox.ring);
    inbox.info = info;
    __atomic_store_n(&info->magic, SegmentInfo::kMagic, __ATOMIC_RELEASE);
    return inbox;
}

std::optional<InboxSegment> InboxSegment::open(const std::string &key, uint32_t cell_size) {
    std::optional<InboxSegment> inbox;
    try {
        inbox.emplace(InboxSegment{ShmSegment::open(segment_name(key))});
    } catch (const FabricError &) {
        return std::nullopt;  // no endpoint of this address on this node (or not ours to open)
    }
    ShmSegment &seg = inbox->segment;
    if (seg.data_size() < sizeof(SegmentInfo)) return std::nullopt;
    auto *info = static_cast<SegmentInfo *>(seg.data());
    if (__atomic_load_n(&info->magic, __ATOMIC_ACQUIRE) != SegmentInfo::kMagic ||
        info->cell_size != cell_size || !seg.owner_alive())
        return std::nullopt;
    inbox->ring = ShmRing::attach(reinterpret_cast<uint8_t *>(info + 1),
                                  seg.data_size() - sizeof(SegmentInfo));
    if (!inbox->ring) return std::nullopt;
    inbox->info = info;
    inbox->split_claims = split_claims_of(seg, *inbox->ring);
    return inbox;
}

std::optional<std::string> local_key(const void *addr, size_t len) {
    if (!addr || len < sizeof(sa_family_t)) return std::nullopt;
    sa_family_t family;
    memcpy(&family, addr, sizeof family);
    char text[INET6_ADDRSTRLEN + 16];
    if (family == AF_INET && len >= sizeof(sockaddr_in)) {
        sockaddr_in sin;
        memcpy(&sin, addr, sizeof sin);
        snprintf(text, sizeof text, "4-%08x-%u", ntohl(sin.sin_addr.s_addr), ntohs(sin.sin_port));
        return std::string(text);
    }
    if (family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
        sockaddr_in6 sin6;
        memcpy(&sin6, addr, sizeof sin6);
        std::string key = "6-";
        for (uint8_t b : sin6.sin6_addr.s6_addr) {
            snprintf(text, sizeof text, "%02x", b);
            key += text;
        }
        snprintf(text, sizeof text, "-%u", ntohs(sin6.sin6_port));
        return key + text;
    }
    return std::nullopt;
}

std::string segment_prefix() {
    return "/tandem-" + std::to_string(geteuid()) + "-";
}

std::string segment_name(const std::string &key) {
    return segment_prefix() + key;
}

std::string wake_path(const std::string &key) {
    return "/dev/shm" + segment_name(key) + ".wake";
}

// What processes that died without closing left in /dev/shm: their segments, then wake
// FIFOs without a segment (an endpoint creates its segment first and removes it last).
void reap_stale() {
    size_t n = ShmSegment::reap_stale(segment_prefix());
    const std::string suffix = ".wake";
    for (const std::string &name : ShmSegment::names_with_prefix(segment_prefix())) {
        if (!name.ends_with(suffix)) continue;
        std::string segment = "/dev/shm" + name.substr(0, name.size() - suffix.size());
        struct stat st;
        if (stat(segment.c_str(), &st) != 0 && errno == ENOENT &&
            unlink(("/dev/shm" + name).c_str()) == 0)
            ++n;
    }
    if (n) TANDEM_INFO(FI_LOG_EP_CTRL, "removed %zu leftovers of dead processes\n", n);
}

}  // namespace tandem::shm
