// The collective algorithms of off_tandem (offload_prov/coll/: one rank's schedule each, pure
// functions) run by their executor (Operation) over an in-process fake transport of n ranks.
//
// The fake matches sends and receives exactly by (source, destination, tag); a message that
// arrives before its receive is kept as unexpected, a copy of its payload, as a real tagged
// matcher does. Messages arrive and transfers end in a seeded random order (a random part of
// the shuffled pending events each pass), ranks are progressed in a random order and now and
// then skipped, and send/recv now and then answer -FI_EAGAIN, so that the rounds of different
// ranks interleave and the retries are exercised. It also checks what the executor may not do:
// a receive of the wrong length, a send buffer or a receive buffer changed while in flight,
// overlapping buffers in flight, a tag used twice, rounds out of order, a completion after the
// end. A run that cannot go on any more (a deadlock) fails with the state of the ranks stuck.
//
// Every result is compared with the straightforward reference of tests/common/coll_reference.h,
// never with the code under test (tests/common/coll_unit.h: the ranks' buffers and their check).
#include "offload_prov/coll/operation.h"
#include "offload_prov/coll/schedule.h"
#include "tests/common/coll_reference.h"
#include "tests/common/coll_unit.h"

#include <rdma/fi_errno.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using tandem::off::coll::Args;
using tandem::off::coll::Buf;
using tandem::off::coll::kMaxMembers;
using tandem::off::coll::kMaxRounds;
using tandem::off::coll::Operation;
using tandem::off::coll::Round;
using tandem::off::coll::Schedule;
using tandem::off::coll::Shape;
using tandem::off::coll::Span;
using tandem::off::coll::Step;
using tandem::off::coll::Thresholds;
using tandem::off::coll::Transfer;
using tandem::off::coll::Transport;
namespace coll = tandem::off::coll;
using namespace tandem_test::coll_ref;
using namespace tandem_test::coll_unit;

constexpr uint64_t kRoundBits = 12;
constexpr uint64_t kRoundMask = (uint64_t(1) << kRoundBits) - 1;

// ---- seeds ---------------------------------------------------------------------------------

uint32_t seed_of(std::initializer_list<uint64_t> parts) {
    const uint64_t h = hash_of(0x7a6e6465ull, parts);
    return uint32_t(h ^ (h >> 32));
}

// ---- the fake transport ---------------------------------------------------------------------

struct Key {
    uint32_t src = 0, dst = 0;
    uint64_t tag = 0;
    auto operator<=>(const Key &) const = default;
};

std::string describe(const Key &k) {
    std::ostringstream o;
    o << k.src << "->" << k.dst << " op " << (k.tag >> kRoundBits) << " round "
      << (k.tag & kRoundMask);
    return o.str();
}

// One operation of one rank, as the fake sees it.
struct OpState {
    uint32_t rank = 0, index = 0;
    std::unique_ptr<Operation> op;
    size_t in_flight = 0;   // transfers accepted and not ended
    size_t sends = 0;       // sends accepted
    long first_call = -1;   // sequence number of its first progress call
    long finish_call = -1;  // of the call that first reported it finished
    bool any_transfer = false;
    uint64_t last_round = 0;  // of the last transfer started
    struct Active {
        bool send;
        uint32_t peer;
        uint64_t tag;
        const uint8_t *buf;
        size_t len;
    };
    std::map<uint64_t, Active> active;  // by transfer id
    std::vector<Key> transfers;         // every transfer started, in order
    std::set<Key> used;
};

// A send of this operation fails: the nth accepted one ends with FI_EIO (the message is lost),
// or (sync) send() refuses it with -FI_EIO.
struct Fault {
    int rank = -1;
    uint32_t op_index = 0;
    size_t nth = 0;
    bool sync = false;
};

class World;

class Port final : public Transport {
  public:
    Port(World &w, uint32_t rank) : world_(w), rank_(rank) {}
    int send(uint32_t peer, uint64_t tag, const void *buf, size_t len, Operation *op) override;
    int recv(uint32_t peer, uint64_t tag, void *buf, size_t len, Operation *op) override;

  private:
    World &world_;
    uint32_t rank_;
};

class World {
  public:
    World(uint32_t n, uint32_t seed)
        : n_(n), rng_(seed), start_(n, 0), enabled_(n, true), held_(n, false) {
        const unsigned eagain[] = {0, 125, 400};  // per mille of send/recv calls refused
        eagain_ = eagain[seed % 3];
        for (uint32_t r = 0; r < n; ++r) ports_.push_back(std::make_unique<Port>(*this, r));
    }

    OpState &add(uint32_t rank, uint32_t index, Schedule s, const void *send, void *recv,
                 int datatype, int op) {
        auto st = std::make_unique<OpState>();
        st->rank = rank;
        st->index = index;
        st->op = std::make_unique<Operation>(std::move(s), send, recv, datatype, op,
                                             uint64_t(index) << kRoundBits);
        by_op_[st->op.get()] = st.get();
        ops_.push_back(std::move(st));
        return *ops_.back();
    }
    OpState &state(uint32_t rank, uint32_t index) {
        for (auto &s : ops_)
            if (s->rank == rank && s->index == index) return *s;
        ADD_FAILURE() << "no operation " << index << " at rank " << rank;
        return *ops_.front();
    }
    const std::vector<std::unique_ptr<OpState>> &ops() const { return ops_; }
    Transport &port(uint32_t rank) { return *ports_[rank]; }

    void set_fault(const Fault &f) { fault_ = f; }
    // The rank is not progressed before this pass (of this World's passes so far).
    void start_at(uint32_t rank, size_t pass) { start_[rank] = pass; }
    void enable(uint32_t rank, bool on) { enabled_[rank] = on; }
    // Messages from the rank stay in transit while held.
    void hold(uint32_t rank, bool on) { held_[rank] = on; }
    size_t pass() const { return pass_; }
    size_t refused() const { return refused_; }  // send/recv calls answered -FI_EAGAIN
    size_t early() const { return early_; }      // messages that arrived before their receive

    // Runs passes until every operation has finished (true) or nothing more happens for many
    // passes (false: a deadlock, or ranks disabled / messages held).
    bool run() {
        size_t idle = 0;
        const size_t last_start = *std::max_element(start_.begin(), start_.end());
        for (size_t guard = 0; guard < 2000000; ++guard) {
            if (all_finished()) return true;
            bool activity = progress_all();
            if (deliver_some()) activity = true;
            ++pass_;
            if (activity || pass_ <= last_start)
                idle = 0;
            else if (++idle > kIdlePasses)
                return false;
        }
        ADD_FAILURE() << "runaway: still busy after 2000000 passes";
        return false;
    }

