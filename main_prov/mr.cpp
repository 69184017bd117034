#include "main_prov/mr.h"

#include "common/fabric_compat.h"

#include "main_prov/cntr.h"
#include "main_prov/domain.h"

#include <algorithm>
#include <mutex>
#include <random>

#include <sys/random.h>

namespace tandem {

namespace {

fi_ops mr_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&MemoryRegion::close>::call<fid>,
    .bind = &Trampoline<&MemoryRegion::bind>::call<fid>,
    .control = &Trampoline<&MemoryRegion::control>::call<fid>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

constexpr uint64_t kAccessBits =
    FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;

// FI_MR_DMABUF (1.20): attr's first member names a DMA-buf, not iovecs (null without the
// flag). tandem's paths move memory by its address (staged copies, IPC handles, CMA; the NIC
// maps the DMA-buf), so the DMA-buf must be mapped in the process: the region, in *range, is
// base_addr + offset.
const compat::MrDmabuf *dmabuf_of(const Domain &domain, const fi_mr_attr &attr, uint64_t flags,
                                  iovec &range) {
    if (!(flags & compat::kMrDmabuf)) return nullptr;
    const auto *dmabuf = reinterpret_cast<const compat::MrDmabuf *>(attr.mr_iov);
    if (!dmabuf || dmabuf->fd < 0 || !dmabuf->len)
        fail(FI_EINVAL, "FI_MR_DMABUF without a DMA-buf");
    if (!(domain.info()->caps & FI_HMEM))
        fail(FI_EINVAL, "FI_MR_DMABUF on a domain opened without FI_HMEM");
    if (!dmabuf->base_addr)
        fail(FI_EOPNOTSUPP, "a DMA-buf not mapped in the process (base_addr NULL)");
    range = {static_cast<uint8_t *>(dmabuf->base_addr) + dmabuf->offset, dmabuf->len};
    return dmabuf;
}

}  // namespace

MemoryRegion::MemoryRegion(Domain *domain, const fi_mr_attr &attr, uint64_t flags)
    : domain_(domain),
      access_(attr.access),
      offset_(attr.offset),
      virt_addr_(domain->mr_mode() & (FI_MR_VIRT_ADDR | compat::kMrBasic)) {
    if (!attr.mr_iov && attr.iov_count) fail(FI_EINVAL, "memory region without iov");
    if (attr.access & ~kAccessBits) fail(FI_EINVAL, "unsupported access flags");
    constexpr uint64_t kHmemAllocFlags = FI_HMEM_DEVICE_ONLY | FI_HMEM_HOST_ALLOC;
    if (flags & ~(FI_RMA_EVENT | kHmemAllocFlags | compat::kMrDmabuf))
        fail(FI_EBADFLAGS, "unsupported registration flags");
    iovec dmabuf_range{};
    const compat::MrDmabuf *dmabuf = dmabuf_of(*domain, attr, flags, dmabuf_range);
    const iovec *ranges = dmabuf ? &dmabuf_range : attr.mr_iov;
    const size_t nranges = dmabuf ? 1 : attr.iov_count;
    // How the memory was allocated (fi_mr(3)): by the device API's device allocator
    // (DEVICE_ONLY: the device's memory, as the checks below hold it to), or by its host
    // allocator (HOST_ALLOC: the host's memory, pinned, which tandem's CPU copies reach; the
    // device field is ignored). fabtests passes DEVICE_ONLY with every device buffer.
    if ((flags & kHmemAllocFlags) == kHmemAllocFlags)
        fail(FI_EINVAL, "FI_HMEM_DEVICE_ONLY and FI_HMEM_HOST_ALLOC together");
    if ((flags & FI_HMEM_DEVICE_ONLY) && attr.iface == FI_HMEM_SYSTEM)
        fail(FI_EINVAL, "FI_HMEM_DEVICE_ONLY for system memory");
    // Device memory: the iface must be one we have, with the device that really holds every
    // iovec (a wrong device would have copies run on the wrong engine).
    desc_.mem = {attr.iface, attr.iface == FI_HMEM_CUDA ? static_cast<uint64_t>(attr.device.cuda)
                                                        : attr.device.reserved};
    if (attr.iface == FI_HMEM_SYSTEM || (flags & FI_HMEM_HOST_ALLOC))
        desc_.mem = {FI_HMEM_SYSTEM, 0};
    if (!desc_.mem.on_host() && !(domain->info()->caps & FI_HMEM))
        fail(FI_EINVAL, "device memory on a domain opened without FI_HMEM");
    for (size_t i = 0; i < nranges; ++i) {
        if (!desc_.mem.on_host() &&
            hmem::check_range(desc_.mem, ranges[i].iov_base, ranges[i].iov_len))
            fail(FI_EINVAL, "the registered range is not memory of the given iface and device");
        iov_.push_back(ranges[i]);
        total_ += ranges[i].iov_len;
    }
    init_fid(FI_CLASS_MR, attr.context, &mr_fi_ops);
    desc_.owner = this;
    fid()->mem_desc = &desc_;
    bool prov_key = domain->mr_mode() & (FI_MR_PROV_KEY | compat::kMrBasic);
    uint64_t key = attr.requested_key;
    LinkDomain *link = domain->mr_table().region_link();
    // Where the domain takes a NIC's keys (a device domain with RMA) the region is the NIC's;
    // otherwise (no RMA there: keys of the application's choosing) it is for local use.
    if (link && total_ > 0 && prov_key && virt_addr_) {
        // A link with keys of its own (a NIC's rkeys) names the region: one range, addressed
        // by virtual address, the key the link's.
        const uint64_t remote = access_ & (FI_REMOTE_READ | FI_REMOTE_WRITE);
        const iovec first = iov_.empty() ? iovec{} : iov_[0];
        if (int ret = dmabuf ? link->register_dmabuf_region(first, desc_.mem, dmabuf->fd,
                                                            dmabuf->offset, remote, registered_)
                             : link->register_region(first, desc_.mem, remote, registered_))
            fail(-ret, "the link cannot register this memory");
        if (registered_) {
            if (iov_.size() != 1) fail(FI_EINVAL, "the link registers one range per region");
            key = registered_->key;
            prov_key = false;
        }
    }
    int ret = domain->mr_table().insert(this, key, prov_key);
    if (ret) fail(-ret, "memory key in use");
    fid()->key = key_;
    // FI_MR_ENDPOINT regions are usable only after fi_mr_bind + fi_mr_enable.
    enabled_ = !(domain->mr_mode() & FI_MR_ENDPOINT);
    domain_->hold();
}

MemoryRegion::~MemoryRegion() {
    domain_->mr_table().erase(this);
    if (cntr_) cntr_->release();
    domain_->release();
}

int MemoryRegion::close() {
    std::lock_guard guard(domain_->lock());
    delete this;
    return 0;
}

int MemoryRegion::bind(struct fid *bfid, uint64_t flags) {
    if (!bfid) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
    switch (bfid->fclass) {
        case FI_CLASS_CNTR:
            if (!(flags & (FI_REMOTE_WRITE | FI_REMOTE_READ))) return -FI_EINVAL;
            if (cntr_) return -FI_EALREADY;
            cntr_ = Cntr::of(bfid);
            cntr_->hold();
            return 0;
        case FI_CLASS_EP:
            if (!(domain_->mr_mode() & FI_MR_ENDPOINT)) return -FI_EINVAL;
            return 0;
        default:
            return -FI_EINVAL;
    }
}

int MemoryRegion::control(int command, void *arg) {
    (void)arg;
    if (command == FI_ENABLE) {
        std::lock_guard guard(domain_->lock());
        enabled_ = true;
        return 0;
    }
    return -FI_ENOSYS;
}

bool MemoryRegion::translate(uint64_t addr, size_t len, LocalPieces &out) const {
    out.count = 0;
    if (!enabled_) return false;
    uint64_t base =
        virt_addr_ ? (iov_.empty() ? 0 : reinterpret_cast<uint64_t>(iov_[0].iov_base)) : offset_;
    if (addr < base) return false;
    uint64_t off = addr - base;
    if (off > total_ || len > total_ - off) return false;
    for (const iovec &v : iov_) {
        if (!len) break;
        if (off >= v.iov_len) {
            off -= v.iov_len;
            continue;
        }
        if (out.count == LocalPieces::kMax) return false;
        size_t n = std::min<size_t>(len, v.iov_len - off);
        out.mem[out.count] = desc_.mem;
        out.iov[out.count++] = {static_cast<uint8_t *>(v.iov_base) + off, n};
        len -= n;
        off = 0;
    }
    return true;
}

void MemoryRegion::count_remote_access(uint64_t access) {
    if (cntr_ && (access_ & access)) cntr_->inc();
}

// 64 bits from the kernel's random source (getrandom); should it fail, from a generator
// seeded once. (Not thread_local: a dlopen'ed provider has little static TLS, and a 2.5 KB
// generator there made the AddressSanitizer build unloadable.)
uint64_t MrTable::random_key() {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) == static_cast<ssize_t>(sizeof v)) return v;
    static std::mutex mu;
    static std::mt19937_64 fallback{std::random_device{}()};
    std::lock_guard lk(mu);
    return fallback();
}

