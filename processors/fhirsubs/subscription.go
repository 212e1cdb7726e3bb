package fhirsubs

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"carehub/kernel/egress"
	"carehub/kernel/fault"
	"carehub/kernel/ids"
)

// The backport IG's extensions and profiles, and carehub's one extension.
const (
	backport          = "http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/"
	extFilterCriteria = backport + "backport-filter-criteria"
	extPayloadContent = backport + "backport-payload-content"
	extHeartbeat      = backport + "backport-heartbeat-period"
	extTimeout        = backport + "backport-timeout"
	extMaxCount       = backport + "backport-max-count"
	profSubscription  = backport + "backport-subscription"
	profStatus        = backport + "backport-subscription-status-r4"
	profNotification  = backport + "backport-subscription-notification-r4"
	// ExtSigningSecret carries a rest-hook subscription's whsec_ signing secret, in the answer to
	// its create only.
	ExtSigningSecret = "https://carehub.example/fhir/StructureDefinition/subscription-signing-secret"
)

// Channel types and payload contents.
const (
	ChannelRestHook  = "rest-hook"
	ChannelWebSocket = "websocket"
	ContentEmpty     = "empty"
	ContentIDOnly    = "id-only"
	ContentFull      = "full-resource"
)

// Statuses of a subscription (R4's Subscription.status).
const (
	StatusRequested = "requested"
	StatusActive    = "active"
	StatusError     = "error"
	StatusOff       = "off"
)

// Bounds of a subscription's settings.
const (
	maxHeaders   = 10
	maxHeaderLen = 1024
	maxHeartbeat = 3600
	// MinHeartbeat is the shortest heartbeat period: a subscription must not make carehub a
	// source of a POST a second to any URL its creator chooses.
	MinHeartbeat      = 60
	defaultTimeout    = 10
	maxTimeout        = 60
	DefaultMaxCount   = 20
	MaxMaxCount       = 100
	maxReasonLen      = 1024
	maxCriteriaLength = 2048
)

// Subscription is a stored subscription.
type Subscription struct {
	ID, OrgID, KeyID, Mode string
	Scopes                 []string
	Topic                  Topic
	Filters                Filters
	Criteria               string // the filter criteria as written, one per line
	Reason                 string
	Channel                string
	Endpoint               string
	Headers                []string
	Content                string
	HeartbeatSeconds       int
	TimeoutSeconds         int
	MaxCount               int
	Status                 string
	EventsSinceStart       int64
	DeliveredThrough       int64
	Failures               int
	LastError              string
	CreatedAt              time.Time
	LastSentAt             *time.Time // the last notification a rest-hook receiver took; nil: not even the handshake
}

// Filters are a subscription's filter values; empty ones match everything.
type Filters struct {
	Patient string `json:"patient,omitempty"` // a carehub patient id
	Code    string `json:"code,omitempty"`    // a LOINC code, or news2 / qsofa
}

// matches reports whether an event of p passes f.
func (f Filters) matches(p payload) bool {
	return (f.Patient == "" || f.Patient == p.PatientID) && (f.Code == "" || strings.EqualFold(f.Code, p.Code))
}

// r4Subscription is the R4 Subscription resource, as the backport profiles it.
type r4Subscription struct {
	ResourceType string      `json:"resourceType"`
	ID           string      `json:"id,omitempty"`
	Meta         *meta       `json:"meta,omitempty"`
	Extension    []extension `json:"extension,omitempty"`
	Status       string      `json:"status"`
	End          string      `json:"end,omitempty"`
	Reason       string      `json:"reason"`
	Criteria     string      `json:"criteria"`
	CriteriaExt  *element    `json:"_criteria,omitempty"`
	Error        string      `json:"error,omitempty"`
	Channel      struct {
		Extension  []extension `json:"extension,omitempty"`
		Type       string      `json:"type"`
		Endpoint   string      `json:"endpoint,omitempty"`
		Payload    string      `json:"payload,omitempty"`
		PayloadExt *element    `json:"_payload,omitempty"`
		Header     []string    `json:"header,omitempty"`
	} `json:"channel"`
}

type meta struct {
	Profile []string `json:"profile,omitempty"`
}

type element struct {
	Extension []extension `json:"extension,omitempty"`
}

type extension struct {
	URL              string  `json:"url"`
	ValueString      *string `json:"valueString,omitempty"`
	ValueCode        *string `json:"valueCode,omitempty"`
	ValueUnsignedInt *int    `json:"valueUnsignedInt,omitempty"`
	ValuePositiveInt *int    `json:"valuePositiveInt,omitempty"`
}

// intValue is an extension's unsignedInt or positiveInt.
func (e extension) intValue() (int, bool) {
	switch {
	case e.ValueUnsignedInt != nil:
		return *e.ValueUnsignedInt, true
	case e.ValuePositiveInt != nil:
		return *e.ValuePositiveInt, true
	}
	return 0, false
}

