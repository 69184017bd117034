#include "nccl_plugin/vdevice.h"

#include "common/wire.h"
#include "nccl_plugin/plugin.h"

#include <algorithm>
#include <cstring>

namespace tandem::nccl {

namespace {

constexpr uint32_t kHelloMagic = 0x6f6c6876;    // "vhlo"
constexpr uint32_t kMembersMagic = 0x6d656d76;  // "vmem"
constexpr uint32_t kHandleMagic = 0x636e6976;   // "vinc"

// NCCL's handle of a virtual NIC's listen: member 0's listen handle, and the sender's progress.
struct VHandle {
    uint32_t magic;
    uint8_t ndevs;
    uint8_t reserved[3];
    uint64_t connecting;  // the sender's send comm while connecting (0 before the first call)
    uint8_t first[sizeof(wire::NcclHandle)];
};
static_assert(sizeof(VHandle) <= kHandleMaxSize);

void *as_ptr(uint64_t h) {
    return reinterpret_cast<void *>(uintptr_t(h));
}
uint64_t as_handle(const void *p) {
    return uint64_t(reinterpret_cast<uintptr_t>(p));
}

}  // namespace

VirtualDevice::VirtualDevice(uint8_t index, std::vector<NetDevice *> members, std::vector<int> ids)
    : index_(index),
      members_(std::move(members)),
      ids_(std::move(ids)),
      listens_(HandleKind::Listen, index),
      sends_(HandleKind::Send, index),
      recvs_(HandleKind::Recv, index),
      requests_(HandleKind::Request, index),
      memory_(HandleKind::Memory, index),
      sent_(members_.size()),
      received_(members_.size()) {
    // What NCCL's own transports derive for a fused NIC: the members' names joined by '+', the
    // first member's PCI path, the sum of the speeds, what all of them support, the smallest
    // message limit.
    description_ = members_[0]->description();
    description_.speed_mbps = 0;
    for (size_t i = 0; i < k(); ++i) {
        const DeviceDescription &d = members_[i]->description();
        if (i) description_.name += "+" + d.name;
        description_.speed_mbps += d.speed_mbps;
        description_.max_msg_size = std::min(description_.max_msg_size, d.max_msg_size);
        description_.hmem = description_.hmem && d.hmem;
    }
    size_t eager = 0;
    for (NetDevice *m : members_) eager = std::max(eager, m->eager_max());
    // Every part of a split message must go by RMA write (only writes land at an offset): the
    // smallest part, kStripeMin less the rounding of at most 7 parts, stays above the eager limit.
    stripe_min_ = std::max(kStripeMin, eager + 4096);
}

bool VirtualDevice::member_bytes(size_t member, uint64_t *sent, uint64_t *received) {
    std::lock_guard lk(mu_);
    if (member >= k()) return false;
    *sent = sent_[member];
    *received = received_[member];
    return true;
}

size_t VirtualDevice::open_comms() {
    std::lock_guard lk(mu_);
    return listens_.live() + sends_.live() + recvs_.live();
}

// ---- connection set-up -------------------------------------------------------------------------

Result VirtualDevice::listen(void *handle, void **listen_comm) {
    if (!handle || !listen_comm) WARN_RETURN(kInternalError, "NET/tandem: listen without a handle");
    std::lock_guard lk(mu_);
    auto l = std::make_unique<ListenComm>();
    l->listens.assign(k(), nullptr);
    l->handles.resize(k());
    l->recvs.assign(k(), nullptr);
    for (size_t i = 0; i < k(); ++i) {
        if (Result r = members_[i]->listen(l->handles[i].data(), &l->listens[i])) {
            for (size_t j = 0; j < i; ++j) members_[j]->close_listen(l->listens[j]);
            return r;
        }
    }
    VHandle out{};
    out.magic = kHandleMagic;
    out.ndevs = uint8_t(k());
    std::memcpy(out.first, l->handles[0].data(), sizeof out.first);
    std::memset(handle, 0, kHandleMaxSize);
    std::memcpy(handle, &out, sizeof out);
    *listen_comm = as_ptr(listens_.add(std::move(l)));
    return kSuccess;
}

template <typename M>
Result VirtualDevice::post_control(Control<M> &c, NetDevice *dev, bool send) {
    if (!c.mh)
        if (Result r = dev->reg_mr(c.comm, c.msg.get(), sizeof(M), kPtrHost, &c.mh)) return r;
    if (c.req) return kSuccess;
    if (send) return dev->isend(c.comm, c.msg.get(), sizeof(M), kBootTag, c.mh, &c.req);
    void *data = c.msg.get();
    size_t size = sizeof(M);
    int tag = kBootTag;
    return dev->irecv(c.comm, 1, &data, &size, &tag, &c.mh, &c.req);
}

// *done once the message has gone or arrived; its registration is released then.
template <typename M>
Result VirtualDevice::finish_control(Control<M> &c, NetDevice *dev, bool *done) {
    *done = false;
    if (!c.req) return kSuccess;  // not posted yet (no room): the caller posts it again
    int finished = 0;
    if (Result r = dev->test(c.req, &finished, nullptr)) return r;
    if (!finished) return kSuccess;
    c.req = nullptr;
    if (Result r = dev->dereg_mr(c.comm, c.mh)) return r;
    c.mh = nullptr;
    *done = true;
    return kSuccess;
}

// Sender, after member 0 connected: a reverse listen on member 0, its handle in the hello.
Result VirtualDevice::send_hello(SendComm &s) {
    NetDevice *dev = members_[0];
    if (!s.rev_listen) {
        if (Result r = dev->listen(s.hello.msg->reverse.data(), &s.rev_listen)) return r;
        s.hello.msg->magic = kHelloMagic;
        s.hello.msg->ndevs = uint32_t(k());
        s.hello.comm = s.comms[0];
    }
    if (Result r = post_control(s.hello, dev, true)) return r;
    if (s.hello.req) s.stage = 1;
    return kSuccess;
}

// Sender: the receiver's connection back, and on it the listen handles of members 1..k-1.
Result VirtualDevice::receive_handles(SendComm &s) {
    NetDevice *dev = members_[0];
    if (!s.rev_recv) {
        if (Result r = dev->accept(s.rev_listen, &s.rev_recv)) return r;
        if (!s.rev_recv) return kSuccess;
        s.in.comm = s.rev_recv;
    }
    if (Result r = post_control(s.in, dev, false)) return r;
    bool done = false;
    if (Result r = finish_control(s.in, dev, &done)) return r;
    if (!done) return kSuccess;
    const MemberHandles &m = *s.in.msg;
    if (m.magic != kMembersMagic || m.count != k() - 1)
        WARN_RETURN(kSystemError,
                    "NET/tandem %s: connect: the receiver's member handles are malformed (%u "
                    "for %zu members): both ends must fuse as many devices",
                    description_.name.c_str(), m.count, k());
    for (size_t i = 1; i < k(); ++i) s.handles[i] = m.handles[i - 1];
    dev->close_recv(s.rev_recv);
    dev->close_listen(s.rev_listen);
    s.rev_recv = s.rev_listen = nullptr;
    s.stage = 2;
    return kSuccess;
}

Result VirtualDevice::connect_step(SendComm &s) {
    if (!s.comms[0]) {
        if (Result r = members_[0]->connect(s.handles[0].data(), &s.comms[0])) return r;
        if (!s.comms[0]) return kSuccess;
    }
    if (s.stage == 0 && k() > 1)
        if (Result r = send_hello(s); r || s.stage == 0) return r;
    if (s.stage == 1)
        if (Result r = receive_handles(s); r || s.stage == 1) return r;
    bool all = true;
    for (size_t i = 1; i < k(); ++i) {
        if (s.comms[i]) continue;
        if (Result r = members_[i]->connect(s.handles[i].data(), &s.comms[i])) return r;
        all = all && s.comms[i];
    }
    if (!all) return kSuccess;
    if (k() > 1) {
        bool done = false;
        if (Result r = finish_control(s.hello, members_[0], &done)) return r;
        if (!done) return kSuccess;
    }
    s.ready = true;
    return kSuccess;
}

Result VirtualDevice::connect(void *handle, void **send_comm) {
    if (!handle || !send_comm) WARN_RETURN(kInternalError, "NET/tandem: connect without a handle");
    *send_comm = nullptr;
    VHandle in;
    std::memcpy(&in, handle, sizeof in);
    if (in.magic != kHandleMagic || in.ndevs != k())
        WARN_RETURN(kInvalidUsage,
                    "NET/tandem %s: connect: the handle is no listen handle of a virtual NIC of "
                    "%zu devices (magic %#x, %u devices)",
                    description_.name.c_str(), k(), in.magic, in.ndevs);
    std::lock_guard lk(mu_);
    SendComm *s = in.connecting ? sends_.find(in.connecting) : nullptr;
    if (in.connecting && (!s || s->ready))
        WARN_RETURN(kInvalidUsage, "NET/tandem: connect: the handle names no connection under way");
    if (!s) {
        auto fresh = std::make_unique<SendComm>();
        fresh->comms.assign(k(), nullptr);
        fresh->handles.resize(k());
        std::memcpy(fresh->handles[0].data(), in.first, sizeof in.first);
        in.connecting = sends_.add(std::move(fresh));
        std::memcpy(handle, &in, sizeof in);
        s = sends_.find(in.connecting);
    }
    if (Result r = connect_step(*s)) {
        for (size_t i = 0; i < k(); ++i)
            if (s->comms[i]) members_[i]->close_send(s->comms[i]);
        if (s->rev_recv) members_[0]->close_recv(s->rev_recv);
        if (s->rev_listen) members_[0]->close_listen(s->rev_listen);
        sends_.remove(in.connecting);
        in.connecting = 0;
        std::memcpy(handle, &in, sizeof in);
        return r;
    }
    if (s->ready) *send_comm = as_ptr(in.connecting);
    return kSuccess;
}

// Receiver, after member 0 accepted: the hello, then a connection back to the sender.
Result VirtualDevice::receive_hello(ListenComm &l) {
    NetDevice *dev = members_[0];
    l.hello.comm = l.recvs[0];
    if (Result r = post_control(l.hello, dev, false)) return r;
    bool done = false;
    if (Result r = finish_control(l.hello, dev, &done)) return r;
    if (!done) return kSuccess;
    if (l.hello.msg->magic != kHelloMagic || l.hello.msg->ndevs != k())
        WARN_RETURN(kSystemError,
                    "NET/tandem %s: accept: the sender's hello is malformed (%u devices for "
                    "%zu): both ends must fuse as many devices",
                    description_.name.c_str(), l.hello.msg->ndevs, k());
    l.reverse = l.hello.msg->reverse;
    l.stage = 1;
    return kSuccess;
}

Result VirtualDevice::send_handles(ListenComm &l) {
    NetDevice *dev = members_[0];
    if (!l.rev_send) {
        if (Result r = dev->connect(l.reverse.data(), &l.rev_send)) return r;
        if (!l.rev_send) return kSuccess;
        l.out.comm = l.rev_send;
        l.out.msg->magic = kMembersMagic;
        l.out.msg->count = uint32_t(k() - 1);
        for (size_t i = 1; i < k(); ++i) l.out.msg->handles[i - 1] = l.handles[i];
    }
    if (Result r = post_control(l.out, dev, true)) return r;
    if (l.out.req) l.stage = 2;
    return kSuccess;
}

Result VirtualDevice::accept_step(ListenComm &l) {
    if (!l.recvs[0]) {
        if (Result r = members_[0]->accept(l.listens[0], &l.recvs[0])) return r;
        if (!l.recvs[0]) return kSuccess;
    }
    if (l.stage == 0 && k() > 1)
        if (Result r = receive_hello(l); r || l.stage == 0) return r;
    if (l.stage == 1)
        if (Result r = send_handles(l); r || l.stage == 1) return r;
    bool all = true;
    for (size_t i = 1; i < k(); ++i) {
        if (l.recvs[i]) continue;
        if (Result r = members_[i]->accept(l.listens[i], &l.recvs[i])) return r;
        all = all && l.recvs[i];
    }
    if (!all) return kSuccess;
    if (k() > 1) {
        bool done = false;
        if (Result r = finish_control(l.out, members_[0], &done)) return r;
        if (!done) return kSuccess;
        members_[0]->close_send(l.rev_send);
        l.rev_send = nullptr;
    }
    l.accepted = true;
    return kSuccess;
}

Result VirtualDevice::accept(void *listen_comm, void **recv_comm) {
    if (!recv_comm) WARN_RETURN(kInternalError, "NET/tandem: accept without an output");
    *recv_comm = nullptr;
    std::lock_guard lk(mu_);
    ListenComm *l = listens_.find(listen_comm);
    if (!l) WARN_RETURN(kInvalidUsage, "NET/tandem: accept: %p is no listen comm", listen_comm);
    if (l->accepted)
        WARN_RETURN(kInvalidUsage, "NET/tandem: accept: this listen comm already accepted");
    if (Result r = accept_step(*l)) return r;
    if (!l->accepted) return kSuccess;
    auto rc = std::make_unique<RecvComm>();
    rc->comms = l->recvs;
    *recv_comm = as_ptr(recvs_.add(std::move(rc)));
    return kSuccess;
}

// ---- memory ------------------------------------------------------------------------------------

Result VirtualDevice::reg_each(void *comm, void **mhandle,
                               const std::function<Result(size_t, void *, void **)> &reg) {
    if (!mhandle) WARN_RETURN(kInternalError, "NET/tandem: regMr without an output");
    std::lock_guard lk(mu_);
    const std::vector<void *> *comms = nullptr;
    if (SendComm *s = sends_.find(comm); s && s->ready) comms = &s->comms;
    if (RecvComm *r = recvs_.find(comm)) comms = &r->comms;
    if (!comms)
        WARN_RETURN(kInvalidUsage, "NET/tandem: regMr: %p is no send or receive comm", comm);
    auto m = std::make_unique<MemHandle>();
    m->mh.assign(k(), nullptr);
    for (size_t i = 0; i < k(); ++i) {
        if (Result r = reg(i, (*comms)[i], &m->mh[i])) {
            for (size_t j = 0; j < i; ++j) members_[j]->dereg_mr((*comms)[j], m->mh[j]);
            return r;
        }
    }
    *mhandle = as_ptr(memory_.add(std::move(m)));
    return kSuccess;
}

Result VirtualDevice::reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
    return reg_each(comm, mhandle, [&](size_t i, void *c, void **mh) {
        return members_[i]->reg_mr(c, data, size, type, mh);
    });
}

