#!/usr/bin/env bash
# Runs a command (a test suite) with /proc/kallsyms reading empty, where that can be done:
#   scripts/quiet-kallsyms.sh CMD [ARGS...]
# Why: the system libfabric 1.17's verbs provider reads /proc/kallsyms twice whenever a process
# loads libfabric (to learn whether the kernel has peer-memory and dma-buf symbols), about
# 0.2 s of every one of the suites' ~2,500 test programs on these machines (0.41-0.49 s ->
# 0.24-0.25 s for one api test, measured). tandem does not use that provider, and nothing of
# tandem reads the file. As root, CMD runs in a mount namespace of its own whose /proc/kallsyms
# is /dev/null; elsewhere (not root, no unshare), or with TANDEM_KEEP_KALLSYMS=1, it runs as is.
set -euo pipefail
if [ "$(id -u)" -eq 0 ] && [ -z "${TANDEM_KEEP_KALLSYMS:-}" ] && command -v unshare >/dev/null &&
    unshare -m true 2>/dev/null; then
    exec unshare -m bash -c 'mount --bind /dev/null /proc/kallsyms 2>/dev/null || true; exec "$@"' \
        quiet-kallsyms "$@"
fi
exec "$@"
