// off_tandem's trigger queue alone (offload_prov/trigger/trigger_queue.h): counters are plain
// atomics here, and the work's callbacks record what started and what was discarded.
#include "offload_prov/trigger/trigger_queue.h"

#include <rdma/fi_errno.h>

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace {

using tandem::off::TriggerQueue;
using tandem::peer::TriggerWork;

struct Counter {
    std::atomic<uint64_t> success{0}, errors{0};
    fid_cntr *fid() { return reinterpret_cast<fid_cntr *>(this); }
};

// A work's callbacks: its name goes into started or discarded; a start may run an action
// (move a counter, queue more) or refuse (-FI_EAGAIN) while `refuse` says so.
struct Log {
    std::vector<std::string> started, discarded;
};
struct Job {
    Log *log;
    std::string name;
    std::function<void()> action;
    bool refuse = false;
};

int start_job(void *arg) {
    auto *j = static_cast<Job *>(arg);
    if (j->refuse) return -FI_EAGAIN;
    j->log->started.push_back(j->name);
    if (j->action) j->action();
    return 0;
}
void discard_job(void *arg, int err, bool report) {
    auto *j = static_cast<Job *>(arg);
    EXPECT_EQ(err, FI_ECANCELED);
    j->log->discarded.push_back(j->name + (report ? "" : " (silent)"));
}

class TriggerQueueTest : public ::testing::Test {
  protected:
    Log log;
    std::map<std::string, Job> jobs;
    std::map<uint64_t, uint64_t> xpu;
    int group = 0;
    // Last: its destructor discards what is left, calling back into the jobs above.
    TriggerQueue queue{[this](uint64_t var, uint64_t *v) {
        *v = xpu[var];
        return true;
    }};

    Job &job(const std::string &name) {
        Job &j = jobs[name];
        j.log = &log;
        j.name = name;
        return j;
    }
    int add(const std::string &name, Counter &c, uint64_t threshold, bool with_errors = false,
            const void *grp = nullptr) {
        TriggerWork w;
        w.cntr = c.fid();
        w.successes = &c.success;
        w.errors = &c.errors;
        w.threshold = threshold;
        w.with_errors = with_errors;
        w.names[0] = c.fid();
        Job &j = job(name);
        w.arg = &j;
        w.match = &j;
        w.group = grp ? grp : &group;
        w.start = start_job;
        w.discard = discard_job;
        return queue.queue(w);
    }
    int add_xpu(const std::string &name, uint64_t var, uint64_t value) {
        TriggerWork w;
        w.kind = TriggerWork::Kind::Xpu;
        w.xpu_var = var;
        w.xpu_value = value;
        Job &j = job(name);
        w.arg = &j;
        w.match = &j;
        w.group = &group;
        w.start = start_job;
        w.discard = discard_job;
        return queue.queue(w);
    }
    using Names = std::vector<std::string>;
};

TEST_F(TriggerQueueTest, NothingStartsBelowTheThreshold) {
    Counter c;
    ASSERT_EQ(add("a", c, 2), 0);
    c.success = 1;
    EXPECT_EQ(queue.progress(), 0u);
    EXPECT_TRUE(log.started.empty());
    EXPECT_EQ(queue.pending(), 1u);
}

TEST_F(TriggerQueueTest, ThresholdOrderThenQueueOrderWhateverTheJump) {
    Counter c;
    for (auto [name, t] : std::vector<std::pair<std::string, uint64_t>>{
             {"t3", 3}, {"t1", 1}, {"t2a", 2}, {"t2b", 2}, {"t9", 9}})
        ASSERT_EQ(add(name, c, t), 0);
    c.success = 5;
    EXPECT_EQ(queue.progress(), 4u);
    EXPECT_EQ(log.started, (Names{"t1", "t2a", "t2b", "t3"}));
    EXPECT_EQ(queue.pending(), 1u);
}

TEST_F(TriggerQueueTest, DeferredWorkCountsErrorsThresholdWorkDoesNot) {
    Counter c;
    ASSERT_EQ(add("success only", c, 1, false), 0);
    ASSERT_EQ(add("with errors", c, 1, true), 0);
    c.errors = 1;
    queue.progress();
    EXPECT_EQ(log.started, (Names{"with errors"}));
}

TEST_F(TriggerQueueTest, AChainRunsInOnePass) {
    Counter c0, c1, c2;
    ASSERT_EQ(add("third", c2, 1), 0);
    ASSERT_EQ(add("second", c1, 1), 0);
    ASSERT_EQ(add("first", c0, 1), 0);
    job("first").action = [&] { c1.success++; };
    job("second").action = [&] {
        c2.success++;
        queue.progress();  // what a counter moved from inside a start does: a re-entry
    };
    c0.success = 1;
    EXPECT_EQ(queue.progress(), 3u);
    EXPECT_EQ(log.started, (Names{"first", "second", "third"}));
    EXPECT_EQ(queue.pending(), 0u);
}

TEST_F(TriggerQueueTest, NoRoomKeepsTheWorkFirstInLine) {
    Counter c;
    ASSERT_EQ(add("a", c, 1), 0);
    ASSERT_EQ(add("b", c, 1), 0);
    job("a").refuse = true;
    c.success = 1;
    EXPECT_EQ(queue.progress(), 0u);  // b must not overtake a
    EXPECT_TRUE(log.started.empty());
    EXPECT_EQ(queue.pending(), 2u);
    job("a").refuse = false;
    EXPECT_EQ(queue.progress(), 2u);
    EXPECT_EQ(log.started, (Names{"a", "b"}));
}

TEST_F(TriggerQueueTest, CancelFindsOnlyWaitingWork) {
    Counter c;
    ASSERT_EQ(add("a", c, 1), 0);
    EXPECT_EQ(queue.cancel(&group, &jobs["a"]), 0);
    EXPECT_EQ(log.discarded, (Names{"a"}));
    EXPECT_EQ(queue.cancel(&group, &jobs["a"]), -FI_ENOENT);
    c.success = 1;
    EXPECT_EQ(queue.progress(), 0u);
}

TEST_F(TriggerQueueTest, FlushTakesTheGroupsWorkOfOneCounterOrAll) {
    Counter c1, c2;
    int other = 0;
    ASSERT_EQ(add("g-c1", c1, 1), 0);
    ASSERT_EQ(add("g-c2", c2, 1), 0);
    ASSERT_EQ(add("other-c1", c1, 1, false, &other), 0);
    EXPECT_EQ(queue.flush(&group, c1.fid()), 1u);
    EXPECT_EQ(log.discarded, (Names{"g-c1"}));
    EXPECT_EQ(queue.flush(&group, nullptr), 1u);
    EXPECT_EQ(queue.pending(), 1u);
}

TEST_F(TriggerQueueTest, ClosingACounterDiscardsWorkNamingItInAnyRole) {
    Counter trigger, done;
    TriggerWork w;
    w.cntr = trigger.fid();
    w.successes = &trigger.success;
    w.threshold = 1;
    w.names[0] = trigger.fid();
    w.names[1] = done.fid();  // its completion counter
    Job &j = job("completes on done");
    w.arg = &j;
    w.group = &group;
    w.start = start_job;
    w.discard = discard_job;
    ASSERT_EQ(queue.queue(w), 0);
    EXPECT_EQ(queue.flush_counter(done.fid()), 1u);
    EXPECT_EQ(log.discarded, (Names{"completes on done"}));
}

TEST_F(TriggerQueueTest, DiscardingAGroupReportsNothing) {
    Counter c;
    ASSERT_EQ(add("a", c, 1), 0);
    EXPECT_EQ(queue.discard_group(&group), 1u);
    EXPECT_EQ(log.discarded, (Names{"a (silent)"}));
}

TEST_F(TriggerQueueTest, XpuWorkStartsInValueOrderAsTheVariableGrows) {
    ASSERT_EQ(add_xpu("v1", 7, 1), 0);
    ASSERT_EQ(add_xpu("v2", 7, 2), 0);
    xpu[7] = 1;
    queue.progress();
    EXPECT_EQ(log.started, (Names{"v1"}));
    xpu[7] = 2;
    queue.progress();
    EXPECT_EQ(log.started, (Names{"v1", "v2"}));
}

TEST_F(TriggerQueueTest, WorkWithoutACondition) {
    TriggerWork w;  // no counter
    w.arg = &job("accepted once complete");
    w.start = start_job;
    w.discard = discard_job;
    EXPECT_EQ(queue.queue(w), -FI_EINVAL);
    Counter c;
    w.cntr = c.fid();
    EXPECT_EQ(queue.queue(w), -FI_EINVAL);  // a counter without its words
    w.successes = &c.success;
    w.with_errors = true;
    EXPECT_EQ(queue.queue(w), -FI_EINVAL);  // deferred work without the error word
    w.errors = &c.errors;
    EXPECT_EQ(queue.queue(w), 0);
    EXPECT_EQ(queue.pending(), 1u);
    w.kind = TriggerWork::Kind::Xpu;
    TriggerQueue no_xpu;
    EXPECT_EQ(no_xpu.queue(w), -FI_EINVAL);  // XPU work where nothing reads variables
}

}  // namespace
