// Collectives (fi_collective(3)) between processes: every rank of a group is a process of its
// own, forked from the gtest process before any libfabric call (the gtest process never makes
// one). The ranks share one anonymous MAP_SHARED block made before the fork: each publishes its
// endpoint name in its slot, and all insert every name in rank order, so that rank r is
// fi_addr_t r in every AV; a counter in the block is the ranks' barrier. Each rank checks the
// results of its calls against values computed here from the inputs, which are a function of
// (rank, element) every rank can compute.
//
// A rank writes what went wrong as text into its slot and exits non-zero; one that gives up
// (its calls cannot go on) raises the block's abort flag, so the others stop waiting for it.
// Every wait of a rank is bounded (kWait); the gtest process kills whatever has not exited at
// its deadline and fails the test with the ranks' messages.
//
// ctest runs the suite twice: peer.coll_processes.local.* over the node-local path,
// .net.* over the TCP link (FI_TANDEM_LOCAL=0).
#include <gtest/gtest.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_trigger.h>

#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <new>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kMaxRanks = 8;
constexpr auto kWait = 20s;      // any one wait of a rank (a completion, an event, a barrier)
constexpr auto kDeadline = 75s;  // the gtest process's, for all ranks of a test to exit
constexpr uint64_t kSentinel = 0x5e5e5e5e5e5e5e5eull;  // result memory no element may reach

template <typename... A>
std::string cat(const A &...a) {
    std::ostringstream o;
    (o << ... << a);
    return o.str();
}

std::string err_str(long ret) {
    if (ret >= 0) return cat(ret);
    return cat(fi_strerror(int(-ret)), " (", ret, ")");
}

// ---- what the processes share -----------------------------------------------------------------

struct Slot {
    std::atomic<int> name_ready;
    uint32_t name_len;
    uint8_t name[256];
    std::atomic<int> failed;  // any failure reported below
    std::atomic<int> done;    // the rank's body returned (it did not crash)
    std::atomic<int> dies;    // the rank kills itself on purpose (MemberDeath)
    uint32_t msg_len;
    char msg[16384];
};

struct Shared {
    std::atomic<int> abort;         // a rank gave up: the others stop waiting (value: its rank + 1)
    std::atomic<uint64_t> arrived;  // the barrier: arrivals of every rank, all generations
    // Ranks that died on purpose, and the barriers they had passed: the survivors' barriers
    // count without them.
    std::atomic<uint64_t> dead_arrivals;
    std::atomic<int> dead;
    Slot slot[kMaxRanks];
};

class SharedBlock {
  public:
    SharedBlock() {
        void *p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                       -1, 0);
        if (p != MAP_FAILED) {
            std::memset(p, 0, sizeof(Shared));
            s_ = new (p) Shared;
        }
    }
    ~SharedBlock() {
        if (s_) munmap(s_, sizeof(Shared));
    }
    SharedBlock(const SharedBlock &) = delete;
    SharedBlock &operator=(const SharedBlock &) = delete;
    Shared *get() const { return s_; }

  private:
    Shared *s_ = nullptr;
};

// ---- one rank ---------------------------------------------------------------------------------

