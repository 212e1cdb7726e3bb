package oip

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"carehub/processors/inference/httpcall"
)

// Defaults for Config fields left zero.
const (
	// DefaultTimeout bounds one call (connect, send, wait, read) when Config.Timeout is 0.
	DefaultTimeout = 10 * time.Second
	// MaxResponseBytes bounds a response body; a larger one fails with ErrResponseTooLarge.
	MaxResponseBytes = 16 << 20
	// maxMessage is how much of the server's message goes into an error string.
	maxMessage = 1024
)

var (
	// ErrInvalidInput wraps every reason Infer refuses its inputs before sending them.
	ErrInvalidInput = errors.New("oip: invalid input")
	// ErrInvalidResponse wraps every reason a 2xx response body is refused (bad JSON, an
	// output whose data does not match its shape or datatype).
	ErrInvalidResponse = errors.New("oip: invalid response")
	// ErrResponseTooLarge: the response body is longer than MaxResponseBytes.
	ErrResponseTooLarge = errors.New("oip: response too large")
	// ErrNotReady is wrapped by Ready's error when the server or the model is not ready.
	ErrNotReady = errors.New("oip: not ready")
)

// Config says where the model is served and how to reach it.
type Config struct {
	// BaseURL is the server's root, e.g. http://127.0.0.1:8080 (a path prefix is kept).
	BaseURL string
	// Model is the model's name; Version, when not empty, selects /versions/{Version}.
	Model   string
	Version string
	// Header is added to every request (e.g. Authorization).
	Header http.Header
	// Timeout bounds each call; 0 means DefaultTimeout, a negative value means none (the
	// caller's context only).
	Timeout time.Duration
	// HTTPClient, when set, is used instead of the package's shared keep-alive client.
	HTTPClient *http.Client
}

// Tensor is one input or output tensor. Data is row-major (C order) and holds exactly
// the product of Shape elements.
//
// Inputs must be FP32 (an empty Datatype means FP32). Outputs of any numeric datatype
// (FP16, FP32, FP64, INT8..INT64, UINT8..UINT64) are decoded into Data as float32; Datatype
// keeps the server's datatype, so a caller can tell that an FP64 output was rounded to
// float32 (relative error below 6e-8) or that an INT64 above 2^24 lost precision. BOOL and
// BYTES outputs are refused with ErrInvalidResponse.
type Tensor struct {
	Name     string
	Datatype string
	Shape    []int64
	Data     []float32
}

// TensorMetadata describes one tensor in a model's metadata; -1 is a dynamic dimension.
type TensorMetadata struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
}

// Metadata is the model metadata response (GET /v2/models/{name}[/versions/{v}]).
type Metadata struct {
	Name     string           `json:"name"`
	Versions []string         `json:"versions"`
	Platform string           `json:"platform"`
	Inputs   []TensorMetadata `json:"inputs"`
	Outputs  []TensorMetadata `json:"outputs"`
}

// StatusError is a non-2xx response: the HTTP status and the server's message (the
// "error" field of the OIP error body, FastAPI's "detail", or the start of a plain body).
type StatusError = httpcall.StatusError

// TransportError is a request that got no HTTP response: connection refused or reset,
// timeout, DNS failure, the connection closed mid-response.
type TransportError = httpcall.TransportError

// Retryable reports whether err is worth retrying later, on this or another replica:
// a TransportError (connection refused or reset, a timeout, including Config.Timeout
// expiring) or a StatusError with status 408, 429 or 5xx. The caller's own mistakes are not:
// other 4xx statuses (unknown model, malformed request), ErrInvalidInput, ErrInvalidResponse,
// ErrResponseTooLarge, and a context the caller canceled.
//
// Note that MLServer answers an exception raised inside the model (for example a
// scikit-learn model given the wrong number of features) with a plain 500, which therefore
// counts as retryable; Infer checks inputs against the model metadata when it has it (see
// Client.Metadata) to catch such mistakes before they reach the server.
func Retryable(err error) bool { return httpcall.Retryable(err) }

