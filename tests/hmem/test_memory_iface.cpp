// Contract suite of the memory interfaces (hmem/): one suite, every interface present.
// FI_HMEM_SYSTEM always runs; FI_HMEM_CUDA runs against whatever libcuda.so.1 the process
// finds: the emulated driver of the tests (hmem.iface.emu), or a real GPU's driver
// (hmem.iface.gpu, SKIPPED with the reason where there is none). Device memory is only ever
// touched through the driver's copies: the emulated driver maps it PROT_NONE, so a CPU access
// by hmem/ would crash the test.
#include "hmem/cuda_abi.h"
#include "hmem/hmem.h"
#include "hmem/ipc_cache.h"
#include "hmem/p2p_policy.h"
#include "tests/emucuda/emucuda_control.h"

#include <dlfcn.h>
#include <rdma/fi_errno.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using tandem::hmem::AddrInfo;
using tandem::hmem::IpcExport;
using tandem::hmem::IpcExportCache;
using tandem::hmem::IpcImportCache;
using tandem::hmem::MemRef;
using tandem::hmem::P2pDecision;
using tandem::hmem::P2pPolicy;
using tandem::hmem::Registry;

const char *g_self = nullptr;  // argv[0]: the IPC test runs its other side as a new process

// The driver as the test uses it: its own handle on the same libcuda.so.1 the interface
// loaded, to allocate and to check memory independently of the code under test.
struct Driver : tandem::hmem::CudaDriverCalls {
    bool ok = false;
    void *lib = nullptr;

    static Driver &get() {
        static Driver d;
        return d;
    }
    Driver() {
        lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (!lib || !resolve(lib)) return;
        CUdevice dev;
        CUcontext ctx;
        int count = 0;
        ok = init(0) == CUDA_SUCCESS && device_get_count(&count) == CUDA_SUCCESS && count > 0 &&
             device_get(&dev, 0) == CUDA_SUCCESS && primary_ctx_retain(&ctx, dev) == CUDA_SUCCESS &&
             ctx_set_current(ctx) == CUDA_SUCCESS;
    }
    template <typename Fn>
    Fn *control(const char *name) const {
        return lib ? reinterpret_cast<Fn *>(dlsym(lib, name)) : nullptr;
    }
    // The emulated driver's live IPC mappings (-1 on a real driver).
    long long live_mappings() const {
        auto *stats = control<decltype(emucuda_get_stats)>("emucuda_get_stats");
        if (!stats) return -1;
        emucuda_stats s{};
        stats(&s);
        return static_cast<long long>(s.live_ipc_mappings);
    }
};

