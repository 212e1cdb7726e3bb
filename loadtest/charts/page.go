package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"slices"
)

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
