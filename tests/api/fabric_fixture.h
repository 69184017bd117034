// Shared fixture and helpers for the black-box API tests of the tandem provider.
//
// The tests talk to the provider only through the system libfabric (FI_PROVIDER_PATH and
// FI_PROVIDER are set by ctest). The provider name defaults to "tandem"; the environment
// variable TANDEM_TEST_PROVIDER overrides it (e.g. "tcp;ofi_rxm") so that the test logic itself
// can be cross-checked against a provider that ships with libfabric.
//
// tandem's progress is FI_PROGRESS_MANUAL unless the hints ask for FI_PROGRESS_AUTO: nothing
// moves unless somebody reads a CQ/EQ. Every wait in these tests therefore goes through
// poll_until(), which drains the CQs of all endpoints of the
// fixture in a loop and gives up after a deadline instead of hanging.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <arpa/inet.h>
#include <cstdio>
#include <fstream>
#include <dirent.h>
#include <netinet/in.h>
#include <sched.h>

#include <gtest/gtest.h>

#include "tests/common/progress_env.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace tandem_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// The API version the tests are written against (Debian bookworm ships 1.17).
inline constexpr uint32_t kApiVersion = FI_VERSION(1, 17);
// Default deadline for anything that waits on the provider.
inline constexpr Ms kTimeout = 10s;
// How long to keep polling when checking that something does NOT happen.
inline constexpr Ms kQuiet = 100ms;

inline const char *provider_name() {
    const char *p = std::getenv("TANDEM_TEST_PROVIDER");
    return (p && *p) ? p : "tandem";
}

inline std::string fi_err_str(long ret) {
    if (ret >= 0) return "ok (" + std::to_string(ret) + ")";
    return std::string(fi_strerror(static_cast<int>(-ret))) + " (" + std::to_string(ret) + ")";
}

}  // namespace tandem_test

// Checks a fi_* call that returns 0 on success; on failure prints the call and fi_strerror.
// More context can be streamed in: ASSERT_FI_OK(fi_x(...)) << "while ...";
#define TANDEM_FI_CHECK_(kind, expr, want)                         \
    switch (0)                                                     \
    case 0:                                                        \
    default:                                                       \
        if (const long fi_ret_ = static_cast<long>(expr); false) { \
        } else                                                     \
            kind##_EQ(fi_ret_, static_cast<long>(want))            \
                << #expr << " -> " << ::tandem_test::fi_err_str(fi_ret_) << " "
#define ASSERT_FI_OK(expr) TANDEM_FI_CHECK_(ASSERT, expr, 0)
#define EXPECT_FI_OK(expr) TANDEM_FI_CHECK_(EXPECT, expr, 0)
// Checks a fi_* call that returns an exact non-negative value (byte or entry count).
#define ASSERT_FI_RET(expr, want) TANDEM_FI_CHECK_(ASSERT, expr, want)
#define EXPECT_FI_RET(expr, want) TANDEM_FI_CHECK_(EXPECT, expr, want)

