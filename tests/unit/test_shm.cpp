// The node-local channel's building blocks (main_prov/shm/): ShmSegment (named shared memory
// and its stale owners), ShmRing (the MPSC queue inside it), the inbox segment, wake-ups, the
// death verdict on a peer, cross-memory attach, and the channel that holds them together.
#include "common/shm_ring.h"
#include "main_prov/shm/channel.h"
#include "main_prov/shm/cma.h"
#include "main_prov/shm/copy_costs.h"
#include "main_prov/shm/death_verdict.h"
#include "main_prov/shm/inbox_segment.h"
#include "main_prov/shm/outbox.h"
#include "main_prov/shm/peer_inbox.h"
#include "main_prov/shm/send_choice.h"
#include "main_prov/shm/sender_hold.h"
#include "main_prov/shm/shm_segment.h"
#include "main_prov/shm/split_claims.h"
#include "main_prov/shm/wake.h"
#include "peer/peer_abi.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace tandem;

namespace {

using Clock = std::chrono::steady_clock;

// Names no other test run can collide with; anything a failed test leaves behind starts
// with "/tandem-ut-<pid>-".
std::string unique_name(const std::string &what) {
    static int counter = 0;
    return "/tandem-ut-" + std::to_string(::getpid()) + "-" + what + "-" +
           std::to_string(counter++);
}

bool shm_exists(const std::string &name) {
    struct stat st;
    return ::stat(("/dev/shm" + name).c_str(), &st) == 0;
}

mode_t shm_mode(const std::string &name) {
    struct stat st;
    return ::stat(("/dev/shm" + name).c_str(), &st) == 0 ? st.st_mode & 07777 : 0;
}

// The negative errno an operation threw as ShmError, or 0 when it did not throw.
template <class F>
int shm_error_of(F &&operation) {
    try {
        operation();
    } catch (const ShmError &e) {
        return e.err;
    }
    return 0;
}

// A forked child running `body`, whose return value is the exit status (99 for an
// exception). Bodies must not use gtest assertions: they report through the status.
// A child still running when the test ends (e.g. it failed early) is killed and reaped.
class Child {
  public:
    explicit Child(const std::function<int()> &body) {
        pid_ = ::fork();
        if (pid_ == 0) {
            int status = 98;
            try {
                status = body();
            } catch (...) {
                status = 99;
            }
            ::_exit(status);  // no gtest teardown, no destructors of the parent's objects
        }
    }
    Child(const Child &) = delete;
    Child &operator=(const Child &) = delete;
    ~Child() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
    }
    pid_t pid() const { return pid_; }
    bool started() const { return pid_ > 0; }
    // The exit status, or 128 + signal.
    int wait() {
        int status = 0;
        if (::waitpid(pid_, &status, 0) != pid_) return -1;
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }

  private:
    pid_t pid_ = -1;
};

// One-way channel between parent and child for small values; reads time out so that a
// child that died does not hang the test.
class Pipe {
  public:
    Pipe() {
        if (::pipe(fds_) != 0) fds_[0] = fds_[1] = -1;
    }
    Pipe(const Pipe &) = delete;
    Pipe &operator=(const Pipe &) = delete;
    ~Pipe() {
        ::close(fds_[0]);
        ::close(fds_[1]);
    }
    template <class T>
    bool send(const T &value) {
        return ::write(fds_[1], &value, sizeof(T)) == ssize_t(sizeof(T));
    }
    template <class T>
    bool receive(T &value, int timeout_ms = 10000) {
        pollfd p{fds_[0], POLLIN, 0};
        if (::poll(&p, 1, timeout_ms) != 1) return false;
        return ::read(fds_[0], &value, sizeof(T)) == ssize_t(sizeof(T));
    }

  private:
    int fds_[2];
};

}  // namespace

// ---- ShmSegment ---------------------------------------------------------------------------

TEST(ShmSegment, CreatedModeIs0600WhateverTheUmask) {
    // 0277 takes even the owner's write bit: only the fchmod after creation restores it.
    for (mode_t mask : {mode_t(0), mode_t(022), mode_t(077), mode_t(0277)}) {
        std::string name = unique_name("mode");
        mode_t old_mask = ::umask(mask);
        std::optional<ShmSegment> seg;
        int err = shm_error_of([&] { seg.emplace(ShmSegment::create(name, 4096)); });
        ::umask(old_mask);
        ASSERT_EQ(err, 0) << "umask " << std::oct << mask;
        EXPECT_EQ(shm_mode(name), mode_t(0600)) << "umask " << std::oct << mask;
        EXPECT_EQ(shm_error_of([&] { ShmSegment::open(name); }), 0);
    }
}

TEST(ShmSegment, AnotherProcessSeesTheDataAndWritesBack) {
    std::string name = unique_name("shared");
    constexpr size_t kSize = 1 << 16;
    ShmSegment seg = ShmSegment::create(name, kSize);
    ASSERT_EQ(seg.data_size(), kSize);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(seg.data()) % 64, 0u);
    auto *bytes = static_cast<unsigned char *>(seg.data());
    for (size_t i = 0; i < kSize; ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 3);

    Child child([&] {
        ShmSegment opened = ShmSegment::open(name);
        if (opened.is_creator()) return 2;
        if (opened.owner_pid() != ::getppid() || !opened.owner_alive()) return 3;
        if (opened.data_size() != kSize || opened.data() == seg.data()) return 4;
        auto *seen = static_cast<unsigned char *>(opened.data());
        for (size_t i = 0; i < kSize; ++i)
            if (seen[i] != static_cast<unsigned char>(i * 7 + 3)) return 5;
        std::memset(seen, 0xab, 100);
        return 0;
    });
    ASSERT_TRUE(child.started());
    EXPECT_EQ(child.wait(), 0);
    for (size_t i = 0; i < 100; ++i) ASSERT_EQ(bytes[i], 0xab) << i;
    EXPECT_EQ(bytes[100], static_cast<unsigned char>(100 * 7 + 3));
}

TEST(ShmSegment, OpenRefusesASegmentOthersCouldWrite) {
    std::string name = unique_name("perm");
    ShmSegment seg = ShmSegment::create(name, 4096);
    std::string path = "/dev/shm" + name;
    ASSERT_EQ(::chmod(path.c_str(), 0660), 0);
    EXPECT_EQ(shm_error_of([&] { ShmSegment::open(name); }), -EACCES);
    ASSERT_EQ(::chmod(path.c_str(), 0604), 0);
    EXPECT_EQ(shm_error_of([&] { ShmSegment::open(name); }), -EACCES);
    ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
    EXPECT_EQ(shm_error_of([&] { ShmSegment::open(name); }), 0);
}

TEST(ShmSegment, OpenOfAMissingNameThrowsENOENT) {
    std::string name = unique_name("missing");
    EXPECT_EQ(shm_error_of([&] { ShmSegment::open(name); }), -ENOENT);
    // What the provider's ABI boundary turns into -FI_ENOENT.
    try {
        ShmSegment::open(name);
        FAIL() << "open of a missing name succeeded";
    } catch (const FabricError &e) {
        EXPECT_EQ(e.code(), FI_ENOENT);
    }
}

TEST(ShmSegment, OpenOfSomethingElseIsRefused) {
    std::string name = unique_name("foreign");
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(shm_error_of([&] { ShmSegment::open(name); }), -EAGAIN);  // empty: being made
    ASSERT_EQ(::ftruncate(fd, 4096), 0);
    EXPECT_EQ(shm_error_of([&] { ShmSegment::open(name); }), -EAGAIN);  // never made ready
    ::close(fd);
    // Not a tandem segment, so not a stale one either: reaping and creating leave it alone.
    EXPECT_EQ(ShmSegment::reap_stale(name), 0u);
    EXPECT_EQ(shm_error_of([&] { ShmSegment::create(name, 4096); }), -EEXIST);
    EXPECT_TRUE(shm_exists(name));
    ::shm_unlink(name.c_str());
}

TEST(ShmSegment, RejectsBadNamesAndSizes) {
    EXPECT_EQ(shm_error_of([] { ShmSegment::create("no-slash", 64); }), -EINVAL);
    EXPECT_EQ(shm_error_of([] { ShmSegment::create("/a/b", 64); }), -EINVAL);
    EXPECT_EQ(shm_error_of([] { ShmSegment::create("/", 64); }), -EINVAL);
    EXPECT_EQ(shm_error_of([] { ShmSegment::create(unique_name("size"), 0); }), -EINVAL);
    EXPECT_EQ(shm_error_of([] { ShmSegment::create(unique_name("size"), SIZE_MAX); }), -EINVAL);
    EXPECT_EQ(shm_error_of([] { ShmSegment::reap_stale("/"); }), -EINVAL);
}