// Client talks to one model on one OIP v2 REST server. It is safe for concurrent use.
type Client struct {
	http      *http.Client
	header    http.Header
	timeout   time.Duration
	base      string // BaseURL without a trailing slash
	modelPath string // /v2/models/{name}[/versions/{v}]
	model     string
	meta      atomic.Pointer[Metadata]
}

// New checks cfg and returns a client. It does not contact the server (see Ready).
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("oip: BaseURL %q: %w", cfg.BaseURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("oip: BaseURL %q: want http(s)://host[:port][/prefix]", cfg.BaseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("oip: BaseURL %q: no query or fragment allowed", cfg.BaseURL)
	}
	if cfg.Model == "" {
		return nil, errors.New("oip: Config.Model is empty")
	}
	c := &Client{
		http:    cfg.HTTPClient,
		header:  cfg.Header.Clone(),
		timeout: cfg.Timeout,
		base:    strings.TrimRight(u.String(), "/"),
		model:   cfg.Model,
	}
	if c.http == nil {
		c.http = httpcall.SharedClient
	}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	c.modelPath = "/v2/models/" + url.PathEscape(cfg.Model)
	if cfg.Version != "" {
		c.modelPath += "/versions/" + url.PathEscape(cfg.Version)
	}
	return c, nil
}

// Ready returns nil when both the server (GET /v2/health/ready) and the model
// (GET /v2/models/{name}[/versions/{v}]/ready) answer 200. A non-200 answer gives an error
// wrapping ErrNotReady and the StatusError; no answer gives a TransportError.
func (c *Client) Ready(ctx context.Context) error {
	for _, p := range []string{"/v2/health/ready", c.modelPath + "/ready"} {
		if _, err := c.do(ctx, http.MethodGet, p, nil); err != nil {
			var se *StatusError
			if errors.As(err, &se) {
				return fmt.Errorf("%w: %w", ErrNotReady, err)
			}
			return err
		}
	}
	return nil
}

// WaitReady polls Ready every interval until it returns nil or ctx ends; then it returns
// the last error Ready gave before ctx ended, joined with ctx's error.
func (c *Client) WaitReady(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last error
	for {
		err := c.Ready(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return errors.Join(last, ctx.Err())
		case <-t.C:
		}
	}
}

// Metadata fetches the model's metadata. The client keeps the last metadata fetched and,
// when it declares inputs, Infer checks every input against it (known name, datatype, rank,
// fixed dimensions) before sending.
func (c *Client) Metadata(ctx context.Context) (Metadata, error) {
	body, err := c.do(ctx, http.MethodGet, c.modelPath, nil)
	if err != nil {
		return Metadata{}, err
	}
	var m Metadata
	if err := json.Unmarshal(body, &m); err != nil {
		return Metadata{}, fmt.Errorf("%w: metadata of %s: %v", ErrInvalidResponse, c.model, err)
	}
	c.meta.Store(&m)
	return m, nil
}

