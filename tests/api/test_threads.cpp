// FI_THREAD_SAFE: several threads post tagged sends and receives on one endpoint pair and
// read the shared CQs concurrently; every completion is counted exactly once.
#include "fabric_fixture.h"

#include <mutex>
#include <set>
#include <type_traits>

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
constexpr size_t kMaxLen = 128 << 10;

size_t msg_len(uint64_t i) {
    return (i % 37 == 5) ? kMaxLen : 64 + (i % 200);
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

}  // namespace
}  // namespace tandem_test
