// fi_cm(3) / fi_endpoint(3) for FI_EP_MSG: passive endpoints, connect / accept / reject with
// CM data, FI_CONNREQ / FI_CONNECTED / FI_SHUTDOWN, FI_ECONNREFUSED error events, and data
// transfer over the resulting connections.
#include "fabric_fixture.h"

#include <rdma/fi_atomic.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

namespace tandem_test {
namespace {

struct EqEvent {
    uint32_t event = 0;
    fid_t fid = nullptr;
    InfoPtr info;
    std::vector<uint8_t> data;
};

struct EqError {
    fi_eq_err_entry e{};
    std::vector<uint8_t> err_data;
};

// Drains one EQ into vectors of events and error events.
class EqLog {
  public:
    fid_eq *eq = nullptr;
    std::vector<EqEvent> events;
    std::vector<EqError> errs;

    void drain() {
        for (int guard = 0; guard < 10000; ++guard) {
            alignas(16) uint8_t raw[sizeof(fi_eq_cm_entry) + 8192];
            uint32_t ev = 0;
            ssize_t n = fi_eq_read(eq, &ev, raw, sizeof(raw), 0);
            if (n == -FI_EAGAIN) return;
            if (n == -FI_EAVAIL) {
                EqError err;
                ssize_t r = fi_eq_readerr(eq, &err.e, 0);
                if (r < 0) {
                    ADD_FAILURE() << "fi_eq_readerr after -FI_EAVAIL: " << fi_err_str(r);
                    return;
                }
                if (err.e.err_data && err.e.err_data_size) {
                    auto *d = static_cast<const uint8_t *>(err.e.err_data);
                    err.err_data.assign(d, d + err.e.err_data_size);
                }
                err.e.err_data = nullptr;
                errs.push_back(std::move(err));
                continue;
            }
            if (n < 0) {
                ADD_FAILURE() << "fi_eq_read: " << fi_err_str(n);
                return;
            }
            EqEvent e;
            e.event = ev;
            if (ev == FI_CONNREQ || ev == FI_CONNECTED || ev == FI_SHUTDOWN) {
                EXPECT_GE(static_cast<size_t>(n), sizeof(fi_eq_cm_entry));
                fi_eq_cm_entry cm{};
                std::memcpy(&cm, raw, sizeof(cm));
                e.fid = cm.fid;
                e.info.reset(cm.info);
                if (static_cast<size_t>(n) > sizeof(fi_eq_cm_entry))
                    e.data.assign(raw + sizeof(fi_eq_cm_entry), raw + n);
            } else {
                fi_eq_entry ent{};
                std::memcpy(&ent, raw, sizeof(ent));
                e.fid = ent.fid;
            }
            events.push_back(std::move(e));
        }
    }

    const EqEvent *find(uint32_t ev, fid_t fid = nullptr) const {
        for (auto &e : events)
            if (e.event == ev && (!fid || e.fid == fid)) return &e;
        return nullptr;
    }
    const EqError *find_err(fid_t fid = nullptr) const {
        for (auto &e : errs)
            if (!fid || e.e.fid == fid) return &e;
        return nullptr;
    }
    std::string summary() const {
        std::string s = std::to_string(events.size()) + " events [";
        for (auto &e : events) s += std::string(fi_tostr(&e.event, FI_TYPE_EQ_EVENT)) + " ";
        s += "], " + std::to_string(errs.size()) + " errors [";
        for (auto &e : errs) s += std::string(fi_strerror(e.e.err)) + " ";
        return s + "]";
    }
};

struct Conn {
    Fid<fid_cq> cq;
    Fid<fid_ep> ep;
    CqLog log;
};

class MsgEpTest : public ::testing::Test {
  protected:
    InfoPtr info;
    Fid<fid_fabric> fabric;
    Fid<fid_domain> domain;
    Fid<fid_eq> srv_eq, cli_eq;
    Fid<fid_pep> pep;
    EqLog srv_log, cli_log;
    std::vector<std::unique_ptr<Conn>> conns;  // closed before the EQs (declared after)
    std::vector<uint8_t> pep_name;
    std::array<fi_context2, 64> ctxs_{};

    void *ctx(size_t i) { return &ctxs_.at(i); }

    void SetUp() override {
        InfoPtr hints = alloc_hints();
        hints->fabric_attr->prov_name = strdup(provider_name());
        hints->ep_attr->type = FI_EP_MSG;
        hints->caps = FI_MSG | FI_RMA | FI_ATOMIC;
        hints->mode = FI_CONTEXT | FI_CONTEXT2;
        hints->addr_format = FI_SOCKADDR_IN;
        hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
        hints->domain_attr->threading = FI_THREAD_SAFE;
        int ret = getinfo_own("127.0.0.1", nullptr, FI_SOURCE, hints.get(), &info);
        ASSERT_EQ(ret, 0) << "fi_getinfo(FI_EP_MSG): " << fi_err_str(ret);
        ASSERT_FI_OK(fi_fabric(info->fabric_attr, fabric.out(), nullptr));
        ASSERT_FI_OK(fi_domain(fabric, info.get(), domain.out(), nullptr));
        fi_eq_attr attr{};
        attr.size = 64;
        attr.wait_obj = FI_WAIT_UNSPEC;
        ASSERT_FI_OK(fi_eq_open(fabric, &attr, srv_eq.out(), nullptr));
        ASSERT_FI_OK(fi_eq_open(fabric, &attr, cli_eq.out(), nullptr));
        srv_log.eq = srv_eq;
        cli_log.eq = cli_eq;
        ASSERT_FI_OK(fi_passive_ep(fabric, info.get(), pep.out(), nullptr));
        ASSERT_FI_OK(fi_pep_bind(pep, &srv_eq->fid, 0));
        ASSERT_FI_OK(fi_listen(pep));
        pep_name.resize(64);
        size_t len = pep_name.size();
        ASSERT_FI_OK(fi_getname(&pep->fid, pep_name.data(), &len));
        pep_name.resize(len);
    }

    void TearDown() override {
        conns.clear();
        pep.reset();
        srv_eq.reset();
        cli_eq.reset();
        domain.reset();
        fabric.reset();
    }

    uint16_t pep_port() const {
        sockaddr_in sin{};
        std::memcpy(&sin, pep_name.data(), std::min(pep_name.size(), sizeof(sin)));
        return ntohs(sin.sin_port);
    }

