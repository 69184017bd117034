// A peer process killed with SIGKILL in the middle of transfers: the survivor gets error
// completions (or, where the transfer no longer needs the peer, its operation finishes
// correctly: each test states which, per path), never hangs, never crashes, and keeps talking
// to its other peers.
//
// The peer is this same binary re-executed with --tandem-peer-child, so it starts with a fresh
// libfabric; the two processes exchange endpoint names and MR keys over pipes.
#include "fabric_fixture.h"
#include "tests/common/scoped_env.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <thread>

namespace tandem_test {
namespace {

constexpr size_t kServeLen = 16 << 20;  // RMA region the "serve" child exposes
constexpr uint32_t kServeSeed = 700;

constexpr size_t kChildMsg = 32 << 20;  // message size the "sender" child streams
constexpr uint32_t kChildSeed = 701;
constexpr size_t kEagerMsg = 60 << 10;
constexpr size_t kLargeMsg = 1 << 20;  // what the parent sends a "large_receiver" child
constexpr uint32_t kLargeSeed = 702;
constexpr uint64_t kLargeTag = 0x1a;  // under tandem's eager limit (64 KiB)

struct Hello {
    uint32_t name_len = 0;
    uint8_t name[64] = {};
    uint64_t key = 0;
    uint64_t addr = 0;
};

bool write_all(int fd, const void *p, size_t n) {
    auto *c = static_cast<const uint8_t *>(p);
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w <= 0) return false;
        c += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

bool read_all(int fd, void *p, size_t n, int timeout_ms) {
    auto *c = static_cast<uint8_t *>(p);
    const auto deadline = Clock::now() + Ms(timeout_ms);
    while (n) {
        pollfd pfd{fd, POLLIN, 0};
        int left =
            static_cast<int>(std::chrono::duration_cast<Ms>(deadline - Clock::now()).count());
        if (left <= 0 || poll(&pfd, 1, left) <= 0) return false;
        ssize_t r = read(fd, c, n);
        if (r <= 0) return false;
        c += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

// ---- the child -------------------------------------------------------------------------------

[[noreturn]] void die(const char *what, long ret) {
    std::fprintf(stderr, "peer child: %s failed: %s\n", what, fi_err_str(ret).c_str());
    _exit(2);
}

// "answer_and_exit": kBurst small tagged messages to the parent (unexpected there: they fill
// its inbox ahead of what follows), a byte to say so, then the first message the parent sends
// is received (answered, when the parent asked for FI_DELIVERY_COMPLETE) and the child exits
// at once, as a process whose work is done does.
constexpr int kBurst = 100;
[[noreturn]] void answer_and_exit(fid_ep *ep, fid_cq *cq, fi_addr_t peer, const void *buf,
                                  int wfd) {
    fi_cq_tagged_entry e[8];
    for (int i = 0; i < kBurst; ++i) {
        ssize_t r;
        while ((r = fi_tinject(ep, buf, 64, peer, 0x5eed)) == -FI_EAGAIN) fi_cq_read(cq, e, 8);
        if (r) die("fi_tinject", r);
    }
    uint8_t flag = 1;
    if (!write_all(wfd, &flag, 1)) die("write burst", -FI_EIO);
    for (;;) {
        ssize_t n = fi_cq_read(cq, e, 8);
        for (ssize_t i = 0; i < n; ++i)
            if (e[i].flags & FI_RECV) _exit(0);
        if (n == -FI_EAVAIL) die("the receive", n);
    }
}

[[noreturn]] void child_main(int rfd, int wfd, const std::string &mode) {
    alarm(60);  // never outlive a broken parent for long
    FabricOptions o;
    InfoPtr hints = hints_for(o);
    InfoPtr info;
    // (PEER_CHILD_SERVICE: the port to take, as a server restarted on its port does.)
    int ret =
        getinfo_own("127.0.0.1", std::getenv("PEER_CHILD_SERVICE"), FI_SOURCE, hints.get(), &info);
    if (ret) die("fi_getinfo", ret);
    fid_fabric *fabric;
    fid_domain *domain;
    fid_cq *cq;
    fid_av *av;
    fid_ep *ep;
    if ((ret = fi_fabric(info->fabric_attr, &fabric, nullptr))) die("fi_fabric", ret);
    if ((ret = fi_domain(fabric, info.get(), &domain, nullptr))) die("fi_domain", ret);
    fi_cq_attr cattr{};
    cattr.format = FI_CQ_FORMAT_TAGGED;
    cattr.size = 1024;
    // "sleeper": reads its CQ with fi_cq_sread, asleep (armed) between messages.
    if (mode == "sleeper") cattr.wait_obj = FI_WAIT_UNSPEC;
    if ((ret = fi_cq_open(domain, &cattr, &cq, nullptr))) die("fi_cq_open", ret);
    fi_av_attr aattr{};
    aattr.type = FI_AV_TABLE;
    if ((ret = fi_av_open(domain, &aattr, &av, nullptr))) die("fi_av_open", ret);
    if ((ret = fi_endpoint(domain, info.get(), &ep, nullptr))) die("fi_endpoint", ret);
    if ((ret = fi_ep_bind(ep, &av->fid, 0))) die("bind av", ret);
    if ((ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV))) die("bind cq", ret);
    if ((ret = fi_enable(ep))) die("fi_enable", ret);

    const bool mr_local = info->domain_attr->mr_mode & FI_MR_LOCAL;
    const bool virt = info->domain_attr->mr_mode & FI_MR_VIRT_ADDR;
    const size_t len = mode == "serve" ? kServeLen : kChildMsg;
    AlignedBuf mem(len);
    fill_pattern(mem.data(), len, mode == "serve" ? kServeSeed : kChildSeed);
    fid_mr *mr = nullptr;
    if ((ret = fi_mr_reg(domain, mem.data(), len, kAllAccess, 0, 0x77, 0, &mr, nullptr)))
        die("fi_mr_reg", ret);
    void *desc = mr_local ? fi_mr_desc(mr) : nullptr;
    AlignedBuf rbuf(64 * 1024);
    fid_mr *rmr = nullptr;
    if ((ret = fi_mr_reg(domain, rbuf.data(), rbuf.size(), kAllAccess, 0, 0x78, 0, &rmr, nullptr)))
        die("fi_mr_reg", ret);
    void *rdesc = mr_local ? fi_mr_desc(rmr) : nullptr;

    Hello me;
    size_t nlen = sizeof(me.name);
    if ((ret = fi_getname(&ep->fid, me.name, &nlen))) die("fi_getname", ret);
    me.name_len = static_cast<uint32_t>(nlen);
    me.key = fi_mr_key(mr);
    me.addr = virt ? reinterpret_cast<uintptr_t>(mem.data()) : 0;
    if (!write_all(wfd, &me, sizeof(me))) die("write hello", -FI_EIO);
    Hello parent;
    if (!read_all(rfd, &parent, sizeof(parent), 20000)) die("read hello", -FI_EIO);
    fi_addr_t peer = FI_ADDR_NOTAVAIL;
    if (fi_av_insert(av, parent.name, 1, &peer, 0, nullptr) != 1) die("fi_av_insert", -FI_EINVAL);

    // Receives for anything the parent sends (small messages only).
    std::array<fi_context2, 16> rctx{};
    for (size_t i = 0; i < rctx.size(); ++i)
        fi_recv(ep, rbuf.data() + i * 4096, 4096, rdesc, FI_ADDR_UNSPEC, &rctx[i]);
    fi_context2 sctx{};
    bool sending = false, idle = false;
    // "large_receiver": one tagged receive of kLargeMsg (kLargeTag: apart from the small
    // untagged ones above) into its own buffer, whose completion and contents it reports to
    // the parent (a byte: 1 the pattern is whole, 0 it is not).
    AlignedBuf large(mode == "large_receiver" ? kLargeMsg : 0);
    fi_context2 lctx{};
    if (mode == "large_receiver" &&
        (ret = fi_trecv(ep, large.data(), kLargeMsg, nullptr, FI_ADDR_UNSPEC, kLargeTag, 0, &lctx)))
        die("fi_trecv large", ret);
    uint8_t flag = 1;
    if (!write_all(wfd, &flag, 1)) die("write ready", -FI_EIO);
    if (mode == "answer_and_exit") answer_and_exit(ep, cq, peer, mem.data(), wfd);
    for (;;) {
        if (mode == "idle" && idle) {  // reads nothing more: what arrives stays unread
            pause();
            continue;
        }
        if ((mode == "sender" || mode == "small_sender" || mode == "eager_sender") && !sending) {
            const size_t n = mode == "sender" ? len : mode == "eager_sender" ? kEagerMsg : 64;
            ssize_t r = fi_send(ep, mem.data(), n, desc, peer, &sctx);
            if (r == 0) sending = true;
        }
        fi_cq_tagged_entry e[8];
        ssize_t n = mode == "sleeper" ? fi_cq_sread(cq, e, 8, nullptr, 50) : fi_cq_read(cq, e, 8);
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            fi_cq_readerr(cq, &err, 0);
            if (err.op_context == &sctx) sending = false;
            if (err.op_context == &lctx) {
                std::fprintf(stderr, "peer child: the large receive failed: %s\n",
                             fi_strerror(err.err));
                uint8_t bad = 0;
                if (!write_all(wfd, &bad, 1)) die("write verdict", -FI_EIO);
            }
        }
        for (ssize_t i = 0; i < n; ++i) {
            if (e[i].op_context == &sctx) {
                sending = false;
            } else if (e[i].op_context == &lctx) {
                uint8_t ok = e[i].len == kLargeMsg &&
                             check_pattern(large.data(), kLargeMsg, kLargeSeed) == -1;
                if (!write_all(wfd, &ok, 1)) die("write verdict", -FI_EIO);
            } else if (e[i].flags & FI_RECV) {
                idle = true;  // ("idle": connected now, it reads nothing after this message)
                auto *c = static_cast<fi_context2 *>(e[i].op_context);
                size_t slot = static_cast<size_t>(c - rctx.data());
                fi_recv(ep, rbuf.data() + slot * 4096, 4096, rdesc, FI_ADDR_UNSPEC, c);
            }
        }
        pollfd pfd{rfd, POLLIN, 0};
        if (poll(&pfd, 1, 0) > 0) {
            char c;
            if (read(rfd, &c, 1) <= 0) _exit(0);  // parent went away
        }
    }
}

// ---- the parent ------------------------------------------------------------------------------

std::string g_self;  // path of this executable

class Child {
  public:
    pid_t pid = -1;
    int rfd = -1, wfd = -1;  // parent's ends
    Hello hello;