Result VirtualDevice::reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset,
                                    int fd, void **mhandle) {
    return reg_each(comm, mhandle, [&](size_t i, void *c, void **mh) {
        return members_[i]->reg_mr_dmabuf(c, data, size, type, offset, fd, mh);
    });
}

// A member refusing (its registration still in use) keeps the handle, with what is left of it,
// for another deregMr.
Result VirtualDevice::dereg_mr(void *comm, void *mhandle) {
    std::lock_guard lk(mu_);
    MemHandle *m = memory_.find(mhandle);
    if (!m) WARN_RETURN(kInvalidUsage, "NET/tandem: deregMr: %p is no memory handle", mhandle);
    (void)comm;  // the members' registrations are their domains'
    for (size_t i = 0; i < k(); ++i) {
        if (!m->mh[i]) continue;
        if (Result r = members_[i]->dereg_mr(nullptr, m->mh[i])) return r;
        m->mh[i] = nullptr;
    }
    memory_.remove(as_handle(mhandle));
    return kSuccess;
}

// ---- data --------------------------------------------------------------------------------------

// The parts of one message, queued in member order after those of earlier messages.
void VirtualDevice::plan(SendComm &s, uint64_t rh, char *data, size_t size, int tag,
                         const MemHandle *m) {
    const size_t parts = std::clamp<size_t>(size / stripe_min_, 1, k());
    const size_t first = size_t(s.next_member++ % k());
    const size_t part = parts == 1 ? size : ((size + parts - 1) / parts + 63) & ~size_t(63);
    size_t offset = 0;
    for (size_t j = 0; j < k(); ++j) {
        const size_t member = (first + j) % k();
        const size_t len = j < parts ? std::min(part, size - offset) : 0;
        s.queue.push_back({rh, int(member), data + (len ? offset : 0), len, len ? offset : 0, tag,
                           m ? m->mh[member] : nullptr});
        offset += len;
    }
}