    bool all_finished() const {
        for (auto &s : ops_)
            if (!s->op->finished()) return false;
        return true;
    }

    // Ends the receives still waiting for a message (not matched yet) of the operations for
    // which pred holds with FI_ECANCELED, as the engine cancels a failed operation's receives.
    void cancel_receives(const std::function<bool(const OpState &)> &pred) {
        for (auto it = posted_.begin(); it != posted_.end();) {
            auto &q = it->second;
            for (auto p = q.begin(); p != q.end();) {
                if (pred(*p->op)) {
                    complete(p->op, p->id, FI_ECANCELED);
                    p = q.erase(p);
                } else {
                    ++p;
                }
            }
            it = q.empty() ? posted_.erase(it) : std::next(it);
        }
    }
    // What the engine does on an Abort notice: every unfinished operation fails, its
    // receives are cancelled.
    void abort_unfinished(int err) {
        for (auto &s : ops_)
            if (!s->op->finished()) s->op->fail(err);
        cancel_receives([](const OpState &s) { return !s.op->finished(); });
    }

    // After a successful run: nothing left behind.
    void expect_clean(const std::string &label) const {
        EXPECT_TRUE(pending_.empty()) << label << ": " << pending_.size() << " events left";
        for (auto &[k, q] : posted_)
            if (!q.empty()) ADD_FAILURE() << label << ": receive " << describe(k) << " left";
        for (auto &[k, q] : unexpected_)
            if (!q.empty())
                ADD_FAILURE() << label << ": message " << describe(k) << " never received";
    }

    // Who is stuck where: for a deadlock report.
    std::string report() const {
        std::ostringstream o;
        for (auto &s : ops_) {
            if (s->op->finished()) continue;
            o << "\n  rank " << s->rank << " op " << s->index << ": status " << s->op->status()
              << ", " << s->op->in_flight() << " transfers in flight, ";
            if (s->any_transfer)
                o << "last round started " << s->last_round;
            else
                o << "no transfer started";
            o << (enabled_[s->rank] ? "" : " (rank disabled)");
            for (auto &[id, a] : s->active)
                o << "; " << (a.send ? "send to " : "recv from ") << a.peer << " round "
                  << (a.tag & kRoundMask) << " (" << a.len << " bytes)";
        }
        for (auto &[k, q] : unexpected_)
            if (!q.empty()) o << "\n  unexpected message " << describe(k) << " not received";
        size_t held = 0;
        for (auto &e : pending_) held += e.arrival;
        if (held) o << "\n  " << held << " messages held in transit";
        return o.str();
    }

    int do_send(uint32_t rank, uint32_t peer, uint64_t tag, const void *buf, size_t len,
                Operation *op);
    int do_recv(uint32_t rank, uint32_t peer, uint64_t tag, void *buf, size_t len, Operation *op);

  private:
    static constexpr size_t kIdlePasses = 200;

    struct Event {
        bool arrival = false;
        Key key;
        OpState *op = nullptr;  // the sender of an arrival, the owner of a completion
        uint64_t id = 0;
        const uint8_t *buf = nullptr;  // arrival: the sender's buffer and what it held
        std::vector<uint8_t> payload;
        int err = 0;  // completion
    };
    struct Posted {
        OpState *op;
        uint64_t id;
        uint8_t *buf;
        size_t len;
        std::vector<uint8_t> before;  // the buffer when posted: nobody may touch it meanwhile
    };

    OpState *state_of(Operation *op) {
        auto it = by_op_.find(op);
        if (it == by_op_.end()) {
            ADD_FAILURE() << "transfer for an operation the fake does not know";
            return nullptr;
        }
        return it->second;
    }

    bool roll(unsigned per_mille) { return per_mille && rng_() % 1000 < per_mille; }

    // Checks a new transfer against the operation's others; records it.
    uint64_t accept(OpState &s, bool send, uint32_t peer, uint64_t tag, const uint8_t *buf,
                    size_t len) {
        const Key key = send ? Key{s.rank, peer, tag} : Key{peer, s.rank, tag};
        EXPECT_LT(peer, n_) << "rank " << s.rank << " op " << s.index << ": peer out of range";
        EXPECT_EQ(tag >> kRoundBits, s.index)
            << "rank " << s.rank << ": tag " << tag << " lost the operation's tag base";
        EXPECT_LT(tag & kRoundMask, kMaxRounds)
            << "rank " << s.rank << " op " << s.index << ": round on the notice channel";
        if (s.any_transfer) {
            EXPECT_GE(tag & kRoundMask, s.last_round)
                << "rank " << s.rank << " op " << s.index << ": a round started after a later";
        }
        EXPECT_TRUE(s.used.insert(key).second)
            << "rank " << s.rank << " op " << s.index << ": two transfers " << describe(key);
        for (auto &[id, a] : s.active) {
            if (!len || !a.len || (send && a.send)) continue;
            if (buf < a.buf + a.len && a.buf < buf + len)
                ADD_FAILURE() << "rank " << s.rank << " op " << s.index << ": "
                              << (send ? "send" : "recv") << " " << describe(key) << " overlaps a "
                              << (a.send ? "send" : "recv") << " in flight";
        }
        s.any_transfer = true;
        s.last_round = tag & kRoundMask;
        s.transfers.push_back(key);
        const uint64_t id = next_id_++;
        s.active[id] = OpState::Active{send, peer, tag, buf, len};
        ++s.in_flight;
        activity_ = true;
        return id;
    }

    void complete(OpState *s, uint64_t id, int err) {
        Event e;
        e.op = s;
        e.id = id;
        e.err = err;
        pending_.push_back(std::move(e));
    }

    // A message meets its receive.
    void deliver(const Key &k, const std::vector<uint8_t> &payload, Posted &p) {
        if (payload.size() > p.len)
            ADD_FAILURE() << "message " << describe(k) << " of " << payload.size()
                          << " bytes for a receive of " << p.len;
        else if (payload.size() < p.len)
            ADD_FAILURE() << "message " << describe(k) << " of " << payload.size()
                          << " bytes for a receive of " << p.len << " (schedules disagree)";
        if (p.len && memcmp(p.buf, p.before.data(), p.len) != 0)
            ADD_FAILURE() << "receive " << describe(k) << ": buffer changed while in flight";
        const size_t len = std::min(payload.size(), p.len);
        if (len) memcpy(p.buf, payload.data(), len);
        complete(p.op, p.id, payload.size() > p.len ? FI_ETRUNC : 0);
    }

