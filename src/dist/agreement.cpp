#include "dist/agreement.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string_view>

namespace stsa::dist::detail {
namespace {

using ::stsa::detail::concat;

constexpr std::size_t kMessageBytes = 240;

// What every rank must agree on, as integers, with names for the messages.
enum Field : std::size_t {
  kBatch, kFrames, kHeight, kWidth, kText, kTextPlacement, kHeads, kKvHeads, kHeadDim, kInDtype, kOutDtype, kWithLse,
  kMaskHash, kRouterHash, kScaleBits, kDescaleHash, kTileRows, kTileCols, kAlignment, kBackendHash, kFieldCount
};
constexpr std::array<std::string_view, kFieldCount> kFieldNames{
    "batch", "frames", "height", "width", "text tokens", "text placement", "heads", "K/V heads", "head dim",
    "input dtype",
    "output dtype", "whether LSE is wanted", "head masks", "router options", "softmax scale", "descales", "tile rows",
    "tile columns", "alignment", "backend"};

constexpr std::int64_t kAnyLse = -1;  // kWithLse of a rank that holds no output row

struct Descriptor {
  std::int64_t ok = 0;
  std::array<std::int64_t, kFieldCount> fields{};
  char message[kMessageBytes] = {};  // this rank's own error, NUL-terminated
};

std::int64_t fnv1a(std::int64_t hash, std::int64_t value) {
  auto h = std::uint64_t(hash);
  for (int byte = 0; byte < 8; ++byte) {
    h ^= (std::uint64_t(value) >> (8 * byte)) & 0xffu;
    h *= 0x100000001b3ull;
  }
  return std::int64_t(h);
}

std::int64_t hash_masks(const std::vector<MaskSpec>& masks) {
  std::int64_t h = std::int64_t(0xcbf29ce484222325ull);
  for (const MaskSpec& m : masks) {
    for (std::int64_t value : {std::int64_t(m.kind), std::int64_t(m.band_order), m.band, m.frame_radius,
                               std::int64_t(m.anchor)})
      h = fnv1a(h, value);
  }
  return h;
}

std::int64_t hash_router(const Router* router) {
  if (router == nullptr) return 0;
  const RouterOptions& o = router->options();
  std::int64_t h = std::int64_t(0xcbf29ce484222325ull);
  for (double value : {o.spatial_density, o.temporal_density, o.frame_window_density, o.max_rel_l2}) {
    std::int64_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    h = fnv1a(h, bits);
  }
  for (std::int64_t value : {std::int64_t(o.samples), std::int64_t(o.try_frame_window), std::int64_t(o.anchor),
                             std::int64_t(o.seed)})
    h = fnv1a(h, value);
  return h;
}

// Which descales are given and their values' bits (every rank holds all B x H of each).
std::int64_t hash_descales(const Descales& descales) {
  std::int64_t h = std::int64_t(0xcbf29ce484222325ull);
  for (std::span<const float> values : {descales.q, descales.k, descales.v}) {
    h = fnv1a(h, std::int64_t(values.size()));
    for (float value : values) {
      std::int32_t bits = 0;
      std::memcpy(&bits, &value, sizeof bits);
      h = fnv1a(h, bits);
    }
  }
  return h;
}

std::int64_t hash_name(std::string_view name) {
  std::int64_t h = std::int64_t(0xcbf29ce484222325ull);
  for (char c : name) h = fnv1a(h, std::int64_t(static_cast<unsigned char>(c)));
  return h;
}

std::string shape_text(const TensorView& t) {
  return concat("[", t.shape[0], ", ", t.shape[1], ", ", t.shape[2], ", ", t.shape[3], "]");
}

void check_view(const char* name, const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, std::int64_t d) {
  const std::array<std::int64_t, 4> expected{b, n, h, d};
  STSA_CHECK(t.shape == expected, InvalidArgument, name, " has shape ", shape_text(t), ", expected [B, tokens, H, D] = [",
             b, ", ", n, ", ", h, ", ", d, "]");
  if (b * n * h * d == 0) return;  // a rank without tokens: nothing is read or written there
  STSA_CHECK(t.data != nullptr, InvalidArgument, name, " is null");
  validate_view_memory(name, t);
}

void check_lse(const char* name, const LseView& l, std::int64_t b, std::int64_t h, std::int64_t n) {
  const std::array<std::int64_t, 3> expected{b, h, n};
  STSA_CHECK(l.shape == expected, InvalidArgument, name, " has shape [", l.shape[0], ", ", l.shape[1], ", ",
             l.shape[2], "], expected [B, H, tokens] = [", b, ", ", h, ", ", n, "]");
  if (b * h * n > 0) validate_lse_memory(name, l);
}

// Everything one rank can check alone; throws InvalidArgument.
void check_local(const Communicator& comm, const UlyssesCall& call) {
  const VideoLayout& layout = call.layout;
  layout.validate();
  call.tile.validate();
  if (call.router != nullptr) {
    STSA_CHECK(call.masks.empty(), InvalidArgument, "give masks or a router, not both");
    call.router->options().validate();
  } else {
    STSA_CHECK(call.masks.size() == 1 || std::int64_t(call.masks.size()) == layout.heads, InvalidArgument, "got ",
               call.masks.size(), " masks for ", layout.heads, " heads (give one per head, or one for all)");
  }
  for (const MaskSpec& m : call.masks) m.validate(layout.grid);
  const std::int64_t b = layout.batch, h = layout.heads, d = layout.head_dim;
  const Shard shard = sequence_shard(layout.grid.video_tokens(), comm.size(), comm.rank());
  STSA_CHECK(call.q.tokens() == shard.count, InvalidArgument, "q holds ", call.q.tokens(), " video tokens but rank ",
             comm.rank(), " of ", comm.size(), " should hold ", shard.count, " (frame-major video tokens [",
             shard.begin, ", ", shard.end(), ") of ", layout.grid.video_tokens(), ")");
  check_view("q", call.q, b, shard.count, h, d);
  check_kv_head_counts("", call.k.heads(), call.v.heads(), h);  // grouped-query attention
  const std::int64_t kv_heads = call.k.heads();
  check_view("k", call.k, b, shard.count, kv_heads, d);
  check_view("v", call.v, b, shard.count, kv_heads, d);
  check_view("o", call.o, b, shard.count, h, d);
  STSA_CHECK(call.q.dtype == call.k.dtype && call.k.dtype == call.v.dtype, InvalidArgument,
             "q, k and v must share a dtype, got ", to_string(call.q.dtype), ", ", to_string(call.k.dtype), ", ",
             to_string(call.v.dtype));
  STSA_CHECK(is_output_dtype(call.o.dtype), InvalidArgument, "o must be fp32, bf16 or fp16, got ",
             to_string(call.o.dtype), " (fp8 is an input type)");
  STSA_CHECK(std::isfinite(call.softmax_scale), InvalidArgument, "softmax scale must be finite, got ",
             call.softmax_scale);
  validate_descales(call.descales, b, h);
  const bool with_lse = call.lse.data != nullptr;
  if (with_lse) check_lse("lse", call.lse, b, h, shard.count);
  const std::int64_t text = layout.grid.text_tokens;
  if (text == 0) {
    STSA_CHECK(call.text_q.data == nullptr && call.text_k.data == nullptr && call.text_v.data == nullptr &&
                   call.text_o.data == nullptr && call.text_lse.data == nullptr,
               InvalidArgument, "text tensors given, but the layout has no text tokens");
  } else {
    check_view("text_q", call.text_q, b, text, h, d);
    check_view("text_k", call.text_k, b, text, kv_heads, d);
    check_view("text_v", call.text_v, b, text, kv_heads, d);
    check_view("text_o", call.text_o, b, text, h, d);
    STSA_CHECK(call.text_q.dtype == call.q.dtype && call.text_k.dtype == call.q.dtype &&
                   call.text_v.dtype == call.q.dtype && call.text_o.dtype == call.o.dtype,
               InvalidArgument, "text tensors must have the dtypes of q (inputs) and o (output)");
    STSA_CHECK((call.text_lse.data != nullptr) == with_lse, InvalidArgument,
               "give text_lse exactly when lse is given (text outputs are returned like video outputs)");
    if (with_lse) check_lse("text_lse", call.text_lse, b, h, text);
  }
  // With their shapes: the video and text parts of one O (or LSE) interleave in memory
  // with more than one batch entry, or heads outside tokens, without sharing a byte.
  const NamedExtent outputs[] = {NamedExtent::of("o", call.o), NamedExtent::of("lse", call.lse),
                                 NamedExtent::of("text_o", call.text_o), NamedExtent::of("text_lse", call.text_lse)};
  const NamedExtent inputs[] = {NamedExtent::of("q", call.q),           NamedExtent::of("k", call.k),
                                NamedExtent::of("v", call.v),           NamedExtent::of("text_q", call.text_q),
                                NamedExtent::of("text_k", call.text_k), NamedExtent::of("text_v", call.text_v),
                                {"q_descale", span_extent(call.descales.q)},
                                {"k_descale", span_extent(call.descales.k)},
                                {"v_descale", span_extent(call.descales.v)}};
  check_outputs_apart("", outputs, inputs);
}

Descriptor describe(const Communicator& comm, const UlyssesCall& call, const Backend& backend) {
  Descriptor d;
  try {
    check_local(comm, call);
  } catch (const Error& e) {
    std::strncpy(d.message, e.what(), kMessageBytes - 1);
    return d;
  }
  d.ok = 1;
  const VideoLayout& l = call.layout;
  std::vector<MaskSpec> masks = call.masks;
  if (masks.size() == 1) masks.assign(std::size_t(l.heads), call.masks[0]);
  float scale = call.softmax_scale;
  std::int32_t scale_bits = 0;
  std::memcpy(&scale_bits, &scale, sizeof scale_bits);
  // A rank holding no output row (no video tokens, no text) has no LSE to give: its views may be
  // null, so its wish counts for nothing (kAnyLse) and it follows the others'.
  const bool holds_outputs = sequence_shard(l.grid.video_tokens(), comm.size(), comm.rank()).count > 0 ||
                             l.grid.text_tokens > 0;
  const std::int64_t with_lse = !holds_outputs ? kAnyLse : call.lse.data != nullptr ? 1 : 0;
  d.fields = {l.batch, l.grid.frames, l.grid.height, l.grid.width, l.grid.text_tokens,
              std::int64_t(l.grid.text_placement), l.heads, call.k.heads(), l.head_dim, std::int64_t(call.q.dtype),
              std::int64_t(call.o.dtype), with_lse, hash_masks(masks), hash_router(call.router),
              scale_bits, hash_descales(call.descales),
              call.tile.q, call.tile.k, std::int64_t(call.alignment), hash_name(backend.name())};
  return d;
}

}  // namespace

Agreement agree(Communicator& comm, const UlyssesCall& call, const Backend& backend) {
  const int ranks = comm.size();
  const Descriptor mine = describe(comm, call, backend);
  std::vector<Descriptor> all(static_cast<std::size_t>(ranks));
  comm.allgather(&mine, sizeof(Descriptor), all.data());

  std::string failures;
  for (int r = 0; r < ranks; ++r) {
    const Descriptor& d = all[std::size_t(r)];
    if (d.ok) continue;
    failures += concat(failures.empty() ? "" : "; ", "rank ", r, ": ",
                       std::string(d.message, strnlen(d.message, kMessageBytes)));
  }
  STSA_CHECK(failures.empty(), DistError, "Ulysses call rejected on every rank because of bad input (", failures,
             ")");
  for (int r = 1; r < ranks; ++r)
    for (std::size_t f = 0; f < kFieldCount; ++f)
      STSA_CHECK(all[std::size_t(r)].fields[f] == all[0].fields[f] ||
                     (f == kWithLse && all[std::size_t(r)].fields[f] == kAnyLse),
                 DistError, "Ulysses ranks disagree on ",
                 kFieldNames[f], ": rank 0 has ", all[0].fields[f], ", rank ", r, " has ",
                 all[std::size_t(r)].fields[f], " (every rank must describe the same problem)");

  Agreement a;
  a.local_heads = heads_per_rank(call.layout.heads, ranks);  // InvalidArgument on every rank alike
  const std::int64_t kv_heads = all[0].fields[kKvHeads];
  STSA_CHECK(kv_heads % ranks == 0, InvalidArgument, "Ulysses splits K/V heads over ranks too: ", kv_heads,
             " K/V heads (grouped-query attention) cannot be split over ", ranks, " ranks");
  a.local_kv_heads = kv_heads / ranks;
  for (int r = 0; r < ranks; ++r) a.shards.push_back(sequence_shard(call.layout.grid.video_tokens(), ranks, r));
  a.with_lse = all[0].fields[kWithLse] == 1;  // rank 0 holds the first video token
  a.masks = call.masks;
  if (a.masks.size() == 1) a.masks.assign(std::size_t(call.layout.heads), call.masks[0]);
  return a;
}

void agree_on_outcome(Communicator& comm, const std::string& error, const char* phase) {
  Descriptor mine;
  mine.ok = error.empty() ? 1 : 0;
  std::strncpy(mine.message, error.c_str(), kMessageBytes - 1);
  std::vector<Descriptor> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(&mine, sizeof(Descriptor), all.data());
  std::string failures;
  for (int r = 0; r < comm.size(); ++r)
    if (!all[std::size_t(r)].ok)
      failures += concat(failures.empty() ? "" : "; ", "rank ", r, ": ",
                         std::string(all[std::size_t(r)].message, strnlen(all[std::size_t(r)].message, kMessageBytes)));
  STSA_CHECK(failures.empty(), DistError, "Ulysses ", phase, " failed (", failures, ")");
}

}  // namespace stsa::dist::detail
