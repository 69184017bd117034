// The emulated RDMA device of the tests: libtandem-emurdma.so (test code, never shipped, never
// installed as libibverbs.so.1). It defines the part of libibverbs and librdmacm that an RC link
// uses, as the real C functions over the system's rdma-core headers (real struct layouts, the
// header's inline calls going through context->ops), so verbs code runs unchanged once it looks
// the functions up in this library (dlopen + dlsym by plain name). Linked -Bsymbolic with hidden
// internals: its own calls never land in a real libibverbs loaded next to it.
//
// Emulated, with a real RC device's semantics:
// - One device, emu_rdma0, port 1, RoCE-like (Ethernet link layer), serving the addresses of one
//   network interface (EMURDMA_NETDEV, default lo). Connections between processes of one host
//   and within a process: each connection is one Unix stream socket between two QPs; a listener
//   is an abstract Unix socket named after its IP and port (so per network namespace, like IP),
//   ports come from the emulator's own port space (one abstract name per port).
// - Each open context has a NIC: a thread that moves data asynchronously, as an RNIC does. It
//   executes a QP's work requests in order, checks lkeys/rkeys, bounds and access, writes local
//   memory, consumes receive WQEs (QP or SRQ, in posting order), makes CQEs, waits for a receive
//   (RNR) with the requester's rnr_retry and the responder's min_rnr_timer, and moves QPs to the
//   error state where real RC does (local/remote protection and length errors, RNR retries
//   exceeded, a peer that failed or vanished), flushing their work. The app's own data-path
//   calls drive the same NIC while it polls (as a kernel-bypass provider's would): ibv_poll_cq
//   does a pass of the NIC's work for its context, ibv_post_send transmits on the spot, so a
//   busy-polling app does not wait for the NIC thread to be scheduled; the NIC thread does
//   everything when the app makes no call (an RDMA READ is served with the target idle).
// - rdma_cm: address and route resolution, listen/connect/accept/reject with IB CM's private
//   data limits and padding (56/196/148 bytes, delivered zero-padded to that size), disconnect,
//   event channels, rdma_migrate_id; IB CM's reject reasons (8: nobody listens, 28: rdma_reject).
// - Completion channels, CQ overrun (IBV_EVENT_CQ_ERR), async events, dma-buf MRs (the fd is
//   mapped here and data moves through the mapping; the iova is never touched), and fault
//   injection (emurdma_control.h).
//
// Not emulated: real DMA or kernel bypass (every byte is copied through the socket by the NIC
// thread or the app's calls), more than one host, UD/UC/XRC QPs, atomics, memory windows,
// ibv_create_qp outside rdma_cm, rdma_cm's synchronous mode (NULL event channel), rdma_cm ids over
// AF_IB, the extended verbs (context->abi_compat is not extended, so ibv_*_ex inlines report no
// support), on-demand paging and page pinning (a registered range must stay mapped while
// registered). The port space is per port number: two ids cannot bind one port on two different
// addresses.
//
// After fork() the child starts with a fresh, empty device (objects made before the fork are not
// usable there, as with verbs without ibv_fork_init): its copy of the parent's sockets is closed,
// so the parent's peers still see the parent alone.
#include "tests/emurdma/emurdma.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

EMURDMA_API ibv_device **ibv_get_device_list(int *num_devices);
EMURDMA_API void ibv_free_device_list(ibv_device **list);
EMURDMA_API const char *ibv_get_device_name(ibv_device *device);
EMURDMA_API __be64 ibv_get_device_guid(ibv_device *device);
EMURDMA_API ibv_context *ibv_open_device(ibv_device *device);
EMURDMA_API int ibv_close_device(ibv_context *context);
EMURDMA_API int ibv_query_device(ibv_context *context, ibv_device_attr *attr);
EMURDMA_API int ibv_query_port(ibv_context *context, uint8_t port_num,
                               struct _compat_ibv_port_attr *port_attr);
EMURDMA_API int ibv_query_gid(ibv_context *context, uint8_t port_num, int index, ibv_gid *gid);
EMURDMA_API ibv_pd *ibv_alloc_pd(ibv_context *context);
EMURDMA_API int ibv_dealloc_pd(ibv_pd *pd);
EMURDMA_API ibv_mr *ibv_reg_mr(ibv_pd *pd, void *addr, size_t length, int access);
EMURDMA_API ibv_mr *ibv_reg_mr_iova2(ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                     unsigned int access);
EMURDMA_API ibv_mr *ibv_reg_dmabuf_mr(ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
                                      int fd, int access);
EMURDMA_API int ibv_dereg_mr(ibv_mr *mr);
EMURDMA_API ibv_comp_channel *ibv_create_comp_channel(ibv_context *context);
EMURDMA_API int ibv_destroy_comp_channel(ibv_comp_channel *channel);
EMURDMA_API ibv_cq *ibv_create_cq(ibv_context *context, int cqe, void *cq_context,
                                  ibv_comp_channel *channel, int comp_vector);
EMURDMA_API int ibv_destroy_cq(ibv_cq *cq);
EMURDMA_API int ibv_get_cq_event(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context);
EMURDMA_API void ibv_ack_cq_events(ibv_cq *cq, unsigned int nevents);
EMURDMA_API ibv_srq *ibv_create_srq(ibv_pd *pd, ibv_srq_init_attr *srq_init_attr);
EMURDMA_API int ibv_destroy_srq(ibv_srq *srq);
EMURDMA_API int ibv_modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask);
EMURDMA_API int ibv_query_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask,
                             ibv_qp_init_attr *init_attr);
EMURDMA_API int ibv_destroy_qp(ibv_qp *qp);
EMURDMA_API const char *ibv_wc_status_str(ibv_wc_status status);
EMURDMA_API const char *ibv_event_type_str(ibv_event_type event);
EMURDMA_API int ibv_get_async_event(ibv_context *context, ibv_async_event *event);
EMURDMA_API void ibv_ack_async_event(ibv_async_event *event);

