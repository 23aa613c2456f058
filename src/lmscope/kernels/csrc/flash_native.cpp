// lmscope's FlashAttention autograd Function in C++: the eager host path of a call whose kernels
// Python has already tuned and compiled (lmscope/kernels/flash_native.py builds and feeds it).
//
// Why: a Python autograd.Function with three Triton launches costs more host time per
// forward+backward than SDPA's whole C++ path (docs/kernels/flash_attention_host_notes.md).
// Here the forward (allocate O and L, one launch) and the backward (allocate dQ, dK, dV, two
// launches) run in C++, the backward on the autograd engine's thread without the GIL.
//
// What Python hands over per input signature (``add_plan``): the example q, k, v and causal
// (shapes, strides, dtype, device: what a later call must match exactly), O's strides, the
// float32 buffer's size and D's offset in it, the dO strides the backward kernels were built
// for, the separate mode's dQ-accumulator argument, and per kernel the CUfunction Triton
// loaded, its grid, threads, shared memory and its parameter slots: a table index of a tensor
// (whose data pointer fills the slot) or constant bits (strides, scalars, Triton's scratch
// pointers). ``apply`` returns None where no plan matches; Python then takes its own path.

#include <torch/extension.h>
#include <pybind11/stl.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace {

// The driver API, resolved from libcuda at first use (no link-time dependency on it).
using CuResult = int;
struct Driver {
  CuResult (*launch_kernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, void*, void**, void**);
  CuResult (*ctx_get_current)(void**);
  CuResult (*ctx_set_current)(void*);
  CuResult (*device_get)(int*, int);
  CuResult (*primary_ctx_retain)(void**, int);
};

template <typename F>
void resolve(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  TORCH_CHECK(fn != nullptr, "lmscope flash native: no ", name, " in libcuda.so.1");
}

const Driver& driver() {
  static const Driver d = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(lib != nullptr, "lmscope flash native: cannot open libcuda.so.1");
    Driver found{};
    resolve(lib, "cuLaunchKernel", found.launch_kernel);
    resolve(lib, "cuCtxGetCurrent", found.ctx_get_current);
    resolve(lib, "cuCtxSetCurrent", found.ctx_set_current);
    resolve(lib, "cuDeviceGet", found.device_get);
    resolve(lib, "cuDevicePrimaryCtxRetain", found.primary_ctx_retain);
    return found;
  }();
  return d;
}

// A thread that has run no CUDA runtime call may have no current context (the caching allocator
// can serve it without one): bind the device's primary context, as Triton's launcher does.
void ensure_context(const c10::Device& device) {
  const Driver& d = driver();
  void* ctx = nullptr;
  TORCH_CHECK(d.ctx_get_current(&ctx) == 0, "lmscope flash native: cuCtxGetCurrent failed");
  if (ctx != nullptr) return;
  int handle = 0;
  TORCH_CHECK(d.device_get(&handle, device.index()) == 0, "lmscope flash native: cuDeviceGet failed");
  TORCH_CHECK(d.primary_ctx_retain(&ctx, handle) == 0 && d.ctx_set_current(ctx) == 0,
              "lmscope flash native: cannot make the device's primary context current");
}

// Tensor table: the slots of every launch point into it.
enum Slot : int { Q, K, V, O, L, D, DO, DQ, DK, DV, DQ_ACC, N_TENSORS };
constexpr size_t kMaxParams = 64;

struct LaunchSpec {
  void* function = nullptr;  // CUfunction
  unsigned grid_x = 0, grid_y = 0, threads = 0, shared = 0;
  std::vector<int64_t> slot_tensor;  // table index, or -1: slot_value holds the bits
  std::vector<uint64_t> slot_value;
};

using LaunchTuple = std::tuple<uint64_t, int64_t, int64_t, int64_t, int64_t,
                               std::vector<int64_t>, std::vector<uint64_t>>;

LaunchSpec to_spec(const LaunchTuple& t) {
  LaunchSpec s;
  s.function = reinterpret_cast<void*>(std::get<0>(t));
  s.grid_x = static_cast<unsigned>(std::get<1>(t));
  s.grid_y = static_cast<unsigned>(std::get<2>(t));
  s.threads = static_cast<unsigned>(std::get<3>(t));
  s.shared = static_cast<unsigned>(std::get<4>(t));
  s.slot_tensor = std::get<5>(t);
  s.slot_value = std::get<6>(t);
  TORCH_CHECK(s.slot_tensor.size() == s.slot_value.size() && s.slot_tensor.size() <= kMaxParams,
              "lmscope flash native: bad parameter slots");
  for (int64_t i : s.slot_tensor) {
    TORCH_CHECK(i >= -1 && i < N_TENSORS, "lmscope flash native: bad tensor slot ", i);
  }
  return s;
}

