// The node-local collectives of off_tandem (offload_prov/coll/shm_*.cpp: ShmGroup, ShmOp), with
// every member of a group in this one process: a group of n is n ShmGroup objects mapping the
// same segment (rank 0's made by ShmGroup::create, the others' by ShmGroup::open), each with its
// own order of operations (next_gen, turn), as n processes would have.
//
// An operation is one ShmOp per rank, made in the same order on every rank. The test drives the
// operations not finished yet in a seeded random order, each rank sitting out a share of the
// calls of its own (so some run ahead, a generation or more, and others lag), until all have
// finished; a run in which no operation finishes for many calls fails with the state of every
// member instead of hanging. Results are compared, exactly, with a straightforward reference
// of tests/common/coll_reference.h; inputs must stay untouched and nothing may be written outside
// the buffers (tests/common/coll_unit.h).
//
// A member that died is simulated with a forked child that opens the group and exits.
#include "offload_prov/coll/schedule.h"
#include "offload_prov/coll/shm_group.h"
#include "tests/common/atomic_reference.h"
#include "tests/common/coll_reference.h"
#include "tests/common/coll_unit.h"

#include <rdma/fi_errno.h>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using tandem::off::coll::Args;
using tandem::off::coll::ShmGroup;
using tandem::off::coll::ShmOp;
using namespace tandem_test::coll_ref;
using namespace tandem_test::coll_unit;
using tandem_test::atomic_ref::element_size;

// The boundaries the tests aim at: the chunk of one generation, the sub-slot (one
// destination's piece) of alltoall and reduce-scatter, and the size up to which every member
// of an allreduce reduces the whole vector itself (shm_reduce.cpp's kWhole).
constexpr size_t kChunk = 256u << 10;
static_assert(ShmGroup::kChunk == kChunk, "the boundaries below assume 256 KiB chunks");
constexpr size_t kWhole = 4096;

// Bytes of one block a generation carries (shm_blocks.cpp): a slot of n sub-slots, each a
// multiple of 64 bytes, for alltoall and reduce-scatter; the whole chunk otherwise.
size_t piece_of(fi_collective_op c, uint32_t n) {
    if (c == FI_ALLTOALL || c == FI_REDUCE_SCATTER) return kChunk / n / 64 * 64;
    return kChunk;
}

// A call that makes no progress for this many progress() calls is stuck.
constexpr uint64_t kStallCalls = 10'000'000;

// ---- seeds ---------------------------------------------------------------------------------

uint64_t seed_of(std::initializer_list<uint64_t> parts) {
    return hash_of(0x73686d636f6cull, parts);
}

// ---- groups ----------------------------------------------------------------------------------

// Segment names no other run (or other group of this run) uses.
std::string fresh_name() {
    static const uint64_t key = (uint64_t(std::random_device{}()) << 32) ^ uint64_t(::getpid());
    static uint32_t id = 0;
    return ShmGroup::name_for(key, ++id);
}

// One group of n, every member in this process.
class Group {
  public:
    explicit Group(uint32_t n) : name_(fresh_name()) {
        members_.push_back(ShmGroup::create(name_, n));
        for (uint32_t r = 1; r < n; ++r) {
            members_.push_back(ShmGroup::open(name_, n, r));
            if (!members_.back())
                throw std::runtime_error("rank " + std::to_string(r) + " cannot open " + name_);
        }
        if (!members_.front()->all_attached())
            throw std::runtime_error("not every member attached to " + name_);
    }
    ShmGroup &at(uint32_t r) { return *members_[r]; }
    uint32_t size() const { return uint32_t(members_.size()); }

  private:
    std::string name_;
    std::vector<std::unique_ptr<ShmGroup>> members_;
};

// ---- driving operations ----------------------------------------------------------------------

struct Posted {
    ShmGroup *group = nullptr;
    uint32_t rank = 0;
    size_t index = 0;  // in the posting order of its rank
    std::unique_ptr<ShmOp> op;
    bool finished = false;
    uint64_t finished_at = 0;  // of all operations of the driver, the how-manieth to finish
};

class Driver {
  public:
    explicit Driver(uint64_t seed) : rng_(seed) {}