TEST(ShmSegment, DeadOwnerIsNotAliveAndIsReaped) {
    std::string prefix = unique_name("reap") + "-";
    std::string dead_name = prefix + "dead", live_name = prefix + "live";
    ShmSegment live = ShmSegment::create(live_name, 4096);

    Pipe created;
    Child child([&] {
        ShmSegment seg = ShmSegment::create(dead_name, 4096);
        created.send(1);
        ::_exit(0);  // a crash: the name is never removed
        return 0;
    });
    int signal_value = 0;
    ASSERT_TRUE(created.receive(signal_value));
    ShmSegment seen = ShmSegment::open(dead_name);
    EXPECT_EQ(seen.owner_pid(), child.pid());

    // Not yet reaped by waitpid, the child is a zombie: kill(pid, 0) still succeeds, but it
    // must count as dead.
    auto deadline = Clock::now() + std::chrono::seconds(3);
    while (seen.owner_alive() && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_FALSE(seen.owner_alive()) << "a zombie owner counts as alive";

    EXPECT_EQ(child.wait(), 0);
    EXPECT_FALSE(seen.owner_alive());
    EXPECT_TRUE(live.owner_alive());

    EXPECT_EQ(ShmSegment::reap_stale(prefix), 1u);
    EXPECT_FALSE(shm_exists(dead_name));
    EXPECT_TRUE(shm_exists(live_name));
    EXPECT_EQ(shm_error_of([&] { ShmSegment::open(dead_name); }), -ENOENT);
    EXPECT_EQ(ShmSegment::reap_stale(prefix), 0u);
}

TEST(ShmSegment, AnotherUsersSegmentIsNeitherOpenedNorReaped) {
    // Handing a segment to another user takes root; the check itself is uid against euid.
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown a segment to another user";
    std::string prefix = unique_name("foreign-user") + "-";
    std::string name = prefix + "dead";
    Child child([&] {
        ShmSegment seg = ShmSegment::create(name, 4096);
        ::_exit(0);
        return 0;
    });
    ASSERT_EQ(child.wait(), 0);
    ASSERT_EQ(::chown(("/dev/shm" + name).c_str(), 65534, 65534), 0);

    EXPECT_EQ(shm_error_of([&] { ShmSegment::open(name); }), -EACCES);
    EXPECT_EQ(ShmSegment::reap_stale(prefix), 0u) << "removed another user's segment";
    EXPECT_EQ(shm_error_of([&] { ShmSegment::create(name, 4096); }), -EEXIST);
    EXPECT_TRUE(shm_exists(name));
    ::shm_unlink(name.c_str());
}

TEST(ShmSegment, RecycledPidWithAnotherStartTimeIsNotTheOwner) {
    std::string name = unique_name("pidreuse");
    ShmSegment seg = ShmSegment::create(name, 4096);
    ASSERT_TRUE(seg.owner_alive());

    // Rewrite the recorded start time through a second mapping, as if our pid had been
    // handed to a new process after the real owner died.
    int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    void *raw = ::mmap(nullptr, ShmSegment::kHeaderSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(raw, MAP_FAILED);
    auto *start_time = reinterpret_cast<uint64_t *>(static_cast<char *>(raw) +
                                                    offsetof(ShmSegmentHeader, owner_start_time));
    if (*start_time == 0) {
        ::munmap(raw, ShmSegment::kHeaderSize);
        GTEST_SKIP() << "/proc/self/stat unreadable: no start time recorded";
    }
    *start_time += 1;
    EXPECT_FALSE(ShmSegment::open(name).owner_alive());
    EXPECT_FALSE(seg.owner_alive());
    *start_time -= 1;
    EXPECT_TRUE(seg.owner_alive());
    ::munmap(raw, ShmSegment::kHeaderSize);
}

TEST(ShmSegment, CreateOverAStaleNameSucceeds) {
    std::string name = unique_name("stale");
    Child child([&] {
        ShmSegment seg = ShmSegment::create(name, 4096);
        ::_exit(0);
        return 0;
    });
    ASSERT_EQ(child.wait(), 0);
    ASSERT_TRUE(shm_exists(name));

    ShmSegment seg = ShmSegment::create(name, 8192);
    EXPECT_TRUE(seg.is_creator());
    EXPECT_EQ(seg.owner_pid(), ::getpid());
    EXPECT_EQ(seg.data_size(), 8192u);
    EXPECT_TRUE(seg.owner_alive());
}

TEST(ShmSegment, CreateOverALiveNameFailsWithEEXIST) {
    std::string name = unique_name("live");
    ShmSegment seg = ShmSegment::create(name, 4096);
    EXPECT_EQ(shm_error_of([&] { ShmSegment::create(name, 4096); }), -EEXIST);
    EXPECT_TRUE(shm_exists(name));
}

TEST(ShmSegment, OnlyTheCreatingProcessRemovesTheName) {
    std::string name = unique_name("owner");
    {
        ShmSegment seg = ShmSegment::create(name, 4096);
        // A forked child destroying its inherited copy must not remove the parent's name.
        Child child([&] {
            ShmSegment inherited = std::move(seg);
            return inherited.is_creator() ? 2 : 0;
        });
        EXPECT_EQ(child.wait(), 0);
        EXPECT_TRUE(shm_exists(name));
        { ShmSegment opened = ShmSegment::open(name); }  // nor does an opener
        EXPECT_TRUE(shm_exists(name));
        ShmSegment moved = std::move(seg);  // the moved-from object owns nothing
        EXPECT_TRUE(moved.is_creator());
    }
    EXPECT_FALSE(shm_exists(name));
}

// ---- ShmRing -------------------------------------------------------------------------------

namespace {

// Cache-line aligned memory filled with garbage, so that nothing relies on zeroed memory.
class RingMemory {
  public:
    explicit RingMemory(size_t bytes) : size_((bytes + 63) / 64 * 64) {
        mem_ = std::aligned_alloc(64, size_);
        std::memset(mem_, 0xa5, size_);
    }
    RingMemory(const RingMemory &) = delete;
    RingMemory &operator=(const RingMemory &) = delete;
    ~RingMemory() { std::free(mem_); }
    void *get() const { return mem_; }

  private:
    size_t size_;
    void *mem_;
};

struct Item {
    uint32_t producer;
    uint32_t check;
    uint64_t sequence;
};
uint32_t check_of(uint32_t producer, uint64_t sequence) {
    return uint32_t(sequence * 2654435761u) ^ (producer << 24);
}

// A broken ring can stop consuming; producers and consumer then give up at a deadline so
// that the test fails instead of hanging.
constexpr auto kRingTestLimit = std::chrono::seconds(20);

// Pushes `count` items; false when the ring stayed full past the deadline.
bool produce(ShmRing &ring, uint32_t producer, uint64_t count,
             Clock::duration limit = kRingTestLimit) {
    auto deadline = Clock::now() + limit;
    for (uint64_t seq = 0; seq < count; ++seq) {
        void *cell;
        while (!(cell = ring.try_reserve(::getpid()))) {
            if (Clock::now() > deadline) return false;
            std::this_thread::yield();
        }
        Item item{producer, check_of(producer, seq), seq};
        std::memcpy(cell, &item, sizeof(item));
        ring.publish(cell);
    }
    return true;
}

// Pops until every producer's `count` items arrived or the deadline passed, checking that
// each producer's items come in order, without gap or repetition.
struct Consumed {
    uint64_t total = 0;
    uint64_t errors = 0;
    std::vector<uint64_t> next;
};
Consumed consume(ShmRing &ring, uint32_t producers, uint64_t count,
                 Clock::duration limit = kRingTestLimit) {
    Consumed result;
    result.next.assign(producers, 0);
    auto deadline = Clock::now() + limit;
    while (result.total < producers * count) {
        const void *cell = ring.peek();
        if (!cell) {
            if (Clock::now() > deadline) break;
            std::this_thread::yield();
            continue;
        }
        Item item;
        std::memcpy(&item, cell, sizeof(item));
        ring.release();
        ++result.total;
        if (item.producer >= producers || item.check != check_of(item.producer, item.sequence) ||
            item.sequence != result.next[item.producer]) {
            ++result.errors;
            if (item.producer < producers) result.next[item.producer] = item.sequence + 1;
        } else {
            ++result.next[item.producer];
        }
    }
    return result;
}

}  // namespace

TEST(ShmRing, BytesForAndInitRejectBadShapes) {
    EXPECT_EQ(ShmRing::bytes_for(0, 256), 0u);
    EXPECT_EQ(ShmRing::bytes_for(1, 256), 0u);  // one cell cannot tell "free" from "full"
    EXPECT_EQ(ShmRing::bytes_for(6, 256), 0u);
    EXPECT_EQ(ShmRing::bytes_for(8, 0), 0u);
    EXPECT_EQ(ShmRing::bytes_for(8, ShmRing::kMaxCellSize + 1), 0u);
    EXPECT_EQ(ShmRing::bytes_for(ShmRing::kMaxCells * 2, 8), 0u);
    // Header lines, cells of a whole number of lines each, then the cells' owner words (8 B
    // each, whole lines).
    EXPECT_EQ(ShmRing::bytes_for(8, 240), 3 * 64 + 8 * 256u + 64);
    EXPECT_EQ(ShmRing::bytes_for(8, 256), 3 * 64 + 8 * 320u + 64);
    EXPECT_EQ(ShmRing::bytes_for(16, 256), 3 * 64 + 16 * 320u + 128);

    size_t bytes = ShmRing::bytes_for(8, 256);
    RingMemory mem(bytes + 64);
    EXPECT_EQ(ShmRing::init(static_cast<char *>(mem.get()) + 8, 8, 256), nullptr);  // unaligned
    EXPECT_EQ(ShmRing::init(mem.get(), 6, 256), nullptr);
    EXPECT_EQ(ShmRing::init(nullptr, 8, 256), nullptr);
}

TEST(ShmRing, AttachValidatesTheLayout) {
    size_t bytes = ShmRing::bytes_for(16, 128);
    RingMemory mem(bytes);
    EXPECT_EQ(ShmRing::attach(mem.get()), nullptr);  // garbage, never initialised
    ShmRing *ring = ShmRing::init(mem.get(), 16, 128);
    ASSERT_NE(ring, nullptr);
    EXPECT_EQ(ShmRing::attach(mem.get()), ring);
    EXPECT_EQ(ShmRing::attach(mem.get(), bytes), ring);
    EXPECT_EQ(ShmRing::attach(mem.get(), bytes - 1), nullptr);  // would run past the memory
    EXPECT_EQ(ring->cells(), 16u);
    EXPECT_EQ(ring->cell_size(), 128u);

    // The layout is shared between processes, so it is fixed: the cell count is the 32-bit
    // word at byte 12. A count that is not a power of two is refused.
    uint32_t bad_count = 12;
    std::memcpy(static_cast<char *>(mem.get()) + 12, &bad_count, sizeof(bad_count));
    EXPECT_EQ(ShmRing::attach(mem.get()), nullptr);
}

// What a consumer that learns of a producer's death waits for: claimed_end is one past the
// last cell claimed (published or not), consumed the next cell to read; every cell claimed
// before the check is read once consumed reaches claimed_end, in later laps too.
TEST(ShmRing, ClaimedEndCoversEveryClaimedCellUntilConsumed) {
    constexpr uint32_t kCells = 8, kCellSize = 128;
    RingMemory mem(ShmRing::bytes_for(kCells, kCellSize));
    ShmRing *ring = ShmRing::init(mem.get(), kCells, kCellSize);
    ASSERT_NE(ring, nullptr);
    EXPECT_EQ(ring->claimed_end(), 0u);
    EXPECT_EQ(ring->consumed(), 0u);
    for (int lap = 0; lap < 3; ++lap) {
        const uint64_t base = ring->consumed();
        void *first = ring->try_reserve(1), *second = ring->try_reserve(2);
        void *third = ring->try_reserve(1);
        ASSERT_TRUE(first && second && third);
        ring->publish(first);
        ring->publish(third);  // the second stays claimed, unpublished
        EXPECT_EQ(ring->claimed_end(), base + 3) << "lap " << lap;
        ASSERT_NE(ring->peek(), nullptr);
        ring->release();
        EXPECT_EQ(ring->consumed(), base + 1);
        EXPECT_EQ(ring->peek(), nullptr);  // behind the unpublished one
        EXPECT_EQ(ring->claimed_end(), base + 3);
        ring->publish(second);
        for (int i = 0; i < 2; ++i) {
            ASSERT_NE(ring->peek(), nullptr);
            ring->release();
        }
        EXPECT_EQ(ring->consumed(), base + 3);
        EXPECT_EQ(ring->claimed_end(), base + 3) << "nothing claimed: the head";
        // Fill the rest of the lap so the next one starts elsewhere in the cells.
        for (uint32_t i = 0; i < kCells - 3; ++i) {
            void *c = ring->try_reserve(3);
            ASSERT_NE(c, nullptr);
            ring->publish(c);
            ASSERT_NE(ring->peek(), nullptr);
            ring->release();
        }
    }
}

TEST(ShmRing, SingleThreadFifoFullAndEmpty) {
    constexpr uint32_t kCells = 8, kCellSize = 256;
    RingMemory mem(ShmRing::bytes_for(kCells, kCellSize));
    ShmRing *ring = ShmRing::init(mem.get(), kCells, kCellSize);
    ASSERT_NE(ring, nullptr);
    EXPECT_EQ(ring->peek(), nullptr);

    for (int lap = 0; lap < 3; ++lap) {
        std::vector<void *> reserved;
        for (uint32_t i = 0; i < kCells; ++i) {
            void *cell = ring->try_reserve(::getpid());
            ASSERT_NE(cell, nullptr) << "lap " << lap << " cell " << i;
            EXPECT_EQ(reinterpret_cast<uintptr_t>(cell) % 16, 0u);
            std::memset(cell, lap * 16 + int(i), kCellSize);  // the whole payload
            reserved.push_back(cell);
        }
        EXPECT_EQ(ring->try_reserve(::getpid()), nullptr) << "full";
        EXPECT_EQ(ring->peek(), nullptr) << "reserved is not published";

        // Published out of order, consumed in reservation order.
        for (uint32_t i = kCells - 1; i > 0; --i) ring->publish(reserved[i]);
        EXPECT_EQ(ring->peek(), nullptr) << "the oldest cell is still unpublished";
        ring->publish(reserved[0]);
        EXPECT_EQ(ring->try_reserve(::getpid()), nullptr)
            << "published but unconsumed is still full";

        for (uint32_t i = 0; i < kCells; ++i) {
            const void *cell = ring->peek();
            ASSERT_EQ(cell, reserved[i]);
            EXPECT_EQ(ring->peek(), cell) << "peek without release returns the same entry";
            std::vector<unsigned char> expected(kCellSize, (unsigned char)(lap * 16 + int(i)));
            EXPECT_EQ(std::memcmp(cell, expected.data(), kCellSize), 0) << "cell " << i;
            ring->release();
        }
        EXPECT_EQ(ring->peek(), nullptr) << "empty";
    }

    // With head and tail in the middle of a lap: one entry left, so kCells - 1 free cells.
    for (int i = 0; i < 3; ++i) ring->publish(ring->try_reserve(::getpid()));
    ring->release();
    ring->release();
    int reserved = 0;
    while (void *cell = ring->try_reserve(::getpid())) {
        ring->publish(cell);
        ++reserved;
    }
    EXPECT_EQ(reserved, int(kCells) - 1);
    for (uint32_t i = 0; i < kCells; ++i) {
        ASSERT_NE(ring->peek(), nullptr);
        ring->release();
    }
    EXPECT_EQ(ring->peek(), nullptr);
}

// The sleep handshake (ShmRing's header): a consumer about to sleep arms the ring; the
// producer's claim then sees the flag, and the first producer to take it after publishing
// is the one that wakes the consumer. A claimed or published cell at head keeps the consumer
// awake instead (arm() says so), so no wake-up can fall between its look and its sleep.
TEST(ShmRing, ArmIsSeenByTheNextClaimAndAClaimKeepsTheConsumerAwake) {
    constexpr uint32_t kCells = 8, kCellSize = 64;
    RingMemory mem(ShmRing::bytes_for(kCells, kCellSize));
    ShmRing *ring = ShmRing::init(mem.get(), kCells, kCellSize);
    ASSERT_NE(ring, nullptr);
    ShmRing::ProducerView a, b;

    // Not armed: a claim asks for no wake-up.
    void *cell = ring->try_reserve(7, a);
    ASSERT_NE(cell, nullptr);
    EXPECT_FALSE(a.wake);
    // Claimed, not yet published: the consumer must not sleep.
    EXPECT_FALSE(ring->arm());
    ring->publish(cell);
    // Published, not consumed: nor now.
    EXPECT_FALSE(ring->arm());
    ASSERT_NE(ring->peek(), nullptr);
    ring->release();

    // Empty: the consumer may sleep, and the next claim sees it asleep.
    EXPECT_TRUE(ring->arm());
    cell = ring->try_reserve(7, a);
    ASSERT_NE(cell, nullptr);
    EXPECT_TRUE(a.wake);
    // A second producer claiming before the first published sees the flag too; only the first
    // to take it wakes the consumer.
    void *other = ring->try_reserve(9, b);
    ASSERT_NE(other, nullptr);
    EXPECT_TRUE(b.wake);
    ring->publish(cell);
    EXPECT_TRUE(ring->take_wake());
    ring->publish(other);
    EXPECT_FALSE(ring->take_wake());
    // Flag taken: later claims ask for nothing.
    for (int i = 0; i < 2; ++i) {
        ASSERT_NE(ring->peek(), nullptr);
        ring->release();
    }
    cell = ring->try_reserve(7, a);
    ASSERT_NE(cell, nullptr);
    EXPECT_FALSE(a.wake);
    ring->publish(cell);
    // disarm(): a consumer that did not sleep after all leaves no flag for the producers.
    ASSERT_NE(ring->peek(), nullptr);
    ring->release();
    EXPECT_TRUE(ring->arm());
    ring->disarm();
    cell = ring->try_reserve(7, a);
    ASSERT_NE(cell, nullptr);
    EXPECT_FALSE(a.wake);
}

// A producer's view keeps the consumer's head as it last read it and reads it again only when
// the ring looks full: cells the consumer freed meanwhile are found then, none is lost, and a
// ring that is still full stays full.
TEST(ShmRing, AProducerViewReadsHeadAgainWhenTheRingLooksFull) {
    constexpr uint32_t kCells = 4, kCellSize = 64;
    RingMemory mem(ShmRing::bytes_for(kCells, kCellSize));
    ShmRing *ring = ShmRing::init(mem.get(), kCells, kCellSize);
    ASSERT_NE(ring, nullptr);
    ShmRing::ProducerView view;
    for (int lap = 0; lap < 5; ++lap) {
        for (uint32_t i = 0; i < kCells; ++i) {
            void *cell = ring->try_reserve(7, view);
            ASSERT_NE(cell, nullptr) << "lap " << lap << " cell " << i;
            std::memset(cell, lap * 8 + int(i), kCellSize);
            ring->publish(cell);
        }
        EXPECT_EQ(ring->try_reserve(7, view), nullptr) << "full";
        EXPECT_FALSE(ring->has_room(view));
        // One consumed: exactly one more goes in.
        ASSERT_NE(ring->peek(), nullptr);
        ring->release();
        EXPECT_TRUE(ring->has_room(view));
        void *cell = ring->try_reserve(7, view);
        ASSERT_NE(cell, nullptr);
        std::memset(cell, 0xee, kCellSize);
        ring->publish(cell);
        EXPECT_EQ(ring->try_reserve(7, view), nullptr);
        for (uint32_t i = 1; i <= kCells; ++i) {
            const void *c = ring->peek();
            ASSERT_NE(c, nullptr);
            unsigned char want = i < kCells ? (unsigned char)(lap * 8 + int(i)) : 0xee;
            EXPECT_EQ(*static_cast<const unsigned char *>(c), want) << "lap " << lap;
            ring->release();
        }
        EXPECT_EQ(ring->peek(), nullptr);
    }
}

// A ring built in fresh zeroed memory (a new segment) writes its header line and no cell:
// an endpoint's inbox costs resident memory only for the cells traffic uses.
TEST(ShmRing, InitOfZeroedMemoryTouchesNoCell) {
    constexpr uint32_t kCells = 64, kCellSize = 8192;
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    size_t bytes = ShmRing::bytes_for(kCells, kCellSize);
    size_t pages = (bytes + page - 1) / page;
    void *mem =
        ::mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mem, MAP_FAILED);
    auto resident = [&] {
        std::vector<unsigned char> in(pages);
        EXPECT_EQ(::mincore(mem, pages * page, in.data()), 0);
        size_t n = 0;
        for (unsigned char c : in) n += c & 1;
        return n;
    };
    ASSERT_EQ(resident(), 0u);
    ShmRing *ring = ShmRing::init(mem, kCells, kCellSize, /*zeroed=*/true);
    ASSERT_NE(ring, nullptr);
    EXPECT_EQ(resident(), 1u) << "the header line's page only";
    EXPECT_EQ(ring->peek(), nullptr);
    // One message: its cell's first page and the owner words' page, no more.
    void *cell = ring->try_reserve(7);
    ASSERT_NE(cell, nullptr);
    std::memset(cell, 1, 64);
    ring->publish(cell);
    ASSERT_NE(ring->peek(), nullptr);
    ring->release();
    EXPECT_LE(resident(), 3u);
    ::munmap(mem, pages * page);
}

TEST(ShmRing, FourProducerThreadsOneConsumerLoseNothingAndKeepOrder) {
    constexpr uint32_t kProducers = 4;
    constexpr uint64_t kItems = 100000;
    RingMemory mem(ShmRing::bytes_for(1024, 256));
    ShmRing *ring = ShmRing::init(mem.get(), 1024, 256);
    ASSERT_NE(ring, nullptr);

    std::atomic<uint32_t> gave_up{0};
    std::vector<std::thread> producers;
    for (uint32_t p = 0; p < kProducers; ++p)
        producers.emplace_back([ring, p, &gave_up] {
            if (!produce(*ring, p, kItems)) ++gave_up;
        });
    Consumed got = consume(*ring, kProducers, kItems);
    for (auto &t : producers) t.join();

    EXPECT_EQ(gave_up, 0u) << "producers found the ring full until the deadline";
    EXPECT_EQ(got.total, kProducers * kItems);
    EXPECT_EQ(got.errors, 0u);
    for (uint32_t p = 0; p < kProducers; ++p) EXPECT_EQ(got.next[p], kItems) << "producer " << p;
    EXPECT_EQ(ring->peek(), nullptr);
}

// The claim race alone: with room for every item the producers never wait, and each round
// starts them together, so two producers often try the same position at once. Two of them
// taking one cell shows as a cell the consumer cannot read, or as a duplicate. The window
// is a few instructions wide: one round rarely hits it, many rounds do.
TEST(ShmRing, ProducersRacingForCellsNeverShareOne) {
    constexpr uint32_t kProducers = 4;
    constexpr uint64_t kItems = 1 << 12;
    constexpr uint32_t kCells = kProducers * kItems;
    static constexpr auto kLimit = std::chrono::seconds(2);
    RingMemory mem(ShmRing::bytes_for(kCells, sizeof(Item)));

    for (int round = 0; round < 100; ++round) {
        ShmRing *ring = ShmRing::init(mem.get(), kCells, sizeof(Item));
        ASSERT_NE(ring, nullptr);
        std::atomic<bool> start{false};
        std::atomic<uint32_t> gave_up{0};
        std::vector<std::thread> producers;
        for (uint32_t p = 0; p < kProducers; ++p)
            producers.emplace_back([ring, p, &start, &gave_up] {
                while (!start.load(std::memory_order_acquire)) {
                }
                if (!produce(*ring, p, kItems, kLimit)) ++gave_up;
            });
        start.store(true, std::memory_order_release);
        for (auto &t : producers) t.join();

        Consumed got = consume(*ring, kProducers, kItems, kLimit);
        ASSERT_EQ(gave_up, 0u) << "round " << round;
        ASSERT_EQ(got.total, kProducers * kItems) << "round " << round;
        ASSERT_EQ(got.errors, 0u) << "round " << round;
        EXPECT_EQ(ring->peek(), nullptr);
    }
}

TEST(ShmRing, ThreeProducerProcessesOneConsumerThroughASegment) {
    constexpr uint32_t kProducers = 3;
    constexpr uint64_t kItems = 100000;
    constexpr uint32_t kCells = 256, kCellSize = 256;
    std::string name = unique_name("ring");
    ShmSegment seg = ShmSegment::create(name, ShmRing::bytes_for(kCells, kCellSize));
    ShmRing *ring = ShmRing::init(seg.data(), kCells, kCellSize);
    ASSERT_NE(ring, nullptr);

    std::vector<std::unique_ptr<Child>> children;
    for (uint32_t p = 0; p < kProducers; ++p) {
        // Each producer maps the segment itself, at an address of its own.
        children.push_back(std::make_unique<Child>([&name, p] {
            ShmSegment opened = ShmSegment::open(name);
            ShmRing *attached = ShmRing::attach(opened.data(), opened.data_size());
            if (!attached) return 2;
            return produce(*attached, p, kItems) ? 0 : 3;
        }));
        ASSERT_TRUE(children.back()->started());
    }
    Consumed got = consume(*ring, kProducers, kItems);
    for (auto &child : children) EXPECT_EQ(child->wait(), 0);

    EXPECT_EQ(got.total, kProducers * kItems);
    EXPECT_EQ(got.errors, 0u);
    for (uint32_t p = 0; p < kProducers; ++p) EXPECT_EQ(got.next[p], kItems) << "producer " << p;
    EXPECT_EQ(ring->peek(), nullptr);
}

// A producer killed between try_reserve and publish: its cell would hold the consumer at
// that position for ever. Once the producer is dead (and reaped), reclaim_dead skips the
// cell and another producer's items behind it arrive, all of them and in order, and the
// ring keeps working for the laps after.
TEST(ShmRing, ACellClaimedByAKilledProducerIsSkipped) {
    constexpr uint32_t kCells = 16, kCellSize = 64;
    std::string name = unique_name("ring-dead");
    ShmSegment seg = ShmSegment::create(name, ShmRing::bytes_for(kCells, kCellSize));
    ShmRing *ring = ShmRing::init(seg.data(), kCells, kCellSize);
    ASSERT_NE(ring, nullptr);

    Pipe reserved;
    Child child([&] {
        ShmSegment opened = ShmSegment::open(name);
        ShmRing *attached = ShmRing::attach(opened.data(), opened.data_size());
        if (!attached || !attached->try_reserve(::getpid())) return 2;
        reserved.send(1);
        ::pause();  // killed here, before publishing
        return 3;
    });
    ASSERT_TRUE(child.started());
    int flag = 0;
    ASSERT_TRUE(reserved.receive(flag)) << "the child did not reserve a cell";
    // While it lives, its claim is respected.
    EXPECT_EQ(ring->reclaim_dead(process_running), 0u);
    ::kill(child.pid(), SIGKILL);
    ASSERT_EQ(child.wait(), 128 + SIGKILL);

    // Every other cell: published behind the dead one.
    ASSERT_TRUE(produce(*ring, 0, kCells - 1, std::chrono::seconds(0)));
    EXPECT_EQ(ring->peek(), nullptr) << "the dead producer's cell is first";
    EXPECT_EQ(ring->reclaim_dead(process_running), 1u);
    Consumed got = consume(*ring, 1, kCells - 1, std::chrono::seconds(2));
    EXPECT_EQ(got.total, kCells - 1);
    EXPECT_EQ(got.errors, 0u);
    // Two more laps through every cell, the dead one's included.
    bool produced = false;
    std::thread producer([&] { produced = produce(*ring, 0, 2 * kCells); });
    Consumed more = consume(*ring, 1, 2 * kCells);
    producer.join();
    EXPECT_TRUE(produced);
    EXPECT_EQ(more.total, 2 * kCells);
    EXPECT_EQ(more.errors, 0u);
    EXPECT_EQ(ring->peek(), nullptr);
}

// A claimed cell whose producer lives is never skipped, however long it takes to publish.
TEST(ShmRing, ACellClaimedByALiveProducerIsKept) {
    constexpr uint32_t kCells = 8, kCellSize = 64;
    RingMemory mem(ShmRing::bytes_for(kCells, kCellSize));
    ShmRing *ring = ShmRing::init(mem.get(), kCells, kCellSize);
    ASSERT_NE(ring, nullptr);
    void *slow = ring->try_reserve(::getpid());
    ASSERT_NE(slow, nullptr);
    void *next = ring->try_reserve(::getpid());
    ASSERT_NE(next, nullptr);
    std::memset(next, 2, kCellSize);
    ring->publish(next);
    EXPECT_EQ(ring->reclaim_dead(process_running), 0u);
    EXPECT_EQ(ring->peek(), nullptr);
    std::memset(slow, 1, kCellSize);
    ring->publish(slow);
    for (unsigned char want : {1, 2}) {
        const void *cell = ring->peek();
        ASSERT_NE(cell, nullptr);
        EXPECT_EQ(*static_cast<const unsigned char *>(cell), want);
        ring->release();
    }
    // Nothing claimed: nothing to skip.
    EXPECT_EQ(ring->reclaim_dead([](pid_t) { return false; }), 0u);
    EXPECT_EQ(ring->peek(), nullptr);
}

// ---- Peers in another pid namespace ---------------------------------------------------------
// Containers that share /dev/shm but not a pid namespace: the owner's pid names another
// process here (or none), so its liveness comes from its lock on the object, and its ring
// claims and collective membership name it by its token.

namespace {

// A process in a pid namespace of its own (pid 1 there): an intermediate child unshares the
// namespace and forks it. It creates `name` with a ring, claims a cell of `ring_name`'s ring
// and reports (its pid here, its token), then waits to be killed.
struct ForeignOwner {
    Pipe started, report;
    std::unique_ptr<Child> parent;  // (std::optional here draws a false -Wmaybe-uninitialized)
    pid_t pid = -1;                 // as seen from here
    uint32_t token = 0;
    bool ok = false;
    std::string refusal;

    ForeignOwner(const std::string &name, const std::string &ring_name) {
        parent = std::make_unique<Child>([&] {
            if (::unshare(CLONE_NEWPID) != 0) {
                started.send(-errno);
                return 1;
            }
            pid_t inner = ::fork();
            if (inner == 0) {
                ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a test that failed
                try {
                    ShmSegment own = ShmSegment::create(name, 4096);
                    ShmSegment ring_seg = ShmSegment::open(ring_name);
                    ShmRing *ring = ShmRing::attach(ring_seg.data(), ring_seg.data_size());
                    if (::getpid() != 1 || !ring || !ring->try_reserve(own_process_token()))
                        ::_exit(4);
                    report.send(own_process_token());
                    ::pause();
                } catch (...) {
                }
                ::_exit(5);
            }
            started.send(int(inner));
            int status = 0;
            ::waitpid(inner, &status, 0);
            return 0;
        });
        int first = 0;
        if (!started.receive(first)) return;
        if (first < 0) {
            refusal = std::string("unshare(CLONE_NEWPID): ") + std::strerror(-first);
            return;
        }
        pid = first;
        ok = report.receive(token);
    }
};

}  // namespace

TEST(ShmSegment, OwnerInAnotherPidNamespaceIsAliveWhileItHoldsItsLock) {
    constexpr uint32_t kCells = 8, kCellSize = 64;
    std::string prefix = unique_name("pidns") + "-";
    std::string name = prefix + "owner", ring_name = prefix + "ring";
    ShmSegment ring_seg = ShmSegment::create(ring_name, ShmRing::bytes_for(kCells, kCellSize));
    ShmRing *ring = ShmRing::init(ring_seg.data(), kCells, kCellSize);
    ASSERT_NE(ring, nullptr);
    ForeignOwner owner(name, ring_name);
    if (!owner.refusal.empty())
        GTEST_SKIP() << owner.refusal << " (needs root or a user namespace)";
    ASSERT_TRUE(owner.ok) << "the process in its own pid namespace did not start";

    ShmSegment seen = ShmSegment::open(name);
    EXPECT_EQ(seen.owner_pid(), 1) << "its pid in its own namespace";
    EXPECT_FALSE(seen.owner_shares_pid_namespace());
    EXPECT_EQ(seen.owner_token(), owner.token);
    // Pid 1 here is another process: its start time differs, so a pid check would find the
    // owner dead and a reaper would remove a live peer's segment.
    EXPECT_TRUE(seen.owner_alive());
    EXPECT_EQ(ShmSegment::reap_stale(prefix), 0u);
    EXPECT_TRUE(shm_exists(name));
    ProcessWatch watch(prefix);
    EXPECT_TRUE(watch.alive(owner.token));
    EXPECT_EQ(ring->reclaim_dead([&](uint32_t id) { return watch.alive(id); }), 0u)
        << "a live foreign producer's claim was taken back";

    ::kill(owner.pid, SIGKILL);
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (seen.owner_alive() && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_FALSE(seen.owner_alive()) << "the lock outlived its owner";
    EXPECT_FALSE(watch.alive(owner.token));
    EXPECT_EQ(ring->reclaim_dead([&](uint32_t id) { return watch.alive(id); }), 1u);
    EXPECT_EQ(owner.parent->wait(), 0);
    EXPECT_EQ(ShmSegment::reap_stale(prefix), 1u);
    EXPECT_FALSE(shm_exists(name));
}

// A process in another pid namespace that closes the segment a watch found, and keeps
// another, still runs: the watch looks again instead of calling it dead (its claims in a
// ring would otherwise be taken back under it).
TEST(ShmSegment, ProcessWatchLooksAgainWhenTheSegmentItFoundIsClosed) {
    std::string prefix = unique_name("rewatch") + "-";
    Pipe started, report, command;
    Child parent([&] {
        if (::unshare(CLONE_NEWPID) != 0) {
            started.send(-errno);
            return 1;
        }
        pid_t inner = ::fork();
        if (inner == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            try {
                std::optional<ShmSegment> first(ShmSegment::create(prefix + "first", 4096));
                report.send(own_process_token());
                int go = 0;
                if (!command.receive(go, 20000)) ::_exit(4);
                ShmSegment second = ShmSegment::create(prefix + "second", 4096);
                first.reset();  // closed: its name and its lock are gone
                report.send(uint32_t(1));
                ::pause();
            } catch (...) {
            }
            ::_exit(5);
        }
        started.send(int(inner));
        ::waitpid(inner, nullptr, 0);
        return 0;
    });
    int first = 0;
    ASSERT_TRUE(started.receive(first));
    if (first < 0) GTEST_SKIP() << "unshare(CLONE_NEWPID): " << std::strerror(-first);
    uint32_t token = 0, done = 0;
    ASSERT_TRUE(report.receive(token));
    ProcessWatch watch(prefix);
    EXPECT_TRUE(watch.alive(token)) << "found through its first segment";
    ASSERT_TRUE(command.send(1));
    ASSERT_TRUE(report.receive(done));
    EXPECT_FALSE(shm_exists(prefix + "first"));
    EXPECT_TRUE(watch.alive(token)) << "its first segment closed, it runs on with the second";
    ::kill(pid_t(first), SIGKILL);
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (watch.alive(token) && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_FALSE(watch.alive(token));
    EXPECT_EQ(parent.wait(), 0);
    EXPECT_EQ(ShmSegment::reap_stale(prefix), 1u);
}

// Our own segments: same namespace, found by token while we live.
TEST(ShmSegment, ProcessWatchFindsALiveOwnerByToken) {
    std::string prefix = unique_name("watch") + "-";
    Pipe created;
    uint32_t token = 0;
    Child child([&] {
        ShmSegment own = ShmSegment::create(prefix + "x", 4096);
        created.send(own_process_token());
        ::pause();
        return 0;
    });
    ASSERT_TRUE(created.receive(token));
    EXPECT_NE(token, own_process_token()) << "a forked child draws its own token";
    EXPECT_NE(token & 0x80000000u, 0u);
    ProcessWatch watch(prefix);
    EXPECT_TRUE(watch.alive(token));
    EXPECT_FALSE(watch.alive(token ^ 1u)) << "nobody has this token";
    ::kill(child.pid(), SIGKILL);
    EXPECT_EQ(child.wait(), 128 + SIGKILL);
    EXPECT_FALSE(watch.alive(token));
    EXPECT_EQ(ShmSegment::reap_stale(prefix), 1u);
}

// ---- Cross-memory attach -------------------------------------------------------------------

namespace {

constexpr size_t kPeerBufferSize = 1 << 20;
unsigned char child_pattern(size_t i) {
    return static_cast<unsigned char>(i * 13 + 5);
}
unsigned char parent_pattern(size_t i) {
    return static_cast<unsigned char>(i * 31 + 7);
}

// A child holding a buffer of its own (filled with child_pattern after the fork, so it
// differs from anything in the parent) whose address it reports. On `go` it checks that
// the buffer now holds parent_pattern and exits 0 if so.
struct CmaPeer {
    Pipe to_parent, to_child;
    std::unique_ptr<Child> child;  // (std::optional here draws a false -Wmaybe-uninitialized)
    unsigned char *buffer = nullptr;

    CmaPeer() {
        child = std::make_unique<Child>([this] {
            std::vector<unsigned char> own(kPeerBufferSize);
            for (size_t i = 0; i < own.size(); ++i) own[i] = child_pattern(i);
            unsigned char *addr = own.data();
            to_parent.send(addr);
            int go;
            if (!to_child.receive(go, 30000)) return 2;
            for (size_t i = 0; i < own.size(); ++i)
                if (own[i] != parent_pattern(i)) return 3;
            return 0;
        });
        if (!to_parent.receive(buffer)) buffer = nullptr;
    }
    pid_t pid() const { return child->pid(); }
    // The word a probe of `buffer` must read: the child's pattern's first 8 bytes.
    static uint64_t first_word() {
        uint64_t w = 0;
        for (size_t i = 0; i < sizeof w; ++i) w |= uint64_t(child_pattern(i)) << (8 * i);
        return w;
    }
    bool probe() const { return cma_probe(pid(), buffer, first_word()); }
    // Why CMA is refused, for the skip message.
    std::string refusal() const {
        char byte;
        iovec local{&byte, 1}, remote{buffer, 1};
        ssize_t rc = cma_read(pid(), &local, 1, &remote, 1);
        return rc < 0 ? std::string("process_vm_readv: ") + std::strerror(int(-rc))
                      : "probe failed";
    }
};

}  // namespace

// The figures the node-local path chooses its copies by: measured here, positive, growing
// with the size, and extended past the sizes measured in proportion.
TEST(CopyCosts, MeasuredHereAndGrowingWithTheSize) {
    CopyCosts c = CopyCosts::measure();
    ASSERT_TRUE(c.cma_measured()) << "cross-memory attach to ourselves is refused here";
    double last_copy = 0, last_cma = 0;
    for (size_t n : CopyCosts::kSizes) {
        EXPECT_GT(c.memcpy_ns(n), 0.0) << n;
        EXPECT_GT(c.cma_ns(n), 0.0) << n;
        EXPECT_GE(c.memcpy_ns(n), last_copy * 0.5) << "memcpy of " << n << " B";
        EXPECT_GE(c.cma_ns(n), last_cma * 0.5) << "CMA of " << n << " B";
        last_copy = c.memcpy_ns(n);
        last_cma = c.cma_ns(n);
    }
    const size_t top = CopyCosts::kSizes[CopyCosts::kPoints - 1];
    EXPECT_DOUBLE_EQ(c.memcpy_ns(4 * top), 4 * c.memcpy_ns(top));
    // Between two sizes measured: between their figures.
    const size_t a = CopyCosts::kSizes[1], b = CopyCosts::kSizes[2];
    double mid = c.memcpy_ns((a + b) / 2);
    EXPECT_GE(mid, std::min(c.memcpy_ns(a), c.memcpy_ns(b)));
    EXPECT_LE(mid, std::max(c.memcpy_ns(a), c.memcpy_ns(b)));
}

TEST(Cma, ReadsAndWritesAForkedChildsBuffer) {
    CmaPeer peer;
    ASSERT_NE(peer.buffer, nullptr);
    if (!peer.probe()) GTEST_SKIP() << "CMA not permitted here (" << peer.refusal() << ")";
    // A probe checks what it read: the same read expecting another word is no proof of
    // having reached the process meant.
    EXPECT_FALSE(cma_probe(peer.pid(), peer.buffer, ~CmaPeer::first_word()));

    // Read with the two sides split at different places, and an empty range among them.
    std::vector<unsigned char> local(kPeerBufferSize);
    size_t third = kPeerBufferSize / 3, half = kPeerBufferSize / 2;
    iovec local_ranges[] = {{local.data(), 1000},
                            {local.data() + 1000, half - 1000},
                            {local.data() + half, kPeerBufferSize - half}};
    iovec remote_ranges[] = {{peer.buffer, third},
                             {peer.buffer + third, 0},
                             {peer.buffer + third, kPeerBufferSize - third}};
    ASSERT_EQ(cma_read(peer.pid(), local_ranges, 3, remote_ranges, 3), ssize_t(kPeerBufferSize));
    for (size_t i = 0; i < kPeerBufferSize; ++i) ASSERT_EQ(local[i], child_pattern(i)) << i;

    // More empty ranges in a row than one system call takes, then the data.
    std::vector<iovec> mostly_empty(IOV_MAX + 10, iovec{peer.buffer, 0});
    mostly_empty.push_back({peer.buffer + 100, 64});
    std::vector<unsigned char> small(64);
    iovec small_range{small.data(), small.size()};
    ASSERT_EQ(cma_read(peer.pid(), &small_range, 1, mostly_empty.data(), mostly_empty.size()), 64);
    for (size_t i = 0; i < small.size(); ++i) ASSERT_EQ(small[i], child_pattern(100 + i)) << i;

    // Write through more remote ranges than one system call takes (IOV_MAX).
    for (size_t i = 0; i < kPeerBufferSize; ++i) local[i] = parent_pattern(i);
    constexpr size_t kRangeSize = 256;
    std::vector<iovec> many(kPeerBufferSize / kRangeSize);
    for (size_t r = 0; r < many.size(); ++r) many[r] = {peer.buffer + r * kRangeSize, kRangeSize};
    ASSERT_GT(many.size(), size_t(IOV_MAX));
    iovec whole{local.data(), local.size()};
    EXPECT_EQ(cma_write(peer.pid(), &whole, 1, many.data(), many.size()), ssize_t(kPeerBufferSize));

    peer.to_child.send(1);
    EXPECT_EQ(peer.child->wait(), 0) << "the child did not see what was written";
}

TEST(Cma, BadAddressGivesEFAULT) {
    CmaPeer peer;
    ASSERT_NE(peer.buffer, nullptr);
    if (!peer.probe()) GTEST_SKIP() << "CMA not permitted here (" << peer.refusal() << ")";

    auto *unmapped = reinterpret_cast<unsigned char *>(0x10);  // below mmap_min_addr
    std::vector<unsigned char> local(8192);
    iovec local_all{local.data(), local.size()};
    iovec bad_remote{unmapped, 64};
    EXPECT_EQ(cma_read(peer.pid(), &local_all, 1, &bad_remote, 1), -EFAULT);
    EXPECT_EQ(cma_write(peer.pid(), &local_all, 1, &bad_remote, 1), -EFAULT);
    EXPECT_FALSE(cma_probe(peer.pid(), unmapped, 0));

    // Good first, bad after: the kernel copies the good part and reports a short count;
    // the loop must then report the fault rather than success.
    iovec half_bad[] = {{peer.buffer, 4096}, {unmapped, 4096}};
    EXPECT_EQ(cma_read(peer.pid(), &local_all, 1, half_bad, 2), -EFAULT);
    EXPECT_EQ(local[0], child_pattern(0));

    iovec bad_local{unmapped, 64}, good_remote{peer.buffer, 64};
    EXPECT_EQ(cma_read(peer.pid(), &bad_local, 1, &good_remote, 1), -EFAULT);
}

TEST(Cma, GonePeerGivesESRCH) {
    uint64_t mine = 1;
    if (!cma_probe(::getpid(), &mine, 1)) GTEST_SKIP() << "CMA not permitted here";
    Child child([] { return 0; });
    pid_t gone = child.pid();
    ASSERT_EQ(child.wait(), 0);
    char byte;
    iovec local{&byte, 1}, remote{&mine, 1};
    EXPECT_EQ(cma_read(gone, &local, 1, &remote, 1), -ESRCH);
}

// ---- The node-local channel's inbox segment, wake-ups and death verdict -------------------

namespace {

// A key no other test run uses (an inbox is named "/tandem-<uid>-<key>").
std::string unique_key(const std::string &what) {
    return unique_name(what).substr(1);  // (unique_name's "/tandem-ut-...", less the slash)
}

bool readable_within(int fd, int timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) == 1;
}

}  // namespace

TEST(InboxSegment, APeerOpensWhatTheCreatorPublished) {
    const std::string key = unique_key("inbox");
    const shm::InboxIdentity identity{
        .probe_addr = 0x1000, .probe_value = 0xfeed, .auth = 7, .job = 9};
    shm::InboxSegment own = shm::InboxSegment::create(key, 16, 256, identity);
    ASSERT_NE(own.ring, nullptr);
    ASSERT_NE(own.split_claims, nullptr);
    EXPECT_EQ(own.segment.name(), shm::segment_name(key));
    EXPECT_EQ(own.segment.data_size(), shm::InboxSegment::bytes(16, 256));

    std::optional<shm::InboxSegment> peer = shm::InboxSegment::open(key, 256);
    ASSERT_TRUE(peer);
    EXPECT_EQ(peer->info->magic, shm::SegmentInfo::kMagic);
    EXPECT_EQ(peer->info->pid, ::getpid());
    EXPECT_EQ(peer->info->cell_size, 256u);
    EXPECT_EQ(peer->info->probe_value, 0xfeedu);
    EXPECT_EQ(peer->info->auth, 7u);
    EXPECT_EQ(peer->info->job, 9u);
    EXPECT_EQ(peer->ring->cells(), 16u);
    // One ring seen from both mappings: a cell published through the peer's arrives here.
    void *cell = peer->ring->try_reserve(own_process_token());
    ASSERT_NE(cell, nullptr);
    memcpy(cell, "cell", 5);
    peer->ring->publish(cell);
    const void *got = own.ring->peek();
    ASSERT_NE(got, nullptr);
    EXPECT_STREQ(static_cast<const char *>(got), "cell");
    own.ring->release();
}

TEST(InboxSegment, OpenRefusesWhatIsNotALiveInboxOfThisShape) {
    const std::string key = unique_key("inbox-refused");
    EXPECT_FALSE(shm::InboxSegment::open(key, 256)) << "nothing under the key";

    shm::InboxSegment own = shm::InboxSegment::create(key, 16, 256, {});
    EXPECT_FALSE(shm::InboxSegment::open(key, 512)) << "another cell size";
    // A segment under such a name that is not an inbox: no magic.
    const std::string other = unique_key("not-an-inbox");
    ShmSegment plain = ShmSegment::create(shm::segment_name(other), 4096);
    EXPECT_FALSE(shm::InboxSegment::open(other, 256));

    // An inbox whose owner died.
    const std::string dead_key = unique_key("inbox-dead");
    Pipe created;
    Child child([&] {
        shm::InboxSegment theirs = shm::InboxSegment::create(dead_key, 16, 256, {});
        created.send(1);
        ::_exit(0);  // a crash: nothing is removed
        return 0;
    });
    int signal_value = 0;
    ASSERT_TRUE(created.receive(signal_value));
    ASSERT_EQ(child.wait(), 0);
    EXPECT_FALSE(shm::InboxSegment::open(dead_key, 256));
    EXPECT_EQ(ShmSegment::reap_stale(shm::segment_name(dead_key)), 1u);
}

TEST(InboxWake, APeersWakeTheOwnersOwnAndTheTimerMakeItsDescriptorReadable) {
    const std::string key = unique_key("wake");
    shm::InboxWake wake(key);
    EXPECT_FALSE(readable_within(wake.fd(), 0));

    shm::PeerWake peer(key);
    peer.wake();
    EXPECT_TRUE(readable_within(wake.fd(), 0));
    wake.drain();
    EXPECT_FALSE(readable_within(wake.fd(), 0)) << "drain left the peer's byte";

    wake.wake_self();
    EXPECT_TRUE(readable_within(wake.fd(), 0));
    wake.drain();

    wake.set_timer(30);
    EXPECT_TRUE(wake.timer_set());
    EXPECT_TRUE(readable_within(wake.fd(), 5000)) << "the timer never fired";
    wake.drain();
    EXPECT_FALSE(readable_within(wake.fd(), 0)) << "drain left the timer's expiry";

    wake.set_timer(30);
    wake.stop_timer();
    EXPECT_FALSE(wake.timer_set());
    EXPECT_FALSE(readable_within(wake.fd(), 200)) << "a stopped timer fired";
}

TEST(InboxWake, WithoutAFifoItStillWakesItselfAndForItsTimer) {
    shm::InboxWake wake{shm::InboxWake::NoFifo{}};
    EXPECT_FALSE(readable_within(wake.fd(), 0));
    wake.wake_self();
    EXPECT_TRUE(readable_within(wake.fd(), 0));
    wake.drain();
    EXPECT_FALSE(readable_within(wake.fd(), 0)) << "drain left our own byte";
    wake.set_timer(30);
    EXPECT_TRUE(readable_within(wake.fd(), 5000)) << "the timer never fired";
    wake.drain();
    EXPECT_FALSE(readable_within(wake.fd(), 0)) << "drain left the timer's expiry";
}

TEST(InboxWake, TheFifoGoesWithItsOwnerAndAWakeOfNobodyIsQuiet) {
    const std::string key = unique_key("wake-gone");
    struct stat st;
    {
        shm::InboxWake wake(key);
        ASSERT_EQ(::stat(shm::wake_path(key).c_str(), &st), 0);
        EXPECT_TRUE(S_ISFIFO(st.st_mode));
        EXPECT_EQ(st.st_mode & 0777, 0600u);
    }
    EXPECT_NE(::stat(shm::wake_path(key).c_str(), &st), 0) << "the FIFO outlived its owner";
    shm::PeerWake peer(key);
    peer.wake();  // nobody there: no SIGPIPE, no error
    shm::PeerWake nobody;
    nobody.wake();
    SUCCEED();
}

TEST(DeathVerdict, AlivePeerThenDrainingUntilOurInboxIsReadThenDead) {
    constexpr uint32_t kCells = 8, kCellSize = 128;
    RingMemory mem(ShmRing::bytes_for(kCells, kCellSize));
    ShmRing *inbox = ShmRing::init(mem.get(), kCells, kCellSize);
    ASSERT_NE(inbox, nullptr);

    const std::string name = unique_name("verdict");
    Pipe created, go;
    Child child([&] {
        ShmSegment theirs = ShmSegment::create(name, 4096);
        created.send(1);
        int v = 0;
        go.receive(v);
        ::_exit(0);
        return 0;
    });
    int v = 0;
    ASSERT_TRUE(created.receive(v));
    ShmSegment peer = ShmSegment::open(name);
    shm::DeathVerdict verdict;
    EXPECT_EQ(verdict.judge(peer, inbox), shm::DeathVerdict::State::kAlive);

    // What it wrote us before it died: one cell published, one claimed and never published.
    void *answer = inbox->try_reserve(1);
    void *torn = inbox->try_reserve(2);
    ASSERT_TRUE(answer && torn);
    inbox->publish(answer);
    go.send(1);
    ASSERT_EQ(child.wait(), 0);

    EXPECT_EQ(verdict.judge(peer, inbox), shm::DeathVerdict::State::kDraining);
    ASSERT_NE(inbox->peek(), nullptr);
    inbox->release();  // the answer read
    EXPECT_EQ(verdict.judge(peer, inbox), shm::DeathVerdict::State::kDraining)
        << "dead before the cell it claimed was passed";
    inbox->publish(torn);  // (as reclaim_dead skips it)
    ASSERT_NE(inbox->peek(), nullptr);
    inbox->release();
    EXPECT_EQ(verdict.judge(peer, inbox), shm::DeathVerdict::State::kDead);
    // Cells claimed after the death was seen are not its: they hold nothing back.
    void *later = inbox->try_reserve(3);
    ASSERT_NE(later, nullptr);
    EXPECT_EQ(verdict.judge(peer, inbox), shm::DeathVerdict::State::kDead);
    inbox->publish(later);
    EXPECT_EQ(shm::DeathVerdict().judge(peer, nullptr), shm::DeathVerdict::State::kDead)
        << "without an inbox there is nothing to drain";
}

namespace {

// The endpoint's side of an Outbox in these tests: who writes, and the streams that ended.
struct RecordingSender final : shm::Sender, shm::StreamListener {
    RecordingSender() {
        producer = 7;
        name = name_bytes;
        short_line = &line;
        streams = this;
        line.build(name_bytes, 16);
    }
    RecordingSender(const RecordingSender &) = delete;
    void stream_ended(const shm::Stream &stream, int status) override {
        ended.push_back({stream.hdr.msg_id, status});
    }
    uint8_t name_bytes[wire::kLocalNameRoom] = {2, 0, 1, 2, 127, 0, 0, 1};
    ShortLine line;
    std::vector<std::pair<uint64_t, int>> ended;
};

// A ring of node-local cells in memory of this process.
struct CellRing {
    explicit CellRing(uint32_t cells)
        : mem(ShmRing::bytes_for(cells, wire::kLocalCellSize)),
          ring(ShmRing::init(mem.get(), cells, wire::kLocalCellSize)) {}
    RingMemory mem;
    ShmRing *ring;
};

wire::LocalHeader header_of(wire::LocalOp op, uint64_t msg_id) {
    wire::LocalHeader hdr{};
    hdr.op = static_cast<uint8_t>(op);
    hdr.name_len = 16;
    hdr.msg_id = msg_id;
    return hdr;
}

// The next cell of the ring, as the receiver reads it (nullopt: none).
std::optional<wire::LocalHeader> read_header(ShmRing *ring, std::vector<uint8_t> *body = nullptr) {
    const void *cell = ring->peek();
    if (!cell) return std::nullopt;
    wire::LocalHeader hdr;
    memcpy(&hdr, cell, sizeof hdr);
    if (body) {
        auto *at = static_cast<const uint8_t *>(cell) + sizeof hdr + wire::kLocalNameRoom;
        body->assign(at, at + hdr.size);
    }
    ring->release();
    return hdr;
}

}  // namespace

TEST(Outbox, CellsAndStreamsWaitInOrderBehindAFullRingAndFlushInOrder) {
    constexpr uint32_t kCells = 4;
    CellRing inbox(kCells);
    ShmRing *ring = inbox.ring;
    ASSERT_NE(ring, nullptr);
    RecordingSender sender;
    shm::Outbox out(ring, "");

    for (uint64_t id = 0; id < kCells; ++id)
        out.push(sender, header_of(wire::LocalOp::Fin, id), nullptr, 0);
    EXPECT_FALSE(out.admits()) << "the ring is full";
    EXPECT_EQ(out.blocked, 0) << "nothing waits yet";
    out.push(sender, header_of(wire::LocalOp::Fin, 4), nullptr, 0);
    EXPECT_EQ(out.blocked, shm::Outbox::kBacklog);
    EXPECT_EQ(sender.backlogged, 1u);
    // A payload of three cells and a bit, behind it.
    std::vector<uint8_t> payload(3 * wire::kLocalBodyRoom + 100);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 7);
    iovec iov{payload.data(), payload.size()};
    wire::LocalHeader frag = header_of(wire::LocalOp::Frag, 5);
    frag.total = payload.size();
    out.push_stream(sender, frag, &iov, 1, payload.size(), nullptr,
                    {.kind = shm::StreamEnd::Kind::CompleteTx});
    EXPECT_TRUE(sender.ended.empty());
    EXPECT_EQ(sender.backlogged, 1u) << "one Outbox, however much waits in it";

    std::vector<uint64_t> order;
    std::vector<uint8_t> assembled, body;
    for (int round = 0; round < 10 && (order.size() < 6 || assembled.size() < payload.size());
         ++round) {
        while (auto hdr = read_header(ring, &body)) {
            if (hdr->op == static_cast<uint8_t>(wire::LocalOp::Fin)) {
                order.push_back(hdr->msg_id);
                continue;
            }
            ASSERT_EQ(hdr->op, static_cast<uint8_t>(wire::LocalOp::Frag));
            EXPECT_EQ(order.size(), 5u) << "a stream cell overtook a cell before it";
            EXPECT_EQ(hdr->offset, assembled.size());
            EXPECT_EQ(bool(hdr->flags & wire::kLocalLast),
                      assembled.size() + hdr->size == payload.size());
            assembled.insert(assembled.end(), body.begin(), body.end());
        }
        // The ring has room now, and still a cell posted now goes behind what waits.
        if (round == 0) out.push(sender, header_of(wire::LocalOp::Fin, 6), nullptr, 0);
        out.flush(sender);
    }
    EXPECT_EQ(order, (std::vector<uint64_t>{0, 1, 2, 3, 4, 6}));
    EXPECT_EQ(assembled, payload);
    ASSERT_EQ(sender.ended.size(), 1u);
    EXPECT_EQ(sender.ended[0], (std::pair<uint64_t, int>{5, 0}));
    EXPECT_EQ(sender.backlogged, 0u);
    EXPECT_EQ(out.blocked, 0);
    EXPECT_TRUE(out.admits());
}

// An Outbox writing into a ring of two cells.
class OutboxOfTwo : public ::testing::Test {
  protected:
    CellRing inbox{2};
    RecordingSender sender;
    shm::Outbox out{inbox.ring, ""};
};

TEST_F(OutboxOfTwo, AnEagerCellNobodyAnswersGoesAsAShortCell) {
    ShmRing *ring = inbox.ring;
    wire::LocalHeader eager = header_of(wire::LocalOp::Eager, 0);
    eager.tag = 0x1234;
    eager.size = 5;
    out.push(sender, eager, "hello", 5);
    eager.flags = wire::kLocalAckReq;  // a Fin is wanted: the full header
    out.push(sender, eager, "hello", 5);
    const auto *cell = static_cast<const uint8_t *>(ring->peek());
    ASSERT_NE(cell, nullptr);
    EXPECT_EQ(cell[0], static_cast<uint8_t>(wire::LocalOp::Short));
    ring->release();
    cell = static_cast<const uint8_t *>(ring->peek());
    ASSERT_NE(cell, nullptr);
    EXPECT_EQ(cell[0], static_cast<uint8_t>(wire::LocalOp::Eager));
    ring->release();
}

TEST_F(OutboxOfTwo, APeerFoundDeadEndsTheStreamsThatWaitedWithConnectionReset) {
    out.push(sender, header_of(wire::LocalOp::Fin, 0), nullptr, 0);
    out.push(sender, header_of(wire::LocalOp::Fin, 1), nullptr, 0);
    std::vector<uint8_t> payload(100, 1);
    iovec iov{payload.data(), payload.size()};
    out.push_stream(sender, header_of(wire::LocalOp::Frag, 2), &iov, 1, payload.size(), nullptr,
                    {.kind = shm::StreamEnd::Kind::FailPending});
    EXPECT_TRUE(sender.ended.empty());
    out.close_dead(sender);
    ASSERT_EQ(sender.ended.size(), 1u);
    EXPECT_EQ(sender.ended[0], (std::pair<uint64_t, int>{2, FI_ECONNRESET}));
    EXPECT_EQ(out.blocked, shm::Outbox::kDead);
    EXPECT_EQ(sender.backlogged, 0u);
}

TEST(SplitClaims, WhoeverTakesAnOpenClaimCopiesAndTheOtherNever) {
    std::vector<std::atomic<uint64_t>> table(shm::kSplitClaims);
    shm::SplitClaims claims(table.data());

    // The sender takes it first: the receiver cannot take it back.
    std::optional<shm::ClaimId> first = claims.open();
    ASSERT_TRUE(first);
    EXPECT_TRUE(shm::SplitClaims::take_for_sender(table.data(), *first));
    EXPECT_FALSE(claims.take_back(*first));
    EXPECT_FALSE(shm::SplitClaims::take_for_sender(table.data(), *first)) << "taken twice";
    claims.release(*first);

    // The receiver takes it back first: the sender's Cts arrives too late.
    std::optional<shm::ClaimId> second = claims.open();
    ASSERT_TRUE(second);
    EXPECT_TRUE(claims.take_back(*second));
    EXPECT_FALSE(shm::SplitClaims::take_for_sender(table.data(), *second));
    claims.release(*second);

    // A slot used again comes under its next generation: a late Cts of the old claim, or one
    // naming no slot of the table, takes nothing.
    std::vector<shm::ClaimId> open;
    while (auto c = claims.open()) open.push_back(*c);
    EXPECT_EQ(open.size(), size_t(shm::kSplitClaims)) << "every slot, then none";
    EXPECT_FALSE(shm::SplitClaims::take_for_sender(table.data(), *first));
    EXPECT_FALSE(
        shm::SplitClaims::take_for_sender(table.data(), shm::ClaimId(shm::kSplitClaims) << 32));
    EXPECT_FALSE(shm::SplitClaims::take_for_sender(nullptr, open[0]));
    EXPECT_FALSE(claims.take_back(wire::kLocalNoClaim));
    for (shm::ClaimId c : open) EXPECT_TRUE(shm::SplitClaims::take_for_sender(table.data(), c));
}

TEST(SplitClaims, ATableOfAnotherMappingSeesTheSameClaims) {
    const std::string key = unique_key("claims");
    shm::InboxSegment own = shm::InboxSegment::create(key, 4, 256, {});
    std::optional<shm::InboxSegment> peer = shm::InboxSegment::open(key, 256);
    ASSERT_TRUE(peer);
    shm::SplitClaims claims(own.split_claims);
    std::optional<shm::ClaimId> claim = claims.open();
    ASSERT_TRUE(claim);
    EXPECT_TRUE(shm::SplitClaims::take_for_sender(peer->split_claims, *claim));
    EXPECT_FALSE(claims.take_back(*claim));
}

namespace {

// An inbox of ours under a fresh key, published as a peer would see it, with the word a CMA
// probe must read.
struct OwnInbox {
    explicit OwnInbox(const std::string &what, uint64_t auth, uint64_t job,
                      uint64_t probe_value_said)
        : key(unique_key(what)),
          inbox(shm::InboxSegment::create(key, 4, wire::kLocalCellSize,
                                          {.probe_addr = reinterpret_cast<uint64_t>(&word),
                                           .probe_value = probe_value_said,
                                           .auth = auth,
                                           .job = job})) {}
    static inline const uint64_t word = 0x5eed5eed5eed5eedull;
    std::string key;
    shm::InboxSegment inbox;
};

}  // namespace

TEST(PeerInbox, APeerOfTheSameKeyIsOpenedWithItsRingAndPid) {
    OwnInbox own("peer", /*auth=*/5, /*job=*/1, OwnInbox::word);
    std::optional<shm::PeerInbox> peer =
        shm::open_peer(own.key, {}, {.auth = 5, .job = 1, .cma = true});
    ASSERT_TRUE(peer);
    EXPECT_EQ(peer->key, own.key);
    EXPECT_EQ(peer->pid, ::getpid());
    EXPECT_TRUE(peer->same_pid_ns);
    EXPECT_NE(peer->split_claims, nullptr);
    EXPECT_FALSE(peer->dead);
    // Our Outbox to it writes its ring.
    RecordingSender sender;
    wire::LocalHeader fin{};
    fin.op = static_cast<uint8_t>(wire::LocalOp::Fin);
    fin.msg_id = 42;
    peer->out.push(sender, fin, nullptr, 0);
    std::optional<wire::LocalHeader> got = read_header(own.inbox.ring);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->msg_id, 42u);
}