std::vector<uint8_t> pattern(size_t len, uint8_t seed) {
    std::vector<uint8_t> v(len);
    for (size_t i = 0; i < len; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
    return v;
}

// A buffer of one interface; filled and read back by the test's own means (the driver).
class Buffer {
  public:
    Buffer(fi_hmem_iface iface, size_t len) : iface_(iface), len_(len) {
        if (iface == FI_HMEM_SYSTEM) {
            host_.resize(len);
            ptr_ = host_.data();
        } else {
            CUdeviceptr p = 0;
            if (Driver::get().mem_alloc(&p, len) == CUDA_SUCCESS)
                ptr_ = reinterpret_cast<void *>(p);
        }
    }
    ~Buffer() {
        if (iface_ == FI_HMEM_CUDA && ptr_) Driver::get().mem_free(dptr());
    }
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;
    void *get() const { return ptr_; }
    uint8_t *at(size_t off) const { return static_cast<uint8_t *>(ptr_) + off; }
    MemRef mem() const { return iface_ == FI_HMEM_CUDA ? MemRef{FI_HMEM_CUDA, 0} : MemRef{}; }
    void write(const std::vector<uint8_t> &v, size_t off = 0) {
        if (iface_ == FI_HMEM_SYSTEM)
            memcpy(at(off), v.data(), v.size());
        else
            ASSERT_EQ(Driver::get().memcpy_htod(dptr() + off, v.data(), v.size()), CUDA_SUCCESS);
    }
    std::vector<uint8_t> read(size_t off, size_t len) const {
        std::vector<uint8_t> v(len);
        if (iface_ == FI_HMEM_SYSTEM)
            memcpy(v.data(), at(off), len);
        else
            EXPECT_EQ(Driver::get().memcpy_dtoh(v.data(), dptr() + off, len), CUDA_SUCCESS);
        return v;
    }

  private:
    CUdeviceptr dptr() const { return reinterpret_cast<CUdeviceptr>(ptr_); }
    fi_hmem_iface iface_;
    size_t len_;
    std::vector<uint8_t> host_;
    void *ptr_ = nullptr;
};

class MemoryIface : public ::testing::TestWithParam<fi_hmem_iface> {
  protected:
    void SetUp() override {
        if (!Registry::instance().available(GetParam()))
            GTEST_SKIP() << "no " << (GetParam() == FI_HMEM_CUDA ? "CUDA" : "such")
                         << " memory here: " << Registry::instance().missing_reason(GetParam());
        ASSERT_TRUE(GetParam() == FI_HMEM_SYSTEM || Driver::get().ok);
        ops_ = Registry::instance().ops(GetParam());
        ASSERT_NE(ops_, nullptr);
    }
    bool device() const { return GetParam() != FI_HMEM_SYSTEM; }
    const tandem::hmem::IfaceOps *ops_ = nullptr;
};

TEST_P(MemoryIface, QueryKnowsItsOwnMemoryOnly) {
    Buffer buf(GetParam(), 4096);
    ASSERT_NE(buf.get(), nullptr);
    std::vector<uint8_t> host(64);
    AddrInfo info;
    EXPECT_EQ(ops_->query(host.data(), &info), 0) << "host memory is no interface's";
    if (!device()) {
        EXPECT_EQ(ops_->query(buf.get(), &info), 0);
        EXPECT_EQ(tandem::hmem::detect(buf.get()), tandem::hmem::kHost);
        return;
    }
    ASSERT_EQ(ops_->query(buf.at(100), &info), 1);
    EXPECT_EQ(info.mem, buf.mem());
    EXPECT_EQ(info.base, reinterpret_cast<uintptr_t>(buf.get()));
    EXPECT_GE(info.length, 4096u);
    EXPECT_NE(info.buffer_id, 0u);
    EXPECT_EQ(tandem::hmem::detect(buf.at(5)), buf.mem());
    EXPECT_EQ(tandem::hmem::detect(host.data()), tandem::hmem::kHost);
}

TEST_P(MemoryIface, CopiesToFromAndWithinTheInterface) {
    const size_t len = 256 * 1024 + 13;
    Buffer a(GetParam(), len), b(GetParam(), len);
    auto p = pattern(len, 3);
    std::vector<uint8_t> out(len);
    uint64_t before = tandem::hmem::counters().device_copies.load();
    ASSERT_EQ(tandem::hmem::copy(a.mem(), a.get(), tandem::hmem::kHost, p.data(), len), 0);
    ASSERT_EQ(tandem::hmem::copy(b.mem(), b.get(), a.mem(), a.get(), len), 0);
    ASSERT_EQ(tandem::hmem::copy(tandem::hmem::kHost, out.data(), b.mem(), b.get(), len), 0);
    EXPECT_EQ(out, p);
    EXPECT_EQ(b.read(0, len), p);  // independently of hmem/
    uint64_t copies = tandem::hmem::counters().device_copies.load() - before;
    EXPECT_EQ(copies, device() ? 3u : 0u) << "device memory moves by the device's copies only";
}

TEST_P(MemoryIface, GatherAndScatterWalkMixedLists) {
    Buffer dev(GetParam(), 300);
    std::vector<uint8_t> h1(100), h2(50);
    iovec iov[3] = {{h1.data(), h1.size()}, {dev.get(), 200}, {h2.data(), h2.size()}};
    MemRef mem[3] = {tandem::hmem::kHost, dev.mem(), tandem::hmem::kHost};
    auto p = pattern(350, 9);
    ASSERT_EQ(tandem::hmem::scatter(iov, mem, 3, 0, p.data(), p.size()), 350);
    EXPECT_EQ(std::vector<uint8_t>(h1.begin(), h1.end()),
              std::vector<uint8_t>(p.begin(), p.begin() + 100));
    EXPECT_EQ(dev.read(0, 200), std::vector<uint8_t>(p.begin() + 100, p.begin() + 300));
    std::vector<uint8_t> out(300);
    ASSERT_EQ(tandem::hmem::gather(out.data(), iov, mem, 3, 30, 300), 300);
    EXPECT_EQ(out, std::vector<uint8_t>(p.begin() + 30, p.begin() + 330));
    // A list shorter than asked gives what it has.
    EXPECT_EQ(tandem::hmem::gather(out.data(), iov, mem, 3, 340, 100), 10);
}

TEST_P(MemoryIface, CheckRangeRejectsWhatTheRegistrationDoesNotHold) {
    Buffer buf(GetParam(), 8192);
    EXPECT_EQ(tandem::hmem::check_range(buf.mem(), buf.get(), 8192), 0);
    if (!device()) return;
    std::vector<uint8_t> host(64);
    EXPECT_EQ(tandem::hmem::check_range(buf.mem(), host.data(), host.size()), -FI_EINVAL)
        << "host memory claimed as device memory";
    EXPECT_EQ(tandem::hmem::check_range({GetParam(), 7}, buf.get(), 8192), -FI_EINVAL)
        << "a device that does not exist";
    EXPECT_EQ(tandem::hmem::check_range(buf.mem(), buf.at(4096), 8192), -FI_EINVAL)
        << "past the end of the allocation";
}

TEST_P(MemoryIface, IpcHandlesOnlyForDeviceMemory) {
    Buffer buf(GetParam(), 4096);
    tandem::hmem::IpcHandle h;
    if (!device()) {
        EXPECT_EQ(ops_->ipc_get(buf.get(), &h), -FI_EOPNOTSUPP);
        return;
    }
    std::vector<uint8_t> host(64);
    EXPECT_NE(ops_->ipc_get(host.data(), &h), 0) << "no IPC handle for host memory";
    EXPECT_EQ(ops_->ipc_get(buf.get(), &h), 0);
}

TEST_P(MemoryIface, DmabufHandleForANic) {
    Buffer buf(GetParam(), 10000);
    int fd = -1;
    uint64_t offset = 0;
    if (!device()) {
        EXPECT_EQ(ops_->dmabuf(buf.get(), 100, &fd, &offset), -FI_EOPNOTSUPP);
        return;
    }
    ASSERT_EQ(ops_->dmabuf(buf.at(100), 200, &fd, &offset), 0);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(offset, 100u) << "the fd covers the allocation from its base";
    close(fd);
    EXPECT_EQ(ops_->dmabuf(buf.at(9900), 200, &fd, &offset), -FI_EINVAL) << "past the end";
}

TEST_P(MemoryIface, ExportCacheRenewsTheHandleOfReallocatedMemory) {
    if (!device()) GTEST_SKIP() << "host memory has no IPC handles";
    IpcExportCache cache;
    auto &exports = tandem::hmem::counters().ipc_exports;
    IpcExport first, again, fresh;
    uint64_t before = exports.load();
    uint64_t first_id;
    {
        Buffer buf(GetParam(), 65536);
        ASSERT_EQ(cache.get(buf.mem(), buf.at(1000), 100, &first), 0);
        ASSERT_EQ(cache.get(buf.mem(), buf.at(2000), 100, &again), 0);
        EXPECT_EQ(exports.load() - before, 1u) << "the second use hits the cache";
        EXPECT_EQ(memcmp(&first.handle, &again.handle, sizeof first.handle), 0);
        EXPECT_EQ(first.offset, 1000u);
        EXPECT_EQ(again.offset, 2000u);
        EXPECT_EQ(cache.get(buf.mem(), buf.at(65500), 100, &again), -FI_EINVAL)
            << "a range past the allocation";
        first_id = first.buffer_id;
    }
    // Freed; a new allocation (perhaps at the same address) is a new buffer with a new handle.
    Buffer buf(GetParam(), 65536);
    ASSERT_EQ(cache.get(buf.mem(), buf.get(), 100, &fresh), 0);
    EXPECT_NE(fresh.buffer_id, first_id);
    EXPECT_EQ(exports.load() - before, 2u);
}

// Parent exports, a new process maps (through the import cache), reads, writes back.
TEST_P(MemoryIface, IpcMappingInAnotherProcess) {
    if (!device()) GTEST_SKIP() << "host memory has no IPC handles";
    const size_t len = 1 << 20;
    Buffer buf(GetParam(), len);
    auto p = pattern(len, 42);
    buf.write(p);
    IpcExportCache cache;
    IpcExport ex;
    ASSERT_EQ(cache.get(buf.mem(), buf.at(4096), len - 4096, &ex), 0);
    std::string hex;
    const auto *raw = reinterpret_cast<const uint8_t *>(&ex);
    for (size_t i = 0; i < sizeof ex; ++i) {
        char b[3];
        snprintf(b, sizeof b, "%02x", raw[i]);
        hex += b;
    }
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        execl("/proc/self/exe", g_self, "--ipc-child", hex.c_str(),
              std::to_string(getppid()).c_str(), static_cast<char *>(nullptr));
        _exit(99);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status)) << "the other process crashed (signal "
                                   << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ")";
    ASSERT_EQ(WEXITSTATUS(status), 0) << "the other process failed its checks";
    // It wrote the inverse pattern over the exported range.
    auto back = buf.read(4096, len - 4096);
    for (size_t i = 0; i < back.size(); ++i)
        ASSERT_EQ(back[i], static_cast<uint8_t>(~p[4096 + i])) << "at " << i;
}