    Posted &post(ShmGroup &g, size_t index, const Args &a, const void *send, void *recv) {
        auto p = std::make_unique<Posted>();
        p->group = &g;
        p->rank = g.rank();
        p->index = index;
        p->op = std::make_unique<ShmOp>(g, a, send, recv);
        ops_.push_back(std::move(p));
        return *ops_.back();
    }
    const std::vector<std::unique_ptr<Posted>> &ops() const { return ops_; }

    // Progresses the unfinished operations until all have finished (true), or none has
    // finished for stall_calls calls (false, with a failure that says who is stuck).
    bool run(const std::string &label, uint64_t stall_calls = kStallCalls) {
        return drive(label, stall_calls, -1, 0) && all_finished();
    }

    // Calls progress() `calls` times on the operations of every rank but `absent`; returns
    // how many finished meanwhile.
    size_t run_without(uint32_t absent, uint64_t calls) {
        const uint64_t before = finishes_;
        drive("", std::numeric_limits<uint64_t>::max(), int64_t(absent), calls);
        return size_t(finishes_ - before);
    }

    bool all_finished() const {
        for (auto &p : ops_)
            if (!p->finished) return false;
        return true;
    }

    // Every unfinished operation, and the shared counters and order of every member.
    std::string report() const {
        std::ostringstream o;
        std::map<uint32_t, const ShmGroup *> groups;
        for (auto &p : ops_) {
            groups[p->rank] = p->group;
            if (!p->finished) o << "\n  rank " << p->rank << " operation " << p->index;
        }
        for (auto &[rank, g] : groups) {
            const ShmGroup::Ctl &c = g->ctl(rank);
            o << "\n  rank " << rank << ": turn " << g->turn << ", next_gen " << g->next_gen
              << ", arrived " << c.arrived.load() << ", reduced " << c.reduced.load() << ", done "
              << c.done.load() << (g->aborted() ? ", aborted" : "");
        }
        return o.str();
    }

  private:
    // Stops when everything finished, after `budget` calls (when nonzero), or when nothing
    // finished for stall_calls calls (a failure).
    bool drive(const std::string &label, uint64_t stall_calls, int64_t absent, uint64_t budget) {
        uint32_t ranks = 0;
        for (auto &p : ops_) ranks = std::max(ranks, p->rank + 1);
        // Of 8 calls, how many each rank sits out.
        static const unsigned kSkips[] = {0, 0, 0, 1, 2, 4, 7};
        std::vector<unsigned> skip(ranks);
        for (auto &s : skip) s = kSkips[rng_() % std::size(kSkips)];
        std::vector<Posted *> live;
        uint64_t since = 0, calls = 0;
        for (;;) {
            live.clear();
            for (auto &p : ops_)
                if (!p->finished && int64_t(p->rank) != absent) live.push_back(p.get());
            if (live.empty()) return true;
            std::shuffle(live.begin(), live.end(), rng_);
            for (Posted *p : live) {
                if (rng_() % 8 < skip[p->rank]) continue;
                if (budget && calls++ >= budget) return true;
                if (p->op->progress()) {
                    p->finished = true;
                    p->finished_at = ++finishes_;
                    since = 0;
                } else if (++since >= stall_calls) {
                    ADD_FAILURE() << label << ": no operation finished in " << stall_calls
                                  << " calls; stuck:" << report();
                    return false;
                }
            }
        }
    }

    std::mt19937_64 rng_;
    std::vector<std::unique_ptr<Posted>> ops_;
    uint64_t finishes_ = 0;
};

// ---- names and inputs ----------------------------------------------------------------------

const char *coll_name(fi_collective_op c) {
    switch (c) {
        case FI_BARRIER:
            return "barrier";
        case FI_BROADCAST:
            return "broadcast";
        case FI_ALLREDUCE:
            return "allreduce";
        case FI_REDUCE:
            return "reduce";
        case FI_ALLGATHER:
            return "allgather";
        case FI_GATHER:
            return "gather";
        case FI_SCATTER:
            return "scatter";
        case FI_ALLTOALL:
            return "alltoall";
        case FI_REDUCE_SCATTER:
            return "reduce_scatter";
        default:
            break;
    }
    return "?";
}