    void progress() {
        srv_log.drain();
        cli_log.drain();
        for (auto &c : conns) c->log.drain();
    }
    bool poll_until(const std::function<bool()> &pred, Ms timeout = kTimeout) {
        return ::tandem_test::poll_until(
            [&] {
                progress();
                return pred();
            },
            timeout);
    }
    ssize_t post(const std::function<ssize_t()> &op) {
        ssize_t ret = -FI_EAGAIN;
        ::tandem_test::poll_until([&] {
            ret = op();
            if (ret != -FI_EAGAIN) return true;
            progress();
            return false;
        });
        return ret;
    }

    // An endpoint bound to its own CQ, or to `shared_cq`, which its log then leaves alone.
    Conn &new_conn(fi_info *i, fid_eq *eq, fid_cq *shared_cq = nullptr) {
        auto c = std::make_unique<Conn>();
        if (!shared_cq) {
            fi_cq_attr cattr{};
            cattr.format = FI_CQ_FORMAT_TAGGED;
            cattr.size = 256;
            EXPECT_FI_OK(fi_cq_open(domain, &cattr, c->cq.out(), nullptr));
            c->log.cq = c->cq;
        }
        c->log.use_readfrom = false;
        EXPECT_FI_OK(fi_endpoint(domain, i, c->ep.out(), nullptr));
        if (c->ep) {
            EXPECT_FI_OK(fi_ep_bind(c->ep, &eq->fid, 0));
            fid_cq *cq = shared_cq ? shared_cq : c->cq.get();
            EXPECT_FI_OK(fi_ep_bind(c->ep, &cq->fid, FI_TRANSMIT | FI_RECV));
        }
        conns.push_back(std::move(c));
        return *conns.back();
    }

    // Client endpoint aimed at the listener, then fi_connect with `data`. The endpoint is
    // enabled explicitly unless `implicit_enable` (fi_connect must then enable it).
    // auth_key: the client endpoint's own authorization key (the listener has none).
    Conn *connect(const void *data, size_t len, uint16_t port = 0, bool implicit_enable = false,
                  const char *auth_key = nullptr) {
        InfoPtr hints(fi_dupinfo(info.get()));
        std::free(hints->src_addr);
        hints->src_addr = nullptr;
        hints->src_addrlen = 0;
        const std::string svc = std::to_string(port ? port : pep_port());
        InfoPtr cinfo;
        int ret = getinfo_own("127.0.0.1", svc.c_str(), 0, hints.get(), &cinfo);
        EXPECT_EQ(ret, 0) << "fi_getinfo for the client: " << fi_err_str(ret);
        if (ret) return nullptr;
        if (auth_key) {
            cinfo->ep_attr->auth_key_size = std::strlen(auth_key);
            cinfo->ep_attr->auth_key = reinterpret_cast<uint8_t *>(strdup(auth_key));
        }
        Conn &c = new_conn(cinfo.get(), cli_eq);
        if (!c.ep) return nullptr;
        if (!implicit_enable) {
            ret = fi_enable(c.ep);
            EXPECT_EQ(ret, 0) << "fi_enable (client): " << fi_err_str(ret);
        }
        ret = fi_connect(c.ep, cinfo->dest_addr, data, len);
        EXPECT_EQ(ret, 0) << "fi_connect: " << fi_err_str(ret);
        return ret ? nullptr : &c;
    }

    // Waits for the next FI_CONNREQ and returns its event (removed from the log).
    std::optional<EqEvent> next_connreq() {
        if (!poll_until([&] { return srv_log.find(FI_CONNREQ) != nullptr; })) return std::nullopt;
        auto it = std::find_if(srv_log.events.begin(), srv_log.events.end(),
                               [](const EqEvent &e) { return e.event == FI_CONNREQ; });
        EqEvent e = std::move(*it);
        srv_log.events.erase(it);
        return e;
    }

    // A client's request held by an enabled server endpoint, not accepted yet: {client,
    // server}, or nulls (with a failure).
    std::pair<Conn *, Conn *> request_held() {
        Conn *cli = connect("x", 1);
        if (!cli) return {nullptr, nullptr};
        auto req = next_connreq();
        EXPECT_TRUE(req) << srv_log.summary();
        if (!req) return {nullptr, nullptr};
        Conn &srv = new_conn(req->info.get(), srv_eq);
        if (!srv.ep) return {nullptr, nullptr};
        int ret = fi_enable(srv.ep);  // (the endpoint holds the request from here on)
        EXPECT_EQ(ret, 0) << "fi_enable (server): " << fi_err_str(ret);
        if (ret) return {nullptr, nullptr};
        return {cli, &srv};
    }

    // The error event that refused the client's connection: nullptr (and a failure) when the
    // client heard nothing; a failure too when it was reported connected.
    const EqError *refusal(const char *who) {
        bool heard = poll_until(
            [&] { return !cli_log.errs.empty() || cli_log.find(FI_CONNECTED) != nullptr; });
        EXPECT_TRUE(heard) << who << " heard nothing: " << cli_log.summary();
        EXPECT_EQ(cli_log.find(FI_CONNECTED), nullptr) << who << " was reported connected";
        return heard ? cli_log.find_err() : nullptr;
    }

    // Accepts a connection request on a new endpoint, enabled explicitly unless
    // `implicit_enable` (fi_accept must then enable it).
    Conn *accept(EqEvent &req, const void *data, size_t len, bool implicit_enable = false) {
        Conn &c = new_conn(req.info.get(), srv_eq);
        if (!c.ep) return nullptr;
        int ret = 0;
        if (!implicit_enable) {
            ret = fi_enable(c.ep);
            EXPECT_EQ(ret, 0) << "fi_enable (server): " << fi_err_str(ret);
        }
        ret = fi_accept(c.ep, data, len);
        EXPECT_EQ(ret, 0) << "fi_accept: " << fi_err_str(ret);
        return ret ? nullptr : &c;
    }

    // The other side alone progresses for `wait` (long enough for what it sends to arrive),
    // then one read of eq must return `expected`, into cm.
    static void read_after_other_side(EqLog &other, fid_eq *eq, uint32_t expected,
                                      fi_eq_cm_entry &cm, Ms wait = 100ms) {
        auto until = std::chrono::steady_clock::now() + wait;
        while (std::chrono::steady_clock::now() < until) other.drain();
        alignas(16) uint8_t raw[sizeof(fi_eq_cm_entry) + 256];
        uint32_t ev = 0;
        ssize_t n = fi_eq_read(eq, &ev, raw, sizeof raw, 0);
        ASSERT_GE(n, ssize_t(sizeof(fi_eq_cm_entry))) << fi_err_str(n);
        EXPECT_EQ(ev, expected);
        std::memcpy(&cm, raw, sizeof cm);
    }

