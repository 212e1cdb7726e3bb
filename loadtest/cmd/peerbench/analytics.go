package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"carehub/kernel/events"
	"carehub/loadtest/loadcli"
	"carehub/loadtest/report"
	"carehub/processors/eventlog"
	chstore "carehub/storage/clickhouse"
)

// The analytics workload (issue 59): Kafka → analytical store. ClickHouse's own Kafka table
// engine (a Kafka table and a materialized view into event_log) beside carehub's event-log
// writer (processors/eventlog, run in this process on storage/clickhouse's store), on one
// Apache Kafka broker (deploy/local/kafka) and one ClickHouse engine (deploy/local/clickhouse),
// both started by this command on ports and state dirs of their own and stopped at the end.
// Every run writes into a fresh database whose tables are carehub's own (storage/clickhouse.Open
// applies schemas/clickhouse), so both sides insert into the same event_log with the same
// materialized views (the hourly counts, the spans) behind it. The records are carehub event
// envelopes (events.Encode), keyed by organization, on a topic of -analytics-partitions.
//
//  1. backlog: -analytics-records records are produced first (not measured); then the engine,
//     and then the writer, each in a consumer group of its own from the start of the topic, is
//     timed from its start until every row is visible (SELECT count() polled every 50 ms): rows/s;
//  2. steady rate: for each of -analytics-rates, a fresh topic, the side started, and records
//     published at that rate for -d, each envelope's createdAt the moment it was produced;
//     publish → visible is read by polling the rows per 50-ms bucket of created_at: the rows a
//     bucket gained since the last poll became visible then (p50, p99, max over rows).
//
// The side that goes first alternates from one comparison to the next. After each run the
// side is stopped and its database must hold exactly the records published, each id once:
// event_log's distinct ids, its rows, and the rows its insert-time view counted
// (event_counts_hourly, which ReplacingMergeTree's merges do not collapse) must all be N, or the
// run is an error.

// analyticsConfig is the workload's part of the flags.
type analyticsConfig struct {
	Records          int           `json:"backlogRecords"`
	Rates            []int         `json:"ratesPerSec"`
	Duration         time.Duration `json:"-"` // each steady-rate run publishes this long (-d)
	Window           time.Duration `json:"-"`
	Partitions       int           `json:"partitions"`
	FlushMs          int           `json:"kafkaFlushIntervalMs"` // 0: the server's stream_flush_interval_ms
	KafkaScript      string        `json:"kafkaScript"`
	ClickHouseScript string        `json:"clickhouseScript"`
	DurationS        string        `json:"duration"`
	WindowS          string        `json:"window"`
	ratesFlag        string
}

func (c *analyticsConfig) parse() []error {
	var errs []error
	for s := range strings.SplitSeq(c.ratesFlag, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100000 {
			errs = append(errs, fmt.Errorf("-analytics-rates: %q is not 1 to 100,000 records/s", s))
			continue
		}
		c.Rates = append(c.Rates, n)
	}
	if c.Records < 1 || c.Records > 10_000_000 {
		errs = append(errs, errors.New("-analytics-records must be 1 to 10,000,000"))
	}
	for _, r := range c.Rates {
		if float64(r)*c.Duration.Seconds() > 10_000_000 {
			errs = append(errs, fmt.Errorf("-analytics-rates %d for -d %s: more than 10,000,000 records", r, c.Duration))
		}
	}
	if c.Window < 10*time.Second || c.Window > 30*time.Minute {
		errs = append(errs, errors.New("-analytics-window must be within [10s, 30m]"))
	}
	if c.Partitions < 1 || c.Partitions > 64 {
		errs = append(errs, errors.New("-analytics-partitions must be 1 to 64"))
	}
	if c.FlushMs < 0 || c.FlushMs > 600000 {
		errs = append(errs, errors.New("-analytics-flush-ms must be 0 (the server's default) to 600,000"))
	}
	return errs
}

// The two sides.
const (
	sideEngine  = "clickhouse-kafka-engine"
	sideCarehub = "carehub-eventlog-writer"
)

