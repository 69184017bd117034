#include "offload_prov/eq.h"

#include "offload_prov/fabric.h"

namespace tandem::off {

namespace {

fi_ops eq_fi_ops = fid_ops(&Trampoline<&Eq::close>::call<fid>);

fi_ops_eq eq_ops = {
    .size = sizeof(fi_ops_eq),
    .read = enosys<decltype(fi_ops_eq::read)>,
    .readerr = enosys<decltype(fi_ops_eq::readerr)>,
    .write = &Trampoline<&Eq::write>::call<fid_eq>,
    .sread = enosys<decltype(fi_ops_eq::sread)>,
    .strerror = enosys<decltype(fi_ops_eq::strerror)>,
};

}  // namespace

Eq::Eq(Fabric *fabric, fid_eq *owner) : fabric_(fabric), owner_(owner) {
    init_fid(FI_CLASS_EQ, nullptr, &eq_fi_ops);
    fid()->ops = &eq_ops;
    fabric_->hold();
}

Eq::~Eq() {
    fabric_->release();
}

int Eq::close() {
    delete this;
    return 0;
}

// fi_eq_write on the peer EQ lands on the owner's: there is one queue of events.
ssize_t Eq::write(uint32_t event, const void *buf, size_t len, uint64_t flags) {
    return report(event, buf, len, flags);
}

}  // namespace tandem::off
