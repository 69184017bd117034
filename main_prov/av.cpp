#include "main_prov/av.h"

#include "common/fabric_compat.h"

#include "main_prov/av_set.h"

#include "main_prov/domain.h"
#include "main_prov/eq.h"

#include <arpa/inet.h>
#include <climits>
#include <fcntl.h>
#include <netdb.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>

#include <cstdio>
#include <cstring>

namespace tandem {

namespace {

fi_ops av_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&Av::close>::call<fid>,
    .bind = &Trampoline<&Av::bind>::call<fid>,
    .control = &Trampoline<&Av::control>::call<fid>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

// 1.20's table (common/fabric_compat.h): an application of 1.17 sees its first part only.
compat::AvOps1_20 av_ops = {
    .size = sizeof(compat::AvOps1_20),
    .insert = &Trampoline<&Av::insert>::call<fid_av>,
    .insertsvc = &Trampoline<&Av::insertsvc>::call<fid_av>,
    .insertsym = &Trampoline<&Av::insertsym>::call<fid_av>,
    .remove = &Trampoline<&Av::remove>::call<fid_av>,
    .lookup = &Trampoline<&Av::lookup>::call<fid_av>,
    .straddr = &Trampoline<&Av::straddr>::call<fid_av>,
    .av_set = &Trampoline<&Av::av_set>::call<fid_av>,
    // Authorization keys per AV entry (FI_AV_AUTH_KEY) are not offered: docs/compatibility.md.
    .insert_auth_key = enosys<decltype(compat::AvOps1_20::insert_auth_key)>,
    .lookup_auth_key = enosys<decltype(compat::AvOps1_20::lookup_auth_key)>,
    .set_user_id = &Trampoline<&Av::set_user_id_of>::call<fid_av>,
};

constexpr uint32_t kSharedAvMagic = 0x74617631;  // "tav1"
// glibc's shm_open names are the files of this directory: a named AV is built as an unnamed
// file here and linked under its name once complete.
constexpr const char *kShmDir = "/dev/shm";
// Publishing loses to another creator, whose AV is then joined; should that one be closed
// (and its name removed) before it is opened, creation starts over, at most this often.
constexpr int kPublishAttempts = 8;

// Test hook: with TANDEM_TEST_AV_STOP_BEFORE_PUBLISH=1 the creator of a named AV stops itself
// (SIGSTOP) once the AV is built and before it is published, so that tests can open the
// name, or kill the creator, at exactly that point.
void test_hook_before_publish() {
    const char *v = getenv("TANDEM_TEST_AV_STOP_BEFORE_PUBLISH");
    if (v && v[0] == '1') raise(SIGSTOP);
}

}  // namespace

// Layout of a named AV in shared memory: a header, then `capacity` entries. Entries are
// appended with an atomic counter; an entry becomes visible when its state turns Valid
// (release), and every change bumps `version` so other processes refresh their view.
// The segment appears under its name only complete (see create_shared); `magic` is stored
// last (release) and checked first (acquire) all the same.
struct Av::SharedSegment {
    struct Entry {
        std::atomic<uint32_t> state;  // 0 empty, 1 valid, 2 removed
        uint32_t len;
        sockaddr_in6 addr;  // large enough for either family
    };
    std::atomic<uint32_t> magic;
    uint32_t addr_format;
    uint64_t capacity;
    std::atomic<uint64_t> count;
    std::atomic<uint64_t> version;
    Entry entries[];

