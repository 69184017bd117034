// Authorization keys (fi_domain(3), fi_endpoint(3) auth_key): "only peer endpoints that are
// programmed to use the same authorization key may communicate". Endpoints of one process with
// keys of their own (ep_attr) or their domain's, on every path the variant runs (node-local,
// TCP link, verbs link): the same key talks; another key, or none against one, is refused at
// connection time (FI_ECONNREFUSED) and nothing reaches the other side.
#include "fabric_fixture.h"

#include <rdma/fi_cm.h>

using namespace tandem_test;

namespace {

std::vector<uint8_t> key_bytes(const char *text) {
    return {text, text + std::strlen(text)};
}

void set_key(uint8_t *&field, size_t &size, const std::vector<uint8_t> &key) {
    std::free(field);
    field = static_cast<uint8_t *>(std::malloc(key.size()));
    std::memcpy(field, key.data(), key.size());
    size = key.size();
}

class AuthKeyTest : public FabricTest {
  protected:
    void configure(FabricOptions &o) override { o.num_eps = 0; }

    // An endpoint of the fixture's domain with its own key (none: the domain's).
    Endpoint &keyed(const char *key) {
        InfoPtr plain = std::move(info);
        info.reset(fi_dupinfo(plain.get()));
        if (key) set_key(info->ep_attr->auth_key, info->ep_attr->auth_key_size, key_bytes(key));
        add_endpoint();
        info = std::move(plain);
        return *eps.back();
    }

    // `from` sends 64 bytes to `to` (which has a receive posted): the send's outcome.
    std::optional<CqError> send_between(Endpoint &from, Endpoint &to, void *sctx, void *rctx) {
        auto s = buf(64), r = buf(64);
        fi_addr_t dst = FI_ADDR_NOTAVAIL;
        EXPECT_EQ(fi_av_insert(from.av, to.name.data(), 1, &dst, 0, nullptr), 1);
        EXPECT_EQ(
            post([&] { return fi_recv(to.ep, r->data(), 64, r->desc, FI_ADDR_UNSPEC, rctx); }), 0);
        EXPECT_EQ(post([&] { return fi_send(from.ep, s->data(), 64, s->desc, dst, sctx); }), 0);
        auto err = wait_err(from, sctx);
        poll_for(kQuiet);
        recv_bufs_.push_back(std::move(r));
        send_bufs_.push_back(std::move(s));
        return err;
    }

    std::vector<std::unique_ptr<DataBuf>> recv_bufs_, send_bufs_;
};

TEST_F(AuthKeyTest, SameKeyTalks) {
    Endpoint &x = keyed("job-1"), &y = keyed("job-1");
    auto err = send_between(x, y, ctx(1), ctx(2));
    EXPECT_FALSE(err) << describe(*err);
    EXPECT_TRUE(x.log.has(ctx(1))) << x.log.summary();
    EXPECT_TRUE(y.log.has(ctx(2)))
        << "the receiver of the same key got nothing: " << y.log.summary();
}

TEST_F(AuthKeyTest, AnotherKeyIsRefused) {
    Endpoint &x = keyed("job-1"), &y = keyed("job-2");
    auto err = send_between(x, y, ctx(1), ctx(2));
    ASSERT_TRUE(err) << "a send to an endpoint of another key did not fail: " << x.log.summary();
    EXPECT_EQ(err->e.err, FI_ECONNREFUSED) << describe(*err);
    EXPECT_FALSE(y.log.has(ctx(2)) || y.log.has_err(ctx(2)))
        << "the endpoint of another key received something: " << y.log.summary();
    // It still talks to its own kind: the receive it posted first (ctx 2, which nothing of
    // x's reached) takes the first message of an endpoint of its key.
    Endpoint &z = keyed("job-2");
    auto ok = send_between(z, y, ctx(3), ctx(4));
    EXPECT_FALSE(ok) << describe(*ok);
    EXPECT_TRUE(y.log.has(ctx(2))) << y.log.summary();
}

TEST_F(AuthKeyTest, KeyedAndUnkeyedDoNotTalk) {
    Endpoint &x = keyed("job-1"), &y = keyed(nullptr);
    auto err = send_between(y, x, ctx(1), ctx(2));
    ASSERT_TRUE(err) << "an endpoint without a key reached one with a key: " << y.log.summary();
    EXPECT_EQ(err->e.err, FI_ECONNREFUSED) << describe(*err);
    EXPECT_FALSE(x.log.has(ctx(2))) << x.log.summary();
}

// fi_endpoint(3): "The domain authorization key will be used if auth_key_size is set to 0."
TEST_F(AuthKeyTest, DomainKeyIsTheDefault) {
    InfoPtr keyed_info(fi_dupinfo(info.get()));
    set_key(keyed_info->domain_attr->auth_key, keyed_info->domain_attr->auth_key_size,
            key_bytes("job-domain"));
    Fid<fid_domain> keyed_domain;
    ASSERT_FI_OK(fi_domain(fabric, keyed_info.get(), keyed_domain.out(), nullptr));
    // An endpoint of the keyed domain without a key of its own, opened as add_endpoint does.
    std::swap(domain, keyed_domain);
    InfoPtr plain = std::move(info);
    info.reset(fi_dupinfo(plain.get()));
    add_endpoint();
    info = std::move(plain);
    std::swap(domain, keyed_domain);
    Endpoint &in_keyed = *eps.back();
    Endpoint &same = keyed("job-domain"), &other = keyed(nullptr);
    auto ok = send_between(same, in_keyed, ctx(1), ctx(2));
    EXPECT_FALSE(ok) << describe(*ok);
    EXPECT_TRUE(in_keyed.log.has(ctx(2))) << in_keyed.log.summary();
    auto err = send_between(other, in_keyed, ctx(3), ctx(4));
    ASSERT_TRUE(err) << other.log.summary();
    EXPECT_EQ(err->e.err, FI_ECONNREFUSED) << describe(*err);
    eps.pop_back();
    eps.pop_back();
    eps.pop_back();  // before their domain
}

TEST(AuthKeyGetinfo, KeysOfTheHintsComeBack) {
    InfoPtr hints = hints_for(FabricOptions{});
    set_key(hints->domain_attr->auth_key, hints->domain_attr->auth_key_size, key_bytes("dom-key"));
    set_key(hints->ep_attr->auth_key, hints->ep_attr->auth_key_size, key_bytes("ep-key-1"));
    InfoPtr out;
    ASSERT_FI_OK(getinfo_own("127.0.0.1", nullptr, FI_SOURCE, hints.get(), &out));
    ASSERT_EQ(out->domain_attr->auth_key_size, 7u);
    EXPECT_EQ(std::memcmp(out->domain_attr->auth_key, "dom-key", 7), 0);
    ASSERT_EQ(out->ep_attr->auth_key_size, 8u);
    EXPECT_EQ(std::memcmp(out->ep_attr->auth_key, "ep-key-1", 8), 0);
}

TEST(AuthKeyGetinfo, KeyLongerThan64BytesIsRefused) {
    InfoPtr hints = hints_for(FabricOptions{});
    set_key(hints->ep_attr->auth_key, hints->ep_attr->auth_key_size, std::vector<uint8_t>(65, 'k'));
    InfoPtr out;
    EXPECT_EQ(getinfo_own("127.0.0.1", nullptr, FI_SOURCE, hints.get(), &out), -FI_ENODATA);
}

}  // namespace