void launch(const LaunchSpec& s, const std::array<uint64_t, N_TENSORS>& ptrs, void* stream) {
  if (s.grid_x == 0 || s.grid_y == 0) return;  // nothing to do; Triton skips such launches too
  std::array<uint64_t, kMaxParams> storage;
  std::array<void*, kMaxParams> params;
  const size_t n = s.slot_tensor.size();
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = s.slot_tensor[i];
    storage[i] = t >= 0 ? ptrs[t] : s.slot_value[i];
    params[i] = &storage[i];
  }
  const CuResult r = driver().launch_kernel(s.function, s.grid_x, s.grid_y, 1, s.threads, 1, 1,
                                        s.shared, stream, params.data(), nullptr);
  TORCH_CHECK(r == 0, "lmscope flash native: cuLaunchKernel failed with CUresult ", r);
}

uint64_t ptr(const at::Tensor& t) { return reinterpret_cast<uint64_t>(t.data_ptr()); }
bool aligned(const at::Tensor& t) { return ptr(t) % 16 == 0; }

struct NativePlan : torch::CustomClassHolder {
  std::vector<int64_t> q_sizes, q_strides, k_sizes, k_strides, v_sizes, v_strides;
  at::ScalarType dtype;
  c10::Device device{c10::kCUDA};
  bool causal = false;
  std::vector<int64_t> o_strides;  // empty: contiguous
  int64_t buffer_numel = 0;        // L, then D at d_offset (floats)
  int64_t d_offset = 0;
  std::vector<int64_t> l_sizes, l_strides;  // L's view of the buffer's head: q's sizes without d
  std::vector<int64_t> do_strides;  // the dO layout the backward kernels were built for
  at::Tensor dq_acc;                // never read or written by the separate mode's kernels
  LaunchSpec fwd, dq, dkdv;

  bool matches(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool c) const {
    return c == causal && q.scalar_type() == dtype && k.scalar_type() == dtype &&
           v.scalar_type() == dtype && q.device() == device && k.device() == device &&
           v.device() == device && q.sizes() == q_sizes && q.strides() == q_strides &&
           k.sizes() == k_sizes && k.strides() == k_strides && v.sizes() == v_sizes &&
           v.strides() == v_strides;
  }
};

std::vector<c10::intrusive_ptr<NativePlan>>& plans() {
  static std::vector<c10::intrusive_ptr<NativePlan>> kept;
  return kept;
}
constexpr size_t kMaxPlans = 64;  // as many as Python keeps (_MAX_PLANS); cleared when full

// The tensor table's entries that the forward fills (the backward adds D, dO, dQ, dK, dV, DQ_ACC).
std::array<uint64_t, N_TENSORS> forward_table(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& o, const at::Tensor& buffer) {
  std::array<uint64_t, N_TENSORS> ptrs{};
  ptrs[Q] = ptr(q);
  ptrs[K] = ptr(k);
  ptrs[V] = ptr(v);
  ptrs[O] = ptr(o);
  ptrs[L] = ptr(buffer);
  return ptrs;
}

// The current CUDA stream through c10's device-generic interface (no CUDA headers needed).
void* current_stream(const c10::Device& device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device).native_handle();
}

}  // namespace