namespace tandem_test {

// ---------------------------------------------------------------------------------------------
// RAII wrappers

inline const char *fid_class_name(size_t fclass) {
    switch (fclass) {
        case FI_CLASS_FABRIC:
            return "fabric";
        case FI_CLASS_DOMAIN:
            return "domain";
        case FI_CLASS_EP:
            return "endpoint";
        case FI_CLASS_PEP:
            return "passive endpoint";
        case FI_CLASS_AV:
            return "AV";
        case FI_CLASS_MR:
            return "MR";
        case FI_CLASS_EQ:
            return "EQ";
        case FI_CLASS_CQ:
            return "CQ";
        case FI_CLASS_CNTR:
            return "counter";
        case FI_CLASS_WAIT:
            return "wait set";
        case FI_CLASS_POLL:
            return "poll set";
        default:
            return "fid";
    }
}

// Owns one libfabric object and closes it (reporting a failing fi_close as a test failure).
template <typename T>
class Fid {
  public:
    Fid() = default;
    explicit Fid(T *p) : p_(p) {}
    ~Fid() { reset(); }
    Fid(const Fid &) = delete;
    Fid &operator=(const Fid &) = delete;
    Fid(Fid &&o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
    Fid &operator=(Fid &&o) noexcept {
        if (this != &o) {
            reset();
            p_ = std::exchange(o.p_, nullptr);
        }
        return *this;
    }
    void reset() {
        if (p_) {
            const size_t fclass = p_->fid.fclass;
            int ret = fi_close(&p_->fid);
            if (ret)
                ADD_FAILURE() << "fi_close(" << fid_class_name(fclass)
                              << ") failed: " << fi_err_str(ret);
            p_ = nullptr;
        }
    }
    // Closes without reporting (for tests that check fi_close themselves).
    T *release() { return std::exchange(p_, nullptr); }
    T **out() {
        reset();
        return &p_;
    }
    T *get() const { return p_; }
    T *operator->() const { return p_; }
    operator T *() const { return p_; }
    explicit operator bool() const { return p_ != nullptr; }
    fid_t fid() const { return p_ ? &p_->fid : nullptr; }

  private:
    T *p_ = nullptr;
};

struct InfoDeleter {
    void operator()(fi_info *i) const {
        if (i) fi_freeinfo(i);
    }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// Hints as applications write them: the memory-registration modes MPI and fabtests offer
// (a NIC's keys are its own and address memory by virtual address).
inline InfoPtr alloc_hints() {
    InfoPtr h(fi_allocinfo());
    if (h)
        h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    return h;
}

// The api_verbs variant names the emulated RDMA device's library (FI_TANDEM_VERBS_LIB); on a
// host with a real device whose port is up (a NIC, rdma_rxe, siw) the suites run on that
// instead: before libfabric is first called, the emulator's names are dropped, so that tandem
// loads the system's libibverbs and librdmacm.
inline bool real_rdma_device_present() {
    DIR *dir = opendir("/sys/class/infiniband");
    if (!dir) return false;
    bool found = false;
    while (dirent *e = readdir(dir)) {
        if (e->d_name[0] == '.') continue;
        std::ifstream state(std::string("/sys/class/infiniband/") + e->d_name + "/ports/1/state");
        std::string line;
        if (std::getline(state, line) && line.find("ACTIVE") != std::string::npos) found = true;
    }
    closedir(dir);
    return found;
}
inline const bool kVerbsOnRealDevice = [] {
    const char *link = std::getenv("FI_TANDEM_LINK");
    if (!link || std::strcmp(link, "verbs") != 0 || !real_rdma_device_present()) return false;
    unsetenv("FI_TANDEM_VERBS_LIB");
    unsetenv("FI_TANDEM_RDMACM_LIB");
    return true;
}();

// Which device the verbs link runs on, said once per test program.
inline void say_verbs_device(const fi_info *info) {
    static bool said = false;
    const char *link = std::getenv("FI_TANDEM_LINK");
    if (said || !link || std::strcmp(link, "verbs") != 0 || !info || !info->domain_attr) return;
    said = true;
    const char *lib = std::getenv("FI_TANDEM_VERBS_LIB");
    bool emulated = lib && std::strstr(lib, "emurdma");
    std::printf("[ verbs link on %s%s ]\n", info->domain_attr->name, emulated ? " (EMULATED)" : "");
}

// The api_verbs variant (FI_TANDEM_LINK=verbs): a device domain offers no FI_RMA_EVENT.
// The api_verbs variant (FI_TANDEM_LINK=verbs: RDMA device domains only).
inline bool on_verbs_link() {
    const char *link = std::getenv("FI_TANDEM_LINK");
    return link && std::strcmp(link, "verbs") == 0;
}

// True for entries of the provider under test itself. The core layers ofi_rxm over every
// provider that offers FI_EP_MSG, so the same hints also return "<prov>;ofi_rxm" entries
// (listed first for FI_EP_RDM); those exercise the core's rxm, not this provider.
inline bool is_own(const fi_info *i) {
    return i && i->fabric_attr && i->fabric_attr->prov_name &&
           std::strcmp(i->fabric_attr->prov_name, provider_name()) == 0;
}

// fi_getinfo restricted to the provider under test: *out gets a copy of the first entry of
// our own (see is_own); -FI_ENODATA when there is none.
inline int getinfo_own(const char *node, const char *service, uint64_t flags, const fi_info *hints,
                       InfoPtr *out) {
    fi_info *list = nullptr;
    out->reset();
    int ret = fi_getinfo(kApiVersion, node, service, flags, hints, &list);
    if (ret) return ret;
    for (fi_info *i = list; i; i = i->next) {
        if (is_own(i)) {
            out->reset(fi_dupinfo(i));
            break;
        }
    }
    fi_freeinfo(list);
    return *out ? 0 : -FI_ENODATA;
}

inline size_t count_infos(const fi_info *i) {
    size_t n = 0;
    for (; i; i = i->next) ++n;
    return n;
}

// ---------------------------------------------------------------------------------------------
// Data patterns

inline uint8_t pattern_byte(size_t i, uint32_t seed) {
    uint64_t x = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull + seed * 0x632BE5ABull;
    x ^= x >> 29;
    return static_cast<uint8_t>(x ^ (x >> 11) ^ (i >> 8));
}
inline void fill_pattern(void *buf, size_t len, uint32_t seed, size_t first = 0) {
    auto *p = static_cast<uint8_t *>(buf);
    for (size_t i = 0; i < len; ++i) p[i] = pattern_byte(first + i, seed);
}
// Returns the index of the first byte that differs from the pattern, or -1.
inline long check_pattern(const void *buf, size_t len, uint32_t seed, size_t first = 0) {
    auto *p = static_cast<const uint8_t *>(buf);
    for (size_t i = 0; i < len; ++i)
        if (p[i] != pattern_byte(first + i, seed)) return static_cast<long>(i);
    return -1;
}
inline long check_fill(const void *buf, size_t len, uint8_t v) {
    auto *p = static_cast<const uint8_t *>(buf);
    for (size_t i = 0; i < len; ++i)
        if (p[i] != v) return static_cast<long>(i);
    return -1;
}

// Page-aligned heap buffer.
class AlignedBuf {
  public:
    explicit AlignedBuf(size_t len, uint8_t fill = 0) : len_(len) {
        size_t alloc = (len + 4095) / 4096 * 4096;
        if (alloc == 0) alloc = 4096;
        ptr_ = static_cast<uint8_t *>(std::aligned_alloc(4096, alloc));
        if (ptr_) std::memset(ptr_, fill, alloc);
    }
    ~AlignedBuf() { std::free(ptr_); }
    AlignedBuf(const AlignedBuf &) = delete;
    AlignedBuf &operator=(const AlignedBuf &) = delete;
    uint8_t *data() const { return ptr_; }
    size_t size() const { return len_; }