const fi_collective_op kAllColls[] = {FI_BARRIER, FI_BROADCAST, FI_ALLREDUCE,
                                      FI_REDUCE,  FI_ALLGATHER, FI_GATHER,
                                      FI_SCATTER, FI_ALLTOALL,  FI_REDUCE_SCATTER};

void random_fill(std::mt19937_64 &rng, uint8_t *p, size_t len) {
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const uint64_t v = rng();
        memcpy(p + i, &v, 8);
    }
    for (; i < len; ++i) p[i] = uint8_t(rng() >> 13);
}

// ---- one collective call on every rank -----------------------------------------------------

// One rank's buffers, and its operation once posted.
struct RankData : RankBuffers {
    const Posted *posted = nullptr;
};

struct Case {
    uint32_t n = 0;
    Args a;
    std::string label;
    std::vector<RankData> ranks;
};

// The expected outputs from the inputs as they are now (and the inputs recorded).
void expect_reference(Case &c) {
    expect_results(c.a, c.ranks);
}

// Buffers and inputs of every rank (outputs start as garbage), and the expected outputs.
Case make_case(uint32_t n, const Args &a, uint64_t seed) {
    Case c;
    c.n = n;
    c.a = a;
    c.label = label_of(coll_name(a.coll), n, a);
    std::mt19937_64 rng(seed);
    for (uint32_t r = 0; r < n; ++r) {
        RankData d;
        static_cast<RankBuffers &>(d) = buffers_for(a, n, r);
        random_fill(rng, d.recv.data(), d.recv.size());
        if (a.elem) {
            fill_reduction_input(a.datatype, a.op, n, rng, d.send.data(), d.send.size() / a.elem);
            if (a.coll == FI_BROADCAST && r == a.root)
                fill_reduction_input(a.datatype, a.op, n, rng, d.recv.data(),
                                     d.recv.size() / a.elem);
        }
        c.ranks.push_back(std::move(d));
    }
    expect_reference(c);
    return c;
}

// One ShmOp a rank, in rank order (the order between ranks does not matter; within a rank,
// operations must be posted in the same order everywhere).
void post_case(Driver &dr, Group &g, Case &c, size_t index) {
    for (uint32_t r = 0; r < c.n; ++r) {
        RankData &d = c.ranks[r];
        d.posted = &dr.post(g.at(r), index, c.a, d.io.send ? d.send.data() : nullptr,
                            d.io.recv ? d.recv.data() : nullptr);
    }
}

// Finished with status 0, outputs against the reference, inputs untouched, guards intact.
bool check_case(const Case &c) {
    bool ok = true;
    for (uint32_t r = 0; r < c.n; ++r) {
        const RankData &d = c.ranks[r];
        if (!d.posted || !d.posted->finished || d.posted->op->status() != 0) {
            ADD_FAILURE() << c.label << " rank " << r << ": finished "
                          << (d.posted && d.posted->finished) << ", status "
                          << (d.posted ? d.posted->op->status() : -1);
            ok = false;
        }
    }
    return check_buffers(c.label, c.a, c.ranks) && ok;
}

// Runs one call on every member of g and checks it. True when all is well.
bool run_case(Group &g, Case &c, uint64_t seed) {
    Driver dr(mix(seed));
    post_case(dr, g, c, 0);
    if (!dr.run(c.label)) return false;
    return check_case(c);
}

// Cases on groups kept per size (so operations follow each other on a group, starting at
// either half of the slots), a group made anew after a failed case; stops after 5 failures.
class Runner {
  public:
    bool run(uint32_t n, const Args &a, uint64_t seed) {
        Case c = make_case(n, a, seed);
        return run(c, seed);
    }
    bool run(Case &c, uint64_t seed) {
        if (failures_ >= kMaxFailures) return false;
        ++cases_;
        auto &g = groups_[c.n];
        if (!g) g = std::make_unique<Group>(c.n);
        if (run_case(*g, c, seed)) return true;
        g.reset();
        if (++failures_ == kMaxFailures) ADD_FAILURE() << "stopped after 5 failing cases";
        return false;
    }
    size_t cases() const { return cases_; }