    ~Child() {
        kill_and_reap();
        if (rfd >= 0) close(rfd);
        if (wfd >= 0) close(wfd);
    }
    // stop_at: a point of tandem's protocol where the child stops itself (common/test_hook.h),
    // to be killed there.
    bool start(const std::string &mode, const std::string &stop_at = "",
               const std::vector<std::string> &env = {}) {
        int to_child[2], to_parent[2];
        if (pipe(to_child) || pipe(to_parent)) return false;
        pid = fork();
        if (pid < 0) return false;
        if (pid == 0) {
            close(to_child[1]);
            close(to_parent[0]);
            const std::string fds =
                std::to_string(to_child[0]) + "," + std::to_string(to_parent[1]);
            if (!stop_at.empty()) setenv("TANDEM_TEST_STOP_AT", stop_at.c_str(), 1);
            for (const std::string &kv : env) putenv(const_cast<char *>(kv.c_str()));
            execl(g_self.c_str(), g_self.c_str(), "--tandem-peer-child", fds.c_str(), mode.c_str(),
                  static_cast<char *>(nullptr));
            _exit(127);
        }
        close(to_child[0]);
        close(to_parent[1]);
        wfd = to_child[1];
        rfd = to_parent[0];
        return true;
    }
    // Waits (driving the parent's progress) until the child has stopped at its point.
    bool wait_stopped(const std::function<void()> &progress, Ms timeout) {
        const auto deadline = Clock::now() + timeout;
        while (Clock::now() < deadline) {
            int status = 0;
            pid_t r = waitpid(pid, &status, WNOHANG | WUNTRACED);
            if (r == pid && WIFSTOPPED(status)) return true;
            if (r == pid) {
                pid = -1;  // it ended instead
                return false;
            }
            progress();
        }
        return false;
    }
    void kill_and_reap() {
        if (pid > 0) {
            kill(pid, SIGKILL);
            int status = 0;
            waitpid(pid, &status, 0);
            pid = -1;
        }
    }
};

class PeerDeathTest : public FabricTest {
  protected:
    Child child;
    fi_addr_t dead = FI_ADDR_NOTAVAIL;

    // Whether the peers meet over a link (FI_TANDEM_LOCAL=0: the api_net and api_verbs
    // variants) rather than through off_tandem's shared memory (api).
    static bool over_link() {
        const char *local = std::getenv("FI_TANDEM_LOCAL");
        return local && std::string(local) == "0";
    }

    // Starts the child, swaps names with a, inserts the child into a's AV.
    void start_child(const std::string &mode, const std::string &stop_at = "",
                     const std::vector<std::string> &env = {}) {
        ASSERT_TRUE(child.start(mode, stop_at, env));
        ASSERT_TRUE(read_all(child.rfd, &child.hello, sizeof(child.hello), 20000))
            << "the child did not report its address";
        Hello me;
        ASSERT_LE(a().name.size(), sizeof(me.name));
        me.name_len = static_cast<uint32_t>(a().name.size());
        std::memcpy(me.name, a().name.data(), a().name.size());
        ASSERT_TRUE(write_all(child.wfd, &me, sizeof(me)));
        uint8_t ready = 0;
        ASSERT_TRUE(read_all(child.rfd, &ready, 1, 20000)) << "the child did not get ready";
        ASSERT_FI_RET(fi_av_insert(a().av, child.hello.name, 1, &dead, 0, nullptr), 1);
    }

    // Kills the child once it stopped at its point (within 20 s).
    void kill_when_stopped(const char *point) {
        ASSERT_TRUE(child.wait_stopped([&] { progress(); }, 20s))
            << "the child never reached " << point << ": " << a().log.summary();
        child.kill_and_reap();
    }