    static constexpr uint32_t kEmpty = 0, kValid = 1, kRemoved = 2;
};

std::string EndpointName::to_string() const {
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (ss.ss_family == AF_INET) {
        auto *in = reinterpret_cast<const sockaddr_in *>(&ss);
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
        return std::string("fi_sockaddr_in://") + host + ":" + std::to_string(port);
    }
    if (ss.ss_family == AF_INET6) {
        auto *in6 = reinterpret_cast<const sockaddr_in6 *>(&ss);
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
        return std::string("fi_sockaddr_in6://[") + host + "]:" + std::to_string(port);
    }
    return "fi_addr_unspec://";
}

bool EndpointName::from_bytes(const void *bytes, size_t len, EndpointName &out) {
    if (len < sizeof(sa_family_t)) return false;
    sa_family_t family;
    memcpy(&family, bytes, sizeof family);
    size_t need = family == AF_INET    ? sizeof(sockaddr_in)
                  : family == AF_INET6 ? sizeof(sockaddr_in6)
                                       : 0;
    if (!need || len < need) return false;
    out.ss = {};
    memcpy(&out.ss, bytes, need);
    if (family == AF_INET6) {
        // Only the fields that name an endpoint count.
        auto *in6 = reinterpret_cast<sockaddr_in6 *>(&out.ss);
        in6->sin6_flowinfo = 0;
    } else {
        memset(reinterpret_cast<sockaddr_in *>(&out.ss)->sin_zero, 0, 8);
    }
    return true;
}

Av::Av(Domain *domain, const fi_av_attr &attr, void *context)
    : domain_(domain), type_(FI_AV_TABLE), addr_format_(domain->info()->addr_format) {
    int type = raw_enum(attr.type);
    if (type != FI_AV_UNSPEC && type != FI_AV_MAP && type != FI_AV_TABLE)
        fail(FI_EINVAL, "unknown AV type");
    if (type == FI_AV_MAP) type_ = FI_AV_MAP;
    if (attr.rx_ctx_bits) fail(FI_ENOSYS, "scalable endpoints are not supported");
    if (attr.flags & ~uint64_t(FI_EVENT | FI_SYMMETRIC | FI_READ | FI_AV_USER_ID))
        fail(FI_EINVAL, "unsupported AV flags");
    // FI_AV_USER_ID on the AV (2.0): user IDs come from fi_av_set_user_id, and a completion
    // from an entry that has none names no source.
    ids_from_set_ = ids_in_use_ = attr.flags & FI_AV_USER_ID;
    if (ids_from_set_ && attr.name) fail(FI_EINVAL, "FI_AV_USER_ID on a shared AV");
    addrlen_ = addr_format_ == FI_SOCKADDR_IN6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    names_.reserve(attr.count);
    async_ = attr.flags & FI_EVENT;
    if (attr.name) {
        open_shared(attr);
        map_table_.resize(shared_->capacity);
        for (size_t i = 0; i < map_table_.size(); ++i) map_table_[i] = i;
    } else if (attr.flags & FI_READ)
        fail(FI_EINVAL, "FI_READ names an existing shared AV");
    init_fid(FI_CLASS_AV, context, &av_fi_ops);
    fid()->ops = reinterpret_cast<fi_ops_av *>(&av_ops);
    domain_->hold();
}

// A named AV is created atomically: built complete in an unnamed file, then linked under its
// name, which fails if the name exists. A process opening the name therefore finds nothing or
// a finished AV, never one half made (shm_open(O_CREAT | O_EXCL) followed by initialisation
// let an opener in between see no header and fail), and a creator that dies while building
// leaves nothing behind for anyone to wait for.
void Av::open_shared(const fi_av_attr &attr) {
    shared_name_ = attr.name[0] == '/' ? attr.name : std::string("/") + attr.name;
    if (shared_name_.size() < 2 || shared_name_.size() > NAME_MAX ||
        shared_name_.find('/', 1) != std::string::npos)
        fail(FI_EINVAL, "a shared AV's name is one file name");
    read_only_ = attr.flags & FI_READ;
    if (read_only_) {
        int fd = shm_open(shared_name_.c_str(), O_RDONLY | O_CLOEXEC, 0);
        if (fd < 0)
            fail(errno == ENOENT   ? FI_ENOENT
                 : errno == EACCES ? FI_EACCES
                                   : FI_EINVAL,
                 "cannot open the shared AV");
        join_shared(fd);
        return;
    }
    const size_t capacity = attr.count ? attr.count : 1024;
    for (int attempt = 0; attempt < kPublishAttempts; ++attempt) {
        int fd = shm_open(shared_name_.c_str(), O_RDWR | O_CLOEXEC, 0);
        if (fd >= 0) {
            join_shared(fd);
            return;
        }
        if (errno != ENOENT)
            fail(errno == EACCES ? FI_EACCES : FI_EINVAL, "cannot open the shared AV");
        if (create_shared(capacity)) return;
    }
    fail(FI_EAGAIN, "the shared AV kept being created and removed while it was opened");
}

// Maps the AV another process published under the name (fd is consumed).
void Av::join_shared(int fd) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || size_t(st.st_size) < sizeof(SharedSegment)) {
        ::close(fd);
        fail(FI_EINVAL, "shared AV segment is not a tandem AV");
    }
    // Ours alone, as we create them: a file of that name that another user owns, or that
    // others may write, could hold addresses someone else chose for us.
    if (st.st_uid != geteuid() || (st.st_mode & 077)) {
        ::close(fd);
        fail(FI_EACCES, "the shared AV " + shared_name_ +
                            " is another user's or others may write it: not joined");
    }
    shared_size_ = static_cast<size_t>(st.st_size);
    void *mem = mmap(nullptr, shared_size_, read_only_ ? PROT_READ : PROT_READ | PROT_WRITE,
                     MAP_SHARED, fd, 0);
    ::close(fd);
    if (mem == MAP_FAILED) fail(FI_ENOMEM, "cannot map the shared AV");
    auto *seg = static_cast<SharedSegment *>(mem);
    if (seg->magic.load(std::memory_order_acquire) != kSharedAvMagic ||
        seg->addr_format != addr_format_ ||
        seg->capacity > (shared_size_ - sizeof(SharedSegment)) / sizeof(SharedSegment::Entry)) {
        munmap(mem, shared_size_);
        fail(FI_EINVAL, "shared AV segment is not a compatible tandem AV");
    }
    shared_ = seg;
}

