// ShmSegment: a named POSIX shared-memory object that off_tandem's processes on one node
// share. The creator owns the name; a header at offset 0 records who that is, so a segment
// left behind by a crashed process can be recognised and removed.
//
// Peers share one /dev/shm, but not always one pid namespace (containers that share /dev/shm
// and nothing else). Where the owner's pid namespace is ours, the owner is identified by pid
// plus the pid's start time; elsewhere a pid means nothing here, and the owner is alive while
// it holds its lock on the object (an open-file-description lock, which the kernel drops when
// the owner dies however it dies).
#pragma once

#include "common/fabric_error.h"

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace tandem {

// A failed shared-memory operation. err is a negative errno; FabricError's code is the same
// value made positive, so the provider's ABI boundary returns it as -FI_E* unchanged (the
// FI_E* codes used here equal their errno values).
struct ShmError : FabricError {
    ShmError(int negative_errno, const std::string &what)
        : FabricError(-negative_errno, what), err(negative_errno) {}
    int err;
};

// The first bytes of every segment. Fields other than `ready` are written once, before
// `ready`, by the creator; anyone else reads them only after seeing `ready` set. The creator
// sets `ready` to kClosed when it lets go of the segment (its endpoint closed, its process
// running on): its owner is then gone for every reader, as a dead one is.
struct ShmSegmentHeader {
    static constexpr uint64_t kMagic = 0x54414e44454d5348ULL;  // "TANDEMSH"
    static constexpr uint32_t kVersion = 2;
    static constexpr uint32_t kReady = 1;
    static constexpr uint32_t kClosed = 2;

    uint64_t magic;
    uint32_t version;
    uint32_t header_size;       // where the caller's bytes begin
    uint64_t size;              // whole object, header included
    int32_t owner_pid;          // in the owner's pid namespace
    uint32_t owner_token;       // own_process_token() of the owner
    uint64_t owner_start_time;  // field 22 of /proc/<pid>/stat; 0 when /proc was unreadable
    std::atomic<uint32_t> ready;
    uint32_t reserved;
    uint64_t owner_pid_ns;  // own_pid_namespace() of the owner
};
// Another process may map the same bytes: the layout and the atomic must not depend on
// anything but these types.
static_assert(std::is_standard_layout_v<ShmSegmentHeader>);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(sizeof(ShmSegmentHeader) == 56);

// Whether process `pid` (of our pid namespace) still runs (exists and is no zombie). Without
// its start time a recycled pid counts as alive (the safe answer).
bool process_running(pid_t pid);

// This process's name in shared memory, meaningful in every pid namespace: a random word,
// never 0 and never a pid (bit 31 set), drawn again in a forked child. Ring claims and
// collective members carry it; ProcessWatch tells whether its process still runs.
uint32_t own_process_token();

// The pid and network namespaces of this process (the inodes of /proc/self/ns/pid and
// /proc/self/ns/net); 0 when unreadable.
uint64_t own_pid_namespace();
uint64_t own_net_namespace();
// Whether a pid recorded with pid namespace `ns` (an own_pid_namespace() value) names the same
// process here; true when either side's namespace is unknown (0).
bool pid_namespace_is_ours(uint64_t ns);

class ShmSegment {
  public:
    // The caller's bytes start here, one cache line in, so whatever is placed there (a
    // ShmRing, say) starts on its own line.
    static constexpr size_t kHeaderSize = 64;

    // Creates `name` ("/something", no other '/') with `size` bytes for the caller, readable
    // and writable by this user only. A name left behind by a dead owner is removed and
    // the creation retried once; a live owner's name fails with -EEXIST. So does a name whose
    // creator died before finishing the header: nothing in it says who that was.
    static ShmSegment create(const std::string &name, size_t size);

    // Maps an existing segment read-write. Refuses (-EACCES) one that belongs to another
    // user or is open to group/others, -EAGAIN while its creator is still writing the
    // header, -EPROTO when it is not a segment of this layout.
    static ShmSegment open(const std::string &name);

    // Removes every segment under /dev/shm whose name starts with `prefix` ("/something")
    // and whose owner is dead. Segments of live owners, of other users and ones that are not
    // of this layout are left alone. Returns how many were removed.
    static size_t reap_stale(const std::string &prefix);
    // The names ("/something") in /dev/shm that start with `prefix`, whatever they are.
    static std::vector<std::string> names_with_prefix(const std::string &prefix);

    ShmSegment(ShmSegment &&other) noexcept;
    ShmSegment &operator=(ShmSegment &&other) noexcept;
    ShmSegment(const ShmSegment &) = delete;
    ShmSegment &operator=(const ShmSegment &) = delete;
    // Unmaps; the creating process also removes the name (a forked child does not).
    ~ShmSegment();

    // Whether the creating process still runs. In our pid namespace: it exists, is not a
    // zombie, and its start time is the one recorded (so a recycled pid does not count).
    // In another one: it still holds its lock on the object.
    bool owner_alive() const;
    // Whether its owner let go of it (closed that endpoint) and may run on: a peer that finds
    // it so looks for a new endpoint at the address (Channel::peer_of). One load, for the
    // send paths; owner_alive() says it too, among its dearer checks.
    bool closed() const noexcept {
        return header()->ready.load(std::memory_order_acquire) == ShmSegmentHeader::kClosed;
    }
    // The word that says so, for a writer that checks it before each cell (Outbox::claim).
    const std::atomic<uint32_t> *ready_word() const noexcept { return &header()->ready; }
    // Whether the owner's pid means the same process here: only then may its pid be used
    // (cross-memory attach, kill).
    bool owner_shares_pid_namespace() const;
    uint32_t owner_token() const noexcept { return header()->owner_token; }

    void *data() const noexcept { return base_ + kHeaderSize; }
    size_t data_size() const noexcept { return mapped_size_ - kHeaderSize; }
    const std::string &name() const noexcept { return name_; }
    pid_t owner_pid() const noexcept { return header()->owner_pid; }
    // True in the process that created the name (not in a child forked from it).
    bool is_creator() const noexcept;

  private:
    ShmSegment(std::string name, char *base, size_t mapped_size, pid_t creator_pid, dev_t dev,
               ino_t ino, int lock_fd)
        : name_(std::move(name)),
          base_(base),
          mapped_size_(mapped_size),
          creator_pid_(creator_pid),
          dev_(dev),
          ino_(ino),
          lock_fd_(lock_fd) {}
    const ShmSegmentHeader *header() const noexcept {
        return reinterpret_cast<const ShmSegmentHeader *>(base_);
    }
    enum class Staleness { kRemoved, kGone, kKept };
    static Staleness remove_if_stale(const std::string &name);
    static ShmSegment map_existing(int fd, const std::string &name);
    static ShmSegment init_created(int fd, const std::string &name, size_t total);
    void release() noexcept;

    std::string name_;
    char *base_ = nullptr;
    size_t mapped_size_ = 0;
    pid_t creator_pid_ = 0;  // the process that created the name; 0 for an opener
    dev_t dev_ = 0;          // identity of the object, to unlink only our own name
    ino_t ino_ = 0;
    // The creator's: holds the owner lock. An opener's, when the owner is in another pid
    // namespace: the descriptor its liveness is probed through. Otherwise -1.
    int lock_fd_ = -1;
};

// Whether processes named by their tokens (own_process_token()) still run, in whatever pid
// namespace they are: a segment the process owns under `prefix` answers (owner_alive()). The
// segment found for a token is kept, so asking again costs one check, not a search.
class ProcessWatch {
  public:
    explicit ProcessWatch(std::string prefix) : prefix_(std::move(prefix)) {}
    // False when no segment of a live owner carries the token (a process that died, or a
    // token nobody has).
    bool alive(uint32_t token);

  private:
    std::string prefix_;
    std::unordered_map<uint32_t, ShmSegment> found_;
};

}  // namespace tandem
