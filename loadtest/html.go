package loadtest

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// The HTML reports (--html) are one self-contained page each: charts are
// inline SVG drawn here, the style is inline, and nothing is loaded from
// anywhere (no script, no link, no URL), so a report can be mailed or
// archived and opened offline. The page is written as XHTML-compatible
// HTML (every element closed, attributes quoted, numeric character
// references only), so an XML parser reads it too.

// CompareResult is one cell of a comparison: a scenario run against one
// broker, or the reason it was not run (Note, with a nil Report).
type CompareResult struct {
	Scenario string
	Label    string
	Report   *Report
	Note     string
}

// Chart colours: the run's series, and one per broker in a comparison.
var (
	colPublish, colConsume = "#1f77b4", "#2ca02c"
	colConfirm50, colConf  = "#ffbb78", "#ff7f0e"
	colE2E50, colE2E       = "#c5b0d5", "#9467bd"
	brokerColours          = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}
)

const pageStyle = `body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}.note{color:#a00}.muted{color:#666}
svg{display:block;margin:8px 0}svg text{font:11px system-ui,sans-serif;fill:#444}
.charts{display:flex;flex-wrap:wrap;gap:8px}code{font-size:12px}`

// WriteHTML writes the run's report as a self-contained HTML page:
// throughput and latency charts over time, the summary, and the
// per-second values.
func (r *Report) WriteHTML(w io.Writer) error {
	b := bufio.NewWriter(w)
	title := fmt.Sprintf("warren-loadtest: %s / %s", r.Driver, r.Scenario)
	pageHead(b, title)
	fmt.Fprintf(b, "<p>%s</p>\n", esc(r.Conditions))
	verdict(b, r)
	b.WriteString(`<div class="charts">` + "\n")
	throughputChart(b, r)
	latencyChart(b, r)
	b.WriteString("</div>\n<h2>Summary</h2>\n")
	summaryTable(b, r)
	b.WriteString("<h2>Per second</h2>\n")
	seriesTable(b, r)
	b.WriteString("</body>\n</html>\n")
	return b.Flush()
}

// WriteHTMLFile writes the run's HTML report to path.
func (r *Report) WriteHTMLFile(path string) error { return writeFile(path, r.WriteHTML) }

