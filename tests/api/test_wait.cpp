// fi_poll(3): native wait objects (FI_GETWAIT + epoll, fi_trywait), wait sets (fi_wait_open /
// fi_wait) and poll sets (fi_poll_open / fi_poll). With FI_PROGRESS_MANUAL the provider must
// make its wait objects fire when progress is needed, or a blocked application never wakes.
#include "fabric_fixture.h"

#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

// fi_wait_open, fi_wait and the fi_poll_* calls: deprecated from libfabric 2.0, whose headers mark
// them so (a build against them, cmake -DTANDEM_LIBFABRIC_PREFIX). Applications of 1.x call them,
// and tandem serves those.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace tandem_test {
namespace {

// Closes an epoll descriptor.
struct Epoll {
    int fd = epoll_create1(0);
    ~Epoll() {
        if (fd >= 0) close(fd);
    }
    bool add(int wfd) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = wfd;
        return epoll_ctl(fd, EPOLL_CTL_ADD, wfd, &ev) == 0;
    }
    int wait(int timeout_ms) {
        epoll_event ev[4];
        return epoll_wait(fd, ev, 4, timeout_ms);
    }
};

// How often the calling thread has given the core away waiting (getrusage's ru_nvcsw): a
// blocking call that sleeps through an idle second adds one; one that wakes every 50 ms to
// look again adds twenty. What a wake-up test cannot see (a periodic look finds what a missed
// wake-up left behind), this can.
long voluntary_switches() {
    rusage usage{};
    getrusage(RUSAGE_THREAD, &usage);
    return usage.ru_nvcsw;
}
constexpr long kIdleSleepSwitches = 3;  // one sleep, and room for a lock's or the kernel's

// An endpoint of a domain of its own (so that nothing but its own calls drive it), whose CQ has
// the wait object `wait`, with the endpoint named `to_name` at *to.
void open_sender_domain(fid_fabric *fabric, fi_info *info, const std::vector<uint8_t> &to_name,
                        Fid<fid_domain> &domain, Endpoint &sender, fi_wait_obj wait,
                        fi_addr_t &to) {
    ASSERT_FI_OK(fi_domain(fabric, info, domain.out(), nullptr));
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_TAGGED;
    cq_attr.wait_obj = wait;
    ASSERT_FI_OK(fi_cq_open(domain, &cq_attr, sender.cq.out(), nullptr));
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    ASSERT_FI_OK(fi_av_open(domain, &av_attr, sender.av.out(), nullptr));
    ASSERT_FI_OK(fi_endpoint(domain, info, sender.ep.out(), nullptr));
    ASSERT_FI_OK(fi_ep_bind(sender.ep, &sender.av->fid, 0));
    ASSERT_FI_OK(fi_ep_bind(sender.ep, &sender.cq->fid, FI_TRANSMIT | FI_RECV));
    ASSERT_FI_OK(fi_enable(sender.ep));
    ASSERT_FI_RET(fi_av_insert(sender.av, to_name.data(), 1, &to, 0, nullptr), 1);
}

class FdWaitTest : public FabricTest {
  protected:
    void configure(FabricOptions &o) override {
        o.cq_wait = FI_WAIT_FD;
        o.mr_mode &= ~FI_MR_LOCAL;  // plain buffers below
    }
    int cq_fd(Endpoint &e) {
        int fd = -1;
        int ret = fi_control(&e.cq->fid, FI_GETWAIT, &fd);
        EXPECT_EQ(ret, 0) << "FI_GETWAIT: " << fi_err_str(ret);
        return fd;
    }
    // An endpoint of a domain of its own (so that nothing but its own calls drive it), whose
    // CQ has the wait object `wait`, with b at to_b.
    void open_sender(Fid<fid_domain> &domain, Endpoint &sender, fi_wait_obj wait, fi_addr_t &to_b) {
        open_sender_domain(fabric, info.get(), b().name, domain, sender, wait, to_b);
    }
};

TEST_F(FdWaitTest, GetwaitReturnsDescriptor) {
    EXPECT_GE(cq_fd(a()), 0);
    EXPECT_GE(cq_fd(b()), 0);
}

// fi_poll(3): FI_GETWAITOBJ "returns the type of wait object associated with a wait set or fid".
TEST_F(FdWaitTest, GetwaitobjReportsFd) {
    enum fi_wait_obj obj = FI_WAIT_NONE;
    ASSERT_FI_OK(fi_control(&a().cq->fid, FI_GETWAITOBJ, &obj));
    EXPECT_EQ(obj, FI_WAIT_FD);
}