// Hands queued parts to their members, in order, until one has no room.
void VirtualDevice::pump(SendComm &s) {
    while (!s.queue.empty()) {
        const Part &p = s.queue.front();
        Request *r = requests_.find(p.request);
        if (r) {
            void *req = nullptr;
            Result rc = members_[p.member]->isend_at(s.comms[p.member], p.data, p.size, p.offset,
                                                     p.tag, p.mhandle, &req);
            if (rc == kSuccess && !req) return;  // no room: test tries again
            if (rc)
                part_done(*r, p.member, rc, nullptr);
            else
                r->parts[p.member] = req;
            r->bytes[p.member] = p.size;
        }
        s.queue.pop_front();
    }
}

Result VirtualDevice::isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                            void **request) {
    if (!request) WARN_RETURN(kInternalError, "NET/tandem: isend without an output");
    *request = nullptr;
    std::lock_guard lk(mu_);
    SendComm *s = sends_.find(send_comm);
    if (!s || !s->ready)
        WARN_RETURN(kInvalidUsage, "NET/tandem: isend: %p is no connected send comm", send_comm);
    MemHandle *m = mhandle ? memory_.find(mhandle) : nullptr;
    if (mhandle && !m)
        WARN_RETURN(kInvalidUsage, "NET/tandem: isend: %p is no memory handle", mhandle);
    if (size > description_.max_msg_size)
        WARN_RETURN(kInternalError, "NET/tandem: isend of %zu B: more than maxP2pBytes", size);
    // One request of each member per message: within the members' own limit, they never refuse
    // for want of requests.
    if (s->inflight >= kMaxRequests * kMaxRecvs) return kSuccess;  // NCCL asks again
    uint64_t rh;
    Request *r = requests_.emplace(&rh);
    r->comm = as_handle(send_comm);
    r->send = true;
    r->pending = int(k());
    r->sizes[0] = int(size);
    plan(*s, rh, static_cast<char *>(data), size, tag, m);
    ++s->inflight;
    pump(*s);
    *request = as_ptr(rh);
    return kSuccess;
}