// In a rank's body (a void function): report (RK_FAIL, RK_CHECK, RK_RET), or report and give up
// on this rank (RK_REQUIRE, RK_CALL, RK_TRY after a helper that reported).
#define RK_FAIL(r, ...) (r).fail(__LINE__, cat(__VA_ARGS__))
#define RK_CHECK(r, cond, ...)                                                            \
    do {                                                                                  \
        if (!(cond)) RK_FAIL(r, "check failed: " #cond __VA_OPT__(, ": ", ) __VA_ARGS__); \
    } while (0)
#define RK_REQUIRE(r, cond, ...)                                             \
    do {                                                                     \
        if (!(cond)) {                                                       \
            RK_FAIL(r, "required: " #cond __VA_OPT__(, ": ", ) __VA_ARGS__); \
            (r).give_up();                                                   \
            return;                                                          \
        }                                                                    \
    } while (0)
// A call that must return `want` (a return code).
#define RK_RET(r, expr, want)                                                         \
    do {                                                                              \
        const long rk_ret_ = long(expr);                                              \
        if (rk_ret_ != long(want))                                                    \
            RK_FAIL(r, #expr " -> ", err_str(rk_ret_), ", expected ", err_str(want)); \
    } while (0)
#define RK_CALL(r, expr)                                \
    do {                                                \
        const long rk_ret_ = long(expr);                \
        if (rk_ret_ != 0) {                             \
            RK_FAIL(r, #expr " -> ", err_str(rk_ret_)); \
            (r).give_up();                              \
            return;                                     \
        }                                               \
    } while (0)
// A helper that reported its failure already.
#define RK_TRY(r, expr)    \
    do {                   \
        if (!(expr)) {     \
            (r).give_up(); \
            return;        \
        }                  \
    } while (0)

struct EqEvent {
    bool error = false;
    uint32_t event = 0;
    fi_eq_entry entry{};
    fi_eq_err_entry err{};
};

class Rank {
  public:
    Rank(Shared &sh, int rank, int n) : rank(rank), n(n), sh_(sh), slot_(sh.slot[rank]) {}
    Rank(const Rank &) = delete;
    Rank &operator=(const Rank &) = delete;
    ~Rank() { close_all(); }

    const int rank, n;
    fi_info *info = nullptr;
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    fid_av *av = nullptr;
    fid_eq *eq = nullptr;
    fid_cq *cq = nullptr;
    fid_cntr *cntr = nullptr;  // opened when the endpoint has FI_TRIGGER
    fid_ep *ep = nullptr;

    bool fail(int line, const std::string &msg) {
        slot_.failed.store(1);
        if (++failures_ > 40) return false;
        std::string text = failures_ == 40 ? std::string("(more failures left out)")
                                           : cat("line ", line, ": ", msg);
        for (char &c : text)
            if (c == '\n') c = ' ';
        text += '\n';
        const size_t room = sizeof slot_.msg - 1 - slot_.msg_len;
        const size_t len = std::min(room, text.size());
        std::memcpy(slot_.msg + slot_.msg_len, text.data(), len);
        slot_.msg_len += uint32_t(len);
        return false;
    }
    void give_up() {
        gave_up_ = true;
        int none = 0;
        sh_.abort.compare_exchange_strong(none, rank + 1);
    }
    bool gave_up() const { return gave_up_; }
    bool failed() const { return slot_.failed.load() != 0; }

    // Opens the endpoint and inserts every rank's name, rank r at fi_addr_t r.
    bool start(uint64_t caps) { return open(caps) && connect(); }

    // Stops a wait when another rank gave up.
    bool aborted(const std::string &what) {
        const int who = sh_.abort.load();
        if (!who || who == rank + 1) return false;
        return !fail(__LINE__, cat("stopped waiting for ", what, ": rank ", who - 1, " gave up"));
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
                fail(__LINE__, cat("fi_cq_readerr -> ", err_str(m)));
        } else if (k != -FI_EAGAIN && !cq_error_said_) {
            cq_error_said_ = true;
            fail(__LINE__, cat("fi_cq_read -> ", err_str(k)));
        }
    }

    // The ranks' barrier (the endpoint progresses meanwhile: a peer may need its answers).
    bool barrier(const char *what = "barrier") {
        const uint64_t gen = uint64_t(++generation_);
        sh_.arrived.fetch_add(1);
        const auto until = Clock::now() + kWait;
        auto want = [&] {
            const int dead = sh_.dead.load();  // (then the arrivals they made: see die())
            return gen * uint64_t(n - dead) + sh_.dead_arrivals.load();
        };
        while (sh_.arrived.load() < want()) {
            progress();
            if (aborted(what)) return false;
            if (Clock::now() > until) return fail(__LINE__, cat(what, ": timed out"));
            sched_yield();
        }
        return true;
    }

    // The rank's process ends here, killed (MemberDeath): its barriers no longer count.
    [[noreturn]] void die() {
        sh_.dead_arrivals.fetch_add(uint64_t(generation_));
        sh_.dead.fetch_add(1);
        slot_.dies.store(1);
        fflush(stdout);
        fflush(stderr);
        raise(SIGKILL);
        _exit(99);
    }

    // The error of the completion of ctx (0 for success), within kWait.
    bool wait_result(void *ctx, const std::string &what, int *err) {
        const auto until = Clock::now() + kWait;
        for (;;) {
            for (auto it = done_.begin(); it != done_.end(); ++it) {
                if (it->ctx != ctx) continue;
                *err = it->err;
                done_.erase(it);
                return true;
            }
            progress();
            if (aborted(what)) return false;
            if (Clock::now() > until)
                return fail(__LINE__, cat(what, ": no completion within ",
                                          std::chrono::seconds(kWait).count(), " s"));
            sched_yield();
        }
    }

    // A fresh operation context (fi_context2-sized, valid until the rank ends).
    void *new_ctx() { return &contexts_.emplace_back(); }

    // Posts (retrying while -FI_EAGAIN) with a fresh context.
    template <typename F>
    bool post(const std::string &what, void *ctx, F &&call) {
        const auto until = Clock::now() + kWait;
        for (;;) {
            const ssize_t ret = call(ctx);
            if (ret == 0) return true;
            if (ret != -FI_EAGAIN) return fail(__LINE__, cat(what, " -> ", err_str(ret)));
            progress();
            if (Clock::now() > until) return fail(__LINE__, cat(what, " kept giving -FI_EAGAIN"));
        }
    }

    // The one completion of the operation with context ctx: FI_COLLECTIVE, no error.
    bool wait(void *ctx, const std::string &what) {
        const auto until = Clock::now() + kWait;
        for (;;) {
            for (auto it = done_.begin(); it != done_.end(); ++it) {
                if (it->ctx != ctx) continue;
                const Done d = *it;
                done_.erase(it);
                if (d.err)
                    return fail(__LINE__, cat(what, ": error completion, err ", d.err, " (",
                                              fi_strerror(d.err), ")"));
                if (!(d.flags & FI_COLLECTIVE))
                    return fail(__LINE__, cat(what, ": completion flags 0x", std::hex, d.flags,
                                              " without FI_COLLECTIVE"));
                return true;
            }
            progress();
            if (aborted(what)) return false;
            if (Clock::now() > until)
                return fail(__LINE__, cat(what, ": no completion within ",
                                          std::chrono::seconds(kWait).count(), " s"));
            sched_yield();
        }
    }

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
                return fail(__LINE__, cat(what, ": a completion came (flags 0x", std::hex,
                                          done_.front().flags, std::dec, ", err ",
                                          done_.front().err, ") before the trigger"));
            sched_yield();
        }
        return true;
    }

    // The next EQ event (the CQ progresses meanwhile; its completions are kept).
    bool wait_eq(EqEvent &ev, const std::string &what, std::chrono::seconds limit = kWait) {
        const auto until = Clock::now() + limit;
        for (;;) {
            ssize_t k = fi_eq_read(eq, &ev.event, &ev.entry, sizeof ev.entry, 0);
            if (k == ssize_t(sizeof ev.entry)) {
                ev.error = false;
                return true;
            }
            if (k == -FI_EAVAIL) {
                ssize_t m = fi_eq_readerr(eq, &ev.err, 0);
                if (m <= 0) return fail(__LINE__, cat(what, ": fi_eq_readerr -> ", err_str(m)));
                ev.error = true;
                return true;
            }
            if (k != -FI_EAGAIN) return fail(__LINE__, cat(what, ": fi_eq_read -> ", err_str(k)));
            progress();
            if (aborted(what)) return false;
            if (Clock::now() > until)
                return fail(__LINE__, cat(what, ": no EQ event within ", limit.count(), " s"));
            sched_yield();
        }
    }

    // fi_join_collective and its FI_JOIN_COMPLETE: the group, or null (failure reported).
    fid_mc *join(fid_av_set *set, fi_addr_t coll_addr, const std::string &what) {
        void *ctx = new_ctx();
        fid_mc *mc = nullptr;
        int ret = fi_join_collective(ep, coll_addr, set, 0, &mc, ctx);
        if (ret) {
            fail(__LINE__, cat(what, ": fi_join_collective -> ", err_str(ret)));
            return nullptr;
        }
        mcs_.push_back(mc);
        EqEvent ev;
        if (!wait_eq(ev, what)) return nullptr;
        if (ev.error) {
            fail(__LINE__, cat(what, ": EQ error entry, err ", ev.err.err, " (",
                               fi_strerror(ev.err.err), ")"));
            return nullptr;
        }
        bool ok = true;
        if (ev.event != FI_JOIN_COMPLETE)
            ok = fail(__LINE__, cat(what, ": EQ event ", ev.event, ", not FI_JOIN_COMPLETE"));
        if (ev.entry.fid != &mc->fid)
            ok = fail(__LINE__, cat(what, ": FI_JOIN_COMPLETE names another fid"));
        if (ev.entry.context != ctx)
            ok = fail(__LINE__, cat(what, ": FI_JOIN_COMPLETE carries another context"));
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
        const auto until = Clock::now() + (gave_up_ ? std::chrono::seconds(1) : kWait);
        for (;;) {
            int ret = fi_close(&mc->fid);
            if (ret == 0) return true;
            if (ret != -FI_EBUSY) return fail(__LINE__, cat("fi_close(mc) -> ", err_str(ret)));
            progress();
            if (Clock::now() > until) return fail(__LINE__, "fi_close(mc) kept giving -FI_EBUSY");
            sched_yield();
        }
    }

    // An AV set (kept for closing), or null.
    fid_av_set *av_set(fi_av_set_attr attr, const char *what) {
        fid_av_set *s = nullptr;
        int ret = fi_av_set(av, &attr, &s, nullptr);
        if (ret) {
            fail(__LINE__, cat("fi_av_set(", what, ") -> ", err_str(ret)));
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
        if (ret) fail(__LINE__, cat("fi_av_set_addr -> ", err_str(ret)));
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
            fail(__LINE__, cat("a completion nobody waited for: flags 0x", std::hex, d.flags,
                               std::dec, ", err ", d.err));
        done_.clear();
    }

    // Closes everything; a close that fails is a failure of the rank.
    void close_all() {
        auto shut = [&](fid_t f, const char *what) {
            int ret = fi_close(f);
            if (ret) fail(__LINE__, cat("fi_close(", what, ") -> ", err_str(ret)));
        };
        while (!mcs_.empty())
            if (!close_mc(mcs_.back())) {  // the endpoint and all under it stay busy
                fail(__LINE__, "a group would not close: the endpoint and its objects stay open");
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
        if (info) fi_freeinfo(info);
        info = nullptr;
    }

  private:
    struct Done {
        void *ctx;
        uint64_t flags;
        int err;
    };

    bool open(uint64_t caps) {
        fi_info *hints = fi_allocinfo();
        if (!hints) return fail(__LINE__, "fi_allocinfo failed");
        hints->caps = caps;
        hints->addr_format = FI_SOCKADDR_IN;
        hints->ep_attr->type = FI_EP_RDM;
        hints->domain_attr->av_type = FI_AV_TABLE;
        hints->fabric_attr->prov_name = strdup("tandem");
        fi_info *list = nullptr;
        int ret = fi_getinfo(FI_VERSION(1, 17), "127.0.0.1", nullptr, FI_SOURCE, hints, &list);
        fi_freeinfo(hints);
        if (ret) return fail(__LINE__, cat("fi_getinfo(tandem) -> ", err_str(ret)));
        for (fi_info *i = list; i && !info; i = i->next)
            if (i->fabric_attr && i->fabric_attr->prov_name &&
                strcmp(i->fabric_attr->prov_name, "tandem") == 0)
                info = fi_dupinfo(i);
        fi_freeinfo(list);
        if (!info) return fail(__LINE__, "fi_getinfo lists no plain tandem entry");
        if ((ret = fi_fabric(info->fabric_attr, &fabric, nullptr)))
            return fail(__LINE__, cat("fi_fabric -> ", err_str(ret)));
        if ((ret = fi_domain(fabric, info, &domain, nullptr)))
            return fail(__LINE__, cat("fi_domain -> ", err_str(ret)));
        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        av_attr.count = kMaxRanks;
        if ((ret = fi_av_open(domain, &av_attr, &av, nullptr)))
            return fail(__LINE__, cat("fi_av_open -> ", err_str(ret)));
        fi_eq_attr eq_attr{};
        eq_attr.size = 64;
        if ((ret = fi_eq_open(fabric, &eq_attr, &eq, nullptr)))
            return fail(__LINE__, cat("fi_eq_open -> ", err_str(ret)));
        fi_cq_attr cq_attr{};
        cq_attr.size = 1024;
        cq_attr.format = FI_CQ_FORMAT_TAGGED;
        if ((ret = fi_cq_open(domain, &cq_attr, &cq, nullptr)))
            return fail(__LINE__, cat("fi_cq_open -> ", err_str(ret)));
        if (caps & FI_TRIGGER) {
            fi_cntr_attr c{};
            c.events = FI_CNTR_EVENTS_COMP;
            if ((ret = fi_cntr_open(domain, &c, &cntr, nullptr)))
                return fail(__LINE__, cat("fi_cntr_open -> ", err_str(ret)));
        }
        if ((ret = fi_endpoint(domain, info, &ep, nullptr)))
            return fail(__LINE__, cat("fi_endpoint -> ", err_str(ret)));
        if ((ret = fi_ep_bind(ep, &av->fid, 0)))
            return fail(__LINE__, cat("fi_ep_bind(AV) -> ", err_str(ret)));
        if ((ret = fi_ep_bind(ep, &eq->fid, 0)))
            return fail(__LINE__, cat("fi_ep_bind(EQ) -> ", err_str(ret)));
        if ((ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)))
            return fail(__LINE__, cat("fi_ep_bind(CQ) -> ", err_str(ret)));
        if ((ret = fi_enable(ep))) return fail(__LINE__, cat("fi_enable -> ", err_str(ret)));
        return true;
    }

    bool connect() {
        size_t len = sizeof slot_.name;
        int ret = fi_getname(&ep->fid, slot_.name, &len);
        if (ret) return fail(__LINE__, cat("fi_getname -> ", err_str(ret)));
        slot_.name_len = uint32_t(len);
        slot_.name_ready.store(1);
        if (!barrier("the names")) return false;
        for (int q = 0; q < n; ++q) {
            fi_addr_t a = FI_ADDR_NOTAVAIL;
            ret = fi_av_insert(av, sh_.slot[q].name, 1, &a, 0, nullptr);
            if (ret != 1) return fail(__LINE__, cat("fi_av_insert(rank ", q, ") -> ", ret));
            if (a != fi_addr_t(q))
                return fail(__LINE__, cat("rank ", q, " is fi_addr_t ", a, " in the AV"));
        }
        return true;
    }

    Shared &sh_;
    Slot &slot_;
    int failures_ = 0;
    bool gave_up_ = false;
    bool cq_error_said_ = false;
    uint64_t generation_ = 0;
    std::deque<Done> done_;
    std::deque<fi_context2> contexts_;
    std::vector<fid_mc *> mcs_;
    std::vector<fid_av_set *> sets_;
};

// Forks n ranks running body, waits for them (kDeadline) and fails the test with their messages.
void run_ranks(int n, const std::function<void(Rank &)> &body) {
    ASSERT_LE(n, kMaxRanks);
    SharedBlock block;
    Shared *sh = block.get();
    ASSERT_NE(sh, nullptr) << "mmap of the shared block failed";
    fflush(stdout);
    fflush(stderr);
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
        pid_t pid = fork();
        if (pid < 0) {
            ADD_FAILURE() << "fork: " << strerror(errno);
            sh->abort.store(kMaxRanks + 1);
            break;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            const std::string name = cat("coll-rank-", r);  // at most 15 characters
            prctl(PR_SET_NAME, name.c_str());
            {
                Rank rank(*sh, r, n);
                try {
                    body(rank);
                    if (!rank.gave_up()) rank.finish();
                } catch (const std::exception &e) {
                    rank.fail(__LINE__, cat("exception: ", e.what()));
                    rank.give_up();
                } catch (...) {
                    rank.fail(__LINE__, "unknown exception");
                    rank.give_up();
                }
            }  // closes every object (a failing close is a failure too)
            sh->slot[r].done.store(1);
            _exit(sh->slot[r].failed.load() ? 1 : 0);
        }
        pids.push_back(pid);
    }
    std::vector<int> status(pids.size(), -1);
    std::vector<bool> exited(pids.size(), false);
    const auto until = Clock::now() + kDeadline;
    size_t left = pids.size();
    while (left) {
        for (size_t i = 0; i < pids.size(); ++i) {
            if (exited[i]) continue;
            int st = 0;
            if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                exited[i] = true;
                status[i] = st;
                --left;
                // A rank that crashed says nothing: the others must not wait for it.
                if (!sh->slot[i].done.load() && !sh->slot[i].dies.load())
                    sh->abort.store(int(i) + 1);
            }
        }
        if (!left) break;
        if (Clock::now() > until) {
            for (size_t i = 0; i < pids.size(); ++i)
                if (!exited[i]) {
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], &status[i], 0);
                    ADD_FAILURE() << "rank " << i << " was still running at the deadline ("
                                  << std::chrono::seconds(kDeadline).count() << " s): killed";
                }
            break;
        }
        usleep(1000);
    }
    for (size_t i = 0; i < pids.size(); ++i) {
        const Slot &s = sh->slot[i];
        std::string msg(s.msg, s.msg_len);
        const int st = status[i];
        if (s.dies.load() && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && s.msg_len == 0)
            continue;  // died as it was told to
        std::string how = WIFEXITED(st)     ? cat("exit ", WEXITSTATUS(st))
                          : WIFSIGNALED(st) ? cat("signal ", WTERMSIG(st))
                                            : cat("status ", st);
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) || !msg.empty())
            ADD_FAILURE() << "rank " << i << " (" << how << "):\n" << msg;
    }
}

