// The node-local path's shared segments as a user sees them in /dev/shm: private to the
// user (0600), removed when the endpoint closes, and removed after a process that died
// without closing, by the next endpoint created.
#include "common/shm_ring.h"
#include "common/wire.h"
#include "common/coarse_clock.h"
#include "main_prov/shm/inbox_segment.h"
#include "main_prov/shm/send_choice.h"
#include "main_prov/shm/shm_segment.h"
#include "peer/ep_diag.h"
#include "tests/common/rdm_endpoint.h"

#include <gtest/gtest.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <netinet/in.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

std::set<std::string> tandem_segments() {
    std::set<std::string> out;
    std::string prefix = "tandem-" + std::to_string(geteuid()) + "-";
    DIR *d = opendir("/dev/shm");
    if (!d) return out;
    while (dirent *e = readdir(d)) {
        std::string name = e->d_name;
        if (name.rfind(prefix, 0) == 0) out.insert(name);
    }
    closedir(d);
    return out;
}

using Rdm = tandem_test::RdmEndpoint;

TEST(LocalSegments, PrivateToTheUserAndRemovedOnClose) {
    auto before = tandem_segments();
    Rdm rdm;
    std::string why;
    ASSERT_TRUE(rdm.try_open(why)) << why;
    auto during = tandem_segments();
    // This endpoint's files are named for its address; other tests running at the same time
    // (ctest -j) create theirs too, so only names ending in our port count.
    sockaddr_in name = rdm.ipv4_name();
    ASSERT_EQ(name.sin_family, AF_INET);
    std::string port = "-";  // (not "-" + to_string(): GCC 12 -Wrestrict false positive at -O3)
    port += std::to_string(ntohs(name.sin_port));
    auto ours = [&](const std::string &n) {
        return n.ends_with(port) || n.ends_with(port + ".wake");
    };
    std::set<std::string> mine;
    for (const auto &n : during)
        if (!before.count(n) && ours(n)) mine.insert(n);
    // The inbox segment and its wake FIFO.
    ASSERT_EQ(mine.size(), 2u);
    for (const auto &n : mine) {
        struct stat st;
        ASSERT_EQ(stat(("/dev/shm/" + n).c_str(), &st), 0);
        EXPECT_EQ(st.st_mode & 0777, 0600u) << n;
        EXPECT_EQ(st.st_uid, geteuid());
    }
    rdm.close();
    auto after = tandem_segments();
    for (const auto &n : mine) EXPECT_EQ(after.count(n), 0u) << n << " left behind";
}

// FI_OPT_SHARED_MEMORY_PERMITTED (libfabric 1.21; 11 in fi_endpoint.h's enum, which 1.17's
// headers lack) set to false before fi_enable: the endpoint makes no segment, so it reaches
// its node-local peers over the link and they reach it so, messages arriving both ways; once
// enabled the option can no longer change.
TEST(LocalSegments, SharedMemoryNotPermittedMakesNoSegmentAndTakesTheLinkBothWays) {
    constexpr int kOptSharedMemoryPermitted = 11;
    tandem_test::RdmEndpoint off, on;
    // What in /dev/shm is named after an endpoint's address (segment_names.cpp's key: family,
    // address, port): other tests running meanwhile make and remove segments of their own.
    auto named_after = [](tandem_test::RdmEndpoint &e) {
        const sockaddr_in a = e.ipv4_name();
        char key[32];
        snprintf(key, sizeof key, "-4-%08x-%u", ntohl(a.sin_addr.s_addr), ntohs(a.sin_port));
        std::set<std::string> out;
        for (const std::string &name : tandem_segments())
            if (name.find(key) != std::string::npos) out.insert(name);
        return out;
    };
    off.before_enable = [](fid_ep *ep) {
        const bool permitted = false;
        ASSERT_EQ(fi_setopt(&ep->fid, FI_OPT_ENDPOINT, kOptSharedMemoryPermitted, &permitted,
                            sizeof permitted),
                  0);
    };
    ASSERT_NO_FATAL_FAILURE(off.open());
    EXPECT_EQ(named_after(off).size(), 0u)
        << "an endpoint not permitted shared memory made a segment";
    ASSERT_NO_FATAL_FAILURE(on.open());
    // (The same lookup finds the segment, and its wake-up FIFO, of an endpoint permitted it.)
    ASSERT_GT(named_after(on).size(), 0u);
    const bool permitted = true;
    EXPECT_EQ(fi_setopt(&off.ep->fid, FI_OPT_ENDPOINT, kOptSharedMemoryPermitted, &permitted,
                        sizeof permitted),
              -FI_EOPBADSTATE);

    const fi_addr_t on_at_off = off.insert(on), off_at_on = on.insert(off);
    auto path = [](tandem_test::RdmEndpoint &e, fi_addr_t to) {
        void *ops = nullptr;
        EXPECT_EQ(fi_open_ops(&e.ep->fid, tandem::peer::kEpDiagOpsName, 0, &ops, nullptr), 0);
        auto *diag = static_cast<tandem::peer::EpDiagOps *>(ops);
        return diag ? diag->peer_path(e.ep, to) : -1;
    };
    EXPECT_EQ(path(off, on_at_off), int(tandem::peer::PeerPath::Link));
    EXPECT_EQ(path(on, off_at_on), int(tandem::peer::PeerPath::Link));

    char to_on[16] = "to on", to_off[16] = "to off", in_on[16] = {}, in_off[16] = {};
    int ctx_on, ctx_off;
    ASSERT_EQ(fi_trecv(on.ep, in_on, sizeof in_on, nullptr, FI_ADDR_UNSPEC, 1, 0, &ctx_on), 0);
    ASSERT_EQ(fi_trecv(off.ep, in_off, sizeof in_off, nullptr, FI_ADDR_UNSPEC, 2, 0, &ctx_off), 0);
    ASSERT_EQ(fi_tsend(off.ep, to_on, sizeof to_on, nullptr, on_at_off, 1, nullptr), 0);
    ASSERT_EQ(fi_tsend(on.ep, to_off, sizeof to_off, nullptr, off_at_on, 2, nullptr), 0);
    std::vector<void *> done_on, done_off;
    size_t errors = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    auto has = [](const std::vector<void *> &v, void *c) {
        return std::find(v.begin(), v.end(), c) != v.end();
    };
    while ((!has(done_on, &ctx_on) || !has(done_off, &ctx_off)) &&
           std::chrono::steady_clock::now() < deadline) {
        on.poll(done_on, errors);
        off.poll(done_off, errors);
    }
    EXPECT_EQ(errors, 0u);
    EXPECT_TRUE(has(done_on, &ctx_on));
    EXPECT_TRUE(has(done_off, &ctx_off));
    EXPECT_STREQ(in_on, "to on");
    EXPECT_STREQ(in_off, "to off");
    off.close();
    on.close();
}