// Infer sends inputs to POST /v2/models/{name}[/versions/{v}]/infer and returns the
// outputs in the server's order. Inputs that are inconsistent (data length vs shape, a
// datatype other than FP32, NaN or Inf, which JSON cannot carry) or that contradict the
// metadata fetched earlier fail with ErrInvalidInput without a request.
func (c *Client) Infer(ctx context.Context, inputs []Tensor) ([]Tensor, error) {
	if err := c.check(inputs); err != nil {
		return nil, err
	}
	buf := bufPool.Get().(*[]byte)
	defer func() {
		if cap(*buf) <= 1<<20 {
			bufPool.Put(buf)
		}
	}()
	*buf = encodeRequest((*buf)[:0], inputs)
	body, err := c.do(ctx, http.MethodPost, c.modelPath+"/infer", *buf)
	if err != nil {
		return nil, err
	}
	return decodeResponse(body)
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func (c *Client) check(inputs []Tensor) error {
	if len(inputs) == 0 {
		return fmt.Errorf("%w: no inputs", ErrInvalidInput)
	}
	meta := c.meta.Load()
	for i, t := range inputs {
		if t.Name == "" {
			return fmt.Errorf("%w: input %d has no name", ErrInvalidInput, i)
		}
		if t.Datatype != "" && t.Datatype != "FP32" {
			return fmt.Errorf("%w: input %q: datatype %q, only FP32 is supported", ErrInvalidInput, t.Name, t.Datatype)
		}
		n := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("%w: input %q: negative dimension in shape %v", ErrInvalidInput, t.Name, t.Shape)
			}
			if d > 0 && n > math.MaxInt64/d {
				return fmt.Errorf("%w: input %q: shape %v is too large", ErrInvalidInput, t.Name, t.Shape)
			}
			n *= d
		}
		if n != int64(len(t.Data)) {
			return fmt.Errorf("%w: input %q: shape %v holds %d values, data has %d", ErrInvalidInput, t.Name, t.Shape, n, len(t.Data))
		}
		for j, v := range t.Data {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("%w: input %q: value %d is %v, which JSON cannot carry", ErrInvalidInput, t.Name, j, v)
			}
		}
		if meta != nil && len(meta.Inputs) > 0 {
			if err := checkAgainst(t, meta.Inputs); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkAgainst(t Tensor, decl []TensorMetadata) error {
	for _, d := range decl {
		if d.Name != t.Name {
			continue
		}
		if d.Datatype != "" && d.Datatype != "FP32" {
			return fmt.Errorf("%w: input %q: the model wants %s, the client sends FP32", ErrInvalidInput, t.Name, d.Datatype)
		}
		if len(d.Shape) == 0 {
			return nil
		}
		if len(d.Shape) != len(t.Shape) {
			return fmt.Errorf("%w: input %q: shape %v, the model wants %v", ErrInvalidInput, t.Name, t.Shape, d.Shape)
		}
		for k, want := range d.Shape {
			if want >= 0 && t.Shape[k] != want {
				return fmt.Errorf("%w: input %q: shape %v, the model wants %v", ErrInvalidInput, t.Name, t.Shape, d.Shape)
			}
		}
		return nil
	}
	names := make([]string, len(decl))
	for i, d := range decl {
		names[i] = d.Name
	}
	return fmt.Errorf("%w: input %q: the model's inputs are %v", ErrInvalidInput, t.Name, names)
}

// encodeRequest appends {"inputs":[{"name","shape","datatype","data"}...]} to b. Data is
// flat (row-major), each value the shortest decimal that reads back as the same float32.
func encodeRequest(b []byte, inputs []Tensor) []byte {
	b = append(b, `{"inputs":[`...)
	for i, t := range inputs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = strconv.AppendQuote(b, t.Name)
		b = append(b, `,"shape":[`...)
		for j, d := range t.Shape {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, d, 10)
		}
		b = append(b, `],"datatype":"FP32","data":[`...)
		for j, v := range t.Data {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendFloat(b, float64(v), 'g', -1, 32)
		}
		b = append(b, "]}"...)
	}
	return append(b, "]}"...)
}

type wireOutput struct {
	Name     string          `json:"name"`
	Shape    []int64         `json:"shape"`
	Datatype string          `json:"datatype"`
	Data     json.RawMessage `json:"data"`
}

type wireResponse struct {
	ModelName string       `json:"model_name"`
	Outputs   []wireOutput `json:"outputs"`
}

var numericTypes = map[string]bool{
	"FP16": true, "FP32": true, "FP64": true, "BF16": true,
	"INT8": true, "INT16": true, "INT32": true, "INT64": true,
	"UINT8": true, "UINT16": true, "UINT32": true, "UINT64": true,
}