  private:
    static constexpr int kMaxFailures = 5;
    std::map<uint32_t, std::unique_ptr<Group>> groups_;
    int failures_ = 0;
    size_t cases_ = 0;
};

const uint32_t kSizes[] = {1, 2, 3, 4, 5, 8};

// Every root up to 5 members (when `all`), the first and the last beyond.
std::vector<uint32_t> roots_for(fi_collective_op c, uint32_t n, bool all = true) {
    std::vector<uint32_t> roots;
    if (!rooted(c)) return {0};
    if (all && n <= 5) {
        for (uint32_t r = 0; r < n; ++r) roots.push_back(r);
        return roots;
    }
    roots.push_back(0);
    if (n > 1) roots.push_back(n - 1);
    return roots;
}

const int kDataTypes[] = {FI_UINT64, FI_INT32, FI_DOUBLE};

// ---- the tests -----------------------------------------------------------------------------

// The boundaries the tests aim at are the ones the code uses.
TEST(CollShm, PieceSizes) {
    for (uint32_t n = 1; n <= ShmGroup::kMaxMembers; ++n)
        for (fi_collective_op c : kAllColls) {
            EXPECT_EQ(ShmOp::piece_bytes(c, n), piece_of(c, n)) << coll_name(c) << " n=" << n;
            EXPECT_EQ(piece_of(c, n) % 64, 0u);
            EXPECT_LE(piece_of(c, n) * ((c == FI_ALLTOALL || c == FI_REDUCE_SCATTER) ? n : 1),
                      kChunk);
        }
}

// Every collective, every size, every root; counts 0, 1 and 7 of each data type.
TEST(CollShm, EveryCollectiveSmallCounts) {
    Runner run;
    for (uint32_t n : kSizes)
        for (fi_collective_op c : kAllColls)
            for (uint32_t root : roots_for(c, n))
                for (size_t count : {size_t(0), size_t(1), size_t(7)})
                    for (int dt : kDataTypes) {
                        if (c == FI_BARRIER && (count || dt != FI_UINT64)) continue;
                        if (count == 0 && dt != FI_UINT64) continue;
                        run.run(n, args_of(c, count, dt, FI_SUM, root),
                                seed_of({n, uint64_t(c), root, count, uint64_t(dt)}));
                    }
    RecordProperty("cases", int(run.cases()));
}

// Counts at the boundaries of a generation's piece: exactly one piece, one piece and one
// element, and several pieces with a short last one; the data types in turn.
TEST(CollShm, ChunkAndPieceBoundaries) {
    Runner run;
    for (uint32_t n : {1u, 2u, 3u, 5u, 8u})
        for (fi_collective_op c : kAllColls) {
            if (c == FI_BARRIER) continue;
            for (int kind = 0; kind < 3; ++kind) {
                const int dt = kDataTypes[(n + uint32_t(c) + kind) % 3];
                const size_t elem = element_size(dt), pe = piece_of(c, n) / elem;
                const size_t count = kind == 0 ? pe : kind == 1 ? pe + 1 : 2 * pe + 5;
                for (uint32_t root : roots_for(c, n, false))
                    run.run(n, args_of(c, count, dt, FI_SUM, root),
                            seed_of({n, uint64_t(c), root, count, uint64_t(dt), 1}));
            }
        }
    // 600 KiB allreduces and reduces (three chunks, the last one short), every data type.
    for (uint32_t n : {1u, 2u, 3u, 5u, 8u})
        for (int dt : kDataTypes)
            for (fi_collective_op c : {FI_ALLREDUCE, FI_REDUCE, FI_BROADCAST})
                for (uint32_t root : roots_for(c, n, false))
                    run.run(n, args_of(c, (600u << 10) / element_size(dt), dt, FI_SUM, root),
                            seed_of({n, uint64_t(c), root, uint64_t(dt), 2}));
    RecordProperty("cases", int(run.cases()));
}

