// libtorch's own c10d, the engine torch.distributed, DDP and FSDP run on: a TCPStore for
// the rendezvous and a Gloo process group for the collectives (src/ranks/). The store and
// the group cross to Rust as opaque pointers that Rust frees.

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "ffi.h"

namespace {

struct Store {
    c10::intrusive_ptr<c10d::Store> store;
};

struct Group {
    c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
};

bool is_loopback(const std::string& host) {
    return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// As torch.distributed picks Gloo's device: the interface GLOO_SOCKET_IFNAME names, the
// loopback one when the ranks meet on loopback, else the address the hostname resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master) {
    if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface != nullptr && *interface != '\0') {
        return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
    }
    if (is_loopback(master)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

// Connects to the TCPStore at host:port, serving it when is_server. Does not wait for
// the other ranks: the rendezvous (src/ranks/rendezvous.rs) does, naming any missing.
extern "C" char* petting_store_connect(const char* host, uint16_t port, bool is_server, int64_t world,
                                       int64_t timeout_ms, void** out) {
    return petting::guarded([&] {
        c10d::TCPStoreOptions options;
        options.port = port;
        options.isServer = is_server;
        options.numWorkers = static_cast<std::size_t>(world);
        options.waitWorkers = false;
        options.timeout = std::chrono::milliseconds(timeout_ms);
        auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
        *out = new Store{store};
    });
}

extern "C" void petting_store_free(void* store) { delete static_cast<Store*>(store); }

// The same store with every key under prefix: the keys of a pool's ranks (and of its
// Gloo group) apart from every other pool's.
extern "C" char* petting_store_prefixed(void* store, const char* prefix, void** out) {
    return petting::guarded([&] {
        auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, static_cast<Store*>(store)->store);
        *out = new Store{prefixed};
    });
}

extern "C" char* petting_store_set(void* store, const char* key, const uint8_t* data, size_t len) {
    return petting::guarded([&] {
        std::vector<uint8_t> value(data, data + len);
        static_cast<Store*>(store)->store->set(key, value);
    });
}

// The value of key, waiting for it up to timeout_ms; the bytes are malloc'd, for
// petting_free_bytes.
extern "C" char* petting_store_get(void* store, const char* key, int64_t timeout_ms, uint8_t** data, size_t* len) {
    return petting::guarded([&] {
        auto& s = static_cast<Store*>(store)->store;
        s->wait({key}, std::chrono::milliseconds(timeout_ms));
        std::vector<uint8_t> value = s->get(key);
        *len = value.size();
        *data = static_cast<uint8_t*>(std::malloc(value.size() == 0 ? 1 : value.size()));
        if (!value.empty()) std::memcpy(*data, value.data(), value.size());
    });
}

extern "C" void petting_free_bytes(uint8_t* data) { std::free(data); }

extern "C" char* petting_store_check(void* store, const char* key, bool* present) {
    return petting::guarded([&] { *present = static_cast<Store*>(store)->store->check({key}); });
}

extern "C" char* petting_store_add(void* store, const char* key, int64_t value, int64_t* total) {
    return petting::guarded([&] { *total = static_cast<Store*>(store)->store->add(key, value); });
}

// A Gloo process group of world ranks over store (its own keys under a prefix the
// constructor adds); every collective fails after timeout_ms.
extern "C" char* petting_gloo_new(void* store, const char* master, int64_t rank, int64_t world, int64_t timeout_ms,
                                  void** out) {
    return petting::guarded([&] {
        auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(timeout_ms));
        options->devices.push_back(gloo_device(master));
        auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(static_cast<Store*>(store)->store, rank, world, options);
        *out = new Group{gloo};
    });
}

extern "C" void petting_gloo_free(void* group) { delete static_cast<Group*>(group); }

// Sums tensor over every rank, in place.
extern "C" char* petting_allreduce_sum(void* group, at::Tensor* tensor) {
    return petting::guarded([&] {
        std::vector<at::Tensor> tensors{*tensor};
        static_cast<Group*>(group)->gloo->allreduce(tensors)->wait();
    });
}

// Gives every rank root's tensor, in place.
extern "C" char* petting_broadcast(void* group, at::Tensor* tensor, int64_t root) {
    return petting::guarded([&] {
        std::vector<at::Tensor> tensors{*tensor};
        c10d::BroadcastOptions options;
        options.rootRank = root;
        static_cast<Group*>(group)->gloo->broadcast(tensors, options)->wait();
    });
}
