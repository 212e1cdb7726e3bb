package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"carehub/processors/inference/httpcall"
)

// Defaults for Config fields left zero.
const (
	// DefaultTimeout bounds one call when Config.Timeout is 0. Generation is slow (seconds
	// to minutes on CPU), so it is longer than a plain RPC's.
	DefaultTimeout = 2 * time.Minute
	// DefaultMaxResponseBytes bounds a response body when Config.MaxResponseBytes is 0.
	DefaultMaxResponseBytes = 8 << 20
	// maxMessage is how much of the server's message goes into an error string.
	maxMessage = 1024
)

var (
	// ErrInvalidRequest wraps every reason Complete refuses a request before sending it.
	ErrInvalidRequest = errors.New("chat: invalid request")
	// ErrInvalidResponse wraps every reason a 2xx response body is refused (bad JSON, no
	// choices, content that is not a string, no usage).
	ErrInvalidResponse = errors.New("chat: invalid response")
	// ErrResponseTooLarge: the response body is longer than the configured bound.
	ErrResponseTooLarge = errors.New("chat: response too large")
	// ErrNotReady is wrapped by Ready's error when the server answers but cannot serve the
	// model.
	ErrNotReady = errors.New("chat: not ready")
)

// Config says where the model is served and how to reach it.
type Config struct {
	// BaseURL is the server's root, e.g. http://127.0.0.1:8080, with or without a trailing
	// /v1 (a path prefix is kept).
	BaseURL string
	// APIKey, when set, is sent as "Authorization: Bearer <APIKey>". It never appears in
	// errors or logs.
	APIKey string
	// Model is the model's name on the server, sent with every request.
	Model string
	// Timeout bounds each call; 0 means DefaultTimeout, a negative value means none (the
	// caller's context only).
	Timeout time.Duration
	// HTTPClient, when set, is used instead of the package's shared keep-alive client.
	HTTPClient *http.Client
	// MaxResponseBytes bounds a response body; 0 means DefaultMaxResponseBytes.
	MaxResponseBytes int64
}

// Message is one turn of the conversation.
type Message struct {
	Role    string `json:"role"` // system, user, assistant
	Content string `json:"content"`
}

// Request is one chat completion request. Zero and nil fields are left to the server.
type Request struct {
	Messages []Message
	// MaxTokens bounds the completion's tokens; 0 leaves it to the server (which may
	// generate up to its context size).
	MaxTokens   int
	Temperature *float64
	Seed        *int64
	Stop        []string
}

// Usage is the server's token count for one call.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Response is the first choice of a chat completion and the call's usage.
type Response struct {
	ID           string
	Model        string // as the server names it, which may differ from Config.Model
	Content      string
	FinishReason string // "stop", "length", …; empty when the server sent none
	Usage        Usage
}

// StatusError is a non-2xx response: the HTTP status and the server's message (the
// "message" of the OpenAI error body, FastAPI's "detail", or the start of a plain body).
type StatusError = httpcall.StatusError

// TransportError is a request that got no HTTP response: connection refused or reset,
// timeout, DNS failure, the connection closed mid-response.
type TransportError = httpcall.TransportError

// Retryable reports whether err is worth retrying later, on this or another replica: a
// TransportError (connection refused or reset, a timeout, including Config.Timeout
// expiring) or a StatusError with status 408, 429 or 5xx. The caller's own mistakes are
// not: other 4xx statuses (bad key, prompt longer than the context, malformed request),
// ErrInvalidRequest, ErrInvalidResponse, ErrResponseTooLarge, and a context the caller
// canceled.
func Retryable(err error) bool { return httpcall.Retryable(err) }

// Client talks to one model on one OpenAI-compatible server. It is safe for concurrent use.
type Client struct {
	http     *http.Client
	auth     string // "Bearer <key>" or empty
	timeout  time.Duration
	maxBytes int64
	base     string // BaseURL without a trailing slash or /v1
	shown    string // base with user information removed, for errors
	model    string
}

