package report

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Report is one run of a scenario: its own figures (Summary, the scenario's JSON report) and
// the series its Recorder collected.
type Report struct {
	Scenario string    `json:"scenario"`
	Started  time.Time `json:"started"`
	Unit     string    `json:"unit"`               // what a point's rate counts
	LagName  string    `json:"lagName,omitempty"`  // what a point's lag measures
	EndToEnd string    `json:"endToEnd,omitempty"` // what a point's end-to-end percentiles measure ("": none)
	Summary  any       `json:"summary"`
	Series   []Point   `json:"series"`
}

// Files are the paths Write wrote.
type Files struct{ JSON, PNG, HTML string }

// Write writes r under dir as <scenario>-<UTC time>.json, .png and .html (the page embeds the
// chart and the summary, so it is one file to share).
func Write(dir string, r Report) (Files, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Files{}, err
	}
	base := filepath.Join(dir, fmt.Sprintf("%s-%s", r.Scenario, r.Started.UTC().Format("20060102T150405Z")))
	f := Files{JSON: base + ".json", PNG: base + ".png", HTML: base + ".html"}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return Files{}, fmt.Errorf("report JSON: %w", err)
	}
	png, err := Chart(r)
	if err != nil {
		return Files{}, err
	}
	page, err := HTML(r, png)
	if err != nil {
		return Files{}, err
	}
	for path, b := range map[string][]byte{f.JSON: append(js, '\n'), f.PNG: png, f.HTML: page} {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

var (
	blue   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	orange = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	red    = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	green  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
)

type series struct {
	name  string
	color color.Color
	y     func(Point) float64
}

// panel is one chart of the stack: a title, a y label and its lines over time, on a linear
// y axis from 0, or a logarithmic one (logY) that leaves out the points at 0 (nothing measured).
func panel(r Report, title, ylabel string, logY bool, lines ...series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = ylabel
	if logY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	} else {
		p.Y.Min = 0
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	for _, s := range lines {
		xys := make(plotter.XYs, 0, len(r.Series))
		for _, pt := range r.Series {
			if y := finite(s.y(pt)); !logY || y > 0 {
				xys = append(xys, plotter.XY{X: pt.Seconds, Y: y})
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, fmt.Errorf("chart %s: %w", s.name, err)
		}
		l.Color, l.Width = s.color, vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	if logY { // a log axis needs a range above 0, also when nothing or one value was measured
		if p.Y.Min <= 0 || math.IsInf(p.Y.Min, 0) {
			p.Y.Min = 1
		}
		if !(p.Y.Max > p.Y.Min) {
			p.Y.Max = 10 * p.Y.Min
		}
	}
	return p, nil
}

func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// Chart draws throughput, latency percentiles and lag over time, stacked, as a PNG.
func Chart(r Report) ([]byte, error) {
	if len(r.Series) == 0 {
		// One point at zero, so that an empty run still has a chart that says so.
		r.Series = []Point{{}}
	}
	panels := [][]*plot.Plot{}
	add := func(p *plot.Plot, err error) error {
		if err == nil {
			panels = append(panels, []*plot.Plot{p})
		}
		return err
	}
	if err := add(panel(r, r.Scenario+": throughput", r.Unit, false,
		series{"rate", blue, func(p Point) float64 { return p.Rate }},
		series{"refused/s", red, func(p Point) float64 { return float64(p.Refused) }})); err != nil {
		return nil, err
	}
	if err := add(panel(r, "latency", "ms", false,
		series{"p50", green, func(p Point) float64 { return p.P50Ms }},
		series{"p99", orange, func(p Point) float64 { return p.P99Ms }})); err != nil {
		return nil, err
	}
	if r.EndToEnd != "" {
		// Logarithmic: a queue's seconds and a quiet run's milliseconds in one panel.
		if err := add(panel(r, r.EndToEnd+", by when sent", "ms (log scale)", true,
			series{"p50", green, func(p Point) float64 { return p.EndToEndP50Ms }},
			series{"p99", orange, func(p Point) float64 { return p.EndToEndP99Ms }})); err != nil {
			return nil, err
		}
	}
	if r.LagName != "" {
		if err := add(panel(r, "lag", r.LagName, false, series{r.LagName, red, func(p Point) float64 { return p.Lag }})); err != nil {
			return nil, err
		}
	}
	img := vgimg.New(vg.Points(900), vg.Points(float64(260*len(panels))))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 5}
	canvases := plot.Align(panels, tiles, dc)
	for i := range panels {
		panels[i][0].Draw(canvases[i][0])
	}
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("chart PNG: %w", err)
	}
	return buf.Bytes(), nil
}

// row is one figure of the summary table.
type row struct{ Name, Value string }

// summaryRows flattens the scenario's summary (any JSON object) into name/value rows, in the
// order of its fields.
func summaryRows(summary any) ([]row, error) {
	b, err := json.Marshal(summary)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var rows []row
	var walk func(prefix string) error
	walk = func(prefix string) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				for dec.More() {
					k, err := dec.Token()
					if err != nil {
						return err
					}
					name := k.(string)
					if prefix != "" {
						name = prefix + "." + name
					}
					if err := walk(name); err != nil {
						return err
					}
				}
			case '[':
				var items []string
				for i := 0; dec.More(); i++ {
					var v json.RawMessage
					if err := dec.Decode(&v); err != nil {
						return err
					}
					items = append(items, string(v))
				}
				rows = append(rows, row{prefix, fmt.Sprint(items)})
			}
			_, err := dec.Token() // the closing delimiter
			return err
		default:
			rows = append(rows, row{prefix, fmt.Sprint(t)})
			return nil
		}
	}
	if err := walk(""); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(rows, func(r row) bool { return r.Name == "" && r.Value == "<nil>" }), nil
}

