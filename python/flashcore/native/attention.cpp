// The native autograd path: `flashcore_native::attention`, a PyTorch operator whose autograd
// rule is a C++ node, over FlashCore's Rust library (its C entry points, python/src/native.rs).
//
// Why C++: a Python torch.autograd.Function costs ~10 µs of host time a call, and handing a
// call's tensors to the extension through Python objects a few more, on calls whose kernels
// take microseconds (docs/python.md#speed). Here the node costs ~1 µs and each tensor's
// address and layout are read from the tensor itself.
//
// `flashcore/_native.py` compiles this file on first use with the host's C++ compiler
// against the installed torch (whose C++ ABI is not stable across versions, so no wheel can
// carry a built copy), caches the library, loads it and hands it the Rust entry points
// (`flashcore_native::connect`). Where that fails the package runs the Python path. Two
// operators, `attention` (dense batches) and `varlen_attention` (packed batches, flash_attn's
// varlen form), without dropout; everything else keeps the Python path.
// Arguments are checked by the Python caller and by the Rust library (whose errors arrive
// here as a status code and text, raised as the same Python exceptions as on the Python path).

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cstdint>
#include <exception>
#include <vector>

namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The C contract of python/src/native.rs: the same structs, field for field.
constexpr int64_t kAbiVersion = 5;

struct NativeTensor {
  uint64_t ptr;
  int64_t shape[4];
  int64_t strides[4];
  int32_t dtype;  // 0 f16, 1 bf16
};

struct NativeOptions {
  float softmax_scale;
  int32_t causal;
  int32_t window_left;
  int32_t window_right;
  int32_t attention_chunk;
  float softcap;
  int32_t num_splits;
  int32_t deterministic;
};

struct NativeVarlen {
  uint64_t cu_seqlens_q, cu_seqlens_q_len;
  uint64_t cu_seqlens_k, cu_seqlens_k_len;
  uint64_t seqused_k, seqused_k_len;
  int64_t max_seqlen_q, max_seqlen_k;
  int32_t packed;  // 0: a dense call (every field zero)
  int32_t check;
};

struct NativeScratch {
  uint64_t (*alloc)(void* ctx, size_t bytes);
  void* ctx;
};

struct NativeCall {
  int32_t device;
  uint64_t stream;
  NativeScratch scratch;
};

struct NativeForward {
  NativeCall call;
  NativeTensor q, k, v, o;
  uint64_t lse, lse_len, alibi, alibi_len;
  NativeOptions options;
  NativeVarlen varlen;
};

struct NativeBackward {
  NativeCall call;
  NativeTensor q, k, v, o, dout, dq, dk, dv;
  uint64_t lse, lse_len, alibi, alibi_len;
  NativeOptions options;
  NativeVarlen varlen;
};

using ForwardEntry = int32_t (*)(const NativeForward*, char*, size_t);
using BackwardEntry = int32_t (*)(const NativeBackward*, char*, size_t);
ForwardEntry forward_entry = nullptr;
BackwardEntry backward_entry = nullptr;

// A tensor as the Rust library reads it: `[B, S, H, D]`, or a packed batch's `[total, H, D]`
// with a leading 1 (its stride as `unsqueeze(0)` gives it).
NativeTensor describe(const Tensor& t, const char* name) {
  int64_t dims = t.dim();
  TORCH_CHECK_VALUE(dims == 4 || dims == 3, "`", name, "` must have 4 dims [B, S, H, D] or 3 [total, H, D], got ", t.sizes());
  NativeTensor d{};
  d.ptr = reinterpret_cast<uint64_t>(t.data_ptr());
  int first = 4 - static_cast<int>(dims);
  if (first == 1) {
    d.shape[0] = 1;
    d.strides[0] = t.size(0) * t.stride(0);
  }
  for (int i = 0; i < dims; ++i) {
    d.shape[first + i] = t.size(i);
    d.strides[first + i] = t.stride(i);
  }
  auto type = t.scalar_type();
  TORCH_CHECK_TYPE(type == at::kHalf || type == at::kBFloat16, "`", name, "` has dtype ", type, ": FlashCore takes float16 and bfloat16");
  d.dtype = type == at::kHalf ? 0 : 1;
  return d;
}

// Scratch memory from PyTorch's caching allocator on the call's device, held until the call
// returns (later work on the stream is ordered after it by the allocator); an allocation's
// exception is kept and rethrown as it is once the Rust call has returned.
struct Scratch {
  at::Device device;
  std::vector<Tensor> held;
  std::exception_ptr failure;

