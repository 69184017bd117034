// The NCCL network plugin (nccl_plugin/, libnccl-net-tandem.so), driven as NCCL drives it: the
// library is dlopen()ed by the name NCCL builds from NCCL_NET_PLUGIN and its ncclNetPlugin_v*
// tables are taken with dlsym, never linked, so that the test sees exactly the exported ABI
// (declared in nccl_plugin/nccl_net_abi.h) and nothing else of the plugin.
//
// Every test forks its roles (a receiver and a sender, or one process for the calls that need
// no peer) before anything is loaded: the gtest process never loads the plugin, libfabric or
// the CUDA driver, so each role initialises them on its own, as NCCL's ranks do, and the
// tests also run one after another in one gtest process. The roles run under
// atomic_procs::run_roles (tests/common/atomic_processes.h): failures are reported as they
// happen, every role is killed at the test's deadline. Between the two roles:
//   - a SOCK_SEQPACKET socketpair made before the fork: NCCL's bootstrap, which carries the
//     listen handle to the sender, and short "I got it" messages;
//   - a shared Board whose flags say "the other role failed" (or crashed), so that a role
//     waiting for its peer gives up at once instead of at its 20 s deadline.
// CUDA memory comes from the driver on the library path (the emulated one, tests/emucuda, in
// ctest), through tests/common/hmem_driver.h; its device memory is PROT_NONE to the CPU, so
// it is filled and checked only with the driver's copies.
//
// The ctest variants (tests/nccl/CMakeLists.txt): nccl.local.* (tandem's node-local path
// between the two processes) and nccl.net.* (FI_TANDEM_LOCAL=0: over the TCP link).
#include "nccl_plugin/nccl_net_abi.h"
#include "tests/common/atomic_processes.h"
#include "tests/common/hmem_driver.h"
#include "tests/common/shared_map.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <deque>
#include <thread>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

namespace tn = tandem::nccl;
namespace ap = tandem_test::atomic_procs;
using ap::cat;
using ap::Report;
using tandem_test::pattern;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kWait = 20s;       // every loop on the plugin or the peer (the contract's 20 s)
constexpr auto kSupervise = 50s;  // a whole test, all roles (ctest's timeout is 60 s)
constexpr size_t KiB = 1024, MiB = 1024 * 1024;
constexpr uint64_t kCommId = 0x7a9de30c11ull;  // both roles: one communicator, as in NCCL
constexpr int kMaxRecvs = 8;                   // the plugin's promised maxRecvs

size_t round_up(size_t v, size_t to) {
    return (v + to - 1) / to * to;
}

std::string rc_name(tn::Result rc) {
    switch (rc) {
        case tn::kSuccess:
            return "ncclSuccess (0)";
        case tn::kUnhandledCudaError:
            return "ncclUnhandledCudaError (1)";
        case tn::kSystemError:
            return "ncclSystemError (2)";
        case tn::kInternalError:
            return "ncclInternalError (3)";
        case tn::kInvalidArgument:
            return "ncclInvalidArgument (4)";
        case tn::kInvalidUsage:
            return "ncclInvalidUsage (5)";
        case tn::kRemoteError:
            return "ncclRemoteError (6)";
    }
    return cat("result ", int(rc));
}

// ---- checks inside a role (every helper returns false once it has reported a failure) -------

#define N_FAIL(r, ...) AP_FAIL(r, __VA_ARGS__)
#define N_TRY(expr)                \
    do {                           \
        if (!(expr)) return false; \
    } while (0)
#define N_REQUIRE(r, cond, ...)                                                \
    do {                                                                       \
        if (!(cond)) return N_FAIL(r, #cond __VA_OPT__(, ": ", ) __VA_ARGS__); \
    } while (0)
#define N_CHECK AP_CHECK
// `call` must give `want`; the failure names the call and what it gave.
#define N_RC(r, call, want)                                                                 \
    do {                                                                                    \
        const tn::Result rc_ = (call);                                                      \
        if (rc_ != (want))                                                                  \
            return N_FAIL(r, #call, " gives ", rc_name(rc_), ", expected ", rc_name(want)); \
    } while (0)
#define N_OK(r, call) N_RC(r, call, tn::kSuccess)
// The same, without leaving the helper (a close at the end of a role).
#define N_EXPECT_RC(r, call, want)                                                   \
    do {                                                                             \
        const tn::Result rc_ = (call);                                               \
        if (rc_ != (want))                                                           \
            N_FAIL(r, #call, " gives ", rc_name(rc_), ", expected ", rc_name(want)); \
    } while (0)

// ---- the logger given to init: it records, so that the tests can count WARN lines -----------

struct LogLine {
    tn::LogLevel level;
    std::string text;
};
std::mutex g_log_mu;  // the plugin may log from its own threads
std::vector<LogLine> g_log;

void record_log(tn::LogLevel level, unsigned long, const char *file, int line, const char *fmt,
                ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt ? fmt : "(null format)", ap);
    va_end(ap);
    std::lock_guard lk(g_log_mu);
    g_log.push_back({level, cat(file ? file : "?", ":", line, ": ", buf)});
}

size_t log_size() {
    std::lock_guard lk(g_log_mu);
    return g_log.size();
}

std::vector<std::string> warns_since(size_t from) {
    std::lock_guard lk(g_log_mu);
    std::vector<std::string> out;
    for (size_t i = from; i < g_log.size(); ++i)
        if (g_log[i].level == tn::kLogWarn) out.push_back(g_log[i].text);
    return out;
}

// The contract: a bad input is reported once, as one WARN line, through the logger of init.
bool warned_once(Report &r, size_t since, const std::string &what) {
    std::vector<std::string> w = warns_since(since);
    if (w.size() == 1) return true;
    std::string lines;
    for (const auto &s : w) lines += cat(" | ", s);
    return N_FAIL(r, what, ": the plugin logged ", w.size(), " WARN lines, expected 1", lines);
}

// ---- the two roles' channel and failure flags ------------------------------------------------

struct Board {
    std::atomic<int> failed[2];  // by role: 0 the receiver, 1 the sender
};

Board *g_board = nullptr;  // this child's, for its crash handler
int g_me = 0;

// A crash flags the role as failed before atomic_procs' handler reports it and dies.
void flag_crash(int sig, siginfo_t *si, void *uc) {
    if (g_board) g_board->failed[g_me].store(1);
    ap::on_fatal_signal(sig, si, uc);
}

class Link {
  public:
    Link(int fd, Board *board, int me) : fd_(fd), board_(board), me_(me) {}

    bool peer_failed() const { return board_ && board_->failed[1 - me_].load() != 0; }

    bool send(Report &r, const void *p, size_t n, const std::string &what) {
        if (::send(fd_, p, n, MSG_NOSIGNAL) != ssize_t(n))
            return N_FAIL(r, "sending ", what, " to the other role: ", strerror(errno));
        return true;
    }
    // The other role's next message.
    bool recv(Report &r, std::string &out, const std::string &what) {
        const auto until = Clock::now() + kWait;
        for (;;) {
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 10) > 0) {
                char buf[4096];
                ssize_t got = ::recv(fd_, buf, sizeof buf, 0);
                if (got > 0) {
                    out.assign(buf, size_t(got));
                    return true;
                }
                if (got == 0 || (errno != EINTR && errno != EAGAIN))
                    return N_FAIL(r, "waiting for ", what, ": the channel closed");
            }
            if (peer_failed())
                return N_FAIL(r, "waiting for ", what, ": the other role failed (see its report)");
            if (Clock::now() > until)
                return N_FAIL(r, "waiting for ", what, ": nothing after ", kWait.count(), " s");
        }
    }
    bool recv_exact(Report &r, void *p, size_t n, const std::string &what) {
        std::string m;
        N_TRY(recv(r, m, what));
        N_REQUIRE(r, m.size() == n, what, " has ", m.size(), " bytes, expected ", n);
        memcpy(p, m.data(), n);
        return true;
    }
    bool tell(Report &r, const std::string &msg) {
        return send(r, msg.data(), msg.size(), cat('"', msg, '"'));
    }
    bool expect(Report &r, const std::string &msg) {
        std::string m;
        N_TRY(recv(r, m, cat('"', msg, '"')));
        N_REQUIRE(r, m == msg, "the other role said \"", m, "\", expected \"", msg, "\"");
        return true;
    }

  private:
    int fd_;
    Board *board_;
    int me_;
};

// Calls `step` until it returns 1 (done) or -1 (failed, and said why), as NCCL's proxy polls
// the plugin; fails after kWait, or at once when the other role has failed.
template <typename Step>
bool poll_until(Report &r, const Link &l, const std::string &what, Step &&step) {
    const auto until = Clock::now() + kWait;
    for (;;) {
        int s = step();
        if (s > 0) return true;
        if (s < 0) return false;
        if (l.peer_failed()) return N_FAIL(r, what, ": the other role failed (see its report)");
        if (Clock::now() > until) return N_FAIL(r, what, ": not done after ", kWait.count(), " s");
        sched_yield();  // two processes polling on two shared cores
    }
}

// Before closing: each side tells the other that all its requests completed, and waits to
// hear the same. NCCL itself puts no barrier between the ranks before closing their comms
// (commDestroySync only synchronizes its own streams); the transfer tests close in step so
// that they test the transfers, and Teardown.* tests the unsynchronized close on its own.
bool both_done(Report &r, Link &l, bool receiver) {
    N_TRY(l.tell(r, receiver ? "received" : "sent"));
    return l.expect(r, receiver ? "sent" : "received");
}

// ---- running the roles -----------------------------------------------------------------------

using Body = std::function<bool(Report &, Link &)>;

// What the roles reported becomes this test's result. A role that cannot run its case says
// "SKIP <why>" in a note.
void conclude(const ap::RunResult &res) {
    for (const auto &f : res.failures) ADD_FAILURE() << f;
    if (!res.failures.empty() || getenv("NCCL_TEST_VERBOSE")) {
        for (const auto &n : res.notes) printf("%s\n", n.c_str());
        printf("(%.2f s)\n", res.seconds);
    }
    if (!res.failures.empty()) return;
    for (const auto &n : res.notes) {
        auto at = n.find("] SKIP ");
        if (at != std::string::npos) GTEST_SKIP() << n.substr(at + 7);
    }
}

ap::RoleDef role_def(const char *name, const char *comm, int me, Board *board, int chan[2],
                     Body body) {
    return {name,
            comm,
            [=](Report &r) {
                g_board = board;
                g_me = me;
                struct sigaction sa {};
                sa.sa_sigaction = flag_crash;
                sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
                for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT})
                    sigaction(sig, &sa, nullptr);
                int fd = -1;
                if (chan) {
                    ::close(chan[1 - me]);  // only the other role's end stays with it
                    fd = chan[me];
                }
                Link l(fd, board, me);
                try {
                    body(r, l);
                } catch (const std::exception &e) {
                    N_FAIL(r, "exception: ", e.what());
                }
                if (r.failed()) {
                    board->failed[me].store(1);
                    // What the plugin said, for the diagnosis (printed with the failures).
                    for (const auto &w : warns_since(0)) r.note(cat("plugin WARN: ", w));
                }
            },
            {}};
}

// The receiver and the sender, each in a child; the parent only waits and reports.
void run_pair(Body receiver, Body sender) {
    int chan[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, chan), 0) << strerror(errno);
    tandem_test::SharedMap<Board> board;
    ap::SharedBlock block;  // run_roles' own shared state (we use none of it)
    ASSERT_TRUE(board.get() && block.get()) << "mmap failed";
    // The receiver first: atomic_procs calls roles[0] the target, the one that outlives the rest.
    std::vector<ap::RoleDef> roles{
        role_def("receiver", "nccl-recv", 0, board.get(), chan, std::move(receiver)),
        role_def("sender", "nccl-send", 1, board.get(), chan, std::move(sender))};
    ap::RunResult res = ap::run_roles(roles, *block.get(), kSupervise);
    ::close(chan[0]);
    ::close(chan[1]);
    conclude(res);
}

// One role, for the calls that need no peer.
void run_one(std::function<bool(Report &)> body) {
    tandem_test::SharedMap<Board> board;
    ap::SharedBlock block;
    ASSERT_TRUE(board.get() && block.get()) << "mmap failed";
    std::vector<ap::RoleDef> roles{role_def("process", "nccl-one", 0, board.get(), nullptr,
                                            [body](Report &r, Link &) { return body(r); })};
    conclude(ap::run_roles(roles, *block.get(), kSupervise));
}

// ---- the plugin, as NCCL loads it ------------------------------------------------------------

// The library NCCL loads for NCCL_NET_PLUGIN=<name>: libnccl-net-<name>.so, from the library
// path, with RTLD_NOW | RTLD_LOCAL as NCCL does. Never closed (NCCL keeps it too).
void *open_plugin(Report &r) {
    static void *h = nullptr;
    if (h) return h;
    const char *name = getenv("NCCL_NET_PLUGIN");
    if (!name || !*name) {
        N_FAIL(r, "NCCL_NET_PLUGIN is not set (ctest sets it to tandem)");
        return nullptr;
    }
    std::string lib = cat("libnccl-net-", name, ".so");
    h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        N_FAIL(r, "dlopen(", lib, "): ", e ? e : "?");
    }
    return h;
}

template <typename T>
const T *load_table(Report &r) {
    void *h = open_plugin(r);
    if (!h) return nullptr;
    auto *t = static_cast<const T *>(dlsym(h, T::kSymbol));
    if (!t) N_FAIL(r, "the plugin exports no ", T::kSymbol);
    return t;
}

// One version's table behind one interface, so that a scenario runs on any of them: the
// adaptor supplies what an older table lacks (v11's context, v10's connect config, the
// profiler handles) and narrows sizes to the int of v6..v8 as NCCL's own adaptors do.
template <typename T>
class Net {
  public:
    static constexpr int kV = T::kVersion;
    using Props = typename T::Properties;

    const T *t = nullptr;
    void *ctx = nullptr;  // v11, v12: init's per-communicator context

