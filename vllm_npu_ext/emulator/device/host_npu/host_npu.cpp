// The stand-in's `npu` device: torch's PrivateUse1 backend whose memory is host memory.
//
// Registration points as in PyTorch's out-of-tree reference backend (OpenReg,
// test/cpp_extensions/open_registration_extension): an allocator, a device guard, the
// PrivateUse1 hooks, the factory/copy/view/resize kernels, and a boxed fallback for every
// other aten operator. Unlike OpenReg's fallback (copy to the CPU and back) this one runs the
// CPU kernel on CPU tensors that alias the same memory, so in-place operators write the npu
// tensor's own bytes and a view returned by a CPU kernel becomes an npu view of the same npu
// storage: aliasing is what it is on a device.
//
// Host kernels run synchronously, so streams and events keep their ordering semantics
// trivially: an event recorded on any stream has completed when the record returns.
// Loaded with torch.ops.load_library; static initialisers register everything. Control and
// figures: the `npu_host::` operators at the end.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace npu_host {
namespace {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
// Indices a process may select; device_count() is what the Python side reports.
constexpr c10::DeviceIndex kMaxDevices = 64;

std::atomic<c10::DeviceIndex> g_current_device{0};
std::atomic<c10::DeviceIndex> g_device_count{1};
std::atomic<int64_t> g_fallback_calls{0};
// Non-empty while the device's stream is blocked (a graph replay waits on an ExternalEvent not
// yet recorded, `graphs.py`): why. Work submitted meanwhile would wait forever on the device;
// here it is refused with that reason.
std::mutex g_blocked_mutex;
std::string g_blocked;

void check_not_blocked(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_blocked_mutex);
  TORCH_CHECK(g_blocked.empty(), what, " on the npu device would wait forever: ", g_blocked);
}

c10::DeviceIndex current_device() {
  return g_current_device.load();
}

void check_index(int64_t index) {
  TORCH_CHECK(
      index >= 0 && index < kMaxDevices,
      "npu (host stand-in): invalid device index ", index,
      " (0 to ", static_cast<int>(kMaxDevices) - 1, ")");
}

// ---------------------------------------------------------------- memory

struct Ledger {
  std::mutex mutex;
  std::unordered_map<const void*, std::pair<size_t, c10::DeviceIndex>> device;  // ptr -> bytes, index
  std::unordered_set<const void*> pinned;
  int64_t device_bytes = 0;
  int64_t device_peak = 0;
};

Ledger& ledger() {
  static Ledger* instance = new Ledger();  // never destroyed: deleters may run at exit
  return *instance;
}

void free_device(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  {
    Ledger& l = ledger();
    std::lock_guard<std::mutex> lock(l.mutex);
    auto it = l.device.find(ptr);
    if (it != l.device.end()) {
      l.device_bytes -= static_cast<int64_t>(it->second.first);
      l.device.erase(it);
    }
  }
  c10::free_cpu(ptr);
}

