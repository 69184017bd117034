// FI_THREAD_SAFE: several threads post tagged sends and receives on one endpoint pair and
// read the shared CQs concurrently; every completion is counted exactly once.
// MSG endpoints whose EQs and CQ are read by other threads while connections come and go,
// under FI_THREAD_SAFE and FI_THREAD_DOMAIN (docs/architecture.md, "Threads and progress").
#include "fabric_fixture.h"

#include <rdma/fi_atomic.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_trigger.h>

#include <array>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <set>
#include <type_traits>

// fi_wait_open and fi_wait: deprecated from libfabric 2.0, whose headers mark them so (a build
// against them, cmake -DTANDEM_LIBFABRIC_PREFIX). Applications of 1.x call them, and tandem serves
// those.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace tandem_test {
namespace {

constexpr Ms kStressDeadline = 30s;

// One outstanding operation; the fi_context2 comes first so op_context maps back to it.
struct Op {
    fi_context2 fctx{};
    std::atomic<int> state{0};  // 0 free, 1 posted, 2 completed, 3 failed
    uint64_t tag = 0;
    size_t len = 0;
    uint8_t *buf = nullptr;
};
static_assert(std::is_standard_layout_v<Op>, "op_context must map back to the Op");

struct Stats {
    std::atomic<uint64_t> completions{0}, errors{0}, unknown{0};
    std::mutex mu;
    std::vector<std::string> problems;
    void problem(std::string s) {
        std::lock_guard<std::mutex> g(mu);
        if (problems.size() < 20) problems.push_back(std::move(s));
    }
};

// Reads one batch from `cq` and marks the operations it names. Safe from any thread.
void poll_cq(fid_cq *cq, Stats &st) {
    fi_cq_tagged_entry e[16];
    ssize_t n = fi_cq_read(cq, e, 16);
    if (n == -FI_EAGAIN) return;
    if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        if (fi_cq_readerr(cq, &err, 0) == 1) {
            st.errors++;
            st.problem(std::string("error completion: ") + fi_strerror(err.err));
            if (err.op_context) static_cast<Op *>(err.op_context)->state = 3;
        }
        return;
    }
    if (n < 0) {
        st.problem("fi_cq_read: " + fi_err_str(n));
        return;
    }
    for (ssize_t i = 0; i < n; ++i) {
        auto *op = static_cast<Op *>(e[i].op_context);
        if (!op) {
            st.unknown++;
            continue;
        }
        if (op->state.load() != 1) {
            st.problem("completion for an operation that was not outstanding");
            st.unknown++;
            continue;
        }
        if (e[i].flags & FI_RECV) {
            op->tag = e[i].tag;
            op->len = e[i].len;
        }
        op->state.store(2);  // publishes tag/len to the owning thread
        st.completions++;
    }
}

constexpr size_t kWindow = 16;
constexpr size_t kMaxLen = 384 << 10;

// Mostly small messages; every 37th one of 128 KiB (node-local: single copy or staged), every
// 74th of 384 KiB (a split copy: the receiver's Cts reaches the sender while other threads
// drive progress).
size_t msg_len(uint64_t i) {
    if (i % 37 != 5) return 64 + (i % 200);
    return (i % 74 == 5) ? kMaxLen : 128 << 10;
}

class ThreadsTest : public FabricTest {
  protected:
    Stats st;
    std::atomic<bool> abort_{false};

    void poll_all() {
        for (auto &e : eps) poll_cq(e->cq, st);
    }

    // Sends `count` messages tagged (id << 32 | i) from `from` to `to`.
    void sender(Endpoint &from, fi_addr_t to, uint64_t id, uint64_t count, DataBuf &mem) {
        std::vector<Op> ops(kWindow);
        for (size_t s = 0; s < kWindow; ++s) ops[s].buf = mem.data() + s * kMaxLen;
        uint64_t next = 0, done = 0;
        const auto deadline = Clock::now() + kStressDeadline;
        while (done < count && !abort_ && Clock::now() < deadline) {
            for (auto &op : ops) {
                int s = op.state.load();
                if (s == 2 || s == 3) {
                    if (s == 3) st.problem("send failed");
                    ++done;
                    op.state = 0;
                }
                if (op.state.load() == 0 && next < count) {
                    const uint64_t tag = (id << 32) | next;
                    const size_t len = msg_len(next);
                    std::memcpy(op.buf, &tag, 8);
                    fill_pattern(op.buf + 8, len - 8, static_cast<uint32_t>(tag));
                    op.tag = tag;
                    op.len = len;
                    op.state = 1;
                    ssize_t ret = fi_tsend(from.ep, op.buf, len, mem.desc, to, tag, &op.fctx);
                    if (ret == -FI_EAGAIN) {
                        op.state = 0;
                    } else if (ret) {
                        st.problem("fi_tsend: " + fi_err_str(ret));
                        abort_ = true;
                    } else {
                        ++next;
                    }
                }
            }
            poll_all();
        }
        if (done < count)
            st.problem("sender " + std::to_string(id) + " finished " + std::to_string(done) +
                       " of " + std::to_string(count));
        // Do not return (and free the contexts) while operations are outstanding.
        while (Clock::now() < deadline + 5s) {
            bool busy = false;
            for (auto &op : ops) busy |= op.state.load() == 1;
            if (!busy) break;
            poll_all();
        }
    }

