// The emulated CUDA driver of the tests: built as libcuda.so.1 (test code, never shipped) and
// loaded instead of the real driver through the library path. It implements the driver calls
// of TANDEM_CUDA_DRIVER_CALLS (hmem/cuda_abi.h) with the real driver's semantics and error codes
// where they apply, on a machine without a GPU:
//
// - "Device memory" is a POSIX shared-memory object mapped twice: PROT_NONE (that address is the
//   CUdeviceptr, so the CPU touching device memory crashes the test) and read-write, a private
//   alias that only the copy engine below uses. Another process maps the same object through an
//   IPC handle, which carries the object's name.
// - The copy engine and the stream memory operations run on the calling thread, inside the
//   driver calls: a stream is a FIFO of pending operations, progressed head first (stopping at an
//   unsatisfied wait-value) on every call that touches streams, events or copies. Nothing runs
//   in the background; a synchronizing call re-checks with a short sleep and gives up with
//   CUDA_ERROR_UNKNOWN after EMUCUDA_SYNC_TIMEOUT_MS instead of hanging.
// - The legacy null stream (0) keeps its implicit synchronization: an operation on it waits for
//   the work issued before it to the context's blocking streams (created without
//   CU_STREAM_NON_BLOCKING), and an operation on a blocking stream waits for the null stream's.
//   The synchronous copies (cuMemcpyHtoD/DtoH/DtoD) are null-stream operations of the current
//   context and return once done.
//
// Where the real driver leaves room, or cannot be followed without a GPU:
// - Allocations are zero-filled (posix_fallocate reserves the memory, so a full /dev/shm is
//   CUDA_ERROR_OUT_OF_MEMORY at cuMemAlloc rather than SIGBUS later) and page-granular; the
//   pointer attributes report the size as requested. EMUCUDA_MEM_LIMIT counts requested sizes.
// - The last cuDevicePrimaryCtxRelease of a device destroys what lives in its context, as the
//   real driver does: allocations, IPC mappings opened in it, streams, events, peer access.
//   Stale stream and event handles give CUDA_ERROR_INVALID_HANDLE, never a crash.
// - A current context is needed by cuMemAlloc, cuStreamCreate, cuEventCreate,
//   cuIpcOpenMemHandle, cuCtxEnablePeerAccess, the synchronous copies and anything on the null
//   stream (CUDA_ERROR_INVALID_CONTEXT without one); an explicit stream carries its context.
// - An IPC mapping gets a fresh buffer id of the opening process (from the same counter as its
//   allocations: ids stay unique per process); its device ordinal is the owner's device and its
//   context the one current at the first open. A handle names the allocation whatever address
//   inside it was given; opening it returns the mapping's base.
// - cuMemGetHandleForAddressRange wants page-aligned ptr and size (as the real driver does), and
//   the range must start at the allocation's base: the fd is the whole shared-memory object,
//   whose offset 0 is the base (other starts: CUDA_ERROR_NOT_SUPPORTED). The size may round the
//   allocation up to whole pages.
// - cuMemGetAddressRange gives CUDA_ERROR_INVALID_VALUE for memory it does not know (the real
//   driver's CUDA_ERROR_NOT_FOUND is not in cuda_abi.h).
// - A synchronous copy that gives up (sync timeout) keeps its place in the null stream but
//   never runs: the caller's host buffer may be gone by then.
// - The library is linked -z nodelete: the "device" outlives a dlclose.
//
// Environment and test control: see emucuda_control.h.
#include "hmem/cuda_abi.h"
#include "tests/emucuda/emucuda_control.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

// The exported driver calls, declared from the same list the loader of the providers uses.
#define EMUCUDA_DECLARE(field, sym, ret, params) extern "C" EMUCUDA_EXPORT ret sym params;
TANDEM_CUDA_DRIVER_CALLS(EMUCUDA_DECLARE)
#undef EMUCUDA_DECLARE

namespace emucuda {

constexpr int kMaxDevices = 16;
constexpr unsigned kDefaultSyncTimeoutMs = 10000;
constexpr int kDriverVersion = 13000;
// What the device reports of itself: a compute capability of a current data-centre GPU, and
// 16 GiB of memory unless EMUCUDA_MEM_LIMIT says less.
constexpr int kComputeMajor = 9;
constexpr int kComputeMinor = 0;
constexpr std::size_t kDefaultTotalMem = std::size_t{16} << 30;

// The IPC handle's 64 bytes.
constexpr std::uint32_t kIpcMagic = 0x55434d45;  // "EMCU"
constexpr std::uint32_t kIpcVersion = 1;
constexpr char kShmPrefix[] = "/emucuda-";
struct IpcWire {
    std::uint32_t magic;
    std::uint32_t version;
    std::int32_t pid;  // the process that allocated (and owns) the memory
    std::int32_t device;
    std::uint64_t buffer_id;  // the owner's buffer id
    std::uint64_t size;       // the allocation's size as requested
    char name[32];            // the shared-memory object, NUL-terminated
};
static_assert(sizeof(IpcWire) == kCuIpcHandleSize);

// Device memory of this process: an allocation, or another process's allocation opened through
// an IPC handle. Unmapped when the last reference goes (queued operations hold one).
struct Mapping {
    bool ipc = false;
    char *dev = nullptr;     // the CUdeviceptr, PROT_NONE
    char *alias = nullptr;   // read-write, for the copy engine
    std::size_t size = 0;    // as requested (the range the pointer attributes report)
    std::size_t length = 0;  // mapped: size rounded up to pages
    int fd = -1;             // the shared-memory object (dma-buf export dups it)
    std::uint64_t buffer_id = 0;
    int device = 0;
    CUctx_st *ctx = nullptr;
    std::string name;
    pid_t owner_pid = 0;             // who created the object
    std::uint64_t owner_buffer = 0;  // IPC: the owner's buffer id
    int refs = 0;                    // IPC: opens not yet closed

    Mapping() = default;
    Mapping(const Mapping &) = delete;
    Mapping &operator=(const Mapping &) = delete;
    ~Mapping() {
        if (dev) munmap(dev, length);
        if (alias) munmap(alias, length);
        if (fd >= 0) close(fd);
    }
};

enum class OpKind : std::uint8_t { kCopy, kWrite32, kWait32, kWrite64, kWait64, kRecord };

// "Done once that stream has completed the operation with that sequence number"; a stream that
// no longer exists has nothing left to do.
struct Dep {
    std::weak_ptr<CUstream_st> stream;
    std::uint64_t seq;
};

struct Op {
    OpKind kind = OpKind::kCopy;
    bool cancelled =
        false;  // a synchronous copy whose caller gave up: keeps its place, does nothing
    std::uint64_t seq = 0;
    std::vector<Dep> deps;             // the legacy null stream's implicit synchronization
    std::shared_ptr<Mapping> keep[2];  // device memory the operation touches stays mapped
    // kCopy
    void *dst = nullptr;
    const void *src = nullptr;
    std::size_t size = 0;
    // kWrite32, kWait32, kWrite64, kWait64 (a 64-bit word: word64)
    std::uint32_t *word = nullptr;
    std::uint64_t *word64 = nullptr;
    std::uint64_t value = 0;
    unsigned cond = 0;
    // kRecord
    std::weak_ptr<CUevent_st> event;
    std::uint64_t record = 0;
};

}  // namespace emucuda

