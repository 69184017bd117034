#include "peer/peer_srx.h"

#include "common/fabric_compat.h"
#include "common/log.h"

#include <cstring>

namespace tandem::peer {

struct ExportedSrxOps {
    // The entry callbacks carry no srx argument: the entry's srx field leads back to the
    // export.
    static SrxOwner &owner_of(fi_peer_rx_entry *entry) {
        return ExportedSrx::of(entry->srx)->owner_;
    }
    static int queue_msg(fi_peer_rx_entry *e) noexcept {
        return guard([&] { return owner_of(e).peer_queue_msg(e); });
    }
    static int queue_tag(fi_peer_rx_entry *e) noexcept {
        return guard([&] { return owner_of(e).peer_queue_tag(e); });
    }
    static void free_entry(fi_peer_rx_entry *e) noexcept {
        guard([&] {
            owner_of(e).peer_free_entry(e);
            return 0;
        });
    }
    template <class F>
    static int guard(F &&f) noexcept {
        try {
            return f();
        } catch (...) {
            return current_exception_errno();
        }
    }
    static inline fi_ops_srx_owner ops = {
        sizeof(fi_ops_srx_owner),
        Trampoline<&ExportedSrx::get_msg>::call<fid_peer_srx>,
        Trampoline<&ExportedSrx::get_tag>::call<fid_peer_srx>,
        queue_msg,
        queue_tag,
        free_entry,
    };
};

// The owner ops of a peer built with another release's layout (peer_abi_versions.h): each
// entry is handed over in the peer's layout (OwnerRxEntry::foreign) and what the peer wrote
// into it is copied back before the owner reads it.
template <SrxAbi Abi>
struct ForeignSrxOps {
    static auto &view(OwnerRxEntry *o) {
        if constexpr (Abi == SrxAbi::V2_3)
            return o->foreign.unlinked;
        else
            return o->foreign.linked;
    }
    static void *hand(fi_peer_rx_entry *e) {
        OwnerRxEntry *o = OwnerRxEntry::of(e);
        copy_to_foreign(o->entry, o->cq_data, view(o));
        return &view(o);
    }
    static fi_peer_rx_entry *take(void *f) {
        OwnerRxEntry *o = OwnerRxEntry::of_foreign(f);
        copy_from_foreign(view(o), o->entry, o->cq_data);
        return &o->entry;
    }
    static SrxOwner &owner_of(fid_peer_srx *srx) { return ExportedSrx::of(srx)->owner_; }
    static SrxOwner &owner_of(void *f) { return owner_of(OwnerRxEntry::of_foreign(f)->entry.srx); }
    // The owner's answer to a get, handed over (an entry comes with -FI_ENOENT too).
    static int give(int ret, fi_peer_rx_entry *e, void **entry) {
        if (e) *entry = hand(e);
        return ret;
    }

    // 1.19 to 1.22: the get calls name the source and the size or tag.
    static int get_msg_1_19(fid_peer_srx *srx, fi_addr_t addr, size_t size, void **entry) noexcept {
        fi_peer_rx_entry *e = nullptr;
        int ret = ExportedSrxOps::guard([&] { return owner_of(srx).peer_get_msg(addr, size, &e); });
        return give(ret, e, entry);
    }
    static int get_tag_1_19(fid_peer_srx *srx, fi_addr_t addr, uint64_t tag,
                            void **entry) noexcept {
        fi_peer_rx_entry *e = nullptr;
        int ret = ExportedSrxOps::guard([&] { return owner_of(srx).peer_get_tag(addr, tag, &e); });
        return give(ret, e, entry);
    }
    // 2.0: one fi_peer_match_attr, which gives the size for tagged messages too.
    static int get_msg_2_0(fid_peer_srx *srx, MatchAttr *attr, void **entry) noexcept {
        if (!attr) return -FI_EINVAL;
        return get_msg_1_19(srx, attr->addr, attr->msg_size, entry);
    }
    static int get_tag_2_0(fid_peer_srx *srx, MatchAttr *attr, void **entry) noexcept {
        if (!attr) return -FI_EINVAL;
        fi_peer_rx_entry *e = nullptr;
        int ret = ExportedSrxOps::guard(
            [&] { return owner_of(srx).peer_get_tag(attr->addr, attr->tag, &e); });
        if (e) e->size = attr->msg_size;
        return give(ret, e, entry);
    }
    static int queue_msg(void *f) noexcept {
        if (!f) return -FI_EINVAL;
        return ExportedSrxOps::guard([&] { return owner_of(f).peer_queue_msg(take(f)); });
    }
    static int queue_tag(void *f) noexcept {
        if (!f) return -FI_EINVAL;
        return ExportedSrxOps::guard([&] { return owner_of(f).peer_queue_tag(take(f)); });
    }
    static void foreach_unspec_addr(fid_peer_srx *srx, GetAddr get_addr) noexcept {
        if (!get_addr) return;
        ExportedSrxOps::guard([&] {
            owner_of(srx).peer_foreach_unspec_addr(
                [&](fi_peer_rx_entry *e) { e->addr = get_addr(hand(e)); });
            return 0;
        });
    }
    static void free_entry(void *f) noexcept {
        if (!f) return;
        ExportedSrxOps::guard([&] {
            owner_of(f).peer_free_entry(&OwnerRxEntry::of_foreign(f)->entry);
            return 0;
        });
    }