    // Receives `count` messages with tags (id << 32 | *) on `on`.
    void receiver(Endpoint &on, uint64_t id, uint64_t count, DataBuf &mem) {
        std::vector<Op> ops(kWindow);
        for (size_t s = 0; s < kWindow; ++s) ops[s].buf = mem.data() + s * kMaxLen;
        std::vector<uint8_t> seen(count, 0);
        uint64_t posted = 0, done = 0;
        const auto deadline = Clock::now() + kStressDeadline;
        while (done < count && !abort_ && Clock::now() < deadline) {
            for (auto &op : ops) {
                int s = op.state.load();
                if (s == 3) {
                    st.problem("receive failed");
                    ++done;
                    op.state = 0;
                } else if (s == 2) {
                    uint64_t hdr = 0;
                    std::memcpy(&hdr, op.buf, 8);
                    const uint64_t i = op.tag & 0xFFFFFFFFull;
                    if ((op.tag >> 32) != id) {
                        st.problem("receiver " + std::to_string(id) + " got tag of sender " +
                                   std::to_string(op.tag >> 32));
                    } else if (hdr != op.tag) {
                        st.problem("payload header does not match the tag");
                    } else if (i >= count || seen[i]) {
                        st.problem("duplicate or out-of-range message " + std::to_string(i));
                    } else if (op.len != msg_len(i)) {
                        st.problem("wrong length for message " + std::to_string(i));
                    } else if (check_pattern(op.buf + 8, op.len - 8, static_cast<uint32_t>(hdr)) !=
                               -1) {
                        st.problem("corrupt payload in message " + std::to_string(i));
                    } else {
                        seen[i] = 1;
                    }
                    ++done;
                    op.state = 0;
                }
                if (op.state.load() == 0 && posted < count) {
                    op.state = 1;
                    ssize_t ret = fi_trecv(on.ep, op.buf, kMaxLen, mem.desc, FI_ADDR_UNSPEC,
                                           id << 32, 0xFFFFFFFFull, &op.fctx);
                    if (ret == -FI_EAGAIN) {
                        op.state = 0;
                    } else if (ret) {
                        st.problem("fi_trecv: " + fi_err_str(ret));
                        abort_ = true;
                    } else {
                        ++posted;
                    }
                }
            }
            poll_all();
        }
        uint64_t good = 0;
        for (auto v : seen) good += v;
        if (good != count)
            st.problem("receiver " + std::to_string(id) + " got " + std::to_string(good) + " of " +
                       std::to_string(count) + " messages intact");
        // Cancel whatever is still posted (only after a failure) and wait for it to drain.
        for (auto &op : ops)
            if (op.state.load() == 1) fi_cancel(&on.ep->fid, &op.fctx);
        while (Clock::now() < deadline + 5s) {
            bool busy = false;
            for (auto &op : ops) busy |= op.state.load() == 1;
            if (!busy) break;
            poll_all();
        }
    }

    std::string problems() {
        std::string s;
        for (auto &p : st.problems) s += "\n  " + p;
        return s;
    }
};

TEST_F(ThreadsTest, ConcurrentTaggedTrafficOneDirection) {
    constexpr int kPairs = 3;
    constexpr uint64_t kCount = 400;
    std::vector<std::unique_ptr<DataBuf>> mem;
    for (int i = 0; i < 2 * kPairs; ++i) mem.push_back(buf(kWindow * kMaxLen));
    std::vector<std::thread> threads;
    for (int t = 0; t < kPairs; ++t) {
        threads.emplace_back([&, t] { receiver(b(), t, kCount, *mem[2 * t]); });
        threads.emplace_back([&, t] { sender(a(), a().peer[1], t, kCount, *mem[2 * t + 1]); });
    }
    for (auto &th : threads) th.join();
    EXPECT_TRUE(st.problems.empty()) << problems();
    EXPECT_EQ(st.errors.load(), 0u);
    EXPECT_EQ(st.unknown.load(), 0u);
    EXPECT_EQ(st.completions.load(), 2 * kPairs * kCount) << "sends + receives";
}

TEST_F(ThreadsTest, ConcurrentTaggedTrafficBothDirections) {
    constexpr uint64_t kCount = 300;
    std::vector<std::unique_ptr<DataBuf>> mem;
    for (int i = 0; i < 8; ++i) mem.push_back(buf(kWindow * kMaxLen));
    std::vector<std::thread> threads;
    // ids 0,1: a -> b; ids 2,3: b -> a
    for (uint64_t id = 0; id < 4; ++id) {
        Endpoint &src = id < 2 ? a() : b();
        Endpoint &dst = id < 2 ? b() : a();
        fi_addr_t to = id < 2 ? a().peer[1] : b().peer[0];
        threads.emplace_back([&, id] { receiver(dst, id, kCount, *mem[2 * id]); });
        threads.emplace_back([&, id, to] { sender(src, to, id, kCount, *mem[2 * id + 1]); });
    }
    for (auto &th : threads) th.join();
    EXPECT_TRUE(st.problems.empty()) << problems();
    EXPECT_EQ(st.errors.load(), 0u);
    EXPECT_EQ(st.unknown.load(), 0u);
    EXPECT_EQ(st.completions.load(), 8 * kCount);
}