namespace lmscope {

// Named outside the anonymous namespace: its autograd node is "lmscope::FlashAttentionTritonNative".
struct FlashAttentionTritonNative : public torch::autograd::Function<FlashAttentionTritonNative> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v,
                            const c10::intrusive_ptr<NativePlan>& plan) {
    c10::DeviceGuard guard(plan->device);
    ensure_context(plan->device);
    const auto options = q.options();
    at::Tensor o = plan->o_strides.empty() ? at::empty(q.sizes(), options)
                                           : at::empty_strided(q.sizes(), plan->o_strides, options);
    at::Tensor buffer = at::empty({plan->buffer_numel}, options.dtype(at::kFloat));
    const auto ptrs = forward_table(q, k, v, o, buffer);
    launch(plan->fwd, ptrs, current_stream(plan->device));
    // L saved as its own (..., n_queries) view (the documented contract), beside the buffer
    ctx->save_for_backward({q, k, v, o, buffer.as_strided(plan->l_sizes, plan->l_strides), buffer});
    ctx->saved_data["plan"] = c10::IValue::make_capsule(plan);
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto plan = c10::static_intrusive_pointer_cast<NativePlan>(ctx->saved_data["plan"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &buffer = saved[5];
    c10::DeviceGuard guard(plan->device);
    ensure_context(plan->device);
    at::Tensor d_o = grads[0];
    if (d_o.scalar_type() != plan->dtype) d_o = d_o.to(plan->dtype);
    if (d_o.strides() != plan->do_strides || !aligned(d_o)) {
      // Another layout than the kernels were built for (their strides are fixed arguments):
      // the same values in that layout.
      at::Tensor copy = at::empty_strided(d_o.sizes(), plan->do_strides, d_o.options());
      copy.copy_(d_o);
      d_o = copy;
    }
    const auto options = q.options();
    at::Tensor dq = at::empty(q.sizes(), options);
    at::Tensor dk = at::empty(k.sizes(), options);
    at::Tensor dv = at::empty(k.sizes(), options);
    auto ptrs = forward_table(q, k, v, o, buffer);
    ptrs[D] = ptr(buffer) + static_cast<uint64_t>(plan->d_offset) * sizeof(float);
    ptrs[DO] = ptr(d_o);
    ptrs[DQ] = ptr(dq);
    ptrs[DK] = ptr(dk);
    ptrs[DV] = ptr(dv);
    ptrs[DQ_ACC] = ptr(plan->dq_acc);
    void* stream = current_stream(plan->device);
    launch(plan->dq, ptrs, stream);  // also stores D for the dK/dV kernel
    launch(plan->dkdv, ptrs, stream);
    return {dq, dk, dv, at::Tensor()};
  }
};

}  // namespace lmscope

namespace {

std::vector<int64_t> vec(at::IntArrayRef a) { return a.vec(); }

int64_t add_plan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                 std::vector<int64_t> o_strides, int64_t buffer_numel, int64_t d_offset,
                 std::vector<int64_t> do_strides, const at::Tensor& dq_acc,
                 const LaunchTuple& fwd, const LaunchTuple& dq, const LaunchTuple& dkdv) {
  TORCH_CHECK(q.is_cuda(), "lmscope flash native: CUDA tensors only");
  driver();  // a missing driver entry point fails here, where Python falls back, not in a call
  TORCH_CHECK(do_strides.size() == static_cast<size_t>(q.dim()),
              "lmscope flash native: dO strides must have q's rank");
  auto plan = c10::make_intrusive<NativePlan>();
  plan->q_sizes = vec(q.sizes());
  plan->q_strides = vec(q.strides());
  plan->k_sizes = vec(k.sizes());
  plan->k_strides = vec(k.strides());
  plan->v_sizes = vec(v.sizes());
  plan->v_strides = vec(v.strides());
  plan->dtype = q.scalar_type();
  plan->device = q.device();
  plan->causal = causal;
  plan->o_strides = std::move(o_strides);
  plan->buffer_numel = buffer_numel;
  plan->d_offset = d_offset;
  plan->l_sizes.assign(q.sizes().begin(), q.sizes().end() - 1);
  plan->l_strides.assign(plan->l_sizes.size(), 1);
  for (int64_t i = static_cast<int64_t>(plan->l_sizes.size()) - 2; i >= 0; --i) {
    plan->l_strides[i] = plan->l_strides[i + 1] * plan->l_sizes[i + 1];
  }
  plan->do_strides = std::move(do_strides);
  plan->dq_acc = dq_acc;
  plan->fwd = to_spec(fwd);
  plan->dq = to_spec(dq);
  plan->dkdv = to_spec(dkdv);
  auto& kept = plans();
  for (auto it = kept.begin(); it != kept.end(); ++it) {
    if ((*it)->matches(q, k, v, causal)) {  // a newer plan for the same signature replaces it
      kept.erase(it);
      break;
    }
  }
  if (kept.size() >= kMaxPlans) kept.clear();
  kept.push_back(plan);
  return static_cast<int64_t>(kept.size());
}

std::optional<at::Tensor> apply(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                bool causal) {
  for (const auto& plan : plans()) {
    if (plan->matches(q, k, v, causal)) {
      if (!aligned(q) || !aligned(k) || !aligned(v)) return std::nullopt;  // another binary
      return lmscope::FlashAttentionTritonNative::apply(q, k, v, plan);
    }
  }
  return std::nullopt;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "lmscope FlashAttention: the eager host path in C++ (see flash_native.py)";
  m.def("add_plan", &add_plan, "Keep a plan for one input signature; returns how many are kept");
  m.def("apply", &apply, "O for q, k, v, causal through the kept plan, or None where none matches");
  m.def("clear", [] { plans().clear(); }, "Forget every plan");
  m.def("n_plans", [] { return static_cast<int64_t>(plans().size()); }, "How many plans are kept");
}