TEST_F(FdWaitTest, TrywaitIsSuccessOnlyWhenNothingIsPending) {
    fid_t fids[1] = {&b().cq->fid};
    EXPECT_EQ(fi_trywait(fabric, fids, 1), FI_SUCCESS) << "empty CQ, no traffic";
    AlignedBuf s(64), r(64);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r.data(), 64, nullptr, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(post([&] { return fi_send(a().ep, s.data(), 64, nullptr, a().peer[1], ctx(0)); }));
    // Only trywait and a's CQ are driven: trywait must eventually report the pending receive.
    int ret = FI_SUCCESS;
    ASSERT_TRUE(::tandem_test::poll_until([&] {
        a().log.drain();
        ret = fi_trywait(fabric, fids, 1);
        return ret == -FI_EAGAIN;
    })) << "fi_trywait kept returning "
        << fi_err_str(ret) << " with a message on the way";
    ASSERT_TRUE(poll_until([&] { return b().log.has(ctx(1)); })) << b().log.summary();
    ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(0)); })) << a().log.summary();
    // Drained and quiet again: safe to block.
    EXPECT_TRUE(::tandem_test::poll_until(
        [&] {
            b().log.drain();
            return fi_trywait(fabric, fids, 1) == FI_SUCCESS;
        },
        2s))
        << "fi_trywait never returned FI_SUCCESS on a drained CQ";
}

TEST_F(FdWaitTest, EpollOnCqFdWakesWhenMessageArrives) {
    const int fd = cq_fd(b());
    ASSERT_GE(fd, 0);
    Epoll ep;
    ASSERT_GE(ep.fd, 0);
    ASSERT_TRUE(ep.add(fd));
    AlignedBuf s(128), r(128);
    fill_pattern(s.data(), 128, 600);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r.data(), 128, nullptr, FI_ADDR_UNSPEC, ctx(1)); }));
    // b's thread: block in epoll whenever fi_trywait allows it; read when woken.
    std::atomic<bool> got{false};
    std::atomic<int> wakeups{0}, timeouts{0};
    std::atomic<long> blocked_ms{0};
    std::thread waiter([&] {
        fid_t fids[1] = {&b().cq->fid};
        const auto deadline = Clock::now() + kTimeout;
        while (!got && Clock::now() < deadline) {
            if (fi_trywait(fabric, fids, 1) == FI_SUCCESS) {
                auto t0 = Clock::now();
                int n = ep.wait(3000);
                blocked_ms += std::chrono::duration_cast<Ms>(Clock::now() - t0).count();
                (n > 0 ? wakeups : timeouts)++;
            }
            fi_cq_tagged_entry e[4];
            ssize_t n;
            while ((n = fi_cq_read(b().cq, e, 4)) > 0)
                for (ssize_t i = 0; i < n; ++i)
                    if (e[i].op_context == ctx(1)) got = true;
        }
    });
    std::this_thread::sleep_for(200ms);  // let b block first
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s.data(), 128, nullptr, a().peer[1], ctx(0)); }));
    auto sent_at = Clock::now();
    ::tandem_test::poll_until([&] {
        a().log.drain();
        return got.load() && a().log.has(ctx(0));
    });
    auto done_at = Clock::now();
    waiter.join();
    ASSERT_TRUE(got.load()) << "message never read on b; wakeups " << wakeups << ", timeouts "
                            << timeouts;
    EXPECT_GE(wakeups.load(), 1) << "epoll on the CQ fd never woke up";
    EXPECT_EQ(timeouts.load(), 0) << "b only saw the message after an epoll timeout";
    EXPECT_LT(done_at - sent_at, 2s);
    EXPECT_EQ(check_pattern(r.data(), 128, 600), -1);
}