    bool progress_all() {
        bool activity = false;
        std::vector<OpState *> order;
        for (auto &s : ops_) order.push_back(s.get());
        std::shuffle(order.begin(), order.end(), rng_);
        for (OpState *s : order) {
            if (!enabled_[s->rank] || pass_ < start_[s->rank] || s->op->finished()) continue;
            if (s->first_call >= 0 && roll(200)) continue;  // a slow rank this pass
            const long seq = ++calls_;
            if (s->first_call < 0) s->first_call = seq;
            activity_ = false;
            const bool done = s->op->progress(*ports_[s->rank]);
            if (activity_) activity = true;
            EXPECT_EQ(done, s->op->finished()) << "rank " << s->rank << " op " << s->index;
            EXPECT_EQ(s->op->in_flight(), s->in_flight)
                << "rank " << s->rank << " op " << s->index << ": transfers in flight";
            if (done) {
                activity = true;
                s->finish_call = seq;
                EXPECT_EQ(s->in_flight, 0u) << "rank " << s->rank << " op " << s->index
                                            << " finished with transfers in flight";
            }
        }
        return activity;
    }

    bool deliver_some() {
        if (pending_.empty()) return false;
        std::shuffle(pending_.begin(), pending_.end(), rng_);
        const size_t take = 1 + rng_() % pending_.size();
        std::vector<Event> batch;
        std::vector<Event> keep;
        for (size_t i = 0; i < pending_.size(); ++i) {
            Event &e = pending_[i];
            if (i >= take || (e.arrival && held_[e.key.src]))
                keep.push_back(std::move(e));
            else
                batch.push_back(std::move(e));
        }
        pending_ = std::move(keep);
        for (Event &e : batch) {
            if (e.arrival)
                arrive(e);
            else
                end_transfer(e);
        }
        return !batch.empty();
    }

    void arrive(Event &e) {
        if (!e.payload.empty() && memcmp(e.buf, e.payload.data(), e.payload.size()) != 0)
            ADD_FAILURE() << "send " << describe(e.key) << ": buffer changed while in flight";
        auto it = posted_.find(e.key);
        if (it != posted_.end() && !it->second.empty()) {
            Posted p = std::move(it->second.front());
            it->second.pop_front();
            if (it->second.empty()) posted_.erase(it);
            deliver(e.key, e.payload, p);
        } else {
            unexpected_[e.key].push_back(std::move(e.payload));
            ++early_;
        }
        complete(e.op, e.id, 0);
    }

    void end_transfer(Event &e) {
        OpState &s = *e.op;
        if (s.op->finished())
            ADD_FAILURE() << "rank " << s.rank << " op " << s.index
                          << ": a transfer ended after the operation finished";
        EXPECT_EQ(s.active.erase(e.id), 1u);
        --s.in_flight;
        s.op->transfer_done(e.err);
        EXPECT_EQ(s.op->in_flight(), s.in_flight) << "rank " << s.rank << " op " << s.index;
    }

    uint32_t n_;
    std::mt19937 rng_;
    std::vector<std::unique_ptr<Port>> ports_;
    std::vector<std::unique_ptr<OpState>> ops_;
    std::map<Operation *, OpState *> by_op_;
    std::vector<size_t> start_;
    std::vector<bool> enabled_, held_;
    std::map<Key, std::deque<Posted>> posted_;
    std::map<Key, std::deque<std::vector<uint8_t>>> unexpected_;
    std::vector<Event> pending_;
    unsigned eagain_ = 125;
    Fault fault_;
    size_t pass_ = 0;
    long calls_ = 0;
    uint64_t next_id_ = 1;
    size_t refused_ = 0, early_ = 0;
    bool activity_ = false;
};

int World::do_send(uint32_t rank, uint32_t peer, uint64_t tag, const void *buf, size_t len,
                   Operation *op) {
    OpState *s = state_of(op);
    if (!s) return -FI_EINVAL;
    EXPECT_EQ(s->rank, rank) << "an operation used another rank's transport";
    if (roll(eagain_)) return ++refused_, -FI_EAGAIN;
    const bool faulty =
        fault_.rank == int(rank) && fault_.op_index == s->index && fault_.nth == s->sends;
    if (faulty && fault_.sync) {
        ++s->sends;
        return -FI_EIO;
    }
    const auto *p = static_cast<const uint8_t *>(buf);
    const uint64_t id = accept(*s, true, peer, tag, p, len);
    ++s->sends;
    if (faulty) {  // lost: ends with the error, never arrives
        complete(s, id, FI_EIO);
        return 0;
    }
    Event e;
    e.arrival = true;
    e.key = Key{rank, peer, tag};
    e.op = s;
    e.id = id;
    e.buf = p;
    if (len) e.payload.assign(p, p + len);
    pending_.push_back(std::move(e));
    return 0;
}

int World::do_recv(uint32_t rank, uint32_t peer, uint64_t tag, void *buf, size_t len,
                   Operation *op) {
    OpState *s = state_of(op);
    if (!s) return -FI_EINVAL;
    EXPECT_EQ(s->rank, rank) << "an operation used another rank's transport";
    if (roll(eagain_)) return ++refused_, -FI_EAGAIN;
    auto *p = static_cast<uint8_t *>(buf);
    const uint64_t id = accept(*s, false, peer, tag, p, len);
    Posted posted{s, id, p, len, {}};
    if (len) posted.before.assign(p, p + len);
    const Key key{peer, rank, tag};
    auto it = unexpected_.find(key);
    if (it != unexpected_.end() && !it->second.empty()) {
        std::vector<uint8_t> payload = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) unexpected_.erase(it);
        deliver(key, payload, posted);
    } else {
        posted_[key].push_back(std::move(posted));
    }
    return 0;
}

int Port::send(uint32_t peer, uint64_t tag, const void *buf, size_t len, Operation *op) {
    return world_.do_send(rank_, peer, tag, buf, len, op);
}
int Port::recv(uint32_t peer, uint64_t tag, void *buf, size_t len, Operation *op) {
    return world_.do_recv(rank_, peer, tag, buf, len, op);
}

// ---- the inputs ----------------------------------------------------------------------------

void random_fill(std::mt19937_64 &rng, uint8_t *p, size_t len) {
    for (size_t i = 0; i < len; ++i) p[i] = uint8_t(rng() >> 13);
}

// ---- one collective call on every rank -----------------------------------------------------

struct Algo {
    const char *name;
    fi_collective_op coll;
    std::function<Schedule(Shape, const Args &)> build;
};

