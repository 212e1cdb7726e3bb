package oip

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// Unit tests of the encoding, decoding and error handling against in-process fake servers;
// oip_test.go runs the client against a real MLServer.

func fakeServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

func TestNewConfig(t *testing.T) {
	for _, cfg := range []Config{
		{BaseURL: "", Model: "m"},
		{BaseURL: "127.0.0.1:8080", Model: "m"},
		{BaseURL: "ftp://host", Model: "m"},
		{BaseURL: "http://host?x=1", Model: "m"},
		{BaseURL: "http://host"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
}

func TestInferRequestEncoding(t *testing.T) {
	var got struct {
		Path, Auth, ContentType string
		Body                    map[string]any
	}
	s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) {
		got.Path, got.Auth, got.ContentType = r.URL.EscapedPath(), r.Header.Get("Authorization"), r.Header.Get("Content-Type")
		if err := json.NewDecoder(r.Body).Decode(&got.Body); err != nil {
			t.Error(err)
		}
		io.WriteString(w, `{"model_name":"m/1","model_version":"v 2","outputs":[
			{"name":"p","shape":[2,2],"datatype":"FP64","data":[[0.25,0.75],[0.1,0.9]]},
			{"name":"label","shape":[2],"datatype":"INT64","data":[1,0]}]}`)
	})
	c := newClient(t, Config{BaseURL: s.URL + "/prefix/", Model: "m/1", Version: "v 2",
		Header: http.Header{"Authorization": {"Bearer xyz"}}})
	out, err := c.Infer(context.Background(), []Tensor{
		{Name: "x", Shape: []int64{2, 3}, Data: []float32{1, 2.5, 36.8, -0.1, 1e-7, 3.4028235e38}},
		{Name: "y", Datatype: "FP32", Shape: []int64{}, Data: []float32{7}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.Path != "/prefix/v2/models/m%2F1/versions/v%202/infer" || got.Auth != "Bearer xyz" || got.ContentType != "application/json" {
		t.Errorf("request path %q, Authorization %q, Content-Type %q", got.Path, got.Auth, got.ContentType)
	}
	wantBody := `{"inputs":[{"data":[1,2.5,36.8,-0.1,1e-7,3.4028235e+38],"datatype":"FP32","name":"x","shape":[2,3]},` +
		`{"data":[7],"datatype":"FP32","name":"y","shape":[]}]}`
	if b, _ := json.Marshal(got.Body); string(b) != wantBody {
		t.Errorf("request body\n%s\nwant\n%s", b, wantBody)
	}
	if len(out) != 2 ||
		out[0].Name != "p" || out[0].Datatype != "FP64" || !slices.Equal(out[0].Shape, []int64{2, 2}) || !slices.Equal(out[0].Data, []float32{0.25, 0.75, 0.1, 0.9}) ||
		out[1].Name != "label" || out[1].Datatype != "INT64" || !slices.Equal(out[1].Data, []float32{1, 0}) {
		t.Errorf("outputs %+v", out)
	}
}

func TestInferLocalChecks(t *testing.T) {
	c := newClient(t, Config{BaseURL: "http://127.0.0.1:1", Model: "m"})
	nan := float32(0)
	nan /= nan
	for name, in := range map[string][]Tensor{
		"no inputs": nil,
		"no name":   {{Shape: []int64{1}, Data: []float32{1}}},
		"FP64":      {{Name: "x", Datatype: "FP64", Shape: []int64{1}, Data: []float32{1}}},
		"negative":  {{Name: "x", Shape: []int64{-1}, Data: []float32{1}}},
		"too long":  {{Name: "x", Shape: []int64{1, 1}, Data: []float32{1, 2}}},
		"overflow":  {{Name: "x", Shape: []int64{1 << 32, 1 << 32}, Data: nil}},
		"NaN":       {{Name: "x", Shape: []int64{1}, Data: []float32{nan}}},
	} {
		if _, err := c.Infer(context.Background(), in); !errors.Is(err, ErrInvalidInput) || Retryable(err) {
			t.Errorf("%s: %v, want non-retryable ErrInvalidInput", name, err)
		}
	}
}

func TestErrorResponses(t *testing.T) {
	cases := []struct {
		status    int
		body      string
		msg       string
		retryable bool
	}{
		{400, `{"error":"input vitals: bad datatype"}`, "input vitals: bad datatype", false},
		{404, `{"error":"Model m not found"}`, "Model m not found", false},
		{422, `{"detail":[{"type":"json_invalid","msg":"JSON decode error"}]}`, `[{"type":"json_invalid","msg":"JSON decode error"}]`, false},
		{429, `{"error":"slow down"}`, "slow down", true},
		{500, "Internal Server Error", "Internal Server Error", true},
		{503, "  upstream unavailable\n", "upstream unavailable", true},
		{502, "", "", true},
	}
	for _, tc := range cases {
		s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			io.WriteString(w, tc.body)
		})
		c := newClient(t, Config{BaseURL: s.URL, Model: "m"})
		_, err := c.Infer(context.Background(), benchInput)
		var se *StatusError
		if !errors.As(err, &se) || se.StatusCode != tc.status || se.Message != tc.msg {
			t.Errorf("%d %q: %v, want StatusError with message %q", tc.status, tc.body, err, tc.msg)
			continue
		}
		if Retryable(err) != tc.retryable {
			t.Errorf("%d: Retryable = %v, want %v", tc.status, !tc.retryable, tc.retryable)
		}
		if !strings.Contains(err.Error(), http.StatusText(tc.status)) {
			t.Errorf("%d: error %q does not say the status", tc.status, err)
		}
	}
}

func TestInvalidResponses(t *testing.T) {
	for name, body := range map[string]string{
		"not JSON":     `<html>`,
		"no outputs":   `{"model_name":"m","outputs":[]}`,
		"short data":   `{"outputs":[{"name":"p","shape":[1,2],"datatype":"FP32","data":[1]}]}`,
		"BYTES":        `{"outputs":[{"name":"p","shape":[1],"datatype":"BYTES","data":["a"]}]}`,
		"string data":  `{"outputs":[{"name":"p","shape":[1],"datatype":"FP32","data":["a"]}]}`,
		"nested junk":  `{"outputs":[{"name":"p","shape":[2],"datatype":"FP32","data":[[1],["x"]]}]}`,
		"negative dim": `{"outputs":[{"name":"p","shape":[-1],"datatype":"FP32","data":[]}]}`,
		"huge shape":   `{"outputs":[{"name":"p","shape":[4294967296,4294967296,4],"datatype":"FP32","data":[1]}]}`,
	} {
		s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) })
		c := newClient(t, Config{BaseURL: s.URL, Model: "m"})
		if _, err := c.Infer(context.Background(), benchInput); !errors.Is(err, ErrInvalidResponse) || Retryable(err) {
			t.Errorf("%s: %v, want non-retryable ErrInvalidResponse", name, err)
		}
	}
}