// Allreduce and reduce just below, at and above the size up to which every member reduces
// the whole vector itself, and a vector shorter than one element per member beyond it.
TEST(CollShm, WholeVectorThreshold) {
    Runner run;
    for (uint32_t n : kSizes)
        for (int dt : kDataTypes)
            for (fi_collective_op c : {FI_ALLREDUCE, FI_REDUCE}) {
                const size_t at = kWhole / element_size(dt);
                for (size_t count : {at - 1, at, at + 1, at + n, 2 * at + 3})
                    for (uint32_t root : roots_for(c, n, false))
                        run.run(n, args_of(c, count, dt, FI_SUM, root),
                                seed_of({n, uint64_t(c), root, count, uint64_t(dt), 3}));
            }
    RecordProperty("cases", int(run.cases()));
}

// The reductions on integer types: SUM and PROD wrap, MIN, MAX, BXOR; short vectors, ones
// reduced in parts, and several chunks.
TEST(CollShm, Reductions) {
    Runner run;
    for (uint32_t n : {2u, 3u, 5u})
        for (int op : {FI_SUM, FI_MIN, FI_MAX, FI_BXOR, FI_PROD})
            for (int dt : {FI_INT32, FI_UINT64, FI_UINT8})
                for (fi_collective_op c : {FI_ALLREDUCE, FI_REDUCE, FI_REDUCE_SCATTER}) {
                    const size_t elem = element_size(dt);
                    for (size_t count : {size_t(7), 6000 / elem, kChunk / elem + 5}) {
                        const uint32_t root = c == FI_REDUCE ? n / 2 : 0;
                        run.run(n, args_of(c, count, dt, op, root),
                                seed_of({n, uint64_t(op), uint64_t(dt), uint64_t(c), count, 4}));
                    }
                }
    RecordProperty("cases", int(run.cases()));
}

// MIN and MAX of doubles with NaNs (of different signs and payloads) and signed zeros are not
// commutative: every member must end with the same bits, those of the reduction in rank order.
TEST(CollShm, MinMaxWithNaNSameBitsEverywhere) {
    Runner run;
    for (uint32_t n : {3u, 5u})
        for (int op : {FI_MIN, FI_MAX})
            for (size_t count : {size_t(100), size_t(1000), size_t(70000)}) {
                const uint64_t seed = seed_of({n, uint64_t(op), count, 5});
                Case c = make_case(n, args_of(FI_ALLREDUCE, count, FI_DOUBLE, op), seed);
                std::mt19937_64 rng(mix(seed));
                for (RankData &d : c.ranks)
                    for (size_t i = 0; i < count; ++i) {
                        const uint64_t x = rng();
                        double v = double(int64_t(x % 7) - 3);
                        if (x % 5 == 0) {
                            uint64_t bits = 0x7ff8000000000000ull | ((x >> 8) & 0xfffff);
                            if (x & (1u << 30)) bits |= uint64_t(1) << 63;
                            memcpy(&v, &bits, 8);
                        } else if (v == 0 && (x & (1u << 31))) {
                            v = -0.0;
                        }
                        memcpy(d.send.data() + i * 8, &v, 8);
                    }
                expect_reference(c);
                if (!run.run(c, seed)) continue;
                for (uint32_t r = 1; r < n; ++r)
                    EXPECT_EQ(memcmp(c.ranks[r].recv.data(), c.ranks[0].recv.data(), count * 8), 0)
                        << c.label << ": rank " << r << " differs from rank 0";
            }
    RecordProperty("cases", int(run.cases()));
}