// The driver's opaque handle types, defined here.
struct CUctx_st {
    int device = 0;
    int refs = 0;            // primary context retains; 0: inactive (not usable)
    std::vector<char> peer;  // peer[d]: peer access to device d's context enabled
    std::shared_ptr<CUstream_st> null_stream;
};

struct CUstream_st {
    CUctx_st *ctx = nullptr;
    unsigned flags = 0;
    bool is_null = false;
    bool destroyed = false;  // the handle is gone; kept until its queue has drained
    std::deque<emucuda::Op> queue;
    std::uint64_t enqueued = 0;   // sequence number of the last operation queued
    std::uint64_t completed = 0;  // ... and of the last one that left the queue
};

struct CUevent_st {
    CUctx_st *ctx = nullptr;
    unsigned flags = 0;
    std::uint64_t recorded = 0;  // records issued
    std::uint64_t done = 0;      // the latest record that has completed
};

namespace emucuda {
namespace {

#define EMUCUDA_COUNTERS(X) \
    X(allocs)               \
    X(frees)                \
    X(htod_copies)          \
    X(dtoh_copies)          \
    X(dtod_copies)          \
    X(peer_copies)          \
    X(bytes_htod)           \
    X(bytes_dtoh)           \
    X(bytes_dtod)           \
    X(ipc_gets)             \
    X(ipc_opens)            \
    X(ipc_closes)           \
    X(dmabuf_gets)          \
    X(stream_mem_ops)       \
    X(failed_calls)         \
    X(htoh_copies)          \
    X(bytes_htoh)           \
    X(event_records)        \
    X(sync_timeouts)

struct Counters {
#define EMUCUDA_COUNTER(name) std::atomic<unsigned long long> name{0};
    EMUCUDA_COUNTERS(EMUCUDA_COUNTER)
#undef EMUCUDA_COUNTER
};

struct State {
    std::mutex mu;  // guards everything below that is not atomic

    // Configuration: the environment at the first call, then the control API.
    int devices = 1;
    bool dmabuf = true;
    std::atomic<bool> ipc{true};
    std::atomic<bool> peer{true};
    std::atomic<unsigned long long> mem_limit{0};
    std::atomic<unsigned> sync_timeout_ms{kDefaultSyncTimeoutMs};
    // Injected failures (emucuda_fail_after): calls of a kind left to pass before failing
    // ones, calls left to fail, and with what.
    std::atomic<int> pass_copies{0}, pass_ipc_opens{0};
    std::atomic<int> fail_copies{0}, fail_ipc_opens{0};
    std::atomic<CUresult> fail_copy_error{CUDA_ERROR_ILLEGAL_ADDRESS};
    std::atomic<CUresult> fail_ipc_error{CUDA_ERROR_OUT_OF_MEMORY};
    std::size_t page = 4096;

    std::atomic<bool> initialized{false};
    std::vector<std::unique_ptr<CUctx_st>> ctxs;  // the primary contexts, one per device

    std::map<std::uintptr_t, std::shared_ptr<Mapping>> mappings;  // by device address
    std::map<std::pair<pid_t, std::uint64_t>, std::shared_ptr<Mapping>> opened;  // IPC
    std::unordered_map<CUstream_st *, std::shared_ptr<CUstream_st>> streams;     // live handles
    std::vector<std::shared_ptr<CUstream_st>> running;  // every stream incl. null and destroyed
    std::unordered_map<CUevent_st *, std::shared_ptr<CUevent_st>> events;
    std::uint64_t next_buffer_id = 1;
    std::uint64_t next_shm = 0;
    std::uint64_t live_bytes = 0, live_allocs = 0;
    std::set<void *> host_allocs;  // cuMemHostAlloc's (page-locked host memory)

    Counters n;
};

State *g_state = nullptr;
thread_local CUctx_st *t_current = nullptr;

bool env_flag(const char *name, bool dflt) {
    const char *v = std::getenv(name);
    if (!v || !*v) return dflt;
    return std::strcmp(v, "0") != 0;
}

unsigned long long env_number(const char *name, unsigned long long dflt) {
    const char *v = std::getenv(name);
    if (!v || !*v) return dflt;
    char *end = nullptr;
    errno = 0;
    unsigned long long x = std::strtoull(v, &end, 0);
    if (errno || *end || *v == '-') {
        std::fprintf(stderr, "emucuda: ignoring %s=%s (not a number)\n", name, v);
        return dflt;
    }
    return x;
}

void fork_prepare() {
    g_state->mu.lock();
}
void fork_release() {
    g_state->mu.unlock();
}

State *make_state() {
    auto *s = new State;  // never deleted: calls may come from other libraries' destructors
    unsigned long long devices = env_number("EMUCUDA_DEVICES", 1);
    s->devices = devices > kMaxDevices ? kMaxDevices : static_cast<int>(devices);
    s->dmabuf = env_flag("EMUCUDA_DMABUF", true);
    s->ipc = env_flag("EMUCUDA_IPC", true);
    s->peer = env_flag("EMUCUDA_PEER_ACCESS", true);
    s->mem_limit = env_number("EMUCUDA_MEM_LIMIT", 0);
    unsigned long long timeout = env_number("EMUCUDA_SYNC_TIMEOUT_MS", kDefaultSyncTimeoutMs);
    s->sync_timeout_ms = timeout ? static_cast<unsigned>(timeout) : kDefaultSyncTimeoutMs;
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0) s->page = static_cast<std::size_t>(page);
    for (int d = 0; d < s->devices; d++) {
        auto ctx = std::make_unique<CUctx_st>();
        ctx->device = d;
        ctx->peer.assign(s->devices, 0);
        ctx->null_stream = std::make_shared<CUstream_st>();
        ctx->null_stream->ctx = ctx.get();
        ctx->null_stream->is_null = true;
        s->running.push_back(ctx->null_stream);
        s->ctxs.push_back(std::move(ctx));
    }
    g_state = s;
    // A fork never copies the state half-changed.
    pthread_atfork(fork_prepare, fork_release, fork_release);
    return s;
}

State &st() {
    static State *s = make_state();
    return *s;
}

// At exit, the shared-memory objects this process still owns go (the memory goes with the
// process, as with a real driver). Objects inherited from a parent through fork are the parent's.
__attribute__((destructor)) void unlink_at_exit() {
    if (!g_state) return;
    std::unique_lock lk(g_state->mu, std::try_to_lock);
    if (!lk.owns_lock()) return;
    for (auto &[addr, m] : g_state->mappings)
        if (!m->ipc && m->owner_pid == getpid()) shm_unlink(m->name.c_str());
}

CUresult finish(CUresult rc) {
    if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY) st().n.failed_calls++;
    return rc;
}