TEST_F(ThreadsTest, ConcurrentRegistrationAndAddressInsertion) {
    constexpr int kThreads = 4, kIters = 200;
    Fid<fid_av> av;
    ASSERT_NO_FATAL_FAILURE(open_av(av, FI_AV_TABLE));
    std::vector<std::vector<std::pair<fi_addr_t, uint16_t>>> inserted(kThreads);
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            AlignedBuf mem(4096);
            for (int i = 0; i < kIters; ++i) {
                fid_mr *mr = nullptr;
                if (fi_mr_reg(domain, mem.data(), 4096, kAllAccess, 0, 100000 + t * kIters + i, 0,
                              &mr, nullptr) != 0) {
                    failures++;
                    continue;
                }
                if (fi_close(&mr->fid) != 0) failures++;
                sockaddr_in sin{};
                sin.sin_family = AF_INET;
                sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                const uint16_t port = static_cast<uint16_t>(20000 + t * kIters + i);
                sin.sin_port = htons(port);
                fi_addr_t addr = FI_ADDR_NOTAVAIL;
                if (fi_av_insert(av, &sin, 1, &addr, 0, nullptr) != 1) {
                    failures++;
                    continue;
                }
                inserted[t].emplace_back(addr, port);
            }
        });
    }
    for (auto &th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    std::set<fi_addr_t> all;
    for (auto &v : inserted) {
        EXPECT_EQ(v.size(), static_cast<size_t>(kIters));
        for (auto &[addr, port] : v) {
            all.insert(addr);
            sockaddr_in got{};
            size_t len = sizeof(got);
            ASSERT_FI_OK(fi_av_lookup(av, addr, &got, &len));
            EXPECT_EQ(ntohs(got.sin_port), port) << "fi_addr " << addr;
        }
    }
    EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kIters)) << "duplicate fi_addr values";
}

// Atomics from several threads of one process through one endpoint, into one counter of the
// peer, with every thread also driving progress (the target executes atomics in it): the
// counter ends at the sum of all adds and every fetched value is seen exactly once.
class AtomicThreadsTest : public ThreadsTest {
    void configure(FabricOptions &o) override { o.caps |= FI_ATOMIC; }
};

TEST_F(AtomicThreadsTest, FetchAddsFromFourThreadsOnOneEndpoint) {
    constexpr int kThreads = 4;
    constexpr uint64_t kAdds = 500;
    auto counter = buf(sizeof(uint64_t), 0, true);
    std::vector<std::vector<uint64_t>> fetched(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            Op op;
            uint64_t one = 1, old = 0;
            const auto deadline = Clock::now() + kStressDeadline;
            for (uint64_t i = 0; i < kAdds && !abort_ && Clock::now() < deadline; ++i) {
                op.state = 1;
                ssize_t ret;
                while ((ret = fi_fetch_atomic(a().ep, &one, 1, nullptr, &old, nullptr, a().peer[1],
                                              rma_addr(*counter), counter->key, FI_UINT64, FI_SUM,
                                              &op.fctx)) == -FI_EAGAIN)
                    poll_all();
                if (ret) {
                    st.problem("fi_fetch_atomic: " + fi_err_str(ret));
                    abort_ = true;
                    break;
                }
                while (op.state.load() == 1 && !abort_ && Clock::now() < deadline) poll_all();
                if (op.state.load() != 2) {
                    st.problem("a fetch-add did not complete");
                    abort_ = true;
                    break;
                }
                fetched[t].push_back(old);
            }
        });
    }
    for (auto &th : threads) th.join();
    EXPECT_TRUE(st.problems.empty()) << problems();
    uint64_t total = 0;
    std::memcpy(&total, counter->data(), sizeof total);
    EXPECT_EQ(total, kThreads * kAdds);
    std::set<uint64_t> seen;
    for (auto &v : fetched) {
        EXPECT_EQ(v.size(), kAdds);
        seen.insert(v.begin(), v.end());
    }
    EXPECT_EQ(seen.size(), kThreads * kAdds) << "a value was fetched twice";
    EXPECT_EQ(seen.empty() ? 0 : *seen.rbegin(), kThreads * kAdds - 1);
}

// Triggered sends from several threads of one process, each thread with its own counter and
// the receiver's thread posting receives, all driving progress: each thread queues a window of
// sends on its counter, then starts them one fi_cntr_add at a time. Every message arrives
// intact once, and every send completes with its own context.
class TriggerThreadsTest : public ThreadsTest {
    void configure(FabricOptions &o) override { o.caps |= FI_TRIGGER; }
};