// Builds a new AV of `capacity` entries and publishes it under the name: true when it is
// ours, false when another process published one first (nothing of ours is left then).
bool Av::create_shared(size_t capacity) {
    int fd = open(kShmDir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) fail(errno == ENOSPC ? FI_ENOSPC : FI_EINVAL, "cannot create the shared AV");
    const size_t size = sizeof(SharedSegment) + capacity * sizeof(SharedSegment::Entry);
    // (The umask may have narrowed the mode; the AV is the user's alone: 0600.)
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
        ::close(fd);
        fail(FI_ENOMEM, "cannot size the shared AV");
    }
    void *mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
        ::close(fd);
        fail(FI_ENOMEM, "cannot map the shared AV");
    }
    auto *seg = static_cast<SharedSegment *>(mem);
    seg->addr_format = addr_format_;
    seg->capacity = capacity;
    seg->count.store(0, std::memory_order_relaxed);
    seg->version.store(1, std::memory_order_relaxed);
    seg->magic.store(kSharedAvMagic, std::memory_order_release);
    test_hook_before_publish();
    const std::string proc = "/proc/self/fd/" + std::to_string(fd);
    const std::string path = std::string(kShmDir) + shared_name_;
    int ret = linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW);
    int err = errno;
    struct stat st {};
    if (ret == 0 && fstat(fd, &st) == 0) shared_file_ = {st.st_dev, st.st_ino};
    ::close(fd);
    if (ret != 0) {
        munmap(mem, size);
        if (err == EEXIST) return false;
        fail(FI_EINVAL, "cannot publish the shared AV " + shared_name_ + ": " + strerror(err));
    }
    shared_ = seg;
    shared_size_ = size;
    shared_owner_ = true;
    return true;
}

void Av::sync_shared() const {
    if (!shared_) return;
    uint64_t v = shared_->version.load(std::memory_order_acquire);
    if (v == shared_seen_) return;
    shared_seen_ = v;
    uint64_t n =
        std::min<uint64_t>(shared_->count.load(std::memory_order_acquire), shared_->capacity);
    names_.resize(n);
    valid_.assign(n, false);
    reverse_.clear();
    for (uint64_t i = 0; i < n; ++i) {
        const auto &e = shared_->entries[i];
        if (e.state.load(std::memory_order_acquire) != SharedSegment::kValid) continue;
        if (!EndpointName::from_bytes(&e.addr, e.len, names_[i])) continue;
        valid_[i] = true;
        reverse_.emplace(names_[i].key(), i);
    }
}

