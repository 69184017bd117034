// Tests of the emulated RDMA device (libtandem-emurdma.so), used exactly as the providers use it:
// dlopen(RTLD_NOW | RTLD_LOCAL) of its path and dlsym of each call by its plain name; the
// header's inline calls (ibv_post_send, ibv_poll_cq, ...) go through context->ops. Two-process
// cases fork(); the child reports through its exit code (CHILD_CHECK), never through gtest.
// What the device emulates and what it does not: the comment at the top of emurdma_verbs.cpp.
#include "tests/emurdma/emurdma_control.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

// The header turns these into macros or inlines; the table wants the exported functions.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

namespace {

#define EMURDMA_TEST_CALLS(X)     \
    X(ibv_get_device_list)        \
    X(ibv_free_device_list)       \
    X(ibv_get_device_name)        \
    X(ibv_get_device_guid)        \
    X(ibv_open_device)            \
    X(ibv_close_device)           \
    X(ibv_query_device)           \
    X(ibv_query_port)             \
    X(ibv_query_gid)              \
    X(ibv_alloc_pd)               \
    X(ibv_dealloc_pd)             \
    X(ibv_reg_mr)                 \
    X(ibv_reg_dmabuf_mr)          \
    X(ibv_dereg_mr)               \
    X(ibv_create_comp_channel)    \
    X(ibv_destroy_comp_channel)   \
    X(ibv_create_cq)              \
    X(ibv_destroy_cq)             \
    X(ibv_get_cq_event)           \
    X(ibv_ack_cq_events)          \
    X(ibv_create_srq)             \
    X(ibv_destroy_srq)            \
    X(ibv_modify_qp)              \
    X(ibv_query_qp)               \
    X(ibv_wc_status_str)          \
    X(ibv_event_type_str)         \
    X(ibv_get_async_event)        \
    X(ibv_ack_async_event)        \
    X(rdma_create_event_channel)  \
    X(rdma_destroy_event_channel) \
    X(rdma_create_id)             \
    X(rdma_destroy_id)            \
    X(rdma_bind_addr)             \
    X(rdma_resolve_addr)          \
    X(rdma_resolve_route)         \
    X(rdma_listen)                \
    X(rdma_create_qp)             \
    X(rdma_destroy_qp)            \
    X(rdma_connect)               \
    X(rdma_accept)                \
    X(rdma_reject)                \
    X(rdma_disconnect)            \
    X(rdma_get_cm_event)          \
    X(rdma_ack_cm_event)          \
    X(rdma_migrate_id)            \
    X(rdma_event_str)             \
    X(rdma_get_devices)           \
    X(rdma_free_devices)          \
    X(emurdma_get_stats)          \
    X(emurdma_reset_stats)        \
    X(emurdma_inject_qp_error)    \
    X(emurdma_remove_device)      \
    X(emurdma_set_port_state)     \
    X(emurdma_hold_reads)

// The function table, as the provider keeps one.
struct Api {
#define EMURDMA_FIELD(name) decltype(&::name) name = nullptr;
    EMURDMA_TEST_CALLS(EMURDMA_FIELD)
#undef EMURDMA_FIELD
    bool ok = false;
};

const Api &api() {
    static const Api table = [] {
        Api a;
        void *h = dlopen(TANDEM_EMURDMA_LIB, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlopen %s: %s\n", TANDEM_EMURDMA_LIB, dlerror());
            return a;
        }
        a.ok = true;
#define EMURDMA_LOAD(name)                                         \
    a.name = reinterpret_cast<decltype(&::name)>(dlsym(h, #name)); \
    if (!a.name) {                                                 \
        fprintf(stderr, "dlsym %s: missing\n", #name);             \
        a.ok = false;                                              \
    }
        EMURDMA_TEST_CALLS(EMURDMA_LOAD)
#undef EMURDMA_LOAD
        return a;
    }();
    return table;
}

// In a forked child: a failed check ends the child with a code naming the line.
#define CHILD_CHECK(cond)                                                            \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "child check failed at line %d: %s\n", __LINE__, #cond); \
            _exit(1);                                                                \
        }                                                                            \
    } while (0)

constexpr int kTimeoutMs = 5000;

struct EventInfo {
    rdma_cm_event_type type = RDMA_CM_EVENT_TIMEWAIT_EXIT;
    int status = 0;
    rdma_cm_id *id = nullptr;
    rdma_cm_id *listen_id = nullptr;
    bool pdata_null = true;
    std::vector<uint8_t> pdata;
    bool got = false;
};

// The next event of a channel (waiting on its fd as an app would), copied and acknowledged.
EventInfo next_event(rdma_event_channel *ch, int timeout_ms = kTimeoutMs) {
    EventInfo info;
    pollfd p{ch->fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) return info;
    rdma_cm_event *ev = nullptr;
    if (api().rdma_get_cm_event(ch, &ev) != 0) return info;
    info.got = true;
    info.type = ev->event;
    info.status = ev->status;
    info.id = ev->id;
    info.listen_id = ev->listen_id;
    info.pdata_null = ev->param.conn.private_data == nullptr;
    if (ev->param.conn.private_data) {
        auto *b = static_cast<const uint8_t *>(ev->param.conn.private_data);
        info.pdata.assign(b, b + ev->param.conn.private_data_len);
    }
    api().rdma_ack_cm_event(ev);
    return info;
}

// n completions, in the order they come.
std::vector<ibv_wc> poll_wc(ibv_cq *cq, size_t n, int timeout_ms = kTimeoutMs) {
    std::vector<ibv_wc> out;
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (out.size() < n && std::chrono::steady_clock::now() < end) {
        ibv_wc wc[16];
        int got = ibv_poll_cq(cq, 16, wc);
        if (got < 0) break;
        out.insert(out.end(), wc, wc + got);
        if (got == 0) std::this_thread::yield();
    }
    return out;
}

// A completion a test expects: of that request, with that status.
struct Done {
    uint64_t wr_id;
    ibv_wc_status status;
};

// The next completions of cq, as many as want lists, are those, in that order. Fewer ends the
// test (call it in ASSERT_NO_FATAL_FAILURE); a wrong one is reported and the test goes on.
void expect_completions(ibv_cq *cq, std::initializer_list<Done> want) {
    std::vector<ibv_wc> wc = poll_wc(cq, want.size());
    ASSERT_EQ(wc.size(), want.size());
    size_t i = 0;
    for (const Done &w : want) {
        EXPECT_EQ(wc[i].wr_id, w.wr_id) << "completion " << i;
        EXPECT_EQ(wc[i].status, w.status) << "completion " << i;
        ++i;
    }
}

std::vector<ibv_wc> drain_wc(ibv_cq *cq, int settle_ms = 50) {
    std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
    std::vector<ibv_wc> out;
    ibv_wc wc[16];
    int got;
    while ((got = ibv_poll_cq(cq, 16, wc)) > 0) out.insert(out.end(), wc, wc + got);
    return out;
}

sockaddr_in loopback(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    return a;
}

ibv_sge sge(const void *addr, uint32_t len, const ibv_mr *mr) {
    return ibv_sge{reinterpret_cast<uintptr_t>(addr), len, mr ? mr->lkey : 0};
}

int post_send(ibv_qp *qp, ibv_wr_opcode op, uint64_t wr_id, std::vector<ibv_sge> sges,
              unsigned flags = IBV_SEND_SIGNALED, uint64_t raddr = 0, uint32_t rkey = 0,
              uint32_t imm = 0, ibv_send_wr **bad_out = nullptr) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.sg_list = sges.data();
    wr.num_sge = static_cast<int>(sges.size());
    wr.send_flags = flags;
    wr.imm_data = imm;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr *bad = nullptr;
    int rc = ibv_post_send(qp, &wr, &bad);
    if (bad_out) *bad_out = bad;
    if (rc && bad != &wr) return -1000;  // bad_wr must name the failed request
    return rc;
}

// One receive request over sges (which must outlive its posting), for a QP or an SRQ.
ibv_recv_wr recv_wr(uint64_t wr_id, std::vector<ibv_sge> &sges) {
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = sges.data();
    wr.num_sge = static_cast<int>(sges.size());
    return wr;
}

int post_recv(ibv_qp *qp, uint64_t wr_id, std::vector<ibv_sge> sges) {
    ibv_recv_wr wr = recv_wr(wr_id, sges);
    ibv_recv_wr *bad = nullptr;
    return ibv_post_recv(qp, &wr, &bad);
}

int post_srq(ibv_srq *srq, uint64_t wr_id, std::vector<ibv_sge> sges) {
    ibv_recv_wr wr = recv_wr(wr_id, sges);
    ibv_recv_wr *bad = nullptr;
    return ibv_post_srq_recv(srq, &wr, &bad);
}

ibv_qp_state qp_state(ibv_qp *qp) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    api().ibv_query_qp(qp, &attr, IBV_QP_STATE, &init);
    return attr.qp_state;
}

// One end of a connection: its QP's resources.
struct Side {
    rdma_event_channel *ch = nullptr;  // passive side: the listener's (its events come there)
    bool own_ch = false;
    rdma_cm_id *id = nullptr;
    ibv_pd *pd = nullptr;
    ibv_comp_channel *cc = nullptr;
    ibv_cq *cq = nullptr;
    ibv_srq *srq = nullptr;
    std::vector<ibv_mr *> mrs;

    ibv_qp *qp() const { return id->qp; }

    ibv_mr *reg(void *addr, size_t len,
                int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                             IBV_ACCESS_REMOTE_READ) {
        ibv_mr *mr = api().ibv_reg_mr(pd, addr, len, access);
        if (mr) mrs.push_back(mr);
        return mr;
    }

    void destroy() {
        const Api &a = api();
        if (id && id->qp) a.rdma_destroy_qp(id);
        if (id) a.rdma_destroy_id(id);
        id = nullptr;
        for (ibv_mr *mr : mrs) a.ibv_dereg_mr(mr);
        mrs.clear();
        if (srq) a.ibv_destroy_srq(srq);
        srq = nullptr;
        if (cq) a.ibv_destroy_cq(cq);
        cq = nullptr;
        if (cc) a.ibv_destroy_comp_channel(cc);
        cc = nullptr;
        if (pd) a.ibv_dealloc_pd(pd);
        pd = nullptr;
        if (own_ch && ch) a.rdma_destroy_event_channel(ch);
        ch = nullptr;
    }
};

struct QpOptions {
    bool srq = false;
    bool comp_channel = false;
    int cqe = 256;
    uint8_t rnr_retry = 7;
};