TEST(LocalSegments, ADeadProcessesSegmentsAreReapedByTheNextEndpoint) {
    auto before = tandem_segments();
    // The child tells its port: segments of other tests running at the same time are alive
    // and must not count as the dead child's.
    int port_pipe[2];
    ASSERT_EQ(pipe(port_pipe), 0);
    pid_t pid = fork();
    if (pid == 0) {
        Rdm rdm;
        std::string why;
        if (!rdm.try_open(why)) _exit(2);
        sockaddr_in name = rdm.ipv4_name();
        if (name.sin_family != AF_INET) _exit(3);
        uint16_t port = ntohs(name.sin_port);
        if (write(port_pipe[1], &port, sizeof port) != sizeof port) _exit(4);
        _exit(0);  // dies holding its endpoint: nothing closed, nothing removed
    }
    close(port_pipe[1]);
    uint16_t port = 0;
    ASSERT_EQ(read(port_pipe[0], &port, sizeof port), ssize_t(sizeof port));
    close(port_pipe[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    std::string suffix = "-";
    suffix += std::to_string(port);
    std::set<std::string> orphans;
    for (const auto &n : tandem_segments())
        if (!before.count(n) && (n.ends_with(suffix) || n.ends_with(suffix + ".wake")))
            orphans.insert(n);
    ASSERT_FALSE(orphans.empty()) << "the child left no segment (is off_tandem loaded?)";

    Rdm rdm;
    std::string why;
    ASSERT_TRUE(rdm.try_open(why)) << why;
    auto now = tandem_segments();
    for (const auto &n : orphans) EXPECT_EQ(now.count(n), 0u) << n << " of a dead process kept";
    rdm.close();
}

// Two network namespaces that share /dev/shm can each have an endpoint at 127.0.0.1:P, but
// only one segment of that name: the other namespace's. An endpoint of ours sending to
// 127.0.0.1:P means the endpoint of our namespace, and must not write into the other
// namespace's inbox. (Without the check, the message goes to the wrong process and the one
// meant never gets it.)
TEST(LocalSegments, TheSameAddressInAnotherNetworkNamespaceIsAnotherEndpoint) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for a network namespace";
    int to_parent[2], to_child[2];
    ASSERT_EQ(pipe(to_parent), 0);
    ASSERT_EQ(pipe(to_child), 0);
    pid_t pid = fork();
    if (pid == 0) {
        // Another network namespace, with its own loopback up: its 127.0.0.1 is not ours.
        int32_t report = -1;
        if (unshare(CLONE_NEWNET) != 0) {
            report = -errno;
            (void)!write(to_parent[1], &report, sizeof report);
            _exit(1);
        }
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        ifreq ifr{};
        strcpy(ifr.ifr_name, "lo");
        if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) != 0) _exit(2);
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) _exit(3);
        close(s);
        Rdm other;
        std::string why;
        if (!other.try_open(why)) _exit(4);
        sockaddr_in name = other.ipv4_name();
        if (name.sin_family != AF_INET) _exit(5);
        report = ntohs(name.sin_port);
        (void)!write(to_parent[1], &report, sizeof report);
        char done;
        (void)!read(to_child[0], &done, 1);  // keeps its endpoint (and segment) until told
        // Whatever reached its inbox: it must have received nothing.
        std::vector<void *> got;
        size_t errors = 0;
        for (int i = 0; i < 100; ++i) other.poll(got, errors);
        _exit(got.empty() && errors == 0 ? 0 : 6);
    }
    close(to_parent[1]);
    close(to_child[0]);
    int32_t port = 0;
    pollfd pf{to_parent[0], POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, 20000), 1);
    ASSERT_EQ(read(to_parent[0], &port, sizeof port), ssize_t(sizeof port));
    if (port < 0) {
        waitpid(pid, nullptr, 0);
        GTEST_SKIP() << "unshare(CLONE_NEWNET): " << strerror(-port);
    }
    ASSERT_GT(port, 0);

    // Our endpoint at the same address and port: its segment name is taken (by the other
    // namespace's live endpoint), so it is reached over its link.
    Rdm meant, sender;
    std::string why;
    ASSERT_TRUE(meant.try_open(why, FI_MSG | FI_TAGGED, uint16_t(port))) << why;
    ASSERT_TRUE(sender.try_open(why)) << why;
    fi_addr_t dest = sender.insert(meant);
    uint64_t payload = 0x5eed5eed5eed5eedull, got_payload = 0;
    ASSERT_EQ(fi_trecv(meant.ep, &got_payload, sizeof got_payload, nullptr, FI_ADDR_UNSPEC, 7, 0,
                       &got_payload),
              0);
    ASSERT_EQ(fi_tsend(sender.ep, &payload, sizeof payload, nullptr, dest, 7, &payload), 0);
    std::vector<void *> done;
    size_t errors = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (done.size() < 2 && errors == 0 && std::chrono::steady_clock::now() < deadline) {
        sender.poll(done, errors);
        meant.poll(done, errors);
    }
    EXPECT_EQ(errors, 0u);
    EXPECT_EQ(got_payload, payload) << "the endpoint meant did not get the message";
    char go = 1;
    ASSERT_EQ(write(to_child[1], &go, 1), 1);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the other namespace's endpoint: status " << status;
    close(to_parent[0]);
    close(to_child[1]);
    sender.close();
    meant.close();
}