TEST(PeerInbox, AnotherAuthorizationKeyIsNoPeer) {
    OwnInbox own("peer-auth", /*auth=*/5, /*job=*/1, OwnInbox::word);
    EXPECT_FALSE(shm::open_peer(own.key, {}, {.auth = 6, .job = 1, .cma = true}));
    EXPECT_FALSE(shm::open_peer(unique_key("nobody"), {}, {.auth = 5, .job = 1, .cma = true}));
}

TEST(PeerInbox, SingleCopyOnlyWhenAllowedWithinTheJobAndTheProbeReadsTheWord) {
    uint64_t mine = 1;
    if (!cma_probe(::getpid(), &mine, 1)) GTEST_SKIP() << "CMA not permitted here";
    OwnInbox own("peer-cma", /*auth=*/5, /*job=*/1, OwnInbox::word);
    EXPECT_TRUE(shm::open_peer(own.key, {}, {.auth = 5, .job = 1, .cma = true}).value().cma);
    EXPECT_FALSE(shm::open_peer(own.key, {}, {.auth = 5, .job = 1, .cma = false}).value().cma);
    EXPECT_FALSE(shm::open_peer(own.key, {}, {.auth = 5, .job = 2, .cma = true}).value().cma)
        << "another job";
    // A probe that reads something else than the word published (a pid that names another
    // process) does not pass.
    OwnInbox liar("peer-probe", /*auth=*/5, /*job=*/1, OwnInbox::word ^ 1);
    EXPECT_FALSE(shm::open_peer(liar.key, {}, {.auth = 5, .job = 1, .cma = true}).value().cma);
}

