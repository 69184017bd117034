#include "main_prov/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <utility>
#include <vector>

namespace tandem {

namespace {

// glibc's shm_open names live here; reap_stale lists them and the unlink checks stat them.
constexpr const char *kShmDir = "/dev/shm";

[[noreturn]] void throw_errno(int positive_errno, const std::string &what) {
    throw ShmError(-positive_errno, what + ": " + std::strerror(positive_errno));
}

class FdGuard {
  public:
    explicit FdGuard(int fd) : fd_(fd) {}
    FdGuard(const FdGuard &) = delete;
    FdGuard &operator=(const FdGuard &) = delete;
    ~FdGuard() {
        if (fd_ >= 0) ::close(fd_);
    }
    int get() const { return fd_; }
    void release() { fd_ = -1; }

  private:
    int fd_;
};

class MappingGuard {
  public:
    MappingGuard(void *addr, size_t len) : addr_(addr), len_(len) {}
    MappingGuard(const MappingGuard &) = delete;
    MappingGuard &operator=(const MappingGuard &) = delete;
    ~MappingGuard() {
        if (addr_) ::munmap(addr_, len_);
    }
    char *release() { return static_cast<char *>(std::exchange(addr_, nullptr)); }

  private:
    void *addr_;
    size_t len_;
};

// A POSIX shm name is "/" followed by one path component; anything else is either
// unportable or would escape /dev/shm in the stat/unlink checks below.
void check_name(const std::string &name, const char *what) {
    if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
        name.size() > NAME_MAX || name == "/." || name == "/..")
        throw ShmError(-EINVAL, std::string(what) + " is not a valid shm name: '" + name + "'");
}

std::string path_of(const std::string &name) {
    return kShmDir + name;
}

struct ProcessStat {
    char state;
    uint64_t start_time;
};
enum class StatRead { kOk, kGone, kUnreadable };

// Fields 3 (state) and 22 (start time in clock ticks since boot) of /proc/<pid>/stat.
// Field 2, the command name, is in parentheses and may itself contain spaces or ')', so
// the fields are counted from the last ')'.
StatRead read_process_stat(pid_t pid, ProcessStat &out) {
    std::string path = "/proc/" + std::to_string(pid) + "/stat";
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH ? StatRead::kGone : StatRead::kUnreadable;
    char buf[1024];
    ssize_t n;
    do {
        n = ::read(fd, buf, sizeof(buf) - 1);
    } while (n < 0 && errno == EINTR);
    int read_errno = errno;
    ::close(fd);
    // Reading the stat of a process that exited after the open fails with ESRCH.
    if (n < 0) return read_errno == ESRCH ? StatRead::kGone : StatRead::kUnreadable;
    buf[n] = '\0';
    const char *p = std::strrchr(buf, ')');
    if (!p || p[1] != ' ' || p[2] == '\0') return StatRead::kUnreadable;
    out.state = p[2];
    p += 2;
    for (int field = 3; field < 22; ++field) {  // step from field 3 to field 22
        p = std::strchr(p, ' ');
        if (!p) return StatRead::kUnreadable;
        ++p;
    }
    char *end;
    out.start_time = std::strtoull(p, &end, 10);
    return end == p ? StatRead::kUnreadable : StatRead::kOk;
}

uint64_t own_start_time() {
    ProcessStat st;
    return read_process_stat(::getpid(), st) == StatRead::kOk ? st.start_time : 0;
}

bool process_alive(pid_t pid, uint64_t recorded_start_time) {
    if (pid <= 0) return false;
    // EPERM: a process exists but belongs to someone else; the start time decides.
    if (::kill(pid, 0) != 0 && errno != EPERM) return false;
    ProcessStat st;
    switch (read_process_stat(pid, st)) {
        case StatRead::kGone:
            return false;
        case StatRead::kUnreadable:
            return true;  // cannot tell: assume alive, never remove a live owner's segment
        case StatRead::kOk:
            break;
    }
    // A zombie still answers kill(pid, 0) but will never touch the segment again.
    if (st.state == 'Z' || st.state == 'X') return false;
    return recorded_start_time == 0 || st.start_time == recorded_start_time;
}

// The owner lock: a read lock on the first byte, held through the creator's open file
// description for the life of the process. F_OFD_* locks belong to the description, not to
// a process, so they mean the same in every pid namespace, and they do not interact with
// the flock() that removers take.
struct flock owner_lock_range(short type) {
    struct flock lk {};
    lk.l_type = type;
    lk.l_whence = SEEK_SET;
    lk.l_start = 0;
    lk.l_len = 1;
    return lk;
}

bool owner_lock_held(int fd) {
    if (fd < 0) return true;  // nothing to ask: assume alive, never remove a live owner's segment
    struct flock lk = owner_lock_range(F_WRLCK);
    if (::fcntl(fd, F_OFD_GETLK, &lk) != 0) return true;
    return lk.l_type != F_UNLCK;
}

bool same_object(const std::string &name, dev_t dev, ino_t ino) {
    struct stat st;
    return ::stat(path_of(name).c_str(), &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

}  // namespace

bool process_running(pid_t pid) {
    return process_alive(pid, 0);
}

uint32_t own_process_token() {
    static std::atomic<uint64_t> cached{0};  // pid << 32 | token
    uint64_t word = cached.load(std::memory_order_relaxed);
    auto pid = uint32_t(::getpid());
    if (word != 0 && uint32_t(word >> 32) == pid) return uint32_t(word);
    uint32_t token = 0;
    if (::getrandom(&token, sizeof token, 0) != ssize_t(sizeof token))
        token = pid * 2654435761u ^ uint32_t(own_start_time());
    token |= 0x80000000u;  // never 0, never a pid (pids stay below 2^22)
    cached.store(uint64_t(pid) << 32 | token, std::memory_order_relaxed);
    return token;
}

namespace {
uint64_t namespace_inode(const char *path) {
    struct stat st;
    return ::stat(path, &st) == 0 ? uint64_t(st.st_ino) : 0;
}
}  // namespace

uint64_t own_pid_namespace() {
    return namespace_inode("/proc/self/ns/pid");
}

uint64_t own_net_namespace() {
    return namespace_inode("/proc/self/ns/net");
}

bool pid_namespace_is_ours(uint64_t ns) {
    // Not cached: a child forked after unshare(CLONE_NEWPID) lives in another namespace
    // than the parent whose memory it inherited.
    uint64_t ours = own_pid_namespace();
    // Unknown on either side (no /proc): the pid is all there is.
    return ns == 0 || ours == 0 || ns == ours;
}

ShmSegment ShmSegment::create(const std::string &name, size_t size) {
    check_name(name, "segment name");
    if (size == 0 || size > size_t(std::numeric_limits<off_t>::max()) - kHeaderSize)
        throw ShmError(-EINVAL, "bad shm segment size " + std::to_string(size));
    for (int attempt = 0;; ++attempt) {
        // 0600 here is only a request that the umask may narrow; init_created sets it.
        int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) return init_created(fd, name, kHeaderSize + size);
        int e = errno;
        if (e != EEXIST || attempt == 1) throw_errno(e, "shm_open(create) " + name);
        if (remove_if_stale(name) == Staleness::kKept)
            throw ShmError(-EEXIST, name + " exists and is not a dead owner's segment");
    }
}

ShmSegment ShmSegment::init_created(int fd_raw, const std::string &name, size_t total) {
    FdGuard fd(fd_raw);
    try {
        // The umask may have removed bits (even the owner's); the mode must be exactly 0600
        // for open() to accept the segment.
        if (::fchmod(fd.get(), 0600) != 0) throw_errno(errno, "fchmod " + name);
        if (::ftruncate(fd.get(), off_t(total)) != 0) throw_errno(errno, "ftruncate " + name);
        // Reserve the pages now: a full /dev/shm then fails here with ENOSPC instead of
        // raising SIGBUS in whichever process first touches a missing page.
        if (int e = ::posix_fallocate(fd.get(), 0, off_t(total)); e != 0)
            throw_errno(e, "posix_fallocate " + name);
        struct stat st;
        if (::fstat(fd.get(), &st) != 0) throw_errno(errno, "fstat " + name);
        // Before `ready`: nobody may see the segment without its owner lock.
        struct flock lk = owner_lock_range(F_RDLCK);
        if (::fcntl(fd.get(), F_OFD_SETLK, &lk) != 0) throw_errno(errno, "owner lock " + name);
        void *addr = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
        if (addr == MAP_FAILED) throw_errno(errno, "mmap " + name);
        MappingGuard mapping(addr, total);

        auto *header = new (addr) ShmSegmentHeader{};
        header->magic = ShmSegmentHeader::kMagic;
        header->version = ShmSegmentHeader::kVersion;
        header->header_size = kHeaderSize;
        header->size = total;
        header->owner_pid = ::getpid();
        header->owner_token = own_process_token();
        header->owner_start_time = own_start_time();
        header->owner_pid_ns = own_pid_namespace();
        // Release: an opener that sees `ready` (acquire) also sees every field above.
        header->ready.store(ShmSegmentHeader::kReady, std::memory_order_release);
        ShmSegment seg(name, mapping.release(), total, ::getpid(), st.st_dev, st.st_ino, fd.get());
        fd.release();  // the segment keeps it: the owner lock lives as long as it is open
        return seg;
    } catch (...) {
        ::shm_unlink(name.c_str());  // just created by us under O_EXCL, so ours to remove
        throw;
    }
}

ShmSegment ShmSegment::open(const std::string &name) {
    check_name(name, "segment name");
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) throw_errno(errno, "shm_open " + name);
    FdGuard guard(fd);
    return map_existing(fd, name);
}

