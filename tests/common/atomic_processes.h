// Atomics between processes: one target process exposes a region of its memory (host or
// device), initiator processes work on it with fi_atomic(3) calls. Used by
// tests/peer/test_atomic_processes.cpp (host memory) and tests/hmem/test_hmem_atomic.cpp
// (device memory of the emulated CUDA driver, or of a real one).
//
// Every role runs in a process of its own, forked from the gtest process before any libfabric
// call (the gtest process never makes one), so that libfabric and the providers initialise in
// each role separately. The roles share one anonymous MAP_SHARED block (made before the fork):
// the target publishes its endpoint name, the region's address and key there; initiators store
// what they fetched; the gtest process tells the target when all initiators have exited. The
// target progresses its endpoint until then (sleeping in fi_cq_sread, or polling fi_cq_read
// and yielding), and serves the initiators' requests to set or read its region (its own copies:
// memcpy, or the driver's cuMemcpyHtoD / cuMemcpyDtoH, never the CPU on device memory).
//
// Each child writes its failures to a pipe as they happen ("F ..." lines; "I ..." notes), so a
// child that is killed later has still said what went wrong. Every wait is bounded; the gtest
// process kills whatever has not ended at the deadline and fails the test, naming the role.
// Roles name their processes (prctl PR_SET_NAME, "at-target", "at-init-2", ...).
#pragma once

#include "tests/common/progress_env.h"
#include "tests/common/shared_map.h"

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
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
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tandem_test::atomic_procs {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline constexpr uint32_t kFiVersion = FI_VERSION(1, 17);
inline constexpr auto kWait = 20s;  // any single wait of a role (the target's hello, a completion)

template <typename... A>
std::string cat(const A &...a) {
    std::ostringstream o;
    (o << ... << a);
    return o.str();
}

using Env = std::vector<std::pair<std::string, std::string>>;

// Which path the environment selects (FI_TANDEM_LOCAL=0: the TCP link), with `env` set on top
// of this process's.
inline const char *path_name(const Env &env = {}) {
    const char *v = getenv("FI_TANDEM_LOCAL");
    for (const auto &[k, val] : env)
        if (k == "FI_TANDEM_LOCAL") v = val.c_str();
    return v && strcmp(v, "0") == 0 ? "TCP link (FI_TANDEM_LOCAL=0)"
                                    : "node-local (off_tandem shared memory)";
}

// libfabric's exported calls the roles need (everything else is an inline wrapper of an ops
// table): linked directly, or found with dlsym in the child.
struct Lib {
    int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const fi_info *,
                   fi_info **) = nullptr;
    void (*freeinfo)(fi_info *) = nullptr;
    fi_info *(*dupinfo)(const fi_info *) = nullptr;
    int (*fabric)(fi_fabric_attr *, fid_fabric **, void *) = nullptr;
    const char *(*strerror)(int) = nullptr;
    bool ok() const { return getinfo && freeinfo && dupinfo && fabric && strerror; }
};

// Memory of one kind, as the roles use it. Every call returns "" or what went wrong.
struct Memory {
    std::string name = "host";
    fi_hmem_iface iface = FI_HMEM_SYSTEM;
    int device = 0;
    std::function<std::string()> init = [] { return std::string(); };  // once per process
    std::function<std::string(size_t, void **)> alloc = [](size_t len, void **p) {
        *p = std::aligned_alloc(4096, (len + 4095) / 4096 * 4096);
        if (*p) std::memset(*p, 0, len);
        return *p ? std::string() : std::string("out of memory");
    };
    std::function<void(void *)> release = [](void *p) { std::free(p); };
    std::function<std::string(void *, const void *, size_t)> put =  // host bytes -> memory
        [](void *dst, const void *src, size_t n) {
            std::memcpy(dst, src, n);
            return std::string();
        };
    std::function<std::string(void *, const void *, size_t)> get =  // memory -> host bytes
        [](void *dst, const void *src, size_t n) {
            std::memcpy(dst, src, n);
            return std::string();
        };
};

// ---- a role's reports -------------------------------------------------------------------------

class Report {
  public:
    Report(std::string who, int fd) : who_(std::move(who)), fd_(fd) {}
    const std::string &who() const { return who_; }
    bool failed() const { return failed_; }
    bool fail(const char *file, int line, const std::string &msg) {
        failed_ = true;
        const char *base = strrchr(file, '/');
        emit('F', cat(base ? base + 1 : file, ":", line, ": ", msg));
        return false;
    }
    void note(const std::string &msg) { emit('I', msg); }

  private:
    void emit(char kind, std::string msg) {
        for (char &c : msg)
            if (c == '\n') c = ' ';
        std::string line = cat(kind, ' ', msg, '\n');
        if (fd_ >= 0 && ::write(fd_, line.data(), line.size()) < 0) {
        }
    }
    std::string who_;
    int fd_;
    bool failed_ = false;
};