func decodeResponse(body []byte) ([]Tensor, error) {
	var r wireResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidResponse, err)
	}
	if len(r.Outputs) == 0 {
		return nil, fmt.Errorf("%w: no outputs", ErrInvalidResponse)
	}
	out := make([]Tensor, len(r.Outputs))
	for i, o := range r.Outputs {
		if !numericTypes[o.Datatype] {
			return nil, fmt.Errorf("%w: output %q: datatype %q is not numeric", ErrInvalidResponse, o.Name, o.Datatype)
		}
		n := int64(1)
		for _, d := range o.Shape {
			if d < 0 {
				return nil, fmt.Errorf("%w: output %q: negative dimension in shape %v", ErrInvalidResponse, o.Name, o.Shape)
			}
			if d > 0 && n > math.MaxInt64/d {
				return nil, fmt.Errorf("%w: output %q: shape %v is too large", ErrInvalidResponse, o.Name, o.Shape)
			}
			n *= d
		}
		// Each value takes at least two bytes ("0,"): size the slice by the body, not by a
		// shape the server may have got wrong.
		data, err := appendNumbers(make([]float32, 0, min(n, int64(len(o.Data))/2+1)), o.Data)
		if err != nil {
			return nil, fmt.Errorf("%w: output %q: data: %v", ErrInvalidResponse, o.Name, err)
		}
		if int64(len(data)) != n {
			return nil, fmt.Errorf("%w: output %q: shape %v holds %d values, data has %d", ErrInvalidResponse, o.Name, o.Shape, n, len(data))
		}
		out[i] = Tensor{Name: o.Name, Datatype: o.Datatype, Shape: o.Shape, Data: data}
	}
	return out, nil
}

// appendNumbers appends the numbers of a JSON array, flat or nested (the protocol allows
// row-major nesting), to dst as float32.
func appendNumbers(dst []float32, raw json.RawMessage) ([]float32, error) {
	var flat []float64
	if err := json.Unmarshal(raw, &flat); err == nil {
		for _, v := range flat {
			dst = append(dst, float32(v))
		}
		return dst, nil
	}
	var nested []json.RawMessage
	if err := json.Unmarshal(raw, &nested); err != nil {
		return dst, errors.New("not an array of numbers")
	}
	for _, e := range nested {
		if len(e) > 0 && e[0] == '[' {
			var err error
			if dst, err = appendNumbers(dst, e); err != nil {
				return dst, err
			}
			continue
		}
		v, err := strconv.ParseFloat(string(e), 64)
		if err != nil {
			return dst, fmt.Errorf("%s is not a number", httpcall.Truncate(string(e), 40))
		}
		dst = append(dst, float32(v))
	}
	return dst, nil
}

// do sends one request and returns the 2xx body, bounded by MaxResponseBytes.
func (c *Client) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	return httpcall.Do(ctx, httpcall.Request{Client: "oip", HTTP: c.http, Method: method, URL: c.base + path, Header: c.header,
		Body: body, Timeout: c.timeout, MaxBytes: MaxResponseBytes, TooLarge: ErrResponseTooLarge, ErrorMessage: errorMessage})
}

// errorMessage extracts the server's message from an error body: the OIP {"error": "..."},
// FastAPI's {"detail": ...} (MLServer's request validation), else the body's text.
func errorMessage(body []byte) string {
	var e struct {
		Error  *string         `json:"error"`
		Detail json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &e) == nil {
		if e.Error != nil {
			return httpcall.Truncate(*e.Error, maxMessage)
		}
		if len(e.Detail) > 0 {
			var s string
			if json.Unmarshal(e.Detail, &s) == nil {
				return httpcall.Truncate(s, maxMessage)
			}
			return httpcall.Truncate(string(e.Detail), maxMessage)
		}
	}
	return httpcall.Truncate(strings.TrimSpace(string(body)), maxMessage)
}