namespace emurdma {

namespace {

// The failure of a verbs call that returns an object: NULL, with errno saying why.
std::nullptr_t fail_null(int err) {
    errno = err;
    return nullptr;
}

// The mutex and condition variable in the public struct of a CQ, SRQ or QP: libibverbs' own,
// for its callers (the emulator's locking is State::mu), made and destroyed with the object.
template <class Pub>
void init_pub_sync(Pub &pub) {
    pthread_mutex_init(&pub.mutex, nullptr);
    pthread_cond_init(&pub.cond, nullptr);
}

template <class Pub>
void destroy_pub_sync(Pub &pub) {
    pthread_cond_destroy(&pub.cond);
    pthread_mutex_destroy(&pub.mutex);
}

State *g_state = nullptr;
pthread_once_t g_once = PTHREAD_ONCE_INIT;

void read_env(State &s) {
    if (const char *v = getenv("EMURDMA_NETDEV"); v && *v) {
        s.netdevs.clear();
        std::string list = v;
        for (size_t at = 0; at <= list.size();) {
            size_t comma = std::min(list.find(',', at), list.size());
            if (comma > at) s.netdevs.push_back(list.substr(at, comma - at));
            at = comma + 1;
        }
    }
    if (const char *v = getenv("EMURDMA_MAX_INLINE"); v && *v)
        s.max_inline = std::clamp(atoi(v), 0, 1 << 20);
    if (const char *v = getenv("EMURDMA_MAX_SGE"); v && *v) s.max_sge = std::clamp(atoi(v), 1, 64);
    if (const char *v = getenv("EMURDMA_FAULT"); v && *v) {
        constexpr char kAfter[] = "qp_error_after:";
        if (strncmp(v, kAfter, sizeof(kAfter) - 1) == 0)
            s.fault_after = strtoull(v + sizeof(kAfter) - 1, nullptr, 10);
    }
}

// fork(): the child must not hold the parent's connections (its peers would never see the
// parent die) nor its names (listeners, ports), and has no NIC threads. It drops the old state
// (still locked by the prepare handler, so it was consistent at the fork) and starts afresh.
void atfork_prepare() {
    g_state->mu.lock();
}
void atfork_parent() {
    g_state->mu.unlock();
}
void atfork_child() {
    State *old = g_state;
    auto close_fd = [](int fd) {
        if (fd >= 0) close(fd);
    };
    for (Context *c : old->contexts) {
        close_fd(c->wake_fd);
        close_fd(c->ep);
        for (auto &[serial, id] : c->ids) {
            close_fd(id->sock);
            close_fd(id->listen_fd);
        }
    }
    for (CmId *id : old->ids) close_fd(id->port_fd);
    g_state = new State;
    read_env(*g_state);
}

void init_state() {
    g_state = new State;  // never freed: NIC threads may still run while the process exits
    read_env(*g_state);
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

ibv_device make_device() {
    ibv_device d;
    memset(&d, 0, sizeof(d));
    d.node_type = IBV_NODE_CA;
    d.transport_type = IBV_TRANSPORT_IB;
    snprintf(d.name, sizeof(d.name), "%s", kDeviceName);
    snprintf(d.dev_name, sizeof(d.dev_name), "%s", kDeviceName);
    snprintf(d.dev_path, sizeof(d.dev_path), "/sys/class/infiniband_verbs/%s", kDeviceName);
    snprintf(d.ibdev_path, sizeof(d.ibdev_path), "/sys/class/infiniband/%s", kDeviceName);
    return d;
}

int op_poll_cq(ibv_cq *ibcq, int num_entries, ibv_wc *wc);
int op_req_notify_cq(ibv_cq *ibcq, int solicited_only);
int op_post_send(ibv_qp *ibqp, ibv_send_wr *wr, ibv_send_wr **bad_wr);
int op_post_recv(ibv_qp *ibqp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr);
int op_post_srq_recv(ibv_srq *ibsrq, ibv_recv_wr *wr, ibv_recv_wr **bad_wr);

bool is_ours(ibv_device *d) {
    return d == &g_device;
}

constexpr unsigned kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                  IBV_ACCESS_MW_BIND | IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB;

bool access_valid(unsigned access) {
    access &= ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE);
    if (access & ~kKnownAccess) return false;
    // Remote writes and atomics need the local write right too (as the verbs spec says).
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(access & IBV_ACCESS_LOCAL_WRITE))
        return false;
    return true;
}

bool lkey_taken(std::uint32_t k) {
    return S().lkeys.count(k) || S().rkeys.count(k);
}

// Registers a region whose addresses base..base+length live at host in this process.
ibv_mr *new_mr(Pd *pd, std::uint64_t base, std::uint64_t length, std::uint8_t *host, int access,
               void *map_addr, std::size_t map_len) {
    State &s = S();
    auto *mr = new_object<Mr>();
    mr->pd = pd;
    mr->base = base;
    mr->length = length;
    mr->host = host;
    mr->access = access;
    mr->map_addr = map_addr;
    mr->map_len = map_len;
    mr->pub.context = &pd->ctx->pub;
    mr->pub.pd = &pd->pub;
    mr->pub.addr = reinterpret_cast<void *>(base);
    mr->pub.length = length;
    mr->pub.lkey = random_key(lkey_taken);
    s.lkeys[mr->pub.lkey] = mr;
    mr->pub.rkey = random_key(lkey_taken);
    s.rkeys[mr->pub.rkey] = mr;
    mr->pub.handle = mr->pub.lkey;
    pd->users++;
    s.stats.mrs_registered++;
    return &mr->pub;
}

ibv_mr *reg_host(ibv_pd *ibpd, void *addr, size_t length, std::uint64_t iova, unsigned access) {
    std::lock_guard lk(S().mu);
    auto *pd = reinterpret_cast<Pd *>(ibpd);
    if (!pd || !addr || length == 0 || length > kMaxMrSize || !access_valid(access))
        return fail_null(EINVAL);
    if (pd->ctx->dead) return fail_null(EIO);
    return new_mr(pd, iova, length, static_cast<std::uint8_t *>(addr), static_cast<int>(access),
                  nullptr, 0);
}

}  // namespace

State &S() {
    pthread_once(&g_once, init_state);
    return *g_state;
}

ibv_device g_device = make_device();

void sig_raise(int fd) {
    std::uint64_t one = 1;
    if (write(fd, &one, sizeof(one)) < 0) {
        // The count cannot overflow (< 2^64 - 1 events): nothing to do.
    }
}