#define AP_FAIL(r, ...) (r).fail(__FILE__, __LINE__, ::tandem_test::atomic_procs::cat(__VA_ARGS__))
// In a role: returns (from a void function) when cond does not hold.
#define AP_REQUIRE(r, cond, ...)                                \
    do {                                                        \
        if (!(cond)) {                                          \
            AP_FAIL(r, #cond __VA_OPT__(, ": ", ) __VA_ARGS__); \
            return;                                             \
        }                                                       \
    } while (0)
#define AP_CHECK(r, cond, ...)                                           \
    do {                                                                 \
        if (!(cond)) AP_FAIL(r, #cond __VA_OPT__(, ": ", ) __VA_ARGS__); \
    } while (0)
#define AP_TRY(expr)         \
    do {                     \
        if (!(expr)) return; \
    } while (0)

// ---- what the processes share -----------------------------------------------------------------

inline constexpr int kMaxInitiators = 8;
inline constexpr size_t kMaxValues = 10000;
inline constexpr size_t kCmdBytes = 8192;

enum Cmd : int { kCmdSet = 1, kCmdGet = 2 };

struct Shared {
    // The target: 1 once the fields below are valid, -1 when it failed before that.
    std::atomic<int> target_state;
    uint32_t name_len;
    uint8_t name[256];
    uint64_t region_addr, region_key;
    uint64_t inject_size, tx_size;
    // The gtest process: every initiator has exited (the target may finish).
    std::atomic<int> initiators_exited;
    // Initiators that are connected and about to start (a start line for contention).
    std::atomic<int> initiators_ready;
    // An initiator's request to the target (one at a time): set or read region bytes.
    std::atomic<uint64_t> cmd_seq, ack_seq;
    int cmd;
    int cmd_ok;
    uint64_t cmd_off, cmd_len;
    uint8_t cmd_data[kCmdBytes];
    // The target's region (its first 256 bytes) after every initiator exited.
    std::atomic<int> target_done;
    uint8_t final_region[256];
    // What each initiator saw, and how often it found the lock taken.
    uint64_t nvalues[kMaxInitiators];
    uint64_t values[kMaxInitiators][kMaxValues];
    uint64_t busy[kMaxInitiators];
};

// An anonymous shared mapping, made before the roles are forked.
using SharedBlock = SharedMap<Shared>;

// ---- one endpoint of a role -------------------------------------------------------------------

// tandem's plain entry (not a layered one) for an RDM endpoint on 127.0.0.1 (FI_SOURCE) with
// caps, mr_mode and an FI_AV_TABLE AV, to free with lib.freeinfo; null, with what went wrong in
// *why, when there is none.
inline fi_info *tandem_info(const Lib &lib, uint64_t caps, int mr_mode, std::string *why) {
    fi_info *hints = lib.dupinfo(nullptr);
    if (!hints) {
        *why = "fi_dupinfo(NULL) failed";
        return nullptr;
    }
    hints->caps = caps;
    hints->addr_format = FI_SOCKADDR_IN;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = mr_mode;
    hints->domain_attr->av_type = FI_AV_TABLE;
    ask_test_progress(hints->domain_attr);
    hints->fabric_attr->prov_name = strdup("tandem");
    fi_info *list = nullptr;
    const int ret = lib.getinfo(kFiVersion, "127.0.0.1", nullptr, FI_SOURCE, hints, &list);
    lib.freeinfo(hints);
    if (ret) {
        *why = cat("fi_getinfo(tandem) -> ", lib.strerror(-ret), " (", ret, ")");
        return nullptr;
    }
    fi_info *info = nullptr;
    for (fi_info *i = list; i && !info; i = i->next)
        if (i->fabric_attr && i->fabric_attr->prov_name &&
            strcmp(i->fabric_attr->prov_name, "tandem") == 0)
            info = lib.dupinfo(i);
    lib.freeinfo(list);
    if (!info) *why = "fi_getinfo lists no plain tandem entry";
    return info;
}

struct Comp {
    bool err = false;
    fi_cq_tagged_entry e{};
    fi_cq_err_entry ee{};
    void *ctx() const { return err ? ee.op_context : e.op_context; }
};

class Node {
  public:
    Node(const Lib &lib, Report &r) : lib_(lib), r_(r) {}
    Node(const Node &) = delete;
    Node &operator=(const Node &) = delete;
    ~Node() { close(); }

    std::string str(long ret) const {
        if (ret >= 0) return cat(ret);
        return cat(lib_.strerror(static_cast<int>(-ret)), " (", ret, ")");
    }
    std::string show(const Comp &c) const {
        if (c.err)
            return cat("error completion: err ", c.ee.err, " (", lib_.strerror(c.ee.err),
                       "), flags 0x", std::hex, c.ee.flags);
        return cat("completion: len ", c.e.len, ", flags 0x", std::hex, c.e.flags);
    }

    // An enabled RDM endpoint of tandem on 127.0.0.1; `wait`: its CQ can be slept on.
    bool open(uint64_t caps, int mr_mode, bool wait) {
        std::string why;
        if (!(info = tandem_info(lib_, caps, mr_mode, &why))) return fail(__LINE__, why);
        int ret;
        if ((ret = lib_.fabric(info->fabric_attr, &fabric, nullptr)))
            return fail(__LINE__, cat("fi_fabric -> ", str(ret)));
        if ((ret = fi_domain(fabric, info, &domain, nullptr)))
            return fail(__LINE__, cat("fi_domain -> ", str(ret)));
        fi_cq_attr cq_attr{};
        cq_attr.size = 1024;
        cq_attr.format = FI_CQ_FORMAT_TAGGED;
        cq_attr.wait_obj = wait ? FI_WAIT_UNSPEC : FI_WAIT_NONE;
        if ((ret = fi_cq_open(domain, &cq_attr, &cq, nullptr)))
            return fail(__LINE__, cat("fi_cq_open -> ", str(ret)));
        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        av_attr.count = 16;
        if ((ret = fi_av_open(domain, &av_attr, &av, nullptr)))
            return fail(__LINE__, cat("fi_av_open -> ", str(ret)));
        if ((ret = fi_endpoint(domain, info, &ep, nullptr)))
            return fail(__LINE__, cat("fi_endpoint -> ", str(ret)));
        if ((ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)))
            return fail(__LINE__, cat("fi_ep_bind(cq) -> ", str(ret)));
        if ((ret = fi_ep_bind(ep, &av->fid, 0)))
            return fail(__LINE__, cat("fi_ep_bind(av) -> ", str(ret)));
        if ((ret = fi_enable(ep))) return fail(__LINE__, cat("fi_enable -> ", str(ret)));
        waitable_ = wait;
        return true;
    }

    // Registers [p, p + len) of memory `m`; its MR (kept until close), or null.
    fid_mr *reg(void *p, size_t len, const Memory &m, uint64_t access) {
        iovec iov{p, len};
        fi_mr_attr attr{};
        attr.mr_iov = &iov;
        attr.iov_count = 1;
        attr.access = access;
        attr.iface = m.iface;
        if (m.iface == FI_HMEM_CUDA) attr.device.cuda = m.device;
        fid_mr *mr = nullptr;
        int ret = fi_mr_regattr(domain, &attr, 0, &mr);
        if (ret) {
            fail(__LINE__, cat("fi_mr_regattr(", m.name, ", ", len, " B) -> ", str(ret)));
            return nullptr;
        }
        mrs_.push_back(mr);
        return mr;
    }

    // Closes a registration of reg() before its memory goes.
    void unreg(fid_mr *mr) {
        auto it = std::find(mrs_.begin(), mrs_.end(), mr);
        if (it == mrs_.end()) return;  // closed with the endpoint already
        mrs_.erase(it);
        int ret = fi_close(&mr->fid);
        if (ret) fail(__LINE__, cat("fi_close(MR) -> ", str(ret)));
    }

    bool insert(const uint8_t *name, size_t len, fi_addr_t *out) {
        (void)len;
        int ret = fi_av_insert(av, name, 1, out, 0, nullptr);
        return ret == 1 ? true : fail(__LINE__, cat("fi_av_insert -> ", str(ret)));
    }

    // One pass of progress (or one sleep of up to `sleep_ms` in fi_cq_sread when the CQ was
    // opened to be slept on); completions are kept for take().
    void progress(int sleep_ms = 0) {
        fi_cq_tagged_entry e[16];
        ssize_t n = waitable_ && sleep_ms > 0 ? fi_cq_sread(cq, e, 16, nullptr, sleep_ms)
                                              : fi_cq_read(cq, e, 16);
        if (n > 0) {
            for (ssize_t i = 0; i < n; ++i) {
                Comp c;
                c.e = e[i];
                comps_.push_back(c);
            }
        } else if (n == -FI_EAVAIL) {
            Comp c;
            c.err = true;
            if (fi_cq_readerr(cq, &c.ee, 0) == 1) comps_.push_back(c);
        } else if (n != -FI_EAGAIN && n != -FI_ETIMEDOUT && !cq_error_reported_) {
            cq_error_reported_ = true;
            fail(__LINE__, cat("fi_cq_read -> ", str(n)));
        }
    }
    // Any completion kept (the oldest first).
    bool take_any(Comp &out) {
        if (comps_.empty()) return false;
        out = comps_.front();
        comps_.pop_front();
        return true;
    }
    // The completion of the operation with this context (bounded).
    bool wait(void *ctx, Comp &out, const char *what, int sleep_ms = 0) {
        const auto deadline = Clock::now() + kWait;
        for (;;) {
            for (auto it = comps_.begin(); it != comps_.end(); ++it) {
                if (it->ctx() == ctx) {
                    out = *it;
                    comps_.erase(it);
                    return true;
                }
            }
            progress(sleep_ms);
            if (Clock::now() > deadline)
                return fail(
                    __LINE__,
                    cat("no completion of ", what, " within ",
                        std::chrono::duration_cast<std::chrono::seconds>(kWait).count(), " s"));
        }
    }
    // Posts, retrying while the provider says -FI_EAGAIN (progressing meanwhile).
    template <typename F>
    bool post(const char *what, F &&call) {
        const auto deadline = Clock::now() + kWait;
        for (;;) {
            ssize_t ret = call();
            if (ret == 0) return true;
            if (ret != -FI_EAGAIN) return fail(__LINE__, cat(what, " -> ", str(ret)));
            progress();
            if (Clock::now() > deadline)
                return fail(__LINE__, cat(what, " kept giving -FI_EAGAIN"));
        }
    }
    // Posts and waits for success.
    template <typename F>
    bool run(const char *what, void *ctx, F &&call, int sleep_ms = 0) {
        if (!post(what, call)) return false;
        Comp c;
        if (!wait(ctx, c, what, sleep_ms)) return false;
        if (c.err) return fail(__LINE__, cat(what, ": ", show(c)));
        return true;
    }

    void close() {
        auto shut = [&](fid_t f, const char *what) {
            int ret = fi_close(f);
            if (ret) fail(__LINE__, cat("fi_close(", what, ") -> ", str(ret)));
        };
        if (ep) shut(&ep->fid, "endpoint");
        ep = nullptr;
        for (fid_mr *mr : mrs_) shut(&mr->fid, "MR");
        mrs_.clear();
        if (av) shut(&av->fid, "AV");
        av = nullptr;
        if (cq) shut(&cq->fid, "CQ");
        cq = nullptr;
        if (domain) shut(&domain->fid, "domain");
        domain = nullptr;
        if (fabric) shut(&fabric->fid, "fabric");
        fabric = nullptr;
        if (info) lib_.freeinfo(info);
        info = nullptr;
    }

    fi_info *info = nullptr;
    fid_fabric *fabric = nullptr;
    fid_domain *domain = nullptr;
    fid_cq *cq = nullptr;
    fid_av *av = nullptr;
    fid_ep *ep = nullptr;

  private:
    bool fail(int line, const std::string &msg) { return r_.fail(__FILE__, line, msg); }

    const Lib &lib_;
    Report &r_;
    std::vector<fid_mr *> mrs_;
    std::deque<Comp> comps_;
    bool cq_error_reported_ = false;
    bool waitable_ = false;
};

// ---- the target role --------------------------------------------------------------------------

struct TargetConfig {
    Lib lib;
    Memory mem;  // where the region lives
    uint64_t caps = 0;
    int mr_mode = 0;
    size_t region_len = 4096;
    bool sleep = true;  // fi_cq_sread (else fi_cq_read and sched_yield)
};

// Opens an endpoint, exposes a zeroed region, publishes it, progresses and serves requests
// until the gtest process says every initiator exited; then stores the region's first bytes.
inline void target_role(Report &r, Shared &sh, const TargetConfig &cfg) {
    struct Guard {
        Shared &sh;
        ~Guard() {
            if (sh.target_state.load() == 0) sh.target_state.store(-1);
        }
    } guard{sh};
    AP_REQUIRE(r, cfg.lib.ok(), "libfabric could not be loaded");
    std::string err = cfg.mem.init();
    AP_REQUIRE(r, err.empty(), err);
    void *region = nullptr;
    err = cfg.mem.alloc(cfg.region_len, &region);
    AP_REQUIRE(r, err.empty(), "allocating the region (", cfg.mem.name, "): ", err);
    struct Free {
        const Memory &m;
        void *p;
        ~Free() { m.release(p); }
    } free_region{cfg.mem, region};
    {
        std::vector<uint8_t> zero(cfg.region_len, 0);
        err = cfg.mem.put(region, zero.data(), zero.size());
        AP_REQUIRE(r, err.empty(), "zeroing the region: ", err);
    }
    Node n(cfg.lib, r);
    AP_TRY(n.open(cfg.caps, cfg.mr_mode, cfg.sleep));
    fid_mr *mr = n.reg(region, cfg.region_len, cfg.mem, FI_REMOTE_READ | FI_REMOTE_WRITE);
    AP_TRY(mr);
    size_t len = sizeof sh.name;
    int ret = fi_getname(&n.ep->fid, sh.name, &len);
    AP_REQUIRE(r, ret == 0, "fi_getname -> ", n.str(ret));
    sh.name_len = static_cast<uint32_t>(len);
    sh.region_addr =
        (n.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uintptr_t>(region) : 0;
    sh.region_key = fi_mr_key(mr);
    sh.inject_size = n.info->tx_attr->inject_size;
    sh.tx_size = n.info->tx_attr->size;
    sh.target_state.store(1, std::memory_order_release);

    uint64_t served = 0;
    auto serve = [&] {
        const uint64_t seq = sh.cmd_seq.load(std::memory_order_acquire);
        if (seq == served) return;
        served = seq;
        std::string e;
        if (sh.cmd_off + sh.cmd_len > cfg.region_len || sh.cmd_len > kCmdBytes)
            e = "request outside the region";
        else if (sh.cmd == kCmdSet)
            e = cfg.mem.put(static_cast<uint8_t *>(region) + sh.cmd_off, sh.cmd_data, sh.cmd_len);
        else if (sh.cmd == kCmdGet)
            e = cfg.mem.get(sh.cmd_data, static_cast<uint8_t *>(region) + sh.cmd_off, sh.cmd_len);
        else
            e = cat("unknown request ", sh.cmd);
        if (!e.empty()) AP_FAIL(r, "serving an initiator's request: ", e);
        sh.cmd_ok = e.empty();
        sh.ack_seq.store(seq, std::memory_order_release);
    };
    // Until every initiator exited. The gtest process's deadline bounds this loop.
    while (!sh.initiators_exited.load(std::memory_order_acquire)) {
        n.progress(cfg.sleep ? 2 : 0);
        serve();
        if (!cfg.sleep) sched_yield();
        Comp c;
        while (n.take_any(c))  // nothing is expected here
            AP_FAIL(r, "unexpected completion at the target: ", n.show(c));
    }
    serve();
    err = cfg.mem.get(sh.final_region, region, std::min(cfg.region_len, sizeof sh.final_region));
    AP_REQUIRE(r, err.empty(), "reading the region back: ", err);
    sh.target_done.store(1, std::memory_order_release);
}

// ---- the initiators' side ---------------------------------------------------------------------

// Waits for the target's hello and inserts its address; false (reported) if it never came.
inline bool connect_to_target(Report &r, Shared &sh, Node &n, fi_addr_t *peer) {
    const auto deadline = Clock::now() + kWait;
    int st;
    while ((st = sh.target_state.load(std::memory_order_acquire)) == 0) {
        if (Clock::now() > deadline) return AP_FAIL(r, "the target never published its region");
        std::this_thread::sleep_for(1ms);
    }
    if (st != 1) return AP_FAIL(r, "the target failed before publishing its region");
    return n.insert(sh.name, sh.name_len, peer);
}

// Every initiator connected (a start line, so that they really contend).
inline bool start_line(Report &r, Shared &sh, int initiators) {
    sh.initiators_ready.fetch_add(1);
    const auto deadline = Clock::now() + kWait;
    while (sh.initiators_ready.load() < initiators) {
        if (Clock::now() > deadline)
            return AP_FAIL(r, "only ", sh.initiators_ready.load(), " of ", initiators,
                           " initiators came to the start");
        std::this_thread::sleep_for(1ms);
    }
    return true;
}

// Asks the target to set (kCmdSet: data -> region) or read (kCmdGet: region -> data) bytes
// of its region, with its own copies.
inline bool target_request(Report &r, Shared &sh, int cmd, uint64_t off, void *data, size_t len) {
    if (len > kCmdBytes) return AP_FAIL(r, "request of ", len, " bytes");
    sh.cmd = cmd;
    sh.cmd_off = off;
    sh.cmd_len = len;
    if (cmd == kCmdSet) std::memcpy(sh.cmd_data, data, len);
    const uint64_t seq = sh.cmd_seq.load() + 1;
    sh.cmd_seq.store(seq, std::memory_order_release);
    const auto deadline = Clock::now() + kWait;
    while (sh.ack_seq.load(std::memory_order_acquire) != seq) {
        if (Clock::now() > deadline) return AP_FAIL(r, "the target did not answer a request");
        sched_yield();
    }
    if (!sh.cmd_ok) return AP_FAIL(r, "the target could not serve a request (see its report)");
    if (cmd == kCmdGet) std::memcpy(data, sh.cmd_data, len);
    return true;
}

// ---- running the roles ------------------------------------------------------------------------

struct RoleDef {
    std::string name;  // in every failure message
    std::string comm;  // process name (at most 15 characters)
    std::function<void(Report &)> body;
    Env env;  // set in the child before the body
};

struct RunResult {
    std::vector<std::string> roles;  // "name: process comm, pid"
    std::vector<std::string> failures;
    std::vector<std::string> notes;
    double seconds = 0;
};

inline int g_report_fd = -1;

inline void put_num(char *&p, unsigned long v, int base) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    while (n) *p++ = tmp[--n];
}

// A child that crashes says so, with the address (the emulator's device memory is PROT_NONE).
inline void on_fatal_signal(int sig, siginfo_t *si, void *) {
    char line[160], *p = line;
    const char head[] = "F killed by signal ";
    memcpy(p, head, sizeof head - 1);
    p += sizeof head - 1;
    put_num(p, unsigned(sig), 10);
    const char at[] = " at address 0x";
    memcpy(p, at, sizeof at - 1);
    p += sizeof at - 1;
    put_num(p, reinterpret_cast<unsigned long>(si->si_addr), 16);
    *p++ = '\n';
    if (g_report_fd >= 0 && ::write(g_report_fd, line, size_t(p - line)) < 0) {
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

// Shared-memory objects of the emulated driver left by a child that was killed.
inline void remove_device_memory_of(pid_t pid) {
    std::string prefix = cat("emucuda-", std::hex, unsigned(pid), "-");
    if (DIR *d = opendir("/dev/shm")) {
        while (dirent *e = readdir(d))
            if (strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0)
                shm_unlink(cat("/", e->d_name).c_str());
        closedir(d);
    }
}

// Runs roles[0] (the target) and the initiators roles[1..] in children; sets
// initiators_exited once all initiators have exited; kills whatever is left at `deadline`.
inline RunResult run_roles(const std::vector<RoleDef> &roles, Shared &sh,
                           std::chrono::seconds deadline) {
    RunResult res;
    const auto start = Clock::now();
    struct Child {
        pid_t pid = -1;
        int report = -1;
        std::string out;
        bool eof = false, reaped = false, killed = false;
        int status = 0;
    };
    std::vector<Child> kids(roles.size());
    fflush(stdout);
    fflush(stderr);
    for (size_t i = 0; i < roles.size(); ++i) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) != 0) {
            res.failures.push_back(cat("pipe2: ", strerror(errno)));
            break;
        }
        pid_t pid = fork();
        if (pid == 0) {
            ::close(p[0]);
            for (size_t j = 0; j < i; ++j) ::close(kids[j].report);
            g_report_fd = p[1];
            prctl(PR_SET_NAME, roles[i].comm.c_str(), 0, 0, 0);
            prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);  // never outlive the gtest process
            struct sigaction sa {};
            sa.sa_sigaction = on_fatal_signal;
            sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
            for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) sigaction(sig, &sa, nullptr);
            for (const auto &[k, v] : roles[i].env) setenv(k.c_str(), v.c_str(), 1);
            Report r(roles[i].name, p[1]);
            try {
                roles[i].body(r);
            } catch (const std::exception &e) {
                AP_FAIL(r, "exception: ", e.what());
            } catch (...) {
                AP_FAIL(r, "unknown exception");
            }
            fflush(stdout);
            fflush(stderr);
            _exit(r.failed() ? 1 : 0);
        }
        ::close(p[1]);
        if (pid < 0) {
            ::close(p[0]);
            res.failures.push_back(cat("fork: ", strerror(errno)));
            break;
        }
        kids[i].pid = pid;
        kids[i].report = p[0];
        res.roles.push_back(cat(roles[i].name, ": process ", roles[i].comm, ", pid ", pid));
    }

    const auto until = start + deadline;
    for (;;) {
        // Reports.
        std::vector<pollfd> fds;
        std::vector<size_t> who;
        for (size_t i = 0; i < kids.size(); ++i) {
            if (kids[i].pid < 0 || kids[i].eof) continue;
            fds.push_back({kids[i].report, POLLIN, 0});
            who.push_back(i);
        }
        if (!fds.empty() && ::poll(fds.data(), fds.size(), 5) > 0) {
            for (size_t k = 0; k < fds.size(); ++k) {
                if (!fds[k].revents) continue;
                char buf[4096];
                ssize_t got = ::read(fds[k].fd, buf, sizeof buf);
                if (got > 0)
                    kids[who[k]].out.append(buf, size_t(got));
                else if (got == 0 || (errno != EINTR && errno != EAGAIN))
                    kids[who[k]].eof = true;
            }
        } else if (fds.empty()) {
            std::this_thread::sleep_for(5ms);
        }
        // Exits.
        bool all_initiators = true, all = true;
        for (size_t i = 0; i < kids.size(); ++i) {
            Child &k = kids[i];
            if (k.pid > 0 && !k.reaped && waitpid(k.pid, &k.status, WNOHANG) == k.pid)
                k.reaped = true;
            if (k.pid > 0 && !k.reaped) {
                all = false;
                if (i > 0) all_initiators = false;
            }
        }
        if (all_initiators) sh.initiators_exited.store(1, std::memory_order_release);
        if (all) break;
        if (Clock::now() > until) {
            for (Child &k : kids) {
                if (k.pid > 0 && !k.reaped) {
                    kill(k.pid, SIGKILL);
                    waitpid(k.pid, &k.status, 0);
                    k.reaped = k.killed = true;
                }
            }
            break;
        }
    }
    // What is left in the pipes.
    for (Child &k : kids) {
        if (k.report < 0) continue;
        int fl = fcntl(k.report, F_GETFL);
        fcntl(k.report, F_SETFL, fl | O_NONBLOCK);
        char buf[4096];
        ssize_t got;
        while ((got = ::read(k.report, buf, sizeof buf)) > 0) k.out.append(buf, size_t(got));
        ::close(k.report);
        if (k.killed || (k.reaped && WIFSIGNALED(k.status))) remove_device_memory_of(k.pid);
    }
    res.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    for (size_t i = 0; i < kids.size(); ++i) {
        const Child &k = kids[i];
        const std::string &who = roles[i].name;
        if (k.pid < 0) continue;
        std::istringstream lines(k.out);
        std::string line;
        bool said = false;
        while (std::getline(lines, line)) {
            if (line.size() < 2) continue;
            if (line[0] == 'F') {
                res.failures.push_back(cat("[", who, "] ", line.substr(2)));
                said = true;
            } else if (line[0] == 'I') {
                res.notes.push_back(cat("[", who, "] ", line.substr(2)));
            }
        }
        if (k.killed)
            res.failures.push_back(
                cat("[", who, "] had not ended after ", deadline.count(), " s: killed"));
        else if (WIFSIGNALED(k.status) && !said)
            res.failures.push_back(cat("[", who, "] killed by signal ", WTERMSIG(k.status)));
        else if (WIFEXITED(k.status) && WEXITSTATUS(k.status) != 0 && !said)
            res.failures.push_back(cat("[", who, "] exited with ", WEXITSTATUS(k.status)));
    }
    return res;
}

