// The peer API's structures for the tests that play a provider sharing objects with tandem: in
// <rdma/fi_ext.h> up to libfabric 1.18; against newer headers (cmake -DTANDEM_LIBFABRIC_PREFIX)
// 1.17's, which tandem keeps between its two providers (peer/peer_api_1_17.h) and which
// off_tandem and these tests' owners and peers speak. (The SRX layouts of other releases, which
// a provider of the running core speaks, are peer/peer_abi_versions.h's.)
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_ext.h>
#if FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION) >= FI_VERSION(1, 19)
#include "peer/peer_api_1_17.h"
#endif