    tn::Result init() {
        if constexpr (kV >= 11)
            return t->init(&ctx, kCommId, &config_, record_log, nullptr);
        else if constexpr (kV == 10)
            return t->init(record_log, nullptr);
        else
            return t->init(record_log);
    }
    tn::Result listen(int dev, void *handle, void **lcomm) {
        if constexpr (kV >= 11)
            return t->listen(ctx, dev, handle, lcomm);
        else
            return t->listen(dev, handle, lcomm);
    }
    tn::Result connect(int dev, void *handle, void **scomm, tn::DeviceHandle **dh) {
        if constexpr (kV >= 11)
            return t->connect(ctx, dev, handle, scomm, dh);
        else if constexpr (kV == 10)
            return t->connect(dev, &config_, handle, scomm, dh);
        else if constexpr (kV >= 7)
            return t->connect(dev, handle, scomm, dh);
        else
            return (void)dh, t->connect(dev, handle, scomm);
    }
    tn::Result accept(void *lcomm, void **rcomm, tn::DeviceHandle **dh) {
        if constexpr (kV >= 7)
            return t->accept(lcomm, rcomm, dh);
        else
            return (void)dh, t->accept(lcomm, rcomm);
    }
    tn::Result reg_mr(void *comm, void *data, size_t size, int type, void **mh) {
        if constexpr (kV >= 8)
            return t->reg_mr(comm, data, size, type, mh);
        else
            return t->reg_mr(comm, data, int(size), type, mh);
    }
    tn::Result isend(void *comm, void *data, size_t size, int tag, void *mh, void **req) {
        if constexpr (kV >= 10)
            return t->isend(comm, data, size, tag, mh, nullptr, req);
        else if constexpr (kV == 9)
            return t->isend(comm, data, size, tag, mh, req);
        else
            return t->isend(comm, data, int(size), tag, mh, req);
    }
    tn::Result irecv(void *comm, int n, void **data, const size_t *sizes, int *tags, void **mhs,
                     void **req) {
        if constexpr (kV >= 9) {
            std::vector<size_t> sz(sizes, sizes + n);
            if constexpr (kV >= 10) {
                std::vector<void *> phandles(size_t(n), nullptr);
                return t->irecv(comm, n, data, sz.data(), tags, mhs, phandles.data(), req);
            } else {
                return t->irecv(comm, n, data, sz.data(), tags, mhs, req);
            }
        } else {
            std::vector<int> sz(sizes, sizes + n);
            return t->irecv(comm, n, data, sz.data(), tags, mhs, req);
        }
    }

  private:
    tn::CommConfig config_{-1};  // NCCL's default (no traffic class); may be kept by the plugin
};

// What every role does first, as an NCCL rank does: CUDA up (device 0 current), the plugin
// loaded, its name checked, init, at least one device.
template <typename T>
bool open_net(Report &r, Net<T> &net) {
    if (std::string e = tandem_test::use_device0(); !e.empty())
        return N_FAIL(r, "CUDA device 0: ", e);
    net.t = load_table<T>(r);
    N_TRY(net.t);
    N_REQUIRE(r, net.t->name && std::string(net.t->name) == "tandem", "the table's name is \"",
              net.t->name ? net.t->name : "(null)", "\"");
    N_OK(r, net.init());
    int n = 0;
    N_OK(r, net.t->devices(&n));
    N_REQUIRE(r, n >= 1, "devices() gives ", n);
    return true;
}

template <typename T>
bool close_net(Report &r, Net<T> &net) {
    if constexpr (Net<T>::kV >= 11) N_OK(r, net.t->finalize(net.ctx));
    return true;
}

// The receiver's half of NCCL's connection set-up: listen, the handle to the sender (NCCL's
// bootstrap), accept until it gives a comm.
template <typename T>
bool accept_conn(Report &r, Link &l, Net<T> &net, void **lcomm, void **rcomm) {
    char handle[tn::kHandleMaxSize] = {};
    *lcomm = nullptr;
    N_OK(r, net.listen(0, handle, lcomm));
    N_REQUIRE(r, *lcomm != nullptr, "listen succeeded without a listen comm");
    N_TRY(l.send(r, handle, sizeof handle, "the listen handle"));
    tn::DeviceHandle *dh = nullptr;
    *rcomm = nullptr;
    N_TRY(poll_until(r, l, "accept", [&]() -> int {
        tn::Result rc = net.accept(*lcomm, rcomm, &dh);
        if (rc != tn::kSuccess) {
            N_FAIL(r, "accept gives ", rc_name(rc));
            return -1;
        }
        return *rcomm != nullptr;
    }));
    N_REQUIRE(r, dh == nullptr, "accept set a device handle (the plugin offers none)");
    return true;
}

// The sender's half: the handle, and connect with that same buffer until it gives a comm (the
// plugin may keep its progress in the handle, as NCCL allows).
template <typename T>
bool connect_conn(Report &r, Link &l, Net<T> &net, void **scomm, char *handle_out = nullptr) {
    char handle[tn::kHandleMaxSize];
    N_TRY(l.recv_exact(r, handle, sizeof handle, "the listen handle"));
    if (handle_out) memcpy(handle_out, handle, sizeof handle);
    tn::DeviceHandle *dh = nullptr;
    *scomm = nullptr;
    N_TRY(poll_until(r, l, "connect", [&]() -> int {
        tn::Result rc = net.connect(0, handle, scomm, &dh);
        if (rc != tn::kSuccess) {
            N_FAIL(r, "connect gives ", rc_name(rc));
            return -1;
        }
        return *scomm != nullptr;
    }));
    N_REQUIRE(r, dh == nullptr, "connect set a device handle (the plugin offers none)");
    return true;
}

// ---- memory ----------------------------------------------------------------------------------

// Host memory, or device 0's (hmem_driver.h's device0_memory: only the driver's copies touch
// it). Allocations start zeroed.
class Buf {
  public:
    Buf() = default;
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    ~Buf() {
        if (p_) mem_.release(p_);
    }

    bool alloc(Report &r, bool cuda, size_t len) {
        mem_ = cuda ? tandem_test::device0_memory<ap::Memory>() : ap::Memory{};
        cuda_ = cuda;
        len_ = std::max<size_t>(len, 4096);  // never 0 bytes: NCCL's buffers never are
        if (std::string e = mem_.alloc(len_, &p_); !e.empty()) {
            p_ = nullptr;
            return N_FAIL(r, "allocating ", len_, " B of ", mem_.name, " memory: ", e);
        }
        return true;
    }
    void *ptr(size_t off = 0) const { return static_cast<char *>(p_) + off; }
    size_t len() const { return len_; }
    bool cuda() const { return cuda_; }
    int type() const { return cuda_ ? tn::kPtrCuda : tn::kPtrHost; }
    const char *kind() const { return cuda_ ? "CUDA" : "host"; }

    // [off, off + n) := pattern(seed).
    bool fill(Report &r, uint32_t seed, size_t off, size_t n) {
        if (!n) return true;
        std::vector<uint8_t> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = pattern(i, seed);
        if (std::string e = mem_.put(ptr(off), v.data(), n); !e.empty())
            return N_FAIL(r, "writing ", n, " B of ", kind(), " memory: ", e);
        return true;
    }
    // Does [off, off + n) hold pattern(seed)? A failure names the first wrong byte.
    bool check(Report &r, uint32_t seed, size_t off, size_t n, const std::string &what) {
        if (!n) return true;
        std::vector<uint8_t> v(n);
        if (std::string e = mem_.get(v.data(), ptr(off), n); !e.empty())
            return N_FAIL(r, what, ": reading ", n, " B of ", kind(), " memory: ", e);
        for (size_t i = 0; i < n; ++i) {
            if (v[i] != pattern(i, seed)) {
                size_t bad = 0;
                for (size_t j = i; j < n; ++j) bad += v[j] != pattern(j, seed);
                return N_FAIL(r, what, ": byte ", i, " of ", n, " is ", int(v[i]), ", expected ",
                              int(pattern(i, seed)), " (", bad, " bytes differ)");
            }
        }
        return true;
    }

  private:
    ap::Memory mem_;
    void *p_ = nullptr;
    size_t len_ = 0;
    bool cuda_ = false;
};

// `count` buffers of `slot` bytes, registered with the comm: each an allocation and a
// registration of its own, or all slices of one (NCCL registers its buffers whole and sends
// from inside them).
template <typename T>
class Slots {
  public:
    bool alloc(Report &r, Net<T> &net, void *comm, bool cuda, size_t count, size_t slot,
               bool per_buffer) {
        slot_ = slot;
        per_ = per_buffer;
        size_t nbufs = per_buffer ? count : 1, len = per_buffer ? slot : slot * count;
        for (size_t i = 0; i < nbufs; ++i) {
            bufs_.push_back(std::make_unique<Buf>());
            N_TRY(bufs_.back()->alloc(r, cuda, len));
            mhs_.push_back(nullptr);
            N_OK(r, net.reg_mr(comm, bufs_.back()->ptr(), len, bufs_.back()->type(), &mhs_.back()));
        }
        return true;
    }
    void *ptr(size_t i) const { return per_ ? bufs_[i]->ptr() : bufs_[0]->ptr(i * slot_); }
    void *mh(size_t i) const { return per_ ? mhs_[i] : mhs_[0]; }
    bool fill(Report &r, size_t i, uint32_t seed, size_t n) {
        return per_ ? bufs_[i]->fill(r, seed, 0, n) : bufs_[0]->fill(r, seed, i * slot_, n);
    }
    bool check(Report &r, size_t i, uint32_t seed, size_t n, const std::string &what) {
        return per_ ? bufs_[i]->check(r, seed, 0, n, what)
                    : bufs_[0]->check(r, seed, i * slot_, n, what);
    }
    bool release(Report &r, Net<T> &net, void *comm) {
        for (void *mh : mhs_) N_OK(r, net.t->dereg_mr(comm, mh));
        mhs_.clear();
        return true;
    }

  private:
    std::vector<std::unique_ptr<Buf>> bufs_;
    std::vector<void *> mhs_;
    size_t slot_ = 0;
    bool per_ = true;
};

// ---- requests --------------------------------------------------------------------------------

// isend as NCCL calls it: again while the plugin gives no request.
// A send's source: `len` bytes of pattern(seed) in host or CUDA memory, registered with comm.
template <typename T>
bool send_source(Report &r, Net<T> &net, void *comm, Buf &buf, bool cuda, size_t len, uint32_t seed,
                 void **mh) {
    N_TRY(buf.alloc(r, cuda, len));
    N_TRY(buf.fill(r, seed, 0, len));
    N_OK(r, net.reg_mr(comm, buf.ptr(), buf.len(), buf.type(), mh));
    return true;
}

template <typename T>
bool post_send(Report &r, Link &l, Net<T> &net, void *comm, void *data, size_t size, int tag,
               void *mh, void **req, const std::string &what) {
    *req = nullptr;
    return poll_until(r, l, cat("isend of ", what), [&]() -> int {
        tn::Result rc = net.isend(comm, data, size, tag, mh, req);
        if (rc != tn::kSuccess) {
            N_FAIL(r, "isend of ", what, " gives ", rc_name(rc));
            return -1;
        }
        return *req != nullptr;
    });
}

template <typename T>
bool post_recv(Report &r, Link &l, Net<T> &net, void *comm, int n, void **data, const size_t *sizes,
               int *tags, void **mhs, void **req, const std::string &what) {
    *req = nullptr;
    return poll_until(r, l, cat("irecv of ", what), [&]() -> int {
        tn::Result rc = net.irecv(comm, n, data, sizes, tags, mhs, req);
        if (rc != tn::kSuccess) {
            N_FAIL(r, "irecv of ", what, " gives ", rc_name(rc));
            return -1;
        }
        return *req != nullptr;
    });
}

// Tests until done: `sizes` gets the n sizes test wrote; a sentinel after them must stay.
template <typename T>
bool wait_done(Report &r, Link &l, Net<T> &net, void *req, int n, std::vector<int> &sizes,
               const std::string &what) {
    sizes.assign(size_t(n) + 1, -1);
    N_TRY(poll_until(r, l, cat("the completion of ", what), [&]() -> int {
        int done = 0;
        tn::Result rc = net.t->test(req, &done, sizes.data());
        if (rc != tn::kSuccess) {
            N_FAIL(r, "test of ", what, " gives ", rc_name(rc));
            return -1;
        }
        return done != 0;
    }));
    N_REQUIRE(r, sizes[size_t(n)] == -1, "test of ", what, " wrote more than ", n, " sizes");
    sizes.resize(size_t(n));
    return true;
}

// After a receive into CUDA memory: the flush NCCL issues. tandem's data is in device memory
// when the receive completes (its copies are synchronous), so the contract is: success and no
// request to wait for.
template <typename T>
bool flush(Report &r, Link &l, Net<T> &net, void *rcomm, int n, void **data,
           std::vector<int> &sizes, void **mhs, const std::string &what) {
    void *req = nullptr;
    N_OK(r, net.t->iflush(rcomm, n, data, sizes.data(), mhs, &req));
    if (req) {
        N_FAIL(r, "iflush after ", what, " gave a request (the contract: none)");
        std::vector<int> ignored;
        N_TRY(wait_done(r, l, net, req, n, ignored, cat("the flush of ", what)));
    }
    return true;
}

// ---- scenarios: one message at a time, every size -------------------------------------------

struct Combo {
    bool src_cuda, dst_cuda;
    const char *name;
};

constexpr Combo kCombos[] = {{false, false, "HostToHost"},
                             {false, true, "HostToCuda"},
                             {true, false, "CudaToHost"},
                             {true, true, "CudaToCuda"}};

// For gtest's listing: the name, not the bytes.
void PrintTo(const Combo &c, std::ostream *os) {
    *os << c.name;
}

