#include "main_prov/shm/sender_hold.h"

#include "common/wire.h"

#include <cstring>

namespace tandem::shm {

using wire::LocalOp;

std::optional<std::string_view> SenderHold::sender_of(const uint8_t *cell) {
    const auto op = static_cast<LocalOp>(cell[0]);
    size_t header = 0, name_len = 0;
    switch (op) {
        case LocalOp::AtomicResp:
        case LocalOp::Fin:
        case LocalOp::Cts:
        case LocalOp::WriteDone:
        case LocalOp::ReadData:
            return std::nullopt;  // an answer to an operation of ours
        case LocalOp::Short:
        case LocalOp::Atomic: {
            wire::LocalShortHeader s;
            memcpy(&s, cell, sizeof s);
            header = sizeof s;
            name_len = s.name_len;
            break;
        }
        default: {
            wire::LocalHeader h;
            memcpy(&h, cell, sizeof h);
            header = sizeof h;
            name_len = h.name_len;
            break;
        }
    }
    if (name_len > wire::kLocalNameRoom) return std::nullopt;
    return std::string_view(reinterpret_cast<const char *>(cell + header), name_len);
}

void SenderHold::hold(std::string_view sender) {
    held_.try_emplace(std::string(sender));
    update();
}

void SenderHold::lift(std::string_view sender) {
    auto it = held_.find(sender);
    if (it == held_.end()) return;
    for (auto &cell : it->second) released_.push_back(std::move(cell));
    held_.erase(it);
    update();
}

bool SenderHold::keep_if_held(const uint8_t *cell) {
    std::deque<CellCopy> *kept = queue_of(cell);
    if (kept) kept->push_back(copy_of(cell));
    return kept;
}

bool SenderHold::keep_copy(CellCopy &cell) {
    std::deque<CellCopy> *kept = queue_of(cell.get());
    if (kept) kept->push_back(std::move(cell));
    return kept;
}

// The kept cells of the cell's sender while it is held; nullptr otherwise.
std::deque<SenderHold::CellCopy> *SenderHold::queue_of(const uint8_t *cell) {
    auto sender = sender_of(cell);
    if (!sender) return nullptr;
    auto it = held_.find(*sender);
    return it == held_.end() ? nullptr : &it->second;
}

SenderHold::CellCopy SenderHold::copy_of(const uint8_t *cell) {
    CellCopy copy;
    if (spare_.empty()) {
        copy = std::make_unique_for_overwrite<uint8_t[]>(wire::kLocalCellSize);
    } else {
        copy = std::move(spare_.back());
        spare_.pop_back();
    }
    memcpy(copy.get(), cell, wire::kLocalCellSize);
    return copy;
}

void SenderHold::recycle(CellCopy cell) {
    if (cell && spare_.size() < kSpareCells) spare_.push_back(std::move(cell));
}

}  // namespace tandem::shm