    static inline SrxOwnerOps1_19 ops_1_19 = {
        sizeof(SrxOwnerOps1_19), get_msg_1_19, get_tag_1_19, queue_msg, queue_tag,
        foreach_unspec_addr,     free_entry};
    static inline SrxOwnerOps2_0 ops_2_0 = {
        sizeof(SrxOwnerOps2_0), get_msg_2_0, get_tag_2_0, queue_msg, queue_tag,
        foreach_unspec_addr,    free_entry};
};

namespace {

// The owner ops table for a peer of this layout, as fid_peer_srx declares its field.
fi_ops_srx_owner *owner_ops_for(SrxAbi abi) {
    switch (abi) {
        case SrxAbi::V1_19:
            return reinterpret_cast<fi_ops_srx_owner *>(&ForeignSrxOps<SrxAbi::V1_19>::ops_1_19);
        case SrxAbi::V2_0:
            return reinterpret_cast<fi_ops_srx_owner *>(&ForeignSrxOps<SrxAbi::V2_0>::ops_2_0);
        case SrxAbi::V2_3:
            return reinterpret_cast<fi_ops_srx_owner *>(&ForeignSrxOps<SrxAbi::V2_3>::ops_2_0);
        default:
            return &ExportedSrxOps::ops;
    }
}

}  // namespace

// The exported fid's fi_ops: as every export's (the importer does not close what it did not
// open: -FI_ENOSYS), with fi_open_ops for the layout handshake.
constinit fi_ops exported_srx_fid_ops =
    fid_ops(enosys<decltype(fi_ops::close)>, enosys<decltype(fi_ops::bind)>,
            enosys<decltype(fi_ops::control)>, Trampoline<&ExportedSrx::ops_open>::call<fid>);

ExportedSrx::ExportedSrx(SrxOwner &owner, SrxAbi abi) : owner_(owner), abi_(abi) {
    init_fid(FI_CLASS_SRX_CTX, nullptr, &exported_srx_fid_ops);
    fid()->owner_ops = owner_ops_for(abi);
    fid()->peer_ops = nullptr;
    context_.size = sizeof context_;
    context_.srx = fid();
}

bool ExportedSrx::peer_attached() const {
    auto *self = const_cast<ExportedSrx *>(this);
    const fi_ops_srx_peer *ops = self->fid()->peer_ops;
    return ops && ops->start_msg && ops->start_tag && ops->discard_msg && ops->discard_tag;
}

int ExportedSrx::ops_open(const char *name, uint64_t, void **ops, void *) {
    if (!name || !ops || std::strcmp(name, kSrxBuildLayoutName) != 0) return -FI_ENOSYS;
    // (Before the importer has it: no entry was handed out in another layout.)
    abi_ = SrxAbi::V1_17;
    fid()->owner_ops = &ExportedSrxOps::ops;
    *ops = fid()->owner_ops;
    return 0;
}

fi_peer_rx_entry *ExportedSrx::handed(fi_peer_rx_entry *e) const {
    switch (abi_) {
        case SrxAbi::V1_19:
            return static_cast<fi_peer_rx_entry *>(ForeignSrxOps<SrxAbi::V1_19>::hand(e));
        case SrxAbi::V2_0:
            return static_cast<fi_peer_rx_entry *>(ForeignSrxOps<SrxAbi::V2_0>::hand(e));
        case SrxAbi::V2_3:
            return static_cast<fi_peer_rx_entry *>(ForeignSrxOps<SrxAbi::V2_3>::hand(e));
        default:
            return e;
    }
}

int ExportedSrx::start(fi_peer_rx_entry *entry, bool tagged) {
    if (!peer_attached()) return -FI_ENOSYS;
    fi_ops_srx_peer *ops = fid()->peer_ops;
    fi_peer_rx_entry *e = handed(entry);
    return tagged ? ops->start_tag(e) : ops->start_msg(e);
}

int ExportedSrx::discard(fi_peer_rx_entry *entry, bool tagged) {
    if (!peer_attached()) return -FI_ENOSYS;
    fi_ops_srx_peer *ops = fid()->peer_ops;
    fi_peer_rx_entry *e = handed(entry);
    return tagged ? ops->discard_tag(e) : ops->discard_msg(e);
}

fid_peer_srx *ImportedSrx::from_context(const void *context) {
    auto *ctx = static_cast<const fi_peer_srx_context *>(context);
    if (!ctx || ctx->size < sizeof *ctx || !ctx->srx || !ctx->srx->owner_ops) return nullptr;
    struct fid *owner = &ctx->srx->ep_fid.fid;
    void *build_layout = nullptr;
    const bool ours =
        owner->ops && owner->ops->ops_open &&
        owner->ops->ops_open(owner, kSrxBuildLayoutName, 0, &build_layout, nullptr) == 0;
    if (!ours && srx_abi_of(compat::core_version()) != SrxAbi::V1_17) {
        TANDEM_WARN(FI_LOG_EP_CTRL,
                    "an SRX owner of libfabric %u.%u's peer API layout: this build imports only "
                    "its own (libfabric 1.17's headers)\n",
                    FI_MAJOR(compat::core_version()), FI_MINOR(compat::core_version()));
        return nullptr;
    }
    const fi_ops_srx_owner *o = ctx->srx->owner_ops;
    if (!o->get_msg || !o->get_tag || !o->queue_msg || !o->queue_tag || !o->free_entry)
        return nullptr;
    return ctx->srx;
}

}  // namespace tandem::peer