FabricAddr Av::append(const EndpointName &name) {
    // (For a named AV, reverse_ is the segment as sync_shared last read it.)
    if (auto it = reverse_.find(name.key()); it != reverse_.end()) {
        ++extra_inserts_[it->second];
        return it->second;
    }
    if (!shared_) {
        FabricAddr fa;
        if (!free_.empty()) {
            fa = *free_.begin();
            free_.erase(free_.begin());
            names_[fa] = name;
            valid_[fa] = true;
        } else {
            fa = names_.size();
            names_.push_back(name);
            valid_.push_back(true);
        }
        reverse_.emplace(name.key(), fa);
        return fa;
    }
    uint64_t i = shared_->count.fetch_add(1);
    if (i >= shared_->capacity) {
        shared_->count.fetch_sub(1);
        fail(FI_ENOSPC, "shared AV is full");
    }
    auto &e = shared_->entries[i];
    e.len = name.length();
    memcpy(&e.addr, &name.ss, name.length());
    e.state.store(SharedSegment::kValid, std::memory_order_release);
    shared_->version.fetch_add(1, std::memory_order_acq_rel);
    sync_shared();
    return i;
}

Av::~Av() {
    if (shared_) {
        munmap(shared_, shared_size_);
        // Only the AV this process published: the name may have been removed and given to a
        // new AV since (by another process), which must stay.
        struct stat st {};
        const std::string path = std::string(kShmDir) + shared_name_;
        if (shared_owner_ && stat(path.c_str(), &st) == 0 && st.st_dev == shared_file_.first &&
            st.st_ino == shared_file_.second)
            shm_unlink(shared_name_.c_str());
    }
    domain_->release();
}

int Av::close() {
    {
        std::lock_guard guard(domain_->lock());
        if (refs_) return -FI_EBUSY;
    }
    delete this;
    return 0;
}

// fi_export_fid: the fid_peer_av a peer provider imports with fi_av_open(FI_PEER).
int Av::control(int command, void *arg) {
    if (command != FI_EXPORT_FID) return -FI_ENOSYS;
    auto *exp = static_cast<fi_fid_export *>(arg);
    if (!exp || !exp->fid) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    if (!exported_) exported_ = std::make_unique<PeerAvAnswers>(*this, false);
    *exp->fid = exported_->exported().base_fid();
    return 0;
}

int Av::bind(struct fid *bfid, uint64_t flags) {
    if (!bfid || bfid->fclass != FI_CLASS_EQ || flags) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    eq_ = Eq::of(bfid);
    return 0;
}

int Av::finish_insert(int done, size_t count, uint64_t flags, void *context) {
    if (!(flags & FI_EVENT)) return done;
    // Asynchronous form: the count arrives as an FI_AV_COMPLETE event; 0 returned now.
    fi_eq_entry entry{};
    entry.fid = base_fid();
    entry.context = context;
    entry.data = static_cast<uint64_t>(done);
    eq_->post(FI_AV_COMPLETE, &entry, sizeof entry);
    (void)count;
    return 0;
}

int Av::insert(const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *context) {
    if (count && !addr) return -FI_EINVAL;
    if (flags & ~uint64_t(FI_MORE | FI_EVENT | FI_SYNC_ERR | FI_AV_USER_ID)) return -FI_EBADFLAGS;
    // FI_AV_USER_ID: fi_addr holds the user IDs on input (and the fi_addr_t values on output).
    if ((flags & FI_AV_USER_ID) && (!fi_addr || shared_ || ids_from_set_)) return -FI_EINVAL;
    if (async_) flags |= FI_EVENT;
    if ((flags & FI_EVENT) && !eq_) return -FI_ENOEQ;
    if ((flags & FI_SYNC_ERR) && (flags & FI_EVENT)) return -FI_EINVAL;
    int *sync_err = (flags & FI_SYNC_ERR) ? static_cast<int *>(context) : nullptr;
    if (read_only_) return -FI_EOPNOTSUPP;
    std::lock_guard guard(domain_->lock());
    sync_shared();
    int done = 0;
    for (size_t i = 0; i < count; ++i) {
        EndpointName name;
        const auto *bytes = static_cast<const uint8_t *>(addr) + i * addrlen_;
        bool ok = EndpointName::from_bytes(bytes, addrlen_, name);
        if (!ok) {
            if (fi_addr) fi_addr[i] = FI_ADDR_NOTAVAIL;
            if (sync_err) sync_err[i] = -FI_EINVAL;
            if (flags & FI_EVENT) {
                eq_->post_error(base_fid(), context, FI_EINVAL, nullptr, 0, i);
            }
            continue;
        }
        FabricAddr fa = append(name);
        if (flags & FI_AV_USER_ID) set_user_id(fa, fi_addr[i]);
        if (fi_addr) fi_addr[i] = fa;
        if (sync_err) sync_err[i] = 0;
        ++done;
    }
    ++version_;
    if (done) domain_->av_learnt_sources(this);
    return finish_insert(done, count, flags, context);
}