// The inbox segment of an endpoint (named after its IPv4 address, as off_tandem names it),
// and where its ring starts: after off_tandem's 64-byte SegmentInfo.
std::string inbox_name(const Rdm &rdm) {
    sockaddr_in name = rdm.ipv4_name();
    if (name.sin_family != AF_INET) return {};
    char key[64];
    snprintf(key, sizeof key, "4-%08x-%u", ntohl(name.sin_addr.s_addr), ntohs(name.sin_port));
    return "/tandem-" + std::to_string(geteuid()) + "-" + key;
}
constexpr size_t kInboxRingOffset = 64;

// A process that dies between claiming a cell of a peer's inbox and publishing it (killed
// while it fills the cell) must not stop that inbox: the messages other peers send behind
// the dead one's cell still arrive, all of them, in order.
TEST(LocalSegments, AProducerKilledBeforePublishingDoesNotStallTheInbox) {
    Rdm a, b;
    std::string why;
    ASSERT_TRUE(a.try_open(why)) << why;
    ASSERT_TRUE(b.try_open(why)) << why;
    fi_addr_t a_at_b = b.insert(a);
    const std::string inbox = inbox_name(a);
    ASSERT_FALSE(inbox.empty());

    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        // Nothing of the parent's libfabric is touched here: the child is a bare producer.
        try {
            tandem::ShmSegment seg = tandem::ShmSegment::open(inbox);
            auto *ring = tandem::ShmRing::attach(static_cast<char *>(seg.data()) + kInboxRingOffset,
                                                 seg.data_size() - kInboxRingOffset);
            char ok = ring && ring->try_reserve(getpid()) ? 1 : 0;
            if (write(pipe_fds[1], &ok, 1) != 1) _exit(3);
            pause();  // killed here, its cell claimed and never published
        } catch (...) {
        }
        _exit(2);
    }
    ASSERT_GT(pid, 0);
    close(pipe_fds[1]);
    char ok = 0;
    pollfd pfd{pipe_fds[0], POLLIN, 0};
    bool told = poll(&pfd, 1, 10000) == 1 && read(pipe_fds[0], &ok, 1) == 1;
    close(pipe_fds[0]);
    kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(told && ok == 1) << "the child could not claim a cell of " << inbox;

    constexpr uint64_t kMessages = 8;
    uint64_t in[kMessages] = {};
    for (uint64_t i = 0; i < kMessages; ++i)
        ASSERT_EQ(fi_trecv(a.ep, &in[i], sizeof in[i], nullptr, FI_ADDR_UNSPEC, 0x50, 0, &in[i]),
                  0);
    uint64_t out[kMessages];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (uint64_t i = 0; i < kMessages; ++i) {
        out[i] = 1000 + i;
        ssize_t ret;
        while ((ret = fi_tsend(b.ep, &out[i], sizeof out[i], nullptr, a_at_b, 0x50, &out[i])) ==
                   -FI_EAGAIN &&
               std::chrono::steady_clock::now() < deadline) {
            fi_cq_tagged_entry e;
            (void)fi_cq_read(b.cq, &e, 1);
        }
        ASSERT_EQ(ret, 0);
    }
    std::vector<void *> received;
    while (received.size() < kMessages && std::chrono::steady_clock::now() < deadline) {
        fi_cq_tagged_entry e;
        (void)fi_cq_read(b.cq, &e, 1);  // (b's sends complete; nothing to check there)
        if (fi_cq_read(a.cq, &e, 1) == 1) received.push_back(e.op_context);
    }
    ASSERT_EQ(received.size(), kMessages) << "the inbox stayed stuck at the dead process's cell";
    for (uint64_t i = 0; i < kMessages; ++i) {
        EXPECT_EQ(received[i], &in[i]);
        EXPECT_EQ(in[i], 1000 + i);
    }
    b.close();
    a.close();
}

// A receiver whose inbox never empties still tells its senders that it polls: its heartbeat
// (SegmentInfo::heartbeat, which a sender reads before a large message to tell a receiver
// without a core from a busy one, shm::peer_polls) moves while it reads, though none of its
// passes finds the inbox empty (and the twin, which beats on its own passes, is then never
// driven). For 40 ms a puts one Short message into b's inbox before each of b's passes; at the
// end b's heartbeat is younger than kPeerPollMs.
TEST(LocalSegments, AReceiverReadingAnInboxThatNeverEmptiesKeepsItsHeartbeat) {
    Rdm a, b;
    a.open();
    b.open();
    const fi_addr_t to_b = a.insert(b);
    tandem::ShmSegment seg = tandem::ShmSegment::open(inbox_name(b));
    ASSERT_NE(seg.data(), nullptr) << "b has no inbox segment";
    const auto *info = static_cast<const tandem::shm::SegmentInfo *>(seg.data());
    const uint64_t payload = 7;
    size_t passes = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(40);
    while (std::chrono::steady_clock::now() < until) {
        ASSERT_EQ(fi_tinject(a.ep, &payload, sizeof payload, to_b, 0x61), 0);
        fi_cq_tagged_entry e;
        (void)fi_cq_read(b.cq, &e, 1);  // (nothing completes: the messages stay unexpected)
        ++passes;
    }
    const uint32_t beat = __atomic_load_n(&info->heartbeat, __ATOMIC_RELAXED);
    const uint32_t age = uint32_t(tandem::coarse_now_ms()) - beat;
    EXPECT_LT(age, tandem::shm::kPeerPollMs)
        << "b's heartbeat is " << age << " ms old after " << passes << " passes that read";
    b.close();
    a.close();
}

