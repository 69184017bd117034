// Collectives (fi_collective(3)) between processes: every rank of a group is a process of its
// own (tests/common/coll_rank.h), forked from the gtest process before any libfabric call (the
// gtest process never makes one). The ranks share one anonymous MAP_SHARED block made before the
// fork: each publishes its endpoint name there, and all insert every name in rank order, so that
// rank r is fi_addr_t r in every AV; a counter in the block is the ranks' barrier. Each rank
// checks the results of its calls against the reference of tests/common/coll_reference.h,
// computed from the inputs, which are a function of (rank, element) every rank can compute.
//
// A rank writes what went wrong as text into its slot of the block and exits non-zero; one that
// gives up (its calls cannot go on) raises the block's abort flag, so the others stop waiting
// for it. Every wait of a rank is bounded (kWait); the gtest process kills whatever has not
// exited at its deadline and fails the test with the ranks' messages.
//
// ctest runs the suite twice: peer.coll_processes.local.* over the node-local path,
// .net.* over the TCP link (FI_TANDEM_LOCAL=0).
#include "tests/common/atomic_reference.h"
#include "tests/common/coll_rank.h"
#include "tests/common/coll_reference.h"
#include "tests/common/shared_map.h"

#include <gtest/gtest.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_trigger.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace std::chrono_literals;
using namespace tandem_test::coll_procs;
using namespace tandem_test::coll_ref;
namespace atomic_ref = tandem_test::atomic_ref;

constexpr auto kWait = 20s;      // any one wait of a rank (a completion, an event, a barrier)
constexpr auto kDeadline = 75s;  // the gtest process's, for all ranks of a test to exit

// ---- what the processes share -----------------------------------------------------------------

struct Slot {
    std::atomic<int> failed;  // any failure reported below
    std::atomic<int> done;    // the rank's body returned (it did not crash)
    std::atomic<int> dies;    // the rank kills itself on purpose (MemberDeath)
    uint32_t msg_len;
    char msg[16384];
};

struct Shared {
    RankBoard board;
    Slot slot[kMaxRanks];
};

// ---- one rank ---------------------------------------------------------------------------------

// A rank's failures: text in its slot (at most 40 of them), read by the gtest process.
class SlotReport {
  public:
    explicit SlotReport(Slot &slot) : slot_(slot) {}
    bool fail(const char *file, int line, const std::string &msg) {
        slot_.failed.store(1);
        if (++failures_ > 40) return false;
        const char *base = strrchr(file, '/');
        std::string text = failures_ == 40 ? std::string("(more failures left out)")
                                           : cat(base ? base + 1 : file, ":", line, ": ", msg);
        for (char &c : text)
            if (c == '\n') c = ' ';
        text += '\n';
        const size_t room = sizeof slot_.msg - 1 - slot_.msg_len;
        const size_t len = std::min(room, text.size());
        std::memcpy(slot_.msg + slot_.msg_len, text.data(), len);
        slot_.msg_len += uint32_t(len);
        return false;
    }

  private:
    Slot &slot_;
    int failures_ = 0;
};

// The libfabric calls this process links.
const Lib kLinked{&fi_getinfo, &fi_freeinfo, &fi_dupinfo, &fi_fabric, &fi_strerror};

class Rank : public CollRank<SlotReport> {
  public:
    Rank(SlotReport &rep, Shared &sh, int rank, int n)
        : CollRank(rep, kLinked, sh.board, rank, n, kWait), slot_(sh.slot[rank]) {}

    // The rank's process ends here, killed (MemberDeath): its barriers no longer count.
    [[noreturn]] void die() {
        mark_dead();
        slot_.dies.store(1);
        fflush(stdout);
        fflush(stderr);
        raise(SIGKILL);
        _exit(99);
    }

  private:
    Slot &slot_;
};

