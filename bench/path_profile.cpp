// path_profile: a small tagged message's path through a provider, call by call, in one
// thread: two RDM endpoints of one process ping-pong 8-byte messages, so every call finds
// what it is waiting for and nothing spins. Run alone it prints the time of a round trip
// (the software of both sides, no cache line crossing between cores); run under callgrind
// (scripts/path-profile.sh) it counts the instructions of one kind of call, chosen by
// PATH_PROFILE_PHASE, and only those (callgrind's collection is toggled around them):
//   send      fi_tsend
//   recv      fi_trecv
//   deliver   the fi_cq_read that progresses the receiver and returns the message
//   complete  the fi_cq_read that returns a send's completion
//   empty     fi_cq_read with nothing to find
//   all       the whole round trip
//
//   path_profile [-p PROV] [-i ITERS]   (FI_PROVIDER_PATH as for any libfabric program)
//
// A send refused with -FI_EAGAIN (a provider that needs its peer to progress first) is
// retried after reading both CQs, outside what is counted.
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_TOGGLE_COLLECT
#define CALLGRIND_ZERO_STATS
#endif

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

[[noreturn]] void die(const char *what, long rc) {
    std::fprintf(stderr, "path_profile: %s: %s (%ld)\n", what, fi_strerror(int(-rc)), rc);
    std::exit(2);
}

void check(long rc, const char *what) {
    if (rc < 0) die(what, rc);
}

struct Side {
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    fid_cq *cq = nullptr;
    fid_av *av = nullptr;
    fid_ep *ep = nullptr;
    fi_addr_t peer = FI_ADDR_NOTAVAIL;
    char name[256];
    size_t name_len = sizeof name;
    char tx[64] = {}, rx[64] = {};
    fid_mr *mr = nullptr;
    void *desc = nullptr;
    fi_context2 ctx[2];

    void open(fi_info *info) {
        check(fi_fabric(info->fabric_attr, &fabric, nullptr), "fi_fabric");
        check(fi_domain(fabric, info, &domain, nullptr), "fi_domain");
        fi_cq_attr ca{};
        ca.format = FI_CQ_FORMAT_CONTEXT;
        ca.size = 128;
        check(fi_cq_open(domain, &ca, &cq, nullptr), "fi_cq_open");
        fi_av_attr aa{};
        aa.type = FI_AV_TABLE;
        check(fi_av_open(domain, &aa, &av, nullptr), "fi_av_open");
        check(fi_endpoint(domain, info, &ep, nullptr), "fi_endpoint");
        check(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind cq");
        check(fi_ep_bind(ep, &av->fid, 0), "fi_ep_bind av");
        check(fi_enable(ep), "fi_enable");
        check(fi_getname(&ep->fid, name, &name_len), "fi_getname");
        if (info->domain_attr->mr_mode & FI_MR_LOCAL) {
            // (tx and rx are adjacent members: one region covers both)
            check(fi_mr_reg(domain, tx, sizeof tx + sizeof rx, FI_SEND | FI_RECV, 0, 0, 0, &mr,
                            nullptr),
                  "fi_mr_reg");
            desc = fi_mr_desc(mr);
        }
    }
};

enum class Phase { None, Send, Recv, Deliver, Complete, Empty, All };

Phase phase_of(const char *s) {
    if (!s) return Phase::None;
    std::string p = s;
    if (p == "send") return Phase::Send;
    if (p == "recv") return Phase::Recv;
    if (p == "deliver") return Phase::Deliver;
    if (p == "complete") return Phase::Complete;
    if (p == "empty") return Phase::Empty;
    if (p == "all") return Phase::All;
    std::fprintf(stderr, "path_profile: unknown PATH_PROFILE_PHASE %s\n", s);
    std::exit(2);
}

Phase g_phase = Phase::None;
bool g_counting = false;

// Collection on for the calls of `phase` (and everything in "all") while counting.
struct Counted {
    bool on;
    explicit Counted(Phase p) : on(g_counting && g_phase == p && p != Phase::All) {
        if (on) CALLGRIND_TOGGLE_COLLECT;
    }
    ~Counted() {
        if (on) CALLGRIND_TOGGLE_COLLECT;
    }
};

// Reads s's CQ until one completion came; `phase` is that read's kind.
void reap(Side &s, Phase phase) {
    fi_cq_entry e[8];
    for (;;) {
        ssize_t n;
        {
            Counted c(phase);
            n = fi_cq_read(s.cq, e, 1);
        }
        if (n == 1) return;
        if (n != -FI_EAGAIN) check(n, "fi_cq_read");
    }
}

void send(Side &from, Side &to, uint64_t tag) {
    for (;;) {
        ssize_t r;
        {
            Counted c(Phase::Send);
            r = fi_tsend(from.ep, from.tx, 8, from.desc, from.peer, tag, &from.ctx[1]);
        }
        if (r == 0) return;
        if (r != -FI_EAGAIN) check(r, "fi_tsend");
        fi_cq_read(from.cq, nullptr, 0);
        fi_cq_read(to.cq, nullptr, 0);
    }
}

void recv(Side &s, uint64_t tag) {
    Counted c(Phase::Recv);
    check(fi_trecv(s.ep, s.rx, 8, s.desc, FI_ADDR_UNSPEC, tag, 0, &s.ctx[0]), "fi_trecv");
}

}  // namespace