var page = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>carehub load report: {{.R.Scenario}}</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:960px}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}td.v{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%}</style></head><body>
<h1>{{.R.Scenario}}</h1>
<p>Started {{.R.Started.UTC.Format "2006-01-02 15:04:05 MST"}}; {{len .R.Series}} intervals; rate in {{.R.Unit}}{{if .R.LagName}}; lag in {{.R.LagName}}{{end}}.</p>
<img alt="throughput, latency percentiles and lag over time" src="{{.PNG}}">
<h2>Summary</h2>
<table>{{range .Rows}}<tr><th>{{.Name}}</th><td class="v">{{.Value}}</td></tr>{{end}}</table>
<h2>Series</h2>
<table><tr><th>t (s)</th><th>rate</th><th>p50 ms</th><th>p99 ms</th>{{if .R.EndToEnd}}<th>{{.R.EndToEnd}} p50 ms</th><th>{{.R.EndToEnd}} p99 ms</th>{{end}}{{if .R.LagName}}<th>lag</th>{{end}}<th>refused</th></tr>
{{range .R.Series}}<tr><td class="v">{{printf "%.0f" .Seconds}}</td><td class="v">{{printf "%.0f" .Rate}}</td><td class="v">{{printf "%.1f" .P50Ms}}</td><td class="v">{{printf "%.1f" .P99Ms}}</td>{{if $.R.EndToEnd}}<td class="v">{{printf "%.1f" .EndToEndP50Ms}}</td><td class="v">{{printf "%.1f" .EndToEndP99Ms}}</td>{{end}}{{if $.R.LagName}}<td class="v">{{printf "%.0f" .Lag}}</td>{{end}}<td class="v">{{.Refused}}</td></tr>
{{end}}</table>
</body></html>
`))

// HTML renders the self-contained page of r with its chart.
func HTML(r Report, png []byte) ([]byte, error) {
	rows, err := summaryRows(r.Summary)
	if err != nil {
		return nil, fmt.Errorf("report summary: %w", err)
	}
	var buf bytes.Buffer
	err = page.Execute(&buf, struct {
		R    Report
		PNG  template.URL
		Rows []row
	}{r, template.URL("data:image/png;base64," + base64.StdEncoding.EncodeToString(png)), rows})
	return buf.Bytes(), err
}
