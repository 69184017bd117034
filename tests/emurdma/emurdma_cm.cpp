// rdma_cm of the emulated device. Addresses are the IPv4/IPv6 addresses of one network interface
// (EMURDMA_NETDEV); the "fabric" is the host's abstract Unix socket namespace, which is per
// network namespace as IP is:
//   emurdma/port/<port>              held by every bound id: the emulator's port space (one owner
//                                    per port number, whatever the address)
//   emurdma/listen/<ip or any>/<port> a listening id; a connect tries the destination's IP, then
//                                    the wildcard listener of that port
// A connection is the stream socket a connect opens to a listener: IB CM's messages (REQ, REP,
// RTU, REJ, DREQ, DREP) and then the QPs' traffic go over it (emurdma_nic.cpp).
#include "tests/emurdma/emurdma.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

EMURDMA_API rdma_event_channel *rdma_create_event_channel(void);
EMURDMA_API void rdma_destroy_event_channel(rdma_event_channel *channel);
EMURDMA_API int rdma_create_id(rdma_event_channel *channel, rdma_cm_id **id, void *context,
                               rdma_port_space ps);
EMURDMA_API int rdma_destroy_id(rdma_cm_id *id);
EMURDMA_API int rdma_bind_addr(rdma_cm_id *id, sockaddr *addr);
EMURDMA_API int rdma_resolve_addr(rdma_cm_id *id, sockaddr *src_addr, sockaddr *dst_addr,
                                  int timeout_ms);
EMURDMA_API int rdma_resolve_route(rdma_cm_id *id, int timeout_ms);
EMURDMA_API int rdma_listen(rdma_cm_id *id, int backlog);
EMURDMA_API int rdma_create_qp(rdma_cm_id *id, ibv_pd *pd, ibv_qp_init_attr *qp_init_attr);
EMURDMA_API void rdma_destroy_qp(rdma_cm_id *id);
EMURDMA_API int rdma_connect(rdma_cm_id *id, rdma_conn_param *conn_param);
EMURDMA_API int rdma_accept(rdma_cm_id *id, rdma_conn_param *conn_param);
EMURDMA_API int rdma_reject(rdma_cm_id *id, const void *private_data, uint8_t private_data_len);
EMURDMA_API int rdma_disconnect(rdma_cm_id *id);
EMURDMA_API int rdma_get_cm_event(rdma_event_channel *channel, rdma_cm_event **event);
EMURDMA_API int rdma_ack_cm_event(rdma_cm_event *event);
EMURDMA_API int rdma_migrate_id(rdma_cm_id *id, rdma_event_channel *channel);
EMURDMA_API const char *rdma_event_str(rdma_cm_event_type event);
EMURDMA_API ibv_context **rdma_get_devices(int *num_devices);
EMURDMA_API void rdma_free_devices(ibv_context **list);
EMURDMA_API int rdma_set_option(rdma_cm_id *id, int level, int optname, void *optval,
                                size_t optlen);

namespace emurdma {

namespace {

constexpr int kListenBacklog = 4096;
constexpr std::uint16_t kEphemeralLow = 32768;
constexpr std::uint16_t kEphemeralHigh = 60999;

int fail(int err) {
    errno = err;
    return -1;
}

bool is_any(const sockaddr *a) {
    if (a->sa_family == AF_INET)
        return reinterpret_cast<const sockaddr_in *>(a)->sin_addr.s_addr == htonl(INADDR_ANY);
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6 *>(a)->sin6_addr);
}

std::uint16_t get_port(const sockaddr *a) {
    return ntohs(a->sa_family == AF_INET ? reinterpret_cast<const sockaddr_in *>(a)->sin_port
                                         : reinterpret_cast<const sockaddr_in6 *>(a)->sin6_port);
}

void set_port(sockaddr_storage *a, std::uint16_t port) {
    if (a->ss_family == AF_INET)
        reinterpret_cast<sockaddr_in *>(a)->sin_port = htons(port);
    else
        reinterpret_cast<sockaddr_in6 *>(a)->sin6_port = htons(port);
}

socklen_t addr_len(const sockaddr *a) {
    return a->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

bool same_ip(const sockaddr *a, const sockaddr *b) {
    if (a->sa_family != b->sa_family) return false;
    if (a->sa_family == AF_INET)
        return reinterpret_cast<const sockaddr_in *>(a)->sin_addr.s_addr ==
               reinterpret_cast<const sockaddr_in *>(b)->sin_addr.s_addr;
    return memcmp(&reinterpret_cast<const sockaddr_in6 *>(a)->sin6_addr,
                  &reinterpret_cast<const sockaddr_in6 *>(b)->sin6_addr, sizeof(in6_addr)) == 0;
}

std::string ip_str(const sockaddr *a) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->sa_family == AF_INET)
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in *>(a)->sin_addr, buf, sizeof(buf));
    else
        inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 *>(a)->sin6_addr, buf,
                  sizeof(buf));
    return buf;
}