    bool connected(Conn &c, EqLog &log) {
        return poll_until([&] { return log.find(FI_CONNECTED, &c.ep->fid) != nullptr; });
    }

    // Full handshake with small CM data; returns {client, server}.
    std::pair<Conn *, Conn *> establish() {
        const char hello[] = "hello";
        Conn *cli = connect(hello, sizeof(hello));
        if (!cli) return {nullptr, nullptr};
        auto req = next_connreq();
        EXPECT_TRUE(req) << "no FI_CONNREQ: " << srv_log.summary();
        if (!req) return {nullptr, nullptr};
        Conn *srv = accept(*req, "world", 6);
        if (!srv) return {nullptr, nullptr};
        EXPECT_TRUE(connected(*cli, cli_log)) << cli_log.summary();
        EXPECT_TRUE(connected(*srv, srv_log)) << srv_log.summary();
        return {cli, srv};
    }

    // A connection whose server side is bound to `cq` (its log leaves it alone) and counts
    // `cntr_flags` events on `cntr`; returns {client, server}.
    std::pair<Conn *, Conn *> establish_on(fid_cq *cq, fid_cntr *cntr, uint64_t cntr_flags) {
        Conn *cli = connect("x", 1);
        if (!cli) return {nullptr, nullptr};
        auto req = next_connreq();
        EXPECT_TRUE(req) << "no FI_CONNREQ: " << srv_log.summary();
        if (!req) return {nullptr, nullptr};
        Conn *srv = &new_conn(req->info.get(), srv_eq, cq);
        if (!srv->ep) return {nullptr, nullptr};
        EXPECT_FI_OK(fi_ep_bind(srv->ep, &cntr->fid, cntr_flags));
        EXPECT_FI_OK(fi_accept(srv->ep, nullptr, 0));
        EXPECT_TRUE(connected(*cli, cli_log)) << cli_log.summary();
        EXPECT_TRUE(connected(*srv, srv_log)) << srv_log.summary();
        return {cli, srv};
    }