// New checks cfg and returns a client. It does not contact the server (see Ready).
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil {
		// url's error quotes the URL, which may hold a password: say only what is wrong.
		return nil, errors.New("chat: BaseURL does not parse as a URL")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("chat: BaseURL %q: want http(s)://host[:port][/prefix]", u.Redacted())
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("chat: BaseURL %q: no query or fragment allowed", u.Redacted())
	}
	if cfg.Model == "" {
		return nil, errors.New("chat: Config.Model is empty")
	}
	if strings.ContainsFunc(cfg.APIKey, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return nil, errors.New("chat: Config.APIKey holds control characters")
	}
	c := &Client{
		http:     cfg.HTTPClient,
		timeout:  cfg.Timeout,
		maxBytes: cfg.MaxResponseBytes,
		base:     trimBase(u.String()),
		shown:    trimBase(u.Redacted()),
		model:    cfg.Model,
	}
	if cfg.APIKey != "" {
		c.auth = "Bearer " + cfg.APIKey
	}
	if c.http == nil {
		c.http = httpcall.SharedClient
	}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if c.maxBytes <= 0 {
		c.maxBytes = DefaultMaxResponseBytes
	}
	return c, nil
}

// trimBase drops trailing slashes and a final /v1: the paths the client adds start with
// /v1, and OpenAI's own clients are configured with the /v1 included.
func trimBase(s string) string {
	s = strings.TrimRight(s, "/")
	return strings.TrimRight(strings.TrimSuffix(s, "/v1"), "/")
}

// Ready returns nil when GET /v1/models answers 200 and, if the answer lists models,
// Config.Model is among them: servers such as llama-cpp-python's answer requests for an
// unknown model with their default model rather than an error. A non-2xx answer or a
// missing model gives an error wrapping ErrNotReady; no answer gives a TransportError.
func (c *Client) Ready(ctx context.Context) error {
	body, err := c.do(ctx, http.MethodGet, "/v1/models", nil)
	if err != nil {
		var se *StatusError
		if errors.As(err, &se) {
			return fmt.Errorf("%w: %w", ErrNotReady, err)
		}
		return err
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &list) != nil || len(list.Data) == 0 {
		return nil // 200 is all the API promises
	}
	ids := make([]string, len(list.Data))
	for i, m := range list.Data {
		ids[i] = m.ID
	}
	if !slices.Contains(ids, c.model) {
		return fmt.Errorf("%w: model %q is not among the server's models %q", ErrNotReady, c.model, httpcall.Truncate(strings.Join(ids, ", "), maxMessage))
	}
	return nil
}

// wireRequest is the body of POST /v1/chat/completions.
type wireRequest struct {
	Model       string    `json:"model"`
	Messages    []Message `json:"messages"`
	MaxTokens   int       `json:"max_tokens,omitempty"`
	Temperature *float64  `json:"temperature,omitempty"`
	Seed        *int64    `json:"seed,omitempty"`
	Stop        []string  `json:"stop,omitempty"`
	Stream      bool      `json:"stream"`
}

