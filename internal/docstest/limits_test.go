package docstest

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"carehub/api/auth"
	"carehub/api/fhir"
	"carehub/api/graphql"
	"carehub/api/rest"
	"carehub/api/server"
	"carehub/api/ws"
	"carehub/ingest/intake"
	"carehub/kernel/apikeys"
	"carehub/kernel/egress"
	"carehub/kernel/jsonwire"
	"carehub/processors/fanout"
	"carehub/processors/feed"
	"carehub/processors/fhirsubs"
	"carehub/processors/patients"
	"carehub/processors/webhooks"
	"carehub/processors/workflows"
	"carehub/storage/idempotency"
)

// limits is what each row of docs/LIMITS.md must say: the constants the code runs with.
func limits() map[string]string {
	def, ref := auth.DefaultLimits(), auth.DefaultRefusalLimits()
	var schedule []string
	for _, d := range webhooks.DefaultSchedule {
		schedule = append(schedule, d.String())
	}
	return map[string]string{
		"requests":                              rate(def.Default),
		"ingest requests":                       rate(def.Ingest),
		"requests per organization":             rate(def.OrgDefault),
		"ingest requests per organization":      rate(def.OrgIngest),
		"requests in progress":                  fmt.Sprint(auth.DefaultMaxInFlight),
		"audited refusals per client address":   rate(ref.PerSource),
		"audited refusals, all addresses":       rate(ref.Total),
		"request body":                          size(auth.DefaultBodyLimit),
		"ingest body":                           size(auth.IngestBodyLimit),
		"observation":                           size(intake.MaxEntryBytes),
		"observations per request":              fmt.Sprint(intake.DefaultMaxEntries),
		"events per batch":                      fmt.Sprint(feed.MaxBatch),
		"JSON number":                           fmt.Sprint(jsonwire.MaxNumberLength),
		"JSON nesting":                          fmt.Sprint(jsonwire.MaxStorableDepth),
		"GraphQL query":                         size(graphql.DefaultMaxQueryBytes),
		"WebSocket message":                     size(ws.DefaultMaxMessageBytes),
		"depth":                                 fmt.Sprint(graphql.MaxDepth),
		"introspection depth":                   fmt.Sprint(graphql.IntrospectionMaxDepth),
		"cost":                                  fmt.Sprint(graphql.DefaultMaxCost),
		"answer size":                           size(graphql.DefaultMaxResponseBytes),
		"answer rate per key":                   size(graphql.DefaultAnswerBytesPerSecond) + "/s",
		"subscription bytes per organization":   size(graphql.DefaultFanOutBytesPerSecond) + "/s",
		"subscription backlog":                  fmt.Sprintf("%d events, %s", fanout.DefaultBuffer, size(fanout.MaxQueueBytes)),
		"shared subscription backlog":           fmt.Sprintf("%d results, %s", graphql.MemberMaxResults, size(graphql.MemberMaxBytes)),
		"event page payloads":                   size(rest.MaxPageBytes),
		"exports in progress":                   fmt.Sprint(patients.MaxExportsInProgress),
		"subscriptions per organization":        fmt.Sprint(fhirsubs.MaxPerOrganization),
		"subscription sockets per node":         fmt.Sprint(fhir.MaxSubscriptionSockets),
		"subscription sockets per organization": fmt.Sprint(fhir.MaxSubscriptionSocketsPerOrg),
		"sockets per subscription":              fmt.Sprint(fhir.MaxSocketsPerSubscription),
		"subscription heartbeat":                fmt.Sprintf("%ds at least", fhirsubs.MinHeartbeat),
		"subscription events per notification":  fmt.Sprintf("1-%d, default %d", fhirsubs.MaxMaxCount, fhirsubs.DefaultMaxCount),
		"subscription retry":                    fmt.Sprintf("%s doubling to %s", seconds(fhirsubs.FirstRetry), seconds(fhirsubs.LastRetry)),
		"events read by $events":                fmt.Sprint(fhirsubs.MaxEventsRead),
		"subscription event retention":          hours(fhirsubs.EventRetention),
		"export file":                           fmt.Sprintf("%d resources, %s", patients.DefaultExportPartResources, size(patients.DefaultExportPartBytes)),
		"export retention":                      fmt.Sprintf("%g h", patients.DefaultExportRetention.Hours()),
		"key cache":                             auth.DefaultCacheTTL.String(),
		"`limit` default":                       fmt.Sprint(graphql.DefaultLimit),
		"`limit` maximum":                       fmt.Sprint(graphql.MaxLimit),
		"operations per WebSocket connection":   fmt.Sprint(ws.DefaultMaxOperationsPerConn),
		"WebSocket send queue":                  size(ws.DefaultQueueBytes),
		"WebSockets per key":                    fmt.Sprint(ws.DefaultSocketsPerKey),
		"WebSocket operations per key":          fmt.Sprint(ws.DefaultOperationsPerKey),
		"WebSockets per organization":           fmt.Sprint(ws.DefaultSocketsPerOrg),
		"WebSocket operations per organization": fmt.Sprint(ws.DefaultOperationsPerOrg),
		"WebSocket operations per node":         fmt.Sprint(ws.DefaultOperations),
		"open connections":                      fmt.Sprint(server.DefaultMaxConns),
		"request header timeout":                seconds(server.DefaultReadHeaderTimeout),
		"request read timeout":                  seconds(server.DefaultReadTimeout),
		"write timeout":                         seconds(server.DefaultWriteTimeout),
		"idle timeout":                          seconds(server.DefaultIdleTimeout),
		"WebSocket init timeout":                ws.DefaultInitTimeout.String(),
		"slow subscriber":                       ws.DefaultSlowConsumerTimeout.String(),
		"ingest latency budget":                 intake.DefaultLatencyBudget.String(),
		"ingest max lag":                        fmt.Sprint(intake.DefaultMaxLag),
		"ingest request timeout":                intake.DefaultRequestTimeout.String(),
		"observation in the future":             hours(intake.DefaultMaxFuture),
		"JWT lifetime":                          hours(auth.TokenLifetime),
		"rotated key validity":                  hours(apikeys.RotationGrace),
		"idempotency replay":                    hours(idempotency.Retention),
		"attempt timeout":                       webhooks.DefaultTimeout.String(),
		"retry schedule":                        strings.Join(schedule, ", "),
		"failures before pause":                 fmt.Sprint(webhooks.PauseAfter),
		"secret rotation overlap":               hours(webhooks.RotationOverlap),
		"redelivery window":                     webhooks.RedeliverWindow.String(),
		"attempts in flight per subscription":   fmt.Sprint(webhooks.DefaultMaxInFlightPerSubscription),
		"events per batched POST":               fmt.Sprint(webhooks.MaxBatchSize),
		"subscription rate limit":               fmt.Sprint(webhooks.MaxRateLimit),
		"attempts in flight per node":           fmt.Sprint(webhooks.DefaultMaxInFlight),
		"answer headers":                        size(egress.MaxAnswerHeaderBytes),
		"steps":                                 fmt.Sprint(workflows.MaxSteps),
		"trigger depth":                         fmt.Sprint(workflows.MaxTriggerDepth),
	}
}

