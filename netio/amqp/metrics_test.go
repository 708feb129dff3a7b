package amqp_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio/amqp"
)

// metricValue reads one sample from Prometheus text.
func metricValue(t *testing.T, text, name string) string {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			return rest
		}
	}
	t.Fatalf("no %s in\n%s", name, text)
	return ""
}

// The AMQP front's metrics: connections, channels, messages published and
// delivered (deliver and get-ok).
func TestAMQPMetrics(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, l, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	if _, err := conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("m", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	var last *amqp091.DeferredConfirmation
	for i := 0; i < 3; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", "m", false, false, amqp091.Publishing{Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		last = dc
	}
	if ok, err := last.WaitContext(context.Background()); !ok || err != nil {
		t.Fatal("not confirmed", err)
	}
	if _, ok, err := ch.Get("m", true); !ok || err != nil {
		t.Fatalf("get: %v %v", ok, err)
	}
	ds, err := ch.Consume("m", "c", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	recv(t, ds)
	recv(t, ds)
	var b bytes.Buffer
	l.WriteMetrics(&b)
	for name, want := range map[string]string{
		"warren_amqp_connections":              "1",
		"warren_amqp_channels":                 "2",
		"warren_amqp_messages_published_total": "3",
		"warren_amqp_messages_delivered_total": "3",
	} {
		if got := metricValue(t, b.String(), name); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
}