    // len bytes of buf to the child, completing at its answer (FI_DELIVERY_COMPLETE).
    ssize_t send_delivery_complete(DataBuf &buf, size_t len, void *context) {
        iovec iov{buf.data(), len};
        void *desc = buf.desc;
        fi_msg m{};
        m.msg_iov = &iov;
        m.desc = &desc;
        m.iov_count = 1;
        m.addr = dead;
        m.context = context;
        return fi_sendmsg(a().ep, &m, FI_DELIVERY_COMPLETE | FI_COMPLETION);
    }

    void check_survivor_works(uint32_t seed) {
        a().log.clear();
        b().log.clear();
        auto s = buf(1 << 20), r = buf(1 << 20);
        fill_pattern(s->data(), 1 << 20, seed);
        ASSERT_FI_OK(post([&] {
            return fi_recv(b().ep, r->data(), 1 << 20, r->desc, FI_ADDR_UNSPEC, ctx(200));
        }));
        ASSERT_FI_OK(post(
            [&] { return fi_send(a().ep, s->data(), 1 << 20, s->desc, a().peer[1], ctx(201)); }));
        ASSERT_TRUE(wait_comp(b(), ctx(200))) << "survivor cannot talk to b: " << b().log.summary();
        ASSERT_TRUE(wait_comp(a(), ctx(201))) << a().log.summary();
        EXPECT_EQ(check_pattern(r->data(), 1 << 20, seed), -1);
    }
};

TEST_F(PeerDeathTest, ReadsFromKilledPeerFail) {
    ASSERT_NO_FATAL_FAILURE(start_child("serve"));
    constexpr size_t kRead = 4 << 20;
    constexpr size_t kSlots = 4;
    std::vector<std::unique_ptr<DataBuf>> bufs;
    for (size_t i = 0; i < kSlots; ++i) bufs.push_back(buf(kRead));
    std::vector<bool> busy(kSlots, false), after_death(kSlots, false);
    size_t ok_before = 0, ok_after_death = 0, next = 0, errs_seen = 0;
    bool killed = false;
    void *last_ctx = nullptr;
    auto post_read = [&](size_t slot) -> ssize_t {
        // Each read gets a fresh context so late completions cannot be confused.
        void *c = ctx(slot + kSlots * (next++ % 60));
        const uint64_t off = (next * 4096) % (kServeLen - kRead);
        ssize_t ret = post(
            [&] {
                return fi_read(a().ep, bufs[slot]->data(), kRead, bufs[slot]->desc, dead,
                               child.hello.addr + off, child.hello.key, c);
            },
            2s);
        if (ret == 0) {
            busy[slot] = true;
            after_death[slot] = killed;
            last_ctx = c;
        }
        return ret;
    };
    auto slot_of = [&](void *c) {
        return static_cast<size_t>(static_cast<fi_context2 *>(c) - &ctxs_[0]) % kSlots;
    };
    auto any_busy = [&] { return std::find(busy.begin(), busy.end(), true) != busy.end(); };
    for (size_t s = 0; s < kSlots; ++s) ASSERT_FI_OK(post_read(s));
    // Reads keep the peer busy until three completed. Then it is killed with the others in
    // flight, and exactly one more read is posted at once, before this process made progress
    // that could notice the death: each of them is on the connection the death resets. (A
    // read posted after the link noticed connects again and is refused, checked below.)
    const auto deadline = Clock::now() + 20s;
    while (Clock::now() < deadline && (!killed || any_busy())) {
        progress();
        // post_read() drives progress too: work on a snapshot of what arrived so far.
        std::vector<Completion> comps;
        comps.swap(a().log.comps);
        for (; errs_seen < a().log.errs.size(); ++errs_seen)
            busy[slot_of(a().log.errs[errs_seen].e.op_context)] = false;
        for (auto &c : comps) {
            size_t slot = slot_of(c.op_context);
            busy[slot] = false;
            if (after_death[slot])
                ++ok_after_death;
            else if (!killed)
                ++ok_before;
            if (killed) continue;
            if (ok_before >= 3) {
                child.kill_and_reap();  // SIGKILL while reads are in flight
                killed = true;
            }
            ASSERT_FI_OK(post_read(slot));
        }
    }
    EXPECT_GE(ok_before, 3u) << "reads from the live peer did not work";
    ASSERT_TRUE(killed);
    ASSERT_FALSE(any_busy()) << "reads in flight at the death never completed: "
                             << a().log.summary();
    // The read posted after the death cannot succeed, so there is at least its error; each
    // read that fails does so with FI_ECONNRESET (its connection or the peer's segment is
    // gone).
    EXPECT_EQ(ok_after_death, 0u) << "a read posted after the peer's death completed";
    ASSERT_TRUE(a().log.find_err(last_ctx)) << "the read posted after the death did not fail";
    for (auto &e : a().log.errs)
        EXPECT_EQ(e.e.err, FI_ECONNRESET) << "a read failed with " << fi_strerror(e.e.err);
    // A read posted once the death was noticed is taken and fails as a send does: over a link
    // its new connection is refused; node-local the segment belongs to a dead process.
    a().log.clear();
    ASSERT_FI_OK(post_read(0));
    auto err = wait_err(a(), last_ctx);
    ASSERT_TRUE(err) << a().log.summary();
    EXPECT_EQ(err->e.err, over_link() ? FI_ECONNREFUSED : FI_ECONNRESET) << fi_strerror(err->e.err);
    ASSERT_NO_FATAL_FAILURE(check_survivor_works(710));
}

TEST_F(PeerDeathTest, SendToKilledPeerFails) {
    ASSERT_NO_FATAL_FAILURE(start_child("serve"));
    auto small = buf(64), big = buf(1 << 20);
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, small->data(), 64, small->desc, dead, ctx(0)); }));
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << "send to the live child failed: " << a().log.summary();
    child.kill_and_reap();
    // Long enough for the death to be noticed: the link's connection reset (or the
    // node-local path's check of the peer's process).
    poll_for(1s);
    // Both sends are taken and fail with an error completion. Over a link the connection is
    // gone and a new one is refused (nobody listens): FI_ECONNREFUSED. Node-local, the peer's
    // segment belongs to a dead process: FI_ECONNRESET.
    const int expected = over_link() ? FI_ECONNREFUSED : FI_ECONNRESET;
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, big->data(), 1 << 20, big->desc, dead, ctx(1)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, small->data(), 64, small->desc, dead, ctx(2)); }));
    for (int i : {1, 2}) {
        auto err = wait_err(a(), ctx(i), 15s);
        ASSERT_TRUE(err) << (i == 1 ? "1 MiB" : "64 B")
                         << " send to a dead peer: no error within 15 s (" << a().log.summary()
                         << ")";
        EXPECT_EQ(err->e.err, expected) << "got " << fi_strerror(err->e.err);
        EXPECT_FALSE(a().log.has(ctx(i))) << "a send to a dead peer completed successfully";
    }
    ASSERT_NO_FATAL_FAILURE(check_survivor_works(711));
}

