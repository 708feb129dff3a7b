package loadtest

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/netio/warrentest"
)

// TestRunHTMLReport: a run records one point a second (rates and interval
// latency percentiles), and its HTML report holds them as charts and a
// table, with the summary, and loads nothing from anywhere.
func TestRunHTMLReport(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := Config{URL: warrentest.URL(s), Size: "64", Rate: 2000, Warmup: 500 * time.Millisecond, Duration: 1700 * time.Millisecond,
		Scenario: "html", DrainTimeout: 10 * time.Second}
	rep, err := Run(ctx, cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Ticks at 1 s and 2 s, and the partial second up to the end at 2.2 s.
	if len(rep.Series) < 2 || rep.WarmupS != 0.5 {
		t.Fatalf("series %+v warmup %v: want a point per second over 2.2 s and warmup 0.5", rep.Series, rep.WarmupS)
	}
	var published, prevT float64
	for _, p := range rep.Series {
		if p.T <= prevT {
			t.Fatalf("series times not increasing: %+v", rep.Series)
		}
		published += p.PublishRate * (p.T - prevT)
		prevT = p.T
	}
	last := rep.Series[len(rep.Series)-1]
	if published < 0.9*float64(rep.Published) || published > 1.1*float64(rep.Published) || last.T < 2 {
		t.Fatalf("the per-second rates add up to %.0f messages over %.1f s, the run published %d", published, last.T, rep.Published)
	}
	mid := rep.Series[1]
	if mid.Confirms == 0 || mid.ConfirmP50 <= 0 || mid.ConfirmP99 < mid.ConfirmP50 || mid.Deliveries == 0 || mid.E2EP50 <= 0 || mid.E2EP99 < mid.E2EP50 {
		t.Fatalf("a full second of steady traffic has no latency figures: %+v", mid)
	}
	var b bytes.Buffer
	if err := rep.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	checkSelfContained(t, page)
	if n := strings.Count(page, "<svg"); n < 2 {
		t.Errorf("%d charts, want throughput and latency", n)
	}
	for _, p := range rep.Series {
		for _, v := range []string{fmt.Sprintf("%.0f", p.PublishRate), fmt.Sprintf("%.0f", p.ConsumeRate),
			fmt.Sprintf("%.2f", p.ConfirmP99), fmt.Sprintf("%.2f", p.E2EP99)} {
			if !strings.Contains(page, "<td>"+v+"</td>") {
				t.Errorf("the per-second value %s (second %.1f) is not in the report", v, p.T)
			}
		}
	}
	for _, v := range []string{"broker_cpu_us_per_msg", "client_cpu_us_per_msg", fmt.Sprintf("%.2f", rep.ClientCPU),
		fmt.Sprintf("%.0f", rep.PublishRate), fmt.Sprintf("%.3f", rep.E2ELat.P99), rep.Conditions} {
		if !strings.Contains(page, v) {
			t.Errorf("the summary lacks %q", v)
		}
	}
}

// TestCompareHTMLReport: the compare report puts the brokers side by side
// per scenario, a chart line per broker, and says why a cell was not run.
func TestCompareHTMLReport(t *testing.T) {
	rep := func(driver string, rate float64) *Report {
		r := &Report{Driver: driver, Scenario: "throughput", PublishRate: rate, ConsumeRate: rate - 1, BrokerCPU: 3.25, ClientCPU: 1.5,
			ConfirmLat: Latency{P50: 1.5, P99: 7.25}, E2ELat: Latency{P50: 2.5, P99: 9.75}, Conditions: "2 producers <&>", WarmupS: 1}
		for i := 1; i <= 3; i++ {
			r.Series = append(r.Series, Second{T: float64(i), PublishRate: rate + float64(i), ConsumeRate: rate - float64(i),
				Confirms: 10, ConfirmP50: 1, ConfirmP99: 2 + float64(i), Deliveries: 10, E2EP50: 1, E2EP99: 4 + float64(i)})
		}
		return r
	}
	results := []CompareResult{
		{Scenario: "throughput", Label: "Warren", Report: rep("warren", 550001)},
		{Scenario: "throughput", Label: "RabbitMQ classic", Report: rep("amqp", 16002)},
		{Scenario: "priority-mix", Label: "RabbitMQ quorum", Note: "not supported: RabbitMQ quorum queues have no x-max-priority"},
	}
	var b bytes.Buffer
	if err := WriteCompareHTML(&b, results); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	checkSelfContained(t, page)
	for _, v := range []string{"<h2>throughput</h2>", "<h2>priority-mix</h2>", "Warren", "RabbitMQ classic", "550001", "16002",
		"550004", "16005", "quorum queues have no x-max-priority", "2 producers &lt;&amp;&gt;", "3.25", "1.50"} {
		if !strings.Contains(page, v) {
			t.Errorf("the compare report lacks %q", v)
		}
	}
	// The throughput scenario's charts have a line per broker.
	sec := page[strings.Index(page, "<h2>throughput</h2>"):strings.Index(page, "<h2>priority-mix</h2>")]
	if n := strings.Count(sec, "<polyline"); n < 4 {
		t.Errorf("%d lines in the throughput section, want at least 2 brokers × 2 charts", n)
	}
}

// checkSelfContained fails unless page is well-formed (it is written as
// XHTML, so encoding/xml reads it) and refers to nothing outside itself.
func checkSelfContained(t *testing.T, page string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(page))
	d.Strict = true
	depth, elems := 0, 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, page)
		}
		switch tok.(type) {
		case xml.StartElement:
			depth++
			elems++
		case xml.EndElement:
			depth--
		}
	}
	if depth != 0 || elems < 20 || !strings.HasPrefix(page, "<!DOCTYPE html>") {
		t.Fatalf("depth %d, %d elements: not a whole page", depth, elems)
	}
	for _, bad := range []string{"http:", "https:", "//", "src=", "href=", "@import", "url(", "<link", "<script"} {
		if strings.Contains(page, bad) {
			i := strings.Index(page, bad)
			t.Errorf("the report refers outside itself (%q): …%s…", bad, page[max(0, i-60):min(len(page), i+60)])
		}
	}
}