  static uint64_t alloc(void* ctx, size_t bytes) {
    auto* self = static_cast<Scratch*>(ctx);
    try {
      auto buffer = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(self->device));
      self->held.push_back(buffer);
      return reinterpret_cast<uint64_t>(buffer.data_ptr());
    } catch (...) {
      self->failure = std::current_exception();
      return 0;
    }
  }

  NativeScratch entry() { return NativeScratch{&Scratch::alloc, this}; }
};

// PyTorch's current stream of `device`, as the raw handle the Rust library launches on.
uint64_t current_stream(at::Device device) {
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  return reinterpret_cast<uint64_t>(impl.getStream(device).native_handle());
}

NativeCall call_on(const Tensor& q, Scratch& scratch) {
  return NativeCall{static_cast<int32_t>(q.get_device()), current_stream(q.device()), scratch.entry()};
}

// Raises the Rust library's error as the Python path would: TypeError, ValueError,
// NotImplementedError or RuntimeError with its text (status 5, an untrusted kernel cache, too:
// c10 has no PermissionError); a scratch allocation's own exception first.
void raise_status(int32_t status, const char* message, const Scratch& scratch) {
  if (scratch.failure) std::rethrow_exception(scratch.failure);
  switch (status) {
    case 1: TORCH_CHECK_TYPE(false, message);
    case 2: TORCH_CHECK_VALUE(false, message);
    case 3: TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    default: TORCH_CHECK(false, message);
  }
}

void check_connected() {
  TORCH_CHECK(forward_entry != nullptr && backward_entry != nullptr,
              "flashcore_native: not connected to the extension (flashcore._native connects it on load)");
}

// A packed batch's vectors, held by the call (and by the autograd node for the backward);
// `cu_seqlens_q` undefined for a dense call. Checked by the Python caller (dtype, device,
// dims) and by the Rust library (their extents against the tensors).
struct Packed {
  Tensor cu_seqlens_q, cu_seqlens_k, seqused_k;  // seqused_k undefined where absent
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  bool check = false;  // FLASHCORE_CHECK_VARLEN: the Rust library checks the values first

  bool defined() const { return cu_seqlens_q.defined(); }

  NativeVarlen native() const {
    NativeVarlen n{};
    if (!defined()) return n;
    n.cu_seqlens_q = reinterpret_cast<uint64_t>(cu_seqlens_q.data_ptr());
    n.cu_seqlens_q_len = static_cast<uint64_t>(cu_seqlens_q.numel());
    n.cu_seqlens_k = reinterpret_cast<uint64_t>(cu_seqlens_k.data_ptr());
    n.cu_seqlens_k_len = static_cast<uint64_t>(cu_seqlens_k.numel());
    if (seqused_k.defined()) {
      n.seqused_k = reinterpret_cast<uint64_t>(seqused_k.data_ptr());
      n.seqused_k_len = static_cast<uint64_t>(seqused_k.numel());
    }
    n.max_seqlen_q = max_seqlen_q, n.max_seqlen_k = max_seqlen_k;
    n.packed = 1;
    n.check = check;
    return n;
  }

  // Kept in (and read back from) the autograd context's saved data; nothing for a dense call
  // (six map entries cost ~0.5 µs a call).
  void save(torch::autograd::AutogradContext* ctx) const {
    if (!defined()) return;
    auto& data = ctx->saved_data;
    data["cu_seqlens_q"] = cu_seqlens_q, data["cu_seqlens_k"] = cu_seqlens_k, data["seqused_k"] = seqused_k;
    data["max_seqlen_q"] = max_seqlen_q, data["max_seqlen_k"] = max_seqlen_k, data["check"] = check;
  }

  static Packed saved(torch::autograd::AutogradContext* ctx) {
    auto& data = ctx->saved_data;
    if (data.find("cu_seqlens_q") == data.end()) return Packed{};
    auto tensor = [&](const char* key) { return data[key].isTensor() ? data[key].toTensor() : Tensor(); };
    return Packed{tensor("cu_seqlens_q"), tensor("cu_seqlens_k"), tensor("seqused_k"), data["max_seqlen_q"].toInt(),
                  data["max_seqlen_k"].toInt(), data["check"].toBool()};
  }
};

// A chunk past int32 is sent as -1, which the Rust library refuses by name (as too long).
NativeOptions options_of(double scale, bool causal, int64_t window_left, int64_t window_right, int64_t attention_chunk,
                         double softcap, int64_t num_splits, bool deterministic) {
  const int32_t chunk = attention_chunk >= 0 && attention_chunk <= INT32_MAX ? static_cast<int32_t>(attention_chunk) : -1;
  return NativeOptions{static_cast<float>(scale), causal, static_cast<int32_t>(window_left), static_cast<int32_t>(window_right), chunk,
                       static_cast<float>(softcap), static_cast<int32_t>(num_splits), deterministic};
}