int main(int argc, char **argv) {
    std::string prov = "tandem";
    int iters = 20000;
    int opt;
    while ((opt = getopt(argc, argv, "p:i:h")) != -1) {
        if (opt == 'p') {
            prov = optarg;
        } else if (opt == 'i') {
            iters = std::max(1, std::atoi(optarg));
        } else {
            std::fprintf(stderr,
                         "usage: [PATH_PROFILE_PHASE=send|recv|deliver|complete|empty|all] "
                         "path_profile [-p PROV] [-i ITERS]\n");
            return opt == 'h' ? 0 : 2;
        }
    }
    g_phase = phase_of(std::getenv("PATH_PROFILE_PHASE"));
    fi_info *hints = fi_allocinfo();
    hints->caps = FI_TAGGED;
    hints->ep_attr->type = FI_EP_RDM;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->fabric_attr->prov_name = strdup(prov.c_str());
    fi_info *info = nullptr;
    check(fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &info), "fi_getinfo");
    fi_freeinfo(hints);
    Side a, b;
    a.open(info);
    b.open(info);
    if (fi_av_insert(a.av, b.name, 1, &a.peer, 0, nullptr) != 1) die("fi_av_insert", -FI_EINVAL);
    if (fi_av_insert(b.av, a.name, 1, &b.peer, 0, nullptr) != 1) die("fi_av_insert", -FI_EINVAL);

    const int warm = 1000;
    auto t0 = std::chrono::steady_clock::now();
    recv(b, 7);
    for (int i = 0; i < warm + iters; ++i) {
        if (i == warm) {
            g_counting = true;
            CALLGRIND_ZERO_STATS;
            if (g_phase == Phase::All) CALLGRIND_TOGGLE_COLLECT;
            t0 = std::chrono::steady_clock::now();
        }
        // A: receive posted, message to B; B: takes it, posts the next, answers; A takes it.
        recv(a, 7);
        std::memcpy(a.tx, &i, sizeof i);
        send(a, b, 7);
        reap(a, Phase::Complete);
        reap(b, Phase::Deliver);
        std::memcpy(b.tx, b.rx, 8);  // the answer carries the number back
        recv(b, 7);
        send(b, a, 7);
        reap(b, Phase::Complete);
        reap(a, Phase::Deliver);
        int got;
        std::memcpy(&got, a.rx, sizeof got);
        if (got != i) die("a message carried a wrong number", -FI_EIO);
    }
    if (g_phase == Phase::All) CALLGRIND_TOGGLE_COLLECT;
    auto t1 = std::chrono::steady_clock::now();
    if (g_phase == Phase::Empty) {
        fi_cq_entry e[8];
        for (int i = 0; i < iters; ++i) {
            Counted c(Phase::Empty);
            fi_cq_read(a.cq, e, 1);
        }
    }
    std::printf("path_profile %s: %.1f ns per round trip (one thread, %d iterations)\n",
                prov.c_str(), std::chrono::duration<double, std::nano>(t1 - t0).count() / iters,
                iters);
    return 0;
}
