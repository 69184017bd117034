// Handles NCCL holds for the plugin's objects (comms, requests, memory handles): never
// pointers, but a kind, the device, a generation and a slot, so that a stale, foreign or corrupt
// handle is recognised and refused (NCCL tests a request after closing its comm, a job passes a
// freed handle) instead of being dereferenced. None is 0, which NCCL reads as "not ready".
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace tandem::nccl {

enum class HandleKind : uint8_t { Listen = 1, Send = 2, Recv = 3, Request = 4, Memory = 5 };

struct HandleBits {
    HandleKind kind;
    uint8_t device;
    uint32_t generation;  // 20 bits
    uint32_t slot;

    static constexpr uint32_t kGenerationMask = (1u << 20) - 1;
    uint64_t encode() const {
        return uint64_t(kind) << 60 | uint64_t(device) << 52 |
               uint64_t(generation & kGenerationMask) << 32 | slot;
    }
    static HandleBits decode(uint64_t h) {
        return {HandleKind(h >> 60), uint8_t(h >> 52), uint32_t(h >> 32) & kGenerationMask,
                uint32_t(h)};
    }
    static HandleBits decode(const void *h) { return decode(reinterpret_cast<uintptr_t>(h)); }
};

// Objects of one kind on one device. Not thread-safe: the device's lock guards it.
template <typename T>
class HandleTable {
  public:
    HandleTable(HandleKind kind, uint8_t device) : kind_(kind), device_(device) {}

    uint64_t add(std::unique_ptr<T> obj) {
        uint32_t slot = take_slot();
        Slot &s = slots_[slot];
        s.obj = std::move(obj);
        s.live = true;
        return HandleBits{kind_, device_, s.generation, slot}.encode();
    }
    // A fresh object in a slot whose object is reused (see remove(keep)), or a new one: the
    // objects of every message (requests) then cost no allocation.
    T *emplace(uint64_t *handle) {
        uint32_t slot = take_slot();
        Slot &s = slots_[slot];
        if (s.obj)
            *s.obj = T{};
        else
            s.obj = std::make_unique<T>();
        s.live = true;
        *handle = HandleBits{kind_, device_, s.generation, slot}.encode();
        return s.obj.get();
    }
    // The object, or nullptr when the handle is not a live one of this table.
    T *find(uint64_t handle) const {
        HandleBits b = HandleBits::decode(handle);
        if (b.kind != kind_ || b.device != device_ || b.slot >= slots_.size()) return nullptr;
        const Slot &s = slots_[b.slot];
        return s.live && s.generation == b.generation ? s.obj.get() : nullptr;
    }
    T *find(const void *handle) const { return find(reinterpret_cast<uintptr_t>(handle)); }
    // Frees the object (keep: leaves it allocated for emplace); the handle is stale from then on.
    void remove(uint64_t handle, bool keep = false) {
        if (!find(handle)) return;
        uint32_t slot = HandleBits::decode(handle).slot;
        Slot &s = slots_[slot];
        s.live = false;
        if (!keep) s.obj.reset();
        s.generation = (s.generation + 1) & HandleBits::kGenerationMask;
        free_.push_back(slot);
    }
    size_t live() const { return slots_.size() - free_.size(); }
    // Frees every object; generations go on, so that no handle of before names one of after.
    void clear() {
        for (uint32_t i = 0; i < slots_.size(); ++i)
            if (slots_[i].live)
                remove(HandleBits{kind_, device_, slots_[i].generation, i}.encode());
    }
    template <typename F>
    void for_each(F &&f) {
        for (Slot &s : slots_)
            if (s.live) f(*s.obj);
    }
    // f(handle, object) for every live object.
    template <typename F>
    void for_each_handle(F &&f) {
        for (uint32_t i = 0; i < slots_.size(); ++i)
            if (slots_[i].live)
                f(HandleBits{kind_, device_, slots_[i].generation, i}.encode(), *slots_[i].obj);
    }

  private:
    uint32_t take_slot() {
        if (!free_.empty()) {
            uint32_t slot = free_.back();
            free_.pop_back();
            return slot;
        }
        slots_.emplace_back();
        return uint32_t(slots_.size() - 1);
    }
    struct Slot {
        std::unique_ptr<T> obj;
        uint32_t generation = 1;  // never 0 with kind != 0: no handle is 0 anyway
        bool live = false;
    };
    HandleKind kind_;
    uint8_t device_;
    std::vector<Slot> slots_;
    std::vector<uint32_t> free_;
};

}  // namespace tandem::nccl