// Forks n ranks running body, waits for them (kDeadline) and fails the test with their messages.
void run_ranks(int n, const std::function<void(Rank &)> &body) {
    ASSERT_LE(n, kMaxRanks);
    tandem_test::SharedMap<Shared> block;
    Shared *sh = block.get();
    ASSERT_NE(sh, nullptr) << "mmap of the shared block failed";
    fflush(stdout);
    fflush(stderr);
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
        pid_t pid = fork();
        if (pid < 0) {
            ADD_FAILURE() << "fork: " << strerror(errno);
            sh->board.abort.store(kMaxRanks + 1);
            break;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            const std::string name = cat("coll-rank-", r);  // at most 15 characters
            prctl(PR_SET_NAME, name.c_str());
            {
                SlotReport report(sh->slot[r]);
                Rank rank(report, *sh, r, n);
                try {
                    body(rank);
                    if (!rank.gave_up()) rank.finish();
                } catch (const std::exception &e) {
                    RK_FAIL(rank, "exception: ", e.what());
                    rank.give_up();
                } catch (...) {
                    RK_FAIL(rank, "unknown exception");
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
                    sh->board.abort.store(int(i) + 1);
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

        for (int root = 0; root < n; ++root) {  // the root's vector everywhere
            const Plan p =
                plan(FI_BROADCAST, count, root, n, me, salt_of(FI_BROADCAST, count, root));
            std::vector<uint64_t> buf = p.in;
            const std::string what = cat("fi_broadcast root ", root, at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_broadcast(ep, buf.data(), count, nullptr, g, fi_addr_t(root), FI_UINT64,
                                    0, ctx);
            }));
            RK_EXPECT_EQUAL(r, what, buf, p.want);
        }

        {  // rank q's block j goes to rank j's block q
            Plan p = plan(FI_ALLTOALL, count, 0, n, me, salt_of(FI_ALLTOALL, count));
            const std::string what = cat("fi_alltoall", at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_alltoall(ep, p.in.data(), count, nullptr, p.out.data(), nullptr, g,
                                   FI_UINT64, 0, ctx);
            }));
            RK_EXPECT_EQUAL(r, what, p.out, p.want);
        }

        {  // FI_SUM of FI_UINT64 (wrapping)
            Plan p = plan(FI_ALLREDUCE, count, 0, n, me, salt_of(FI_ALLREDUCE, count));
            const std::string what = cat("fi_allreduce FI_SUM FI_UINT64", at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_allreduce(ep, p.in.data(), count, nullptr, p.out.data(), nullptr, g,
                                    FI_UINT64, FI_SUM, 0, ctx);
            }));
            RK_EXPECT_EQUAL(r, what, p.out, p.want);
        }

        {  // block q from rank q
            Plan p = plan(FI_ALLGATHER, count, 0, n, me, salt_of(FI_ALLGATHER, count));
            const std::string what = cat("fi_allgather", at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_allgather(ep, p.in.data(), count, nullptr, p.out.data(), nullptr, g,
                                    FI_UINT64, 0, ctx);
            }));
            RK_EXPECT_EQUAL(r, what, p.out, p.want);
        }

        {  // FI_SUM of FI_INT32: block `me` of the sum of n blocks
            const uint64_t s = salt_of(FI_REDUCE_SCATTER, count);
            std::vector<std::vector<int32_t>> ins(n, std::vector<int32_t>(n * count + 1));
            for (int q = 0; q < n; ++q)
                for (size_t j = 0; j < n * count; ++j)
                    ins[q][j] = int32_t(val(s, q, j) % 2001) - 1000;  // small
            std::vector<int32_t> out(count + 1, int32_t(kSentinel)),
                want = result_of(FI_REDUCE_SCATTER, FI_INT32, FI_SUM, count, 0, me, ins);
            want.push_back(int32_t(kSentinel));
            const std::string what = cat("fi_reduce_scatter FI_SUM FI_INT32", at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_reduce_scatter(ep, ins[me].data(), count, nullptr, out.data(), nullptr, g,
                                         FI_INT32, FI_SUM, 0, ctx);
            }));
            RK_EXPECT_EQUAL(r, what, out, want);
        }

        for (int root = 0; root < n; ++root) {  // FI_MAX of FI_INT64, the root's result only
            const uint64_t s = salt_of(FI_REDUCE, count, root);
            std::vector<std::vector<int64_t>> ins(n, std::vector<int64_t>(count + 1));
            for (int q = 0; q < n; ++q)
                for (size_t i = 0; i < count; ++i) ins[q][i] = int64_t(val(s, q, i));
            std::vector<int64_t> out(count + 1, int64_t(kSentinel)),
                want = result_of(FI_REDUCE, FI_INT64, FI_MAX, count, root, me, ins);
            want.push_back(int64_t(kSentinel));
            const std::string what = cat("fi_reduce FI_MAX FI_INT64 root ", root, at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_reduce(ep, ins[me].data(), count, nullptr,
                                 me == root ? out.data() : nullptr, nullptr, g, fi_addr_t(root),
                                 FI_INT64, FI_MAX, 0, ctx);
            }));
            if (me == root) RK_EXPECT_EQUAL(r, what, out, want);
        }

        for (int root = 0; root < n; ++root) {  // the root's block q to rank q
            Plan p = plan(FI_SCATTER, count, root, n, me, salt_of(FI_SCATTER, count, root));
            const std::string what = cat("fi_scatter root ", root, at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_scatter(ep, me == root ? p.in.data() : nullptr, count, nullptr,
                                  p.out.data(), nullptr, g, fi_addr_t(root), FI_UINT64, 0, ctx);
            }));
            RK_EXPECT_EQUAL(r, what, p.out, p.want);
        }

        for (int root = 0; root < n; ++root) {  // rank q's block to the root's block q
            Plan p = plan(FI_GATHER, count, root, n, me, salt_of(FI_GATHER, count, root));
            const std::string what = cat("fi_gather root ", root, at);
            RK_TRY(r, r.run(what, [&](void *ctx) {
                return fi_gather(ep, p.in.data(), count, nullptr,
                                 me == root ? p.out.data() : nullptr, nullptr, g, fi_addr_t(root),
                                 FI_UINT64, 0, ctx);
            }));
            if (me == root) RK_EXPECT_EQUAL(r, what, p.out, p.want);
        }
    }

    RK_TRY(r, r.run("fi_barrier2", [&](void *ctx) { return fi_barrier2(ep, g, 0, ctx); }));

    {  // the msg form (fi_ops_collective::msg) of an allreduce
        const size_t count = 100;
        Plan p = plan(FI_ALLREDUCE, count, 0, n, me, salt_of(FI_ALLREDUCE, count, 77));
        fi_ioc iov{p.in.data(), count}, res{p.out.data(), count};
        RK_TRY(r, r.run("fi_ops_collective::msg FI_ALLREDUCE", [&](void *ctx) {
            fi_msg_collective msg{&iov,         nullptr,   1,      g,  FI_ADDR_NOTAVAIL,
                                  FI_ALLREDUCE, FI_UINT64, FI_SUM, ctx};
            return ep->collective->msg(ep, &msg, &res, nullptr, 1, 0);
        }));
        RK_EXPECT_EQUAL(r, "msg-form allreduce", p.out, p.want);
    }
}