int Av::insertsvc(const char *node, const char *service, fi_addr_t *fi_addr, uint64_t flags,
                  void *context) {
    if (!node || !service) return -FI_EINVAL;
    if (async_) flags |= FI_EVENT;
    if ((flags & FI_EVENT) && !eq_) return -FI_ENOEQ;
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = addr_format_ == FI_SOCKADDR_IN6 ? AF_INET6 : AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(node, service, &hints, &res) || !res) {
        if (fi_addr) *fi_addr = FI_ADDR_NOTAVAIL;
        if (!(flags & FI_EVENT)) return 0;
        // fi_av(3): an error event for the address that failed, then the completion.
        eq_->post_error(base_fid(), context, FI_EINVAL, nullptr, 0, 0);
        return finish_insert(0, 1, flags, context);
    }
    sockaddr_storage ss{};
    memcpy(&ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return insert(&ss, 1, fi_addr, flags, context);
}

int Av::insertsym(const char *node, size_t nodecnt, const char *service, size_t svccnt,
                  fi_addr_t *fi_addr, uint64_t flags, void *context) {
    // node: a dotted IPv4 address incremented nodecnt times; service: a port incremented
    // svccnt times (fi_av(3)).
    if (!node || !service || addr_format_ != FI_SOCKADDR_IN) return -FI_EINVAL;
    in_addr base{};
    if (inet_pton(AF_INET, node, &base) != 1) return -FI_EINVAL;
    unsigned long port = strtoul(service, nullptr, 10);
    std::vector<sockaddr_in> addrs;
    for (size_t n = 0; n < nodecnt; ++n) {
        for (size_t s = 0; s < svccnt; ++s) {
            sockaddr_in in{};
            in.sin_family = AF_INET;
            in.sin_addr.s_addr = htonl(ntohl(base.s_addr) + static_cast<uint32_t>(n));
            in.sin_port = htons(static_cast<uint16_t>(port + s));
            addrs.push_back(in);
        }
    }
    return insert(addrs.data(), addrs.size(), fi_addr, flags, context);
}

int Av::remove(fi_addr_t *fi_addr, size_t count, uint64_t flags) {
    if (flags) return -FI_EBADFLAGS;
    if (count && !fi_addr) return -FI_EINVAL;
    if (read_only_) return -FI_EOPNOTSUPP;
    std::lock_guard guard(domain_->lock());
    sync_shared();
    int ret = 0;
    for (size_t i = 0; i < count; ++i) {
        FabricAddr fa = fi_addr[i];
        if (fa >= names_.size() || !valid_[fa]) {
            ret = -FI_EINVAL;
            continue;
        }
        if (auto extra = extra_inserts_.find(fa); extra != extra_inserts_.end()) {
            if (--extra->second == 0) extra_inserts_.erase(extra);
            continue;  // still inserted by an earlier insert
        }
        valid_[fa] = false;
        if (fa < user_ids_.size()) user_ids_[fa] = FI_ADDR_NOTAVAIL;
        auto it = reverse_.find(names_[fa].key());
        if (it != reverse_.end() && it->second == fa) reverse_.erase(it);
        if (shared_) {
            shared_->entries[fa].state.store(SharedSegment::kRemoved, std::memory_order_release);
            shared_->version.fetch_add(1, std::memory_order_acq_rel);
        } else {
            free_.insert(fa);
        }
    }
    ++version_;
    return ret;
}

void Av::set_user_id(FabricAddr fa, fi_addr_t user_id) {
    if (user_ids_.size() <= fa) user_ids_.resize(fa + 1, FI_ADDR_NOTAVAIL);
    ids_in_use_ = true;
    user_ids_[fa] = user_id;
}

fi_addr_t Av::reported_slow(fi_addr_t addr) const {
    if (addr >= user_ids_.size() || user_ids_[addr] == FI_ADDR_NOTAVAIL)
        return ids_from_set_ ? FI_ADDR_NOTAVAIL : addr;
    return user_ids_[addr];
}