// ---- the contention workloads -----------------------------------------------------------------

struct Contention {
    Lib lib;
    Memory target_mem;  // the target's counter and lock
    Memory result_mem;  // the initiators' fetch result buffers
    uint64_t caps = FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    int mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
    int initiators = 4;
    size_t ops = 10000;  // per initiator
    size_t window = 32;  // fetch-adds in flight per initiator
    // How the processes wait: in fi_cq_sread (2 ms at a time), or polling fi_cq_read (the
    // target with sched_yield). Measured with 5 processes on 2 cores (4 x 10000 fetch-adds,
    // 4 x 2000 locked increments; node-local / TCP link): all sleeping 0.6 / 1.3 s and
    // 1.5 / 2.6 s; the target polling 0.4 / 1.0 s and 1.2 / 2.2 s; everybody polling 3 / 8 s
    // and the lock starved (a holder waiting for its completion behind four spinners). Sleeping
    // is the default: it holds up best when other tests share the cores.
    bool target_sleeps = true, initiators_sleep = true;
    std::chrono::seconds deadline{30};
    // Environment of the roles, on top of the test's: every process's, the target's, and
    // initiator i's (initiator_env[i], when there).
    Env env, target_env;
    std::vector<Env> initiator_env;
};

inline constexpr uint64_t kLockOff = 0, kCounterOff = 64;

