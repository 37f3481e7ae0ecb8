#pragma once
// Throwaway requests run through the executor as a server starts, so that the first real
// requests do not pay for what a process does once: growing activation
// buffers and per-thread GEMM scratch, first-touch page faults, starting thread pools. Without
// it the first requests to a fresh CPU server waited 1.5-3x the time to first token of later
// ones, and the scheduler's step-cost fit (max_tpot_slowdown, max_decode_slowdown) learned from those slow
// steps and capped the next prompts' chunks too tightly (issue 17: p99 TTFT at 1 req/s was
// 2.7x its p50).
//
// A server takes requests while it warms up: the first one to come ends the warm-up after the
// step running (cut_short), since it waits for the warm-up's steps and would pay more for them
// than for a cold start (a ~1.1B q4_K_M model: a 1 s warm-up, the first request ~0.1 s cold).
//
// It uses its own Engine (own scheduler, own step-cost fit, request ids from the top of the
// id space), so nothing of it reaches the serving engine's statistics or fit; the sequences
// it leaves on the executors are dropped by a last plan.
#include <cstdint>
#include <functional>

#include "common/status.h"
#include "common/step_executor.h"
#include "coordinator/engine/row_cost_curve.h"
#include "coordinator/engine/scheduler.h"

namespace tessera {

struct WarmUpReport {
  int steps = 0;
  int prompt_tokens = 0;  // the longest prefill chunk it ran (0: not run to its end)
  int decode_batch = 0;   // sequences decoding together in its decode steps (0: not run to their end)
  bool cut_short = false;  // `cut_short` ended it
  double seconds = 0;
};

// One short request alone (4 prompt tokens, 3 generated; where the batch below is more than
// one), a decode batch of min(max_num_seqs, 8) such requests where they fit, then one prompt
// as long as a step's token budget allows, at most 128 tokens (capped by max_model_len and the
// KV pool).
// `vocab` bounds the (arbitrary) prompt ids. An executor error ends it with that error.
// `embeddings_only` (a pooling): a server that only embeds (its workers have no LM head) warms
// up with embedding requests of the same prompts instead, so nothing is sampled.
// `cut_short` (when set) is asked before each step: true ends the warm-up there (a real request
// is waiting: a server warms up while it takes requests, and they go first).
StatusOr<WarmUpReport> warm_up_executor(const SchedulerConfig& config, StepExecutor& executor, int64_t vocab,
                                        Pooling embeddings_only = Pooling::kNone,
                                        const std::function<bool()>& cut_short = {});

// The time of a plain step of 1, 2, 4, ... rows on the executor (its target model's time,
// StepResult::target_seconds), for speculative decoding's back-off (SchedulerConfig::row_costs).
// Up to 256 rows, the pool, the token budget and the model's length allow, stopping once a
// step takes 4x a one-row step's (compute-bound: rows beyond cost what the last ones did);
// the median of 5 each, taken in interleaved rounds.
// Like warm_up_executor it runs in an engine of its own and leaves nothing behind.
StatusOr<RowCostCurve> measure_row_costs(const SchedulerConfig& config, StepExecutor& executor, int64_t vocab);

}  // namespace tessera