// ---- Channel ------------------------------------------------------------------------------

namespace {

// An AV as a channel reads it: fi_addr_t -> address bytes, with a version word that moves on
// every change, and counts of the lookups the channel made.
struct FakeBook final : shm::AddressBook {
    std::atomic<uint64_t> version{1};
    std::map<fi_addr_t, std::string> entries;
    mutable int lookups = 0, reverse_lookups = 0;

    const std::atomic<uint64_t> *version_word() const override { return &version; }
    int lookup(fi_addr_t addr, void *buf, size_t *addrlen) const override {
        ++lookups;
        auto it = entries.find(addr);
        if (it == entries.end()) return -FI_EINVAL;
        if (*addrlen < it->second.size()) return -FI_ETOOSMALL;
        memcpy(buf, it->second.data(), it->second.size());
        *addrlen = it->second.size();
        return 0;
    }
    fi_addr_t addr_of(const void *addr, size_t addrlen) const override {
        ++reverse_lookups;
        for (const auto &[a, bytes] : entries)
            if (bytes == std::string_view(static_cast<const char *>(addr), addrlen)) return a;
        return FI_ADDR_NOTAVAIL;
    }
    void set(fi_addr_t addr, const std::string &bytes) {
        entries[addr] = bytes;
        ++version;
    }
    void remove(fi_addr_t addr) {
        entries.erase(addr);
        ++version;
    }
};

// An IPv4 endpoint address on the loopback, with a port no other test run uses (inboxes are
// named after addresses).
std::string loopback_address(int which) {
    static const uint16_t base = uint16_t(20000 + (::getpid() * 7 + std::rand()) % 40000);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(uint16_t(base + which));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return {reinterpret_cast<const char *>(&sa), sizeof sa};
}

// One endpoint's channel with its inbox open under `address`.
struct OpenChannel {
    explicit OpenChannel(const std::string &address, const FakeBook &book)
        : key(*shm::local_key(address.data(), address.size())), channel(sender, book) {
        channel.open_inbox(key,
                           {.cells = 8, .cell_size = wire::kLocalCellSize, .identity = {.auth = 3}},
                           {.auth = 3});
    }
    std::string key;
    RecordingSender sender;
    shm::Channel channel;
};

wire::LocalHeader fin_of(uint64_t msg_id) {
    wire::LocalHeader fin{};
    fin.op = static_cast<uint8_t>(wire::LocalOp::Fin);
    fin.msg_id = msg_id;
    return fin;
}

}  // namespace

