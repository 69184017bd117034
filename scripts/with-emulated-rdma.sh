#!/usr/bin/env bash
# Runs COMMAND with tandem's verbs link on the emulated RDMA device of the tests
# (tests/emurdma), as tests/emucuda stands in for a GPU:
#
#   scripts/with-emulated-rdma.sh fi_info -p tandem
#   scripts/with-emulated-rdma.sh fi_pingpong -p tandem -e rdm <address of the device>
#
# tandem loads libibverbs and librdmacm by the names FI_TANDEM_VERBS_LIB and
# FI_TANDEM_RDMACM_LIB give; here both name the emulator, which implements the part of both
# APIs the link uses. Nothing else in the process changes: the libfabric core's own verbs
# provider still sees the system's libibverbs (and no device).
#
# The device (emu_rdma0) serves the addresses of one network interface, as a RoCE NIC serves
# its netdev: EMURDMA_NETDEV, by default the interface of the default route (lo without one).
# Its other settings (EMURDMA_MAX_INLINE, EMURDMA_MAX_SGE, EMURDMA_FAULT) are described in
# tests/emurdma/emurdma_control.h. FI_PROVIDER_PATH defaults to the build's providers.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${TANDEM_BUILD_DIR:-$root/build}
lib=$build/tests/emurdma/libtandem-emurdma.so
if [ ! -f "$lib" ]; then
    echo "with-emulated-rdma: $lib is missing: build the tests first (scripts/build.sh)" >&2
    exit 2
fi
if [ $# -eq 0 ]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi
if [ -z "${EMURDMA_NETDEV:-}" ]; then
    EMURDMA_NETDEV=$(ip -o route show default 2>/dev/null |
        awk '{for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit }}')
    EMURDMA_NETDEV=${EMURDMA_NETDEV:-lo}
fi
export EMURDMA_NETDEV
export FI_TANDEM_VERBS_LIB=$lib FI_TANDEM_RDMACM_LIB=$lib
export FI_PROVIDER_PATH=${FI_PROVIDER_PATH:-$build/lib}
exec "$@"
