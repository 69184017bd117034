/* What both MPI test programs share: error reporting with the step in progress, a watchdog
 * that names a hung step, soft checks, allocation, and the byte pattern data is checked
 * against. Include it once, after <mpi.h>, with PROGRAM defined. */
#ifndef TANDEM_MPI_CHECK_H
#define TANDEM_MPI_CHECK_H

#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef PROGRAM
#error "define PROGRAM (the program name) before including mpi_check.h"
#endif

static int rank;
static long failures;

/* Any MPI error is reported with where it happened (phase and step), then the job aborts. */
static char g_step[160] = "startup";
static void mpi_fail(int rc, const char *call, int line) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "[rank %d] line %d: %s failed: %s (during: %s)\n", rank, line, call, msg,
            g_step);
    fprintf(stderr, "%s: FAIL (MPI error on rank %d)\n", PROGRAM, rank);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 4);
}
#define MPI_OK(call)                                            \
    do {                                                        \
        int rc_ = (call);                                       \
        if (rc_ != MPI_SUCCESS) mpi_fail(rc_, #call, __LINE__); \
    } while (0)
#define STEP(...) snprintf(g_step, sizeof g_step, __VA_ARGS__)

/* A hang is reported with the step it happened in (MPI_TEST_WATCHDOG seconds, default 240). */
static int g_watchdog_s = 240;
static void on_watchdog(int sig) {
    (void)sig;
    char buf[320];
    int n = snprintf(buf, sizeof buf, "[rank %d] %s: FAIL: watchdog: still in \"%s\" after %d s\n",
                     rank, PROGRAM, g_step, g_watchdog_s);
    if (n > 0) {
        ssize_t w = write(2, buf, (size_t)n);
        (void)w;
    }
    _exit(5);
}
static void start_watchdog(void) {
    const char *env = getenv("MPI_TEST_WATCHDOG");
    if (env && atoi(env) > 0) g_watchdog_s = atoi(env);
    signal(SIGALRM, on_watchdog);
    alarm((unsigned)g_watchdog_s);
}

#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            if (failures++ < 20) {                                                              \
                fprintf(stderr, "[rank %d] check failed at %s:%d: ", rank, __FILE__, __LINE__); \
                fprintf(stderr, __VA_ARGS__);                                                   \
                fputc('\n', stderr);                                                            \
            }                                                                                   \
        }                                                                                       \
    } while (0)

/* The end of every program: the failed checks of all ranks, one PASS or FAIL line from rank
 * 0 (run_mpi.sh looks for it), MPI_Finalize; the exit code. */
static int finish(int nprocs) {
    long total = 0;
    MPI_OK(MPI_Allreduce(&failures, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (rank == 0) {
        if (total)
            printf("%s: FAIL (%ld failed checks over %d ranks)\n", PROGRAM, total, nprocs);
        else
            printf("%s: PASS (%d ranks)\n", PROGRAM, nprocs);
        fflush(stdout);
    }
    MPI_Finalize();
    return total ? 1 : 0;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "[rank %d] out of memory (%zu bytes)\n", rank, n);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

/* The byte at offset i of a message from src with tag (or any two small integers). */
static inline unsigned char pattern(size_t i, int src, int tag) {
    uint32_t x = (uint32_t)i * 2654435761u + (uint32_t)src * 97u + (uint32_t)tag * 40503u;
    return (unsigned char)((x >> 24) ^ (x >> 9) ^ (uint32_t)(i >> 16));
}

#endif