TEST(Channel, ADestinationIsOpenedOnceAndForgottenWhenTheAvChanges) {
    FakeBook book;
    const std::string a = loopback_address(0), b = loopback_address(1);
    OpenChannel ours(a, book), theirs(b, book);
    book.set(5, b);

    shm::PeerInbox *peer = ours.channel.peer_at(5);
    ASSERT_NE(peer, nullptr);
    EXPECT_EQ(peer->key, theirs.key);
    EXPECT_EQ(peer->pid, ::getpid());
    EXPECT_EQ(ours.channel.peer_at(5), peer);
    EXPECT_EQ(book.lookups, 1) << "the second send to it asks the AV nothing";
    EXPECT_EQ(ours.channel.peer_at(6), nullptr) << "not in the AV";

    // The address removed: fi_addr_t 5 names nobody now, and then another endpoint.
    book.remove(5);
    EXPECT_EQ(ours.channel.peer_at(5), nullptr);
    const std::string c = loopback_address(2);
    OpenChannel third(c, book);
    book.set(5, c);
    shm::PeerInbox *now = ours.channel.peer_at(5);
    ASSERT_NE(now, nullptr);
    EXPECT_EQ(now->key, third.key);
    // b's peer is kept (by key): found again without opening its segment twice.
    book.set(7, b);
    EXPECT_EQ(ours.channel.peer_at(7), peer);
}