INSTANTIATE_TEST_SUITE_P(Ifaces, MemoryIface, ::testing::Values(FI_HMEM_SYSTEM, FI_HMEM_CUDA),
                         [](const auto &info) {
                             return std::string(info.param == FI_HMEM_SYSTEM ? "system" : "cuda");
                         });

// The other side of IpcMappingInAnotherProcess. Exit code 0 when every check held.
int ipc_child(const char *hex, uint64_t parent) {
    IpcExport ex;
    auto *raw = reinterpret_cast<uint8_t *>(&ex);
    if (strlen(hex) != 2 * sizeof ex) return 2;
    for (size_t i = 0; i < sizeof ex; ++i) sscanf(hex + 2 * i, "%2hhx", &raw[i]);
    if (!Registry::instance().available(FI_HMEM_CUDA) || !Driver::get().ok) return 3;
    const size_t len = ex.alloc_len - ex.offset;
    IpcImportCache imports(2);
    void *addr = nullptr;
    if (imports.map(parent, 0, ex, len, &addr)) return 4;
    auto &hits = tandem::hmem::counters().ipc_hits;
    void *again = nullptr;
    if (imports.map(parent, 0, ex, len, &again) || again != addr || hits.load() != 1) return 5;
    // A range past what the handle maps is refused, whatever alloc_len the peer claims.
    IpcExport lying = ex;
    lying.alloc_len += 4096;
    if (imports.map(parent, 0, lying, len + 1, &again) != -FI_EINVAL) return 11;
    std::vector<uint8_t> got(len);
    if (tandem::hmem::copy(tandem::hmem::kHost, got.data(), {FI_HMEM_CUDA, 0}, addr, len)) return 6;
    auto p = pattern(ex.alloc_len, 42);
    if (memcmp(got.data(), p.data() + ex.offset, len) != 0) return 7;
    for (auto &b : got) b = static_cast<uint8_t>(~b);
    if (tandem::hmem::copy({FI_HMEM_CUDA, 0}, addr, tandem::hmem::kHost, got.data(), len)) return 8;
    // Forgetting the peer closes what was mapped for it.
    long long live = Driver::get().live_mappings();
    imports.forget_peer(parent);
    if (imports.size() != 0) return 9;
    if (live >= 0 && Driver::get().live_mappings() != live - 1) return 10;
    return 0;
}