func TestResponseTooLarge(t *testing.T) {
	big := strings.Repeat(" ", MaxResponseBytes+1)
	for _, chunked := range []bool{false, true} {
		s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) {
			if chunked {
				w.(http.Flusher).Flush() // no Content-Length
			}
			io.WriteString(w, big)
		})
		c := newClient(t, Config{BaseURL: s.URL, Model: "m"})
		if _, err := c.Infer(context.Background(), benchInput); !errors.Is(err, ErrResponseTooLarge) || Retryable(err) {
			t.Errorf("chunked %v: %v, want ErrResponseTooLarge", chunked, err)
		}
	}
}

// A server that accepts and never answers: Config.Timeout ends the call, retryably.
func TestTimeoutOnHungServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	c := newClient(t, Config{BaseURL: "http://" + l.Addr().String(), Model: "m", Timeout: time.Second})
	start := time.Now()
	_, err = c.Infer(context.Background(), benchInput)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || !Retryable(err) || took >= 2*time.Second {
		t.Errorf("hung server: %v after %v, want a retryable deadline error within 2 s", err, took)
	}

	// The caller's cancellation is not retryable.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = c.Infer(ctx, benchInput)
	if !errors.Is(err, context.Canceled) || Retryable(err) {
		t.Errorf("canceled: %v, want non-retryable context.Canceled", err)
	}
	if Retryable(nil) {
		t.Error("Retryable(nil)")
	}
}

func TestReadyNotReady(t *testing.T) {
	s := fakeServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/health/ready" {
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":"model m is loading"}`)
	})
	c := newClient(t, Config{BaseURL: s.URL, Model: "m"})
	err := c.Ready(context.Background())
	if !errors.Is(err, ErrNotReady) || !Retryable(err) || !strings.Contains(err.Error(), "model m is loading") {
		t.Errorf("Ready: %v, want retryable ErrNotReady with the server's message", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := c.WaitReady(ctx, 50*time.Millisecond); !errors.Is(err, ErrNotReady) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitReady: %v, want ErrNotReady joined with the deadline", err)
	}
}

// BenchmarkEncodeDecode is the client's own CPU cost per batch-1 call, without the network:
// encoding the request and decoding an MLServer-shaped response.
func BenchmarkEncodeDecode(b *testing.B) {
	resp := []byte(`{"model_name":"deterioration","model_version":"1","id":"04c8b751-fb67-4c29-bfde-33943ceea06c",` +
		`"parameters":{},"outputs":[{"name":"predict_proba","shape":[1,2],"datatype":"FP64",` +
		`"parameters":{"content_type":"np"},"data":[0.8662010376186434,0.13379896238135657]}]}`)
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for range b.N {
		buf = encodeRequest(buf[:0], benchInput)
		if _, err := decodeResponse(resp); err != nil {
			b.Fatal(err)
		}
	}
}