// A buffer of `len` bytes of memory `m` in an initiator, registered; at scope end its
// registration is closed, then the memory freed.
struct RoleBuf {
    const Memory &m;
    void *p = nullptr;
    fid_mr *mr = nullptr;
    Node *node = nullptr;
    RoleBuf(const Memory &mem) : m(mem) {}
    RoleBuf(const RoleBuf &) = delete;
    RoleBuf &operator=(const RoleBuf &) = delete;
    ~RoleBuf() {
        if (mr) node->unreg(mr);
        if (p) m.release(p);
    }
    bool make(Report &r, Node &n, size_t len) {
        std::string err = m.alloc(len, &p);
        if (!err.empty()) return AP_FAIL(r, "allocating ", len, " B of ", m.name, ": ", err);
        std::vector<uint8_t> fill(len, 0xA5);
        if (!(err = m.put(p, fill.data(), len)).empty()) return AP_FAIL(r, err);
        node = &n;
        mr = n.reg(p, len, m, FI_READ | FI_WRITE);
        return mr != nullptr;
    }
    void *desc() const { return fi_mr_desc(mr); }
};

// What every initiator of a workload does first: checks, an endpoint, `result_len` bytes of
// cfg.result_mem and 64 of host memory (both registered, filled with 0xA5), the target's
// address; then work(node, result buffer, host buffer, target address).
template <typename Work>
void contention_initiator(Report &r, Shared &sh, const Contention &cfg, int index,
                          size_t result_len, Work &&work) {
    AP_REQUIRE(r, cfg.lib.ok(), "libfabric could not be loaded");
    AP_REQUIRE(r, cfg.ops <= kMaxValues && index < kMaxInitiators);
    std::string err = cfg.result_mem.init();
    AP_REQUIRE(r, err.empty(), err);
    Memory host;
    Node n(cfg.lib, r);
    AP_TRY(n.open(cfg.caps, cfg.mr_mode, cfg.initiators_sleep));
    RoleBuf result(cfg.result_mem), local(host);
    AP_TRY(result.make(r, n, result_len));
    AP_TRY(local.make(r, n, 64));
    fi_addr_t peer;
    AP_TRY(connect_to_target(r, sh, n, &peer));
    work(n, result, local, peer);
}

