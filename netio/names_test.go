package netio_test

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestAmqPrefixIsReserved: a client cannot declare a queue or a new exchange
// named amq.* (RabbitMQ's rule), so it cannot squat the names the broker
// generates; the standard amq.* exchanges can still be redeclared as they
// are.
func TestAmqPrefixIsReserved(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	if _, err := ch.DeclareQueue(ctx, "amq.gen-9", client.QueueOptions{}); wire.CodeOf(err) != wire.AccessRefused {
		t.Fatalf("declare queue amq.gen-9: got %v, want access_refused", err)
	}
	if err := ch.DeclareExchange(ctx, "amq.mine", "direct", client.ExchangeOptions{}); wire.CodeOf(err) != wire.AccessRefused {
		t.Fatalf("declare exchange amq.mine: got %v, want access_refused", err)
	}
	must(t, ch.DeclareExchange(ctx, "amq.direct", "direct", client.ExchangeOptions{Durable: true}))
	if _, err := s.DeclareQueue(wire.QueueDeclare{Name: "amq.gen-1"}); wire.CodeOf(err) != wire.AccessRefused {
		t.Fatalf("admin declare of amq.gen-1: got %v, want access_refused", err)
	}
	aliveCheck(t, s, ch)
}

// TestGeneratedQueueNamesAreUnguessable: server-named queues carry 128
// random bits, not a counter another client can predict.
func TestGeneratedQueueNamesAreUnguessable(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	re := regexp.MustCompile(`^amq\.gen-[A-Za-z0-9_-]{22}$`)
	seen := map[string]bool{}
	for i := 0; i < 20; i++ {
		q, err := ch.DeclareQueue(ctx, "", client.QueueOptions{Exclusive: true})
		must(t, err)
		if !re.MatchString(q.Name) || seen[q.Name] {
			t.Fatalf("generated name %q: want amq.gen- and 22 random base64url characters, each new", q.Name)
		}
		seen[q.Name] = true
	}
}

// TestNamesMustBeCleanUTF8: exchange and queue names must be valid UTF-8
// without control characters (spec §2), over the protocol and the
// operator API alike.
func TestNamesMustBeCleanUTF8(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	for _, name := range []string{"bad\xff", "new\nline", "tab\there", "nul\x00", "del\x7f", "c1\u0085"} {
		if _, err := ch.DeclareQueue(ctx, name, client.QueueOptions{}); wire.CodeOf(err) != wire.InvalidArgument {
			t.Errorf("queue %q: got %v, want invalid_argument", name, err)
		}
		if err := ch.DeclareExchange(ctx, name, "fanout", client.ExchangeOptions{}); wire.CodeOf(err) != wire.InvalidArgument {
			t.Errorf("exchange %q: got %v, want invalid_argument", name, err)
		}
		if _, err := s.DeclareQueue(wire.QueueDeclare{Name: name}); wire.CodeOf(err) != wire.InvalidArgument {
			t.Errorf("admin queue %q: got %v, want invalid_argument", name, err)
		}
	}
	for _, name := range []string{`quo"te`, `back\slash`, "ünïcødé ✓", "sp ace"} {
		if _, err := ch.DeclareQueue(ctx, name, client.QueueOptions{}); err != nil {
			t.Errorf("queue %q: %v", name, err)
		}
	}
	aliveCheck(t, s, ch)
}

// TestMetricsParseWithPrometheus: a /metrics scrape is read by
// Prometheus' own text parser, with queues named with quotes, backslashes
// and non-ASCII, every label value coming back exactly; the confirm
// latency is a Prometheus histogram (le buckets), which histogram_quantile
// can read.
func TestMetricsParseWithPrometheus(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	names := []string{`quo"te`, `back\slash`, `both\"`, "ünïcødé ✓", "plain"}
	for _, n := range names {
		_, err := ch.DeclareQueue(ctx, n, client.QueueOptions{})
		must(t, err)
	}
	// Refused names never reach /metrics.
	_, _ = ch.DeclareQueue(ctx, "bad\xff", client.QueueOptions{})
	_, _ = ch.DeclareQueue(ctx, "new\nline", client.QueueOptions{})
	must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "plain", Body: []byte("x")}))

	var buf bytes.Buffer
	s.WriteMetrics(&buf)
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("Prometheus cannot parse /metrics: %v\n%s", err, buf.String())
	}
	got := map[string]bool{}
	for _, m := range fams["warren_queue_ready"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "queue" {
				got[l.GetValue()] = true
			}
		}
	}
	for _, n := range names {
		if !got[n] {
			t.Errorf("queue %q missing from warren_queue_ready labels %v", n, got)
		}
	}
	if len(got) != len(names) {
		t.Errorf("warren_queue_ready has %d queues, want %d: %v", len(got), len(names), got)
	}
	buckets := fams["warren_publish_confirm_seconds_bucket"]
	if buckets == nil || len(buckets.GetMetric()) < 5 {
		t.Fatalf("no le buckets for warren_publish_confirm_seconds:\n%s", grepLines(buf.String(), "warren_publish_confirm_seconds"))
	}
	for _, m := range buckets.GetMetric() {
		hasLe := false
		for _, l := range m.GetLabel() {
			if l.GetName() == "vmrange" {
				t.Fatalf("vmrange bucket (Prometheus cannot read it): %v", m)
			}
			hasLe = hasLe || l.GetName() == "le"
		}
		if !hasLe {
			t.Fatalf("bucket without le: %v", m)
		}
	}
	if fams["warren_publish_confirm_seconds_count"] == nil {
		t.Fatal("no warren_publish_confirm_seconds_count")
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