// What a forward and a backward both pass (`NativeForward`, `NativeBackward`): where the call
// runs, q, k, v, o, the lse (none where undefined) and ALiBi's slopes (none where absent).
template <typename Args>
void describe_call(Args& args, Scratch& scratch, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                   const std::optional<Tensor>& alibi_slopes) {
  args.call = call_on(q, scratch);
  args.q = describe(q, "q");
  args.k = describe(k, "k");
  args.v = describe(v, "v");
  args.o = describe(o, "o");
  if (lse.defined()) {
    args.lse = reinterpret_cast<uint64_t>(lse.data_ptr());
    args.lse_len = static_cast<uint64_t>(lse.numel());
  }
  if (alibi_slopes.has_value()) {
    args.alibi = reinterpret_cast<uint64_t>(alibi_slopes->data_ptr());
    args.alibi_len = static_cast<uint64_t>(alibi_slopes->numel());
  }
}

// The forward: `(o, lse)`, lse undefined (None) unless `want_lse`; `[B, Hq, Sq]`, or `[Hq,
// total_q]` for a packed batch. An empty batch or no keys is the core's to answer
// (`ProblemShape::has_no_pairs`: o = 0, lse = -inf where they have elements), as for every binding.
std::tuple<Tensor, Tensor> run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Packed& packed,
                                       const NativeOptions& options, bool want_lse, const std::optional<Tensor>& alibi_slopes) {
  check_connected();
  int64_t dims = packed.defined() ? 3 : 4;
  TORCH_CHECK_VALUE(q.dim() == dims && k.dim() == dims, "`q` and `k` must have ", dims, " dims: ", packed.defined() ? "[total, H, D]" : "[B, S, H, D]");
  auto o = at::empty(q.sizes(), q.options());
  Tensor lse;
  if (want_lse) {
    auto rows = packed.defined() ? std::vector<int64_t>{q.size(1), q.size(0)} : std::vector<int64_t>{q.size(0), q.size(2), q.size(1)};
    lse = at::empty(rows, q.options().dtype(at::kFloat));
  }
  Scratch scratch{q.device(), {}, nullptr};
  NativeForward args{};
  describe_call(args, scratch, q, k, v, o, lse, alibi_slopes);
  args.options = options;
  args.varlen = packed.native();
  char message[2048];
  int32_t status = forward_entry(&args, message, sizeof message);
  if (status != 0) raise_status(status, message, scratch);
  return {o, lse};
}

// The backward of `forward`: gradients laid out like q, k, v (dk, dv summed over the query
// heads that share a KV head; all zero without (query, key) pairs, the core's rule).
std::tuple<Tensor, Tensor, Tensor> run_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,
                                                Tensor dout, const Packed& packed, const NativeOptions& options,
                                                const std::optional<Tensor>& alibi_slopes) {
  check_connected();
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  if (dout.stride(-1) != 1) dout = dout.contiguous();  // autograd may hand over any layout; the kernels read rows
  Scratch scratch{q.device(), {}, nullptr};
  NativeBackward args{};
  describe_call(args, scratch, q, k, v, o, lse, alibi_slopes);
  args.dout = describe(dout, "dout");
  args.dq = describe(dq, "dq");
  args.dk = describe(dk, "dk");
  args.dv = describe(dv, "dv");
  args.options = options;
  args.varlen = packed.native();
  char message[2048];
  int32_t status = backward_entry(&args, message, sizeof message);
  if (status != 0) raise_status(status, message, scratch);
  return {dq, dk, dv};
}

// The autograd node of both operators: saves q, k, v, o, lse, ALiBi's slopes, the options and
// a packed batch's vectors; lse has no gradient, and an unused o gets none (no zeros
// materialised).
struct Attention : public torch::autograd::Function<Attention> {
  static constexpr size_t kInputs = 6;  // forward's arguments after ctx: one gradient (or none) each

  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Packed& packed,
                               const NativeOptions& options, const std::optional<Tensor>& alibi_slopes) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [o, lse] = run_forward(q, k, v, packed, options, true, alibi_slopes);
    ctx->save_for_backward({q, k, v, o, lse, alibi_slopes.value_or(Tensor())});
    auto& saved = ctx->saved_data;
    saved["scale"] = options.softmax_scale, saved["causal"] = options.causal != 0, saved["deterministic"] = options.deterministic != 0;
    saved["window_left"] = options.window_left, saved["window_right"] = options.window_right, saved["softcap"] = options.softcap;
    saved["attention_chunk"] = options.attention_chunk;
    packed.save(ctx);
    ctx->mark_non_differentiable({lse});
    ctx->set_materialize_grads(false);
    return {o, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(kInputs);  // the loss did not use o
    auto saved = ctx->get_saved_variables();
    auto& data = ctx->saved_data;
    auto options = options_of(data["scale"].toDouble(), data["causal"].toBool(), data["window_left"].toInt(), data["window_right"].toInt(),
                              data["attention_chunk"].toInt(), data["softcap"].toDouble(), 0, data["deterministic"].toBool());
    std::optional<Tensor> alibi = saved[5].defined() ? std::optional<Tensor>(saved[5]) : std::nullopt;
    auto [dq, dk, dv] = run_backward(saved[0], saved[1], saved[2], saved[3], saved[4], grads[0], Packed::saved(ctx), options, alibi);
    variable_list out(kInputs);
    out[0] = dq, out[1] = dk, out[2] = dv;
    return out;
  }
};