void sig_lower(int fd) {
    // The count is at least one here (it equals the queue length), so this never blocks.
    std::uint64_t v;
    if (read(fd, &v, sizeof(v)) < 0) {
    }
}

bool fd_nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl >= 0 && (fl & O_NONBLOCK);
}

std::uint32_t random_key(bool (*taken)(std::uint32_t)) {
    for (;;) {
        std::uint32_t k = 0;
        if (getrandom(&k, sizeof(k), 0) != sizeof(k)) k = static_cast<std::uint32_t>(random());
        if (k != 0 && !taken(k)) return k;
    }
}

Context *open_context() {
    State &s = S();
    auto *c = new_object<Context>();
    c->pub.device = &g_device;
    c->pub.ops.poll_cq = op_poll_cq;
    c->pub.ops.req_notify_cq = op_req_notify_cq;
    c->pub.ops.post_send = op_post_send;
    c->pub.ops.post_recv = op_post_recv;
    c->pub.ops.post_srq_recv = op_post_srq_recv;
    c->pub.cmd_fd = -1;
    c->pub.async_fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
    c->pub.num_comp_vectors = 1;
    pthread_mutex_init(&c->pub.mutex, nullptr);
    c->pub.abi_compat = nullptr;  // not a verbs_context: the extended inlines see no support
    c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    c->ep = epoll_create1(EPOLL_CLOEXEC);
    if (c->pub.async_fd < 0 || c->wake_fd < 0 || c->ep < 0) {
        int err = errno;
        if (c->pub.async_fd >= 0) close(c->pub.async_fd);
        if (c->wake_fd >= 0) close(c->wake_fd);
        if (c->ep >= 0) close(c->ep);
        delete c;
        errno = err;
        return nullptr;
    }
    c->nic = std::thread(nic_main, c);
    s.contexts.push_back(c);
    return c;
}

Context *cm_context() {
    State &s = S();
    if (!s.cm_ctx || s.cm_ctx->dead) {
        s.cm_ctx = open_context();
        if (s.cm_ctx) s.cm_ctx->cm_owned = true;
    }
    return s.cm_ctx;
}

Mr *find_mr(Pd *pd, std::uint32_t lkey) {
    auto &m = S().lkeys;
    auto it = m.find(lkey);
    if (it == m.end() || it->second->pd != pd) return nullptr;
    return it->second;
}

std::uint8_t *mr_span(Mr *mr, std::uint64_t addr, std::uint64_t len) {
    if (addr < mr->base || len > mr->length || addr - mr->base > mr->length - len) return nullptr;
    return mr->host + (addr - mr->base);
}

void push_cqe(Cq *cq, const ibv_wc &wc) {
    if (cq->overrun) return;
    if (static_cast<int>(cq->q.size()) >= cq->cap) {
        // CQ overrun: the CQ is in error from now on and the owner learns it asynchronously.
        cq->overrun = true;
        ibv_async_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.event_type = IBV_EVENT_CQ_ERR;
        ev.element.cq = &cq->pub;
        queue_async(cq->ctx, ev);
        return;
    }
    cq->q.push_back(wc);
    if (cq->armed && cq->ch) {
        cq->armed = false;
        cq->ch->q.push_back(cq);
        sig_raise(cq->ch->pub.fd);
        cq->ch->cv.notify_all();
    }
}

void queue_async(Context *ctx, ibv_async_event ev) {
    ctx->async_q.push_back(ev);
    sig_raise(ctx->pub.async_fd);
    ctx->async_cv.notify_all();
}

void destroy_qp_locked(Qp *qp) {
    State &s = S();
    if (CmId *id = qp->id) {
        id->qp = nullptr;
        id->pub.qp = nullptr;
        id->rx_reqs.clear();
        id->rnr_armed = false;
        // The peer's requests will find nobody to answer them.
        if (qp->pub.state != IBV_QPS_ERR && id->sock >= 0 &&
            (id->state == CmState::kEstablished || id->state == CmState::kAccepted)) {
            Hdr h{};
            h.type = kQpErr;
            send_frame(id, h, nullptr, 0);
            wake(id->ctx);
        }
    }
    qp->scq->users--;
    qp->rcq->users--;
    if (qp->srq) qp->srq->users--;
    qp->pd->users--;
    s.qps.erase(qp->pub.qp_num);
    s.stats.qps--;
    destroy_pub_sync(qp->pub);
    delete qp;
}

namespace {

bool qpn_taken(std::uint32_t n) {
    return (n & 0xffffff) == 0 || S().qps.count(n & 0xffffff);
}

}  // namespace