func rate(r auth.Rate) string { return fmt.Sprintf("%g/s, burst %d", r.PerSecond, r.Burst) }

func size[T ~int | ~int64](n T) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// seconds writes a duration in seconds, "120s" (Duration.String says "2m0s").
func seconds(d time.Duration) string { return fmt.Sprintf("%gs", d.Seconds()) }

// hours writes whole hours as "1h", "24h" (Duration.String says "1h0m0s").
func hours(d time.Duration) string {
	if d%time.Hour == 0 {
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return d.String()
}

// TestLimitsDoc holds every row of docs/LIMITS.md to the code's constant: a row the test does
// not know, a limit the page lacks and a value that differs all fail.
func TestLimitsDoc(t *testing.T) {
	doc := read(t, "docs/LIMITS.md")
	want := limits()
	got := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\| ([^|]+?) \| ([^|]+?) \| [^|]+\|$`).FindAllStringSubmatch(doc, -1) {
		if m[1] == "limit" || strings.HasPrefix(m[1], "---") {
			continue
		}
		if _, dup := got[m[1]]; dup {
			t.Errorf("docs/LIMITS.md: two rows %q", m[1])
		}
		got[m[1]] = m[2]
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		v, ok := got[name]
		switch {
		case !ok:
			t.Errorf("docs/LIMITS.md has no row %q (the code's value: %s)", name, want[name])
		case v != want[name]:
			t.Errorf("docs/LIMITS.md: %q is %q, the code's value is %q", name, v, want[name])
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("docs/LIMITS.md: row %q is checked against no constant (add it to limits())", name)
		}
	}
}