const std::vector<Algo> &algos() {
    static const std::vector<Algo> all = {
        {"barrier_dissemination", FI_BARRIER,
         [](Shape s, const Args &) { return coll::barrier_dissemination(s); }},
        {"allreduce_recursive_doubling", FI_ALLREDUCE, coll::allreduce_recursive_doubling},
        {"allreduce_ring", FI_ALLREDUCE, coll::allreduce_ring},
        {"reduce_scatter_ring", FI_REDUCE_SCATTER, coll::reduce_scatter_ring},
        {"allgather_ring", FI_ALLGATHER, coll::allgather_ring},
        {"allgather_bruck", FI_ALLGATHER, coll::allgather_bruck},
        {"broadcast_binomial", FI_BROADCAST, coll::broadcast_binomial},
        {"reduce_binomial", FI_REDUCE, coll::reduce_binomial},
        {"scatter_binomial", FI_SCATTER, coll::scatter_binomial},
        {"gather_binomial", FI_GATHER, coll::gather_binomial},
        {"alltoall_pairwise", FI_ALLTOALL, coll::alltoall_pairwise},
    };
    return all;
}

const Algo &algo(const std::string &name) {
    for (const Algo &a : algos())
        if (name == a.name) return a;
    ADD_FAILURE() << "no algorithm " << name;
    return algos().front();
}

struct Instance {
    const Algo *algo = nullptr;
    uint32_t n = 0;
    Args args;
    std::string label;
    std::vector<RankBuffers> ranks;
};

// Buffers and inputs of every rank (recv buffers start with garbage), the inputs recorded.
Instance prepare(const Algo &al, uint32_t n, const Args &a, uint32_t seed) {
    Instance in;
    in.algo = &al;
    in.n = n;
    in.args = a;
    in.label = label_of(al.name, n, a);
    std::mt19937_64 rng(seed);
    for (uint32_t r = 0; r < n; ++r) {
        RankBuffers d = buffers_for(a, n, r);
        if (reduces(a.coll))
            fill_reduction_input(a.datatype, a.op, n, rng, d.send.data(), d.io.send_bytes / a.elem);
        else
            random_fill(rng, d.send.data(), d.io.send_bytes);
        random_fill(rng, d.recv.data(), d.io.recv_bytes);
        in.ranks.push_back(std::move(d));
    }
    record_inputs(a, in.ranks);
    return in;
}

// The expected outputs, from the inputs as they are now.
void expect_reference(Instance &in) {
    expect_results(in.args, in.ranks);
}

void add_to(World &w, Instance &in, uint32_t index) {
    for (uint32_t r = 0; r < in.n; ++r) {
        RankBuffers &d = in.ranks[r];
        w.add(r, index, in.algo->build(Shape{in.n, r}, in.args),
              d.io.send ? d.send.data() : nullptr, d.io.recv ? d.recv.data() : nullptr,
              in.args.datatype, in.args.op);
    }
}

// Outputs against the reference, inputs untouched, guards intact. True when all is well.
bool check(const Instance &in, const World &w, uint32_t index) {
    bool ok = true;
    for (auto &s : w.ops()) {
        if (s->index != index) continue;
        if (!s->op->finished() || s->op->status()) {
            ADD_FAILURE() << in.label << " rank " << s->rank << ": finished " << s->op->finished()
                          << ", status " << s->op->status();
            ok = false;
        }
    }
    return check_buffers(in.label, in.args, in.ranks) && ok;
}

int failures_now() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
}

// Runs one call on n ranks and checks it. True when all is well.
bool run_case(const Algo &al, uint32_t n, const Args &a, uint32_t seed) {
    const int failures_before = failures_now();
    Instance in = prepare(al, n, a, seed);
    expect_reference(in);
    World w(n, mix(seed));
    add_to(w, in, 0);
    if (!w.run()) {
        ADD_FAILURE() << in.label << ": deadlock after " << w.pass() << " passes:" << w.report();
        return false;
    }
    w.expect_clean(in.label);
    return check(in, w, 0) && failures_now() == failures_before;
}

const std::vector<uint32_t> kSizes = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17};

std::vector<size_t> counts_for(uint32_t n, size_t large = 1031) {
    std::vector<size_t> c = {0, 1, 2, 7, size_t(n) - 1, size_t(n) + 1, large};
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    return c;
}

// Every size, every count, every root: data of uint32, the reductions FI_SUM on FI_INT32. The
// large count takes fewer roots (first, second, middle, last) to keep the test fast.
void every_case(const std::string &name) {
    const Algo &al = algo(name);
    size_t failures = 0;
    for (uint32_t n : kSizes) {
        for (size_t count : counts_for(n)) {
            for (uint32_t root = 0; root < (rooted(al.coll) ? n : 1); ++root) {
                if (count > 64 && root != 0 && root != 1 && root != n / 2 && root != n - 1)
                    continue;
                const int dt = reduces(al.coll) ? FI_INT32 : FI_UINT32;
                const Args a = args_of(al.coll, count, dt, FI_SUM, root);
                if (!run_case(al, n, a, seed_of({std::hash<std::string>{}(name), n, count, root})))
                    if (++failures >= 5) {
                        ADD_FAILURE() << name << ": stopped after 5 failing cases";
                        return;
                    }
                if (al.coll == FI_BARRIER) break;
            }
            if (al.coll == FI_BARRIER) break;
        }
    }
}

// ---- schedules on their own ----------------------------------------------------------------

bool same_span(const Span &x, const Span &y) {
    return x.buf == y.buf && x.offset == y.offset && x.len == y.len;
}
bool same_steps(const std::vector<Step> &x, const std::vector<Step> &y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
        if (x[i].kind != y[i].kind || !same_span(x[i].dst, y[i].dst) ||
            !same_span(x[i].src, y[i].src))
            return false;
    return true;
}
bool same_transfers(const std::vector<Transfer> &x, const std::vector<Transfer> &y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
        if (x[i].peer != y[i].peer || !same_span(x[i].span, y[i].span)) return false;
    return true;
}
bool same_schedule(const Schedule &x, const Schedule &y) {
    if (x.scratch != y.scratch || !same_steps(x.before, y.before) ||
        x.rounds.size() != y.rounds.size())
        return false;
    for (size_t i = 0; i < x.rounds.size(); ++i)
        if (!same_transfers(x.rounds[i].recvs, y.rounds[i].recvs) ||
            !same_transfers(x.rounds[i].sends, y.rounds[i].sends) ||
            !same_steps(x.rounds[i].after, y.rounds[i].after))
            return false;
    return true;
}

