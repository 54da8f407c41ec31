// Sequence parallelism (Ulysses) over a small communicator interface.
//
// P ranks each hold a contiguous shard of the video tokens (frame-major order)
// for all H heads. One all-to-all turns the sequence shards into head shards:
// every rank then holds the whole sequence for H/P heads and runs the
// single-device routed path on them (routing if asked, planning, the temporal
// heads' permutation, attention: run_routed() in routed.hpp), which needs
// nothing from the other ranks. A second all-to-all
// returns O (and LSE) to the sequence shards. Because the permutation runs after
// the exchange, on whole sequences of the rank's own heads, sparsity adds no
// bytes between ranks.
//
// Text tokens are not sharded: every rank holds all of them for all heads, takes
// the slice of its own heads after the exchange (no bytes), and the second
// all-to-all hands every rank the text O (and LSE) of every head, so text
// outputs end up replicated like text inputs.
//
// Every collective waits at most Communicator::timeout(); a call that would wait
// longer throws CommTimeout (a rank is missing or stuck). Ranks agree on the
// problem before any work: a rank with bad input makes every rank throw the same
// DistError instead of hanging.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/error.hpp"
#include "stsa/layout.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"
#include "stsa/tensor.hpp"

namespace stsa::dist {

// A collective did not finish within the communicator's timeout. The
// communicator is unusable afterwards: end the job with Communicator::abort().
class CommTimeout : public DistError {
 public:
  using DistError::DistError;
};

// Bytes one rank moved, to or from other ranks only (a rank's block to itself is a local copy).
struct Traffic {
  std::int64_t bytes_sent = 0;              // alltoallv payload
  std::int64_t bytes_received = 0;
  std::int64_t control_bytes_sent = 0;      // allgather / allreduce used to agree and validate
  std::int64_t control_bytes_received = 0;
  std::int64_t exchanges = 0;               // alltoallv calls
  std::int64_t collectives = 0;             // every collective, barriers included

  Traffic operator-(const Traffic& earlier) const;
  Traffic& operator+=(const Traffic& other);
};

enum class MemorySpace : std::uint8_t { Host, Device };
enum class ReduceOp : std::uint8_t { Sum, Min, Max };

// Rank, size and the few collectives Ulysses needs. Not thread-safe: one
// thread per rank calls it, and every rank calls the same collectives in the
// same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string_view name() const = 0;  // "local" | "mpi" | "nccl"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where alltoallv buffers are best placed (NCCL: device; it stages host buffers itself).
  virtual MemorySpace memory() const = 0;

  // Rank r sends send_counts[s] bytes at send + send_offsets[s] to every rank s and
  // receives recv_counts[s] bytes from s into recv + recv_offsets[s]. Counts must match
  // pairwise (what s sends to r is what r expects from s). 64-bit counts. Returns when
  // recv holds the data. Device buffers (NCCL) are read and written after all work
  // issued to the device before the call, on any stream.
  void alltoallv(const std::byte* send, std::span<const std::int64_t> send_counts,
                 std::span<const std::int64_t> send_offsets, std::byte* recv,
                 std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_offsets);
  // Every rank contributes `bytes` bytes of host memory; `all` (size() * bytes) gets them in rank order.
  void allgather(const void* mine, std::size_t bytes, void* all);
  // Element-wise reduction of small host arrays, in place, same result on every rank.
  void allreduce(std::span<double> values, ReduceOp op);
  void barrier();
  // Ends every rank of the job with `exit_code` (MPI_Abort); for use after a CommTimeout.
  [[noreturn]] virtual void abort(int exit_code) = 0;

  // How long any one collective may wait for the other ranks. Default: the
  // STSA_DIST_TIMEOUT environment variable in seconds (in (0, 1e7), rounded up to
  // a millisecond; any other text makes the constructor throw InvalidArgument), else 120 s.
  void set_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const { return timeout_; }
  Traffic traffic() const { return traffic_; }

 protected:
  Communicator();
  virtual void do_alltoallv(const std::byte* send, std::span<const std::int64_t> send_counts,
                            std::span<const std::int64_t> send_offsets, std::byte* recv,
                            std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_offsets) = 0;
  virtual void do_allgather(const void* mine, std::size_t bytes, void* all) = 0;
  virtual void do_allreduce(std::span<double> values, ReduceOp op) = 0;
  virtual void do_barrier() = 0;