  private:
    uint8_t *ptr_ = nullptr;
    size_t len_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Completion collection

struct Completion {
    void *op_context = nullptr;
    uint64_t flags = 0;
    size_t len = 0;
    void *buf = nullptr;
    uint64_t data = 0;
    uint64_t tag = 0;
    fi_addr_t src = FI_ADDR_NOTAVAIL;
};

struct CqError {
    fi_cq_err_entry e{};
    std::vector<uint8_t> err_data;
    std::string str;
};

inline std::string describe(const CqError &err) {
    return std::string("err=") + std::to_string(err.e.err) + " (" + fi_strerror(err.e.err) +
           ") prov_errno=" + std::to_string(err.e.prov_errno) +
           " len=" + std::to_string(err.e.len) + " olen=" + std::to_string(err.e.olen) + " [" +
           err.str + "]";
}

// Drains one CQ into vectors of successful and error completions.
class CqLog {
  public:
    fid_cq *cq = nullptr;
    fi_cq_format format = FI_CQ_FORMAT_TAGGED;
    bool use_readfrom = true;
    std::vector<Completion> comps;
    std::vector<CqError> errs;

    // Reads everything currently available; returns the number of new entries.
    size_t drain() {
        size_t got = 0;
        if (!cq) return 0;
        for (int guard = 0; guard < 100000; ++guard) {
            constexpr size_t kBatch = 16;
            alignas(16) uint8_t raw[kBatch * sizeof(fi_cq_tagged_entry)];
            fi_addr_t src[kBatch];
            for (auto &s : src) s = FI_ADDR_NOTAVAIL;
            ssize_t n =
                use_readfrom ? fi_cq_readfrom(cq, raw, kBatch, src) : fi_cq_read(cq, raw, kBatch);
            if (n == -FI_EAGAIN) break;
            if (n == -FI_EAVAIL) {
                CqError err;
                ssize_t r = fi_cq_readerr(cq, &err.e, 0);
                if (r == -FI_EAGAIN) continue;
                if (r != 1) {
                    ADD_FAILURE() << "fi_cq_readerr after -FI_EAVAIL returned " << fi_err_str(r);
                    break;
                }
                if (err.e.err_data && err.e.err_data_size) {
                    auto *d = static_cast<const uint8_t *>(err.e.err_data);
                    err.err_data.assign(d, d + err.e.err_data_size);
                }
                char sbuf[256] = {};
                const char *s =
                    fi_cq_strerror(cq, err.e.prov_errno, err.e.err_data, sbuf, sizeof(sbuf));
                err.str = s ? s : "";
                err.e.err_data = nullptr;
                errs.push_back(std::move(err));
                ++got;
                continue;
            }
            if (n < 0) {
                ADD_FAILURE() << "fi_cq_read returned " << fi_err_str(n);
                break;
            }
            for (ssize_t i = 0; i < n; ++i) {
                comps.push_back(decode(raw, static_cast<size_t>(i), src[i]));
                ++got;
            }
        }
        return got;
    }