bool is_inet(const sockaddr *a) {
    return a && (a->sa_family == AF_INET || a->sa_family == AF_INET6);
}

bool is_loopback(const sockaddr *a) {
    if (a->sa_family == AF_INET)
        return (ntohl(reinterpret_cast<const sockaddr_in *>(a)->sin_addr.s_addr) >> 24) == 127;
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6 *>(a)->sin6_addr);
}

// The interface's addresses of one family (lo: handled without asking, it serves 127/8 and ::1).
template <class Fn>
void for_each_if_addr(const std::string &netdev, Fn fn) {
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0) return;
    for (ifaddrs *i = list; i; i = i->ifa_next) {
        if (!i->ifa_addr || netdev != i->ifa_name) continue;
        if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) continue;
        if (fn(i->ifa_addr)) break;
    }
    freeifaddrs(list);
}

bool served(const sockaddr *a) {
    for (const std::string &dev : S().netdevs) {
        if (dev == "lo") {
            if (is_loopback(a)) return true;
            continue;
        }
        bool found = false;
        for_each_if_addr(dev, [&](const sockaddr *x) { return found = same_ip(a, x); });
        if (found) return true;
    }
    return false;
}

// Abstract Unix socket names (no file, per network namespace).
socklen_t abstract_name(sockaddr_un *un, const std::string &name) {
    memset(un, 0, sizeof(*un));
    un->sun_family = AF_UNIX;
    std::size_t n = std::min(name.size(), sizeof(un->sun_path) - 2);
    memcpy(un->sun_path + 1, name.data(), n);
    return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

std::string port_name(std::uint16_t port) {
    return "emurdma/port/" + std::to_string(port);
}

std::string listen_name(const sockaddr *a, bool any, std::uint16_t port) {
    return "emurdma/listen/" + (any ? std::string("any") : ip_str(a)) + "/" + std::to_string(port);
}

int bind_abstract(const std::string &name, int type_flags) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | type_flags, 0);
    if (fd < 0) return -1;
    sockaddr_un un;
    socklen_t len = abstract_name(&un, name);
    if (bind(fd, reinterpret_cast<sockaddr *>(&un), len) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

// A port of the emulator's port space: the given one, or a free ephemeral one.
int reserve_port(std::uint16_t *port) {
    if (*port) return bind_abstract(port_name(*port), 0);
    std::uint32_t r = 0;
    if (getrandom(&r, sizeof(r), 0) != sizeof(r)) r = static_cast<std::uint32_t>(random());
    const std::uint32_t span = kEphemeralHigh - kEphemeralLow + 1;
    for (std::uint32_t i = 0; i < span; ++i) {
        auto p = static_cast<std::uint16_t>(kEphemeralLow + (r + i) % span);
        int fd = bind_abstract(port_name(p), 0);
        if (fd >= 0) {
            *port = p;
            return fd;
        }
        if (errno != EADDRINUSE) return -1;
    }
    errno = EADDRINUSE;
    return -1;
}

CmId *cm(rdma_cm_id *id) {
    return reinterpret_cast<CmId *>(id);
}

int bind_locked(CmId *c, const sockaddr *addr) {
    if (!is_inet(addr)) return addr ? EAFNOSUPPORT : EINVAL;
    if (c->state != CmState::kIdle) return EINVAL;
    bool any = is_any(addr);
    // A specific address must be one this device serves (real rdma_cm finds no device for it).
    if (!any && !served(addr)) return ENODEV;
    Context *ctx = cm_context();
    if (!ctx) return ENOMEM;
    std::uint16_t port = get_port(addr);
    int fd = reserve_port(&port);
    if (fd < 0) return errno;
    c->port_fd = fd;
    c->port = port;
    c->wildcard = any;
    c->ctx = ctx;
    memset(&c->pub.route.addr.src_storage, 0, sizeof(sockaddr_storage));
    memcpy(&c->pub.route.addr.src_storage, addr, addr_len(addr));
    set_port(&c->pub.route.addr.src_storage, port);
    if (!any) {
        // Bound to the device's address: the id has its device (a wildcard gets one only with a
        // connection request, as on real rdma_cm).
        c->pub.verbs = &ctx->pub;
        c->pub.port_num = 1;
    }
    c->state = CmState::kBound;
    return 0;
}

void report_disconnected(CmId *c) {
    if (c->disc_reported) return;
    c->disc_reported = true;
    queue_cm_event(c, RDMA_CM_EVENT_DISCONNECTED, 0, nullptr, 0, 0);
}

// An embryo (accepted socket without a REQ) that goes: its memory when the NIC's pass is over.
void kill_embryo(CmId *e) {
    close_sock(e);
    if (e->listener) e->listener->embryos.erase(e);
    e->listener = nullptr;
    S().graveyard.push_back(e);
}

// An IB CM message to the peer of a connection (code: the REJ's reason).
void send_cm(CmId *c, FrameType type, const void *msg = nullptr, std::size_t len = 0,
             int code = 0) {
    Hdr h{};
    h.type = type;
    h.code = static_cast<std::uint8_t>(code);
    send_frame(c, h, msg, len);
}

void send_rej(CmId *c, int reason, const void *pdata, std::size_t len) {
    CmRejMsg m{};
    m.pdlen = static_cast<std::uint8_t>(len);
    if (len) memcpy(m.pdata, pdata, len);
    send_cm(c, kCmRej, &m, sizeof(m), reason);
}

// rdma_connect's and rdma_accept's checks of the app's parameters (null: none), max the private
// data the message carries.
bool conn_param_ok(const rdma_conn_param *param, std::size_t max) {
    if (!param) return true;
    if (param->private_data_len > max) return false;
    return !param->private_data_len || param->private_data;
}

// The app's parameters that a REQ or a REP carries to the peer (null: none, all zero).
template <class Msg>
void put_conn_param(Msg *m, const rdma_conn_param *param) {
    if (!param) return;
    m->responder_resources = param->responder_resources;
    m->initiator_depth = param->initiator_depth;
    m->pdlen = param->private_data_len;
    if (m->pdlen) memcpy(m->pdata, param->private_data, m->pdlen);
}

// What the peer's REQ or REP said, in the event that delivers it (e null: none was queued, the
// id having no channel).
template <class Msg>
void get_conn_param(Event *e, const Msg &m) {
    if (!e) return;
    e->pub.param.conn.responder_resources = m.responder_resources;
    e->pub.param.conn.initiator_depth = m.initiator_depth;
    e->pub.param.conn.rnr_retry_count = m.rnr_retry;
    e->pub.param.conn.qp_num = m.qpn;
}

void move_events(Channel *from, Channel *to, CmId *c) {
    for (auto it = from->q.begin(); it != from->q.end();) {
        Event *e = *it;
        if (e->owner == c || e->pub.listen_id == &c->pub) {
            it = from->q.erase(it);
            sig_lower(from->pub.fd);
            to->q.push_back(e);
            sig_raise(to->pub.fd);
        } else {
            ++it;
        }
    }
    to->cv.notify_all();
}

void destroy_locked(CmId *c);

// The events of an id that goes: its own, and the connection requests a listener had not handed
// out (their new ids go with them).
void purge_events(CmId *c) {
    Channel *ch = c->ch;
    if (!ch) return;
    std::vector<CmId *> orphans;
    for (auto it = ch->q.begin(); it != ch->q.end();) {
        Event *e = *it;
        bool request = e->pub.listen_id == &c->pub && e->owner != c;
        if (e->owner == c || request) {
            if (request) orphans.push_back(e->owner);
            it = ch->q.erase(it);
            sig_lower(ch->pub.fd);
            delete e;
        } else {
            ++it;
        }
    }
    for (CmId *o : orphans) destroy_locked(o);
}

void destroy_locked(CmId *c) {
    State &s = S();
    purge_events(c);
    if (Qp *qp = c->qp) {
        qp_to_error(qp, false);
        qp->id = nullptr;
        c->qp = nullptr;
        c->pub.qp = nullptr;
    }
    switch (c->state) {
        case CmState::kReqRcvd:
            send_rej(c, kRejConsumer, nullptr, 0);
            break;
        case CmState::kEstablished:
        case CmState::kAccepted:
            send_cm(c, kCmDreq);
            break;
        default:
            break;
    }
    close_sock(c);
    for (CmId *e : c->embryos) {
        e->listener = nullptr;
        close_sock(e);
        delete e;
    }
    c->embryos.clear();
    if (c->listen_fd >= 0) {
        // Refuses new connections at once, even while the NIC's poll() still holds the socket.
        shutdown(c->listen_fd, SHUT_RDWR);
        close(c->listen_fd);
        c->listen_fd = -1;
        wake(c->ctx);
    }
    if (c->ctx) c->ctx->ids.erase(c->serial);
    if (c->port_fd >= 0) close(c->port_fd);
    s.ids.erase(c);
    delete c;
}

// Connects to whoever listens on dst (its IP, else the port's wildcard listener). Returns the
// socket, or -1 (ECONNREFUSED: nobody listens).
int connect_listener(const sockaddr *dst, std::unique_lock<std::mutex> &lk, CmId *c) {
    std::uint16_t port = get_port(dst);
    const std::string names[2] = {listen_name(dst, false, port), listen_name(dst, true, port)};
    for (const std::string &name : names) {
        for (int attempt = 0;; ++attempt) {
            int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
            if (fd < 0) return -1;
            sockaddr_un un;
            socklen_t len = abstract_name(&un, name);
            if (connect(fd, reinterpret_cast<sockaddr *>(&un), len) == 0) return fd;
            int err = errno;
            close(fd);
            if (err != EAGAIN || attempt >= 2000) break;
            // The listener's backlog is full: wait for its NIC to take connections (which may
            // be ours, so without the lock).
            lk.unlock();
            usleep(1000);
            lk.lock();
            if (!S().ids.count(c)) {
                errno = EINVAL;
                return -1;
            }
        }
    }
    errno = ECONNREFUSED;
    return -1;
}

}  // namespace