// ---- deterministic inputs -------------------------------------------------------------------

uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
// Rank r's element i of the call salted `salt`.
uint64_t val(uint64_t salt, int r, size_t i) {
    return mix(mix(salt) ^ (uint64_t(r) << 48) ^ uint64_t(i));
}
uint64_t salt_of(int coll, size_t count, int root = 0) {
    return (uint64_t(coll) << 40) ^ (uint64_t(count) << 8) ^ uint64_t(root);
}

// Compares got with want (same length); one failure naming the first difference.
template <class T>
void expect_equal(Rank &r, int line, const std::string &what, const std::vector<T> &got,
                  const std::vector<T> &want) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i)
        if (got[i] != want[i] && bad++ == 0) first = i;
    if (bad)
        r.fail(line, cat(what, ": ", bad, " of ", want.size(), " elements wrong, first [", first,
                         "] = ", got[first], ", expected ", want[first]));
}

// ---- 1: every collective ----------------------------------------------------------------------

void every_collective(Rank &r) {
    RK_TRY(r, r.start(FI_MSG | FI_COLLECTIVE));
    fid_mc *mc = r.join_all();
    RK_TRY(r, mc);
    const fi_addr_t g = fi_mc_addr(mc);
    const int n = r.n, me = r.rank;
    fid_ep *ep = r.ep;

    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(9001)}) {
        const std::string at = cat(" (count ", count, ")");
        RK_TRY(r, r.run(cat("fi_barrier", at), [&](void *ctx) { return fi_barrier(ep, g, ctx); }));

        for (int root = 0; root < n; ++root) {
            const uint64_t s = salt_of(FI_BROADCAST, count, root);
            std::vector<uint64_t> buf(count + 1, kSentinel), want(count + 1, kSentinel);
            for (size_t i = 0; i < count; ++i) want[i] = val(s, root, i);
            if (me == root) std::copy(want.begin(), want.end(), buf.begin());
            const std::string what = cat("fi_broadcast root ", root, at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_broadcast(ep, buf.data(), count, nullptr, g, fi_addr_t(root), FI_UINT64,
                                    0, ctx);
            }));
            expect_equal(r, __LINE__, what, buf, want);
        }

        {  // rank q's block j goes to rank j's block q
            const uint64_t s = salt_of(FI_ALLTOALL, count);
            std::vector<uint64_t> in(n * count + 1), out(n * count + 1, kSentinel),
                want(n * count + 1, kSentinel);
            for (size_t j = 0; j < n * count; ++j) in[j] = val(s, me, j);
            for (int q = 0; q < n; ++q)
                for (size_t i = 0; i < count; ++i) want[q * count + i] = val(s, q, me * count + i);
            const std::string what = cat("fi_alltoall", at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_alltoall(ep, in.data(), count, nullptr, out.data(), nullptr, g, FI_UINT64,
                                   0, ctx);
            }));
            expect_equal(r, __LINE__, what, out, want);
        }

        {  // FI_SUM of FI_UINT64 (wrapping)
            const uint64_t s = salt_of(FI_ALLREDUCE, count);
            std::vector<uint64_t> in(count + 1), out(count + 1, kSentinel),
                want(count + 1, kSentinel);
            for (size_t i = 0; i < count; ++i) {
                in[i] = val(s, me, i);
                want[i] = 0;
                for (int q = 0; q < n; ++q) want[i] += val(s, q, i);
            }
            const std::string what = cat("fi_allreduce FI_SUM FI_UINT64", at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_allreduce(ep, in.data(), count, nullptr, out.data(), nullptr, g,
                                    FI_UINT64, FI_SUM, 0, ctx);
            }));
            expect_equal(r, __LINE__, what, out, want);
        }

        {  // block q from rank q
            const uint64_t s = salt_of(FI_ALLGATHER, count);
            std::vector<uint64_t> in(count + 1), out(n * count + 1, kSentinel),
                want(n * count + 1, kSentinel);
            for (size_t i = 0; i < count; ++i) in[i] = val(s, me, i);
            for (int q = 0; q < n; ++q)
                for (size_t i = 0; i < count; ++i) want[q * count + i] = val(s, q, i);
            const std::string what = cat("fi_allgather", at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_allgather(ep, in.data(), count, nullptr, out.data(), nullptr, g,
                                    FI_UINT64, 0, ctx);
            }));
            expect_equal(r, __LINE__, what, out, want);
        }

        {  // FI_SUM of FI_INT32: block `me` of the sum of n blocks
            const uint64_t s = salt_of(FI_REDUCE_SCATTER, count);
            auto small = [&](int q, size_t j) { return int32_t(val(s, q, j) % 2001) - 1000; };
            std::vector<int32_t> in(n * count + 1), out(count + 1, int32_t(kSentinel)),
                want(count + 1, int32_t(kSentinel));
            for (size_t j = 0; j < n * count; ++j) in[j] = small(me, j);
            for (size_t i = 0; i < count; ++i) {
                want[i] = 0;
                for (int q = 0; q < n; ++q) want[i] += small(q, me * count + i);
            }
            const std::string what = cat("fi_reduce_scatter FI_SUM FI_INT32", at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_reduce_scatter(ep, in.data(), count, nullptr, out.data(), nullptr, g,
                                         FI_INT32, FI_SUM, 0, ctx);
            }));
            expect_equal(r, __LINE__, what, out, want);
        }

        for (int root = 0; root < n; ++root) {  // FI_MAX of FI_INT64, the root's result only
            const uint64_t s = salt_of(FI_REDUCE, count, root);
            std::vector<int64_t> in(count + 1), out(count + 1, int64_t(kSentinel)),
                want(count + 1, int64_t(kSentinel));
            for (size_t i = 0; i < count; ++i) {
                in[i] = int64_t(val(s, me, i));
                want[i] = int64_t(val(s, 0, i));
                for (int q = 1; q < n; ++q) want[i] = std::max(want[i], int64_t(val(s, q, i)));
            }
            const std::string what = cat("fi_reduce FI_MAX FI_INT64 root ", root, at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_reduce(ep, in.data(), count, nullptr, me == root ? out.data() : nullptr,
                                 nullptr, g, fi_addr_t(root), FI_INT64, FI_MAX, 0, ctx);
            }));
            if (me == root) expect_equal(r, __LINE__, what, out, want);
        }

        for (int root = 0; root < n; ++root) {  // the root's block q to rank q
            const uint64_t s = salt_of(FI_SCATTER, count, root);
            std::vector<uint64_t> in(n * count + 1), out(count + 1, kSentinel),
                want(count + 1, kSentinel);
            for (size_t j = 0; j < n * count; ++j) in[j] = val(s, root, j);
            for (size_t i = 0; i < count; ++i) want[i] = val(s, root, me * count + i);
            const std::string what = cat("fi_scatter root ", root, at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_scatter(ep, me == root ? in.data() : nullptr, count, nullptr, out.data(),
                                  nullptr, g, fi_addr_t(root), FI_UINT64, 0, ctx);
            }));
            expect_equal(r, __LINE__, what, out, want);
        }

        for (int root = 0; root < n; ++root) {  // rank q's block to the root's block q
            const uint64_t s = salt_of(FI_GATHER, count, root);
            std::vector<uint64_t> in(count + 1), out(n * count + 1, kSentinel),
                want(n * count + 1, kSentinel);
            for (size_t i = 0; i < count; ++i) in[i] = val(s, me, i);
            for (int q = 0; q < n; ++q)
                for (size_t i = 0; i < count; ++i) want[q * count + i] = val(s, q, i);
            const std::string what = cat("fi_gather root ", root, at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_gather(ep, in.data(), count, nullptr, me == root ? out.data() : nullptr,
                                 nullptr, g, fi_addr_t(root), FI_UINT64, 0, ctx);
            }));
            if (me == root) expect_equal(r, __LINE__, what, out, want);
        }
    }

    RK_TRY(r, r.run("fi_barrier2", [&](void *ctx) { return fi_barrier2(ep, g, 0, ctx); }));

    {  // the msg form (fi_ops_collective::msg) of an allreduce
        const size_t count = 100;
        const uint64_t s = salt_of(FI_ALLREDUCE, count, 77);
        std::vector<uint64_t> in(count), out(count + 1, kSentinel), want(count + 1, kSentinel);
        for (size_t i = 0; i < count; ++i) {
            in[i] = val(s, me, i);
            want[i] = 0;
            for (int q = 0; q < n; ++q) want[i] += val(s, q, i);
        }
        fi_ioc iov{in.data(), count}, res{out.data(), count};
        RK_TRY(r, r.run("fi_ops_collective::msg FI_ALLREDUCE", [&](void *ctx) {
            fi_msg_collective msg{&iov,         nullptr,   1,      g,  FI_ADDR_NOTAVAIL,
                                  FI_ALLREDUCE, FI_UINT64, FI_SUM, ctx};
            return ep->collective->msg(ep, &msg, &res, nullptr, 1, 0);
        }));
        expect_equal(r, __LINE__, "msg-form allreduce", out, want);
    }
}