TEST_F(TriggerThreadsTest, TriggeredSendsFromFourThreadsEachOnItsCounter) {
    constexpr int kThreads = 4;
    constexpr uint64_t kSends = 200;
    constexpr size_t kQueued = 8;  // triggered sends each thread keeps queued
    std::vector<std::unique_ptr<DataBuf>> mem;
    for (int i = 0; i < 2 * kThreads; ++i) mem.push_back(buf(kWindow * kMaxLen));
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] { receiver(b(), t, kSends, *mem[2 * t]); });
        threads.emplace_back([&, t] {
            fid_cntr *cntr = nullptr;
            fi_cntr_attr attr{};
            attr.events = FI_CNTR_EVENTS_COMP;
            if (fi_cntr_open(domain, &attr, &cntr, nullptr)) {
                st.problem("fi_cntr_open");
                abort_ = true;
                return;
            }
            std::vector<Op> ops(kQueued);
            uint8_t *base = mem[2 * t + 1]->data();
            uint64_t posted = 0, started = 0;
            const auto deadline = Clock::now() + kStressDeadline;
            while (started < kSends && !abort_ && Clock::now() < deadline) {
                // Keep kQueued sends queued, each on the next threshold of this counter.
                for (auto &op : ops) {
                    int s = op.state.load();
                    if (s == 3) st.problem("triggered send failed");
                    if ((s == 2 || s == 3) || (s == 0 && posted < kSends)) {
                        if (posted == kSends) {
                            op.state = 0;
                            continue;
                        }
                        const size_t slot = static_cast<size_t>(&op - ops.data());
                        op.buf = base + slot * kMaxLen;
                        const uint64_t tag = (uint64_t(t) << 32) | posted;
                        op.len = msg_len(posted);
                        std::memcpy(op.buf, &tag, 8);
                        fill_pattern(op.buf + 8, op.len - 8, static_cast<uint32_t>(tag));
                        auto *tctx = reinterpret_cast<fi_triggered_context *>(&op.fctx);
                        static_assert(sizeof(fi_triggered_context) <= sizeof op.fctx);
                        *tctx = {};
                        tctx->event_type = FI_TRIGGER_THRESHOLD;
                        tctx->trigger.threshold.cntr = cntr;
                        tctx->trigger.threshold.threshold = posted + 1;
                        iovec iov{op.buf, op.len};
                        void *desc = mem[2 * t + 1]->desc;
                        fi_msg_tagged msg{&iov, &desc, 1, a().peer[1], tag, 0, &op.fctx, 0};
                        op.state = 1;
                        ssize_t ret = fi_tsendmsg(a().ep, &msg, FI_TRIGGER);
                        if (ret == -FI_EAGAIN) {
                            op.state = 0;
                        } else if (ret) {
                            st.problem("fi_tsendmsg(FI_TRIGGER): " + fi_err_str(ret));
                            abort_ = true;
                        } else {
                            ++posted;
                        }
                    }
                }
                if (started < posted) {
                    fi_cntr_add(cntr, 1);  // starts the send with the next threshold
                    ++started;
                }
                poll_all();
            }
            while (Clock::now() < deadline + 5s) {  // the contexts outlive their operations
                bool busy = false;
                for (auto &op : ops) busy |= op.state.load() == 1;
                if (!busy) break;
                poll_all();
            }
            if (fi_cntr_read(cntr) != kSends) st.problem("the counter did not reach its sends");
            fi_close(&cntr->fid);
        });
    }
    for (auto &th : threads) th.join();
    EXPECT_TRUE(st.problems.empty()) << problems();
    EXPECT_EQ(st.errors.load(), 0u);
    EXPECT_EQ(st.unknown.load(), 0u);
    EXPECT_EQ(st.completions.load(), 2 * kThreads * kSends) << "sends + receives";
}

// ---------------------------------------------------------------------------------------------
// MSG endpoints, EQ readers and CQ readers on different threads

// Aborts the test process when the work it guards does not finish in time: a deadlocked
// thread can be neither joined nor abandoned, so failing loudly is the only way not to hang.
class Watchdog {
  public:
    Watchdog(Ms limit, std::string what) : what_(std::move(what)) {
        thread_ = std::thread([this, limit] {
            std::unique_lock lk(mu_);
            if (!cv_.wait_for(lk, limit, [this] { return done_; })) {
                std::fprintf(stderr, "Watchdog: %s did not finish in %lld ms (deadlock?)\n",
                             what_.c_str(), static_cast<long long>(limit.count()));
                std::fflush(stderr);
                std::abort();
            }
        });
    }
    ~Watchdog() {
        {
            std::lock_guard lk(mu_);
            done_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }

  private:
    std::string what_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread thread_;
};

struct CmEvent {
    uint32_t event = 0;
    fid_t fid = nullptr;
    InfoPtr info;  // FI_CONNREQ
};

// Events an EQ reader thread read, for the thread that waits for them.
class Mailbox {
  public:
    void put(CmEvent e) {
        std::lock_guard g(mu_);
        events_.push_back(std::move(e));
    }
    // The first `event` naming `fid` (any fid when null), removed; nullopt when none came yet.
    std::optional<CmEvent> take(uint32_t event, fid_t fid = nullptr) {
        std::lock_guard g(mu_);
        for (auto it = events_.begin(); it != events_.end(); ++it) {
            if (it->event != event || (fid && it->fid != fid)) continue;
            CmEvent e = std::move(*it);
            events_.erase(it);
            return e;
        }
        return std::nullopt;
    }