bool served_source(int family, const sockaddr *dst, sockaddr_storage *out) {
    memset(out, 0, sizeof(*out));
    auto loopback = [&] {
        if (family == AF_INET) {
            auto *in = reinterpret_cast<sockaddr_in *>(out);
            in->sin_family = AF_INET;
            in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        } else {
            auto *in6 = reinterpret_cast<sockaddr_in6 *>(out);
            in6->sin6_family = AF_INET6;
            in6->sin6_addr = in6addr_loopback;
        }
        return true;
    };
    const auto &devs = S().netdevs;
    const bool serves_lo = std::find(devs.begin(), devs.end(), "lo") != devs.end();
    if (dst) {
        if (serves_lo && is_loopback(dst)) return loopback();
        if (!served(dst)) return false;
        memcpy(out, dst, addr_len(dst));
        set_port(out, 0);
        return true;
    }
    // No destination: the first address of the family of the first interface that has one.
    for (const std::string &dev : devs) {
        if (dev == "lo") return loopback();
        bool found = false;
        for_each_if_addr(dev, [&](const sockaddr *x) {
            if (x->sa_family != family) return false;
            memcpy(out, x, addr_len(x));
            return found = true;
        });
        if (found) return true;
    }
    return false;
}

Event *queue_cm_event_impl(CmId *c, rdma_cm_event_type type, int status, const void *pdata,
                           std::size_t len, std::size_t padded, CmId *listen_id) {
    Channel *ch = c->ch;
    if (!ch) return nullptr;
    auto *e = new_object<Event>();
    e->owner = c;
    e->pub.id = &c->pub;
    e->pub.listen_id = listen_id ? &listen_id->pub : nullptr;
    e->pub.event = type;
    e->pub.status = status;
    if (padded) {
        // IB CM carries private data in fixed-size fields: the receiver sees all of it.
        memset(e->pdata, 0, padded);
        if (len) memcpy(e->pdata, pdata, len);
        e->pub.param.conn.private_data = e->pdata;
        e->pub.param.conn.private_data_len = static_cast<std::uint8_t>(padded);
    }
    ch->q.push_back(e);
    sig_raise(ch->pub.fd);
    ch->cv.notify_all();
    return e;
}

