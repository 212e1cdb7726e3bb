package chat

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Unit tests of the encoding, decoding and error handling against in-process fake servers;
// llamacpp_test.go runs the client against a real llama-cpp-python server.

const okBody = `{"id":"chatcmpl-1","object":"chat.completion","model":"m-served",
	"choices":[{"index":0,"message":{"role":"assistant","content":"hi there"},"finish_reason":"length"}],
	"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}`

func fakeServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

func newTestClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	if cfg.Model == "" {
		cfg.Model = "m"
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var hello = Request{Messages: []Message{{Role: "user", Content: "hello"}}}

func TestNewConfig(t *testing.T) {
	for _, cfg := range []Config{
		{BaseURL: "", Model: "m"},
		{BaseURL: "127.0.0.1:8080", Model: "m"},
		{BaseURL: "ftp://host", Model: "m"},
		{BaseURL: "http://host?x=1", Model: "m"},
		{BaseURL: "http://host"},
		{BaseURL: "http://host", Model: "m", APIKey: "sk-x\r\nX-Evil: 1"},
	} {
		_, err := New(cfg)
		if err == nil {
			t.Errorf("New(%+v): no error", cfg)
		} else if strings.Contains(err.Error(), "sk-x") {
			t.Errorf("New's error shows the API key: %v", err)
		}
	}
}

func TestCompleteRequestEncoding(t *testing.T) {
	var got struct {
		Path, Auth, ContentType string
		Body                    map[string]any
	}
	s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) {
		got.Path, got.Auth, got.ContentType = r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("Content-Type")
		if err := json.NewDecoder(r.Body).Decode(&got.Body); err != nil {
			t.Error(err)
		}
		io.WriteString(w, okBody)
	})
	temp, seed := 0.0, int64(7)
	for _, base := range []string{s.URL + "/prefix", s.URL + "/prefix/", s.URL + "/prefix/v1", s.URL + "/prefix/v1/"} {
		c := newTestClient(t, Config{BaseURL: base, Model: "tiny", APIKey: "sk-secret"})
		resp, err := c.Complete(context.Background(), Request{
			Messages:  []Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello"}},
			MaxTokens: 5, Temperature: &temp, Seed: &seed, Stop: []string{"\n"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got.Path != "/prefix/v1/chat/completions" || got.Auth != "Bearer sk-secret" || got.ContentType != "application/json" {
			t.Errorf("BaseURL %q: path %q, Authorization %q, Content-Type %q", base, got.Path, got.Auth, got.ContentType)
		}
		want := Response{ID: "chatcmpl-1", Model: "m-served", Content: "hi there", FinishReason: "length",
			Usage: Usage{PromptTokens: 12, CompletionTokens: 2, TotalTokens: 14}}
		if resp != want {
			t.Errorf("response %+v, want %+v", resp, want)
		}
	}
	wantBody := `{"max_tokens":5,"messages":[{"content":"be brief","role":"system"},{"content":"hello","role":"user"}],` +
		`"model":"tiny","seed":7,"stop":["\n"],"stream":false,"temperature":0}`
	if b, _ := json.Marshal(got.Body); string(b) != wantBody {
		t.Errorf("request body\n%s\nwant\n%s", b, wantBody)
	}
}

func TestCompleteOmitsUnsetFieldsAndKey(t *testing.T) {
	var body map[string]any
	var auth []string
	s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) {
		auth = r.Header.Values("Authorization")
		json.NewDecoder(r.Body).Decode(&body)
		io.WriteString(w, okBody)
	})
	if _, err := newTestClient(t, Config{BaseURL: s.URL}).Complete(context.Background(), hello); err != nil {
		t.Fatal(err)
	}
	if len(auth) != 0 {
		t.Errorf("Authorization sent without an API key: %q", auth)
	}
	for _, k := range []string{"max_tokens", "temperature", "seed", "stop"} {
		if _, ok := body[k]; ok {
			t.Errorf("request has %q though it was not set: %v", k, body)
		}
	}
}

func TestCompleteLocalChecks(t *testing.T) {
	c := newTestClient(t, Config{BaseURL: "http://127.0.0.1:1"})
	nan, neg := 0.0, -1.0
	nan /= nan
	for name, r := range map[string]Request{
		"no messages":   {},
		"no role":       {Messages: []Message{{Content: "x"}}},
		"negative max":  {Messages: hello.Messages, MaxTokens: -1},
		"NaN temp":      {Messages: hello.Messages, Temperature: &nan},
		"negative temp": {Messages: hello.Messages, Temperature: &neg},
	} {
		if _, err := c.Complete(context.Background(), r); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: %v, want ErrInvalidRequest", name, err)
		}
	}
}