// A node-local peer dies and a new process takes its address (a server restarted on its
// port). The survivor, which found the first one dead, reaches the new one both ways: a
// message it reads out of the new process's memory (an Rts of 32 MiB: its sender is checked
// against the process the address leads to now), and a send the new process answers
// (FI_DELIVERY_COMPLETE).
TEST_F(PeerDeathTest, ANewProcessAtADeadPeersAddressIsReachedAgain) {
    if (over_link()) GTEST_SKIP() << "node-local peers (a link connects to whoever listens)";
    int s = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(s, 0);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t slen = sizeof sin;
    ASSERT_EQ(bind(s, reinterpret_cast<sockaddr *>(&sin), sizeof sin), 0);
    ASSERT_EQ(getsockname(s, reinterpret_cast<sockaddr *>(&sin), &slen), 0);
    close(s);
    const std::string service = "PEER_CHILD_SERVICE=" + std::to_string(ntohs(sin.sin_port));
    ASSERT_NO_FATAL_FAILURE(start_child("idle", "", {service}));
    auto small = buf(64);
    ASSERT_FI_OK(send_delivery_complete(*small, 64, ctx(0)));
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << "send to the first child failed: " << a().log.summary();
    child.kill_and_reap();
    ASSERT_FI_OK(send_delivery_complete(*small, 64, ctx(1)));
    auto err = wait_err(a(), ctx(1), 15s);
    ASSERT_TRUE(err) << "a send to the dead child did not fail: " << a().log.summary();
    ASSERT_EQ(err->e.err, FI_ECONNRESET) << "got " << fi_strerror(err->e.err);

    const fi_addr_t first = dead;  // (the address, as the AV gave it before the restart)
    Child again;
    std::swap(child.pid, again.pid);  // (the first one's pipes close with `again`)
    std::swap(child.rfd, again.rfd);
    std::swap(child.wfd, again.wfd);
    ASSERT_NO_FATAL_FAILURE(start_child("sender", "", {service}));
    auto r = buf(kChildMsg);
    ASSERT_FI_OK(post(
        [&] { return fi_recv(a().ep, r->data(), kChildMsg, r->desc, FI_ADDR_UNSPEC, ctx(2)); }));
    auto c = wait_comp(a(), ctx(2), 20s);
    ASSERT_TRUE(c) << "no message from the new process: " << a().log.summary();
    EXPECT_EQ(c->len, kChildMsg);
    EXPECT_EQ(check_pattern(r->data(), kChildMsg, kChildSeed), -1);
    ASSERT_FI_OK(send_delivery_complete(*small, 64, ctx(3)));
    EXPECT_TRUE(wait_comp(a(), ctx(3), 15s))
        << "a send to the new process did not complete: " << a().log.summary();
    // A small message to the address as inserted before the restart (the peer whose ring the
    // first process's death closed): into the new process's ring.
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, small->data(), 64, small->desc, first, ctx(4)); }));
    EXPECT_TRUE(wait_comp(a(), ctx(4), 15s))
        << "a small send to the restarted address did not complete: " << a().log.summary();
}

TEST_F(PeerDeathTest, KilledSenderLeavesReceiverUsable) {
    std::vector<std::unique_ptr<DataBuf>> r;
    for (int i = 0; i < 2; ++i) r.push_back(buf(kChildMsg));
    if (!over_link()) {
        // Node-local, a 32 MiB message is copied by both sides: the receiver reads the first
        // half out of the sender's memory and asks the sender (Cts) to write the second. The
        // sender claims that half, stops there, and is killed: mid rendezvous, in every run
        // (TANDEM_TEST_SPLIT_WAIT: this receiver waits for the sender's claim rather than
        // take the half back first, which SenderWithoutACoreDoesNotHoldTheReceive covers).
        // The receive fails with FI_ECONNRESET once the death is noticed (the peers' liveness
        // is checked every 200 ms).
        ScopedEnv wait("TANDEM_TEST_SPLIT_WAIT", "1");
        ASSERT_NO_FATAL_FAILURE(start_child("sender", "local.cts_claimed"));
        ASSERT_FI_OK(post([&] {
            return fi_recv(a().ep, r[0]->data(), kChildMsg, r[0]->desc, FI_ADDR_UNSPEC, ctx(0));
        }));
        ASSERT_NO_FATAL_FAILURE(kill_when_stopped("local.cts_claimed"));
        auto err = wait_err(a(), ctx(0), 5s);
        ASSERT_TRUE(err) << "the receive whose sender died mid copy did not fail within 5 s: "
                         << a().log.summary();
        EXPECT_EQ(err->e.err, FI_ECONNRESET) << "got " << fi_strerror(err->e.err);
        EXPECT_FALSE(a().log.has(ctx(0))) << "a half-copied message reported as received";
        ASSERT_NO_FATAL_FAILURE(check_survivor_works(712));
        return;
    }
    ASSERT_NO_FATAL_FAILURE(start_child("sender"));
    ASSERT_FI_OK(post([&] {
        return fi_recv(a().ep, r[0]->data(), kChildMsg, r[0]->desc, FI_ADDR_UNSPEC, ctx(0));
    }));
    auto first = wait_comp(a(), ctx(0), 20s);
    ASSERT_TRUE(first) << "no message from the child: " << a().log.summary();
    EXPECT_EQ(first->len, kChildMsg);
    EXPECT_EQ(check_pattern(r[0]->data(), kChildMsg, kChildSeed), -1);
    // The child streams one message after another; kill it in the middle of one.
    // Over a link the receiver reads the message from the sender (a rendezvous), which needs the
    // sender alive: killed once the first bytes have landed, with the rest still to come, the
    // receive fails with FI_ECONNRESET. (The emulated RDMA device places a READ's response as
    // it arrives, as a NIC does.) A loaded machine can keep us off the core until the whole
    // message is in: that one is not the case under test, and the next is tried (the first
    // 32 MiB message whose first byte we see before its end, of at most 8).
    size_t at = 1;
    for (;; ++at) {
        ASSERT_LE(at, 8u) << "every message arrived whole before its first byte was seen";
        std::memset(r[1]->data(), 0, kChildMsg);
        ASSERT_FI_OK(post([&] {
            return fi_recv(a().ep, r[1]->data(), kChildMsg, r[1]->desc, FI_ADDR_UNSPEC, ctx(at));
        }));
        ASSERT_TRUE(poll_until([&] { return r[1]->data()[0] != 0 || a().log.has(ctx(at)); }, 20s))
            << "no byte of message " << at + 1 << " arrived";
        if (!a().log.has(ctx(at))) break;
    }
    child.kill_and_reap();
    auto err = wait_err(a(), ctx(at), 15s);
    ASSERT_TRUE(err) << "the receive interrupted by the sender's death did not fail: "
                     << a().log.summary();
    EXPECT_EQ(err->e.err, FI_ECONNRESET) << "got " << fi_strerror(err->e.err);
    EXPECT_FALSE(a().log.has(ctx(at))) << "a partial message reported as received";
    ASSERT_NO_FATAL_FAILURE(check_survivor_works(712));
}