TEST(Channel, WithoutAnInboxNoPeerIsReached) {
    FakeBook book;
    const std::string b = loopback_address(3);
    OpenChannel theirs(b, book);
    book.set(1, b);
    RecordingSender sender;
    shm::Channel closed(sender, book);  // FI_OPT_SHARED_MEMORY_PERMITTED false: never opened
    EXPECT_FALSE(closed.has_inbox());
    EXPECT_EQ(closed.inbox(), nullptr);
    EXPECT_EQ(closed.wake(), nullptr);
    EXPECT_EQ(closed.peer_at(1), nullptr);
    EXPECT_EQ(closed.sender_peer(b), nullptr);
    EXPECT_EQ(book.lookups, 0);
}

TEST(Channel, ACellThroughAPeersOutboxReachesItsInboxAndItsSenderIsFound) {
    FakeBook book;
    const std::string a = loopback_address(4), b = loopback_address(5);
    OpenChannel ours(a, book), theirs(b, book);
    book.set(0, a);
    book.set(1, b);

    shm::PeerInbox *to_them = ours.channel.peer_at(1);
    ASSERT_NE(to_them, nullptr);
    to_them->out.push(ours.sender, fin_of(77), nullptr, 0);
    std::optional<wire::LocalHeader> got = read_header(theirs.channel.inbox());
    ASSERT_TRUE(got);
    EXPECT_EQ(got->msg_id, 77u);

    // The receiver answers the cell's sender, named by its address bytes.
    shm::PeerInbox *to_us = theirs.channel.sender_peer(a);
    ASSERT_NE(to_us, nullptr);
    EXPECT_EQ(to_us->key, ours.key);
    EXPECT_EQ(theirs.channel.sender_peer(a), to_us);
    EXPECT_EQ(theirs.channel.sender_peer(loopback_address(6)), nullptr) << "no inbox there";

    // The sender's fi_addr_t: asked of the AV once per AV version.
    EXPECT_EQ(theirs.channel.source_of(a), 0u);
    EXPECT_EQ(theirs.channel.source_of(a), 0u);
    EXPECT_EQ(book.reverse_lookups, 1);
    book.remove(0);
    EXPECT_EQ(theirs.channel.source_of(a), FI_ADDR_NOTAVAIL) << "removed from the AV";
    EXPECT_EQ(book.reverse_lookups, 2);
}