    void exchange(Conn &from, Conn &to, size_t len, uint32_t seed) {
        auto s = std::make_unique<AlignedBuf>(len), r = std::make_unique<AlignedBuf>(len);
        fill_pattern(s->data(), len, seed);
        void *sc = ctx(seed % 32), *rc = ctx(32 + seed % 32);
        ASSERT_FI_OK(post([&] { return fi_recv(to.ep, r->data(), len, nullptr, 0, rc); }));
        ASSERT_FI_OK(post([&] { return fi_send(from.ep, s->data(), len, nullptr, 0, sc); }));
        ASSERT_TRUE(poll_until([&] { return to.log.has(rc) || to.log.has_err(rc); }))
            << to.log.summary();
        auto got = to.log.find(rc);
        ASSERT_TRUE(got) << to.log.summary();
        EXPECT_EQ(got->len, len);
        EXPECT_EQ(check_pattern(r->data(), len, seed), -1);
        ASSERT_TRUE(poll_until([&] { return from.log.has(sc) || from.log.has_err(sc); }));
        EXPECT_TRUE(from.log.has(sc)) << from.log.summary();
        to.log.clear();
        from.log.clear();
    }
};

TEST_F(MsgEpTest, ListenerHasLoopbackAddressWithPort) {
    ASSERT_EQ(pep_name.size(), sizeof(sockaddr_in));
    sockaddr_in sin{};
    std::memcpy(&sin, pep_name.data(), sizeof(sin));
    EXPECT_EQ(sin.sin_family, AF_INET);
    EXPECT_EQ(ntohl(sin.sin_addr.s_addr), 0x7F000001u);
    EXPECT_NE(sin.sin_port, 0);
}

TEST_F(MsgEpTest, ConnectAcceptExchangesCmData) {
    const char hello[] = "hello from the client";
    Conn *cli = connect(hello, sizeof(hello));
    ASSERT_NE(cli, nullptr);
    auto req = next_connreq();
    ASSERT_TRUE(req) << srv_log.summary();
    EXPECT_EQ(req->fid, &pep->fid) << "FI_CONNREQ must name the passive endpoint";
    ASSERT_NE(req->info, nullptr);
    EXPECT_NE(req->info->handle, nullptr) << "connreq info carries no handle";
    EXPECT_EQ(req->info->ep_attr->type, FI_EP_MSG);
    ASSERT_GE(req->data.size(), sizeof(hello));
    EXPECT_EQ(std::memcmp(req->data.data(), hello, sizeof(hello)), 0);
    const char reply[] = "welcome";
    Conn *srv = accept(*req, reply, sizeof(reply));
    ASSERT_NE(srv, nullptr);
    ASSERT_TRUE(connected(*cli, cli_log)) << cli_log.summary();
    ASSERT_TRUE(connected(*srv, srv_log)) << srv_log.summary();
    const EqEvent *ce = cli_log.find(FI_CONNECTED, &cli->ep->fid);
    ASSERT_GE(ce->data.size(), sizeof(reply));
    EXPECT_EQ(std::memcmp(ce->data.data(), reply, sizeof(reply)), 0);
    EXPECT_TRUE(cli_log.errs.empty()) << cli_log.summary();
    EXPECT_TRUE(srv_log.errs.empty()) << srv_log.summary();
}

// fi_endpoint(3): "Calling connect or accept on an endpoint will implicitly enable an endpoint
// if it has not already been enabled."
TEST_F(MsgEpTest, ConnectAndAcceptEnableImplicitly) {
    Conn *cli = connect("implicit", 9, 0, true);
    ASSERT_NE(cli, nullptr);
    auto req = next_connreq();
    ASSERT_TRUE(req) << srv_log.summary();
    Conn *srv = accept(*req, nullptr, 0, true);
    ASSERT_NE(srv, nullptr);
    ASSERT_TRUE(connected(*cli, cli_log)) << cli_log.summary();
    ASSERT_TRUE(connected(*srv, srv_log)) << srv_log.summary();
    ASSERT_NO_FATAL_FAILURE(exchange(*cli, *srv, 100, 408));
}

// A passive endpoint progresses only when its EQ is read (ofi_rxm reads it every 10 ms): a
// request already at the listener must come with the next read, not some reads later.
TEST_F(MsgEpTest, ConnectionRequestAtTheListenerComesWithTheNextEqRead) {
    Conn *c = connect("x", 1);
    ASSERT_NE(c, nullptr);
    // Only the client progresses, long enough for its request to reach the listener.
    fi_eq_cm_entry cm{};
    ASSERT_NO_FATAL_FAILURE(read_after_other_side(cli_log, srv_eq, FI_CONNREQ, cm));
    ASSERT_NE(cm.info, nullptr);
    EXPECT_FI_OK(
        fi_reject(pep, cm.info->handle, nullptr, 0));  // its request is the pep's until then
    fi_freeinfo(cm.info);
}

// An EQ read is the application's connection-management call: an answer already at the
// client's socket comes with its next read, however quiet the endpoint's link was (an idle or
// quiet link is otherwise polled every 64th or 256th pass only: fi_eq_sread, one pass per
// 50 ms, took 12.8 s per connection).
TEST_F(MsgEpTest, ConnectedEventComesWithTheNextEqReadAfterTheAnswerArrived) {
    Conn *cli = connect("c", 1);
    ASSERT_NE(cli, nullptr);
    auto req = next_connreq();
    ASSERT_TRUE(req) << srv_log.summary();
    // The client's link goes quiet meanwhile: many of its passes bring nothing.
    for (int i = 0; i < 2048; ++i) {
        fi_cq_tagged_entry e;
        (void)fi_cq_read(cli->cq, &e, 1);
    }
    Conn *srv = accept(*req, nullptr, 0);
    ASSERT_NE(srv, nullptr);
    // Only the server progresses, long enough for its answer to reach the client's socket
    // (or, over the emulated RDMA device, its connection manager's thread). The client makes
    // no pass meanwhile, so waiting longer cannot make up for a read that skips the link.
    fi_eq_cm_entry cm{};
    ASSERT_NO_FATAL_FAILURE(read_after_other_side(srv_log, cli_eq, FI_CONNECTED, cm, 400ms));
    EXPECT_EQ(cm.fid, &cli->ep->fid);
}

TEST_F(MsgEpTest, GetpeerNamesTheOtherSide) {
    auto [cli, srv] = establish();
    ASSERT_TRUE(cli && srv);
    sockaddr_in peer{};
    size_t len = sizeof(peer);
    ASSERT_FI_OK(fi_getpeer(cli->ep, &peer, &len));
    EXPECT_EQ(len, sizeof(sockaddr_in));
    EXPECT_EQ(ntohs(peer.sin_port), pep_port());
    sockaddr_in cli_name{}, srv_peer{};
    size_t l1 = sizeof(cli_name), l2 = sizeof(srv_peer);
    ASSERT_FI_OK(fi_getname(&cli->ep->fid, &cli_name, &l1));
    ASSERT_FI_OK(fi_getpeer(srv->ep, &srv_peer, &l2));
    EXPECT_EQ(cli_name.sin_port, srv_peer.sin_port);
    EXPECT_EQ(cli_name.sin_addr.s_addr, srv_peer.sin_addr.s_addr);
}

// fi_endpoint(3): an active endpoint opened with info->handle set to a passive endpoint
// acquires its address: fi_getname says so before and after the connection, the connection
// leaves from it (the server sees it as the peer), and the passive endpoint no longer listens.
TEST_F(MsgEpTest, ActiveEndpointTakesThePassiveEndpointsAddress) {
    Fid<fid_eq> eq2;
    fi_eq_attr eq_attr{};
    ASSERT_FI_OK(fi_eq_open(fabric, &eq_attr, eq2.out(), nullptr));
    Fid<fid_pep> reserved;
    ASSERT_FI_OK(fi_passive_ep(fabric, info.get(), reserved.out(), nullptr));
    ASSERT_FI_OK(fi_pep_bind(reserved, &eq2->fid, 0));
    ASSERT_FI_OK(fi_listen(reserved));  // a port of its own
    sockaddr_in bound{};
    size_t len = sizeof bound;
    ASSERT_FI_OK(fi_getname(&reserved->fid, &bound, &len));
    ASSERT_NE(bound.sin_port, 0);

    InfoPtr hints(fi_dupinfo(info.get()));
    hints->handle = &reserved->fid;
    const std::string svc = std::to_string(pep_port());
    fi_info *raw = nullptr;
    ASSERT_FI_OK(fi_getinfo(kApiVersion, "127.0.0.1", svc.c_str(), 0, hints.get(), &raw));
    hints->handle = nullptr;
    InfoPtr cinfo(raw);
    ASSERT_EQ(cinfo->handle, &reserved->fid);
    Conn &cli = new_conn(cinfo.get(), cli_eq);
    ASSERT_TRUE(cli.ep);
    EXPECT_FI_RET(fi_listen(reserved), -FI_EOPBADSTATE);  // its address is the endpoint's now
    reserved.reset();
    auto name_of = [](fid_t fid) {
        sockaddr_in sin{};
        size_t l = sizeof sin;
        EXPECT_FI_OK(fi_getname(fid, &sin, &l));
        return sin;
    };
    EXPECT_EQ(name_of(&cli.ep->fid).sin_port, bound.sin_port);
    ASSERT_FI_OK(fi_connect(cli.ep, cinfo->dest_addr, nullptr, 0));
    auto req = next_connreq();
    ASSERT_TRUE(req) << srv_log.summary();
    auto *peer = static_cast<const sockaddr_in *>(req->info->dest_addr);
    EXPECT_EQ(peer->sin_port, bound.sin_port) << "the connection did not leave from it";
    Conn *srv = accept(*req, nullptr, 0);
    ASSERT_TRUE(srv);
    ASSERT_TRUE(connected(cli, cli_log)) << cli_log.summary();
    EXPECT_EQ(name_of(&cli.ep->fid).sin_port, bound.sin_port);
    exchange(cli, *srv, 64, 41);
}

TEST_F(MsgEpTest, DataFlowsBothWaysAfterConnect) {
    auto [cli, srv] = establish();
    ASSERT_TRUE(cli && srv);
    ASSERT_NO_FATAL_FAILURE(exchange(*cli, *srv, 1024, 400));
    ASSERT_NO_FATAL_FAILURE(exchange(*srv, *cli, 1024, 401));
    ASSERT_NO_FATAL_FAILURE(exchange(*cli, *srv, 8 << 20, 402));
    ASSERT_NO_FATAL_FAILURE(exchange(*srv, *cli, 8 << 20, 403));
    ASSERT_NO_FATAL_FAILURE(exchange(*cli, *srv, 0, 404));
}

TEST_F(MsgEpTest, ReceivePostedBeforeAcceptGetsFirstMessage) {
    auto [cli, held] = request_held();
    ASSERT_TRUE(cli && held);
    Conn &srv = *held;
    AlignedBuf r(256), s(256);
    fill_pattern(s.data(), 256, 405);
    ASSERT_FI_OK(fi_recv(srv.ep, r.data(), 256, nullptr, 0, ctx(1)));
    ASSERT_FI_OK(fi_accept(srv.ep, nullptr, 0));
    ASSERT_TRUE(connected(*cli, cli_log)) << cli_log.summary();
    ASSERT_FI_OK(post([&] { return fi_send(cli->ep, s.data(), 256, nullptr, 0, ctx(0)); }));
    ASSERT_TRUE(poll_until([&] { return srv.log.has(ctx(1)); })) << srv.log.summary();
    EXPECT_EQ(check_pattern(r.data(), 256, 405), -1);
    ASSERT_TRUE(poll_until([&] { return cli->log.has(ctx(0)); })) << cli->log.summary();
}

TEST_F(MsgEpTest, RmaOverConnection) {
    auto [cli, srv] = establish();
    ASSERT_TRUE(cli && srv);
    AlignedBuf target(1 << 20), local(1 << 20);
    Fid<fid_mr> mr;
    ASSERT_FI_OK(fi_mr_reg(domain, target.data(), target.size(), FI_REMOTE_READ | FI_REMOTE_WRITE,
                           0, 55, 0, mr.out(), nullptr));
    const uint64_t base = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR)
                              ? reinterpret_cast<uintptr_t>(target.data())
                              : 0;
    fill_pattern(local.data(), local.size(), 406);
    ASSERT_FI_OK(post([&] {
        return fi_write(cli->ep, local.data(), local.size(), nullptr, 0, base, fi_mr_key(mr),
                        ctx(0));
    }));
    ASSERT_TRUE(poll_until([&] { return cli->log.has(ctx(0)) || cli->log.has_err(ctx(0)); }));
    ASSERT_TRUE(cli->log.has(ctx(0))) << cli->log.summary();
    EXPECT_TRUE(poll_until([&] { return check_pattern(target.data(), target.size(), 406) == -1; }));
    std::memset(local.data(), 0, local.size());
    ASSERT_FI_OK(post([&] {
        return fi_read(cli->ep, local.data(), 4096, nullptr, 0, base + 4096, fi_mr_key(mr), ctx(1));
    }));
    ASSERT_TRUE(poll_until([&] { return cli->log.has(ctx(1)) || cli->log.has_err(ctx(1)); }));
    ASSERT_TRUE(cli->log.has(ctx(1))) << cli->log.summary();
    EXPECT_EQ(check_pattern(local.data(), 4096, 406, 4096), -1);
}

// A connected endpoint runs atomics like an RDM one: fetch-adds from the client into the
// server's memory, each fetching the value the one before it left, then a compare-and-swap.
TEST_F(MsgEpTest, AtomicsOverConnection) {
    auto [cli, srv] = establish();
    ASSERT_TRUE(cli && srv);
    alignas(8) static uint64_t counter;
    counter = 0;
    Fid<fid_mr> mr;
    ASSERT_FI_OK(fi_mr_reg(domain, &counter, sizeof counter, FI_REMOTE_READ | FI_REMOTE_WRITE, 0,
                           56, 0, mr.out(), nullptr));
    const uint64_t addr =
        (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uintptr_t>(&counter) : 0;
    constexpr uint64_t kAdds = 200;
    for (uint64_t i = 0; i < kAdds; ++i) {
        uint64_t two = 2, old = ~0ull;
        void *c = ctx(i % 32);
        cli->log.clear();
        ASSERT_FI_OK(post([&] {
            return fi_fetch_atomic(cli->ep, &two, 1, nullptr, &old, nullptr, 0, addr, fi_mr_key(mr),
                                   FI_UINT64, FI_SUM, c);
        }));
        ASSERT_TRUE(poll_until([&] { return cli->log.has(c) || cli->log.has_err(c); }));
        ASSERT_TRUE(cli->log.has(c)) << cli->log.summary();
        EXPECT_EQ(cli->log.find(c)->flags & (FI_ATOMIC | FI_READ), uint64_t(FI_ATOMIC | FI_READ));
        ASSERT_EQ(old, 2 * i) << "fetch-add " << i;
    }
    EXPECT_EQ(counter, 2 * kAdds);
    uint64_t desired = 7, expected = 2 * kAdds, old = 0;
    cli->log.clear();
    ASSERT_FI_OK(post([&] {
        return fi_compare_atomic(cli->ep, &desired, 1, nullptr, &expected, nullptr, &old, nullptr,
                                 0, addr, fi_mr_key(mr), FI_UINT64, FI_CSWAP, ctx(40));
    }));
    ASSERT_TRUE(poll_until([&] { return cli->log.has(ctx(40)) || cli->log.has_err(ctx(40)); }));
    ASSERT_TRUE(cli->log.has(ctx(40))) << cli->log.summary();
    EXPECT_EQ(old, 2 * kAdds);
    EXPECT_EQ(counter, 7u);
}

TEST_F(MsgEpTest, RejectDeliversEconnrefusedWithData) {
    Conn *cli = connect("let me in", 10);
    ASSERT_NE(cli, nullptr);
    auto req = next_connreq();
    ASSERT_TRUE(req) << srv_log.summary();
    const char why[] = "go away";
    ASSERT_FI_OK(fi_reject(pep, req->info->handle, why, sizeof(why)));
    const EqError *err = refusal("the rejected client");
    ASSERT_NE(err, nullptr);
    EXPECT_EQ(err->e.err, FI_ECONNREFUSED) << fi_strerror(err->e.err);
    EXPECT_EQ(err->e.fid, &cli->ep->fid);
    ASSERT_GE(err->err_data.size(), sizeof(why)) << "reject data missing from the error event";
    EXPECT_EQ(std::memcmp(err->err_data.data(), why, sizeof(why)), 0);
    // The listener keeps working after a reject.
    auto [c2, s2] = establish();
    EXPECT_TRUE(c2 && s2);
}

// An endpoint opened and enabled for a request, then closed without fi_accept, refuses it
// through its own link: the request's connection came from the listener, which may be closed
// already.
TEST_F(MsgEpTest, AnEndpointClosedWithoutAcceptingRefusesTheRequestAfterItsListenerClosed) {
    auto [cli, srv] = request_held();
    ASSERT_TRUE(cli && srv);
    pep.reset();
    srv->ep.reset();
    const EqError *err = refusal("the refused client");
    ASSERT_NE(err, nullptr);
    EXPECT_EQ(err->e.err, FI_ECONNREFUSED) << fi_strerror(err->e.err);
}

// fi_endpoint(3): only endpoints of the same authorization key communicate. The listener
// refuses the request itself (the application never sees it), and takes the next one.
TEST_F(MsgEpTest, ConnectWithAnotherAuthKeyIsRefused) {
    Conn *cli = connect("hello", 5, 0, false, "another-job");
    ASSERT_NE(cli, nullptr);
    const EqError *err = refusal("the client of another key");
    ASSERT_NE(err, nullptr);
    EXPECT_EQ(err->e.err, FI_ECONNREFUSED) << fi_strerror(err->e.err);
    EXPECT_EQ(srv_log.find(FI_CONNREQ), nullptr) << "a request of another key reached the listener";
    auto [c2, s2] = establish();
    EXPECT_TRUE(c2 && s2);
}

TEST_F(MsgEpTest, ConnectToPortWithoutListenerFails) {
    // Find a port nobody listens on.
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr *>(&sin), sizeof(sin)), 0);
    socklen_t sl = sizeof(sin);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr *>(&sin), &sl), 0);
    close(fd);
    InfoPtr hints(fi_dupinfo(info.get()));
    std::free(hints->src_addr);
    hints->src_addr = nullptr;
    hints->src_addrlen = 0;
    const std::string svc = std::to_string(ntohs(sin.sin_port));
    InfoPtr cinfo;
    ASSERT_FI_OK(getinfo_own("127.0.0.1", svc.c_str(), 0, hints.get(), &cinfo));
    Conn &c = new_conn(cinfo.get(), cli_eq);
    ASSERT_TRUE(c.ep);
    ASSERT_FI_OK(fi_enable(c.ep));
    int ret = fi_connect(c.ep, cinfo->dest_addr, nullptr, 0);
    if (ret != 0) {
        EXPECT_EQ(ret, -FI_ECONNREFUSED) << fi_err_str(ret);
        return;  // refused synchronously: fine
    }
    ASSERT_TRUE(poll_until([&] {
        return !cli_log.errs.empty() || cli_log.find(FI_CONNECTED) != nullptr;
    })) << "connect to a closed port neither failed nor connected";
    EXPECT_EQ(cli_log.find(FI_CONNECTED), nullptr);
    ASSERT_FALSE(cli_log.errs.empty());
    EXPECT_EQ(cli_log.errs[0].e.err, FI_ECONNREFUSED) << fi_strerror(cli_log.errs[0].e.err);
    EXPECT_EQ(cli_log.errs[0].e.fid, &c.ep->fid);
}

