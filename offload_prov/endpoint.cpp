#include "offload_prov/endpoint.h"

#include "common/iov.h"
#include "common/log.h"
#include "common/unsupported_ops.h"
#include "offload_prov/av.h"
#include "offload_prov/config.h"
#include "offload_prov/cq.h"
#include "offload_prov/domain.h"
#include "offload_prov/eq.h"
#include "offload_prov/shm/cma.h"
#include "offload_prov/srx.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace tandem::off {

namespace {

using wire::LocalFlags;
using wire::LocalHeader;
using wire::LocalIov;
using wire::LocalOp;

fi_ops ep_fi_ops = fid_ops(
    &Trampoline<&Endpoint::close>::call<fid>, &Trampoline<&Endpoint::bind>::call<fid>,
    &Trampoline<&Endpoint::control>::call<fid>, &Trampoline<&Endpoint::ops_open>::call<fid>);

// Receives are the owner's to cancel.
fi_ops_ep ep_ops =
    fid_ep_ops(enosys<decltype(fi_ops_ep::cancel)>, &Trampoline<&Endpoint::getopt>::call<fid>,
               &Trampoline<&Endpoint::setopt>::call<fid>);

// The owner posts with the *msg calls only (they carry every argument); the short forms
// would pretend to a use nobody makes of an offload endpoint.
fi_ops_msg msg_ops = {
    .size = sizeof(fi_ops_msg),
    .recv = enosys<decltype(fi_ops_msg::recv)>,
    .recvv = enosys<decltype(fi_ops_msg::recvv)>,
    .recvmsg = enosys<decltype(fi_ops_msg::recvmsg)>,
    .send = enosys<decltype(fi_ops_msg::send)>,
    .sendv = enosys<decltype(fi_ops_msg::sendv)>,
    .sendmsg = &Trampoline<&Endpoint::sendmsg>::call<fid_ep>,
    .inject = enosys<decltype(fi_ops_msg::inject)>,
    .senddata = enosys<decltype(fi_ops_msg::senddata)>,
    .injectdata = enosys<decltype(fi_ops_msg::injectdata)>,
};

fi_ops_tagged tagged_ops = {
    .size = sizeof(fi_ops_tagged),
    .recv = enosys<decltype(fi_ops_tagged::recv)>,
    .recvv = enosys<decltype(fi_ops_tagged::recvv)>,
    .recvmsg = enosys<decltype(fi_ops_tagged::recvmsg)>,
    .send = enosys<decltype(fi_ops_tagged::send)>,
    .sendv = enosys<decltype(fi_ops_tagged::sendv)>,
    .sendmsg = &Trampoline<&Endpoint::tsendmsg>::call<fid_ep>,
    .inject = enosys<decltype(fi_ops_tagged::inject)>,
    .senddata = enosys<decltype(fi_ops_tagged::senddata)>,
    .injectdata = enosys<decltype(fi_ops_tagged::injectdata)>,
};

fi_ops_rma rma_ops = {
    .size = sizeof(fi_ops_rma),
    .read = enosys<decltype(fi_ops_rma::read)>,
    .readv = enosys<decltype(fi_ops_rma::readv)>,
    .readmsg = &Trampoline<&Endpoint::readmsg>::call<fid_ep>,
    .write = enosys<decltype(fi_ops_rma::write)>,
    .writev = enosys<decltype(fi_ops_rma::writev)>,
    .writemsg = &Trampoline<&Endpoint::writemsg>::call<fid_ep>,
    .inject = enosys<decltype(fi_ops_rma::inject)>,
    .writedata = enosys<decltype(fi_ops_rma::writedata)>,
    .injectdata = enosys<decltype(fi_ops_rma::injectdata)>,
};

int local_reachable(fid_ep *ep, fi_addr_t addr) noexcept try {
    return Endpoint::of(ep)->reachable(addr);
} catch (...) {
    return 0;
}

int local_wait_fd(fid_ep *ep) noexcept {
    return Endpoint::of(ep)->wait_fd();
}

int local_arm(fid_ep *ep) noexcept try { return Endpoint::of(ep)->arm(); } catch (...) {
    return 1;
}

uint64_t local_queued_data(fid_ep *, fi_peer_rx_entry *entry) noexcept {
    auto *held = static_cast<HeldMessage *>(entry ? entry->peer_context : nullptr);
    return held ? held->hdr.cq_data : 0;
}

void local_introduce(fid_ep *ep, fi_addr_t addr) noexcept try {
    Endpoint::of(ep)->introduce(addr);
} catch (...) {
}

int local_remote_twin(fid_ep *ep, fi_addr_t addr, uint64_t *caps) noexcept {
    return Endpoint::of(ep)->remote_twin(addr, caps);
}

size_t local_inject_limit(fid_ep *) noexcept {
    return Config::get().eager_limit;
}

ssize_t local_inject(fid_ep *ep, const iovec *iov, size_t count, fi_addr_t dest, uint64_t tag,
                     uint64_t data, uint64_t flags) noexcept try {
    return Endpoint::of(ep)->inject(iov, count, dest, tag, data, flags);
} catch (...) {
    return current_exception_errno();
}

peer::LocalPathOps local_path_ops = {sizeof(peer::LocalPathOps),
                                     local_reachable,
                                     local_wait_fd,
                                     local_arm,
                                     local_queued_data,
                                     local_introduce,
                                     local_remote_twin,
                                     local_inject_limit,
                                     local_inject};

// Completions of the transfers we post on the owner's endpoint (FI_PEER_TRANSFER).
ssize_t transfer_complete(fid_ep *ep, fi_cq_tagged_entry *entry, fi_addr_t *src) noexcept try {
    if (!ep || !entry) return -FI_EINVAL;
    Endpoint::of(ep)->transfer_complete(*entry, src ? *src : FI_ADDR_NOTAVAIL);
    return 0;
} catch (...) {
    return current_exception_errno();
}
ssize_t transfer_comperr(fid_ep *ep, fi_cq_err_entry *err) noexcept try {
    if (!ep || !err) return -FI_EINVAL;
    Endpoint::of(ep)->transfer_error(*err);
    return 0;
} catch (...) {
    return current_exception_errno();
}
fi_ops_transfer_peer transfer_ops = {sizeof(fi_ops_transfer_peer), transfer_complete,
                                     transfer_comperr};

// The start of every segment's data: who owns it and where a CMA probe may read.
struct SegmentInfo {
    static constexpr uint64_t kMagic = 0x6f66665f746e6431ull;  // "off_tnd1"
    uint64_t magic;
    int32_t pid;
    uint32_t cell_size;
    uint64_t probe_addr;  // an address in the owner's memory a peer may read 8 bytes from
    uint32_t armed;       // the owner may sleep: the next sender writes its wake FIFO
    uint8_t reserved[36];
};
static_assert(sizeof(SegmentInfo) == 64);

const uint64_t g_probe_word = SegmentInfo::kMagic;

SegmentInfo *info_of(const ShmSegment &segment) {
    return static_cast<SegmentInfo *>(segment.data());
}

const uint8_t *body_of(const uint8_t *cell) {
    return cell + sizeof(LocalHeader) + wire::kLocalNameRoom;
}

}  // namespace

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

// The wake FIFO of the endpoint with that key, beside its segment in /dev/shm.
static std::string wake_path(const std::string &key) {
    return "/dev/shm" + segment_name(key) + ".wake";
}

