// The domain lock and the lock order (main_prov/lock_order.h), checked in every build: the
// lock is never taken twice by one thread, the twin's callbacks run under it, and it is never
// taken under an EQ's mutex. Each violation aborts with a message naming it.
#include "main_prov/lock_order.h"

#include <gtest/gtest.h>

#include <thread>

namespace tandem {
namespace {

TEST(DomainLockDeathTest, TakenAgainByItsHolderAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(
        {
            DomainLock lock(true);
            lock.lock();
            lock.lock();
        },
        "the domain lock taken again by the thread that holds it");
}

TEST(DomainLockDeathTest, TakenUnderAnEqMutexAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(
        {
            EqMutex eq;
            DomainLock lock(true);
            eq.lock();
            lock.lock();
        },
        "the domain lock taken under an EQ's mutex");
}

TEST(DomainLockDeathTest, ATwinCallbackOutsideTheLockAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(
        {
            DomainLock lock(true);
            PeerEntryGuard twin_call(lock, true);
        },
        "the twin called back into tandem outside its lock");
}

TEST(DomainLock, HeldByTheThreadThatLockedItOnly) {
    DomainLock lock(true);
    EXPECT_FALSE(lock.held());
    lock.lock();
    EXPECT_TRUE(lock.held());
    bool held_elsewhere = true;
    std::thread([&] { held_elsewhere = lock.held(); }).join();
    EXPECT_FALSE(held_elsewhere);
    lock.unlock();
    EXPECT_FALSE(lock.held());
    // Taken again after its release: no abort.
    lock.lock();
    EXPECT_TRUE(lock.held());
    lock.unlock();
}

// FI_THREAD_DOMAIN: the application serialises its calls, the lock is skipped, and every
// thread counts as holding it (held() guards only the checks).
TEST(DomainLock, SkippedLockCountsAsHeld) {
    DomainLock lock(false);
    EXPECT_TRUE(lock.held());
    lock.lock();
    lock.lock();  // skipped, so no second acquisition
    lock.unlock();
    lock.unlock();
    EXPECT_FALSE(lock.taken());
}

TEST(PeerEntryGuard, AForeignImportersCallTakesTheLockAndTheTwinsDoesNot) {
    DomainLock lock(true);
    {
        PeerEntryGuard foreign_call(lock, false);
        EXPECT_TRUE(lock.held());
    }
    EXPECT_FALSE(lock.held());
    lock.lock();
    {
        PeerEntryGuard twin_call(lock, true);  // would abort if it took the lock again
        EXPECT_TRUE(lock.held());
    }
    EXPECT_TRUE(lock.held());  // the twin's guard left the holder's lock alone
    lock.unlock();
}

}  // namespace
}  // namespace tandem