void queue_cm_event(CmId *id, rdma_cm_event_type type, int status, const void *pdata,
                    std::size_t len, std::size_t padded, CmId *listen_id) {
    queue_cm_event_impl(id, type, status, pdata, len, padded, listen_id);
}

void cm_on_accept(CmId *l) {
    State &s = S();
    for (;;) {
        int fd = accept4(l->listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            return;  // EAGAIN, or out of descriptors: the peer's connect then times out
        }
        auto *e = new_object<CmId>();
        e->serial = s.next_serial++;
        e->state = CmState::kEmbryo;
        e->ch = l->ch;
        e->ctx = l->ctx;
        e->listener = l;
        e->sock = fd;
        l->embryos.insert(e);
        cm_serve(e);
    }
}

void cm_on_frame(CmId *c, const Hdr &h, const std::uint8_t *payload) {
    switch (h.type) {
        case kCmReq: {
            if (c->state != CmState::kEmbryo || h.len != sizeof(CmReqMsg)) return;
            CmReqMsg m;
            memcpy(&m, payload, sizeof(m));
            CmId *l = c->listener;
            const auto *dst = reinterpret_cast<const sockaddr *>(&m.dst);
            // A listener on a specific address does not take requests for another one.
            if (!l || (!l->wildcard && !same_ip(dst, &l->pub.route.addr.src_addr))) {
                send_rej(c, kRejInvalidServiceId, nullptr, 0);
                kill_embryo(c);
                return;
            }
            l->embryos.erase(c);
            c->listener = nullptr;
            c->pub.verbs = &l->ctx->pub;
            c->pub.context = l->pub.context;
            c->pub.channel = l->pub.channel;
            c->ch = l->ch;
            c->pub.ps = RDMA_PS_TCP;
            c->pub.qp_type = IBV_QPT_RC;
            c->pub.port_num = 1;
            c->pub.route.addr.src_storage = m.dst;
            c->pub.route.addr.dst_storage = m.src;
            c->peer_qpn = m.qpn;
            c->peer_rnr_retry = m.rnr_retry;
            c->state = CmState::kReqRcvd;
            S().ids.insert(c);
            Event *e = queue_cm_event_impl(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0, m.pdata, m.pdlen,
                                           kReqPrivMax, l);
            get_conn_param(e, m);
            if (e) e->pub.param.conn.retry_count = m.retry_count;  // only a REQ carries it
            return;
        }
        case kCmRep: {
            if (c->state != CmState::kConnecting || h.len != sizeof(CmRepMsg)) return;
            CmRepMsg m;
            memcpy(&m, payload, sizeof(m));
            c->peer_qpn = m.qpn;
            c->peer_rnr_retry = m.rnr_retry;
            if (Qp *qp = c->qp) {
                qp->peer_qpn = m.qpn;
                qp->peer_rnr_retry = m.rnr_retry;
                if (qp->pub.state != IBV_QPS_ERR) qp->pub.state = IBV_QPS_RTS;
            }
            send_cm(c, kCmRtu);
            c->state = CmState::kEstablished;
            Event *e = queue_cm_event_impl(c, RDMA_CM_EVENT_ESTABLISHED, 0, m.pdata, m.pdlen,
                                           kRepPrivMax, nullptr);
            get_conn_param(e, m);
            wake(c->ctx);
            return;
        }
        case kCmRtu:
            if (c->state != CmState::kAccepted) return;
            c->state = CmState::kEstablished;
            queue_cm_event(c, RDMA_CM_EVENT_ESTABLISHED, 0, nullptr, 0, 0);
            return;
        case kCmRej: {
            if (c->state != CmState::kConnecting) return;
            CmRejMsg m{};
            if (h.len == sizeof(m)) memcpy(&m, payload, sizeof(m));
            c->state = CmState::kRejected;
            if (c->qp) qp_to_error(c->qp, false);
            // A consumer reject carries the rejecter's private data; the CM's own rejects none.
            if (h.code == kRejConsumer)
                queue_cm_event(c, RDMA_CM_EVENT_REJECTED, h.code, m.pdata, m.pdlen, kRejPrivMax);
            else
                queue_cm_event(c, RDMA_CM_EVENT_REJECTED, h.code, nullptr, 0, 0);
            close_sock(c);
            return;
        }
        case kCmDreq: {
            if (c->state != CmState::kEstablished && c->state != CmState::kAccepted &&
                c->state != CmState::kDisconnecting)
                return;
            if (c->qp) qp_to_error(c->qp, false);
            send_cm(c, kCmDrep);
            c->state = CmState::kDisconnected;
            report_disconnected(c);
            c->close_after_flush = true;
            wake(c->ctx);
            return;
        }
        case kCmDrep:
            if (c->state != CmState::kDisconnecting) return;
            c->state = CmState::kDisconnected;
            report_disconnected(c);
            close_sock(c);
            return;
        default:
            return;
    }
}