// The sender is in another domain, so nothing but the wake-up it sends (the peer's FIFO on the
// node-local path, the socket over the link) can make b's descriptor readable: the domain's
// own progress, which delivered the message in the test above, never runs for b here. A raw
// epoll_wait has no periodic wake-up either.
TEST_F(FdWaitTest, EpollOnCqFdWakesForASenderInAnotherDomain) {
    Fid<fid_domain> other_domain;
    Endpoint sender;
    fi_addr_t to_b = FI_ADDR_NOTAVAIL;
    ASSERT_NO_FATAL_FAILURE(open_sender(other_domain, sender, FI_WAIT_NONE, to_b));

    const int fd = cq_fd(b());
    ASSERT_GE(fd, 0);
    Epoll ep;
    ASSERT_TRUE(ep.add(fd));
    AlignedBuf s(64), r(64);
    fill_pattern(s.data(), 64, 601);
    ASSERT_FI_OK(fi_recv(b().ep, r.data(), 64, nullptr, FI_ADDR_UNSPEC, ctx(1)));
    fid_t fids[1] = {&b().cq->fid};
    ASSERT_EQ(fi_trywait(fabric, fids, 1), FI_SUCCESS);
    ASSERT_FI_OK(post([&] { return fi_send(sender.ep, s.data(), 64, nullptr, to_b, ctx(0)); }));
    // Over the link the sender's connection request reaches b's listener first, which makes
    // b's descriptor readable as well; the rest of the message then needs both sides driven.
    ASSERT_EQ(ep.wait(10000), 1) << "b's CQ descriptor never became readable";
    bool received = false, sent = false;
    fi_cq_tagged_entry e{};
    ASSERT_TRUE(::tandem_test::poll_until([&] {
        fi_cq_tagged_entry se{};
        sent = sent || fi_cq_read(sender.cq, &se, 1) == 1;
        received = received || fi_cq_read(b().cq, &e, 1) == 1;
        return sent && received;
    })) << "sent "
        << sent << ", received " << received;
    EXPECT_EQ(e.op_context, ctx(1));
    EXPECT_EQ(check_pattern(r.data(), 64, 601), -1);
    sender.ep.reset();
}

// A sender that sleeps on its CQ's descriptor while its sends are still on the way: a burst of
// eager sends far larger than a socket's buffers (over a link, what did not fit goes out only
// when tandem runs, and the peer taking it gives the sender nothing to read), then one large
// send (rendezvous). fi_trywait must refuse the sleep while such work waits, or the descriptor
// must wake for it: every sleep here is bounded, and one that runs to its end fails. The
// receiver is driven by a thread of its own, in another domain. (Measured: over the TCP link the
// sender sleeps a few times in the burst, node-local a few hundred times.)
TEST_F(FdWaitTest, ASenderAsleepWhileItsSendsAreOnTheWayWakesForThem) {
    Fid<fid_domain> other_domain;
    Endpoint sender;
    fi_addr_t to_b = FI_ADDR_NOTAVAIL;
    ASSERT_NO_FATAL_FAILURE(open_sender(other_domain, sender, FI_WAIT_FD, to_b));

    // Eager sends of 64 KiB (tandem's eager limit), as many as the queues take, up to 32 MiB
    // in all; then one of 32 MiB.
    constexpr size_t kEager = 64u << 10, kLarge = 32u << 20;
    const size_t burst = std::min<size_t>({512, info->tx_attr->size, info->rx_attr->size});
    AlignedBuf s(kLarge), r(kLarge);
    fill_pattern(s.data(), kLarge, 611);
    std::atomic<size_t> received{0};
    std::atomic<bool> stop{false}, slept{false};
    std::thread receiver([&] {
        // The receiver takes nothing before the sender's first sleep: the sender then sleeps
        // with what its socket could not take, and only that socket's room can wake it.
        const auto start_by = std::chrono::steady_clock::now() + 10s;
        while (!slept.load() && !stop.load() && std::chrono::steady_clock::now() < start_by)
            std::this_thread::sleep_for(1ms);
        size_t posted = 0;
        while (!stop.load() && received.load() < burst + 1) {
            if (posted < burst + 1) {
                const bool large = posted == burst;
                uint8_t *at = large ? r.data() : r.data() + (posted % (kLarge / kEager)) * kEager;
                if (fi_recv(b().ep, at, large ? kLarge : kEager, nullptr, FI_ADDR_UNSPEC, ctx(1)) ==
                    0)
                    ++posted;
            }
            fi_cq_tagged_entry e{};
            if (fi_cq_read(b().cq, &e, 1) == 1) ++received;
        }
    });

    int fd = -1;
    ASSERT_FI_OK(fi_control(&sender.cq->fid, FI_GETWAIT, &fd));
    Epoll ep;
    ASSERT_TRUE(ep.add(fd));
    fid_t fids[1] = {&sender.cq->fid};
    size_t posted = 0, sent = 0;
    std::string why;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (sent < burst + 1 && why.empty() && std::chrono::steady_clock::now() < deadline) {
        // The burst goes out first, the large send once the burst is done (its receive is
        // the last one posted).
        while (posted < burst + (sent == burst ? 1 : 0)) {
            const bool large = posted == burst;
            ssize_t ret = fi_send(sender.ep, s.data() + (large ? 0 : (posted % 8) * kEager),
                                  large ? kLarge : kEager, nullptr, to_b, ctx(0));
            if (ret == -FI_EAGAIN) break;
            if (ret) {
                why = "fi_send: " + fi_err_str(int(ret));
                break;
            }
            ++posted;
        }
        fi_cq_tagged_entry e{};
        ssize_t n = fi_cq_read(sender.cq, &e, 1);
        if (n == 1) {
            ++sent;
            continue;
        }
        // Asleep only while a send is outstanding: with none, a send that found no room
        // (-FI_EAGAIN, a full node-local ring) has no completion to wait for, and is retried.
        if (n != -FI_EAGAIN)
            why = "fi_cq_read: " + fi_err_str(int(n));
        else if (posted > sent && fi_trywait(fabric, fids, 1) == FI_SUCCESS &&
                 (slept = true, ep.wait(5000) == 0))
            why = "asleep for 5 s with " + std::to_string(posted - sent) +
                  " sends on their way: nothing woke the sender";
    }
    // A send may complete before its receiver has taken it (node-local: once in the ring).
    const auto drained = std::chrono::steady_clock::now() + 20s;
    while (received.load() < burst + 1 && std::chrono::steady_clock::now() < drained)
        std::this_thread::sleep_for(1ms);
    stop = true;
    receiver.join();
    EXPECT_TRUE(why.empty()) << why;
    EXPECT_EQ(sent, burst + 1) << "of " << burst << " eager sends and a large one";
    EXPECT_EQ(received.load(), burst + 1);
    EXPECT_EQ(check_pattern(r.data(), kLarge, 611), -1);
    sender.ep.reset();
}