// Node-local without single copy (FI_OFF_TANDEM_CMA=0 in the sender), a large message is
// staged through the receiver's ring, and the receive that took it at its first fragment gets
// each fragment as it comes. The sender stops once its first cells are in our ring (the rest
// waiting in its backlog), and is killed there once we have read the first of them: the
// receive fails with FI_ECONNRESET when the death is noticed, as a link's rendezvous does,
// and is never reported as received. (A sender that dies before we read its first fragment
// leaves only a reassembly behind, which no receive waits on.)
TEST_F(PeerDeathTest, KilledStagingSenderFailsTheReceiveThatTookItsMessage) {
    if (over_link()) GTEST_SKIP() << "a node-local staged message (a link reads the message)";
    auto r = buf(kChildMsg);
    std::memset(r->data(), 0, kChildMsg);
    ASSERT_FI_OK(post(
        [&] { return fi_recv(a().ep, r->data(), kChildMsg, r->desc, FI_ADDR_UNSPEC, ctx(0)); }));
    ASSERT_NO_FATAL_FAILURE(
        start_child("sender", "local.stream_backlogged", {"FI_OFF_TANDEM_CMA=0"}));
    ASSERT_TRUE(child.wait_stopped([&] { progress(); }, 20s))
        << "the child never stopped with part of its message sent: " << a().log.summary();
    // The fragments it sent are read (into the receive) while it lives: the channel then
    // knows its process, and hears of its death.
    ASSERT_TRUE(poll_until([&] { return r->data()[0] != 0 || a().log.has(ctx(0)); }, 20s))
        << "no byte of the message reached the receive";
    child.kill_and_reap();
    auto err = wait_err(a(), ctx(0), 15s);
    ASSERT_TRUE(err) << "the receive interrupted by the sender's death did not fail: "
                     << a().log.summary();
    EXPECT_EQ(err->e.err, FI_ECONNRESET) << "got " << fi_strerror(err->e.err);
    EXPECT_FALSE(a().log.has(ctx(0))) << "a partial message reported as received";
    ASSERT_NO_FATAL_FAILURE(check_survivor_works(713));
}

// Death at chosen points of the protocol: the child stops itself there (common/test_hook.h) and
// is killed. Each survivor outcome within a bound, one per path.

// Node-local: the receiver stops as it is about to copy a message out of the sender's memory
// (its Cts not sent, nothing copied), and dies there. The sender, waiting for its Fin, fails
// the send with FI_ECONNRESET when the death is noticed.

// A large node-local message must not wait for a sender that has no core. The sender stops
// (SIGSTOP, as the scheduler would leave it) when the receiver's Cts reaches it, before it
// claims its half: the receiver, its own half read, takes the other half back and completes
// the whole message alone. When the sender runs again it finds the half taken and writes
// nothing: the buffer, cleared after the completion, stays clear.
TEST_F(PeerDeathTest, SenderWithoutACoreDoesNotHoldTheReceive) {
    if (over_link()) GTEST_SKIP() << "a node-local split copy (a link reads the whole message)";
    auto r = buf(kChildMsg);
    ASSERT_NO_FATAL_FAILURE(start_child("sender", "local.cts_arrived"));
    ASSERT_FI_OK(post(
        [&] { return fi_recv(a().ep, r->data(), kChildMsg, r->desc, FI_ADDR_UNSPEC, ctx(0)); }));
    auto c = wait_comp(a(), ctx(0), 5s);
    ASSERT_TRUE(c) << "the receive waited for a sender without a core: " << a().log.summary();
    EXPECT_EQ(c->len, kChildMsg);
    EXPECT_EQ(check_pattern(r->data(), kChildMsg, kChildSeed), -1);
    ASSERT_TRUE(child.wait_stopped([&] { progress(); }, 20s)) << "the child never got the Cts";
    std::memset(r->data(), 0, kChildMsg);
    ASSERT_EQ(kill(child.pid, SIGCONT), 0);
    // The child's send completes with our Fin, and it sends its next message, which finds no
    // receive (unexpected): nothing more may land in r.
    const auto until = Clock::now() + 300ms;
    while (Clock::now() < until) progress();
    std::vector<uint8_t> zero(4096, 0);
    for (size_t at = 0; at < kChildMsg; at += zero.size())
        ASSERT_EQ(std::memcmp(r->data() + at, zero.data(), zero.size()), 0)
            << "the sender wrote into a receive that had completed, at byte " << at;
    child.kill_and_reap();
    ASSERT_NO_FATAL_FAILURE(check_survivor_works(713));
}

// The other way round: a large node-local send to a receiver that has no core (stopped, as
// the scheduler leaves a process when processes outnumber cores) completes without it, the
// message staged through the receiver's ring; the receiver, running again, gets it whole.
TEST_F(PeerDeathTest, LargeSendToAReceiverWithoutACoreCompletes) {
    if (over_link()) GTEST_SKIP() << "a node-local choice (a link sends what its socket takes)";
    auto s = buf(kLargeMsg);
    fill_pattern(s->data(), kLargeMsg, kLargeSeed);
    ASSERT_NO_FATAL_FAILURE(start_child("large_receiver"));
    ASSERT_EQ(kill(child.pid, SIGSTOP), 0);
    int status = 0;
    ASSERT_EQ(waitpid(child.pid, &status, WUNTRACED), child.pid);
    ASSERT_TRUE(WIFSTOPPED(status));
    std::this_thread::sleep_for(50ms);  // long enough for its heartbeat to look stale
    ASSERT_FI_OK(post(
        [&] { return fi_tsend(a().ep, s->data(), kLargeMsg, s->desc, dead, kLargeTag, ctx(0)); }));
    auto c = wait_comp(a(), ctx(0), 2s);
    ASSERT_TRUE(c) << "the send waited for a receiver without a core: " << a().log.summary();
    ASSERT_EQ(kill(child.pid, SIGCONT), 0);
    uint8_t ok = 0;
    ASSERT_TRUE(read_all(child.rfd, &ok, 1, 20000)) << "the child did not report its receive";
    EXPECT_EQ(ok, 1) << "the child's receive was not the message, whole";
}

// (4 MiB, more than the receiver's ring of 256 cells holds: a message that fits the room left
// in it goes staged when the receiver's heartbeat looks stale, which under load it can, and
// then the receiver never comes to its copy.)
TEST_F(PeerDeathTest, ReceiverKilledBeforeItsCopyFailsTheSend) {
    if (over_link()) GTEST_SKIP() << "cross-memory attach is the node-local path's";
    ASSERT_NO_FATAL_FAILURE(start_child("serve", "local.before_cma_read"));
    constexpr size_t kBeyondTheRing = 4 << 20;
    auto big = buf(kBeyondTheRing);
    ASSERT_FI_OK(post(
        [&] { return fi_send(a().ep, big->data(), kBeyondTheRing, big->desc, dead, ctx(0)); }));
    ASSERT_NO_FATAL_FAILURE(kill_when_stopped("local.before_cma_read"));
    auto err = wait_err(a(), ctx(0), 5s);
    ASSERT_TRUE(err) << "the send to a receiver that died mid copy did not fail within 5 s: "
                     << a().log.summary();
    EXPECT_EQ(err->e.err, FI_ECONNRESET) << "got " << fi_strerror(err->e.err);
    ASSERT_NO_FATAL_FAILURE(check_survivor_works(713));
}