// 64 MiB only where both sides are of one kind: a few of them keep the binary quick.
std::vector<size_t> sizes_of(const Combo &c) {
    std::vector<size_t> s{0, 1, 8, 4095, 4096, 65536, 1 * MiB, 16 * MiB};
    if (c.src_cuda == c.dst_cuda) s.push_back(64 * MiB);
    return s;
}

uint32_t size_seed(size_t i) {
    return 0x51e00 + uint32_t(i);
}

constexpr int kSizesTag = 0x2a;

// getDeviceMr of a host-networking plugin: success, no device handle.
template <typename T>
bool check_device_mr(Report &r, Net<T> &net, void *comm, void *mh) {
    void *dptr = &dptr;  // anything but null: the plugin must clear it
    N_OK(r, net.t->get_device_mr(comm, mh, &dptr));
    N_REQUIRE(r, dptr == nullptr, "getDeviceMr left a device handle ", dptr);
    return true;
}

bool sizes_receiver(Report &r, Link &l, const Combo &c) {
    Net<tn::NetV11> net;
    void *lcomm, *rcomm;
    N_TRY(open_net(r, net));
    N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
    const auto sizes = sizes_of(c);
    const size_t cap = sizes.back() + 4 * KiB;
    Buf buf;
    N_TRY(buf.alloc(r, c.dst_cuda, cap));
    void *mh = nullptr;
    N_OK(r, net.reg_mr(rcomm, buf.ptr(), cap, buf.type(), &mh));
    N_TRY(check_device_mr(r, net, rcomm, mh));
    for (size_t i = 0; i < sizes.size(); ++i) {
        const size_t s = sizes[i];
        // Larger than the send either way: the whole buffer, or the size rounded up plus a page.
        size_t posted = i % 2 ? cap : round_up(s, 4 * KiB) + 4 * KiB;
        int tag = kSizesTag;
        void *data = buf.ptr(), *req = nullptr;
        const std::string what = cat("the ", s, " B message into ", buf.kind(), " memory");
        N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh, &req, what));
        std::vector<int> got;
        N_TRY(wait_done(r, l, net, req, 1, got, what));
        N_REQUIRE(r, got[0] == int(s), what, ": test gives size ", got[0], " (", posted,
                  " B posted)");
        if (c.dst_cuda && s > 0) N_TRY(flush(r, l, net, rcomm, 1, &data, got, &mh, what));
        N_TRY(buf.check(r, size_seed(i), 0, s, what));
    }
    N_TRY(both_done(r, l, /*receiver=*/true));
    N_OK(r, net.t->dereg_mr(rcomm, mh));
    N_OK(r, net.t->close_recv(rcomm));
    N_OK(r, net.t->close_listen(lcomm));
    return close_net(r, net);
}

bool sizes_sender(Report &r, Link &l, const Combo &c) {
    Net<tn::NetV11> net;
    void *scomm;
    N_TRY(open_net(r, net));
    N_TRY(connect_conn(r, l, net, &scomm));
    const auto sizes = sizes_of(c);
    Buf buf;
    N_TRY(buf.alloc(r, c.src_cuda, sizes.back() + 4 * KiB));
    void *mh = nullptr;
    N_OK(r, net.reg_mr(scomm, buf.ptr(), buf.len(), buf.type(), &mh));
    N_TRY(check_device_mr(r, net, scomm, mh));
    for (size_t i = 0; i < sizes.size(); ++i) {
        const size_t s = sizes[i];
        const std::string what = cat("the ", s, " B message from ", buf.kind(), " memory");
        N_TRY(buf.fill(r, size_seed(i), 0, s));
        void *req;
        N_TRY(post_send(r, l, net, scomm, buf.ptr(), s, kSizesTag, mh, &req, what));
        std::vector<int> got;
        N_TRY(wait_done(r, l, net, req, 1, got, what));
        N_CHECK(r, got[0] == int(s), what, ": test gives size ", got[0]);
    }
    N_TRY(both_done(r, l, /*receiver=*/false));
    N_OK(r, net.t->dereg_mr(scomm, mh));
    N_OK(r, net.t->close_send(scomm));
    return close_net(r, net);
}

class Sizes : public ::testing::TestWithParam<Combo> {};

TEST_P(Sizes, EverySizeOneAtATime) {
    const Combo c = GetParam();
    run_pair([c](Report &r, Link &l) { return sizes_receiver(r, l, c); },
             [c](Report &r, Link &l) { return sizes_sender(r, l, c); });
}

INSTANTIATE_TEST_SUITE_P(Memory, Sizes, ::testing::ValuesIn(kCombos),
                         [](const auto &info) { return std::string(info.param.name); });

// ---- scenarios: grouped receives ---------------------------------------------------------

// One message of a grouped receive, and the whole plan: the receiver posts the groups in
// order (all of them before testing any), the sender sends each group's messages in its
// send order, group after group.
struct Msg {
    int tag;
    size_t size;
    uint32_t seed;
};
struct Group {
    std::vector<Msg> msgs;        // in the order of the irecv's arrays
    std::vector<int> send_order;  // indices into msgs
};
struct Plan {
    std::vector<Group> groups;
    size_t slot = 0;  // every buffer's receive size: larger than any send
    bool src_cuda = false, dst_cuda = false;
    bool mr_per_buffer = true;     // else one registration for all buffers
    bool sender_waits = false;     // for "posted": all groups outstanding before any send
    bool send_sizes_null = false;  // the sender tests with sizes == NULL (NCCL may)
    size_t count() const {
        size_t n = 0;
        for (const auto &g : groups) n += g.msgs.size();
        return n;
    }
};

template <typename T>
bool check_props(Report &r, Net<T> &net);

// `props`: check the table's properties first (init is once per process for v6..v10).
template <typename T>
bool plan_receiver(Report &r, Link &l, const Plan &p, bool props = false) {
    Net<T> net;
    void *lcomm, *rcomm;
    N_TRY(open_net(r, net));
    if (props) N_TRY(check_props(r, net));
    N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
    Slots<T> slots;
    N_TRY(slots.alloc(r, net, rcomm, p.dst_cuda, p.count(), p.slot, p.mr_per_buffer));
    const size_t ng = p.groups.size();
    std::vector<size_t> first(ng);  // each group's first slot
    for (size_t g = 1; g < ng; ++g) first[g] = first[g - 1] + p.groups[g - 1].msgs.size();
    auto arrays = [&](size_t g, std::vector<void *> &data, std::vector<void *> &mhs) {
        data.clear();
        mhs.clear();
        for (size_t k = 0; k < p.groups[g].msgs.size(); ++k) {
            data.push_back(slots.ptr(first[g] + k));
            mhs.push_back(slots.mh(first[g] + k));
        }
    };
    std::vector<void *> reqs(ng, nullptr);
    for (size_t g = 0; g < ng; ++g) {
        const Group &G = p.groups[g];
        const int n = int(G.msgs.size());
        std::vector<void *> data, mhs;
        arrays(g, data, mhs);
        std::vector<size_t> sizes(size_t(n), p.slot);
        std::vector<int> tags;
        for (const auto &m : G.msgs) tags.push_back(m.tag);
        N_TRY(post_recv(r, l, net, rcomm, n, data.data(), sizes.data(), tags.data(), mhs.data(),
                        &reqs[g], cat("group ", g, " (n = ", n, ")")));
    }
    if (p.sender_waits) N_TRY(l.tell(r, "posted"));
    std::vector<bool> done(ng, false);
    size_t ndone = 0;
    // Every outstanding group tested in turn, as NCCL's proxy does.
    N_TRY(poll_until(r, l, cat("the completions of ", ng, " grouped receives"), [&]() -> int {
        for (size_t g = 0; g < ng; ++g) {
            if (done[g]) continue;
            const Group &G = p.groups[g];
            const int n = int(G.msgs.size());
            std::vector<int> sizes(size_t(n) + 1, -1);
            int d = 0;
            tn::Result rc = net.t->test(reqs[g], &d, sizes.data());
            if (rc != tn::kSuccess) {
                N_FAIL(r, "test of group ", g, " gives ", rc_name(rc));
                return -1;
            }
            if (!d) continue;
            done[g] = true;
            ++ndone;
            N_CHECK(r, sizes[size_t(n)] == -1, "test of group ", g, " wrote more than ", n,
                    " sizes");
            sizes.resize(size_t(n));
            size_t total = 0;
            for (int k = 0; k < n; ++k) {
                N_CHECK(r, sizes[size_t(k)] == int(G.msgs[size_t(k)].size), "group ", g, ", tag ",
                        G.msgs[size_t(k)].tag, ": test gives size ", sizes[size_t(k)],
                        ", the send had ", G.msgs[size_t(k)].size);
                total += G.msgs[size_t(k)].size;
            }
            std::vector<void *> data, mhs;
            arrays(g, data, mhs);
            const std::string what = cat("group ", g);
            if (p.dst_cuda && total > 0 &&
                !flush(r, l, net, rcomm, n, data.data(), sizes, mhs.data(), what))
                return -1;
            if constexpr (Net<T>::kV >= 7) {
                // What NCCL calls once a device has consumed a receive: nothing to do here.
                tn::Result rc2 = net.t->irecv_consumed(rcomm, n, reqs[g]);
                if (rc2 != tn::kSuccess)
                    N_FAIL(r, "irecvConsumed of group ", g, " gives ", rc_name(rc2));
            }
            for (int k = 0; k < n; ++k) {
                const Msg &m = G.msgs[size_t(k)];
                slots.check(r, first[g] + size_t(k), m.seed, m.size,
                            cat("group ", g, ", tag ", m.tag, " (", m.size, " B)"));
            }
        }
        return ndone == ng;
    }));
    N_TRY(both_done(r, l, /*receiver=*/true));
    N_TRY(slots.release(r, net, rcomm));
    N_OK(r, net.t->close_recv(rcomm));
    N_OK(r, net.t->close_listen(lcomm));
    return close_net(r, net);
}

template <typename T>
bool plan_sender(Report &r, Link &l, const Plan &p) {
    Net<T> net;
    void *scomm;
    N_TRY(open_net(r, net));
    N_TRY(connect_conn(r, l, net, &scomm));
    Slots<T> slots;
    N_TRY(slots.alloc(r, net, scomm, p.src_cuda, p.count(), p.slot, p.mr_per_buffer));
    size_t at = 0;
    for (const auto &G : p.groups)
        for (const auto &m : G.msgs) N_TRY(slots.fill(r, at++, m.seed, m.size));
    if (p.sender_waits) N_TRY(l.expect(r, "posted"));

    struct Pending {
        void *req;
        size_t size;
        std::string what;
    };
    std::vector<Pending> pending;
    size_t most = 0;
    // Tests every outstanding send once; false when one failed.
    auto progress = [&]() -> bool {
        for (size_t i = 0; i < pending.size();) {
            int d = 0;
            int sizes[2] = {-1, -1};
            tn::Result rc = net.t->test(pending[i].req, &d, p.send_sizes_null ? nullptr : sizes);
            if (rc != tn::kSuccess)
                return N_FAIL(r, "test of ", pending[i].what, " gives ", rc_name(rc));
            if (!d) {
                ++i;
                continue;
            }
            if (!p.send_sizes_null) {
                N_CHECK(r, sizes[0] == int(pending[i].size), "test of ", pending[i].what,
                        " gives size ", sizes[0]);
                N_CHECK(r, sizes[1] == -1, "test of ", pending[i].what, " wrote 2 sizes");
            }
            pending[i] = std::move(pending.back());
            pending.pop_back();
        }
        return true;
    };
    at = 0;
    for (size_t g = 0; g < p.groups.size(); ++g) {
        const Group &G = p.groups[g];
        const size_t first = at;
        for (int k : G.send_order) {
            const Msg &m = G.msgs[size_t(k)];
            const size_t i = first + size_t(k);
            const std::string what = cat("group ", g, ", tag ", m.tag, " (", m.size, " B)");
            void *req = nullptr;
            // NCCL progresses its other requests while the plugin gives none.
            N_TRY(poll_until(r, l, cat("isend of ", what), [&]() -> int {
                tn::Result rc = net.isend(scomm, slots.ptr(i), m.size, m.tag, slots.mh(i), &req);
                if (rc != tn::kSuccess) {
                    N_FAIL(r, "isend of ", what, " gives ", rc_name(rc));
                    return -1;
                }
                if (req) return 1;
                return progress() ? 0 : -1;
            }));
            pending.push_back({req, m.size, what});
            most = std::max(most, pending.size());
        }
        at += G.msgs.size();
    }
    N_TRY(poll_until(r, l, "the sends' completions", [&]() -> int {
        if (!progress()) return -1;
        return pending.empty();
    }));
    r.note(cat(most, " sends outstanding at most"));
    N_TRY(both_done(r, l, /*receiver=*/false));
    N_TRY(slots.release(r, net, scomm));
    N_OK(r, net.t->close_send(scomm));
    return close_net(r, net);
}

template <typename T>
void run_plan(const Plan &p) {
    run_pair([p](Report &r, Link &l) { return plan_receiver<T>(r, l, p); },
             [p](Report &r, Link &l) { return plan_sender<T>(r, l, p); });
}

// Tags that are neither indices nor in order: the tag, not the position, picks the buffer.
constexpr int kTags[kMaxRecvs] = {3, 17, 1, 42, 0, 255, 1000, 7};

// Two grouped receives of 8 (both outstanding before the sends), 0 B .. 2 MiB per tag, the
// sends in a shuffled tag order; the second group lists its tags in another order, with other
// sizes.
Plan grouped_plan(const Combo &c) {
    const size_t kSizes[kMaxRecvs] = {0, 1, 100, 4096, 65536 + 7, 300000, 1 * MiB, 2 * MiB};
    Plan p;
    p.slot = 2 * MiB + 4 * KiB;
    p.src_cuda = c.src_cuda;
    p.dst_cuda = c.dst_cuda;
    Group g0, g1;
    for (int k = 0; k < kMaxRecvs; ++k) {
        g0.msgs.push_back({kTags[k], kSizes[k], 0x6000u + uint32_t(k)});
        // Reversed tag order, sizes rotated by three.
        g1.msgs.push_back(
            {kTags[kMaxRecvs - 1 - k], kSizes[(k + 3) % kMaxRecvs], 0x6100u + uint32_t(k)});
    }
    g0.send_order = {6, 0, 3, 7, 1, 5, 2, 4};
    g1.send_order = {2, 5, 0, 7, 4, 1, 6, 3};
    p.groups = {g0, g1};
    return p;
}

