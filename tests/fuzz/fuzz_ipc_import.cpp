// Fuzz target: the import of a peer's device memory by IPC handle, as the node-local path
// does it for an IpcRts or IpcWrite cell (wire::LocalIpc; hmem::import_ipc_entry, the
// import cache, and the driver's cuIpcOpenMemHandle: here the emulated driver,
// tests/emucuda, loaded as libcuda.so.1 from LD_LIBRARY_PATH). Another process of the harness
// owns a real 64 KiB device allocation and hands over its handle, so that inputs can name
// real memory with hostile offsets, lengths and sizes as well as garbage handles. Checks, on
// top of the sanitizers: whatever import_ipc_entry accepts lies inside what the handle
// really maps, and the copy it allows succeeds.
#include "hmem/cuda_abi.h"
#include "hmem/hmem.h"
#include "hmem/ipc_cache.h"

#include <dlfcn.h>
#include <sys/prctl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using namespace tandem;

constexpr size_t kAllocSize = 64 * 1024;

struct Owned {
    uint8_t handle[64];
    uint64_t size;
    pid_t pid;
};

bool open_driver(hmem::CudaDriverCalls &cu) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    CUdevice dev;
    CUcontext ctx;
    return lib && cu.resolve(lib) && cu.init(0) == CUDA_SUCCESS &&
           cu.device_get(&dev, 0) == CUDA_SUCCESS &&
           cu.primary_ctx_retain(&ctx, dev) == CUDA_SUCCESS &&
           cu.ctx_set_current(ctx) == CUDA_SUCCESS;
}

// The other process: allocates, exports, and lives until the harness does.
[[noreturn]] void owner(int out) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    hmem::CudaDriverCalls cu;
    Owned o{};
    CUdeviceptr p = 0;
    CUipcMemHandle h;
    if (!open_driver(cu) || cu.mem_alloc(&p, kAllocSize) != CUDA_SUCCESS ||
        cu.ipc_get_mem_handle(&h, p) != CUDA_SUCCESS)
        _exit(1);
    std::vector<uint8_t> pattern(kAllocSize, 0x5a);
    cu.memcpy_htod(p, pattern.data(), pattern.size());
    memcpy(o.handle, h.reserved, sizeof o.handle);
    o.size = kAllocSize;
    o.pid = getpid();
    if (write(out, &o, sizeof o) != sizeof o) _exit(1);
    for (;;) pause();
}

struct Harness {
    Owned owned{};
    hmem::CudaDriverCalls cu;
    hmem::IpcImportCache cache{8};
    bool ok = false;
};

Harness *g_harness;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    int fds[2];
    if (pipe(fds) != 0) abort();
    pid_t child = fork();  // before any driver state exists in this process
    if (child == 0) {
        close(fds[0]);
        owner(fds[1]);
    }
    close(fds[1]);
    g_harness = new Harness;
    if (read(fds[0], &g_harness->owned, sizeof(Owned)) != sizeof(Owned)) {
        fprintf(stderr, "fuzz_ipc_import: no device (is tests/emucuda on LD_LIBRARY_PATH?)\n");
        abort();
    }
    close(fds[0]);
    g_harness->ok =
        open_driver(g_harness->cu) && hmem::Registry::instance().available(FI_HMEM_CUDA);
    if (!g_harness->ok) abort();
    return 0;
}

// Input: one control byte, then a wire::LocalIpc (zero-padded when short). Control bit 0: the
// entry's handle is replaced by the owner's real one; bit 1: the peer is named by the
// owner's pid (else by the input's own word); bit 2: import on device 0 rather than the peer's.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    Harness &h = *g_harness;
    const uint8_t ctl = data[0];
    wire::LocalIpc e{};
    memcpy(&e, data + 1, std::min(size - 1, sizeof e));
    if (ctl & 1) memcpy(e.handle, h.owned.handle, sizeof e.handle);
    uint64_t peer = (ctl & 2) ? uint64_t(h.owned.pid) : e.buffer_id ^ e.addr;
    void *addr = nullptr;
    hmem::MemRef mem;
    int ret = hmem::import_ipc_entry(h.cache, peer, (ctl & 4) ? 0 : UINT64_MAX, e, &addr, &mem);
    if (ret || e.length == 0) return 0;  // (an empty range may end where the mapping does)
    // Accepted: the range lies in one mapping of the driver's, and can be copied.
    CUdeviceptr base = 0;
    size_t length = 0;
    if (h.cu.mem_get_address_range(&base, &length, reinterpret_cast<CUdeviceptr>(addr)) !=
        CUDA_SUCCESS)
        abort();
    auto a = reinterpret_cast<uintptr_t>(addr);
    if (a < base || e.length > base + length - a) abort();
    std::vector<uint8_t> out(std::min<uint64_t>(e.length, kAllocSize));
    if (hmem::copy(hmem::kHost, out.data(), mem, addr, out.size()) != 0) abort();
    return 0;
}