// analyticsRun is one side's run: the backlog, or one steady rate.
type analyticsRun struct {
	Side    string `json:"side"`
	Mode    string `json:"mode"` // backlog, rate
	Rate    int    `json:"ratePerSec,omitempty"`
	Topic   string `json:"topic"`
	Records int64  `json:"records"`
	// PublishedPerSec is the rate achieved by the producer (steady runs).
	PublishedPerSec float64 `json:"publishedPerSec,omitempty"`
	// From the side's start (the Kafka table created, the writer started): the first rows
	// visible, every row visible; rows/s is Records over the second.
	FirstVisibleSec     float64 `json:"firstVisibleSec"`
	AllVisibleSec       float64 `json:"allVisibleSec"`
	RowsPerSec          float64 `json:"rowsPerSec"`
	RowsPerSecFirstLast float64 `json:"rowsPerSecFirstToLastVisible"`
	// Publish → visible (steady runs), over LagRows rows.
	LagP50Ms float64 `json:"lagP50Ms,omitempty"`
	LagP99Ms float64 `json:"lagP99Ms,omitempty"`
	LagMaxMs float64 `json:"lagMaxMs,omitempty"`
	LagRows  int64   `json:"lagRows,omitempty"`
	// What the database holds once the side stopped.
	Rows       int64 `json:"rows"`
	Distinct   int64 `json:"distinctIds"`
	Inserted   int64 `json:"rowsInserted"` // counted by event_counts_hourly's view at insert
	Duplicates int64 `json:"duplicates"`
	Parts      int64 `json:"activeParts"`
	// CPU over the run: the ClickHouse server, the broker, this process (the producer, the
	// poller and, for carehub's side, the writer) and the rest of the machine.
	ClickHouseCPUSec float64 `json:"clickhouseCpuSec"`
	KafkaCPUSec      float64 `json:"kafkaCpuSec"`
	ClientCPUSec     float64 `json:"clientCpuSec"`
	OtherCPUSec      float64 `json:"otherCpuSec"`
	Seconds          float64 `json:"seconds"`

	points []report.Point
}

// analyticsComparison is carehub's writer beside the engine in one mode; each ratio is carehub
// ÷ engine.
type analyticsComparison struct {
	Mode              string  `json:"mode"`
	Rate              int     `json:"ratePerSec,omitempty"`
	Records           int64   `json:"records"`
	EngineRowsPerSec  float64 `json:"engineRowsPerSec"`
	CarehubRowsPerSec float64 `json:"carehubRowsPerSec"`
	RatioRows         float64 `json:"ratioRows"`
	EngineLagP50Ms    float64 `json:"engineLagP50Ms,omitempty"`
	EngineLagP99Ms    float64 `json:"engineLagP99Ms,omitempty"`
	EngineLagMaxMs    float64 `json:"engineLagMaxMs,omitempty"`
	CarehubLagP50Ms   float64 `json:"carehubLagP50Ms,omitempty"`
	CarehubLagP99Ms   float64 `json:"carehubLagP99Ms,omitempty"`
	CarehubLagMaxMs   float64 `json:"carehubLagMaxMs,omitempty"`
	RatioLagP50       float64 `json:"ratioLagP50,omitempty"`
	RatioLagP99       float64 `json:"ratioLagP99,omitempty"`
	EngineFlushMs     int     `json:"engineFlushIntervalMs"`
	// Goals (issue 59): carehub's rows/s at least 0.8× the engine's; in a steady run,
	// carehub's publish → visible p99 below the engine's flush interval (nil for the backlog).
	GoalRows bool  `json:"goalRowsMet"`
	GoalLag  *bool `json:"goalLagMet,omitempty"`
}

// minRowsRatio is issue 59's goal for carehub's rows/s against the engine's.
const minRowsRatio = 0.8

func compareAnalytics(engine, carehub analyticsRun, flushMs int) analyticsComparison {
	c := analyticsComparison{Mode: engine.Mode, Rate: engine.Rate, Records: engine.Records,
		EngineRowsPerSec: engine.RowsPerSec, CarehubRowsPerSec: carehub.RowsPerSec, RatioRows: ratio(carehub.RowsPerSec, engine.RowsPerSec),
		EngineFlushMs: flushMs}
	c.GoalRows = engine.RowsPerSec > 0 && c.RatioRows >= minRowsRatio
	if engine.Mode == "rate" {
		c.EngineLagP50Ms, c.EngineLagP99Ms, c.EngineLagMaxMs = engine.LagP50Ms, engine.LagP99Ms, engine.LagMaxMs
		c.CarehubLagP50Ms, c.CarehubLagP99Ms, c.CarehubLagMaxMs = carehub.LagP50Ms, carehub.LagP99Ms, carehub.LagMaxMs
		c.RatioLagP50, c.RatioLagP99 = ratio(carehub.LagP50Ms, engine.LagP50Ms), ratio(carehub.LagP99Ms, engine.LagP99Ms)
		met := carehub.LagRows > 0 && flushMs > 0 && carehub.LagP99Ms < float64(flushMs)
		c.GoalLag = &met
	}
	return c
}