Result VirtualDevice::irecv(void *recv_comm, int n, void **data, const size_t *sizes,
                            const int *tags, void **mhandles, void **request) {
    if (!request) WARN_RETURN(kInternalError, "NET/tandem: irecv without an output");
    *request = nullptr;
    if (n < 1 || n > kMaxRecvs || !data || !sizes || !tags || !mhandles)
        WARN_RETURN(kInternalError,
                    "NET/tandem: irecv of %d buffers (maxRecvs is %d), or no arrays", n, kMaxRecvs);
    std::lock_guard lk(mu_);
    RecvComm *c = recvs_.find(recv_comm);
    if (!c) WARN_RETURN(kInvalidUsage, "NET/tandem: irecv: %p is no receive comm", recv_comm);
    MemHandle *mems[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
        mems[i] = mhandles[i] ? memory_.find(mhandles[i]) : nullptr;
        if (mhandles[i] && !mems[i])
            WARN_RETURN(kInvalidUsage, "NET/tandem: irecv: %p is no memory handle", mhandles[i]);
    }
    if (c->inflight >= kMaxRequests) return kSuccess;  // the members' limit: NCCL asks again
    uint64_t rh;
    Request *r = requests_.emplace(&rh);
    r->comm = as_handle(recv_comm);
    r->n = n;
    r->pending = int(k());
    for (size_t j = 0; j < k(); ++j) {
        void *mhs[kMaxRecvs];
        for (int i = 0; i < n; ++i) mhs[i] = mems[i] ? mems[i]->mh[j] : nullptr;
        void *req = nullptr;
        Result rc = members_[j]->irecv(c->comms[j], n, data, sizes, tags, mhs, &req);
        if (rc == kSuccess && !req) {
            NCCL_TANDEM_WARN("NET/tandem %s: irecv: member %zu had no room",
                             description_.name.c_str(), j);
            rc = kInternalError;
        }
        if (rc)
            part_done(*r, int(j), rc, nullptr);
        else
            r->parts[j] = req;
    }
    ++c->inflight;
    *request = as_ptr(rh);
    return kSuccess;
}

