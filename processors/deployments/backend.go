package deployments

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"carehub/kernel/access"
	"carehub/kernel/egress"
	"carehub/kernel/fault"
	"carehub/kernel/sealing"
	"carehub/processors/inference/chat"
	"carehub/processors/inference/httpcall"
	"carehub/processors/inference/oip"
)

// ProtocolOIP is the Open Inference Protocol v2 over REST (KServe, Triton, MLServer, OpenVINO).
const ProtocolOIP = "oip-v2"

// Backend is an external inference server a deployment sends its invocations to, instead of
// running a model itself. Its credential is kept sealed and never shown.
type Backend struct {
	Protocol string `json:"protocol"`          // ProtocolOIP or ProtocolChat
	URL      string `json:"url"`               // the server's base URL, e.g. https://kserve.example.org
	Model    string `json:"model"`             // the model's name on the server
	Version  string `json:"version,omitempty"` // the model's version on the server; "" for its default
	// BAA: the server's operator is covered by a business associate agreement, so a HIPAA-mode
	// deployment may send it a patient's identifiers; otherwise LLM agents send it a
	// de-identified context.
	BAA bool `json:"baa,omitempty"`
}

// BackendInput is a Backend as createDeployment takes it: with the value of the Authorization
// header the server wants ("" for none), which is sealed before it is stored.
type BackendInput struct {
	Backend
	Authorization string
}

// check validates b; allowPrivate lets its URL name loopback and private addresses (a test or
// an on-premises inference server).
func (b *BackendInput) check(allowPrivate bool) map[string]string {
	bad := map[string]string{}
	if b.Protocol != ProtocolOIP && b.Protocol != ProtocolChat {
		bad["backend.protocol"] = "must be " + ProtocolOIP + " (the Open Inference Protocol v2: KServe, Triton, MLServer, OpenVINO) or " +
			ProtocolChat + " (OpenAI-compatible chat completions: vLLM, llama.cpp's server, TGI, Ollama)"
	}
	if b.Protocol == ProtocolChat && b.Version != "" {
		bad["backend.version"] = "an " + ProtocolChat + " server names its models without versions: omit version"
	}
	if err := egress.CheckURL(b.URL, allowPrivate); err != nil {
		fields, _ := fault.As(err).Details["fields"].(map[string]any)
		bad["backend.url"] = fmt.Sprint(fields["url"]) // CheckURL's refusals all name url
	}
	if b.Model == "" || len(b.Model) > 200 {
		bad["backend.model"] = "the model's name on the server: 1 to 200 characters"
	}
	if len(b.Version) > 100 {
		bad["backend.version"] = "at most 100 characters"
	}
	if len(b.Authorization) > 4096 {
		bad["backend.authorization"] = "at most 4096 characters"
	}
	return bad
}

// credentialInfo names this use of the server key (kernel/sealing derives one key per use).
const credentialInfo = "carehub deployment backend credential v1"

// credentialBox seals backend credentials, bound to their deployment's id.
type credentialBox struct{ aead cipher.AEAD }

func newCredentialBox(key *sealing.Key) credentialBox {
	if key == nil {
		key = sealing.Random()
	}
	aead, err := key.AEAD(credentialInfo, nil)
	if err != nil {
		panic("deployments: sealing key: " + err.Error()) // HKDF and AES-GCM fail only on lengths, fixed here
	}
	return credentialBox{aead: aead}
}

func (b credentialBox) seal(id, credential string) []byte {
	if credential == "" {
		return nil
	}
	n := b.aead.NonceSize()
	nonce := make([]byte, n, n+len(credential)+b.aead.Overhead())
	rand.Read(nonce)
	return b.aead.Seal(nonce, nonce, []byte(credential), []byte(id))
}

func (b credentialBox) open(id string, sealed []byte) (string, error) {
	if sealed == nil {
		return "", nil
	}
	n := b.aead.NonceSize()
	if len(sealed) < n {
		return "", errors.New("backend credential does not open")
	}
	plain, err := b.aead.Open(nil, sealed[:n], sealed[n:], []byte(id))
	if err != nil {
		return "", errors.New("backend credential does not open under this node's sealing key")
	}
	return string(plain), nil
}

// Circuit breaking of a backend that keeps failing: after breakerFailures retryable failures in
// a row, invocations fail at once for breakerOpen, then one is let through to try it again.
const (
	breakerFailures = 5
	breakerOpen     = 2 * time.Second
)

// remote is a node's client of one deployment's backend, with its circuit breaker.
type remote struct {
	backend    Backend // what the client was made from
	credential string
	client     *oip.Client  // ProtocolOIP
	chat       *chat.Client // ProtocolChat

	mu           sync.Mutex
	failures     int
	openUntil    time.Time
	features     features
	featuresRead bool
}

// allow reports whether a call may go to the backend now, or the error to answer instead.
func (r *remote) allow(now time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Before(r.openUntil) {
		return fault.Unavailable("the deployment's inference backend failed %d times in a row; carehub tries it again in %s", r.failures, r.openUntil.Sub(now).Round(100*time.Millisecond))
	}
	return nil
}

// record counts the outcome of a call.
func (r *remote) record(err error, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil || !httpcall.Retryable(err) { // both protocols' clients fail as httpcall says
		r.failures = 0
		return
	}
	r.failures++
	if r.failures >= breakerFailures {
		r.openUntil = now.Add(breakerOpen)
	}
}