// Fetch-add of 1 to the target's counter, `ops` times with up to `window` in flight, each into
// a slot of its own of the result buffer; the fetched values go to sh.values[index].
inline void fetch_add_initiator(Report &r, Shared &sh, const Contention &cfg, int index) {
    contention_initiator(
        r, sh, cfg, index, cfg.ops * sizeof(uint64_t),
        [&](Node &n, RoleBuf &results, RoleBuf &one, fi_addr_t peer) {
            const uint64_t v1 = 1;
            AP_TRY(one.m.put(one.p, &v1, sizeof v1).empty());
            const size_t window =
                std::max<size_t>(1, std::min<size_t>(cfg.window, n.info->tx_attr->size));
            std::vector<fi_context2> ctx(cfg.ops);
            AP_TRY(start_line(r, sh, cfg.initiators));
            size_t posted = 0, done = 0;
            auto *res = static_cast<uint64_t *>(results.p);
            const auto deadline = Clock::now() + cfg.deadline - 5s;
            while (done < cfg.ops) {
                while (posted < cfg.ops && posted - done < window) {
                    ssize_t ret =
                        fi_fetch_atomic(n.ep, one.p, 1, one.desc(), res + posted, results.desc(),
                                        peer, sh.region_addr + kCounterOff, sh.region_key,
                                        FI_UINT64, FI_SUM, &ctx[posted]);
                    if (ret == -FI_EAGAIN) break;
                    AP_REQUIRE(r, ret == 0, "fi_fetch_atomic #", posted, " -> ", n.str(ret));
                    ++posted;
                }
                n.progress(cfg.initiators_sleep && posted - done >= window ? 2 : 0);
                Comp c;
                while (n.take_any(c)) {
                    AP_REQUIRE(r, !c.err, "fetch-add: ", n.show(c));
                    AP_CHECK(r, (c.e.flags & (FI_ATOMIC | FI_READ)) == (FI_ATOMIC | FI_READ),
                             "completion flags 0x", std::hex, c.e.flags);
                    ++done;
                }
                AP_REQUIRE(r, Clock::now() < deadline, "only ", done, " of ", cfg.ops,
                           " fetch-adds completed in time");
            }
            std::vector<uint64_t> got(cfg.ops);
            std::string err = cfg.result_mem.get(got.data(), results.p, cfg.ops * sizeof(uint64_t));
            AP_REQUIRE(r, err.empty(), "reading the results: ", err);
            std::memcpy(sh.values[index], got.data(), cfg.ops * sizeof(uint64_t));
            sh.nvalues[index] = cfg.ops;
        });
}