ShmSegment ShmSegment::map_existing(int fd, const std::string &name) {
    struct stat st;
    if (::fstat(fd, &st) != 0) throw_errno(errno, "fstat " + name);
    // Whoever can write the segment can steer this process through it: only our own,
    // private segments are trusted.
    if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
        throw ShmError(-EACCES, name + " belongs to another user or is open to others");
    if (st.st_size == 0) throw ShmError(-EAGAIN, name + " is still being created");
    if (size_t(st.st_size) < kHeaderSize) throw ShmError(-EPROTO, name + " is too small");
    size_t total = size_t(st.st_size);
    void *addr = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) throw_errno(errno, "mmap " + name);
    MappingGuard mapping(addr, total);

    auto *header = static_cast<ShmSegmentHeader *>(addr);
    // Acquire pairs with the creator's release: the other fields are complete once ready.
    if (header->ready.load(std::memory_order_acquire) != ShmSegmentHeader::kReady)
        throw ShmError(-EAGAIN, name + " is still being created");
    if (header->magic != ShmSegmentHeader::kMagic ||
        header->version != ShmSegmentHeader::kVersion || header->header_size != kHeaderSize ||
        header->size != total)
        throw ShmError(-EPROTO, name + " is not a tandem segment of this version");
    ShmSegment seg(name, mapping.release(), total, 0, st.st_dev, st.st_ino, -1);
    // An owner in another pid namespace is asked through the object itself (its lock).
    if (!seg.owner_shares_pid_namespace()) {
        seg.lock_fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (seg.lock_fd_ < 0) throw_errno(errno, "dup " + name);
    }
    return seg;
}