struct DeviceAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex index = current_device();
    void* ptr = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    if (ptr != nullptr) {
      Ledger& l = ledger();
      std::lock_guard<std::mutex> lock(l.mutex);
      l.device[ptr] = {nbytes, index};
      l.device_bytes += static_cast<int64_t>(nbytes);
      l.device_peak = std::max(l.device_peak, l.device_bytes);
    }
    return {ptr, ptr, &free_device, c10::Device(kNpu, index)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_device;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

void free_pinned(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  {
    Ledger& l = ledger();
    std::lock_guard<std::mutex> lock(l.mutex);
    l.pinned.erase(ptr);
  }
  c10::free_cpu(ptr);
}

// Page-locked host memory on an NPU host; here ordinary host memory that is remembered as
// pinned, so Tensor.is_pinned() and pin_memory() behave as torch_npu's do.
struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    if (ptr != nullptr) {
      Ledger& l = ledger();
      std::lock_guard<std::mutex> lock(l.mutex);
      l.pinned.insert(ptr);
    }
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

DeviceAllocator g_device_allocator;
PinnedAllocator g_pinned_allocator;
REGISTER_ALLOCATOR(kNpu, &g_device_allocator);

// ---------------------------------------------------------------- device guard, streams, events

struct HostEvent {
  std::chrono::steady_clock::time_point recorded;
  bool was_recorded = false;
};

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kNpu;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device old = getDevice();
    setDevice(device);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(kNpu, current_device());
  }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kNpu, "npu (host stand-in): not an npu device: ", device);
    if (device.has_index()) {
      check_index(device.index());
      g_current_device = device.index();
    }
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.has_index() && device.index() >= 0 && device.index() < kMaxDevices) {
      g_current_device = device.index();
    }
  }
  // One stream per device, the default one: host kernels complete in submission order.
  c10::Stream getStream(c10::Device device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getNewStream(c10::Device device, int priority) const override {
    (void)priority;
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return g_device_count.load();
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    (void)stream;
    (void)device_index;
    (void)flag;
    if (*event == nullptr) {
      *event = new HostEvent();
    }
    auto* host_event = static_cast<HostEvent*>(*event);
    host_event->recorded = std::chrono::steady_clock::now();
    host_event->was_recorded = true;
  }
  void block(void* event, const c10::Stream& stream) const override {
    (void)event;
    (void)stream;  // completed already
  }
  bool queryEvent(void* event) const override {
    (void)event;
    return true;
  }
  void destroyEvent(void* event, const c10::DeviceIndex device_index) const noexcept override {
    (void)device_index;
    delete static_cast<HostEvent*>(event);
  }
  bool queryStream(const c10::Stream& stream) const override {
    (void)stream;
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    (void)stream;
  }
  void synchronizeEvent(void* event) const override {
    (void)event;
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    (void)device_index;
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex device_index) const override {
    (void)device_index;
    auto* first = static_cast<HostEvent*>(start);
    auto* second = static_cast<HostEvent*>(end);
    TORCH_CHECK(first != nullptr && second != nullptr && first->was_recorded &&
                    second->was_recorded,
                "npu (host stand-in): elapsed_time needs two recorded events");
    return std::chrono::duration<double, std::milli>(second->recorded - first->recorded).count();
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    (void)data_ptr;
    (void)stream;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// ---------------------------------------------------------------- generators

// An npu generator: the host's Mersenne Twister (the CPU kernels draw from it), on the npu
// device. The fallback hands a CPU kernel a CPU twin holding its state and takes the state
// back afterwards, so an npu generator advances as the draws go.
struct HostGenerator final : at::CPUGeneratorImpl {
  explicit HostGenerator(c10::DeviceIndex index) : at::CPUGeneratorImpl(c10::default_rng_seed_val) {
    device_ = c10::Device(kNpu, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::mutex mutex;
  static std::vector<at::Generator>* generators = new std::vector<at::Generator>(kMaxDevices);
  if (index < 0) {
    index = current_device();
  }
  check_index(index);
  std::lock_guard<std::mutex> lock(mutex);
  at::Generator& generator = (*generators)[index];
  if (!generator.defined()) {
    generator = at::make_generator<HostGenerator>(index);
  }
  return generator;
}

// ---------------------------------------------------------------- hooks

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    (void)device_index;
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return g_device_count.load();
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return at::make_generator<HostGenerator>(device_index < 0 ? current_device() : device_index);
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_index(device);
    g_current_device = device;
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const c10::DeviceIndex old = current_device();
    setCurrentDevice(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  bool isPinnedPtr(const void* data) const override {
    Ledger& l = ledger();
    std::lock_guard<std::mutex> lock(l.mutex);
    return l.pinned.count(data) > 0;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }
  c10::Device getDeviceFromPtr(void* data) const override {
    Ledger& l = ledger();
    std::lock_guard<std::mutex> lock(l.mutex);
    auto it = l.device.find(data);
    TORCH_CHECK(it != l.device.end(), "npu (host stand-in): not an npu allocation: ", data);
    return c10::Device(kNpu, it->second.second);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "npu (host stand-in): storage is not resizable");
    c10::DataPtr fresh = g_device_allocator.allocate(newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0) {
      std::memcpy(fresh.get(), impl->data(), keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

const bool g_hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  return true;
}();

// ---------------------------------------------------------------- host aliases

// A CPU storage over the same bytes as `storage`, keeping it alive. Resizable with the CPU
// allocator: a CPU kernel that resizes an out= argument moves the alias to new CPU memory,
// which the fallback then writes back into the npu tensor.
c10::Storage host_storage(const c10::Storage& storage) {
  auto* keep = new c10::Storage(storage);
  c10::DataPtr data(
      const_cast<void*>(storage.data()), keep,
      [](void* context) { delete static_cast<c10::Storage*>(context); },
      c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(data),
                      c10::GetCPUAllocator(), /*resizable=*/true);
}

at::Tensor with_layout(at::Tensor tensor, const at::Tensor& like) {
  auto* impl = tensor.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) {
    tensor._set_conj(true);
  }
  if (like.is_neg()) {
    tensor._set_neg(true);
  }
  return tensor;
}

// The CPU tensor over an npu tensor's memory (same sizes, strides, offset).
at::Tensor host_alias(const at::Tensor& tensor, c10::Storage storage) {
  auto alias = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), tensor.dtype());
  return with_layout(std::move(alias), tensor);
}

at::Tensor host_alias(const at::Tensor& tensor) {
  return host_alias(tensor, host_storage(tensor.storage()));
}

// An npu storage owning a CPU kernel's result memory (no copy).
c10::Storage device_storage_owning(const c10::Storage& cpu, c10::DeviceIndex index) {
  auto* keep = new c10::Storage(cpu);
  c10::DataPtr data(
      const_cast<void*>(cpu.data()), keep,
      [](void* context) { delete static_cast<c10::Storage*>(context); },
      c10::Device(kNpu, index));
  return c10::Storage(c10::Storage::use_byte_size_t(), cpu.nbytes(), std::move(data),
                      &g_device_allocator, /*resizable=*/true);
}

at::Tensor device_tensor(c10::Storage storage, const at::Tensor& like) {
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), like.dtype());
  return with_layout(std::move(tensor), like);
}

// ---------------------------------------------------------------- the fallback

struct Call {
  c10::DeviceIndex index = -1;
  // npu tensors met in the arguments, with their CPU aliases (one alias per tensor).
  std::vector<std::pair<at::Tensor, at::Tensor>> tensors;
  // npu storages by address: a CPU result over one of these addresses is a view of it.
  std::unordered_map<const void*, c10::Storage> storages;
  // the host storage standing for each npu storage met
  std::unordered_map<const c10::StorageImpl*, c10::Storage> host_storages;
  // npu generators and the CPU twins the CPU kernel draws from.
  std::vector<std::pair<at::Generator, at::Generator>> generators;

  at::Generator twin_of(at::Generator generator) {
    at::Generator twin = at::make_generator<at::CPUGeneratorImpl>();
    std::lock_guard<std::mutex> lock(generator.mutex());
    twin.set_state(generator.get_state());
    generators.emplace_back(generator, twin);
    return twin;
  }

  // The npu generators take their twins' state: the draws advanced them.
  void advance_generators() {
    for (auto& [generator, twin] : generators) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(twin.get_state());
    }
  }

  at::Tensor to_host(const at::Tensor& tensor) {
    if (!tensor.defined() || tensor.device().type() != kNpu) {
      return tensor;
    }
    for (const auto& [device, host] : tensors) {
      if (device.unsafeGetTensorImpl() == tensor.unsafeGetTensorImpl()) {
        return host;
      }
    }
    if (index < 0) {
      index = tensor.device().index();
    }
    // Arguments sharing an npu storage share one host storage, so the CPU kernel's overlap
    // checks see what they would see on the device.
    auto shared = host_storages.find(tensor.storage().unsafeGetStorageImpl());
    if (shared == host_storages.end()) {
      shared = host_storages
                   .emplace(tensor.storage().unsafeGetStorageImpl(), host_storage(tensor.storage()))
                   .first;
    }
    at::Tensor host = host_alias(tensor, shared->second);
    tensors.emplace_back(tensor, host);
    if (tensor.storage().data() != nullptr) {
      storages.emplace(tensor.storage().data(), tensor.storage());
    }
    return host;
  }

  // `value` with every tensor in it (alone, in a tensor list or in a generic list) mapped.
  template <typename Map>
  static c10::IValue map_tensors(const c10::IValue& value, const Map& map) {
    if (value.isTensor()) {
      return map(value.toTensor());
    }
    if (value.isTensorList()) {
      std::vector<at::Tensor> out;
      for (const at::Tensor& tensor : value.toTensorVector()) {
        out.push_back(map(tensor));
      }
      return out;
    }
    if (value.isList()) {
      c10::impl::GenericList out(value.toList().elementType());
      for (const c10::IValue& element : value.toList()) {
        out.push_back(map_tensors(element, map));
      }
      return out;
    }
    return value;
  }

  c10::IValue argument_to_host(const c10::IValue& value) {
    if (value.isDevice() && value.toDevice().type() == kNpu) {
      if (index < 0) {
        index = value.toDevice().has_index() ? value.toDevice().index() : current_device();
      }
      return c10::Device(c10::DeviceType::CPU);
    }
    return map_tensors(value, [this](const at::Tensor& tensor) { return to_host(tensor); });
  }

  at::Tensor to_device(const at::Tensor& result) {
    if (!result.defined() || result.device().type() != c10::DeviceType::CPU) {
      return result;
    }
    for (const auto& [device, host] : tensors) {
      if (host.unsafeGetTensorImpl() == result.unsafeGetTensorImpl()) {
        return device;  // an in-place or out= operator returns its argument
      }
    }
    auto found = storages.find(result.storage().data());
    if (found != storages.end() && result.storage().data() != nullptr) {
      return device_tensor(found->second, result);  // a view of an argument
    }
    return device_tensor(device_storage_owning(result.storage(), index), result);
  }

  c10::IValue result_to_device(const c10::IValue& value) {
    return map_tensors(value, [this](const at::Tensor& tensor) { return to_device(tensor); });
  }

  // A CPU kernel that resized an out= argument moved its alias to new memory: the npu
  // tensor takes the new shape and the values.
  void write_back_moved() {
    for (auto& [device, host] : tensors) {
      const bool moved = host.storage().data() != device.storage().data() ||
                         host.sizes() != device.sizes() || host.strides() != device.strides() ||
                         host.storage_offset() != device.storage_offset();
      if (!moved) {
        continue;
      }
      if (host.sizes() != device.sizes()) {
        at::native::resize_(device, host.sizes(), std::nullopt);
      }
      if (host.storage().data() != device.storage().data()) {
        at::Tensor target = host_alias(device);
        target.copy_(host);
      }
    }
  }
};