// WriteCompareHTML writes a comparison as a self-contained HTML page: per
// scenario, the brokers side by side in a table and as one chart line
// each (consume rate, confirm and publish→deliver p99 over time), then
// each broker's own charts.
func WriteCompareHTML(w io.Writer, results []CompareResult) error {
	b := bufio.NewWriter(w)
	pageHead(b, "warren-loadtest compare")
	var scenarios []string
	by := map[string][]CompareResult{}
	colour := map[string]string{} // a broker keeps its colour in every chart
	for _, c := range results {
		if _, ok := colour[c.Label]; !ok && c.Report != nil {
			colour[c.Label] = brokerColours[len(colour)%len(brokerColours)]
		}
		if _, ok := by[c.Scenario]; !ok {
			scenarios = append(scenarios, c.Scenario)
		}
		by[c.Scenario] = append(by[c.Scenario], c)
	}
	b.WriteString(`<p class="muted">Same machine, same harness, brokers run one after the other. Values are measured after each run's warmup; the charts show the whole run, warmup included (left of the dashed line).</p>` + "\n")
	for _, sc := range scenarios {
		cells := by[sc]
		fmt.Fprintf(b, "<h2>%s</h2>\n", esc(sc))
		b.WriteString(`<table><tr><th class="l">broker</th><th>publish msg/s</th><th>consume msg/s</th><th>confirm p50 / p99 ms</th><th>publish→deliver p50 / p99 ms</th><th>broker / load generator CPU µs per msg</th><th>lost</th><th class="l">conditions</th></tr>` + "\n")
		var lines [3][]line
		var warm float64
		for _, c := range cells {
			if c.Report == nil {
				fmt.Fprintf(b, `<tr><td class="l">%s</td><td class="l note" colspan="7">%s</td></tr>`+"\n", esc(c.Label), esc(c.Note))
				continue
			}
			r := c.Report
			fmt.Fprintf(b, `<tr><td class="l">%s</td><td>%.0f</td><td>%.0f</td><td>%.2f / %.2f</td><td>%.2f / %.2f</td><td>%s / %s</td><td>%d</td><td class="l">%s</td></tr>`+"\n",
				esc(c.Label), r.PublishRate, r.ConsumeRate, r.ConfirmLat.P50, r.ConfirmLat.P99, r.E2ELat.P50, r.E2ELat.P99,
				cpuString(r.BrokerCPU), cpuString(r.ClientCPU), r.Lost, esc(r.Conditions))
			col := colour[c.Label]
			lines[0] = append(lines[0], seriesLine(c.Label, col, r, func(s Second) (float64, bool) { return s.ConsumeRate, true }))
			lines[1] = append(lines[1], seriesLine(c.Label, col, r, func(s Second) (float64, bool) { return s.ConfirmP99, s.Confirms > 0 }))
			lines[2] = append(lines[2], seriesLine(c.Label, col, r, func(s Second) (float64, bool) { return s.E2EP99, s.Deliveries > 0 }))
			warm = max(warm, r.WarmupS)
		}
		b.WriteString("</table>\n")
		if len(lines[0]) == 0 {
			continue
		}
		b.WriteString(`<div class="charts">` + "\n")
		svgChart(b, "consume rate", "msg/s", lines[0], warm)
		svgChart(b, "publish→confirm p99", "ms", lines[1], warm)
		svgChart(b, "publish→deliver p99", "ms", lines[2], warm)
		b.WriteString("</div>\n")
		for _, c := range cells {
			if c.Report == nil {
				continue
			}
			fmt.Fprintf(b, "<details><summary>%s: charts, summary and per-second values</summary>\n", esc(c.Label))
			verdict(b, c.Report)
			b.WriteString(`<div class="charts">` + "\n")
			throughputChart(b, c.Report)
			latencyChart(b, c.Report)
			b.WriteString("</div>\n")
			summaryTable(b, c.Report)
			seriesTable(b, c.Report)
			b.WriteString("</details>\n")
		}
	}
	b.WriteString("</body>\n</html>\n")
	return b.Flush()
}

// WriteCompareHTMLFile writes a comparison's HTML report to path.
func WriteCompareHTMLFile(path string, results []CompareResult) error {
	return writeFile(path, func(w io.Writer) error { return WriteCompareHTML(w, results) })
}