// A receiver that answers and exits at once (its work done) has not failed the sender: its
// answer is in our inbox before its death, though perhaps behind more cells than one progress
// pass reads. Node-local: the child fills our inbox with 100 small messages, then receives our
// FI_DELIVERY_COMPLETE send, answers it (Fin) and exits; we make no progress until it is gone,
// and then the first pass reads 64 cells, none of them the Fin, and checks the peers, whose
// liveness check finds the child dead. The send completes, without an error.
TEST_F(PeerDeathTest, ReceiverThatAnsweredAndExitedDoesNotFailTheSend) {
    if (over_link()) GTEST_SKIP() << "node-local: a link moves nothing while we make no progress";
    ASSERT_NO_FATAL_FAILURE(start_child("answer_and_exit"));
    uint8_t burst = 0;
    ASSERT_TRUE(read_all(child.rfd, &burst, 1, 20000)) << "the child did not send its burst";
    auto s = buf(64);
    ASSERT_FI_OK(send_delivery_complete(*s, 64, ctx(0)));
    int status = 0;
    const auto until = Clock::now() + 20s;
    pid_t r = 0;
    while ((r = waitpid(child.pid, &status, WNOHANG)) == 0 && Clock::now() < until)
        std::this_thread::sleep_for(5ms);
    ASSERT_EQ(r, child.pid) << "the child did not exit";
    child.pid = -1;
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child failed: " << status;
    // (wait_comp gives a completion, not an error: a send failed with FI_ECONNRESET fails here.)
    ASSERT_TRUE(wait_comp(a(), ctx(0), 5s))
        << "the send failed or never completed, though it was answered: " << a().log.summary();
}

// Node-local: a sender dies holding a cell of our inbox it claimed and never published. The
// cells other peers publish behind it are consumed all the same once the claimant is found
// dead (within 5 s), so b's message reaches a.
TEST_F(PeerDeathTest, PeerKilledHoldingARingCellBlocksNobody) {
    if (over_link()) GTEST_SKIP() << "the inbox ring is the node-local path's";
    ASSERT_NO_FATAL_FAILURE(start_child("small_sender", "local.ring_reserved"));
    ASSERT_NO_FATAL_FAILURE(kill_when_stopped("local.ring_reserved"));
    auto s = buf(256), r = buf(256);
    fill_pattern(s->data(), 256, 714);
    ASSERT_FI_OK(post([&] {
        return fi_trecv(a().ep, r->data(), 256, r->desc, FI_ADDR_UNSPEC, 0x714, 0, ctx(0));
    }));
    ASSERT_FI_OK(post(
        [&] { return fi_tsend(b().ep, s->data(), 256, s->desc, b().peer[0], 0x714, ctx(1)); }));
    ASSERT_TRUE(wait_comp(a(), ctx(0), 5s))
        << "a message published behind the dead peer's cell never arrived: " << a().log.summary();
    EXPECT_EQ(check_pattern(r->data(), 256, 714), -1);
}

// TCP link: the peer dies having read our connection request and not answered it. The send
// that opened the connection fails with FI_ECONNREFUSED (the connection never came up).
TEST_F(PeerDeathTest, PeerKilledDuringConnectionSetUpFailsTheSend) {
    if (!over_link() || on_verbs_link()) GTEST_SKIP() << "the TCP link's connection set-up";
    ASSERT_NO_FATAL_FAILURE(start_child("serve", "link.request_received"));
    auto small = buf(64);
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, small->data(), 64, small->desc, dead, ctx(0)); }));
    ASSERT_NO_FATAL_FAILURE(kill_when_stopped("link.request_received"));
    auto err = wait_err(a(), ctx(0), 5s);
    ASSERT_TRUE(err) << "a send whose connection's listener died did not fail within 5 s: "
                     << a().log.summary();
    EXPECT_EQ(err->e.err, FI_ECONNREFUSED) << "got " << fi_strerror(err->e.err);
    ASSERT_NO_FATAL_FAILURE(check_survivor_works(715));
}

// TCP link: the target dies having read an RDMA read request and not answered it. The read
// fails with FI_ECONNRESET.
TEST_F(PeerDeathTest, TargetKilledOnAReadRequestFailsTheRead) {
    if (!over_link() || on_verbs_link()) GTEST_SKIP() << "the TCP link serves reads in software";
    ASSERT_NO_FATAL_FAILURE(start_child("serve", "link.read_requested"));
    auto dst = buf(1 << 20);
    ASSERT_FI_OK(post([&] {
        return fi_read(a().ep, dst->data(), 1 << 20, dst->desc, dead, child.hello.addr,
                       child.hello.key, ctx(0));
    }));
    ASSERT_NO_FATAL_FAILURE(kill_when_stopped("link.read_requested"));
    auto err = wait_err(a(), ctx(0), 5s);
    ASSERT_TRUE(err) << "a read whose target died did not fail within 5 s: " << a().log.summary();
    EXPECT_EQ(err->e.err, FI_ECONNRESET) << "got " << fi_strerror(err->e.err);
    ASSERT_NO_FATAL_FAILURE(check_survivor_works(716));
}

// TCP link: the target dies having read an RDMA write's header and none of its data. The
// write fails with FI_ECONNRESET.
TEST_F(PeerDeathTest, TargetKilledOnAWriteFailsTheWrite) {
    if (!over_link() || on_verbs_link()) GTEST_SKIP() << "the TCP link places writes in software";
    ASSERT_NO_FATAL_FAILURE(start_child("serve", "link.write_received"));
    auto src = buf(1 << 20);
    ASSERT_FI_OK(post([&] {
        return fi_write(a().ep, src->data(), 1 << 20, src->desc, dead, child.hello.addr,
                        child.hello.key, ctx(0));
    }));
    ASSERT_NO_FATAL_FAILURE(kill_when_stopped("link.write_received"));
    auto err = wait_err(a(), ctx(0), 5s);
    ASSERT_TRUE(err) << "a write whose target died did not fail within 5 s: " << a().log.summary();
    EXPECT_EQ(err->e.err, FI_ECONNRESET) << "got " << fi_strerror(err->e.err);
    ASSERT_NO_FATAL_FAILURE(check_survivor_works(717));
}

// TCP link: the sender of an eager message dies with part of its frame on the wire (a 4 KiB
// socket buffer makes the 60 KiB frame leave in pieces). Nothing of it is delivered: the
// receive it would have taken stays posted, and takes b's message next, whole.
TEST_F(PeerDeathTest, SenderKilledMidEagerFrameDeliversNothing) {
    if (!over_link() || on_verbs_link()) GTEST_SKIP() << "the TCP link's frames";
    ASSERT_NO_FATAL_FAILURE(
        start_child("eager_sender", "link.frame_partly_sent", {"FI_TANDEM_SOCKET_BUFFER=4096"}));
    auto r = buf(kEagerMsg), s = buf(kEagerMsg);
    ASSERT_FI_OK(post(
        [&] { return fi_recv(a().ep, r->data(), kEagerMsg, r->desc, FI_ADDR_UNSPEC, ctx(0)); }));
    ASSERT_NO_FATAL_FAILURE(kill_when_stopped("link.frame_partly_sent"));
    poll_for(500ms);
    ASSERT_FALSE(a().log.has(ctx(0)) || a().log.has_err(ctx(0)))
        << "the receive ended when its sender died mid frame: " << a().log.summary();
    fill_pattern(s->data(), kEagerMsg, 718);
    ASSERT_FI_OK(
        post([&] { return fi_send(b().ep, s->data(), kEagerMsg, s->desc, b().peer[0], ctx(1)); }));
    auto c = wait_comp(a(), ctx(0), 5s);
    ASSERT_TRUE(c) << a().log.summary();
    EXPECT_EQ(c->len, kEagerMsg);
    EXPECT_EQ(check_pattern(r->data(), kEagerMsg, 718), -1) << "the receive holds other bytes";
}