TEST(Channel, APeerWhoseProcessDiedIsBuriedOnceWhatItWroteUsIsRead) {
    FakeBook book;
    const std::string a = loopback_address(7), c = loopback_address(8);
    OpenChannel ours(a, book);
    book.set(2, c);

    Pipe ready, go, done;
    Child child([&] {
        FakeBook their_book;
        their_book.set(0, a);
        OpenChannel theirs(c, their_book);
        ready.send(1);
        int v = 0;
        if (!go.receive(v)) return 1;
        shm::PeerInbox *to_us = theirs.channel.peer_at(0);
        if (!to_us) return 2;
        to_us->out.push(theirs.sender, fin_of(9), nullptr, 0);  // its last word to us
        done.send(1);
        return 0;
    });
    int v = 0;
    ASSERT_TRUE(ready.receive(v));
    shm::PeerInbox *peer = ours.channel.peer_at(2);
    ASSERT_NE(peer, nullptr);
    std::vector<std::string> buried;
    auto bury = [&](shm::PeerInbox &p) { buried.push_back(p.key); };
    EXPECT_FALSE(ours.channel.check_peers(bury));
    EXPECT_TRUE(buried.empty()) << "alive";

    go.send(1);
    ASSERT_TRUE(done.receive(v));
    ASSERT_EQ(child.wait(), 0);
    EXPECT_TRUE(ours.channel.check_peers(bury)) << "its Fin is still unread";
    EXPECT_TRUE(buried.empty());
    EXPECT_FALSE(peer->dead);
    EXPECT_TRUE(ours.channel.deaths().empty()) << "logged before its last word was read";
    std::optional<wire::LocalHeader> got = read_header(ours.channel.inbox());
    ASSERT_TRUE(got);
    EXPECT_EQ(got->msg_id, 9u);

    EXPECT_FALSE(ours.channel.check_peers(bury));
    ASSERT_EQ(buried.size(), 1u);
    EXPECT_EQ(buried[0], peer->key);
    EXPECT_TRUE(peer->dead);
    // The death is logged for the endpoint (tandem ends that process's staged messages).
    ASSERT_EQ(ours.channel.deaths().size(), 1u);
    EXPECT_EQ(ours.channel.deaths()[0].key, peer->key);
    EXPECT_EQ(ours.channel.deaths()[0].pid, peer->pid);
    EXPECT_NE(peer->pid, 0);
    EXPECT_EQ(ours.channel.sender_peer(c), nullptr) << "nobody to answer";
    EXPECT_EQ(ours.channel.peer_at(2), peer) << "a destination stays its peer, dead";
    EXPECT_FALSE(ours.channel.check_peers(bury));
    EXPECT_EQ(buried.size(), 1u) << "buried once";
    EXPECT_EQ(ours.channel.deaths().size(), 1u) << "logged once";
}

// An endpoint closes and the same process opens another at its address (fabtests'
// rdm_multi_client -R; or a port the kernel hands out again): what we send to that address,
// by destination or as an answer to its cells, goes into the new one's ring at once, not into
// the closed one's (which nobody reads), and the closed one is buried as a dead one is.
TEST(Channel, AnEndpointReopenedAtAClosedOnesAddressTakesItsKey) {
    FakeBook book;
    const std::string a = loopback_address(9), c = loopback_address(10);
    OpenChannel ours(a, book);
    book.set(2, c);
    auto first = std::make_unique<OpenChannel>(c, book);
    shm::PeerInbox *closed = ours.channel.peer_at(2);
    ASSERT_NE(closed, nullptr);
    ASSERT_EQ(ours.channel.sender_peer(c), closed);
    first.reset();  // (its endpoint closes; this process runs on)
    EXPECT_EQ(closed->out.claim(ours.sender.producer), nullptr) << "nobody reads its ring";
    // Looked up before the next endpoint opens there: nobody new yet (and the next look by
    // destination is not due for kReopenEveryMs).
    EXPECT_EQ(ours.channel.peer_at(2), closed);
    OpenChannel second(c, book);

    // A cell from the address (its sender looked up to answer it) finds the new endpoint at
    // once; lookups by destination lead there from then on.
    shm::PeerInbox *now = ours.channel.sender_peer(c);
    ASSERT_NE(now, nullptr);
    ASSERT_NE(now, closed) << "the closed endpoint's ring, which nobody reads";
    EXPECT_TRUE(now->reachable());
    EXPECT_EQ(ours.channel.peer_at(2), now);
    now->out.push(ours.sender, fin_of(21), nullptr, 0);
    EXPECT_TRUE(ours.channel.answer(c, 22, 0));
    for (uint64_t id : {21u, 22u}) {
        std::optional<wire::LocalHeader> got = read_header(second.channel.inbox());
        ASSERT_TRUE(got) << "cell " << id << " is not in the new endpoint's inbox";
        EXPECT_EQ(got->msg_id, id);
    }

    // The closed one is judged as a dead one (nothing of its is unread here): buried once,
    // its death logged as one that a new endpoint of its process succeeded.
    EXPECT_FALSE(closed->dead);
    std::vector<shm::PeerInbox *> buried;
    auto bury = [&](shm::PeerInbox &p) { buried.push_back(&p); };
    EXPECT_FALSE(ours.channel.check_peers(bury));
    ASSERT_EQ(buried.size(), 1u);
    EXPECT_EQ(buried[0], closed);
    EXPECT_TRUE(closed->dead);
    ASSERT_EQ(ours.channel.deaths().size(), 1u);
    EXPECT_TRUE(ours.channel.deaths()[0].succeeded_in_process);
    EXPECT_FALSE(ours.channel.check_peers(bury));
    EXPECT_EQ(buried.size(), 1u) << "buried once";
    EXPECT_EQ(ours.channel.peer_at(2), now);
    EXPECT_FALSE(now->dead);
}

