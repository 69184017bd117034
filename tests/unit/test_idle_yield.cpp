// IdleYield (common/idle_yield.h): when an application's empty polls give the core away.
#include "common/idle_yield.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(IdleYield, YieldsOnceEveryRunOfEmptyPolls) {
    IdleYield idle;
    for (int round = 0; round < 3; ++round) {
        for (unsigned i = 1; i < IdleYield::kEmptyPolls; ++i)
            ASSERT_FALSE(idle.empty_poll()) << "round " << round << ", poll " << i;
        EXPECT_TRUE(idle.empty_poll()) << "round " << round;
    }
}

TEST(IdleYield, APollThatFindsSomethingStartsTheCountAgain) {
    IdleYield idle;
    for (int round = 0; round < 4; ++round) {
        for (unsigned i = 1; i < IdleYield::kEmptyPolls; ++i) ASSERT_FALSE(idle.empty_poll());
        idle.found();  // one short of a yield: found something
    }
    for (unsigned i = 1; i < IdleYield::kEmptyPolls; ++i) ASSERT_FALSE(idle.empty_poll());
    EXPECT_TRUE(idle.empty_poll());
}

}  // namespace
}  // namespace tandem