class Grouped : public ::testing::TestWithParam<Combo> {};

TEST_P(Grouped, EightTagsShuffled) {
    run_plan<tn::NetV11>(grouped_plan(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Memory, Grouped, ::testing::ValuesIn(kCombos),
                         [](const auto &info) { return std::string(info.param.name); });

// kMaxRequests grouped receives of 8 outstanding at once (posted before the first send), the
// sender streaming all 256 sends (a sendComm must take 8 x 32 at once, NCCL's README says),
// every group's sends shuffled; one registration for all buffers, as NCCL's.
Plan pipeline_plan(bool cuda) {
    const size_t kChoices[kMaxRecvs] = {0, 1, 8, 100, 4095, 4096, 16384, 65536};
    Plan p;
    p.slot = 64 * KiB + 4 * KiB;
    p.src_cuda = p.dst_cuda = cuda;
    p.mr_per_buffer = false;
    p.sender_waits = true;
    p.send_sizes_null = true;
    for (int g = 0; g < tn::kMaxRequests; ++g) {
        Group G;
        for (int k = 0; k < kMaxRecvs; ++k)
            G.msgs.push_back({kTags[(k + g) % kMaxRecvs], kChoices[size_t(g * 5 + k * 3) % 8],
                              0x7000u + uint32_t(g * kMaxRecvs + k)});
        G.send_order = {0, 1, 2, 3, 4, 5, 6, 7};
        std::shuffle(G.send_order.begin(), G.send_order.end(), std::mt19937(uint32_t(g)));
        p.groups.push_back(G);
    }
    return p;
}

TEST(Pipeline, ThirtyTwoGroupedReceivesHost) {
    run_plan<tn::NetV11>(pipeline_plan(false));
}

TEST(Pipeline, ThirtyTwoGroupedReceivesCuda) {
    run_plan<tn::NetV11>(pipeline_plan(true));
}

// ---- the older tables ----------------------------------------------------------------------

// Each version's properties, as far as its struct has them.
template <typename T>
bool check_props(Report &r, Net<T> &net) {
    typename Net<T>::Props p{};
    N_OK(r, net.t->get_properties(0, &p));
    N_CHECK(r, p.name && *p.name, "the device has no name");
    N_CHECK(r, p.ptr_support == (tn::kPtrHost | tn::kPtrCuda | tn::kPtrDmabuf), "ptrSupport ",
            p.ptr_support);
    N_CHECK(r, p.max_recvs == kMaxRecvs, "maxRecvs ", p.max_recvs);
    N_CHECK(r, p.max_comms >= 1, "maxComms ", p.max_comms);
    N_CHECK(r, p.speed > 0, "speed ", p.speed);
    if constexpr (Net<T>::kV >= 7) {
        N_CHECK(r, p.device_type == tn::kDeviceHost, "netDeviceType ", int(p.device_type));
        N_CHECK(r, p.device_version == 0, "netDeviceVersion ", p.device_version);
    }
    if constexpr (Net<T>::kV >= 8)
        N_CHECK(r, p.reg_is_global == 0, "regIsGlobal ", p.reg_is_global);
    if constexpr (Net<T>::kV >= 9) {
        N_CHECK(r, p.force_flush == 0, "forceFlush ", p.force_flush);
        N_CHECK(r, p.max_p2p_bytes > 0, "maxP2pBytes ", p.max_p2p_bytes);
        N_CHECK(r, net.t->make_vdevice != nullptr,
                "makeVDevice is not set (the plugin fuses NICs)");
    }
    if constexpr (Net<T>::kV >= 11)
        N_CHECK(r, p.max_multi_request_size == 1, "maxMultiRequestSize ", p.max_multi_request_size);
    return true;
}

// Set-up and one grouped receive of 0 B, 100 B and 1 MiB, the largest sent first.
template <typename T>
void run_older(bool src_cuda, bool dst_cuda) {
    Plan p;
    p.slot = 1 * MiB + 4 * KiB;
    p.src_cuda = src_cuda;
    p.dst_cuda = dst_cuda;
    p.groups = {Group{{{5, 0, 0x8000}, {9, 100, 0x8001}, {2, 1 * MiB, 0x8002}}, {2, 0, 1}}};
    run_pair([p](Report &r, Link &l) { return plan_receiver<T>(r, l, p, true); },
             [p](Report &r, Link &l) { return plan_sender<T>(r, l, p); });
}

TEST(OlderTables, V10CudaToCuda) {
    run_older<tn::NetV10>(true, true);
}

TEST(OlderTables, V9HostToCuda) {
    run_older<tn::NetV9>(false, true);
}

TEST(OlderTables, V6CudaToHost) {
    run_older<tn::NetV6>(true, false);
}

// Every table NCCL may look for is there, named "tandem", with the calls of its version.
template <typename T>
bool check_table(Report &r) {
    const T *t = load_table<T>(r);
    N_TRY(t);
    N_CHECK(r, t->name && std::string(t->name) == "tandem", T::kSymbol, "'s name is \"",
            t->name ? t->name : "(null)", "\"");
    N_CHECK(r,
            t->init && t->devices && t->get_properties && t->listen && t->connect && t->accept &&
                t->reg_mr && t->reg_mr_dmabuf && t->dereg_mr && t->isend && t->irecv && t->iflush &&
                t->test && t->close_send && t->close_recv && t->close_listen,
            T::kSymbol, " lacks a call");
    if constexpr (T::kVersion >= 7)
        N_CHECK(r, t->get_device_mr && t->irecv_consumed, T::kSymbol,
                " lacks getDeviceMr or irecvConsumed");
    if constexpr (T::kVersion >= 9)
        N_CHECK(r, t->make_vdevice != nullptr, T::kSymbol, " lacks makeVDevice");
    if constexpr (T::kVersion >= 11)
        N_CHECK(r, t->finalize && t->set_net_attr, T::kSymbol, " lacks finalize or setNetAttr");
    return true;
}

TEST(Tables, AllSevenVersionsExported) {
    run_one([](Report &r) {
        return check_table<tn::NetV12>(r) && check_table<tn::NetV11>(r) &&
               check_table<tn::NetV10>(r) && check_table<tn::NetV9>(r) &&
               check_table<tn::NetV8>(r) && check_table<tn::NetV7>(r) && check_table<tn::NetV6>(r);
    });
}

// ---- init and the properties (v11) -----------------------------------------------------------

TEST(Init, PropertiesAndAttributes) {
    run_one([](Report &r) {
        Net<tn::NetV11> net;
        N_TRY(open_net(r, net));
        int n = 0;
        N_OK(r, net.t->devices(&n));
        for (int dev = 0; dev < n; ++dev) {
            tn::PropertiesV11 p{};
            N_OK(r, net.t->get_properties(dev, &p));
            N_CHECK(r, p.name && *p.name, "device ", dev, " has no name");
            N_CHECK(r, p.ptr_support == (tn::kPtrHost | tn::kPtrCuda | tn::kPtrDmabuf), "device ",
                    dev, ": ptrSupport ", p.ptr_support,
                    " (the emulated CUDA driver is on the library path)");
            N_CHECK(r, p.max_recvs == kMaxRecvs, "device ", dev, ": maxRecvs ", p.max_recvs);
            N_CHECK(r, p.max_comms >= 1, "device ", dev, ": maxComms ", p.max_comms);
            N_CHECK(r, p.speed > 0, "device ", dev, ": speed ", p.speed);
            N_CHECK(r, p.reg_is_global == 0, "device ", dev, ": regIsGlobal ", p.reg_is_global);
            N_CHECK(r, p.force_flush == 0, "device ", dev, ": forceFlush ", p.force_flush);
            N_CHECK(r, p.device_type == tn::kDeviceHost, "device ", dev, ": netDeviceType ",
                    int(p.device_type));
            N_CHECK(r, p.device_version == 0, "device ", dev, ": netDeviceVersion ",
                    p.device_version);
            N_CHECK(r, p.max_p2p_bytes > 0, "device ", dev, ": maxP2pBytes ", p.max_p2p_bytes);
            N_CHECK(r, p.max_multi_request_size == 1, "device ", dev, ": maxMultiRequestSize ",
                    p.max_multi_request_size);
        }
        tn::PropertiesV11 p{};
        N_EXPECT_RC(r, net.t->get_properties(n, &p), tn::kInternalError);
        N_CHECK(r, net.t->make_vdevice != nullptr,
                "makeVDevice is not set (the plugin fuses NICs)");
        // What NCCL tells the plugin of an operation's communication pattern: taken, unused.
        tn::NetAttr attr{};
        attr.send_comm = {1, 1, 2, 1};
        attr.recv_comm = {1, 1, 2, 1};
        attr.op = 1;
        N_EXPECT_RC(r, net.t->set_net_attr(net.ctx, &attr), tn::kSuccess);
        return close_net(r, net);
    });
}

// ---- DMA-BUF registrations -------------------------------------------------------------------

// The dma-buf fd of the allocation at `base` (the emulator exports whole allocations only, from
// their base), or -1 with the driver's error in *rc.
int dmabuf_fd(CUdeviceptr base, size_t len, CUresult *rc) {
    int fd = -1;
    *rc = tandem_test::cuda_driver().mem_get_handle_for_address_range(
        &fd, base, round_up(len, 4 * KiB), CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    return *rc == CUDA_SUCCESS ? fd : -1;
}

// regMrDmaBuf as NCCL calls it: the fd closed right after the registration, which must not
// need it any more.
bool reg_dmabuf(Report &r, Net<tn::NetV11> &net, void *comm, const Buf &buf, size_t offset,
                size_t len, void **mh) {
    CUresult cu = CUDA_SUCCESS;
    int fd = dmabuf_fd(reinterpret_cast<CUdeviceptr>(buf.ptr()), buf.len(), &cu);
    N_REQUIRE(r, fd >= 0, "cuMemGetHandleForAddressRange gives CUDA error ", cu);
    tn::Result rc = net.t->reg_mr_dmabuf(comm, buf.ptr(offset), len, tn::kPtrCuda, offset, fd, mh);
    ::close(fd);
    if (rc != tn::kSuccess)
        return N_FAIL(r, "regMrDmaBuf(offset ", offset, ", ", len, " B) gives ", rc_name(rc));
    return true;
}

TEST(DmaBuf, RegisteredFromFdAndOffset) {
    // Whether the driver exports dma-bufs at all, asked in a child (the gtest process loads
    // nothing): the contract's DMA-BUF case needs cuMemGetHandleForAddressRange.
    run_one([](Report &r) {
        if (std::string e = tandem_test::use_device0(); !e.empty())
            return N_FAIL(r, "CUDA device 0: ", e);
        Buf b;
        N_TRY(b.alloc(r, true, 4 * KiB));
        CUresult cu;
        int fd = dmabuf_fd(reinterpret_cast<CUdeviceptr>(b.ptr()), b.len(), &cu);
        if (fd < 0)
            r.note(
                cat("SKIP the CUDA driver exports no dma-buf (cuMemGetHandleForAddressRange "
                    "gives ",
                    cu, ")"));
        else
            ::close(fd);
        return true;
    });
    if (::testing::Test::IsSkipped() || ::testing::Test::HasFailure()) return;

    constexpr size_t kLen = 2 * MiB;
    constexpr size_t kBig = 1 * MiB + 1, kSmall = 100;
    constexpr size_t kSmallAt = 1 * MiB + 8 * KiB;  // where the second message goes, both sides
    run_pair(
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *lcomm, *rcomm;
            N_TRY(open_net(r, net));
            N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
            Buf buf;
            N_TRY(buf.alloc(r, true, kLen));
            void *mh = nullptr;
            N_TRY(reg_dmabuf(r, net, rcomm, buf, 0, kLen, &mh));  // the whole buffer
            const size_t sizes[2] = {kBig, kSmall};
            const size_t at[2] = {0, kSmallAt};
            for (int i = 0; i < 2; ++i) {
                void *data = buf.ptr(at[i]), *req;
                size_t posted = sizes[i] + 4 * KiB;
                int tag = i;
                const std::string what = cat("the ", sizes[i], " B message");
                N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh, &req, what));
                std::vector<int> got;
                N_TRY(wait_done(r, l, net, req, 1, got, what));
                N_REQUIRE(r, got[0] == int(sizes[i]), what, ": test gives size ", got[0]);
                N_TRY(flush(r, l, net, rcomm, 1, &data, got, &mh, what));
                N_TRY(buf.check(r, 0xd0a + uint32_t(i), at[i], sizes[i], what));
            }
            N_TRY(both_done(r, l, /*receiver=*/true));
            N_OK(r, net.t->dereg_mr(rcomm, mh));
            N_OK(r, net.t->close_recv(rcomm));
            N_OK(r, net.t->close_listen(lcomm));
            return close_net(r, net);
        },
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *scomm;
            N_TRY(open_net(r, net));
            N_TRY(connect_conn(r, l, net, &scomm));
            Buf buf;
            N_TRY(buf.alloc(r, true, kLen));
            // Registered from one page in: the data pointer and the fd's offset agree.
            void *mh = nullptr;
            N_TRY(reg_dmabuf(r, net, scomm, buf, 4 * KiB, kLen - 4 * KiB, &mh));
            const size_t sizes[2] = {kBig, kSmall};
            const size_t at[2] = {4 * KiB, 4 * KiB + kSmallAt};
            for (int i = 0; i < 2; ++i) {
                N_TRY(buf.fill(r, 0xd0a + uint32_t(i), at[i], sizes[i]));
                void *req;
                const std::string what = cat("the ", sizes[i], " B message");
                N_TRY(post_send(r, l, net, scomm, buf.ptr(at[i]), sizes[i], i, mh, &req, what));
                std::vector<int> got;
                N_TRY(wait_done(r, l, net, req, 1, got, what));
            }
            N_TRY(both_done(r, l, /*receiver=*/false));
            N_OK(r, net.t->dereg_mr(scomm, mh));
            N_OK(r, net.t->close_send(scomm));
            return close_net(r, net);
        });
}