// Six mixed operations posted back to back on every rank before any runs: all right, and on
// each rank they complete in the order posted.
TEST(CollShm, BackToBackOperations) {
    for (uint32_t n : {2u, 3u, 5u, 8u})
        for (uint64_t s = 0; s < 4; ++s) {
            const uint64_t seed = seed_of({n, s, 6});
            std::mt19937_64 rng(seed);
            auto root = [&] { return uint32_t(rng() % n); };
            const size_t pe = piece_of(FI_ALLTOALL, n) / 8;
            std::vector<Args> pool = {
                args_of(FI_ALLREDUCE, (600u << 10) / 4, FI_INT32, FI_SUM),
                args_of(FI_BARRIER, 0, FI_UINT64),
                args_of(FI_BROADCAST, kChunk / 8 + 1, FI_UINT64, FI_NOOP, root()),
                args_of(FI_ALLTOALL, 2 * pe + 1, FI_UINT64),
                args_of(FI_GATHER, 7, FI_DOUBLE, FI_NOOP, root()),
                args_of(FI_REDUCE_SCATTER, pe + 3, FI_UINT64, FI_BXOR),
                args_of(FI_SCATTER, kChunk / 4 + 9, FI_INT32, FI_NOOP, root()),
                args_of(FI_ALLGATHER, 1000, FI_UINT64),
                args_of(FI_REDUCE, 300, FI_INT32, FI_MIN, root()),
                args_of(FI_ALLREDUCE, 5, FI_UINT64, FI_PROD),
                args_of(FI_ALLREDUCE, 3000, FI_DOUBLE, FI_MAX),
            };
            std::shuffle(pool.begin(), pool.end(), rng);
            pool.resize(6);
            Group g(n);
            Driver dr(mix(seed));
            std::vector<Case> cases;
            for (size_t i = 0; i < pool.size(); ++i)
                cases.push_back(make_case(n, pool[i], seed_of({seed, i})));
            std::string label = "n=" + std::to_string(n) + " seed " + std::to_string(s) + ":";
            for (size_t i = 0; i < cases.size(); ++i) {
                label += " " + cases[i].label + ";";
                post_case(dr, g, cases[i], i);
            }
            if (!dr.run(label)) continue;
            for (auto &c : cases) EXPECT_TRUE(check_case(c)) << label;
            for (uint32_t r = 0; r < n; ++r)
                for (size_t i = 1; i < cases.size(); ++i)
                    EXPECT_LT(cases[i - 1].ranks[r].posted->finished_at,
                              cases[i].ranks[r].posted->finished_at)
                        << label << " rank " << r << ": operation " << i
                        << " completed before operation " << i - 1;
        }
}

// A member that does not call progress holds the others: a barrier (and the other
// collectives that need its part) finishes nowhere until it joins, then everywhere.
TEST(CollShm, WaitsForTheMissingMember) {
    for (uint32_t n : {3u, 4u}) {
        Group g(n);
        uint64_t k = 0;
        for (uint32_t absent = 0; absent < n; ++absent)
            for (fi_collective_op c :
                 {FI_BARRIER, FI_BARRIER, FI_ALLREDUCE, FI_BROADCAST, FI_SCATTER, FI_ALLGATHER,
                  FI_ALLTOALL, FI_REDUCE_SCATTER, FI_ALLREDUCE}) {
                const uint64_t seed = seed_of({n, absent, ++k, 7});
                const size_t count = k % 3 == 0 ? kChunk / 8 + 3 : 7;
                Case cs = make_case(n, args_of(c, count, FI_UINT64, FI_SUM, absent), seed);
                Driver dr(mix(seed));
                post_case(dr, g, cs, 0);
                const size_t early = dr.run_without(absent, 200000);
                EXPECT_EQ(early, 0u)
                    << cs.label << ": " << early << " members finished without rank " << absent
                    << ":" << dr.report();
                if (!dr.run(cs.label)) return;
                EXPECT_TRUE(check_case(cs));
            }
    }
}

// progress() on an operation that has already finished must leave the order of the group
// alone (the engine calls a hierarchical operation's node_out again while probes of its
// message part are in flight). It used to set turn back to the end of the finished operation,
// so an operation posted after a later one that had finished meanwhile never started.
TEST(CollShm, ProgressAfterFinishedKeepsTheOrder) {
    Group g(2);
    const Args barrier = args_of(FI_BARRIER, 0, FI_UINT64);
    std::vector<std::unique_ptr<ShmOp>> first, second, third;
    for (uint32_t r = 0; r < 2; ++r) {
        first.push_back(std::make_unique<ShmOp>(g.at(r), barrier, nullptr, nullptr));
        second.push_back(std::make_unique<ShmOp>(g.at(r), barrier, nullptr, nullptr));
        third.push_back(std::make_unique<ShmOp>(g.at(r), barrier, nullptr, nullptr));
    }
    auto finish = [](std::vector<std::unique_ptr<ShmOp>> &ops) {
        std::vector<bool> done(ops.size());
        for (int i = 0; i < 1'000'000; ++i) {
            bool all = true;
            for (size_t r = 0; r < ops.size(); ++r)
                if (!done[r]) all = false, done[r] = ops[r]->progress();
            if (all) return true;
        }
        return false;
    };
    ASSERT_TRUE(finish(first));
    ASSERT_TRUE(finish(second));
    EXPECT_TRUE(first[0]->progress());  // once more, finished long ago
    EXPECT_TRUE(finish(third)) << "the third barrier never starts at rank 0: turn " << g.at(0).turn
                               << ", next_gen " << g.at(0).next_gen;
}