void cm_on_eof(CmId *c) {
    CmState st = c->state;
    close_sock(c);
    // Whatever was outstanding cannot complete any more.
    if (c->qp) qp_to_error(c->qp, false);
    switch (st) {
        case CmState::kEmbryo:
            kill_embryo(c);
            return;
        case CmState::kConnecting:
            // Accepted by the socket layer, then nobody answered: as a REQ that timed out.
            c->state = CmState::kRejected;
            queue_cm_event(c, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT, nullptr, 0, 0);
            return;
        case CmState::kReqRcvd:
            c->peer_closed = true;
            return;
        case CmState::kAccepted:
            c->state = CmState::kDisconnected;
            queue_cm_event(c, RDMA_CM_EVENT_CONNECT_ERROR, -ETIMEDOUT, nullptr, 0, 0);
            return;
        case CmState::kEstablished:
        case CmState::kDisconnecting:
            c->state = CmState::kDisconnected;
            report_disconnected(c);
            return;
        default:
            return;
    }
}

void cm_device_removed() {
    for (CmId *c : S().ids) queue_cm_event(c, RDMA_CM_EVENT_DEVICE_REMOVAL, 0, nullptr, 0, 0);
}

}  // namespace emurdma

using namespace emurdma;

rdma_event_channel *rdma_create_event_channel(void) {
    State &s = S();
    std::lock_guard lk(s.mu);
    int fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
    if (fd < 0) return nullptr;
    auto *ch = new Channel;
    ch->pub.fd = fd;
    s.channels.insert(ch);
    return &ch->pub;
}

void rdma_destroy_event_channel(rdma_event_channel *channel) {
    State &s = S();
    std::lock_guard lk(s.mu);
    auto *ch = reinterpret_cast<Channel *>(channel);
    if (!ch) return;
    for (Event *e : ch->q) delete e;
    // Ids still on it (the app should have destroyed them first) lose their events from now on
    // rather than reach freed memory.
    for (CmId *c : s.ids)
        if (c->ch == ch) c->ch = nullptr;
    for (Context *ctx : s.contexts)
        for (auto &[serial, c] : ctx->ids)
            if (c->ch == ch) c->ch = nullptr;
    close(ch->pub.fd);
    s.channels.erase(ch);
    delete ch;
}

int rdma_create_id(rdma_event_channel *channel, rdma_cm_id **id, void *context,
                   rdma_port_space ps) {
    State &s = S();
    std::lock_guard lk(s.mu);
    // Only RC over RDMA_PS_TCP, and only with an event channel (no synchronous mode).
    if (!id || !channel || ps != RDMA_PS_TCP) return fail(EINVAL);
    auto *c = new_object<CmId>();
    c->pub.channel = channel;
    c->pub.context = context;
    c->pub.ps = ps;
    c->pub.qp_type = IBV_QPT_RC;
    c->ch = reinterpret_cast<Channel *>(channel);
    c->serial = s.next_serial++;
    s.ids.insert(c);
    *id = &c->pub;
    return 0;
}