// What processes that died without closing left in /dev/shm: their segments, then wake
// FIFOs without a segment (an endpoint creates its segment first and removes it last).
static void reap_stale() {
    size_t n = ShmSegment::reap_stale(segment_prefix());
    std::string prefix = segment_prefix().substr(1);  // without the leading '/'
    DIR *dir = opendir("/dev/shm");
    if (dir) {
        while (dirent *e = readdir(dir)) {
            std::string name = e->d_name;
            const std::string suffix = ".wake";
            if (name.rfind(prefix, 0) != 0 || name.size() <= suffix.size() ||
                name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
                continue;
            std::string segment = "/dev/shm/" + name.substr(0, name.size() - suffix.size());
            struct stat st;
            if (stat(segment.c_str(), &st) != 0 && errno == ENOENT &&
                unlink(("/dev/shm/" + name).c_str()) == 0)
                ++n;
        }
        closedir(dir);
    }
    if (n) TANDEM_INFO(FI_LOG_EP_CTRL, "removed %zu leftovers of dead processes\n", n);
}

Endpoint::Endpoint(Domain *domain, const fi_info *info, fi_peer_transfer_context *transfer)
    : domain_(domain), info_(fi_dupinfo(info)), owner_ep_(transfer->ep) {
    if (!info_) fail(FI_ENOMEM, "fi_dupinfo");
    init_fid(FI_CLASS_EP, nullptr, &ep_fi_ops);
    fid()->ops = &ep_ops;
    fid()->msg = &msg_ops;
    fid()->tagged = &tagged_ops;
    fid()->rma = &rma_ops;
    fid()->atomic = atomic_ops();
    complete_ep_tables(*fid());
    transfer->peer_ops = &transfer_ops;
    void *ops = nullptr;
    struct fid *owner = &owner_ep_->fid;
    if (owner->ops->ops_open &&
        owner->ops->ops_open(owner, peer::kPeerEpOpsName, 0, &ops, nullptr) == 0)
        owner_ep_ops_ = static_cast<peer::PeerEpOps *>(ops);
    if (owner_ep_ops_ && owner_ep_ops_->size >= sizeof(peer::PeerEpOps) &&
        owner_ep_ops_->mr_generation)
        mr_generation_ = owner_ep_ops_->mr_generation(owner_ep_);
    domain_->hold();
}

Endpoint::~Endpoint() {
    // Receives matched for split copies still waiting for their sender: their entries go
    // back to the owner, which is closing the endpoint they belong to.
    if (srx_) {
        for (auto &[id, split] : splits_)
            if (split.entry) srx_->owner().free_entry(split.entry);
        // (and those of receive completions the owner's CQ never took)
        for (; !cq_backlog_.empty(); cq_backlog_.pop_front())
            if (cq_backlog_.front().entry) srx_->owner().free_entry(cq_backlog_.front().entry);
    }
    for (auto &[key, link] : links_)
        if (link->wake_fd >= 0) ::close(link->wake_fd);
    if (wake_rd_ >= 0) ::close(wake_rd_);
    if (wake_wr_ >= 0) ::close(wake_wr_);
    if (!wake_path_.empty()) unlink(wake_path_.c_str());
    // Messages queued with the owner belong to the owner's entries now: the owner frees the
    // entries when it closes (it closes us first), so only our side of them goes here.
    for (HeldMessage *h : held_) delete h;
    if (cq_) cq_->detach(this);
    if (av_) av_->release();
    if (srx_) srx_->release();
    fi_freeinfo(info_);
    domain_->release();
}

int Endpoint::close() {
    delete this;
    return 0;
}

int Endpoint::bind(struct fid *bfid, uint64_t flags) {
    if (!bfid) return -FI_EINVAL;
    if (enabled_) return -FI_EOPBADSTATE;
    switch (bfid->fclass) {
        case FI_CLASS_CQ:
            if (cq_) return -FI_EINVAL;
            if (!(flags & (FI_TRANSMIT | FI_RECV))) return -FI_EBADFLAGS;
            cq_ = Cq::of(bfid);
            cq_->attach(this);
            return 0;
        case FI_CLASS_AV:
            if (av_) return -FI_EINVAL;
            av_ = Av::of(bfid);
            av_->hold();
            return 0;
        case FI_CLASS_SRX_CTX:
            if (srx_) return -FI_EINVAL;
            srx_ = Srx::of(bfid);
            srx_->hold();
            return 0;
        case FI_CLASS_EQ:
            return 0;  // nothing of ours raises connection events
        default:
            return -FI_EINVAL;
    }
}

int Endpoint::control(int command, void *) {
    if (command != FI_ENABLE) return -FI_ENOSYS;
    if (!cq_ || !av_ || !srx_) return -FI_ENOCQ;
    if (!enabled_) enable();
    return 0;
}

int Endpoint::ops_open(const char *name, uint64_t, void **ops, void *) {
    if (!name || !ops) return -FI_EINVAL;
    if (strcmp(name, peer::kLocalPathOpsName) != 0) return -FI_ENOSYS;
    *ops = &local_path_ops;
    return 0;
}

// The inbox is named after the owner endpoint's address, which peers know from their AV.
void Endpoint::enable() {
    uint8_t name[128];
    size_t len = sizeof name;
    int ret = fi_getname(&owner_ep_->fid, name, &len);
    if (ret) fail(-ret, "fi_getname of the owner endpoint");
    auto key = local_key(name, len);
    if (!key || len > wire::kLocalNameRoom) fail(FI_EINVAL, "owner address not an IP address");
    key_ = *key;
    memcpy(name_, name, len);
    proto_.name_len = static_cast<uint8_t>(len);
    proto_.pid = getpid();

    reap_stale();
    const Config &cfg = Config::get();
    uint32_t cells = static_cast<uint32_t>(cfg.ring_cells);
    size_t bytes = sizeof(SegmentInfo) + ShmRing::bytes_for(cells, wire::kLocalCellSize);
    segment_.emplace(ShmSegment::create(segment_name(key_), bytes));
    // We own the key now (the segment was created exclusively): a FIFO left by a dead owner
    // of the same key goes. We keep a write end ourselves so that the read end never sees
    // a hang-up (which would make it readable for ever).
    wake_path_ = wake_path(key_);
    unlink(wake_path_.c_str());
    if (mkfifo(wake_path_.c_str(), 0600) != 0) fail(errno, "mkfifo " + wake_path_);
    wake_rd_ = ::open(wake_path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    wake_wr_ = ::open(wake_path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (wake_rd_ < 0 || wake_wr_ < 0) fail(errno, "open " + wake_path_);
    auto *info = static_cast<SegmentInfo *>(segment_->data());
    *info = {};
    info->pid = getpid();
    info->cell_size = wire::kLocalCellSize;
    info->probe_addr = reinterpret_cast<uint64_t>(&g_probe_word);
    inbox_ = ShmRing::init(static_cast<uint8_t *>(segment_->data()) + sizeof(SegmentInfo), cells,
                           wire::kLocalCellSize);
    if (!inbox_) fail(FI_EINVAL, "inbox ring shape");
    // Written last: a peer that sees the magic sees an initialised ring.
    __atomic_store_n(&info->magic, SegmentInfo::kMagic, __ATOMIC_RELEASE);
    enabled_ = true;
}

int Endpoint::reachable(fi_addr_t addr) {
    if (!enabled_) return 0;
    PeerLink *link = link_for(addr);
    return link && !link->dead;
}

// The link of a destination, remembered per fi_addr_t until the AV changes (an address
// removed and another inserted may reuse the fi_addr_t).
Endpoint::PeerLink *Endpoint::link_for(fi_addr_t addr) {
    uint64_t version = av_->owner().version();
    if (version != links_version_) {
        link_by_addr_.clear();
        last_link_ = nullptr;
        links_version_ = version;
    }
    if (addr == last_addr_ && last_link_) return last_link_;
    auto it = link_by_addr_.find(addr);
    if (it != link_by_addr_.end()) {
        last_addr_ = addr;
        last_link_ = it->second;
        return it->second;
    }
    uint8_t name[128];
    size_t len = sizeof name;
    if (av_->owner().lookup(addr, name, &len) != 0 || len > sizeof name) return nullptr;
    auto key = local_key(name, len);
    if (!key) return nullptr;
    PeerLink *link = link_for_key(*key);
    if (link) link_by_addr_[addr] = link;
    return link;
}

Endpoint::PeerLink *Endpoint::link_for_key(const std::string &key) {
    auto it = links_.find(key);
    if (it != links_.end()) return it->second.get();
    std::optional<ShmSegment> seg;
    try {
        seg.emplace(ShmSegment::open(segment_name(key)));
    } catch (const FabricError &) {
        return nullptr;  // no endpoint of this address on this node (or not ours to open)
    }
    if (seg->data_size() < sizeof(SegmentInfo)) return nullptr;
    auto *info = static_cast<SegmentInfo *>(seg->data());
    if (__atomic_load_n(&info->magic, __ATOMIC_ACQUIRE) != SegmentInfo::kMagic ||
        info->cell_size != wire::kLocalCellSize || !seg->owner_alive())
        return nullptr;
    ShmRing *ring = ShmRing::attach(static_cast<uint8_t *>(seg->data()) + sizeof(SegmentInfo),
                                    seg->data_size() - sizeof(SegmentInfo));
    if (!ring) return nullptr;
    // Named members: PeerLink grows, and a positional {} once landed in wake_fd (0: stdin).
    auto link = std::make_unique<PeerLink>(
        PeerLink{.key = key, .segment = std::move(*seg), .ring = ring, .pid = info->pid});
    link->cma =
        Config::get().cma && cma_probe(link->pid, reinterpret_cast<const void *>(info->probe_addr));
    TANDEM_INFO(FI_LOG_EP_CTRL, "node-local peer %s (pid %d), single copy by CMA: %s\n",
                key.c_str(), link->pid, link->cma ? "yes" : "no");
    PeerLink *raw = link.get();
    links_.emplace(key, std::move(link));
    return raw;
}

// ------------------------------------------------------------------------------------------
// Sending cells

void Endpoint::push(PeerLink &link, const LocalHeader &hdr, const void *body, size_t len) {
    iovec iov{const_cast<void *>(body), len};
    push_gather(link, hdr, &iov, len ? 1 : 0, 0, len);
}

// False when device memory could not be copied (nothing was pushed then): device bytes go
// through a bounce first, so that a failed copy never reaches the receiver as data.
bool Endpoint::push_gather(PeerLink &link, const LocalHeader &hdr, const iovec *iov, size_t count,
                           size_t offset, size_t len, const hmem::MemRef *mem) {
    const uint8_t *staged = nullptr;
    if (mem) {
        thread_local std::vector<uint8_t> bounce;
        bounce.resize(len);
        if (hmem::gather(bounce.data(), iov, mem, count, offset, len) != ssize_t(len)) {
            TANDEM_WARN(FI_LOG_EP_DATA, "device memory could not be copied for sending\n");
            return false;
        }
        staged = bounce.data();
    }
    if (try_push(link, hdr, iov, count, offset, len, staged)) return true;
    // The inbox is full: keep the cell, in order, for the next progress call.
    std::vector<uint8_t> cell(sizeof hdr + wire::kLocalNameRoom + len);
    fill_cell(cell.data(), hdr, iov, count, offset, len, staged);
    if (link.backlog.empty()) ++backlogged_;
    link.backlog.push_back(Outgoing{std::move(cell), nullptr});
    return true;
}

// The cell straight into the peer's inbox, if it can go now: nothing waits for room before
// it (order) and the ring has a free cell. False, with nothing written, otherwise.
inline bool Endpoint::try_push(PeerLink &link, const LocalHeader &hdr, const iovec *iov,
                               size_t count, size_t offset, size_t len, const uint8_t *staged) {
    if (!link.backlog.empty()) return false;
    void *cell = link.ring->try_reserve(proto_.pid);
    if (!cell) return false;
    fill_cell(static_cast<uint8_t *>(cell), hdr, iov, count, offset, len, staged);
    link.ring->publish(cell);
    notify(link);
    return true;
}

// An Eager message nobody waits a Fin for goes as a Short cell (see wire::LocalShortHeader).
void Endpoint::fill_cell(uint8_t *cell, const LocalHeader &hdr, const iovec *iov, size_t count,
                         size_t offset, size_t len, const uint8_t *staged) const {
    uint8_t *body;
    if (hdr.op == static_cast<uint8_t>(LocalOp::Eager) && !(hdr.flags & wire::kLocalAckReq)) {
        wire::LocalShortHeader s{.op = static_cast<uint8_t>(LocalOp::Short),
                                 .flags = hdr.flags,
                                 .name_len = hdr.name_len,
                                 .reserved = 0,
                                 .size = hdr.size,
                                 .tag = hdr.tag,
                                 .cq_data = hdr.cq_data};
        size_t at = wire::local_short_body_offset(hdr.name_len);
        uint8_t head[sizeof s + wire::kLocalNameRoom];  // header and name, built here
        static_assert(sizeof head >= ShmRing::kFirstLinePayload);
        memcpy(head, &s, sizeof s);
        memcpy(head + sizeof s, name_, at - sizeof s);  // name_ is zero-padded
        if (at + len <= ShmRing::kFirstLinePayload) {
            // The whole cell is in the line the receiver polls: the data joins the head here
            // and the line is stored in one burst, so that the receiver's polling cannot take
            // it back between our stores.
            if (staged)
                memcpy(head + at, staged, len);
            else
                iov_gather(head + at, iov, count, offset, len);
            memcpy(cell, head, ShmRing::kFirstLinePayload);
            return;
        }
        memcpy(cell, head, at);
        body = cell + at;
    } else {
        memcpy(cell, &hdr, sizeof hdr);
        memcpy(cell + sizeof hdr, name_, wire::kLocalNameRoom);
        body = cell + sizeof hdr + wire::kLocalNameRoom;
    }
    if (staged)
        memcpy(body, staged, len);
    else
        iov_gather(body, iov, count, offset, len);
}

// A payload in as many cells as it takes (Frag, WriteFrag, ReadData): each carries its
// offset, the last one kLocalLast (an empty payload still sends that one cell). The cells
// that fit go now; the rest follow from the payload's own buffers as the ring makes room
// (flush), behind whatever waited before. `end` says what happens once it is all sent.
void Endpoint::push_staged(PeerLink &link, LocalHeader hdr, const iovec *iov, size_t count,
                           size_t len, const hmem::MemRef *mem, StreamEnd end) {
    auto stream = std::make_unique<Stream>();
    stream->hdr = hdr;
    stream->hdr.offset = 0;
    stream->iov.assign(iov, iov + count);
    if (mem) stream->mem.assign(mem, mem + count);
    stream->len = len;
    stream->end = end;
    int status = 0;
    if (link.backlog.empty() && pump(link, *stream, &status)) {
        finish_stream(*stream, status);
        return;
    }
    if (link.backlog.empty()) ++backlogged_;
    link.backlog.push_back(Outgoing{{}, std::move(stream)});
}

// The stream's next cells into the ring while it has room: true when the stream ended, with
// *status 0 (its last cell went) or FI_EIO (a device copy failed: an empty last cell with
// that status ends the payload instead, and the receiver drops what it assembled).
bool Endpoint::pump(PeerLink &link, Stream &stream, int *status) {
    LocalHeader &hdr = stream.hdr;
    for (;;) {
        void *reserved = link.ring->try_reserve(proto_.pid);
        if (!reserved) return false;
        auto *cell = static_cast<uint8_t *>(reserved);
        const size_t off = hdr.offset;
        hdr.size = static_cast<uint32_t>(std::min(wire::kLocalBodyRoom, stream.len - off));
        if (off + hdr.size == stream.len) hdr.flags |= wire::kLocalLast;
        uint8_t *body = cell + sizeof hdr + wire::kLocalNameRoom;
        bool copied = true;
        if (stream.mem.empty())
            iov_gather(body, stream.iov.data(), stream.iov.size(), off, hdr.size);
        else
            copied = hmem::gather(body, stream.iov.data(), stream.mem.data(), stream.iov.size(),
                                  off, hdr.size) == ssize_t(hdr.size);
        LocalHeader out = hdr;
        if (!copied) {
            TANDEM_WARN(FI_LOG_EP_DATA, "device memory could not be copied for sending\n");
            out.flags |= wire::kLocalLast;
            out.size = 0;
            out.status = FI_EIO;
        }
        memcpy(cell, &out, sizeof out);
        memcpy(cell + sizeof out, name_, wire::kLocalNameRoom);
        link.ring->publish(cell);
        notify(link);
        if (out.flags & wire::kLocalLast) {
            *status = out.status;
            return true;
        }
        hdr.offset = off + hdr.size;
    }
}

void Endpoint::finish_stream(const Stream &stream, int status) {
    switch (stream.end.kind) {
        case StreamEnd::Kind::None:
            return;
        case StreamEnd::Kind::CompleteTx:
            complete_tx(stream.end.context, stream.end.flags, stream.len, status);
            return;
        case StreamEnd::Kind::FailPending:
            if (status) finish_pending(stream.hdr.msg_id, status);
            return;
        case StreamEnd::Kind::ReadAccess:
            if (!status && owner_ep_ops_)
                owner_ep_ops_->access_done(owner_ep_, stream.end.rma_key, FI_REMOTE_READ);
            return;
    }
}

bool Endpoint::flush(PeerLink &link) {
    while (!link.backlog.empty()) {
        Outgoing &next = link.backlog.front();
        if (next.stream) {
            int status = 0;
            if (!pump(link, *next.stream, &status)) return false;
            std::unique_ptr<Stream> done = std::move(next.stream);
            link.backlog.pop_front();
            if (link.backlog.empty()) --backlogged_;
            finish_stream(*done, status);
            continue;
        }
        void *cell = link.ring->try_reserve(proto_.pid);
        if (!cell) return false;
        memcpy(cell, next.cell.data(), next.cell.size());
        link.ring->publish(cell);
        link.backlog.pop_front();
        if (link.backlog.empty()) --backlogged_;
        notify(link);
    }
    return true;
}

// The receiver armed its wake FIFO before sleeping: the first sender after that wakes it.
// The fence orders our publish before reading `armed`, against the receiver's store of
// `armed` before it looks at its ring again (arm()): one of the two sees the other.
void Endpoint::notify(PeerLink &link) {
    SegmentInfo *info = info_of(link.segment);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!__atomic_load_n(&info->armed, __ATOMIC_RELAXED)) return;
    if (!__atomic_exchange_n(&info->armed, 0u, __ATOMIC_ACQ_REL)) return;
    if (link.wake_fd < 0)
        link.wake_fd = ::open(wake_path(link.key).c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    char byte = 0;
    if (link.wake_fd >= 0 && ::write(link.wake_fd, &byte, 1) < 0 && errno != EAGAIN)
        TANDEM_DEBUG(FI_LOG_EP_DATA, "wake of %s failed: %s\n", link.key.c_str(), strerror(errno));
}

int Endpoint::arm() {
    if (!enabled_) return 0;
    char drain[64];
    while (::read(wake_rd_, drain, sizeof drain) > 0) {
    }
    SegmentInfo *info = info_of(*segment_);
    __atomic_store_n(&info->armed, 1u, __ATOMIC_RELAXED);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    bool pending =
        inbox_->peek() != nullptr || !tx_done_.empty() || !cq_backlog_.empty() || backlogged_;
    if (pending) {
        char byte = 0;
        (void)!::write(wake_wr_, &byte, 1);
    }
    return pending ? 1 : 0;
}

// The inbox of the endpoint that sent a cell (named by its address bytes), if it lives.
Endpoint::PeerLink *Endpoint::link_to(std::string_view sender) {
    if (last_sender_link_ && sender == last_sender_)
        return last_sender_link_->dead ? nullptr : last_sender_link_;
    auto key = local_key(sender.data(), sender.size());
    PeerLink *link = key ? link_for_key(*key) : nullptr;
    if (link) {
        last_sender_.assign(sender);
        last_sender_link_ = link;
    }
    return link && !link->dead ? link : nullptr;
}

void Endpoint::answer(std::string_view sender, uint64_t msg_id, int status) {
    PeerLink *link = link_to(sender);
    if (!link) return;  // the sender is gone: nobody waits for the answer
    LocalHeader hdr = proto_;
    hdr.op = static_cast<uint8_t>(LocalOp::Fin);
    hdr.msg_id = msg_id;
    hdr.status = status;
    push(*link, hdr, nullptr, 0);
}

// ------------------------------------------------------------------------------------------
// Posting

ssize_t Endpoint::sendmsg(const fi_msg *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return post_send(msg->msg_iov, msg->desc, msg->iov_count, msg->addr, 0, msg->data, msg->context,
                     flags, false);
}

ssize_t Endpoint::tsendmsg(const fi_msg_tagged *msg, uint64_t flags) {
    if (!msg) return -FI_EINVAL;
    return post_send(msg->msg_iov, msg->desc, msg->iov_count, msg->addr, msg->tag, msg->data,
                     msg->context, flags, true);
}

ssize_t Endpoint::post_send(const iovec *iov, void **desc, size_t count, fi_addr_t dest,
                            uint64_t tag, uint64_t data, void *context, uint64_t flags,
                            bool tagged) {
    if (!enabled_) return -FI_EOPBADSTATE;
    if ((count && !iov) || count > wire::kLocalMaxIov) return -FI_EINVAL;
    PeerLink *link = link_for(dest);
    if (!link) return -FI_EHOSTUNREACH;
    size_t len = iov_length(iov, count);
    uint64_t cq_flags = FI_SEND | (tagged ? FI_TAGGED : FI_MSG);
    if (link->dead) {
        complete_tx(context, cq_flags, len, FI_ECONNRESET);
        return 0;
    }
    // Back-pressure: the peer's ring is full, or cells wait for room already.
    if (!admits(*link)) return -FI_EAGAIN;
    LocalHeader hdr = message_header(len, tag, data, flags, tagged);
    // FI_DELIVERY_COMPLETE: complete when the receiver placed the data (its Fin), not when
    // the cells are written.
    bool ack = flags & FI_DELIVERY_COMPLETE;
    hmem::MemRef mem[wire::kLocalMaxIov];
    bool device = desc && peer::mems_of(desc, count, mem);
    if (device) {
        // Device memory: peer to peer through IPC handles where the policy and the driver
        // allow, else staged through cells by the device's copies (never by the CPU).
        auto &c = hmem::counters();
        switch (p2p_.decide(true, len, Config::get().eager_limit)) {
            case hmem::P2pDecision::PeerToPeer: {
                Pending p{.context = context,
                          .flags = cq_flags,
                          .len = len,
                          .link = link,
                          .iov = {iov, iov + count},
                          .mem = {mem, mem + count},
                          .ipc = true,
                          .ack = ack,
                          .tag = tag,
                          .data = data,
                          .hdr_flags = hdr.flags};
                if (post_ipc(*link, hdr, iov, mem, count, std::move(p))) {
                    c.p2p_transfers.fetch_add(1, std::memory_order_relaxed);
                    return 0;
                }
                if (p2p_.mode() == FI_HMEM_P2P_REQUIRED) {
                    c.refused_transfers.fetch_add(1, std::memory_order_relaxed);
                    complete_tx(context, cq_flags, len, FI_EOPNOTSUPP);
                    return 0;
                }
                break;  // no IPC handle for this memory: staged
            }
            case hmem::P2pDecision::Fail:
                c.refused_transfers.fetch_add(1, std::memory_order_relaxed);
                complete_tx(context, cq_flags, len, FI_EOPNOTSUPP);
                return 0;
            case hmem::P2pDecision::Stage:
                break;
        }
        c.staged_transfers.fetch_add(1, std::memory_order_relaxed);
        if (len > Config::get().eager_limit && link->cma && len <= kStagedRtsMax) {
            // Large: our device copies it once into a host bounce that the receiver reads
            // like any host message (single copy by CMA), instead of cell by cell.
            Pending p{.context = context, .flags = cq_flags, .len = len, .link = link};
            p.bounce.resize(len);
            if (hmem::gather(p.bounce.data(), iov, mem, count, 0, len) != ssize_t(len)) {
                complete_tx(context, cq_flags, len, FI_EIO);
                return 0;
            }
            send_rts(*link, hdr, std::move(p));
            return 0;
        }
        if (ack) {
            hdr.flags |= wire::kLocalAckReq;
            pending_[hdr.msg_id] =
                Pending{.context = context, .flags = cq_flags, .len = len, .link = link};
        }
        hdr.op =
            static_cast<uint8_t>(len <= Config::get().eager_limit ? LocalOp::Eager : LocalOp::Frag);
        if (hdr.op == static_cast<uint8_t>(LocalOp::Frag)) {
            push_staged(*link, hdr, iov, count, len, mem, send_end(ack, context, cq_flags));
            return 0;
        }
        hdr.size = static_cast<uint32_t>(len);
        if (!push_gather(*link, hdr, iov, count, 0, len, mem)) {
            // The device could not copy it: an error completion, and nothing delivered.
            pending_.erase(hdr.msg_id);
            complete_tx(context, cq_flags, len, FI_EIO);
        } else if (!ack) {
            complete_tx(context, cq_flags, len, 0);
        }
        return 0;
    }
    if (ack) {
        hdr.flags |= wire::kLocalAckReq;
        pending_[hdr.msg_id] =
            Pending{.context = context, .flags = cq_flags, .len = len, .link = link};
    }
    if (len <= Config::get().eager_limit) {
        hdr.op = static_cast<uint8_t>(LocalOp::Eager);
        hdr.size = static_cast<uint32_t>(len);
        push_gather(*link, hdr, iov, count, 0, len);
        if (!ack) complete_tx(context, cq_flags, len, 0);
        return 0;
    }
    if (link->cma) {
        send_rts(*link, hdr,
                 Pending{.context = context,
                         .flags = cq_flags,
                         .len = len,
                         .link = link,
                         .iov = {iov, iov + count}});
        return 0;
    }
    // No cross-memory attach: stage the message through the ring, a cell at a time.
    hdr.op = static_cast<uint8_t>(LocalOp::Frag);
    push_staged(*link, hdr, iov, count, len, nullptr, send_end(ack, context, cq_flags));
    return 0;
}

// The owner's fast path for small messages: the same Eager cell post_send would write, but
// only when it can go into the ring at once, and without a completion (the owner reports the
// send itself). A link with a backlog refuses: the cell must queue behind the backlog, which
// post_send does.
ssize_t Endpoint::inject(const iovec *iov, size_t count, fi_addr_t dest, uint64_t tag,
                         uint64_t data, uint64_t flags) {
    if (!enabled_) return -FI_EOPBADSTATE;
    if ((count && !iov) || count > wire::kLocalMaxIov) return -FI_EINVAL;
    PeerLink *link = link_for(dest);
    if (!link) return -FI_EHOSTUNREACH;
    if (link->dead) return -FI_ECONNRESET;
    size_t len = iov_length(iov, count);
    if (len > Config::get().eager_limit) return -FI_EMSGSIZE;
    LocalHeader hdr = message_header(len, tag, data, flags, flags & FI_TAGGED);
    hdr.op = static_cast<uint8_t>(LocalOp::Eager);
    hdr.size = static_cast<uint32_t>(len);
    // (An id not sent is skipped: ids only name operations, they need not be consecutive.)
    return try_push(*link, hdr, iov, count, 0, len, nullptr) ? 0 : -FI_EAGAIN;
}

// The header of a message's first (or only) cell, with a fresh id; op and size are the
// caller's.
LocalHeader Endpoint::message_header(size_t len, uint64_t tag, uint64_t data, uint64_t flags,
                                     bool tagged) {
    LocalHeader hdr = proto_;
    hdr.flags =
        (tagged ? wire::kLocalTagged : 0) | ((flags & FI_REMOTE_CQ_DATA) ? wire::kLocalCqData : 0);
    hdr.tag = tag;
    hdr.cq_data = data;
    hdr.total = len;
    hdr.msg_id = next_id_++;
    return hdr;
}

// Single copy: the receiver reads the buffers of p.iov (or p.bounce) with CMA; they stay ours
// until its Fin.
void Endpoint::send_rts(PeerLink &link, LocalHeader hdr, Pending p) {
    if (!p.bounce.empty()) p.iov.assign(1, iovec{p.bounce.data(), p.bounce.size()});
    hdr.op = static_cast<uint8_t>(LocalOp::Rts);
    LocalIov body[wire::kLocalMaxIov];
    size_t n = 0;
    for (const iovec &v : p.iov)
        if (v.iov_len) body[n++] = {reinterpret_cast<uint64_t>(v.iov_base), v.iov_len};
    hdr.iov_count = static_cast<uint8_t>(n);
    hdr.flags &= ~uint8_t(wire::kLocalAckReq);  // Fin comes anyway, after delivery
    pending_[hdr.msg_id] = std::move(p);
    push(link, hdr, body, n * sizeof(LocalIov));
}

// An IpcRts naming the sender's device buffers; false when some buffer has no IPC handle
// (the driver refuses, or the memory is not device memory), and nothing was sent.
bool Endpoint::post_ipc(PeerLink &link, LocalHeader hdr, const iovec *iov, const hmem::MemRef *mem,
                        size_t count, Pending p) {
    wire::LocalIpc body[wire::kLocalMaxIov];
    size_t n = 0;
    for (size_t i = 0; i < count; ++i) {
        if (!iov[i].iov_len) continue;
        hmem::IpcExport ex;
        if (mem[i].on_host() || ipc_export_.get(mem[i], iov[i].iov_base, iov[i].iov_len, &ex))
            return false;
        wire::LocalIpc &e = body[n++];
        memcpy(e.handle, ex.handle.bytes, sizeof e.handle);
        e.buffer_id = ex.buffer_id;
        e.alloc_len = ex.alloc_len;
        e.offset = ex.offset;
        e.length = iov[i].iov_len;
        e.addr = reinterpret_cast<uint64_t>(iov[i].iov_base);
        e.iface = static_cast<uint32_t>(ex.mem.iface);
        e.device = static_cast<uint32_t>(ex.mem.device);
    }
    hdr.op = static_cast<uint8_t>(LocalOp::IpcRts);
    hdr.iov_count = static_cast<uint8_t>(n);
    hdr.flags &= ~uint8_t(wire::kLocalAckReq);  // Fin comes anyway, after delivery
    pending_[hdr.msg_id] = std::move(p);
    push(link, hdr, body, n * sizeof(wire::LocalIpc));
    return true;
}

int Endpoint::setopt(int level, int optname, const void *optval, size_t optlen) {
    if (level != FI_OPT_ENDPOINT || optname != FI_OPT_FI_HMEM_P2P) return -FI_ENOPROTOOPT;
    if (!optval || optlen != sizeof(int)) return -FI_EINVAL;
    // The node-local path can go peer to peer wherever the driver gives IPC handles.
    return p2p_.set(*static_cast<const int *>(optval), hmem::Registry::instance().any_device());
}

int Endpoint::getopt(int level, int optname, void *optval, size_t *optlen) {
    if (level != FI_OPT_ENDPOINT || optname != FI_OPT_FI_HMEM_P2P) return -FI_ENOPROTOOPT;
    if (!optval || !optlen || *optlen < sizeof(int)) return -FI_EINVAL;
    *static_cast<int *>(optval) = p2p_.mode();
    *optlen = sizeof(int);
    return 0;
}

ssize_t Endpoint::writemsg(const fi_msg_rma *msg, uint64_t flags) {
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    return post_rma(msg->msg_iov, msg->desc, msg->iov_count, msg->rma_iov[0], msg->addr, msg->data,
                    msg->context, flags, true);
}

ssize_t Endpoint::readmsg(const fi_msg_rma *msg, uint64_t flags) {
    if (!msg || msg->rma_iov_count != 1 || !msg->rma_iov) return -FI_EINVAL;
    return post_rma(msg->msg_iov, msg->desc, msg->iov_count, msg->rma_iov[0], msg->addr, 0,
                    msg->context, flags, false);
}

ssize_t Endpoint::post_rma(const iovec *iov, void **desc, size_t count, const fi_rma_iov &rma,
                           fi_addr_t dest, uint64_t data, void *context, uint64_t flags,
                           bool write) {
    if (!enabled_) return -FI_EOPBADSTATE;
    if ((count && !iov) || count > wire::kLocalMaxIov) return -FI_EINVAL;
    PeerLink *link = link_for(dest);
    if (!link) return -FI_EHOSTUNREACH;
    size_t len = iov_length(iov, count);
    uint64_t cq_flags = FI_RMA | (write ? FI_WRITE : FI_READ);
    if (link->dead) {
        complete_tx(context, cq_flags, len, FI_ECONNRESET);
        return 0;
    }
    if (!admits(*link)) return -FI_EAGAIN;
    LocalHeader hdr = proto_;
    hdr.flags = (write && (flags & FI_REMOTE_CQ_DATA)) ? wire::kLocalCqData : 0;
    hdr.cq_data = data;
    hdr.total = len;
    hdr.rma_addr = rma.addr;
    hdr.rma_key = rma.key;
    hdr.msg_id = next_id_++;
    Pending p{.context = context, .flags = cq_flags, .len = len, .link = link};
    // Device memory is staged (its device copies it into and out of cells): node-local RMA
    // has no peer-to-peer form, so FI_HMEM_P2P_REQUIRED refuses it.
    hmem::MemRef mem[wire::kLocalMaxIov];
    bool device = desc && peer::mems_of(desc, count, mem);
    if (device) {
        if (p2p_.decide(false, len, 0) == hmem::P2pDecision::Fail) {
            hmem::counters().refused_transfers.fetch_add(1, std::memory_order_relaxed);
            complete_tx(context, cq_flags, len, FI_EOPNOTSUPP);
            return 0;
        }
        hmem::counters().staged_transfers.fetch_add(1, std::memory_order_relaxed);
        p.mem.assign(mem, mem + count);
    }
    bool cma = link->cma && !device;
    LocalIov body[wire::kLocalMaxIov];
    size_t n = 0;
    for (size_t i = 0; i < count; ++i)
        if (iov[i].iov_len)
            body[n++] = {reinterpret_cast<uint64_t>(iov[i].iov_base), iov[i].iov_len};
    if (!write) {
        // The target writes into our buffers (CMA) or answers with ReadData cells.
        p.iov.assign(iov, iov + count);
        hdr.op = static_cast<uint8_t>(LocalOp::Read);
        hdr.iov_count = static_cast<uint8_t>(cma ? n : 0);
        pending_[hdr.msg_id] = std::move(p);
        push(*link, hdr, body, hdr.iov_count * sizeof(LocalIov));
        return 0;
    }
    // A large write read with CMA: the target may ask us (Cts) to write part of it ourselves.
    if (cma && len >= wire::kLocalSplitMin) p.iov.assign(iov, iov + count);
    pending_[hdr.msg_id] = std::move(p);
    bool sent = true;
    if (len <= Config::get().eager_limit) {
        hdr.op = static_cast<uint8_t>(LocalOp::Write);
        hdr.size = static_cast<uint32_t>(len);
        sent = push_gather(*link, hdr, iov, count, 0, len, device ? mem : nullptr);
    } else if (cma) {
        hdr.op = static_cast<uint8_t>(LocalOp::Write);
        hdr.iov_count = static_cast<uint8_t>(n);
        push(*link, hdr, body, n * sizeof(LocalIov));
    } else {
        hdr.op = static_cast<uint8_t>(LocalOp::WriteFrag);
        // A failed device copy fails the write (a later Fin finds nothing to finish).
        push_staged(*link, hdr, iov, count, len, device ? mem : nullptr,
                    {.kind = StreamEnd::Kind::FailPending});
    }
    if (!sent) finish_pending(hdr.msg_id, FI_EIO);  // (a later Fin finds nothing to finish)
    return 0;
}

// ------------------------------------------------------------------------------------------
// Progress

void Endpoint::progress() {
    if (!enabled_) return;
    if (!hello_posted_) post_hello_receive();
    if (!introductions_.empty()) send_hellos();
    // A bounded batch: a sender that never stops must not starve the rest of the owner.
    for (int i = 0; i < 64; ++i) {
        const void *cell = inbox_->peek();
        if (!cell) break;
        handle_cell(static_cast<const uint8_t *>(cell));
        inbox_->release();
    }
    if (backlogged_)
        for (auto &[key, link] : links_)
            if (!link->dead) flush(*link);
    // Completions the owner's CQ refused earlier go first, in order.
    while (!cq_backlog_.empty() && try_write_cq(cq_backlog_.front())) cq_backlog_.pop_front();
    while (!tx_done_.empty()) {
        TxCompletion c = tx_done_.front();
        tx_done_.pop_front();
        CqWrite w{.kind = c.err ? CqWrite::Kind::Error : CqWrite::Kind::Entry};
        w.e.op_context = c.context;
        w.e.flags = c.flags;
        w.e.len = c.len;
        w.e.err = c.err;
        w.e.prov_errno = c.err;
        write_cq(w);
    }
    // Peers' liveness every 200 ms; the clock itself only every 1024 passes (reading it on
    // every poll showed up as a tenth of a ping-pong's time), every 32 while atomics wait for
    // answers (a small atomic's round trip is a few passes: a clock read each would be a
    // tenth of it), and on every pass while other operations wait on a peer.
    ++passes_;
    if (passes_ % 1024 == 0 || (atomics_pending_ && passes_ % 32 == 0) || !pending_.empty() ||
        !splits_.empty() || !restaging_.empty()) {
        auto now = std::chrono::steady_clock::now();
        if (now >= next_check_) {
            next_check_ = now + std::chrono::milliseconds(200);
            check_peers();
        }
    }
}

void Endpoint::complete_tx(void *context, uint64_t flags, size_t len, int err) {
    tx_done_.push_back({context, flags, len, err});
}

// A peer that died leaves our operations waiting on it with errors, not a hang, and no
// cell it had claimed in our inbox without publishing it stops the cells behind.
void Endpoint::check_peers() {
    if (uint32_t n = inbox_->reclaim_dead(process_running))
        TANDEM_INFO(FI_LOG_EP_DATA, "skipped %u inbox cells claimed by dead processes\n", n);
    for (auto &[key, link] : links_) {
        if (link->dead || link->segment.owner_alive()) continue;
        link->dead = true;
        if (!link->backlog.empty()) --backlogged_;
        std::deque<Outgoing> unsent = std::move(link->backlog);
        link->backlog.clear();
        for (const Outgoing &o : unsent)
            if (o.stream) finish_stream(*o.stream, FI_ECONNRESET);
        TANDEM_INFO(FI_LOG_EP_DATA, "node-local peer %s died\n", key.c_str());
        for (auto it = pending_.begin(); it != pending_.end();) {
            if (it->second.link != link.get()) {
                ++it;
                continue;
            }
            complete_tx(it->second.context, it->second.flags, it->second.len, FI_ECONNRESET);
            it = pending_.erase(it);
        }
        for (AtomicSlot &slot : atomics_)
            if (slot.link == link.get()) finish_atomic_slot(slot, FI_ECONNRESET);
        // Receives whose sender was still to write its half.
        for (auto it = splits_.begin(); it != splits_.end();) {
            auto sender = local_key(it->first.first.data(), it->first.first.size());
            if (!sender || *sender != key) {
                ++it;
                continue;
            }
            Split split = it->second;
            it = splits_.erase(it);
            if (split.entry) complete_rx(split.entry, split.hdr, split.n, FI_ECONNRESET, split.src);
        }
        // Its staged writes that failed here, and what it sent behind a split write of its:
        // nobody waits for any of it now.
        std::erase_if(failed_writes_, [&](const auto &f) {
            auto sender = local_key(f.first.first.data(), f.first.first.size());
            return sender && *sender == key;
        });
        std::erase_if(deferred_, [&](const auto &d) {
            auto sender = local_key(d.first.data(), d.first.size());
            return sender && *sender == key;
        });
        // Receives waiting for a staged copy it will never send, and its memory we mapped.
        for (auto it = restaging_.begin(); it != restaging_.end();) {
            auto sender = local_key(it->first.first.data(), it->first.first.size());
            if (!sender || *sender != key) {
                ++it;
                continue;
            }
            fi_peer_rx_entry *entry = it->second;
            LocalHeader hdr{};
            hdr.total = entry->size;
            hdr.tag = entry->tag;
            it = restaging_.erase(it);
            complete_rx(entry, hdr, 0, FI_ECONNRESET, entry->addr);
        }
        ipc_import_.forget_peer(static_cast<uint64_t>(link->pid));
    }
}

// The sender's fi_addr_t in the shared AV. Looked up through the owner once per sender and
// AV version: a receive completion must not pay a reverse lookup.
fi_addr_t Endpoint::source_of(std::string_view sender) {
    uint64_t version = av_->owner().version();
    if (version != sources_version_) {
        sources_.clear();
        sources_version_ = version;
    }
    for (const auto &[name, addr] : sources_)
        if (name == sender) return addr;
    fi_addr_t addr = av_->owner().addr_of(sender.data(), sender.size());
    if (sources_.size() >= 64) sources_.clear();
    sources_.emplace_back(std::string(sender), addr);
    return addr;
}

void Endpoint::handle_cell(const uint8_t *cell) {
    if (!deferred_.empty() && defer_if_held(cell)) return;
    switch (static_cast<LocalOp>(cell[0])) {
        case LocalOp::Short:
            handle_short(cell);
            return;
        case LocalOp::Atomic:
            serve_atomic(cell);
            return;
        case LocalOp::AtomicResp:
            finish_atomic(cell);
            return;
        default:
            break;
    }
    LocalHeader hdr;
    memcpy(&hdr, cell, sizeof hdr);
    if (hdr.name_len > wire::kLocalNameRoom) {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed cell\n");
        return;
    }
    // The sender's address bytes: mapped to an fi_addr_t (cached), and to the key of its
    // inbox only when we answer it.
    std::string_view sender(reinterpret_cast<const char *>(cell + sizeof hdr), hdr.name_len);
    const uint8_t *body = body_of(cell);
    if (hdr.size > wire::kLocalBodyRoom || hdr.iov_count > wire::kLocalMaxIov) {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed cell (op %u)\n", hdr.op);
        return;
    }
    switch (static_cast<LocalOp>(hdr.op)) {
        case LocalOp::Eager:
            handle_message(hdr, sender, source_of(sender), body, nullptr, nullptr);
            return;
        case LocalOp::Rts:
            handle_message(hdr, sender, source_of(sender), nullptr,
                           reinterpret_cast<const LocalIov *>(body), nullptr);
            return;
        case LocalOp::IpcRts: {
            wire::LocalIpc ipc[wire::kLocalMaxIov];  // (copied: the cell body is unaligned)
            memcpy(ipc, body, hdr.iov_count * sizeof(wire::LocalIpc));
            handle_message(hdr, sender, source_of(sender), nullptr, nullptr, nullptr, ipc);
            return;
        }
        case LocalOp::Frag: {
            std::pair<std::string, uint64_t> id{std::string(sender), hdr.msg_id};
            if (hdr.status) {
                // The sender gave up on a message whose receive we hold (see finish_pending).
                if (auto r = restaging_.find(id); r != restaging_.end()) {
                    fi_peer_rx_entry *entry = r->second;
                    restaging_.erase(r);
                    complete_rx(entry, hdr, 0, hdr.status, source_of(sender));
                }
                staged_.erase(id);
                return;
            }
            auto &st = staged_[id];
            if (st.data.empty() && hdr.total) {
                st.hdr = hdr;
                st.data.resize(hdr.total);
            }
            if (hdr.offset + hdr.size > st.data.size()) {
                staged_.erase(id);
                TANDEM_WARN(FI_LOG_EP_DATA, "dropping a fragment out of its message\n");
                return;
            }
            memcpy(st.data.data() + hdr.offset, body, hdr.size);
            st.received += hdr.size;
            if (st.received < st.data.size()) return;
            Staged whole = std::move(st);
            staged_.erase(id);
            // The staged copy of an IpcRts we could not map already has its receive.
            if (auto r = restaging_.find(id); r != restaging_.end()) {
                fi_peer_rx_entry *entry = r->second;
                restaging_.erase(r);
                deliver(entry, whole.hdr, sender, whole.data.data(), nullptr, source_of(sender));
                return;
            }
            handle_message(whole.hdr, sender, source_of(sender), whole.data.data(), nullptr,
                           &whole.data);
            return;
        }
        case LocalOp::Fin:
            finish_pending(hdr.msg_id, hdr.status);
            return;
        case LocalOp::ReadData: {
            auto it = pending_.find(hdr.msg_id);
            if (it == pending_.end()) return;
            Pending &p = it->second;
            if (hdr.status) {  // the target could not copy its memory
                finish_pending(hdr.msg_id, hdr.status);
                return;
            }
            if (p.mem.empty())
                iov_scatter(p.iov.data(), p.iov.size(), hdr.offset, body, hdr.size);
            else if (hmem::scatter(p.iov.data(), p.mem.data(), p.iov.size(), hdr.offset, body,
                                   hdr.size) < 0)
                p.received = SIZE_MAX / 2;  // reported as an error when the last one came
            p.received += hdr.size;
            if (hdr.flags & wire::kLocalLast)
                finish_pending(hdr.msg_id, p.received > p.len ? FI_EIO : 0);
            return;
        }
        case LocalOp::Write:
        case LocalOp::Read:
        case LocalOp::WriteFrag:
            handle_rma(hdr, sender, body);
            return;
        case LocalOp::Cts:
            handle_cts(hdr, sender, body);
            return;
        case LocalOp::WriteDone:
            handle_write_done(hdr, sender);
            return;
        case LocalOp::Short:
        case LocalOp::Atomic:
        case LocalOp::AtomicResp:
            return;  // handled above, before the long header is read
    }
    TANDEM_WARN(FI_LOG_EP_DATA, "dropping a cell with unknown op %u\n", hdr.op);
}

// A Short cell is an Eager message with the fields it leaves out implied.
void Endpoint::handle_short(const uint8_t *cell) {
    wire::LocalShortHeader s;
    memcpy(&s, cell, sizeof s);
    if (s.name_len > wire::kLocalNameRoom || s.size > wire::kLocalBodyRoom) {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a malformed cell\n");
        return;
    }
    LocalHeader hdr{};
    hdr.op = static_cast<uint8_t>(LocalOp::Eager);
    hdr.flags = s.flags;
    hdr.name_len = s.name_len;
    hdr.size = s.size;
    hdr.total = s.size;
    hdr.tag = s.tag;
    hdr.cq_data = s.cq_data;
    std::string_view sender(reinterpret_cast<const char *>(cell + sizeof s), s.name_len);
    handle_message(hdr, sender, source_of(sender), cell + wire::local_short_body_offset(s.name_len),
                   nullptr, nullptr);
}

// A whole message (inline, assembled from fragments, or an Rts naming the sender's buffers)
// asks the owner for a receive buffer.
void Endpoint::handle_message(const LocalHeader &hdr, std::string_view sender, fi_addr_t src,
                              const uint8_t *data, const LocalIov *rts_iov,
                              std::vector<uint8_t> *owned, const wire::LocalIpc *ipc) {
    bool tagged = hdr.flags & wire::kLocalTagged;
    fi_peer_rx_entry *entry = nullptr;
    const peer::ImportedSrx &srx = srx_->owner();
    int ret = tagged ? srx.get_tag(src, hdr.tag, &entry) : srx.get_msg(src, hdr.total, &entry);
    if (ret == 0 && entry) {
        deliver(entry, hdr, sender, data, rts_iov, src, ipc);
        return;
    }
    if (ret != -FI_ENOENT || !entry) {
        TANDEM_WARN(FI_LOG_EP_DATA, "owner refused a receive buffer: %s\n", fi_strerror(-ret));
        if (rts_iov || ipc) answer(sender, hdr.msg_id, FI_ENOMEM);
        return;
    }
    // No receive yet: hold the message (its bytes, or only the sender's buffer list of an
    // Rts) and let the owner queue it until one is posted.
    auto *held = new HeldMessage;
    held->ep = this;
    held->hdr = hdr;
    held->sender.assign(sender);
    held->src = src;
    if (rts_iov)
        memcpy(held->iov, rts_iov, hdr.iov_count * sizeof(LocalIov));
    else if (ipc)
        memcpy(held->ipc, ipc, hdr.iov_count * sizeof(wire::LocalIpc));
    else if (owned)
        held->data = std::move(*owned);
    else
        held->data.assign(data, data + hdr.total);
    entry->peer_context = held;
    entry->size = hdr.total;
    entry->tag = hdr.tag;
    entry->addr = src;
    if (hdr.flags & wire::kLocalCqData) entry->flags |= FI_REMOTE_CQ_DATA;
    held_.insert(held);
    srx.queue(entry, tagged);
}

// Copies a message into the receive buffer the owner gave, writes its completion to the
// owner's CQ and hands the entry back.
void Endpoint::deliver(fi_peer_rx_entry *entry, const LocalHeader &hdr, std::string_view sender,
                       const uint8_t *data, const LocalIov *rts_iov, fi_addr_t src,
                       const wire::LocalIpc *ipc) {
    size_t room = iov_length(entry->iov, entry->count);
    size_t n = std::min<size_t>(hdr.total, room);
    int err = 0;
    // Where the receive buffer lives: the owner passes the application's descriptors.
    hmem::MemRef mem[peer::kMaxEntryIov];
    size_t count = std::min(entry->count, peer::kMaxEntryIov);
    bool device = entry->desc && peer::mems_of(entry->desc, count, mem);
    // This endpoint's own policy holds for what it receives: DISABLED opens no handle (the
    // sender stages instead); REQUIRED refuses device memory that arrives staged.
    int mode = p2p_.mode();
    if (ipc) {
        if (mode == FI_HMEM_P2P_DISABLED)
            err = FI_EOPNOTSUPP;
        else if (n)
            err = deliver_ipc(entry, device ? mem : nullptr, hdr, ipc, n);
        if (err == FI_EOPNOTSUPP) {
            // We cannot map the sender's memory (IPC or peer access refused here): the sender
            // sends it again through cells, into this same receive.
            restaging_[std::make_pair(std::string(sender), hdr.msg_id)] = entry;
            answer(sender, hdr.msg_id, FI_EOPNOTSUPP);
            return;
        }
    } else if (device && n && mode == FI_HMEM_P2P_REQUIRED) {
        hmem::counters().refused_transfers.fetch_add(1, std::memory_order_relaxed);
        err = FI_EOPNOTSUPP;
    } else if (data && device) {
        if (hmem::scatter(entry->iov, mem, count, 0, data, n) < 0) err = FI_EIO;
    } else if (data) {
        iov_scatter(entry->iov, entry->count, 0, data, n);
    } else if (n) {
        iovec remote[wire::kLocalMaxIov];
        size_t nremote = 0, left = n;
        for (size_t i = 0; i < hdr.iov_count && left; ++i) {
            size_t take = std::min<size_t>(rts_iov[i].length, left);
            remote[nremote++] = {reinterpret_cast<void *>(rts_iov[i].addr), take};
            left -= take;
        }
        if (device) {
            // Cross-memory attach cannot reach device memory: through a host bounce buffer.
            err = cma_read_staged(hdr.pid, entry->iov, mem, count, remote, nremote, n);
        } else {
            // A large message is copied by both sides at once: the sender writes the second
            // half into our buffer while we read the first (two cores, twice the copy rate).
            size_t half = (n / 2) & ~size_t(4095);
            PeerLink *link = n >= wire::kLocalSplitMin ? link_to(sender) : nullptr;
            if (link && link->cma &&
                send_cts(*link, hdr.msg_id, entry->iov, entry->count, half, n)) {
                iovec local[wire::kLocalMaxIov * 4], first[wire::kLocalMaxIov];
                size_t nlocal =
                    iov_slice(entry->iov, entry->count, 0, half, local, std::size(local));
                size_t nfirst = iov_slice(remote, nremote, 0, half, first, std::size(first));
                ssize_t got = cma_read(hdr.pid, local, nlocal, first, nfirst);
                Split split{entry, hdr, n, half, {}, nremote, 0, src, {}, 0};
                for (size_t i = 0; i < nremote; ++i) split.remote[i] = remote[i];
                if (got < 0 || size_t(got) != half)
                    split.err = got == -ESRCH ? FI_ECONNRESET : FI_EIO;
                splits_.emplace(std::make_pair(std::string(sender), hdr.msg_id), split);
                return;  // completed by the sender's WriteDone
            }
            iovec local[wire::kLocalMaxIov * 4];
            size_t nlocal = iov_slice(entry->iov, entry->count, 0, n, local, std::size(local));
            ssize_t got = cma_read(hdr.pid, local, nlocal, remote, nremote);
            if (got < 0 || size_t(got) != n) err = got == -ESRCH ? FI_ECONNRESET : FI_EIO;
        }
    }
    if (hdr.op == static_cast<uint8_t>(LocalOp::Rts) ||
        hdr.op == static_cast<uint8_t>(LocalOp::IpcRts) || (hdr.flags & wire::kLocalAckReq))
        answer(sender, hdr.msg_id, err);
    complete_rx(entry, hdr, n, err, src);
}

// IpcRts: map the sender's device buffers (cached) and copy them into the receive with the
// device's engine: device to device, or device to host for a host buffer. FI_EOPNOTSUPP
// when a buffer cannot be mapped here; another FI_* code when a copy fails.
int Endpoint::deliver_ipc(fi_peer_rx_entry *entry, const hmem::MemRef *mem, const LocalHeader &hdr,
                          const wire::LocalIpc *ipc, size_t n) {
    hmem::Registry &reg = hmem::Registry::instance();
    iovec remote[wire::kLocalMaxIov];
    hmem::MemRef rmem[wire::kLocalMaxIov];
    for (size_t i = 0; i < hdr.iov_count; ++i) {
        const wire::LocalIpc &e = ipc[i];
        auto iface = static_cast<fi_hmem_iface>(e.iface);
        if (!reg.available(iface) || iface == FI_HMEM_SYSTEM || e.offset > e.alloc_len ||
            e.length > e.alloc_len - e.offset)
            return FI_EINVAL;
        if (hdr.pid == getpid()) {  // a peer in our own process: its memory is ours
            remote[i] = {reinterpret_cast<void *>(e.addr), e.length};
            rmem[i] = {iface, e.device};
            continue;
        }
        // Mapped on our receive buffer's device, or on the sender's device number for a
        // host buffer (its copy engine then reads the peer's memory into ours).
        uint64_t device = mem && !mem[0].on_host() ? mem[0].device : e.device;
        if (device >= static_cast<uint64_t>(reg.device_count(iface))) device = 0;
        hmem::IpcExport ex;
        memcpy(ex.handle.bytes, e.handle, sizeof ex.handle.bytes);
        ex.mem = {iface, e.device};
        ex.buffer_id = e.buffer_id;
        ex.offset = e.offset;
        ex.alloc_len = e.alloc_len;
        void *addr = nullptr;
        if (ipc_import_.map(static_cast<uint64_t>(hdr.pid), device, ex, &addr))
            return FI_EOPNOTSUPP;
        remote[i] = {addr, e.length};
        rmem[i] = {iface, device};
    }
    // Walk both lists; one copy per overlapping piece.
    size_t count = std::min(entry->count, peer::kMaxEntryIov);
    size_t done =
        iov_walk2(entry->iov, count, remote, hdr.iov_count, n,
                  [&](size_t i, uint8_t *dst, size_t j, uint8_t *src, size_t k) {
                      return hmem::copy(mem ? mem[i] : hmem::kHost, dst, rmem[j], src, k) == 0;
                  });
    return done == n ? 0 : FI_EIO;
}

// Cross-memory attach into buffers that may be device memory: a chunk at a time through a
// host bounce buffer, then the device's copy. 0 or an FI_* code.
int Endpoint::cma_read_staged(pid_t pid, const iovec *local, const hmem::MemRef *mem, size_t nlocal,
                              const iovec *remote, size_t nremote, size_t n) {
    constexpr size_t kChunk = 1 << 20;
    std::vector<uint8_t> bounce(std::min(n, kChunk));
    for (size_t off = 0; off < n;) {
        size_t k = std::min(kChunk, n - off);
        iovec from[wire::kLocalMaxIov * 4];
        size_t nfrom = iov_slice(remote, nremote, off, k, from, std::size(from));
        iovec to{bounce.data(), k};
        ssize_t got = cma_read(pid, &to, 1, from, nfrom);
        if (got < 0 || size_t(got) != k) return got == -ESRCH ? FI_ECONNRESET : FI_EIO;
        if (hmem::scatter(local, mem, nlocal, off, bounce.data(), k) != ssize_t(k)) return FI_EIO;
        off += k;
    }
    return 0;
}

// The receive's completion to the owner's CQ, and its entry back to the owner.
void Endpoint::complete_rx(fi_peer_rx_entry *entry, const LocalHeader &hdr, size_t n, int err,
                           fi_addr_t src) {
    size_t room = iov_length(entry->iov, entry->count);
    if (!err && hdr.total > room) err = FI_ETRUNC;
    uint64_t flags = FI_RECV | ((hdr.flags & wire::kLocalTagged) ? FI_TAGGED : FI_MSG) |
                     ((hdr.flags & wire::kLocalCqData) ? FI_REMOTE_CQ_DATA : 0) |
                     (entry->flags & FI_MULTI_RECV);
    CqWrite w{.kind = err                              ? CqWrite::Kind::Error
                      : (entry->flags & FI_COMPLETION) ? CqWrite::Kind::Entry
                                                       : CqWrite::Kind::None,
              .src = src,
              .entry = entry};
    w.e.op_context = entry->context;
    w.e.flags = flags;
    w.e.len = n;
    w.e.buf = entry->count ? entry->iov[0].iov_base : nullptr;
    w.e.data = hdr.cq_data;
    w.e.tag = hdr.tag;
    if (err) {
        w.e.olen = hdr.total - n;
        w.e.err = err;
        w.e.prov_errno = err;
    }
    write_cq(w);
}

// A completion to the owner's CQ, behind those it refused before (kept, in order, and
// written again at the next progress: the owner handles its CQ's overflow, fi_peer(3)).
void Endpoint::write_cq(const CqWrite &w) {
    if (cq_backlog_.empty() && try_write_cq(w)) return;
    if (cq_backlog_.empty())
        TANDEM_DEBUG(FI_LOG_CQ, "the owner's CQ is full: completions wait for room\n");
    cq_backlog_.push_back(w);
}

// False when the owner's CQ has no room now (-FI_EAGAIN); the entry of a receive goes back
// to the owner once its completion is written. Any other refusal is final for that
// completion: reported in the log, not retried for ever ahead of all the others.
bool Endpoint::try_write_cq(const CqWrite &w) {
    ssize_t ret = 0;
    if (w.kind == CqWrite::Kind::Error)
        ret = cq_->owner().writeerr(w.e);
    else if (w.kind == CqWrite::Kind::Entry)
        ret = cq_->owner().write(w.e.op_context, w.e.flags, w.e.len, w.e.buf, w.e.data, w.e.tag,
                                 w.src);
    if (ret == -FI_EAGAIN) return false;
    if (ret)
        TANDEM_WARN(FI_LOG_CQ, "the owner's CQ refused a completion (context %p, flags %#lx): %s\n",
                    w.e.op_context, (unsigned long)w.e.flags, fi_strerror(int(-ret)));
    if (w.entry) srx_->owner().free_entry(w.entry);
    return true;
}

// Sender side of a split copy: write our part into the receiver's buffer.
void Endpoint::handle_cts(const LocalHeader &hdr, std::string_view sender, const uint8_t *body) {
    int status = FI_EIO;
    auto it = pending_.find(hdr.msg_id);
    if (it != pending_.end() && !it->second.iov.empty()) {
        Pending &p = it->second;
        iovec local[wire::kLocalMaxIov];
        size_t nlocal =
            iov_slice(p.iov.data(), p.iov.size(), hdr.offset, hdr.total, local, wire::kLocalMaxIov);
        bool whole = iov_length(local, nlocal) == hdr.total;
        auto *dst = reinterpret_cast<const LocalIov *>(body);
        iovec remote[wire::kLocalMaxIov];
        for (size_t i = 0; i < hdr.iov_count; ++i)
            remote[i] = {reinterpret_cast<void *>(dst[i].addr), dst[i].length};
        ssize_t put = whole ? cma_write(hdr.pid, local, nlocal, remote, hdr.iov_count) : -EINVAL;
        status = (put >= 0 && uint64_t(put) == hdr.total) ? 0 : FI_EIO;
    }
    PeerLink *link = link_to(sender);
    if (!link) return;
    LocalHeader done = proto_;
    done.op = static_cast<uint8_t>(LocalOp::WriteDone);
    done.msg_id = hdr.msg_id;
    done.status = status;
    push(*link, done, nullptr, 0);
}

// Receiver side: the sender wrote its part (or could not: then we read it ourselves).
void Endpoint::handle_write_done(const LocalHeader &hdr, std::string_view sender) {
    auto it = splits_.find(std::make_pair(std::string(sender), hdr.msg_id));
    if (it == splits_.end()) return;
    Split split = it->second;
    splits_.erase(it);
    int err = split.err;
    if (!err && hdr.status != 0) {
        // Our buffer and the sender's, both from `half` to `n`.
        iovec local[wire::kLocalMaxIov * 4], rest[wire::kLocalMaxIov];
        size_t nlocal = split.entry ? iov_slice(split.entry->iov, split.entry->count, split.half,
                                                split.n - split.half, local, std::size(local))
                                    : iov_slice(split.target, split.ntarget, split.half,
                                                split.n - split.half, local, std::size(local));
        size_t nrest = iov_slice(split.remote, split.nremote, split.half, split.n - split.half,
                                 rest, wire::kLocalMaxIov);
        ssize_t got = cma_read(split.hdr.pid, local, nlocal, rest, nrest);
        if (got < 0 || size_t(got) != split.n - split.half)
            err = got == -ESRCH ? FI_ECONNRESET : FI_EIO;
    }
    if (!split.entry) {
        finish_rma(split.hdr, sender, err);
        replay_deferred(std::string(sender));
        return;
    }
    answer(sender, split.hdr.msg_id, err);
    complete_rx(split.entry, split.hdr, split.n, err, split.src);
}

// Asks the sender of msg_id to write bytes [half, n) of its buffers into ours (`dst` holds
// all n): false, with nothing sent, when that part does not fit one Cts (we copy it all then).
bool Endpoint::send_cts(PeerLink &link, uint64_t msg_id, const iovec *dst, size_t ndst, size_t half,
                        size_t n) {
    iovec mine[wire::kLocalMaxIov];
    size_t nmine = iov_slice(dst, ndst, half, n - half, mine, wire::kLocalMaxIov);
    if (!nmine || iov_length(mine, nmine) != n - half) return false;
    LocalHeader cts = proto_;
    cts.op = static_cast<uint8_t>(LocalOp::Cts);
    cts.msg_id = msg_id;
    cts.offset = half;
    cts.total = n - half;
    cts.iov_count = static_cast<uint8_t>(nmine);
    LocalIov body[wire::kLocalMaxIov];
    for (size_t i = 0; i < nmine; ++i)
        body[i] = {reinterpret_cast<uint64_t>(mine[i].iov_base), mine[i].iov_len};
    push(link, cts, body, nmine * sizeof(LocalIov));
    return true;
}

// A cell from an initiator whose RMA write is split (see deferred_) waits for its WriteDone;
// answers to our own operations (Fin, Cts, WriteDone, ReadData) do not.
bool Endpoint::defer_if_held(const uint8_t *cell) {
    std::string_view sender;
    if (cell[0] == static_cast<uint8_t>(LocalOp::AtomicResp)) return false;  // an answer
    if (cell[0] == static_cast<uint8_t>(LocalOp::Short) ||
        cell[0] == static_cast<uint8_t>(LocalOp::Atomic)) {
        wire::LocalShortHeader s;
        memcpy(&s, cell, sizeof s);
        if (s.name_len > wire::kLocalNameRoom) return false;
        sender = {reinterpret_cast<const char *>(cell + sizeof s), s.name_len};
    } else {
        LocalHeader hdr;
        memcpy(&hdr, cell, sizeof hdr);
        auto op = static_cast<LocalOp>(hdr.op);
        if (op == LocalOp::Fin || op == LocalOp::Cts || op == LocalOp::WriteDone ||
            op == LocalOp::ReadData || hdr.name_len > wire::kLocalNameRoom)
            return false;
        sender = {reinterpret_cast<const char *>(cell + sizeof hdr), hdr.name_len};
    }
    auto it = deferred_.find(sender);
    if (it == deferred_.end()) return false;
    CellCopy copy;
    if (spare_cells_.empty()) {
        copy = std::make_unique_for_overwrite<uint8_t[]>(wire::kLocalCellSize);
    } else {
        copy = std::move(spare_cells_.back());
        spare_cells_.pop_back();
    }
    memcpy(copy.get(), cell, wire::kLocalCellSize);
    it->second.push_back(std::move(copy));
    return true;
}

// The initiator's split write is done: what it sent meanwhile is handled now, in order, up
// to the next write of its that splits.
void Endpoint::replay_deferred(const std::string &sender) {
    auto it = deferred_.find(sender);
    if (it == deferred_.end()) return;
    std::deque<CellCopy> cells = std::move(it->second);
    deferred_.erase(it);
    while (!cells.empty()) {
        CellCopy cell = std::move(cells.front());
        cells.pop_front();
        handle_cell(cell.get());
        if (spare_cells_.size() < Config::get().ring_cells) spare_cells_.push_back(std::move(cell));
        if (auto again = deferred_.find(sender); again != deferred_.end()) {
            for (auto &rest : cells) again->second.push_back(std::move(rest));
            return;
        }
    }
}

// ------------------------------------------------------------------------------------------
// Peer transfers: twins on different nodes introduce themselves over the owner's endpoint.

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

void Endpoint::send_hellos() {
    std::vector<fi_addr_t> todo;
    todo.swap(introductions_);
    for (fi_addr_t addr : todo) {
        auto *hello = new wire::TwinHello{
            wire::kTwinMagic, 1, 0,
            wire::kTwinNodeLocal | (Config::get().cma ? uint64_t(wire::kTwinCma) : 0)};
        iovec iov{hello, sizeof *hello};
        fi_msg_tagged msg{&iov, nullptr, 1, addr, wire::kTwinHelloTag, 0, hello, 0};
        ssize_t ret = fi_tsendmsg(owner_ep_, &msg, FI_PEER_TRANSFER);
        if (ret == 0) continue;
        delete hello;
        if (ret == -FI_EAGAIN)
            introductions_.push_back(addr);
        else
            TANDEM_INFO(FI_LOG_EP_CTRL, "could not introduce ourselves to fi_addr %lu: %s\n",
                        (unsigned long)addr, fi_strerror(int(-ret)));
    }
}

void Endpoint::transfer_complete(const fi_cq_tagged_entry &entry, fi_addr_t src) {
    if (entry.op_context == &hello_rx_ctx_) {
        if (entry.len == sizeof hello_in_ && hello_in_.magic == wire::kTwinMagic &&
            src != FI_ADDR_NOTAVAIL) {
            remote_twins_[src] = hello_in_.caps;
            TANDEM_INFO(FI_LOG_EP_CTRL,
                        "remote twin at fi_addr %lu introduced itself (caps %#lx)\n",
                        (unsigned long)src, (unsigned long)hello_in_.caps);
        } else {
            TANDEM_WARN(FI_LOG_EP_CTRL, "dropping a malformed twin hello (%zu bytes)\n", entry.len);
        }
        hello_posted_ = false;  // repost at the next pass
        return;
    }
    // One of our hellos went out.
    delete static_cast<wire::TwinHello *>(entry.op_context);
}

void Endpoint::transfer_error(const fi_cq_err_entry &err) {
    if (err.op_context == &hello_rx_ctx_) {
        TANDEM_INFO(FI_LOG_EP_CTRL, "twin hello receive failed: %s\n", fi_strerror(err.err));
        hello_posted_ = err.err == FI_ECANCELED;  // repost, unless it was cancelled
        return;
    }
    TANDEM_INFO(FI_LOG_EP_CTRL, "twin hello not delivered: %s\n", fi_strerror(err.err));
    delete static_cast<wire::TwinHello *>(err.op_context);
}

int Endpoint::remote_twin(fi_addr_t addr, uint64_t *caps) const {
    auto it = remote_twins_.find(addr);
    if (it == remote_twins_.end()) return 0;
    if (caps) *caps = it->second;
    return 1;
}

int Endpoint::start_held(fi_peer_rx_entry *entry) {
    auto *held = static_cast<HeldMessage *>(entry->peer_context);
    if (!held) return -FI_EINVAL;
    Endpoint *ep = held->ep;
    ep->held_.erase(held);
    bool rts = held->hdr.op == static_cast<uint8_t>(LocalOp::Rts);
    bool ipc = held->hdr.op == static_cast<uint8_t>(LocalOp::IpcRts);
    ep->deliver(entry, held->hdr, held->sender, rts || ipc ? nullptr : held->data.data(),
                rts ? held->iov : nullptr, held->src, ipc ? held->ipc : nullptr);
    delete held;
    return 0;
}

int Endpoint::discard_held(fi_peer_rx_entry *entry) {
    auto *held = static_cast<HeldMessage *>(entry->peer_context);
    if (!held) return -FI_EINVAL;
    Endpoint *ep = held->ep;
    ep->held_.erase(held);
    // The receiver dropped it: a sender waiting to have its buffers read is done with them.
    if (held->hdr.op == static_cast<uint8_t>(LocalOp::Rts) ||
        held->hdr.op == static_cast<uint8_t>(LocalOp::IpcRts) ||
        (held->hdr.flags & wire::kLocalAckReq))
        ep->answer(held->sender, held->hdr.msg_id, 0);
    delete held;
    ep->srx_->owner().free_entry(entry);
    return 0;
}

void Endpoint::finish_pending(uint64_t msg_id, int status) {
    auto it = pending_.find(msg_id);
    if (it == pending_.end()) return;  // already failed (a dead peer) or a duplicate answer
    Pending p = std::move(it->second);
    pending_.erase(it);
    if (p.ipc && status == FI_EOPNOTSUPP && p2p_.mode() != FI_HMEM_P2P_REQUIRED && !p.link->dead) {
        // The receiver could not map our memory: the same message again, staged by our
        // device's copies into cells, for the receive it is holding.
        auto &c = hmem::counters();
        c.p2p_transfers.fetch_sub(1, std::memory_order_relaxed);
        c.staged_transfers.fetch_add(1, std::memory_order_relaxed);
        LocalHeader hdr = proto_;
        hdr.op = static_cast<uint8_t>(LocalOp::Frag);
        hdr.flags = p.hdr_flags;
        hdr.tag = p.tag;
        hdr.cq_data = p.data;
        hdr.total = p.len;
        hdr.msg_id = msg_id;
        // FI_DELIVERY_COMPLETE: complete at the receiver's Fin for the staged copy.
        if (p.ack) hdr.flags |= wire::kLocalAckReq;
        PeerLink &link = *p.link;
        std::vector<iovec> iov = p.iov;
        std::vector<hmem::MemRef> mem = p.mem;
        StreamEnd end = send_end(p.ack, p.context, p.flags);
        if (p.ack) {
            p.ipc = false;
            pending_[msg_id] = std::move(p);
        }
        push_staged(link, hdr, iov.data(), iov.size(), hdr.total, mem.data(), end);
        return;
    } else if (p.ipc && status == FI_EOPNOTSUPP) {
        // FI_HMEM_P2P_REQUIRED: no staged copy. The receiver is holding its receive for
        // one: an empty last fragment carrying the error releases it.
        hmem::counters().refused_transfers.fetch_add(1, std::memory_order_relaxed);
        if (!p.link->dead) {
            LocalHeader hdr = proto_;
            hdr.op = static_cast<uint8_t>(LocalOp::Frag);
            hdr.flags = p.hdr_flags | wire::kLocalLast;
            hdr.tag = p.tag;
            hdr.total = p.len;
            hdr.msg_id = msg_id;
            hdr.status = FI_EOPNOTSUPP;
            push(*p.link, hdr, nullptr, 0);
        }
    }
    complete_tx(p.context, p.flags, p.len, status);
}

int Endpoint::resolve(uint64_t key, uint64_t addr, size_t len, uint64_t access, iovec *iov,
                      hmem::MemRef *mem, size_t *count) {
    if (!owner_ep_ops_) return -FI_ENOSYS;
    return owner_ep_ops_->resolve(owner_ep_, key, addr, len, access, iov, mem, count);
}

// RMA at the target: the key is checked by the owner, the copy is ours.
void Endpoint::handle_rma(const LocalHeader &hdr, std::string_view sender, const uint8_t *body) {
    auto op = static_cast<LocalOp>(hdr.op);
    const bool fragment = op == LocalOp::WriteFrag;
    const bool last = !fragment || (hdr.flags & wire::kLocalLast);
    // A staged write whose earlier fragment failed: the rest are not placed, and its last
    // fragment reports that first error, once. Nothing of a failed write counts as done.
    if (fragment && !failed_writes_.empty()) {
        auto failed = failed_writes_.find(std::make_pair(std::string(sender), hdr.msg_id));
        if (failed != failed_writes_.end()) {
            if (last || hdr.status) {
                int status = failed->second;
                failed_writes_.erase(failed);
                if (!hdr.status) finish_rma(hdr, sender, status);
            }
            return;
        }
    }
    if (hdr.status) return;  // the initiator could not copy its memory and failed the write
    // The operation failed here: the initiator hears of it once, from the last fragment of a
    // staged write (see above), at once otherwise.
    auto fail = [&](int status) {
        if (last)
            answer(sender, hdr.msg_id, status);
        else
            failed_writes_.emplace(std::make_pair(std::string(sender), hdr.msg_id), status);
    };
    bool write = op != LocalOp::Read;
    uint64_t access = write ? FI_REMOTE_WRITE : FI_REMOTE_READ;
    // The key is checked against the whole operation, also for each fragment of a staged
    // write: a write that runs past the region is refused whole, none of its fragments land.
    const size_t len = hdr.total;
    const size_t at = fragment ? hdr.offset : 0;
    if (fragment && (hdr.offset > len || hdr.size > len - hdr.offset)) {
        TANDEM_WARN(FI_LOG_EP_DATA, "dropping a write fragment outside its write\n");
        fail(FI_EINVAL);
        return;
    }
    iovec pieces[kMaxRmaPieces];
    hmem::MemRef pmem[kMaxRmaPieces];
    size_t npieces = kMaxRmaPieces;
    int ret = resolve(hdr.rma_key, hdr.rma_addr, len, access, pieces, pmem, &npieces);
    if (ret) {
        fail(ret == -FI_ENOSYS ? FI_EOPNOTSUPP : FI_EACCES);
        return;
    }
    int status = 0;
    auto *remote_iov = reinterpret_cast<const LocalIov *>(body);
    iovec remote[wire::kLocalMaxIov];
    for (size_t i = 0; i < hdr.iov_count; ++i)
        remote[i] = {reinterpret_cast<void *>(remote_iov[i].addr), remote_iov[i].length};
    // A target region in device memory: its device copies (CMA cannot reach it).
    bool device = !hmem::all_host(pmem, npieces);
    auto place = [&](const uint8_t *from, size_t k) {
        if (!device) {
            iov_scatter(pieces, npieces, at, from, k);
            return 0;
        }
        return hmem::scatter(pieces, pmem, npieces, at, from, k) == ssize_t(k) ? 0 : FI_EIO;
    };
    switch (op) {
        case LocalOp::Write:
            if (hdr.iov_count == 0) {
                status = place(body, std::min<size_t>(hdr.size, len));
            } else if (device) {
                status =
                    cma_read_staged(hdr.pid, pieces, pmem, npieces, remote, hdr.iov_count, len);
            } else {
                // A large write is copied by both sides at once, as a large message is (see
                // deliver): the initiator writes the second half while we read the first.
                size_t half = (len / 2) & ~size_t(4095);
                PeerLink *link = len >= wire::kLocalSplitMin ? link_to(sender) : nullptr;
                if (link && link->cma && send_cts(*link, hdr.msg_id, pieces, npieces, half, len)) {
                    iovec local[kMaxRmaPieces], first[wire::kLocalMaxIov];
                    size_t nlocal = iov_slice(pieces, npieces, 0, half, local, std::size(local));
                    size_t nfirst =
                        iov_slice(remote, hdr.iov_count, 0, half, first, std::size(first));
                    ssize_t got = cma_read(hdr.pid, local, nlocal, first, nfirst);
                    Split split{nullptr,          hdr, len,    half, {}, hdr.iov_count, 0,
                                FI_ADDR_NOTAVAIL, {},  npieces};
                    std::copy(remote, remote + hdr.iov_count, split.remote);
                    std::copy(pieces, pieces + npieces, split.target);
                    if (got < 0 || size_t(got) != half)
                        split.err = got == -ESRCH ? FI_ECONNRESET : FI_EIO;
                    splits_.emplace(std::make_pair(std::string(sender), hdr.msg_id), split);
                    deferred_.try_emplace(std::string(sender));
                    return;  // finished by the initiator's WriteDone
                }
                ssize_t got = cma_read(hdr.pid, pieces, npieces, remote, hdr.iov_count);
                if (got < 0 || size_t(got) != len) status = FI_EIO;
            }
            break;
        case LocalOp::WriteFrag:
            status = place(body, hdr.size);
            if (status) {
                fail(status);
                return;
            }
            break;
        case LocalOp::Read: {
            ssize_t put = -EPERM;
            if (hdr.iov_count && !device)
                put = cma_write(hdr.pid, pieces, npieces, remote, hdr.iov_count);
            if (put >= 0 && size_t(put) == len) break;
            if (put == -EPERM || put == -ENOSYS || hdr.iov_count == 0) {
                // Staged answer: the data travels back in ReadData cells.
                PeerLink *link = link_to(sender);
                if (!link) return;
                LocalHeader out = proto_;
                out.op = static_cast<uint8_t>(LocalOp::ReadData);
                out.msg_id = hdr.msg_id;
                out.total = len;
                // The access counts once the data is sent, not when a device copy failed.
                push_staged(*link, out, pieces, npieces, len, device ? pmem : nullptr,
                            {.kind = StreamEnd::Kind::ReadAccess, .rma_key = hdr.rma_key});
                return;
            }
            status = FI_EIO;
            break;
        }
        default:
            return;
    }
    if (!last) return;
    finish_rma(hdr, sender, status);
}

// The target's side of an RMA operation is over: the counters and the remote CQ data of a
// successful one, and the initiator's Fin.
void Endpoint::finish_rma(const LocalHeader &hdr, std::string_view sender, int status) {
    bool write = static_cast<LocalOp>(hdr.op) != LocalOp::Read;
    uint64_t access = write ? FI_REMOTE_WRITE : FI_REMOTE_READ;
    if (!status && owner_ep_ops_) owner_ep_ops_->access_done(owner_ep_, hdr.rma_key, access);
    if (!status && write && (hdr.flags & wire::kLocalCqData)) {
        CqWrite w{.kind = CqWrite::Kind::Entry, .src = source_of(sender)};
        w.e.flags = FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA;
        w.e.len = hdr.total;
        w.e.data = hdr.cq_data;
        write_cq(w);
    }
    answer(sender, hdr.msg_id, status);
}

}  // namespace tandem::off