    Completion decode(const uint8_t *raw, size_t i, fi_addr_t src) const {
        Completion c;
        c.src = src;
        switch (format) {
            case FI_CQ_FORMAT_CONTEXT: {
                auto *e = reinterpret_cast<const fi_cq_entry *>(raw) + i;
                c.op_context = e->op_context;
                break;
            }
            case FI_CQ_FORMAT_MSG: {
                auto *e = reinterpret_cast<const fi_cq_msg_entry *>(raw) + i;
                c.op_context = e->op_context;
                c.flags = e->flags;
                c.len = e->len;
                break;
            }
            case FI_CQ_FORMAT_DATA: {
                auto *e = reinterpret_cast<const fi_cq_data_entry *>(raw) + i;
                c.op_context = e->op_context;
                c.flags = e->flags;
                c.len = e->len;
                c.buf = e->buf;
                c.data = e->data;
                break;
            }
            default: {
                auto *e = reinterpret_cast<const fi_cq_tagged_entry *>(raw) + i;
                c.op_context = e->op_context;
                c.flags = e->flags;
                c.len = e->len;
                c.buf = e->buf;
                c.data = e->data;
                c.tag = e->tag;
                break;
            }
        }
        return c;
    }

    std::optional<Completion> find(const void *ctx) const {
        for (auto &c : comps)
            if (c.op_context == ctx) return c;
        return std::nullopt;
    }
    std::optional<CqError> find_err(const void *ctx) const {
        for (auto &e : errs)
            if (e.e.op_context == ctx) return e;
        return std::nullopt;
    }
    size_t count(const void *ctx) const {
        size_t n = 0;
        for (auto &c : comps) n += (c.op_context == ctx);
        return n;
    }
    size_t count_flags(uint64_t flags) const {
        size_t n = 0;
        for (auto &c : comps) n += ((c.flags & flags) == flags);
        return n;
    }
    bool has(const void *ctx) const { return find(ctx).has_value(); }
    bool has_err(const void *ctx) const { return find_err(ctx).has_value(); }
    void clear() {
        comps.clear();
        errs.clear();
    }
    std::string summary() const {
        std::string s = std::to_string(comps.size()) + " completions, " +
                        std::to_string(errs.size()) + " errors";
        for (auto &e : errs) s += "; " + describe(e);
        return s;
    }
};

// Generic bounded wait: calls step() until it returns true or the deadline passes.
inline bool poll_until(const std::function<bool()> &step, Ms timeout = kTimeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
        if (step()) return true;
        if (Clock::now() >= deadline) return false;
        sched_yield();
    }
}

// ---------------------------------------------------------------------------------------------
// Memory registration

// A buffer that is registered with the domain when needed (always, or only when the domain
// requires FI_MR_LOCAL). rma_base is the address a peer uses for offset 0 of the buffer.
struct DataBuf {
    explicit DataBuf(size_t len, uint8_t fill = 0) : mem(len, fill) {}
    AlignedBuf mem;
    Fid<fid_mr> mr;
    void *desc = nullptr;
    uint64_t key = FI_KEY_NOTAVAIL;
    uint64_t rma_base = 0;
    uint8_t *data() const { return mem.data(); }
    size_t size() const { return mem.size(); }
};

inline constexpr uint64_t kAllAccess =
    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;

// ---------------------------------------------------------------------------------------------
// The fixture

inline fi_threading default_threading() {
    const char *t = std::getenv("TANDEM_TEST_THREADING");
    return t && !strcmp(t, "domain") ? FI_THREAD_DOMAIN : FI_THREAD_SAFE;
}

struct FabricOptions {
    fi_ep_type ep_type = FI_EP_RDM;
    uint64_t caps = FI_MSG | FI_TAGGED | FI_RMA | FI_SOURCE | FI_DIRECTED_RECV | FI_MULTI_RECV |
                    FI_LOCAL_COMM | FI_REMOTE_COMM;
    uint64_t mode = FI_CONTEXT | FI_CONTEXT2;
    int mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    // TANDEM_TEST_THREADING=domain: FI_THREAD_DOMAIN, under which tandem takes no locks (the
    // api_domain.* variant of the single-threaded suites).
    fi_threading threading = default_threading();
    fi_progress progress = test_progress();  // asked for control and data alike
    fi_cq_format cq_format = FI_CQ_FORMAT_TAGGED;
    fi_wait_obj cq_wait = FI_WAIT_NONE;
    size_t cq_size = 4096;
    fid_wait *cq_wait_set = nullptr;  // used when cq_wait == FI_WAIT_SET
    fi_av_type av_type = FI_AV_TABLE;
    uint64_t cq_bind_flags = FI_TRANSMIT | FI_RECV;
    uint64_t tx_op_flags = 0;         // OR-ed into info->tx_attr->op_flags when non-zero
    size_t tx_size = 0, rx_size = 0;  // queue depths to ask for (0: the provider's)
    int num_eps = 2;
};

// fi_getinfo hints for the given options.
inline InfoPtr hints_for(const FabricOptions &o) {
    InfoPtr h = alloc_hints();
    h->caps = o.caps;
    h->mode = o.mode;
    h->addr_format = FI_SOCKADDR_IN;
    h->ep_attr->type = o.ep_type;
    h->domain_attr->mr_mode = o.mr_mode;
    h->domain_attr->threading = o.threading;
    h->domain_attr->control_progress = o.progress;
    h->domain_attr->data_progress = o.progress;
    h->fabric_attr->prov_name = strdup(provider_name());
    h->tx_attr->size = o.tx_size;
    h->rx_attr->size = o.rx_size;
    return h;
}

struct Endpoint {
    Fid<fid_cq> cq;
    Fid<fid_av> av;
    // Optional counters, opened and bound by fixtures that need them (before_enable).
    Fid<fid_cntr> send_cntr, recv_cntr, read_cntr, write_cntr, rread_cntr, rwrite_cntr;
    Fid<fid_ep> ep;  // declared last: closed first
    CqLog log;
    std::vector<uint8_t> name;
    std::vector<fi_addr_t> peer;  // peer[j]: fi_addr of endpoint j in this endpoint's AV
};

class FabricTest : public ::testing::Test {
  protected:
    FabricOptions opts;
    InfoPtr info;
    Fid<fid_fabric> fabric;
    Fid<fid_domain> domain;
    std::vector<std::unique_ptr<Endpoint>> eps;
    std::array<fi_context2, 512> ctxs_{};
    uint64_t next_key_ = 0x1000;

