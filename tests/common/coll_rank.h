// One rank of the collective tests between processes (tests/peer/test_coll_processes.cpp,
// tests/hmem/test_hmem_coll.cpp), in a process of its own: a tandem RDM endpoint on 127.0.0.1
// with its AV, EQ and CQ (and a counter when it has FI_TRIGGER), and what the ranks share in a
// RankBoard mapped before the fork: each rank publishes its endpoint name there and inserts
// every rank's in rank order, so that rank q is fi_addr_t q in every AV; a counter is the ranks'
// barrier; a rank that gives up raises the abort flag, so that the others stop waiting for it.
// Every wait is bounded. Completions are kept until waited for (by context); the rank's AV
// sets and groups are closed with it.
//
// The test says how a rank reports (its Reporter: `bool fail(const char *file, int line, const
// std::string &msg)` records a failure and returns false; atomic_procs::Report is one) and how
// it reaches libfabric's exported calls (an atomic_procs::Lib: the linked ones, or those loaded
// with dlopen in the rank's process).
#pragma once

#include "tests/common/atomic_processes.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

namespace tandem_test::coll_procs {

using atomic_procs::cat;
using atomic_procs::Clock;
using atomic_procs::Lib;

inline constexpr int kMaxRanks = 8;

// What the ranks share (zeroed before the fork).
struct RankBoard {
    std::atomic<int> abort;         // a rank gave up: the others stop waiting (value: its rank + 1)
    std::atomic<uint64_t> arrived;  // the barrier: arrivals of every rank, all generations
    // Ranks that died on purpose, and the barriers they had passed: the survivors' barriers
    // count without them.
    std::atomic<uint64_t> dead_arrivals;
    std::atomic<int> dead;
    uint32_t name_len[kMaxRanks];
    uint8_t name[kMaxRanks][256];
};

// In a rank's body (a void function; k: the rank): report (RK_FAIL, RK_CHECK, RK_RET), or report
// and give up on this rank (RK_REQUIRE, RK_CALL, RK_TRY after a helper that reported).
#define RK_FAIL(k, ...) AP_FAIL((k).r, __VA_ARGS__)
#define RK_CHECK(k, cond, ...)                                                            \
    do {                                                                                  \
        if (!(cond)) RK_FAIL(k, "check failed: " #cond __VA_OPT__(, ": ", ) __VA_ARGS__); \
    } while (0)
#define RK_REQUIRE(k, cond, ...)                                             \
    do {                                                                     \
        if (!(cond)) {                                                       \
            RK_FAIL(k, "required: " #cond __VA_OPT__(, ": ", ) __VA_ARGS__); \
            (k).give_up();                                                   \
            return;                                                          \
        }                                                                    \
    } while (0)
// A call that must return `want` (a return code).
#define RK_RET(k, expr, want)                                                         \
    do {                                                                              \
        const long rk_ret_ = long(expr);                                              \
        if (rk_ret_ != long(want))                                                    \
            RK_FAIL(k, #expr " -> ", (k).str(rk_ret_), ", expected ", (k).str(want)); \
    } while (0)
#define RK_CALL(k, expr)                                \
    do {                                                \
        const long rk_ret_ = long(expr);                \
        if (rk_ret_ != 0) {                             \
            RK_FAIL(k, #expr " -> ", (k).str(rk_ret_)); \
            (k).give_up();                              \
            return;                                     \
        }                                               \
    } while (0)
// A helper that reported its failure already.
#define RK_TRY(k, expr)    \
    do {                   \
        if (!(expr)) {     \
            (k).give_up(); \
            return;        \
        }                  \
    } while (0)

// Compares got with want (the same length, the last element the one behind the result): one
// failure, at the caller's line, naming the first difference.
#define RK_EXPECT_EQUAL(k, what, got, want) \
    ::tandem_test::coll_procs::expect_equal((k).r, __FILE__, __LINE__, what, got, want)

template <class Reporter, class T>
void expect_equal(Reporter &r, const char *file, int line, const std::string &what,
                  const std::vector<T> &got, const std::vector<T> &want) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i)
        if (got[i] != want[i] && bad++ == 0) first = i;
    if (bad)
        r.fail(file, line,
               cat(what, ": ", bad, " of ", want.size(),
                   " elements wrong (the last one is behind the result), first [", first,
                   "] = ", got[first], ", expected ", want[first]));
}

struct EqEvent {
    bool error = false;
    uint32_t event = 0;
    fi_eq_entry entry{};
    fi_eq_err_entry err{};
};

template <class Reporter>
class CollRank {
  public:
    // Rank `rank` of n; `wait` bounds every wait.
    CollRank(Reporter &rep, const Lib &lib, RankBoard &board, int rank, int n,
             std::chrono::seconds wait)
        : r(rep), rank(rank), n(n), lib_(lib), b_(board), wait_(wait) {}
    CollRank(const CollRank &) = delete;
    CollRank &operator=(const CollRank &) = delete;
    ~CollRank() { close_all(); }

    Reporter &r;
    const int rank, n;
    fi_info *info = nullptr;
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    fid_av *av = nullptr;
    fid_eq *eq = nullptr;
    fid_cq *cq = nullptr;
    fid_cntr *cntr = nullptr;  // opened when the endpoint has FI_TRIGGER
    fid_ep *ep = nullptr;
    // The CQ's wait object (set before start()): FI_WAIT_FD for a rank that sleeps on it.
    fi_wait_obj cq_wait = FI_WAIT_NONE;
    // FI_OPT_SHARED_MEMORY_PERMITTED (set before start()): false, and the endpoint makes no
    // node-local segment (its peers are reached over the link).
    bool shm_permitted = true;

    // A return code with its name.
    std::string str(long ret) const {
        if (ret >= 0) return cat(ret);
        return cat(lib_.strerror(int(-ret)), " (", ret, ")");
    }

    void give_up() {
        gave_up_ = true;
        int none = 0;
        b_.abort.compare_exchange_strong(none, rank + 1);
    }
    bool gave_up() const { return gave_up_; }

    // Opens the endpoint (with caps, and mr_mode for its domain) and inserts every rank's name,
    // rank q at fi_addr_t q.
    bool start(uint64_t caps, int mr_mode = 0) { return open(caps, mr_mode) && connect(); }

    // Stops a wait when another rank gave up.
    bool aborted(const std::string &what) {
        const int who = b_.abort.load();
        if (!who || who == rank + 1) return false;
        return !AP_FAIL(r, "stopped waiting for ", what, ": rank ", who - 1, " gave up");
    }

    // One pass of progress: completions are kept for wait().
    void progress() {
        if (!cq) return;
        fi_cq_tagged_entry e[16];
        ssize_t k = fi_cq_read(cq, e, 16);
        if (k > 0) {
            for (ssize_t i = 0; i < k; ++i) done_.push_back({e[i].op_context, e[i].flags, 0});
        } else if (k == -FI_EAVAIL) {
            fi_cq_err_entry ee{};
            ssize_t m = fi_cq_readerr(cq, &ee, 0);
            if (m == 1)
                done_.push_back({ee.op_context, ee.flags, ee.err ? ee.err : -1});
            else
                AP_FAIL(r, "fi_cq_readerr -> ", str(m));
        } else if (k != -FI_EAGAIN && !cq_error_said_) {
            cq_error_said_ = true;
            AP_FAIL(r, "fi_cq_read -> ", str(k));
        }
    }

    // The ranks' barrier (the endpoint progresses meanwhile: a peer may need its answers).
    bool barrier(const std::string &what = "barrier") {
        const uint64_t gen = uint64_t(++generation_);
        b_.arrived.fetch_add(1);
        const auto until = Clock::now() + wait_;
        auto want = [&] {
            const int dead = b_.dead.load();  // (then the arrivals they made: see mark_dead())
            return gen * uint64_t(n - dead) + b_.dead_arrivals.load();
        };
        while (b_.arrived.load() < want()) {
            progress();
            if (aborted(what)) return false;
            if (Clock::now() > until) return AP_FAIL(r, what, ": timed out");
            sched_yield();
        }
        return true;
    }

    // The rank is about to die on purpose: the others' barriers no longer count it.
    void mark_dead() {
        b_.dead_arrivals.fetch_add(uint64_t(generation_));
        b_.dead.fetch_add(1);
    }

    // The error of the completion of ctx (0 for success), within the wait.
    bool wait_result(void *ctx, const std::string &what, int *err) {
        Done d;
        if (!take(ctx, what, &d)) return false;
        *err = d.err;
        return true;
    }

    // As wait_result, the way an application that does not spin waits: between reads it
    // sleeps on the CQ's wait descriptor (FI_GETWAIT, fi_trywait, then poll for whatever is
    // left of the wait), so only what the provider does ends a sleep: a sleep that runs to
    // its end fails. Needs cq_wait FI_WAIT_FD.
    bool sleep_for_result(void *ctx, const std::string &what, int *err) {
        int fd = -1;
        int ret = fi_control(&cq->fid, FI_GETWAIT, &fd);
        if (ret) return AP_FAIL(r, "fi_control(FI_GETWAIT) -> ", str(ret));
        const auto until = Clock::now() + wait_;
        for (Done d;;) {
            if (kept(ctx, &d)) {
                *err = d.err;
                return true;
            }
            fid *waits[] = {&cq->fid};
            ret = fi_trywait(fabric, waits, 1);
            if (ret == 0) {
                const auto left =
                    std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
                pollfd p{fd, POLLIN, 0};
                if (left.count() <= 0 || poll(&p, 1, int(left.count())) == 0)
                    return AP_FAIL(r, what, ": asleep on the CQ, nothing woke us within ",
                                   wait_.count(), " s");
            } else if (ret != -FI_EAGAIN) {
                return AP_FAIL(r, "fi_trywait -> ", str(ret));
            }
            progress();
            if (aborted(what)) return false;
        }
    }

    // A fresh operation context (fi_context2-sized, valid until the rank ends).
    void *new_ctx() { return &contexts_.emplace_back(); }

    // Posts call(ctx), retrying while -FI_EAGAIN.
    template <typename F>
    bool post(const std::string &what, void *ctx, F &&call) {
        const auto until = Clock::now() + wait_;
        for (;;) {
            const ssize_t ret = call(ctx);
            if (ret == 0) return true;
            if (ret != -FI_EAGAIN) return AP_FAIL(r, what, " -> ", str(ret));
            progress();
            if (Clock::now() > until) return AP_FAIL(r, what, " kept giving -FI_EAGAIN");
        }
    }

    // The one completion of the operation with context ctx: FI_COLLECTIVE, no error.
    bool wait(void *ctx, const std::string &what) {
        Done d;
        if (!take(ctx, what, &d)) return false;
        if (d.err)
            return AP_FAIL(r, what, ": error completion, err ", d.err, " (", lib_.strerror(d.err),
                           ")");
        if (!(d.flags & FI_COLLECTIVE))
            return AP_FAIL(r, what, ": completion flags 0x", std::hex, d.flags,
                           " without FI_COLLECTIVE");
        return true;
    }

    // Posts call(ctx) with a fresh context, then waits for its completion.
    template <typename F>
    bool run(const std::string &what, F &&call) {
        void *ctx = new_ctx();
        return post(what, ctx, call) && wait(ctx, what);
    }

    // Polls the CQ for `ms`: false (and a failure) when anything completes.
    bool quiet_for(int ms, const std::string &what) {
        const auto until = Clock::now() + std::chrono::milliseconds(ms);
        while (Clock::now() < until) {
            progress();
            if (!done_.empty())
                return AP_FAIL(r, what, ": a completion came (flags 0x", std::hex,
                               done_.front().flags, std::dec, ", err ", done_.front().err, ")");
            sched_yield();
        }
        return true;
    }

    // The next EQ event (the CQ progresses meanwhile; its completions are kept).
    bool wait_eq(EqEvent &ev, const std::string &what) { return wait_eq(ev, what, wait_); }
    bool wait_eq(EqEvent &ev, const std::string &what, std::chrono::seconds limit) {
        const auto until = Clock::now() + limit;
        for (;;) {
            ssize_t k = fi_eq_read(eq, &ev.event, &ev.entry, sizeof ev.entry, 0);
            if (k == ssize_t(sizeof ev.entry)) {
                ev.error = false;
                return true;
            }
            if (k == -FI_EAVAIL) {
                ssize_t m = fi_eq_readerr(eq, &ev.err, 0);
                if (m <= 0) return AP_FAIL(r, what, ": fi_eq_readerr -> ", str(m));
                ev.error = true;
                return true;
            }
            if (k != -FI_EAGAIN) return AP_FAIL(r, what, ": fi_eq_read -> ", str(k));
            progress();
            if (aborted(what)) return false;
            if (Clock::now() > until)
                return AP_FAIL(r, what, ": no EQ event within ", limit.count(), " s");
            sched_yield();
        }
    }

    // fi_join_collective and its FI_JOIN_COMPLETE: the group, or null (failure reported).
    fid_mc *join(fid_av_set *set, fi_addr_t coll_addr, const std::string &what) {
        void *ctx = new_ctx();
        fid_mc *mc = nullptr;
        int ret = fi_join_collective(ep, coll_addr, set, 0, &mc, ctx);
        if (ret) {
            AP_FAIL(r, what, ": fi_join_collective -> ", str(ret));
            return nullptr;
        }
        mcs_.push_back(mc);
        EqEvent ev;
        if (!wait_eq(ev, what)) return nullptr;
        if (ev.error) {
            AP_FAIL(r, what, ": EQ error entry, err ", ev.err.err, " (", lib_.strerror(ev.err.err),
                    ")");
            return nullptr;
        }
        bool ok = true;
        if (ev.event != FI_JOIN_COMPLETE)
            ok = AP_FAIL(r, what, ": EQ event ", ev.event, ", not FI_JOIN_COMPLETE");
        if (ev.entry.fid != &mc->fid) ok = AP_FAIL(r, what, ": FI_JOIN_COMPLETE names another fid");
        if (ev.entry.context != ctx)
            ok = AP_FAIL(r, what, ": FI_JOIN_COMPLETE carries another context");
        return ok ? mc : nullptr;
    }
    // fi_join_collective's call alone (the group is kept for closing).
    int join_call(fid_av_set *set, fi_addr_t coll_addr, void *ctx, fid_mc **mc) {
        *mc = nullptr;
        int ret = fi_join_collective(ep, coll_addr, set, 0, mc, ctx);
        if (ret == 0) mcs_.push_back(*mc);
        return ret;
    }

    // Closes a group (retrying while its twin still runs something of it; briefly once the
    // rank gave up: what it waited for may never end).
    bool close_mc(fid_mc *mc) {
        auto it = std::find(mcs_.begin(), mcs_.end(), mc);
        if (it == mcs_.end()) return true;
        mcs_.erase(it);
        const auto until = Clock::now() + (gave_up_ ? std::chrono::seconds(1) : wait_);
        for (;;) {
            int ret = fi_close(&mc->fid);
            if (ret == 0) return true;
            if (ret != -FI_EBUSY) return AP_FAIL(r, "fi_close(mc) -> ", str(ret));
            progress();
            if (Clock::now() > until) return AP_FAIL(r, "fi_close(mc) kept giving -FI_EBUSY");
            sched_yield();
        }
    }

    // An AV set (kept for closing), or null.
    fid_av_set *av_set(fi_av_set_attr attr, const char *what) {
        fid_av_set *s = nullptr;
        int ret = fi_av_set(av, &attr, &s, nullptr);
        if (ret) {
            AP_FAIL(r, "fi_av_set(", what, ") -> ", str(ret));
            return nullptr;
        }
        sets_.push_back(s);
        return s;
    }
    fid_av_set *empty_set() {
        fi_av_set_attr a{};
        a.start_addr = a.end_addr = FI_ADDR_NOTAVAIL;
        return av_set(a, "empty");
    }
    fid_av_set *universe() {
        fi_av_set_attr a{};
        a.start_addr = a.end_addr = FI_ADDR_NOTAVAIL;
        a.flags = FI_UNIVERSE;
        return av_set(a, "FI_UNIVERSE");
    }
    fid_av_set *range(fi_addr_t start, fi_addr_t end, uint64_t stride) {
        fi_av_set_attr a{};
        a.start_addr = start;
        a.end_addr = end;
        a.stride = stride;
        return av_set(a, "range");
    }
    // fi_av_set_addr of a set: FI_ADDR_NOTAVAIL on failure (reported).
    fi_addr_t set_addr(fid_av_set *s) {
        fi_addr_t a = FI_ADDR_NOTAVAIL;
        int ret = fi_av_set_addr(s, &a);
        if (ret) AP_FAIL(r, "fi_av_set_addr -> ", str(ret));
        return a;
    }
    // A group of every rank, joined through the set's address.
    fid_mc *join_all() {
        fid_av_set *all = universe();
        if (!all) return nullptr;
        fi_addr_t a = set_addr(all);
        if (a == FI_ADDR_NOTAVAIL) return nullptr;
        return join(all, a, "join of every rank");
    }

    // The end of a rank's body: every rank got here, and no completion is left over.
    void finish() {
        if (!barrier("the last barrier")) return;
        for (const Done &d : done_)
            AP_FAIL(r, "a completion nobody waited for: flags 0x", std::hex, d.flags, std::dec,
                    ", err ", d.err);
        done_.clear();
    }

    // Closes everything; a close that fails is a failure of the rank.
    void close_all() {
        auto shut = [&](fid_t f, const char *what) {
            int ret = fi_close(f);
            if (ret) AP_FAIL(r, "fi_close(", what, ") -> ", str(ret));
        };
        while (!mcs_.empty())
            if (!close_mc(mcs_.back())) {  // the endpoint and all under it stay busy
                AP_FAIL(r, "a group would not close: the endpoint and its objects stay open");
                return;
            }
        if (ep) shut(&ep->fid, "endpoint");
        ep = nullptr;
        for (fid_av_set *s : sets_) shut(&s->fid, "AV set");
        sets_.clear();
        if (av) shut(&av->fid, "AV");
        av = nullptr;
        if (cntr) shut(&cntr->fid, "counter");
        cntr = nullptr;
        if (cq) shut(&cq->fid, "CQ");
        cq = nullptr;
        if (eq) shut(&eq->fid, "EQ");
        eq = nullptr;
        if (domain) shut(&domain->fid, "domain");
        domain = nullptr;
        if (fabric) shut(&fabric->fid, "fabric");
        fabric = nullptr;
        if (info) lib_.freeinfo(info);
        info = nullptr;
    }

  private:
    struct Done {
        void *ctx = nullptr;
        uint64_t flags = 0;
        int err = 0;
    };

    // The completion of ctx if it is among the kept ones (taken out).
    bool kept(void *ctx, Done *out) {
        for (auto it = done_.begin(); it != done_.end(); ++it) {
            if (it->ctx != ctx) continue;
            *out = *it;
            done_.erase(it);
            return true;
        }
        return false;
    }

    // The completion of ctx, taken out of the kept ones, within the wait.
    bool take(void *ctx, const std::string &what, Done *out) {
        const auto until = Clock::now() + wait_;
        for (;;) {
            if (kept(ctx, out)) return true;
            progress();
            if (aborted(what)) return false;
            if (Clock::now() > until)
                return AP_FAIL(r, what, ": no completion within ", wait_.count(), " s");
            sched_yield();
        }
    }

    // An enabled RDM endpoint of tandem with `caps`, bound to an AV, a CQ and an EQ
    // (FI_JOIN_COMPLETE goes there), and with FI_TRIGGER a counter.
    bool open(uint64_t caps, int mr_mode) {
        std::string why;
        if (!(info = atomic_procs::tandem_info(lib_, caps, mr_mode, &why))) return AP_FAIL(r, why);
        int ret;
        if ((info->caps & caps) != caps ||
            ((mr_mode & FI_MR_HMEM) && !(info->domain_attr->mr_mode & FI_MR_HMEM)))
            return AP_FAIL(r, "tandem's entry lacks what was asked for: caps 0x", std::hex,
                           info->caps, ", mr_mode 0x", info->domain_attr->mr_mode);
        if ((ret = lib_.fabric(info->fabric_attr, &fabric, nullptr)))
            return AP_FAIL(r, "fi_fabric -> ", str(ret));
        if ((ret = fi_domain(fabric, info, &domain, nullptr)))
            return AP_FAIL(r, "fi_domain -> ", str(ret));
        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        av_attr.count = kMaxRanks;
        if ((ret = fi_av_open(domain, &av_attr, &av, nullptr)))
            return AP_FAIL(r, "fi_av_open -> ", str(ret));
        fi_eq_attr eq_attr{};
        eq_attr.size = 64;
        if ((ret = fi_eq_open(fabric, &eq_attr, &eq, nullptr)))
            return AP_FAIL(r, "fi_eq_open -> ", str(ret));
        fi_cq_attr cq_attr{};
        cq_attr.size = 1024;
        cq_attr.format = FI_CQ_FORMAT_TAGGED;
        cq_attr.wait_obj = cq_wait;
        if ((ret = fi_cq_open(domain, &cq_attr, &cq, nullptr)))
            return AP_FAIL(r, "fi_cq_open -> ", str(ret));
        if (caps & FI_TRIGGER) {
            fi_cntr_attr c{};
            c.events = FI_CNTR_EVENTS_COMP;
            if ((ret = fi_cntr_open(domain, &c, &cntr, nullptr)))
                return AP_FAIL(r, "fi_cntr_open -> ", str(ret));
        }
        if ((ret = fi_endpoint(domain, info, &ep, nullptr)))
            return AP_FAIL(r, "fi_endpoint -> ", str(ret));
        if ((ret = fi_ep_bind(ep, &av->fid, 0))) return AP_FAIL(r, "fi_ep_bind(AV) -> ", str(ret));
        if ((ret = fi_ep_bind(ep, &eq->fid, 0))) return AP_FAIL(r, "fi_ep_bind(EQ) -> ", str(ret));
        if ((ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)))
            return AP_FAIL(r, "fi_ep_bind(CQ) -> ", str(ret));
        // (FI_OPT_SHARED_MEMORY_PERMITTED is 11 in fi_endpoint.h's enum from libfabric 1.21;
        // 1.17's headers lack it.)
        constexpr int kOptSharedMemoryPermitted = 11;
        if (!shm_permitted && (ret = fi_setopt(&ep->fid, FI_OPT_ENDPOINT, kOptSharedMemoryPermitted,
                                               &shm_permitted, sizeof shm_permitted)))
            return AP_FAIL(r, "fi_setopt(FI_OPT_SHARED_MEMORY_PERMITTED) -> ", str(ret));
        if ((ret = fi_enable(ep))) return AP_FAIL(r, "fi_enable -> ", str(ret));
        return true;
    }

    // Publishes this rank's name, waits for everybody's, inserts them in rank order.
    bool connect() {
        size_t len = sizeof b_.name[rank];
        int ret = fi_getname(&ep->fid, b_.name[rank], &len);
        if (ret) return AP_FAIL(r, "fi_getname -> ", str(ret));
        b_.name_len[rank] = uint32_t(len);
        if (!barrier("the names")) return false;
        for (int q = 0; q < n; ++q) {
            fi_addr_t a = FI_ADDR_NOTAVAIL;
            ret = fi_av_insert(av, b_.name[q], 1, &a, 0, nullptr);
            if (ret != 1) return AP_FAIL(r, "fi_av_insert(rank ", q, ") -> ", str(ret));
            if (a != fi_addr_t(q)) return AP_FAIL(r, "rank ", q, " is fi_addr_t ", a, " in the AV");
        }
        return true;
    }

    const Lib &lib_;
    RankBoard &b_;
    const std::chrono::seconds wait_;
    bool gave_up_ = false;
    bool cq_error_said_ = false;
    uint64_t generation_ = 0;
    std::deque<Done> done_;
    std::deque<fi_context2> contexts_;
    std::vector<fid_mc *> mcs_;
    std::vector<fid_av_set *> sets_;
};

}  // namespace tandem_test::coll_procs