// A receiver that took what it waited for and then sleeps on its CQ's descriptor: the sends it
// took must still complete at the sender. Sent with FI_TRANSMIT_COMPLETE over the TCP link they
// complete on the receiver's acknowledgement, which rides on its own traffic or goes after a
// few passes without any; a sleeper makes no passes, so it must go before the sleep. The sender
// (another domain, on a thread of its own) sleeps on its own descriptor too while it waits, and
// answers its five send completions with a sixth message; only that can wake the receiver (a
// raw epoll_wait has no periodic wake-up). fabtests' fi_rdm_tagged_peek has this shape.
TEST_F(FdWaitTest, AReceiverAsleepOnItsDescriptorLetsTheSendsItTookComplete) {
    Fid<fid_domain> other_domain;
    Endpoint sender;
    fi_addr_t to_b = FI_ADDR_NOTAVAIL;
    ASSERT_NO_FATAL_FAILURE(open_sender(other_domain, sender, FI_WAIT_FD, to_b));

    constexpr int kSends = 5;
    constexpr size_t kSize = 1024;
    AlignedBuf s(kSize * (kSends + 1)), r(kSize * (kSends + 1));
    for (int i = 0; i <= kSends; ++i) fill_pattern(s.data() + kSize * i, kSize, 620 + i);
    for (int i = 0; i <= kSends; ++i)
        ASSERT_FI_OK(fi_recv(b().ep, r.data() + kSize * i, kSize, nullptr, FI_ADDR_UNSPEC, ctx(1)));
    std::atomic<int> completed{0};
    std::atomic<bool> stop{false};
    std::string sender_error;
    std::thread sending([&] {
        const auto give_up = std::chrono::steady_clock::now() + 20s;
        int fd = -1;
        if (fi_control(&sender.cq->fid, FI_GETWAIT, &fd) != 0) {
            sender_error = "FI_GETWAIT on the sender's CQ";
            return;
        }
        Epoll sleeper;
        sleeper.add(fd);
        fid_t own[1] = {&sender.cq->fid};
        auto post_one = [&](int i) {
            iovec iov{s.data() + kSize * i, kSize};
            fi_msg msg{};
            msg.msg_iov = &iov;
            msg.iov_count = 1;
            msg.addr = to_b;
            msg.context = ctx(0);
            ssize_t ret;
            while ((ret = fi_sendmsg(sender.ep, &msg, FI_COMPLETION | FI_TRANSMIT_COMPLETE)) ==
                       -FI_EAGAIN &&
                   !stop.load() && std::chrono::steady_clock::now() < give_up) {
                fi_cq_tagged_entry e{};
                if (fi_cq_read(sender.cq, &e, 1) == 1) ++completed;
            }
            if (ret) sender_error = "fi_sendmsg: " + fi_err_str(int(ret));
            return ret == 0;
        };
        auto wait_for = [&](int count) {
            while (completed.load() < count && !stop.load() &&
                   std::chrono::steady_clock::now() < give_up) {
                fi_cq_tagged_entry e{};
                if (fi_cq_read(sender.cq, &e, 1) == 1)
                    ++completed;
                else if (fi_trywait(fabric, own, 1) == FI_SUCCESS && sleeper.wait(10000) == 0)
                    sender_error = "asleep for 10 s with " + std::to_string(count - completed) +
                                   " sends to complete";
            }
        };
        for (int i = 0; i < kSends; ++i)
            if (!post_one(i)) return;
        wait_for(kSends);
        // The sixth, once the five completed; the sender goes on driving it to its end.
        if (completed.load() == kSends && post_one(kSends)) wait_for(kSends + 1);
    });

    const int fd = cq_fd(b());
    ASSERT_GE(fd, 0);
    Epoll ep;
    ASSERT_TRUE(ep.add(fd));
    fid_t fids[1] = {&b().cq->fid};
    int received = 0;
    std::string why;
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    // The first five busy-polled, as a client that then has nothing left to wait for but the
    // sender's next message; then asleep, each sleep bounded at 10 s.
    while (received <= kSends && why.empty() && std::chrono::steady_clock::now() < deadline) {
        fi_cq_tagged_entry e{};
        ssize_t n = fi_cq_read(b().cq, &e, 1);
        if (n == 1) {
            ++received;
            continue;
        }
        if (n != -FI_EAGAIN)
            why = "fi_cq_read: " + fi_err_str(int(n));
        else if (received == kSends && fi_trywait(fabric, fids, 1) == FI_SUCCESS &&
                 ep.wait(10000) == 0)
            why = "asleep for 10 s after " + std::to_string(received) +
                  " messages; the sender saw " + std::to_string(completed.load()) +
                  " of its sends complete";
    }
    // b goes on driving what the sixth still needs, until the sender has its completion.
    while (why.empty() && completed.load() < kSends + 1 &&
           std::chrono::steady_clock::now() < deadline) {
        fi_cq_tagged_entry e{};
        fi_cq_read(b().cq, &e, 1);
    }
    stop = true;
    sending.join();
    EXPECT_TRUE(why.empty()) << why;
    EXPECT_TRUE(sender_error.empty()) << sender_error;
    EXPECT_EQ(completed.load(), kSends + 1);
    EXPECT_EQ(received, kSends + 1);
    for (int i = 0; i <= kSends; ++i)
        EXPECT_EQ(check_pattern(r.data() + kSize * i, kSize, 620 + i), -1) << "message " << i;
    sender.ep.reset();
}