// rdma_create_qp's QP (RC only). Returns nullptr with *err set.
Qp *create_qp_locked(Pd *pd, ibv_qp_init_attr *attr, int *err) {
    State &s = S();
    auto fail = [err](int e) {
        *err = e;
        return nullptr;
    };
    ibv_qp_cap &c = attr->cap;
    if (attr->qp_type != IBV_QPT_RC || !attr->send_cq || !attr->recv_cq ||
        c.max_send_wr > kMaxQpWr || c.max_recv_wr > kMaxQpWr ||
        c.max_send_sge > static_cast<std::uint32_t>(s.max_sge) ||
        c.max_recv_sge > static_cast<std::uint32_t>(s.max_sge) ||
        c.max_inline_data > static_cast<std::uint32_t>(s.max_inline))
        return fail(EINVAL);
    auto *scq = reinterpret_cast<Cq *>(attr->send_cq);
    auto *rcq = reinterpret_cast<Cq *>(attr->recv_cq);
    auto *srq = reinterpret_cast<Srq *>(attr->srq);
    if (scq->ctx != pd->ctx || rcq->ctx != pd->ctx || (srq && srq->pd->ctx != pd->ctx))
        return fail(EINVAL);
    if (pd->ctx->dead) return fail(EIO);
    if (static_cast<int>(s.qps.size()) >= kMaxQp) return fail(ENOMEM);
    auto *qp = new_object<Qp>();
    qp->pd = pd;
    qp->scq = scq;
    qp->rcq = rcq;
    qp->srq = srq;
    // The caps the QP really has (written back, as a device rounds them up): the device's SGE and
    // inline limits, the work request counts asked for (at least one).
    c.max_send_wr = std::max<std::uint32_t>(c.max_send_wr, 1);
    c.max_recv_wr = srq ? 0 : std::max<std::uint32_t>(c.max_recv_wr, 1);
    c.max_send_sge = static_cast<std::uint32_t>(s.max_sge);
    c.max_recv_sge = srq ? 0 : static_cast<std::uint32_t>(s.max_sge);
    c.max_inline_data = static_cast<std::uint32_t>(s.max_inline);
    qp->cap = c;
    qp->sig_all = attr->sq_sig_all != 0;
    qp->pub.context = &pd->ctx->pub;
    qp->pub.qp_context = attr->qp_context;
    qp->pub.pd = &pd->pub;
    qp->pub.send_cq = attr->send_cq;
    qp->pub.recv_cq = attr->recv_cq;
    qp->pub.srq = attr->srq;
    qp->pub.qp_num = random_key(qpn_taken) & 0xffffff;  // 24 bits, as on the wire
    qp->pub.handle = qp->pub.qp_num;
    qp->pub.state = IBV_QPS_INIT;  // rdma_cm's QPs start in INIT
    qp->pub.qp_type = IBV_QPT_RC;
    init_pub_sync(qp->pub);
    scq->users++;
    rcq->users++;
    if (srq) srq->users++;
    pd->users++;
    s.qps[qp->pub.qp_num] = qp;
    s.stats.qps++;
    return qp;
}

namespace {

int op_poll_cq(ibv_cq *ibcq, int num_entries, ibv_wc *wc) {
    std::lock_guard lk(S().mu);
    auto *cq = reinterpret_cast<Cq *>(ibcq);
    if (num_entries < 0) return -1;
    // The app's poll drives the NIC (a pass over the context's connections) unless what it
    // asks for is there already.
    if (static_cast<std::size_t>(num_entries) > cq->q.size())
        app_pass(cq->ctx, cq->armed && cq->ch);
    int n = 0;
    while (n < num_entries && !cq->q.empty()) {
        wc[n++] = cq->q.front();
        cq->q.pop_front();
    }
    if (n == 0 && cq->overrun) return -1;  // what was queued before the overrun came out first
    return n;
}

int op_req_notify_cq(ibv_cq *ibcq, int /*solicited_only: every CQE is an event*/) {
    std::lock_guard lk(S().mu);
    reinterpret_cast<Cq *>(ibcq)->armed = true;
    return 0;
}

constexpr unsigned kKnownSendFlags =
    IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE;

int check_send(Qp *qp, const ibv_send_wr *wr, std::uint64_t *len) {
    switch (wr->opcode) {
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM:
        case IBV_WR_RDMA_READ:
            break;
        default:
            return EINVAL;  // atomics, invalidate, memory windows, TSO: not this device
    }
    if (wr->send_flags & ~kKnownSendFlags) return EINVAL;
    if (wr->num_sge < 0 || static_cast<std::uint32_t>(wr->num_sge) > qp->cap.max_send_sge)
        return EINVAL;
    if (wr->num_sge > 0 && !wr->sg_list) return EINVAL;
    std::uint64_t total = 0;
    for (int i = 0; i < wr->num_sge; ++i) total += wr->sg_list[i].length;
    if (total > kMaxMsgSize) return EINVAL;
    if (wr->send_flags & IBV_SEND_INLINE) {
        if (wr->opcode == IBV_WR_RDMA_READ || total > qp->cap.max_inline_data) return EINVAL;
    }
    *len = total;
    return 0;
}

int op_post_send(ibv_qp *ibqp, ibv_send_wr *wr, ibv_send_wr **bad_wr) {
    State &s = S();
    std::lock_guard lk(s.mu);
    auto *qp = reinterpret_cast<Qp *>(ibqp);
    int err = 0;
    bool queued = false;
    for (; wr; wr = wr->next) {
        std::uint64_t len = 0;
        err = check_send(qp, wr, &len);
        if (err) break;
        ibv_qp_state st = qp->pub.state;
        if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR) {
            err = EINVAL;
            break;
        }
        if (st == IBV_QPS_ERR) {
            // As mlx5 does: taken, and completed at once as flushed.
            flush_cqe(qp, qp->scq, wr->wr_id, wc_opcode(wr->opcode));
            continue;
        }
        if (qp->sq.size() >= qp->cap.max_send_wr) {
            err = ENOMEM;
            break;
        }
        SendWqe w;
        w.wr_id = wr->wr_id;
        w.op = wr->opcode;
        w.signaled = qp->sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
        w.inl = (wr->send_flags & IBV_SEND_INLINE) != 0;
        w.imm = wr->imm_data;
        w.raddr = wr->wr.rdma.remote_addr;
        w.rkey = wr->wr.rdma.rkey;
        w.len = len;
        if (w.inl) {
            // The CPU copies inline data at post time: the buffer is free once this returns.
            w.data.resize(len);
            std::size_t off = 0;
            for (int i = 0; i < wr->num_sge; ++i) {
                memcpy(w.data.data() + off, reinterpret_cast<const void *>(wr->sg_list[i].addr),
                       wr->sg_list[i].length);
                off += wr->sg_list[i].length;
            }
            s.stats.inline_sends++;
        } else {
            w.sge.assign(wr->sg_list, wr->sg_list + wr->num_sge);
        }
        if (s.fault_after && ++qp->posted_sends == s.fault_after) w.fault = true;
        qp->sq.push_back(std::move(w));
        queued = true;
    }
    if (err && bad_wr) *bad_wr = wr;
    if (queued) app_sent(qp);
    return err;
}

int check_recv(const ibv_recv_wr *wr, std::uint32_t max_sge) {
    if (wr->num_sge < 0 || static_cast<std::uint32_t>(wr->num_sge) > max_sge) return EINVAL;
    if (wr->num_sge > 0 && !wr->sg_list) return EINVAL;
    return 0;
}