void host_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_not_blocked(op.schema().operator_name().name);
  g_fallback_calls++;
  const size_t num_arguments = op.schema().arguments().size();
  auto arguments = torch::jit::last(stack, num_arguments);
  Call call;
  std::vector<c10::IValue> host_arguments;
  host_arguments.reserve(num_arguments);
  for (const c10::IValue& value : arguments) {
    host_arguments.push_back(call.argument_to_host(value));
  }
  if (call.index < 0) {
    call.index = current_device();
  }
  // Random draws: an npu generator's twin, and for `Generator? generator=None` the device's
  // default generator's (the CPU kernel would otherwise draw from the host's).
  const auto& schema_arguments = op.schema().arguments();
  for (size_t i = 0; i < num_arguments; ++i) {
    c10::IValue& value = host_arguments[i];
    if (value.isGenerator() && value.toGenerator().device().type() == kNpu) {
      value = call.twin_of(value.toGenerator());
    } else if (value.isNone() && schema_arguments[i].type()->str() == "Generator?" &&
               !call.tensors.empty()) {
      value = call.twin_of(default_generator(call.index));
    }
  }
  torch::jit::drop(stack, num_arguments);
  for (auto& value : host_arguments) {
    torch::jit::push(stack, std::move(value));
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  call.advance_generators();
  call.write_back_moved();
  const size_t num_returns = op.schema().returns().size();
  auto returns = torch::jit::last(stack, num_returns);
  std::vector<c10::IValue> device_returns;
  device_returns.reserve(num_returns);
  for (const c10::IValue& value : returns) {
    device_returns.push_back(call.result_to_device(value));
  }
  torch::jit::drop(stack, num_returns);
  for (auto& value : device_returns) {
    torch::jit::push(stack, std::move(value));
  }
}