// A driver call: counted when it fails, CUDA_ERROR_NOT_INITIALIZED before cuInit.
template <class F>
CUresult api(F &&body) {
    State &s = st();
    if (!s.initialized.load()) return finish(CUDA_ERROR_NOT_INITIALIZED);
    return finish(body(s));
}

bool valid_device(const State &s, CUdevice dev) {
    return dev >= 0 && dev < s.devices;
}

CUctx_st *known_ctx(const State &s, CUcontext ctx) {
    for (auto &c : s.ctxs)
        if (c.get() == ctx) return c.get();
    return nullptr;
}

// The calling thread's current context if it is usable. Under s.mu.
CUctx_st *current(const State &) {
    return t_current && t_current->refs > 0 ? t_current : nullptr;
}

// The mapping containing addr (within its requested size). Under s.mu.
std::shared_ptr<Mapping> find(const State &s, std::uintptr_t addr) {
    auto it = s.mappings.upper_bound(addr);
    if (it == s.mappings.begin()) return nullptr;
    --it;
    return addr - it->first < it->second->size ? it->second : nullptr;
}

// The mapping containing all of [addr, addr + n), n > 0.
std::shared_ptr<Mapping> find_range(const State &s, std::uintptr_t addr, std::size_t n) {
    auto m = find(s, addr);
    if (!m) return nullptr;
    std::size_t offset = addr - reinterpret_cast<std::uintptr_t>(m->dev);
    return n <= m->size - offset ? m : nullptr;
}

char *alias_of(const Mapping &m, std::uintptr_t addr) {
    return m.alias + (addr - reinterpret_cast<std::uintptr_t>(m.dev));
}