TEST(CollProcesses, EveryCollectiveHostMemory3Ranks) {
    run_ranks(3, every_collective);
}
TEST(CollProcesses, EveryCollectiveHostMemory4Ranks) {
    run_ranks(4, every_collective);
}

// ---- 2: every reduction fi_query_collective reports ------------------------------------------

template <class R>
struct Cx {  // C's _Complex R: real part, then imaginary part
    R re, im;
    bool operator==(const Cx &o) const { return re == o.re && im == o.im; }
    bool operator!=(const Cx &o) const { return !(*this == o); }
};
template <class T>
constexpr bool kIsCx = false;
template <class R>
constexpr bool kIsCx<Cx<R>> = true;

template <class T>
struct Tag {
    using type = T;
};

template <class F>
void with_type(int dt, F &&f) {
    switch (dt) {
        case FI_INT8:
            return f(Tag<int8_t>{});
        case FI_UINT8:
            return f(Tag<uint8_t>{});
        case FI_INT16:
            return f(Tag<int16_t>{});
        case FI_UINT16:
            return f(Tag<uint16_t>{});
        case FI_INT32:
            return f(Tag<int32_t>{});
        case FI_UINT32:
            return f(Tag<uint32_t>{});
        case FI_INT64:
            return f(Tag<int64_t>{});
        case FI_UINT64:
            return f(Tag<uint64_t>{});
        case FI_FLOAT:
            return f(Tag<float>{});
        case FI_DOUBLE:
            return f(Tag<double>{});
        case FI_FLOAT_COMPLEX:
            return f(Tag<Cx<float>>{});
        case FI_DOUBLE_COMPLEX:
            return f(Tag<Cx<double>>{});
        case FI_LONG_DOUBLE:
            return f(Tag<long double>{});
        case FI_LONG_DOUBLE_COMPLEX:
            return f(Tag<Cx<long double>>{});
    }
}