// fi_cq_sread with nothing to come sleeps until its deadline in one sleep: no periodic
// wake-up (it woke every 100 ms before 2026-12-05).
TEST_F(FdWaitTest, AnIdleCqSreadSleepsWithoutWakingUp) {
    fi_cq_tagged_entry e{};
    ASSERT_EQ(fi_cq_read(b().cq, &e, 1), -FI_EAGAIN);
    const long before = voluntary_switches();
    EXPECT_EQ(fi_cq_sread(b().cq, &e, 1, nullptr, 1000), -FI_EAGAIN);
    EXPECT_LE(voluntary_switches() - before, kIdleSleepSwitches)
        << "fi_cq_sread woke up during an idle second";
}

TEST_F(FdWaitTest, WaitNoneCqHasNoFd) {
    // A CQ opened without a wait object has nothing to hand out.
    Fid<fid_cq> cq;
    ASSERT_NO_FATAL_FAILURE(open_cq(cq, FI_CQ_FORMAT_CONTEXT, FI_WAIT_NONE));
    int fd = -1;
    EXPECT_LT(fi_control(&cq->fid, FI_GETWAIT, &fd), 0);
}

// ---- EQ and counter fds ----------------------------------------------------------------------

using EqCntrFdTest = FabricTest;

TEST_F(EqCntrFdTest, EpollOnEqFdWakesOnWrite) {
    fi_eq_attr attr{};
    attr.wait_obj = FI_WAIT_FD;
    attr.flags = FI_WRITE;
    Fid<fid_eq> eq;
    ASSERT_FI_OK(fi_eq_open(fabric, &attr, eq.out(), nullptr));
    int fd = -1;
    ASSERT_FI_OK(fi_control(&eq->fid, FI_GETWAIT, &fd));
    ASSERT_GE(fd, 0);
    fid_t fids[1] = {&eq->fid};
    ASSERT_EQ(fi_trywait(fabric, fids, 1), FI_SUCCESS);
    Epoll ep;
    ASSERT_TRUE(ep.add(fd));
    fid_eq *raw = eq;
    std::thread writer([raw] {
        std::this_thread::sleep_for(150ms);
        fi_eq_entry e{};
        e.data = 31;
        fi_eq_write(raw, FI_NOTIFY, &e, sizeof(e), 0);
    });
    auto t0 = Clock::now();
    int n = ep.wait(5000);
    auto elapsed = Clock::now() - t0;
    writer.join();
    EXPECT_EQ(n, 1) << "epoll on the EQ fd did not wake";
    EXPECT_LT(elapsed, 4s);
    EXPECT_EQ(fi_trywait(fabric, fids, 1), -FI_EAGAIN) << "event queued but trywait says block";
    uint32_t event = 0;
    fi_eq_entry e{};
    ASSERT_FI_RET(fi_eq_read(eq, &event, &e, sizeof(e), 0), sizeof(e));
    EXPECT_EQ(e.data, 31u);
    EXPECT_EQ(fi_trywait(fabric, fids, 1), FI_SUCCESS);
}