int rdma_destroy_id(rdma_cm_id *id) {
    std::lock_guard lk(S().mu);
    if (!id) return fail(EINVAL);
    destroy_locked(cm(id));
    return 0;
}

int rdma_bind_addr(rdma_cm_id *id, sockaddr *addr) {
    std::lock_guard lk(S().mu);
    if (!id) return fail(EINVAL);
    int err = bind_locked(cm(id), addr);
    return err ? fail(err) : 0;
}

int rdma_resolve_addr(rdma_cm_id *id, sockaddr *src_addr, sockaddr *dst_addr,
                      int /*timeout_ms: resolution is immediate*/) {
    State &s = S();
    std::lock_guard lk(s.mu);
    CmId *c = cm(id);
    if (!c || !is_inet(dst_addr)) return fail(EINVAL);
    if (c->state != CmState::kIdle && c->state != CmState::kBound) return fail(EINVAL);
    if (src_addr && c->state == CmState::kIdle) {
        if (int err = bind_locked(c, src_addr)) return fail(err);
    }
    memset(&c->pub.route.addr.dst_storage, 0, sizeof(sockaddr_storage));
    memcpy(&c->pub.route.addr.dst_storage, dst_addr, addr_len(dst_addr));
    if (!s.port_up || !served(dst_addr)) {
        queue_cm_event(c, RDMA_CM_EVENT_ADDR_ERROR, s.port_up ? -ENODEV : -ENETUNREACH, nullptr, 0,
                       0);
        return 0;
    }
    sockaddr_storage src;
    served_source(dst_addr->sa_family, dst_addr, &src);
    if (c->state == CmState::kIdle) {
        if (int err = bind_locked(c, reinterpret_cast<sockaddr *>(&src))) return fail(err);
    } else if (c->wildcard) {
        // The route picks the source address; the port stays.
        set_port(&src, c->port);
        c->pub.route.addr.src_storage = src;
        c->wildcard = false;
    }
    c->pub.verbs = &c->ctx->pub;
    c->pub.port_num = 1;
    c->state = CmState::kAddrResolved;
    queue_cm_event(c, RDMA_CM_EVENT_ADDR_RESOLVED, 0, nullptr, 0, 0);
    return 0;
}

int rdma_resolve_route(rdma_cm_id *id, int /*timeout_ms*/) {
    std::lock_guard lk(S().mu);
    CmId *c = cm(id);
    if (!c || c->state != CmState::kAddrResolved) return fail(EINVAL);
    c->state = CmState::kRouteResolved;
    queue_cm_event(c, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, nullptr, 0, 0);
    return 0;
}

int rdma_listen(rdma_cm_id *id, int /*backlog: the socket's own is used*/) {
    std::unique_lock lk(S().mu);
    CmId *c = cm(id);
    if (!c) return fail(EINVAL);
    if (c->state == CmState::kIdle) {
        // As the real one: an unbound id listens on the wildcard address, on a port of its own.
        sockaddr_in any{};
        any.sin_family = AF_INET;
        if (int err = bind_locked(c, reinterpret_cast<sockaddr *>(&any))) return fail(err);
    }
    if (c->state != CmState::kBound) return fail(EINVAL);
    const sockaddr *a = &c->pub.route.addr.src_addr;
    const std::string name = listen_name(a, c->wildcard, c->port);
    int fd = bind_abstract(name, SOCK_NONBLOCK);
    // We hold the port, so a listener of that name can only be a destroyed one whose socket a
    // NIC's poll() still holds for a moment: wait for it to go.
    for (int attempt = 0; fd < 0 && errno == EADDRINUSE && attempt < 1000; ++attempt) {
        lk.unlock();
        usleep(1000);
        lk.lock();
        if (!S().ids.count(c) || c->state != CmState::kBound) return fail(EINVAL);
        fd = bind_abstract(name, SOCK_NONBLOCK);
    }
    if (fd < 0) return -1;
    if (listen(fd, kListenBacklog) != 0) {
        int err = errno;
        close(fd);
        return fail(err);
    }
    c->listen_fd = fd;
    c->state = CmState::kListen;
    cm_serve(c);
    return 0;
}

int rdma_create_qp(rdma_cm_id *id, ibv_pd *pd, ibv_qp_init_attr *attr) {
    std::lock_guard lk(S().mu);
    CmId *c = cm(id);
    if (!c || !pd || !attr || !c->pub.verbs || c->qp || pd->context != c->pub.verbs)
        return fail(EINVAL);
    int err = 0;
    Qp *qp = create_qp_locked(reinterpret_cast<Pd *>(pd), attr, &err);
    if (!qp) return fail(err);
    qp->id = c;
    qp->peer_qpn = c->peer_qpn;
    qp->peer_rnr_retry = c->peer_rnr_retry;
    c->qp = qp;
    c->pub.qp = &qp->pub;
    c->pub.send_cq = attr->send_cq;
    c->pub.recv_cq = attr->recv_cq;
    c->pub.srq = attr->srq;
    c->pub.pd = pd;
    return 0;
}

