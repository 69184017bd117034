// fid_pep: a passive MSG endpoint. It listens on the link, turns each connection request
// into an FI_CONNREQ event whose info->handle (a ConnRequest fid) carries the connection to
// the endpoint the application opens for it, and answers fi_reject itself.
#pragma once

#include "common/fid_adaptor.h"
#include "main_prov/eq.h"
#include "main_prov/lock_order.h"
#include "common/wire.h"
#include "main_prov/link/link.h"
#include "main_prov/types.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>

#include <memory>
#include <mutex>

namespace tandem {

class Fabric;

// The fid behind fi_info->handle of an FI_CONNREQ event.
class ConnRequest : public FidObject<ConnRequest, struct fid> {
  public:
    explicit ConnRequest(std::unique_ptr<LinkConnection> conn);
    std::unique_ptr<LinkConnection> conn;
};

// Takes the connection out of a request handle (for the endpoint that accepts it).
std::unique_ptr<LinkConnection> take_connection_request(struct fid *handle);

class PassiveEndpoint : public FidObject<PassiveEndpoint, fid_pep>,
                        public CmSource,
                        public RemoteKeyResolver {
  public:
    PassiveEndpoint(Fabric *fabric, fi_info *info, void *context);
    ~PassiveEndpoint() override;

    int close();
    int bind(struct fid *bfid, uint64_t flags);
    int control(int command, void *arg);
    int getopt(int level, int optname, void *optval, size_t *optlen);
    int setopt(int level, int optname, const void *optval, size_t optlen);
    int setname(void *addr, size_t addrlen);
    int getname(void *addr, size_t *addrlen);
    int listen();
    int reject(fid_t handle, const void *param, size_t paramlen);
    // An active endpoint takes this one's address (fi_endpoint(3): info->handle set to a
    // passive endpoint). It stops listening and has no fabric resources left after; the
    // application closes it. Returns the address (the interface's in place of a wildcard).
    EndpointName surrender_address();

    void progress_cm() override;
    void cm_watch(WaitSet &set) override;
    int sleep_limit_ms() override;

  private:
    bool resolve(uint64_t, uint64_t, size_t, uint64_t, LocalPieces &) noexcept override {
        return false;
    }
    void remote_access_done(uint64_t, uint64_t) noexcept override {}

    Fabric *fabric_;
    fi_info *info_;
    PepMutex mutex_;  // before the EQ's in the lock order: progress_cm posts FI_CONNREQ
    std::shared_ptr<LinkDomain> link_;
    std::unique_ptr<LinkTransport> transport_;
    EndpointName name_;
    Eq *eq_ = nullptr;
    bool listening_ = false;
    bool surrendered_ = false;  // its address went to an active endpoint
    size_t cm_data_size_;
    size_t cm_data_max_ = wire::kMaxCmPrivate;  // what the link's connection requests carry
    // Digest of the authorization key (fi_endpoint(3) auth_key; 0: none): connection
    // requests carry it, and only a request with the same one is accepted.
    uint64_t auth_ = 0;
};

}  // namespace tandem