// The members' receives complete once their data is in place: nothing to flush here either.
Result VirtualDevice::iflush(void *recv_comm, int n, void **mhandles, void **request) {
    return flush_nothing(mu_, recvs_, memory_, recv_comm, n, mhandles, request);
}

void VirtualDevice::part_done(Request &r, int member, Result rc, const int *sizes) {
    r.parts[size_t(member)] = nullptr;
    --r.pending;
    if (rc && r.error == kSuccess) r.error = rc;
    if (rc) return;
    if (r.send) {
        sent_[size_t(member)] += r.bytes[size_t(member)];
        return;
    }
    for (int i = 0; i < r.n; ++i) {
        r.sizes[size_t(i)] += sizes[i];
        received_[size_t(member)] += uint64_t(sizes[i]);
    }
}

Result VirtualDevice::test(void *request, int *done, int *sizes) {
    if (!done) WARN_RETURN(kInternalError, "NET/tandem: test without an output");
    *done = 0;
    std::lock_guard lk(mu_);
    Request *r = requests_.find(request);
    if (!r)
        WARN_RETURN(kInvalidUsage,
                    "NET/tandem: test: %p is no request under way (already completed, or its "
                    "comm was closed)",
                    request);
    if (r->send)
        if (SendComm *s = sends_.find(r->comm)) pump(*s);
    for (size_t j = 0; j < k(); ++j) {
        if (!r->parts[j]) continue;
        int finished = 0, got[kMaxRecvs] = {};
        Result rc = members_[j]->test(r->parts[j], &finished, got);
        if (rc || finished) part_done(*r, int(j), rc, got);
    }
    if (r->pending > 0) return kSuccess;
    if (r->send)
        if (SendComm *s = sends_.find(r->comm)) --s->inflight;
    if (!r->send)
        if (RecvComm *c = recvs_.find(r->comm)) --c->inflight;
    Result error = r->error;
    if (error == kSuccess && sizes)
        for (int i = 0; i < r->n; ++i) sizes[i] = r->sizes[size_t(i)];
    requests_.remove(as_handle(request), true);
    *done = 1;
    return error;
}