TEST_F(MsgEpTest, ShutdownNotifiesPeer) {
    auto [cli, srv] = establish();
    ASSERT_TRUE(cli && srv);
    ASSERT_FI_OK(fi_shutdown(cli->ep, 0));
    ASSERT_TRUE(poll_until([&] { return srv_log.find(FI_SHUTDOWN, &srv->ep->fid) != nullptr; }))
        << "no FI_SHUTDOWN at the server: " << srv_log.summary();
    // Sending on the shut-down endpoint fails (at once or through the CQ).
    AlignedBuf s(64);
    ssize_t ret = fi_send(cli->ep, s.data(), 64, nullptr, 0, ctx(5));
    if (ret == 0) {
        EXPECT_TRUE(poll_until([&] { return cli->log.has_err(ctx(5)) || cli->log.has(ctx(5)); }));
        EXPECT_FALSE(cli->log.has(ctx(5))) << "send after fi_shutdown completed successfully";
    } else {
        EXPECT_LT(ret, 0);
    }
}

// The endpoint that calls fi_shutdown gets FI_SHUTDOWN as well (as on verbs and libfabric's
// tcp provider), once, and so does its peer when it shuts down in turn: fabtests' fi_cm_data
// has both sides call fi_shutdown and wait for the event.
TEST_F(MsgEpTest, EachSideThatShutsDownGetsOneFiShutdown) {
    auto [cli, srv] = establish();
    ASSERT_TRUE(cli && srv);
    ASSERT_FI_OK(fi_shutdown(cli->ep, 0));
    ASSERT_TRUE(poll_until([&] { return cli_log.find(FI_SHUTDOWN, &cli->ep->fid) != nullptr; }))
        << "no FI_SHUTDOWN on the endpoint that shut down: " << cli_log.summary();
    ASSERT_TRUE(poll_until([&] { return srv_log.find(FI_SHUTDOWN, &srv->ep->fid) != nullptr; }))
        << srv_log.summary();
    ASSERT_FI_OK(fi_shutdown(srv->ep, 0));
    for (int i = 0; i < 100; ++i) progress();
    auto count = [](const EqLog &log, fid_t fid) {
        return std::count_if(log.events.begin(), log.events.end(), [&](const EqEvent &e) {
            return e.event == FI_SHUTDOWN && e.fid == fid;
        });
    };
    EXPECT_EQ(count(cli_log, &cli->ep->fid), 1) << cli_log.summary();
    EXPECT_EQ(count(srv_log, &srv->ep->fid), 1) << srv_log.summary();
}

