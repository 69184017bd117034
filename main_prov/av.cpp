#include "main_prov/av.h"

#include "main_prov/domain.h"
#include "main_prov/eq.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <cstdio>
#include <cstring>

namespace tandem {

namespace {

fi_ops av_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&Av::close>::call<fid>,
    .bind = &Trampoline<&Av::bind>::call<fid>,
    .control = enosys<decltype(fi_ops::control)>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_av av_ops = {
    .size = sizeof(fi_ops_av),
    .insert = &Trampoline<&Av::insert>::call<fid_av>,
    .insertsvc = &Trampoline<&Av::insertsvc>::call<fid_av>,
    .insertsym = &Trampoline<&Av::insertsym>::call<fid_av>,
    .remove = &Trampoline<&Av::remove>::call<fid_av>,
    .lookup = &Trampoline<&Av::lookup>::call<fid_av>,
    .straddr = &Trampoline<&Av::straddr>::call<fid_av>,
    .av_set = enosys<decltype(fi_ops_av::av_set)>,
};

}  // namespace

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
    size_t need = family == AF_INET ? sizeof(sockaddr_in) : family == AF_INET6 ? sizeof(sockaddr_in6) : 0;
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
    : domain_(domain),
      type_(attr.type == FI_AV_UNSPEC ? FI_AV_TABLE : attr.type),
      addr_format_(domain->info()->addr_format) {
    if (type_ != FI_AV_MAP && type_ != FI_AV_TABLE) fail(FI_EINVAL, "unknown AV type");
    if (attr.rx_ctx_bits) fail(FI_ENOSYS, "scalable endpoints are not supported");
    if (attr.flags & ~uint64_t(FI_EVENT | FI_SYMMETRIC))
        fail(FI_EINVAL, "unsupported AV flags");
    if (attr.name) fail(FI_ENOSYS, "named (shared) address vectors are not supported yet");
    addrlen_ = addr_format_ == FI_SOCKADDR_IN6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    names_.reserve(attr.count);
    init_fid(FI_CLASS_AV, context, &av_fi_ops);
    fid()->ops = &av_ops;
    domain_->hold();
}

Av::~Av() { domain_->release(); }

int Av::close() {
    {
        std::lock_guard guard(domain_->lock());
        if (refs_) return -FI_EBUSY;
    }
    delete this;
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

int Av::insert(const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags,
               void *context) {
    if (count && !addr) return -FI_EINVAL;
    if (flags & ~uint64_t(FI_MORE | FI_EVENT | FI_SYNC_ERR)) return -FI_EBADFLAGS;
    if ((flags & FI_EVENT) && !eq_) return -FI_ENOEQ;
    if ((flags & FI_SYNC_ERR) && (flags & FI_EVENT)) return -FI_EINVAL;
    int *sync_err = (flags & FI_SYNC_ERR) ? static_cast<int *>(context) : nullptr;
    std::lock_guard guard(domain_->lock());
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
        FabricAddr fa = names_.size();
        names_.push_back(name);
        valid_.push_back(true);
        reverse_.emplace(name.key(), fa);
        if (fi_addr) fi_addr[i] = fa;
        if (sync_err) sync_err[i] = 0;
        ++done;
    }
    ++version_;
    return finish_insert(done, count, flags, context);
}

int Av::insertsvc(const char *node, const char *service, fi_addr_t *fi_addr, uint64_t flags,
                  void *context) {
    if (!node || !service) return -FI_EINVAL;
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = addr_format_ == FI_SOCKADDR_IN6 ? AF_INET6 : AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(node, service, &hints, &res) || !res) {
        if (fi_addr) *fi_addr = FI_ADDR_NOTAVAIL;
        return flags & FI_EVENT ? finish_insert(0, 1, flags, context) : 0;
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
    std::lock_guard guard(domain_->lock());
    int ret = 0;
    for (size_t i = 0; i < count; ++i) {
        FabricAddr fa = fi_addr[i];
        if (fa >= names_.size() || !valid_[fa]) {
            ret = -FI_EINVAL;
            continue;
        }
        valid_[fa] = false;
        auto it = reverse_.find(names_[fa].key());
        if (it != reverse_.end() && it->second == fa) reverse_.erase(it);
    }
    ++version_;
    return ret;
}

int Av::lookup(fi_addr_t fi_addr, void *addr, size_t *addrlen) {
    if (!addrlen) return -FI_EINVAL;
    std::lock_guard guard(domain_->lock());
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
    std::string text = EndpointName::from_bytes(addr, addrlen_, name) ? name.to_string()
                                                                      : "fi_addr_unspec://";
    if (buf && *len) {
        snprintf(buf, *len, "%s", text.c_str());
    }
    *len = text.size() + 1;
    return buf;
}

const EndpointName *Av::name_of(FabricAddr addr) const {
    if (addr >= names_.size() || !valid_[addr]) return nullptr;
    return &names_[addr];
}

FabricAddr Av::addr_of(const EndpointName &name) const {
    auto it = reverse_.find(name.key());
    return it == reverse_.end() ? FI_ADDR_NOTAVAIL : it->second;
}

}  // namespace tandem