    // Hooks for derived fixtures.
    virtual void configure(FabricOptions &) {}
    // Called after fabric and domain are open, before any endpoint.
    virtual void after_fabric() {}
    // Called after CQ/AV are bound and before fi_enable.
    virtual void before_enable(Endpoint &, size_t /*index*/) {}

    void SetUp() override {
        configure(opts);
        ASSERT_NO_FATAL_FAILURE(open_fabric());
        if (IsSkipped()) return;
        ASSERT_NO_FATAL_FAILURE(after_fabric());
        for (int i = 0; i < opts.num_eps; ++i) ASSERT_NO_FATAL_FAILURE(add_endpoint());
        ASSERT_NO_FATAL_FAILURE(insert_all_names());
    }

    void TearDown() override {
        eps.clear();
        domain.reset();
        fabric.reset();
        info.reset();
    }

    InfoPtr make_hints() const { return hints_for(opts); }

    void open_fabric() {
        InfoPtr hints = make_hints();
        int ret = getinfo_own("127.0.0.1", nullptr, FI_SOURCE, hints.get(), &info);
        ASSERT_EQ(ret, 0) << "fi_getinfo(" << provider_name()
                          << ", 127.0.0.1, FI_SOURCE): " << fi_err_str(ret);
        ASSERT_NE(info, nullptr);
        say_verbs_device(info.get());
        if (opts.progress == FI_PROGRESS_AUTO) {
            ASSERT_EQ(info->domain_attr->data_progress, FI_PROGRESS_AUTO);
            ASSERT_EQ(info->domain_attr->control_progress, FI_PROGRESS_AUTO);
        }
        if (opts.tx_op_flags) info->tx_attr->op_flags |= opts.tx_op_flags;
        ASSERT_FI_OK(fi_fabric(info->fabric_attr, fabric.out(), nullptr));
        ASSERT_FI_OK(fi_domain(fabric, info.get(), domain.out(), nullptr));
    }