// PD, CQ (both directions), SRQ if asked for, and the QP on the id.
bool make_qp(Side &s, const QpOptions &o) {
    const Api &a = api();
    s.pd = a.ibv_alloc_pd(s.id->verbs);
    if (!s.pd) return false;
    if (o.comp_channel && !(s.cc = a.ibv_create_comp_channel(s.id->verbs))) return false;
    s.cq = a.ibv_create_cq(s.id->verbs, o.cqe, nullptr, s.cc, 0);
    if (!s.cq) return false;
    if (o.srq) {
        ibv_srq_init_attr sa{};
        sa.attr.max_wr = 256;
        sa.attr.max_sge = 4;
        if (!(s.srq = a.ibv_create_srq(s.pd, &sa))) return false;
    }
    ibv_qp_init_attr qa{};
    qa.send_cq = s.cq;
    qa.recv_cq = s.cq;
    qa.srq = s.srq;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = 64;
    qa.cap.max_recv_wr = 64;
    qa.cap.max_send_sge = 4;
    qa.cap.max_recv_sge = 4;
    qa.cap.max_inline_data = 64;
    return a.rdma_create_qp(s.id, s.pd, &qa) == 0;
}

rdma_cm_id *make_listener(rdma_event_channel *ch, uint16_t *port) {
    rdma_cm_id *id = nullptr;
    if (api().rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return nullptr;
    sockaddr_in a = loopback(0);
    if (api().rdma_bind_addr(id, reinterpret_cast<sockaddr *>(&a)) || api().rdma_listen(id, 16)) {
        api().rdma_destroy_id(id);
        return nullptr;
    }
    *port = ntohs(id->route.addr.src_sin.sin_port);
    return id;
}

// The active side up to its QP: a channel of its own, the id, ADDR_RESOLVED, ROUTE_RESOLVED.
// 0: done, else the step that failed (start_connect's codes).
int resolve(Side &s, sockaddr_in dst, int timeout_ms) {
    const Api &a = api();
    s.ch = a.rdma_create_event_channel();
    s.own_ch = true;
    if (!s.ch || a.rdma_create_id(s.ch, &s.id, nullptr, RDMA_PS_TCP)) return 1;
    if (a.rdma_resolve_addr(s.id, nullptr, reinterpret_cast<sockaddr *>(&dst), timeout_ms))
        return 2;
    if (next_event(s.ch).type != RDMA_CM_EVENT_ADDR_RESOLVED) return 3;
    if (a.rdma_resolve_route(s.id, timeout_ms)) return 4;
    if (next_event(s.ch).type != RDMA_CM_EVENT_ROUTE_RESOLVED) return 5;
    return 0;
}

// The active side up to rdma_connect (ADDR_RESOLVED, ROUTE_RESOLVED, QP). 0: done.
int start_connect(Side &s, uint16_t port, const QpOptions &o, const void *pdata = nullptr,
                  uint8_t pdlen = 0) {
    if (int rc = resolve(s, loopback(port), 1000)) return rc;
    if (!make_qp(s, o)) return 6;
    rdma_conn_param cp{};
    cp.private_data = pdata;
    cp.private_data_len = pdlen;
    cp.rnr_retry_count = o.rnr_retry;
    cp.retry_count = 7;
    if (api().rdma_connect(s.id, &cp)) return 7;
    return 0;
}

// The passive side up to its accept: the CONNECT_REQUEST and a QP on its id (a test that posts
// receives or registers memory before it accepts stops here). 0: done.
int take_request(Side &s, rdma_event_channel *lch, const QpOptions &o, EventInfo *req) {
    *req = next_event(lch);
    if (req->type != RDMA_CM_EVENT_CONNECT_REQUEST) return 1;
    s.ch = lch;
    s.id = req->id;
    if (!make_qp(s, o)) return 2;
    return 0;
}

// rdma_accept with that private data and the QP's RNR retry count: rdma_accept's result.
int accept_request(Side &s, const QpOptions &o, const void *pdata = nullptr, uint8_t pdlen = 0) {
    rdma_conn_param cp{};
    cp.private_data = pdata;
    cp.private_data_len = pdlen;
    cp.rnr_retry_count = o.rnr_retry;
    return api().rdma_accept(s.id, &cp);
}

// The passive side: the CONNECT_REQUEST, a QP, rdma_accept. 0: done.
int accept_one(Side &s, rdma_event_channel *lch, const QpOptions &o, EventInfo *req,
               const void *pdata = nullptr, uint8_t pdlen = 0) {
    if (int rc = take_request(s, lch, o, req)) return rc;
    if (accept_request(s, o, pdata, pdlen)) return 3;
    return 0;
}

// Where an RDMA target's memory is, as the passive side tells its peer in the accept's private
// data (address, then rkey), the way the providers exchange it.
struct RemoteBuf {
    uint64_t addr = 0;
    uint32_t rkey = 0;
};

void put_remote(uint8_t *pdata, const void *addr, const ibv_mr *mr) {
    uint64_t a = reinterpret_cast<uintptr_t>(addr);
    memcpy(pdata, &a, 8);
    memcpy(pdata + 8, &mr->rkey, 4);
}

RemoteBuf get_remote(const std::vector<uint8_t> &pdata) {
    RemoteBuf r;
    memcpy(&r.addr, pdata.data(), 8);
    memcpy(&r.rkey, pdata.data() + 8, 4);
    return r;
}

// Reaps a forked child: it passed if it exited with 0 (a failed CHILD_CHECK exits with 1). The
// caller wraps it in ASSERT_NO_FATAL_FAILURE: without the child reaped the test cannot go on.
void expect_child_passed(pid_t pid) {
    int status = -1;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

// A connected pair of QPs in this process: a (active) and p (passive).
class Pair : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_TRUE(api().ok); }
    void TearDown() override {
        a.destroy();
        p.destroy();
        if (listener) api().rdma_destroy_id(listener);
        if (lch) api().rdma_destroy_event_channel(lch);
    }

    void listen() {
        lch = api().rdma_create_event_channel();
        ASSERT_NE(lch, nullptr);
        listener = make_listener(lch, &port);
        ASSERT_NE(listener, nullptr);
    }

    void connect(const QpOptions &ao = {}, const QpOptions &po = {}) {
        listen();
        ASSERT_EQ(start_connect(a, port, ao), 0);
        EventInfo req;
        ASSERT_EQ(accept_one(p, lch, po, &req), 0);
        ASSERT_EQ(next_event(a.ch).type, RDMA_CM_EVENT_ESTABLISHED);
        ASSERT_EQ(next_event(lch).type, RDMA_CM_EVENT_ESTABLISHED);
    }

    Side a, p;
    rdma_event_channel *lch = nullptr;
    rdma_cm_id *listener = nullptr;
    uint16_t port = 0;
};

using Cm = Pair;
using Data = Pair;
using Keys = Pair;
using Rnr = Pair;
using Errors = Pair;
using Channels = Pair;
using Fault = Pair;
using Memory = Pair;
// The two-process tests: the listener and the passive side p in this process, the active side
// in a forked child (which never returns to gtest, so never tears anything down). The child is
// forked before this process makes any device object, so that it never inherits a NIC thread's
// half-held lock (an allocator's, under AddressSanitizer, whose fork handling does not cover its
// allocator: a child forked while a NIC thread allocated hung in its first allocation). It
// learns the listener's port through a pipe (in_child), and `ready` is a pipe from child to
// parent for tests that need one.
class TwoProcess : public Pair {
  protected:
    void SetUp() override {
        ASSERT_EQ(pipe(port_pipe_), 0);
        ASSERT_EQ(pipe(ready), 0);
        pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) return;  // the test body's in_child() branch takes over
        close(port_pipe_[0]);
        ASSERT_NO_FATAL_FAILURE(Pair::SetUp());
        ASSERT_NO_FATAL_FAILURE(listen());
        ASSERT_EQ(write(port_pipe_[1], &port, sizeof port), static_cast<ssize_t>(sizeof port));
        close(port_pipe_[1]);
    }
    void TearDown() override {
        if (pid > 0) {
            // A child a failed test left behind.
            if (waitpid(pid, nullptr, WNOHANG) == 0) kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
        Pair::TearDown();
    }

    // In the child: waits for the listener's port and returns true. In the parent: false.
    bool in_child() {
        if (pid != 0) return false;
        close(port_pipe_[1]);
        if (read(port_pipe_[0], &port, sizeof port) != static_cast<ssize_t>(sizeof port)) _exit(99);
        return true;
    }

    pid_t pid = -1;
    int ready[2] = {-1, -1};

  private:
    int port_pipe_[2] = {-1, -1};
};

// ---- The device ----