int op_post_recv(ibv_qp *ibqp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    std::lock_guard lk(S().mu);
    auto *qp = reinterpret_cast<Qp *>(ibqp);
    int err = 0;
    bool queued = false;
    for (; wr; wr = wr->next) {
        if (qp->srq || qp->pub.state == IBV_QPS_RESET) {
            err = EINVAL;
            break;
        }
        err = check_recv(wr, qp->cap.max_recv_sge);
        if (err) break;
        if (qp->pub.state == IBV_QPS_ERR) {
            flush_cqe(qp, qp->rcq, wr->wr_id, IBV_WC_RECV);
            continue;
        }
        if (qp->rq.size() >= qp->cap.max_recv_wr) {
            err = ENOMEM;
            break;
        }
        qp->rq.push_back(RecvWqe{wr->wr_id, {wr->sg_list, wr->sg_list + wr->num_sge}});
        queued = true;
    }
    if (err && bad_wr) *bad_wr = wr;
    // A message waiting for a receive (RNR) may go on now.
    if (queued) app_recv_posted(qp);
    return err;
}

int op_post_srq_recv(ibv_srq *ibsrq, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    std::lock_guard lk(S().mu);
    auto *srq = reinterpret_cast<Srq *>(ibsrq);
    int err = 0;
    bool queued = false;
    for (; wr; wr = wr->next) {
        err = check_recv(wr, srq->max_sge);
        if (err) break;
        if (srq->q.size() >= srq->max_wr) {
            err = ENOMEM;
            break;
        }
        srq->q.push_back(RecvWqe{wr->wr_id, {wr->sg_list, wr->sg_list + wr->num_sge}});
        queued = true;
    }
    if (err && bad_wr) *bad_wr = wr;
    if (queued && srq->users > 0) app_srq_posted(srq);
    return err;
}

}  // namespace
}  // namespace emurdma

using namespace emurdma;

// ---- Devices and contexts ----

ibv_device **ibv_get_device_list(int *num_devices) {
    S();
    auto **list = static_cast<ibv_device **>(calloc(2, sizeof(ibv_device *)));
    if (!list) return fail_null(ENOMEM);
    list[0] = &g_device;
    if (num_devices) *num_devices = 1;
    return list;
}

void ibv_free_device_list(ibv_device **list) {
    free(list);
}

const char *ibv_get_device_name(ibv_device *device) {
    return is_ours(device) ? device->name : nullptr;
}

__be64 ibv_get_device_guid(ibv_device *device) {
    return is_ours(device) ? htobe64(kNodeGuid) : 0;
}

ibv_context *ibv_open_device(ibv_device *device) {
    if (!is_ours(device)) return fail_null(ENODEV);
    std::lock_guard lk(S().mu);
    Context *c = open_context();
    return c ? &c->pub : nullptr;
}

int ibv_close_device(ibv_context *context) {
    State &s = S();
    std::unique_lock lk(s.mu);
    auto *c = reinterpret_cast<Context *>(context);
    if (c->cm_owned) return 0;  // rdma_cm's own context (rdma_get_devices) stays open
    if (c->users > 0) return EBUSY;
    c->stop = true;
    wake(c);
    lk.unlock();
    c->nic.join();
    lk.lock();
    s.contexts.erase(std::find(s.contexts.begin(), s.contexts.end(), c));
    close(c->wake_fd);
    close(c->ep);
    close(c->pub.async_fd);
    pthread_mutex_destroy(&c->pub.mutex);
    delete c;
    return 0;
}

int ibv_query_device(ibv_context *context, ibv_device_attr *a) {
    if (!context || !a) return EINVAL;
    State &s = S();
    memset(a, 0, sizeof(*a));
    snprintf(a->fw_ver, sizeof(a->fw_ver), "1.0.0 (emurdma)");
    a->node_guid = htobe64(kNodeGuid);
    a->sys_image_guid = htobe64(kNodeGuid);
    a->max_mr_size = kMaxMrSize;
    a->page_size_cap = 0xfffff000;
    a->vendor_id = kVendorId;
    a->vendor_part_id = 1;
    a->hw_ver = 1;
    a->max_qp = kMaxQp;
    a->max_qp_wr = static_cast<int>(kMaxQpWr);
    a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT |
                          IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_SRQ_RESIZE;
    a->max_sge = s.max_sge;
    a->max_sge_rd = s.max_sge;
    a->max_cq = 65536;
    a->max_cqe = kMaxCqe;
    a->max_mr = 1 << 20;
    a->max_pd = 65536;
    a->max_qp_rd_atom = kMaxRdAtom;
    a->max_ee_rd_atom = 0;
    a->max_res_rd_atom = kMaxRdAtom * kMaxQp;
    a->max_qp_init_rd_atom = kMaxRdAtom;
    a->atomic_cap = IBV_ATOMIC_NONE;
    a->max_srq = 4096;
    a->max_srq_wr = static_cast<int>(kMaxSrqWr);
    a->max_srq_sge = s.max_sge;
    a->max_pkeys = 1;
    a->local_ca_ack_delay = 16;
    a->phys_port_cnt = 1;
    return 0;
}

int ibv_query_port(ibv_context *context, uint8_t port_num,
                   struct _compat_ibv_port_attr *port_attr) {
    if (!context || !port_attr || port_num != 1) return EINVAL;
    // The caller passes a whole struct ibv_port_attr (the header's inline casts it).
    auto *a = reinterpret_cast<ibv_port_attr *>(port_attr);
    bool up;
    {
        std::lock_guard lk(S().mu);
        up = S().port_up && !reinterpret_cast<Context *>(context)->dead;
    }
    memset(a, 0, sizeof(*a));
    a->state = up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = IBV_MTU_4096;
    a->gid_tbl_len = 1;
    a->port_cap_flags = IBV_PORT_CM_SUP;
    a->max_msg_sz = kMaxMsgSize;
    a->pkey_tbl_len = 1;
    a->max_vl_num = 1;
    a->active_width = 2;         // 4x
    a->active_speed = 32;        // EDR
    a->phys_state = up ? 5 : 3;  // LinkUp / Disabled
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
}

