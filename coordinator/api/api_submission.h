#pragma once
// Where a decoded API request (coordinator/api/openai_api.h) meets the engine, once for both front
// ends (HTTP in coordinator/server/http_server.cc, ZeroMQ in
// coordinator/server/zmq_client_server.cc): the n-choice fan-out, the mapping of a Status to the
// API error a client gets, and the API-key check. The transports only move bytes and frame what
// these decide.
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "coordinator/engine/engine_service.h"
#include "coordinator/api/openai_api.h"

namespace tessera {

ApiError api_error(int http_status, std::string type, std::string code, std::string message,
                   std::string param = "");
// A failed submit (or any engine Status) as the client sees it: ResourceExhausted 429
// "queue_full", Unavailable 503 "draining", InvalidArgument 400, anything else 500.
ApiError api_error_of(const Status& status);
// A generation the engine failed (GenerateEvent::error; "" reads "generation failed"): 503
// "workers_unavailable" when the workers could not run it (a lost rank; the client may retry),
// else 500.
ApiError generation_error(const std::string& error, bool unavailable);

// True when no keys are configured, or `presented` (non-empty) is one of them.
bool api_key_accepted(const std::vector<std::string>& keys, std::string_view presented);

// One event of the response's choice `index` (prompt_index × n + choice).
using ChoiceCallback = std::function<void(size_t index, const GenerateEvent& event)>;

// Submits one engine request per prompt (each with the request's n choices, forked after
// one prefill) and routes their events to `callback` with the response's choice index. On a
// failed submit the prompts already submitted are aborted (their late events still reach
// the callback, as kAborted) and the error is returned.
StatusOr<std::vector<RequestId>> submit_api_request(EngineService& service, const ApiRequest& request,
                                                    ChoiceCallback callback);
// Aborts every choice still running of the submitted requests (finished ones are ignored).
void abort_api_request(EngineService& service, const std::vector<RequestId>& ids);

}  // namespace tessera
