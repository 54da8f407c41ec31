// The Ulysses call: agree, all-to-all to head shards, the single-device routed
// path (routed.hpp) on this rank's heads, all-to-all back to sequence shards.
//
// Packed exchange blocks (one per peer, contiguous, in this order):
//   scatter, rank r -> s:  Q, K, V of r's video tokens, s's heads: [B][n_r][H/P][D] for Q, then
//                          [B][n_r][Hkv/P][D] for K and for V (Hkv = H but for grouped-query attention)
//   gather,  rank r -> s:  O of s's video tokens, r's heads:       [B][n_s][H/P][D]     (output dtype)
//                          LSE of the same rows (when wanted):     [B][H/P][n_s]        (fp32)
//                          text O of r's heads:                    [B][T][H/P][D]
//                          text LSE (when wanted):                 [B][H/P][T]
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "dist/agreement.hpp"
#include "dist/row_copy.hpp"

namespace stsa::dist {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Offsets of consecutive blocks with the given sizes.
std::vector<std::int64_t> offsets_of(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> offsets(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) offsets[i] = offsets[i - 1] + counts[i - 1];
  return offsets;
}

std::int64_t total_of(const std::vector<std::int64_t>& counts) {
  std::int64_t total = 0;
  for (std::int64_t c : counts) total += c;
  return total;
}


// Position of text token j in the full sequence.
std::int64_t text_position(const VideoGrid& grid, std::int64_t j) {
  return grid.text_placement == TextPlacement::Before ? j : grid.video_end() + j;
}

// This rank's heads of the whole sequence, frame-major, as the exchange delivers them.
struct LocalTensors {
  TensorView q, k, v, o;
  LseView lse;
};

}  // namespace

// Named regions of reusable memory. Everything in them is written in full before
// it is read, so growing one does not keep (or zero) its contents.
struct UlyssesWorkspace::Buffers {
  enum Region { kSend, kReceive, kQ, kK, kV, kO, kLse, kRegions };
  struct Block {
    std::unique_ptr<std::byte[]> data;
    std::size_t bytes = 0;
  };
  Block blocks[kRegions];

  std::byte* get(Region region, std::int64_t bytes, const char* what) {
    Block& block = blocks[region];
    const auto wanted = std::size_t(std::max<std::int64_t>(bytes, 1));
    if (block.bytes < wanted) {
      block.data.reset();  // the old block is not needed while the new one is made
      block.bytes = 0;
      check_host_allocation(std::uint64_t(wanted), what);
      try {
        block.data.reset(new std::byte[wanted]);
      } catch (const std::bad_alloc&) {
        throw ResourceError(::stsa::detail::concat(what, ": ", wanted >> 20, " MiB could not be allocated"));
      }
      block.bytes = wanted;
    }
    return block.data.get();
  }
};

UlyssesWorkspace::UlyssesWorkspace() : buffers_(std::make_unique<Buffers>()) {}
UlyssesWorkspace::~UlyssesWorkspace() = default;
UlyssesWorkspace::UlyssesWorkspace(UlyssesWorkspace&&) noexcept = default;
UlyssesWorkspace& UlyssesWorkspace::operator=(UlyssesWorkspace&&) noexcept = default;

std::size_t UlyssesWorkspace::bytes() const {
  std::size_t total = 0;
  if (buffers_)
    for (const auto& block : buffers_->blocks) total += block.bytes;
  return total;
}

void UlyssesWorkspace::release() { buffers_ = std::make_unique<Buffers>(); }

UlyssesReport ulysses_attention(Communicator& comm, const UlyssesCall& call, const Backend& backend,
                                PlanCache& plans) {
  UlyssesWorkspace workspace;
  return ulysses_attention(comm, call, backend, plans, workspace);
}