TEST(Device, ListOpenQuery) {
    const Api &a = api();
    ASSERT_TRUE(a.ok);
    int n = 0;
    ibv_device **list = a.ibv_get_device_list(&n);
    ASSERT_EQ(n, 1);
    EXPECT_STREQ(a.ibv_get_device_name(list[0]), "emu_rdma0");
    EXPECT_STREQ(list[0]->dev_name, "emu_rdma0");
    EXPECT_EQ(list[0]->node_type, IBV_NODE_CA);
    EXPECT_EQ(list[0]->transport_type, IBV_TRANSPORT_IB);
    EXPECT_NE(a.ibv_get_device_guid(list[0]), 0U);
    ibv_context *ctx = a.ibv_open_device(list[0]);
    a.ibv_free_device_list(list);
    ASSERT_NE(ctx, nullptr);
    ibv_device_attr da{};
    ASSERT_EQ(a.ibv_query_device(ctx, &da), 0);
    EXPECT_EQ(da.max_qp_wr, 4096);
    EXPECT_EQ(da.max_sge, 16);
    EXPECT_EQ(da.max_srq_wr, 4096);
    EXPECT_EQ(da.max_srq_sge, 16);
    EXPECT_EQ(da.max_cqe, 65536);
    EXPECT_EQ(da.max_mr_size, 1ULL << 40);
    EXPECT_EQ(da.max_qp, 4096);
    EXPECT_EQ(da.max_qp_rd_atom, 16);
    EXPECT_EQ(da.phys_port_cnt, 1);
    ibv_port_attr pa{};
    ASSERT_EQ(a.ibv_query_port(ctx, 1, reinterpret_cast<_compat_ibv_port_attr *>(&pa)), 0);
    EXPECT_EQ(pa.state, IBV_PORT_ACTIVE);
    EXPECT_EQ(pa.active_mtu, IBV_MTU_4096);
    EXPECT_EQ(pa.max_msg_sz, 1U << 30);
    EXPECT_EQ(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
    EXPECT_EQ(pa.gid_tbl_len, 1);
    EXPECT_EQ(a.ibv_query_port(ctx, 2, reinterpret_cast<_compat_ibv_port_attr *>(&pa)), EINVAL);
    ibv_gid gid{};
    EXPECT_EQ(a.ibv_query_gid(ctx, 1, 0, &gid), 0);
    EXPECT_EQ(gid.raw[15], 1);  // ::ffff:127.0.0.1
    EXPECT_STREQ(a.ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error");
    EXPECT_STREQ(a.rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED");
    EXPECT_EQ(a.ibv_close_device(ctx), 0);

    ibv_context **devs = a.rdma_get_devices(&n);
    ASSERT_NE(devs, nullptr);
    EXPECT_EQ(n, 1);
    EXPECT_NE(devs[0], nullptr);
    EXPECT_EQ(devs[1], nullptr);
    a.rdma_free_devices(devs);
}

TEST(Device, MemoryRegistrationChecks) {
    const Api &a = api();
    ASSERT_TRUE(a.ok);
    ibv_device **list = a.ibv_get_device_list(nullptr);
    ibv_context *ctx = a.ibv_open_device(list[0]);
    a.ibv_free_device_list(list);
    ASSERT_NE(ctx, nullptr);
    ibv_pd *pd = a.ibv_alloc_pd(ctx);
    ASSERT_NE(pd, nullptr);
    std::vector<char> buf(4096);
    errno = 0;
    EXPECT_EQ(a.ibv_reg_mr(pd, buf.data(), 0, IBV_ACCESS_LOCAL_WRITE), nullptr);
    EXPECT_EQ(errno, EINVAL);
    errno = 0;
    EXPECT_EQ(a.ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
    EXPECT_EQ(errno, EINVAL);
    std::vector<ibv_mr *> mrs;
    std::vector<uint32_t> keys;
    for (int i = 0; i < 8; ++i) {
        ibv_mr *mr = a.ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
        ASSERT_NE(mr, nullptr);
        EXPECT_NE(mr->lkey, 0U);
        EXPECT_NE(mr->rkey, 0U);
        keys.push_back(mr->lkey);
        keys.push_back(mr->rkey);
        mrs.push_back(mr);
    }
    std::sort(keys.begin(), keys.end());
    EXPECT_EQ(std::unique(keys.begin(), keys.end()), keys.end());
    emurdma_stats st{};
    a.emurdma_get_stats(&st);
    EXPECT_GE(st.mrs_registered, 8U);
    EXPECT_EQ(a.ibv_dealloc_pd(pd), EBUSY);
    for (ibv_mr *mr : mrs) EXPECT_EQ(a.ibv_dereg_mr(mr), 0);
    EXPECT_EQ(a.ibv_dealloc_pd(pd), 0);
    EXPECT_EQ(a.ibv_close_device(ctx), 0);
}

// ---- Connection management ----

TEST_F(Cm, BindListenAndResolveErrors) {
    const Api &api_ = api();
    listen();
    rdma_cm_id *id = nullptr;
    EXPECT_EQ(api_.rdma_create_id(lch, &id, nullptr, RDMA_PS_UDP), -1);
    EXPECT_EQ(errno, EINVAL);
    ASSERT_EQ(api_.rdma_create_id(lch, &id, nullptr, RDMA_PS_TCP), 0);
    sockaddr_in same = loopback(port);
    EXPECT_EQ(api_.rdma_bind_addr(id, reinterpret_cast<sockaddr *>(&same)), -1);
    EXPECT_EQ(errno, EADDRINUSE);
    sockaddr_in other{};
    other.sin_family = AF_INET;
    other.sin_addr.s_addr = inet_addr("10.255.255.1");
    EXPECT_EQ(api_.rdma_bind_addr(id, reinterpret_cast<sockaddr *>(&other)), -1);
    EXPECT_EQ(errno, ENODEV);
    // The wildcard address binds without a device (verbs stays NULL until a request comes).
    sockaddr_in any{};
    any.sin_family = AF_INET;
    ASSERT_EQ(api_.rdma_bind_addr(id, reinterpret_cast<sockaddr *>(&any)), 0);
    EXPECT_EQ(id->verbs, nullptr);
    EXPECT_NE(listener->verbs, nullptr);
    api_.rdma_destroy_id(id);

    rdma_event_channel *ch = api_.rdma_create_event_channel();
    ASSERT_EQ(api_.rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
    other.sin_port = htons(1234);
    ASSERT_EQ(api_.rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&other), 100), 0);
    EventInfo ev = next_event(ch);
    EXPECT_EQ(ev.type, RDMA_CM_EVENT_ADDR_ERROR);
    EXPECT_EQ(ev.status, -ENODEV);
    api_.rdma_destroy_id(id);
    api_.rdma_destroy_event_channel(ch);
}

TEST_F(Cm, ConnectToNobodyIsRejected) {
    listen();
    uint16_t unused = port;
    api().rdma_destroy_id(listener);  // nobody listens there any more
    listener = nullptr;
    ASSERT_EQ(start_connect(a, unused, {}), 0);
    EventInfo ev = next_event(a.ch);
    EXPECT_EQ(ev.type, RDMA_CM_EVENT_REJECTED);
    EXPECT_EQ(ev.status, 8);  // IB CM: invalid service ID
    EXPECT_TRUE(ev.pdata_null);
}

TEST_F(Cm, AddrResolvedFillsTheId) {
    listen();
    ASSERT_EQ(start_connect(a, port, {}), 0);
    EXPECT_NE(a.id->verbs, nullptr);
    EXPECT_EQ(a.id->port_num, 1);
    EXPECT_EQ(a.id->route.addr.src_sin.sin_family, AF_INET);
    EXPECT_NE(a.id->route.addr.src_sin.sin_port, 0);
    EXPECT_EQ(ntohs(a.id->route.addr.dst_sin.sin_port), port);
    EXPECT_EQ(qp_state(a.qp()), IBV_QPS_INIT);
}

TEST_F(Cm, RejectWithPrivateData) {
    listen();
    const char msg[] = "not today";
    ASSERT_EQ(start_connect(a, port, {}), 0);
    EventInfo req = next_event(lch);
    ASSERT_EQ(req.type, RDMA_CM_EVENT_CONNECT_REQUEST);
    EXPECT_EQ(req.listen_id, listener);
    EXPECT_EQ(req.id->channel, lch);
    EXPECT_EQ(req.id->context, listener->context);
    EXPECT_NE(req.id->verbs, nullptr);
    std::vector<char> big(149, 'x');
    EXPECT_EQ(api().rdma_reject(req.id, big.data(), 149), -1);
    EXPECT_EQ(errno, EINVAL);
    ASSERT_EQ(api().rdma_reject(req.id, msg, sizeof(msg)), 0);
    EventInfo ev = next_event(a.ch);
    EXPECT_EQ(ev.type, RDMA_CM_EVENT_REJECTED);
    EXPECT_EQ(ev.status, 28);          // consumer reject
    ASSERT_EQ(ev.pdata.size(), 148U);  // IB CM's REJ carries 148 bytes, zero-padded
    EXPECT_EQ(memcmp(ev.pdata.data(), msg, sizeof(msg)), 0);
    api().rdma_destroy_id(req.id);
}

TEST_F(Cm, PrivateDataLimits) {
    listen();
    std::vector<uint8_t> d(200, 7);
    ASSERT_EQ(start_connect(a, port, {}, d.data(), 56), 0);
    EventInfo req;
    ASSERT_EQ(take_request(p, lch, {}, &req), 0);
    EXPECT_EQ(req.pdata.size(), 56U);
    EXPECT_EQ(accept_request(p, {}, d.data(), 197), -1);
    EXPECT_EQ(errno, EINVAL);

    Side b;
    EXPECT_EQ(start_connect(b, port, {}, d.data(), 57), 7);  // rdma_connect refuses 57 bytes
    EXPECT_EQ(errno, EINVAL);
    b.destroy();
}

TEST_F(Cm, MigrateIdMovesItsEvents) {
    connect();
    rdma_event_channel *ch2 = api().rdma_create_event_channel();
    ASSERT_EQ(api().rdma_migrate_id(p.id, ch2), 0);
    EXPECT_EQ(p.id->channel, ch2);
    ASSERT_EQ(api().rdma_disconnect(a.id), 0);
    EXPECT_EQ(next_event(a.ch).type, RDMA_CM_EVENT_DISCONNECTED);
    EventInfo ev = next_event(ch2);
    EXPECT_EQ(ev.type, RDMA_CM_EVENT_DISCONNECTED);
    EXPECT_EQ(ev.id, p.id);
    EXPECT_FALSE(next_event(lch, 50).got);
    p.destroy();
    api().rdma_destroy_event_channel(ch2);
}

TEST_F(Cm, NonBlockingChannelSaysEagain) {
    listen();
    int fl = fcntl(lch->fd, F_GETFL);
    ASSERT_EQ(fcntl(lch->fd, F_SETFL, fl | O_NONBLOCK), 0);
    rdma_cm_event *ev = nullptr;
    EXPECT_EQ(api().rdma_get_cm_event(lch, &ev), -1);
    EXPECT_EQ(errno, EAGAIN);
}

// Two processes: the child connects with 56 bytes of private data, the parent accepts with 196
// (its MR's address and rkey in them); then data both ways and an RDMA write by the child.
TEST_F(TwoProcess, ConnectPrivateDataBothWaysAndData) {
    if (in_child()) {
        Side c;
        uint8_t req[56];
        for (int i = 0; i < 56; ++i) req[i] = static_cast<uint8_t>(i + 1);
        CHILD_CHECK(start_connect(c, port, {}, req, sizeof(req)) == 0);
        EventInfo est = next_event(c.ch);
        CHILD_CHECK(est.type == RDMA_CM_EVENT_ESTABLISHED);
        CHILD_CHECK(est.pdata.size() == 196);
        for (int i = 16; i < 196; ++i) CHILD_CHECK(est.pdata[i] == static_cast<uint8_t>(255 - i));
        RemoteBuf target = get_remote(est.pdata);
        char in[64] = {};
        char out[64] = "written by the child";
        ibv_mr *mr_in = c.reg(in, sizeof(in));
        ibv_mr *mr_out = c.reg(out, sizeof(out));
        CHILD_CHECK(mr_in && mr_out);
        CHILD_CHECK(post_recv(c.qp(), 1, {sge(in, sizeof(in), mr_in)}) == 0);
        std::vector<ibv_wc> wc = poll_wc(c.cq, 1);
        CHILD_CHECK(wc.size() == 1 && wc[0].status == IBV_WC_SUCCESS);
        CHILD_CHECK(wc[0].opcode == IBV_WC_RECV && wc[0].byte_len == 6);
        CHILD_CHECK(strcmp(in, "hello") == 0);
        CHILD_CHECK(post_send(c.qp(), IBV_WR_RDMA_WRITE, 2, {sge(out, sizeof(out), mr_out)},
                              IBV_SEND_SIGNALED, target.addr, target.rkey) == 0);
        CHILD_CHECK(post_send(c.qp(), IBV_WR_SEND, 3, {sge(out, 4, mr_out)}) == 0);
        wc = poll_wc(c.cq, 2);
        CHILD_CHECK(wc.size() == 2 && wc[0].wr_id == 2 && wc[0].status == IBV_WC_SUCCESS &&
                    wc[1].wr_id == 3 && wc[1].status == IBV_WC_SUCCESS);
        CHILD_CHECK(next_event(c.ch).type == RDMA_CM_EVENT_DISCONNECTED);
        c.destroy();
        _exit(0);
    }

    char target[64] = {};
    char msg[8] = "hello";
    char note[16] = {};
    EventInfo req;
    ASSERT_EQ(take_request(p, lch, {}, &req), 0);
    ASSERT_EQ(req.pdata.size(), 56U);
    for (int i = 0; i < 56; ++i) EXPECT_EQ(req.pdata[i], i + 1);
    ibv_mr *mr_t = p.reg(target, sizeof(target));
    ibv_mr *mr_m = p.reg(msg, sizeof(msg));
    ibv_mr *mr_n = p.reg(note, sizeof(note));
    uint8_t rep[196];
    for (int i = 0; i < 196; ++i) rep[i] = static_cast<uint8_t>(255 - i);
    put_remote(rep, target, mr_t);
    ASSERT_EQ(post_recv(p.qp(), 10, {sge(note, sizeof(note), mr_n)}), 0);
    ASSERT_EQ(accept_request(p, {}, rep, sizeof(rep)), 0);
    ASSERT_EQ(next_event(lch).type, RDMA_CM_EVENT_ESTABLISHED);
    ASSERT_EQ(post_send(p.qp(), IBV_WR_SEND, 11, {sge(msg, 6, mr_m)}), 0);
    std::vector<ibv_wc> wc = poll_wc(p.cq, 2);
    ASSERT_EQ(wc.size(), 2U);
    EXPECT_EQ(wc[0].wr_id, 11U);
    EXPECT_EQ(wc[1].wr_id, 10U);  // the child's send, after its write
    EXPECT_EQ(wc[1].byte_len, 4U);
    EXPECT_STREQ(target, "written by the child");
    ASSERT_EQ(api().rdma_disconnect(p.id), 0);
    EXPECT_EQ(next_event(lch).type, RDMA_CM_EVENT_DISCONNECTED);
    ASSERT_NO_FATAL_FAILURE(expect_child_passed(pid));
}

// The app's polls drive the NIC; a process that stops making calls still has its NIC thread
// serve its memory (an RDMA READ needs nothing of the target's app) and take its messages.
TEST_F(TwoProcess, IdleTargetIsServedByItsNic) {
    if (in_child()) {
        Side c;
        CHILD_CHECK(start_connect(c, port, {}) == 0);
        EventInfo est = next_event(c.ch);
        CHILD_CHECK(est.type == RDMA_CM_EVENT_ESTABLISHED);
        RemoteBuf target = get_remote(est.pdata);
        // The target polled its CQ just before it went quiet: its NIC takes over after a while.
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        char got[32] = {};
        char out[32] = "written while idle";
        ibv_mr *mr_got = c.reg(got, sizeof(got));
        ibv_mr *mr_out = c.reg(out, sizeof(out));
        CHILD_CHECK(mr_got && mr_out);
        for (int round = 0; round < 3; ++round) {
            CHILD_CHECK(post_send(c.qp(), IBV_WR_RDMA_READ, 1, {sge(got, sizeof(got), mr_got)},
                                  IBV_SEND_SIGNALED, target.addr, target.rkey) == 0);
            std::vector<ibv_wc> wc = poll_wc(c.cq, 1);
            CHILD_CHECK(wc.size() == 1 && wc[0].status == IBV_WC_SUCCESS);
            CHILD_CHECK(strcmp(got, "the target's memory") == 0);
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        CHILD_CHECK(post_send(c.qp(), IBV_WR_RDMA_WRITE, 2, {sge(out, sizeof(out), mr_out)},
                              IBV_SEND_SIGNALED, target.addr + 32, target.rkey) == 0);
        CHILD_CHECK(post_send(c.qp(), IBV_WR_SEND, 3, {sge(out, 8, mr_out)}) == 0);
        std::vector<ibv_wc> wc = poll_wc(c.cq, 2);
        CHILD_CHECK(wc.size() == 2 && wc[0].wr_id == 2 && wc[0].status == IBV_WC_SUCCESS &&
                    wc[1].wr_id == 3 && wc[1].status == IBV_WC_SUCCESS);
        c.destroy();
        _exit(0);
    }

    char target[64] = "the target's memory";
    char note[16] = {};
    EventInfo req;
    ASSERT_EQ(take_request(p, lch, {}, &req), 0);
    ibv_mr *mr_t = p.reg(target, sizeof(target));
    ibv_mr *mr_n = p.reg(note, sizeof(note));
    uint8_t rep[16];
    put_remote(rep, target, mr_t);
    ASSERT_EQ(post_recv(p.qp(), 10, {sge(note, sizeof(note), mr_n)}), 0);
    ASSERT_EQ(accept_request(p, {}, rep, sizeof(rep)), 0);
    ASSERT_EQ(next_event(lch).type, RDMA_CM_EVENT_ESTABLISHED);
    ibv_wc none[4];
    for (int i = 0; i < 100; ++i) EXPECT_EQ(ibv_poll_cq(p.cq, 4, none), 0);
    // No call into the library until the child is done.
    ASSERT_NO_FATAL_FAILURE(expect_child_passed(pid));
    // The send came after the write: its completion says the write has landed.
    std::vector<ibv_wc> wc = poll_wc(p.cq, 1);
    ASSERT_GE(wc.size(), 1U);
    EXPECT_EQ(wc[0].wr_id, 10U);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[0].byte_len, 8U);
    EXPECT_EQ(memcmp(note, "written ", 8), 0);
    EXPECT_STREQ(target + 32, "written while idle");
}

// Round trips between two processes that busy-poll their CQs, as a polling provider does. The
// time is information, not a check (it depends on the machine and its load).
TEST_F(TwoProcess, PingPongBetweenPollingProcesses) {
    constexpr int kRounds = 5000;
    constexpr int kWindow = 16;  // receives kept posted

    if (in_child()) {
        Side c;
        CHILD_CHECK(start_connect(c, port, {}) == 0);
        char buf[kWindow][64] = {};
        ibv_mr *mr = c.reg(buf, sizeof(buf));
        CHILD_CHECK(mr != nullptr);
        for (int i = 0; i < kWindow; ++i)
            CHILD_CHECK(post_recv(c.qp(), i, {sge(buf[i], 64, mr)}) == 0);
        CHILD_CHECK(next_event(c.ch).type == RDMA_CM_EVENT_ESTABLISHED);
        for (int i = 0; i < kRounds; ++i) {
            ibv_wc wc;
            int n;
            auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while ((n = ibv_poll_cq(c.cq, 1, &wc)) == 0)
                CHILD_CHECK(std::chrono::steady_clock::now() < give_up);
            CHILD_CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV);
            int slot = static_cast<int>(wc.wr_id);
            int got;
            memcpy(&got, buf[slot], sizeof(got));
            CHILD_CHECK(got == i);
            CHILD_CHECK(
                post_send(c.qp(), IBV_WR_SEND, i, {sge(buf[slot], 8, mr)}, IBV_SEND_INLINE) == 0);
            CHILD_CHECK(post_recv(c.qp(), slot, {sge(buf[slot], 64, mr)}) == 0);
        }
        CHILD_CHECK(next_event(c.ch).type == RDMA_CM_EVENT_DISCONNECTED);
        c.destroy();
        _exit(0);
    }

    EventInfo req;
    char buf[kWindow][64] = {};
    char out[8] = {};
    ASSERT_EQ(accept_one(p, lch, {}, &req), 0);
    ibv_mr *mr = p.reg(buf, sizeof(buf));
    ibv_mr *mr_out = p.reg(out, sizeof(out));
    for (int i = 0; i < kWindow; ++i) ASSERT_EQ(post_recv(p.qp(), i, {sge(buf[i], 64, mr)}), 0);
    ASSERT_EQ(next_event(lch).type, RDMA_CM_EVENT_ESTABLISHED);
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kRounds; ++i) {
        memcpy(out, &i, sizeof(i));
        ASSERT_EQ(post_send(p.qp(), IBV_WR_SEND, i, {sge(out, 8, mr_out)}, IBV_SEND_INLINE), 0);
        ibv_wc wc;
        int n;
        auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while ((n = ibv_poll_cq(p.cq, 1, &wc)) == 0) {
            ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "round " << i;
        }
        ASSERT_EQ(n, 1);
        ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
        ASSERT_EQ(wc.opcode, IBV_WC_RECV);
        int slot = static_cast<int>(wc.wr_id);
        int got;
        memcpy(&got, buf[slot], sizeof(got));
        ASSERT_EQ(got, i);
        ASSERT_EQ(post_recv(p.qp(), slot, {sge(buf[slot], 64, mr)}), 0);
    }
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    printf("%d round trips between processes, %.1f us each\n", kRounds,
           static_cast<double>(us) / kRounds);
    ASSERT_EQ(api().rdma_disconnect(p.id), 0);
    EXPECT_EQ(next_event(lch).type, RDMA_CM_EVENT_DISCONNECTED);
    ASSERT_NO_FATAL_FAILURE(expect_child_passed(pid));
}

// EMURDMA_FAULT is read when a process starts using the device: the child of a fork starts
// afresh with the environment it was forked with.
TEST_F(TwoProcess, FaultEnvFailsTheQpAfterNSends) {
    setenv("EMURDMA_FAULT", "qp_error_after:3", 1);
    if (in_child()) {
        Side c;
        CHILD_CHECK(start_connect(c, port, {}) == 0);
        CHILD_CHECK(next_event(c.ch).type == RDMA_CM_EVENT_ESTABLISHED);
        char buf[8] = "fault";
        ibv_mr *mr = c.reg(buf, sizeof(buf));
        for (int i = 1; i <= 5; ++i)
            CHILD_CHECK(post_send(c.qp(), IBV_WR_SEND, i, {sge(buf, 4, mr)}) == 0);
        std::vector<ibv_wc> wc = poll_wc(c.cq, 5);
        CHILD_CHECK(wc.size() == 5);
        for (int i = 0; i < 5; ++i) {
            CHILD_CHECK(wc[i].wr_id == static_cast<uint64_t>(i + 1));
            CHILD_CHECK(wc[i].status == (i < 3 ? IBV_WC_SUCCESS : IBV_WC_WR_FLUSH_ERR));
        }
        CHILD_CHECK(qp_state(c.qp()) == IBV_QPS_ERR);
        CHILD_CHECK(next_event(c.ch).type == RDMA_CM_EVENT_DISCONNECTED);
        c.destroy();
        _exit(0);
    }
    unsetenv("EMURDMA_FAULT");
    ASSERT_GT(pid, 0);
    EventInfo req;
    ASSERT_EQ(take_request(p, lch, {}, &req), 0);
    char buf[8 * 5];
    ibv_mr *mr = p.reg(buf, sizeof(buf));
    for (int i = 0; i < 5; ++i) ASSERT_EQ(post_recv(p.qp(), 100 + i, {sge(buf + 8 * i, 8, mr)}), 0);
    ASSERT_EQ(api().rdma_accept(p.id, nullptr), 0);
    ASSERT_EQ(next_event(lch).type, RDMA_CM_EVENT_ESTABLISHED);
    EXPECT_EQ(next_event(lch).type, RDMA_CM_EVENT_DISCONNECTED);
    // The first three arrived; the other two were flushed at the sender (whether or not they
    // had been executed here, as on RC), and what is left here flushes with the disconnect.
    std::vector<ibv_wc> wc = poll_wc(p.cq, 5);
    ASSERT_EQ(wc.size(), 5U);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS);
    ASSERT_NO_FATAL_FAILURE(expect_child_passed(pid));
}

