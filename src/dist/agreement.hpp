// Collective validation before a distributed call does any work: every rank
// checks its own input, then all ranks exchange a small descriptor and check
// that they agree. Every rank reaches the same verdict, so a bad input on one
// rank stops all of them with the same message instead of leaving the others
// waiting in an exchange.
#pragma once

#include <string>
#include <vector>

#include "stsa/dist.hpp"

namespace stsa::dist::detail {

struct Agreement {
  std::vector<Shard> shards;     // every rank's video tokens
  std::int64_t local_heads = 0;  // H / P
  std::int64_t local_kv_heads = 0;  // Hkv / P
  bool with_lse = false;
  std::vector<MaskSpec> masks;   // one per global head; empty when every rank routes its own heads
};

// Throws on every rank alike (see ulysses_attention).
Agreement agree(Communicator& comm, const UlyssesCall& call, const Backend& backend);

// After a phase that may fail on some ranks only: shares `error` (empty: this
// rank succeeded) and throws DistError on every rank if any rank failed.
void agree_on_outcome(Communicator& comm, const std::string& error, const char* phase);

}  // namespace stsa::dist::detail
