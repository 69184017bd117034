// The emulated CUDA driver of the tests (tests/emucuda), loaded the way the providers load the
// real one: dlopen("libcuda.so.1") through the library path (TANDEM_EMUCUDA_DIR), every call
// resolved with dlsym by its exported name.
//
// Settings read from the environment (EMUCUDA_DEVICES, ...) are checked in a fresh process: a
// "threadsafe" death test re-executes this binary, whose driver is then loaded anew. IPC runs
// between this process and forked children, which make their own context current.
#include "hmem/cuda_abi.h"
#include "tests/emucuda/emucuda_control.h"

#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

// ---- the driver, as the providers see it -----------------------------------------------------

struct Driver {
#define EMU_FIELD(field, sym, ret, params) ret(*field) params = nullptr;
    TANDEM_CUDA_DRIVER_CALLS(EMU_FIELD)
#undef EMU_FIELD
    void (*get_stats)(emucuda_stats *) = nullptr;
    void (*reset_stats)() = nullptr;
    void (*set_ipc_enabled)(int) = nullptr;
    void (*set_peer_access)(int) = nullptr;
    void (*set_mem_limit)(unsigned long long) = nullptr;
    void (*set_sync_timeout_ms)(unsigned) = nullptr;
    int (*is_device_address)(const void *) = nullptr;

    void *handle = nullptr;
    std::string error;  // why it is not usable: dlopen failed, or the names that did not resolve
    bool ok() const {
        return handle && error.empty();
    }
};

const Driver &cu() {
    static const Driver driver = [] {
        Driver d;
        d.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!d.handle) {
            d.error = std::string("dlopen(libcuda.so.1): ") + dlerror();
            return d;
        }
        auto resolve = [&](auto &fn, const char *name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(d.handle, name));
            if (!fn) d.error += std::string(" missing ") + name;
        };
#define EMU_RESOLVE(field, sym, ret, params) resolve(d.field, #sym);
        TANDEM_CUDA_DRIVER_CALLS(EMU_RESOLVE)
#undef EMU_RESOLVE
        resolve(d.get_stats, "emucuda_get_stats");
        resolve(d.reset_stats, "emucuda_reset_stats");
        resolve(d.set_ipc_enabled, "emucuda_set_ipc_enabled");
        resolve(d.set_peer_access, "emucuda_set_peer_access");
        resolve(d.set_mem_limit, "emucuda_set_mem_limit");
        resolve(d.set_sync_timeout_ms, "emucuda_set_sync_timeout_ms");
        resolve(d.is_device_address, "emucuda_is_device_address");
        return d;
    }();
    return driver;
}

emucuda_stats stats() {
    emucuda_stats s{};
    cu().get_stats(&s);
    return s;
}

void restore_switches() {
    cu().set_ipc_enabled(1);
    cu().set_peer_access(1);
    cu().set_mem_limit(0);
    cu().set_sync_timeout_ms(0);
}

using Bytes = std::vector<unsigned char>;

Bytes pattern(std::size_t n, unsigned seed) {
    Bytes b(n);
    for (std::size_t i = 0; i < n; i++) b[i] = static_cast<unsigned char>(seed + i * 7 + (i >> 9));
    return b;
}

template <class T>
CUdeviceptr host_addr(T *p) {
    return reinterpret_cast<CUdeviceptr>(p);
}

std::size_t page_size() {
    return static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

// The protection of the mapping containing p, as /proc/self/maps shows it ("---s": PROT_NONE,
// shared), or "" when nothing is mapped there.
std::string protection_at(CUdeviceptr p) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        unsigned long lo = 0, hi = 0;
        char perms[8] = {};
        if (std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms) == 3 && p >= lo && p < hi)
            return perms;
    }
    return "";
}

// The driver's shared-memory objects of this process in /dev/shm.
int shm_objects_of_this_process() {
    char prefix[64];
    std::snprintf(prefix, sizeof prefix, "emucuda-%x-", static_cast<unsigned>(getpid()));
    int count = 0;
    if (DIR *dir = opendir("/dev/shm")) {
        while (dirent *e = readdir(dir))
            if (std::strncmp(e->d_name, prefix, std::strlen(prefix)) == 0) count++;
        closedir(dir);
    }
    return count;
}

// ---- child processes -------------------------------------------------------------------------