// Checks every rank's schedule of one call: spans inside the buffers the call has, the sends
// of each round met by receives of the same length in the same round, no overlap between the
// buffers of one round's transfers. Returns the number of problems (reported).
size_t check_structure(const Algo &al, uint32_t n, const Args &a, std::string *details) {
    size_t problems = 0;
    std::ostringstream log, sink;
    auto problem = [&](uint32_t r) -> std::ostream & {
        if (++problems > 5) {
            sink.str("");
            return sink;
        }
        log << "\n  rank " << r << ": ";
        return log;
    };
    std::vector<Schedule> all;
    for (uint32_t r = 0; r < n; ++r) all.push_back(al.build(Shape{n, r}, a));
    // (round, src, dst) -> lengths of the transfers
    std::map<std::tuple<size_t, uint32_t, uint32_t>, std::multiset<size_t>> sent, received;
    for (uint32_t r = 0; r < n; ++r) {
        const Schedule &s = all[r];
        const Io io = io_of(a.coll, a.bytes(), n, r == a.root);
        auto inside = [&](const Span &sp, const char *what) {
            if (!sp.len) return;
            size_t size = 0;
            bool present = true;
            switch (sp.buf) {
                case Buf::Send:
                    size = io.send_bytes;
                    present = io.send;
                    break;
                case Buf::Recv:
                    size = io.recv_bytes;
                    present = io.recv;
                    break;
                case Buf::Scratch:
                    size = s.scratch;
                    break;
            }
            if (!present)
                problem(r) << what << " names a buffer this rank's call does not have\n";
            else if (sp.offset > size || sp.len > size - sp.offset)
                problem(r) << what << " [" << sp.offset << ", +" << sp.len
                           << ") outside a buffer of " << size << "\n";
        };
        auto steps = [&](const std::vector<Step> &v) {
            for (const Step &st : v) {
                inside(st.dst, "step destination");
                inside(st.src, "step source");
                if (st.dst.len != st.src.len) problem(r) << "step of unequal lengths\n";
                if (st.kind != Step::Kind::Copy && !reduces(a.coll))
                    problem(r) << "a reduction in a collective without one\n";
            }
        };
        if (s.rounds.size() >= kMaxRounds) problem(r) << s.rounds.size() << " rounds\n";
        steps(s.before);
        for (size_t k = 0; k < s.rounds.size(); ++k) {
            const Round &round = s.rounds[k];
            steps(round.after);
            std::vector<std::pair<const Transfer *, bool>> xs;
            for (const Transfer &t : round.recvs) xs.push_back({&t, false});
            for (const Transfer &t : round.sends) xs.push_back({&t, true});
            for (auto [t, is_send] : xs) {
                inside(t->span, is_send ? "send" : "recv");
                if (t->peer >= n || t->peer == r)
                    problem(r) << "transfer with peer " << t->peer << "\n";
                if (is_send)
                    sent[{k, r, t->peer}].insert(t->span.len);
                else
                    received[{k, t->peer, r}].insert(t->span.len);
            }
            for (size_t i = 0; i < xs.size(); ++i)
                for (size_t j = i + 1; j < xs.size(); ++j) {
                    const Span &x = xs[i].first->span, &y = xs[j].first->span;
                    if ((xs[i].second && xs[j].second) || !x.len || !y.len || x.buf != y.buf)
                        continue;
                    if (x.offset < y.offset + y.len && y.offset < x.offset + x.len)
                        problem(r) << "round " << k << ": overlapping transfer buffers\n";
                }
        }
    }
    for (auto &[k, lens] : sent)
        if (received[k] != lens)
            problem(std::get<1>(k)) << "round " << std::get<0>(k) << ": sends to " << std::get<2>(k)
                                    << " not met by receives alike\n";
    for (auto &[k, lens] : received)
        if (!sent.count(k))
            problem(std::get<2>(k)) << "round " << std::get<0>(k) << ": receive from "
                                    << std::get<1>(k) << " nobody sends\n";
    *details = log.str();
    return problems;
}

}  // namespace

// ---- the tests -----------------------------------------------------------------------------

TEST(CollScheduleStructure, EveryRankAgreesAndStaysInItsBuffers) {
    std::vector<uint32_t> sizes;
    for (uint32_t n = 1; n <= 33; ++n) sizes.push_back(n);
    for (uint32_t n : {63u, 64u, 65u, 100u}) sizes.push_back(n);
    size_t problems = 0;
    for (const Algo &al : algos())
        for (uint32_t n : sizes)
            for (size_t count : {size_t(0), size_t(1), size_t(3), size_t(n) + 1}) {
                std::set<uint32_t> roots = {0};
                if (rooted(al.coll)) roots = {0, 1 % n, n / 2, n - 1};
                for (uint32_t root : roots) {
                    const Args a = args_of(al.coll, count, FI_INT32, FI_SUM, root);
                    std::string details;
                    const size_t p = check_structure(al, n, a, &details);
                    EXPECT_EQ(p, 0u) << label_of(al.name, n, a) << details;
                    problems += p;
                    if (problems > 20) FAIL() << "stopped after 20 problems";
                }
            }
}

TEST(CollScheduleStructure, RoundsFitTheTagAtMaxMembers) {
    const uint32_t n = 2048;
    ASSERT_LE(n, kMaxMembers);
    const Args a = args_of(FI_ALLREDUCE, 4096, FI_INT32, FI_SUM, 0);
    const Schedule s = coll::allreduce_ring(Shape{n, 0}, a);
    EXPECT_LT(s.rounds.size(), kMaxRounds) << "allreduce_ring n=2048";
    EXPECT_EQ(s.rounds.size(), size_t(2 * (n - 1)));
    for (const Algo &al : algos())
        for (uint32_t r : {0u, 1u, 1000u, n - 1}) {
            const Args b = args_of(al.coll, 3, FI_INT32, FI_SUM, 7);
            EXPECT_LT(al.build(Shape{n, r}, b).rounds.size(), kMaxRounds)
                << al.name << " n=" << n << " rank=" << r;
        }
    const Args c = args_of(FI_ALLREDUCE, 3, FI_INT32, FI_SUM, 0);
    EXPECT_LT(coll::allreduce_ring(Shape{kMaxMembers, 0}, c).rounds.size(), kMaxRounds);
    EXPECT_LT(coll::alltoall_pairwise(Shape{kMaxMembers, 0}, c).rounds.size(), kMaxRounds);
}

TEST(CollSchedule, BarrierDissemination) {
    every_case("barrier_dissemination");
}
TEST(CollSchedule, AllreduceRecursiveDoubling) {
    every_case("allreduce_recursive_doubling");
}
TEST(CollSchedule, AllreduceRing) {
    every_case("allreduce_ring");
}
TEST(CollSchedule, ReduceScatterRing) {
    every_case("reduce_scatter_ring");
}
TEST(CollSchedule, AllgatherRing) {
    every_case("allgather_ring");
}
TEST(CollSchedule, AllgatherBruck) {
    every_case("allgather_bruck");
}
TEST(CollSchedule, BroadcastBinomial) {
    every_case("broadcast_binomial");
}
TEST(CollSchedule, ReduceBinomial) {
    every_case("reduce_binomial");
}
TEST(CollSchedule, ScatterBinomial) {
    every_case("scatter_binomial");
}
TEST(CollSchedule, GatherBinomial) {
    every_case("gather_binomial");
}
TEST(CollSchedule, AlltoallPairwise) {
    every_case("alltoall_pairwise");
}

