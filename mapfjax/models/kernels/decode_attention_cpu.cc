// One decode step's attention on CPU, as an XLA FFI custom call (float32).
//
// Each row holds one query token of Q query heads per KV head; its keys are a prefix shared
// by the G rows of its group and the row's own cache, of which slots 0..index are filled.
// For every (group, KV head) the prefix block is read once for the group's rows, and only
// the filled slots of the own cache are read (the XLA form reads the whole window).
//
// Shapes: q [B, G, K, Q, D]; kp, vp [B, K, P, D]; valid (uint8) [B, P]; k, v [B * G, K, W, D]
// (the loop-carried caches as they are: a reshape there made XLA copy them every step);
// index int32 []; out [B, G, K, Q, D]. Scores are scaled by D^-1/2; a softmax over the valid
// prefix slots and own slots 0..index (probabilities normalised before the value sum, as in
// `qwen3._decode_attend`); a row with nothing to attend gets zeros.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxQ = 16;
constexpr int64_t kMaxD = 256;
// Masked scores: finite (the kernel is built with -ffast-math, which assumes no infinities).
constexpr float kMasked = -1e30f;

struct Dims {
  int64_t b, g, k, q, d, p, w, n;  // n: own slots read (index + 1, at most w)
};

// The functions below take the head dim as a template argument kD for the common sizes (the
// compiler then unrolls the inner loops; about 2x faster at D = 32) and 0 for any other, read
// from `d` at run time.

// Scores of the Q query heads against `count` keys [count, D]: s[h * stride + j].
template <int64_t kD>
inline void Scores(const float* q, int64_t nq, const float* keys, int64_t count, int64_t dyn_d,
                   float scale, float* s, int64_t stride) {
  const int64_t d = kD ? kD : dyn_d;
  for (int64_t j = 0; j < count; ++j) {
    const float* kj = keys + j * d;
    for (int64_t h = 0; h < nq; ++h) {
      const float* qh = q + h * d;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < d; ++i) acc += qh[i] * kj[i];
      s[h * stride + j] = acc * scale;
    }
  }
}

// acc[h * D + :] += sum_j p[h * stride + j] * values[j, :].
template <int64_t kD>
inline void Values(const float* p, int64_t stride, int64_t nq, const float* values,
                   int64_t count, int64_t dyn_d, float* acc) {
  const int64_t d = kD ? kD : dyn_d;
  for (int64_t j = 0; j < count; ++j) {
    const float* vj = values + j * d;
    for (int64_t h = 0; h < nq; ++h) {
      const float w = p[h * stride + j];
      float* ah = acc + h * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) ah[i] += w * vj[i];
    }
  }
}

// Rows of (group bi, KV head ki): all G rows, each with its Q query heads.
template <int64_t kD>
void Block(const Dims& s, int64_t bi, int64_t ki, const float* q, const float* kp,
           const float* vp, const uint8_t* valid, const float* k, const float* v, float* out,
           std::vector<float>& scores) {
  const int64_t d = kD ? kD : s.d, p = s.p, n = s.n, nq = s.q, len = s.p + s.n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float* kpb = kp + (bi * s.k + ki) * p * d;
  const float* vpb = vp + (bi * s.k + ki) * p * d;
  const uint8_t* ok = valid + bi * p;
  scores.resize(static_cast<size_t>(nq * len));
  float acc[kMaxQ * kMaxD];
  for (int64_t gi = 0; gi < s.g; ++gi) {
    const int64_t row = (bi * s.g + gi) * s.k + ki;  // q and out: [B, G, K, ...]
    const float* qr = q + row * nq * d;
    const float* kr = k + row * s.w * d;  // the caches: [B * G, K, W, D]
    const float* vr = v + row * s.w * d;
    float* sc = scores.data();
    Scores<kD>(qr, nq, kpb, p, d, scale, sc, len);
    Scores<kD>(qr, nq, kr, n, d, scale, sc + p, len);
    bool any = n > 0;
    for (int64_t j = 0; j < p; ++j) any = any || ok[j];
    for (int64_t h = 0; h < nq; ++h) {
      float* sh = sc + h * len;
      for (int64_t j = 0; j < p; ++j) sh[j] = ok[j] ? sh[j] : kMasked;
      float mx = kMasked;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < len; ++j) mx = std::max(mx, sh[j]);
      float total = 0.f;
#pragma omp simd reduction(+ : total)
      for (int64_t j = 0; j < len; ++j) {
        sh[j] = std::exp(sh[j] - mx);
        total += sh[j];
      }
      const float inv = any ? 1.0f / total : 0.f;
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) sh[j] *= inv;
    }
    std::fill(acc, acc + nq * d, 0.f);
    Values<kD>(sc, len, nq, vpb, p, d, acc);
    Values<kD>(sc + p, len, nq, vr, n, d, acc);
    std::copy(acc, acc + nq * d, out + row * nq * d);
  }
}