// ---- progress: a send completes without the receiver's help ----------------------------------

// Once its receive completed, an NCCL rank with nothing else posted makes no plugin calls (the
// proxy calls test only on active operations): the sender's matching send must complete all the
// same. The receiver here checks its data, then only waits for the sender's verdict.
// The sender of Progress and Teardown: one `len` B message of pattern(seed) from host memory,
// its completion awaited (then "send done" to the receiver, whatever came of it), and closing.
bool send_and_tell(Report &r, Link &l, size_t len, uint32_t seed, const char *receiver_does) {
    Net<tn::NetV11> net;
    void *scomm;
    N_TRY(open_net(r, net));
    N_TRY(connect_conn(r, l, net, &scomm));
    Buf buf;
    void *mh = nullptr, *req;
    N_TRY(send_source(r, net, scomm, buf, false, len, seed, &mh));
    const std::string what = cat("a ", len, " B send ", receiver_does);
    N_TRY(post_send(r, l, net, scomm, buf.ptr(), len, 1, mh, &req, what));
    std::vector<int> got;
    bool ok = wait_done(r, l, net, req, 1, got, what);
    N_TRY(l.tell(r, "send done"));
    N_TRY(ok);
    N_OK(r, net.t->dereg_mr(scomm, mh));
    N_OK(r, net.t->close_send(scomm));
    return close_net(r, net);
}

class Progress : public ::testing::TestWithParam<size_t> {};

TEST_P(Progress, SendCompletesWhileTheReceiverMakesNoCalls) {
    const size_t len = GetParam();
    const uint32_t seed = 0x9e0 + uint32_t(len % 251);
    run_pair(
        [len, seed](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *lcomm, *rcomm;
            N_TRY(open_net(r, net));
            N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
            Buf buf;
            N_TRY(buf.alloc(r, false, len + 4 * KiB));
            void *mh = nullptr, *req, *data = buf.ptr();
            N_OK(r, net.reg_mr(rcomm, buf.ptr(), buf.len(), buf.type(), &mh));
            size_t posted = buf.len();
            int tag = 1;
            N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh, &req, "the message"));
            std::vector<int> got;
            N_TRY(wait_done(r, l, net, req, 1, got, "the message"));
            N_CHECK(r, got[0] == int(len), "the message: test gives size ", got[0]);
            buf.check(r, seed, 0, len, "the message");
            N_TRY(l.expect(r, "send done"));  // no plugin call meanwhile
            N_OK(r, net.t->dereg_mr(rcomm, mh));
            N_OK(r, net.t->close_recv(rcomm));
            N_OK(r, net.t->close_listen(lcomm));
            return close_net(r, net);
        },
        [len, seed](Report &r, Link &l) {
            return send_and_tell(r, l, len, seed, "whose receiver makes no more calls");
        });
}

// Below and above the plugin's eager limit (64 KiB by default, as tandem's link eager limit:
// larger sends are written).
INSTANTIATE_TEST_SUITE_P(Sizes, Progress, ::testing::Values(100, 64 * KiB + 1, 1 * MiB),
                         [](const auto &info) { return cat(info.param, "B"); });

// ---- several threads on one device -------------------------------------------------------

// NCCL's proxy threads of different communicators share the plugin's device (one endpoint):
// kThreads connections, each streamed by its own thread at both ends at the same time, every
// message checked. Each thread keeps kWindow transfers in flight from (into) its own buffers;
// the sizes cycle through eager and written ones. Run under ThreadSanitizer by scripts/tsan.sh.
constexpr int kThreads = 4, kWindow = 8, kMessages = 300;
constexpr size_t kThreadSizes[] = {0, 100, 4096, 70000, 300000};
constexpr size_t kThreadSlot = 300000;

uint32_t thread_seed(int t, int i) {
    return uint32_t(t * 100003 + i);
}

// One thread's stream: "" when every message arrived whole, else what went wrong.
std::string stream_receiver(const tn::NetV11 *t, void *rcomm, int th) {
    std::vector<uint8_t> bufs(size_t(kWindow) * kThreadSlot);
    void *mh = nullptr;
    if (t->reg_mr(rcomm, bufs.data(), bufs.size(), tn::kPtrHost, &mh) != tn::kSuccess)
        return "regMr failed";
    std::deque<std::pair<void *, int>> inflight;
    auto finish = [&](void *req, int i) -> std::string {
        int done = 0, size = -1;
        for (auto until = Clock::now() + kWait; !done;) {
            if (tn::Result rc = t->test(req, &done, &size); rc != tn::kSuccess)
                return cat("test of message ", i, " gives ", rc_name(rc));
            if (Clock::now() > until) return cat("message ", i, " never arrived");
        }
        const size_t want = kThreadSizes[i % std::size(kThreadSizes)];
        if (size != int(want)) return cat("message ", i, ": size ", size, ", expected ", want);
        const uint8_t *b = bufs.data() + size_t(i % kWindow) * kThreadSlot;
        for (size_t k = 0; k < want; ++k)
            if (b[k] != pattern(k, thread_seed(th, i))) return cat("message ", i, ": byte ", k);
        return "";
    };
    for (int i = 0; i < kMessages; ++i) {
        if (int(inflight.size()) == kWindow) {
            if (std::string e = finish(inflight.front().first, inflight.front().second); !e.empty())
                return e;
            inflight.pop_front();
        }
        void *data = bufs.data() + size_t(i % kWindow) * kThreadSlot, *req = nullptr;
        size_t size = kThreadSlot;
        int tag = th;
        for (auto until = Clock::now() + kWait; !req;) {
            if (t->irecv(rcomm, 1, &data, &size, &tag, &mh, nullptr, &req) != tn::kSuccess)
                return cat("irecv of message ", i, " failed");
            if (Clock::now() > until) return "irecv never took a receive";
        }
        inflight.emplace_back(req, i);
    }
    for (auto &[req, i] : inflight)
        if (std::string e = finish(req, i); !e.empty()) return e;
    return t->dereg_mr(rcomm, mh) == tn::kSuccess ? "" : "deregMr failed";
}

std::string stream_sender(const tn::NetV11 *t, void *scomm, int th) {
    std::vector<uint8_t> bufs(size_t(kWindow) * kThreadSlot);
    void *mh = nullptr;
    if (t->reg_mr(scomm, bufs.data(), bufs.size(), tn::kPtrHost, &mh) != tn::kSuccess)
        return "regMr failed";
    std::deque<std::pair<void *, int>> inflight;
    auto finish = [&](void *req, int i) -> std::string {
        int done = 0, size = -1;
        for (auto until = Clock::now() + kWait; !done;) {
            if (tn::Result rc = t->test(req, &done, &size); rc != tn::kSuccess)
                return cat("test of send ", i, " gives ", rc_name(rc));
            if (Clock::now() > until) return cat("send ", i, " never completed");
        }
        return "";
    };
    for (int i = 0; i < kMessages; ++i) {
        if (int(inflight.size()) == kWindow) {
            if (std::string e = finish(inflight.front().first, inflight.front().second); !e.empty())
                return e;
            inflight.pop_front();
        }
        uint8_t *b = bufs.data() + size_t(i % kWindow) * kThreadSlot;
        const size_t size = kThreadSizes[i % std::size(kThreadSizes)];
        for (size_t k = 0; k < size; ++k) b[k] = pattern(k, thread_seed(th, i));
        void *req = nullptr;
        for (auto until = Clock::now() + kWait; !req;) {
            if (t->isend(scomm, b, size, th, mh, nullptr, &req) != tn::kSuccess)
                return cat("isend of message ", i, " failed");
            if (Clock::now() > until) return "isend never took a send";
        }
        inflight.emplace_back(req, i);
    }
    for (auto &[req, i] : inflight)
        if (std::string e = finish(req, i); !e.empty()) return e;
    return t->dereg_mr(scomm, mh) == tn::kSuccess ? "" : "deregMr failed";
}

// Runs body(comm, thread) on kThreads threads at once; the failures, named by thread.
bool run_threads(Report &r, const std::vector<void *> &comms,
                 const std::function<std::string(void *, int)> &body) {
    std::vector<std::string> errors(comms.size());
    std::vector<std::thread> threads;
    for (size_t th = 0; th < comms.size(); ++th)
        threads.emplace_back([&, th] { errors[th] = body(comms[th], int(th)); });
    for (auto &t : threads) t.join();
    bool ok = true;
    for (size_t th = 0; th < errors.size(); ++th)
        if (!errors[th].empty()) ok = N_FAIL(r, "thread ", th, ": ", errors[th]);
    return ok;
}

TEST(Threads, FourConnectionsStreamedAtOnce) {
    run_pair(
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            N_TRY(open_net(r, net));
            std::vector<void *> lcomms(kThreads), rcomms(kThreads);
            for (int th = 0; th < kThreads; ++th)
                N_TRY(accept_conn(r, l, net, &lcomms[th], &rcomms[th]));
            N_TRY(run_threads(r, rcomms,
                              [&](void *c, int th) { return stream_receiver(net.t, c, th); }));
            N_TRY(both_done(r, l, /*receiver=*/true));
            for (int th = 0; th < kThreads; ++th) {
                N_OK(r, net.t->close_recv(rcomms[th]));
                N_OK(r, net.t->close_listen(lcomms[th]));
            }
            return close_net(r, net);
        },
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            N_TRY(open_net(r, net));
            std::vector<void *> scomms(kThreads);
            for (int th = 0; th < kThreads; ++th) N_TRY(connect_conn(r, l, net, &scomms[th]));
            N_TRY(run_threads(r, scomms,
                              [&](void *c, int th) { return stream_sender(net.t, c, th); }));
            N_TRY(both_done(r, l, /*receiver=*/false));
            for (int th = 0; th < kThreads; ++th) N_OK(r, net.t->close_send(scomms[th]));
            return close_net(r, net);
        });
}

// ---- a write that fails --------------------------------------------------------------------

// Tests `req` until it ends; it must end with `want`.
bool test_fails_with(Report &r, Link &l, Net<tn::NetV11> &net, void *req, tn::Result want,
                     const std::string &what) {
    tn::Result rc = tn::kSuccess;
    N_TRY(poll_until(r, l, cat("the end of ", what), [&]() -> int {
        int done = 0, size = -1;
        rc = net.t->test(req, &done, &size);
        return rc != tn::kSuccess || done;
    }));
    N_CHECK(r, rc == want, "the test of ", what, " gives ", rc_name(rc), ", expected ",
            rc_name(want));
    return true;
}

// The receiver's device faults on the copy that places a large send (written: above the eager
// limit) into its CUDA buffer. The write fails at the sender, whose announcement then fails the
// receive too: both tests give ncclSystemError, neither waits.
TEST(Faults, WriteFailingAtTheTargetFailsBothEnds) {
    if (!tandem_test::cuda_driver().emulated()) GTEST_SKIP() << "the fault needs the emulator";
    const size_t len = MiB;
    run_pair(
        [len](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *lcomm, *rcomm;
            N_TRY(open_net(r, net));
            N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
            Buf buf;
            N_TRY(buf.alloc(r, true, len));
            void *mh = nullptr, *req, *data = buf.ptr();
            N_OK(r, net.reg_mr(rcomm, buf.ptr(), buf.len(), buf.type(), &mh));
            void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
            auto *fail_after = driver ? reinterpret_cast<decltype(&emucuda_fail_after)>(
                                            dlsym(driver, "emucuda_fail_after"))
                                      : nullptr;
            N_REQUIRE(r, fail_after, "the emulated driver has no emucuda_fail_after");
            fail_after(EMUCUDA_FAIL_COPY, 0, 1, CUDA_ERROR_ILLEGAL_ADDRESS);
            size_t posted = buf.len();
            int tag = 5;
            N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh, &req, "the message"));
            N_TRY(test_fails_with(r, l, net, req, tn::kSystemError, "the receive"));
            N_TRY(both_done(r, l, /*receiver=*/true));
            N_OK(r, net.t->dereg_mr(rcomm, mh));
            N_OK(r, net.t->close_recv(rcomm));
            N_OK(r, net.t->close_listen(lcomm));
            return close_net(r, net);
        },
        [len](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *scomm;
            N_TRY(open_net(r, net));
            N_TRY(connect_conn(r, l, net, &scomm));
            Buf buf;
            void *mh = nullptr, *req;
            N_TRY(send_source(r, net, scomm, buf, false, len, 0xfa11, &mh));
            N_TRY(post_send(r, l, net, scomm, buf.ptr(), len, 5, mh, &req, "the message"));
            N_TRY(test_fails_with(r, l, net, req, tn::kSystemError, "the send"));
            N_TRY(both_done(r, l, /*receiver=*/false));
            N_OK(r, net.t->dereg_mr(scomm, mh));
            N_OK(r, net.t->close_send(scomm));
            return close_net(r, net);
        });
}

// ---- NCCL_TANDEM_P2P ----------------------------------------------------------------------

// What the emulated driver counted in this process since the last reset.
emucuda_stats device_stats() {
    emucuda_stats st{};
    tandem_test::cuda_driver().get_stats(&st);
    return st;
}

// A 1 MiB send from CUDA memory into CUDA memory (above the eager limit: written with
// fi_write). Node-local it goes peer to peer (the receiver's device copies from the sender's
// buffer, mapped by IPC) unless NCCL_TANDEM_P2P=disabled, which stages it through host memory
// at both ends. Over the TCP link it is always staged.
class P2pPolicy : public ::testing::TestWithParam<const char *> {};