// An endpoint's inbox as another process writes it: Frag cells of staged messages, each under
// `name` (a sender's address) with the given pid, written into the ring as that sender would.
class ForgedSender {
  public:
    explicit ForgedSender(const Rdm &to) : seg_(tandem::ShmSegment::open(inbox_name(to))) {
        ring_ = tandem::ShmRing::attach(static_cast<char *>(seg_.data()) + kInboxRingOffset,
                                        seg_.data_size() - kInboxRingOffset);
    }
    bool ready() const { return ring_ != nullptr; }
    // A name for the cells: the address of `as` (whose inbox the receiver's channel opens when
    // it looks the sender up).
    bool name_as(const Rdm &as) {
        name_len_ = sizeof name_;
        return fi_getname(&as.ep->fid, name_, &name_len_) == 0 &&
               name_len_ <= tandem::wire::kLocalNameRoom;
    }
    // A fragment of `size` bytes of `fill` at `offset` of a `total`-byte message; a status
    // other than 0 makes it the sender's giving up (an empty last cell).
    void frag(uint32_t pid, uint64_t msg_id, uint64_t offset, uint32_t size, uint64_t total,
              uint8_t fill, uint8_t flags = 0, int32_t status = 0) {
        void *slot = ring_->try_reserve(tandem::own_process_token());
        ASSERT_NE(slot, nullptr);
        auto *cell = static_cast<uint8_t *>(slot);
        tandem::wire::LocalHeader h{};
        h.op = uint8_t(tandem::wire::LocalOp::Frag);
        h.flags = flags;
        h.name_len = uint8_t(name_len_);
        h.pid = int32_t(pid);
        h.msg_id = msg_id;
        h.offset = offset;
        h.size = size;
        h.total = total;
        h.status = status;
        memcpy(cell, &h, sizeof h);
        memset(cell + sizeof h, 0, tandem::wire::kLocalNameRoom);  // (zero-padded, as sent)
        memcpy(cell + sizeof h, name_, name_len_);
        memset(cell + sizeof h + tandem::wire::kLocalNameRoom, fill, size);
        ring_->publish(slot);
    }
    // An Rts of a `total`-byte message naming one buffer of ours, `length` bytes at `at`.
    void rts(uint32_t pid, uint64_t msg_id, uint64_t total, const void *at, uint64_t length) {
        tandem::wire::LocalHeader h{};
        h.op = uint8_t(tandem::wire::LocalOp::Rts);
        h.pid = int32_t(pid);
        h.msg_id = msg_id;
        h.total = total;
        naming(h, at, length);
    }
    // A receiver's Cts for the Rts msg_id: write `total` bytes from `offset` of the message
    // into our buffer `at` (no claim: nothing to take first).
    void cts(uint32_t pid, uint64_t msg_id, uint64_t offset, uint64_t total, void *at) {
        tandem::wire::LocalHeader h{};
        h.op = uint8_t(tandem::wire::LocalOp::Cts);
        h.pid = int32_t(pid);
        h.msg_id = msg_id;
        h.offset = offset;
        h.total = total;
        h.rma_key = tandem::wire::kLocalNoClaim;
        naming(h, at, total);
    }
    // An IpcRts of a `total`-byte message in one buffer of CUDA device memory (its handle all
    // zeros: no process here can map it).
    void ipc_rts(uint32_t pid, uint64_t msg_id, uint64_t total) {
        tandem::wire::LocalHeader h{};
        h.op = uint8_t(tandem::wire::LocalOp::IpcRts);
        h.pid = int32_t(pid);
        h.msg_id = msg_id;
        h.total = total;
        h.iov_count = 1;
        tandem::wire::LocalIpc ipc{};
        ipc.alloc_len = ipc.length = total;
        ipc.iface = FI_HMEM_CUDA;
        write(h, &ipc, sizeof ipc);
    }
    // A Fin (status) for the operation msg_id of the inbox's owner.
    void fin(uint64_t msg_id, int32_t status) {
        void *slot = ring_->try_reserve(tandem::own_process_token());
        ASSERT_NE(slot, nullptr);
        auto *cell = static_cast<uint8_t *>(slot);
        tandem::wire::LocalHeader h{};
        h.op = uint8_t(tandem::wire::LocalOp::Fin);
        h.name_len = uint8_t(name_len_);
        h.pid = int32_t(getpid());
        h.msg_id = msg_id;
        h.status = status;
        memcpy(cell, &h, sizeof h);
        memset(cell + sizeof h, 0, tandem::wire::kLocalNameRoom);
        memcpy(cell + sizeof h, name_, name_len_);
        ring_->publish(slot);
    }
    // An atomic's answer (status 0) for the operation `id` of the inbox's owner, carrying
    // the 8-byte previous value `value`.
    void atomic_resp(uint64_t id, uint64_t value) {
        void *slot = ring_->try_reserve(tandem::own_process_token());
        ASSERT_NE(slot, nullptr);
        auto *cell = static_cast<uint8_t *>(slot);
        tandem::wire::LocalShortHeader h{};
        h.op = uint8_t(tandem::wire::LocalOp::AtomicResp);
        h.name_len = uint8_t(name_len_);
        h.size = sizeof value;
        h.tag = id;
        const size_t at = tandem::wire::local_short_body_offset(name_len_);
        memcpy(cell, &h, sizeof h);
        memset(cell + sizeof h, 0, at - sizeof h);
        memcpy(cell + sizeof h, name_, name_len_);
        memcpy(cell + at, &value, sizeof value);
        ring_->publish(slot);
    }
    // The first cell waiting in the inbox (read, not taken): what the endpoint's owner was
    // sent while it did not poll. nullptr: none.
    const uint8_t *peek() { return static_cast<const uint8_t *>(ring_->peek()); }

