// Faults of the verbs link, injected into the emulated RDMA device (tests/emurdma) that the
// api_verbs variant runs on: the device's queue pairs moved to the error state, the device
// removed. Each ends what waits on the device with error completions within a bound, never
// a hang; after a queue pair error, the next message to the same peer goes over a new
// connection. Elsewhere (no emulated device in place) the suite is skipped.
#include "fabric_fixture.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace tandem_test {
namespace {

class VerbsFaultTest : public FabricTest {
  protected:
    int (*inject_qp_error)(uint32_t qp_num) = nullptr;
    void (*remove_device)() = nullptr;

    void SetUp() override {
        const char *lib = std::getenv("FI_TANDEM_VERBS_LIB");
        if (!lib || std::string(lib).find("emurdma") == std::string::npos)
            GTEST_SKIP() << "needs the emulated RDMA device (the api_verbs variant)";
        // The provider loaded the library by this path: dlopen gives the same instance.
        void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        ASSERT_NE(h, nullptr) << dlerror();
        inject_qp_error = reinterpret_cast<int (*)(uint32_t)>(dlsym(h, "emurdma_inject_qp_error"));
        remove_device = reinterpret_cast<void (*)()>(dlsym(h, "emurdma_remove_device"));
        ASSERT_NE(inject_qp_error, nullptr);
        ASSERT_NE(remove_device, nullptr);
        FabricTest::SetUp();
    }
};

// A rendezvous send waits for the receiver to read its data; the queue pairs fail under it.
TEST_F(VerbsFaultTest, AQueuePairErrorFailsTheSendThatWaitsAndTheNextMessageReconnects) {
    ASSERT_NO_FATAL_FAILURE(exchange_checked(801, 256));
    const size_t big = 1 << 20;  // above the eager limit: the receiver reads it
    auto s = buf(big);
    fill_pattern(s->data(), big, 802);
    ASSERT_FI_OK(
        post([&] { return fi_tsend(a().ep, s->data(), big, s->desc, a().peer[1], 7, ctx(1)); }));
    poll_for(Ms(50));  // the request reaches b, which has no receive for it
    ASSERT_FALSE(a().log.has(ctx(1)) || a().log.has_err(ctx(1))) << a().log.summary();
    ASSERT_EQ(inject_qp_error(0), 0);
    auto err = wait_err(a(), ctx(1), Ms(10000));
    ASSERT_TRUE(err) << "the waiting send did not fail within 10 s: " << a().log.summary();
    EXPECT_EQ(err->e.err, FI_ECONNRESET);
    EXPECT_FALSE(a().log.has(ctx(1)));
    ASSERT_NO_FATAL_FAILURE(exchange_checked(803, 256));
}

// The device goes away: what waits on it fails, the endpoint reports no success for it.
TEST_F(VerbsFaultTest, ARemovedDeviceFailsWhatWaitsOnIt) {
    ASSERT_NO_FATAL_FAILURE(exchange_checked(811, 256));
    const size_t big = 1 << 20;
    auto s = buf(big);
    ASSERT_FI_OK(
        post([&] { return fi_tsend(a().ep, s->data(), big, s->desc, a().peer[1], 9, ctx(2)); }));
    poll_for(Ms(50));
    remove_device();
    auto err = wait_err(a(), ctx(2), Ms(10000));
    ASSERT_TRUE(err) << "the waiting send did not fail within 10 s: " << a().log.summary();
    EXPECT_EQ(err->e.err, FI_ECONNRESET);
    EXPECT_FALSE(a().log.has(ctx(2)));
}

}  // namespace
}  // namespace tandem_test