TEST_P(P2pPolicy, LargeCudaSendMovesAsThePolicySays) {
    const char *policy = GetParam();
    if (!tandem_test::cuda_driver().emulated()) GTEST_SKIP() << "the counts need the emulator";
    const bool p2p = !tandem_test::net_variant() && std::string(policy) != "disabled";
    const size_t len = MiB;
    const uint32_t seed = 0x2b2;
    auto set_policy = [policy] {
        if (*policy) setenv("NCCL_TANDEM_P2P", policy, 1);
    };
    run_pair(
        [=](Report &r, Link &l) {
            set_policy();
            Net<tn::NetV11> net;
            void *lcomm, *rcomm;
            N_TRY(open_net(r, net));
            N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
            Buf buf;
            N_TRY(buf.alloc(r, true, len));
            void *mh = nullptr, *req, *data = buf.ptr();
            N_OK(r, net.reg_mr(rcomm, buf.ptr(), buf.len(), buf.type(), &mh));
            tandem_test::cuda_driver().reset_stats();
            size_t posted = buf.len();
            int tag = 3;
            N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh, &req, "the message"));
            std::vector<int> got;
            N_TRY(wait_done(r, l, net, req, 1, got, "the message"));
            emucuda_stats st = device_stats();
            if (p2p) {
                N_CHECK(r, st.ipc_opens >= 1 && st.bytes_dtod >= len && st.bytes_htod == 0,
                        "peer to peer expected: ipc_opens ", st.ipc_opens, ", bytes_dtod ",
                        st.bytes_dtod, ", bytes_htod ", st.bytes_htod);
            } else {
                N_CHECK(r, st.ipc_opens == 0 && st.bytes_htod >= len, "staged expected: ipc_opens ",
                        st.ipc_opens, ", bytes_htod ", st.bytes_htod);
            }
            buf.check(r, seed, 0, len, "the message");
            N_TRY(both_done(r, l, /*receiver=*/true));
            N_OK(r, net.t->dereg_mr(rcomm, mh));
            N_OK(r, net.t->close_recv(rcomm));
            N_OK(r, net.t->close_listen(lcomm));
            return close_net(r, net);
        },
        [=](Report &r, Link &l) {
            set_policy();
            Net<tn::NetV11> net;
            void *scomm;
            N_TRY(open_net(r, net));
            N_TRY(connect_conn(r, l, net, &scomm));
            Buf buf;
            void *mh = nullptr, *req;
            N_TRY(send_source(r, net, scomm, buf, true, len, seed, &mh));
            tandem_test::cuda_driver().reset_stats();
            N_TRY(post_send(r, l, net, scomm, buf.ptr(), len, 3, mh, &req, "the message"));
            std::vector<int> got;
            N_TRY(wait_done(r, l, net, req, 1, got, "the message"));
            emucuda_stats st = device_stats();
            if (p2p)
                N_CHECK(r, st.ipc_gets >= 1 && st.bytes_dtoh == 0,
                        "peer to peer expected: ipc_gets ", st.ipc_gets, ", bytes_dtoh ",
                        st.bytes_dtoh);
            else
                N_CHECK(r, st.ipc_gets == 0 && st.bytes_dtoh >= len, "staged expected: ipc_gets ",
                        st.ipc_gets, ", bytes_dtoh ", st.bytes_dtoh);
            N_TRY(both_done(r, l, /*receiver=*/false));
            N_OK(r, net.t->dereg_mr(scomm, mh));
            N_OK(r, net.t->close_send(scomm));
            return close_net(r, net);
        });
}

INSTANTIATE_TEST_SUITE_P(Env, P2pPolicy, ::testing::Values("", "enabled", "disabled"),
                         [](const auto &info) {
                             return std::string(*info.param ? info.param : "unset");
                         });

// A value that is no policy: init fails, with a warning naming it.
TEST(BadInput, UnknownP2pPolicyFailsInit) {
    run_one([](Report &r) {
        setenv("NCCL_TANDEM_P2P", "sometimes", 1);
        if (std::string e = tandem_test::use_device0(); !e.empty())
            return N_FAIL(r, "CUDA device 0: ", e);
        Net<tn::NetV11> net;
        net.t = load_table<tn::NetV11>(r);
        N_TRY(net.t);
        size_t since = log_size();
        tn::Result rc = net.init();
        N_CHECK(r, rc == tn::kInvalidUsage, "init with NCCL_TANDEM_P2P=sometimes gives ",
                rc_name(rc));
        return warned_once(r, since, "init with an unknown NCCL_TANDEM_P2P");
    });
}

// ---- teardown without a barrier ----------------------------------------------------------

// The receiver closes its comms (and finalizes) as soon as its receive completed, as an NCCL
// rank may in ncclCommDestroy: no barrier between the ranks comes first. The sender's send,
// whose data has arrived, must still complete successfully. The receiver's process stays
// alive until the sender has its answer, so that only the close is tested, not an exit.
class Teardown : public ::testing::TestWithParam<size_t> {};

TEST_P(Teardown, ReceiverClosesRightAfterItsReceive) {
    const size_t len = GetParam();
    const uint32_t seed = 0x7ea0 + uint32_t(len % 251);
    run_pair(
        [len, seed](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *lcomm, *rcomm;
            N_TRY(open_net(r, net));
            N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
            Buf buf;
            N_TRY(buf.alloc(r, false, len + 4 * KiB));
            void *mh = nullptr, *req, *data = buf.ptr();
            N_OK(r, net.reg_mr(rcomm, buf.ptr(), buf.len(), buf.type(), &mh));
            size_t posted = buf.len();
            int tag = 1;
            N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh, &req, "the message"));
            std::vector<int> got;
            N_TRY(wait_done(r, l, net, req, 1, got, "the message"));
            N_OK(r, net.t->dereg_mr(rcomm, mh));
            N_OK(r, net.t->close_recv(rcomm));
            N_OK(r, net.t->close_listen(lcomm));
            N_TRY(close_net(r, net));
            N_CHECK(r, got[0] == int(len), "the message: test gives size ", got[0]);
            buf.check(r, seed, 0, len, "the message");
            return l.expect(r, "send done");
        },
        [len, seed](Report &r, Link &l) {
            return send_and_tell(r, l, len, seed, "whose receiver closed once it had it");
        });
}

// As Progress.*.
INSTANTIATE_TEST_SUITE_P(Sizes, Teardown, ::testing::Values(100, 64 * KiB + 1, 1 * MiB),
                         [](const auto &info) { return cat(info.param, "B"); });

// ---- bad input: an error code and one WARN line each, never a crash --------------------------

// A receiver that accepts, takes one `len` B message into host memory (checked) and closes: the
// peer of the sender-side bad inputs, whose comm must still work.
bool plain_receiver(Report &r, Link &l, size_t len, uint32_t seed) {
    Net<tn::NetV11> net;
    void *lcomm, *rcomm;
    N_TRY(open_net(r, net));
    N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
    Buf buf;
    N_TRY(buf.alloc(r, false, len + 4 * KiB));
    void *mh = nullptr;
    N_OK(r, net.reg_mr(rcomm, buf.ptr(), buf.len(), buf.type(), &mh));
    void *data = buf.ptr(), *req;
    size_t posted = buf.len();
    int tag = 1;
    N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh, &req, "the message"));
    std::vector<int> got;
    N_TRY(wait_done(r, l, net, req, 1, got, "the message"));
    N_CHECK(r, got[0] == int(len), "the message: test gives size ", got[0]);
    buf.check(r, seed, 0, len, "the message");
    N_TRY(both_done(r, l, /*receiver=*/true));
    N_OK(r, net.t->dereg_mr(rcomm, mh));
    N_OK(r, net.t->close_recv(rcomm));
    N_OK(r, net.t->close_listen(lcomm));
    return close_net(r, net);
}

// The other half: sends one `len` B message from host memory and closes.
bool send_one(Report &r, Link &l, Net<tn::NetV11> &net, void *scomm, size_t len, uint32_t seed) {
    Buf buf;
    N_TRY(buf.alloc(r, false, len));
    void *mh = nullptr, *req;
    N_OK(r, net.reg_mr(scomm, buf.ptr(), buf.len(), buf.type(), &mh));
    N_TRY(buf.fill(r, seed, 0, len));
    N_TRY(post_send(r, l, net, scomm, buf.ptr(), len, 1, mh, &req, "the message"));
    std::vector<int> got;
    N_TRY(wait_done(r, l, net, req, 1, got, "the message"));
    N_TRY(both_done(r, l, /*receiver=*/false));
    N_OK(r, net.t->dereg_mr(scomm, mh));
    N_OK(r, net.t->close_send(scomm));
    return close_net(r, net);
}

// connect with handles that no listen made: refused at once, no comm; then the real handle
// still connects and carries a message.
TEST(BadInput, ConnectWithForeignHandles) {
    run_pair([](Report &r, Link &l) { return plain_receiver(r, l, 64, 0xbad0); },
             [](Report &r, Link &l) {
                 Net<tn::NetV11> net;
                 N_TRY(open_net(r, net));
                 char good[tn::kHandleMaxSize];
                 N_TRY(l.recv_exact(r, good, sizeof good, "the listen handle"));
                 char random[tn::kHandleMaxSize], zeros[tn::kHandleMaxSize] = {},
                                                  magic[tn::kHandleMaxSize];
                 std::mt19937 gen(0x5eed);
                 for (char &c : random) c = char(gen());
                 if (memcmp(random, good, 4) == 0) random[0] = char(~random[0]);
                 memcpy(magic, good, sizeof magic);
                 for (int i = 0; i < 4; ++i) magic[i] = char(~magic[i]);
                 const std::pair<char *, const char *> bad[] = {
                     {random, "a handle of random bytes"},
                     {zeros, "a handle of zeros"},
                     {magic, "a listen handle with its magic changed"}};
                 for (const auto &[h, what] : bad) {
                     void *scomm = nullptr;
                     tn::DeviceHandle *dh = nullptr;
                     const size_t since = log_size();
                     tn::Result rc = net.t->connect(net.ctx, 0, h, &scomm, &dh);
                     N_CHECK(r, rc == tn::kInvalidUsage, "connect with ", what, " gives ",
                             rc_name(rc), ", expected ", rc_name(tn::kInvalidUsage));
                     N_CHECK(r, scomm == nullptr, "connect with ", what, " gave a comm");
                     warned_once(r, since, cat("connect with ", what));
                 }
                 // The listener is unharmed: the real handle connects.
                 void *scomm = nullptr;
                 tn::DeviceHandle *dh = nullptr;
                 N_TRY(poll_until(r, l, "connect with the real handle", [&]() -> int {
                     tn::Result rc = net.t->connect(net.ctx, 0, good, &scomm, &dh);
                     if (rc != tn::kSuccess) {
                         N_FAIL(r, "connect gives ", rc_name(rc));
                         return -1;
                     }
                     return scomm != nullptr;
                 }));
                 return send_one(r, l, net, scomm, 64, 0xbad0);
             });
}

// test on pointers the plugin never handed out: refused, not dereferenced.
TEST(BadInput, TestOnRequestsNeverHandedOut) {
    run_one([](Report &r) {
        Net<tn::NetV11> net;
        N_TRY(open_net(r, net));
        uint64_t on_stack[16];
        memset(on_stack, 0xa5, sizeof on_stack);  // garbage that looks like nothing valid
        const std::pair<void *, const char *> bad[] = {{reinterpret_cast<void *>(0x1234), "0x1234"},
                                                       {on_stack, "a stack variable"}};
        for (const auto &[req, what] : bad) {
            int done = 0, sizes[kMaxRecvs + 1] = {};
            const size_t since = log_size();
            tn::Result rc = net.t->test(req, &done, sizes);
            N_CHECK(r, rc == tn::kInvalidUsage, "test(", what, ") gives ", rc_name(rc),
                    ", expected ", rc_name(tn::kInvalidUsage));
            N_CHECK(r, done == 0, "test(", what, ") says done");
            warned_once(r, since, cat("test(", what, ")"));
        }
        return close_net(r, net);
    });
}

// A 1 MiB send whose receive is never posted stays pending; once its comm is closed, a test
// of it is refused (the request went with the comm).
TEST(BadInput, TestOfPendingSendAfterCloseSend) {
    run_pair(
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *lcomm, *rcomm;
            N_TRY(open_net(r, net));
            N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
            N_TRY(l.expect(r, "closed"));
            N_OK(r, net.t->close_recv(rcomm));
            N_OK(r, net.t->close_listen(lcomm));
            return close_net(r, net);
        },
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *scomm;
            N_TRY(open_net(r, net));
            N_TRY(connect_conn(r, l, net, &scomm));
            Buf buf;
            void *mh = nullptr, *req;
            N_TRY(send_source(r, net, scomm, buf, false, 1 * MiB, 0xc105e, &mh));
            N_TRY(post_send(r, l, net, scomm, buf.ptr(), 1 * MiB, 1, mh, &req,
                            "1 MiB with no receive posted"));
            int done = 0;
            N_OK(r, net.t->test(req, &done, nullptr));
            N_REQUIRE(r, done == 0,
                      "a 1 MiB send completed with no receive posted: nothing pending to test");
            N_OK(r, net.t->close_send(scomm));
            const size_t since = log_size();
            tn::Result rc = net.t->test(req, &done, nullptr);
            N_CHECK(r, rc == tn::kInvalidUsage, "test of a send of a closed comm gives ",
                    rc_name(rc), ", expected ", rc_name(tn::kInvalidUsage));
            warned_once(r, since, "test of a send of a closed comm");
            N_TRY(l.tell(r, "closed"));
            // The registration went with the comm; NCCL deregisters before closing, we did not.
            return close_net(r, net);
        });
}