// FI_CONNECTED of an accepted endpoint is on the EQ when fi_accept returns: an application
// that accepts and then reads the EQ must not find the listener's next FI_CONNREQ first
// (fabtests' fi_multi_ep). Seen without reading the EQ (a read progresses the listener): the
// EQ's descriptor is readable at once.
TEST_F(MsgEpTest, FiConnectedIsOnTheEqWhenAcceptReturns) {
    Conn *cli = connect("x", 1);
    ASSERT_TRUE(cli);
    auto req = next_connreq();
    ASSERT_TRUE(req) << srv_log.summary();
    int fd = -1;
    ASSERT_FI_OK(fi_control(&srv_eq->fid, FI_GETWAIT, &fd));
    ASSERT_GE(fd, 0);
    Conn *srv = accept(*req, nullptr, 0);
    ASSERT_TRUE(srv);
    pollfd pfd{fd, POLLIN, 0};
    EXPECT_EQ(poll(&pfd, 1, 0), 1) << "nothing on the EQ when fi_accept returned";
    alignas(16) uint8_t raw[sizeof(fi_eq_cm_entry) + 64];
    uint32_t event = 0;
    ASSERT_GE(fi_eq_read(srv_eq, &event, raw, sizeof raw, 0), ssize_t(sizeof(fi_eq_cm_entry)));
    EXPECT_EQ(event, uint32_t(FI_CONNECTED));
    fi_eq_cm_entry entry{};
    std::memcpy(&entry, raw, sizeof entry);
    EXPECT_EQ(entry.fid, &srv->ep->fid);
    EXPECT_TRUE(connected(*cli, cli_log)) << cli_log.summary();
}