  private:
    std::mutex mu_;
    std::deque<CmEvent> events_;
};

// One operation whose completion a CQ reader thread reports; the fi_context2 comes first so
// that op_context maps back to it.
struct MsgOp {
    fi_context2 fctx{};
    std::atomic<int> state{0};  // 0 idle, 1 posted, 2 completed, 3 failed
};
static_assert(std::is_standard_layout_v<MsgOp>, "op_context must map back to the MsgOp");

// Collectives from several threads of one process: three endpoints of one domain join four
// groups of all three, then one thread per group runs allreduces on its group through all
// three endpoints while every thread reads the shared CQs (which complete the others'
// operations too). Node-local (the groups' shared segments) in api.*, by messages over the
// link in api_net.*. Every result is right and every operation completes once.
class CollThreadsTest : public ThreadsTest {
    void configure(FabricOptions &o) override {
        o.caps |= FI_COLLECTIVE;
        o.num_eps = 3;
    }
    void before_enable(Endpoint &e, size_t index) override {
        fi_eq_attr attr{};
        attr.wait_obj = FI_WAIT_NONE;
        ASSERT_FI_OK(fi_eq_open(fabric, &attr, eqs_[index].out(), nullptr));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &eqs_[index]->fid, 0));
    }

  protected:
    void TearDown() override {
        for (auto &per_ep : groups)
            for (auto &mc : per_ep) mc.reset();
        for (auto &set : sets) set.reset();
        eps.clear();  // before their EQs, which go before the fabric
        for (auto &eq : eqs_) eq.reset();
        ThreadsTest::TearDown();
    }

    // Joins a group of every endpoint on each of them; its fid_mc per endpoint.
    void join_all(size_t g) {
        for (size_t i = 0; i < eps.size(); ++i) {
            fi_av_set_attr attr{};
            attr.count = eps.size();
            attr.start_addr = eps[i]->peer.front();
            attr.end_addr = eps[i]->peer.back();
            attr.stride = 1;
            ASSERT_FI_OK(fi_av_set(eps[i]->av, &attr, sets[g * 3 + i].out(), nullptr));
            fi_addr_t addr = FI_ADDR_NOTAVAIL;
            ASSERT_FI_OK(fi_av_set_addr(sets[g * 3 + i], &addr));
            ASSERT_FI_OK(fi_join_collective(eps[i]->ep, addr, sets[g * 3 + i], 0,
                                            groups[g][i].out(), nullptr));
        }
        std::array<bool, 3> joined{};
        ASSERT_TRUE(poll_until([&] {
            for (size_t i = 0; i < eps.size(); ++i) {
                uint32_t event = 0;
                fi_eq_entry entry{};
                ssize_t ret = fi_eq_read(eqs_[i], &event, &entry, sizeof entry, 0);
                if (ret == ssize_t(sizeof entry) && event == FI_JOIN_COMPLETE) joined[i] = true;
                poll_all();
            }
            return joined[0] && joined[1] && joined[2];
        })) << "group "
            << g << " did not join";
    }

    std::array<Fid<fid_eq>, 3> eqs_;
    std::array<Fid<fid_av_set>, 12> sets;
    std::array<std::array<Fid<fid_mc>, 3>, 4> groups;
};

TEST_F(CollThreadsTest, AllreducesFromFourThreadsEachOnItsGroup) {
    constexpr int kGroups = 4;
    constexpr uint64_t kIters = 200;
    for (int g = 0; g < kGroups; ++g) ASSERT_NO_FATAL_FAILURE(join_all(size_t(g)));
    std::vector<std::thread> threads;
    for (int g = 0; g < kGroups; ++g) {
        threads.emplace_back([&, g] {
            std::array<Op, 3> ops;
            std::array<std::array<uint64_t, 4>, 3> in{}, out{};
            const auto deadline = Clock::now() + kStressDeadline;
            for (uint64_t it = 0; it < kIters && !abort_ && Clock::now() < deadline; ++it) {
                // Vectors of 1 and 4 elements, in turn.
                const size_t count = it % 2 ? 4 : 1;
                for (size_t i = 0; i < 3; ++i) {
                    for (size_t k = 0; k < count; ++k)
                        in[i][k] = (uint64_t(g) << 40) + it * 10 + i + k;
                    ops[i].state = 1;
                    ssize_t ret;
                    while ((ret = fi_allreduce(eps[i]->ep, in[i].data(), count, nullptr,
                                               out[i].data(), nullptr, fi_mc_addr(groups[g][i]),
                                               FI_UINT64, FI_SUM, 0, &ops[i].fctx)) == -FI_EAGAIN)
                        poll_all();
                    if (ret) {
                        st.problem("fi_allreduce: " + fi_err_str(ret));
                        abort_ = true;
                    }
                }
                bool done = false;
                while (!done && !abort_ && Clock::now() < deadline) {
                    poll_all();
                    done = ops[0].state.load() != 1 && ops[1].state.load() != 1 &&
                           ops[2].state.load() != 1;
                }
                for (size_t i = 0; i < 3 && !abort_; ++i) {
                    if (ops[i].state.load() != 2) {
                        st.problem("an allreduce of group " + std::to_string(g) +
                                   " did not complete");
                        abort_ = true;
                        break;
                    }
                    for (size_t k = 0; k < count; ++k) {
                        const uint64_t want = 3 * ((uint64_t(g) << 40) + it * 10 + k) + 0 + 1 + 2;
                        if (out[i][k] != want) {
                            st.problem("group " + std::to_string(g) + " iteration " +
                                       std::to_string(it) + ": wrong sum");
                            abort_ = true;
                        }
                    }
                }
            }
            // Do not return (and free the contexts) while an operation is outstanding.
            while (
                Clock::now() < deadline + 5s &&
                (ops[0].state.load() == 1 || ops[1].state.load() == 1 || ops[2].state.load() == 1))
                poll_all();
        });
    }
    for (auto &th : threads) th.join();
    EXPECT_TRUE(st.problems.empty()) << problems();
    EXPECT_EQ(st.completions.load(), uint64_t(kGroups) * kIters * 3);
    EXPECT_EQ(st.unknown.load(), 0u);
}

class MsgThreadsTest : public ::testing::Test {
  protected:
    InfoPtr info, client_info;
    Fid<fid_fabric> fabric;
    Fid<fid_domain> domain;
    Fid<fid_eq> srv_eq, cli_eq;
    Fid<fid_cq> cq;
    Fid<fid_pep> pep;
    Fid<fid_wait> wait_set;
    Stats st;
    std::atomic<bool> stop{false};
    Mailbox srv_box, cli_box;
    // Each round's receives and sends; members, so that a completion a CQ reader thread reads
    // after a failed round still lands in a live object.
    std::array<MsgOp, 4> ops_;