// Maps a shared-memory object as device memory: PROT_NONE, and the read-write alias.
bool map_object(Mapping &m) {
    void *dev = mmap(nullptr, m.length, PROT_NONE, MAP_SHARED, m.fd, 0);
    if (dev == MAP_FAILED) return false;
    void *alias = mmap(nullptr, m.length, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
    if (alias == MAP_FAILED) {
        munmap(dev, m.length);
        return false;
    }
    m.dev = static_cast<char *>(dev);
    m.alias = static_cast<char *>(alias);
    return true;
}

// ---- streams ---------------------------------------------------------------------------------

bool deps_done(const std::vector<Dep> &deps) {
    for (const Dep &d : deps) {
        auto s = d.stream.lock();
        if (s && s->completed < d.seq) return false;
    }
    return true;
}

// The driver's wait-value conditions, on a word of 32 or 64 bits (GEQ compares the way the
// driver documents it: (int)(value - ref) >= 0, wrap-around included).
template <class U, class S>
bool condition_holds(U v, U ref, unsigned cond) {
    switch (cond) {
        case CU_STREAM_WAIT_VALUE_GEQ:
            return static_cast<S>(v - ref) >= 0;
        case CU_STREAM_WAIT_VALUE_EQ:
            return v == ref;
        case 2:  // CU_STREAM_WAIT_VALUE_AND
            return (v & ref) != 0;
        default:  // 3: CU_STREAM_WAIT_VALUE_NOR
            return static_cast<U>(~(v | ref)) != 0;
    }
}

bool wait_satisfied(const Op &op) {
    if (op.kind == OpKind::kWait64)
        return condition_holds<std::uint64_t, std::int64_t>(
            __atomic_load_n(op.word64, __ATOMIC_ACQUIRE), op.value, op.cond);
    return condition_holds<std::uint32_t, std::int32_t>(
        __atomic_load_n(op.word, __ATOMIC_ACQUIRE), static_cast<std::uint32_t>(op.value), op.cond);
}

bool ready(const Op &op) {
    if (!deps_done(op.deps)) return false;
    const bool waits = op.kind == OpKind::kWait32 || op.kind == OpKind::kWait64;
    return !waits || op.cancelled || wait_satisfied(op);
}

void run(Op &op) {
    if (op.cancelled) return;
    switch (op.kind) {
        case OpKind::kCopy:
            std::memmove(op.dst, op.src, op.size);
            break;
        case OpKind::kWrite32:
            __atomic_store_n(op.word, static_cast<std::uint32_t>(op.value), __ATOMIC_RELEASE);
            break;
        case OpKind::kWrite64:
            __atomic_store_n(op.word64, op.value, __ATOMIC_RELEASE);
            break;
        case OpKind::kWait32:
        case OpKind::kWait64:
            break;
        case OpKind::kRecord:
            if (auto e = op.event.lock(); e && e->recorded == op.record) e->done = op.record;
            break;
    }
}

// Runs every operation that can run, in stream order, until nothing changes. Under s.mu.
void progress(State &s) {
    for (bool changed = true; changed;) {
        changed = false;
        for (std::size_t i = 0; i < s.running.size(); i++) {
            CUstream_st &q = *s.running[i];
            while (!q.queue.empty() && ready(q.queue.front())) {
                run(q.queue.front());
                q.completed = q.queue.front().seq;
                q.queue.pop_front();
                changed = true;
            }
        }
    }
    std::erase_if(s.running, [](const auto &q) { return q->destroyed && q->queue.empty(); });
}

bool blocking(const CUstream_st &q) {
    return !q.is_null && !(q.flags & CU_STREAM_NON_BLOCKING);
}

// What an operation issued now to stream q waits for besides q's own earlier work: the legacy
// null stream's implicit synchronization with the blocking streams of its context.
std::vector<Dep> legacy_deps(const State &s, const CUstream_st &q) {
    std::vector<Dep> deps;
    if (q.is_null) {
        for (auto &other : s.running)
            if (other->ctx == q.ctx && blocking(*other) && other->completed < other->enqueued)
                deps.push_back({other, other->enqueued});
    } else if (blocking(q)) {
        auto &null = q.ctx->null_stream;
        if (null->completed < null->enqueued) deps.push_back({null, null->enqueued});
    }
    return deps;
}

// What a query or synchronization of q waits for: everything issued to q so far (whose
// operations carry their own implicit dependencies), and for the null stream, as if a marker were
// issued to it now, the work of the blocking streams.
std::vector<Dep> issued_so_far(const State &s, const std::shared_ptr<CUstream_st> &q) {
    std::vector<Dep> deps;
    if (q->is_null) deps = legacy_deps(s, *q);
    deps.push_back({q, q->enqueued});
    return deps;
}

std::uint64_t enqueue(State &s, CUstream_st &q, Op op) {
    op.deps = legacy_deps(s, q);
    op.seq = ++q.enqueued;
    q.queue.push_back(std::move(op));
    progress(s);
    return q.enqueued;
}

// Waits (progressing all streams, the lock released while sleeping) until done() holds, or
// gives up after the sync timeout.
template <class Done>
CUresult wait_for(std::unique_lock<std::mutex> &lk, State &s, Done &&done) {
    using Clock = std::chrono::steady_clock;
    auto deadline = Clock::now() + std::chrono::milliseconds(s.sync_timeout_ms.load());
    for (;;) {
        progress(s);
        if (done()) return CUDA_SUCCESS;
        if (Clock::now() >= deadline) {
            s.n.sync_timeouts++;
            return CUDA_ERROR_UNKNOWN;
        }
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        lk.lock();
    }
}

// The stream a call names: 0 is the null stream of the current context.
CUresult resolve_stream(State &s, CUstream h, std::shared_ptr<CUstream_st> &out) {
    if (!h) {
        CUctx_st *ctx = current(s);
        if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
        out = ctx->null_stream;
        return CUDA_SUCCESS;
    }
    auto it = s.streams.find(h);
    if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    out = it->second;
    return CUDA_SUCCESS;
}

// ---- contexts --------------------------------------------------------------------------------

// The last release of a primary context destroys what lives in it, as the real driver does:
// its allocations and IPC mappings, streams and events, and the peer access to and from it.
void reset_context(State &s, CUctx_st *ctx) {
    for (auto it = s.mappings.begin(); it != s.mappings.end();) {
        Mapping &m = *it->second;
        if (m.ctx != ctx) {
            ++it;
            continue;
        }
        if (m.ipc) {
            s.opened.erase({m.owner_pid, m.owner_buffer});
        } else {
            shm_unlink(m.name.c_str());
            s.live_bytes -= m.size;
            s.live_allocs--;
        }
        it = s.mappings.erase(it);
    }
    std::erase_if(s.streams, [ctx](const auto &kv) { return kv.second->ctx == ctx; });
    std::erase_if(s.running, [ctx](const auto &q) { return q->ctx == ctx && !q->is_null; });
    ctx->null_stream->queue.clear();
    ctx->null_stream->completed = ctx->null_stream->enqueued;
    std::erase_if(s.events, [ctx](const auto &kv) { return kv.second->ctx == ctx; });
    for (auto &c : s.ctxs) c->peer[ctx->device] = 0;
    std::fill(ctx->peer.begin(), ctx->peer.end(), 0);
    progress(s);
}

// ---- copies ----------------------------------------------------------------------------------

enum class Side { kAny, kDevice, kHost };

// One copy of n bytes: each side is device memory (the whole range inside one mapping) or host
// memory (anything else, accessed with a plain memcpy). Side::kHost takes the address as host
// memory without asking, as the real driver's cuMemcpyDtoH/HtoD do.
// Whether this call fails by injection: while failures are armed, the first `pass` calls
// still succeed.
bool injected_failure(std::atomic<int> &pass, std::atomic<int> &fail) {
    if (fail.load() <= 0) return false;
    if (pass.load() > 0 && pass.fetch_sub(1) > 0) return false;
    return fail.fetch_sub(1) > 0;
}

CUresult copy(std::unique_lock<std::mutex> &lk, State &s, CUstream h, std::uintptr_t dst,
              Side dst_side, std::uintptr_t src, Side src_side, std::size_t n, bool sync) {
    if (injected_failure(s.pass_copies, s.fail_copies)) return s.fail_copy_error.load();
    std::shared_ptr<CUstream_st> q;
    if (CUresult rc = resolve_stream(s, h, q); rc != CUDA_SUCCESS) return rc;
    Op op;
    op.kind = OpKind::kCopy;
    op.size = n;
    std::uintptr_t addr[2] = {dst, src};
    Side side[2] = {dst_side, src_side};
    void *local[2] = {};
    for (int i = 0; i < 2; i++) {
        if (side[i] == Side::kAny) side[i] = find(s, addr[i]) ? Side::kDevice : Side::kHost;
        if (side[i] == Side::kDevice) {
            if (n == 0) {
                if (!find(s, addr[i])) return CUDA_ERROR_INVALID_VALUE;
                continue;
            }
            op.keep[i] = find_range(s, addr[i], n);
            if (!op.keep[i]) return CUDA_ERROR_INVALID_VALUE;
            local[i] = alias_of(*op.keep[i], addr[i]);
        } else {
            if (!addr[i] && n) return CUDA_ERROR_INVALID_VALUE;
            local[i] = reinterpret_cast<void *>(addr[i]);
        }
    }
    if (n == 0) return CUDA_SUCCESS;
    op.dst = local[0];
    op.src = local[1];
    bool dst_dev = side[0] == Side::kDevice, src_dev = side[1] == Side::kDevice;
    if (dst_dev && src_dev) {
        s.n.dtod_copies++;
        s.n.bytes_dtod += n;
        if (op.keep[0]->device != op.keep[1]->device) s.n.peer_copies++;
    } else if (dst_dev) {
        s.n.htod_copies++;
        s.n.bytes_htod += n;
    } else if (src_dev) {
        s.n.dtoh_copies++;
        s.n.bytes_dtoh += n;
    } else {
        s.n.htoh_copies++;
        s.n.bytes_htoh += n;
    }
    std::uint64_t seq = enqueue(s, *q, std::move(op));
    if (!sync) return CUDA_SUCCESS;
    CUresult rc = wait_for(lk, s, [&] { return q->completed >= seq; });
    if (rc != CUDA_SUCCESS) {
        // The caller's host buffer may go away: the copy keeps its place but never runs.
        for (Op &pending : q->queue)
            if (pending.seq == seq) {
                pending.cancelled = true;
                pending.keep[0].reset();
                pending.keep[1].reset();
            }
    }
    return rc;
}

CUresult sync_copy(std::uintptr_t dst, Side dst_side, std::uintptr_t src, Side src_side,
                   std::size_t n) {
    return api([&](State &s) -> CUresult {
        std::unique_lock lk(s.mu);
        return copy(lk, s, nullptr, dst, dst_side, src, src_side, n, true);
    });
}

// ---- memory ----------------------------------------------------------------------------------

CUresult allocate(State &s, CUctx_st *ctx, std::size_t size, CUdeviceptr *out) {
    unsigned long long limit = s.mem_limit.load();
    if (limit && (size > limit || s.live_bytes > limit - size)) return CUDA_ERROR_OUT_OF_MEMORY;
    auto m = std::make_shared<Mapping>();
    m->size = size;
    m->length = (size + s.page - 1) / s.page * s.page;
    if (m->length < size) return CUDA_ERROR_OUT_OF_MEMORY;
    m->owner_pid = getpid();
    for (int attempt = 0; attempt < 100 && m->fd < 0; attempt++) {
        char name[sizeof(IpcWire::name)];
        int len = std::snprintf(name, sizeof name, "%s%x-%llx", kShmPrefix,
                                static_cast<unsigned>(m->owner_pid),
                                static_cast<unsigned long long>(s.next_shm++));
        if (len < 0 || static_cast<std::size_t>(len) >= sizeof name) return CUDA_ERROR_UNKNOWN;
        m->fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (m->fd >= 0)
            m->name = name;
        else if (errno != EEXIST)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (m->fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    // Reserved now, so that a full /dev/shm is an allocation failure rather than a SIGBUS later.
    if (posix_fallocate(m->fd, 0, static_cast<off_t>(m->length)) != 0 || !map_object(*m)) {
        shm_unlink(m->name.c_str());
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->buffer_id = s.next_buffer_id++;
    m->device = ctx->device;
    m->ctx = ctx;
    s.live_bytes += size;
    s.live_allocs++;
    s.mappings.emplace(reinterpret_cast<std::uintptr_t>(m->dev), m);
    s.n.allocs++;
    *out = reinterpret_cast<CUdeviceptr>(m->dev);
    return CUDA_SUCCESS;
}

struct ErrorName {
    CUresult code;
    const char *name;
};
constexpr ErrorName kErrorNames[] = {
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

}  // namespace
}  // namespace emucuda

using emucuda::api;
using emucuda::Side;
using emucuda::State;
using emucuda::t_current;

// ---- the driver calls ----------------------------------------------------------------------

CUresult cuInit(unsigned flags) {
    State &s = emucuda::st();
    if (flags != 0) return emucuda::finish(CUDA_ERROR_INVALID_VALUE);
    s.initialized = true;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    emucuda::st();
    if (!version) return emucuda::finish(CUDA_ERROR_INVALID_VALUE);
    *version = emucuda::kDriverVersion;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    emucuda::st();
    if (!name) return emucuda::finish(CUDA_ERROR_INVALID_VALUE);
    for (const auto &e : emucuda::kErrorNames)
        if (e.code == error) {
            *name = e.name;
            return CUDA_SUCCESS;
        }
    *name = nullptr;
    return emucuda::finish(CUDA_ERROR_INVALID_VALUE);
}

// The name stands for the description: the emulator has no longer text of its own.
CUresult cuGetErrorString(CUresult error, const char **str) {
    return cuGetErrorName(error, str);
}

CUresult cuDeviceGetCount(int *count) {
    return api([&](State &s) -> CUresult {
        if (!count) return CUDA_ERROR_INVALID_VALUE;
        *count = s.devices;
        return CUDA_SUCCESS;
    });
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    return api([&](State &s) -> CUresult {
        if (!dev) return CUDA_ERROR_INVALID_VALUE;
        if (!emucuda::valid_device(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
        *dev = ordinal;
        return CUDA_SUCCESS;
    });
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    return api([&](State &s) -> CUresult {
        if (!value) return CUDA_ERROR_INVALID_VALUE;
        if (!emucuda::valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
        switch (attribute) {
            case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
                *value = 1;
                return CUDA_SUCCESS;
            case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
                *value = dev + 1;
                return CUDA_SUCCESS;
            case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED:
                *value = s.dmabuf ? 1 : 0;
                return CUDA_SUCCESS;
            case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
                *value = emucuda::kComputeMajor;
                return CUDA_SUCCESS;
            case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
                *value = emucuda::kComputeMinor;
                return CUDA_SUCCESS;
            default:
                return CUDA_ERROR_INVALID_VALUE;
        }
    });
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    return api([&](State &s) -> CUresult {
        if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
        if (!emucuda::valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
        snprintf(name, static_cast<std::size_t>(len), "tandem emulated GPU %d", dev);
        return CUDA_SUCCESS;
    });
}

CUresult cuDeviceTotalMem_v2(std::size_t *bytes, CUdevice dev) {
    return api([&](State &s) -> CUresult {
        if (!bytes) return CUDA_ERROR_INVALID_VALUE;
        if (!emucuda::valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
        unsigned long long limit = s.mem_limit.load();
        *bytes = limit ? static_cast<std::size_t>(limit) : emucuda::kDefaultTotalMem;
        return CUDA_SUCCESS;
    });
}

CUresult cuDeviceCanAccessPeer(int *can_access, CUdevice dev, CUdevice peer_dev) {
    return api([&](State &s) -> CUresult {
        if (!can_access) return CUDA_ERROR_INVALID_VALUE;
        if (!emucuda::valid_device(s, dev) || !emucuda::valid_device(s, peer_dev))
            return CUDA_ERROR_INVALID_DEVICE;
        *can_access = dev != peer_dev && s.peer.load() ? 1 : 0;
        return CUDA_SUCCESS;
    });
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    return api([&](State &s) -> CUresult {
        if (!ctx) return CUDA_ERROR_INVALID_VALUE;
        if (!emucuda::valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
        std::lock_guard lk(s.mu);
        CUctx_st *c = s.ctxs[dev].get();
        c->refs++;
        *ctx = c;
        return CUDA_SUCCESS;
    });
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    return api([&](State &s) -> CUresult {
        if (!emucuda::valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
        std::lock_guard lk(s.mu);
        CUctx_st *c = s.ctxs[dev].get();
        if (c->refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
        if (--c->refs == 0) emucuda::reset_context(s, c);
        return CUDA_SUCCESS;
    });
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    return api([&](State &s) -> CUresult {
        if (!ctx) {
            t_current = nullptr;
            return CUDA_SUCCESS;
        }
        std::lock_guard lk(s.mu);
        CUctx_st *c = emucuda::known_ctx(s, ctx);
        if (!c || c->refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
        t_current = c;
        return CUDA_SUCCESS;
    });
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
    return api([&](State &) -> CUresult {
        if (!ctx) return CUDA_ERROR_INVALID_VALUE;
        *ctx = t_current;
        return CUDA_SUCCESS;
    });
}

CUresult cuCtxGetDevice(CUdevice *dev) {
    return api([&](State &s) -> CUresult {
        if (!dev) return CUDA_ERROR_INVALID_VALUE;
        std::lock_guard lk(s.mu);
        CUctx_st *c = emucuda::current(s);
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        *dev = c->device;
        return CUDA_SUCCESS;
    });
}

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
    return api([&](State &s) -> CUresult {
        std::lock_guard lk(s.mu);
        CUctx_st *c = emucuda::current(s);
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        CUctx_st *p = emucuda::known_ctx(s, peer);
        if (!p || p->refs == 0 || p == c) return CUDA_ERROR_INVALID_CONTEXT;
        if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
        if (!s.peer.load()) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
        if (c->peer[p->device]) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        c->peer[p->device] = 1;
        return CUDA_SUCCESS;
    });
}

CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
    return api([&](State &s) -> CUresult {
        if (!data) return CUDA_ERROR_INVALID_VALUE;
        std::lock_guard lk(s.mu);
        auto m = emucuda::find(s, ptr);
        if (!m) return CUDA_ERROR_INVALID_VALUE;  // host memory: not registered with the driver
        switch (attribute) {
            case CU_POINTER_ATTRIBUTE_CONTEXT:
                *static_cast<CUcontext *>(data) = m->ctx;
                return CUDA_SUCCESS;
            case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
                *static_cast<unsigned *>(data) = CU_MEMORYTYPE_DEVICE;
                return CUDA_SUCCESS;
            case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
                *static_cast<CUdeviceptr *>(data) = ptr;
                return CUDA_SUCCESS;
            case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
            case CU_POINTER_ATTRIBUTE_MAPPED:
                *static_cast<unsigned *>(data) = 1;
                return CUDA_SUCCESS;
            case CU_POINTER_ATTRIBUTE_IS_MANAGED:
                *static_cast<unsigned *>(data) = 0;
                return CUDA_SUCCESS;
            case CU_POINTER_ATTRIBUTE_BUFFER_ID:
                *static_cast<unsigned long long *>(data) = m->buffer_id;
                return CUDA_SUCCESS;
            case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
                *static_cast<int *>(data) = m->device;
                return CUDA_SUCCESS;
            case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
                *static_cast<CUdeviceptr *>(data) = reinterpret_cast<CUdeviceptr>(m->dev);
                return CUDA_SUCCESS;
            case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
                *static_cast<std::size_t *>(data) = m->size;
                return CUDA_SUCCESS;
            default:  // incl. HOST_POINTER: device memory is not mapped for the host
                return CUDA_ERROR_INVALID_VALUE;
        }
    });
}

// SYNC_MEMOPS is the one attribute a program sets (fabtests does, on every allocation): the
// emulator's copies are always synchronous with respect to other memory operations already.
CUresult cuPointerSetAttribute(const void *value, int attribute, CUdeviceptr ptr) {
    return api([&](State &s) -> CUresult {
        if (!value) return CUDA_ERROR_INVALID_VALUE;
        std::lock_guard lk(s.mu);
        if (!emucuda::find(s, ptr)) return CUDA_ERROR_INVALID_VALUE;
        return attribute == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS ? CUDA_SUCCESS
                                                             : CUDA_ERROR_INVALID_VALUE;
    });
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, std::size_t *size, CUdeviceptr ptr) {
    return api([&](State &s) -> CUresult {
        std::lock_guard lk(s.mu);
        auto m = emucuda::find(s, ptr);
        if (!m) return CUDA_ERROR_INVALID_VALUE;  // the real driver says CUDA_ERROR_NOT_FOUND
        if (base) *base = reinterpret_cast<CUdeviceptr>(m->dev);
        if (size) *size = m->size;
        return CUDA_SUCCESS;
    });
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, std::size_t size) {
    return api([&](State &s) -> CUresult {
        if (!ptr) return CUDA_ERROR_INVALID_VALUE;
        std::lock_guard lk(s.mu);
        CUctx_st *c = emucuda::current(s);
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        if (size == 0) return CUDA_ERROR_INVALID_VALUE;
        return emucuda::allocate(s, c, size, ptr);
    });
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
    return api([&](State &s) -> CUresult {
        std::lock_guard lk(s.mu);
        auto it = s.mappings.find(ptr);
        if (it == s.mappings.end() || it->second->ipc) return CUDA_ERROR_INVALID_VALUE;
        emucuda::Mapping &m = *it->second;
        shm_unlink(m.name.c_str());
        s.live_bytes -= m.size;
        s.live_allocs--;
        s.mappings.erase(it);  // unmapped now, or when the last queued operation on it has run
        s.n.frees++;
        return CUDA_SUCCESS;
    });
}

// Page-locked host memory: plain host memory here (nothing to lock without a device), counted
// with the allocations so that a leak shows in live_allocs.
CUresult cuMemHostAlloc(void **ptr, std::size_t size, unsigned flags) {
    return api([&](State &s) -> CUresult {
        constexpr unsigned kKnown = 0x1 | 0x2 | 0x4;  // PORTABLE, DEVICEMAP, WRITECOMBINED
        if (!ptr || size == 0 || (flags & ~kKnown)) return CUDA_ERROR_INVALID_VALUE;
        std::lock_guard lk(s.mu);
        if (!emucuda::current(s)) return CUDA_ERROR_INVALID_CONTEXT;
        void *p = std::calloc(1, size);
        if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
        s.host_allocs.insert(p);
        s.live_allocs++;
        s.n.allocs++;
        *ptr = p;
        return CUDA_SUCCESS;
    });
}

CUresult cuMemFreeHost(void *ptr) {
    return api([&](State &s) -> CUresult {
        std::lock_guard lk(s.mu);
        if (!s.host_allocs.erase(ptr)) return CUDA_ERROR_INVALID_VALUE;
        std::free(ptr);
        s.live_allocs--;
        s.n.frees++;
        return CUDA_SUCCESS;
    });
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, std::size_t size) {
    return emucuda::sync_copy(dst, Side::kDevice, reinterpret_cast<std::uintptr_t>(src),
                              Side::kHost, size);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, std::size_t size) {
    return emucuda::sync_copy(reinterpret_cast<std::uintptr_t>(dst), Side::kHost, src,
                              Side::kDevice, size);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t size) {
    return emucuda::sync_copy(dst, Side::kDevice, src, Side::kDevice, size);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, std::size_t size, CUstream stream) {
    return api([&](State &s) -> CUresult {
        std::unique_lock lk(s.mu);
        return emucuda::copy(lk, s, stream, dst, Side::kAny, src, Side::kAny, size, false);
    });
}

CUresult cuStreamCreate(CUstream *stream, unsigned flags) {
    return api([&](State &s) -> CUresult {
        if (!stream || (flags & ~CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
        std::lock_guard lk(s.mu);
        CUctx_st *c = emucuda::current(s);
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        auto q = std::make_shared<CUstream_st>();
        q->ctx = c;
        q->flags = flags;
        s.streams.emplace(q.get(), q);
        s.running.push_back(q);
        *stream = q.get();
        return CUDA_SUCCESS;
    });
}

CUresult cuStreamQuery(CUstream stream) {
    return api([&](State &s) -> CUresult {
        std::lock_guard lk(s.mu);
        std::shared_ptr<CUstream_st> q;
        if (CUresult rc = emucuda::resolve_stream(s, stream, q); rc != CUDA_SUCCESS) return rc;
        emucuda::progress(s);
        return emucuda::deps_done(emucuda::issued_so_far(s, q)) ? CUDA_SUCCESS
                                                                : CUDA_ERROR_NOT_READY;
    });
}

CUresult cuStreamSynchronize(CUstream stream) {
    return api([&](State &s) -> CUresult {
        std::unique_lock lk(s.mu);
        std::shared_ptr<CUstream_st> q;
        if (CUresult rc = emucuda::resolve_stream(s, stream, q); rc != CUDA_SUCCESS) return rc;
        auto targets = emucuda::issued_so_far(s, q);
        return emucuda::wait_for(lk, s, [&] { return emucuda::deps_done(targets); });
    });
}

CUresult cuStreamDestroy_v2(CUstream stream) {
    return api([&](State &s) -> CUresult {
        std::lock_guard lk(s.mu);
        auto it = s.streams.find(stream);
        if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
        it->second->destroyed = true;  // its pending work still runs, then it goes
        s.streams.erase(it);
        emucuda::progress(s);
        return CUDA_SUCCESS;
    });
}

namespace emucuda {
namespace {
CUresult stream_mem_op(OpKind kind, CUstream stream, CUdeviceptr addr, std::uint64_t value,
                       unsigned cond, bool flags_valid) {
    const bool wide = kind == OpKind::kWrite64 || kind == OpKind::kWait64;
    const std::size_t width = wide ? sizeof(std::uint64_t) : sizeof(std::uint32_t);
    return api([&](State &s) -> CUresult {
        if (!flags_valid) return CUDA_ERROR_INVALID_VALUE;
        std::lock_guard lk(s.mu);
        std::shared_ptr<CUstream_st> q;
        if (CUresult rc = resolve_stream(s, stream, q); rc != CUDA_SUCCESS) return rc;
        if (addr % width) return CUDA_ERROR_INVALID_VALUE;
        Op op;
        op.kind = kind;
        op.keep[0] = find_range(s, addr, width);
        if (!op.keep[0]) return CUDA_ERROR_INVALID_VALUE;
        void *alias = alias_of(*op.keep[0], addr);
        if (wide)
            op.word64 = static_cast<std::uint64_t *>(alias);
        else
            op.word = static_cast<std::uint32_t *>(alias);
        op.value = value;
        op.cond = cond;
        s.n.stream_mem_ops++;
        enqueue(s, *q, std::move(op));
        return CUDA_SUCCESS;
    });
}
}  // namespace
}  // namespace emucuda

CUresult cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, std::uint32_t value,
                                 unsigned flags) {
    constexpr unsigned kNoMemoryBarrier = 0x1;  // CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER
    return emucuda::stream_mem_op(emucuda::OpKind::kWrite32, stream, addr, value, 0,
                                  !(flags & ~kNoMemoryBarrier));
}

CUresult cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, std::uint32_t value,
                                unsigned flags) {
    constexpr unsigned kFlush = 1u << 30;  // CU_STREAM_WAIT_VALUE_FLUSH
    unsigned cond = flags & ~kFlush;       // GEQ, EQ, AND or NOR
    return emucuda::stream_mem_op(emucuda::OpKind::kWait32, stream, addr, value, cond, cond <= 3);
}

CUresult cuStreamWriteValue64_v2(CUstream stream, CUdeviceptr addr, std::uint64_t value,
                                 unsigned flags) {
    constexpr unsigned kNoMemoryBarrier = 0x1;
    return emucuda::stream_mem_op(emucuda::OpKind::kWrite64, stream, addr, value, 0,
                                  !(flags & ~kNoMemoryBarrier));
}

CUresult cuStreamWaitValue64_v2(CUstream stream, CUdeviceptr addr, std::uint64_t value,
                                unsigned flags) {
    constexpr unsigned kFlush = 1u << 30;
    unsigned cond = flags & ~kFlush;
    return emucuda::stream_mem_op(emucuda::OpKind::kWait64, stream, addr, value, cond, cond <= 3);
}

CUresult cuEventCreate(CUevent *event, unsigned flags) {
    return api([&](State &s) -> CUresult {
        constexpr unsigned kBlockingSync = 0x1, kInterprocess = 0x4;
        if (!event || (flags & ~(kBlockingSync | CU_EVENT_DISABLE_TIMING | kInterprocess)))
            return CUDA_ERROR_INVALID_VALUE;
        if ((flags & kInterprocess) && !(flags & CU_EVENT_DISABLE_TIMING))
            return CUDA_ERROR_INVALID_VALUE;
        std::lock_guard lk(s.mu);
        CUctx_st *c = emucuda::current(s);
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        auto e = std::make_shared<CUevent_st>();
        e->ctx = c;
        e->flags = flags;
        s.events.emplace(e.get(), e);
        *event = e.get();
        return CUDA_SUCCESS;
    });
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
    return api([&](State &s) -> CUresult {
        std::lock_guard lk(s.mu);
        auto it = s.events.find(event);
        if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
        std::shared_ptr<CUstream_st> q;
        if (CUresult rc = emucuda::resolve_stream(s, stream, q); rc != CUDA_SUCCESS) return rc;
        if (q->ctx != it->second->ctx) return CUDA_ERROR_INVALID_HANDLE;
        emucuda::Op op;
        op.kind = emucuda::OpKind::kRecord;
        op.event = it->second;
        op.record = ++it->second->recorded;
        s.n.event_records++;
        emucuda::enqueue(s, *q, std::move(op));
        return CUDA_SUCCESS;
    });
}

CUresult cuEventQuery(CUevent event) {
    return api([&](State &s) -> CUresult {
        std::lock_guard lk(s.mu);
        auto it = s.events.find(event);
        if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
        emucuda::progress(s);
        return it->second->done == it->second->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    });
}

CUresult cuEventSynchronize(CUevent event) {
    return api([&](State &s) -> CUresult {
        std::unique_lock lk(s.mu);
        auto it = s.events.find(event);
        if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
        std::shared_ptr<CUevent_st> e = it->second;
        std::uint64_t target = e->recorded;
        return emucuda::wait_for(lk, s, [&] { return e->done >= target; });
    });
}

CUresult cuEventDestroy_v2(CUevent event) {
    return api([&](State &s) -> CUresult {
        std::lock_guard lk(s.mu);
        return s.events.erase(event) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    });
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr ptr) {
    return api([&](State &s) -> CUresult {
        if (!handle) return CUDA_ERROR_INVALID_VALUE;
        if (!s.ipc.load()) return CUDA_ERROR_NOT_SUPPORTED;
        std::lock_guard lk(s.mu);
        auto m = emucuda::find(s, ptr);
        if (!m || m->ipc) return CUDA_ERROR_INVALID_VALUE;
        emucuda::IpcWire w{};
        w.magic = emucuda::kIpcMagic;
        w.version = emucuda::kIpcVersion;
        w.pid = m->owner_pid;
        w.device = m->device;
        w.buffer_id = m->buffer_id;
        w.size = m->size;
        std::snprintf(w.name, sizeof w.name, "%s", m->name.c_str());
        std::memcpy(handle->reserved, &w, sizeof w);
        s.n.ipc_gets++;
        return CUDA_SUCCESS;
    });
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *ptr, CUipcMemHandle handle, unsigned flags) {
    return api([&](State &s) -> CUresult {
        if (!ptr) return CUDA_ERROR_INVALID_VALUE;
        std::lock_guard lk(s.mu);
        CUctx_st *c = emucuda::current(s);
        if (!c) return CUDA_ERROR_INVALID_CONTEXT;
        if (flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
        if (emucuda::injected_failure(s.pass_ipc_opens, s.fail_ipc_opens))
            return s.fail_ipc_error.load();
        if (!s.ipc.load()) return CUDA_ERROR_NOT_SUPPORTED;
        emucuda::IpcWire w;
        std::memcpy(&w, handle.reserved, sizeof w);
        if (w.magic != emucuda::kIpcMagic || w.version != emucuda::kIpcVersion ||
            !std::memchr(w.name, 0, sizeof w.name) ||
            std::strncmp(w.name, emucuda::kShmPrefix, sizeof emucuda::kShmPrefix - 1) != 0)
            return CUDA_ERROR_INVALID_HANDLE;
        if (w.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // as the real driver says
        if (!emucuda::valid_device(s, w.device)) return CUDA_ERROR_INVALID_DEVICE;
        if (w.device != c->device && !s.peer.load()) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
        if (auto it = s.opened.find({w.pid, w.buffer_id}); it != s.opened.end()) {
            it->second->refs++;
            *ptr = reinterpret_cast<CUdeviceptr>(it->second->dev);
            s.n.ipc_opens++;
            return CUDA_SUCCESS;
        }
        auto m = std::make_shared<emucuda::Mapping>();
        m->fd = shm_open(w.name, O_RDWR | O_CLOEXEC, 0);
        if (m->fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // freed by its owner
        m->size = w.size;
        m->length = (w.size + s.page - 1) / s.page * s.page;
        struct stat sb;
        if (w.size == 0 || fstat(m->fd, &sb) != 0 ||
            static_cast<unsigned long long>(sb.st_size) < m->length)
            return CUDA_ERROR_INVALID_HANDLE;
        if (!emucuda::map_object(*m)) return CUDA_ERROR_MAP_FAILED;
        m->ipc = true;
        m->name = w.name;
        m->buffer_id = s.next_buffer_id++;  // a buffer id of this process, like any mapping
        m->device = w.device;               // where the memory lives
        m->ctx = c;
        m->owner_pid = w.pid;
        m->owner_buffer = w.buffer_id;
        m->refs = 1;
        s.mappings.emplace(reinterpret_cast<std::uintptr_t>(m->dev), m);
        s.opened.emplace(std::make_pair(static_cast<pid_t>(w.pid), w.buffer_id), m);
        s.n.ipc_opens++;
        *ptr = reinterpret_cast<CUdeviceptr>(m->dev);
        return CUDA_SUCCESS;
    });
}

CUresult cuIpcCloseMemHandle(CUdeviceptr ptr) {
    return api([&](State &s) -> CUresult {
        std::lock_guard lk(s.mu);
        auto it = s.mappings.find(ptr);
        if (it == s.mappings.end() || !it->second->ipc) return CUDA_ERROR_INVALID_VALUE;
        s.n.ipc_closes++;
        emucuda::Mapping &m = *it->second;
        if (--m.refs == 0) {
            s.opened.erase({m.owner_pid, m.owner_buffer});
            s.mappings.erase(it);
        }
        return CUDA_SUCCESS;
    });
}

CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr ptr, std::size_t size,
                                       int handle_type, unsigned long long flags) {
    return api([&](State &s) -> CUresult {
        constexpr unsigned long long kMappingTypePcie = 0x1;  // CUDA 12.8+
        if (!handle || handle_type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD ||
            (flags & ~kMappingTypePcie))
            return CUDA_ERROR_INVALID_VALUE;
        if (!s.dmabuf) return CUDA_ERROR_NOT_SUPPORTED;
        std::lock_guard lk(s.mu);
        auto m = emucuda::find(s, ptr);
        if (!m || size == 0 || ptr % s.page || size % s.page) return CUDA_ERROR_INVALID_VALUE;
        // The fd is the whole shared-memory object, whose offset 0 is the allocation's base,
        // where the real driver's covers [ptr, ptr + size): only ranges starting at the base
        // can be exported faithfully.
        if (ptr != reinterpret_cast<CUdeviceptr>(m->dev)) return CUDA_ERROR_NOT_SUPPORTED;
        if (size > m->length) return CUDA_ERROR_INVALID_VALUE;
        int fd = fcntl(m->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) return CUDA_ERROR_UNKNOWN;
        *static_cast<int *>(handle) = fd;
        s.n.dmabuf_gets++;
        return CUDA_SUCCESS;
    });
}

// Every call of the list is defined (with --no-undefined, a missing one fails the link).
#define EMUCUDA_ADDRESS(field, sym, ret, params) reinterpret_cast<void *>(&sym),
[[gnu::used]] static void *const kEveryDriverCall[] = {TANDEM_CUDA_DRIVER_CALLS(EMUCUDA_ADDRESS)};
#undef EMUCUDA_ADDRESS

// ---- test control ----------------------------------------------------------------------------

void emucuda_get_stats(struct emucuda_stats *out) {
    State &s = emucuda::st();
    if (!out) return;
    *out = {};
#define EMUCUDA_COPY(name) out->name = s.n.name.load();
    EMUCUDA_COUNTERS(EMUCUDA_COPY)
#undef EMUCUDA_COPY
    std::lock_guard lk(s.mu);
    out->live_allocs = s.live_allocs;
    out->live_bytes = s.live_bytes;
    out->live_ipc_mappings = s.opened.size();
}

void emucuda_reset_stats(void) {
    State &s = emucuda::st();
#define EMUCUDA_ZERO(name) s.n.name = 0;
    EMUCUDA_COUNTERS(EMUCUDA_ZERO)
#undef EMUCUDA_ZERO
}

void emucuda_set_ipc_enabled(int enabled) {
    emucuda::st().ipc = enabled != 0;
}

void emucuda_set_peer_access(int enabled) {
    emucuda::st().peer = enabled != 0;
}

void emucuda_set_mem_limit(unsigned long long bytes) {
    emucuda::st().mem_limit = bytes;
}

void emucuda_set_sync_timeout_ms(unsigned ms) {
    emucuda::st().sync_timeout_ms = ms ? ms : emucuda::kDefaultSyncTimeoutMs;
}

void emucuda_fail_next(int what, int count, int error) {
    emucuda_fail_after(what, 0, count, error);
}

void emucuda_fail_after(int what, int pass, int count, int error) {
    State &s = emucuda::st();
    if (what == EMUCUDA_FAIL_COPY) {
        s.fail_copy_error = error;
        s.pass_copies = pass;
        s.fail_copies = count;
    } else if (what == EMUCUDA_FAIL_IPC_OPEN) {
        s.fail_ipc_error = error;
        s.pass_ipc_opens = pass;
        s.fail_ipc_opens = count;
    }
}

int emucuda_is_device_address(const void *p) {
    State &s = emucuda::st();
    std::lock_guard lk(s.mu);
    return emucuda::find(s, reinterpret_cast<std::uintptr_t>(p)) ? 1 : 0;
}