  private:
    // A cell under h (in our name) whose body names one buffer of ours, `length` bytes at `at`.
    void naming(tandem::wire::LocalHeader h, const void *at, uint64_t length) {
        h.iov_count = 1;
        const tandem::wire::LocalIov iov{reinterpret_cast<uint64_t>(at), length};
        write(h, &iov, sizeof iov);
    }
    // A cell under h, in our name, with `size` bytes of body.
    void write(tandem::wire::LocalHeader h, const void *body, uint32_t size) {
        void *slot = ring_->try_reserve(tandem::own_process_token());
        ASSERT_NE(slot, nullptr);
        auto *cell = static_cast<uint8_t *>(slot);
        h.name_len = uint8_t(name_len_);
        h.size = size;
        memcpy(cell, &h, sizeof h);
        memset(cell + sizeof h, 0, tandem::wire::kLocalNameRoom);
        memcpy(cell + sizeof h, name_, name_len_);
        memcpy(cell + sizeof h + tandem::wire::kLocalNameRoom, body, size);
        ring_->publish(slot);
    }

    tandem::ShmSegment seg_;
    tandem::ShmRing *ring_ = nullptr;
    char name_[64] = {};
    size_t name_len_ = 0;
};

// The next entry of a's CQ (10 s at most): 1 with *e, or -FI_EAVAIL with the error in *err.
ssize_t next_completion(Rdm &a, fi_cq_tagged_entry *e, fi_cq_err_entry *err) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    ssize_t ret;
    while ((ret = fi_cq_read(a.cq, e, 1)) == -FI_EAGAIN &&
           std::chrono::steady_clock::now() < deadline) {
    }
    if (ret == -FI_EAVAIL) (void)fi_cq_readerr(a.cq, err, 0);
    return ret;
}

// A process that dies in the middle of a staged message leaves its first fragments with the
// receiver. A new process at the same address (a server restarted on its port) numbers its
// messages from 1 again: its message of the same number must arrive whole, neither appended
// to the dead one's part nor dropped as out of order. The cells are written into the inbox
// as the two processes write them, plain or flagged restaged (a device message sent again
// through cells: with no IpcRts of theirs matched here, reassembled as any other).
void staged_message_of_a_new_process_at_the_same_address(bool restaged) {
    Rdm a;
    std::string why;
    ASSERT_TRUE(a.try_open(why)) << why;
    ForgedSender in(a);
    ASSERT_TRUE(in.ready());
    ASSERT_TRUE(in.name_as(a));  // the sender's: any address will do

    constexpr uint32_t kPart = 1000;
    std::vector<uint8_t> got(2 * kPart + 16, 0);
    ASSERT_EQ(fi_recv(a.ep, got.data(), got.size(), nullptr, FI_ADDR_UNSPEC, &got), 0);
    const uint8_t flags = restaged ? tandem::wire::kLocalRestaged : 0;
    in.frag(1001, 1, 0, kPart, 2 * kPart, 0xd1, flags);  // the process that died: half sent
    in.frag(1002, 1, 0, kPart, 2 * kPart, 0x51, flags);  // the new one: a whole message
    in.frag(1002, 1, kPart, kPart, 2 * kPart, 0x52, flags);

    fi_cq_tagged_entry e{};
    fi_cq_err_entry err{};
    ASSERT_EQ(next_completion(a, &e, &err), 1) << "the new process's message never arrived";
    EXPECT_EQ(e.op_context, &got);
    EXPECT_EQ(e.len, 2 * kPart);
    for (uint32_t i = 0; i < 2 * kPart; ++i)
        ASSERT_EQ(got[i], i < kPart ? 0x51 : 0x52) << "byte " << i;
    a.close();
}

TEST(LocalSegments, AStagedMessageOfANewProcessAtADeadOnesAddressArrivesWhole) {
    staged_message_of_a_new_process_at_the_same_address(false);
}

TEST(LocalSegments, ARestagedMessageOfANewProcessAtADeadOnesAddressArrivesWhole) {
    staged_message_of_a_new_process_at_the_same_address(true);
}

// A receiver `a` with a receive of 2 * kPart bytes posted, and a live node-local peer `b` (an
// endpoint of this process, whose pid the forged cells carry) in whose name cells reach a.
class StagedFromLivePeer : public ::testing::Test {
  protected:
    static constexpr uint32_t kPart = 1000;
    void SetUp() override {
        std::string why;
        ASSERT_TRUE(a.try_open(why)) << why;
        ASSERT_TRUE(b.try_open(why)) << why;
        in.emplace(a);
        ASSERT_TRUE(in->ready());
        ASSERT_TRUE(in->name_as(b));
        ASSERT_EQ(fi_recv(a.ep, got.data(), got.size(), nullptr, FI_ADDR_UNSPEC, &got), 0);
    }
    void TearDown() override {
        in.reset();
        b.close();
        a.close();
    }
    Rdm a, b;
    std::optional<ForgedSender> in;
    std::vector<uint8_t> got = std::vector<uint8_t>(2 * kPart, 0);
    const uint32_t pid = uint32_t(getpid());
};