// A peer that never read what it was sent (its completions, and on a link its socket, hold
// them) dies: sends to it afterwards fail as they do to any dead peer, and the survivor's
// other peers are unaffected.
TEST_F(PeerDeathTest, PeerKilledWithCompletionsUnreadLeavesTheSurvivorWorking) {
    ASSERT_NO_FATAL_FAILURE(start_child("idle"));
    auto small = buf(64);
    // The first message connects them (over a link the child's progress accepts the
    // connection); the child reads nothing after it.
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, small->data(), 64, small->desc, dead, ctx(20)); }));
    ASSERT_TRUE(wait_comp(a(), ctx(20))) << a().log.summary();
    poll_for(100ms);
    for (int i = 0; i < 8; ++i)
        ASSERT_FI_OK(
            post([&] { return fi_send(a().ep, small->data(), 64, small->desc, dead, ctx(i)); }));
    for (int i = 0; i < 8; ++i)
        ASSERT_TRUE(wait_comp(a(), ctx(i))) << "send " << i << ": " << a().log.summary();
    child.kill_and_reap();
    // Over a link the dead peer's socket says so at once; node-locally its death is noticed by
    // the liveness check (every 200 ms of passes, docs/architecture.md), and an eager send
    // written into its ring before then completes, as into any ring. So sends go out one at a
    // time until one fails: that one must fail as sends to a dead peer do.
    const int expected = over_link() ? FI_ECONNREFUSED : FI_ECONNRESET;
    std::optional<CqError> err;
    int sent = 0;  // (contexts 300 to 499: 100 ms apart, 150 at most)
    for (const auto deadline = Clock::now() + 15s; !err && Clock::now() < deadline; ++sent) {
        void *c = ctx(300 + size_t(sent));
        ASSERT_FI_OK(
            post([&] { return fi_send(a().ep, small->data(), 64, small->desc, dead, c); }));
        err = wait_err(a(), c, 1s);
        if (err) break;
        ASSERT_TRUE(a().log.has(c)) << "a send neither completed nor failed";
        poll_for(100ms);
    }
    ASSERT_TRUE(err) << "no send to the dead peer failed in 15 s (" << sent
                     << " sent): " << a().log.summary();
    EXPECT_EQ(err->e.err, expected) << "got " << fi_strerror(err->e.err);
    ASSERT_NO_FATAL_FAILURE(check_survivor_works(719));
}

// A node-local peer asleep in fi_cq_sread has asked its senders to wake it (its ring's sleep
// flag; the wake is a byte into its FIFO). Killed so, the first send after its death takes
// that flag: the wake must not raise SIGPIPE in the sender (a process whose handler is the
// default dies of it), and the survivor goes on as with any dead peer.
TEST_F(PeerDeathTest, PeerKilledAsleepInItsReadDoesNotKillTheSender) {
    ASSERT_NO_FATAL_FAILURE(start_child("sleeper"));
    auto small = buf(64);
    for (int i = 0; i < 4; ++i) {
        ASSERT_FI_OK(
            post([&] { return fi_send(a().ep, small->data(), 64, small->desc, dead, ctx(i)); }));
        ASSERT_TRUE(wait_comp(a(), ctx(i))) << a().log.summary();
    }
    std::this_thread::sleep_for(200ms);  // the child back asleep in its read, armed
    child.kill_and_reap();
    for (int i = 0; i < 4; ++i)
        ASSERT_FI_OK(post(
            [&] { return fi_send(a().ep, small->data(), 64, small->desc, dead, ctx(10 + i)); }));
    // Each send either completed (written into the dead peer's ring before its death was
    // noticed) or failed as sends to a dead peer do: what matters is that this process lives.
    for (int i = 0; i < 4; ++i) {
        auto err = wait_err(a(), ctx(10 + i));
        ASSERT_TRUE(a().log.has(ctx(10 + i)) || err) << a().log.summary();
    }
    ASSERT_NO_FATAL_FAILURE(check_survivor_works(721));
}

// The parent's CQ can be slept on (FI_WAIT_FD), so the test can wait for the dead peer's reset
// to reach the socket without driving progress; endpoint a counts its writes.
class PeerDeathWaitTest : public PeerDeathTest {
  protected:
    void configure(FabricOptions &o) override { o.cq_wait = FI_WAIT_FD; }
    // Kills the child 300 ms into a sleep on a's CQ descriptor (FI_GETWAIT, fi_trywait, poll)
    // and sleeps until an entry can be read, 10 s at most: fi_cq_read's answer then (-FI_EAGAIN
    // when the sleep ran out). (Not fi_cq_sread: it wakes every 100 ms by itself.)
    ssize_t sleep_through_death() {
        int fd = -1;
        if (fi_control(&a().cq->fid, FI_GETWAIT, &fd)) return -FI_EOTHER;
        std::thread killer([&] {
            std::this_thread::sleep_for(300ms);
            child.kill_and_reap();
        });
        const auto deadline = Clock::now() + 10s;
        ssize_t n = -FI_EAGAIN;
        fid *fids[] = {&a().cq->fid};
        while (Clock::now() < deadline) {
            fi_cq_tagged_entry e{};
            if (fi_trywait(fabric, fids, 1) == FI_SUCCESS) {
                pollfd pfd{fd, POLLIN, 0};
                const auto left = std::chrono::duration_cast<Ms>(deadline - Clock::now()).count();
                if (::poll(&pfd, 1, int(std::max<int64_t>(left, 0))) == 0) break;
            }
            n = fi_cq_read(a().cq, &e, 1);
            if (n != -FI_EAGAIN) break;
        }
        killer.join();
        return n;
    }
    void before_enable(Endpoint &e, size_t index) override {
        if (index != 0) return;
        ASSERT_NO_FATAL_FAILURE(open_cntr(e.write_cntr));
        ASSERT_FI_OK(fi_ep_bind(e.ep, &e.write_cntr->fid, FI_WRITE));
    }
};

// An application asleep on its CQ's descriptor (FI_GETWAIT, fi_trywait, poll) while its send
// waits for a node-local receiver's answer (FI_DELIVERY_COMPLETE) wakes and reads the send's
// error when the receiver dies: a dead process writes nothing to wake it, so the descriptor
// becomes readable when the next liveness check of the peers that operations wait on is due.
// The receiver is stopped before our send (it will never answer) and killed 300 ms into our
// sleep; the sleep is allowed 10 s. (Not fi_cq_sread: it wakes every 100 ms by itself.)
TEST_F(PeerDeathWaitTest, SleeperWaitingOnADeadReceiverWakesWithTheError) {
    if (over_link()) GTEST_SKIP() << "node-local: a link's peer that dies resets its socket";
    ASSERT_NO_FATAL_FAILURE(start_child("serve"));
    auto s = buf(64);
    ASSERT_FI_OK(post([&] { return fi_send(a().ep, s->data(), 64, s->desc, dead, ctx(0)); }));
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << a().log.summary();
    ASSERT_EQ(kill(child.pid, SIGSTOP), 0);
    int status = 0;
    ASSERT_EQ(waitpid(child.pid, &status, WUNTRACED), child.pid);
    ASSERT_FI_OK(send_delivery_complete(*s, 64, ctx(1)));
    ASSERT_EQ(sleep_through_death(), -FI_EAVAIL)
        << "the sleeper did not wake for the receiver's death within 10 s";
    fi_cq_err_entry err{};
    ASSERT_EQ(fi_cq_readerr(a().cq, &err, 0), 1);
    EXPECT_EQ(err.op_context, ctx(1));
    EXPECT_EQ(err.err, FI_ECONNRESET) << fi_strerror(err.err);
}