TEST_F(EqCntrFdTest, CounterFdWaitObject) {
    Fid<fid_cntr> c;
    ASSERT_NO_FATAL_FAILURE(open_cntr(c, FI_WAIT_FD));
    int fd = -1;
    ASSERT_FI_OK(fi_control(&c->fid, FI_GETWAIT, &fd));
    EXPECT_GE(fd, 0);
    fid_t fids[1] = {&c->fid};
    EXPECT_EQ(fi_trywait(fabric, fids, 1), FI_SUCCESS);
}

// fi_cntr_wait with nothing to come sleeps until its deadline in one sleep (it woke every 50 ms
// before 2026-12-05).
TEST_F(EqCntrFdTest, AnIdleCntrWaitSleepsWithoutWakingUp) {
    Fid<fid_cntr> c;
    ASSERT_NO_FATAL_FAILURE(open_cntr(c, FI_WAIT_FD));
    ASSERT_EQ(fi_cntr_read(c), 0u);
    const long before = voluntary_switches();
    EXPECT_EQ(fi_cntr_wait(c, 1, 1000), -FI_ETIMEDOUT);
    EXPECT_LE(voluntary_switches() - before, kIdleSleepSwitches)
        << "fi_cntr_wait woke up during an idle second";
}

// fi_eq_sread with nothing to come sleeps until its deadline in one sleep (it woke every 50 ms
// before 2026-12-05).
TEST_F(EqCntrFdTest, AnIdleEqSreadSleepsWithoutWakingUp) {
    fi_eq_attr attr{};
    attr.wait_obj = FI_WAIT_FD;
    Fid<fid_eq> eq;
    ASSERT_FI_OK(fi_eq_open(fabric, &attr, eq.out(), nullptr));
    uint32_t event = 0;
    fi_eq_entry entry{};
    const long before = voluntary_switches();
    EXPECT_EQ(fi_eq_sread(eq, &event, &entry, sizeof entry, 1000, 0), -FI_EAGAIN);
    EXPECT_LE(voluntary_switches() - before, kIdleSleepSwitches)
        << "fi_eq_sread woke up during an idle second";
}

// fi_trywait on a counter refuses the sleep while the counter holds what the application has not
// read: an fi_cntr_add (here on this thread, as from another one) between the application's
// fi_cntr_read and its fi_trywait signals no descriptor, since nothing was armed yet, and a
// sleep then would last until the next increment.
TEST_F(EqCntrFdTest, CounterTrywaitRefusesWhileAnIncrementIsUnread) {
    Fid<fid_cntr> c;
    ASSERT_NO_FATAL_FAILURE(open_cntr(c, FI_WAIT_FD));
    int fd = -1;
    ASSERT_FI_OK(fi_control(&c->fid, FI_GETWAIT, &fd));
    fid_t fids[1] = {&c->fid};
    ASSERT_EQ(fi_cntr_read(c), 0u);
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    EXPECT_EQ(fi_trywait(fabric, fids, 1), -FI_EAGAIN) << "an unread increment";
    EXPECT_EQ(fi_cntr_read(c), 1u);
    EXPECT_EQ(fi_trywait(fabric, fids, 1), FI_SUCCESS) << "everything read";
    ASSERT_FI_OK(fi_cntr_adderr(c, 1));
    EXPECT_EQ(fi_trywait(fabric, fids, 1), -FI_EAGAIN) << "an unread error";
    EXPECT_EQ(fi_cntr_readerr(c), 1u);
    EXPECT_EQ(fi_trywait(fabric, fids, 1), FI_SUCCESS) << "the error read";
    // Armed by that fi_trywait: an increment now wakes the descriptor.
    ASSERT_FI_OK(fi_cntr_add(c, 1));
    Epoll ep;
    ASSERT_TRUE(ep.add(fd));
    EXPECT_EQ(ep.wait(0), 1) << "an increment after fi_trywait left the descriptor asleep";
}