// A staged message from a live peer goes into the receive posted for it as its fragments
// come: the first fragment's bytes are in the buffer before the message is complete, and the
// completion comes with the last.
TEST_F(StagedFromLivePeer, ItIsCopiedIntoThePostedReceiveAsItsFragmentsCome) {
    in->frag(pid, 7, 0, kPart, 2 * kPart, 0x61);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    fi_cq_tagged_entry e{};
    ssize_t ret;
    while ((ret = fi_cq_read(a.cq, &e, 1)) == -FI_EAGAIN && got[kPart - 1] != 0x61 &&
           std::chrono::steady_clock::now() < deadline) {
    }
    ASSERT_EQ(ret, -FI_EAGAIN) << "a completion for half a message";
    ASSERT_EQ(got[kPart - 1], 0x61) << "the first fragment was not copied into the receive";
    in->frag(pid, 7, kPart, kPart, 2 * kPart, 0x62);
    fi_cq_err_entry err{};
    ASSERT_EQ(next_completion(a, &e, &err), 1) << "the message never completed";
    EXPECT_EQ(e.op_context, &got);
    EXPECT_EQ(e.len, 2 * kPart);
    for (uint32_t i = 0; i < 2 * kPart; ++i)
        ASSERT_EQ(got[i], i < kPart ? 0x61 : 0x62) << "byte " << i;
}

// An Rts whose buffers hold fewer bytes than the message it announces is no message anyone
// can read: it is refused, its sender told (a Fin with FI_EIO, so that a sender that meant it
// does not wait for ever), and the receive posted stays for the next message.
class RtsFromLivePeer : public StagedFromLivePeer {};

TEST_F(RtsFromLivePeer, OneWhoseBuffersDoNotHoldItsMessageIsRefusedAndItsSenderTold) {
    std::vector<uint8_t> theirs(kPart, 0x33);
    in->rts(pid, 5, 2 * kPart, theirs.data(), kPart);
    in->frag(pid, 6, 0, kPart, kPart, 0x44);  // then a whole staged message
    fi_cq_tagged_entry e{};
    fi_cq_err_entry err{};
    ASSERT_EQ(next_completion(a, &e, &err), 1) << "no completion";
    EXPECT_EQ(e.op_context, &got);
    EXPECT_EQ(e.len, kPart) << "the receive did not go to the message after the Rts";
    EXPECT_EQ(got[0], 0x44);
    ForgedSender at_b(b);  // (b does not poll: the answer waits in its inbox)
    ASSERT_TRUE(at_b.ready());
    const uint8_t *cell = at_b.peek();
    ASSERT_NE(cell, nullptr) << "the Rts's sender was not answered";
    tandem::wire::LocalHeader fin;
    memcpy(&fin, cell, sizeof fin);
    EXPECT_EQ(fin.op, uint8_t(tandem::wire::LocalOp::Fin));
    EXPECT_EQ(fin.msg_id, 5u);
    EXPECT_EQ(fin.status, FI_EIO) << fi_strerror(fin.status);
}

// The header of the first cell waiting in `to`'s inbox (`to` does not poll), when it is of
// `op`: an Rts a large send to it put there, a Write an RMA write.
bool waiting_at(const Rdm &to, tandem::wire::LocalOp op, tandem::wire::LocalHeader &h) {
    ForgedSender at(to);
    const uint8_t *cell = at.ready() ? at.peek() : nullptr;
    if (!cell) return false;
    memcpy(&h, cell, sizeof h);
    return h.op == uint8_t(op);
}

// A large node-local message is copied by both sides at once: its receiver reads the first
// half and asks the sender (a Cts) to write the second into the receive. Here b, the receiver,
// does not poll; its Cts is forged (in its name, naming a buffer of this process, without a
// claim) into a's inbox: a writes its part there. The Rts carries an id of tandem's own
// operations (wire::kLocalOwnerOp), which the Cts echoes.
TEST(LocalSegments, ASenderWritesItsPartOfASplitCopyWhenItsReceiverAsks) {
    Rdm a, b;
    std::string why;
    ASSERT_TRUE(a.try_open(why)) << why;
    ASSERT_TRUE(b.try_open(why)) << why;
    const fi_addr_t to_b = a.insert(b);
    constexpr size_t kLen = 4u << 20;  // more than b's ring holds: an Rts, never staged
    std::vector<uint8_t> msg(kLen);
    for (size_t i = 0; i < kLen; ++i) msg[i] = uint8_t(1 + (i * 7 + i / 4096) % 255);  // never 0
    ASSERT_EQ(fi_send(a.ep, msg.data(), kLen, nullptr, to_b, &msg), 0);
    tandem::wire::LocalHeader rts;
    ASSERT_TRUE(waiting_at(b, tandem::wire::LocalOp::Rts, rts)) << "no Rts reached b's inbox";
    ASSERT_TRUE(rts.msg_id & tandem::wire::kLocalOwnerOp) << "not an id of tandem's";

    std::vector<uint8_t> part(kLen / 2, 0);
    ForgedSender to_a(a);
    ASSERT_TRUE(to_a.ready());
    ASSERT_TRUE(to_a.name_as(b));
    to_a.cts(uint32_t(getpid()), rts.msg_id, kLen / 2, kLen / 2, part.data());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    fi_cq_tagged_entry e{};
    while (part.back() == 0 && std::chrono::steady_clock::now() < deadline)
        ASSERT_EQ(fi_cq_read(a.cq, &e, 1), -FI_EAGAIN) << "the send completed without a Fin";
    ASSERT_TRUE(std::equal(part.begin(), part.end(), msg.begin() + kLen / 2))
        << "the sender did not write its part";
    b.close();
    a.close();
}

// a's operation msg_id (context) went to b: a Fin for it in c's name leaves it pending through
// 300 ms of polling, b's completes it.
void only_its_peer_ends(Rdm &a, const Rdm &b, const Rdm &c, uint64_t msg_id, void *context) {
    ForgedSender to_a(a);
    ASSERT_TRUE(to_a.ready());
    ASSERT_TRUE(to_a.name_as(c));
    to_a.fin(msg_id, 0);
    fi_cq_tagged_entry e{};
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < until)
        ASSERT_EQ(fi_cq_read(a.cq, &e, 1), -FI_EAGAIN) << "a Fin from c ended an operation to b";
    ASSERT_TRUE(to_a.name_as(b));
    to_a.fin(msg_id, 0);
    fi_cq_err_entry err{};
    ASSERT_EQ(next_completion(a, &e, &err), 1) << "b's Fin did not end the operation";
    EXPECT_EQ(e.op_context, context);
}