// parse reads an R4 Subscription a client sent into what create stores. Every refusal is a
// fault.Validation naming the element (FHIRPath), so the FHIR base answers an OperationOutcome
// whose issue.expression points at it.
func parse(body []byte, allowPrivate bool) (Subscription, error) {
	var r r4Subscription
	if err := json.Unmarshal(body, &r); err != nil {
		return Subscription{}, fault.Invalid("the body is not a Subscription resource: %v", err)
	}
	bad := func(field, format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		return fault.Validation(field+": "+msg, map[string]string{"Subscription." + field: msg})
	}
	if r.ResourceType != "Subscription" {
		return Subscription{}, bad("resourceType", "must be Subscription")
	}
	var s Subscription
	switch r.Status {
	case StatusRequested, StatusActive, "":
	default:
		return s, bad("status", "a new subscription is requested (or active); %q is the server's to set", r.Status)
	}
	if r.End != "" {
		return s, bad("end", "is not supported: delete the subscription to end it")
	}
	if len(r.Reason) > maxReasonLen {
		return s, bad("reason", "is longer than %d characters", maxReasonLen)
	}
	s.Reason = r.Reason
	topic, ok := LookupTopic(r.Criteria)
	if r.Criteria == "" || !strings.HasPrefix(r.Criteria, TopicBase) || !ok {
		return s, bad("criteria", "must be the canonical URL of a topic of this server's catalogue (%s{id}, "+
			"GET /fhir/R4/SubscriptionTopic lists them)", TopicBase)
	}
	s.Topic = topic
	if r.CriteriaExt != nil {
		var parts []string
		for _, e := range r.CriteriaExt.Extension {
			if e.URL != extFilterCriteria || e.ValueString == nil {
				return s, bad("criteria.extension", "only %s with a valueString is understood", extFilterCriteria)
			}
			parts = append(parts, *e.ValueString)
		}
		f, err := parseFilters(topic, parts)
		if err != nil {
			return s, bad("criteria.extension", "%v", err)
		}
		s.Filters, s.Criteria = f, strings.Join(parts, "\n")
	}

	ch := r.Channel
	s.Channel = ch.Type
	switch ch.Type {
	case ChannelRestHook:
		if err := egress.CheckURL(ch.Endpoint, allowPrivate); err != nil {
			return s, bad("channel.endpoint", "%v", fault.As(err).Message)
		}
		s.Endpoint = ch.Endpoint
	case ChannelWebSocket:
		if ch.Endpoint != "" {
			return s, bad("channel.endpoint", "a websocket channel has no endpoint: bind to it with $get-ws-binding-token")
		}
	default:
		return s, bad("channel.type", "must be rest-hook or websocket")
	}
	switch ch.Payload {
	case "", "application/fhir+json", "application/json":
	default:
		return s, bad("channel.payload", "must be application/fhir+json")
	}
	s.Content = ContentIDOnly
	if ch.PayloadExt != nil {
		for _, e := range ch.PayloadExt.Extension {
			if e.URL != extPayloadContent || e.ValueCode == nil {
				continue
			}
			switch *e.ValueCode {
			case ContentEmpty, ContentIDOnly, ContentFull:
				s.Content = *e.ValueCode
			default:
				return s, bad("channel.payload.extension", "payload content must be empty, id-only or full-resource")
			}
		}
	} else if ch.Payload == "" {
		s.Content = ContentEmpty
	}
	if len(ch.Header) > maxHeaders {
		return s, bad("channel.header", "at most %d headers", maxHeaders)
	}
	for _, h := range ch.Header {
		name, _, ok := strings.Cut(h, ":")
		if !ok || name != strings.TrimSpace(name) || !validHeaderName(name) || len(h) > maxHeaderLen || strings.ContainsAny(h, "\r\n\x00") {
			return s, bad("channel.header", "each header is \"Name: value\" on one line, at most %d characters", maxHeaderLen)
		}
	}
	if s.Channel == ChannelWebSocket && len(ch.Header) > 0 {
		return s, bad("channel.header", "a websocket channel sends no HTTP headers")
	}
	s.Headers = ch.Header
	s.TimeoutSeconds, s.MaxCount = defaultTimeout, DefaultMaxCount
	for _, e := range ch.Extension {
		n, isInt := e.intValue()
		set := func(dst *int, lo, hi int) error {
			if !isInt || n < lo || n > hi {
				return bad("channel.extension", "%s takes an integer from %d to %d", e.URL[len(backport):], lo, hi)
			}
			*dst = n
			return nil
		}
		var err error
		switch e.URL {
		case extHeartbeat:
			err = set(&s.HeartbeatSeconds, MinHeartbeat, maxHeartbeat)
		case extTimeout:
			err = set(&s.TimeoutSeconds, 1, maxTimeout)
		case extMaxCount:
			err = set(&s.MaxCount, 1, MaxMaxCount)
		}
		if err != nil {
			return s, err
		}
	}
	return s, nil
}