int MrTable::insert(MemoryRegion *mr, uint64_t requested_key, bool prov_key) {
    uint64_t key;
    if (prov_key) {
        // Random, so that a peer cannot guess a key it was not given (a counter made the
        // next region's key the last one plus one). Beside a link's own keys (32-bit rkeys),
        // ours keep bit 62 set, out of their range; never the internal bit, never 0.
        const uint64_t base = link_names_regions_ ? uint64_t{1} << 62 : 0;
        const uint64_t mask = link_names_regions_ ? (uint64_t{1} << 62) - 1 : ~kInternalBit;
        do {
            key = base | (random_key() & mask);
        } while (key == 0 || regions_.count(key));
    } else {
        key = requested_key;
        if (key & kInternalBit || regions_.count(key)) return -FI_ENOKEY;
    }
    mr->key_ = key;
    regions_[key] = mr;
    return 0;
}

void MrTable::erase(MemoryRegion *mr) {
    auto it = regions_.find(mr->key_);
    if (it != regions_.end() && it->second == mr) regions_.erase(it);
    generation_.fetch_add(1, std::memory_order_release);
}

MemoryRegion *MrTable::find(uint64_t key) const {
    auto it = regions_.find(key);
    return it == regions_.end() ? nullptr : it->second;
}

uint64_t MrTable::insert_internal(const iovec &iov, hmem::MemRef mem, uint64_t access) {
    if (link_) {
        std::unique_ptr<LinkRegion> region;
        if (link_->register_region(iov, mem, access, region) != 0) return 0;
        if (region) {
            uint64_t key = kInternalBit | region->key;
            internal_[key] = {iov, mem, access, std::move(region)};
            return key;
        }
    }
    // Random as the application's provider keys are: a rendezvous source is exposed to every
    // connection of the domain while its message is in flight, so its key must not be one a
    // peer could count its way to.
    uint64_t key;
    do {
        key = kInternalBit | random_key();
    } while (internal_.count(key));
    internal_[key] = {iov, mem, access, nullptr};
    return key;
}

void MrTable::erase_internal(uint64_t key) {
    internal_.erase(key);
    generation_.fetch_add(1, std::memory_order_release);
}

bool MrTable::resolve(uint64_t key, uint64_t addr, size_t len, uint64_t access,
                      LocalPieces &out) const {
    out.count = 0;
    out.application = !(key & kInternalBit);
    if (key & kInternalBit) {
        auto it = internal_.find(key);
        if (it == internal_.end() || access != it->second.access) return false;
        const iovec &v = it->second.iov;
        uint64_t base = reinterpret_cast<uint64_t>(v.iov_base);
        if (addr < base || addr - base > v.iov_len || len > v.iov_len - (addr - base)) return false;
        out.mem[out.count] = it->second.mem;
        out.iov[out.count++] = {reinterpret_cast<void *>(addr), len};
        return true;
    }
    MemoryRegion *mr = find(key);
    if (!mr || (mr->access() & access) != access) return false;  // every access asked for
    return mr->translate(addr, len, out);
}

}  // namespace tandem