const char *const kDatatypeNames[] = {"FI_INT8",          "FI_UINT8",
                                      "FI_INT16",         "FI_UINT16",
                                      "FI_INT32",         "FI_UINT32",
                                      "FI_INT64",         "FI_UINT64",
                                      "FI_FLOAT",         "FI_DOUBLE",
                                      "FI_FLOAT_COMPLEX", "FI_DOUBLE_COMPLEX",
                                      "FI_LONG_DOUBLE",   "FI_LONG_DOUBLE_COMPLEX"};
const char *const kOpNames[] = {
    "FI_MIN",  "FI_MAX",  "FI_SUM",  "FI_PROD",        "FI_LOR",          "FI_LAND", "FI_BOR",
    "FI_BAND", "FI_LXOR", "FI_BXOR", "FI_ATOMIC_READ", "FI_ATOMIC_WRITE", "FI_CSWAP"};
const char *coll_name(int coll) {
    switch (coll) {
        case FI_ALLREDUCE:
            return "FI_ALLREDUCE";
        case FI_REDUCE_SCATTER:
            return "FI_REDUCE_SCATTER";
        case FI_REDUCE:
            return "FI_REDUCE";
    }
    return "?";
}

// A small value of T: a (and b, the imaginary part); real types take a / 2 (exact).
template <class T>
T make(long a, long b) {
    if constexpr (kIsCx<T>) {
        using R = decltype(T::re);
        return T{R(a), R(b)};
    } else if constexpr (std::is_floating_point_v<T>) {
        return T(a) / 2;
    } else {
        return T(a);  // negative values wrap in unsigned types
    }
}

// Rank r's element j for `op`: small enough that every result is exact, with zeros where the
// logical operations need them (element 0: no zero, 1 and 2: one rank's, 3: two, 4: all).
template <class T>
T input(int op, int r, size_t j) {
    const long k = long(r) * 7 + long(j) * 3 + op;
    switch (op) {
        case FI_LOR:
        case FI_LAND:
        case FI_LXOR: {
            static const unsigned kZeroAt[5] = {0, 1, 2, 5, 7};  // bit r: rank r gives 0
            if (kZeroAt[j % 5] >> r & 1) return make<T>(0, 0);
            long v = long((r + j) % 3) + 1;
            if ((r + j) % 2) v = -v;
            // Complex: some values are true by their imaginary part alone.
            if (kIsCx<T> && (r + j) % 3 == 1) return make<T>(0, v);
            return make<T>(v, 0);
        }
        case FI_BOR:
        case FI_BAND:
        case FI_BXOR:
            if constexpr (std::is_integral_v<T>)
                return T(mix(uint64_t(op) << 32 ^ uint64_t(r) << 16 ^ j));
            else
                return make<T>(0, 0);
        case FI_PROD:
            return make<T>(k % 7 - 3, (k / 7) % 5 - 2);
        case FI_SUM:
            return make<T>(k % 201 - 100, (k * 13) % 201 - 100);
        default:  // FI_MIN, FI_MAX
            return make<T>(k % 11 - 5, 0);
    }
}

template <class T>
bool truth(const T &v) {
    if constexpr (kIsCx<T>)
        return v.re != 0 || v.im != 0;
    else
        return v != 0;
}
template <class T>
T one_or_zero(bool b) {
    if constexpr (kIsCx<T>) {
        using R = decltype(T::re);
        return T{R(b ? 1 : 0), R(0)};
    } else {
        return T(b ? 1 : 0);
    }
}