ShmSegment::Staleness ShmSegment::remove_if_stale(const std::string &name) {
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return errno == ENOENT ? Staleness::kGone : Staleness::kKept;
    FdGuard guard(fd);
    try {
        ShmSegment seg = map_existing(fd, name);
        if (seg.owner_alive()) return Staleness::kKept;
        // Two removers can find the same dead segment; the second must not unlink a fresh
        // segment the first has created under the name meanwhile. Removers serialise on a
        // lock on the dead object itself and unlink only while the name still refers to it.
        while (::flock(fd, LOCK_EX) != 0)
            if (errno != EINTR) return Staleness::kKept;
        if (!same_object(name, seg.dev_, seg.ino_)) return Staleness::kGone;
        if (::shm_unlink(name.c_str()) != 0)
            return errno == ENOENT ? Staleness::kGone : Staleness::kKept;
        return Staleness::kRemoved;
    } catch (const ShmError &) {
        return Staleness::kKept;  // not ours, not ready, or not of this layout
    }
}

std::vector<std::string> ShmSegment::names_with_prefix(const std::string &prefix) {
    check_name(prefix, "segment name prefix");
    DIR *dir = ::opendir(kShmDir);
    if (!dir) throw_errno(errno, std::string("opendir ") + kShmDir);
    std::vector<std::string> names;
    const char *entry_prefix = prefix.c_str() + 1;  // directory entries lack the '/'
    size_t entry_prefix_len = prefix.size() - 1;
    while (const dirent *entry = ::readdir(dir))
        if (std::strncmp(entry->d_name, entry_prefix, entry_prefix_len) == 0) {
            std::string name = "/";
            name += entry->d_name;
            names.push_back(std::move(name));
        }
    ::closedir(dir);
    return names;
}

