package netio

// The Server's metrics (warren_*, in Prometheus text format): the
// counters and gauges registered at start, the per-queue lines written at
// each scrape, and label escaping.

import (
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/segment"
)

type serverMetrics struct {
	set                                              *metrics.Set
	published, delivered, acked, confirmed, returned *metrics.Counter
	protocolErrors, authFailures                     *metrics.Counter
	tlsHandshakeFailures                             *metrics.Counter
	confirmLatency                                   *metrics.PrometheusHistogram
	dlDropped                                        [broker.NumDLDrops]*metrics.Counter
	channels                                         atomic.Int64
	blocked                                          atomic.Int64 // connections not being read (memory alarm)
	busyNanos                                        atomic.Int64
	lastBusy, lastBusyAt                             atomic.Int64
}

func (s *Server) initMetrics() {
	m := &s.metrics
	m.set = metrics.NewSet()
	s.adm.init(m.set, s.unauthenticatedCount)
	m.published = m.set.NewCounter("warren_published_total")
	m.delivered = m.set.NewCounter("warren_delivered_total")
	m.acked = m.set.NewCounter("warren_acked_total")
	m.confirmed = m.set.NewCounter("warren_confirmed_total")
	m.returned = m.set.NewCounter("warren_returned_total")
	m.protocolErrors = m.set.NewCounter("warren_protocol_errors_total")
	m.authFailures = m.set.NewCounter("warren_auth_failures_total")
	m.tlsHandshakeFailures = m.set.NewCounter("warren_tls_handshake_failures_total")
	// Prometheus-style le buckets (histogram_quantile cannot read
	// VictoriaMetrics' vmrange buckets), from 100 µs: a confirm in memory
	// takes well under a millisecond.
	m.confirmLatency = m.set.NewPrometheusHistogramExt("warren_publish_confirm_seconds", confirmBuckets)
	for r := range m.dlDropped {
		m.dlDropped[r] = m.set.NewCounter(`warren_dead_letter_dropped_total{reason="` + broker.DLDrop(r).String() + `"}`)
	}
	m.set.NewGauge("warren_auth_checks_running", func() float64 { return float64(len(s.auth.checks)) })
	m.set.NewGauge("warren_auth_checks_max", func() float64 { return float64(cap(s.auth.checks)) })
	m.set.NewGauge("warren_auth_delayed_total", func() float64 { return float64(s.auth.delayed.Load()) })
	m.set.NewGauge("warren_connections", func() float64 { return float64(s.ConnectionCount()) })
	m.set.NewGauge("warren_channels", func() float64 { return float64(m.channels.Load()) })
	m.set.NewGauge("warren_stored_message_bytes", func() float64 { return float64(s.StoredBytes()) })
	m.set.NewGauge("warren_memory_high_watermark_bytes", func() float64 { return float64(s.cfg.MemoryHighWater) })
	m.set.NewGauge("warren_flow_blocked", func() float64 {
		if s.flowBlocked() {
			return 1
		}
		return 0
	})
	m.set.NewGauge("warren_disk_alarm", func() float64 {
		if s.diskAlarm.Load() {
			return 1
		}
		return 0
	})
	m.set.NewGauge("warren_disk_free_limit_bytes", func() float64 { return float64(s.cfg.DiskFreeLimit) })
	m.set.NewGauge("warren_connections_blocked", func() float64 { return float64(m.blocked.Load()) })
	m.set.NewGauge("warren_eventloop_busy_ratio", func() float64 {
		now := time.Now().UnixNano()
		busy := m.busyNanos.Load()
		prevAt, prev := m.lastBusyAt.Swap(now), m.lastBusy.Swap(busy)
		if prevAt == 0 || now <= prevAt {
			return 0
		}
		return float64(busy-prev) / float64(now-prevAt) / float64(s.cfg.EventLoops)
	})
	m.set.RegisterMetricsWriter(func(w io.Writer) {
		if s.nodeLog != nil {
			writeLogMetrics(w, s.nodeLog.Stats())
		}
		for _, q := range s.Queues() {
			l := queueLabels(q.Name)
			fmt.Fprintf(w, "warren_queue_ready%s %d\n", l, q.Ready)
			fmt.Fprintf(w, "warren_queue_unacked%s %d\n", l, q.Unacked)
			fmt.Fprintf(w, "warren_queue_consumers%s %d\n", l, q.Consumers)
			fmt.Fprintf(w, "warren_queue_published_total%s %d\n", l, q.Published)
			fmt.Fprintf(w, "warren_queue_delivered_total%s %d\n", l, q.Delivered)
			fmt.Fprintf(w, "warren_queue_acked_total%s %d\n", l, q.Acked)
			fmt.Fprintf(w, "warren_queue_redelivered_total%s %d\n", l, q.Redelivered)
			fmt.Fprintf(w, "warren_queue_dead_lettered_total%s %d\n", l, q.DeadLettered)
			fmt.Fprintf(w, "warren_queue_dead_letter_dropped_total%s %d\n", l, q.DeadLetterDropped)
			fmt.Fprintf(w, "warren_queue_dead_letters_held%s %d\n", l, q.DeadLettersHeld)
			if q.RaftRole != "" {
				// A replicated queue in a cluster: its leader as this node
				// knows it (0: none), whether this node leads it, and this
				// node's commit lag (commit index − applied index).
				fmt.Fprintf(w, "warren_queue_leader%s %d\n", l, q.Leader)
				fmt.Fprintf(w, "warren_queue_replicas%s %d\n", l, len(q.Replicas))
				fmt.Fprintf(w, "warren_queue_raft_is_leader%s %d\n", l, b2i(q.RaftRole == "leader"))
				fmt.Fprintf(w, "warren_queue_raft_commit_index%s %d\n", l, q.RaftCommit)
				fmt.Fprintf(w, "warren_queue_raft_applied_index%s %d\n", l, q.RaftApplied)
				fmt.Fprintf(w, "warren_queue_raft_commit_lag%s %d\n", l, q.RaftCommit-min(q.RaftCommit, q.RaftApplied))
				fmt.Fprintf(w, "warren_queue_replica_failed%s %d\n", l, b2i(q.RaftRole == "failed"))
			}
		}
	})
}