// ---- wait sets -------------------------------------------------------------------------------

class WaitSetTest : public FabricTest {
  protected:
    Fid<fid_wait> ws;
    void configure(FabricOptions &o) override {
        o.cq_wait = FI_WAIT_SET;
        o.mr_mode &= ~FI_MR_LOCAL;
    }
    void after_fabric() override {
        fi_wait_attr attr{};
        attr.wait_obj = FI_WAIT_UNSPEC;
        ASSERT_FI_OK(fi_wait_open(fabric, &attr, ws.out()));
        opts.cq_wait_set = ws;
    }
    void TearDown() override {
        eps.clear();  // CQs go before the wait set
        ws.reset();
        FabricTest::TearDown();
    }
};

TEST_F(WaitSetTest, WaitTimesOutWhenNothingHappens) {
    auto t0 = Clock::now();
    int ret = fi_wait(ws, 100);
    auto elapsed = std::chrono::duration_cast<Ms>(Clock::now() - t0);
    EXPECT_LT(ret, 0) << "fi_wait on an idle wait set returned " << ret;
    EXPECT_GE(elapsed.count(), 80);
    EXPECT_LT(elapsed.count(), 5000);
}

// fi_wait sleeps until a member's descriptor wakes the set: with the sender in another domain
// (driven by a thread of its own) nothing of b's domain runs while b sleeps, and fi_wait has no
// periodic pass that would find the message by itself, so the message's own wake-up (the
// peer's FIFO node-local, the socket over the link) is what ends the sleep. One fi_wait of
// 20 s: it returns 0 once, and the receive is then complete.
TEST_F(WaitSetTest, FiWaitWakesForASenderInAnotherDomain) {
    Fid<fid_domain> other_domain;
    Endpoint sender;
    fi_addr_t to_b = FI_ADDR_NOTAVAIL;
    ASSERT_NO_FATAL_FAILURE(
        open_sender_domain(fabric, info.get(), b().name, other_domain, sender, FI_WAIT_NONE, to_b));
    AlignedBuf s(256), r(256);
    fill_pattern(s.data(), 256, 631);
    ASSERT_FI_OK(fi_recv(b().ep, r.data(), 256, nullptr, FI_ADDR_UNSPEC, ctx(1)));
    std::atomic<bool> asleep{false}, stop{false}, sent{false};
    std::thread sending([&] {
        while (!asleep.load() && !stop.load()) std::this_thread::sleep_for(1ms);
        // (Past fi_wait's first look: b is asleep, or about to be, when the message leaves.)
        std::this_thread::sleep_for(50ms);
        while (!stop.load() &&
               fi_send(sender.ep, s.data(), 256, nullptr, to_b, ctx(0)) == -FI_EAGAIN) {
            fi_cq_tagged_entry e{};
            fi_cq_read(sender.cq, &e, 1);
        }
        while (!stop.load() && !sent.load()) {
            fi_cq_tagged_entry e{};
            if (fi_cq_read(sender.cq, &e, 1) == 1) sent = true;
        }
    });
    int ret = -FI_EAGAIN;
    bool got = false;
    const auto deadline = Clock::now() + 20s;
    // A pass first (b's listener takes the sender's connection over the link, and every wake
    // may be for a step of it): then each fi_wait until the receive is in.
    while (!got && Clock::now() < deadline) {
        asleep = true;
        ret = fi_wait(ws, 20000);
        if (ret != 0) break;
        b().log.drain();
        got = b().log.has(ctx(1));
    }
    stop = !got;
    while (got && !sent.load() && Clock::now() < deadline) b().log.drain();
    stop = true;
    sending.join();
    EXPECT_EQ(ret, 0) << "fi_wait: " << fi_err_str(ret);
    ASSERT_TRUE(got) << "receive never completed; " << b().log.summary();
    EXPECT_EQ(check_pattern(r.data(), 256, 631), -1);
    sender.ep.reset();
}

