// Package chat is a client for servers that speak OpenAI's chat completions API over
// HTTP (llama.cpp's and llama-cpp-python's servers, vLLM, Ollama, OpenAI and the gateways
// in front of them), for carehub's LLM agents:
//
//	GET  /v1/models              readiness, and that the model is served   (Client.Ready)
//	POST /v1/chat/completions    one completion, not streamed               (Client.Complete)
//
// Config.BaseURL is the server's root, with or without the /v1 that OpenAI's own clients
// are configured with.
//
// # Token usage
//
// Every Response carries the server's token counts (the "usage" object); a response
// without them fails with ErrInvalidResponse, because carehub records what each call
// really cost and does not estimate it.
//
// # Errors
//
// A non-2xx answer is a *StatusError carrying the status and the server's message (OpenAI's
// {"error": {"message": ...}} body, or FastAPI's "detail", of which only locations and
// messages are kept: its validation errors echo the refused input, which may be a
// patient's). A request that got no answer (connection refused or reset, timeout) is a
// *TransportError. Retryable tells the two kinds of failure apart: transport errors, 408,
// 429 and 5xx are worth retrying on this or another replica; other 4xx (a bad key, a
// prompt longer than the context) and the client's own checks are the caller's mistake.
// Errors never hold the API key, the URL's user information or the messages. Bodies are
// bounded: a response over Config.MaxResponseBytes (DefaultMaxResponseBytes, 8 MiB, when
// zero) fails with ErrResponseTooLarge.
//
// # Connections
//
// Clients built without Config.HTTPClient share one keep-alive http.Transport.
// Config.Timeout (DefaultTimeout, 2 minutes, when zero) bounds each call on top of the
// caller's context.
//
// # Tests
//
// Unit tests use in-process fake servers. The integration tests run a real llama-cpp-python
// server (llamacpptest: tests/llamacpp) serving a tiny random-weight model that
// tests/llamacpp/setup.sh generates; they fail, naming that script, when its virtualenv is
// missing or stale.
package chat