// A call with autograd's node where autograd records (grad mode on, an input requiring a
// gradient), else the forward alone.
std::tuple<Tensor, Tensor> attend(const Tensor& q, const Tensor& k, const Tensor& v, const Packed& packed, const NativeOptions& options,
                                  bool want_lse, const std::optional<Tensor>& alibi_slopes) {
  bool records = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (!records) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return run_forward(q, k, v, packed, options, want_lse, alibi_slopes);
  }
  auto out = Attention::apply(q, k, v, packed, options, alibi_slopes);
  return {out[0], out[1]};
}

// The operators' bodies, one for each kernel key: `Run` is `run_forward` (CUDA: no autograd)
// or `attend` (Autograd: the node where autograd records).
using Runner = std::tuple<Tensor, Tensor> (*)(const Tensor&, const Tensor&, const Tensor&, const Packed&, const NativeOptions&, bool,
                                              const std::optional<Tensor>&);

template <Runner Run>
std::tuple<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal, int64_t window_left,
                                     int64_t window_right, int64_t attention_chunk, double softcap, int64_t num_splits, bool deterministic,
                                     bool want_lse, const std::optional<Tensor>& alibi_slopes) {
  auto options = options_of(scale, causal, window_left, window_right, attention_chunk, softcap, num_splits, deterministic);
  return Run(q, k, v, Packed{}, options, want_lse, alibi_slopes);
}

template <Runner Run>
std::tuple<Tensor, Tensor> varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q,
                                            const Tensor& cu_seqlens_k, const std::optional<Tensor>& seqused_k, int64_t max_seqlen_q,
                                            int64_t max_seqlen_k, bool check, double scale, bool causal, int64_t window_left,
                                            int64_t window_right, int64_t attention_chunk, double softcap, bool deterministic,
                                            bool want_lse, const std::optional<Tensor>& alibi_slopes) {
  Packed packed{cu_seqlens_q, cu_seqlens_k, seqused_k.value_or(Tensor()), max_seqlen_q, max_seqlen_k, check};
  auto options = options_of(scale, causal, window_left, window_right, attention_chunk, softcap, 0, deterministic);
  return Run(q, k, v, packed, options, want_lse, alibi_slopes);
}

void connect(int64_t abi_version, int64_t forward_address, int64_t backward_address) {
  TORCH_CHECK(abi_version == kAbiVersion, "flashcore_native: the extension's entry points are of ABI version ", abi_version,
              ", this library's ", kAbiVersion, " (a stale build: delete it from the cache)");
  forward_entry = reinterpret_cast<ForwardEntry>(static_cast<uintptr_t>(forward_address));
  backward_entry = reinterpret_cast<BackwardEntry>(static_cast<uintptr_t>(backward_address));
}

int64_t stream_of(const Tensor& t) { return static_cast<int64_t>(current_stream(t.device())); }

}  // namespace

TORCH_LIBRARY(flashcore_native, m) {
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_left, int window_right, "
      "int attention_chunk, float softcap, int num_splits, bool deterministic, bool want_lse, Tensor? alibi_slopes) -> (Tensor, Tensor)");
  m.def(
      "varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_k, "
      "int max_seqlen_q, int max_seqlen_k, bool check, float softmax_scale, bool causal, int window_left, int window_right, "
      "int attention_chunk, float softcap, bool deterministic, bool want_lse, Tensor? alibi_slopes) -> (Tensor, Tensor)");
  m.def("connect(int abi_version, int forward, int backward) -> ()", &connect);
  // The raw stream the operator launches on, for the tests (PyTorch's current stream).
  m.def("stream_of(Tensor t) -> int", &stream_of);
}

TORCH_LIBRARY_IMPL(flashcore_native, CUDA, m) {
  m.impl("attention", &attention<run_forward>);
  m.impl("varlen_attention", &varlen_attention<run_forward>);
}

TORCH_LIBRARY_IMPL(flashcore_native, Autograd, m) {
  m.impl("attention", &attention<attend>);
  m.impl("varlen_attention", &varlen_attention<attend>);
}
