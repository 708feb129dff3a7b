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
	refusedProxy                                *metrics.Counter
	handshakeTimeouts                           *metrics.Counter
}

func (m *listenerMetrics) init(l *Listener) {
	m.set = metrics.NewSet()
	m.refusedMax = m.set.NewCounter(`warren_amqp_connections_refused_total{reason="max_connections"}`)
	m.refusedPerSource = m.set.NewCounter(`warren_amqp_connections_refused_total{reason="per_source"}`)
	m.refusedUnauth = m.set.NewCounter(`warren_amqp_connections_refused_total{reason="unauthenticated"}`)
	m.refusedProxy = m.set.NewCounter(`warren_amqp_connections_refused_total{reason="proxy_untrusted"}`)
	m.handshakeTimeouts = m.set.NewCounter("warren_amqp_handshake_timeouts_total")
	m.set.NewGauge("warren_amqp_connections_unauthenticated", func() float64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return float64(l.unauthN)
	})
	m.set.NewGauge("warren_amqp_connections", func() float64 { return float64(l.ConnectionCount()) })
	m.set.NewGauge("warren_amqp_channels", func() float64 {
		n := 0
		l.mu.Lock()
		for c := range l.conns {
			c.mu.Lock()
			n += len(c.channels)
			c.mu.Unlock()
		}
		l.mu.Unlock()
		return float64(n)
	})
	// Counted per connection (no shared cache line per message), summed
	// here with what closed connections counted.
	m.set.NewGauge("warren_amqp_messages_published_total", func() float64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		n := l.closedPublished
		for c := range l.conns {
			n += c.published.Load()
		}
		return float64(n)
	})
	m.set.NewGauge("warren_amqp_messages_delivered_total", func() float64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		n := l.closedDelivered
		for c := range l.conns {
			n += c.delivered.Load()
		}
		return float64(n)
	})
}

// WriteMetrics writes the AMQP front's metrics in Prometheus text format.
func (l *Listener) WriteMetrics(w io.Writer) { l.met.set.WritePrometheus(w) }