    int mr_mode() const { return info ? info->domain_attr->mr_mode : 0; }
    bool mr_local() const { return mr_mode() & FI_MR_LOCAL; }
    bool prov_key() const { return mr_mode() & FI_MR_PROV_KEY; }
    bool virt_addr() const { return mr_mode() & FI_MR_VIRT_ADDR; }

    void open_cq(Fid<fid_cq> &cq, fi_cq_format fmt, fi_wait_obj wait, void *context = nullptr) {
        fi_cq_attr attr{};
        attr.size = opts.cq_size;
        attr.format = fmt;
        attr.wait_obj = wait;
        if (wait == FI_WAIT_SET) attr.wait_set = opts.cq_wait_set;
        ASSERT_FI_OK(fi_cq_open(domain, &attr, cq.out(), context));
    }

    void open_cntr(Fid<fid_cntr> &cntr, fi_wait_obj wait = FI_WAIT_NONE) {
        fi_cntr_attr attr{};
        attr.events = FI_CNTR_EVENTS_COMP;
        attr.wait_obj = wait;
        ASSERT_FI_OK(fi_cntr_open(domain, &attr, cntr.out(), nullptr));
    }

    void open_av(Fid<fid_av> &av, fi_av_type type = FI_AV_TABLE) {
        fi_av_attr attr{};
        attr.type = type;
        attr.count = 64;
        ASSERT_FI_OK(fi_av_open(domain, &attr, av.out(), nullptr));
    }

    static std::vector<uint8_t> get_name(fid_t fid) {
        std::vector<uint8_t> name(256);
        size_t len = name.size();
        int ret = fi_getname(fid, name.data(), &len);
        EXPECT_EQ(ret, 0) << "fi_getname: " << fi_err_str(ret);
        name.resize(ret == 0 ? len : 0);
        return name;
    }

    void add_endpoint() {
        auto e = std::make_unique<Endpoint>();
        // The CQ's context is its Endpoint (fi_poll reports it).
        ASSERT_NO_FATAL_FAILURE(open_cq(e->cq, opts.cq_format, opts.cq_wait, e.get()));
        ASSERT_NO_FATAL_FAILURE(open_av(e->av, opts.av_type));
        ASSERT_FI_OK(fi_endpoint(domain, info.get(), e->ep.out(), nullptr));
        ASSERT_FI_OK(fi_ep_bind(e->ep, &e->av->fid, 0));
        ASSERT_FI_OK(fi_ep_bind(e->ep, &e->cq->fid, opts.cq_bind_flags));
        e->log.cq = e->cq;
        e->log.format = opts.cq_format;
        e->log.use_readfrom = (info->caps & FI_SOURCE) != 0;
        ASSERT_NO_FATAL_FAILURE(before_enable(*e, eps.size()));
        ASSERT_FI_OK(fi_enable(e->ep));
        e->name = get_name(&e->ep->fid);
        ASSERT_FALSE(e->name.empty());
        eps.push_back(std::move(e));
    }

    void insert_all_names() {
        for (auto &e : eps) {
            e->peer.clear();
            for (auto &other : eps) {
                fi_addr_t addr = FI_ADDR_NOTAVAIL;
                ASSERT_FI_RET(fi_av_insert(e->av, other->name.data(), 1, &addr, 0, nullptr), 1);
                ASSERT_NE(addr, FI_ADDR_NOTAVAIL);
                e->peer.push_back(addr);
            }
        }
    }

    Endpoint &a() { return *eps.at(0); }
    Endpoint &b() { return *eps.at(1); }
    void *ctx(size_t i) { return &ctxs_.at(i); }