 private:
  Traffic traffic_;
  std::chrono::milliseconds timeout_;
};

// One rank, no transport: exchanges are local copies. Lets the distributed
// path run (and be tested) in a single process.
std::unique_ptr<Communicator> make_local_communicator();

bool built_with_mpi();
bool built_with_nccl();

// Owns MPI's lifetime in a process: initialises MPI on construction (unless
// already initialised) and finalises it on destruction if it initialised it.
// Throws Unsupported when stsa was built without MPI.
class MpiSession {
 public:
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  // A communicator over every rank of the job (a duplicate of MPI_COMM_WORLD).
  std::unique_ptr<Communicator> world() const;

 private:
  bool owns_ = false;
};

// NCCL over the ranks of `bootstrap` (which only passes NCCL's unique id around),
// on CUDA device `device` (-1: rank modulo the visible devices). Throws
// Unsupported when built without NCCL, DistError when NCCL or CUDA fail.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device = -1);

// ---------------------------------------------------------------------------
// Sharding

// The video tokens of rank `rank` out of `ranks`, in frame-major order: contiguous
// blocks, the first V % P ranks one token longer:
//   count = V / P + (rank < V % P),  begin = rank * (V / P) + min(rank, V % P).
// A rank may hold no tokens (V < P). Throws InvalidArgument for ranks < 1 or rank out of range.
struct Shard {
  std::int64_t begin = 0;
  std::int64_t count = 0;
  std::int64_t end() const { return begin + count; }
  bool operator==(const Shard&) const = default;
};
Shard sequence_shard(std::int64_t video_tokens, int ranks, int rank);

// Heads per rank (rank r computes heads [r * H/P, (r+1) * H/P)). Throws
// InvalidArgument when `ranks` does not divide `heads`, listing the rank counts that do.
std::int64_t heads_per_rank(std::int64_t heads, int ranks);

// ---------------------------------------------------------------------------
// The single-device path

// Decisions that make run_routed() (routed.hpp) run the given masks: one per
// head, or one for all `heads`. The single-device path each rank runs after the
// exchange, and the baseline a distributed call is compared with.
std::vector<HeadRoute> routes_for_masks(std::span<const MaskSpec> masks, std::int64_t heads);

// ---------------------------------------------------------------------------
// Ulysses

struct UlyssesCall {
  VideoLayout layout;   // the whole problem: full grid (video and text), batch, all H heads, head dim
  // This rank's video shard, frame-major: q logical [B, shard.count, H, D], k and v
  // [B, shard.count, Hkv, D] with Hkv = H, or fewer heads (grouped-query attention,
  // attention.hpp) split evenly over the ranks too (rank r gets K/V heads
  // [r * Hkv/P, (r+1) * Hkv/P), those its query heads read).
  TensorView q, k, v;
  TensorView o;         // logical [B, shard.count, H, D]
  LseView lse;          // logical [B, H, shard.count]; optional, but every rank must agree
  // Text tokens (layout.grid.text_tokens = T > 0), the same on every rank: logical
  // [B, T, H, D] (text_k and text_v with k's heads); leave unset when T == 0. text_o (and text_lse [B, H, T], required
  // when lse is given) receive every head.
  // Every view follows validate()'s rules (attention.hpp): non-negative strides under
  // which no two elements share an address, pointers aligned to the element, O of
  // fp32, bf16 or fp16, and no output sharing a byte with an input or another output
  // (inputs may share bytes: the text's and the video's views of one tensor).
  TensorView text_q, text_k, text_v, text_o;
  LseView text_lse;
  // What each head runs with: H masks (indexed by global head) or one for every
  // head; or leave masks empty and give a router, and every rank routes its own
  // heads after the exchange, on their whole sequence.
  std::vector<MaskSpec> masks;
  const Router* router = nullptr;
  float softmax_scale = 0.f;
  // Per-(batch, head) descales (attention.hpp), indexed by global head: every rank
  // gives the same B x H values (the agreement compares them) and runs its heads' own.
  Descales descales = {};
  TileShape tile{};
  Alignment alignment = Alignment::Exact;
};

