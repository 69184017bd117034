/* MPI one-sided communication through tandem's atomics: Open MPI's osc rdma component over its
 * btl ofi, which run_mpi.sh (MPI_TEST_MODE=osc) forces onto tandem. Every rank
 *   - fetch-adds 1 to a counter in rank 0's window N times (MPI_Fetch_and_op, MPI_SUM): the
 *     counter ends at N * nprocs and no fetched value is seen twice across the ranks;
 *   - puts a word into rank 0's window and gets it back (RMA under the same epoch).
 * Nothing else of one-sided MPI goes through Open MPI 4.1's btl ofi: its compare-and-swap
 * dereferences a missing local registration (mca_btl_ofi_acswap crashes the rank), and the
 * atomics its window locks and accumulates use are ones its to_fi_op does not map ("Unknown
 * or unsupported atomic op", then it aborts), with libfabric's shm provider as with tandem.
 * The window is MPI_Win_create over malloc'd memory: with MPI_Win_allocate, osc rdma would
 * put ranks of one node in shared memory and do the atomics with the CPU, not the network. */
#define PROGRAM "mpi_osc"
#include "mpi_check.h"

static int nprocs;

enum { kCounter, kSlots };

static void test_fetch_add(MPI_Win win, int64_t *base) {
    const int n = 500;
    int64_t *seen = xmalloc(sizeof(int64_t) * (size_t)n);
    const int64_t one = 1;
    MPI_OK(MPI_Win_lock_all(0, win));
    for (int i = 0; i < n; ++i) {
        STEP("fetch-add %d", i);
        MPI_OK(MPI_Fetch_and_op(&one, &seen[i], MPI_INT64_T, 0, kCounter, MPI_SUM, win));
        MPI_OK(MPI_Win_flush(0, win));
    }
    MPI_OK(MPI_Win_unlock_all(win));
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
    int64_t *all = rank == 0 ? xmalloc(sizeof(int64_t) * (size_t)n * (size_t)nprocs) : NULL;
    MPI_OK(MPI_Gather(seen, n, MPI_INT64_T, all, n, MPI_INT64_T, 0, MPI_COMM_WORLD));
    if (rank == 0) {
        const int64_t total = (int64_t)n * nprocs;
        CHECK(base[kCounter] == total, "counter %lld, expected %lld", (long long)base[kCounter],
              (long long)total);
        /* Each value 0 .. total-1 fetched exactly once: the adds were atomic. */
        char *hit = calloc((size_t)total, 1);
        for (int64_t i = 0; i < total; ++i) {
            int64_t v = all[i];
            CHECK(v >= 0 && v < total && !hit[v], "fetched value %lld out of range or twice",
                  (long long)v);
            if (v >= 0 && v < total) hit[v] = 1;
        }
        free(hit);
        free(all);
    }
    free(seen);
}

/* Each rank puts a value into its own word of rank 0's window and reads it back. */
static void test_put_get(MPI_Win win, int64_t *base) {
    const int64_t mine = 7 * (rank + 1);
    int64_t back = 0;
    STEP("put and get");
    MPI_OK(MPI_Win_lock_all(0, win));
    MPI_OK(MPI_Put(&mine, 1, MPI_INT64_T, 0, kSlots + rank, 1, MPI_INT64_T, win));
    MPI_OK(MPI_Win_flush(0, win));
    MPI_OK(MPI_Get(&back, 1, MPI_INT64_T, 0, kSlots + rank, 1, MPI_INT64_T, win));
    MPI_OK(MPI_Win_flush(0, win));
    MPI_OK(MPI_Win_unlock_all(win));
    CHECK(back == mine, "read back %lld, put %lld", (long long)back, (long long)mine);
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
    if (rank == 0)
        for (int r = 0; r < nprocs; ++r)
            CHECK(base[kSlots + r] == 7 * (r + 1), "word of rank %d holds %lld", r,
                  (long long)base[kSlots + r]);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    start_watchdog();
    int64_t *base = xmalloc(sizeof(int64_t) * (size_t)(kSlots + nprocs));
    memset(base, 0, sizeof(int64_t) * (size_t)(kSlots + nprocs));
    MPI_Win win;
    STEP("MPI_Win_create");
    MPI_OK(MPI_Win_create(base, sizeof(int64_t) * (size_t)(kSlots + nprocs), sizeof(int64_t),
                          MPI_INFO_NULL, MPI_COMM_WORLD, &win));
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
    test_fetch_add(win, base);
    test_put_get(win, base);
    MPI_OK(MPI_Win_free(&win));
    free(base);
    return finish(nprocs);
}