TEST(CollProcesses, EveryCollectiveHostMemory3Ranks) {
    run_ranks(3, every_collective);
}
TEST(CollProcesses, EveryCollectiveHostMemory4Ranks) {
    run_ranks(4, every_collective);
}

// ---- 2: every reduction fi_query_collective reports ------------------------------------------

using atomic_ref::IsCx;

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
    if constexpr (IsCx<T>::value) {
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
            if (IsCx<T>::value && (r + j) % 3 == 1) return make<T>(0, v);
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
std::string show(const T &v) {
    if constexpr (IsCx<T>::value)
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
    std::vector<std::vector<T>> ins(n, std::vector<T>(in_len));
    for (int q = 0; q < n; ++q)
        for (size_t j = 0; j < in_len; ++j) ins[q][j] = input<T>(op, q, j);
    std::vector<T> &in = ins[me];
    std::vector<T> out(kCount, make<T>(99, 99));
    const std::vector<T> want =
        result_of(fi_collective_op(coll), dt, op, kCount, uint32_t(root), uint32_t(me), ins);
    const std::string what =
        cat(coll_name(coll), " ", atomic_ref::op_name(op), " ", atomic_ref::datatype_name(dt),
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
            RK_FAIL(r, what, ": element ", i, " = ", show(out[i]), ", expected ", show(want[i]));
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
                    RK_FAIL(r, "fi_query_collective(", coll_name(coll), ", ",
                            atomic_ref::op_name(op), ", ", atomic_ref::datatype_name(dt), ") -> ",
                            r.str(ret), ", expected -FI_EOPNOTSUPP");
            }
            const bool complex =
                dt == FI_FLOAT_COMPLEX || dt == FI_DOUBLE_COMPLEX || dt == FI_LONG_DOUBLE_COMPLEX;
            for (int op = FI_MIN; op <= FI_BXOR; ++op) {
                const int ret = query(coll, dt, op);
                if (complex && op == FI_MIN && ret != -FI_EOPNOTSUPP && say)
                    RK_FAIL(r, "fi_query_collective(", coll_name(coll), ", FI_MIN, ",
                            atomic_ref::datatype_name(dt), ") -> ", r.str(ret),
                            ", expected -FI_EOPNOTSUPP");
                if (ret == -FI_EOPNOTSUPP) continue;
                if (ret != 0) {
                    if (say)
                        RK_FAIL(r, "fi_query_collective(", coll_name(coll), ", ",
                                atomic_ref::op_name(op), ", ", atomic_ref::datatype_name(dt),
                                ") -> ", r.str(ret));
                    continue;
                }
                bool ok = true;
                const int root = index++ % r.n;
                atomic_ref::with_type(dt, [&](auto tag) {
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

// The collectives' own messages never meet the application's receives: over the link they are
// tagged peer transfers on the application's endpoint (fi_peer(3), FI_PEER_TRANSFER), matched
// only against the twin's receives. Each rank posts wildcard receives (any source; any tag) before
// the collectives run; the application's messages sent after them must be what fills them, and
// no completion but the application's reaches its CQ (finish). Endpoints without FI_TAGGED carry
// their collectives' tagged messages too (every_collective asks FI_MSG | FI_COLLECTIVE alone).
void collectives_beside_wildcard_receives(Rank &r) {
    RK_TRY(r, r.start(FI_MSG | FI_TAGGED | FI_COLLECTIVE));
    fid_ep *ep = r.ep;
    const int n = r.n, me = r.rank;
    char tagged_in[64] = {}, plain_in[64] = {};
    void *tagged_rx = r.new_ctx(), *plain_rx = r.new_ctx();
    RK_TRY(r, r.post("wildcard fi_trecv", tagged_rx, [&](void *ctx) {
        return fi_trecv(ep, tagged_in, sizeof tagged_in, nullptr, FI_ADDR_UNSPEC, 0, ~0ull, ctx);
    }));
    RK_TRY(r, r.post("wildcard fi_recv", plain_rx, [&](void *ctx) {
        return fi_recv(ep, plain_in, sizeof plain_in, nullptr, FI_ADDR_UNSPEC, ctx);
    }));
    fid_mc *mc = r.join_all();
    RK_TRY(r, mc);
    const fi_addr_t g = fi_mc_addr(mc);
    for (int i = 0; i < 20; ++i) {
        uint64_t in = uint64_t(me) + 1, out = 0;
        RK_TRY(r, r.run("fi_allreduce", [&](void *ctx) {
            return fi_allreduce(ep, &in, 1, nullptr, &out, nullptr, g, FI_UINT64, FI_SUM, 0, ctx);
        }));
        RK_CHECK(r, out == uint64_t(n) * uint64_t(n + 1) / 2, "allreduce ", i, " gave ", out);
        RK_TRY(r, r.run("fi_barrier", [&](void *ctx) { return fi_barrier(ep, g, ctx); }));
    }
    RK_TRY(r, r.barrier("the collectives are done"));
    // Only now does anything the application receives leave: to the next rank.
    const std::string tagged_out = cat("tagged from ", me), plain_out = cat("plain from ", me);
    const fi_addr_t next = fi_addr_t((me + 1) % n);
    void *tagged_tx = r.new_ctx(), *plain_tx = r.new_ctx();
    RK_TRY(r, r.post("fi_tsend", tagged_tx, [&](void *ctx) {
        return fi_tsend(ep, tagged_out.c_str(), tagged_out.size() + 1, nullptr, next,
                        0x5eed0000u + unsigned(me), ctx);
    }));
    RK_TRY(r, r.post("fi_send", plain_tx, [&](void *ctx) {
        return fi_send(ep, plain_out.c_str(), plain_out.size() + 1, nullptr, next, ctx);
    }));
    int err = -1;
    for (void *tx : {tagged_tx, plain_tx}) {
        RK_TRY(r, r.wait_result(tx, "a send of the application's", &err));
        RK_CHECK(r, err == 0, "a send of the application's failed: ", err);
    }
    RK_TRY(r, r.wait_result(tagged_rx, "the wildcard fi_trecv", &err));
    RK_CHECK(r, err == 0, "the wildcard fi_trecv failed: ", err);
    RK_TRY(r, r.wait_result(plain_rx, "the wildcard fi_recv", &err));
    RK_CHECK(r, err == 0, "the wildcard fi_recv failed: ", err);
    const int prev = (me + n - 1) % n;
    RK_CHECK(r, std::string(tagged_in) == cat("tagged from ", prev), "the wildcard fi_trecv got \"",
             tagged_in, "\"");
    RK_CHECK(r, std::string(plain_in) == cat("plain from ", prev), "the wildcard fi_recv got \"",
             plain_in, "\"");
}

TEST(CollProcesses, CollectivesNeverMeetTheApplicationsWildcardReceives) {
    run_ranks(3, collectives_beside_wildcard_receives);
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
    RK_EXPECT_EQUAL(r, cat("allreduce of ", name), out, want);

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
    RK_EXPECT_EQUAL(r, cat("allgather of ", name, " (rank, 10 rank + 1, 100 rank + 2)"), all,
                    all_want);

    std::vector<uint64_t> buf(count + 1, kSentinel), bwant(count + 1, kSentinel);
    for (size_t i = 0; i < count; ++i) bwant[i] = val(s + 1, root, i);
    if (me == root) buf = bwant;
    RK_TRY(r, r.run(cat("broadcast of ", name), [&](void *ctx) {
        return fi_broadcast(ep, buf.data(), count, nullptr, g, fi_addr_t(root), FI_UINT64, 0, ctx);
    }));
    RK_EXPECT_EQUAL(r, cat("broadcast of ", name, " from rank ", root), buf, bwant);
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
        Plan a_plan = plan(FI_ALLREDUCE, ca, 0, n, me, salt_of(FI_ALLREDUCE, ca, 100 + it));
        const uint64_t sb = salt_of(FI_ALLGATHER, cb, 100 + it);
        std::vector<uint64_t> bin(cb), bout(2 * cb + 1, kSentinel), bwant(2 * cb + 1, kSentinel);
        for (size_t i = 0; i < cb; ++i) {
            bin[i] = val(sb, me, i);
            bwant[i] = val(sb, 0, i);
            bwant[cb + i] = val(sb, 2, i);
        }
        const std::string at = cat(" (iteration ", it, ")");
        void *ctx_a = r.new_ctx(), *ctx_b = r.new_ctx();
        RK_TRY(r, r.post(cat("allreduce on A", at), ctx_a, [&](void *ctx) {
            return fi_allreduce(ep, a_plan.in.data(), ca, nullptr, a_plan.out.data(), nullptr, ga,
                                FI_UINT64, FI_SUM, 0, ctx);
        }));
        if (in_b) {
            RK_TRY(r, r.post(cat("allgather on B", at), ctx_b, [&](void *ctx) {
                return fi_allgather(ep, bin.data(), cb, nullptr, bout.data(), nullptr, gb,
                                    FI_UINT64, 0, ctx);
            }));
            RK_TRY(r, r.wait(ctx_b, cat("allgather on B", at)));
            RK_EXPECT_EQUAL(r, cat("allgather on B", at), bout, bwant);
        }
        RK_TRY(r, r.wait(ctx_a, cat("allreduce on A", at)));
        RK_EXPECT_EQUAL(r, cat("allreduce on A", at), a_plan.out, a_plan.want);
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
        Plan p = plan(FI_ALLREDUCE, count, 0, n, me, salt_of(FI_ALLREDUCE, count, 200 + form));
        fi_triggered_context t{};
        t.event_type = FI_TRIGGER_THRESHOLD;
        t.trigger.threshold.cntr = r.cntr;
        t.trigger.threshold.threshold = uint64_t(form) + 1;
        const std::string what =
            form == 0 ? "fi_allreduce(FI_TRIGGER)" : "fi_ops_collective::msg(FI_TRIGGER)";
        fi_ioc iov{p.in.data(), count}, res{p.out.data(), count};
        RK_TRY(r, r.post(what, &t, [&](void *ctx) -> ssize_t {
            if (form == 0)
                return fi_allreduce(ep, p.in.data(), count, nullptr, p.out.data(), nullptr, g,
                                    FI_UINT64, FI_SUM, FI_TRIGGER, ctx);
            fi_msg_collective msg{&iov,         nullptr,   1,      g,  FI_ADDR_NOTAVAIL,
                                  FI_ALLREDUCE, FI_UINT64, FI_SUM, ctx};
            return ep->collective->msg(ep, &msg, &res, nullptr, 1, FI_TRIGGER);
        }));
        RK_TRY(r, r.quiet_for(100, cat(what, ", before the trigger")));
        RK_CHECK(r, p.out[0] == kSentinel, what, ": the result was written before the trigger");
        RK_CALL(r, fi_cntr_add(r.cntr, 1));
        RK_TRY(r, r.wait(&t, what));
        RK_EXPECT_EQUAL(r, what, p.out, p.want);
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
// cannot be delivered), never hang; then a new group of the survivors works. `asleep`: the
// survivors wait for those completions asleep on their CQ's descriptor, where no pass of
// theirs runs the checks unless the provider wakes them for it.
void member_death(Rank &r, bool asleep) {
    if (asleep) r.cq_wait = FI_WAIT_FD;
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
        RK_TRY(r, asleep ? r.sleep_for_result(ctx, what, &err) : r.wait_result(ctx, what, &err));
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
    run_ranks(4, [](Rank &r) { member_death(r, false); });
}

TEST(CollProcesses, MemberDeathWhileTheSurvivorsSleep) {
    run_ranks(4, [](Rank &r) { member_death(r, true); });
}

// The same with endpoints not permitted shared memory (FI_OPT_SHARED_MEMORY_PERMITTED false):
// no node-local segment, and so no wake FIFO either, but the sleepers must still wake for the
// probes of the silent member.
TEST(CollProcesses, MemberDeathWhileTheSurvivorsSleepWithoutSharedMemory) {
    run_ranks(4, [](Rank &r) {
        r.shm_permitted = false;
        member_death(r, true);
    });
}

}  // namespace
