// What the node-local path trusts, between processes of one user:
//  - cross-memory attach (single copy) only between processes of one job: a peer of another
//    job (FI_OFF_TANDEM_JOB, or the launcher's job id) gets its large messages staged through
//    the rings, and they arrive whole all the same;
//  - the process a cell names for a single copy is the cell's sender, whatever pid the cell
//    claims: a local process cannot have an endpoint copy a third process's memory into a
//    receive.
// The other processes are this program run again (role in TANDEM_TRUST_ROLE).
#include "common/wire.h"
#include "offload_prov/endpoint.h"
#include "main_prov/shm/inbox_segment.h"
#include "common/shm_ring.h"
#include "main_prov/shm/shm_segment.h"
#include "peer/ep_diag.h"
#include "tests/common/rdm_endpoint.h"

#include <gtest/gtest.h>

#include <rdma/fi_tagged.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Rdm = tandem_test::RdmEndpoint;
using namespace std::chrono_literals;

constexpr size_t kMessage = 1 << 20;
// Where the bystander keeps its secret: an address no other process of the test maps.
const uintptr_t kSecretAt = 0x6e5e00000000ull;
constexpr size_t kSecretLen = 4096;

uint8_t pattern(size_t i) {
    return uint8_t(i * 131 + 7);
}

bool write_all(int fd, const void *p, size_t n) {
    return write(fd, p, n) == ssize_t(n);
}

std::string endpoint_name(const Rdm &r) {
    char buf[64];
    size_t len = sizeof buf;
    return fi_getname(&r.ep->fid, buf, &len) == 0 ? std::string(buf, len) : std::string();
}

// Roles of the other processes. Each writes what the parent needs to stdout (fd 1, a pipe).
int receiver_role() {  // receives one message and checks it; exit status 0 when whole
    Rdm r;
    std::string why;
    if (!r.try_open(why)) return 10;
    std::string name = endpoint_name(r);
    uint32_t len = uint32_t(name.size());
    if (!write_all(1, &len, sizeof len) || !write_all(1, name.data(), len)) return 11;
    std::vector<uint8_t> buf(kMessage);
    if (fi_recv(r.ep, buf.data(), buf.size(), nullptr, FI_ADDR_UNSPEC, nullptr)) return 12;
    auto deadline = std::chrono::steady_clock::now() + 30s;
    fi_cq_tagged_entry e;
    for (;;) {
        ssize_t n = fi_cq_read(r.cq, &e, 1);
        if (n == 1) break;
        if (n != -FI_EAGAIN || std::chrono::steady_clock::now() > deadline) return 13;
    }
    for (size_t i = 0; i < kMessage; ++i)
        if (buf[i] != pattern(i)) return 14;
    return e.len == kMessage ? 0 : 15;
}

int endpoint_role() {  // an endpoint that makes progress until the parent goes
    Rdm r;
    std::string why;
    if (!r.try_open(why)) return 10;
    std::string name = endpoint_name(r);
    uint32_t len = uint32_t(name.size());
    pid_t pid = getpid();
    if (!write_all(1, &pid, sizeof pid) || !write_all(1, &len, sizeof len) ||
        !write_all(1, name.data(), len))
        return 11;
    fi_cq_tagged_entry e;
    for (;;) {
        while (fi_cq_read(r.cq, &e, 1) != -FI_EAGAIN) {
            fi_cq_err_entry err{};
            fi_cq_readerr(r.cq, &err, 0);
        }
        usleep(500);
    }
}

int bystander_role() {  // holds a secret at kSecretAt
    void *p = mmap(reinterpret_cast<void *>(kSecretAt), kSecretLen, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != reinterpret_cast<void *>(kSecretAt)) return 10;
    memset(p, 0x5e, kSecretLen);
    pid_t pid = getpid();
    if (!write_all(1, &pid, sizeof pid)) return 11;
    for (;;) pause();
}