// checkRows is the check every run ends with: exactly want rows, each id once, and as many
// inserted (copies a merge collapsed included).
func checkRows(want, rows, distinct, inserted int64) error {
	switch {
	case distinct != want:
		return fmt.Errorf("%d distinct ids stored, want %d", distinct, want)
	case rows != want || inserted != want:
		return fmt.Errorf("%d duplicates: %d rows, %d inserted, %d distinct ids", max(rows, inserted)-distinct, rows, inserted, distinct)
	}
	return nil
}

// lagBucketMs is the width of the created_at buckets a steady run polls.
const lagBucketMs = 50

// lagSample is rows of one created_at bucket that became visible at one poll.
type lagSample struct {
	lagMs float64
	rows  int64
}

// visibility turns successive polls of the rows per created_at bucket into publish → visible
// samples: the rows a bucket gained since the previous poll became visible at this poll, and
// were published, on average, in the middle of the bucket.
type visibility struct {
	seen    map[int64]int64
	samples []lagSample
	rows    int64
}

func newVisibility() *visibility { return &visibility{seen: map[int64]int64{}} }

// observe takes one poll at nowMs (Unix ms): bucket start (Unix ms) → rows.
func (v *visibility) observe(nowMs int64, counts map[int64]int64) {
	for b, c := range counts {
		if d := c - v.seen[b]; d > 0 {
			v.samples = append(v.samples, lagSample{lagMs: float64(nowMs - (b + lagBucketMs/2)), rows: d})
			v.seen[b] = c
			v.rows += d
		}
	}
}

// parseBuckets reads the poll's answer: lines of "bucket start ms<TAB>rows".
func parseBuckets(tsv string) (map[int64]int64, error) {
	out := map[int64]int64{}
	for line := range strings.SplitSeq(strings.TrimSpace(tsv), "\n") {
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("bucket line %q", line)
		}
		b, err1 := strconv.ParseInt(f[0], 10, 64)
		c, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("bucket line %q", line)
		}
		out[b] += c
	}
	return out, nil
}

// lagPercentiles are the p50, p99 and max of samples weighted by their rows (0s for none).
func lagPercentiles(samples []lagSample) (p50, p99, maxMs float64) {
	s := slices.Clone(samples)
	slices.SortFunc(s, func(a, b lagSample) int { return cmp.Compare(a.lagMs, b.lagMs) })
	var total int64
	for _, x := range s {
		total += x.rows
	}
	if total == 0 {
		return 0, 0, 0
	}
	at := func(q float64) float64 {
		need := int64(math.Ceil(q * float64(total)))
		var acc int64
		for _, x := range s {
			if acc += x.rows; acc >= need {
				return x.lagMs
			}
		}
		return s[len(s)-1].lagMs
	}
	return at(0.5), at(0.99), s[len(s)-1].lagMs
}

// analyticsEvent is record i's envelope: a vital sign of one of 100,000 patients, in one of 50
// organizations and 200 projects, created at t.
func analyticsEvent(i int, t time.Time) ([]byte, error) {
	return events.Encode(events.Event{
		ID: fmt.Sprintf("evt_%026d", i), Type: "vitals.observation.recorded",
		OrgID: fmt.Sprintf("org_%04d", i%50), ProjectID: fmt.Sprintf("prj_%04d", i%200),
		Source: "integration", Severity: "info",
		Payload: json.RawMessage(fmt.Sprintf(`{"patientId":"pat_%06d","code":"8867-4","display":"Heart rate","value":%d,"unit":"/min","device":"monitor-%03d"}`,
			i%100000, 60+i%60, i%300)),
		CreatedAt: t,
	})
}

// clickhouseServer is a ClickHouse engine of deploy/local/clickhouse/clickhouse.sh started by
// this process on free ports with its state in a directory of its own, stopped and deleted by
// Close.
type clickhouseServer struct {
	*localDaemon
	tcp, http string
	client    *http.Client
}

func startClickHouse(ctx context.Context, script string, logw io.Writer) (*clickhouseServer, error) {
	d, err := startDaemon(ctx, "clickhouse", script, logw, [2]string{"CLICKHOUSE_TCP_PORT", "CLICKHOUSE_HTTP_PORT"}, "CLICKHOUSE_STATE_DIR",
		"CLICKHOUSE_DATABASE=peerbench")
	if err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(d.state, "clickhouse.pid")); err == nil {
		d.pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	return &clickhouseServer{localDaemon: d, tcp: fmt.Sprintf("127.0.0.1:%d", d.ports[0]), http: fmt.Sprintf("127.0.0.1:%d", d.ports[1]),
		client: &http.Client{Timeout: 2 * time.Minute}}, nil
}

