package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/warren-mq/warren/client"
)

// The Grafana dashboard and the Prometheus rules under ops/ name metrics
// by hand; these tests hold them to what warrend's /metrics really serves
// (`make dashboards` also runs promtool on the rules).
const (
	dashboardPath = "../../ops/grafana/warren.json"
	alertsPath    = "../../ops/prometheus/alerts.yml"
)

// synthesized are the series Prometheus makes itself for every target;
// only the rules may name them.
var synthesized = []string{"up"}

// TestDashboardsNameLiveMetrics: every metric the dashboard and the alert
// rules name is in a live scrape of warrend after a little traffic.
func TestDashboardsNameLiveMetrics(t *testing.T) {
	scraped := liveMetricNames(t)
	dash := dashboardExprs(t)
	rules := ruleExprs(t, alertsPath)
	if len(dash) < 10 || len(rules) < 5 {
		t.Fatalf("found %d dashboard and %d rule expressions: the files lost their content", len(dash), len(rules))
	}
	if err := missingMetrics(dash, scraped, nil); err != nil {
		t.Errorf("%s: %v", dashboardPath, err)
	}
	if err := missingMetrics(rules, scraped, synthesized); err != nil {
		t.Errorf("%s: %v", alertsPath, err)
	}
}

// TestDashboardsCheckCatchesUnknownMetric: the check above fails on a rule
// that names a metric warrend does not export (a typo, a renamed metric).
func TestDashboardsCheckCatchesUnknownMetric(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yml")
	bad := "groups:\n- name: x\n  rules:\n  - alert: Typo\n    expr: warren_queue_redy > 10 and on (queue) warren_queue_consumers == 0\n" +
		"    for: 5m\n    labels: {severity: warning}\n    annotations: {description: d}\n"
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	scraped := map[string]bool{"warren_queue_ready": true, "warren_queue_consumers": true}
	err := missingMetrics(ruleExprs(t, path), scraped, synthesized)
	if err == nil || !strings.Contains(err.Error(), "warren_queue_redy") || strings.Contains(err.Error(), "warren_queue_consumers is not") {
		t.Fatalf("got %v, want an error naming warren_queue_redy alone", err)
	}
}

func TestPromQLMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (queue) (rate(warren_queue_published_total{instance=~"$instance", queue=~"a}b"}[$__rate_interval]))`: {"warren_queue_published_total"},
		`warren_stored_message_bytes > 0.8 * warren_memory_high_watermark_bytes`:                                     {"warren_stored_message_bytes", "warren_memory_high_watermark_bytes"},
		"warren_queue_ready > 1e3\n  and on (instance, queue) delta(warren_queue_ready[15m]) > 0":                    {"warren_queue_ready"},
		`histogram_quantile(0.99, sum without (instance) (rate(warren_publish_confirm_seconds_bucket[5m])))`:         {"warren_publish_confirm_seconds_bucket"},
		`label_values(warren_queue_ready{instance=~"$instance"}, queue)`:                                             {"warren_queue_ready"},
		`up{job=~".*warren.*"} == 0 or absent(go_goroutines) unless on () vector(1) offset 5m`:                       {"up", "go_goroutines"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}

// TestDashboardImportable: the dashboard is JSON Grafana imports: a
// datasource variable that every panel and query uses, unique panel ids,
// a position for each panel and a query for each graph.
func TestDashboardImportable(t *testing.T) {
	var d struct {
		Title, UID    string
		SchemaVersion int
		Templating    struct {
			List []struct{ Type, Name, Query any }
		}
		Panels []map[string]any
	}
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if d.Title == "" || d.UID == "" || d.SchemaVersion == 0 {
		t.Errorf("title %q uid %q schemaVersion %d: Grafana needs all three", d.Title, d.UID, d.SchemaVersion)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		hasDS = hasDS || (v.Type == "datasource" && v.Name == "datasource" && v.Query == "prometheus")
	}
	if !hasDS {
		t.Error("no datasource variable of type prometheus named datasource")
	}
	ids := map[float64]bool{}
	for _, p := range d.Panels {
		title, _ := p["title"].(string)
		id, _ := p["id"].(float64)
		if id == 0 || ids[id] {
			t.Errorf("panel %q: id %v missing or repeated", title, p["id"])
		}
		ids[id] = true
		if gp, ok := p["gridPos"].(map[string]any); !ok || gp["w"] == nil || gp["h"] == nil {
			t.Errorf("panel %q has no gridPos", title)
		}
		if p["type"] == "row" {
			continue
		}
		if !usesDSVar(p["datasource"]) {
			t.Errorf("panel %q: datasource %v, want the ${datasource} variable", title, p["datasource"])
		}
		targets, _ := p["targets"].([]any)
		if len(targets) == 0 {
			t.Errorf("panel %q has no query", title)
		}
		for _, tg := range targets {
			m, _ := tg.(map[string]any)
			if e, _ := m["expr"].(string); e == "" || !usesDSVar(m["datasource"]) {
				t.Errorf("panel %q: query %v lacks an expression or the datasource variable", title, m)
			}
		}
	}
}

func usesDSVar(v any) bool {
	m, ok := v.(map[string]any)
	return ok && m["type"] == "prometheus" && m["uid"] == "${datasource}"
}

// TestAlertRulesComplete: each rule has a for:, a severity an operator can
// route on, and a description that says what to do.
func TestAlertRulesComplete(t *testing.T) {
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr, For string
				Labels           map[string]string
				Annotations      map[string]string
			}
		}
	}
	b, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			seen[r.Alert] = true
			if r.Alert == "" || r.Expr == "" || r.For == "" {
				t.Errorf("rule %q: needs alert, expr and for", r.Alert)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("rule %q: severity %q, want warning or critical", r.Alert, s)
			}
			if len(r.Annotations["description"]) < 80 || r.Annotations["summary"] == "" {
				t.Errorf("rule %q: needs a summary and a description that says what to do", r.Alert)
			}
		}
	}
	for _, want := range []string{"WarrenMemoryAlarm", "WarrenDiskAlarm", "WarrenDiskLow", "WarrenQueueGrowingWithoutConsumers", "WarrenDeadLettering", "WarrenPublishersBlocked"} {
		if !seen[want] {
			t.Errorf("no rule %s", want)
		}
	}
}

// TestDashboardShowsDiskAlarm: the dashboard shows the disk alarm and the
// free-disk limit beside the free space (warren_disk_alarm,
// warren_disk_free_limit_bytes), not only the memory alarm.
func TestDashboardShowsDiskAlarm(t *testing.T) {
	names := map[string]bool{}
	for _, e := range dashboardExprs(t) {
		for _, n := range metricNames(e) {
			names[n] = true
		}
	}
	for _, want := range []string{"warren_disk_alarm", "warren_disk_free_limit_bytes", "warren_flow_blocked"} {
		if !names[want] {
			t.Errorf("%s does not show %s", dashboardPath, want)
		}
	}
}

// liveMetricNames starts warrend, sends a message through a queue and
// returns the metric names of a /metrics scrape.
func liveMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]net.Addr, 1)
	done := make(chan error, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data", filepath.Join(dir, "data"), "--log-level", "error",
			"--disk-free-limit", "-1"},
			func(string) string { return "" }, strings.NewReader(""), io.Discard, &stderr,
			func(b, h net.Addr) { addrs <- [2]net.Addr{b, h} })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("warrend did not shut down")
		}
	})
	var a [2]net.Addr
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("warrend exited: %v\n%s", err, stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("warrend did not start")
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	c, err := client.Dial(cctx, "warren://guest:guest@"+a[0].String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel(cctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.DeclareQueue(cctx, "orders", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish(cctx, "", client.Message{RoutingKey: "orders", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	cs, err := ch.Consume(cctx, "orders", client.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-cs.Deliveries():
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
	case <-cctx.Done():
		t.Fatal("no delivery")
	}
	resp, err := http.Get("http://" + a[1].String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// dashboardExprs returns every PromQL expression of the dashboard: the
// panels' queries and the template variables' queries.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var out []string
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				walk(e, k)
			}
		case []any:
			for _, e := range x {
				walk(e, key)
			}
		case string:
			if key == "expr" || (key == "query" && strings.Contains(x, "(")) {
				out = append(out, x)
			}
		}
	}
	walk(v, "")
	return out
}

func ruleExprs(t *testing.T, path string) []string {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []struct{ Expr string }
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, r.Expr)
		}
	}
	return out
}

// missingMetrics lists the metrics the expressions name that are neither
// scraped nor allowed.
func missingMetrics(exprs []string, scraped map[string]bool, allowed []string) error {
	missing := map[string][]string{}
	for _, e := range exprs {
		for _, n := range metricNames(e) {
			if !scraped[n] && !slices.Contains(allowed, n) {
				missing[n] = append(missing[n], e)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	var names []string
	for n := range missing {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "\n  %s is not in warrend's /metrics (used in %q)", n, missing[n][0])
	}
	return fmt.Errorf("metrics not exported:%s", b.String())
}

var (
	promStrings  = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promMatchers = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promLabelVal = regexp.MustCompile(`\blabel_values\s*\(([^,)]*)(?:,[^)]*)?\)`)
	promToken    = regexp.MustCompile(`\$\{?\w+\}?|[0-9][0-9A-Za-z_.]*(?:[eE][+-][0-9]+)?|[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "inf", "nan", "Inf", "NaN"}
)