// The same for a receive: asleep while a node-local sender is to write its part of a split
// copy into our receive, the application wakes and reads the receive's error when that sender
// dies (a receive waits on its sender as a send waits on its receiver's Fin). The sender stops
// once it claimed its part (TANDEM_TEST_SPLIT_WAIT: we wait for its claim, see
// KilledSenderLeavesReceiverUsable) and is killed 300 ms into our sleep.
TEST_F(PeerDeathWaitTest, SleeperWhoseSenderDiesMidCopyWakesWithTheError) {
    if (over_link()) GTEST_SKIP() << "a node-local split copy (a link reads the whole message)";
    ScopedEnv wait("TANDEM_TEST_SPLIT_WAIT", "1");
    auto r = buf(kChildMsg);
    ASSERT_NO_FATAL_FAILURE(start_child("sender", "local.cts_claimed"));
    ASSERT_FI_OK(post(
        [&] { return fi_recv(a().ep, r->data(), kChildMsg, r->desc, FI_ADDR_UNSPEC, ctx(0)); }));
    ASSERT_TRUE(child.wait_stopped([&] { progress(); }, 20s))
        << "the child never claimed its part: " << a().log.summary();
    ASSERT_EQ(sleep_through_death(), -FI_EAVAIL)
        << "the sleeper did not wake for the sender's death within 10 s";
    fi_cq_err_entry err{};
    ASSERT_EQ(fi_cq_readerr(a().cq, &err, 0), 1);
    EXPECT_EQ(err.op_context, ctx(0));
    EXPECT_EQ(err.err, FI_ECONNRESET) << fi_strerror(err.err);
}

// fi_writedata is two link work requests (the write, then the notice carrying the data). When
// the connection fails while the write is being posted, the write is flushed and the notice
// refused: the operation must still complete once, with its own context, and leave the
// endpoint's queue accounting intact.
TEST_F(PeerDeathWaitTest, WritedataOnFailingConnectionCompletesOnce) {
    ASSERT_NO_FATAL_FAILURE(start_child("serve"));
    auto src = buf(256);
    fill_pattern(src->data(), 256, 720);
    ASSERT_FI_OK(post([&] {
        return fi_writedata(a().ep, src->data(), 256, src->desc, 0x55, dead, child.hello.addr,
                            child.hello.key, ctx(0));
    }));
    ASSERT_TRUE(wait_comp(a(), ctx(0))) << "writedata to the live child: " << a().log.summary();

    // Stop the child so that it reads nothing more, then leave a message unread in its socket:
    // a process that exits with unread data resets its connections (RST, not FIN), and the
    // parent's next send on the connection fails at once.
    ASSERT_EQ(kill(child.pid, SIGSTOP), 0);
    int status = 0;
    ASSERT_EQ(waitpid(child.pid, &status, WUNTRACED), child.pid);
    ASSERT_TRUE(WIFSTOPPED(status));
    for (int i = 0; i < 8; ++i) progress();  // take in whatever the child sent before it stopped
    auto small = buf(64);
    ASSERT_FI_OK(fi_send(a().ep, small->data(), 64, small->desc, dead, ctx(1)));
    child.kill_and_reap();
    if (over_link()) {
        // Wait, without driving progress, until the reset has reached the parent's socket (the
        // CQ's descriptor watches the domain's sockets).
        int fd = -1;
        ASSERT_FI_OK(fi_control(&a().cq->fid, FI_GETWAIT, &fd));
        pollfd pfd{fd, POLLIN, 0};
        ASSERT_EQ(::poll(&pfd, 1, 10000), 1) << "the dead child's reset never arrived";
    }

    constexpr size_t kWrites = 4;
    for (size_t i = 0; i < kWrites; ++i) {
        ASSERT_FI_OK(fi_writedata(a().ep, src->data(), 256, src->desc, 0x60 + i, dead,
                                  child.hello.addr, child.hello.key, ctx(10 + i)))
            << "write " << i;
    }
    auto count_err = [&](const void *c) {
        size_t n = 0;
        for (auto &e : a().log.errs) n += e.e.op_context == c;
        return n;
    };
    // Which operation each error completion names (its context's index, or null).
    auto errors = [&] {
        std::string s;
        for (auto &e : a().log.errs) {
            auto *c = static_cast<fi_context2 *>(e.e.op_context);
            s += c ? " ctx " + std::to_string(c - &ctxs_[0]) : std::string(" null context");
            s += " (" + std::string(fi_strerror(e.e.err)) + ")";
        }
        return a().log.summary() + ":" + s;
    };
    // The small send to the stopped child completed when it was posted: its payload was
    // copied and the connection was up (FI_INJECT_COMPLETE, the default).
    ASSERT_TRUE(poll_until([&] {
        for (size_t i = 0; i < kWrites; ++i)
            if (count_err(ctx(10 + i)) == 0) return false;
        return a().log.count(ctx(1)) > 0;
    })) << "operations to the dead child did not all end: "
        << errors();
    progress();
    for (size_t i = 0; i < kWrites; ++i) {
        EXPECT_EQ(count_err(ctx(10 + i)), 1u) << "write " << i << ": " << errors();
        EXPECT_FALSE(a().log.has(ctx(10 + i))) << "write " << i << " to a dead peer succeeded";
    }
    EXPECT_EQ(a().log.count(ctx(1)), 1u) << errors();
    EXPECT_EQ(count_err(ctx(1)), 0u) << errors();
    EXPECT_EQ(count_err(nullptr), 0u) << "error completion without a context: " << errors();
    // Nothing else: the first write's, the small send's and the writes' entries only.
    EXPECT_EQ(a().log.errs.size() + a().log.comps.size(), 2 + kWrites) << errors();
    EXPECT_EQ(fi_cntr_readerr(a().write_cntr), kWrites);
    EXPECT_EQ(fi_cntr_read(a().write_cntr), 1u);

    // The queue accounting is intact: a new operation to the surviving peer is taken at once.
    a().log.clear();
    auto target = buf(256, 0, true);
    EXPECT_FI_OK(fi_writedata(a().ep, src->data(), 256, src->desc, 0x70, a().peer[1],
                              rma_addr(*target), target->key, ctx(20)));
    EXPECT_TRUE(wait_comp(a(), ctx(20))) << a().log.summary();
    EXPECT_EQ(check_pattern(target->data(), 256, 720), -1);
}

}  // namespace
}  // namespace tandem_test

int main(int argc, char **argv) {
    if (argc >= 4 && std::string(argv[1]) == "--tandem-peer-child") {
        int rfd = -1, wfd = -1;
        if (std::sscanf(argv[2], "%d,%d", &rfd, &wfd) != 2) return 2;
        tandem_test::child_main(rfd, wfd, argv[3]);
    }
    char self[PATH_MAX] = {};
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    tandem_test::g_self = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