TEST_F(Cm, ListenerOnOneAddressIgnoresAnother) {
    listen();  // on 127.0.0.1
    sockaddr_in dst = loopback(port);
    dst.sin_addr.s_addr = inet_addr("127.0.0.2");
    ASSERT_EQ(resolve(a, dst, 100), 0);
    ASSERT_TRUE(make_qp(a, {}));
    ASSERT_EQ(api().rdma_connect(a.id, nullptr), 0);
    EventInfo ev = next_event(a.ch);
    EXPECT_EQ(ev.type, RDMA_CM_EVENT_REJECTED);
    EXPECT_EQ(ev.status, 8);
    EXPECT_FALSE(next_event(lch, 50).got);
}

// EMURDMA_NETDEV: an interface without the loopback addresses serves none of them.
TEST(Netdev, OnlyTheInterfacesAddressesAreServed) {
    ASSERT_TRUE(api().ok);
    setenv("EMURDMA_NETDEV", "emurdma-none0", 1);
    pid_t pid = fork();
    if (pid == 0) {
        const Api &a = api();
        rdma_event_channel *ch = a.rdma_create_event_channel();
        rdma_cm_id *id = nullptr;
        CHILD_CHECK(a.rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0);
        sockaddr_in lo = loopback(0);
        CHILD_CHECK(a.rdma_bind_addr(id, reinterpret_cast<sockaddr *>(&lo)) == -1);
        CHILD_CHECK(errno == ENODEV);
        lo.sin_port = htons(7);
        CHILD_CHECK(a.rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&lo), 100) == 0);
        CHILD_CHECK(next_event(ch).type == RDMA_CM_EVENT_ADDR_ERROR);
        _exit(0);
    }
    unsetenv("EMURDMA_NETDEV");
    ASSERT_GT(pid, 0);
    ASSERT_NO_FATAL_FAILURE(expect_child_passed(pid));
}