// a, b and c open, b and c peers of a's, and a's 4 MiB send to b (an Rts: its send completes
// at a Fin) waiting in b's inbox, which b does not poll.
class RtsWaitingAtB : public ::testing::Test {
  protected:
    static constexpr size_t kLen = 4u << 20;  // more than b's ring holds: an Rts, never staged
    static constexpr uint8_t kFill = 0x5a;
    void SetUp() override {
        std::string why;
        ASSERT_TRUE(a.try_open(why)) << why;
        ASSERT_TRUE(b.try_open(why)) << why;
        ASSERT_TRUE(c.try_open(why)) << why;
        const fi_addr_t to_b = a.insert(b);
        a.insert(c);
        ASSERT_EQ(fi_send(a.ep, msg.data(), kLen, nullptr, to_b, &msg), 0);
        ASSERT_TRUE(waiting_at(b, tandem::wire::LocalOp::Rts, rts)) << "no Rts reached b's inbox";
    }
    void TearDown() override {
        c.close();
        b.close();
        a.close();
    }
    Rdm a, b, c;
    std::vector<uint8_t> msg = std::vector<uint8_t>(kLen, kFill);
    tandem::wire::LocalHeader rts{};
};

// A sender's buffers are its own again at the Fin of the peer it sent to, and only then: a
// Fin for the same operation in another live endpoint's name (any local process of the user
// can write the inbox) is ignored, and the send completes at its receiver's.
TEST_F(RtsWaitingAtB, OnlyTheReceiverOfAMessageEndsItsSend) {
    ASSERT_NO_FATAL_FAILURE(only_its_peer_ends(a, b, c, rts.msg_id, &msg));
}

// The same for an operation off_tandem carries (an RMA write, which its target reads out of
// the initiator's memory and answers with a Fin): a Fin in another live endpoint's name leaves
// it pending, its target's completes it.
TEST(LocalSegments, OnlyTheTargetOfAWriteEndsIt) {
    Rdm a, b, c;
    a.open(FI_MSG | FI_RMA);
    b.open(FI_MSG | FI_RMA);
    c.open();
    const fi_addr_t to_b = a.insert(b);
    a.insert(c);
    const size_t len = 4u << 20;
    std::vector<uint8_t> region(len, 0), local(len, 0x5b);
    fid_mr *region_mr = nullptr, *local_mr = nullptr;
    ASSERT_EQ(
        fi_mr_reg(b.domain, region.data(), len, FI_REMOTE_WRITE, 0, 7, 0, &region_mr, nullptr), 0);
    ASSERT_EQ(fi_mr_reg(a.domain, local.data(), len, FI_WRITE, 0, 8, 0, &local_mr, nullptr), 0);
    const uint64_t at = (b.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR)
                            ? reinterpret_cast<uint64_t>(region.data())
                            : 0;
    fi_context ctx{};
    ASSERT_EQ(fi_write(a.ep, local.data(), len, fi_mr_desc(local_mr), to_b, at,
                       fi_mr_key(region_mr), &ctx),
              0);
    tandem::wire::LocalHeader write;
    ASSERT_TRUE(waiting_at(b, tandem::wire::LocalOp::Write, write)) << "no Write reached b's inbox";

    ASSERT_NO_FATAL_FAILURE(only_its_peer_ends(a, b, c, write.msg_id, &ctx));
    fi_close(&local_mr->fid);
    fi_close(&region_mr->fid);
    c.close();
    b.close();
    a.close();
}

// The same for an atomic (off_tandem's, answered by an AtomicResp under the compact header):
// a fetching atomic's answer in another live endpoint's name leaves it pending and its result
// untouched; the target's completes it with the value the target sent.
TEST(LocalSegments, OnlyTheTargetOfAnAtomicAnswersIt) {
    Rdm a, b, c;
    a.open(FI_MSG | FI_ATOMIC);
    b.open(FI_MSG | FI_ATOMIC);
    c.open();
    const fi_addr_t to_b = a.insert(b);
    a.insert(c);
    uint64_t target = 5, operand = 1, result = 0;
    fid_mr *target_mr = nullptr;
    ASSERT_EQ(fi_mr_reg(b.domain, &target, sizeof target, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 9, 0,
                        &target_mr, nullptr),
              0);
    const uint64_t at =
        (b.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(&target) : 0;
    fi_context ctx{};
    ASSERT_EQ(fi_fetch_atomic(a.ep, &operand, 1, nullptr, &result, nullptr, to_b, at,
                              fi_mr_key(target_mr), FI_UINT64, FI_SUM, &ctx),
              0);
    ForgedSender at_b(b);
    ASSERT_TRUE(at_b.ready());
    const uint8_t *request = at_b.peek();
    ASSERT_NE(request, nullptr) << "no Atomic reached b's inbox";
    tandem::wire::LocalShortHeader h;
    memcpy(&h, request, sizeof h);
    ASSERT_EQ(h.op, uint8_t(tandem::wire::LocalOp::Atomic));

    ForgedSender to_a(a);
    ASSERT_TRUE(to_a.ready());
    ASSERT_TRUE(to_a.name_as(c));
    to_a.atomic_resp(h.tag, 0x77);
    fi_cq_tagged_entry e{};
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < until)
        ASSERT_EQ(fi_cq_read(a.cq, &e, 1), -FI_EAGAIN) << "c's answer ended an atomic sent to b";
    EXPECT_EQ(result, 0u) << "c's answer was written into the result";
    ASSERT_TRUE(to_a.name_as(b));
    to_a.atomic_resp(h.tag, 0x77);
    fi_cq_err_entry err{};
    ASSERT_EQ(next_completion(a, &e, &err), 1) << "b's answer did not end the atomic";
    EXPECT_EQ(e.op_context, &ctx);
    EXPECT_EQ(result, 0x77u);
    fi_close(&target_mr->fid);
    c.close();
    b.close();
    a.close();
}