    void open(fi_threading threading) {
        InfoPtr hints = alloc_hints();
        hints->fabric_attr->prov_name = strdup(provider_name());
        hints->ep_attr->type = FI_EP_MSG;
        hints->caps = FI_MSG;
        hints->mode = FI_CONTEXT | FI_CONTEXT2;
        hints->addr_format = FI_SOCKADDR_IN;
        hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
        hints->domain_attr->threading = threading;
        ASSERT_FI_OK(getinfo_own("127.0.0.1", nullptr, FI_SOURCE, hints.get(), &info));
        ASSERT_EQ(info->domain_attr->threading, threading);
        ASSERT_FI_OK(fi_fabric(info->fabric_attr, fabric.out(), nullptr));
        ASSERT_FI_OK(fi_domain(fabric, info.get(), domain.out(), nullptr));
        fi_eq_attr eattr{};
        eattr.size = 64;
        eattr.wait_obj = FI_WAIT_UNSPEC;
        ASSERT_FI_OK(fi_eq_open(fabric, &eattr, srv_eq.out(), nullptr));
        ASSERT_FI_OK(fi_eq_open(fabric, &eattr, cli_eq.out(), nullptr));
        fi_cq_attr cattr{};
        cattr.format = FI_CQ_FORMAT_CONTEXT;
        cattr.size = 256;
        ASSERT_FI_OK(fi_cq_open(domain, &cattr, cq.out(), nullptr));
    }

    void listen() {
        ASSERT_FI_OK(fi_passive_ep(fabric, info.get(), pep.out(), nullptr));
        ASSERT_FI_OK(fi_pep_bind(pep, &srv_eq->fid, 0));
        ASSERT_FI_OK(fi_listen(pep));
        sockaddr_in sin{};
        size_t len = sizeof sin;
        ASSERT_FI_OK(fi_getname(&pep->fid, &sin, &len));
        InfoPtr hints(fi_dupinfo(info.get()));
        std::free(hints->src_addr);
        hints->src_addr = nullptr;
        hints->src_addrlen = 0;
        const std::string port = std::to_string(ntohs(sin.sin_port));
        ASSERT_FI_OK(getinfo_own("127.0.0.1", port.c_str(), 0, hints.get(), &client_info));
    }

    // Reader threads: joined before anything they use goes away, also when a test fails early.
    std::vector<std::thread> workers_;
    template <class F>
    void spawn(F &&f) {
        workers_.emplace_back(std::forward<F>(f));
    }
    void stop_workers() {
        stop = true;
        for (auto &t : workers_) t.join();
        workers_.clear();
    }

    void TearDown() override {
        stop_workers();
        pep.reset();
        wait_set.reset();
        cq.reset();
        srv_eq.reset();
        cli_eq.reset();
        domain.reset();
        fabric.reset();
    }

    std::string problems() {
        std::string s;
        for (auto &p : st.problems) s += "\n  " + p;
        return s;
    }

    // Reads `eq` until `stop`: with fi_eq_sread, or with fi_eq_read and, between reads that
    // find nothing, fi_trywait and FI_GETWAIT (the calls that collect the sources' sockets).
    void read_eq(fid_eq *eq, bool blocking, Mailbox &box) {
        alignas(fi_eq_cm_entry) uint8_t raw[sizeof(fi_eq_cm_entry) + 256];
        while (!stop) {
            uint32_t ev = 0;
            ssize_t n = blocking ? fi_eq_sread(eq, &ev, raw, sizeof raw, 20, 0)
                                 : fi_eq_read(eq, &ev, raw, sizeof raw, 0);
            if (n == -FI_EAGAIN) {
                if (!blocking) {
                    fid_t f = &eq->fid;
                    int ret = fi_trywait(fabric, &f, 1);
                    if (ret && ret != -FI_EAGAIN) st.problem("fi_trywait: " + fi_err_str(ret));
                    int fd = -1;
                    ret = fi_control(&eq->fid, FI_GETWAIT, &fd);
                    if (ret) st.problem("FI_GETWAIT: " + fi_err_str(ret));
                }
                continue;
            }
            if (n == -FI_EAVAIL) {
                fi_eq_err_entry err{};
                if (fi_eq_readerr(eq, &err, 0) > 0)
                    st.problem(std::string("EQ error event: ") + fi_strerror(err.err));
                continue;
            }
            if (n < ssize_t(sizeof(fi_eq_cm_entry))) {
                st.problem("fi_eq_read: " + fi_err_str(n));
                continue;
            }
            fi_eq_cm_entry cm{};
            std::memcpy(&cm, raw, sizeof cm);
            box.put(CmEvent{ev, cm.fid, InfoPtr(ev == FI_CONNREQ ? cm.info : nullptr)});
        }
    }