TEST_F(Cm, BlockingGetWakesOnEvent) {
    rdma_event_channel *ch = api().rdma_create_event_channel();
    rdma_cm_id *id = nullptr;
    ASSERT_EQ(api().rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
    rdma_cm_event_type got = RDMA_CM_EVENT_TIMEWAIT_EXIT;
    std::thread waiter([&] {
        rdma_cm_event *ev = nullptr;
        if (api().rdma_get_cm_event(ch, &ev) == 0) {
            got = ev->event;
            api().rdma_ack_cm_event(ev);
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    sockaddr_in dst = loopback(9);
    ASSERT_EQ(api().rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr *>(&dst), 100), 0);
    waiter.join();
    EXPECT_EQ(got, RDMA_CM_EVENT_ADDR_RESOLVED);
    api().rdma_destroy_id(id);
    api().rdma_destroy_event_channel(ch);
}

// ---- Data movement ----

TEST_F(Data, SendRecvOverSrqInPostingOrder) {
    connect({}, QpOptions{.srq = true});
    char src[3][32] = {"one", "two two", "three three three"};
    char dst[3][32] = {};
    ibv_mr *ms = a.reg(src, sizeof(src));
    ibv_mr *md = p.reg(dst, sizeof(dst));
    for (int i = 0; i < 3; ++i) ASSERT_EQ(post_srq(p.srq, 100 + i, {sge(dst[i], 32, md)}), 0);
    for (int i = 0; i < 3; ++i)
        ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, i,
                            {sge(src[i], static_cast<uint32_t>(strlen(src[i]) + 1), ms)}),
                  0);
    std::vector<ibv_wc> rx = poll_wc(p.cq, 3);
    ASSERT_EQ(rx.size(), 3U);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(rx[i].status, IBV_WC_SUCCESS);
        EXPECT_EQ(rx[i].opcode, IBV_WC_RECV);
        EXPECT_EQ(rx[i].wr_id, 100U + i);
        EXPECT_EQ(rx[i].byte_len, strlen(src[i]) + 1);
        EXPECT_EQ(rx[i].qp_num, p.qp()->qp_num);
        EXPECT_EQ(rx[i].src_qp, a.qp()->qp_num);
        EXPECT_FALSE(rx[i].wc_flags & IBV_WC_WITH_IMM);
        EXPECT_STREQ(dst[i], src[i]);
    }
    std::vector<ibv_wc> tx = poll_wc(a.cq, 3);
    ASSERT_EQ(tx.size(), 3U);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(tx[i].wr_id, static_cast<uint64_t>(i));
        EXPECT_EQ(tx[i].opcode, IBV_WC_SEND);
    }
    EXPECT_NE(a.qp()->qp_num, p.qp()->qp_num);
}

TEST_F(Data, SendWithImm) {
    connect();
    char buf[16] = "imm";
    char dst[16] = {};
    ibv_mr *ms = a.reg(buf, sizeof(buf));
    ibv_mr *md = p.reg(dst, sizeof(dst));
    ASSERT_EQ(post_recv(p.qp(), 5, {sge(dst, sizeof(dst), md)}), 0);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND_WITH_IMM, 1, {sge(buf, 4, ms)}, IBV_SEND_SIGNALED, 0, 0,
                        htonl(0xabcd1234)),
              0);
    std::vector<ibv_wc> rx = poll_wc(p.cq, 1);
    ASSERT_EQ(rx.size(), 1U);
    EXPECT_EQ(rx[0].opcode, IBV_WC_RECV);
    EXPECT_TRUE(rx[0].wc_flags & IBV_WC_WITH_IMM);
    EXPECT_EQ(rx[0].imm_data, htonl(0xabcd1234));
    EXPECT_EQ(rx[0].byte_len, 4U);
}

TEST_F(Data, InlineSendCopiesAtPostAndHasALimit) {
    connect();
    char buf[200];
    char dst[200] = {};
    memset(buf, 'a', sizeof(buf));
    ibv_mr *md = p.reg(dst, sizeof(dst));
    ASSERT_EQ(post_recv(p.qp(), 1, {sge(dst, sizeof(dst), md)}), 0);
    // No MR and no lkey: inline data is copied by the CPU at post time.
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 1, {sge(buf, 100, nullptr)},
                        IBV_SEND_SIGNALED | IBV_SEND_INLINE),
              0);
    memset(buf, 'b', sizeof(buf));
    std::vector<ibv_wc> rx = poll_wc(p.cq, 1);
    ASSERT_EQ(rx.size(), 1U);
    EXPECT_EQ(rx[0].byte_len, 100U);
    EXPECT_EQ(dst[0], 'a');
    EXPECT_EQ(dst[99], 'a');
    // Beyond the device's 128 bytes (the QP says what it has).
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    ASSERT_EQ(api().ibv_query_qp(a.qp(), &attr, IBV_QP_CAP, &init), 0);
    EXPECT_EQ(init.cap.max_inline_data, 128U);
    ibv_send_wr *bad = nullptr;
    EXPECT_EQ(post_send(a.qp(), IBV_WR_SEND, 2, {sge(buf, 129, nullptr)},
                        IBV_SEND_SIGNALED | IBV_SEND_INLINE, 0, 0, 0, &bad),
              EINVAL);
    EXPECT_NE(bad, nullptr);
    emurdma_stats st{};
    api().emurdma_get_stats(&st);
    EXPECT_GE(st.inline_sends, 1U);
}

TEST_F(Data, SgeLimits) {
    connect();
    std::vector<char> buf(64);
    ibv_mr *mr = a.reg(buf.data(), buf.size());
    std::vector<ibv_sge> many(17, sge(buf.data(), 1, mr));
    EXPECT_EQ(post_send(a.qp(), IBV_WR_SEND, 1, many), EINVAL);
    EXPECT_EQ(post_recv(a.qp(), 1, many), EINVAL);
    // rdma_create_qp asking for more than the device has.
    Side b;
    b.ch = api().rdma_create_event_channel();
    b.own_ch = true;
    ASSERT_EQ(api().rdma_create_id(b.ch, &b.id, nullptr, RDMA_PS_TCP), 0);
    sockaddr_in src = loopback(0);
    ASSERT_EQ(api().rdma_bind_addr(b.id, reinterpret_cast<sockaddr *>(&src)), 0);
    b.pd = api().ibv_alloc_pd(b.id->verbs);
    b.cq = api().ibv_create_cq(b.id->verbs, 16, nullptr, nullptr, 0);
    ASSERT_TRUE(b.pd && b.cq);
    auto try_caps = [&](uint32_t sge_n, uint32_t inl, uint32_t wr) {
        ibv_qp_init_attr qa{};
        qa.send_cq = qa.recv_cq = b.cq;
        qa.qp_type = IBV_QPT_RC;
        qa.cap = {wr, 1, sge_n, 1, inl};
        return api().rdma_create_qp(b.id, b.pd, &qa) == 0 ? 0 : errno;
    };
    EXPECT_EQ(try_caps(17, 0, 1), EINVAL);
    EXPECT_EQ(try_caps(1, 129, 1), EINVAL);
    EXPECT_EQ(try_caps(1, 0, 5000), EINVAL);
    ibv_qp_init_attr qa{};
    qa.send_cq = qa.recv_cq = b.cq;
    qa.qp_type = IBV_QPT_UD;
    qa.cap = {1, 1, 1, 1, 0};
    EXPECT_EQ(api().rdma_create_qp(b.id, b.pd, &qa), -1);
    b.destroy();
}

TEST_F(Data, WriteAndReadWithScatterGather) {
    connect();
    char l1[8] = "abcdefg", l2[8] = "hijklmn", l3[8] = "opqrstu";
    std::vector<char> remote(64, 0);
    ibv_mr *ml = a.reg(l1, sizeof(l1));
    ibv_mr *ml2 = a.reg(l2, sizeof(l2));
    ibv_mr *ml3 = a.reg(l3, sizeof(l3));
    ibv_mr *mr = p.reg(remote.data(), remote.size());
    uint64_t raddr = reinterpret_cast<uintptr_t>(remote.data()) + 8;
    ASSERT_EQ(
        post_send(a.qp(), IBV_WR_RDMA_WRITE, 1, {sge(l1, 7, ml), sge(l2, 7, ml2), sge(l3, 7, ml3)},
                  IBV_SEND_SIGNALED, raddr, mr->rkey),
        0);
    char r1[10] = {}, r2[11] = {};
    ibv_mr *mr1 = a.reg(r1, sizeof(r1));
    ibv_mr *mr2 = a.reg(r2, sizeof(r2));
    ASSERT_EQ(post_send(a.qp(), IBV_WR_RDMA_READ, 2, {sge(r1, 10, mr1), sge(r2, 11, mr2)},
                        IBV_SEND_SIGNALED, raddr, mr->rkey),
              0);
    std::vector<ibv_wc> wc = poll_wc(a.cq, 2);
    ASSERT_EQ(wc.size(), 2U);
    EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_WRITE);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[1].opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
    EXPECT_EQ(std::string(remote.data() + 8, 21), "abcdefghijklmnopqrstu");
    EXPECT_EQ(remote[7], 0);
    EXPECT_EQ(remote[29], 0);
    EXPECT_EQ(std::string(r1, 10) + std::string(r2, 11), "abcdefghijklmnopqrstu");
    // No receive was consumed and the target saw no completion.
    EXPECT_TRUE(drain_wc(p.cq).empty());
    emurdma_stats st{};
    api().emurdma_get_stats(&st);
    EXPECT_GE(st.writes, 1U);
    EXPECT_GE(st.reads, 1U);
}