// Checks in a child process: print what failed and exit 1 (the parent expects exit status 0).
[[noreturn]] void child_fail(const char *file, int line, const std::string &what) {
    std::fprintf(stderr, "%s:%d: %s\n", file, line, what.c_str());
    std::fflush(stderr);
    std::exit(1);
}
#define CHILD_CHECK(cond)                                                    \
    do {                                                                     \
        if (!(cond)) child_fail(__FILE__, __LINE__, "check failed: " #cond); \
    } while (0)
#define CHILD_EQ(a, b)                                                                \
    do {                                                                              \
        auto a_ = (a);                                                                \
        auto b_ = (b);                                                                \
        if (!(a_ == b_))                                                              \
            child_fail(__FILE__, __LINE__,                                            \
                       std::string(#a " == " #b ": ") + std::to_string(a_) + " vs " + \
                           std::to_string(b_));                                       \
    } while (0)

// Runs fn in a forked child; returns its wait status.
int run_child(const std::function<void()> &fn) {
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
        fn();
        std::exit(0);
    }
    int status = -1;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
}
#define EXPECT_CHILD_OK(...)                                         \
    do {                                                             \
        int status_ = run_child(__VA_ARGS__);                        \
        EXPECT_TRUE(WIFEXITED(status_) && WEXITSTATUS(status_) == 0) \
            << "child wait status " << status_;                      \
    } while (0)
#define CHILD_CHILD_OK(...)                                           \
    do {                                                              \
        int status_ = run_child(__VA_ARGS__);                         \
        CHILD_CHECK(WIFEXITED(status_) && WEXITSTATUS(status_) == 0); \
    } while (0)

// A child's own context: fork keeps the forking thread's current context, a real client would
// not have one.
void child_context(int device) {
    CHILD_CHECK(cu().ok());
    CUcontext ctx = nullptr;
    CHILD_EQ(cu().init(0), CUDA_SUCCESS);
    CHILD_EQ(cu().ctx_set_current(nullptr), CUDA_SUCCESS);
    CHILD_EQ(cu().primary_ctx_retain(&ctx, device), CUDA_SUCCESS);
    CHILD_EQ(cu().ctx_set_current(ctx), CUDA_SUCCESS);
}

// Sets environment variables for the scope (the fresh process a death test starts inherits
// them), then restores them.
class ScopedEnv {
  public:
    ScopedEnv(std::initializer_list<std::pair<const char *, const char *>> vars) {
        for (auto &[name, value] : vars) {
            const char *old = std::getenv(name);
            saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
            setenv(name, value, 1);
        }
    }
    ~ScopedEnv() {
        for (auto &[name, old] : saved_) {
            if (old)
                setenv(name.c_str(), old->c_str(), 1);
            else
                unsetenv(name.c_str());
        }
    }
    ScopedEnv(const ScopedEnv &) = delete;
    ScopedEnv &operator=(const ScopedEnv &) = delete;

  private:
    std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Runs fn in a new process that re-executes this test binary ("threadsafe" death-test style):
// its driver is loaded anew and reads the environment set before.
#define EXPECT_IN_FRESH_PROCESS(fn)                     \
    do {                                                \
        GTEST_FLAG_SET(death_test_style, "threadsafe"); \
        EXPECT_EXIT(                                    \
            {                                           \
                fn();                                   \
                std::exit(0);                           \
            },                                          \
            ::testing::ExitedWithCode(0), "");          \
    } while (0)

// ---- the fixture: device 0's primary context current ----------------------------------------

class EmuCuda : public ::testing::Test {
  protected:
    void SetUp() override {
        ASSERT_TRUE(cu().ok()) << cu().error;
        ASSERT_EQ(cu().init(0), CUDA_SUCCESS);
        ASSERT_EQ(cu().primary_ctx_retain(&ctx_, 0), CUDA_SUCCESS);
        ASSERT_EQ(cu().ctx_set_current(ctx_), CUDA_SUCCESS);
        restore_switches();
    }
    void TearDown() override {
        if (!cu().ok()) return;
        restore_switches();
        // The last release destroys whatever a failed test left behind.
        if (ctx_) {
            EXPECT_EQ(cu().primary_ctx_release(0), CUDA_SUCCESS);
        }
        cu().ctx_set_current(nullptr);
    }

    CUdeviceptr alloc(std::size_t n) {
        CUdeviceptr p = 0;
        EXPECT_EQ(cu().mem_alloc(&p, n), CUDA_SUCCESS);
        return p;
    }
    Bytes read(CUdeviceptr p, std::size_t n) {
        Bytes out(n);
        EXPECT_EQ(cu().memcpy_dtoh(out.data(), p, n), CUDA_SUCCESS);
        return out;
    }
    void write(CUdeviceptr p, const Bytes &b) {
        EXPECT_EQ(cu().memcpy_htod(p, b.data(), b.size()), CUDA_SUCCESS);
    }
    void write32(CUdeviceptr p, std::uint32_t v) {
        EXPECT_EQ(cu().memcpy_htod(p, &v, sizeof v), CUDA_SUCCESS);
    }
    CUstream stream(unsigned flags = CU_STREAM_NON_BLOCKING) {
        CUstream s = nullptr;
        EXPECT_EQ(cu().stream_create(&s, flags), CUDA_SUCCESS);
        return s;
    }
    template <class T>
    T attr(int attribute, CUdeviceptr p) {
        T value{};
        EXPECT_EQ(cu().pointer_get_attribute(&value, attribute, p), CUDA_SUCCESS)
            << "attribute " << attribute;
        return value;
    }

    CUcontext ctx_ = nullptr;
};

using EmuCudaDeathTest = EmuCuda;
using EmuCudaIpc = EmuCuda;

// ---- loading -------------------------------------------------------------------------------

TEST(EmuCudaLoad, ExportsEveryDriverCallAndTheControlApiFromTheTestDirectory) {
    ASSERT_TRUE(cu().ok()) << cu().error;
    Dl_info info{};
    ASSERT_NE(dladdr(reinterpret_cast<void *>(cu().init), &info), 0);
    char real[PATH_MAX], dir[PATH_MAX];
    ASSERT_NE(realpath(info.dli_fname, real), nullptr);
    ASSERT_NE(realpath(TANDEM_EMUCUDA_DIR, dir), nullptr);
    EXPECT_EQ(std::string(real), std::string(dir) + "/libcuda.so.1");
}

// ---- before cuInit, and the environment --------------------------------------------------------

void child_before_init() {
    CHILD_CHECK(cu().ok());
    int n = -1;
    CHILD_EQ(cu().device_get_count(&n), CUDA_ERROR_NOT_INITIALIZED);
    CUdeviceptr p = 0;
    CHILD_EQ(cu().mem_alloc(&p, 64), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx = nullptr;
    CHILD_EQ(cu().primary_ctx_retain(&ctx, 0), CUDA_ERROR_NOT_INITIALIZED);
    CHILD_EQ(cu().stream_query(nullptr), CUDA_ERROR_NOT_INITIALIZED);
    CHILD_EQ(cu().stream_write_value32(nullptr, 0, 0, 0x7), CUDA_ERROR_NOT_INITIALIZED);
    int version = 0;
    CHILD_EQ(cu().driver_get_version(&version), CUDA_SUCCESS);
    CHILD_EQ(version, 13000);
    const char *name = nullptr;
    CHILD_EQ(cu().get_error_name(CUDA_ERROR_NOT_INITIALIZED, &name), CUDA_SUCCESS);
    CHILD_CHECK(name && std::string(name) == "CUDA_ERROR_NOT_INITIALIZED");
    CHILD_EQ(cu().init(1), CUDA_ERROR_INVALID_VALUE);
    CHILD_EQ(cu().device_get_count(&n), CUDA_ERROR_NOT_INITIALIZED);
    CHILD_EQ(cu().init(0), CUDA_SUCCESS);
    CHILD_EQ(cu().init(0), CUDA_SUCCESS);
    CHILD_EQ(cu().device_get_count(&n), CUDA_SUCCESS);
    CHILD_EQ(n, 1);
}

TEST(EmuCudaEnvDeathTest, CallsBeforeCuInitAreNotInitialized) {
    ScopedEnv env({{"EMUCUDA_DEVICES", "1"}});
    EXPECT_IN_FRESH_PROCESS(child_before_init);
}

void child_no_devices() {
    CHILD_CHECK(cu().ok());
    CHILD_EQ(cu().init(0), CUDA_SUCCESS);
    int n = -1;
    CHILD_EQ(cu().device_get_count(&n), CUDA_SUCCESS);
    CHILD_EQ(n, 0);
    CUdevice dev = -1;
    CHILD_EQ(cu().device_get(&dev, 0), CUDA_ERROR_INVALID_DEVICE);
    CUcontext ctx = nullptr;
    CHILD_EQ(cu().primary_ctx_retain(&ctx, 0), CUDA_ERROR_INVALID_DEVICE);
    int value = 0;
    CHILD_EQ(cu().device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0),
             CUDA_ERROR_INVALID_DEVICE);
    CUdeviceptr p = 0;
    CHILD_EQ(cu().mem_alloc(&p, 64), CUDA_ERROR_INVALID_CONTEXT);
}

TEST(EmuCudaEnvDeathTest, NoDevices) {
    ScopedEnv env({{"EMUCUDA_DEVICES", "0"}});
    EXPECT_IN_FRESH_PROCESS(child_no_devices);
}

void child_two_devices() {
    CHILD_CHECK(cu().ok());
    CHILD_EQ(cu().init(0), CUDA_SUCCESS);
    int n = 0, value = 0, can = -1;
    CHILD_EQ(cu().device_get_count(&n), CUDA_SUCCESS);
    CHILD_EQ(n, 2);
    CHILD_EQ(cu().device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1), CUDA_SUCCESS);
    CHILD_EQ(value, 2);
    CHILD_EQ(cu().device_can_access_peer(&can, 0, 1), CUDA_SUCCESS);
    CHILD_EQ(can, 1);
    CHILD_EQ(cu().device_can_access_peer(&can, 1, 1), CUDA_SUCCESS);
    CHILD_EQ(can, 0);

    CUcontext ctx0 = nullptr, ctx1 = nullptr;
    CHILD_EQ(cu().primary_ctx_retain(&ctx0, 0), CUDA_SUCCESS);
    CHILD_EQ(cu().primary_ctx_retain(&ctx1, 1), CUDA_SUCCESS);
    CHILD_CHECK(ctx0 != ctx1);
    CHILD_EQ(cu().ctx_set_current(ctx0), CUDA_SUCCESS);
    CHILD_EQ(cu().ctx_enable_peer_access(ctx1, 1), CUDA_ERROR_INVALID_VALUE);
    CHILD_EQ(cu().ctx_enable_peer_access(ctx1, 0), CUDA_SUCCESS);
    CHILD_EQ(cu().ctx_enable_peer_access(ctx1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    CHILD_EQ(cu().ctx_enable_peer_access(ctx0, 0), CUDA_ERROR_INVALID_CONTEXT);

    const std::size_t size = 10000;
    CUdeviceptr a = 0, b = 0;
    CHILD_EQ(cu().mem_alloc(&a, size), CUDA_SUCCESS);
    CHILD_EQ(cu().ctx_set_current(ctx1), CUDA_SUCCESS);
    CUdevice dev = -1;
    CHILD_EQ(cu().ctx_get_device(&dev), CUDA_SUCCESS);
    CHILD_EQ(dev, 1);
    CHILD_EQ(cu().mem_alloc(&b, size), CUDA_SUCCESS);
    int ordinal = -1;
    CHILD_EQ(cu().pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a),
             CUDA_SUCCESS);
    CHILD_EQ(ordinal, 0);
    CHILD_EQ(cu().pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b),
             CUDA_SUCCESS);
    CHILD_EQ(ordinal, 1);

    // A copy between the two devices is a peer copy.
    cu().reset_stats();
    Bytes in = pattern(size, 3), out(size);
    CHILD_EQ(cu().memcpy_htod(a, in.data(), size), CUDA_SUCCESS);
    CHILD_EQ(cu().memcpy_dtod(b, a, size), CUDA_SUCCESS);
    CHILD_EQ(cu().memcpy_dtoh(out.data(), b, size), CUDA_SUCCESS);
    CHILD_CHECK(out == in);
    emucuda_stats s = stats();
    CHILD_EQ(s.dtod_copies, 1ull);
    CHILD_EQ(s.peer_copies, 1ull);

    // A process whose current context is on device 1 opens device 0's memory.
    CUipcMemHandle handle;
    CHILD_EQ(cu().ipc_get_mem_handle(&handle, a), CUDA_SUCCESS);
    CHILD_CHILD_OK([&] {
        child_context(1);
        CUdeviceptr p = 0;
        CHILD_EQ(cu().ipc_open_mem_handle(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                 CUDA_SUCCESS);
        int where = -1;
        CHILD_EQ(cu().pointer_get_attribute(&where, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
                 CUDA_SUCCESS);
        CHILD_EQ(where, 0);
        Bytes seen(size);
        CHILD_EQ(cu().memcpy_dtoh(seen.data(), p, size), CUDA_SUCCESS);
        CHILD_CHECK(seen == in);
        CHILD_EQ(cu().ipc_close_mem_handle(p), CUDA_SUCCESS);
    });

    // Peer access switched off at run time: no peer access, no IPC across devices; the same
    // device still opens it.
    cu().set_peer_access(0);
    CHILD_EQ(cu().device_can_access_peer(&can, 0, 1), CUDA_SUCCESS);
    CHILD_EQ(can, 0);
    CHILD_EQ(cu().ctx_enable_peer_access(ctx0, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    CHILD_CHILD_OK([&] {
        child_context(1);
        CUdeviceptr p = 0;
        CHILD_EQ(cu().ipc_open_mem_handle(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                 CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
        CHILD_EQ(cu().ctx_set_current(nullptr), CUDA_SUCCESS);
        child_context(0);
        CHILD_EQ(cu().ipc_open_mem_handle(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                 CUDA_SUCCESS);
        CHILD_EQ(cu().ipc_close_mem_handle(p), CUDA_SUCCESS);
    });

    CHILD_EQ(cu().mem_free(a), CUDA_SUCCESS);
    CHILD_EQ(cu().mem_free(b), CUDA_SUCCESS);
    CHILD_EQ(cu().primary_ctx_release(1), CUDA_SUCCESS);
    CHILD_EQ(cu().primary_ctx_release(0), CUDA_SUCCESS);
}

TEST(EmuCudaEnvDeathTest, TwoDevicesWithPeerAccessAndIpcAcrossThem) {
    ScopedEnv env({{"EMUCUDA_DEVICES", "2"}, {"EMUCUDA_PEER_ACCESS", "1"}});
    EXPECT_IN_FRESH_PROCESS(child_two_devices);
}

void child_peer_access_off() {
    CHILD_CHECK(cu().ok());
    CHILD_EQ(cu().init(0), CUDA_SUCCESS);
    int can = -1;
    CHILD_EQ(cu().device_can_access_peer(&can, 0, 1), CUDA_SUCCESS);
    CHILD_EQ(can, 0);
    CUcontext ctx0 = nullptr, ctx1 = nullptr;
    CHILD_EQ(cu().primary_ctx_retain(&ctx0, 0), CUDA_SUCCESS);
    CHILD_EQ(cu().primary_ctx_retain(&ctx1, 1), CUDA_SUCCESS);
    CHILD_EQ(cu().ctx_set_current(ctx1), CUDA_SUCCESS);
    CHILD_EQ(cu().ctx_enable_peer_access(ctx0, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    cu().set_peer_access(1);
    CHILD_EQ(cu().device_can_access_peer(&can, 0, 1), CUDA_SUCCESS);
    CHILD_EQ(can, 1);
    CHILD_EQ(cu().ctx_enable_peer_access(ctx0, 0), CUDA_SUCCESS);
}

TEST(EmuCudaEnvDeathTest, TwoDevicesWithoutPeerAccess) {
    ScopedEnv env({{"EMUCUDA_DEVICES", "2"}, {"EMUCUDA_PEER_ACCESS", "0"}});
    EXPECT_IN_FRESH_PROCESS(child_peer_access_off);
}

void child_ipc_and_dmabuf_off() {
    child_context(0);
    int value = -1;
    CHILD_EQ(cu().device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0),
             CUDA_SUCCESS);
    CHILD_EQ(value, 0);
    CUdeviceptr p = 0;
    CHILD_EQ(cu().mem_alloc(&p, page_size()), CUDA_SUCCESS);
    CUipcMemHandle handle;
    CHILD_EQ(cu().ipc_get_mem_handle(&handle, p), CUDA_ERROR_NOT_SUPPORTED);
    int fd = -1;
    CHILD_EQ(cu().mem_get_handle_for_address_range(&fd, p, page_size(),
                                                   CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
             CUDA_ERROR_NOT_SUPPORTED);
    cu().set_ipc_enabled(1);  // IPC has a run-time switch, dma-buf does not
    CHILD_EQ(cu().ipc_get_mem_handle(&handle, p), CUDA_SUCCESS);
    CHILD_EQ(cu().mem_free(p), CUDA_SUCCESS);
}

TEST(EmuCudaEnvDeathTest, IpcAndDmaBufSwitchedOff) {
    ScopedEnv env({{"EMUCUDA_IPC", "0"}, {"EMUCUDA_DMABUF", "0"}});
    EXPECT_IN_FRESH_PROCESS(child_ipc_and_dmabuf_off);
}

void child_mem_limit() {
    child_context(0);
    CUdeviceptr a = 0, b = 0;
    CHILD_EQ(cu().mem_alloc(&a, 1 << 20), CUDA_SUCCESS);
    CHILD_EQ(cu().mem_alloc(&b, 1), CUDA_ERROR_OUT_OF_MEMORY);
    CHILD_EQ(cu().mem_free(a), CUDA_SUCCESS);
    CHILD_EQ(cu().mem_alloc(&b, 1), CUDA_SUCCESS);
    CHILD_EQ(cu().mem_free(b), CUDA_SUCCESS);
}

TEST(EmuCudaEnvDeathTest, MemLimit) {
    ScopedEnv env({{"EMUCUDA_MEM_LIMIT", "1048576"}});
    EXPECT_IN_FRESH_PROCESS(child_mem_limit);
}

void child_sync_timeout() {
    child_context(0);
    CUdeviceptr flag = 0;
    CHILD_EQ(cu().mem_alloc(&flag, 4), CUDA_SUCCESS);
    CUstream s = nullptr;
    CHILD_EQ(cu().stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHILD_EQ(cu().stream_wait_value32(s, flag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    auto start = std::chrono::steady_clock::now();
    CHILD_EQ(cu().stream_synchronize(s), CUDA_ERROR_UNKNOWN);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - start)
                  .count();
    CHILD_CHECK(ms >= 100 && ms < 5000);
}

TEST(EmuCudaEnvDeathTest, SyncTimeout) {
    ScopedEnv env({{"EMUCUDA_SYNC_TIMEOUT_MS", "100"}});
    EXPECT_IN_FRESH_PROCESS(child_sync_timeout);
}

// ---- devices and contexts ------------------------------------------------------------------

TEST_F(EmuCuda, DeviceQueries) {
    int n = 0, value = -1, version = 0, can = -1;
    ASSERT_EQ(cu().device_get_count(&n), CUDA_SUCCESS);
    EXPECT_EQ(n, 1);
    EXPECT_EQ(cu().device_get_count(nullptr), CUDA_ERROR_INVALID_VALUE);
    CUdevice dev = -1;
    EXPECT_EQ(cu().device_get(&dev, 0), CUDA_SUCCESS);
    EXPECT_EQ(dev, 0);
    EXPECT_EQ(cu().device_get(&dev, 1), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(cu().device_get(&dev, -1), CUDA_ERROR_INVALID_DEVICE);

    EXPECT_EQ(cu().device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0),
              CUDA_SUCCESS);
    EXPECT_EQ(value, 1);
    EXPECT_EQ(cu().device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0), CUDA_SUCCESS);
    EXPECT_EQ(value, 1);
    EXPECT_EQ(cu().device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 0),
              CUDA_SUCCESS);
    EXPECT_EQ(value, 1);
    EXPECT_EQ(cu().device_get_attribute(&value, 1 /* max threads per block */, 0),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1),
              CUDA_ERROR_INVALID_DEVICE);

    EXPECT_EQ(cu().driver_get_version(&version), CUDA_SUCCESS);
    EXPECT_EQ(version, 13000);
    EXPECT_EQ(cu().device_can_access_peer(&can, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(can, 0);
    EXPECT_EQ(cu().device_can_access_peer(&can, 0, 1), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(EmuCuda, ErrorNames) {
    const std::pair<CUresult, const char *> names[] = {
        {CUDA_SUCCESS, "CUDA_SUCCESS"},
        {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
        {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
        {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
        {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
        {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
        {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
        {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED"},
        {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED"},
        {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED"},
        {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"},
        {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"},
        {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY"},
        {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"},
        {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"},
        {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"},
        {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED"},
        {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"},
        {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN"},
    };
    for (auto &[code, expected] : names) {
        const char *name = nullptr;
        ASSERT_EQ(cu().get_error_name(code, &name), CUDA_SUCCESS) << code;
        ASSERT_NE(name, nullptr);
        EXPECT_STREQ(name, expected);
    }
    const char *name = "unchanged";
    EXPECT_EQ(cu().get_error_name(12345, &name), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(name, nullptr);
    EXPECT_EQ(cu().get_error_name(CUDA_SUCCESS, nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(EmuCuda, PrimaryContextIsRefcountedAndCurrentPerThread) {
    CUcontext again = nullptr, cur = nullptr;
    ASSERT_EQ(cu().primary_ctx_retain(&again, 0), CUDA_SUCCESS);
    EXPECT_EQ(again, ctx_);
    EXPECT_EQ(cu().primary_ctx_release(0), CUDA_SUCCESS);  // still retained by the fixture
    EXPECT_EQ(cu().primary_ctx_release(1), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(cu().ctx_get_current(&cur), CUDA_SUCCESS);
    EXPECT_EQ(cur, ctx_);
    CUdevice dev = -1;
    EXPECT_EQ(cu().ctx_get_device(&dev), CUDA_SUCCESS);
    EXPECT_EQ(dev, 0);
    EXPECT_EQ(cu().ctx_enable_peer_access(ctx_, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().ctx_set_current(reinterpret_cast<CUcontext>(&dev)), CUDA_ERROR_INVALID_CONTEXT);

    // Another thread has no current context until it sets one.
    std::thread([&] {
        CUcontext none = ctx_;
        EXPECT_EQ(cu().ctx_get_current(&none), CUDA_SUCCESS);
        EXPECT_EQ(none, nullptr);
        CUdevice d = -1;
        EXPECT_EQ(cu().ctx_get_device(&d), CUDA_ERROR_INVALID_CONTEXT);
        CUdeviceptr p = 0;
        EXPECT_EQ(cu().mem_alloc(&p, 64), CUDA_ERROR_INVALID_CONTEXT);
        EXPECT_EQ(cu().ctx_set_current(ctx_), CUDA_SUCCESS);
        EXPECT_EQ(cu().ctx_get_device(&d), CUDA_SUCCESS);
        EXPECT_EQ(d, 0);
    }).join();

    // Without a current context: what needs one fails, what names its memory or stream works.
    CUdeviceptr p = alloc(64);
    CUstream s = stream();
    ASSERT_EQ(cu().ctx_set_current(nullptr), CUDA_SUCCESS);
    CUdeviceptr q = 0;
    CUstream s2 = nullptr;
    CUevent e = nullptr;
    std::uint32_t v = 1;
    CUipcMemHandle handle{};
    EXPECT_EQ(cu().ctx_get_device(&dev), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().mem_alloc(&q, 64), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().stream_create(&s2, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().event_create(&e, 0), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().memcpy_htod(p, &v, sizeof v), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().stream_query(nullptr), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().ipc_open_mem_handle(&q, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().memcpy_async(p, host_addr(&v), sizeof v, s), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_synchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(attr<int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p), 0);
    EXPECT_EQ(cu().stream_destroy(s), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(p), CUDA_SUCCESS);
    ASSERT_EQ(cu().ctx_set_current(ctx_), CUDA_SUCCESS);
}

TEST_F(EmuCuda, LastReleaseOfThePrimaryContextDestroysWhatLivesInIt) {
    CUdeviceptr p = alloc(4096);
    CUstream s = stream();
    CUevent e = nullptr;
    ASSERT_EQ(cu().event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    EXPECT_EQ(stats().live_allocs, 1u);

    ASSERT_EQ(cu().primary_ctx_release(0), CUDA_SUCCESS);
    EXPECT_EQ(stats().live_allocs, 0u);
    unsigned type = 0;
    EXPECT_EQ(cu().pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().mem_free(p), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().stream_query(s), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(cu().event_query(e), CUDA_ERROR_INVALID_HANDLE);
    CUdeviceptr q = 0;
    EXPECT_EQ(cu().mem_alloc(&q, 64), CUDA_ERROR_INVALID_CONTEXT);  // still current, destroyed
    EXPECT_EQ(cu().ctx_set_current(ctx_), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().primary_ctx_release(0), CUDA_ERROR_INVALID_CONTEXT);

    CUcontext again = nullptr;
    ASSERT_EQ(cu().primary_ctx_retain(&again, 0), CUDA_SUCCESS);
    EXPECT_EQ(again, ctx_);
    ASSERT_EQ(cu().ctx_set_current(ctx_), CUDA_SUCCESS);
    q = alloc(64);
    EXPECT_EQ(cu().mem_free(q), CUDA_SUCCESS);
}

// ---- memory --------------------------------------------------------------------------------

TEST_F(EmuCuda, AllocationsAreSharedMemoryObjectsWithUniqueBufferIds) {
    int objects = shm_objects_of_this_process();
    cu().reset_stats();
    CUdeviceptr a = alloc(1000), b = alloc(4096), c = alloc(1);
    ASSERT_TRUE(a && b && c);
    EXPECT_EQ(protection_at(a), "---s");  // the CPU cannot touch it
    auto ida = attr<unsigned long long>(CU_POINTER_ATTRIBUTE_BUFFER_ID, a);
    auto idb = attr<unsigned long long>(CU_POINTER_ATTRIBUTE_BUFFER_ID, b);
    auto idc = attr<unsigned long long>(CU_POINTER_ATTRIBUTE_BUFFER_ID, c);
    EXPECT_GE(ida, 1u);
    EXPECT_LT(ida, idb);
    EXPECT_LT(idb, idc);
    EXPECT_EQ(shm_objects_of_this_process(), objects + 3);
    EXPECT_EQ(stats().live_allocs, 3u);
    EXPECT_EQ(stats().live_bytes, 1000u + 4096u + 1u);

    EXPECT_EQ(cu().mem_free(b), CUDA_SUCCESS);
    EXPECT_EQ(shm_objects_of_this_process(), objects + 2);
    EXPECT_EQ(protection_at(b), "");
    EXPECT_EQ(cu().mem_free(b), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().mem_free(a + 8), CUDA_ERROR_INVALID_VALUE);
    int host = 0;
    EXPECT_EQ(cu().mem_free(host_addr(&host)), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().mem_free(0), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr p = 0;
    EXPECT_EQ(cu().mem_alloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().mem_alloc(nullptr, 8), CUDA_ERROR_INVALID_VALUE);

    // A buffer id is never reused, even at an address seen before.
    CUdeviceptr d = alloc(4096);
    EXPECT_GT(attr<unsigned long long>(CU_POINTER_ATTRIBUTE_BUFFER_ID, d), idc);
    EXPECT_EQ(cu().mem_free(a), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(c), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(d), CUDA_SUCCESS);
    EXPECT_EQ(shm_objects_of_this_process(), objects);
    emucuda_stats s = stats();
    EXPECT_EQ(s.allocs, 4u);
    EXPECT_EQ(s.frees, 4u);
    EXPECT_EQ(s.live_allocs, 0u);
    EXPECT_EQ(s.live_bytes, 0u);
    EXPECT_EQ(s.failed_calls, 6u);
}

TEST_F(EmuCuda, MemLimitGivesOutOfMemory) {
    cu().set_mem_limit(1 << 20);
    CUdeviceptr a = alloc(1 << 20), b = 0;
    EXPECT_EQ(cu().mem_alloc(&b, 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(cu().mem_free(a), CUDA_SUCCESS);
    a = alloc(512 << 10);
    b = alloc(512 << 10);
    CUdeviceptr c = 0;
    EXPECT_EQ(cu().mem_alloc(&c, 1), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(cu().mem_alloc(&c, ~std::size_t{0}), CUDA_ERROR_OUT_OF_MEMORY);
    cu().set_mem_limit(0);
    c = alloc(8 << 20);
    for (CUdeviceptr p : {a, b, c}) EXPECT_EQ(cu().mem_free(p), CUDA_SUCCESS);
}

TEST_F(EmuCuda, PointerAttributesOfDeviceAndHostMemory) {
    CUdeviceptr p = alloc(10000), q = p + 1234;
    EXPECT_EQ(attr<unsigned>(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q), CU_MEMORYTYPE_DEVICE);
    EXPECT_EQ(attr<int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, q), 0);
    EXPECT_EQ(attr<unsigned long long>(CU_POINTER_ATTRIBUTE_BUFFER_ID, q),
              attr<unsigned long long>(CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
    EXPECT_EQ(attr<CUdeviceptr>(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q), p);
    EXPECT_EQ(attr<std::size_t>(CU_POINTER_ATTRIBUTE_RANGE_SIZE, q), 10000u);
    EXPECT_EQ(attr<CUcontext>(CU_POINTER_ATTRIBUTE_CONTEXT, q), ctx_);
    EXPECT_EQ(attr<CUdeviceptr>(CU_POINTER_ATTRIBUTE_DEVICE_POINTER, q), q);
    EXPECT_EQ(attr<unsigned>(CU_POINTER_ATTRIBUTE_IS_MANAGED, q), 0u);
    EXPECT_EQ(attr<unsigned>(CU_POINTER_ATTRIBUTE_MAPPED, q), 1u);
    EXPECT_EQ(attr<unsigned>(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, q), 1u);
    void *host_ptr = nullptr;
    EXPECT_EQ(cu().pointer_get_attribute(&host_ptr, CU_POINTER_ATTRIBUTE_HOST_POINTER, q),
              CUDA_ERROR_INVALID_VALUE);
    unsigned type = 0;
    EXPECT_EQ(cu().pointer_get_attribute(&type, 99, q), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().pointer_get_attribute(nullptr, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q),
              CUDA_ERROR_INVALID_VALUE);

    // Host memory, and the byte after the allocation, are not device memory.
    int on_stack = 0;
    std::vector<char> on_heap(100);
    for (CUdeviceptr h :
         {host_addr(&on_stack), host_addr(on_heap.data()), p + 10000, CUdeviceptr{0}}) {
        EXPECT_EQ(cu().pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, h),
                  CUDA_ERROR_INVALID_VALUE);
        EXPECT_EQ(cu().mem_get_address_range(nullptr, nullptr, h), CUDA_ERROR_INVALID_VALUE);
        EXPECT_EQ(cu().is_device_address(reinterpret_cast<void *>(h)), 0);
    }

    CUdeviceptr base = 0;
    std::size_t size = 0;
    EXPECT_EQ(cu().mem_get_address_range(&base, &size, q), CUDA_SUCCESS);
    EXPECT_EQ(base, p);
    EXPECT_EQ(size, 10000u);
    EXPECT_EQ(cu().mem_get_address_range(nullptr, &size, p + 9999), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_get_address_range(&base, nullptr, p + 9999), CUDA_SUCCESS);
    EXPECT_EQ(cu().is_device_address(reinterpret_cast<void *>(p)), 1);
    EXPECT_EQ(cu().is_device_address(reinterpret_cast<void *>(p + 9999)), 1);
    EXPECT_EQ(cu().mem_free(p), CUDA_SUCCESS);
    EXPECT_EQ(cu().is_device_address(reinterpret_cast<void *>(p)), 0);
}

// ---- copies --------------------------------------------------------------------------------

TEST_F(EmuCuda, CopiesRoundTripTheData) {
    const std::size_t n = 3 * 4096 + 123;
    CUdeviceptr a = alloc(n), b = alloc(n);
    Bytes in = pattern(n, 1);
    cu().reset_stats();
    write(a, in);
    EXPECT_EQ(cu().memcpy_dtod(b, a, n), CUDA_SUCCESS);
    EXPECT_EQ(read(b, n), in);

    // Parts of an allocation.
    Bytes part = pattern(50, 99);
    EXPECT_EQ(cu().memcpy_htod(b + 100, part.data(), part.size()), CUDA_SUCCESS);
    Bytes expected = in;
    std::copy(part.begin(), part.end(), expected.begin() + 100);
    EXPECT_EQ(read(b, n), expected);
    Bytes tail(10);
    EXPECT_EQ(cu().memcpy_dtoh(tail.data(), b + n - 10, 10), CUDA_SUCCESS);
    EXPECT_EQ(tail, Bytes(expected.end() - 10, expected.end()));

    // The unified asynchronous copy, each direction, on the null stream and on a stream.
    for (CUstream s : {static_cast<CUstream>(nullptr), stream()}) {
        Bytes in2 = pattern(n, s ? 7 : 5), out(n), out2(n);
        EXPECT_EQ(cu().memcpy_async(a, host_addr(in2.data()), n, s), CUDA_SUCCESS);  // HtoD
        EXPECT_EQ(cu().memcpy_async(b, a, n, s), CUDA_SUCCESS);                      // DtoD
        EXPECT_EQ(cu().memcpy_async(host_addr(out.data()), b, n, s), CUDA_SUCCESS);  // DtoH
        EXPECT_EQ(cu().memcpy_async(host_addr(out2.data()), host_addr(out.data()), n, s),
                  CUDA_SUCCESS);  // HtoH
        EXPECT_EQ(cu().stream_synchronize(s), CUDA_SUCCESS);
        EXPECT_EQ(out, in2);
        EXPECT_EQ(out2, in2);
        if (s) {
            EXPECT_EQ(cu().stream_destroy(s), CUDA_SUCCESS);
        }
    }

    // Nothing to copy is fine.
    EXPECT_EQ(cu().memcpy_htod(a, in.data(), 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().memcpy_async(a, b, 0, nullptr), CUDA_SUCCESS);

    emucuda_stats st = stats();
    EXPECT_EQ(st.htod_copies, 4u);
    EXPECT_EQ(st.bytes_htod, 3 * n + 50);
    EXPECT_EQ(st.dtoh_copies, 5u);
    EXPECT_EQ(st.bytes_dtoh, 4 * n + 10);
    EXPECT_EQ(st.dtod_copies, 3u);
    EXPECT_EQ(st.bytes_dtod, 3 * n);
    EXPECT_EQ(st.peer_copies, 0u);
    EXPECT_EQ(st.htoh_copies, 2u);
    EXPECT_EQ(st.bytes_htoh, 2 * n);
    EXPECT_EQ(st.failed_calls, 0u);
    EXPECT_EQ(cu().mem_free(a), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(b), CUDA_SUCCESS);
}

TEST_F(EmuCuda, CopiesOutOfRangeAreRejectedWithoutTouchingMemory) {
    const std::size_t n = 4096;
    CUdeviceptr a = alloc(n), b = alloc(2 * n);
    Bytes in = pattern(n, 2), big = pattern(2 * n, 3);
    write(a, in);
    cu().reset_stats();
    Bytes out(200, 0xee);
    int host = 0;
    EXPECT_EQ(cu().memcpy_htod(a + n - 100, big.data(), 200), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().memcpy_dtoh(out.data(), a + n - 100, 200), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(out, Bytes(200, 0xee));
    EXPECT_EQ(cu().memcpy_dtod(b, a + 1, n), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().memcpy_dtod(a, b, 2 * n), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().memcpy_dtod(host_addr(&host), a, 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().memcpy_htod(host_addr(&host), big.data(), 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().memcpy_dtoh(out.data(), host_addr(&host), 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().memcpy_async(a + 1, host_addr(big.data()), n, nullptr),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().memcpy_async(host_addr(out.data()), a + n - 1, 2, nullptr),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().memcpy_htod(a, nullptr, 4), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().memcpy_async(a, host_addr(big.data()), 4, reinterpret_cast<CUstream>(&host)),
              CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(cu().stream_write_value32(nullptr, a + 2, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().stream_write_value32(nullptr, a + n, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().stream_write_value32(nullptr, host_addr(&host), 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().stream_wait_value32(nullptr, a, 1, 7), CUDA_ERROR_INVALID_VALUE);
    emucuda_stats s = stats();
    EXPECT_EQ(s.failed_calls, 15u);
    EXPECT_EQ(s.htod_copies + s.dtoh_copies + s.dtod_copies + s.stream_mem_ops, 0u);
    EXPECT_EQ(host, 0);
    EXPECT_EQ(read(a, n), in);
    EXPECT_EQ(cu().mem_free(a), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(b), CUDA_SUCCESS);
}

TEST_F(EmuCudaDeathTest, CpuTouchingDeviceMemoryDies) {
    CUdeviceptr p = alloc(4096), q = alloc(4096);
    // The default action, whatever a sanitizer installed: the kernel's SIGSEGV kills the child.
    auto default_segv = [] { signal(SIGSEGV, SIG_DFL); };
    EXPECT_EXIT(
        {
            default_segv();
            volatile unsigned char c = *reinterpret_cast<volatile unsigned char *>(p);
            (void)c;
            std::exit(0);
        },
        ::testing::KilledBySignal(SIGSEGV), "");
    EXPECT_EXIT(
        {
            default_segv();
            *reinterpret_cast<volatile unsigned char *>(p + 100) = 1;
            std::exit(0);
        },
        ::testing::KilledBySignal(SIGSEGV), "");
    // Device memory passed where the driver takes host memory.
    EXPECT_EXIT(
        {
            default_segv();
            cu().memcpy_htod(q, reinterpret_cast<const void *>(p), 16);
            std::exit(0);
        },
        ::testing::KilledBySignal(SIGSEGV), "");
    EXPECT_EXIT(
        {
            default_segv();
            cu().memcpy_dtoh(reinterpret_cast<void *>(p), q, 16);
            std::exit(0);
        },
        ::testing::KilledBySignal(SIGSEGV), "");
    EXPECT_EQ(cu().mem_free(p), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(q), CUDA_SUCCESS);
}

// ---- streams and events --------------------------------------------------------------------

TEST_F(EmuCuda, StreamWaitValueHoldsLaterOperationsUntilSatisfied) {
    const std::size_t n = 4096;
    CUdeviceptr flag = alloc(64), data = alloc(n);
    write32(flag, 0);
    CUstream s = stream(), t = stream();
    CUevent e = nullptr;
    ASSERT_EQ(cu().event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    Bytes in = pattern(n, 4);
    cu().reset_stats();

    ASSERT_EQ(cu().stream_wait_value32(s, flag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    ASSERT_EQ(cu().memcpy_async(data, host_addr(in.data()), n, s), CUDA_SUCCESS);
    ASSERT_EQ(cu().event_record(e, s), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_ERROR_NOT_READY);
    EXPECT_EQ(cu().event_query(e), CUDA_ERROR_NOT_READY);
    EXPECT_EQ(read(data, n), Bytes(n, 0));  // the copy waits (s does not block the null stream)

    ASSERT_EQ(cu().stream_write_value32(t, flag, 1, CU_STREAM_WRITE_VALUE_DEFAULT), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(t), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_SUCCESS);
    EXPECT_EQ(cu().event_query(e), CUDA_SUCCESS);
    EXPECT_EQ(read(data, n), in);

    // EQ waits for exactly the value.
    ASSERT_EQ(cu().stream_wait_value32(s, flag, 5, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
    ASSERT_EQ(cu().stream_write_value32(t, flag, 6, 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_ERROR_NOT_READY);
    ASSERT_EQ(cu().stream_write_value32(t, flag, 5, 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_SUCCESS);

    // GEQ compares as the driver does, (int32_t)(*addr - value) >= 0: it survives wrap-around.
    write32(flag, 0xfffffff0u);
    ASSERT_EQ(cu().stream_wait_value32(s, flag, 0x10, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_ERROR_NOT_READY);
    write32(flag, 0x10);  // a plain host-to-device copy satisfies it too
    EXPECT_EQ(cu().stream_query(s), CUDA_SUCCESS);

    // AND: any bit in common; NOR: ~(*addr | value) != 0.
    ASSERT_EQ(cu().stream_wait_value32(s, flag, 0x4, 2 /* AND */), CUDA_SUCCESS);
    write32(flag, 0x3);
    EXPECT_EQ(cu().stream_query(s), CUDA_ERROR_NOT_READY);
    write32(flag, 0x6);
    EXPECT_EQ(cu().stream_query(s), CUDA_SUCCESS);
    write32(flag, 0xf);
    ASSERT_EQ(cu().stream_wait_value32(s, flag, 0xfffffff0u, 3 /* NOR */), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_ERROR_NOT_READY);
    write32(flag, 0x7);
    EXPECT_EQ(cu().stream_query(s), CUDA_SUCCESS);

    // The flush bit is accepted with any condition.
    ASSERT_EQ(cu().stream_wait_value32(s, flag, 0x7, CU_STREAM_WAIT_VALUE_EQ | (1u << 30)),
              CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_synchronize(s), CUDA_SUCCESS);

    emucuda_stats st = stats();
    EXPECT_EQ(st.stream_mem_ops, 9u);
    EXPECT_EQ(st.event_records, 1u);
    EXPECT_EQ(st.failed_calls, 0u);
    EXPECT_EQ(cu().event_destroy(e), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_destroy(s), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_destroy(t), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(flag), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(data), CUDA_SUCCESS);
}

// The 64-bit forms (what an XPU trigger variable is written with): the whole word is compared
// and written, and the word must be 8-aligned.
TEST_F(EmuCuda, StreamWriteAndWaitValue64UseTheWholeWord) {
    CUdeviceptr word = alloc(64);
    CUstream s = stream(), t = stream();
    const uint64_t zero = 0;
    ASSERT_EQ(cu().memcpy_htod(word, &zero, sizeof zero), CUDA_SUCCESS);
    cu().reset_stats();
    // A value above 32 bits: a 32-bit comparison of the low half (0) would already hold.
    const uint64_t big = 0x100000000ull;
    ASSERT_EQ(cu().stream_wait_value64(s, word, big, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_ERROR_NOT_READY);
    ASSERT_EQ(cu().stream_write_value64(t, word, big + 1, 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_SUCCESS);
    uint64_t out = 0;
    ASSERT_EQ(cu().memcpy_dtoh(&out, word, sizeof out), CUDA_SUCCESS);
    EXPECT_EQ(out, big + 1);
    ASSERT_EQ(cu().stream_wait_value64(s, word, big, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_ERROR_NOT_READY);
    ASSERT_EQ(cu().stream_write_value64(t, word, big, 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_write_value64(t, word + 4, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().stream_wait_value64(t, word, 1, 7), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(stats().stream_mem_ops, 4u);
    EXPECT_EQ(cu().stream_destroy(s), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_destroy(t), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(word), CUDA_SUCCESS);
}

TEST_F(EmuCuda, SynchronizeGivesUpOnAWaitNeverSatisfied) {
    cu().set_sync_timeout_ms(200);
    CUdeviceptr flag = alloc(4);
    write32(flag, 0);
    CUstream s = stream(), t = stream();
    CUevent e = nullptr;
    ASSERT_EQ(cu().event_create(&e, 0), CUDA_SUCCESS);
    ASSERT_EQ(cu().stream_wait_value32(s, flag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    ASSERT_EQ(cu().event_record(e, s), CUDA_SUCCESS);
    cu().reset_stats();

    auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(cu().stream_synchronize(s), CUDA_ERROR_UNKNOWN);
    EXPECT_EQ(cu().event_synchronize(e), CUDA_ERROR_UNKNOWN);
    auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_GE(elapsed, std::chrono::milliseconds(400));
    EXPECT_LT(elapsed, std::chrono::seconds(5));
    EXPECT_EQ(stats().sync_timeouts, 2u);

    ASSERT_EQ(cu().stream_write_value32(t, flag, 1, 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_synchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(cu().event_synchronize(e), CUDA_SUCCESS);
    EXPECT_EQ(cu().event_destroy(e), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_destroy(s), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_destroy(t), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(flag), CUDA_SUCCESS);
}

TEST_F(EmuCuda, NullStreamSynchronizesWithBlockingStreamsOnly) {
    cu().set_sync_timeout_ms(200);
    const std::size_t n = 256;
    CUdeviceptr flag = alloc(4), data = alloc(n);
    write32(flag, 0);
    CUstream blocking = stream(0), non_blocking = stream(CU_STREAM_NON_BLOCKING),
             other = stream(CU_STREAM_NON_BLOCKING);
    Bytes first = pattern(n, 10), second = pattern(n, 20), third = pattern(n, 30);

    // A blocked blocking stream holds the null stream: the synchronous copy gives up, and its
    // copy never runs later (the caller's buffer may be gone).
    ASSERT_EQ(cu().stream_wait_value32(blocking, flag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    EXPECT_EQ(cu().memcpy_htod(data, first.data(), n), CUDA_ERROR_UNKNOWN);
    EXPECT_EQ(cu().stream_query(nullptr), CUDA_ERROR_NOT_READY);
    // A non-blocking stream does not wait for either.
    ASSERT_EQ(cu().memcpy_async(data, host_addr(second.data()), n, non_blocking), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(non_blocking), CUDA_SUCCESS);
    ASSERT_EQ(cu().stream_write_value32(non_blocking, flag, 1, 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(blocking), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(nullptr), CUDA_SUCCESS);
    EXPECT_EQ(read(data, n), second);

    // A blocked null stream holds the blocking streams, not the others.
    ASSERT_EQ(cu().stream_wait_value32(nullptr, flag, 2, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    ASSERT_EQ(cu().memcpy_async(data, host_addr(third.data()), n, blocking), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(blocking), CUDA_ERROR_NOT_READY);
    ASSERT_EQ(cu().stream_write_value32(other, flag, 2, 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(nullptr), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(blocking), CUDA_SUCCESS);
    EXPECT_EQ(read(data, n), third);

    for (CUstream s : {blocking, non_blocking, other})
        EXPECT_EQ(cu().stream_destroy(s), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(flag), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(data), CUDA_SUCCESS);
}

TEST_F(EmuCuda, EventsCompleteInStreamOrder) {
    CUdeviceptr flag = alloc(4);
    write32(flag, 0);
    CUstream s = stream(), t = stream();
    CUevent e = nullptr, f = nullptr;
    ASSERT_EQ(cu().event_create(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    ASSERT_EQ(cu().event_create(&f, 0), CUDA_SUCCESS);

    EXPECT_EQ(cu().event_query(e), CUDA_SUCCESS);  // never recorded
    EXPECT_EQ(cu().event_synchronize(e), CUDA_SUCCESS);
    ASSERT_EQ(cu().event_record(e, s), CUDA_SUCCESS);
    EXPECT_EQ(cu().event_query(e), CUDA_SUCCESS);  // nothing before it

    ASSERT_EQ(cu().stream_wait_value32(s, flag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    ASSERT_EQ(cu().event_record(e, s), CUDA_SUCCESS);
    ASSERT_EQ(cu().event_record(f, t), CUDA_SUCCESS);
    EXPECT_EQ(cu().event_query(e), CUDA_ERROR_NOT_READY);
    EXPECT_EQ(cu().event_query(f), CUDA_SUCCESS);
    ASSERT_EQ(cu().event_record(e, t), CUDA_SUCCESS);  // the latest record counts
    EXPECT_EQ(cu().event_query(e), CUDA_SUCCESS);
    ASSERT_EQ(cu().event_record(e, s), CUDA_SUCCESS);
    EXPECT_EQ(cu().event_query(e), CUDA_ERROR_NOT_READY);
    ASSERT_EQ(cu().event_record(f, nullptr), CUDA_SUCCESS);  // the null stream
    EXPECT_EQ(cu().event_query(f), CUDA_SUCCESS);
    ASSERT_EQ(cu().stream_write_value32(t, flag, 1, 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().event_query(e), CUDA_SUCCESS);

    // A destroyed stream finishes its work; its handle is gone.
    const std::size_t n = 128;
    CUdeviceptr data = alloc(n);
    Bytes in = pattern(n, 8);
    ASSERT_EQ(cu().stream_wait_value32(s, flag, 2, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    ASSERT_EQ(cu().memcpy_async(data, host_addr(in.data()), n, s), CUDA_SUCCESS);
    ASSERT_EQ(cu().event_record(e, s), CUDA_SUCCESS);
    ASSERT_EQ(cu().stream_destroy(s), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(cu().stream_destroy(s), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(cu().event_query(e), CUDA_ERROR_NOT_READY);
    ASSERT_EQ(cu().stream_write_value32(t, flag, 2, 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().event_query(e), CUDA_SUCCESS);
    EXPECT_EQ(read(data, n), in);

    EXPECT_EQ(cu().event_destroy(e), CUDA_SUCCESS);
    EXPECT_EQ(cu().event_destroy(e), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(cu().event_query(e), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(cu().event_record(e, t), CUDA_ERROR_INVALID_HANDLE);
    CUevent bad = nullptr;
    EXPECT_EQ(cu().event_create(&bad, 0x8), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().event_create(&bad, 0x4 /* interprocess needs DISABLE_TIMING */),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().stream_create(&t, 0x8), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().event_destroy(f), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_destroy(t), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(flag), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(data), CUDA_SUCCESS);
}

TEST_F(EmuCuda, ConcurrentThreadsAllocateCopyAndQuery) {
    std::vector<std::thread> threads;
    std::vector<std::vector<unsigned long long>> ids(4);
    for (int t = 0; t < 4; t++)
        threads.emplace_back([&, t] {
            EXPECT_EQ(cu().ctx_set_current(ctx_), CUDA_SUCCESS);
            CUstream s = nullptr;
            EXPECT_EQ(cu().stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
            for (int i = 0; i < 100; i++) {
                std::size_t n = 1000 + 37 * i;
                CUdeviceptr p = 0;
                ASSERT_EQ(cu().mem_alloc(&p, n), CUDA_SUCCESS);
                unsigned long long id = 0;
                EXPECT_EQ(
                    cu().pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p + n / 2),
                    CUDA_SUCCESS);
                ids[t].push_back(id);
                Bytes in = pattern(n, t * 100 + i), out(n);
                EXPECT_EQ(cu().memcpy_async(p, host_addr(in.data()), n, s), CUDA_SUCCESS);
                EXPECT_EQ(cu().memcpy_async(host_addr(out.data()), p, n, s), CUDA_SUCCESS);
                EXPECT_EQ(cu().stream_synchronize(s), CUDA_SUCCESS);
                EXPECT_EQ(out, in);
                EXPECT_EQ(cu().mem_free(p), CUDA_SUCCESS);
            }
            EXPECT_EQ(cu().stream_destroy(s), CUDA_SUCCESS);
        });
    for (auto &th : threads) th.join();
    std::set<unsigned long long> unique;
    for (auto &v : ids) unique.insert(v.begin(), v.end());
    EXPECT_EQ(unique.size(), 400u);
    EXPECT_EQ(stats().live_allocs, 0u);
}

// ---- dma-buf -------------------------------------------------------------------------------

TEST_F(EmuCuda, DmaBufFdAliasesTheAllocation) {
    const std::size_t page = page_size(), n = 2 * page;
    CUdeviceptr a = alloc(n), small = alloc(100);
    Bytes in = pattern(n, 6);
    write(a, in);
    cu().reset_stats();
    int fd = -1;
    ASSERT_EQ(
        cu().mem_get_handle_for_address_range(&fd, a, n, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
        CUDA_SUCCESS);
    ASSERT_GE(fd, 0);
    void *m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(m, MAP_FAILED);
    EXPECT_EQ(std::memcmp(m, in.data(), n), 0);
    static_cast<unsigned char *>(m)[page + 1] = 0x5a;  // what a device would do through it
    in[page + 1] = 0x5a;
    EXPECT_EQ(read(a, n), in);
    munmap(m, n);
    close(fd);

    // The size rounds up to pages; the range starts at the allocation (the fd's offset 0).
    EXPECT_EQ(cu().mem_get_handle_for_address_range(&fd, small, page,
                                                    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
              CUDA_SUCCESS);
    close(fd);
    EXPECT_EQ(cu().mem_get_handle_for_address_range(&fd, a + page, page,
                                                    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
              CUDA_ERROR_NOT_SUPPORTED);
    EXPECT_EQ(cu().mem_get_handle_for_address_range(&fd, a, page + 1,
                                                    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().mem_get_handle_for_address_range(&fd, a, 3 * page,
                                                    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().mem_get_handle_for_address_range(&fd, a, n, 2, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().mem_get_handle_for_address_range(nullptr, a, n,
                                                    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
              CUDA_ERROR_INVALID_VALUE);
    Bytes host(n);
    EXPECT_EQ(cu().mem_get_handle_for_address_range(&fd, host_addr(host.data()), page,
                                                    CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
              CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(stats().dmabuf_gets, 2u);
    EXPECT_EQ(cu().mem_free(a), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(small), CUDA_SUCCESS);
}

// ---- IPC -----------------------------------------------------------------------------------

TEST_F(EmuCudaIpc, OpeningAHandleOfTheSameProcessOrABadHandleFails) {
    CUdeviceptr a = alloc(10000);
    CUipcMemHandle h{}, inner{};
    ASSERT_EQ(cu().ipc_get_mem_handle(&h, a), CUDA_SUCCESS);
    ASSERT_EQ(cu().ipc_get_mem_handle(&inner, a + 5000), CUDA_SUCCESS);
    EXPECT_EQ(std::memcmp(&h, &inner, sizeof h), 0);  // the allocation, whatever address in it
    CUdeviceptr p = 0;
    EXPECT_EQ(cu().ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(cu().ipc_open_mem_handle(&p, h, 0), CUDA_ERROR_INVALID_VALUE);
    CUipcMemHandle bad = h;
    bad.reserved[0] ^= 0x55;
    EXPECT_EQ(cu().ipc_open_mem_handle(&p, bad, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_ERROR_INVALID_HANDLE);
    CUipcMemHandle zero{};
    EXPECT_EQ(cu().ipc_open_mem_handle(&p, zero, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(cu().ipc_close_mem_handle(a), CUDA_ERROR_INVALID_VALUE);
    int host = 0;
    EXPECT_EQ(cu().ipc_get_mem_handle(&h, host_addr(&host)), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cu().ipc_get_mem_handle(nullptr, a), CUDA_ERROR_INVALID_VALUE);

    cu().set_ipc_enabled(0);
    EXPECT_EQ(cu().ipc_get_mem_handle(&h, a), CUDA_ERROR_NOT_SUPPORTED);
    cu().set_ipc_enabled(1);
    EXPECT_EQ(cu().ipc_get_mem_handle(&h, a), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(a), CUDA_SUCCESS);
}

TEST_F(EmuCudaIpc, ChildReadsAndWritesTheParentsMemory) {
    const std::size_t n = 3 * 4096 + 5;
    CUdeviceptr a = alloc(n);
    Bytes first = pattern(n, 11), second = pattern(n, 12);
    write(a, first);
    CUipcMemHandle h;
    ASSERT_EQ(cu().ipc_get_mem_handle(&h, a + 7), CUDA_SUCCESS);

    EXPECT_CHILD_OK([&] {
        child_context(0);
        cu().reset_stats();
        CUdeviceptr p = 0;
        CHILD_EQ(cu().ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
        CHILD_CHECK(p != 0 && p != a);  // a mapping of its own (a is inherited from fork)
        CHILD_CHECK(protection_at(p) == "---s");
        CHILD_CHECK(cu().is_device_address(reinterpret_cast<void *>(p + n - 1)) == 1);
        unsigned type = 0;
        int ordinal = -1;
        CUdeviceptr start = 0;
        std::size_t size = 0;
        CHILD_EQ(cu().pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 3),
                 CUDA_SUCCESS);
        CHILD_EQ(type, CU_MEMORYTYPE_DEVICE);
        CHILD_EQ(cu().pointer_get_attribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
                 CUDA_SUCCESS);
        CHILD_EQ(ordinal, 0);
        CHILD_EQ(cu().pointer_get_attribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 3),
                 CUDA_SUCCESS);
        CHILD_EQ(start, p);
        CHILD_EQ(cu().pointer_get_attribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p),
                 CUDA_SUCCESS);
        CHILD_EQ(size, n);

        Bytes seen(n);
        CHILD_EQ(cu().memcpy_dtoh(seen.data(), p, n), CUDA_SUCCESS);
        CHILD_CHECK(seen == first);
        CHILD_EQ(cu().memcpy_htod(p, second.data(), n), CUDA_SUCCESS);

        // Opened twice: the same address, closed twice.
        CUdeviceptr again = 0;
        CHILD_EQ(cu().ipc_open_mem_handle(&again, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                 CUDA_SUCCESS);
        CHILD_EQ(again, p);
        CHILD_EQ(cu().ipc_close_mem_handle(p), CUDA_SUCCESS);
        CHILD_CHECK(protection_at(p) == "---s");
        CHILD_EQ(cu().mem_free(p), CUDA_ERROR_INVALID_VALUE);  // not an allocation
        CHILD_EQ(cu().ipc_close_mem_handle(p), CUDA_SUCCESS);
        CHILD_CHECK(protection_at(p).empty());
        CHILD_EQ(cu().ipc_close_mem_handle(p), CUDA_ERROR_INVALID_VALUE);
        emucuda_stats s = stats();
        CHILD_EQ(s.ipc_opens, 2ull);
        CHILD_EQ(s.ipc_closes, 2ull);
        CHILD_EQ(s.live_ipc_mappings, 0ull);
    });
    EXPECT_EQ(read(a, n), second);

    // Freed by its owner: the handle no longer opens.
    EXPECT_EQ(cu().mem_free(a), CUDA_SUCCESS);
    EXPECT_CHILD_OK([&] {
        child_context(0);
        CUdeviceptr p = 0;
        CHILD_EQ(cu().ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                 CUDA_ERROR_INVALID_HANDLE);
    });
}

TEST_F(EmuCudaIpc, AStreamWaitIsSatisfiedByAnotherProcess) {
    const std::size_t n = 1000;
    CUdeviceptr flag = alloc(64), data = alloc(n);
    write32(flag, 0);
    Bytes in = pattern(n, 13), out(n, 0);
    write(data, in);
    CUstream s = stream();
    ASSERT_EQ(cu().stream_wait_value32(s, flag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    ASSERT_EQ(cu().memcpy_async(host_addr(out.data()), data, n, s), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(s), CUDA_ERROR_NOT_READY);
    CUipcMemHandle h;
    ASSERT_EQ(cu().ipc_get_mem_handle(&h, flag), CUDA_SUCCESS);

    EXPECT_CHILD_OK([&] {
        child_context(0);
        CUdeviceptr p = 0;
        CHILD_EQ(cu().ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
        CHILD_EQ(cu().stream_write_value32(nullptr, p, 1, 0), CUDA_SUCCESS);
        CHILD_EQ(cu().stream_synchronize(nullptr), CUDA_SUCCESS);
        CHILD_EQ(cu().ipc_close_mem_handle(p), CUDA_SUCCESS);
    });
    EXPECT_EQ(cu().stream_synchronize(s), CUDA_SUCCESS);
    EXPECT_EQ(out, in);
    EXPECT_EQ(cu().stream_destroy(s), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(flag), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(data), CUDA_SUCCESS);
}

TEST_F(EmuCudaIpc, OpeningNeedsAContextAndIpcInTheOpeningProcess) {
    CUdeviceptr a = alloc(4096);
    CUipcMemHandle h;
    ASSERT_EQ(cu().ipc_get_mem_handle(&h, a), CUDA_SUCCESS);
    EXPECT_CHILD_OK([&] {
        CHILD_EQ(cu().ctx_set_current(nullptr), CUDA_SUCCESS);
        CUdeviceptr p = 0;
        CHILD_EQ(cu().ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                 CUDA_ERROR_INVALID_CONTEXT);
        child_context(0);
        cu().set_ipc_enabled(0);
        CHILD_EQ(cu().ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                 CUDA_ERROR_NOT_SUPPORTED);
        cu().set_ipc_enabled(1);
        CHILD_EQ(cu().ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
        CHILD_EQ(cu().ipc_close_mem_handle(p), CUDA_SUCCESS);
    });
    EXPECT_EQ(cu().mem_free(a), CUDA_SUCCESS);
}

// ---- the counters --------------------------------------------------------------------------

TEST_F(EmuCuda, StatsCountEveryKindOfCall) {
    const std::size_t page = page_size();
    CUdeviceptr a = alloc(page), b = alloc(page);
    cu().reset_stats();
    emucuda_stats s = stats();
    EXPECT_EQ(s.allocs + s.frees + s.htod_copies + s.failed_calls + s.ipc_gets, 0u);
    EXPECT_EQ(s.live_allocs, 2u);  // state, not a counter
    EXPECT_EQ(s.live_bytes, 2 * page);

    Bytes in = pattern(page, 9), out(page);
    write(a, in);
    EXPECT_EQ(cu().memcpy_dtod(b, a, 100), CUDA_SUCCESS);
    EXPECT_EQ(cu().memcpy_dtoh(out.data(), b, 50), CUDA_SUCCESS);
    EXPECT_EQ(cu().memcpy_async(a, host_addr(in.data()), 10, nullptr), CUDA_SUCCESS);
    CUipcMemHandle h;
    EXPECT_EQ(cu().ipc_get_mem_handle(&h, a), CUDA_SUCCESS);
    int fd = -1;
    EXPECT_EQ(
        cu().mem_get_handle_for_address_range(&fd, a, page, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
        CUDA_SUCCESS);
    close(fd);
    CUstream st = stream();
    EXPECT_EQ(cu().stream_write_value32(st, b, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_wait_value32(st, b, 1, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_query(st), CUDA_ERROR_NOT_READY);  // not a failure
    EXPECT_EQ(cu().stream_write_value32(nullptr, b, 1, 0), CUDA_SUCCESS);
    EXPECT_EQ(cu().stream_synchronize(st), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(a + 1), CUDA_ERROR_INVALID_VALUE);  // a failure
    EXPECT_EQ(cu().stream_destroy(st), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(a), CUDA_SUCCESS);
    EXPECT_EQ(cu().mem_free(b), CUDA_SUCCESS);

    s = stats();
    EXPECT_EQ(s.allocs, 0u);
    EXPECT_EQ(s.frees, 2u);
    EXPECT_EQ(s.htod_copies, 2u);
    EXPECT_EQ(s.bytes_htod, page + 10);
    EXPECT_EQ(s.dtod_copies, 1u);
    EXPECT_EQ(s.bytes_dtod, 100u);
    EXPECT_EQ(s.dtoh_copies, 1u);
    EXPECT_EQ(s.bytes_dtoh, 50u);
    EXPECT_EQ(s.peer_copies, 0u);
    EXPECT_EQ(s.ipc_gets, 1u);
    EXPECT_EQ(s.ipc_opens, 0u);
    EXPECT_EQ(s.ipc_closes, 0u);
    EXPECT_EQ(s.dmabuf_gets, 1u);
    EXPECT_EQ(s.stream_mem_ops, 3u);
    EXPECT_EQ(s.failed_calls, 1u);
    EXPECT_EQ(s.sync_timeouts, 0u);
    EXPECT_EQ(s.live_allocs, 0u);
    EXPECT_EQ(s.live_bytes, 0u);
}

}  // namespace