TEST(P2pPolicy, DecisionsFollowTheMode) {
    unsetenv("FI_HMEM_DISABLE_P2P");
    P2pPolicy p;
    EXPECT_EQ(p.mode(), FI_HMEM_P2P_ENABLED);
    // ENABLED: tandem's choice, staged up to `small` bytes.
    EXPECT_EQ(p.decide(true, 100, 8192), P2pDecision::Stage);
    EXPECT_EQ(p.decide(true, 100000, 8192), P2pDecision::PeerToPeer);
    EXPECT_EQ(p.decide(false, 100000, 8192), P2pDecision::Stage);
    ASSERT_EQ(p.set(FI_HMEM_P2P_PREFERRED, true), 0);
    EXPECT_EQ(p.decide(true, 100, 8192), P2pDecision::PeerToPeer);
    EXPECT_EQ(p.decide(false, 100, 8192), P2pDecision::Stage);
    ASSERT_EQ(p.set(FI_HMEM_P2P_REQUIRED, true), 0);
    EXPECT_EQ(p.decide(true, 100, 8192), P2pDecision::PeerToPeer);
    EXPECT_EQ(p.decide(false, 100, 8192), P2pDecision::Fail);
    ASSERT_EQ(p.set(FI_HMEM_P2P_DISABLED, true), 0);
    EXPECT_EQ(p.decide(true, 1 << 20, 8192), P2pDecision::Stage);
    EXPECT_EQ(p.set(FI_HMEM_P2P_REQUIRED, false), -FI_EOPNOTSUPP)
        << "REQUIRED where no path can do peer to peer";
    EXPECT_EQ(p.mode(), FI_HMEM_P2P_DISABLED) << "a refused mode changes nothing";
    EXPECT_EQ(p.set(12345, true), -FI_EINVAL);
}