// The driver itself: a run that cannot finish is reported with who is stuck, not a hang.
TEST(CollShm, StallIsReported) {
    Group g(3);
    Case c = make_case(3, args_of(FI_ALLREDUCE, 7, FI_INT32), 10);
    Driver dr(10);
    for (uint32_t r = 0; r < 2; ++r) {  // rank 2 never posts
        RankData &d = c.ranks[r];
        d.posted = &dr.post(g.at(r), 0, c.a, d.send.data(), d.recv.data());
    }
    EXPECT_NONFATAL_FAILURE(dr.run("two of three", 100000), "rank 1 operation 0");
}

// A member whose process dies (here: exits or is killed right after opening the group,
// without taking part) fails the group: the operation waiting for it ends with
// FI_ECONNRESET at every live member, the group is marked aborted, and later operations
// fail the same way.
void dead_member(uint32_t n, bool killed) {
    const std::string name = fresh_name();
    const uint32_t dead = n - 1;
    std::vector<std::unique_ptr<ShmGroup>> live;
    live.push_back(ShmGroup::create(name, n));
    for (uint32_t r = 1; r < dead; ++r) {
        live.push_back(ShmGroup::open(name, n, r));
        ASSERT_TRUE(live.back()) << "rank " << r;
    }
    const pid_t child = ::fork();
    ASSERT_GE(child, 0) << strerror(errno);
    if (child == 0) {
        int code = 0;
        try {
            auto g = ShmGroup::open(name, n, dead);
            if (!g) code = 2;
            if (g && killed) ::raise(SIGKILL);
        } catch (...) {
            code = 3;
        }
        ::_exit(code);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    if (killed)
        ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
    else
        ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    EXPECT_TRUE(live[0]->all_attached());
    EXPECT_EQ(live[0]->ctl(dead).pid.load(), child);
    EXPECT_FALSE(live[0]->aborted());

    const Args a = args_of(FI_ALLREDUCE, 1000, FI_INT32, FI_SUM);
    std::vector<std::vector<int32_t>> send(dead, std::vector<int32_t>(1000, 1)),
        recv(dead, std::vector<int32_t>(1000));
    Driver dr(seed_of({n, killed, 8}));
    for (uint32_t r = 0; r < dead; ++r) dr.post(*live[r], 0, a, send[r].data(), recv[r].data());
    ASSERT_TRUE(dr.run("allreduce with a dead member", 1'000'000));
    for (auto &p : dr.ops())
        EXPECT_EQ(p->op->status(), FI_ECONNRESET) << "rank " << p->rank << ":" << dr.report();
    for (auto &g : live) EXPECT_TRUE(g->aborted()) << "rank " << g->rank();

    // The group stays failed: a barrier and another allreduce after it fail too.
    Driver again(seed_of({n, killed, 9}));
    for (uint32_t r = 0; r < dead; ++r) {
        again.post(*live[r], 0, args_of(FI_BARRIER, 0, FI_UINT64), nullptr, nullptr);
        again.post(*live[r], 1, a, send[r].data(), recv[r].data());
    }
    ASSERT_TRUE(again.run("operations after the failure", 1'000'000));
    for (auto &p : again.ops())
        EXPECT_EQ(p->op->status(), FI_ECONNRESET)
            << "rank " << p->rank << " operation " << p->index;
}

TEST(CollShm, DeadMemberThatExited) {
    dead_member(2, false);
}

TEST(CollShm, DeadMemberThatWasKilled) {
    dead_member(2, true);
}

TEST(CollShm, DeadMemberOfThree) {
    dead_member(3, false);
}

}  // namespace