// metricNames returns the metric names a PromQL expression (or a Grafana
// label_values query) reads, in order of first use. It is a loose parse:
// strings, label matchers, ranges, grouping label lists and Grafana
// variables are removed; an identifier followed by "(" is a function.
func metricNames(expr string) []string {
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	e = promLabelVal.ReplaceAllString(e, "$1")
	var out []string
	for _, m := range promToken.FindAllStringSubmatch(e, -1) {
		tok := m[0]
		if tok[0] == '$' || (tok[0] >= '0' && tok[0] <= '9') || m[1] != "" || slices.Contains(promKeywords, tok) {
			continue
		}
		if !slices.Contains(out, tok) {
			out = append(out, tok)
		}
	}
	return out
}

// promtoolCases are promtool unit tests of the alert rules: each alert
// fires on the trouble it is for, and not on a healthy broker.
const promtoolCases = `rule_files: [alerts.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - {series: 'up{job="warren",instance="a"}', values: '0x10'}
      - {series: 'up{job="warren",instance="b"}', values: '1x10'}
      - {series: 'warren_flow_blocked{job="warren",instance="a"}', values: '0 1x10'}
      - {series: 'warren_flow_blocked{job="warren",instance="b"}', values: '0x10'}
      - {series: 'warren_connections_blocked{job="warren",instance="a"}', values: '2x10'}
      - {series: 'warren_connections_blocked{job="warren",instance="b"}', values: '0x10'}
      - {series: 'warren_disk_free_bytes{job="warren",instance="a"}', values: '4x10'}
      - {series: 'warren_disk_free_bytes{job="warren",instance="b"}', values: '10x20'}
      - {series: 'warren_disk_total_bytes{job="warren",instance="a"}', values: '100x10'}
      - {series: 'warren_disk_total_bytes{job="warren",instance="b"}', values: '100x20'}
      - {series: 'warren_dead_letter_dropped_total{job="warren",instance="a",reason="unroutable"}', values: '0 0 1 1 1 1'}
      - {series: 'warren_dead_letter_dropped_total{job="warren",instance="a",reason="cycle"}', values: '0x5'}
    alert_rule_test:
      - {eval_time: 2m, alertname: WarrenDown, exp_alerts: [{exp_labels: {severity: critical, job: warren, instance: a}}]}
      - {eval_time: 5m, alertname: WarrenMemoryAlarm, exp_alerts: [{exp_labels: {severity: critical, job: warren, instance: a}}]}
      - {eval_time: 6m, alertname: WarrenPublishersBlocked, exp_alerts: [{exp_labels: {severity: warning, job: warren, instance: a}}]}
      - {eval_time: 4m, alertname: WarrenPublishersBlocked, exp_alerts: []}
      - {eval_time: 5m, alertname: WarrenDiskCritical, exp_alerts: [{exp_labels: {severity: critical, job: warren, instance: a}}]}
      - {eval_time: 8m, alertname: WarrenDiskLow, exp_alerts: []}
      - {eval_time: 15m, alertname: WarrenDiskLow, exp_alerts: [{exp_labels: {severity: warning, job: warren, instance: a}}, {exp_labels: {severity: warning, job: warren, instance: b}}]}
      - {eval_time: 3m, alertname: WarrenDeadLettersDropped, exp_alerts: [{exp_labels: {severity: critical, job: warren, instance: a, reason: unroutable}}]}
  - interval: 1m
    input_series:
      - {series: 'warren_stored_message_bytes{job="warren",instance="a"}', values: '900x20'}
      - {series: 'warren_stored_message_bytes{job="warren",instance="b"}', values: '700x20'}
      - {series: 'warren_memory_high_watermark_bytes{job="warren",instance="a"}', values: '1000x20'}
      - {series: 'warren_memory_high_watermark_bytes{job="warren",instance="b"}', values: '1000x20'}
      - {series: 'warren_queue_ready{job="warren",instance="a",queue="orders"}', values: '1000+100x40'}
      - {series: 'warren_queue_consumers{job="warren",instance="a",queue="orders"}', values: '0x40'}
      - {series: 'warren_queue_ready{job="warren",instance="a",queue="busy"}', values: '1000+100x40'}
      - {series: 'warren_queue_consumers{job="warren",instance="a",queue="busy"}', values: '3x40'}
      - {series: 'warren_queue_ready{job="warren",instance="a",queue="idle"}', values: '5000x40'}
      - {series: 'warren_queue_consumers{job="warren",instance="a",queue="idle"}', values: '0x40'}
      - {series: 'warren_queue_dead_lettered_total{job="warren",instance="a",queue="orders"}', values: '0+20x40'}
      - {series: 'warren_queue_dead_lettered_total{job="warren",instance="a",queue="busy"}', values: '0+1x40'}
    alert_rule_test:
      - {eval_time: 15m, alertname: WarrenMemoryNearWatermark, exp_alerts: [{exp_labels: {severity: warning, job: warren, instance: a}}]}
      - {eval_time: 35m, alertname: WarrenQueueGrowingWithoutConsumers, exp_alerts: [{exp_labels: {severity: warning, job: warren, instance: a, queue: orders}}]}
      - {eval_time: 10m, alertname: WarrenQueueGrowingWithoutConsumers, exp_alerts: []}
      - {eval_time: 35m, alertname: WarrenDeadLettering, exp_alerts: [{exp_labels: {severity: warning, job: warren, instance: a, queue: orders}}]}
  - interval: 1m
    input_series:
      # c: the disk alarm (it blocks publishers too: warren_flow_blocked); d: the memory alarm alone.
      - {series: 'warren_disk_alarm{job="warren",instance="c"}', values: '0 1x10'}
      - {series: 'warren_flow_blocked{job="warren",instance="c"}', values: '0 1x10'}
      - {series: 'warren_disk_alarm{job="warren",instance="d"}', values: '0x10'}
      - {series: 'warren_flow_blocked{job="warren",instance="d"}', values: '0 1x10'}
    alert_rule_test:
      - {eval_time: 1m, alertname: WarrenDiskAlarm, exp_alerts: []}
      - {eval_time: 3m, alertname: WarrenDiskAlarm, exp_alerts: [{exp_labels: {severity: critical, job: warren, instance: c}}]}
      - {eval_time: 3m, alertname: WarrenMemoryAlarm, exp_alerts: [{exp_labels: {severity: critical, job: warren, instance: d}}]}
`

// TestAlertRulesFire runs promtoolCases with promtool (make dashboards
// sets WARREN_REQUIRE_PROMTOOL, so it cannot be skipped there). promtool
// compares annotations too; the cases check which alerts fire with which
// labels, so the rules are given to it without their annotations.
func TestAlertRulesFire(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("WARREN_REQUIRE_PROMTOOL") != "" {
			t.Fatal("promtool not found: apt-get install prometheus (Debian), or get it from prometheus.io")
		}
		t.Skip("promtool not installed; make dashboards runs this test")
	}
	var doc yaml.Node
	b, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var strip func(n *yaml.Node)
	strip = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == "annotations" {
					n.Content = append(n.Content[:i], n.Content[i+2:]...)
					i -= 2
				}
			}
		}
		for _, c := range n.Content {
			strip(c)
		}
	}
	strip(&doc)
	rules, err := yaml.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "alerts.yml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yml"), []byte(promtoolCases), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "test", "rules", filepath.Join(dir, "alerts_test.yml")).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