void rdma_destroy_qp(rdma_cm_id *id) {
    std::lock_guard lk(S().mu);
    CmId *c = cm(id);
    if (c && c->qp) destroy_qp_locked(c->qp);
}

int rdma_connect(rdma_cm_id *id, rdma_conn_param *param) {
    State &s = S();
    std::unique_lock lk(s.mu);
    CmId *c = cm(id);
    if (!c || c->state != CmState::kRouteResolved || !c->qp) return fail(EINVAL);
    if (!conn_param_ok(param, kReqPrivMax)) return fail(EINVAL);
    if (!s.port_up || c->ctx->dead) {
        queue_cm_event(c, RDMA_CM_EVENT_UNREACHABLE, -ENETUNREACH, nullptr, 0, 0);
        return 0;
    }
    Qp *qp = c->qp;
    qp->rnr_retry = param ? std::min<std::uint8_t>(param->rnr_retry_count, 7) : 7;
    qp->retry_cnt = param ? std::min<std::uint8_t>(param->retry_count, 7) : 7;
    sockaddr_storage dst = c->pub.route.addr.dst_storage;
    c->state = CmState::kConnecting;  // no second connect while we wait below
    int fd = connect_listener(reinterpret_cast<sockaddr *>(&dst), lk, c);
    if (fd < 0) {
        if (!s.ids.count(c)) return fail(EINVAL);  // destroyed meanwhile
        // Nobody listens there: IB CM's answer is a reject, "invalid service ID", no data.
        c->state = CmState::kRejected;
        queue_cm_event(c, RDMA_CM_EVENT_REJECTED, kRejInvalidServiceId, nullptr, 0, 0);
        return 0;
    }
    c->sock = fd;
    CmReqMsg m{};
    m.src = c->pub.route.addr.src_storage;
    m.dst = c->pub.route.addr.dst_storage;
    m.qpn = qp->pub.qp_num;
    m.rnr_retry = qp->rnr_retry;
    m.retry_count = qp->retry_cnt;
    put_conn_param(&m, param);
    send_cm(c, kCmReq, &m, sizeof(m));
    cm_serve(c);
    return 0;
}

int rdma_accept(rdma_cm_id *id, rdma_conn_param *param) {
    std::lock_guard lk(S().mu);
    CmId *c = cm(id);
    if (!c || c->state != CmState::kReqRcvd || !c->qp) return fail(EINVAL);
    if (!conn_param_ok(param, kRepPrivMax)) return fail(EINVAL);
    Qp *qp = c->qp;
    if (c->peer_closed || c->sock < 0) {
        // The requester went away: the REP is never answered.
        c->state = CmState::kDisconnected;
        qp_to_error(qp, false);
        queue_cm_event(c, RDMA_CM_EVENT_CONNECT_ERROR, -ETIMEDOUT, nullptr, 0, 0);
        return 0;
    }
    qp->peer_qpn = c->peer_qpn;
    qp->peer_rnr_retry = c->peer_rnr_retry;
    qp->rnr_retry = param ? std::min<std::uint8_t>(param->rnr_retry_count, 7) : 7;
    if (qp->pub.state != IBV_QPS_ERR) qp->pub.state = IBV_QPS_RTS;
    CmRepMsg m{};
    m.qpn = qp->pub.qp_num;
    m.rnr_retry = qp->rnr_retry;
    put_conn_param(&m, param);
    send_cm(c, kCmRep, &m, sizeof(m));
    c->state = CmState::kAccepted;
    wake(c->ctx);
    return 0;
}

int rdma_reject(rdma_cm_id *id, const void *private_data, uint8_t private_data_len) {
    std::lock_guard lk(S().mu);
    CmId *c = cm(id);
    if (!c || c->state != CmState::kReqRcvd) return fail(EINVAL);
    if (private_data_len > kRejPrivMax || (private_data_len && !private_data)) return fail(EINVAL);
    send_rej(c, kRejConsumer, private_data, private_data_len);
    c->state = CmState::kRejected;
    close_sock(c);
    return 0;
}

int rdma_disconnect(rdma_cm_id *id) {
    std::lock_guard lk(S().mu);
    CmId *c = cm(id);
    if (!c) return fail(EINVAL);
    switch (c->state) {
        case CmState::kEstablished:
        case CmState::kAccepted: {
            if (c->qp) qp_to_error(c->qp, false);
            send_cm(c, kCmDreq);
            c->state = CmState::kDisconnecting;
            wake(c->ctx);
            return 0;
        }
        case CmState::kDisconnecting:
        case CmState::kDisconnected:
            if (c->qp) qp_to_error(c->qp, false);
            return 0;
        default:
            return fail(EINVAL);
    }
}

