#include "main_prov/pep.h"

#include "common/coarse_clock.h"
#include "common/auth_key.h"
#include "common/log.h"
#include "main_prov/config.h"
#include "main_prov/conn_hello.h"
#include "main_prov/link/tcp_link.h"
#include "main_prov/fabric.h"
#include "main_prov/interfaces.h"
#include "common/wire.h"

#include <cstring>

namespace tandem {

namespace {

fi_ops connreq_fi_ops = {
    .size = sizeof(fi_ops),
    .close = [](struct fid *f) noexcept -> int {
        delete ConnRequest::of(f);
        return 0;
    },
    .bind = enosys<decltype(fi_ops::bind)>,
    .control = enosys<decltype(fi_ops::control)>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops pep_fi_ops = {
    .size = sizeof(fi_ops),
    .close = &Trampoline<&PassiveEndpoint::close>::call<fid>,
    .bind = &Trampoline<&PassiveEndpoint::bind>::call<fid>,
    .control = &Trampoline<&PassiveEndpoint::control>::call<fid>,
    .ops_open = enosys<decltype(fi_ops::ops_open)>,
    .tostr = enosys<decltype(fi_ops::tostr)>,
    .ops_set = enosys<decltype(fi_ops::ops_set)>,
};

fi_ops_ep pep_ep_ops = fid_ep_ops(enosys<decltype(fi_ops_ep::cancel)>,
                                  &Trampoline<&PassiveEndpoint::getopt>::call<fid>,
                                  &Trampoline<&PassiveEndpoint::setopt>::call<fid>);

fi_ops_cm pep_cm_ops = {
    .size = sizeof(fi_ops_cm),
    .setname = &Trampoline<&PassiveEndpoint::setname>::call<fid>,
    .getname = &Trampoline<&PassiveEndpoint::getname>::call<fid>,
    .getpeer = enosys<decltype(fi_ops_cm::getpeer)>,
    .connect = enosys<decltype(fi_ops_cm::connect)>,
    .listen = &Trampoline<&PassiveEndpoint::listen>::call<fid_pep>,
    .accept = enosys<decltype(fi_ops_cm::accept)>,
    .reject = &Trampoline<&PassiveEndpoint::reject>::call<fid_pep>,
    .shutdown = enosys<decltype(fi_ops_cm::shutdown)>,
    .join = enosys<decltype(fi_ops_cm::join)>,
};

}  // namespace

ConnRequest::ConnRequest(std::unique_ptr<LinkConnection> c) : conn(std::move(c)) {
    init_fid(FI_CLASS_CONNREQ, nullptr, &connreq_fi_ops);
}

std::unique_ptr<LinkConnection> take_connection_request(struct fid *handle) {
    if (!handle || handle->fclass != FI_CLASS_CONNREQ) return nullptr;
    ConnRequest *req = ConnRequest::of(handle);
    auto conn = std::move(req->conn);
    delete req;
    return conn;
}

PassiveEndpoint::PassiveEndpoint(Fabric *fabric, fi_info *info, void *context)
    : fabric_(fabric), info_(fi_dupinfo(info)), cm_data_size_(wire::kMaxCmPrivate) {
    if (!info_ || !info_->ep_attr || info_->ep_attr->type != FI_EP_MSG)
        fail(FI_EINVAL, "passive endpoints are FI_EP_MSG");
    auth_ = endpoint_auth_digest(info_, info_);
    // Connections start here: they get the endpoints' link settings from the start.
    std::string why;
    link_ = open_link_domain(
        info_->domain_attr && info_->domain_attr->name ? info_->domain_attr->name : "", &why);
    if (!link_) fail(FI_ENODEV, why.c_str());
    transport_ = link_->transport(this, Config::get().link_settings().max_send_size);
    // Connection data rides in the request after our hello: what the link leaves of it.
    if (size_t carried = transport_->caps().max_connect_data)
        cm_data_size_ = cm_data_max_ =
            std::min(wire::kMaxCmPrivate, carried - sizeof(wire::ConnHello));
    if (info_->src_addr) {
        if (!EndpointName::from_bytes(info_->src_addr, info_->src_addrlen, name_))
            fail(FI_EINVAL, "bad source address");
    } else {
        name_.ss.ss_family = info_->addr_format == FI_SOCKADDR_IN6 ? AF_INET6 : AF_INET;
    }
    init_fid(FI_CLASS_PEP, context, &pep_fi_ops);
    fid()->ops = &pep_ep_ops;
    fid()->cm = &pep_cm_ops;
    fabric_->hold();
}

PassiveEndpoint::~PassiveEndpoint() {
    fi_freeinfo(info_);
    fabric_->release();
}

int PassiveEndpoint::close() {
    // Waits for an EQ read that is inside progress_cm or cm_watch (they take mutex_, which
    // is not held here).
    if (eq_) eq_->remove_source(this);
    delete this;
    return 0;
}

int PassiveEndpoint::bind(struct fid *bfid, uint64_t flags) {
    (void)flags;
    if (!bfid || bfid->fclass != FI_CLASS_EQ) return -FI_EINVAL;
    std::lock_guard guard(mutex_);
    if (eq_) return -FI_EINVAL;
    eq_ = Eq::of(bfid);
    eq_->add_source(this);
    return 0;
}

int PassiveEndpoint::control(int command, void *arg) {
    (void)arg;
    return command == FI_ENABLE ? 0 : -FI_ENOSYS;
}

int PassiveEndpoint::getopt(int level, int optname, void *optval, size_t *optlen) {
    if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
    if (optname != FI_OPT_CM_DATA_SIZE) return -FI_ENOPROTOOPT;
    if (!optval || !optlen) return -FI_EINVAL;
    if (*optlen < sizeof(size_t)) return -FI_ETOOSMALL;
    *static_cast<size_t *>(optval) = cm_data_size_;
    *optlen = sizeof(size_t);
    return 0;
}

int PassiveEndpoint::setopt(int level, int optname, const void *optval, size_t optlen) {
    if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
    if (optname != FI_OPT_CM_DATA_SIZE) return -FI_ENOPROTOOPT;
    if (!optval || optlen != sizeof(size_t)) return -FI_EINVAL;
    size_t want = *static_cast<const size_t *>(optval);
    if (want > cm_data_max_) return -FI_EINVAL;
    cm_data_size_ = want;
    return 0;
}

int PassiveEndpoint::setname(void *addr, size_t addrlen) {
    std::lock_guard guard(mutex_);
    if (listening_ || surrendered_) return -FI_EOPBADSTATE;
    if (!addr || !EndpointName::from_bytes(addr, addrlen, name_)) return -FI_EINVAL;
    return 0;
}

int PassiveEndpoint::getname(void *addr, size_t *addrlen) {
    if (!addrlen) return -FI_EINVAL;
    std::lock_guard guard(mutex_);
    EndpointName name = name_;
    if (listening_) name.ss = transport_->name();
    substitute_interface_address(info_->domain_attr ? info_->domain_attr->name : nullptr, name);
    size_t need = name.length(), have = *addrlen;
    *addrlen = need;
    if (have < need) return -FI_ETOOSMALL;
    if (!addr) return -FI_EINVAL;
    memcpy(addr, &name.ss, need);
    return 0;
}

EndpointName PassiveEndpoint::surrender_address() {
    std::lock_guard guard(mutex_);
    EndpointName name = name_;
    if (listening_) name.ss = transport_->name();
    substitute_interface_address(info_->domain_attr ? info_->domain_attr->name : nullptr, name);
    // Its listener (and any request not yet read) goes: the address is the new endpoint's.
    transport_ = transport_->fresh();
    listening_ = false;
    surrendered_ = true;
    return name;
}

int PassiveEndpoint::listen() {
    std::lock_guard guard(mutex_);
    if (listening_ || surrendered_) return -FI_EOPBADSTATE;
    if (!eq_) return -FI_ENOEQ;
    int ret = transport_->listen(name_.sa(), name_.length(), 512);
    if (ret) return ret;
    listening_ = true;
    return 0;
}

int PassiveEndpoint::reject(fid_t handle, const void *param, size_t paramlen) {
    if (paramlen && !param) return -FI_EINVAL;
    if (paramlen > cm_data_size_) return -FI_EINVAL;
    auto conn = take_connection_request(handle);
    if (!conn) return -FI_EINVAL;
    std::lock_guard guard(mutex_);
    LinkConnection *raw = conn.get();
    transport_->adopt(std::move(conn));
    raw->reject(param, paramlen);
    transport_->destroy(raw);
    return 0;
}

void PassiveEndpoint::progress_cm() {
    std::lock_guard guard(mutex_);
    if (!listening_) return;
    // An EQ read is this endpoint's only progress: accept what waits now.
    transport_->progress_now();
    WorkCompletion wc[8];
    while (transport_->poll(wc, 8) > 0) {
        // A passive endpoint posts nothing: only flushes of rejected connections come here.
    }
    CmEvent ev;
    while (transport_->poll_cm(ev)) {
        if (ev.type != CmEventType::ConnectRequest) continue;
        std::string why;
        auto hello = accept_conn_hello(ev.private_data, wire::ConnKind::Msg, auth_, &why);
        if (!hello) {
            TANDEM_WARN(FI_LOG_EP_CTRL, "rejecting a connection request: %s\n", why.c_str());
            ev.conn->reject(nullptr, 0);
            continue;
        }
        fi_info *info = fi_dupinfo(info_);
        if (!info) continue;
        EndpointName peer;
        peer.ss = ev.conn->peer_address();
        free(info->dest_addr);
        info->dest_addr = malloc(peer.length());
        memcpy(info->dest_addr, &peer.ss, peer.length());
        info->dest_addrlen = peer.length();
        auto *req = new ConnRequest(transport_->release(ev.conn));
        info->handle = req->base_fid();
        std::vector<uint8_t> buf(sizeof(fi_eq_cm_entry) + hello->user.size());
        auto *entry = reinterpret_cast<fi_eq_cm_entry *>(buf.data());
        entry->fid = base_fid();
        entry->info = info;
        if (!hello->user.empty()) memcpy(entry->data, hello->user.data(), hello->user.size());
        eq_->post(FI_CONNREQ, buf.data(), buf.size());
    }
}

void PassiveEndpoint::cm_watch(WaitSet &set) {
    std::vector<WaitFd> fds;
    std::lock_guard guard(mutex_);
    transport_->before_sleep();
    transport_->wait_fds(fds);
    for (WaitFd fd : fds) set.add(fd);
}

// What the listener does without a peer's bytes: a connection request that stalls is closed
// when its time runs out.
int PassiveEndpoint::sleep_limit_ms() {
    std::lock_guard guard(mutex_);
    if (transport_->busy()) return 1;
    return ms_until(transport_->next_timer_ms());
}

}  // namespace tandem