// remotes are an Invoker's backend clients, by deployment.
type remotes struct {
	mu           sync.Mutex
	byDeployment map[string]*remote
	transport    http.RoundTripper // connects to public addresses only, unless allowPrivate
}

func newRemotes(allowPrivate bool) *remotes {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.Control = egress.DialControl
	}
	t := &http.Transport{DialContext: dialer.DialContext, ForceAttemptHTTP2: true, MaxIdleConns: 256,
		MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 5 * time.Second}
	return &remotes{byDeployment: map[string]*remote{}, transport: t}
}

// get returns the client of deployment id's backend b, made anew when b or its credential changed.
func (rs *remotes) get(id string, b *Backend, credential string, timeout time.Duration) (*remote, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r := rs.byDeployment[id]; r != nil && r.backend == *b && r.credential == credential {
		return r, nil
	}
	h := http.Header{}
	if credential != "" {
		h.Set("Authorization", credential)
	}
	hc := &http.Client{Transport: rs.transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	r := &remote{backend: *b, credential: credential}
	var err error
	if b.Protocol == ProtocolChat {
		// OpenAI-compatible servers take a bearer token; "Bearer " is optional in the credential.
		token := credential
		if len(token) > 7 && strings.EqualFold(token[:7], "bearer ") {
			token = token[7:]
		}
		r.chat, err = chat.New(chat.Config{BaseURL: b.URL, Model: b.Model, APIKey: token, Timeout: timeout, HTTPClient: hc})
	} else {
		r.client, err = oip.New(oip.Config{BaseURL: b.URL, Model: b.Model, Version: b.Version, Header: h, Timeout: timeout, HTTPClient: hc})
	}
	if err != nil {
		return nil, fmt.Errorf("backend of %s: %w", id, err)
	}
	rs.byDeployment[id] = r
	return r, nil
}

// invokeBackend sends req to deployment d's inference server; the caller holds a replica. A
// retryable failure (connection refused, timeout, 5xx) is retried once; failures in a row open
// the circuit (remote.allow) so that a dead server answers at once instead of after a timeout.
// Only feature values reach the server: never a patient's id, name or any date.
func (inv *Invoker) invokeBackend(ctx context.Context, p *access.Principal, d *served, req InvokeRequest, res *InvokeResult) error {
	r, err := inv.remotes.get(d.id, d.backend, d.credential, inv.cfg.BackendTimeout)
	if err != nil {
		return err
	}
	if err := r.allow(time.Now()); err != nil {
		return err
	}
	f, err := inv.backendFeatures(ctx, d, r)
	if err != nil {
		return err
	}
	in, pred, err := inv.prepare(ctx, p, d, f, req)
	if err != nil {
		return err
	}
	tensors := make([]oip.Tensor, len(in))
	for i, t := range in {
		data := make([]float32, len(t.Data))
		for j, x := range t.Data {
			data[j] = float32(x)
		}
		tensors[i] = oip.Tensor{Name: t.Name, Datatype: "FP32", Shape: t.Shape, Data: data}
	}
	sent := time.Now()
	out, err := r.client.Infer(ctx, tensors)
	if oip.Retryable(err) && ctx.Err() == nil {
		out, err = r.client.Infer(ctx, tensors)
	}
	answered := time.Now()
	res.Backend = answered.Sub(sent)
	r.record(err, answered)
	var se *oip.StatusError
	switch {
	case err == nil:
	case errors.Is(err, oip.ErrInvalidInput):
		return fault.Validation("the model cannot take these inputs", map[string]string{"inputs": err.Error()})
	case errors.As(err, &se) && (se.StatusCode == http.StatusBadRequest || se.StatusCode == http.StatusUnprocessableEntity):
		return fault.Validation("the inference backend refused the inputs", map[string]string{"inputs": se.Message})
	default:
		return fault.Wrap(fault.KindUnavailable, err, "the deployment's inference backend did not answer: "+err.Error())
	}
	outputs := make([]ModelTensor, len(out))
	for i, t := range out {
		outputs[i] = ModelTensor{Name: t.Name, Shape: t.Shape, Datatype: t.Datatype, Data: float64s(t.Data)}
	}
	pred.Model = d.backend.Protocol + ":" + d.backend.Model
	if d.backend.Version != "" {
		pred.Model += "/" + d.backend.Version
	}
	pred.withOutputs(outputs)
	res.Runtime, res.Prediction = ProtocolOIP, pred
	return nil
}

// backendFeatures says how d's backend takes vitals: as the model file the asset's version
// carries says (the same model, served elsewhere), else tensors only.
func (inv *Invoker) backendFeatures(ctx context.Context, d *served, r *remote) (features, error) {
	if d.modelSHA == nil {
		return features{}, nil
	}
	r.mu.Lock()
	f, ok := r.features, r.featuresRead
	r.mu.Unlock()
	if ok {
		return f, nil
	}
	var sig struct {
		Inputs   []struct{ Name string }
		Metadata map[string]string
	}
	if err := inv.s.pool.QueryRow(ctx, `select signature from model_artifacts where sha256 = $1`, *d.modelSHA).Scan(&sig); err != nil {
		return features{}, fmt.Errorf("model of %s: %w", d.id, err)
	}
	var inputs []string
	for _, in := range sig.Inputs {
		inputs = append(inputs, in.Name)
	}
	f = featuresOf(sig.Metadata, inputs)
	r.mu.Lock()
	r.features, r.featuresRead = f, true
	r.mu.Unlock()
	return f, nil
}