func TestErrorResponses(t *testing.T) {
	for _, tc := range []struct {
		status    int
		body      string
		msg       string
		retryable bool
	}{
		{429, `{"error":{"message":"slow down","type":"rate_limit"}}`, "slow down", true},
		{500, `{"error":"boom"}`, "boom", true},
		{503, `loading model`, "loading model", true},
		{408, ``, "", true},
		{401, `{"detail":"Invalid API key"}`, "Invalid API key", false},
		{400, `{"error":{"message":"Requested tokens (900) exceed context window of 512","type":"invalid_request_error"}}`,
			"Requested tokens (900) exceed context window of 512", false},
		// FastAPI's validation error echoes the input (patient text); only loc and msg are kept.
		{422, `{"detail":[{"type":"missing","loc":["body","messages",0,"role"],"msg":"Field required","input":{"content":"PATIENT-SECRET"}}]}`,
			"body.messages.0.role: Field required", false},
		{404, `{"error":{"message":"model not found"}}`, "model not found", false},
	} {
		s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			io.WriteString(w, tc.body)
		})
		_, err := newTestClient(t, Config{BaseURL: s.URL, APIKey: "sk-secret"}).Complete(context.Background(), hello)
		var se *StatusError
		if !errors.As(err, &se) || se.StatusCode != tc.status || se.Message != tc.msg {
			t.Errorf("%d %s: %v, want a StatusError with message %q", tc.status, tc.body, err, tc.msg)
			continue
		}
		if Retryable(err) != tc.retryable {
			t.Errorf("%d: Retryable = %v, want %v", tc.status, Retryable(err), tc.retryable)
		}
		if s := err.Error(); strings.Contains(s, "sk-secret") || strings.Contains(s, "PATIENT") {
			t.Errorf("error shows a secret or the input: %s", s)
		}
	}
}

func TestInvalidResponses(t *testing.T) {
	for name, body := range map[string]string{
		"malformed JSON": `{"choices":[`,
		"no choices":     `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":0,"total_tokens":1}}`,
		"null content":   `{"choices":[{"message":{"role":"assistant","content":null}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`,
		"array content":  `{"choices":[{"message":{"role":"assistant","content":[{"type":"text","text":"x"}]}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`,
		"no content":     `{"choices":[{"message":{"role":"assistant"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`,
		"missing usage":  `{"choices":[{"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}]}`,
		"null usage":     `{"choices":[{"message":{"role":"assistant","content":"x"}}],"usage":null}`,
		"negative usage": `{"choices":[{"message":{"role":"assistant","content":"x"}}],"usage":{"prompt_tokens":-1,"completion_tokens":1,"total_tokens":0}}`,
	} {
		s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) })
		_, err := newTestClient(t, Config{BaseURL: s.URL}).Complete(context.Background(), hello)
		if !errors.Is(err, ErrInvalidResponse) || Retryable(err) {
			t.Errorf("%s: %v, want a non-retryable ErrInvalidResponse", name, err)
		}
	}
}

func TestResponseTooLarge(t *testing.T) {
	big := `{"choices":[{"message":{"role":"assistant","content":"` + strings.Repeat("x", 2000) + `"}}],` +
		`"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	for _, chunked := range []bool{false, true} {
		s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) {
			if chunked {
				w.(http.Flusher).Flush() // no Content-Length: the limit applies while reading
			}
			io.WriteString(w, big)
		})
		c := newTestClient(t, Config{BaseURL: s.URL, MaxResponseBytes: 1000})
		if _, err := c.Complete(context.Background(), hello); !errors.Is(err, ErrResponseTooLarge) || Retryable(err) {
			t.Errorf("chunked=%v: %v, want a non-retryable ErrResponseTooLarge", chunked, err)
		}
		c = newTestClient(t, Config{BaseURL: s.URL, MaxResponseBytes: int64(len(big))})
		if _, err := c.Complete(context.Background(), hello); err != nil {
			t.Errorf("chunked=%v, body exactly at the limit: %v", chunked, err)
		}
	}
}

func TestTransportErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: connection refused
	c := newTestClient(t, Config{BaseURL: "http://user:hunter2@" + addr})
	_, err = c.Complete(context.Background(), hello)
	var te *TransportError
	if !errors.As(err, &te) || !Retryable(err) {
		t.Errorf("refused: %v, want a retryable TransportError", err)
	}
	if err != nil && strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error shows the URL's password: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Complete(ctx, hello); err == nil || Retryable(err) {
		t.Errorf("canceled context: %v, want a non-retryable error", err)
	}
}

func TestTimeoutOnHungServer(t *testing.T) {
	release := make(chan struct{})
	s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	c := newTestClient(t, Config{BaseURL: s.URL, Timeout: 200 * time.Millisecond})
	start := time.Now()
	_, err := c.Complete(context.Background(), hello)
	var te *TransportError
	if !errors.As(err, &te) || !errors.Is(err, context.DeadlineExceeded) || !Retryable(err) {
		t.Errorf("%v, want a retryable TransportError wrapping DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestReady(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		ok     bool
	}{
		{200, `{"object":"list","data":[{"id":"other"},{"id":"m"}]}`, true},
		{200, `{}`, true}, // no listing: 200 is all that is promised
		{200, `{"object":"list","data":[{"id":"other"}]}`, false},
		{503, `{"error":{"message":"loading"}}`, false},
		{401, `{"detail":"Invalid API key"}`, false},
	} {
		s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet || r.URL.Path != "/v1/models" || r.Header.Get("Authorization") != "Bearer k" {
				t.Errorf("%s %s, Authorization %q", r.Method, r.URL.Path, r.Header.Get("Authorization"))
			}
			w.WriteHeader(tc.status)
			io.WriteString(w, tc.body)
		})
		err := newTestClient(t, Config{BaseURL: s.URL + "/v1", APIKey: "k"}).Ready(context.Background())
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrNotReady)) {
			t.Errorf("%d %s: %v", tc.status, tc.body, err)
		}
	}
}