const int g_role = [] {
    const char *role = getenv("TANDEM_TRUST_ROLE");
    if (!role) return 0;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    std::string r = role;
    _exit(r == "receiver" ? receiver_role() : r == "endpoint" ? endpoint_role() : bystander_role());
}();

// Another process of this program in a role, with extra environment; its stdout is ours.
struct Child {
    pid_t pid = -1;
    int out = -1;
    Child(const char *role, std::vector<std::string> env) {
        int fds[2];
        if (pipe(fds) != 0) return;
        pid = fork();
        if (pid == 0) {
            dup2(fds[1], 1);
            close(fds[0]);
            setenv("TANDEM_TRUST_ROLE", role, 1);
            for (auto &kv : env) putenv(kv.data());
            execl("/proc/self/exe", "/proc/self/exe", static_cast<char *>(nullptr));
            _exit(99);
        }
        close(fds[1]);
        out = fds[0];
    }
    template <typename T>
    bool read_value(T &v) {
        return read(out, &v, sizeof v) == ssize_t(sizeof v);
    }
    bool read_name(std::string &name) {
        uint32_t len = 0;
        if (!read_value(len) || len > 64) return false;
        name.resize(len);
        return read(out, name.data(), len) == ssize_t(len);
    }
    int wait_exit() {
        int status = 0;
        if (waitpid(pid, &status, 0) != pid) return -1;
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    ~Child() {
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
        if (out >= 0) close(out);
    }
};

// This process's job (read when the provider loads).
const int g_env = setenv("FI_OFF_TANDEM_JOB", "job-a", 1) | setenv("FI_TANDEM_LOCAL", "1", 1);

struct Opened : Rdm {
    tandem::peer::EpDiagOps *diag = nullptr;
    ~Opened() { close(); }
    void open() {
        ASSERT_NO_FATAL_FAILURE(Rdm::open());
        void *ops = nullptr;
        ASSERT_EQ(fi_open_ops(&ep->fid, tandem::peer::kEpDiagOpsName, 0, &ops, nullptr), 0);
        diag = static_cast<tandem::peer::EpDiagOps *>(ops);
    }
};

// A 1 MiB message to a receiver in another process of the given job: the path it takes, and
// whether it arrived whole.
void send_to_job(const char *job, tandem::peer::PeerPath expected) {
    ASSERT_EQ(g_env, 0);
    Opened me;
    ASSERT_NO_FATAL_FAILURE(me.open());
    Child rx("receiver", {std::string("FI_OFF_TANDEM_JOB=") + job});
    std::string name;
    ASSERT_TRUE(rx.read_name(name)) << "the receiver did not start";
    fi_addr_t dest = FI_ADDR_NOTAVAIL;
    ASSERT_EQ(fi_av_insert(me.av, name.data(), 1, &dest, 0, nullptr), 1);
    EXPECT_EQ(me.diag->peer_path(me.ep, dest), int(expected));
    std::vector<uint8_t> msg(kMessage);
    for (size_t i = 0; i < kMessage; ++i) msg[i] = pattern(i);
    ssize_t ret;
    while ((ret = fi_send(me.ep, msg.data(), msg.size(), nullptr, dest, nullptr)) == -FI_EAGAIN)
        fi_cq_read(me.cq, nullptr, 0);
    ASSERT_EQ(ret, 0);
    fi_cq_tagged_entry e;
    auto deadline = std::chrono::steady_clock::now() + 30s;
    while ((ret = fi_cq_read(me.cq, &e, 1)) == -FI_EAGAIN)
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the send never completed";
    if (ret == -FI_EAVAIL) {
        // (What the error was, and how the receiver saw the transfer. Under load this test
        // failed so, about 1 run in 30: FI_ECONNRESET, the receiver exited with 0. Its death
        // was judged before its Fin was read; api.peer_death
        // ReceiverThatAnsweredAndExitedDoesNotFailTheSend holds that case now.)
        fi_cq_err_entry err{};
        fi_cq_readerr(me.cq, &err, 0);
        ADD_FAILURE() << "the send failed: " << fi_strerror(err.err) << " (prov_errno "
                      << err.prov_errno << "); the receiver exited with " << rx.wait_exit();
        return;
    }
    ASSERT_EQ(ret, 1) << fi_strerror(int(-ret));
    EXPECT_EQ(rx.wait_exit(), 0) << "the receiver did not get the message whole";
}

TEST(LocalTrust, SingleCopyWithinOneJob) {
    send_to_job("job-a", tandem::peer::PeerPath::LocalSingleCopy);
}

TEST(LocalTrust, StagedWithAnotherJob) {
    send_to_job("job-b", tandem::peer::PeerPath::LocalStaged);
}

// A cell in our inbox claiming to come from a live endpoint of another process, asking us to
// read a message by single copy from a third process's memory (its pid in the cell). We read
// from the sender's process instead, where that address is not mapped: the receive fails
// (FI_EIO) and holds none of the third process's bytes.
TEST(LocalTrust, CellCannotNameAThirdProcess) {
    ASSERT_EQ(g_env, 0);
    Opened me;
    ASSERT_NO_FATAL_FAILURE(me.open());
    Child mallory("endpoint", {"FI_OFF_TANDEM_JOB=job-a"});
    Child bystander("bystander", {});
    pid_t mallory_pid = 0, bystander_pid = 0;
    std::string mallory_name;
    ASSERT_TRUE(mallory.read_value(mallory_pid) && mallory.read_name(mallory_name));
    ASSERT_TRUE(bystander.read_value(bystander_pid));
    std::vector<uint8_t> rbuf(kSecretLen, 0);
    ASSERT_EQ(fi_recv(me.ep, rbuf.data(), rbuf.size(), nullptr, FI_ADDR_UNSPEC, &rbuf), 0);

    // The Rts cell, written into our inbox as a local process of this user can.
    std::string my_name = endpoint_name(me);
    auto key = tandem::shm::local_key(my_name.data(), my_name.size());
    ASSERT_TRUE(key);
    auto inbox = tandem::shm::InboxSegment::open(*key, tandem::wire::kLocalCellSize);
    ASSERT_TRUE(inbox);
    tandem::ShmRing *ring = inbox->ring;
    void *slot = ring->try_reserve(tandem::own_process_token());
    ASSERT_NE(slot, nullptr);
    auto *cell = static_cast<uint8_t *>(slot);
    memset(cell, 0, tandem::wire::kLocalCellSize);
    tandem::wire::LocalHeader h{};
    h.op = uint8_t(tandem::wire::LocalOp::Rts);
    h.name_len = uint8_t(mallory_name.size());
    h.iov_count = 1;
    h.pid = bystander_pid;
    h.msg_id = 7;
    h.total = kSecretLen;
    memcpy(cell, &h, sizeof h);
    memcpy(cell + sizeof h, mallory_name.data(), mallory_name.size());
    tandem::wire::LocalIov iov{kSecretAt, kSecretLen};
    memcpy(cell + sizeof h + tandem::wire::kLocalNameRoom, &iov, sizeof iov);
    ring->publish(slot);

    fi_cq_err_entry err{};
    fi_cq_tagged_entry e;
    auto deadline = std::chrono::steady_clock::now() + 10s;
    ssize_t ret;
    while ((ret = fi_cq_read(me.cq, &e, 1)) == -FI_EAGAIN)
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the receive never ended";
    ASSERT_EQ(ret, -FI_EAVAIL) << "the receive completed: it read some process's memory";
    ASSERT_EQ(fi_cq_readerr(me.cq, &err, 0), 1);
    EXPECT_EQ(err.op_context, &rbuf);
    EXPECT_EQ(err.err, FI_EIO) << fi_strerror(err.err);
    for (size_t i = 0; i < kSecretLen; ++i)
        ASSERT_NE(rbuf[i], 0x5e) << "the third process's secret reached the receive (byte " << i
                                 << ")";
}

}  // namespace