// Data movement does not depend on the element: blocks of 1 and of 16 bytes.
TEST(CollSchedule, MovementWithOtherElementSizes) {
    size_t failures = 0;
    for (const Algo &al : algos()) {
        if (al.coll == FI_BARRIER || reduces(al.coll)) continue;
        for (uint32_t n : {1u, 3u, 5u, 8u, 9u})
            for (int dt : {FI_UINT8, FI_DOUBLE_COMPLEX})
                for (size_t count : {size_t(1), size_t(7), size_t(n) + 1})
                    for (uint32_t root : std::set<uint32_t>{0, n - 1}) {
                        const Args a = args_of(al.coll, count, dt, FI_NOOP, root);
                        if (!run_case(al, n, a, seed_of({77, size_t(dt), n, count, root})) &&
                            ++failures >= 5)
                            FAIL() << "stopped after 5 failing cases";
                    }
    }
}

// select picks by size and shape (ring from the thresholds on, recursive doubling / Bruck
// below), and whatever it picks gives the right data.
TEST(CollSchedule, SelectSmallAndLarge) {
    const Thresholds defaults;
    const Thresholds tiny{64, 64};
    auto expected_name = [](fi_collective_op c, uint32_t n, const Args &a, const Thresholds &t) {
        switch (c) {
            case FI_BARRIER:
                return "barrier_dissemination";
            case FI_BROADCAST:
                return "broadcast_binomial";
            case FI_ALLTOALL:
                return "alltoall_pairwise";
            case FI_ALLREDUCE:
                return a.bytes() >= t.allreduce_ring_min && a.count >= n
                           ? "allreduce_ring"
                           : "allreduce_recursive_doubling";
            case FI_ALLGATHER:
                return a.bytes() >= t.allgather_ring_min ? "allgather_ring" : "allgather_bruck";
            case FI_REDUCE_SCATTER:
                return "reduce_scatter_ring";
            case FI_REDUCE:
                return "reduce_binomial";
            case FI_SCATTER:
                return "scatter_binomial";
            case FI_GATHER:
                return "gather_binomial";
            default:
                return "?";
        }
    };
    const fi_collective_op colls[] = {FI_BARRIER,   FI_BROADCAST, FI_ALLTOALL,
                                      FI_ALLREDUCE, FI_ALLGATHER, FI_REDUCE_SCATTER,
                                      FI_REDUCE,    FI_SCATTER,   FI_GATHER};
    size_t failures = 0;
    for (const Thresholds *t : {&tiny, &defaults}) {
        const Algo sel{"select", FI_BARRIER,
                       [t](Shape s, const Args &a) { return coll::select(s, a, *t); }};
        for (fi_collective_op c : colls)
            for (uint32_t n : {1u, 2u, 3u, 5u, 8u, 12u, 17u}) {
                std::vector<size_t> counts = {1, 7, size_t(n) + 1, 40};
                if (t == &defaults) {
                    if (n > 8) continue;
                    if (c == FI_ALLREDUCE) counts = {16383, 16384, 16387};  // 64 KiB of int32
                    if (c == FI_ALLGATHER) counts = {8191, 8192};           // 32 KiB per rank
                    if (c != FI_ALLREDUCE && c != FI_ALLGATHER) counts = {3};
                }
                for (size_t count : counts) {
                    const uint32_t root = n / 2;
                    const int dt = reduces(c) ? FI_INT32 : FI_UINT32;
                    const Args a = args_of(c, count, dt, FI_SUM, root);
                    const Algo &want = algo(expected_name(c, n, a, *t));
                    const std::string name = std::string("select:") + want.name;
                    Algo named = sel;
                    named.coll = c;
                    named.name = name.c_str();
                    for (uint32_t r = 0; r < n; ++r)
                        EXPECT_TRUE(same_schedule(coll::select(Shape{n, r}, a, *t),
                                                  want.build(Shape{n, r}, a)))
                            << "select " << label_of(want.name, n, a) << " rank " << r
                            << " thresholds " << t->allreduce_ring_min << "/"
                            << t->allgather_ring_min << ": not the expected algorithm";
                    if (!run_case(named, n, a, seed_of({99, size_t(c), n, count})) &&
                        ++failures >= 5)
                        FAIL() << "stopped after 5 failing cases";
                }
            }
    }
}

// Every reducing algorithm with the ops and datatypes of the engine: SUM on int32 and on
// (integral) doubles, MIN/MAX on int64, BXOR on uint8, PROD on uint16 (wrapping), LAND/LOR on
// int32 with some zeros. Roots: first, middle and last.
TEST(CollSchedule, ReductionOpsAndDatatypes) {
    const std::pair<int, int> cases[] = {
        {FI_SUM, FI_INT32},  {FI_SUM, FI_DOUBLE},  {FI_MIN, FI_INT64},  {FI_MAX, FI_INT64},
        {FI_BXOR, FI_UINT8}, {FI_PROD, FI_UINT16}, {FI_LAND, FI_INT32}, {FI_LOR, FI_INT32},
    };
    size_t failures = 0;
    for (const char *name : {"allreduce_recursive_doubling", "allreduce_ring",
                             "reduce_scatter_ring", "reduce_binomial"}) {
        const Algo &al = algo(name);
        for (auto [op, dt] : cases)
            for (uint32_t n : kSizes)
                for (size_t count : counts_for(n, n <= 9 ? 1031 : 257))
                    for (uint32_t root : std::set<uint32_t>{0, n / 2, n - 1}) {
                        if (!rooted(al.coll) && root) continue;
                        const Args a = args_of(al.coll, count, dt, op, root);
                        if (!run_case(al, n, a,
                                      seed_of({size_t(op), size_t(dt), n, count, root, 5})) &&
                            ++failures >= 5)
                            FAIL() << "stopped after 5 failing cases";
                    }
    }
}

// Larger groups, a little of everything: powers of two and their neighbours.
TEST(CollSchedule, LargerGroups) {
    size_t failures = 0;
    for (const Algo &al : algos())
        for (uint32_t n : {31u, 32u, 33u, 64u})
            for (size_t count : {size_t(1), size_t(n) + 1})
                for (uint32_t root : std::set<uint32_t>{0, n / 2 + 1, n - 1}) {
                    if (!rooted(al.coll) && root) continue;
                    const int dt = reduces(al.coll) ? FI_INT64 : FI_UINT32;
                    const int op = count == 1 ? FI_MAX : FI_SUM;
                    const Args a = args_of(al.coll, count, dt, op, root);
                    if (!run_case(al, n, a, seed_of({size_t(op), n, count, root, 41})) &&
                        ++failures >= 5)
                        FAIL() << "stopped after 5 failing cases";
                }
}