struct Work {
  Dims s;
  const float *q, *kp, *vp, *k, *v;
  const uint8_t* valid;
  float* out;
  int64_t blocks, chunk;
  std::atomic<int64_t> next{0}, done{0};

  void Run() {
    std::vector<float> scores;
    for (;;) {
      const int64_t start = next.fetch_add(chunk, std::memory_order_relaxed);
      if (start >= blocks) return;
      const int64_t end = std::min(blocks, start + chunk);
      for (int64_t i = start; i < end; ++i) {
        const int64_t bi = i / s.k, ki = i % s.k;
        switch (s.d) {
          case 32:
            Block<32>(s, bi, ki, q, kp, vp, valid, k, v, out, scores);
            break;
          case 64:
            Block<64>(s, bi, ki, q, kp, vp, valid, k, v, out, scores);
            break;
          case 128:
            Block<128>(s, bi, ki, q, kp, vp, valid, k, v, out, scores);
            break;
          default:
            Block<0>(s, bi, ki, q, kp, vp, valid, k, v, out, scores);
        }
      }
      done.fetch_add(end - start, std::memory_order_release);
    }
  }
};

ffi::Error DecodeAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                               ffi::Buffer<ffi::F32> kp, ffi::Buffer<ffi::F32> vp,
                               ffi::Buffer<ffi::U8> valid, ffi::Buffer<ffi::F32> k,
                               ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> index,
                               ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions();
  auto pd = kp.dimensions();
  auto kd = k.dimensions();
  if (qd.size() != 5 || pd.size() != 4 || kd.size() != 4)
    return ffi::Error::InvalidArgument("decode attention: expected q of rank 5, the rest of rank 4");
  Dims s{qd[0], qd[1], qd[2], qd[3], qd[4], pd[2], kd[2], 0};
  if (s.q > kMaxQ || s.d > kMaxD)
    return ffi::Error::InvalidArgument(
        "decode attention: at most 16 query heads per KV head and a head dim of at most 256");
  auto vd = valid.dimensions();
  if (pd[0] != s.b || pd[1] != s.k || pd[3] != s.d || kd[0] != s.b * s.g || kd[1] != s.k ||
      kd[3] != s.d || !(vp.dimensions() == pd) || !(v.dimensions() == kd) || vd.size() != 2 ||
      vd[0] != s.b || vd[1] != s.p || index.element_count() != 1)
    return ffi::Error::InvalidArgument(
        "decode attention: inconsistent shapes; expected q [B, G, K, Q, D], kp and vp "
        "[B, K, P, D], valid [B, P], k and v [B * G, K, W, D], one index");
  const int64_t idx = static_cast<int64_t>(index.typed_data()[0]);
  s.n = std::clamp<int64_t>(idx + 1, 0, s.w);
  // (group, KV head) blocks, taken in chunks from a shared counter by this thread and by
  // XLA's intra-op threads: a helper that starts late takes fewer, or none. The caller waits
  // for the blocks, not for the helpers (one that never starts cannot stall it); the state is
  // shared so a helper that starts after the call returned finds no block and exits.
  auto work = std::make_shared<Work>();
  work->s = s;
  work->q = q.typed_data();
  work->kp = kp.typed_data();
  work->vp = vp.typed_data();
  work->valid = valid.typed_data();
  work->k = k.typed_data();
  work->v = v.typed_data();
  work->out = out->typed_data();
  work->blocks = s.b * s.k;
  const int64_t threads =
      std::max<int64_t>(1, std::min<int64_t>(pool.num_threads(), work->blocks));
  work->chunk = std::max<int64_t>(1, work->blocks / (4 * threads));
  for (int64_t t = 1; t < threads; ++t) pool.Schedule([work] { work->Run(); });
  work->Run();
  while (work->done.load(std::memory_order_acquire) < work->blocks) {
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MapfjaxDecodeAttentionF32, DecodeAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::U8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