// SenderHold: the cells of a sender behind its split write, kept by the inbox's reader.

namespace {

// A cell of `op` from `sender`, its id (msg_id, or the Short's tag) marking it.
std::vector<uint8_t> held_cell(wire::LocalOp op, std::string_view sender, uint64_t id) {
    std::vector<uint8_t> cell(wire::kLocalCellSize, 0);
    if (op == wire::LocalOp::Short || op == wire::LocalOp::Atomic) {
        wire::LocalShortHeader s{};
        s.op = static_cast<uint8_t>(op);
        s.name_len = static_cast<uint8_t>(sender.size());
        s.tag = id;
        memcpy(cell.data(), &s, sizeof s);
        memcpy(cell.data() + sizeof s, sender.data(), sender.size());
    } else {
        wire::LocalHeader h{};
        h.op = static_cast<uint8_t>(op);
        h.name_len = static_cast<uint8_t>(sender.size());
        h.msg_id = id;
        memcpy(cell.data(), &h, sizeof h);
        memcpy(cell.data() + sizeof h, sender.data(), sender.size());
    }
    return cell;
}

// The id held_cell() gave a cell.
uint64_t held_id(const uint8_t *cell) {
    if (cell[0] == static_cast<uint8_t>(wire::LocalOp::Short)) {
        wire::LocalShortHeader s;
        memcpy(&s, cell, sizeof s);
        return s.tag;
    }
    wire::LocalHeader h;
    memcpy(&h, cell, sizeof h);
    return h.msg_id;
}

}  // namespace

TEST(SenderHold, KeepsAHeldSendersCellsAndReplaysThemInOrderOnceLifted) {
    shm::SenderHold holds;
    EXPECT_FALSE(holds.active());
    holds.hold("A");
    EXPECT_TRUE(holds.active());
    auto s1 = held_cell(wire::LocalOp::Short, "A", 1), e2 = held_cell(wire::LocalOp::Eager, "A", 2),
         w3 = held_cell(wire::LocalOp::Write, "A", 3), b = held_cell(wire::LocalOp::Short, "B", 9),
         fin = held_cell(wire::LocalOp::Fin, "A", 7);
    EXPECT_TRUE(holds.keep_if_held(s1.data()));
    EXPECT_TRUE(holds.keep_if_held(e2.data()));
    EXPECT_FALSE(holds.keep_if_held(b.data())) << "another sender goes on";
    EXPECT_FALSE(holds.keep_if_held(fin.data())) << "an answer to an operation of ours goes on";
    EXPECT_TRUE(holds.keep_if_held(w3.data()));
    // The cells are copies: the ring's may be reused at once.
    s1.assign(s1.size(), 0xFF);
    std::vector<uint64_t> got;
    auto dispatch = [&](const uint8_t *c) { got.push_back(held_id(c)); };
    holds.replay(dispatch);
    EXPECT_TRUE(got.empty()) << "nothing is released before the lift";
    holds.lift("A");
    EXPECT_TRUE(holds.has_released());
    holds.replay(dispatch);
    EXPECT_EQ(got, (std::vector<uint64_t>{1, 2, 3}));
    EXPECT_FALSE(holds.active());
    EXPECT_FALSE(holds.keep_if_held(e2.data())) << "the hold is gone";
}

TEST(SenderHold, AReplayedWriteThatSplitsAgainHoldsWhatFollowsIt) {
    shm::SenderHold holds;
    holds.hold("A");
    auto w1 = held_cell(wire::LocalOp::Write, "A", 1), s2 = held_cell(wire::LocalOp::Short, "A", 2),
         s3 = held_cell(wire::LocalOp::Short, "A", 3),
         later = held_cell(wire::LocalOp::Eager, "A", 4);
    for (auto *c : {&w1, &s2, &s3}) ASSERT_TRUE(holds.keep_if_held(c->data()));
    holds.lift("A");
    std::vector<uint64_t> got;
    holds.replay([&](const uint8_t *c) {
        got.push_back(held_id(c));
        if (held_id(c) == 1) holds.hold("A");  // the replayed write splits again
    });
    EXPECT_EQ(got, (std::vector<uint64_t>{1}));
    EXPECT_TRUE(holds.active());
    EXPECT_EQ(holds.held_senders(), 1u);
    // A cell newer in the ring waits behind the ones kept again.
    EXPECT_TRUE(holds.keep_if_held(later.data()));
    holds.lift("A");
    holds.replay([&](const uint8_t *c) { got.push_back(held_id(c)); });
    EXPECT_EQ(got, (std::vector<uint64_t>{1, 2, 3, 4}));
    EXPECT_FALSE(holds.active());
}

TEST(SenderHold, ADeadSendersCellsAreForgottenAndTheOthersKept) {
    shm::SenderHold holds;
    holds.hold("A");
    holds.hold("B");
    auto a1 = held_cell(wire::LocalOp::Short, "A", 1), b2 = held_cell(wire::LocalOp::Short, "B", 2),
         a3 = held_cell(wire::LocalOp::Eager, "A", 3);
    for (auto *c : {&a1, &b2, &a3}) ASSERT_TRUE(holds.keep_if_held(c->data()));
    holds.lift("A");  // A's released but not yet replayed when it is found dead
    holds.forget([](std::string_view s) { return s == "A"; });
    EXPECT_FALSE(holds.has_released());
    EXPECT_TRUE(holds.active()) << "B is still held";
    holds.lift("B");
    std::vector<uint64_t> got;
    holds.replay([&](const uint8_t *c) { got.push_back(held_id(c)); });
    EXPECT_EQ(got, (std::vector<uint64_t>{2}));
    EXPECT_FALSE(holds.active());
}

TEST(SenderHold, ACellWhoseNameDoesNotFitIsNeverKept) {
    shm::SenderHold holds;
    std::string long_name(wire::kLocalNameRoom + 1, 'x');
    holds.hold(long_name);
    auto bad = held_cell(wire::LocalOp::Eager, long_name, 1);
    EXPECT_FALSE(holds.keep_if_held(bad.data()));
    EXPECT_EQ(shm::SenderHold::sender_of(bad.data()), std::nullopt);
    EXPECT_EQ(shm::SenderHold::sender_of(held_cell(wire::LocalOp::Rts, "A", 1).data()),
              std::optional<std::string_view>("A"));
}

// shm::RtsLateness (learn_lateness), what makes a sender stage its large messages to a receiver
// that is slow to answer: an Rts posted while earlier ones of ours were still being read waited for
// them (our own traffic, which a staged message would wait behind too), so only its wait past
// the previous Fin counts; one posted after that Fin counts all its wait.
TEST(SendChoice, AnRtsQueuedBehindOursTeachesNoLateness) {
    shm::RtsLateness peer;
    // Two Rts posted 2 ms ago in one window; the receiver read the first after 2 ms.
    const int64_t posted = shm::now_ns() - 2'000'000;
    peer.learn(posted, 0);
    const double first = peer.ns;
    EXPECT_GT(first, 400'000.0) << "a quarter of 2 ms into the moving average";
    // The second right after it: it could not be read sooner, nothing late in it.
    peer.learn(posted, 0);
    const double second = peer.ns;
    EXPECT_LT(second, first);
    // One posted once the receiver had answered, its Fin 3 ms later: all of that is late.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const int64_t later = shm::now_ns();
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    peer.learn(later, 0);
    EXPECT_GT(peer.ns, second + 500'000.0);
}

// shm::device_send, the one decision both providers' senders make for a node-local message of
// device memory. An empty one moves no device memory: one empty Eager cell under every policy
// (an IpcRts naming no buffer is refused by its receiver as malformed).
TEST(SendChoice, AnEmptyDeviceMessageIsAnEagerCellUnderEveryPolicy) {
    for (int mode :
         {FI_HMEM_P2P_ENABLED, FI_HMEM_P2P_PREFERRED, FI_HMEM_P2P_REQUIRED, FI_HMEM_P2P_DISABLED}) {
        hmem::P2pPolicy p2p;
        ASSERT_EQ(p2p.set(mode, true), 0);
        EXPECT_EQ(shm::device_send(p2p, 0, wire::kLocalBodyRoom, true), shm::DeviceSend::Eager)
            << "mode " << mode;
    }
}

// Under FI_HMEM_P2P_REQUIRED a message peer to peer could not carry (no IPC handle) is refused,
// not staged.
TEST(SendChoice, RequiredRefusesADeviceMessageWithoutAHandle) {
    hmem::P2pPolicy p2p;
    ASSERT_EQ(p2p.set(FI_HMEM_P2P_REQUIRED, true), 0);
    EXPECT_EQ(shm::device_send_staged(p2p, 1 << 20, wire::kLocalBodyRoom, true),
              shm::DeviceSend::Refuse);
}

// Staged, a device message larger than a cell goes through one host bounce the receiver reads
// by cross-memory attach, up to kDeviceBounceMax; past it, or without cross-memory attach, in
// cells; up to a cell, in one.
TEST(SendChoice, AStagedDeviceMessageTakesAHostBounceUpToItsLimit) {
    hmem::P2pPolicy p2p;
    ASSERT_EQ(p2p.set(FI_HMEM_P2P_DISABLED, false), 0);
    const size_t cell = wire::kLocalBodyRoom;
    const std::pair<std::tuple<size_t, bool>, shm::DeviceSend> cases[] = {
        {{cell, true}, shm::DeviceSend::Eager},
        {{cell + 1, true}, shm::DeviceSend::HostBounce},
        {{shm::kDeviceBounceMax, true}, shm::DeviceSend::HostBounce},
        {{shm::kDeviceBounceMax + 1, true}, shm::DeviceSend::Frag},
        {{cell + 1, false}, shm::DeviceSend::Frag},
    };
    for (const auto &[in, want] : cases) {
        const auto [len, cma] = in;
        EXPECT_EQ(shm::device_send(p2p, len, cell, cma), want) << len << " bytes, cma " << cma;
    }
}

// shm::SplitShare: a sender that had not begun its part of a split copy by the time the
// reader's part was read (the reader took it back) is asked for less next time, down to an
// eighth of the message, never nothing.
TEST(SplitShare, ASenderLateWithItsPartIsAskedForLess) {
    shm::SplitShare share;
    constexpr size_t n = 1 << 20;
    ASSERT_EQ(share.readers_part(n), n / 2);
    share.taken_back();
    EXPECT_EQ(share.readers_part(n), n - n / 64 * 28);
    for (int i = 0; i < 20; ++i) share.taken_back();
    EXPECT_EQ(share.readers_part(n), n - n / 8);
}

// ... and one that began its part in time is given back a 64th at a time, up to half (the
// reader's part is never less than half).
TEST(SplitShare, ASenderInTimeGetsItsShareBackUpToHalf) {
    shm::SplitShare share;
    constexpr size_t n = 1 << 20;
    for (int i = 0; i < 20; ++i) share.taken_back();
    share.in_time();
    EXPECT_EQ(share.readers_part(n), n - n / 64 * 9);
    for (int i = 0; i < 100; ++i) share.in_time();
    EXPECT_EQ(share.readers_part(n), n / 2);
}