// `ops` increments of the plain counter at kCounterOff under a spin lock at kLockOff: taken
// with FI_CSWAP 0 -> 1 (fetched into device or host memory), the counter read with a fetch
// FI_ATOMIC_READ and written back plus one with FI_ATOMIC_WRITE, the lock released with
// FI_ATOMIC_WRITE 0. Each value read under the lock goes to sh.values[index].
inline void lock_initiator(Report &r, Shared &sh, const Contention &cfg, int index) {
    contention_initiator(
        r, sh, cfg, index, 64, [&](Node &n, RoleBuf &result, RoleBuf &local, fi_addr_t peer) {
            auto *l = static_cast<uint64_t *>(local.p);  // [0] 1, [1] 0, [2] the new counter value
            l[0] = 1;
            l[1] = 0;
            auto *res =
                static_cast<uint64_t *>(result.p);  // [0] the lock's old value, [1] the counter
            AP_TRY(start_line(r, sh, cfg.initiators));
            const uint64_t lock = sh.region_addr + kLockOff, counter = sh.region_addr + kCounterOff;
            const uint64_t key = sh.region_key;
            const int sleep_ms = cfg.initiators_sleep ? 2 : 0;
            fi_context2 ctx{};
            uint64_t busy = 0;
            std::string err;
            const auto deadline = Clock::now() + cfg.deadline - 5s;
            for (size_t i = 0; i < cfg.ops; ++i) {
                for (;;) {
                    AP_TRY(n.run(
                        "fi_compare_atomic(FI_CSWAP 0 -> 1) on the lock", &ctx,
                        [&] {
                            return fi_compare_atomic(n.ep, &l[0], 1, local.desc(), &l[1],
                                                     local.desc(), &res[0], result.desc(), peer,
                                                     lock, key, FI_UINT64, FI_CSWAP, &ctx);
                        },
                        sleep_ms));
                    uint64_t old = ~0ull;
                    err = cfg.result_mem.get(&old, &res[0], sizeof old);
                    AP_REQUIRE(r, err.empty(), "reading the CSWAP's result: ", err);
                    if (old == 0) break;
                    AP_REQUIRE(r, old == 1, "the lock word is ", old,
                               " (only 0 and 1 are ever written)");
                    ++busy;
                    AP_REQUIRE(r, Clock::now() < deadline, "increment ", i,
                               ": the lock stayed taken");
                    sched_yield();
                }
                AP_TRY(n.run(
                    "fi_fetch_atomic(FI_ATOMIC_READ) of the counter", &ctx,
                    [&] {
                        return fi_fetch_atomic(n.ep, &l[0], 1, local.desc(), &res[1], result.desc(),
                                               peer, counter, key, FI_UINT64, FI_ATOMIC_READ, &ctx);
                    },
                    sleep_ms));
                uint64_t v = 0;
                err = cfg.result_mem.get(&v, &res[1], sizeof v);
                AP_REQUIRE(r, err.empty(), "reading the counter's value: ", err);
                sh.values[index][i] = v;
                l[2] = v + 1;
                AP_TRY(n.run(
                    "fi_atomic(FI_ATOMIC_WRITE) of the counter", &ctx,
                    [&] {
                        return fi_atomic(n.ep, &l[2], 1, local.desc(), peer, counter, key,
                                         FI_UINT64, FI_ATOMIC_WRITE, &ctx);
                    },
                    sleep_ms));
                AP_TRY(n.run(
                    "fi_atomic(FI_ATOMIC_WRITE 0) releasing the lock", &ctx,
                    [&] {
                        return fi_atomic(n.ep, &l[1], 1, local.desc(), peer, lock, key, FI_UINT64,
                                         FI_ATOMIC_WRITE, &ctx);
                    },
                    sleep_ms));
            }
            sh.nvalues[index] = cfg.ops;
            sh.busy[index] = busy;
        });
}