// ---------------------------------------------------------------- kernels of the device itself

// The device a factory allocates on, after the checks every factory shares.
c10::Device factory_device(std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                           std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "npu (host stand-in): only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory),
              "npu (host stand-in): pinned memory is host memory; pin a CPU tensor");
  return c10::device_or_default(device);
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device, std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(factory_device(layout, device, pin_memory));
  return at::detail::empty_generic(size, &g_device_allocator,
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  const c10::DeviceGuard guard(factory_device(layout, device, pin_memory));
  return at::detail::empty_strided_generic(size, stride, &g_device_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage source, int64_t offset,
                                      c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::cpu::set_(self, source, offset, size, stride);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, source);
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_empty(at::Tensor& self) {
  return at::cpu::set_(self);
}

// A non-blocking copy from pageable host memory to the device: torch_npu queues it and the
// device reads the host memory when the stream reaches it. Here the copy is made at once, and
// the source goes to the check the Python side registered (`device/host_copies.py`), which
// refuses it if it is freed or overwritten before the host knows the stream passed the copy.
void report_pageable_copy(const at::Tensor& source, const at::Tensor& dst) {
  if (!source.device().is_cpu() || dst.device().type() != kNpu || source.is_pinned()) {
    return;
  }
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("npu_host::pageable_copy", "");
  if (op.hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
    op.typed<void(const at::Tensor&)>().call(source);
  }
}

// Copies between npu and cpu, and within npu: both sides as host tensors.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  check_not_blocked("a copy");
  if (non_blocking) {
    report_pageable_copy(self, dst);
  }
  Call call;
  at::Tensor source = call.to_host(self);
  at::Tensor target = call.to_host(dst);
  target.copy_(source, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  check_not_blocked("reading a value");
  return at::native::_local_scalar_dense_cpu(host_alias(self));
}

// ---------------------------------------------------------------- control and figures

at::Tensor host_view(const at::Tensor& self) {
  TORCH_CHECK(self.device().type() == kNpu, "npu_host::host_view: expected an npu tensor, got ",
              self.device());
  return host_alias(self);
}

void set_device(int64_t index) {
  check_index(index);
  g_current_device = static_cast<c10::DeviceIndex>(index);
}

int64_t get_device() {
  return current_device();
}

void set_device_count(int64_t count) {
  TORCH_CHECK(count >= 1 && count <= kMaxDevices, "npu_host::set_device_count: count ", count,
              " not in 1..", static_cast<int>(kMaxDevices));
  g_device_count = static_cast<c10::DeviceIndex>(count);
}

std::vector<int64_t> memory_figures() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mutex);
  return {l.device_bytes, l.device_peak, static_cast<int64_t>(l.device.size()),
          static_cast<int64_t>(l.pinned.size()), g_fallback_calls.load()};
}

