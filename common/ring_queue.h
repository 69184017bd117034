// RingQueue: a FIFO of trivially copyable values in one power-of-two array that doubles when
// full and never shrinks. For the completion queues a busy-polled endpoint pushes to and pops
// from on every message: std::deque allocates and frees a block every few entries and
// spends several times the instructions on each push and pop.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <type_traits>

namespace tandem {

template <class T>
class RingQueue {
    static_assert(std::is_trivially_copyable_v<T>);

  public:
    bool empty() const { return head_ == tail_; }
    size_t size() const { return tail_ - head_; }
    T &front() { return slots_[head_ & mask_]; }
    const T &front() const { return slots_[head_ & mask_]; }
    void pop_front() { ++head_; }
    void push_back(const T &value) {
        if (tail_ - head_ == capacity_) grow();
        slots_[tail_++ & mask_] = value;
    }
    // The slot of a new last value, for the caller to fill in place (no copy of a built one).
    // (Always inline: gcc left it out of line in the CQ push of every small message.)
    [[gnu::always_inline]] T &push_slot() {
        if (tail_ - head_ == capacity_) grow();
        return slots_[tail_++ & mask_];
    }
    void clear() { head_ = tail_ = 0; }
    // Removes the values pred accepts, keeping the others in order; returns how many went.
    template <class Pred>
    size_t remove_if(Pred pred) {
        size_t kept = head_;
        for (size_t i = head_; i != tail_; ++i)
            if (!pred(slots_[i & mask_])) slots_[kept++ & mask_] = slots_[i & mask_];
        size_t removed = tail_ - kept;
        tail_ = kept;
        return removed;
    }

  private:
    void grow() {
        size_t capacity = std::max<size_t>(16, capacity_ * 2);
        auto slots = std::make_unique<T[]>(capacity);
        for (size_t i = 0; i < capacity_; ++i) slots[i] = slots_[(head_ + i) & mask_];
        slots_ = std::move(slots);
        tail_ -= head_;
        head_ = 0;
        capacity_ = capacity;
        mask_ = capacity - 1;
    }

    std::unique_ptr<T[]> slots_;
    size_t capacity_ = 0, mask_ = 0;
    size_t head_ = 0, tail_ = 0;  // positions; head_ <= tail_, tail_ - head_ <= capacity_
};

}  // namespace tandem