size_t ShmSegment::reap_stale(const std::string &prefix) {
    // Collected first: the directory changes under us as segments are removed.
    size_t removed = 0;
    for (const std::string &name : names_with_prefix(prefix))
        if (remove_if_stale(name) == Staleness::kRemoved) ++removed;
    return removed;
}

ShmSegment::ShmSegment(ShmSegment &&other) noexcept
    : name_(std::move(other.name_)),
      base_(std::exchange(other.base_, nullptr)),
      mapped_size_(std::exchange(other.mapped_size_, 0)),
      creator_pid_(std::exchange(other.creator_pid_, 0)),
      dev_(other.dev_),
      ino_(other.ino_),
      lock_fd_(std::exchange(other.lock_fd_, -1)) {}

ShmSegment &ShmSegment::operator=(ShmSegment &&other) noexcept {
    if (this != &other) {
        release();
        name_ = std::move(other.name_);
        base_ = std::exchange(other.base_, nullptr);
        mapped_size_ = std::exchange(other.mapped_size_, 0);
        creator_pid_ = std::exchange(other.creator_pid_, 0);
        dev_ = other.dev_;
        ino_ = other.ino_;
        lock_fd_ = std::exchange(other.lock_fd_, -1);
    }
    return *this;
}

ShmSegment::~ShmSegment() {
    release();
}

void ShmSegment::release() noexcept {
    if (!base_) return;
    // A forked child inherits the object but not the ownership of the name; and the name
    // is only ours while it still refers to the object we created.
    if (is_creator()) {
        reinterpret_cast<ShmSegmentHeader *>(base_)->ready.store(ShmSegmentHeader::kClosed,
                                                                 std::memory_order_release);
        if (same_object(name_, dev_, ino_)) ::shm_unlink(name_.c_str());
    }
    ::munmap(base_, mapped_size_);
    base_ = nullptr;
    if (lock_fd_ >= 0) ::close(std::exchange(lock_fd_, -1));
}

bool ShmSegment::is_creator() const noexcept {
    return creator_pid_ != 0 && creator_pid_ == ::getpid();
}

bool ShmSegment::owner_alive() const {
    if (closed()) return false;  // (its owner let go of it, and runs on)
    if (owner_shares_pid_namespace())
        return process_alive(header()->owner_pid, header()->owner_start_time);
    return owner_lock_held(lock_fd_);
}

bool ShmSegment::owner_shares_pid_namespace() const {
    return pid_namespace_is_ours(header()->owner_pid_ns);
}

bool ProcessWatch::alive(uint32_t token) {
    if (token == own_process_token()) return true;
    if (auto it = found_.find(token); it != found_.end()) {
        if (it->second.owner_alive()) return true;
        // That segment's owner let go of it: it died, or only closed that endpoint (an
        // owner in another pid namespace is seen through the segment's lock) and runs on
        // with another. Look again.
        found_.erase(it);
    }
    // First question about this token: find a segment its process owns. Rare (a ring cell
    // left claimed, a collective member to check), so a walk of the directory is fine.
    std::vector<std::string> names;
    try {
        names = ShmSegment::names_with_prefix(prefix_);
    } catch (const ShmError &) {
        return true;  // cannot tell: never hand a live producer's cell to another
    }
    for (const std::string &name : names) {
        try {
            ShmSegment seg = ShmSegment::open(name);
            if (seg.owner_token() != token || !seg.owner_alive()) continue;
            found_.emplace(token, std::move(seg));
            return true;
        } catch (const ShmError &) {
            // gone meanwhile, another user's, still being made: not this process's answer
        }
    }
    return false;
}

}  // namespace tandem