int rdma_get_cm_event(rdma_event_channel *channel, rdma_cm_event **event) {
    std::unique_lock lk(S().mu);
    auto *ch = reinterpret_cast<Channel *>(channel);
    if (!ch || !event) return fail(EINVAL);
    if (!wait_queue(lk, ch->cv, ch->pub.fd, [ch] { return !ch->q.empty(); })) return -1;
    Event *e = ch->q.front();
    ch->q.pop_front();
    sig_lower(ch->pub.fd);
    e->owner->pub.event = &e->pub;
    *event = &e->pub;
    return 0;
}

int rdma_ack_cm_event(rdma_cm_event *event) {
    if (!event) return fail(EINVAL);
    std::lock_guard lk(S().mu);
    auto *e = reinterpret_cast<Event *>(event);
    // The id may be gone already (destroyed with the event unacknowledged).
    if (S().ids.count(e->owner) && e->owner->pub.event == event) e->owner->pub.event = nullptr;
    delete e;
    return 0;
}

int rdma_migrate_id(rdma_cm_id *id, rdma_event_channel *channel) {
    std::lock_guard lk(S().mu);
    CmId *c = cm(id);
    if (!c || !channel) return fail(EINVAL);  // no synchronous mode
    auto *to = reinterpret_cast<Channel *>(channel);
    if (to == c->ch) return 0;
    // Events queued and not yet read move with the id (as the kernel moves them).
    if (c->ch) move_events(c->ch, to, c);
    c->ch = to;
    c->pub.channel = channel;
    return 0;
}

const char *rdma_event_str(rdma_cm_event_type event) {
    switch (event) {
        case RDMA_CM_EVENT_ADDR_RESOLVED:
            return "RDMA_CM_EVENT_ADDR_RESOLVED";
        case RDMA_CM_EVENT_ADDR_ERROR:
            return "RDMA_CM_EVENT_ADDR_ERROR";
        case RDMA_CM_EVENT_ROUTE_RESOLVED:
            return "RDMA_CM_EVENT_ROUTE_RESOLVED";
        case RDMA_CM_EVENT_ROUTE_ERROR:
            return "RDMA_CM_EVENT_ROUTE_ERROR";
        case RDMA_CM_EVENT_CONNECT_REQUEST:
            return "RDMA_CM_EVENT_CONNECT_REQUEST";
        case RDMA_CM_EVENT_CONNECT_RESPONSE:
            return "RDMA_CM_EVENT_CONNECT_RESPONSE";
        case RDMA_CM_EVENT_CONNECT_ERROR:
            return "RDMA_CM_EVENT_CONNECT_ERROR";
        case RDMA_CM_EVENT_UNREACHABLE:
            return "RDMA_CM_EVENT_UNREACHABLE";
        case RDMA_CM_EVENT_REJECTED:
            return "RDMA_CM_EVENT_REJECTED";
        case RDMA_CM_EVENT_ESTABLISHED:
            return "RDMA_CM_EVENT_ESTABLISHED";
        case RDMA_CM_EVENT_DISCONNECTED:
            return "RDMA_CM_EVENT_DISCONNECTED";
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
            return "RDMA_CM_EVENT_DEVICE_REMOVAL";
        case RDMA_CM_EVENT_MULTICAST_JOIN:
            return "RDMA_CM_EVENT_MULTICAST_JOIN";
        case RDMA_CM_EVENT_MULTICAST_ERROR:
            return "RDMA_CM_EVENT_MULTICAST_ERROR";
        case RDMA_CM_EVENT_ADDR_CHANGE:
            return "RDMA_CM_EVENT_ADDR_CHANGE";
        case RDMA_CM_EVENT_TIMEWAIT_EXIT:
            return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
        default:
            return "UNKNOWN EVENT";
    }
}

ibv_context **rdma_get_devices(int *num_devices) {
    std::lock_guard lk(S().mu);
    Context *c = cm_context();
    auto **list = static_cast<ibv_context **>(calloc(2, sizeof(ibv_context *)));
    if (!c || !list) {
        free(list);
        errno = ENOMEM;
        return nullptr;
    }
    list[0] = &c->pub;
    if (num_devices) *num_devices = 1;
    return list;
}

void rdma_free_devices(ibv_context **list) {
    free(list);
}

int rdma_set_option(rdma_cm_id *id, int level, int optname, void * /*optval*/, size_t /*optlen*/) {
    if (!id) return fail(EINVAL);
    // Accepted and without effect: the emulated fabric has no TOS, timeouts or address reuse.
    if (level == RDMA_OPTION_ID &&
        (optname == RDMA_OPTION_ID_TOS || optname == RDMA_OPTION_ID_REUSEADDR ||
         optname == RDMA_OPTION_ID_AFONLY || optname == RDMA_OPTION_ID_ACK_TIMEOUT))
        return 0;
    return fail(ENOSYS);
}