// The same on the receiving side: a receive that no send ever matches, its comm closed.
TEST(BadInput, TestOfPendingRecvAfterCloseRecv) {
    run_pair(
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *lcomm, *rcomm;
            N_TRY(open_net(r, net));
            N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
            Buf buf;
            N_TRY(buf.alloc(r, false, 1 * MiB));
            void *mh = nullptr, *req, *data = buf.ptr();
            N_OK(r, net.reg_mr(rcomm, buf.ptr(), buf.len(), buf.type(), &mh));
            size_t posted = 1 * MiB;
            int tag = 1;
            N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh, &req,
                            "1 MiB with no send"));
            int done = 0;
            N_OK(r, net.t->test(req, &done, nullptr));
            N_REQUIRE(r, done == 0, "a receive completed with no send");
            N_OK(r, net.t->close_recv(rcomm));
            const size_t since = log_size();
            tn::Result rc = net.t->test(req, &done, nullptr);
            N_CHECK(r, rc == tn::kInvalidUsage, "test of a receive of a closed comm gives ",
                    rc_name(rc), ", expected ", rc_name(tn::kInvalidUsage));
            warned_once(r, since, "test of a receive of a closed comm");
            N_TRY(l.tell(r, "closed"));
            N_OK(r, net.t->close_listen(lcomm));
            return close_net(r, net);
        },
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *scomm;
            N_TRY(open_net(r, net));
            N_TRY(connect_conn(r, l, net, &scomm));
            N_TRY(l.expect(r, "closed"));
            N_OK(r, net.t->close_send(scomm));
            return close_net(r, net);
        });
}

// deregMr of a registration that a pending request uses is refused, and leaves it intact:
// the request completes with the right data, and then the same deregMr succeeds. On both
// sides: first a send's registration (the receive posted only afterwards), then a receive's
// (the send issued only afterwards).
TEST(BadInput, DeregOfRegistrationInUse) {
    constexpr size_t kLen = 1 * MiB;
    run_pair(
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *lcomm, *rcomm;
            N_TRY(open_net(r, net));
            N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
            Buf buf;
            N_TRY(buf.alloc(r, false, kLen + 4 * KiB));
            size_t posted = buf.len();
            int tag = 1;
            void *data = buf.ptr(), *req;
            std::vector<int> got;
            // 1: the sender's registration is busy; receive its message.
            N_TRY(l.expect(r, "dereg tried"));
            void *mh1 = nullptr;
            N_OK(r, net.reg_mr(rcomm, buf.ptr(), buf.len(), buf.type(), &mh1));
            N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh1, &req, "message 1"));
            N_TRY(wait_done(r, l, net, req, 1, got, "message 1"));
            N_CHECK(r, got[0] == int(kLen), "message 1: test gives size ", got[0]);
            buf.check(r, 0xde61, 0, kLen, "message 1");
            N_OK(r, net.t->dereg_mr(rcomm, mh1));
            // 2: ours is.
            void *mh2 = nullptr;
            N_OK(r, net.reg_mr(rcomm, buf.ptr(), buf.len(), buf.type(), &mh2));
            N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh2, &req, "message 2"));
            int done = 0;
            N_OK(r, net.t->test(req, &done, nullptr));
            N_REQUIRE(r, done == 0, "a receive completed with no send");
            const size_t since = log_size();
            tn::Result rc = net.t->dereg_mr(rcomm, mh2);
            N_CHECK(r, rc == tn::kInvalidUsage,
                    "deregMr of a pending receive's registration gives ", rc_name(rc),
                    ", expected ", rc_name(tn::kInvalidUsage));
            warned_once(r, since, "deregMr of a pending receive's registration");
            N_TRY(l.tell(r, "dereg tried"));
            N_TRY(wait_done(r, l, net, req, 1, got, "message 2"));
            N_CHECK(r, got[0] == int(kLen), "message 2: test gives size ", got[0]);
            buf.check(r, 0xde62, 0, kLen, "message 2");
            N_OK(r, net.t->dereg_mr(rcomm, mh2));
            N_TRY(both_done(r, l, /*receiver=*/true));
            N_OK(r, net.t->close_recv(rcomm));
            N_OK(r, net.t->close_listen(lcomm));
            return close_net(r, net);
        },
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *scomm;
            N_TRY(open_net(r, net));
            N_TRY(connect_conn(r, l, net, &scomm));
            Buf buf;
            N_TRY(buf.alloc(r, false, kLen));
            std::vector<int> got;
            void *req;
            // 1: ours is busy.
            N_TRY(buf.fill(r, 0xde61, 0, kLen));
            void *mh1 = nullptr;
            N_OK(r, net.reg_mr(scomm, buf.ptr(), buf.len(), buf.type(), &mh1));
            N_TRY(post_send(r, l, net, scomm, buf.ptr(), kLen, 1, mh1, &req, "message 1"));
            int done = 0;
            N_OK(r, net.t->test(req, &done, nullptr));
            N_REQUIRE(r, done == 0, "a 1 MiB send completed with no receive posted");
            const size_t since = log_size();
            tn::Result rc = net.t->dereg_mr(scomm, mh1);
            N_CHECK(r, rc == tn::kInvalidUsage, "deregMr of a pending send's registration gives ",
                    rc_name(rc), ", expected ", rc_name(tn::kInvalidUsage));
            warned_once(r, since, "deregMr of a pending send's registration");
            N_TRY(l.tell(r, "dereg tried"));
            N_TRY(wait_done(r, l, net, req, 1, got, "message 1"));
            N_OK(r, net.t->dereg_mr(scomm, mh1));
            // 2: the receiver's is.
            N_TRY(l.expect(r, "dereg tried"));
            N_TRY(buf.fill(r, 0xde62, 0, kLen));
            void *mh2 = nullptr;
            N_OK(r, net.reg_mr(scomm, buf.ptr(), buf.len(), buf.type(), &mh2));
            N_TRY(post_send(r, l, net, scomm, buf.ptr(), kLen, 1, mh2, &req, "message 2"));
            N_TRY(wait_done(r, l, net, req, 1, got, "message 2"));
            N_TRY(both_done(r, l, /*receiver=*/false));
            N_OK(r, net.t->dereg_mr(scomm, mh2));
            N_OK(r, net.t->close_send(scomm));
            return close_net(r, net);
        });
}

// A grouped receive of more than maxRecvs is NCCL misusing the plugin: refused, with no
// request; the comm still takes a group of 8 afterwards.
TEST(BadInput, IrecvOfMoreThanMaxRecvs) {
    run_pair(
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *lcomm, *rcomm;
            N_TRY(open_net(r, net));
            N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
            constexpr int kN = kMaxRecvs + 1;
            Buf buf;
            N_TRY(buf.alloc(r, false, kN * 4 * KiB));
            void *mh = nullptr;
            N_OK(r, net.reg_mr(rcomm, buf.ptr(), buf.len(), buf.type(), &mh));
            void *data[kN], *mhs[kN];
            size_t sizes[kN];
            int tags[kN];
            for (int k = 0; k < kN; ++k) {
                data[k] = buf.ptr(size_t(k) * 4 * KiB);
                mhs[k] = mh;
                sizes[k] = 4 * KiB;
                tags[k] = k;
            }
            void *req = nullptr;
            const size_t since = log_size();
            tn::Result rc = net.irecv(rcomm, kN, data, sizes, tags, mhs, &req);
            N_CHECK(r, rc == tn::kInternalError, "irecv with n = ", kN, " gives ", rc_name(rc),
                    ", expected ", rc_name(tn::kInternalError));
            N_CHECK(r, req == nullptr, "irecv with n = ", kN, " gave a request");
            warned_once(r, since, cat("irecv with n = ", kN));
            N_TRY(post_recv(r, l, net, rcomm, kMaxRecvs, data, sizes, tags, mhs, &req,
                            "a group of 8"));
            std::vector<int> got;
            N_TRY(wait_done(r, l, net, req, kMaxRecvs, got, "a group of 8"));
            for (int k = 0; k < kMaxRecvs; ++k) {
                N_CHECK(r, got[size_t(k)] == 100 + k, "tag ", k, ": test gives size ",
                        got[size_t(k)]);
                buf.check(r, 0x9000u + uint32_t(k), size_t(k) * 4 * KiB, size_t(100 + k),
                          cat("tag ", k));
            }
            N_TRY(both_done(r, l, /*receiver=*/true));
            N_OK(r, net.t->dereg_mr(rcomm, mh));
            N_OK(r, net.t->close_recv(rcomm));
            N_OK(r, net.t->close_listen(lcomm));
            return close_net(r, net);
        },
        [](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *scomm;
            N_TRY(open_net(r, net));
            N_TRY(connect_conn(r, l, net, &scomm));
            Buf buf;
            N_TRY(buf.alloc(r, false, kMaxRecvs * 4 * KiB));
            void *mh = nullptr;
            N_OK(r, net.reg_mr(scomm, buf.ptr(), buf.len(), buf.type(), &mh));
            std::vector<void *> reqs;
            for (int k = kMaxRecvs - 1; k >= 0; --k) {
                N_TRY(buf.fill(r, 0x9000u + uint32_t(k), size_t(k) * 4 * KiB, size_t(100 + k)));
                void *req;
                N_TRY(post_send(r, l, net, scomm, buf.ptr(size_t(k) * 4 * KiB), size_t(100 + k), k,
                                mh, &req, cat("tag ", k)));
                reqs.push_back(req);
            }
            for (void *req : reqs) {
                std::vector<int> got;
                N_TRY(wait_done(r, l, net, req, 1, got, "a send"));
            }
            N_TRY(both_done(r, l, /*receiver=*/false));
            N_OK(r, net.t->dereg_mr(scomm, mh));
            N_OK(r, net.t->close_send(scomm));
            return close_net(r, net);
        });
}

// A send larger than the receive it matches fails on both sides with ncclInvalidUsage (NCCL's
// README: a receive smaller than the send is an error), and nothing is written past the
// receive's size.
// A send larger than the receive buffer of its tag fails at the receiver. A large send (above
// the plugin's eager limit) fails at the sender too: it learns the buffer's size before it
// writes, and writes nothing. An eager one has left before the sender could know, and completes.
struct Truncation {
    size_t send, recv;
    const char *name;
    bool sender_fails;
};

void PrintTo(const Truncation &t, std::ostream *os) {
    *os << t.name;
}

class SendLargerThanReceive : public ::testing::TestWithParam<Truncation> {};

TEST_P(SendLargerThanReceive, FailsAtTheReceiver) {
    const Truncation t = GetParam();
    constexpr uint32_t kStale = 0x57a1e, kData = 0xda7a;
    // The test of the request until it fails; it must not complete.
    // `since`: the log before the post (the plugin may learn of the mismatch, and report it,
    // while posting: its sender learns the receive's size before it writes).
    auto fail_expected = [](Report &r, Link &l, Net<tn::NetV11> &net, void *req,
                            const std::string &what, size_t since) {
        tn::Result rc = tn::kSuccess;
        N_TRY(poll_until(r, l, cat("the error of ", what), [&]() -> int {
            int done = 0, sizes[2] = {-1, -1};
            rc = net.t->test(req, &done, sizes);
            if (rc != tn::kSuccess) return 1;
            if (done) {
                N_FAIL(r, what, " completed successfully (size ", sizes[0], ")");
                return -1;
            }
            return 0;
        }));
        N_CHECK(r, rc == tn::kInvalidUsage, "test of ", what, " gives ", rc_name(rc), ", expected ",
                rc_name(tn::kInvalidUsage));
        warned_once(r, since, cat("the failed test of ", what));
        return true;
    };
    run_pair(
        [t, fail_expected](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *lcomm, *rcomm;
            N_TRY(open_net(r, net));
            N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
            Buf buf;  // larger than the receive posted into it: its tail must stay stale
            N_TRY(buf.alloc(r, false, t.send + 4 * KiB));
            N_TRY(buf.fill(r, kStale, 0, buf.len()));
            void *mh = nullptr, *req, *data = buf.ptr();
            N_OK(r, net.reg_mr(rcomm, buf.ptr(), buf.len(), buf.type(), &mh));
            size_t posted = t.recv;
            int tag = 1;
            const std::string what = cat("a ", t.recv, " B receive of a ", t.send, " B send");
            const size_t since = log_size();
            N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh, &req, what));
            N_TRY(fail_expected(r, l, net, req, what, since));
            // Only [0, recv) may have been written.
            std::vector<uint8_t> tail(buf.len() - t.recv);
            memcpy(tail.data(), static_cast<char *>(buf.ptr()) + t.recv, tail.size());
            for (size_t i = 0; i < tail.size(); ++i) {
                if (tail[i] != pattern(t.recv + i, kStale)) {
                    N_FAIL(r, what, ": byte ", t.recv + i, " (past the receive) was written");
                    break;
                }
            }
            // The comm is done for; both sides still close it, after the other saw its error.
            N_TRY(l.tell(r, "seen"));
            N_TRY(l.expect(r, "seen"));
            N_EXPECT_RC(r, net.t->dereg_mr(rcomm, mh), tn::kSuccess);
            N_EXPECT_RC(r, net.t->close_recv(rcomm), tn::kSuccess);
            N_EXPECT_RC(r, net.t->close_listen(lcomm), tn::kSuccess);
            return close_net(r, net);
        },
        [t, fail_expected](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *scomm;
            N_TRY(open_net(r, net));
            N_TRY(connect_conn(r, l, net, &scomm));
            Buf buf;
            void *mh = nullptr, *req;
            N_TRY(send_source(r, net, scomm, buf, false, t.send, kData, &mh));
            const std::string what = cat("a ", t.send, " B send into a ", t.recv, " B receive");
            const size_t since = log_size();
            N_TRY(post_send(r, l, net, scomm, buf.ptr(), t.send, 1, mh, &req, what));
            if (t.sender_fails) {
                N_TRY(fail_expected(r, l, net, req, what, since));
            } else {
                std::vector<int> got;
                N_TRY(wait_done(r, l, net, req, 1, got, what));
                N_CHECK(r, got[0] == int(t.send), what, ": test gives size ", got[0]);
            }
            N_TRY(l.tell(r, "seen"));
            N_TRY(l.expect(r, "seen"));
            N_EXPECT_RC(r, net.t->dereg_mr(scomm, mh), tn::kSuccess);
            N_EXPECT_RC(r, net.t->close_send(scomm), tn::kSuccess);
            return close_net(r, net);
        });
}