    // Reads the CQ once and marks the operations it reports.
    void read_cq() {
        fi_cq_entry e[8];
        ssize_t n = fi_cq_read(cq, e, 8);
        if (n == -FI_EAGAIN) return;
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            if (fi_cq_readerr(cq, &err, 0) == 1) {
                st.problem(std::string("error completion: ") + fi_strerror(err.err));
                if (err.op_context) static_cast<MsgOp *>(err.op_context)->state = 3;
            }
            return;
        }
        if (n < 0) {
            st.problem("fi_cq_read: " + fi_err_str(n));
            return;
        }
        for (ssize_t i = 0; i < n; ++i) static_cast<MsgOp *>(e[i].op_context)->state = 2;
    }

    // Waits until `done()`; reads the CQ meanwhile when this thread is the domain's
    // (`drive_cq`), else another thread's reads make the progress. False after a generous
    // deadline (a guard against hanging, not a timing requirement).
    bool wait_for(const std::function<bool()> &done, bool drive_cq) {
        return ::tandem_test::poll_until([&] {
            if (drive_cq) read_cq();
            return done();
        });
    }

    // `rounds` times: a client connects, the server accepts, each sends the other a message,
    // the client shuts down, the server sees FI_SHUTDOWN, both close. Every wait is on events
    // and completions other threads read (the EQs always; the CQ unless `drive_cq`).
    void connect_exchange_close(int rounds, Mailbox &srv_box, Mailbox &cli_box, bool drive_cq) {
        AlignedBuf sbuf(256), rbuf(256), sbuf2(256), rbuf2(256);
        for (int round = 0; round < rounds && !HasFailure(); ++round) {
            Fid<fid_ep> cli, srv;
            ASSERT_FI_OK(fi_endpoint(domain, client_info.get(), cli.out(), nullptr));
            ASSERT_FI_OK(fi_ep_bind(cli, &cli_eq->fid, 0));
            ASSERT_FI_OK(fi_ep_bind(cli, &cq->fid, FI_TRANSMIT | FI_RECV));
            ASSERT_FI_OK(fi_enable(cli));
            ASSERT_FI_OK(fi_connect(cli, client_info->dest_addr, nullptr, 0));
            std::optional<CmEvent> req;
            ASSERT_TRUE(
                wait_for([&] { return (req = srv_box.take(FI_CONNREQ)).has_value(); }, drive_cq))
                << "round " << round << ": no FI_CONNREQ" << problems();
            ASSERT_FI_OK(fi_endpoint(domain, req->info.get(), srv.out(), nullptr));
            ASSERT_FI_OK(fi_ep_bind(srv, &srv_eq->fid, 0));
            ASSERT_FI_OK(fi_ep_bind(srv, &cq->fid, FI_TRANSMIT | FI_RECV));
            ASSERT_FI_OK(fi_enable(srv));
            auto &[recv_srv, recv_cli, send_cli, send_srv] = ops_;
            for (MsgOp &op : ops_) op.state = 1;
            ASSERT_FI_OK(fi_recv(srv, rbuf.data(), 256, nullptr, 0, &recv_srv.fctx));
            ASSERT_FI_OK(fi_recv(cli, rbuf2.data(), 256, nullptr, 0, &recv_cli.fctx));
            ASSERT_FI_OK(fi_accept(srv, nullptr, 0));
            ASSERT_TRUE(wait_for([&] { return cli_box.take(FI_CONNECTED, &cli->fid).has_value(); },
                                 drive_cq))
                << "round " << round << ": client not connected" << problems();
            ASSERT_TRUE(wait_for([&] { return srv_box.take(FI_CONNECTED, &srv->fid).has_value(); },
                                 drive_cq))
                << "round " << round << ": server not connected" << problems();
            fill_pattern(sbuf.data(), 256, round);
            fill_pattern(sbuf2.data(), 256, round + 1000);
            ASSERT_FI_OK(fi_send(cli, sbuf.data(), 256, nullptr, 0, &send_cli.fctx));
            ASSERT_FI_OK(fi_send(srv, sbuf2.data(), 256, nullptr, 0, &send_srv.fctx));
            ASSERT_TRUE(wait_for(
                [&] {
                    return recv_srv.state != 1 && recv_cli.state != 1 && send_cli.state != 1 &&
                           send_srv.state != 1;
                },
                drive_cq))
                << "round " << round << ": messages not completed" << problems();
            EXPECT_EQ(recv_srv.state.load(), 2);
            EXPECT_EQ(recv_cli.state.load(), 2);
            EXPECT_EQ(check_pattern(rbuf.data(), 256, round), -1) << "round " << round;
            EXPECT_EQ(check_pattern(rbuf2.data(), 256, round + 1000), -1) << "round " << round;
            ASSERT_FI_OK(fi_shutdown(cli, 0));
            ASSERT_TRUE(wait_for([&] { return srv_box.take(FI_SHUTDOWN, &srv->fid).has_value(); },
                                 drive_cq))
                << "round " << round << ": no FI_SHUTDOWN at the server" << problems();
            // The fids are closed while the EQ readers go on reading.
        }
    }
};

// Two EQ readers (fi_eq_sread on the server's EQ; fi_eq_read, fi_trywait and FI_GETWAIT on the
// client's) and a CQ reader, each on its own thread, while the main thread connects, exchanges
// messages, shuts down and closes MSG endpoints. The EQ readers drive the endpoints'
// connection progress and the CQ reader their data progress, so each lock of tandem is taken
// from both sides: CQ progress holds the domain lock and posts to an EQ, and an EQ collecting
// its sources' sockets must not hold its own lock meanwhile (it did: lock-order inversion,
// and a deadlock when the two met).
TEST_F(MsgThreadsTest, EqAndCqReadersWhileConnectionsComeAndGo) {
    ASSERT_NO_FATAL_FAILURE(open(FI_THREAD_SAFE));
    ASSERT_NO_FATAL_FAILURE(listen());
    Watchdog dog(50s, "EqAndCqReadersWhileConnectionsComeAndGo");
    spawn([this] { read_eq(srv_eq, true, srv_box); });
    spawn([this] { read_eq(cli_eq, false, cli_box); });
    spawn([this] {
        while (!stop) read_cq();
    });
    connect_exchange_close(40, srv_box, cli_box, false);
    stop_workers();
    EXPECT_TRUE(st.problems.empty()) << problems();
}