// query runs one statement over HTTP and returns the answer, trimmed.
func (s *clickhouseServer) query(ctx context.Context, sql string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.http+"/", strings.NewReader(sql))
	if err != nil {
		return "", err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("clickhouse: %s: HTTP %d: %s", snippet([]byte(sql)), resp.StatusCode, snippet(b))
	}
	return strings.TrimSpace(string(b)), nil
}

// ints runs sql, whose answer is one row of integers.
func (s *clickhouseServer) ints(ctx context.Context, sql string) ([]int64, error) {
	out, err := s.query(ctx, sql)
	if err != nil {
		return nil, err
	}
	var vals []int64
	for _, f := range strings.Fields(out) {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("clickhouse: %s: answer %q", snippet([]byte(sql)), out)
		}
		vals = append(vals, v)
	}
	return vals, nil
}

type analyticsBench struct {
	cfg     analyticsConfig
	quiet   bool
	kafka   *kafkaBroker
	ch      *clickhouseServer
	flushMs int
	runs    int
}

// analyticsSummary is the workload's report.
type analyticsSummary struct {
	Config                analyticsConfig                `json:"config"`
	Servers               map[string]string              `json:"servers"`
	Notes                 []string                       `json:"notes"`
	EngineFlushMs         int                            `json:"engineFlushIntervalMs"`
	BacklogProducedPerSec float64                        `json:"backlogProducedPerSec"`
	Comparisons           map[string]analyticsComparison `json:"comparisons"`
	Runs                  map[string]analyticsRun        `json:"runs"`
	SeriesStart           map[string]float64             `json:"seriesStart"`
	Errors                int                            `json:"errors"`
}