// ---- closing -----------------------------------------------------------------------------------

void VirtualDevice::drop_requests(uint64_t comm) {
    std::vector<uint64_t> orphans;
    requests_.for_each_handle([&](uint64_t rh, Request &r) {
        if (r.comm == comm) orphans.push_back(rh);
    });
    for (uint64_t rh : orphans) requests_.remove(rh, true);
}

Result VirtualDevice::close_send(void *send_comm) {
    std::lock_guard lk(mu_);
    SendComm *s = sends_.find(send_comm);
    if (!s) WARN_RETURN(kInvalidUsage, "NET/tandem: closeSend: %p is no send comm", send_comm);
    for (size_t i = 0; i < k(); ++i)
        if (s->comms[i]) members_[i]->close_send(s->comms[i]);
    if (s->rev_recv) members_[0]->close_recv(s->rev_recv);
    if (s->rev_listen) members_[0]->close_listen(s->rev_listen);
    for (size_t i = 0; i < k(); ++i)
        NCCL_TANDEM_INFO("NET/tandem %s: member %zu (%s) has sent %llu B",
                         description_.name.c_str(), i, members_[i]->description().name.c_str(),
                         (unsigned long long)sent_[i]);
    drop_requests(as_handle(send_comm));
    sends_.remove(as_handle(send_comm));
    return kSuccess;
}

Result VirtualDevice::close_recv(void *recv_comm) {
    std::lock_guard lk(mu_);
    RecvComm *c = recvs_.find(recv_comm);
    if (!c) WARN_RETURN(kInvalidUsage, "NET/tandem: closeRecv: %p is no receive comm", recv_comm);
    for (size_t i = 0; i < k(); ++i) {
        members_[i]->close_recv(c->comms[i]);
        NCCL_TANDEM_INFO("NET/tandem %s: member %zu (%s) has received %llu B",
                         description_.name.c_str(), i, members_[i]->description().name.c_str(),
                         (unsigned long long)received_[i]);
    }
    drop_requests(as_handle(recv_comm));
    recvs_.remove(as_handle(recv_comm));
    return kSuccess;
}

Result VirtualDevice::close_listen(void *listen_comm) {
    std::lock_guard lk(mu_);
    ListenComm *l = listens_.find(listen_comm);
    if (!l)
        WARN_RETURN(kInvalidUsage, "NET/tandem: closeListen: %p is no listen comm", listen_comm);
    for (size_t i = 0; i < k(); ++i) {
        members_[i]->close_listen(l->listens[i]);
        // Accepted, but never handed to NCCL: the set-up did not finish.
        if (!l->accepted && l->recvs[i]) members_[i]->close_recv(l->recvs[i]);
    }
    if (l->rev_send) members_[0]->close_send(l->rev_send);
    listens_.remove(as_handle(listen_comm));
    return kSuccess;
}

}  // namespace tandem::nccl