TEST(P2pPolicy, EnvironmentTakesPrecedence) {
    setenv("FI_HMEM_DISABLE_P2P", "1", 1);
    P2pPolicy p;
    EXPECT_EQ(p.mode(), FI_HMEM_P2P_DISABLED);
    EXPECT_EQ(p.set(FI_HMEM_P2P_PREFERRED, true), -FI_EOPNOTSUPP);
    EXPECT_EQ(p.set(FI_HMEM_P2P_DISABLED, true), 0);
    EXPECT_EQ(p.decide(true, 1 << 20, 0), P2pDecision::Stage);
    setenv("FI_HMEM_DISABLE_P2P", "0", 1);
    EXPECT_EQ(P2pPolicy().mode(), FI_HMEM_P2P_ENABLED);
    unsetenv("FI_HMEM_DISABLE_P2P");
}

TEST(Registry, CudaIsOfferedExactlyWhereADeviceIs) {
    bool driver = Driver::get().ok;
    EXPECT_EQ(Registry::instance().available(FI_HMEM_CUDA), driver);
    EXPECT_EQ(Registry::instance().any_device(), driver);
    EXPECT_TRUE(Registry::instance().available(FI_HMEM_SYSTEM));
    EXPECT_FALSE(Registry::instance().available(FI_HMEM_ZE)) << "no Level Zero interface";
    if (!driver) {
        EXPECT_STRNE(Registry::instance().missing_reason(FI_HMEM_CUDA), "");
    }
}

}  // namespace

int main(int argc, char **argv) {
    g_self = argv[0];
    if (argc == 4 && !strcmp(argv[1], "--ipc-child"))
        return ipc_child(argv[2], strtoull(argv[3], nullptr, 10));
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