void manual_seed(int64_t seed, int64_t device) {
  const c10::DeviceIndex first = device < 0 ? 0 : static_cast<c10::DeviceIndex>(device);
  const c10::DeviceIndex last = device < 0 ? kMaxDevices - 1 : first;
  for (c10::DeviceIndex index = first; index <= last; ++index) {
    at::Generator generator = default_generator(index);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(static_cast<uint64_t>(seed));
  }
}

int64_t initial_seed(int64_t device) {
  at::Generator generator = default_generator(static_cast<c10::DeviceIndex>(device));
  return static_cast<int64_t>(generator.current_seed());
}

void set_blocked(std::string reason) {
  std::lock_guard<std::mutex> lock(g_blocked_mutex);
  g_blocked = std::move(reason);
}

void reset_peak() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mutex);
  l.device_peak = l.device_bytes;
}

}  // namespace
}  // namespace npu_host

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(npu_host::empty_memory_format));
  m.impl("empty_strided", TORCH_FN(npu_host::empty_strided));
  m.impl("as_strided", TORCH_FN(npu_host::as_strided));
  m.impl("view", TORCH_FN(npu_host::view));
  m.impl("_reshape_alias", TORCH_FN(npu_host::reshape_alias));
  m.impl("resize_", TORCH_FN(npu_host::resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(npu_host::set_source_storage_offset));
  m.impl("set_.source_Storage", TORCH_FN(npu_host::set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(npu_host::set_source_tensor));
  m.impl("set_", TORCH_FN(npu_host::set_empty));
  m.impl("_copy_from", TORCH_FN(npu_host::copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(npu_host::copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(npu_host::local_scalar_dense));
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_host::host_fallback>());
}

TORCH_LIBRARY(npu_host, m) {
  m.def("host_view(Tensor(a) self) -> Tensor(a)");
  m.impl("host_view", c10::DispatchKey::PrivateUse1, TORCH_FN(npu_host::host_view));
  m.def("set_device(int index) -> ()", TORCH_FN(npu_host::set_device));
  m.def("current_device() -> int", TORCH_FN(npu_host::get_device));
  m.def("set_device_count(int count) -> ()", TORCH_FN(npu_host::set_device_count));
  m.def("memory_figures() -> int[]", TORCH_FN(npu_host::memory_figures));
  m.def("reset_peak() -> ()", TORCH_FN(npu_host::reset_peak));
  m.def("set_blocked(str reason) -> ()", TORCH_FN(npu_host::set_blocked));
  m.def("manual_seed(int seed, int device) -> ()", TORCH_FN(npu_host::manual_seed));
  m.def("initial_seed(int device) -> int", TORCH_FN(npu_host::initial_seed));
  // No kernel here: the Python side registers the CPU one (`device/host_copies.py`).
  m.def("pageable_copy(Tensor source) -> ()");
}