TEST_F(MsgEpTest, ClosingPeerEndpointNotifiesShutdown) {
    auto [cli, srv] = establish();
    ASSERT_TRUE(cli && srv);
    fid_t cli_fid = &cli->ep->fid;
    srv->ep.reset();  // abrupt close of the server side
    EXPECT_TRUE(poll_until([&] { return cli_log.find(FI_SHUTDOWN, cli_fid) != nullptr; }))
        << "no FI_SHUTDOWN after the peer closed: " << cli_log.summary();
}

TEST_F(MsgEpTest, SeveralClientsOnOneListener) {
    constexpr int kClients = 4;
    std::vector<Conn *> clients, servers(kClients, nullptr);
    for (int i = 0; i < kClients; ++i) {
        uint8_t id = static_cast<uint8_t>(i);
        Conn *c = connect(&id, 1);
        ASSERT_NE(c, nullptr);
        clients.push_back(c);
    }
    for (int i = 0; i < kClients; ++i) {
        auto req = next_connreq();
        ASSERT_TRUE(req) << "connreq " << i << ": " << srv_log.summary();
        ASSERT_GE(req->data.size(), 1u);
        const uint8_t id = req->data[0];
        ASSERT_LT(id, kClients);
        EXPECT_EQ(servers[id], nullptr) << "two requests carried id " << int(id);
        servers[id] = accept(*req, nullptr, 0);
        ASSERT_NE(servers[id], nullptr);
    }
    for (int i = 0; i < kClients; ++i) {
        ASSERT_TRUE(connected(*clients[i], cli_log)) << i << ": " << cli_log.summary();
        ASSERT_TRUE(connected(*servers[i], srv_log)) << i << ": " << srv_log.summary();
    }
    for (int i = 0; i < kClients; ++i)
        ASSERT_NO_FATAL_FAILURE(exchange(*clients[i], *servers[i], 512, 410 + i));
}

TEST_F(MsgEpTest, CmDataUpToTheAdvertisedSizeArrives) {
    size_t max = 0, len = sizeof(max);
    ASSERT_FI_OK(fi_getopt(&pep->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &max, &len));
    ASSERT_GT(max, 0u) << "no room for CM data";
    const size_t n = std::min<size_t>(max, 4096);
    std::vector<uint8_t> data(n);
    fill_pattern(data.data(), n, 407);
    Conn *cli = connect(data.data(), n);
    ASSERT_NE(cli, nullptr);
    auto req = next_connreq();
    ASSERT_TRUE(req) << srv_log.summary();
    ASSERT_GE(req->data.size(), n);
    EXPECT_EQ(check_pattern(req->data.data(), n, 407), -1);
    Conn *srv = accept(*req, data.data(), n);
    ASSERT_NE(srv, nullptr);
    ASSERT_TRUE(connected(*cli, cli_log)) << cli_log.summary();
    const EqEvent *ce = cli_log.find(FI_CONNECTED, &cli->ep->fid);
    ASSERT_GE(ce->data.size(), n);
    EXPECT_EQ(check_pattern(ce->data.data(), n, 407), -1);
}

// ofi_rxm closes a connection's MSG endpoint, then reads the CQ that all its connections share
// and reposts each completed receive buffer on the endpoint the completion came from: the
// closed endpoint's receive completions must be gone by then (fi_endpoint(3) lets a provider
// discard them; verbs does). Its transmit completions, and the other endpoint's, stay.
TEST_F(MsgEpTest, ClosingAnEndpointDiscardsItsReceiveCompletionsFromASharedCq) {
    fi_cq_attr cattr{};
    cattr.format = FI_CQ_FORMAT_TAGGED;
    cattr.size = 64;
    Fid<fid_cq> shared;
    ASSERT_FI_OK(fi_cq_open(domain, &cattr, shared.out(), nullptr));
    fi_cntr_attr nattr{};
    nattr.events = FI_CNTR_EVENTS_COMP;
    Fid<fid_cntr> done;  // counts what the shared CQ holds, without reading it
    ASSERT_FI_OK(fi_cntr_open(domain, &nattr, done.out(), nullptr));
    Conn *cli[2], *srv[2];
    for (int i = 0; i < 2; ++i) {
        std::tie(cli[i], srv[i]) = establish_on(shared, done, FI_SEND | FI_RECV);
        ASSERT_TRUE(cli[i] && srv[i]);
        ASSERT_FALSE(HasFailure());
    }
    AlignedBuf r0(64), r1(64), s(64), back(64);
    fill_pattern(s.data(), 64, 408);
    ASSERT_FI_OK(fi_recv(srv[0]->ep, r0.data(), 64, nullptr, 0, ctx(1)));
    ASSERT_FI_OK(fi_recv(srv[1]->ep, r1.data(), 64, nullptr, 0, ctx(2)));
    ASSERT_FI_OK(fi_recv(cli[0]->ep, back.data(), 64, nullptr, 0, ctx(3)));
    ASSERT_FI_OK(post([&] { return fi_send(cli[0]->ep, s.data(), 64, nullptr, 0, ctx(4)); }));
    ASSERT_FI_OK(post([&] { return fi_send(cli[1]->ep, s.data(), 64, nullptr, 0, ctx(5)); }));
    ASSERT_FI_OK(post([&] { return fi_send(srv[0]->ep, s.data(), 64, nullptr, 0, ctx(6)); }));
    // Both receives and srv[0]'s send completed: all three wait in the shared CQ.
    ASSERT_TRUE(poll_until([&] { return fi_cntr_read(done) == 3; }))
        << "completions counted: " << fi_cntr_read(done);
    EXPECT_EQ(check_pattern(r0.data(), 64, 408), -1);
    srv[0]->ep.reset();
    CqLog log;
    log.cq = shared;
    log.use_readfrom = false;
    log.drain();
    EXPECT_FALSE(log.has(ctx(1))) << "a receive of the closed endpoint was still reported: "
                                  << log.summary();
    EXPECT_TRUE(log.has(ctx(2))) << log.summary();
    EXPECT_TRUE(log.has(ctx(6))) << "the closed endpoint's send completion was dropped: "
                                 << log.summary();
    EXPECT_EQ(log.comps.size(), 2u) << log.summary();
    EXPECT_TRUE(log.errs.empty()) << log.summary();
    srv[1]->ep.reset();  // before the shared CQ and counter it is bound to
}