// FI_MIN / FI_MAX on doubles are not commutative with NaN (and keep the target's zero sign):
// every rank must still end with the very same bits, the ones the ring's owner of a block or
// the recursive doubling's rank order produced.
TEST(CollSchedule, MinMaxWithNaNSameBitsOnEveryRank) {
    for (const char *name : {"allreduce_recursive_doubling", "allreduce_ring"})
        for (int op : {FI_MIN, FI_MAX})
            for (uint32_t n : {3u, 5u, 8u})
                for (size_t count : {size_t(1), size_t(n) + 2, size_t(257)}) {
                    const Algo &al = algo(name);
                    const Args a = args_of(FI_ALLREDUCE, count, FI_DOUBLE, op, 0);
                    const uint32_t seed = seed_of({size_t(op), n, count, 11});
                    Instance in = prepare(al, n, a, seed);
                    in.label += " (NaN)";
                    std::mt19937_64 rng(seed);
                    size_t nans = 0;
                    for (uint32_t r = 0; r < n; ++r)
                        for (size_t i = 0; i < count; ++i) {
                            const uint64_t x = rng();
                            double v = double(int(x % 1000) - 500);
                            if (x % 4 == 0 || r + i == 1) {  // a NaN whose payload names the rank
                                const uint64_t bits = 0x7ff8000000000000ull | (uint64_t(r) << 8) |
                                                      (i & 0xff) | ((x & 16) << 59);
                                memcpy(&v, &bits, sizeof v);
                                ++nans;
                            } else if (x % 7 == 0) {
                                v = (x & 32) ? -0.0 : 0.0;
                            }
                            memcpy(in.ranks[r].send.data() + i * 8, &v, 8);
                        }
                    record_inputs(a, in.ranks);
                    World w(n, mix(seed));
                    add_to(w, in, 0);
                    ASSERT_TRUE(w.run()) << in.label << ": deadlock:" << w.report();
                    ASSERT_TRUE(check(in, w, 0)) << in.label;  // nothing to compare: status
                    EXPECT_GT(nans, 0u);
                    const uint8_t *first = in.ranks[0].recv.data();
                    for (uint32_t r = 1; r < n; ++r)
                        for (size_t i = 0; i < count; ++i)
                            EXPECT_EQ(memcmp(first + i * 8, in.ranks[r].recv.data() + i * 8, 8), 0)
                                << in.label << " rank " << r << " element " << i << ": rank 0 has "
                                << hex(first + i * 8, 8) << ", this rank "
                                << hex(in.ranks[r].recv.data() + i * 8, 8);
                    // Where no input is NaN the value is the plain minimum / maximum.
                    for (size_t i = 0; i < count; ++i) {
                        bool any_nan = false;
                        double want = op == FI_MIN ? INFINITY : -INFINITY;
                        for (auto &d : in.ranks) {
                            double v;
                            memcpy(&v, d.send.data() + i * 8, 8);
                            any_nan |= std::isnan(v);
                            want = op == FI_MIN ? std::min(want, v) : std::max(want, v);
                        }
                        double got;
                        memcpy(&got, first + i * 8, 8);
                        if (!any_nan) {
                            EXPECT_EQ(got, want) << in.label << " element " << i;
                        }
                    }
                }
}

// The barrier holds every rank until the last has arrived: with one rank started only once all
// others have gone as far as they can, no rank may finish before that rank's first progress.
TEST(CollSchedule, BarrierWaitsForTheLastRank) {
    const Algo &al = algo("barrier_dissemination");
    for (uint32_t n : kSizes)
        for (uint32_t late = 0; late < n; ++late) {
            const std::string label =
                "barrier n=" + std::to_string(n) + " late rank=" + std::to_string(late);
            const uint32_t seed = seed_of({n, late, 3});
            Instance in = prepare(al, n, args_of(FI_BARRIER, 0, FI_VOID, FI_NOOP, 0), seed);
            World w(n, seed);
            add_to(w, in, 0);
            std::mt19937 rng(seed);
            for (uint32_t r = 0; r < n; ++r) w.start_at(r, rng() % (3 * n));  // staggered
            if (n > 1) {
                w.enable(late, false);
                EXPECT_FALSE(w.run()) << label << ": finished without the late rank";
                for (auto &s : w.ops())
                    EXPECT_FALSE(s->op->finished())
                        << label << ": rank " << s->rank << " left before the late rank came";
                w.enable(late, true);
            }
            ASSERT_TRUE(w.run()) << label << ": deadlock:" << w.report();
            w.expect_clean(label);
            const long last_arrival = w.state(late, 0).first_call;
            for (auto &s : w.ops()) {
                EXPECT_LE(s->first_call, last_arrival) << label;
                if (n > 1) {
                    EXPECT_GT(s->finish_call, last_arrival)
                        << label << ": rank " << s->rank << " left before the late rank came";
                }
                EXPECT_EQ(s->op->status(), 0) << label << " rank " << s->rank;
            }
        }
}

// Likewise when the rank has started but its messages are held in transit.
TEST(CollSchedule, BarrierWaitsForTheMessagesOfEveryRank) {
    const Algo &al = algo("barrier_dissemination");
    for (uint32_t n : kSizes) {
        if (n == 1) continue;
        for (uint32_t slow = 0; slow < n; ++slow) {
            const std::string label =
                "barrier n=" + std::to_string(n) + " held rank=" + std::to_string(slow);
            const uint32_t seed = seed_of({n, slow, 4});
            Instance in = prepare(al, n, args_of(FI_BARRIER, 0, FI_VOID, FI_NOOP, 0), seed);
            World w(n, seed);
            add_to(w, in, 0);
            w.hold(slow, true);
            EXPECT_FALSE(w.run()) << label << ": finished without the held rank's messages";
            for (auto &s : w.ops())
                EXPECT_FALSE(s->op->finished())
                    << label << ": rank " << s->rank << " left without the held messages";
            w.hold(slow, false);
            ASSERT_TRUE(w.run()) << label << ": deadlock:" << w.report();
            w.expect_clean(label);
        }
    }
}