    // Drives progress on every endpoint of the fixture.
    void progress() {
        for (auto &e : eps) e->log.drain();
    }

    bool poll_until(const std::function<bool()> &pred, Ms timeout = kTimeout) {
        return ::tandem_test::poll_until(
            [&] {
                progress();
                return pred();
            },
            timeout);
    }

    // An RMA write completed at the initiator (transmit-complete semantics) need not be visible
    // at the target yet: keep driving progress until the pattern shows up or the deadline passes.
    // Returns the index of the first differing byte, or -1.
    long eventually_pattern(const void *p, size_t len, uint32_t seed, size_t first = 0) {
        long r = -1;
        poll_until([&] {
            r = check_pattern(p, len, seed, first);
            return r == -1;
        });
        return r;
    }

    // Keeps polling for `d` (to let unwanted completions show up).
    void poll_for(Ms d) {
        poll_until([] { return false; }, d);
    }

    // Retries a posting call while it returns -FI_EAGAIN, driving progress in between.
    ssize_t post(const std::function<ssize_t()> &op, Ms timeout = kTimeout) {
        ssize_t ret = -FI_EAGAIN;
        ::tandem_test::poll_until(
            [&] {
                ret = op();
                if (ret != -FI_EAGAIN) return true;
                progress();
                return false;
            },
            timeout);
        return ret;
    }

    // One message of `len` bytes a -> b, checked. Each seed its own contexts (ctx(100..299)):
    // a completion of an earlier exchange must not stand for this one's (over a NIC the send
    // can complete before the receiver has progressed at all).
    void exchange_checked(uint32_t seed, size_t len = 128) {
        auto s = buf(len), r = buf(len);
        fill_pattern(s->data(), len, seed);
        void *rctx = ctx(100 + 2 * (seed % 100)), *sctx = ctx(101 + 2 * (seed % 100));
        ASSERT_FI_OK(
            post([&] { return fi_recv(b().ep, r->data(), len, r->desc, FI_ADDR_UNSPEC, rctx); }));
        ASSERT_FI_OK(
            post([&] { return fi_send(a().ep, s->data(), len, s->desc, a().peer[1], sctx); }));
        ASSERT_TRUE(wait_comp(b(), rctx)) << b().log.summary();
        ASSERT_TRUE(wait_comp(a(), sctx)) << a().log.summary();
        EXPECT_EQ(check_pattern(r->data(), len, seed), -1);
    }

    std::optional<Completion> wait_comp(Endpoint &e, const void *c, Ms timeout = kTimeout) {
        poll_until([&] { return e.log.has(c) || e.log.has_err(c); }, timeout);
        return e.log.find(c);
    }
    std::optional<CqError> wait_err(Endpoint &e, const void *c, Ms timeout = kTimeout) {
        poll_until([&] { return e.log.has(c) || e.log.has_err(c); }, timeout);
        return e.log.find_err(c);
    }

    // Registers `buf` with the domain (requested key when the provider takes user keys).
    int reg(DataBuf &buf, uint64_t access = kAllAccess) {
        uint64_t want = next_key_++;
        int ret =
            fi_mr_reg(domain, buf.data(), buf.size(), access, 0, want, 0, buf.mr.out(), nullptr);
        if (ret) return ret;
        buf.desc = fi_mr_desc(buf.mr);
        buf.key = fi_mr_key(buf.mr);
        buf.rma_base = virt_addr() ? reinterpret_cast<uintptr_t>(buf.data()) : 0;
        return 0;
    }

    // A data buffer, registered when the domain needs local registration (or `always_reg`).
    std::unique_ptr<DataBuf> buf(size_t len, uint8_t fill = 0, bool always_reg = false,
                                 uint64_t access = kAllAccess) {
        auto b = std::make_unique<DataBuf>(len, fill);
        if (!b->data()) {
            ADD_FAILURE() << "out of memory for " << len << " bytes";
            return b;
        }
        if (always_reg || mr_local()) {
            int ret = reg(*b, access);
            if (ret) ADD_FAILURE() << "fi_mr_reg(" << len << " bytes): " << fi_err_str(ret);
        }
        return b;
    }

    // Address of byte `off` of a registered buffer, as a peer names it in RMA calls.
    static uint64_t rma_addr(const DataBuf &b, size_t off = 0) { return b.rma_base + off; }
};

}  // namespace tandem_test