enum class Workload { FetchAdd, SpinLock };

// Runs the target and cfg.initiators initiators of a workload.
inline RunResult run_contention(const Contention &cfg, Workload w, SharedBlock &block) {
    Shared &sh = *block.get();
    TargetConfig t;
    t.lib = cfg.lib;
    t.mem = cfg.target_mem;
    t.caps = cfg.caps;
    t.mr_mode = cfg.mr_mode;
    t.region_len = 4096;
    t.sleep = cfg.target_sleeps;
    std::vector<RoleDef> roles;
    Env env = cfg.env;
    env.insert(env.end(), cfg.target_env.begin(), cfg.target_env.end());
    roles.push_back({cat("target (", cfg.target_mem.name, " memory, ", path_name(env), ")"),
                     "at-target", [t, &sh](Report &r) { target_role(r, sh, t); }, env});
    for (int i = 0; i < cfg.initiators; ++i) {
        env = cfg.env;
        if (size_t(i) < cfg.initiator_env.size())
            env.insert(env.end(), cfg.initiator_env[i].begin(), cfg.initiator_env[i].end());
        std::string name = cat("initiator ", i + 1, "/", cfg.initiators, " (results in ",
                               cfg.result_mem.name, " memory, ", path_name(env), ")");
        roles.push_back({name, cat("at-init-", i + 1),
                         [cfg, &sh, i, w](Report &r) {
                             if (w == Workload::FetchAdd)
                                 fetch_add_initiator(r, sh, cfg, i);
                             else
                                 lock_initiator(r, sh, cfg, i);
                         },
                         env});
    }
    RunResult res = run_roles(roles, sh, cfg.deadline);
    return res;
}