// Operations of one group run at once, told apart by their tag base; within an operation, no
// two transfers between the same two ranks share a tag (the round is in it), and the tag keeps
// the operation's base.
TEST(CollSchedule, ConcurrentOperationsAndDistinctTags) {
    size_t refused = 0, early = 0;
    for (uint32_t n : {1u, 2u, 3u, 5u, 8u, 12u, 17u}) {
        struct Call {
            const char *name;
            size_t count;
            uint32_t root;
        };
        const Call calls[] = {
            {"barrier_dissemination", 0, 0},  {"allreduce_recursive_doubling", 7, 0},
            {"allreduce_ring", n + 3, 0},     {"reduce_scatter_ring", 3, 0},
            {"allgather_bruck", 2, 0},        {"allgather_ring", 2, 0},
            {"broadcast_binomial", 5, n - 1}, {"reduce_binomial", 4, n / 2},
            {"scatter_binomial", 3, 0},       {"gather_binomial", 3, n - 1},
            {"alltoall_pairwise", 3, 0},      {"allreduce_ring", 1, 0},
        };
        std::vector<Instance> ins;
        ins.reserve(std::size(calls));
        World w(n, seed_of({n, 21}));
        uint32_t index = 0;
        for (const Call &c : calls) {
            const Algo &al = algo(c.name);
            const int dt = reduces(al.coll) ? FI_INT64 : FI_UINT32;
            ins.push_back(prepare(al, n, args_of(al.coll, c.count, dt, FI_SUM, c.root),
                                  seed_of({n, index, 22})));
            expect_reference(ins.back());
            add_to(w, ins.back(), index++);
        }
        ASSERT_TRUE(w.run()) << "n=" << n << ": deadlock:" << w.report();
        w.expect_clean("n=" + std::to_string(n));
        refused += w.refused();
        early += w.early();
        for (uint32_t i = 0; i < ins.size(); ++i) EXPECT_TRUE(check(ins[i], w, i));
        for (auto &s : w.ops()) {
            std::set<Key> seen;
            uint64_t last = 0;
            for (const Key &k : s->transfers) {
                EXPECT_TRUE(seen.insert(k).second) << ins[s->index].label << " rank " << s->rank
                                                   << ": tag used twice for " << describe(k);
                EXPECT_EQ(k.tag >> kRoundBits, s->index) << ins[s->index].label;
                EXPECT_GE(k.tag & kRoundMask, last) << ins[s->index].label;
                last = k.tag & kRoundMask;
            }
        }
    }
    // The fake did exercise retries and messages that come before their receive.
    EXPECT_GT(refused, 0u);
    EXPECT_GT(early, 0u);
}

// A send that ends with FI_EIO while the rank still has a receive in flight: the operation
// reports FI_EIO, starts nothing more, and finishes only once that receive has ended.
TEST(CollSchedule, FailedSendFinishesAfterTransfersInFlight) {
    const Algo &al = algo("allreduce_ring");
    const uint32_t n = 4, x = 1;
    const Args a = args_of(FI_ALLREDUCE, 8, FI_INT32, FI_SUM, 0);
    Instance in = prepare(al, n, a, 5);
    World w(n, 5);
    add_to(w, in, 0);
    w.set_fault(Fault{int(x), 0, 0, false});
    w.enable(0, false);  // rank 1's first receive (from rank 0) stays in flight
    EXPECT_FALSE(w.run());
    OpState &s = w.state(x, 0);
    EXPECT_EQ(s.op->status(), FI_EIO);
    EXPECT_FALSE(s.op->finished());
    EXPECT_EQ(s.op->in_flight(), 1u);
    EXPECT_EQ(s.sends, 1u) << "a failed operation started more sends";
    w.enable(0, true);
    EXPECT_FALSE(w.run());  // rank 2 never hears from rank 1
    EXPECT_TRUE(s.op->finished()) << w.report();
    EXPECT_EQ(s.op->status(), FI_EIO);
    EXPECT_EQ(s.op->in_flight(), 0u);
    for (const Key &k : s.transfers) EXPECT_EQ(k.tag & kRoundMask, 0u) << describe(k);
    // An operation failed from outside (a member died) also waits for its transfers.
    OpState &t = w.state(2, 0);
    ASSERT_FALSE(t.op->finished());
    t.op->fail(FI_ECONNRESET);
    EXPECT_FALSE(t.op->progress(w.port(2)));
    EXPECT_GT(t.op->in_flight(), 0u);
    w.abort_unfinished(FI_ECANCELED);
    EXPECT_TRUE(w.run()) << w.report();
    EXPECT_EQ(t.op->status(), FI_ECONNRESET);
    EXPECT_EQ(s.op->status(), FI_EIO);
    for (auto &o : w.ops()) EXPECT_EQ(o->op->in_flight(), 0u);
}

// A failing send anywhere in any algorithm (its completion or the call itself): the operation
// reports FI_EIO once its transfers have ended, the others can be aborted, nothing hangs.
TEST(CollSchedule, FailedSendAnywhere) {
    for (const Algo &al : algos())
        for (uint32_t n : {2u, 3u, 4u, 5u, 8u})
            for (uint32_t root : std::set<uint32_t>{0, n - 1}) {
                if (!rooted(al.coll) && root) continue;
                const Args a = args_of(al.coll, 5, FI_INT32, FI_SUM, root);
                for (uint32_t x = 0; x < n; ++x) {
                    size_t sends = 0;
                    for (const Round &r : al.build(Shape{n, x}, a).rounds) sends += r.sends.size();
                    for (size_t nth : std::set<size_t>{0, sends ? sends - 1 : 0})
                        for (bool sync : {false, true}) {
                            if (!sends) continue;
                            const std::string label = label_of(al.name, n, a) + " failing rank " +
                                                      std::to_string(x) + " send " +
                                                      std::to_string(nth) +
                                                      (sync ? " (call)" : " (completion)");
                            const uint32_t seed = seed_of({n, x, nth, sync, root, 31});
                            Instance in = prepare(al, n, a, seed);
                            World w(n, seed);
                            add_to(w, in, 0);
                            w.set_fault(Fault{int(x), 0, nth, sync});
                            w.run();
                            OpState &s = w.state(x, 0);
                            EXPECT_EQ(s.op->status(), FI_EIO) << label;
                            if (!s.op->finished()) {
                                EXPECT_GT(s.op->in_flight(), 0u) << label;
                                for (auto &[id, t] : s.active)
                                    EXPECT_FALSE(t.send) << label << ": a send never ended";
                            }
                            w.cancel_receives([](const OpState &o) { return o.op->status() != 0; });
                            w.run();
                            EXPECT_TRUE(s.op->finished()) << label << w.report();
                            w.abort_unfinished(FI_ECANCELED);
                            ASSERT_TRUE(w.run()) << label << w.report();
                            for (auto &o : w.ops()) {
                                EXPECT_EQ(o->op->in_flight(), 0u) << label;
                                const int st = o->op->status();
                                if (o->rank == x) {
                                    EXPECT_EQ(st, FI_EIO) << label;
                                } else {
                                    EXPECT_TRUE(st == 0 || st == FI_ECANCELED)
                                        << label << " rank " << o->rank << " status " << st;
                                }
                            }
                        }
                }
            }
}
