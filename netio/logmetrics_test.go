package netio_test

import (
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

// TestLogMetrics: with a data directory, /metrics has the node log's
// counters; confirmed persistent publishes to a durable queue are on disk,
// so the log counts fdatasyncs, records and bytes written, and at least
// its one WAL file. Without a data directory there is no log to count.
func TestLogMetrics(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{DataDir: t.TempDir()})
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	_, err := ch.DeclareQueue(ctx, "d", client.QueueOptions{Durable: true})
	must(t, err)
	before := metricValue(s, "warren_log_syncs_total")
	for range 3 {
		must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "d", Persistent: true, Body: make([]byte, 1000)}))
	}
	must(t, ch.WaitConfirms(ctx))
	if after := metricValue(s, "warren_log_syncs_total"); before < 1 || after <= before {
		t.Errorf("warren_log_syncs_total %g before the publishes (the declare's), %g after their confirms", before, after)
	}
	if v := metricValue(s, "warren_log_wal_written_bytes_total"); v < 3000 {
		t.Errorf("warren_log_wal_written_bytes_total %g after 3 confirmed 1,000-byte persistent publishes", v)
	}
	for _, name := range []string{"warren_log_records_total", "warren_log_wal_files"} {
		if v := metricValue(s, name); v < 1 {
			t.Errorf("%s %g", name, v)
		}
	}
	for _, name := range []string{"warren_log_mover_waits_total", "warren_log_mover_wait_seconds_total", "warren_log_mover_wait_max_seconds"} {
		if v := metricValue(s, name); v != 0 {
			t.Errorf("%s %g, want 0 (no append waited for the mover)", name, v)
		}
	}

	mem := warrentest.StartServer(t, &netio.Config{})
	if v := metricValue(mem, "warren_log_syncs_total"); v != -1 {
		t.Errorf("warren_log_syncs_total %g without a data directory, want none", v)
	}
}