// fi_av_set_user_id (2.0): only on an AV opened with FI_AV_USER_ID, for an entry it holds.
// FI_AUTH_KEY (an authorization-key fi_addr_t) names nothing tandem makes.
int Av::set_user_id_of(fi_addr_t fi_addr, fi_addr_t user_id, uint64_t flags) {
    if (!ids_from_set_ || flags) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    if (!name_of(fi_addr)) return -FI_EINVAL;
    set_user_id(fi_addr, user_id);
    domain_->av_learnt_sources(this);
    return 0;
}

int Av::lookup(fi_addr_t fi_addr, void *addr, size_t *addrlen) {
    if (!addrlen) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    return lookup_locked(fi_addr, addr, addrlen);
}

int Av::lookup_locked(fi_addr_t fi_addr, void *addr, size_t *addrlen) const {
    const EndpointName *name = name_of(fi_addr);
    if (!name) return -FI_EINVAL;
    size_t have = *addrlen;
    *addrlen = name->length();
    if (addr && have) memcpy(addr, &name->ss, std::min(have, size_t(name->length())));
    return have < name->length() ? -FI_ETOOSMALL : 0;
}

const char *Av::straddr(const void *addr, char *buf, size_t *len) {
    if (!addr || !len) return nullptr;
    EndpointName name;
    std::string text =
        EndpointName::from_bytes(addr, addrlen_, name) ? name.to_string() : "fi_addr_unspec://";
    if (buf && *len) {
        snprintf(buf, *len, "%s", text.c_str());
    }
    *len = text.size() + 1;
    return buf;
}

uint64_t Av::version() const {
    return version_word().load(std::memory_order_acquire);
}

const EndpointName *Av::name_of(FabricAddr addr) const {
    sync_shared();
    if (addr >= names_.size() || !valid_[addr]) return nullptr;
    return &names_[addr];
}

int Av::av_set(fi_av_set_attr *attr, fid_av_set **set, void *context) {
    if (!attr || !set) return -FI_EINVAL;
    *set = (new AvSet(this, *attr, context))->fid();
    return 0;
}

peer::ExportedAv &Av::exported_to_twin() {
    if (!twin_exported_) twin_exported_ = std::make_unique<PeerAvAnswers>(*this, true);
    return twin_exported_->exported();
}

void Av::query_locked(fi_av_attr &attr) const {
    sync_shared();
    attr = {};
    attr.type = type_;
    attr.count = names_.size();
    attr.name = shared_name_.empty() ? nullptr : const_cast<char *>(shared_name_.c_str());
    attr.flags = read_only_ ? FI_READ : 0;
}

const std::atomic<uint64_t> &Av::version_word() const {
    return shared_ ? shared_->version : version_;
}

fi_addr_t Av::addr_of_bytes(const void *addr, size_t addrlen) const {
    EndpointName name;
    if (!EndpointName::from_bytes(addr, addrlen, name)) return FI_ADDR_NOTAVAIL;
    return addr_of(name);
}

FabricAddr Av::addr_of(const EndpointName &name) const {
    sync_shared();
    auto it = reverse_.find(name.key());
    return it == reverse_.end() ? FI_ADDR_NOTAVAIL : it->second;
}

// ------------------------------------------------------------------------------------------
// PeerAvAnswers

PeerAvAnswers::PeerAvAnswers(Av &av, bool twin_calls) : av_(av), twin_calls_(twin_calls) {}

int PeerAvAnswers::peer_query(fi_av_attr *attr) {
    PeerEntryGuard guard(av_.domain()->lock(), twin_calls_);
    av_.query_locked(*attr);
    return 0;
}

fi_addr_t PeerAvAnswers::peer_ep_addr(fid_ep *ep) {
    if (!ep) return FI_ADDR_NOTAVAIL;
    uint8_t buf[sizeof(sockaddr_storage)];
    size_t len = sizeof buf;
    // (Before the guard: the endpoint may be one of tandem's, whose fi_getname locks.)
    if (fi_getname(&ep->fid, buf, &len) != 0) return FI_ADDR_NOTAVAIL;
    PeerEntryGuard guard(av_.domain()->lock(), twin_calls_);
    return av_.addr_of_bytes(buf, len);
}

}  // namespace tandem
