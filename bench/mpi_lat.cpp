// mpi_lat: MPI point-to-point latency, started under mpirun as users start jobs, so that the
// same program measures Open MPI over any of its transports (pml ob1 with btl vader, pml cm
// with mtl ofi over a libfabric provider such as tandem).
//
//   mpirun -np 2 [mpirun's choice of transport] mpi_lat [-s 8,64,1k] [-b BATCHES] [-i ITERS]
//
// Ranks 0 and 1 ping-pong MPI_Send / MPI_Recv of each size (any further ranks wait at the
// final barrier): warm-up, then BATCHES batches of ITERS round trips. A batch's latency is half
// its round trip's mean; the figure is the median of the batches. Each received message is
// checked (its first word carries the iteration). Output (rank 0):
//   mpi latency SIZE lat_us L batches K iters I
#include "bench/bench_common.h"

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void fail(const char *what) {
    std::fprintf(stderr, "mpi_lat: %s\n", what);
    MPI_Abort(MPI_COMM_WORLD, 2);
    std::abort();
}

}  // namespace

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::vector<uint64_t> sizes{8};
    int batches = 21, iters = 20000;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "-s" && i + 1 < argc) {
            sizes.clear();
            std::string list = argv[++i];
            size_t at = 0;
            for (;;) {
                size_t comma = list.find(',', at);
                uint64_t v;
                if (!tandem_bench::parse_size(list.substr(at, comma - at), &v)) fail("bad -s");
                sizes.push_back(v);
                if (comma == std::string::npos) break;
                at = comma + 1;
            }
        } else if (a == "-b" && i + 1 < argc) {
            batches = std::max(1, std::atoi(argv[++i]));
        } else if (a == "-i" && i + 1 < argc) {
            iters = std::max(1, std::atoi(argv[++i]));
        } else {
            if (rank == 0)
                std::fprintf(stderr,
                             "usage: mpirun -np 2 mpi_lat [-s 8,64] [-b BATCHES] [-i ITERS]\n");
            MPI_Finalize();
            return 2;
        }
    }
    if (size < 2) fail("needs two ranks");
    if (rank == 0) std::printf("# mpi_lat: %d ranks, half round trip, median of batches\n", size);
    for (uint64_t bytes : sizes) {
        std::vector<uint8_t> buf(std::max<uint64_t>(bytes, 8));
        const int peer = rank == 0 ? 1 : 0;
        std::vector<double> lat;
        const int warm = std::max(iters / 10, 1);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank < 2) {
            for (int b = -1; b < batches; ++b) {
                const int n = b < 0 ? warm : iters;
                double t0 = MPI_Wtime();
                for (int it = 0; it < n; ++it) {
                    uint32_t seq = uint32_t(it);
                    if (rank == 0) {
                        if (bytes >= 4) std::memcpy(buf.data(), &seq, 4);
                        MPI_Send(buf.data(), int(bytes), MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                        MPI_Recv(buf.data(), int(bytes), MPI_BYTE, peer, 1, MPI_COMM_WORLD,
                                 MPI_STATUS_IGNORE);
                    } else {
                        MPI_Recv(buf.data(), int(bytes), MPI_BYTE, peer, 1, MPI_COMM_WORLD,
                                 MPI_STATUS_IGNORE);
                        MPI_Send(buf.data(), int(bytes), MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                    }
                    uint32_t got = 0;
                    if (bytes >= 4) std::memcpy(&got, buf.data(), 4);
                    if (bytes >= 4 && got != seq) fail("a message carried a wrong sequence number");
                }
                if (b >= 0) lat.push_back((MPI_Wtime() - t0) * 1e6 / n / 2);
            }
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {
            std::sort(lat.begin(), lat.end());
            std::printf("mpi latency %llu lat_us %.4f batches %d iters %d\n",
                        (unsigned long long)bytes, lat[lat.size() / 2], batches, iters);
            std::fflush(stdout);
        }
    }
    MPI_Finalize();
    return 0;
}