// a op b, as fi_atomic(3) defines op (a: the target), straight C++ per type.
template <class T>
T apply(int op, const T &a, const T &b) {
    switch (op) {
        case FI_LOR:
            return one_or_zero<T>(truth(a) || truth(b));
        case FI_LAND:
            return one_or_zero<T>(truth(a) && truth(b));
        case FI_LXOR:
            return one_or_zero<T>(truth(a) != truth(b));
    }
    if constexpr (kIsCx<T>) {
        if (op == FI_SUM) return T{a.re + b.re, a.im + b.im};
        if (op == FI_PROD) return T{a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
    } else if constexpr (std::is_floating_point_v<T>) {
        if (op == FI_MIN) return b < a ? b : a;
        if (op == FI_MAX) return b > a ? b : a;
        if (op == FI_SUM) return a + b;
        if (op == FI_PROD) return a * b;
    } else {
        using U = std::make_unsigned_t<T>;
        switch (op) {
            case FI_MIN:
                return b < a ? b : a;
            case FI_MAX:
                return b > a ? b : a;
            case FI_SUM:  // wraps
                return T(U(U(a) + U(b)));
            case FI_PROD:  // wraps
                return T(uint64_t(U(a)) * uint64_t(U(b)));
            case FI_BOR:
                return T(a | b);
            case FI_BAND:
                return T(a & b);
            case FI_BXOR:
                return T(a ^ b);
        }
    }
    return T{};
}

template <class T>
std::string show(const T &v) {
    if constexpr (kIsCx<T>)
        return cat("(", show(v.re), ", ", show(v.im), ")");
    else if constexpr (std::is_floating_point_v<T>)
        return cat(static_cast<long double>(v));
    else if constexpr (std::is_signed_v<T>)
        return cat(static_cast<long long>(v));
    else
        return cat(static_cast<unsigned long long>(v));
}

// One reduction collective of type T, count 5, checked against the rank-order fold.
template <class T>
bool one_reduction(Rank &r, fi_addr_t g, int coll, int dt, int op, int root) {
    constexpr size_t kCount = 5;
    const int n = r.n, me = r.rank;
    const size_t in_len = coll == FI_REDUCE_SCATTER ? n * kCount : kCount;
    std::vector<T> in(in_len), out(kCount, make<T>(99, 99));
    for (size_t j = 0; j < in_len; ++j) in[j] = input<T>(op, me, j);
    const size_t base = coll == FI_REDUCE_SCATTER ? me * kCount : 0;
    std::vector<T> want(kCount);
    for (size_t i = 0; i < kCount; ++i) {
        T acc = input<T>(op, 0, base + i);
        for (int q = 1; q < n; ++q) acc = apply<T>(op, acc, input<T>(op, q, base + i));
        want[i] = acc;
    }
    const std::string what = cat(coll_name(coll), " ", kOpNames[op], " ", kDatatypeNames[dt],
                                 coll == FI_REDUCE ? cat(" root ", root) : std::string());
    fid_ep *ep = r.ep;
    const auto datatype = static_cast<fi_datatype>(dt);
    const auto o = static_cast<fi_op>(op);
    bool ok = r.run(what, [&](void *ctx) -> ssize_t {
        switch (coll) {
            case FI_ALLREDUCE:
                return fi_allreduce(ep, in.data(), kCount, nullptr, out.data(), nullptr, g,
                                    datatype, o, 0, ctx);
            case FI_REDUCE_SCATTER:
                return fi_reduce_scatter(ep, in.data(), kCount, nullptr, out.data(), nullptr, g,
                                         datatype, o, 0, ctx);
            default:
                return fi_reduce(ep, in.data(), kCount, nullptr, me == root ? out.data() : nullptr,
                                 nullptr, g, fi_addr_t(root), datatype, o, 0, ctx);
        }
    });
    if (!ok) return false;
    if (coll == FI_REDUCE && me != root) return true;
    for (size_t i = 0; i < kCount; ++i)  // values, not bytes (long double's padding)
        if (out[i] != want[i])
            r.fail(__LINE__,
                   cat(what, ": element ", i, " = ", show(out[i]), ", expected ", show(want[i])));
    return true;
}

void every_reduction(Rank &r) {
    RK_TRY(r, r.start(FI_MSG | FI_COLLECTIVE));
    fid_mc *mc = r.join_all();
    RK_TRY(r, mc);
    const fi_addr_t g = fi_mc_addr(mc);
    auto query = [&](int coll, int dt, int op) {
        fi_collective_attr attr{};
        attr.op = static_cast<fi_op>(op);
        attr.datatype = static_cast<fi_datatype>(dt);
        return fi_query_collective(r.domain, static_cast<fi_collective_op>(coll), &attr, 0);
    };
    const bool say = r.rank == 0;  // the same answers in every rank: one reports them
    int runs = 0, index = 0;
    for (int coll : {FI_ALLREDUCE, FI_REDUCE_SCATTER, FI_REDUCE}) {
        for (int dt = FI_INT8; dt <= FI_LONG_DOUBLE_COMPLEX; ++dt) {
            for (int op : {FI_ATOMIC_READ, FI_ATOMIC_WRITE, FI_CSWAP}) {
                const int ret = query(coll, dt, op);
                if (say && ret != -FI_EOPNOTSUPP)
                    RK_FAIL(r, "fi_query_collective(", coll_name(coll), ", ", kOpNames[op], ", ",
                            kDatatypeNames[dt], ") -> ", err_str(ret), ", expected -FI_EOPNOTSUPP");
            }
            const bool complex =
                dt == FI_FLOAT_COMPLEX || dt == FI_DOUBLE_COMPLEX || dt == FI_LONG_DOUBLE_COMPLEX;
            for (int op = FI_MIN; op <= FI_BXOR; ++op) {
                const int ret = query(coll, dt, op);
                if (complex && op == FI_MIN && ret != -FI_EOPNOTSUPP && say)
                    RK_FAIL(r, "fi_query_collective(", coll_name(coll), ", FI_MIN, ",
                            kDatatypeNames[dt], ") -> ", err_str(ret), ", expected -FI_EOPNOTSUPP");
                if (ret == -FI_EOPNOTSUPP) continue;
                if (ret != 0) {
                    if (say)
                        RK_FAIL(r, "fi_query_collective(", coll_name(coll), ", ", kOpNames[op],
                                ", ", kDatatypeNames[dt], ") -> ", err_str(ret));
                    continue;
                }
                bool ok = true;
                const int root = index++ % r.n;
                with_type(dt, [&](auto tag) {
                    using T = typename decltype(tag)::type;
                    ok = one_reduction<T>(r, g, coll, dt, op, root);
                });
                RK_TRY(r, ok);
                ++runs;
            }
        }
    }
    // Reported supported at all: every type sums.
    RK_CHECK(r, runs >= 3 * 14, "only ", runs, " reductions reported supported");
}

TEST(CollProcesses, EveryReductionReportedSupported) {
    run_ranks(3, every_reduction);
}

// ---- 3: groups of some ranks, in the order of their sets --------------------------------------

// Joins `set` when this rank is a member (members: the set's AV addresses, in its order), then
// checks an allreduce, an allgather (the members' ranks in the set's order) and a broadcast
// from the member named by root.
void members_work(Rank &r, fid_av_set *set, const std::vector<int> &members, int root,
                  const std::string &name) {
    const int me = r.rank;
    const int m = int(members.size());
    auto pos = std::find(members.begin(), members.end(), me);
    const fi_addr_t sa = r.set_addr(set);
    RK_REQUIRE(r, sa != FI_ADDR_NOTAVAIL);
    if (pos == members.end()) {  // not a member: the join is refused at once
        fid_mc *mc = nullptr;
        RK_RET(r, r.join_call(set, sa, r.new_ctx(), &mc), -FI_EINVAL);
        return;
    }
    fid_mc *mc = r.join(set, sa, cat("join of ", name));
    RK_TRY(r, mc);
    const fi_addr_t g = fi_mc_addr(mc);
    fid_ep *ep = r.ep;
    const size_t count = 7;
    const uint64_t s = salt_of(FI_ALLREDUCE, count, 5);
    std::vector<uint64_t> in(count), out(count + 1, kSentinel), want(count + 1, kSentinel);
    for (size_t i = 0; i < count; ++i) {
        in[i] = val(s, me, i);
        want[i] = 0;
        for (int q : members) want[i] += val(s, q, i);
    }
    RK_TRY(r, r.run(cat("allreduce of ", name), [&](void *ctx) {
        return fi_allreduce(ep, in.data(), count, nullptr, out.data(), nullptr, g, FI_UINT64,
                            FI_SUM, 0, ctx);
    }));
    expect_equal(r, __LINE__, cat("allreduce of ", name), out, want);

    // Who the ranks of the group are: each gives its own rank (and two more values).
    static const uint64_t kScale[3] = {1, 10, 100};
    std::vector<uint64_t> mine{uint64_t(me), uint64_t(me) * 10 + 1, uint64_t(me) * 100 + 2};
    std::vector<uint64_t> all(3 * m + 1, kSentinel), all_want(3 * m + 1, kSentinel);
    for (int b = 0; b < m; ++b)
        for (int i = 0; i < 3; ++i)
            all_want[3 * b + i] = uint64_t(members[b]) * kScale[i] + uint64_t(i);
    RK_TRY(r, r.run(cat("allgather of ", name), [&](void *ctx) {
        return fi_allgather(ep, mine.data(), 3, nullptr, all.data(), nullptr, g, FI_UINT64, 0, ctx);
    }));
    expect_equal(r, __LINE__, cat("allgather of ", name, " (rank, 10 rank + 1, 100 rank + 2)"), all,
                 all_want);

    std::vector<uint64_t> buf(count + 1, kSentinel), bwant(count + 1, kSentinel);
    for (size_t i = 0; i < count; ++i) bwant[i] = val(s + 1, root, i);
    if (me == root) buf = bwant;
    RK_TRY(r, r.run(cat("broadcast of ", name), [&](void *ctx) {
        return fi_broadcast(ep, buf.data(), count, nullptr, g, fi_addr_t(root), FI_UINT64, 0, ctx);
    }));
    expect_equal(r, __LINE__, cat("broadcast of ", name, " from rank ", root), buf, bwant);
    RK_TRY(r, r.close_mc(mc));
}

void stride_and_set_operations(Rank &r) {
    RK_TRY(r, r.start(FI_MSG | FI_COLLECTIVE));
    // start_addr 1, end_addr 4, stride 2: ranks 1 and 3.
    fid_av_set *strided = r.range(1, 4, 2);
    RK_REQUIRE(r, strided);
    members_work(r, strided, {1, 3}, 3, "the set 1..4 stride 2");
    RK_TRY(r, !r.gave_up());
    RK_TRY(r, r.barrier());

    // Universe minus {2} (diff); {3, 4} union that: {3, 4, 0, 1}; intersect {1 .. 4}:
    // {3, 4, 1}; insert 2: {3, 4, 1, 2}; remove 4: {3, 1, 2}.
    fid_av_set *u = r.universe(), *two = r.empty_set(), *s = r.range(3, 4, 1),
               *upper = r.range(1, 4, 1);
    RK_REQUIRE(r, u && two && s && upper);
    RK_CALL(r, fi_av_set_insert(two, 2));
    RK_CALL(r, fi_av_set_diff(u, two));
    RK_CALL(r, fi_av_set_union(s, u));
    RK_CALL(r, fi_av_set_intersect(s, upper));
    RK_CALL(r, fi_av_set_insert(s, 2));
    RK_CALL(r, fi_av_set_remove(s, 4));
    // Set operations that must be refused: a duplicate, a removal of a non-member.
    RK_RET(r, fi_av_set_insert(s, 1), -FI_EINVAL);
    RK_RET(r, fi_av_set_remove(s, 0), -FI_EINVAL);
    members_work(r, s, {3, 1, 2}, 2, "the set {3, 1, 2}");
}

TEST(CollProcesses, NonPowerOfTwoAndStrideSets) {
    run_ranks(5, stride_and_set_operations);
}

// ---- 4: two groups at once ---------------------------------------------------------------------

void overlapping_groups(Rank &r) {
    RK_TRY(r, r.start(FI_MSG | FI_COLLECTIVE));
    const int me = r.rank, n = r.n;
    fid_mc *a = r.join_all();
    RK_TRY(r, a);
    const fi_addr_t ga = fi_mc_addr(a);
    // B: ranks 0 and 2, joined with A as its parent.
    const std::vector<int> b_members{0, 2};
    const bool in_b = me == 0 || me == 2;
    fi_addr_t gb = FI_ADDR_NOTAVAIL;
    fid_av_set *bset = r.range(0, 2, 2);
    RK_REQUIRE(r, bset);
    if (in_b) {
        fid_mc *b = r.join(bset, ga, "join of B = {0, 2} under A");
        RK_TRY(r, b);
        gb = fi_mc_addr(b);
    }
    fid_ep *ep = r.ep;
    const size_t counts[] = {1, 64, 9001};
    for (int it = 0; it < 9; ++it) {
        const size_t ca = counts[it % 3], cb = counts[(it + 1) % 3];
        const uint64_t sa = salt_of(FI_ALLREDUCE, ca, 100 + it);
        const uint64_t sb = salt_of(FI_ALLGATHER, cb, 100 + it);
        std::vector<uint64_t> ain(ca), aout(ca + 1, kSentinel), awant(ca + 1, kSentinel);
        for (size_t i = 0; i < ca; ++i) {
            ain[i] = val(sa, me, i);
            awant[i] = 0;
            for (int q = 0; q < n; ++q) awant[i] += val(sa, q, i);
        }
        std::vector<uint64_t> bin(cb), bout(2 * cb + 1, kSentinel), bwant(2 * cb + 1, kSentinel);
        for (size_t i = 0; i < cb; ++i) {
            bin[i] = val(sb, me, i);
            bwant[i] = val(sb, 0, i);
            bwant[cb + i] = val(sb, 2, i);
        }
        const std::string at = cat(" (iteration ", it, ")");
        void *ctx_a = r.new_ctx(), *ctx_b = r.new_ctx();
        RK_TRY(r, r.post(cat("allreduce on A", at), ctx_a, [&](void *ctx) {
            return fi_allreduce(ep, ain.data(), ca, nullptr, aout.data(), nullptr, ga, FI_UINT64,
                                FI_SUM, 0, ctx);
        }));
        if (in_b) {
            RK_TRY(r, r.post(cat("allgather on B", at), ctx_b, [&](void *ctx) {
                return fi_allgather(ep, bin.data(), cb, nullptr, bout.data(), nullptr, gb,
                                    FI_UINT64, 0, ctx);
            }));
            RK_TRY(r, r.wait(ctx_b, cat("allgather on B", at)));
            expect_equal(r, __LINE__, cat("allgather on B", at), bout, bwant);
        }
        RK_TRY(r, r.wait(ctx_a, cat("allreduce on A", at)));
        expect_equal(r, __LINE__, cat("allreduce on A", at), aout, awant);
    }
}

TEST(CollProcesses, OverlappingGroupsAtOnce) {
    run_ranks(4, overlapping_groups);
}

// ---- 5: a triggered collective ----------------------------------------------------------------

void triggered_collective(Rank &r) {
    RK_TRY(r, r.start(FI_MSG | FI_COLLECTIVE | FI_TRIGGER));
    RK_REQUIRE(r, r.cntr);
    fid_mc *mc = r.join_all();
    RK_TRY(r, mc);
    const fi_addr_t g = fi_mc_addr(mc);
    const int me = r.rank, n = r.n;
    fid_ep *ep = r.ep;
    const size_t count = 16;
    for (int form = 0; form < 2; ++form) {  // the short form, then the msg form
        const uint64_t s = salt_of(FI_ALLREDUCE, count, 200 + form);
        std::vector<uint64_t> in(count), out(count + 1, kSentinel), want(count + 1, kSentinel);
        for (size_t i = 0; i < count; ++i) {
            in[i] = val(s, me, i);
            want[i] = 0;
            for (int q = 0; q < n; ++q) want[i] += val(s, q, i);
        }
        fi_triggered_context t{};
        t.event_type = FI_TRIGGER_THRESHOLD;
        t.trigger.threshold.cntr = r.cntr;
        t.trigger.threshold.threshold = uint64_t(form) + 1;
        const std::string what =
            form == 0 ? "fi_allreduce(FI_TRIGGER)" : "fi_ops_collective::msg(FI_TRIGGER)";
        fi_ioc iov{in.data(), count}, res{out.data(), count};
        RK_TRY(r, r.post(what, &t, [&](void *ctx) -> ssize_t {
            if (form == 0)
                return fi_allreduce(ep, in.data(), count, nullptr, out.data(), nullptr, g,
                                    FI_UINT64, FI_SUM, FI_TRIGGER, ctx);
            fi_msg_collective msg{&iov,         nullptr,   1,      g,  FI_ADDR_NOTAVAIL,
                                  FI_ALLREDUCE, FI_UINT64, FI_SUM, ctx};
            return ep->collective->msg(ep, &msg, &res, nullptr, 1, FI_TRIGGER);
        }));
        RK_TRY(r, r.quiet_for(100, what));
        RK_CHECK(r, out[0] == kSentinel, what, ": the result was written before the trigger");
        RK_CALL(r, fi_cntr_add(r.cntr, 1));
        RK_TRY(r, r.wait(&t, what));
        expect_equal(r, __LINE__, what, out, want);
    }
}

TEST(CollProcesses, TriggeredCollective) {
    run_ranks(3, triggered_collective);
}

// ---- 6: joins and calls that fail -------------------------------------------------------------

void join_errors(Rank &r) {
    RK_TRY(r, r.start(FI_MSG | FI_COLLECTIVE));
    const int me = r.rank, n = r.n;
    fid_ep *ep = r.ep;
    fid_av_set *all = r.universe();
    RK_REQUIRE(r, all);
    const fi_addr_t all_addr = r.set_addr(all);
    RK_REQUIRE(r, all_addr != FI_ADDR_NOTAVAIL);
    uint64_t in[4] = {1, 2, 3, 4}, out[4] = {};
    auto allreduce_on = [&](fi_addr_t a, fi_datatype dt, fi_op op) {
        return fi_allreduce(ep, in, 2, nullptr, out, nullptr, a, dt, op, 0, r.new_ctx());
    };

    // fi_join without FI_COLLECTIVE: no multicast.
    {
        fi_collective_addr ca{all, all_addr};
        fid_mc *mc = nullptr;
        RK_RET(r, fi_join(ep, &ca, 0, &mc, r.new_ctx()), -FI_ENOSYS);
    }
    // A set without this endpoint; a parent set without all of the new set's members.
    {
        fid_av_set *others = r.universe();
        RK_REQUIRE(r, others);
        RK_CALL(r, fi_av_set_remove(others, fi_addr_t(me)));
        fid_mc *mc = nullptr;
        RK_RET(r, r.join_call(others, r.set_addr(others), r.new_ctx(), &mc), -FI_EINVAL);
        fid_av_set *pair = r.range(0, 1, 1);
        RK_REQUIRE(r, pair);
        RK_RET(r, r.join_call(all, r.set_addr(pair), r.new_ctx(), &mc), -FI_EINVAL);
    }
    // Collectives on addresses that are no joined group: a set's, an AV address.
    RK_RET(r, allreduce_on(all_addr, FI_UINT64, FI_SUM), -FI_EINVAL);
    RK_RET(r, allreduce_on(fi_addr_t(1), FI_UINT64, FI_SUM), -FI_EINVAL);
    RK_RET(r, fi_barrier(ep, all_addr, r.new_ctx()), -FI_EINVAL);

    fid_mc *mc = r.join(all, all_addr, "join of every rank");
    RK_TRY(r, mc);
    const fi_addr_t g = fi_mc_addr(mc);
    // Operations no collective runs.
    RK_RET(r, allreduce_on(g, FI_UINT64, FI_CSWAP), -FI_EOPNOTSUPP);
    RK_RET(r, allreduce_on(g, FI_UINT64, FI_ATOMIC_WRITE), -FI_EOPNOTSUPP);
    RK_RET(r, allreduce_on(g, FI_UINT64, FI_ATOMIC_READ), -FI_EOPNOTSUPP);
    RK_RET(r, allreduce_on(g, FI_DOUBLE, FI_BOR), -FI_EOPNOTSUPP);
    RK_RET(r, allreduce_on(g, FI_FLOAT_COMPLEX, FI_MIN), -FI_EOPNOTSUPP);
    RK_RET(r, fi_reduce(ep, in, 2, nullptr, out, nullptr, g, 0, FI_INT32, FI_MSWAP, 0, r.new_ctx()),
           -FI_EOPNOTSUPP);
    RK_RET(
        r,
        fi_reduce_scatter(ep, in, 1, nullptr, out, nullptr, g, FI_FLOAT, FI_BXOR, 0, r.new_ctx()),
        -FI_EOPNOTSUPP);
    // The group works.
    RK_TRY(r, r.run("allreduce after the refusals", [&](void *ctx) {
        return fi_allreduce(ep, in, 4, nullptr, out, nullptr, g, FI_UINT64, FI_SUM, 0, ctx);
    }));
    for (int i = 0; i < 4; ++i)
        RK_CHECK(r, out[i] == uint64_t(n) * in[i], "allreduce element ", i, " = ", out[i]);
    // The endpoint is busy while a group is open; a closed group's address names nothing.
    RK_RET(r, fi_close(&ep->fid), -FI_EBUSY);
    RK_TRY(r, r.close_mc(mc));
    RK_RET(r, allreduce_on(g, FI_UINT64, FI_SUM), -FI_EINVAL);
    RK_TRY(r, r.barrier());

    // Members that list the set in different orders: ranks 0 .. n-2 in rank order, the last
    // rank in reverse. Every join ends with an error event, FI_EINVAL.
    {
        fid_av_set *set = r.empty_set();
        RK_REQUIRE(r, set);
        for (int i = 0; i < n; ++i)
            RK_CALL(r, fi_av_set_insert(set, fi_addr_t(me == n - 1 ? n - 1 - i : i)));
        void *ctx = r.new_ctx();
        fid_mc *bad = nullptr;
        RK_CALL(r, r.join_call(set, r.set_addr(set), ctx, &bad));
        EqEvent ev;
        // (A join ends in milliseconds: 5 s, not kWait, keeps a hang short.)
        RK_TRY(r, r.wait_eq(ev, "the join of a set in different orders", 5s));
        if (!ev.error) {
            RK_FAIL(r, "the join of a set listed in different orders completed (event ", ev.event,
                    ")");
        } else {
            RK_CHECK(r, ev.err.err == FI_EINVAL, "err ", ev.err.err, " (", fi_strerror(ev.err.err),
                     ")");
            RK_CHECK(r, ev.err.fid == &bad->fid, "the error entry names another fid");
            RK_CHECK(r, ev.err.context == ctx, "the error entry carries another context");
        }
        // A group that never joined takes no operation.
        RK_RET(r, allreduce_on(fi_mc_addr(bad), FI_UINT64, FI_SUM), -FI_EINVAL);
        RK_TRY(r, r.close_mc(bad));
    }
    RK_TRY(r, r.barrier());

    // The same members, in the same order everywhere, still join and work.
    mc = r.join(all, all_addr, "the join after the failed one");
    RK_TRY(r, mc);
    RK_TRY(r, r.run("allreduce after the failed join", [&](void *ctx) {
        return fi_allreduce(ep, in, 4, nullptr, out, nullptr, fi_mc_addr(mc), FI_UINT64, FI_PROD, 0,
                            ctx);
    }));
    for (int i = 0; i < 4; ++i) {
        uint64_t want = 1;
        for (int q = 0; q < n; ++q) want *= in[i];
        RK_CHECK(r, out[i] == want, "allreduce FI_PROD element ", i, " = ", out[i]);
    }
}

TEST(CollProcesses, JoinErrors) {
    run_ranks(3, join_errors);
}

// ---- 7: a member dies -------------------------------------------------------------------------

// The last rank is killed after a first allreduce; the survivors' next allreduce, which it
// never joins, must end at every survivor with an error completion FI_ECONNRESET (node-local:
// the group's segment sees the process gone; over the link: the probes of the silent member
// cannot be delivered), never hang; then a new group of the survivors works.
void member_death(Rank &r) {
    RK_TRY(r, r.start(FI_MSG | FI_COLLECTIVE));
    fid_mc *mc = r.join_all();
    RK_TRY(r, mc);
    fid_ep *ep = r.ep;
    const fi_addr_t g = fi_mc_addr(mc);
    const int n = r.n;
    uint64_t in = uint64_t(r.rank) + 1, out = 0;
    RK_TRY(r, r.run("the allreduce before", [&](void *ctx) {
        return fi_allreduce(ep, &in, 1, nullptr, &out, nullptr, g, FI_UINT64, FI_SUM, 0, ctx);
    }));
    RK_CHECK(r, out == uint64_t(n) * uint64_t(n + 1) / 2, "the allreduce before gave ", out);
    RK_TRY(r, r.barrier("before the death"));
    if (r.rank == n - 1) r.die();

    // A broadcast from the dead member: the survivors only wait for it, so over the link only
    // the probes of the silent member find out; then an allreduce, which sends to it too.
    uint64_t data = 0;
    for (int which = 0; which < 2; ++which) {
        const std::string what =
            which == 0 ? "the broadcast from the dead member" : "the allreduce after the death";
        void *ctx = r.new_ctx();
        const auto t0 = Clock::now();
        RK_TRY(r, r.post(what, ctx, [&](void *c) {
            if (which == 0)
                return fi_broadcast(ep, &data, 1, nullptr, g, fi_addr_t(n - 1), FI_UINT64, 0, c);
            return fi_allreduce(ep, &in, 1, nullptr, &out, nullptr, g, FI_UINT64, FI_SUM, 0, c);
        }));
        int err = 0;
        RK_TRY(r, r.wait_result(ctx, what, &err));
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
        RK_CHECK(r, err == FI_ECONNRESET, what, " ended with err ", err, " (", fi_strerror(err),
                 "), not FI_ECONNRESET");
        if (r.rank == 0) {
            printf("%s: error completion after %lld ms\n", what.c_str(), (long long)ms.count());
            fflush(stdout);
        }
    }

    // The survivors carry on in a new group.
    fid_av_set *rest = r.range(0, fi_addr_t(n - 2), 1);
    RK_TRY(r, rest);
    const fi_addr_t rest_addr = r.set_addr(rest);
    RK_TRY(r, rest_addr != FI_ADDR_NOTAVAIL);
    fid_mc *mc2 = r.join(rest, rest_addr, "the survivors' join");
    RK_TRY(r, mc2);
    const fi_addr_t g2 = fi_mc_addr(mc2);
    RK_TRY(r, r.run("the survivors' allreduce", [&](void *c) {
        return fi_allreduce(ep, &in, 1, nullptr, &out, nullptr, g2, FI_UINT64, FI_SUM, 0, c);
    }));
    RK_CHECK(r, out == uint64_t(n - 1) * uint64_t(n) / 2, "the survivors' allreduce gave ", out);
}

TEST(CollProcesses, MemberDeath) {
    run_ranks(4, member_death);
}

}  // namespace
