// Triggered operations between two processes: a chain of four operations, posted before
// anything moves, each started by the counter the one before it moves in the other process.
//
//   A: fi_cntr_add(start, 1)
//   A  op1  send "one"    to B    threshold start >= 1
//   B  op2  send "two"    to A    threshold B's receive counter >= 1   (op1 arrived)
//   A  op3  write "three" into B  threshold A's receive counter >= 1   (op2 arrived)
//   B  op4  send "four"   to A    threshold B's remote-write counter >= 1 (op3 landed)
//
// Nothing but progress (counter reads) runs in either process after the posts, so each hop is
// the trigger queue of the process it starts in. ctest runs the suite twice:
// peer.trigger_processes.local.* over the node-local path, .net.* over the TCP link
// (FI_TANDEM_LOCAL=0).
#include <gtest/gtest.h>

#include "tests/common/progress_env.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_trigger.h>

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

constexpr size_t kMsg = 64;

// Exit codes of the child (B), one per way it can fail, so the parent's assertion says which.
enum Exit : int { kOk = 0, kSetup = 10, kPost = 11, kTimeout = 12, kData = 13 };

struct Wire {  // what the processes tell each other over the socket pair
    char addr[64];
    size_t addrlen;
    uint64_t key;
    uint64_t base;  // the address (virtual) or offset the initiator names the region by
};

bool full_io(int fd, void *buf, size_t len, bool out) {
    auto *p = static_cast<char *>(buf);
    while (len) {
        ssize_t n = out ? write(fd, p, len) : read(fd, p, len);
        if (n <= 0) return false;
        p += n;
        len -= static_cast<size_t>(n);
    }
    return true;
}

// One process's objects: an RDM endpoint with a CQ, counters and a registered buffer.
struct Side {
    fi_info *info = nullptr;
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    fid_av *av = nullptr;
    fid_cq *cq = nullptr;
    fid_ep *ep = nullptr;
    fid_cntr *start = nullptr, *recv = nullptr, *rwrite = nullptr;
    fid_mr *mr = nullptr;
    char buf[4 * kMsg] = {};  // [0]: receive, [1]: RMA target (B), [2..3]: sources
    fi_addr_t peer = FI_ADDR_UNSPEC;

    int open() {
        fi_info *hints = fi_allocinfo();
        hints->caps = FI_MSG | FI_RMA | FI_TRIGGER | FI_RMA_EVENT;
        hints->ep_attr->type = FI_EP_RDM;
        hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
        tandem_test::ask_test_progress(hints->domain_attr);
        hints->fabric_attr->prov_name = strdup("tandem");
        int ret = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, 0, hints, &info);
        fi_freeinfo(hints);
        if (ret) return ret;
        if ((ret = fi_fabric(info->fabric_attr, &fabric, nullptr))) return ret;
        if ((ret = fi_domain(fabric, info, &domain, nullptr))) return ret;
        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        if ((ret = fi_av_open(domain, &av_attr, &av, nullptr))) return ret;
        fi_cq_attr cq_attr{};
        cq_attr.format = FI_CQ_FORMAT_CONTEXT;
        if ((ret = fi_cq_open(domain, &cq_attr, &cq, nullptr))) return ret;
        fi_cntr_attr c{};
        c.events = FI_CNTR_EVENTS_COMP;
        for (fid_cntr **p : {&start, &recv, &rwrite})
            if ((ret = fi_cntr_open(domain, &c, p, nullptr))) return ret;
        if ((ret = fi_endpoint(domain, info, &ep, nullptr))) return ret;
        if ((ret = fi_ep_bind(ep, &av->fid, 0)) ||
            (ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) ||
            (ret = fi_ep_bind(ep, &recv->fid, FI_RECV)) ||
            (ret = fi_ep_bind(ep, &rwrite->fid, FI_REMOTE_WRITE)) || (ret = fi_enable(ep)))
            return ret;
        return fi_mr_reg(domain, buf, sizeof buf, FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE, 0,
                         0, 0, &mr, nullptr);
    }
    Wire mine() {
        Wire w{};
        w.addrlen = sizeof w.addr;
        fi_getname(&ep->fid, w.addr, &w.addrlen);
        w.key = fi_mr_key(mr);
        const bool virt = info->domain_attr->mr_mode & FI_MR_VIRT_ADDR;
        w.base = virt ? reinterpret_cast<uint64_t>(buf) : 0;
        return w;
    }
    int insert(const Wire &w) {
        return fi_av_insert(av, w.addr, 1, &peer, 0, nullptr) == 1 ? 0 : -1;
    }
    int post_recv() {
        return static_cast<int>(fi_recv(ep, buf, kMsg, fi_mr_desc(mr), peer, nullptr));
    }
    // A triggered send of `text` (from the source slot `slot`) when cntr reaches threshold.
    int trigger_send(fi_triggered_context &t, fid_cntr *cntr, const char *text, int slot) {
        char *src = buf + slot * kMsg;
        snprintf(src, kMsg, "%s", text);
        t.event_type = FI_TRIGGER_THRESHOLD;
        t.trigger.threshold.cntr = cntr;
        t.trigger.threshold.threshold = 1;
        iovec iov{src, kMsg};
        void *desc = fi_mr_desc(mr);
        fi_msg msg{&iov, &desc, 1, peer, &t, 0};
        return static_cast<int>(fi_sendmsg(ep, &msg, FI_TRIGGER));
    }
    int trigger_write(fi_triggered_context &t, fid_cntr *cntr, const char *text, int slot,
                      const Wire &target) {
        char *src = buf + slot * kMsg;
        snprintf(src, kMsg, "%s", text);
        t.event_type = FI_TRIGGER_THRESHOLD;
        t.trigger.threshold.cntr = cntr;
        t.trigger.threshold.threshold = 1;
        iovec iov{src, kMsg};
        void *desc = fi_mr_desc(mr);
        fi_rma_iov rma{target.base + kMsg, kMsg, target.key};  // the target's slot 1
        fi_msg_rma msg{&iov, &desc, 1, peer, &rma, 1, &t, 0};
        return static_cast<int>(fi_writemsg(ep, &msg, FI_TRIGGER));
    }
    // Progress (a counter read drives it) until cntr reaches value, at most 10 s.
    bool wait(fid_cntr *cntr, uint64_t value) {
        auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (fi_cntr_read(cntr) < value) {
            fi_cq_entry e[8];
            fi_cq_read(cq, e, 8);
            if (std::chrono::steady_clock::now() > until) return false;
        }
        return true;
    }
    // Keep progressing for a while (the peer's hops need our answers and our acknowledgements).
    void linger(int ms) {
        auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
        while (std::chrono::steady_clock::now() < until) {
            fi_cq_entry e[8];
            fi_cq_read(cq, e, 8);
        }
    }
    ~Side() {
        for (fid *f :
             {ep ? &ep->fid : nullptr, mr ? &mr->fid : nullptr, start ? &start->fid : nullptr,
              recv ? &recv->fid : nullptr, rwrite ? &rwrite->fid : nullptr, cq ? &cq->fid : nullptr,
              av ? &av->fid : nullptr, domain ? &domain->fid : nullptr,
              fabric ? &fabric->fid : nullptr})
            if (f) fi_close(f);
        if (info) fi_freeinfo(info);
    }
};

