// FI_PROGRESS_AUTO: what the domain's progress thread moves while the application makes no
// libfabric call at all, that the thread sleeps when nothing moves (no periodic wake-up), and
// that it survives what applications do around it: FI_THREAD_DOMAIN, closing objects under it,
// fork(), signals.
//
// "No call" is checked on memory the provider writes (a receive buffer, an RMA target): the
// test thread only looks at it (sleeping between looks), so whatever lands there was moved by
// tandem's own thread.
#include "fabric_fixture.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

// A child of fork() that exits through exit(): the objects the parent's other threads held
// (tandem's thread, an emulated NIC's) are reachable from no thread of the child, so
// LeakSanitizer, whose check runs at exit, would report them (sanitizer builds; outside the
// unnamed namespace, and the program exports it, so that the sanitizer's runtime finds it).
static bool g_exiting_fork_child = false;
extern "C" [[gnu::visibility("default")]] int __lsan_is_turned_off() {
    return g_exiting_fork_child;
}

namespace {

using namespace tandem_test;

// The progress threads of this process (named by tandem with pthread_setname_np).
std::vector<pid_t> progress_threads() {
    std::vector<pid_t> out;
    DIR *dir = opendir("/proc/self/task");
    if (!dir) return out;
    while (dirent *e = readdir(dir)) {
        if (e->d_name[0] == '.') continue;
        std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
        std::string name;
        std::getline(comm, name);
        if (name == "tandem-progress") out.push_back(static_cast<pid_t>(atoi(e->d_name)));
    }
    closedir(dir);
    return out;
}

struct ThreadSample {
    char state = '?';        // R running, S sleeping, ...
    uint64_t wakeups = 0;    // voluntary context switches: each sleep the thread began
    uint64_t cpu_ticks = 0;  // utime + stime, in clock ticks
};

ThreadSample sample(pid_t tid) {
    ThreadSample s;
    const std::string dir = "/proc/self/task/" + std::to_string(tid);
    std::ifstream status(dir + "/status");
    for (std::string line; std::getline(status, line);) {
        if (line.rfind("State:", 0) == 0) s.state = line[line.find_first_not_of(" \t", 6)];
        if (line.rfind("voluntary_ctxt_switches:", 0) == 0)
            s.wakeups = std::stoull(line.substr(line.find(':') + 1));
    }
    std::ifstream stat(dir + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    // Fields after the command (which may hold spaces) and its closing parenthesis: state is
    // field 3, utime 14, stime 15.
    std::istringstream rest(text.substr(text.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 15 && rest >> field; ++i)
        if (i == 14 || i == 15) s.cpu_ticks += std::stoull(field);
    return s;
}

// Whether the bytes hold the pattern, read without synchronisation: the provider's thread (or
// the kernel, for a cross-memory copy) writes them meanwhile. Every test confirms through the
// CQ afterwards, synchronised.
[[gnu::no_sanitize_thread, gnu::noinline]] bool landed(const uint8_t *p, size_t len,
                                                       uint32_t seed) {
    const volatile uint8_t *v = p;
    for (size_t i = len; i-- > 0;)  // the end first: it usually lands last
        if (v[i] != pattern_byte(i, seed)) return false;
    return true;
}

class AutoProgress : public FabricTest {
  protected:
    void configure(FabricOptions &o) override {
        o.progress = FI_PROGRESS_AUTO;
        o.caps |= FI_RMA;
    }

    // The domain's one progress thread.
    pid_t progress_thread() {
        auto threads = progress_threads();
        EXPECT_EQ(threads.size(), 1u) << "one domain open, one progress thread";
        return threads.empty() ? 0 : threads[0];
    }

    // Waits, asleep, making no libfabric call, until pred holds or kTimeout passes.
    static bool compute_until(const std::function<bool()> &pred) {
        const auto end = Clock::now() + kTimeout;
        while (!pred()) {
            if (Clock::now() > end) return false;
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        return true;
    }

    // Until the progress thread sleeps (it may still finish what the set-up started).
    bool thread_asleep(pid_t tid) {
        return compute_until([&] {
            ThreadSample a = sample(tid);
            std::this_thread::sleep_for(20ms);
            ThreadSample b = sample(tid);
            return a.state == 'S' && b.state == 'S' && a.wakeups == b.wakeups;
        });
    }

    // One message of len bytes a -> b, both posted, then no call until it is in b's buffer.
    void message_while_computing(size_t len, uint32_t seed) {
        auto s = buf(len), r = buf(len);
        fill_pattern(s->data(), len, seed);
        pid_t tid = progress_thread();
        ASSERT_NE(tid, 0);
        ASSERT_TRUE(thread_asleep(tid));
        const uint64_t wakeups = sample(tid).wakeups;
        ASSERT_FI_OK(fi_recv(b().ep, r->data(), len, r->desc, FI_ADDR_UNSPEC, ctx(1)));
        ASSERT_FI_OK(fi_send(a().ep, s->data(), len, s->desc, a().peer[1], ctx(2)));
        EXPECT_TRUE(compute_until([&] { return landed(r->data(), len, seed); }))
            << len << " bytes: not delivered while the application made no call";
        // (A sleep is counted when it begins: the one after the thread's work.)
        EXPECT_TRUE(thread_asleep(tid));
        EXPECT_GT(sample(tid).wakeups, wakeups) << "the thread woke for the message";
        ASSERT_TRUE(wait_comp(b(), ctx(1))) << b().log.summary();
        ASSERT_TRUE(wait_comp(a(), ctx(2))) << a().log.summary();
        EXPECT_EQ(check_pattern(r->data(), len, seed), -1);
    }
};

// A short message, one that fills a node-local cell or a link frame, and one large enough for
// the rendezvous (a cross-memory copy node-local, RDMA read or its TCP emulation over a link).
// The first message to a peer also makes the connection (the application's send leaves that
// to the thread); the short one goes where the connection is made already, so only what the
// peer writes wakes the thread.
TEST_F(AutoProgress, ShortMessageArrivesWhileTheApplicationComputes) {
    ASSERT_NO_FATAL_FAILURE(exchange_checked(9));
    ASSERT_NO_FATAL_FAILURE(message_while_computing(8, 1));
}
TEST_F(AutoProgress, EagerMessageArrivesWhileTheApplicationComputes) {
    message_while_computing(16 << 10, 2);
}
TEST_F(AutoProgress, RendezvousArrivesWhileTheApplicationComputes) {
    message_while_computing(4 << 20, 3);
}

// RMA: a write lands in the target's region and a read in the initiator's buffer with no call
// after the post.
TEST_F(AutoProgress, RmaCompletesWhileTheApplicationComputes) {
    const size_t len = 1 << 20;
    auto target = buf(len, 0, true), src = buf(len), back = buf(len);
    fill_pattern(src->data(), len, 7);
    ASSERT_FI_OK(fi_write(a().ep, src->data(), len, src->desc, a().peer[1], rma_addr(*target),
                          target->key, ctx(1)));
    EXPECT_TRUE(compute_until([&] { return landed(target->data(), len, 7); }));
    ASSERT_TRUE(wait_comp(a(), ctx(1))) << a().log.summary();
    ASSERT_FI_OK(fi_read(a().ep, back->data(), len, back->desc, a().peer[1], rma_addr(*target),
                         target->key, ctx(2)));
    EXPECT_TRUE(compute_until([&] { return landed(back->data(), len, 7); }));
    ASSERT_TRUE(wait_comp(a(), ctx(2))) << a().log.summary();
}

// An idle domain's thread sleeps until something happens: no wake-up at all in a second with
// connections open (a periodic timer of up to a second would show here), and no CPU time.
TEST_F(AutoProgress, AnIdleDomainsThreadSleeps) {
    ASSERT_NO_FATAL_FAILURE(exchange_checked(11));
    ASSERT_NO_FATAL_FAILURE(exchange_checked(12));
    pid_t tid = progress_thread();
    ASSERT_NE(tid, 0);
    ASSERT_TRUE(thread_asleep(tid));
    ThreadSample before = sample(tid);
    std::this_thread::sleep_for(1s);
    ThreadSample after = sample(tid);
    EXPECT_EQ(after.wakeups, before.wakeups) << "the thread woke with nothing to do";
    EXPECT_EQ(after.cpu_ticks, before.cpu_ticks);
    EXPECT_EQ(after.state, 'S');
}

// Closing the domain's objects while the thread may be inside them: endpoints with messages
// in flight, one after another, and at last the domain (TearDown) with traffic just posted.
TEST_F(AutoProgress, ClosingEndpointsWhileTheThreadRuns) {
    for (int round = 0; round < 20; ++round) {
        ASSERT_NO_FATAL_FAILURE(add_endpoint());
        ASSERT_NO_FATAL_FAILURE(insert_all_names());
        Endpoint &x = *eps.back();
        auto s = buf(64 << 10);
        // Sends the closing endpoint never sees completed, to a peer that never receives them.
        for (int i = 0; i < 4; ++i)
            ASSERT_FI_OK(post([&] {
                return fi_send(x.ep, s->data(), s->size(), s->desc, x.peer[0], ctx(10 + i));
            }));
        std::this_thread::sleep_for(std::chrono::microseconds(100 * round));
        eps.pop_back();  // fi_close(ep), then its CQ and AV
    }
    ASSERT_NO_FATAL_FAILURE(exchange_checked(21));
    auto s = buf(1 << 20), r = buf(1 << 20);
    ASSERT_FI_OK(fi_recv(b().ep, r->data(), r->size(), r->desc, FI_ADDR_UNSPEC, ctx(1)));
    ASSERT_FI_OK(fi_send(a().ep, s->data(), s->size(), s->desc, a().peer[1], ctx(2)));
    // Closed with the transfer under way, while its buffers still exist (an application may
    // free a posted buffer only once the endpoint is closed).
    eps.clear();
    domain.reset();
}

// FI_THREAD_DOMAIN serialises the application's calls, not them with tandem's thread: the
// domain's lock is taken anyway, and messages in both directions arrive intact.
class AutoProgressThreadDomain : public AutoProgress {
    void configure(FabricOptions &o) override {
        AutoProgress::configure(o);
        o.threading = FI_THREAD_DOMAIN;
    }
};
TEST_F(AutoProgressThreadDomain, MessagesArriveIntact) {
    EXPECT_EQ(info->domain_attr->threading, FI_THREAD_DOMAIN);
    for (uint32_t seed = 1; seed <= 200; ++seed) ASSERT_NO_FATAL_FAILURE(exchange_checked(seed));
    ASSERT_NO_FATAL_FAILURE(message_while_computing(1 << 20, 300));
}

// fork() after the thread started: the child can exec (and exits cleanly without it), and the
// parent's domain works on.
TEST_F(AutoProgress, ForkLeavesTheChildUsableAndTheParentWorking) {
    ASSERT_NO_FATAL_FAILURE(exchange_checked(31));
    // Traffic in flight across the fork: the thread is busy when the fork comes.
    auto s = buf(4 << 20), r = buf(4 << 20);
    fill_pattern(s->data(), s->size(), 32);
    ASSERT_FI_OK(fi_recv(b().ep, r->data(), r->size(), r->desc, FI_ADDR_UNSPEC, ctx(1)));
    ASSERT_FI_OK(fi_send(a().ep, s->data(), s->size(), s->desc, a().peer[1], ctx(2)));
    pid_t exec_child = fork();
    ASSERT_GE(exec_child, 0);
    if (exec_child == 0) {
        execl("/bin/true", "true", static_cast<char *>(nullptr));
        _exit(127);
    }
    pid_t exit_child = fork();
    ASSERT_GE(exit_child, 0);
    if (exit_child == 0) {
        // No exec: exit() runs the atexit handlers and libfabric's teardown in the child, which
        // must not wait for a thread that is not there.
        g_exiting_fork_child = true;
        exit(0);
    }
    for (pid_t child : {exec_child, exit_child}) {
        int status = -1;
        ASSERT_EQ(waitpid(child, &status, 0), child);
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
            << "child " << child << " status " << status;
    }
    ASSERT_TRUE(wait_comp(b(), ctx(1))) << b().log.summary();
    ASSERT_TRUE(wait_comp(a(), ctx(2))) << a().log.summary();
    EXPECT_EQ(check_pattern(r->data(), r->size(), 32), -1);
    ASSERT_NO_FATAL_FAILURE(message_while_computing(8, 33));
}

// A signal goes to the application's threads, never to tandem's (which blocks them all): a
// handler installed without SA_RESTART interrupts the application's fi_cq_sread, which
// returns -FI_EINTR, and the thread goes on moving messages.
class AutoProgressWaitFd : public AutoProgress {
    void configure(FabricOptions &o) override {
        AutoProgress::configure(o);
        o.cq_wait = FI_WAIT_FD;
    }
};

std::atomic<int> g_handled{0};
std::atomic<pid_t> g_handled_by{0};
void on_signal(int) {
    g_handled.fetch_add(1);
    g_handled_by.store(static_cast<pid_t>(gettid()));
}

TEST_F(AutoProgressWaitFd, ASignalInterruptsTheApplicationsBlockingRead) {
    struct sigaction sa {
    }, old{};
    sa.sa_handler = &on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART
    ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
    pid_t tid = progress_thread();
    std::atomic<pid_t> reader_tid{0};
    std::atomic<long> ret{1};
    std::thread reader([&] {
        reader_tid = static_cast<pid_t>(gettid());
        fi_cq_tagged_entry entry;
        ret = fi_cq_sread(a().cq, &entry, 1, nullptr, -1);
    });
    // The reader asleep in its read; then the signal, to the process (any thread may take it
    // that does not block it: the reader or this one, never tandem's).
    ASSERT_TRUE(compute_until([&] {
        pid_t t = reader_tid.load();
        return t && sample(t).state == 'S';
    }));
    std::this_thread::sleep_for(50ms);
    ASSERT_EQ(pthread_kill(reader.native_handle(), SIGUSR1), 0);
    reader.join();
    EXPECT_EQ(ret.load(), -FI_EINTR);
    EXPECT_EQ(g_handled.load(), 1);
    EXPECT_NE(g_handled_by.load(), tid);
    // Sent to the process: taken by a thread that does not block it, never tandem's.
    for (int i = 0; i < 20; ++i) kill(getpid(), SIGUSR1);
    EXPECT_TRUE(compute_until([] { return g_handled.load() >= 2; }));
    EXPECT_NE(g_handled_by.load(), tid);
    sigaction(SIGUSR1, &old, nullptr);
    ASSERT_NO_FATAL_FAILURE(message_while_computing(8, 41));
}

}  // namespace