INSTANTIATE_TEST_SUITE_P(Sizes, SendLargerThanReceive,
                         ::testing::Values(Truncation{100, 10, "Small100BInto10B", false},
                                           Truncation{1 * MiB, 64 * KiB, "Large1MiBInto64KiB",
                                                      true}),
                         [](const auto &info) { return std::string(info.param.name); });

// deregMr of something regMr never gave: refused, on either kind of comm.
TEST(BadInput, DeregOfUnknownHandle) {
    auto dereg_junk = [](Report &r, Net<tn::NetV11> &net, void *comm, const char *kind) {
        const size_t since = log_size();
        tn::Result rc = net.t->dereg_mr(comm, reinterpret_cast<void *>(0x5678));
        N_CHECK(r, rc == tn::kInvalidUsage, "deregMr(", kind, ", 0x5678) gives ", rc_name(rc),
                ", expected ", rc_name(tn::kInvalidUsage));
        return warned_once(r, since, cat("deregMr(", kind, ", 0x5678)"));
    };
    run_pair(
        [dereg_junk](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *lcomm, *rcomm;
            N_TRY(open_net(r, net));
            N_TRY(accept_conn(r, l, net, &lcomm, &rcomm));
            dereg_junk(r, net, rcomm, "recvComm");
            N_TRY(l.tell(r, "done"));
            N_TRY(l.expect(r, "done"));
            N_OK(r, net.t->close_recv(rcomm));
            N_OK(r, net.t->close_listen(lcomm));
            return close_net(r, net);
        },
        [dereg_junk](Report &r, Link &l) {
            Net<tn::NetV11> net;
            void *scomm;
            N_TRY(open_net(r, net));
            N_TRY(connect_conn(r, l, net, &scomm));
            dereg_junk(r, net, scomm, "sendComm");
            N_TRY(l.tell(r, "done"));
            N_TRY(l.expect(r, "done"));
            N_OK(r, net.t->close_send(scomm));
            return close_net(r, net);
        });
}

}  // namespace

// ---- interface v12 and virtual NICs (makeVDevice) ---------------------------------------------

namespace {

// v12 end to end: set-up, registrations, a grouped receive of 0 B, 100 B and 1 MiB, data and
// sizes checked (plan_receiver with its properties check, which covers v12's fields below).
TEST(V12, EndToEndThroughTheV12Table) {
    run_older<tn::NetV12>(false, false);
}

// railId and planeId: tandem cannot see the fabric's wiring, so both are NCCL_NET_ID_UNDEF; a
// physical device's vProps is itself.
TEST(V12, PropertiesRailAndPlaneUndefined) {
    run_one([](Report &r) {
        Net<tn::NetV12> net;
        N_TRY(open_net(r, net));
        tn::PropertiesV12 p{};
        p.rail_id = p.plane_id = 7;
        N_OK(r, net.t->get_properties(0, &p));
        N_CHECK(r,
                p.rail_id == tn::kNetIdUndef && p.plane_id == tn::kNetIdUndef &&
                    p.vprops.ndevs == 1 && p.vprops.devs[0] == 0 && p.max_multi_request_size == 1,
                "railId ", p.rail_id, " planeId ", p.plane_id, " vProps ", p.vprops.ndevs, "/",
                p.vprops.devs[0]);
        return close_net(r, net);
    });
}

// Two devices in one process without a second NIC: the loopback interface, named in
// FI_TANDEM_IFACE with the first other interface that has an IPv4 address (set before the
// plugin loads). "" when there is none.
std::string two_interfaces() {
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0) return "";
    std::string other;
    for (ifaddrs *i = list; i && other.empty(); i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
            !(i->ifa_flags & IFF_LOOPBACK))
            other = i->ifa_name;
    freeifaddrs(list);
    return other.empty() ? "" : other + ",lo";
}

// Opens v12 on two devices and fuses them: *vdev is the virtual NIC. false with a SKIP note
// when this machine has no second interface.
bool open_two(Report &r, Net<tn::NetV12> &net, int *vdev, bool *skip) {
    *skip = false;
    std::string ifaces = two_interfaces();
    if (ifaces.empty()) {
        r.note("SKIP no interface with an IPv4 address besides the loopback one");
        *skip = true;
        return false;
    }
    setenv("FI_TANDEM_IFACE", ifaces.c_str(), 1);
    N_TRY(open_net(r, net));
    int n = 0;
    N_OK(r, net.t->devices(&n));
    N_REQUIRE(r, n >= 2, "FI_TANDEM_IFACE=", ifaces, " gives ", n, " devices");
    tn::VirtualDevicePropsV12 vp{};
    vp.ndevs = 2;
    vp.devs[0] = 0;
    vp.devs[1] = 1;
    N_OK(r, net.t->make_vdevice(vdev, &vp));
    N_REQUIRE(r, *vdev == n, "makeVDevice gave device ", *vdev, ", expected ", n);
    return true;
}

using MemberBytes = int (*)(int, int, uint64_t *, uint64_t *);

std::vector<size_t> vnic_sizes() {
    return {0, 1, 4096, 65536, 300 * KiB, 1 * MiB, 4 * MiB, 8 * MiB + 12345};
}

// What a vNIC role reports at the end: the bytes each member carried.
struct Carried {
    uint64_t bytes[2] = {};
    bool valid = false;  // the role got that far
};

bool member_bytes(Report &r, int vdev, bool sent, Carried *c) {
    auto fn = reinterpret_cast<MemberBytes>(dlsym(open_plugin(r), "tandem_nccl_test_member_bytes"));
    N_REQUIRE(r, fn != nullptr, "the plugin exports no tandem_nccl_test_member_bytes");
    for (int m = 0; m < 2; ++m) {
        uint64_t s = 0, v = 0;
        N_REQUIRE(r, fn(vdev, m, &s, &v) == 0, "no member ", m, " of device ", vdev);
        c->bytes[m] = sent ? s : v;
    }
    c->valid = true;
    return true;
}

// The receiver: every size into one buffer, checked; then what its members received.
bool vnic_receiver(Report &r, Link &l, Carried *c) {
    Net<tn::NetV12> net;
    int vdev = -1;
    bool skip;
    if (!open_two(r, net, &vdev, &skip)) return skip;
    char handle[tn::kHandleMaxSize] = {};
    void *lcomm = nullptr, *rcomm = nullptr;
    N_OK(r, net.listen(vdev, handle, &lcomm));
    N_TRY(l.send(r, handle, sizeof handle, "the listen handle"));
    tn::DeviceHandle *dh = nullptr;
    N_TRY(poll_until(r, l, "accept", [&]() -> int {
        return net.accept(lcomm, &rcomm, &dh) != tn::kSuccess ? -1 : rcomm != nullptr;
    }));
    const auto sizes = vnic_sizes();
    Buf buf;
    N_TRY(buf.alloc(r, false, sizes.back()));
    void *mh = nullptr;
    N_OK(r, net.reg_mr(rcomm, buf.ptr(), buf.len(), buf.type(), &mh));
    for (size_t i = 0; i < sizes.size(); ++i) {
        size_t posted = buf.len();
        int tag = 3;
        void *data = buf.ptr(), *req = nullptr;
        const std::string what = cat("the ", sizes[i], " B message");
        N_TRY(post_recv(r, l, net, rcomm, 1, &data, &posted, &tag, &mh, &req, what));
        std::vector<int> got;
        N_TRY(wait_done(r, l, net, req, 1, got, what));
        N_REQUIRE(r, got[0] == int(sizes[i]), what, ": test gives size ", got[0]);
        N_TRY(buf.check(r, size_seed(i), 0, sizes[i], what));
    }
    N_TRY(both_done(r, l, true));
    N_TRY(member_bytes(r, vdev, false, c));
    N_OK(r, net.t->dereg_mr(rcomm, mh));
    N_OK(r, net.t->close_recv(rcomm));
    N_OK(r, net.t->close_listen(lcomm));
    return close_net(r, net);
}

bool vnic_sender(Report &r, Link &l, Carried *c) {
    Net<tn::NetV12> net;
    int vdev = -1;
    bool skip;
    if (!open_two(r, net, &vdev, &skip)) return skip;
    char handle[tn::kHandleMaxSize];
    N_TRY(l.recv_exact(r, handle, sizeof handle, "the listen handle"));
    void *scomm = nullptr;
    tn::DeviceHandle *dh = nullptr;
    N_TRY(poll_until(r, l, "connect", [&]() -> int {
        return net.connect(vdev, handle, &scomm, &dh) != tn::kSuccess ? -1 : scomm != nullptr;
    }));
    const auto sizes = vnic_sizes();
    Buf buf;
    N_TRY(buf.alloc(r, false, sizes.back()));
    void *mh = nullptr;
    N_OK(r, net.reg_mr(scomm, buf.ptr(), buf.len(), buf.type(), &mh));
    for (size_t i = 0; i < sizes.size(); ++i) {
        N_TRY(buf.fill(r, size_seed(i), 0, sizes[i]));
        const std::string what = cat("the ", sizes[i], " B message");
        void *req;
        N_TRY(post_send(r, l, net, scomm, buf.ptr(), sizes[i], 3, mh, &req, what));
        std::vector<int> got;
        N_TRY(wait_done(r, l, net, req, 1, got, what));
    }
    N_TRY(both_done(r, l, false));
    N_TRY(member_bytes(r, vdev, true, c));
    N_OK(r, net.t->dereg_mr(scomm, mh));
    N_OK(r, net.t->close_send(scomm));
    return close_net(r, net);
}

// `check` judges what the receiver's and the sender's members carried.
void run_vnic(std::function<bool(Report &, const Carried &)> check) {
    run_pair(
        [check](Report &r, Link &l) {
            Carried c;
            return vnic_receiver(r, l, &c) && (!c.valid || check(r, c));
        },
        [check](Report &r, Link &l) {
            Carried c;
            return vnic_sender(r, l, &c) && (!c.valid || check(r, c));
        });
}

// Messages from 0 B to 8 MiB over a two-device vNIC arrive whole and intact (the roles check
// every byte and size); what each member carried adds up to what was sent.
TEST(VNic, StripedMessagesArriveIntact) {
    uint64_t total = 0;
    for (size_t s : vnic_sizes()) total += s;
    run_vnic([total](Report &r, const Carried &c) {
        N_CHECK(r, c.bytes[0] + c.bytes[1] == total, "the members carried ", c.bytes[0], " + ",
                c.bytes[1], " B of ", total);
        return true;
    });
}

// Both members carry traffic: each at least a quarter of the bytes (the messages of 1 MiB and
// more are split in halves).
TEST(VNic, BothMembersCarryTraffic) {
    run_vnic([](Report &r, const Carried &c) {
        const uint64_t total = c.bytes[0] + c.bytes[1];
        r.note(cat("member bytes: ", c.bytes[0], " + ", c.bytes[1]));
        N_CHECK(r, c.bytes[0] >= total / 4 && c.bytes[1] >= total / 4, "member 0 carried ",
                c.bytes[0], " B, member 1 ", c.bytes[1], " B");
        return true;
    });
}

// Bad input to makeVDevice: an error result and one WARN line, no device made.
using Make = std::function<tn::Result(Report &, Net<tn::NetV12> &, int *)>;
void bad_vdevice(tn::Result want, Make make) {
    run_one([want, make](Report &r) {
        Net<tn::NetV12> net;
        int vdev = -1;
        bool skip;
        if (!open_two(r, net, &vdev, &skip)) return skip;
        int before = 0, after = 0, made = -1;
        N_OK(r, net.t->devices(&before));
        size_t since = log_size();
        N_RC(r, make(r, net, &made), want);
        N_TRY(warned_once(r, since, "makeVDevice"));
        N_OK(r, net.t->devices(&after));
        N_CHECK(r, after == before, "devices() went from ", before, " to ", after);
        return close_net(r, net);
    });
}

tn::Result make_of(Net<tn::NetV12> &net, int *d, std::vector<int> devs) {
    tn::VirtualDevicePropsV12 vp{};
    vp.ndevs = int(devs.size());
    for (size_t i = 0; i < devs.size() && i < 8; ++i) vp.devs[i] = devs[i];
    return net.t->make_vdevice(d, &vp);
}

TEST(VNicBadInput, EmptyList) {
    bad_vdevice(tn::kInvalidUsage, [](Report &, auto &net, int *d) { return make_of(net, d, {}); });
}
TEST(VNicBadInput, NineDevices) {
    bad_vdevice(tn::kInvalidUsage, [](Report &, auto &net, int *d) {
        return make_of(net, d, {0, 1, 0, 1, 0, 1, 0, 1, 0});
    });
}
TEST(VNicBadInput, DuplicatedDevice) {
    bad_vdevice(tn::kInvalidUsage, [](Report &, auto &net, int *d) {
        return make_of(net, d, {0, 1, 0});
    });
}
TEST(VNicBadInput, UnknownDevice) {
    bad_vdevice(tn::kInvalidUsage, [](Report &, auto &net, int *d) {
        return make_of(net, d, {0, 99});
    });
}
// open_two made device 2, the vNIC of 0 and 1: it cannot be a member.
TEST(VNicBadInput, NestedVirtualNic) {
    bad_vdevice(tn::kInvalidUsage, [](Report &, auto &net, int *d) {
        return make_of(net, d, {0, 2});
    });
}
// v11's vProps hold 4 devices: 5 is refused there.
TEST(VNicBadInput, FiveDevicesThroughV11) {
    bad_vdevice(tn::kInvalidUsage, [](Report &r, auto &, int *d) {
        const tn::NetV11 *t = load_table<tn::NetV11>(r);
        tn::VirtualDeviceProps vp{5, {0, 1, 0, 1}};
        return t ? t->make_vdevice(d, &vp) : tn::kInternalError;
    });
}

}  // namespace