// B: posts its receive and its two triggered operations, then only progresses.
int run_b(int sock) {
    Side b;
    Wire a_wire{};
    if (b.open()) return kSetup;
    Wire mine = b.mine();
    if (!full_io(sock, &mine, sizeof mine, true) || !full_io(sock, &a_wire, sizeof a_wire, false) ||
        b.insert(a_wire))
        return kSetup;
    fi_triggered_context t2{}, t4{};
    if (b.post_recv() || b.trigger_send(t2, b.recv, "two", 2) ||
        b.trigger_send(t4, b.rwrite, "four", 3))
        return kPost;
    char ready = 1;
    if (!full_io(sock, &ready, 1, true)) return kSetup;
    if (!b.wait(b.rwrite, 1)) return kTimeout;
    if (strcmp(b.buf, "one") != 0 || strcmp(b.buf + kMsg, "three") != 0) return kData;
    b.linger(300);  // op4 is on its way: let it (and A's acknowledgements) through
    return kOk;
}

TEST(TriggerProcesses, FourOperationChainAcrossTwoProcesses) {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        close(sv[0]);
        _exit(run_b(sv[1]));
    }
    close(sv[1]);
    Side a;
    ASSERT_EQ(a.open(), 0);
    Wire b_wire{};
    Wire mine = a.mine();
    ASSERT_TRUE(full_io(sv[0], &b_wire, sizeof b_wire, false));
    ASSERT_TRUE(full_io(sv[0], &mine, sizeof mine, true));
    ASSERT_EQ(a.insert(b_wire), 0);
    fi_triggered_context t1{}, t3{};
    ASSERT_EQ(a.post_recv(), 0);
    ASSERT_EQ(a.trigger_send(t1, a.start, "one", 2), 0);
    ASSERT_EQ(a.trigger_write(t3, a.recv, "three", 3, b_wire), 0);
    char ready = 0;
    ASSERT_TRUE(full_io(sv[0], &ready, 1, false));  // B's operations are queued
    // Nothing has started: the chain's first counter has not moved.
    a.linger(50);
    EXPECT_EQ(fi_cntr_read(a.recv), 0u) << "a message arrived before the chain was started";

    ASSERT_EQ(fi_cntr_add(a.start, 1), 0);
    // op2 arrives, starts op3; then op4's message is A's second receive: post it once op2's
    // arrived (the buffer is reused).
    ASSERT_TRUE(a.wait(a.recv, 1)) << "op2 (B's send, triggered by op1's arrival) never came";
    EXPECT_STREQ(a.buf, "two");
    ASSERT_EQ(a.post_recv(), 0);
    ASSERT_TRUE(a.wait(a.recv, 2)) << "op4 (B's send, triggered by op3's write) never came";
    EXPECT_STREQ(a.buf, "four");
    int status = 0;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (waitpid(child, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < until)
        a.linger(10);
    close(sv[0]);
    ASSERT_TRUE(WIFEXITED(status)) << "B did not exit";
    EXPECT_EQ(WEXITSTATUS(status), kOk)
        << "B: 10 set-up, 11 post, 12 timeout waiting for op3, 13 wrong data";
}

}  // namespace