int ibv_query_gid(ibv_context *context, uint8_t port_num, int index, ibv_gid *gid) {
    if (!context || !gid || port_num != 1 || index != 0) {
        errno = EINVAL;
        return -1;
    }
    // RoCE v2's GID of an IPv4 address: ::ffff:a.b.c.d (the interface's first IPv4 address).
    memset(gid, 0, sizeof(*gid));
    gid->raw[10] = 0xff;
    gid->raw[11] = 0xff;
    sockaddr_storage ss;
    if (served_source(AF_INET, nullptr, &ss))
        memcpy(&gid->raw[12], &reinterpret_cast<sockaddr_in *>(&ss)->sin_addr, 4);
    return 0;
}

// ---- Protection domains and memory regions ----

ibv_pd *ibv_alloc_pd(ibv_context *context) {
    std::lock_guard lk(S().mu);
    auto *c = reinterpret_cast<Context *>(context);
    if (!c) return fail_null(EINVAL);
    if (c->dead) return fail_null(EIO);
    auto *pd = new_object<Pd>();
    pd->pub.context = context;
    pd->ctx = c;
    pd->pub.handle = static_cast<std::uint32_t>(S().next_serial++);
    c->users++;
    return &pd->pub;
}

int ibv_dealloc_pd(ibv_pd *ibpd) {
    std::lock_guard lk(S().mu);
    auto *pd = reinterpret_cast<Pd *>(ibpd);
    if (pd->users > 0) return EBUSY;
    pd->ctx->users--;
    delete pd;
    return 0;
}

ibv_mr *ibv_reg_mr(ibv_pd *pd, void *addr, size_t length, int access) {
    return reg_host(pd, addr, length, reinterpret_cast<std::uintptr_t>(addr),
                    static_cast<unsigned>(access));
}

ibv_mr *ibv_reg_mr_iova2(ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                         unsigned int access) {
    return reg_host(pd, addr, length, iova, access);
}

ibv_mr *ibv_reg_dmabuf_mr(ibv_pd *ibpd, uint64_t offset, size_t length, uint64_t iova, int fd,
                          int access) {
    std::lock_guard lk(S().mu);
    auto *pd = reinterpret_cast<Pd *>(ibpd);
    if (!pd || length == 0 || length > kMaxMrSize || !access_valid(static_cast<unsigned>(access)))
        return fail_null(EINVAL);
    if (pd->ctx->dead) return fail_null(EIO);
    // The range must lie inside the object: the NIC would fault (SIGBUS) beyond its end.
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return fail_null(EBADF);
    if (offset > static_cast<std::uint64_t>(st.st_size) ||
        length > static_cast<std::uint64_t>(st.st_size) - offset)
        return fail_null(EINVAL);
    // The NIC's view of the buffer: our own read-write mapping of the fd. The device address
    // (iova) is never touched: in the emulated CUDA it is PROT_NONE.
    auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    std::uint64_t start = offset & ~(page - 1);
    std::size_t map_len = ((offset - start + length + page - 1) / page) * page;
    void *m =
        mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
    if (m == MAP_FAILED) return nullptr;  // errno from mmap
    ibv_mr *mr = new_mr(pd, iova, length, static_cast<std::uint8_t *>(m) + (offset - start), access,
                        m, map_len);
    S().stats.dmabuf_regs++;
    return mr;
}

int ibv_dereg_mr(ibv_mr *ibmr) {
    State &s = S();
    std::lock_guard lk(s.mu);
    auto *mr = reinterpret_cast<Mr *>(ibmr);
    if (!mr) return EINVAL;
    // Under the lock the NIC is not inside this MR: every copy and send is done with the lock
    // held. A READ response still sending from it sends the rest from a copy (the memory may be
    // unmapped next); a request that comes after this finds the key gone.
    tx_copy_from_mr(mr);
    s.lkeys.erase(mr->pub.lkey);
    s.rkeys.erase(mr->pub.rkey);
    if (mr->map_addr) munmap(mr->map_addr, mr->map_len);
    mr->pd->users--;
    s.stats.mrs_registered--;
    delete mr;
    return 0;
}

// ---- Completion channels and CQs ----

ibv_comp_channel *ibv_create_comp_channel(ibv_context *context) {
    std::lock_guard lk(S().mu);
    auto *c = reinterpret_cast<Context *>(context);
    if (!c) return fail_null(EINVAL);
    int fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
    if (fd < 0) return nullptr;
    auto *ch = new CompChannel;
    ch->pub.context = context;
    ch->pub.fd = fd;
    ch->pub.refcnt = 0;
    ch->ctx = c;
    c->users++;
    return &ch->pub;
}

int ibv_destroy_comp_channel(ibv_comp_channel *channel) {
    std::lock_guard lk(S().mu);
    auto *ch = reinterpret_cast<CompChannel *>(channel);
    if (ch->users > 0) return EBUSY;
    close(ch->pub.fd);
    ch->ctx->users--;
    delete ch;
    return 0;
}

ibv_cq *ibv_create_cq(ibv_context *context, int cqe, void *cq_context, ibv_comp_channel *channel,
                      int comp_vector) {
    std::lock_guard lk(S().mu);
    auto *c = reinterpret_cast<Context *>(context);
    auto *ch = reinterpret_cast<CompChannel *>(channel);
    if (!c || cqe < 1 || cqe > kMaxCqe || comp_vector < 0 ||
        comp_vector >= c->pub.num_comp_vectors || (ch && ch->ctx != c))
        return fail_null(EINVAL);
    if (c->dead) return fail_null(EIO);
    auto *cq = new_object<Cq>();
    cq->pub.context = context;
    cq->pub.channel = channel;
    cq->pub.cq_context = cq_context;
    cq->pub.cqe = cqe;
    cq->pub.handle = static_cast<std::uint32_t>(S().next_serial++);
    init_pub_sync(cq->pub);
    cq->ctx = c;
    cq->ch = ch;
    cq->cap = cqe;
    if (ch) {
        ch->users++;
        ch->pub.refcnt++;
    }
    c->users++;
    return &cq->pub;
}