// writeLogMetrics writes the node log's counters (segment.Stats): its
// fdatasyncs and what it wrote, its files, and how often and how long
// appends waited for the mover to catch up (segment.Options.MaxSealedWALs),
// which shows whether a durable queue's confirm stall came from the mover.
func writeLogMetrics(w io.Writer, st segment.Stats) {
	fmt.Fprintf(w, "warren_log_syncs_total %d\n", st.Syncs)
	fmt.Fprintf(w, "warren_log_pipelined_writes_total %d\n", st.Pipelined)
	fmt.Fprintf(w, "warren_log_records_total %d\n", st.Records)
	fmt.Fprintf(w, "warren_log_wal_written_bytes_total %d\n", st.WALBytes)
	fmt.Fprintf(w, "warren_log_moved_bytes_total %d\n", st.MovedBytes)
	fmt.Fprintf(w, "warren_log_compacted_bytes_total %d\n", st.CompactedBytes)
	fmt.Fprintf(w, "warren_log_wal_files %d\n", st.WALFiles)
	fmt.Fprintf(w, "warren_log_segment_files %d\n", st.SegmentFiles)
	fmt.Fprintf(w, "warren_log_deleted_files_total %d\n", st.DeletedFiles)
	fmt.Fprintf(w, "warren_log_mover_waits_total %d\n", st.MoverWaits)
	fmt.Fprintf(w, "warren_log_mover_wait_seconds_total %g\n", st.MoverWaited.Seconds())
	fmt.Fprintf(w, "warren_log_mover_wait_max_seconds %g\n", st.MoverWaitMax.Seconds())
}

// confirmBuckets are the upper bounds of warren_publish_confirm_seconds.
var confirmBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// promLabelValue escapes a label value by the Prometheus text format's
// rules: backslash, double quote and newline are the only escapes (Go's
// strconv.Quote writes \x and \u escapes, which Prometheus refuses).
func promLabelValue(v string) string {
	if !strings.ContainsAny(v, "\\\"\n") {
		return v
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteByte(v[i])
		}
	}
	return b.String()
}

// WriteMetrics writes the broker's metrics in Prometheus text format.
func (s *Server) WriteMetrics(w io.Writer) { s.metrics.set.WritePrometheus(w) }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