// What the workloads must have left: problems found (empty: all is well).
inline std::vector<std::string> check_contention(const Contention &cfg, Workload w,
                                                 const Shared &sh) {
    std::vector<std::string> bad;
    const uint64_t total = uint64_t(cfg.initiators) * cfg.ops;
    if (!sh.target_done.load()) {
        bad.push_back("the target did not read its region back");
    } else {
        uint64_t counter, lock;
        std::memcpy(&counter, sh.final_region + kCounterOff, 8);
        std::memcpy(&lock, sh.final_region + kLockOff, 8);
        if (counter != total)
            bad.push_back(cat("the counter ends at ", counter, ", expected exactly ", total));
        if (lock != 0) bad.push_back(cat("the lock ends at ", lock, ", expected 0 (released)"));
    }
    std::vector<uint64_t> all;
    for (int i = 0; i < cfg.initiators; ++i) {
        if (sh.nvalues[i] != cfg.ops) {
            bad.push_back(cat("initiator ", i + 1, " recorded ", sh.nvalues[i], " values"));
            continue;
        }
        // Each initiator's own operations are applied in the order it posted them
        // (FI_ORDER_ATOMIC_RAW/WAW), so the values it saw increase.
        for (size_t k = 1; k < cfg.ops; ++k) {
            if (sh.values[i][k] <= sh.values[i][k - 1]) {
                bad.push_back(cat("initiator ", i + 1, ": value #", k, " (", sh.values[i][k],
                                  ") not above value #", k - 1, " (", sh.values[i][k - 1], ")"));
                break;
            }
        }
        all.insert(all.end(), sh.values[i], sh.values[i] + cfg.ops);
    }
    if (all.size() == total) {
        std::sort(all.begin(), all.end());
        // Every value from 0 to total - 1 seen exactly once: no two fetch-adds (or two lock
        // holders) saw the same counter.
        for (uint64_t k = 0; k < total; ++k) {
            if (all[k] != k) {
                size_t dup = 0;
                for (size_t j = 1; j < all.size(); ++j) dup += all[j] == all[j - 1];
                bad.push_back(cat("the values seen are not 0..", total - 1, " each once: at ", k,
                                  " found ", all[k], " (", dup, " duplicates in all)"));
                break;
            }
        }
    }
    (void)w;
    return bad;
}

// Runs a workload in `block` and checks what it left: says on stdout what runs, how long it took,
// how often the lock was found taken (the spin lock), the roles' processes and notes. Returns
// the roles' failures, or else what check_contention found (empty: all is well).
inline std::vector<std::string> run_and_check_contention(const Contention &cfg, Workload w,
                                                         const char *what, SharedBlock &block) {
    printf(
        "[atomic] %s: %d initiator processes x %zu, counter%s in the target's %s memory, "
        "results in %s memory, path: %s\n",
        what, cfg.initiators, cfg.ops, w == Workload::SpinLock ? " and lock" : "",
        cfg.target_mem.name.c_str(), cfg.result_mem.name.c_str(),
        cfg.initiator_env.empty() ? path_name(cfg.env) : "mixed");
    fflush(stdout);
    RunResult r = run_contention(cfg, w, block);
    printf("[atomic] %s: %.2f s\n", what, r.seconds);
    if (w == Workload::SpinLock) {
        uint64_t busy = 0;
        for (int i = 0; i < cfg.initiators; ++i) busy += block->busy[i];
        printf("[atomic] the lock was found taken %llu times\n",
               static_cast<unsigned long long>(busy));
    }
    for (const auto &n : r.roles) printf("[atomic]   %s\n", n.c_str());
    for (const auto &n : r.notes) printf("%s\n", n.c_str());
    if (!r.failures.empty()) return r.failures;
    return check_contention(cfg, w, *block.get());
}

}  // namespace tandem_test::atomic_procs
