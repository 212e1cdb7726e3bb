// Package oip is a client for model servers that speak the Open Inference Protocol v2 over
// HTTP/REST (KServe's V2 protocol, served by KServe, NVIDIA Triton, Seldon MLServer, OpenVINO
// Model Server):
//
//	GET  /v2/health/ready                              server readiness   (Client.Ready)
//	GET  /v2/models/{name}[/versions/{v}]/ready        model readiness    (Client.Ready)
//	GET  /v2/models/{name}[/versions/{v}]              model metadata     (Client.Metadata)
//	POST /v2/models/{name}[/versions/{v}]/infer        inference          (Client.Infer)
//
// It is the remote counterpart of processors/inference/onnx, which runs models in-process.
//
// # Tensors
//
// Infer encodes {"inputs":[{"name","shape","datatype","data"}]} with data flat in row-major
// order, and decodes {"model_name","outputs":[{"name","shape","datatype","data"}]}, accepting
// flat or nested data. Inputs are FP32 only for now. Outputs of any numeric datatype are
// converted to float32 (Tensor.Data) while Tensor.Datatype keeps the server's datatype: MLServer's
// scikit-learn runtime, for one, answers FP64, and float32 keeps every output type the same
// as the embedded runtime's. Binary tensor data (the binary_data extension), BYTES and BOOL
// tensors, and request parameters and requested outputs are not supported.
//
// Infer checks inputs before sending: data length against shape, no NaN or Inf (JSON cannot
// carry them), and, once Metadata has been fetched and declares inputs, names, rank and fixed
// dimensions against the model's. Such mistakes fail with ErrInvalidInput.
//
// # Errors
//
// A non-2xx answer is a *StatusError carrying the status and the server's message (the
// protocol's {"error": "..."} body). A request that got no answer (connection refused or reset,
// timeout) is a *TransportError. Retryable tells the two kinds of failure apart: transport
// errors, 408, 429 and 5xx are worth retrying on this or another replica; other 4xx (unknown
// model, malformed request) and the client's own checks are the caller's mistake. Bodies are
// bounded: a response over MaxResponseBytes (16 MiB) fails with ErrResponseTooLarge.
//
// # Connections
//
// Clients built without Config.HTTPClient share one keep-alive http.Transport (up to 64 idle
// connections per host), so many clients of one server reuse connections. Config.Timeout
// (DefaultTimeout, 10 s, when zero) bounds each call on top of the caller's context.
//
// # Tests
//
// The tests run a real MLServer (tests/mlserver) serving models/demo's deterioration model
// through MLServer's scikit-learn runtime; they fail, naming tests/mlserver/setup.sh, when its
// virtualenv is missing or stale.
package oip