func runAnalytics(ctx context.Context, cfg analyticsConfig, results string, quiet bool, v *verdicts) error {
	started := time.Now()
	fmt.Fprintln(os.Stderr, "peerbench: analytics: starting Apache Kafka (deploy/local/kafka/kafka.sh up)")
	kb, err := startKafka(ctx, cfg.KafkaScript, prefixWriter(os.Stderr, "  "))
	if err != nil {
		return err
	}
	defer kb.Close()
	fmt.Fprintf(os.Stderr, "peerbench: analytics: Kafka at %s; starting ClickHouse (deploy/local/clickhouse/clickhouse.sh up)\n", kb.addr)
	chs, err := startClickHouse(ctx, cfg.ClickHouseScript, prefixWriter(os.Stderr, "  "))
	if err != nil {
		return err
	}
	defer chs.Close()
	b := &analyticsBench{cfg: cfg, quiet: quiet, kafka: kb, ch: chs, flushMs: cfg.FlushMs}
	if b.flushMs == 0 {
		// The Kafka table's kafka_flush_interval_ms defaults to the server's.
		v, err := chs.ints(ctx, "SELECT value FROM system.settings WHERE name = 'stream_flush_interval_ms'")
		if err != nil || len(v) != 1 {
			return fmt.Errorf("clickhouse: stream_flush_interval_ms: %v %v", v, err)
		}
		b.flushMs = int(v[0])
	}
	chVersion, _ := chs.query(ctx, "SELECT version()")
	kafkaVersion, _ := kb.output(ctx, "version")
	fmt.Fprintf(os.Stderr, "peerbench: analytics: ClickHouse %s at %s (http %s), the engine's flush interval %d ms\n", chVersion, chs.tcp, chs.http, b.flushMs)

	cl, err := kgo.NewClient(kgo.SeedBrokers(kb.addr), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(50000))
	if err != nil {
		return err
	}
	defer cl.Close()

	flush := "the server's stream_flush_interval_ms"
	if cfg.FlushMs > 0 {
		flush = "set for this run"
	}
	sum := analyticsSummary{Config: cfg, EngineFlushMs: b.flushMs, Comparisons: map[string]analyticsComparison{}, Runs: map[string]analyticsRun{}, SeriesStart: map[string]float64{},
		Servers: map[string]string{
			"clickhouse": "ClickHouse " + chVersion + " (deploy/local/clickhouse: chDB's libchdb.so serving TCP and HTTP), this run's own, on " + chs.tcp,
			"kafka":      "Apache Kafka " + strings.TrimSpace(kafkaVersion) + " (deploy/local/kafka), this run's own broker, on " + kb.addr,
			sideEngine: fmt.Sprintf("ClickHouse's Kafka table engine: ENGINE = Kafka (JSONEachRow, kafka_num_consumers 1, kafka_flush_interval_ms %d: %s) and a materialized view into event_log, parseDateTime64BestEffort(createdAt)",
				b.flushMs, flush),
			sideCarehub: "carehub's event-log writer (processors/eventlog.Writer with its defaults: on ClickHouse batches of up to 20,000, the store's AppendBatch, one append each) in this process, storing through storage/clickhouse's store (AppendEvents: the ids of the batch already stored are looked up, sent as an external table, the rest inserted)",
		},
		Notes: []string{
			"one broker and one ClickHouse engine for both sides, on the same 2-core machine as this process; one side runs at a time, the first side alternating from one comparison to the next; each run writes into a fresh database with carehub's schema (storage/clickhouse.Open), dropped after",
			fmt.Sprintf("backlog: %d records produced first (not measured), each side in a consumer group of its own from the start of the topic; rows/s = records ÷ (the side's start → every row visible, SELECT count() polled every 50 ms); rowsPerSecFirstToLastVisible leaves out the time before the first rows", cfg.Records),
			fmt.Sprintf("steady rate: a fresh topic per run; records published at the rate for %s once the side is started, createdAt the moment each is produced; publish → visible from the rows per %d-ms bucket of created_at polled every 50 ms (a bucket's new rows count as published in its middle), weighted by rows", cfg.Duration, lagBucketMs),
			"unfair to carehub: the engine inserts whatever it reads; carehub's store looks up the batch's ids already stored before every insert, so an event delivered twice (a rebalance, a replay, the outbox relay) is stored once. The engine's copies would stay in event_log until a merge and be counted twice by the hourly counts",
			fmt.Sprintf("unfair to the engine: it inserts once per flush interval (%d ms) or per max block, which bounds its lag from below and makes its parts few and large; carehub inserts what each poll returns at once", b.flushMs),
			"every run ends with the side stopped and a check: event_log's distinct ids, its rows, and the rows its insert-time view counted (event_counts_hourly) must all equal the records published",
			"CPU: clickhouseCpuSec is the ClickHouse server (the engine's consumers and inserts, or carehub's inserts and lookups), clientCpuSec this process (producer, poller and, on carehub's side, the writer), kafkaCpuSec the broker",
		},
	}

	var failures []error
	series := []report.Point{}
	var offset float64
	record := func(r analyticsRun) {
		key := fmt.Sprintf("%02d %s %s", len(sum.Runs)+1, r.Side, modeName(r.Mode, r.Rate))
		sum.Runs[key] = r
		sum.SeriesStart[key] = offset
		for _, p := range r.points {
			p.Seconds += offset
			series = append(series, p)
		}
		offset += r.Seconds
		fmt.Fprintf(os.Stderr, "peerbench: analytics %-24s %-12s %8.0f rows/s (%d rows, first visible %.1fs, all %.1fs); lag p50 %.0f p99 %.0f max %.0f ms; %d distinct, %d duplicates, %d parts; CPU s ClickHouse %.1f Kafka %.1f client %.1f rest %.1f\n",
			r.Side, modeName(r.Mode, r.Rate), r.RowsPerSec, r.Records, r.FirstVisibleSec, r.AllVisibleSec, r.LagP50Ms, r.LagP99Ms, r.LagMaxMs,
			r.Distinct, r.Duplicates, r.Parts, r.ClickHouseCPUSec, r.KafkaCPUSec, r.ClientCPUSec, r.OtherCPUSec)
	}
	pair := func(i int, mode string, rate int, topic string, n int) {
		sides := []string{sideEngine, sideCarehub}
		if i%2 == 1 {
			slices.Reverse(sides)
		}
		res := map[string]analyticsRun{}
		for _, side := range sides {
			if ctx.Err() != nil {
				return
			}
			t := topic
			if mode == "rate" {
				t = fmt.Sprintf("analytics-r%d-%s", rate, shortSide(side))
			}
			r, err := b.run(ctx, cl, side, mode, rate, t, n)
			record(r)
			if err != nil {
				sum.Errors++
				failures = append(failures, fmt.Errorf("analytics %s %s: %w", side, modeName(mode, rate), err))
				return
			}
			res[side] = r
		}
		sum.Comparisons["analytics "+modeName(mode, rate)] = compareAnalytics(res[sideEngine], res[sideCarehub], b.flushMs)
	}

	fmt.Fprintf(os.Stderr, "peerbench: analytics: producing the backlog, %d records on %d partitions\n", cfg.Records, cfg.Partitions)
	if err := b.createTopic(ctx, cl, "analytics-backlog"); err != nil {
		return err
	}
	var produced atomic.Int64
	took, err := produceAnalytics(ctx, cl, "analytics-backlog", cfg.Records, 0, &produced)
	if err != nil {
		return fmt.Errorf("analytics: producing the backlog: %w", err)
	}
	sum.BacklogProducedPerSec = float64(cfg.Records) / took.Seconds()
	fmt.Fprintf(os.Stderr, "peerbench: analytics: backlog produced in %.1fs (%.0f records/s)\n", took.Seconds(), sum.BacklogProducedPerSec)
	pair(0, "backlog", 0, "analytics-backlog", cfg.Records)
	for i, rate := range cfg.Rates {
		pair(i+1, "rate", rate, "", int(math.Round(float64(rate)*cfg.Duration.Seconds())))
	}

	printAnalytics(os.Stdout, sum)
	path, err := report.Write(results, report.Report{Scenario: "peers-kafka-analytics", Started: started, Unit: "rows/s",
		LagName: "records not yet visible", Summary: sum, Series: series})
	if err != nil {
		failures = append(failures, err)
	} else {
		fmt.Fprintf(os.Stderr, "peerbench: report %s (charts: %s)\n", path, report.ChartsCommand(path))
		v.add(analyticsVerdicts(sum, path)...)
	}
	if ctx.Err() != nil {
		failures = append(failures, ctx.Err())
	}
	return errors.Join(failures...)
}

