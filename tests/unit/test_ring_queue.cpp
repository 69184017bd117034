// RingQueue (common/ring_queue.h): FIFO order across wrap-around and growth.
#include "common/ring_queue.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <vector>

namespace tandem {
namespace {

TEST(RingQueue, StartsEmpty) {
    RingQueue<int> q;
    EXPECT_TRUE(q.empty());
    EXPECT_EQ(q.size(), 0u);
}

// Growth while the live entries wrap past the end of the array must keep their order.
TEST(RingQueue, GrowsWhileWrappedAndKeepsOrder) {
    RingQueue<int> q;
    int next_in = 0, next_out = 0;
    for (int i = 0; i < 12; ++i) q.push_back(next_in++);
    for (int i = 0; i < 10; ++i) {
        ASSERT_EQ(q.front(), next_out++);
        q.pop_front();
    }
    for (int i = 0; i < 40; ++i) q.push_back(next_in++);  // wraps, then grows twice
    EXPECT_EQ(q.size(), size_t(next_in - next_out));
    while (!q.empty()) {
        ASSERT_EQ(q.front(), next_out++);
        q.pop_front();
    }
    EXPECT_EQ(next_out, next_in);
}

// Against std::deque under a random mix of pushes and pops.
TEST(RingQueue, MatchesDequeUnderRandomUse) {
    struct Entry {
        uint64_t a;
        int b;
    };
    RingQueue<Entry> q;
    std::deque<Entry> ref;
    std::mt19937 rng(7);
    uint64_t n = 0;
    for (int step = 0; step < 100000; ++step) {
        if (rng() % 3 != 0 || ref.empty()) {
            Entry e{n, int(n % 1000)};
            ++n;
            q.push_back(e);
            ref.push_back(e);
        } else {
            ASSERT_FALSE(q.empty());
            ASSERT_EQ(q.front().a, ref.front().a);
            ASSERT_EQ(q.front().b, ref.front().b);
            q.pop_front();
            ref.pop_front();
        }
        ASSERT_EQ(q.size(), ref.size());
    }
    q.clear();
    EXPECT_TRUE(q.empty());
    q.push_back({1, 2});
    EXPECT_EQ(q.front().a, 1u);
}

TEST(RingQueue, RemoveIfKeepsTheRestInOrderAcrossTheWrap) {
    RingQueue<int> q;
    // Start the live range near the end of the array so that it wraps.
    for (int i = 0; i < 12; ++i) q.push_back(-1);
    for (int i = 0; i < 12; ++i) q.pop_front();
    for (int i = 0; i < 10; ++i) q.push_back(i);
    EXPECT_EQ(q.remove_if([](int v) { return v % 3 == 0; }), 4u);  // 0, 3, 6, 9
    std::vector<int> left;
    while (!q.empty()) {
        left.push_back(q.front());
        q.pop_front();
    }
    EXPECT_EQ(left, (std::vector<int>{1, 2, 4, 5, 7, 8}));
    EXPECT_EQ(q.remove_if([](int) { return true; }), 0u);
    q.push_back(5);
    EXPECT_EQ(q.remove_if([](int v) { return v == 5; }), 1u);
    EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace tandem