int ibv_destroy_cq(ibv_cq *ibcq) {
    std::lock_guard lk(S().mu);
    auto *cq = reinterpret_cast<Cq *>(ibcq);
    if (cq->users > 0) return EBUSY;
    if (CompChannel *ch = cq->ch) {
        // Its unread events go (the real call waits for them to be acknowledged instead).
        for (auto it = ch->q.begin(); it != ch->q.end();) {
            if (*it == cq) {
                it = ch->q.erase(it);
                sig_lower(ch->pub.fd);
            } else {
                ++it;
            }
        }
        ch->users--;
        ch->pub.refcnt--;
    }
    cq->ctx->users--;
    destroy_pub_sync(cq->pub);
    delete cq;
    return 0;
}

int ibv_get_cq_event(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context) {
    std::unique_lock lk(S().mu);
    auto *ch = reinterpret_cast<CompChannel *>(channel);
    if (!wait_queue(lk, ch->cv, ch->pub.fd, [ch] { return !ch->q.empty(); })) return -1;
    Cq *c = ch->q.front();
    ch->q.pop_front();
    sig_lower(ch->pub.fd);
    *cq = &c->pub;
    *cq_context = c->pub.cq_context;
    return 0;
}

void ibv_ack_cq_events(ibv_cq *cq, unsigned int nevents) {
    std::lock_guard lk(S().mu);
    cq->comp_events_completed += nevents;
}

// ---- Shared receive queues and QPs ----

ibv_srq *ibv_create_srq(ibv_pd *ibpd, ibv_srq_init_attr *init) {
    State &s = S();
    std::lock_guard lk(s.mu);
    auto *pd = reinterpret_cast<Pd *>(ibpd);
    if (!pd || !init || init->attr.max_wr == 0 || init->attr.max_wr > kMaxSrqWr ||
        init->attr.max_sge > static_cast<std::uint32_t>(s.max_sge))
        return fail_null(EINVAL);
    if (pd->ctx->dead) return fail_null(EIO);
    auto *srq = new_object<Srq>();
    srq->pub.context = &pd->ctx->pub;
    srq->pub.srq_context = init->srq_context;
    srq->pub.pd = ibpd;
    srq->pub.handle = static_cast<std::uint32_t>(s.next_serial++);
    init_pub_sync(srq->pub);
    srq->pd = pd;
    srq->max_wr = init->attr.max_wr;
    srq->max_sge = static_cast<std::uint32_t>(s.max_sge);
    init->attr.max_sge = srq->max_sge;
    pd->users++;
    return &srq->pub;
}

int ibv_destroy_srq(ibv_srq *ibsrq) {
    std::lock_guard lk(S().mu);
    auto *srq = reinterpret_cast<Srq *>(ibsrq);
    if (srq->users > 0) return EBUSY;
    srq->pd->users--;
    destroy_pub_sync(srq->pub);
    delete srq;
    return 0;
}

int ibv_modify_qp(ibv_qp *ibqp, ibv_qp_attr *attr, int attr_mask) {
    std::lock_guard lk(S().mu);
    auto *qp = reinterpret_cast<Qp *>(ibqp);
    if (!qp || !attr) return EINVAL;
    if (attr_mask & IBV_QP_MIN_RNR_TIMER) qp->min_rnr_timer = attr->min_rnr_timer & 31;
    if (attr_mask & IBV_QP_RNR_RETRY) qp->rnr_retry = std::min<std::uint8_t>(attr->rnr_retry, 7);
    if (attr_mask & IBV_QP_RETRY_CNT) qp->retry_cnt = std::min<std::uint8_t>(attr->retry_cnt, 7);
    if (!(attr_mask & IBV_QP_STATE) || attr->qp_state == qp->pub.state) return 0;
    switch (attr->qp_state) {
        case IBV_QPS_ERR:
            qp_to_error(qp, true);
            return 0;
        case IBV_QPS_RESET:
            // Back to reset: the work requests go without completions.
            qp->sq.clear();
            qp->next_tx = 0;
            qp->rq.clear();
            qp->pub.state = IBV_QPS_RESET;
            return 0;
        case IBV_QPS_INIT:
        case IBV_QPS_RTR:
        case IBV_QPS_RTS:
            if (qp->pub.state == IBV_QPS_ERR || attr->qp_state < qp->pub.state) return EINVAL;
            qp->pub.state = attr->qp_state;
            return 0;
        default:
            return EINVAL;
    }
}

int ibv_query_qp(ibv_qp *ibqp, ibv_qp_attr *attr, int /*attr_mask*/, ibv_qp_init_attr *init) {
    std::lock_guard lk(S().mu);
    auto *qp = reinterpret_cast<Qp *>(ibqp);
    if (!qp || !attr) return EINVAL;
    memset(attr, 0, sizeof(*attr));
    attr->qp_state = qp->pub.state;
    attr->cur_qp_state = qp->pub.state;
    attr->path_mtu = IBV_MTU_4096;
    attr->qp_access_flags =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    attr->cap = qp->cap;
    attr->dest_qp_num = qp->peer_qpn;
    attr->max_rd_atomic = kMaxRdAtom;
    attr->max_dest_rd_atomic = kMaxRdAtom;
    attr->min_rnr_timer = qp->min_rnr_timer;
    attr->port_num = 1;
    attr->timeout = 14;
    attr->retry_cnt = qp->retry_cnt;
    attr->rnr_retry = qp->rnr_retry;
    if (init) {
        memset(init, 0, sizeof(*init));
        init->qp_context = qp->pub.qp_context;
        init->send_cq = qp->pub.send_cq;
        init->recv_cq = qp->pub.recv_cq;
        init->srq = qp->pub.srq;
        init->cap = qp->cap;
        init->qp_type = IBV_QPT_RC;
        init->sq_sig_all = qp->sig_all;
    }
    return 0;
}

int ibv_destroy_qp(ibv_qp *qp) {
    if (!qp) return EINVAL;
    std::lock_guard lk(S().mu);
    destroy_qp_locked(reinterpret_cast<Qp *>(qp));
    return 0;
}

// ---- Async events and strings ----

int ibv_get_async_event(ibv_context *context, ibv_async_event *event) {
    std::unique_lock lk(S().mu);
    auto *c = reinterpret_cast<Context *>(context);
    if (!wait_queue(lk, c->async_cv, c->pub.async_fd, [c] { return !c->async_q.empty(); }))
        return -1;
    *event = c->async_q.front();
    c->async_q.pop_front();
    sig_lower(c->pub.async_fd);
    return 0;
}