// A sender writes its part of a split copy only into the receive of the peer it sent the
// message to: a Cts for it in another live endpoint's name gets nothing of the message.
TEST_F(RtsWaitingAtB, ASplitCopysPartIsWrittenOnlyForItsReceiver) {
    std::vector<uint8_t> part(kLen / 2, 0);
    ForgedSender to_a(a);
    ASSERT_TRUE(to_a.ready());
    ASSERT_TRUE(to_a.name_as(c));
    to_a.cts(uint32_t(getpid()), rts.msg_id, kLen / 2, kLen / 2, part.data());
    fi_cq_tagged_entry e{};
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < until) ASSERT_EQ(fi_cq_read(a.cq, &e, 1), -FI_EAGAIN);
    ASSERT_EQ(std::count(part.begin(), part.end(), 0), std::ptrdiff_t(kLen / 2))
        << "the message's part was written for c";
    ASSERT_TRUE(to_a.name_as(b));
    to_a.cts(uint32_t(getpid()), rts.msg_id, kLen / 2, kLen / 2, part.data());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (part.back() == 0 && std::chrono::steady_clock::now() < deadline)
        ASSERT_EQ(fi_cq_read(a.cq, &e, 1), -FI_EAGAIN);
    ASSERT_EQ(part.back(), kFill) << "b's Cts did not get the part";
}

// A sender that cannot copy the rest of its staged message (its device copy failed) ends it
// with a status: the receive that took the message at its first fragment fails with that
// status, as the sender's send does, rather than wait for bytes that will not come.
TEST_F(StagedFromLivePeer, OneItsSenderGaveUpOnFailsTheReceiveThatTookIt) {
    in->frag(pid, 9, 0, kPart, 2 * kPart, 0x71);
    in->frag(pid, 9, kPart, 0, 2 * kPart, 0, tandem::wire::kLocalLast, FI_EIO);
    fi_cq_tagged_entry e{};
    fi_cq_err_entry err{};
    ASSERT_EQ(next_completion(a, &e, &err), -FI_EAVAIL) << "the receive did not fail";
    EXPECT_EQ(err.op_context, &got);
    EXPECT_EQ(err.err, FI_EIO) << fi_strerror(err.err);
}

// A device message its receiver cannot map (the IpcRts's handle opens nowhere here, and a
// receiver without FI_HMEM opens none) is answered FI_EOPNOTSUPP; its sender sends it again in
// cells flagged kLocalRestaged, and those go into the receive the IpcRts matched, posted
// before the IpcRts came (late_post false) or after (the IpcRts kept as unexpected till then).
void restaged_device_message(bool late_post) {
    constexpr uint32_t kPart = 1000;
    Rdm a, b;
    std::string why;
    ASSERT_TRUE(a.try_open(why)) << why;
    ASSERT_TRUE(b.try_open(why)) << why;
    ForgedSender to_a(a), at_b(b);  // (b does not poll: the answer waits in its inbox)
    ASSERT_TRUE(to_a.ready() && at_b.ready());
    ASSERT_TRUE(to_a.name_as(b));
    const uint32_t pid = uint32_t(getpid());
    std::vector<uint8_t> got(2 * kPart, 0);
    fi_cq_tagged_entry e{};
    if (!late_post) {
        ASSERT_EQ(fi_recv(a.ep, got.data(), got.size(), nullptr, FI_ADDR_UNSPEC, &got), 0);
    }
    to_a.ipc_rts(pid, 11, 2 * kPart);
    if (late_post) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        while (std::chrono::steady_clock::now() < until)
            ASSERT_EQ(fi_cq_read(a.cq, &e, 1), -FI_EAGAIN);
        ASSERT_EQ(at_b.peek(), nullptr) << "an IpcRts with no receive yet was answered";
        ASSERT_EQ(fi_recv(a.ep, got.data(), got.size(), nullptr, FI_ADDR_UNSPEC, &got), 0);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!at_b.peek() && std::chrono::steady_clock::now() < deadline)
        ASSERT_EQ(fi_cq_read(a.cq, &e, 1), -FI_EAGAIN) << "a completion before the message came";
    const uint8_t *cell = at_b.peek();
    ASSERT_NE(cell, nullptr) << "the IpcRts's sender was not answered";
    tandem::wire::LocalHeader fin;
    memcpy(&fin, cell, sizeof fin);
    EXPECT_EQ(fin.op, uint8_t(tandem::wire::LocalOp::Fin));
    EXPECT_EQ(fin.msg_id, 11u);
    EXPECT_EQ(fin.status, FI_EOPNOTSUPP) << fi_strerror(fin.status);

    const uint8_t restaged = tandem::wire::kLocalRestaged;
    to_a.frag(pid, 11, 0, kPart, 2 * kPart, 0x81, restaged);
    to_a.frag(pid, 11, kPart, kPart, 2 * kPart, 0x82, restaged | tandem::wire::kLocalLast);
    fi_cq_err_entry err{};
    ASSERT_EQ(next_completion(a, &e, &err), 1) << "the restaged message did not complete";
    EXPECT_EQ(e.op_context, &got);
    EXPECT_EQ(e.len, 2 * kPart);
    for (uint32_t i = 0; i < 2 * kPart; ++i)
        ASSERT_EQ(got[i], i < kPart ? 0x81 : 0x82) << "byte " << i;
    b.close();
    a.close();
}

TEST(LocalSegments, ADeviceMessageItsReceiverCannotMapIsRestagedIntoTheReceiveItMatched) {
    restaged_device_message(false);
}

TEST(LocalSegments, ADeviceMessageKeptAsUnexpectedIsRestagedIntoTheReceiveThatTakesIt) {
    restaged_device_message(true);
}

}  // namespace