func pageHead(b *bufio.Writer, title string) {
	fmt.Fprintf(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>%s</title>\n<style>\n%s\n</style>\n</head>\n<body>\n<h1>%s</h1>\n",
		esc(title), pageStyle, esc(title))
	fmt.Fprintf(b, "<p class=\"muted\">Written %s.</p>\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
}

func verdict(b *bufio.Writer, r *Report) {
	switch {
	case r.Lost > 0:
		fmt.Fprintf(b, `<p class="note">LOSS: %d confirmed messages were never consumed.</p>`+"\n", r.Lost)
	case r.RateHeld != nil && !*r.RateHeld:
		fmt.Fprintf(b, `<p class="note">NOT HELD: needed %.0f msg/s published and consumed; got %.0f and %.0f.</p>`+"\n", r.MinRate, r.PublishRate, r.ConsumeRate)
	case r.RateHeld != nil:
		fmt.Fprintf(b, "<p>HELD: at least %.0f msg/s published and consumed.</p>\n", r.MinRate)
	}
}

func throughputChart(b *bufio.Writer, r *Report) {
	svgChart(b, "throughput", "msg/s", []line{
		seriesLine("publish", colPublish, r, func(s Second) (float64, bool) { return s.PublishRate, true }),
		seriesLine("consume", colConsume, r, func(s Second) (float64, bool) { return s.ConsumeRate, true }),
	}, r.WarmupS)
}

func latencyChart(b *bufio.Writer, r *Report) {
	svgChart(b, "latency", "ms", []line{
		seriesLine("confirm p50", colConfirm50, r, func(s Second) (float64, bool) { return s.ConfirmP50, s.Confirms > 0 }),
		seriesLine("confirm p99", colConf, r, func(s Second) (float64, bool) { return s.ConfirmP99, s.Confirms > 0 }),
		seriesLine("publish→deliver p50", colE2E50, r, func(s Second) (float64, bool) { return s.E2EP50, s.Deliveries > 0 }),
		seriesLine("publish→deliver p99", colE2E, r, func(s Second) (float64, bool) { return s.E2EP99, s.Deliveries > 0 }),
	}, r.WarmupS)
}

func summaryTable(b *bufio.Writer, r *Report) {
	row := func(name, key, val string) {
		fmt.Fprintf(b, `<tr><th class="l">%s</th><td class="l"><code>%s</code></td><td>%s</td></tr>`+"\n", esc(name), key, esc(val))
	}
	b.WriteString(`<table><tr><th class="l">measure</th><th class="l">JSON field</th><th>value</th></tr>` + "\n")
	row("measured for", "duration_s", fmt.Sprintf("%.1f s (after a %.1f s warmup)", r.DurationS, r.WarmupS))
	row("published", "published", strconv.FormatInt(r.Published, 10))
	row("confirmed", "confirmed", strconv.FormatInt(r.Confirmed, 10))
	row("nacked", "nacked", strconv.FormatInt(r.Nacked, 10))
	row("consumed", "consumed", strconv.FormatInt(r.Consumed, 10))
	row("lost", "lost", strconv.FormatInt(r.Lost, 10))
	row("duplicates", "duplicates", strconv.FormatInt(r.Duplicates, 10))
	row("reordered", "reordered", strconv.FormatInt(r.Reordered, 10))
	row("publish rate, msg/s", "publish_rate", fmt.Sprintf("%.0f", r.PublishRate))
	row("consume rate, msg/s", "consume_rate", fmt.Sprintf("%.0f", r.ConsumeRate))
	lat := func(name, key string, l Latency) {
		row(name, key, fmt.Sprintf("p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f", l.P50, l.P90, l.P99, l.P999, l.Max))
	}
	lat("publish→confirm, ms", "confirm_latency_ms", r.ConfirmLat)
	lat("publish→deliver, ms", "e2e_latency_ms", r.E2ELat)
	row("broker CPU per message, µs", "broker_cpu_us_per_msg", cpuString(r.BrokerCPU))
	row("load generator CPU per message, µs", "client_cpu_us_per_msg", cpuString(r.ClientCPU))
	b.WriteString("</table>\n")
}

func seriesTable(b *bufio.Writer, r *Report) {
	if len(r.Series) == 0 {
		b.WriteString(`<p class="muted">No per-second values: the publishing phase was shorter than 0.1 s.</p>` + "\n")
		return
	}
	b.WriteString(`<table><tr><th>s</th><th>publish/s</th><th>consume/s</th><th>confirms</th><th>confirm p50 ms</th><th>confirm p99 ms</th><th>deliveries</th><th>publish→deliver p50 ms</th><th>publish→deliver p99 ms</th></tr>` + "\n")
	for _, s := range r.Series {
		fmt.Fprintf(b, "<tr><td>%.1f</td><td>%.0f</td><td>%.0f</td><td>%d</td><td>%.2f</td><td>%.2f</td><td>%d</td><td>%.2f</td><td>%.2f</td></tr>\n",
			s.T, s.PublishRate, s.ConsumeRate, s.Confirms, s.ConfirmP50, s.ConfirmP99, s.Deliveries, s.E2EP50, s.E2EP99)
	}
	b.WriteString("</table>\n")
}

// line is one chart line: points (x seconds, y), with gaps where ok is
// false (an interval with nothing to measure).
type line struct {
	name, colour string
	x, y         []float64
	ok           []bool
}

func seriesLine(name, colour string, r *Report, f func(Second) (float64, bool)) line {
	l := line{name: name, colour: colour}
	for _, s := range r.Series {
		v, ok := f(s)
		l.x, l.y, l.ok = append(l.x, s.T), append(l.y, v), append(l.ok, ok && !math.IsNaN(v) && !math.IsInf(v, 0))
	}
	return l
}

// Chart geometry, in SVG user units (pixels).
const (
	chartW, chartH         = 520, 260
	padL, padR, padT, padB = 64, 12, 50, 34
	plotW, plotH           = chartW - padL - padR, chartH - padT - padB
	legendStep             = 145 // three legend entries a row
	maxPointMarks          = 400 // hover marks (with the value) on charts with at most this many points
)

// svgChart draws lines over a shared x axis (seconds since the run
// started) from zero, with a dashed mark where measuring began (warm > 0).
func svgChart(b *bufio.Writer, title, unit string, lines []line, warm float64) {
	var xMax, yMax float64
	points := 0
	for _, l := range lines {
		for i := range l.x {
			xMax = max(xMax, l.x[i])
			if l.ok[i] {
				yMax = max(yMax, l.y[i])
				points++
			}
		}
	}
	fmt.Fprintf(b, `<svg width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`+"\n", chartW, chartH, chartW, chartH, esc(title+" over time"))
	fmt.Fprintf(b, `<text x="%d" y="14" style="font-weight:bold;font-size:13px">%s (%s)</text>`+"\n", padL, esc(title), esc(unit))
	for i, l := range lines { // legend
		x, y := padL+(i%3)*legendStep, 24+(i/3)*13
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="3" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, y+1, l.colour, x+14, y+5, esc(l.name))
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#ccc"/>`+"\n", padL, padT, plotW, plotH)
	if points == 0 {
		fmt.Fprintf(b, `<text x="%d" y="%d">no per-second values</text>`+"\n</svg>\n", padL+10, padT+20)
		return
	}
	xStep, xTop := niceAxis(xMax)
	yStep, yTop := niceAxis(yMax)
	px := func(x float64) float64 { return padL + x/xTop*plotW }
	py := func(y float64) float64 { return padT + plotH - y/yTop*plotH }
	for y := 0.0; y <= yTop*1.0001; y += yStep {
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
			padL, padL+plotW, py(y), py(y), padL-4, py(y)+4, axisLabel(y))
	}
	for x := 0.0; x <= xTop*1.0001; x += xStep {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px(x), padT+plotH+14, axisLabel(x))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">seconds since start</text>`+"\n", padL+plotW/2, chartH-4)
	if warm > 0 && warm < xTop {
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#999" stroke-dasharray="4 3"/><text x="%.1f" y="%d">measured →</text>`+"\n",
			px(warm), px(warm), padT, padT+plotH, px(warm)+3, padT+10)
	}
	for _, l := range lines {
		var pts strings.Builder
		flush := func() {
			if pts.Len() > 0 {
				fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", l.colour, strings.TrimSpace(pts.String()))
				pts.Reset()
			}
		}
		for i := range l.x {
			if !l.ok[i] {
				flush()
				continue
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", px(l.x[i]), py(l.y[i]))
		}
		flush()
		if points <= maxPointMarks {
			for i := range l.x {
				if l.ok[i] {
					fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="2" fill="%s"><title>%s at %.1f s: %s %s</title></circle>`+"\n",
						px(l.x[i]), py(l.y[i]), l.colour, esc(l.name), l.x[i], strconv.FormatFloat(l.y[i], 'f', 2, 64), esc(unit))
				}
			}
		}
	}
	b.WriteString("</svg>\n")
}

// niceAxis picks a tick step of 1, 2 or 5 × 10^n giving about five ticks
// over [0, v], and the axis top (a whole number of steps at or above v).
func niceAxis(v float64) (step, top float64) {
	if v <= 0 {
		return 1, 1
	}
	raw := v / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / mag; {
	case f <= 1:
		step = mag
	case f <= 2:
		step = 2 * mag
	case f <= 5:
		step = 5 * mag
	default:
		step = 10 * mag
	}
	return step, math.Ceil(v/step-1e-9) * step
}

// axisLabel writes a tick value compactly: 250k, 1.5M, 0.25.
func axisLabel(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	default:
		return strconv.FormatFloat(math.Round(v*1e6)/1e6, 'f', -1, 64)
	}
}

func esc(s string) string { return html.EscapeString(s) }

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