// fi_close of passive and active endpoints while other threads read the EQ they are bound to
// (fi_eq_read, fi_eq_sread, fi_trywait, FI_GETWAIT): each read drives the connection progress
// of the EQ's endpoints, and a close must wait for a read that is inside its endpoint rather
// than free it under the reader.
TEST_F(MsgThreadsTest, EndpointsCloseWhileOtherThreadsReadTheirEq) {
    ASSERT_NO_FATAL_FAILURE(open(FI_THREAD_SAFE));
    Watchdog dog(50s, "EndpointsCloseWhileOtherThreadsReadTheirEq");
    spawn([this] { read_eq(srv_eq, false, srv_box); });
    spawn([this] { read_eq(srv_eq, true, srv_box); });
    for (int i = 0; i < 300 && !HasFailure(); ++i) {
        Fid<fid_pep> p;
        ASSERT_FI_OK(fi_passive_ep(fabric, info.get(), p.out(), nullptr));
        ASSERT_FI_OK(fi_pep_bind(p, &srv_eq->fid, 0));
        ASSERT_FI_OK(fi_listen(p));
        Fid<fid_ep> ep;
        ASSERT_FI_OK(fi_endpoint(domain, info.get(), ep.out(), nullptr));
        ASSERT_FI_OK(fi_ep_bind(ep, &srv_eq->fid, 0));
        ASSERT_FI_OK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
        ASSERT_FI_OK(fi_enable(ep));
        EXPECT_FI_OK(fi_close(&ep.release()->fid));
        EXPECT_FI_OK(fi_close(&p.release()->fid));
    }
    stop_workers();
    EXPECT_TRUE(st.problems.empty()) << problems();
}

// FI_THREAD_DOMAIN: the application serialises its calls on the domain's objects (here: the
// main thread makes them all, CQ reads included), but EQs belong to the fabric (fi_domain(3)),
// so other threads read them meanwhile. Those reads drive the progress of the same endpoints
// the CQ reads drive, which must therefore not run at once (ThreadSanitizer reported the race
// when the domain lock was skipped).
TEST_F(MsgThreadsTest, ThreadDomainEqReadersBesideTheCqReader) {
    ASSERT_NO_FATAL_FAILURE(open(FI_THREAD_DOMAIN));
    ASSERT_NO_FATAL_FAILURE(listen());
    Watchdog dog(50s, "ThreadDomainEqReadersBesideTheCqReader");
    spawn([this] { read_eq(srv_eq, true, srv_box); });
    spawn([this] { read_eq(cli_eq, false, cli_box); });
    connect_exchange_close(20, srv_box, cli_box, true);
    stop_workers();
    EXPECT_TRUE(st.problems.empty()) << problems();
}

// CQs, counters and EQs opened on a wait set, then closed, while another thread waits on the
// set: fi_wait asks each member (fi_trywait) without the set's mutex, and a close must wait
// for a wait that is inside its object rather than free it under the waiter.
TEST_F(MsgThreadsTest, WaitSetMembersCloseWhileAnotherThreadWaits) {
    ASSERT_NO_FATAL_FAILURE(open(FI_THREAD_SAFE));
    fi_wait_attr wattr{};
    wattr.wait_obj = FI_WAIT_UNSPEC;
    ASSERT_FI_OK(fi_wait_open(fabric, &wattr, wait_set.out()));
    fid_wait *set = wait_set;
    Watchdog dog(50s, "WaitSetMembersCloseWhileAnotherThreadWaits");
    spawn([this, set] {
        while (!stop) {
            int ret = fi_wait(set, 0);
            if (ret && ret != -FI_ETIMEDOUT) st.problem("fi_wait: " + fi_err_str(ret));
        }
    });
    for (int i = 0; i < 300 && !HasFailure(); ++i) {
        fi_cq_attr cattr{};
        cattr.format = FI_CQ_FORMAT_CONTEXT;
        cattr.wait_obj = FI_WAIT_SET;
        cattr.wait_set = set;
        Fid<fid_cq> c;
        ASSERT_FI_OK(fi_cq_open(domain, &cattr, c.out(), nullptr));
        fi_cntr_attr nattr{};
        nattr.events = FI_CNTR_EVENTS_COMP;
        nattr.wait_obj = FI_WAIT_SET;
        nattr.wait_set = set;
        Fid<fid_cntr> n;
        ASSERT_FI_OK(fi_cntr_open(domain, &nattr, n.out(), nullptr));
        fi_eq_attr eattr{};
        eattr.wait_obj = FI_WAIT_SET;
        eattr.wait_set = set;
        Fid<fid_eq> e;
        ASSERT_FI_OK(fi_eq_open(fabric, &eattr, e.out(), nullptr));
        EXPECT_FI_OK(fi_close(&c.release()->fid));
        EXPECT_FI_OK(fi_close(&n.release()->fid));
        EXPECT_FI_OK(fi_close(&e.release()->fid));
    }
    stop_workers();
    EXPECT_TRUE(st.problems.empty()) << problems();
}

}  // namespace
}  // namespace tandem_test