// A CQ the application sleeps on (FI_WAIT_FD) whose only entry is a receive of an endpoint
// that closes: once the discard empties it, its descriptor must not stay readable.
TEST_F(MsgEpTest, CqEmptiedByAClosingEndpointDoesNotStayReadable) {
    fi_cq_attr cattr{};
    cattr.format = FI_CQ_FORMAT_TAGGED;
    cattr.size = 64;
    cattr.wait_obj = FI_WAIT_FD;
    Fid<fid_cq> cq;
    ASSERT_FI_OK(fi_cq_open(domain, &cattr, cq.out(), nullptr));
    int fd = -1;
    ASSERT_FI_OK(fi_control(&cq->fid, FI_GETWAIT, &fd));
    fi_cntr_attr nattr{};
    nattr.events = FI_CNTR_EVENTS_COMP;
    Fid<fid_cntr> done;
    ASSERT_FI_OK(fi_cntr_open(domain, &nattr, done.out(), nullptr));
    auto [cli, srv] = establish_on(cq, done, FI_RECV);
    ASSERT_TRUE(cli && srv);
    ASSERT_FALSE(HasFailure());
    AlignedBuf r(64), s(64);
    ASSERT_FI_OK(fi_recv(srv->ep, r.data(), 64, nullptr, 0, ctx(1)));
    fid *fids[] = {&cq->fid};
    ASSERT_FI_OK(fi_trywait(fabric, fids, 1));  // the application may sleep from here on
    ASSERT_FI_OK(post([&] { return fi_send(cli->ep, s.data(), 64, nullptr, 0, ctx(2)); }));
    ASSERT_TRUE(poll_until([&] { return fi_cntr_read(done) == 1; }));
    pollfd pfd{fd, POLLIN, 0};
    ASSERT_EQ(::poll(&pfd, 1, 0), 1) << "the receive did not wake the sleeper";
    fid_t cli_fid = &cli->ep->fid;
    srv->ep.reset();
    // Let the client take in the disconnect, so that no socket of the domain has anything to
    // read when the application goes back to sleep.
    ASSERT_TRUE(poll_until([&] { return cli_log.find(FI_SHUTDOWN, cli_fid) != nullptr; }))
        << cli_log.summary();
    EXPECT_EQ(fi_cq_read(cq, nullptr, 0), -FI_EAGAIN);
    ASSERT_FI_OK(fi_trywait(fabric, fids, 1));
    pfd.revents = 0;
    EXPECT_EQ(::poll(&pfd, 1, 0), 0) << "the emptied CQ's descriptor is still readable";
}

// The client sends the server one 64-byte message (into r, receive context ctx(1)) and shuts
// down. Progress from then on goes through the EQs and the client's CQ only, so that the
// server's CQ stays unread (the fixture's poll_until and post would read it): the returned
// step drives it and says whether the server has seen FI_SHUTDOWN.
class MsgShutdownTest : public MsgEpTest {
  protected:
    Conn *cli = nullptr, *srv = nullptr;
    AlignedBuf r{64}, s{64};

    std::function<bool()> send_then_shutdown() {
        std::tie(cli, srv) = establish();
        EXPECT_TRUE(cli && srv);
        if (!cli || !srv) return [] { return false; };
        auto events_only = [this] {
            srv_log.drain();
            cli_log.drain();
            cli->log.drain();
            return srv_log.find(FI_SHUTDOWN, &srv->ep->fid) != nullptr;
        };
        fill_pattern(s.data(), 64, 409);
        EXPECT_FI_OK(fi_recv(srv->ep, r.data(), 64, nullptr, 0, ctx(1)));
        EXPECT_FI_OK(fi_send(cli->ep, s.data(), 64, nullptr, 0, ctx(2)));
        EXPECT_TRUE(::tandem_test::poll_until([&] {
            events_only();
            return cli->log.has(ctx(2));
        })) << cli->log.summary();
        EXPECT_FI_OK(fi_shutdown(cli->ep, 0));
        return events_only;
    }
};

// What the peer sent before it shut down is read before FI_SHUTDOWN is: an application (ofi_rxm
// is one) that closes the endpoint on FI_SHUTDOWN then finds none of its receives in the CQ.
TEST_F(MsgShutdownTest, ShutdownIsReportedOnceTheReceivesBeforeItAreRead) {
    auto events_only = send_then_shutdown();
    ASSERT_FALSE(HasFailure());
    EXPECT_FALSE(::tandem_test::poll_until(events_only, Ms(500)))
        << "FI_SHUTDOWN came before the receive completion was read";
    EXPECT_EQ(fi_cq_read(srv->cq, nullptr, 0), 0) << "the receive completion is not queued";
    srv->log.drain();
    ASSERT_TRUE(srv->log.has(ctx(1))) << srv->log.summary();
    EXPECT_EQ(check_pattern(r.data(), 64, 409), -1);
    EXPECT_TRUE(::tandem_test::poll_until(events_only))
        << "no FI_SHUTDOWN once the CQ was read: " << srv_log.summary();
}

// An application that waits for FI_SHUTDOWN before it reads its CQ still gets the event (after
// the endpoint's hold, about a second), and the receive completion is still there afterwards.
TEST_F(MsgShutdownTest, ShutdownComesEvenIfTheCqIsNeverRead) {
    auto events_only = send_then_shutdown();
    ASSERT_FALSE(HasFailure());
    EXPECT_TRUE(::tandem_test::poll_until(events_only, Ms(10000)))
        << "no FI_SHUTDOWN while the receive completion stayed unread: " << srv_log.summary();
    srv->log.drain();
    EXPECT_TRUE(srv->log.has(ctx(1))) << srv->log.summary();
}

}  // namespace
}  // namespace tandem_test