UlyssesReport ulysses_attention(Communicator& comm, const UlyssesCall& call, const Backend& backend,
                                PlanCache& plans, UlyssesWorkspace& workspace) {
  using Buffers = UlyssesWorkspace::Buffers;
  if (!workspace.buffers_) workspace.buffers_ = std::make_unique<Buffers>();  // a moved-from workspace
  Buffers& memory = *workspace.buffers_;
  const auto start = Clock::now();
  const Traffic at_start = comm.traffic();
  const detail::Agreement agreed = detail::agree(comm, call, backend);

  UlyssesReport report;
  report.ranks = comm.size();
  report.rank = comm.rank();
  report.shard = agreed.shards[std::size_t(report.rank)];
  report.local_heads = agreed.local_heads;
  report.local_kv_heads = agreed.local_kv_heads;
  report.head_begin = report.rank * agreed.local_heads;
  const int ranks = report.ranks;
  const VideoGrid& grid = call.layout.grid;
  const std::int64_t batch = call.layout.batch, tokens = grid.tokens(), text = grid.text_tokens;
  const std::int64_t local_heads = agreed.local_heads, head_begin = report.head_begin;
  const std::int64_t kv_local = agreed.local_kv_heads, kv_begin = report.rank * kv_local;
  // Q's heads, then K's and V's (their own count and first head on this rank).
  const std::int64_t heads_of[3] = {local_heads, kv_local, kv_local}, begin_of[3] = {head_begin, kv_begin, kv_begin};
  const std::int64_t n_mine = report.shard.count;
  const std::size_t in_row = detail::row_bytes(call.q), out_row = detail::row_bytes(call.o);

  VideoLayout local_layout = call.layout;
  local_layout.heads = local_heads;
  // Bytes per peer of the two exchanges (rank s's slot s): Q, K and V rows out to the
  // heads' ranks; O (and LSE) rows back to the tokens' ranks, text rows to every rank.
  const std::int64_t lse_bytes = agreed.with_lse ? std::int64_t(sizeof(float)) : 0;
  const std::int64_t row_total = std::int64_t(out_row) + lse_bytes;
  struct Counts {
    std::vector<std::int64_t> send, recv;
  };
  const auto scatter_counts = [&] {
    Counts c{std::vector<std::int64_t>(std::size_t(ranks)), std::vector<std::int64_t>(std::size_t(ranks))};
    for (int s = 0; s < ranks; ++s) {
      const std::int64_t row_heads = local_heads + 2 * kv_local;
      c.send[std::size_t(s)] = batch * n_mine * row_heads * std::int64_t(in_row);
      c.recv[std::size_t(s)] = batch * agreed.shards[std::size_t(s)].count * row_heads * std::int64_t(in_row);
    }
    return c;
  };
  const auto gather_counts = [&] {
    Counts c{std::vector<std::int64_t>(std::size_t(ranks)), std::vector<std::int64_t>(std::size_t(ranks))};
    for (int s = 0; s < ranks; ++s) {
      c.send[std::size_t(s)] = batch * (agreed.shards[std::size_t(s)].count + text) * local_heads * row_total;
      c.recv[std::size_t(s)] = batch * (n_mine + text) * local_heads * row_total;
    }
    return c;
  };
  // This rank's head shard of the whole sequence, in the workspace (every row is
  // written below: by the exchange, the text slice, or the local attention).
  const std::int64_t head_dim = call.layout.head_dim;
  const auto local_tensor = [&](Buffers::Region region, DType dtype, std::int64_t heads, const char* what) {
    const std::int64_t bytes = batch * tokens * heads * head_dim * std::int64_t(element_size(dtype));
    return TensorView::contiguous(memory.get(region, bytes, what), dtype, batch, tokens, heads, head_dim,
                                  MemoryLayout::BNHD);
  };
  // All of the workspace before the first exchange, and its outcome shared: a rank that
  // cannot allocate would otherwise leave the others waiting in the exchange until
  // CommTimeout, after which the communicator is unusable.
  LocalTensors local;
  std::string allocation_failure;
  try {
    const Counts scatter = scatter_counts(), gather = gather_counts();
    memory.get(Buffers::kSend, std::max(total_of(scatter.send), total_of(gather.send)), "Ulysses send buffer");
    memory.get(Buffers::kReceive, std::max(total_of(scatter.recv), total_of(gather.recv)), "Ulysses receive buffer");
    local = {local_tensor(Buffers::kQ, call.q.dtype, local_heads, "Ulysses local q"),
             local_tensor(Buffers::kK, call.q.dtype, kv_local, "Ulysses local k"),
             local_tensor(Buffers::kV, call.q.dtype, kv_local, "Ulysses local v"),
             local_tensor(Buffers::kO, call.o.dtype, local_heads, "Ulysses local o"),
             {}};
    if (agreed.with_lse) {
      const std::int64_t bytes = batch * local_heads * tokens * std::int64_t(sizeof(float));
      local.lse = LseView::contiguous(reinterpret_cast<float*>(memory.get(Buffers::kLse, bytes, "Ulysses local lse")),
                                      batch, local_heads, tokens);
    }
  } catch (const std::exception& e) {
    allocation_failure = e.what();
  }
  detail::agree_on_outcome(comm, allocation_failure, "workspace allocation");
  report.agreement = comm.traffic() - at_start;
  report.agree_ms = ms_since(start);
  const TensorView inputs[3] = {call.q, call.k, call.v};
  const TensorView text_inputs[3] = {call.text_q, call.text_k, call.text_v};
  const TensorView local_inputs[3] = {local.q, local.k, local.v};

  // --- Scatter: sequence shards -> head shards.
  auto phase = Clock::now();
  Traffic before = comm.traffic();
  {
    const auto [send_counts, recv_counts] = scatter_counts();
    const auto send_offsets = offsets_of(send_counts), recv_offsets = offsets_of(recv_counts);
    std::byte* const send = memory.get(Buffers::kSend, total_of(send_counts), "Ulysses send buffer");
    std::byte* const recv = memory.get(Buffers::kReceive, total_of(recv_counts), "Ulysses receive buffer");
    for (int s = 0; s < ranks; ++s) {
      std::byte* out = send + send_offsets[std::size_t(s)];
      for (int t = 0; t < 3; ++t)
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t i = 0; i < n_mine; ++i)
            for (std::int64_t h = 0; h < heads_of[t]; ++h, out += in_row)
              detail::read_row(inputs[t], b, i, s * heads_of[t] + h, out);
    }
    comm.alltoallv(send, send_counts, send_offsets, recv, recv_counts, recv_offsets);
    // A received token row holds this rank's heads contiguously, exactly a row of the local tensors.
    for (int s = 0; s < ranks; ++s) {
      const Shard& from = agreed.shards[std::size_t(s)];
      const std::byte* in = recv + recv_offsets[std::size_t(s)];
      for (int t = 0; t < 3; ++t) {
        const TensorView& to = local_inputs[t];
        const std::size_t token_bytes = std::size_t(heads_of[t]) * in_row;
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t i = 0; i < from.count; ++i, in += token_bytes) {
            const std::int64_t position = grid.video_begin() + from.begin + i;
            std::memcpy(
                static_cast<std::byte*>(to.data) + to.offset(b, position, 0, 0) * std::int64_t(element_size(to.dtype)),
                in, token_bytes);
          }
      }
    }
  }
  // Text tokens are already here for every head: take this rank's slice.
  std::vector<std::byte> row(in_row);
  for (int t = 0; t < 3 && text > 0; ++t)
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t j = 0; j < text; ++j)
        for (std::int64_t h = 0; h < heads_of[t]; ++h) {
          detail::read_row(text_inputs[t], b, j, begin_of[t] + h, row.data());
          detail::write_row(local_inputs[t], b, text_position(grid, j), h, row.data());
        }
  report.scatter = comm.traffic() - before;
  report.scatter_ms = ms_since(phase);

  // --- Local: routing (when asked), planning, the temporal heads' permutation
  // and attention on this rank's heads, exactly as on one device. It makes no
  // collective calls, which the traffic counters confirm. A failure on one rank
  // is shared before the return exchange, so no rank is left waiting in it.
  phase = Clock::now();
  before = comm.traffic();
  std::vector<std::int64_t> my_heads(static_cast<std::size_t>(local_heads));
  for (std::int64_t h = 0; h < local_heads; ++h) my_heads[std::size_t(h)] = head_begin + h;
  std::vector<float> my_descales;  // this rank's heads' descales
  RoutedCall routed{local_layout, local.q, local.k, local.v, local.o, local.lse, call.softmax_scale};
  routed.descales = call.descales.for_heads(my_heads, batch, call.layout.heads, my_descales);
  const RoutedOptions options{call.tile, call.alignment};
  std::string failure;
  try {
    RoutedResult result;
    if (call.router != nullptr) {
      result = routed_attention(backend, plans, routed, *call.router, options);
    } else {
      const std::span<const MaskSpec> mine(agreed.masks.data() + head_begin, std::size_t(local_heads));
      result = run_routed(backend, plans, routed, routes_for_masks(mine, local_heads), options);
    }
    report.routes = std::move(result.heads);
    report.temporal_heads = std::int64_t(result.temporal.size());
    report.routing_ms = result.routing_ms;
    report.permutation_ms = result.permutation_ms;
    report.attention_ms = result.attention_ms;
  } catch (const std::exception& e) {
    failure = e.what();
  }
  report.local = comm.traffic() - before;
  report.local_ms = ms_since(phase);
  detail::agree_on_outcome(comm, failure, "local attention");

  // --- Gather: head shards -> sequence shards (text outputs to every rank).
  phase = Clock::now();
  before = comm.traffic();
  {
    const auto [send_counts, recv_counts] = gather_counts();
    const auto send_offsets = offsets_of(send_counts), recv_offsets = offsets_of(recv_counts);
    std::byte* const send = memory.get(Buffers::kSend, total_of(send_counts), "Ulysses send buffer");
    std::byte* const recv = memory.get(Buffers::kReceive, total_of(recv_counts), "Ulysses receive buffer");
    const TensorView o = local.o;
    const LseView lse = local.lse;
    const std::size_t token_bytes = std::size_t(local_heads) * out_row;
    const auto element_offset = [&](std::int64_t b, std::int64_t position) {
      return static_cast<const std::byte*>(o.data) + o.offset(b, position, 0, 0) * std::int64_t(element_size(o.dtype));
    };
    // Copies `count` consecutive positions of every (batch, head) LSE row.
    const auto pack_lse = [&](std::byte*& out, std::int64_t first, std::int64_t count) {
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t h = 0; h < local_heads; ++h, out += count * lse_bytes)
          std::memcpy(out, &lse.at(b, h, first), std::size_t(count * lse_bytes));
    };
    for (int s = 0; s < ranks; ++s) {
      const Shard& to = agreed.shards[std::size_t(s)];
      std::byte* out = send + send_offsets[std::size_t(s)];
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t i = 0; i < to.count; ++i, out += token_bytes)
          std::memcpy(out, element_offset(b, grid.video_begin() + to.begin + i), token_bytes);
      if (agreed.with_lse && to.count > 0) pack_lse(out, grid.video_begin() + to.begin, to.count);
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t j = 0; j < text; ++j, out += token_bytes)
          std::memcpy(out, element_offset(b, text_position(grid, j)), token_bytes);
      if (agreed.with_lse && text > 0) pack_lse(out, text_position(grid, 0), text);
    }
    comm.alltoallv(send, send_counts, send_offsets, recv, recv_counts, recv_offsets);
    for (int s = 0; s < ranks; ++s) {
      const std::int64_t heads_of_s = s * local_heads;
      const std::byte* in = recv + recv_offsets[std::size_t(s)];
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t i = 0; i < n_mine; ++i)
          for (std::int64_t h = 0; h < local_heads; ++h, in += out_row) detail::write_row(call.o, b, i, heads_of_s + h, in);
      if (agreed.with_lse)
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t h = 0; h < local_heads; ++h)
            for (std::int64_t i = 0; i < n_mine; ++i, in += lse_bytes) std::memcpy(&call.lse.at(b, heads_of_s + h, i), in, sizeof(float));
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t j = 0; j < text; ++j)
          for (std::int64_t h = 0; h < local_heads; ++h, in += out_row)
            detail::write_row(call.text_o, b, j, heads_of_s + h, in);
      if (agreed.with_lse)
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t h = 0; h < local_heads; ++h)
            for (std::int64_t j = 0; j < text; ++j, in += lse_bytes)
              std::memcpy(&call.text_lse.at(b, heads_of_s + h, j), in, sizeof(float));
    }
  }
  report.gather = comm.traffic() - before;
  report.gather_ms = ms_since(phase);
  report.total = comm.traffic() - at_start;
  report.total_ms = ms_since(start);
  return report;
}

}  // namespace stsa::dist