// Complete sends r to POST /v1/chat/completions (not streamed) and returns the first
// choice with the call's token usage. A request that cannot be valid (no messages, a
// message without a role, negative MaxTokens, a NaN temperature) fails with
// ErrInvalidRequest without being sent.
func (c *Client) Complete(ctx context.Context, r Request) (Response, error) {
	if err := check(r); err != nil {
		return Response{}, err
	}
	body, err := json.Marshal(wireRequest{
		Model: c.model, Messages: r.Messages, MaxTokens: r.MaxTokens,
		Temperature: r.Temperature, Seed: r.Seed, Stop: r.Stop,
	})
	if err != nil {
		return Response{}, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	b, err := c.do(ctx, http.MethodPost, "/v1/chat/completions", body)
	if err != nil {
		return Response{}, err
	}
	return decodeResponse(b)
}

// check refuses requests the server would refuse, without saying anything of their
// content (it may be a patient's).
func check(r Request) error {
	if len(r.Messages) == 0 {
		return fmt.Errorf("%w: no messages", ErrInvalidRequest)
	}
	for i, m := range r.Messages {
		if m.Role == "" {
			return fmt.Errorf("%w: message %d has no role", ErrInvalidRequest, i)
		}
	}
	if r.MaxTokens < 0 {
		return fmt.Errorf("%w: MaxTokens %d is negative", ErrInvalidRequest, r.MaxTokens)
	}
	if t := r.Temperature; t != nil && (math.IsNaN(*t) || math.IsInf(*t, 0) || *t < 0) {
		return fmt.Errorf("%w: temperature %v", ErrInvalidRequest, *t)
	}
	return nil
}

type wireResponse struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content json.RawMessage `json:"content"`
		} `json:"message"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *Usage `json:"usage"`
}

// decodeResponse checks a 2xx body. Usage is required: carehub records the tokens each
// call really cost, and a server that does not count them is not one it can use.
func decodeResponse(body []byte) (Response, error) {
	var w wireResponse
	if err := json.Unmarshal(body, &w); err != nil {
		return Response{}, fmt.Errorf("%w: %v", ErrInvalidResponse, err)
	}
	if len(w.Choices) == 0 {
		return Response{}, fmt.Errorf("%w: no choices", ErrInvalidResponse)
	}
	ch := w.Choices[0]
	var content string
	if err := json.Unmarshal(ch.Message.Content, &content); err != nil || ch.Message.Content[0] != '"' {
		return Response{}, fmt.Errorf("%w: choice 0: message content is not a string", ErrInvalidResponse)
	}
	if w.Usage == nil {
		return Response{}, fmt.Errorf("%w: no usage", ErrInvalidResponse)
	}
	u := *w.Usage
	if u.PromptTokens < 0 || u.CompletionTokens < 0 || u.TotalTokens < 0 {
		return Response{}, fmt.Errorf("%w: negative token count in usage %+v", ErrInvalidResponse, u)
	}
	resp := Response{ID: w.ID, Model: w.Model, Content: content, Usage: u}
	if ch.FinishReason != nil {
		resp.FinishReason = *ch.FinishReason
	}
	return resp, nil
}

// do sends one request and returns the 2xx body, bounded by the client's maxBytes.
func (c *Client) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	var h http.Header
	if c.auth != "" {
		h = http.Header{"Authorization": {c.auth}}
	}
	return httpcall.Do(ctx, httpcall.Request{Client: "chat", HTTP: c.http, Method: method, URL: c.base + path, Shown: c.shown + path,
		Header: h, Body: body, Timeout: c.timeout, MaxBytes: c.maxBytes, TooLarge: ErrResponseTooLarge, ErrorMessage: errorMessage})
}

// errorMessage extracts the server's message from an error body: OpenAI's
// {"error": {"message": ...}}, {"error": "..."}, FastAPI's {"detail": ...}, else the body's
// text.
func errorMessage(body []byte) string {
	var e struct {
		Error  json.RawMessage `json:"error"`
		Detail json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &e) == nil {
		if len(e.Error) > 0 {
			var obj struct {
				Message string `json:"message"`
			}
			var s string
			if json.Unmarshal(e.Error, &obj) == nil && obj.Message != "" {
				return httpcall.Truncate(obj.Message, maxMessage)
			}
			if json.Unmarshal(e.Error, &s) == nil {
				return httpcall.Truncate(s, maxMessage)
			}
		}
		if len(e.Detail) > 0 {
			return httpcall.Truncate(detailMessage(e.Detail), maxMessage)
		}
	}
	return httpcall.Truncate(strings.TrimSpace(string(body)), maxMessage)
}

// detailMessage renders FastAPI's detail: a string, or validation errors as "loc: msg"
// only, because each also carries the "input" it refused, which may be a patient's
// message.
func detailMessage(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var items []struct {
		Loc []any  `json:"loc"`
		Msg string `json:"msg"`
	}
	if json.Unmarshal(raw, &items) != nil {
		return "(unreadable detail)"
	}
	parts := make([]string, 0, len(items))
	for _, it := range items {
		loc := make([]string, len(it.Loc))
		for i, l := range it.Loc {
			loc[i] = fmt.Sprint(l)
		}
		parts = append(parts, strings.Join(loc, ".")+": "+it.Msg)
	}
	return strings.Join(parts, "; ")
}