func shortSide(side string) string {
	if side == sideEngine {
		return "engine"
	}
	return "carehub"
}

func modeName(mode string, rate int) string {
	if mode == "rate" {
		return fmt.Sprintf("rate=%d/s", rate)
	}
	return mode
}

func (b *analyticsBench) createTopic(ctx context.Context, cl *kgo.Client, topic string) error {
	// The broker does not create topics on first use (kafka.sh), and a Kafka table on a
	// missing topic makes inserts into it hang.
	resp, err := kadm.NewClient(cl).CreateTopics(ctx, int32(b.cfg.Partitions), 1, nil, topic, topic+".dlq")
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	for _, t := range resp.Sorted() {
		if t.Err != nil {
			return fmt.Errorf("create topic %s: %w", t.Topic, t.Err)
		}
	}
	return nil
}

// produceAnalytics produces records [0, n) to topic, at rate a second when rate > 0, and
// returns how long it took once all were acknowledged.
func produceAnalytics(ctx context.Context, cl *kgo.Client, topic string, n, rate int, produced *atomic.Int64) (time.Duration, error) {
	var failed atomic.Int64
	var first atomic.Value
	start := time.Now()
	for i := range n {
		if rate > 0 {
			if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return time.Since(start), ctx.Err()
				}
			}
		} else if ctx.Err() != nil {
			return time.Since(start), ctx.Err()
		}
		v, err := analyticsEvent(i, time.Now())
		if err != nil {
			return time.Since(start), err
		}
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "org_%04d", i%50), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Add(1)
				first.CompareAndSwap(nil, err.Error())
				return
			}
			produced.Add(1)
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return time.Since(start), err
	}
	if f := failed.Load(); f > 0 {
		return time.Since(start), fmt.Errorf("%d of %d records not produced, first: %v", f, n, first.Load())
	}
	return time.Since(start), nil
}