void ibv_ack_async_event(ibv_async_event * /*event: nothing is held for it*/) {}

const char *ibv_wc_status_str(ibv_wc_status status) {
    switch (status) {
        case IBV_WC_SUCCESS:
            return "success";
        case IBV_WC_LOC_LEN_ERR:
            return "local length error";
        case IBV_WC_LOC_QP_OP_ERR:
            return "local QP operation error";
        case IBV_WC_LOC_EEC_OP_ERR:
            return "local EE context operation error";
        case IBV_WC_LOC_PROT_ERR:
            return "local protection error";
        case IBV_WC_WR_FLUSH_ERR:
            return "Work Request Flushed Error";
        case IBV_WC_MW_BIND_ERR:
            return "memory management operation error";
        case IBV_WC_BAD_RESP_ERR:
            return "bad response error";
        case IBV_WC_LOC_ACCESS_ERR:
            return "local access error";
        case IBV_WC_REM_INV_REQ_ERR:
            return "remote invalid request error";
        case IBV_WC_REM_ACCESS_ERR:
            return "remote access error";
        case IBV_WC_REM_OP_ERR:
            return "remote operation error";
        case IBV_WC_RETRY_EXC_ERR:
            return "transport retry counter exceeded";
        case IBV_WC_RNR_RETRY_EXC_ERR:
            return "RNR retry counter exceeded";
        case IBV_WC_LOC_RDD_VIOL_ERR:
            return "local RDD violation error";
        case IBV_WC_REM_INV_RD_REQ_ERR:
            return "remote invalid RD request";
        case IBV_WC_REM_ABORT_ERR:
            return "aborted error";
        case IBV_WC_INV_EECN_ERR:
            return "invalid EE context number";
        case IBV_WC_INV_EEC_STATE_ERR:
            return "invalid EE context state";
        case IBV_WC_FATAL_ERR:
            return "fatal error";
        case IBV_WC_RESP_TIMEOUT_ERR:
            return "response timeout error";
        case IBV_WC_GENERAL_ERR:
            return "general error";
        default:
            return "unknown";
    }
}

const char *ibv_event_type_str(ibv_event_type event) {
    switch (event) {
        case IBV_EVENT_CQ_ERR:
            return "CQ error";
        case IBV_EVENT_QP_FATAL:
            return "local work queue catastrophic error";
        case IBV_EVENT_QP_REQ_ERR:
            return "invalid request local work queue error";
        case IBV_EVENT_QP_ACCESS_ERR:
            return "local access violation work queue error";
        case IBV_EVENT_COMM_EST:
            return "communication established";
        case IBV_EVENT_SQ_DRAINED:
            return "send queue drained";
        case IBV_EVENT_PATH_MIG:
            return "path migrated";
        case IBV_EVENT_PATH_MIG_ERR:
            return "path migration request error";
        case IBV_EVENT_DEVICE_FATAL:
            return "local catastrophic error";
        case IBV_EVENT_PORT_ACTIVE:
            return "port active";
        case IBV_EVENT_PORT_ERR:
            return "port error";
        case IBV_EVENT_LID_CHANGE:
            return "LID change";
        case IBV_EVENT_PKEY_CHANGE:
            return "P_Key change";
        case IBV_EVENT_SM_CHANGE:
            return "SM change";
        case IBV_EVENT_SRQ_ERR:
            return "SRQ catastrophic error";
        case IBV_EVENT_SRQ_LIMIT_REACHED:
            return "SRQ limit reached";
        case IBV_EVENT_QP_LAST_WQE_REACHED:
            return "last WQE reached";
        case IBV_EVENT_CLIENT_REREGISTER:
            return "client reregistration";
        case IBV_EVENT_GID_CHANGE:
            return "GID table change";
        case IBV_EVENT_WQ_FATAL:
            return "WQ fatal";
        default:
            return "unknown";
    }
}

// ---- Test control ----

EMURDMA_API void emurdma_get_stats(emurdma_stats *out) {
    std::lock_guard lk(S().mu);
    *out = S().stats;
}

EMURDMA_API void emurdma_reset_stats(void) {
    State &s = S();
    std::lock_guard lk(s.mu);
    emurdma_stats keep = s.stats;
    s.stats = emurdma_stats{};
    s.stats.mrs_registered = keep.mrs_registered;
    s.stats.qps = keep.qps;
}

EMURDMA_API int emurdma_inject_qp_error(uint32_t qp_num) {
    State &s = S();
    std::lock_guard lk(s.mu);
    if (qp_num == 0) {
        std::vector<Qp *> all;
        for (auto &[n, qp] : s.qps) all.push_back(qp);
        for (Qp *qp : all) inject_error(qp);
        return 0;
    }
    auto it = s.qps.find(qp_num);
    if (it == s.qps.end()) return -1;
    inject_error(it->second);
    return 0;
}

EMURDMA_API void emurdma_remove_device(void) {
    State &s = S();
    std::lock_guard lk(s.mu);
    for (auto &[n, qp] : s.qps) qp_to_error(qp, true);
    for (Context *c : s.contexts) {
        if (c->dead) continue;
        c->dead = true;
        ibv_async_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.event_type = IBV_EVENT_DEVICE_FATAL;
        queue_async(c, ev);
        wake(c);
    }
    cm_device_removed();
    s.cm_ctx = nullptr;  // the next id gets a fresh context (a re-plugged device)
}

EMURDMA_API int emurdma_hold_reads(uint32_t qp_num, int hold) {
    State &s = S();
    std::lock_guard lk(s.mu);
    auto it = s.qps.find(qp_num);
    if (it == s.qps.end() || !it->second->id || it->second->id->sock < 0) return -1;
    hold_reads(it->second->id, hold != 0);
    return 0;
}

EMURDMA_API void emurdma_set_port_state(int up) {
    State &s = S();
    std::lock_guard lk(s.mu);
    if (s.port_up == (up != 0)) return;
    s.port_up = up != 0;
    for (Context *c : s.contexts) {
        if (c->dead) continue;
        ibv_async_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.event_type = up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR;
        ev.element.port_num = 1;
        queue_async(c, ev);
        wake(c);
    }
}
