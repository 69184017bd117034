// Short cells (common/short_cell.h): what write_short puts in a cell, read_short gives back,
// and LastSender recognises a sender by its name alone (its first word, its second, and the
// words past them), whatever the cell holds after the name.
#include "common/short_cell.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

namespace tandem {
namespace {

// A whole cell's payload, as a ring gives it.
struct CellBuffer {
    std::vector<uint8_t> bytes = std::vector<uint8_t>(wire::kLocalCellSize, 0xEE);
    uint8_t *data() { return bytes.data(); }
};

std::string name_of(size_t len, uint8_t seed) {
    std::string s(len, '\0');
    for (size_t i = 0; i < len; ++i) s[i] = char(seed + i * 7);
    return s;
}

// A cell from this sender with this payload, written the way the send path writes it.
void write_cell(CellBuffer &cell, const std::string &name, const std::vector<uint8_t> &payload,
                uint8_t flags, uint64_t tag, uint64_t data) {
    ShortLine line;
    line.build(reinterpret_cast<const uint8_t *>(name.data()), name.size());
    write_short(cell.data(), line, flags, payload.data(), payload.size(), tag, data);
}

std::vector<uint8_t> payload_of(size_t len) {
    std::vector<uint8_t> p(len);
    for (size_t i = 0; i < len; ++i) p[i] = uint8_t(3 * i + 1);
    return p;
}

// Sizes on both sides of the first line's room (an IPv4 name leaves 8 bytes there) and names
// of one word, two (IPv4) and four (IPv6).
TEST(ShortCell, ReadGivesBackWhatWasWritten) {
    for (size_t name_len : {6u, 16u, 28u}) {
        for (size_t len : {0u, 1u, 8u, 9u, 40u, 1000u}) {
            SCOPED_TRACE("name " + std::to_string(name_len) + " B, payload " + std::to_string(len) +
                         " B");
            CellBuffer cell;
            const std::string name = name_of(name_len, 11);
            const auto payload = payload_of(len);
            write_cell(cell, name, payload, wire::kLocalTagged | wire::kLocalCqData,
                       0x1122334455667788ull, 0xA5A5ull);
            ASSERT_EQ(cell.data()[0], uint8_t(wire::LocalOp::Short));
            ShortView v;
            ASSERT_TRUE(read_short(cell.data(), v));
            EXPECT_EQ(v.flags, wire::kLocalTagged | wire::kLocalCqData);
            EXPECT_EQ(v.size, len);
            EXPECT_EQ(v.tag, 0x1122334455667788ull);
            EXPECT_EQ(v.cq_data, 0xA5A5ull);
            EXPECT_EQ(std::string(v.sender), name);
            EXPECT_EQ(v.data, cell.data() + wire::local_short_body_offset(name_len));
            EXPECT_EQ(std::vector<uint8_t>(v.data, v.data + len), payload);
        }
    }
}

TEST(ShortCell, ANameOrSizeTheCellCannotHoldIsRefused) {
    CellBuffer cell;
    write_cell(cell, name_of(16, 1), payload_of(8), 0, 1, 0);
    ShortView v;
    ASSERT_TRUE(read_short(cell.data(), v));

    cell.data()[offsetof(wire::LocalShortHeader, name_len)] = uint8_t(wire::kLocalNameRoom + 1);
    EXPECT_FALSE(read_short(cell.data(), v));

    write_cell(cell, name_of(16, 1), payload_of(8), 0, 1, 0);
    const uint32_t too_big = uint32_t(wire::kLocalBodyRoom + 1);
    std::memcpy(cell.data() + offsetof(wire::LocalShortHeader, size), &too_big, sizeof too_big);
    EXPECT_FALSE(read_short(cell.data(), v));
}

// The sender as a receiver sees it: the view read_short gives of a cell from `name`.
struct SenderCell {
    CellBuffer cell;
    ShortView view;
    SenderCell(const std::string &name, size_t payload_len) {
        write_cell(cell, name, payload_of(payload_len), 0, 0, 0);
        EXPECT_TRUE(read_short(cell.data(), view));
    }
};

TEST(LastSender, MatchesTheNameItRemembersInTheSameAvVersion) {
    for (size_t name_len : {6u, 16u, 28u}) {
        SCOPED_TRACE("name " + std::to_string(name_len) + " B");
        const std::string name = name_of(name_len, 40);
        SenderCell first(name, 8), later(name, 300);
        LastSender last;
        EXPECT_FALSE(last.matches(first.view.sender, 7));  // nothing remembered yet
        last.remember(first.view.sender, 7, 42);
        EXPECT_TRUE(last.matches(later.view.sender, 7));
        EXPECT_EQ(last.addr, 42u);
        EXPECT_FALSE(last.matches(later.view.sender, 8));  // the AV changed since
    }
}

// A one-word name is followed by the cell's body, which differs from cell to cell: the word
// after it must not take part in the comparison.
TEST(LastSender, AOneWordNameMatchesWhateverTheBodyAfterIt) {
    const std::string name = name_of(6, 90);
    SenderCell a(name, 0), b(name, 16);
    // The word after the name is the body: make sure the two cells differ there.
    b.cell.data()[wire::local_short_body_offset(6)] ^= 0xFF;
    LastSender last;
    last.remember(a.view.sender, 1, 5);
    EXPECT_TRUE(last.matches(b.view.sender, 1));
}

// A different sender differs in one byte only: in the first word, the second, or (IPv6) the
// fourth; or it has the same bytes but another length.
TEST(LastSender, ANameThatDiffersInAnyWordDoesNotMatch) {
    for (size_t name_len : {6u, 16u, 28u}) {
        const std::string name = name_of(name_len, 70);
        for (size_t at : {size_t(0), name_len / 2, name_len - 1}) {
            SCOPED_TRACE("name " + std::to_string(name_len) + " B, differing at byte " +
                         std::to_string(at));
            std::string other = name;
            other[at] = char(other[at] ^ 0x10);
            SenderCell mine(name, 8), theirs(other, 8);
            LastSender last;
            last.remember(mine.view.sender, 3, 9);
            EXPECT_FALSE(last.matches(theirs.view.sender, 3));
        }
    }
    SenderCell longer(name_of(16, 70), 8), shorter(name_of(12, 70), 8);
    LastSender last;
    last.remember(longer.view.sender, 3, 9);
    EXPECT_FALSE(last.matches(shorter.view.sender, 3));
}

}  // namespace
}  // namespace tandem