// A READ much larger than a socket takes at once: its response comes in many parts, each placed
// where it belongs in the READ's scatter list (two MRs; the parts' edges fall anywhere).
TEST_F(Data, LargeReadLandsWholeAcrossItsScatterList) {
    connect();
    constexpr size_t kFirst = 3u << 20, kSecond = 5u << 20;
    std::vector<uint8_t> remote(kFirst + kSecond);
    for (size_t i = 0; i < remote.size(); ++i) remote[i] = uint8_t(i * 131 + (i >> 16));
    std::vector<uint8_t> d1(kFirst), d2(kSecond);
    ibv_mr *m1 = a.reg(d1.data(), d1.size());
    ibv_mr *m2 = a.reg(d2.data(), d2.size());
    ibv_mr *mr = p.reg(remote.data(), remote.size());
    ASSERT_EQ(post_send(a.qp(), IBV_WR_RDMA_READ, 1,
                        {sge(d1.data(), kFirst, m1), sge(d2.data(), kSecond, m2)},
                        IBV_SEND_SIGNALED, reinterpret_cast<uintptr_t>(remote.data()), mr->rkey),
              0);
    ASSERT_NO_FATAL_FAILURE(expect_completions(a.cq, {{1, IBV_WC_SUCCESS}}));
    EXPECT_TRUE(std::equal(d1.begin(), d1.end(), remote.begin()));
    EXPECT_TRUE(std::equal(d2.begin(), d2.end(), remote.begin() + kFirst));
}

// A large READ response is sent from the responder's MR as the socket takes it. Deregistering
// that MR while the response is on its way, and unmapping its memory, must leave the NIC reading
// nothing freed: the READ delivers what the memory held at deregistration. The requester's reads
// are held until then, so the socket (a few hundred KiB) holds only the start of the 64 MiB
// response.
TEST_F(Data, ResponderMrDeregisteredWhileItsReadResponseIsOnItsWay) {
    connect();
    constexpr size_t kLen = 64u << 20;
    auto remote = std::make_unique<std::vector<uint8_t>>(kLen);
    for (size_t i = 0; i < kLen; ++i) (*remote)[i] = uint8_t(i * 7 + (i >> 12));
    const std::vector<uint8_t> want = *remote;
    std::vector<uint8_t> dst(kLen);
    ibv_mr *md = a.reg(dst.data(), dst.size());
    ibv_mr *mr = p.reg(remote->data(), remote->size());
    emurdma_stats st{};
    api().emurdma_get_stats(&st);
    const unsigned long long served = st.read_responses;
    ASSERT_EQ(api().emurdma_hold_reads(a.qp()->qp_num, 1), 0);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_RDMA_READ, 1, {sge(dst.data(), kLen, md)}, IBV_SEND_SIGNALED,
                        reinterpret_cast<uintptr_t>(remote->data()), mr->rkey),
              0);
    // The responder's NIC serves the request on its own.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    do {
        api().emurdma_get_stats(&st);
    } while (st.read_responses == served && std::chrono::steady_clock::now() < deadline);
    ASSERT_EQ(st.read_responses, served + 1);
    std::erase(p.mrs, mr);
    ASSERT_EQ(api().ibv_dereg_mr(mr), 0);
    std::fill(remote->begin(), remote->end(), uint8_t(0xee));
    remote.reset();  // (64 MiB: unmapped)
    ASSERT_EQ(api().emurdma_hold_reads(a.qp()->qp_num, 0), 0);
    ASSERT_NO_FATAL_FAILURE(expect_completions(a.cq, {{1, IBV_WC_SUCCESS}}));
    EXPECT_TRUE(dst == want);
}

TEST_F(Data, WriteWithImmConsumesAReceive) {
    connect();
    char src[32] = "payload of the write";
    std::vector<char> remote(64, 0);
    char rbuf[16] = {};
    ibv_mr *ms = a.reg(src, sizeof(src));
    ibv_mr *mr = p.reg(remote.data(), remote.size());
    ibv_mr *mb = p.reg(rbuf, sizeof(rbuf));
    ASSERT_EQ(post_recv(p.qp(), 71, {sge(rbuf, sizeof(rbuf), mb)}), 0);
    ASSERT_EQ(post_recv(p.qp(), 72, {sge(rbuf, sizeof(rbuf), mb)}), 0);
    ASSERT_EQ(
        post_send(a.qp(), IBV_WR_RDMA_WRITE_WITH_IMM, 1, {sge(src, 21, ms)}, IBV_SEND_SIGNALED,
                  reinterpret_cast<uintptr_t>(remote.data()), mr->rkey, htonl(77)),
        0);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 2, {sge(src, 3, ms)}), 0);
    std::vector<ibv_wc> rx = poll_wc(p.cq, 2);
    ASSERT_EQ(rx.size(), 2U);
    EXPECT_EQ(rx[0].wr_id, 71U);
    EXPECT_EQ(rx[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_EQ(rx[0].byte_len, 21U);
    EXPECT_TRUE(rx[0].wc_flags & IBV_WC_WITH_IMM);
    EXPECT_EQ(rx[0].imm_data, htonl(77));
    EXPECT_STREQ(remote.data(), "payload of the write");
    EXPECT_EQ(rx[1].wr_id, 72U);
    EXPECT_EQ(rx[1].opcode, IBV_WC_RECV);
    EXPECT_EQ(rx[1].byte_len, 3U);
}

TEST_F(Data, InOrderCompletionOfAMixedSequence) {
    connect({}, QpOptions{.srq = true});
    std::vector<char> local(4096, 'L'), remote(4096, 0), rbuf(4096);
    ibv_mr *ml = a.reg(local.data(), local.size());
    ibv_mr *mr = p.reg(remote.data(), remote.size());
    ibv_mr *mb = p.reg(rbuf.data(), rbuf.size());
    for (int i = 0; i < 8; ++i)
        ASSERT_EQ(post_srq(p.srq, 1000 + i, {sge(&rbuf[i * 512], 512, mb)}), 0);
    auto raddr = reinterpret_cast<uintptr_t>(remote.data());
    const ibv_wr_opcode ops[] = {
        IBV_WR_RDMA_WRITE,          IBV_WR_SEND,      IBV_WR_RDMA_READ,     IBV_WR_SEND,
        IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE};
    const ibv_wc_opcode want[] = {IBV_WC_RDMA_WRITE, IBV_WC_SEND,       IBV_WC_RDMA_READ,
                                  IBV_WC_SEND,       IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ,
                                  IBV_WC_SEND,       IBV_WC_RDMA_WRITE};
    for (int i = 0; i < 8; ++i) {
        // Unsignaled in between: they complete silently, in their place.
        unsigned flags = (i % 3 == 1) ? 0 : IBV_SEND_SIGNALED;
        ASSERT_EQ(post_send(a.qp(), ops[i], i, {sge(&local[i * 256], 256, ml)}, flags,
                            raddr + i * 256, mr->rkey, htonl(i)),
                  0);
    }
    std::vector<ibv_wc> tx = poll_wc(a.cq, 5);
    ASSERT_EQ(tx.size(), 5U);
    size_t k = 0;
    for (int i = 0; i < 8; ++i) {
        if (i % 3 == 1) continue;
        EXPECT_EQ(tx[k].wr_id, static_cast<uint64_t>(i));
        EXPECT_EQ(tx[k].opcode, want[i]);
        EXPECT_EQ(tx[k].status, IBV_WC_SUCCESS);
        ++k;
    }
    std::vector<ibv_wc> rx = poll_wc(p.cq, 4);
    ASSERT_EQ(rx.size(), 4U);
    const ibv_wc_opcode rx_want[] = {IBV_WC_RECV, IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM,
                                     IBV_WC_RECV};
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(rx[i].wr_id, 1000U + i);
        EXPECT_EQ(rx[i].opcode, rx_want[i]);
    }
    EXPECT_TRUE(drain_wc(a.cq).empty());
}

// Many round trips: every message is delivered, in order, and the NIC keeps up.
TEST_F(Data, PingPong) {
    connect(QpOptions{.srq = true}, QpOptions{.srq = true});
    constexpr int kRounds = 2000;
    char abuf[64] = {}, pbuf[64] = {};
    ibv_mr *ma = a.reg(abuf, sizeof(abuf));
    ibv_mr *mp = p.reg(pbuf, sizeof(pbuf));
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kRounds; ++i) {
        ASSERT_EQ(post_srq(p.srq, i, {sge(pbuf, 32, mp)}), 0);
        ASSERT_EQ(post_srq(a.srq, i, {sge(abuf + 32, 32, ma)}), 0);
        memcpy(abuf, &i, sizeof(i));
        ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, i, {sge(abuf, 4, ma)}, IBV_SEND_INLINE), 0);
        std::vector<ibv_wc> wc = poll_wc(p.cq, 1);
        ASSERT_EQ(wc.size(), 1U);
        ASSERT_EQ(wc[0].wr_id, static_cast<uint64_t>(i));
        ASSERT_EQ(memcmp(pbuf, &i, sizeof(i)), 0);
        ASSERT_EQ(post_send(p.qp(), IBV_WR_SEND, i, {sge(pbuf, 4, mp)}, IBV_SEND_INLINE), 0);
        wc = poll_wc(a.cq, 1);
        ASSERT_EQ(wc.size(), 1U);
        ASSERT_EQ(wc[0].opcode, IBV_WC_RECV);
    }
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    printf("%d round trips, %.1f us each\n", kRounds, static_cast<double>(us) / kRounds);
}

TEST_F(Data, ReceiveTooSmall) {
    connect();
    char src[64] = {};
    char dst[8];
    ibv_mr *ms = a.reg(src, sizeof(src));
    ibv_mr *md = p.reg(dst, sizeof(dst));
    ASSERT_EQ(post_recv(p.qp(), 9, {sge(dst, sizeof(dst), md)}), 0);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 1, {sge(src, 64, ms)}), 0);
    std::vector<ibv_wc> rx = poll_wc(p.cq, 1);
    ASSERT_EQ(rx.size(), 1U);
    EXPECT_EQ(rx[0].status, IBV_WC_LOC_LEN_ERR);
    std::vector<ibv_wc> tx = poll_wc(a.cq, 1);
    ASSERT_EQ(tx.size(), 1U);
    EXPECT_EQ(tx[0].status, IBV_WC_REM_INV_REQ_ERR);
    EXPECT_EQ(qp_state(a.qp()), IBV_QPS_ERR);
}

TEST_F(Data, BadLocalKeyIsALocalProtectionError) {
    connect();
    char src[64] = {};
    ibv_mr *ms = a.reg(src, sizeof(src));
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 1,
                        {ibv_sge{reinterpret_cast<uintptr_t>(src), 8, ms->lkey ^ 0x5a5a5a5a}}),
              0);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 2, {sge(src, 8, ms)}), 0);
    std::vector<ibv_wc> tx = poll_wc(a.cq, 2);
    ASSERT_EQ(tx.size(), 2U);
    EXPECT_EQ(tx[0].status, IBV_WC_LOC_PROT_ERR);
    EXPECT_EQ(tx[1].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(tx[1].wr_id, 2U);
}