// fi_wait on a set of CQs with nothing to come sleeps until its deadline in one sleep (it woke
// every 50 ms before 2026-12-05).
TEST_F(WaitSetTest, AnIdleFiWaitSleepsWithoutWakingUp) {
    fi_cq_tagged_entry e{};
    ASSERT_EQ(fi_cq_read(b().cq, &e, 1), -FI_EAGAIN);
    const long before = voluntary_switches();
    EXPECT_EQ(fi_wait(ws, 1000), -FI_ETIMEDOUT);
    EXPECT_LE(voluntary_switches() - before, kIdleSleepSwitches)
        << "fi_wait woke up during an idle second";
}

TEST_F(WaitSetTest, WaitReturnsWhenCompletionArrives) {
    AlignedBuf s(256), r(256);
    fill_pattern(s.data(), 256, 601);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r.data(), 256, nullptr, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(
        post([&] { return fi_send(a().ep, s.data(), 256, nullptr, a().peer[1], ctx(0)); }));
    int signalled = 0;
    bool got = false;
    const auto deadline = Clock::now() + kTimeout;
    // a's CQ is on the same wait set; both sides progress through fi_wait and reads.
    while (!got && Clock::now() < deadline) {
        if (fi_wait(ws, 200) == 0) ++signalled;
        a().log.drain();
        b().log.drain();
        got = b().log.has(ctx(1));
    }
    ASSERT_TRUE(got) << "receive never completed; " << b().log.summary();
    EXPECT_GE(signalled, 1) << "fi_wait never reported the wait set as signalled";
    EXPECT_EQ(check_pattern(r.data(), 256, 601), -1);
    ASSERT_TRUE(poll_until([&] { return a().log.has(ctx(0)); })) << a().log.summary();
}

TEST_F(WaitSetTest, CloseWhileCqAttachedIsBusy) {
    int ret = fi_close(&ws->fid);
    EXPECT_EQ(ret, -FI_EBUSY) << fi_err_str(ret);
    if (ret == 0) ws.release();
}

// ---- poll sets -------------------------------------------------------------------------------

class PollSetTest : public FabricTest {
  protected:
    void configure(FabricOptions &o) override { o.mr_mode &= ~FI_MR_LOCAL; }
};

TEST_F(PollSetTest, PollReportsCqWithCompletions) {
    fi_poll_attr attr{};
    Fid<fid_poll> ps;
    ASSERT_FI_OK(fi_poll_open(domain, &attr, ps.out()));
    ASSERT_FI_OK(fi_poll_add(ps, &b().cq->fid, 0));
    AlignedBuf s(64), r(64);
    ASSERT_FI_OK(
        post([&] { return fi_recv(b().ep, r.data(), 64, nullptr, FI_ADDR_UNSPEC, ctx(1)); }));
    ASSERT_FI_OK(post([&] { return fi_send(a().ep, s.data(), 64, nullptr, a().peer[1], ctx(0)); }));
    void *contexts[4] = {};
    int n = 0;
    // fi_poll progresses the CQs in the set; a is progressed by hand.
    ASSERT_TRUE(::tandem_test::poll_until([&] {
        a().log.drain();
        n = fi_poll(ps, contexts, 4);
        return n != 0;
    })) << "fi_poll never reported b's CQ";
    ASSERT_EQ(n, 1) << fi_err_str(n);
    EXPECT_EQ(contexts[0], &b()) << "fi_poll must return the CQ's context";
    ASSERT_TRUE(poll_until([&] { return b().log.has(ctx(1)) && a().log.has(ctx(0)); }))
        << b().log.summary();
    // Drained: no more reports.
    poll_for(50ms);
    EXPECT_EQ(fi_poll(ps, contexts, 4), 0);
    EXPECT_FI_OK(fi_poll_del(ps, &b().cq->fid, 0));
}

TEST_F(PollSetTest, PollOfEmptySetReturnsZero) {
    fi_poll_attr attr{};
    Fid<fid_poll> ps;
    ASSERT_FI_OK(fi_poll_open(domain, &attr, ps.out()));
    ASSERT_FI_OK(fi_poll_add(ps, &a().cq->fid, 0));
    void *contexts[2] = {};
    EXPECT_EQ(fi_poll(ps, contexts, 2), 0);
    ASSERT_FI_OK(fi_poll_del(ps, &a().cq->fid, 0));
}

}  // namespace
}  // namespace tandem_test
