package amqp

import (
	"io"

	"github.com/VictoriaMetrics/metrics"
)

// listenerMetrics are the AMQP front's own metrics, written beside netio's
// on /metrics (Listener.WriteMetrics), all named warren_amqp_*.
type listenerMetrics struct {
	set                                         *metrics.Set
	refusedMax, refusedPerSource, refusedUnauth *metrics.Counter
	handshakeTimeouts                           *metrics.Counter
}

func (m *listenerMetrics) init(l *Listener) {
	m.set = metrics.NewSet()
	m.refusedMax = m.set.NewCounter(`warren_amqp_connections_refused_total{reason="max_connections"}`)
	m.refusedPerSource = m.set.NewCounter(`warren_amqp_connections_refused_total{reason="per_source"}`)
	m.refusedUnauth = m.set.NewCounter(`warren_amqp_connections_refused_total{reason="unauthenticated"}`)
	m.handshakeTimeouts = m.set.NewCounter("warren_amqp_handshake_timeouts_total")
	m.set.NewGauge("warren_amqp_connections_unauthenticated", func() float64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return float64(l.unauthN)
	})
}

// WriteMetrics writes the AMQP front's metrics in Prometheus text format.
func (l *Listener) WriteMetrics(w io.Writer) { l.met.set.WritePrometheus(w) }