// validHeaderName reports whether name is an HTTP token carehub lets a subscription set: not the
// headers carehub's signature and transport own (hop-by-hop ones included: a subscription asks
// for no protocol switch or connection handling).
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", c)) {
			return false
		}
	}
	switch strings.ToLower(name) {
	case "host", "content-length", "content-type", "transfer-encoding", "connection", "upgrade", "keep-alive", "te", "trailer",
		"proxy-connection", "webhook-id", "webhook-timestamp", "webhook-signature":
		return false
	}
	return true
}

// parseFilters reads filter criteria such as "Observation?patient=Patient/pat-1&code=8867-4": the
// topic's resource type, then its filter parameters, each once.
func parseFilters(t Topic, parts []string) (Filters, error) {
	var f Filters
	seen := map[string]bool{}
	for _, c := range parts {
		if len(c) > maxCriteriaLength {
			return f, fmt.Errorf("filter criteria longer than %d characters", maxCriteriaLength)
		}
		typ, query, _ := strings.Cut(c, "?")
		if typ != t.Resource {
			return f, fmt.Errorf("filter criteria %q: topic %s filters %s resources: %s?name=value", c, t.ID, t.Resource, t.Resource)
		}
		v, err := url.ParseQuery(query)
		if err != nil {
			return f, fmt.Errorf("filter criteria %q: %v", c, err)
		}
		for name, vals := range v {
			if seen[name] || len(vals) != 1 {
				return f, fmt.Errorf("filter %s is given more than once", name)
			}
			seen[name] = true
			val := strings.TrimSpace(vals[0])
			switch name {
			case "patient":
				id := ids.FromFHIR(strings.TrimPrefix(val, "Patient/"))
				if !ids.Valid(ids.Patient, id) {
					return f, fmt.Errorf("filter patient %q is not a patient reference (Patient/{id})", val)
				}
				f.Patient = id
			case "code":
				system, code, hasSystem := strings.Cut(val, "|")
				if !hasSystem {
					code, system = system, ""
				}
				if code == "" || len(code) > 64 {
					return f, fmt.Errorf("filter code %q: a code is required", val)
				}
				if t.Resource == "RiskAssessment" {
					code = strings.ToLower(code)
					if code != "news2" && code != "qsofa" {
						return f, fmt.Errorf("filter code %q: an assessment is news2 or qsofa", val)
					}
				} else if hasSystem && system != "http://loinc.org" {
					return f, fmt.Errorf("filter code %q: observations are coded in LOINC (http://loinc.org)", val)
				}
				f.Code = code
			default:
				var names []string
				for _, p := range t.Filters {
					names = append(names, p.Name)
				}
				return f, fmt.Errorf("topic %s cannot filter by %q: it filters by %s", t.ID, name, strings.Join(names, ", "))
			}
		}
	}
	return f, nil
}

// resource renders s as an R4 Subscription. Header values are not shown (they hold receivers'
// credentials): each header is its name and "***". secret, when set, is the signing secret of
// a subscription just created, shown this once.
func (s Subscription) resource(secret string) r4Subscription {
	r := r4Subscription{ResourceType: "Subscription", ID: ids.FHIR(s.ID), Meta: &meta{Profile: []string{profSubscription}},
		Status: s.Status, Reason: s.Reason, Criteria: s.Topic.URL()}
	if s.Criteria != "" {
		r.CriteriaExt = &element{}
		for c := range strings.SplitSeq(s.Criteria, "\n") {
			r.CriteriaExt.Extension = append(r.CriteriaExt.Extension, extension{URL: extFilterCriteria, ValueString: &c})
		}
	}
	if s.Status == StatusError {
		r.Error = s.LastError
	}
	r.Channel.Type, r.Channel.Endpoint, r.Channel.Payload = s.Channel, s.Endpoint, "application/fhir+json"
	content := s.Content
	r.Channel.PayloadExt = &element{Extension: []extension{{URL: extPayloadContent, ValueCode: &content}}}
	for _, h := range s.Headers {
		name, _, _ := strings.Cut(h, ":")
		r.Channel.Header = append(r.Channel.Header, strings.TrimSpace(name)+": ***")
	}
	ints := []struct {
		url string
		n   int
	}{{extHeartbeat, s.HeartbeatSeconds}, {extTimeout, s.TimeoutSeconds}, {extMaxCount, s.MaxCount}}
	for _, x := range ints {
		if x.n > 0 {
			n := x.n
			if x.url == extHeartbeat || x.url == extTimeout {
				r.Channel.Extension = append(r.Channel.Extension, extension{URL: x.url, ValueUnsignedInt: &n})
			} else {
				r.Channel.Extension = append(r.Channel.Extension, extension{URL: x.url, ValuePositiveInt: &n})
			}
		}
	}
	if secret != "" {
		r.Extension = append(r.Extension, extension{URL: ExtSigningSecret, ValueString: &secret})
	}
	return r
}

// number renders an event number as the backport's R4 profiles carry it (a string: int64).
func number(n int64) string { return strconv.FormatInt(n, 10) }