// What one call moved and how long each phase took, on this rank.
struct UlyssesReport {
  int ranks = 1;
  int rank = 0;
  Shard shard;                    // this rank's video tokens
  std::int64_t head_begin = 0;    // this rank's heads: [head_begin, head_begin + local_heads)
  std::int64_t local_heads = 0;
  std::int64_t local_kv_heads = 0;  // its K/V heads (local_heads but for grouped-query attention)
  std::int64_t temporal_heads = 0;  // of the local heads, how many were permuted (locally)
  std::vector<HeadRoute> routes;    // the decision each local head ran with
  Traffic agreement;  // the collective validation before any work
  Traffic scatter;    // first all-to-all: Q, K, V to head shards
  Traffic local;      // between the exchanges (planning, permutation, attention): zero by design
  Traffic gather;     // second all-to-all: O, LSE (and text O) back
  Traffic total;
  double agree_ms = 0, scatter_ms = 0, local_ms = 0, gather_ms = 0, total_ms = 0;
  double routing_ms = 0, permutation_ms = 0, attention_ms = 0;  // parts of local_ms
};

// Host memory one rank reuses across ulysses_attention calls: the exchange
// buffers and this rank's head-shard tensors. It grows to the largest call seen
// and keeps that; without it every call allocates (and page-faults) them anew.
// One workspace per thread that makes calls.
class UlyssesWorkspace {
 public:
  UlyssesWorkspace();
  ~UlyssesWorkspace();
  UlyssesWorkspace(UlyssesWorkspace&&) noexcept;
  UlyssesWorkspace& operator=(UlyssesWorkspace&&) noexcept;
  std::size_t bytes() const;  // held now
  void release();             // frees everything it holds

  struct Buffers;  // src/dist/ulysses.cpp

 private:
  std::unique_ptr<Buffers> buffers_;
  friend UlyssesReport ulysses_attention(Communicator&, const UlyssesCall&, const Backend&, PlanCache&,
                                         UlyssesWorkspace&);
};

// The distributed call. Every rank of `comm` must call it. Throws (on every rank
// alike): DistError when ranks disagree on the problem or one rank's input is
// invalid (the message names the rank and why), InvalidArgument when the rank
// count does not divide H (or Hkv), CommTimeout when a rank does not show up in time.
UlyssesReport ulysses_attention(Communicator& comm, const UlyssesCall& call, const Backend& backend,
                                PlanCache& plans, UlyssesWorkspace& workspace);
// The same with a workspace of its own, freed on return.
UlyssesReport ulysses_attention(Communicator& comm, const UlyssesCall& call, const Backend& backend,
                                PlanCache& plans);

// ---------------------------------------------------------------------------
// Byte accounting (computed, for comparison with Traffic)

// Exact bytes rank `rank` sends and receives in one ulysses_attention call.
struct UlyssesVolume {
  std::int64_t scatter_sent = 0, scatter_received = 0;  // Q, K, V
  std::int64_t gather_sent = 0, gather_received = 0;    // O, LSE, text O and text LSE
  std::int64_t sent() const { return scatter_sent + gather_sent; }
  std::int64_t received() const { return scatter_received + gather_received; }
};
// kv_heads: K and V's heads (0: the layout's; fewer for grouped-query attention).
UlyssesVolume ulysses_volume(const VideoLayout& layout, DType in_dtype, DType out_dtype, bool with_lse, int ranks,
                             int rank, std::int64_t kv_heads = 0);

// The textbook per-rank Ulysses volume in bytes, assuming P divides the video
// tokens V: (H + 2 Hkv + H) x B x (V/P) x D x (P-1)/P elements (Q, K, V out, O back;
// counted in in_dtype for Q, K, V and out_dtype for O) plus B x (V/P) x H x (P-1)/P
// fp32 LSE values when with_lse, plus the text outputs sent to the other ranks.
// kv_heads as ulysses_volume's.
double ulysses_formula_bytes(const VideoLayout& layout, DType in_dtype, DType out_dtype, bool with_lse, int ranks,
                             std::int64_t kv_heads = 0);

// Bytes rank `rank` would send if the temporal heads' permutation were done on
// the sequence-sharded layout before the exchange (tokens whose spatial-major
// position falls in another rank's shard must move there, for Q, K and V, and O
// and LSE must move back), instead of locally after it. For comparison only:
// ulysses_attention never does this.
std::int64_t sharded_permutation_bytes(const VideoLayout& layout, std::span<const MaskSpec> masks, DType in_dtype,
                                       DType out_dtype, bool with_lse, int ranks, int rank);

}  // namespace stsa::dist
