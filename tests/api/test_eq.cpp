// fi_eq(3): event queues opened on the fabric.
#include "fabric_fixture.h"

namespace tandem_test {
namespace {

class EqTest : public FabricTest {
  protected:
    void configure(FabricOptions &o) override { o.num_eps = 0; }

    void open_eq(Fid<fid_eq> &eq, fi_wait_obj wait, uint64_t flags = FI_WRITE,
                 void *context = nullptr) {
        fi_eq_attr attr{};
        attr.size = 64;
        attr.wait_obj = wait;
        attr.flags = flags;
        ASSERT_FI_OK(fi_eq_open(fabric, &attr, eq.out(), context));
    }

    static ssize_t write_event(fid_eq *eq, uint32_t event, void *context, uint64_t data) {
        fi_eq_entry entry{};
        entry.fid = &eq->fid;
        entry.context = context;
        entry.data = data;
        return fi_eq_write(eq, event, &entry, sizeof(entry), 0);
    }
};

TEST_F(EqTest, OpenAndCloseWithEachWaitObject) {
    for (fi_wait_obj w : {FI_WAIT_NONE, FI_WAIT_UNSPEC, FI_WAIT_FD}) {
        Fid<fid_eq> eq;
        ASSERT_NO_FATAL_FAILURE(open_eq(eq, w)) << "wait_obj " << w;
        EXPECT_FI_OK(fi_close(&eq.release()->fid));
    }
}

TEST_F(EqTest, EmptyQueueReadsReturnEagain) {
    Fid<fid_eq> eq;
    ASSERT_NO_FATAL_FAILURE(open_eq(eq, FI_WAIT_NONE));
    uint32_t event = 0;
    fi_eq_entry entry{};
    EXPECT_EQ(fi_eq_read(eq, &event, &entry, sizeof(entry), 0), -FI_EAGAIN);
    fi_eq_err_entry err{};
    EXPECT_EQ(fi_eq_readerr(eq, &err, 0), -FI_EAGAIN);
}

TEST_F(EqTest, WrittenEventIsReadBack) {
    Fid<fid_eq> eq;
    ASSERT_NO_FATAL_FAILURE(open_eq(eq, FI_WAIT_NONE));
    int token = 0;
    ASSERT_FI_RET(write_event(eq, FI_NOTIFY, &token, 0x1234), sizeof(fi_eq_entry));
    uint32_t event = 0;
    fi_eq_entry entry{};
    ASSERT_FI_RET(fi_eq_read(eq, &event, &entry, sizeof(entry), 0), sizeof(fi_eq_entry));
    EXPECT_EQ(event, static_cast<uint32_t>(FI_NOTIFY));
    EXPECT_EQ(entry.context, &token);
    EXPECT_EQ(entry.data, 0x1234u);
    EXPECT_EQ(entry.fid, &eq->fid);
    EXPECT_EQ(fi_eq_read(eq, &event, &entry, sizeof(entry), 0), -FI_EAGAIN);
}

TEST_F(EqTest, PeekDoesNotConsume) {
    Fid<fid_eq> eq;
    ASSERT_NO_FATAL_FAILURE(open_eq(eq, FI_WAIT_NONE));
    ASSERT_FI_RET(write_event(eq, FI_NOTIFY, nullptr, 77), sizeof(fi_eq_entry));
    uint32_t event = 0;
    fi_eq_entry entry{};
    ASSERT_FI_RET(fi_eq_read(eq, &event, &entry, sizeof(entry), FI_PEEK), sizeof(fi_eq_entry));
    EXPECT_EQ(entry.data, 77u);
    entry = {};
    ASSERT_FI_RET(fi_eq_read(eq, &event, &entry, sizeof(entry), FI_PEEK), sizeof(fi_eq_entry));
    EXPECT_EQ(entry.data, 77u);
    entry = {};
    ASSERT_FI_RET(fi_eq_read(eq, &event, &entry, sizeof(entry), 0), sizeof(fi_eq_entry));
    EXPECT_EQ(entry.data, 77u);
    EXPECT_EQ(fi_eq_read(eq, &event, &entry, sizeof(entry), 0), -FI_EAGAIN);
}

TEST_F(EqTest, EventsAreReadInWriteOrder) {
    Fid<fid_eq> eq;
    ASSERT_NO_FATAL_FAILURE(open_eq(eq, FI_WAIT_NONE));
    for (uint64_t i = 0; i < 20; ++i)
        ASSERT_FI_RET(write_event(eq, FI_NOTIFY, nullptr, i), sizeof(fi_eq_entry));
    for (uint64_t i = 0; i < 20; ++i) {
        uint32_t event = 0;
        fi_eq_entry entry{};
        ASSERT_FI_RET(fi_eq_read(eq, &event, &entry, sizeof(entry), 0), sizeof(fi_eq_entry));
        EXPECT_EQ(entry.data, i);
    }
}

TEST_F(EqTest, SreadTimesOutOnEmptyQueue) {
    Fid<fid_eq> eq;
    ASSERT_NO_FATAL_FAILURE(open_eq(eq, FI_WAIT_UNSPEC));
    uint32_t event = 0;
    fi_eq_entry entry{};
    auto t0 = Clock::now();
    ssize_t ret = fi_eq_sread(eq, &event, &entry, sizeof(entry), 100, 0);
    auto elapsed = std::chrono::duration_cast<Ms>(Clock::now() - t0);
    EXPECT_EQ(ret, -FI_EAGAIN) << fi_err_str(ret);
    EXPECT_GE(elapsed.count(), 80);
    EXPECT_LT(elapsed.count(), 5000);
}

TEST_F(EqTest, SreadReturnsQueuedEventAtOnce) {
    for (fi_wait_obj w : {FI_WAIT_UNSPEC, FI_WAIT_FD}) {
        Fid<fid_eq> eq;
        ASSERT_NO_FATAL_FAILURE(open_eq(eq, w));
        ASSERT_FI_RET(write_event(eq, FI_NOTIFY, nullptr, 5), sizeof(fi_eq_entry));
        uint32_t event = 0;
        fi_eq_entry entry{};
        auto t0 = Clock::now();
        ASSERT_FI_RET(fi_eq_sread(eq, &event, &entry, sizeof(entry), 5000, 0), sizeof(fi_eq_entry));
        EXPECT_LT(Clock::now() - t0, 1s);
        EXPECT_EQ(entry.data, 5u);
    }
}

TEST_F(EqTest, SreadWakesWhenAnotherThreadWrites) {
    for (fi_wait_obj w : {FI_WAIT_UNSPEC, FI_WAIT_FD}) {
        Fid<fid_eq> eq;
        ASSERT_NO_FATAL_FAILURE(open_eq(eq, w));
        fid_eq *raw = eq;
        std::thread writer([raw] {
            std::this_thread::sleep_for(150ms);
            write_event(raw, FI_NOTIFY, nullptr, 99);
        });
        uint32_t event = 0;
        fi_eq_entry entry{};
        auto t0 = Clock::now();
        ssize_t ret = fi_eq_sread(eq, &event, &entry, sizeof(entry), 8000, 0);
        auto elapsed = Clock::now() - t0;
        writer.join();
        EXPECT_EQ(ret, static_cast<ssize_t>(sizeof(fi_eq_entry))) << fi_err_str(ret);
        EXPECT_EQ(entry.data, 99u);
        EXPECT_LT(elapsed, 5s) << "sread was not woken by fi_eq_write (wait_obj " << w << ")";
    }
}

TEST_F(EqTest, StrerrorGivesAString) {
    Fid<fid_eq> eq;
    ASSERT_NO_FATAL_FAILURE(open_eq(eq, FI_WAIT_NONE));
    char buf[128] = {};
    const char *s = fi_eq_strerror(eq, 0, nullptr, buf, sizeof(buf));
    EXPECT_NE(s, nullptr);
}

TEST_F(EqTest, CloseWhileBoundToPassiveEndpointIsBusy) {
    InfoPtr hints = alloc_hints();
    hints->fabric_attr->prov_name = strdup(provider_name());
    hints->ep_attr->type = FI_EP_MSG;
    hints->caps = FI_MSG;
    hints->addr_format = FI_SOCKADDR_IN;
    InfoPtr msg_info;
    ASSERT_FI_OK(getinfo_own("127.0.0.1", nullptr, FI_SOURCE, hints.get(), &msg_info));
    Fid<fid_fabric> msg_fabric;
    ASSERT_FI_OK(fi_fabric(msg_info->fabric_attr, msg_fabric.out(), nullptr));
    fi_eq_attr attr{};
    attr.wait_obj = FI_WAIT_UNSPEC;
    Fid<fid_eq> eq;
    ASSERT_FI_OK(fi_eq_open(msg_fabric, &attr, eq.out(), nullptr));
    Fid<fid_pep> pep;
    ASSERT_FI_OK(fi_passive_ep(msg_fabric, msg_info.get(), pep.out(), nullptr));
    ASSERT_FI_OK(fi_pep_bind(pep, &eq->fid, 0));
    int ret = fi_close(&eq->fid);
    EXPECT_EQ(ret, -FI_EBUSY) << "closing an EQ bound to a passive endpoint: " << fi_err_str(ret);
    if (ret == 0) eq.release();
    pep.reset();
    if (eq) {
        EXPECT_FI_OK(fi_close(&eq.release()->fid));
    }
}

}  // namespace
}  // namespace tandem_test
