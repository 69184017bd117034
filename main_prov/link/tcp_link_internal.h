// Private to the TCP link's files (main_prov/link/tcp_*.cpp): what more than one of them needs
// and nobody else should see.
#pragma once

#include "main_prov/link/tcp_link.h"
#include "common/iov.h"

#include <vector>

namespace tandem {

// Frames kept for reuse per connection (beyond, finished frames are freed).
inline constexpr size_t kSpareFrames = 64;

// Nodelay, buffer sizes and the bound on an unanswering peer, as `config` says, for a socket
// connected or accepted (tcp_connect.cpp).
void set_socket_options(int fd, const TcpLinkConfig &config);

// Bytes [from, from + len) of a scatter list, with where each piece lives when `mem` is given
// (out_mem stays empty otherwise: host memory).
inline void slice_pieces(const iovec *iov, const hmem::MemRef *mem, size_t count, size_t from,
                         size_t len, std::vector<iovec> &out_iov,
                         std::vector<hmem::MemRef> &out_mem) {
    out_iov.clear();
    out_mem.clear();
    iov_walk(iov, count, from, len, [&](size_t i, uint8_t *ptr, size_t n) {
        out_iov.push_back({ptr, n});
        if (mem) out_mem.push_back(mem[i]);
        return true;
    });
}

}  // namespace tandem