// ---- Remote keys ----

enum class BadAccess { kUnknownKey, kOutOfBounds, kNoRemoteWrite };

class KeysP : public Pair, public ::testing::WithParamInterface<BadAccess> {};

TEST_P(KeysP, RemoteAccessErrorWritesNothingAndFlushesWhatFollows) {
    connect();
    std::vector<char> remote(256, 'R');
    char src[64];
    memset(src, 'S', sizeof(src));
    ibv_mr *ms = a.reg(src, sizeof(src));
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                 (GetParam() == BadAccess::kNoRemoteWrite ? 0 : IBV_ACCESS_REMOTE_WRITE);
    ibv_mr *mr = p.reg(remote.data(), 128, access);
    ASSERT_NE(mr, nullptr);
    uint64_t raddr = reinterpret_cast<uintptr_t>(remote.data());
    uint32_t rkey = mr->rkey;
    if (GetParam() == BadAccess::kUnknownKey) rkey ^= 0x00ff00ff;
    if (GetParam() == BadAccess::kOutOfBounds) raddr += 100;  // 100 + 64 > 128
    emurdma_stats before{};
    api().emurdma_get_stats(&before);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_RDMA_WRITE, 1, {sge(src, 64, ms)}, 0, raddr, rkey), 0);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 2, {sge(src, 8, ms)}, 0), 0);
    // Both unsignaled, but errors always complete.
    ASSERT_NO_FATAL_FAILURE(
        expect_completions(a.cq, {{1, IBV_WC_REM_ACCESS_ERR}, {2, IBV_WC_WR_FLUSH_ERR}}));
    for (char c : remote) ASSERT_EQ(c, 'R');
    EXPECT_EQ(qp_state(a.qp()), IBV_QPS_ERR);
    // The target's QP fails too (as on real RC).
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (qp_state(p.qp()) != IBV_QPS_ERR && std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(qp_state(p.qp()), IBV_QPS_ERR);
    // A QP in error takes new work and flushes it at once.
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 3, {sge(src, 8, ms)}, 0), 0);
    ASSERT_NO_FATAL_FAILURE(expect_completions(a.cq, {{3, IBV_WC_WR_FLUSH_ERR}}));
    emurdma_stats after{};
    api().emurdma_get_stats(&after);
    EXPECT_EQ(after.remote_access_errors, before.remote_access_errors + 1);
    // Both ids see the end once one side disconnects.
    ASSERT_EQ(api().rdma_disconnect(a.id), 0);
    EXPECT_EQ(next_event(a.ch).type, RDMA_CM_EVENT_DISCONNECTED);
    EXPECT_EQ(next_event(lch).type, RDMA_CM_EVENT_DISCONNECTED);
}

INSTANTIATE_TEST_SUITE_P(Keys, KeysP,
                         ::testing::Values(BadAccess::kUnknownKey, BadAccess::kOutOfBounds,
                                           BadAccess::kNoRemoteWrite),
                         [](const ::testing::TestParamInfo<BadAccess> &i) {
                             switch (i.param) {
                                 case BadAccess::kUnknownKey:
                                     return std::string("UnknownRkey");
                                 case BadAccess::kOutOfBounds:
                                     return std::string("OutOfBounds");
                                 default:
                                     return std::string("NoRemoteWriteAccess");
                             }
                         });

TEST_F(Keys, ReadNeedsRemoteRead) {
    connect();
    std::vector<char> remote(64, 'R');
    char dst[64] = {};
    ibv_mr *md = a.reg(dst, sizeof(dst));
    ibv_mr *mr =
        p.reg(remote.data(), remote.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_RDMA_READ, 1, {sge(dst, 64, md)}, IBV_SEND_SIGNALED,
                        reinterpret_cast<uintptr_t>(remote.data()), mr->rkey),
              0);
    std::vector<ibv_wc> tx = poll_wc(a.cq, 1);
    ASSERT_EQ(tx.size(), 1U);
    EXPECT_EQ(tx[0].status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(dst[0], 0);
}

// ---- RNR ----

TEST_F(Rnr, SendWaitsForAReceive) {
    connect();
    char src[16] = "late receive", dst[16] = {};
    ibv_mr *ms = a.reg(src, sizeof(src));
    ibv_mr *md = p.reg(dst, sizeof(dst));
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 1, {sge(src, 13, ms)}), 0);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 2, {sge(src, 4, ms)}), 0);  // waits behind it
    EXPECT_TRUE(drain_wc(a.cq, 100).empty());
    ASSERT_EQ(post_recv(p.qp(), 7, {sge(dst, sizeof(dst), md)}), 0);
    std::vector<ibv_wc> rx = poll_wc(p.cq, 1);
    ASSERT_EQ(rx.size(), 1U);
    EXPECT_EQ(rx[0].wr_id, 7U);
    EXPECT_EQ(rx[0].byte_len, 13U);
    EXPECT_STREQ(dst, "late receive");
    ASSERT_NO_FATAL_FAILURE(expect_completions(a.cq, {{1, IBV_WC_SUCCESS}}));
    EXPECT_TRUE(drain_wc(a.cq).empty());  // the second still waits for its receive
    ASSERT_EQ(post_recv(p.qp(), 8, {sge(dst, sizeof(dst), md)}), 0);
    std::vector<ibv_wc> tx = poll_wc(a.cq, 1);
    ASSERT_EQ(tx.size(), 1U);
    EXPECT_EQ(tx[0].wr_id, 2U);
    emurdma_stats st{};
    api().emurdma_get_stats(&st);
    EXPECT_GE(st.rnr_waits, 2U);
}

class RnrRetries : public Pair, public ::testing::WithParamInterface<int> {};

TEST_P(RnrRetries, ExhaustedFailsTheSender) {
    connect(QpOptions{.rnr_retry = static_cast<uint8_t>(GetParam())});
    char src[16] = "nobody listens";
    char dst[16] = {};
    ibv_mr *ms = a.reg(src, sizeof(src));
    ibv_mr *md = p.reg(dst, sizeof(dst));
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 1, {sge(src, 8, ms)}), 0);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 2, {sge(src, 8, ms)}), 0);
    std::vector<ibv_wc> tx = poll_wc(a.cq, 2);
    ASSERT_EQ(tx.size(), 2U);
    EXPECT_EQ(tx[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
    EXPECT_EQ(tx[1].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(qp_state(a.qp()), IBV_QPS_ERR);
    // What the sender gave up on is never delivered.
    ASSERT_EQ(post_recv(p.qp(), 3, {sge(dst, sizeof(dst), md)}), 0);
    for (const ibv_wc &wc : drain_wc(p.cq)) EXPECT_NE(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst[0], 0);
}

INSTANTIATE_TEST_SUITE_P(Rnr, RnrRetries, ::testing::Values(0, 3, 6));

// ---- Errors, disconnect, peers that die ----

TEST_F(Errors, ModifyQpToErrorFlushesItsWork) {
    connect({}, QpOptions{.srq = true});
    char buf[16];
    ibv_mr *ma = a.reg(buf, sizeof(buf));
    ibv_mr *mp = p.reg(buf, sizeof(buf));
    ASSERT_EQ(post_recv(a.qp(), 1, {sge(buf, 16, ma)}), 0);
    ASSERT_EQ(post_recv(a.qp(), 2, {sge(buf, 16, ma)}), 0);
    ASSERT_EQ(post_srq(p.srq, 50, {sge(buf, 16, mp)}), 0);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(api().ibv_modify_qp(a.qp(), &attr, IBV_QP_STATE), 0);
    std::vector<ibv_wc> wc = poll_wc(a.cq, 2);
    ASSERT_EQ(wc.size(), 2U);
    EXPECT_EQ(wc[0].wr_id, 1U);
    EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wc[1].wr_id, 2U);
    // The passive QP (on an SRQ): error it too; the SRQ's receive stays.
    ASSERT_EQ(api().ibv_modify_qp(p.qp(), &attr, IBV_QP_STATE), 0);
    EXPECT_TRUE(drain_wc(p.cq).empty());
    EXPECT_EQ(qp_state(p.qp()), IBV_QPS_ERR);
    emurdma_stats st{};
    api().emurdma_get_stats(&st);
    EXPECT_GE(st.flushes, 2U);
}

TEST_F(Errors, DisconnectFlushesAndBothSidesAreDisconnected) {
    connect();
    char buf[16] = "x";
    ibv_mr *ma = a.reg(buf, sizeof(buf));
    ibv_mr *mp = p.reg(buf, sizeof(buf));
    ASSERT_EQ(post_recv(p.qp(), 21, {sge(buf, 16, mp)}), 0);
    ASSERT_EQ(post_recv(a.qp(), 11, {sge(buf, 16, ma)}), 0);
    // Two sends to a peer with one receive: the second waits (RNR) when we disconnect.
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 1, {sge(buf, 2, ma)}), 0);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 2, {sge(buf, 2, ma)}), 0);
    std::vector<ibv_wc> wc = poll_wc(a.cq, 1);
    ASSERT_EQ(wc.size(), 1U);
    EXPECT_EQ(wc[0].wr_id, 1U);
    ASSERT_EQ(poll_wc(p.cq, 1).size(), 1U);
    ASSERT_EQ(api().rdma_disconnect(a.id), 0);
    EXPECT_EQ(qp_state(a.qp()), IBV_QPS_ERR);
    ASSERT_NO_FATAL_FAILURE(
        expect_completions(a.cq, {{2, IBV_WC_WR_FLUSH_ERR}, {11, IBV_WC_WR_FLUSH_ERR}}));
    EXPECT_EQ(next_event(a.ch).type, RDMA_CM_EVENT_DISCONNECTED);
    EventInfo ev = next_event(lch);
    EXPECT_EQ(ev.type, RDMA_CM_EVENT_DISCONNECTED);
    EXPECT_EQ(ev.id, p.id);
    EXPECT_EQ(qp_state(p.qp()), IBV_QPS_ERR);
    // A second disconnect is harmless; no second event.
    EXPECT_EQ(api().rdma_disconnect(p.id), 0);
    EXPECT_FALSE(next_event(lch, 50).got);
}