// run is one side's run into a fresh database: backlog (topic holds n records) or rate (n
// records published at rate to the fresh topic once the side started).
func (b *analyticsBench) run(ctx context.Context, cl *kgo.Client, side, mode string, rate int, topic string, n int) (r analyticsRun, err error) {
	b.runs++
	r = analyticsRun{Side: side, Mode: mode, Rate: rate, Topic: topic, Records: int64(n)}
	db := fmt.Sprintf("pb_%d_%s_%s", b.runs, shortSide(side), map[string]string{"backlog": "backlog", "rate": fmt.Sprintf("r%d", rate)}[mode])
	group := "peerbench-" + db
	ch := b.ch
	if _, err := ch.query(ctx, "CREATE DATABASE "+db); err != nil {
		return r, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, derr := ch.query(dctx, "DROP DATABASE IF EXISTS "+db+" SYNC"); derr != nil {
			fmt.Fprintln(os.Stderr, "peerbench: analytics: drop", db+":", derr)
		}
		time.Sleep(3 * time.Second) // the next run starts on a settled server
	}()
	st, err := chstore.Open(ctx, "clickhouse://"+ch.tcp+"/"+db, chstore.Config{})
	if err != nil {
		return r, err
	}
	defer st.Close()
	if c, err := ch.ints(ctx, "SELECT count() FROM "+db+".event_log"); err != nil || len(c) != 1 || c[0] != 0 {
		return r, fmt.Errorf("%s.event_log not empty (%v): %v", db, c, err)
	}
	if mode == "rate" {
		if err := b.createTopic(ctx, cl, topic); err != nil {
			return r, err
		}
	}

	ch0, _ := procCPU(ch.pid, false)
	k0, _ := procCPU(b.kafka.pid, true)
	machine0, self0 := machineBusy(), loadcli.ProcessCPU()
	start := time.Now()
	defer func() {
		if r.Seconds == 0 { // a run that failed still takes its place in the series
			r.Seconds = time.Since(start).Seconds()
		}
	}()

	// The side starts.
	var stopOnce sync.Once
	var stopErr error
	var stop func()
	switch side {
	case sideEngine:
		settings := fmt.Sprintf("kafka_broker_list = '%s', kafka_topic_list = '%s', kafka_group_name = '%s', kafka_format = 'JSONEachRow', kafka_num_consumers = 1",
			b.kafka.addr, topic, group)
		if b.cfg.FlushMs > 0 {
			settings += fmt.Sprintf(", kafka_flush_interval_ms = %d", b.cfg.FlushMs)
		}
		if _, err := ch.query(ctx, "CREATE TABLE "+db+".kafka_events (id String, type String, orgId String, projectId String, source String, severity String, payload String, createdAt String) ENGINE = Kafka SETTINGS "+settings); err != nil {
			return r, err
		}
		stop = func() {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for _, t := range []string{"kafka_mv", "kafka_events"} {
				if _, err := ch.query(sctx, "DROP TABLE IF EXISTS "+db+"."+t); err != nil {
					stopErr = errors.Join(stopErr, err)
				}
			}
		}
		defer stopOnce.Do(stop)
		if _, err := ch.query(ctx, fmt.Sprintf(`CREATE MATERIALIZED VIEW %[1]s.kafka_mv TO %[1]s.event_log (id String, org_id String, project_id String, type String, source String, severity String, payload String, created_at DateTime64(6, 'UTC'))
AS SELECT id, orgId AS org_id, projectId AS project_id, type, source, severity, payload, parseDateTime64BestEffort(createdAt, 6, 'UTC') AS created_at FROM %[1]s.kafka_events`, db)); err != nil {
			return r, err
		}
	case sideCarehub:
		w, err := eventlog.New(eventlog.Config{Brokers: []string{b.kafka.addr}, Topic: topic, DeadLetterTopic: topic + ".dlq",
			Group: group, Store: st, LagInterval: -1})
		if err != nil {
			return r, err
		}
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan error, 1)
		go func() { done <- w.Run(wctx) }()
		stop = func() {
			cancel()
			if err := <-done; err != nil {
				stopErr = err
			}
		}
		defer stopOnce.Do(stop)
	}

	var produced atomic.Int64
	var produceDone chan error // nil once every record is published
	var publishTook time.Duration
	if mode == "rate" {
		pctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		produceDone = done
		go func() {
			took, err := produceAnalytics(pctx, cl, topic, n, rate, &produced)
			publishTook = took
			done <- err
		}()
		defer func() { // a run that ends early stops its producer before the next run
			cancel()
			if produceDone != nil {
				<-done
			}
		}()
	} else {
		produced.Store(int64(n))
	}

	vis := newVisibility()
	var first time.Time
	var visible, lastVisible int64
	lastPoint, lastProgress := start, start
	var lastSample int
	deadline := start.Add(b.cfg.Window)
	if mode == "rate" {
		deadline = time.Time{} // set once publishing ends
	}
	pollQ := "SELECT count() FROM " + db + ".event_log"
	if mode == "rate" {
		pollQ = fmt.Sprintf("SELECT intDiv(toUnixTimestamp64Milli(created_at), %d) * %d AS b, count() FROM %s.event_log GROUP BY b FORMAT TSV", lagBucketMs, lagBucketMs, db)
	}
	for {
		select {
		case err := <-produceDone:
			if err != nil {
				return r, fmt.Errorf("publishing: %w", err)
			}
			deadline = time.Now().Add(b.cfg.Window)
			produceDone = nil
		default:
		}
		now := time.Now()
		out, err := ch.query(ctx, pollQ)
		if err != nil {
			return r, err
		}
		if mode == "rate" {
			counts, err := parseBuckets(out)
			if err != nil {
				return r, err
			}
			vis.observe(now.UnixMilli(), counts)
			visible = vis.rows
		} else if visible, err = strconv.ParseInt(out, 10, 64); err != nil {
			return r, fmt.Errorf("count: %q", out)
		}
		if visible > 0 && first.IsZero() {
			first = now
			r.FirstVisibleSec = now.Sub(start).Seconds()
		}
		// A point a second; the last, when every row is visible, unless it would be a
		// spike of a few milliseconds (the run's figures count it anyway).
		if s := now.Sub(lastPoint).Seconds(); s >= 1 || (visible >= int64(n) && s >= 0.5) {
			p := report.Point{Seconds: now.Sub(start).Seconds(), Lag: float64(max(0, produced.Load()-visible))}
			if s > 0 {
				p.Rate = float64(visible-lastVisible) / s
			}
			p.P50Ms, p.P99Ms, _ = lagPercentiles(vis.samples[lastSample:])
			lastSample = len(vis.samples)
			r.points = append(r.points, p)
			lastPoint, lastVisible = now, visible
		}
		if !b.quiet && now.Sub(lastProgress) >= 5*time.Second {
			fmt.Fprintf(os.Stderr, "peerbench: analytics %s %s: %d of %d rows visible (%d published) after %.0fs\n",
				side, modeName(mode, rate), visible, n, produced.Load(), now.Sub(start).Seconds())
			lastProgress = now
		}
		if visible >= int64(n) && produceDone == nil {
			r.AllVisibleSec = now.Sub(start).Seconds()
			break
		}
		if !deadline.IsZero() && now.After(deadline) {
			return r, fmt.Errorf("%d of %d rows visible %s after %s (-analytics-window)", visible, n, b.cfg.Window,
				map[string]string{"backlog": "the side started", "rate": "the last record was published"}[mode])
		}
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.Seconds = time.Since(start).Seconds()
	stopOnce.Do(stop)
	if stopErr != nil {
		return r, fmt.Errorf("stopping: %w", stopErr)
	}
	ch1, _ := procCPU(ch.pid, false)
	k1, _ := procCPU(b.kafka.pid, true)
	r.ClickHouseCPUSec, r.KafkaCPUSec, r.ClientCPUSec = (ch1 - ch0).Seconds(), (k1 - k0).Seconds(), (loadcli.ProcessCPU() - self0).Seconds()
	if m := machineBusy(); m > 0 && machine0 > 0 {
		r.OtherCPUSec = max(0, (m-machine0).Seconds()-r.ClickHouseCPUSec-r.KafkaCPUSec-r.ClientCPUSec)
	}
	r.RowsPerSec = float64(n) / r.AllVisibleSec
	if d := r.AllVisibleSec - r.FirstVisibleSec; d > 0 {
		r.RowsPerSecFirstLast = float64(n) / d
	}
	if mode == "rate" {
		r.PublishedPerSec = float64(n) / publishTook.Seconds()
		r.LagP50Ms, r.LagP99Ms, r.LagMaxMs = lagPercentiles(vis.samples)
		r.LagRows = vis.rows
	}

	// The check: exactly n rows, each id once, n inserted.
	v, err := ch.ints(ctx, "SELECT count(), uniqExact(id) FROM "+db+".event_log")
	if err != nil || len(v) != 2 {
		return r, fmt.Errorf("rows: %v %v", v, err)
	}
	r.Rows, r.Distinct = v[0], v[1]
	ins, err := ch.ints(ctx, "SELECT sum(events) FROM "+db+".event_counts_hourly")
	if err != nil || len(ins) != 1 {
		return r, fmt.Errorf("rows inserted: %v %v", ins, err)
	}
	r.Inserted = ins[0]
	r.Duplicates = max(r.Rows, r.Inserted) - r.Distinct
	if p, err := ch.ints(ctx, "SELECT count() FROM system.parts WHERE database = '"+db+"' AND table = 'event_log' AND active"); err == nil && len(p) == 1 {
		r.Parts = p[0]
	}
	return r, checkRows(int64(n), r.Rows, r.Distinct, r.Inserted)
}

func printAnalytics(w io.Writer, s analyticsSummary) {
	keys := make([]string, 0, len(s.Comparisons))
	for k := range s.Comparisons {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return s.Comparisons[a].Rate - s.Comparisons[b].Rate })
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\trecords\trows/s engine\trows/s carehub\tcarehub/engine\tlag p50 ms e/c\tlag p99 ms e/c\tlag max ms e/c\tflush ms\tgoal rows\tgoal lag\t")
	for _, k := range keys {
		c := s.Comparisons[k]
		lag := "-"
		if c.GoalLag != nil {
			lag = strconv.FormatBool(*c.GoalLag)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.2fx\t%.0f/%.0f\t%.0f/%.0f\t%.0f/%.0f\t%d\t%v\t%s\t\n", k, c.Records,
			c.EngineRowsPerSec, c.CarehubRowsPerSec, c.RatioRows, c.EngineLagP50Ms, c.CarehubLagP50Ms,
			c.EngineLagP99Ms, c.CarehubLagP99Ms, c.EngineLagMaxMs, c.CarehubLagMaxMs, c.EngineFlushMs, c.GoalRows, lag)
	}
	_ = tw.Flush()
}