TEST_F(TwoProcess, PeerKilledIsDisconnectedAndFlushes) {
    if (in_child()) {
        Side c;
        CHILD_CHECK(start_connect(c, port, {}) == 0);
        CHILD_CHECK(next_event(c.ch).type == RDMA_CM_EVENT_ESTABLISHED);
        char one = 1;
        CHILD_CHECK(write(ready[1], &one, 1) == 1);
        for (;;) pause();  // never posts a receive: the parent's send waits (RNR)
    }
    EventInfo req;
    ASSERT_EQ(accept_one(p, lch, {}, &req), 0);
    ASSERT_EQ(next_event(lch).type, RDMA_CM_EVENT_ESTABLISHED);
    char one;
    ASSERT_EQ(read(ready[0], &one, 1), 1);
    char buf[16] = "to the dead";
    ibv_mr *mr = p.reg(buf, sizeof(buf));
    ASSERT_EQ(post_recv(p.qp(), 31, {sge(buf, 16, mr)}), 0);
    ASSERT_EQ(post_send(p.qp(), IBV_WR_SEND, 32, {sge(buf, 4, mr)}), 0);
    EXPECT_TRUE(drain_wc(p.cq, 50).empty());
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EventInfo ev = next_event(lch);
    EXPECT_EQ(ev.type, RDMA_CM_EVENT_DISCONNECTED);
    EXPECT_EQ(ev.id, p.id);
    ASSERT_NO_FATAL_FAILURE(
        expect_completions(p.cq, {{32, IBV_WC_WR_FLUSH_ERR}, {31, IBV_WC_WR_FLUSH_ERR}}));
    EXPECT_EQ(qp_state(p.qp()), IBV_QPS_ERR);
    close(ready[0]);
    close(ready[1]);
}

// ---- Channels ----

TEST_F(Channels, CompletionChannelWakesPoll) {
    connect({}, QpOptions{.comp_channel = true});
    char src[8] = "ping", dst[8] = {};
    ibv_mr *ms = a.reg(src, sizeof(src));
    ibv_mr *md = p.reg(dst, sizeof(dst));
    ASSERT_EQ(ibv_req_notify_cq(p.cq, 0), 0);
    pollfd pf{p.cc->fd, POLLIN, 0};
    EXPECT_EQ(poll(&pf, 1, 0), 0);
    ASSERT_EQ(post_recv(p.qp(), 1, {sge(dst, sizeof(dst), md)}), 0);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 1, {sge(src, 5, ms)}), 0);
    ASSERT_EQ(poll(&pf, 1, kTimeoutMs), 1);
    ibv_cq *cq = nullptr;
    void *ctx = nullptr;
    ASSERT_EQ(api().ibv_get_cq_event(p.cc, &cq, &ctx), 0);
    EXPECT_EQ(cq, p.cq);
    api().ibv_ack_cq_events(cq, 1);
    EXPECT_EQ(poll_wc(p.cq, 1).size(), 1U);
    // One event per arm: nothing more until armed again.
    int fl = fcntl(p.cc->fd, F_GETFL);
    ASSERT_EQ(fcntl(p.cc->fd, F_SETFL, fl | O_NONBLOCK), 0);
    EXPECT_EQ(api().ibv_get_cq_event(p.cc, &cq, &ctx), -1);
    EXPECT_EQ(errno, EAGAIN);
}

TEST_F(Channels, CqOverrunIsAnAsyncError) {
    connect({}, QpOptions{.cqe = 2});
    char buf[8] = {};
    ibv_mr *ma = a.reg(buf, sizeof(buf));
    ibv_mr *mp = p.reg(buf, sizeof(buf));
    for (int i = 0; i < 4; ++i) ASSERT_EQ(post_recv(p.qp(), i, {sge(buf, 8, mp)}), 0);
    for (int i = 0; i < 4; ++i)
        ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, i, {sge(buf, 1, ma)}, 0), 0);
    ibv_async_event ev{};
    pollfd pf{p.id->verbs->async_fd, POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, kTimeoutMs), 1);
    ASSERT_EQ(api().ibv_get_async_event(p.id->verbs, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
    EXPECT_EQ(ev.element.cq, p.cq);
    api().ibv_ack_async_event(&ev);
    ibv_wc wc[8];
    EXPECT_EQ(ibv_poll_cq(p.cq, 8, wc), 2);
    EXPECT_EQ(ibv_poll_cq(p.cq, 8, wc), -1);
}

// ---- Fault injection ----

TEST_F(Fault, InjectQpError) {
    connect();
    char buf[16] = "x";
    ibv_mr *ma = a.reg(buf, sizeof(buf));
    // Outstanding at the active side: a send that waits for a receive at the passive one, and
    // a receive of its own.
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 1, {sge(buf, 2, ma)}), 0);
    ASSERT_EQ(post_recv(a.qp(), 2, {sge(buf, 16, ma)}), 0);
    EXPECT_TRUE(drain_wc(a.cq, 20).empty());
    EXPECT_EQ(api().emurdma_inject_qp_error(0xffffffff), -1);
    ASSERT_EQ(api().emurdma_inject_qp_error(p.qp()->qp_num), 0);
    EXPECT_EQ(qp_state(p.qp()), IBV_QPS_ERR);
    ASSERT_NO_FATAL_FAILURE(
        expect_completions(a.cq, {{1, IBV_WC_RETRY_EXC_ERR}, {2, IBV_WC_WR_FLUSH_ERR}}));
    EXPECT_EQ(qp_state(a.qp()), IBV_QPS_ERR);
    EXPECT_EQ(next_event(a.ch).type, RDMA_CM_EVENT_DISCONNECTED);
    EXPECT_EQ(next_event(lch).type, RDMA_CM_EVENT_DISCONNECTED);
}

TEST_F(Fault, PortDown) {
    connect();
    char buf[8] = {};
    ibv_mr *ma = a.reg(buf, sizeof(buf));
    ibv_context *ctx = a.id->verbs;
    int fl = fcntl(ctx->async_fd, F_GETFL);
    ASSERT_EQ(fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK), 0);
    ibv_async_event ev{};
    while (api().ibv_get_async_event(ctx, &ev) == 0) api().ibv_ack_async_event(&ev);
    api().emurdma_set_port_state(0);
    ASSERT_EQ(api().ibv_get_async_event(ctx, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ERR);
    EXPECT_EQ(ev.element.port_num, 1);
    ibv_port_attr pa{};
    ASSERT_EQ(api().ibv_query_port(ctx, 1, reinterpret_cast<_compat_ibv_port_attr *>(&pa)), 0);
    EXPECT_EQ(pa.state, IBV_PORT_DOWN);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 1, {sge(buf, 1, ma)}), 0);
    std::vector<ibv_wc> wc = poll_wc(a.cq, 1);
    ASSERT_EQ(wc.size(), 1U);
    EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
    Side b;
    EXPECT_EQ(start_connect(b, port, {}), 3);  // the address does not resolve
    b.destroy();
    api().emurdma_set_port_state(1);
    ASSERT_EQ(api().ibv_get_async_event(ctx, &ev), 0);
    EXPECT_EQ(ev.event_type, IBV_EVENT_PORT_ACTIVE);
    fcntl(ctx->async_fd, F_SETFL, fl);
}

TEST_F(Fault, RemoveDevice) {
    connect();
    char buf[8] = {};
    ibv_mr *ma = a.reg(buf, sizeof(buf));
    ASSERT_EQ(post_recv(a.qp(), 61, {sge(buf, 8, ma)}), 0);
    ibv_context *ctx = a.id->verbs;
    api().emurdma_remove_device();
    std::vector<ibv_wc> wc = poll_wc(a.cq, 1);
    ASSERT_EQ(wc.size(), 1U);
    EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(next_event(a.ch).type, RDMA_CM_EVENT_DEVICE_REMOVAL);
    bool listener_seen = false, passive_seen = false;
    for (int i = 0; i < 2; ++i) {
        EventInfo ev = next_event(lch);
        EXPECT_EQ(ev.type, RDMA_CM_EVENT_DEVICE_REMOVAL);
        listener_seen |= ev.id == listener;
        passive_seen |= ev.id == p.id;
    }
    EXPECT_TRUE(listener_seen && passive_seen);
    ibv_async_event ev{};
    bool fatal = false;
    int fl = fcntl(ctx->async_fd, F_GETFL);
    fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
    while (api().ibv_get_async_event(ctx, &ev) == 0)
        fatal |= ev.event_type == IBV_EVENT_DEVICE_FATAL;
    EXPECT_TRUE(fatal);
    EXPECT_EQ(qp_state(a.qp()), IBV_QPS_ERR);
    EXPECT_EQ(api().ibv_alloc_pd(ctx), nullptr);
    // A new id gets a working device again.
    TearDown();
    a = Side{};
    p = Side{};
    listener = nullptr;
    lch = nullptr;
    connect();
    EXPECT_NE(a.id->verbs, ctx);
}

// ---- Memory ----

TEST_F(Memory, DmabufRegistrationMovesDataThroughTheFd) {
    connect();
    constexpr size_t kSize = 64 * 1024;
    int fd = memfd_create("emurdma-test", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, kSize), 0);
    // Our own view of the "device memory", at an address the NIC never learns.
    auto *view =
        static_cast<char *>(mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ASSERT_NE(view, MAP_FAILED);
    const uint64_t iova = 0x7e0000000000ULL;  // nothing mapped there here
    emurdma_stats before{};
    api().emurdma_get_stats(&before);
    ibv_mr *dm = api().ibv_reg_dmabuf_mr(
        p.pd, 4096, 8192, iova, fd,
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(dm, nullptr);
    EXPECT_EQ(reinterpret_cast<uint64_t>(dm->addr), iova);
    EXPECT_EQ(dm->length, 8192U);
    errno = 0;
    EXPECT_EQ(api().ibv_reg_dmabuf_mr(p.pd, 0, kSize + 1, iova, fd, IBV_ACCESS_LOCAL_WRITE),
              nullptr);
    EXPECT_EQ(errno, EINVAL);
    char src[32] = "into device memory";
    ibv_mr *ms = a.reg(src, sizeof(src));
    ASSERT_EQ(post_send(a.qp(), IBV_WR_RDMA_WRITE, 1, {sge(src, 19, ms)}, IBV_SEND_SIGNALED,
                        iova + 100, dm->rkey),
              0);
    std::vector<ibv_wc> wc = poll_wc(a.cq, 1);
    ASSERT_EQ(wc.size(), 1U);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_STREQ(view + 4096 + 100, "into device memory");
    // And a local receive into it, by lkey, at its iova.
    memcpy(view + 4096 + 2000, "old", 4);
    ASSERT_EQ(post_recv(p.qp(), 2, {ibv_sge{iova + 2000, 16, dm->lkey}}), 0);
    ASSERT_EQ(post_send(a.qp(), IBV_WR_SEND, 3, {sge(src, 5, ms)}), 0);
    ASSERT_EQ(poll_wc(p.cq, 1).size(), 1U);
    EXPECT_EQ(memcmp(view + 4096 + 2000, "into", 4), 0);
    emurdma_stats after{};
    api().emurdma_get_stats(&after);
    EXPECT_EQ(after.dmabuf_regs, before.dmabuf_regs + 1);
    EXPECT_EQ(api().ibv_dereg_mr(dm), 0);
    munmap(view, kSize);
    close(fd);
}

TEST_F(Memory, StatsCountLiveObjects) {
    emurdma_stats before{};
    api().emurdma_get_stats(&before);
    connect();
    emurdma_stats st{};
    api().emurdma_get_stats(&st);
    EXPECT_EQ(st.qps, before.qps + 2);
    char buf[8];
    a.reg(buf, sizeof(buf));
    api().emurdma_get_stats(&st);
    EXPECT_EQ(st.mrs_registered, before.mrs_registered + 1);
}

}  // namespace
