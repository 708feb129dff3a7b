package netio

// The memory alarm: whether a publish must wait (memoryAlarm,
// publishMustWait), the stored bytes and the Go heap judged against the
// high-watermark on each tick (checkFlow), and FLOW sent to every
// connection when the alarms change (sendFlow).

import (
	"runtime"
	rtmetrics "runtime/metrics"

	"github.com/warren-mq/warren/wire"
)

// memoryAlarm reports whether publishes must wait: the alarm is on, or the
// stored bytes have passed the watermark since the last tick.
func (s *Server) memoryAlarm() bool {
	return s.flowOff.Load() || s.diskAlarm.Load() || s.StoredBytes() > s.cfg.MemoryHighWater
}

// publishMustWait reports whether a PUBLISH that would add cost to the
// stored bytes must wait: the alarm is on, or it would take what is stored
// past the watermark (unless nothing is stored: a frame that alone costs
// more than the watermark is let through then, or it would wait forever).
func (s *Server) publishMustWait(cost int64) bool {
	if s.flowOff.Load() || s.diskAlarm.Load() {
		return true
	}
	stored := s.StoredBytes()
	if stored > 0 && stored+cost > s.cfg.MemoryHighWater {
		s.flowWanted.Store(true) // the tick raises the alarm (FLOW to everyone)
		return true
	}
	return false
}

// heapAllowance is the Go heap the broker may grow by, beyond the
// watermark, before the heap alone raises the alarm: its own working
// memory (the loops' read buffers, connections' buffers, shards'
// scratch), which the stored-bytes gauge does not count.
const heapAllowance = 32 << 20

// heapLive is the Go heap's live bytes as of the last collection
// (runtime/metrics /gc/heap/live:bytes). Tick goroutine, and Start.
func (s *Server) heapLive() int64 {
	rtmetrics.Read(s.heapSample)
	if s.heapSample[0].Value.Kind() != rtmetrics.KindUint64 {
		return 0
	}
	return int64(s.heapSample[0].Value.Uint64())
}

// checkFlow pauses publishers above the memory high-watermark and resumes
// them below 80% of it. It looks at two figures: the bytes the broker
// counts for stored messages, and the Go runtime's live heap above what
// it was at start (less heapAllowance), which catches memory the count
// misses. The live heap is as of the last collection: to see it fall
// after a purge while nothing allocates, the tick collects (at most once a
// second) when only the heap holds the alarm on.
// It reports whether the memory alarm changed. Tick goroutine.
func (s *Server) checkFlow(conns []*conn) bool {
	used := s.StoredBytes()
	hw := s.cfg.MemoryHighWater
	heap := s.heapLive() - s.heapBase
	off := s.flowOff.Load()
	switch {
	case !off && (used > hw || heap > hw+heapAllowance || s.flowWanted.Swap(false)):
		s.flowOff.Store(true)
		s.log.Warn("memory high-watermark passed: pausing publishers", "stored_bytes", used, "heap_growth_bytes", heap, "high_water", hw)
	case off && used < hw*8/10:
		if heap > hw*8/10+heapAllowance {
			now := s.nowMs()
			if now-s.lastHeapGC < 1000 {
				return false
			}
			s.lastHeapGC = now
			runtime.GC()
			if heap = s.heapLive() - s.heapBase; heap > hw*8/10+heapAllowance {
				return false
			}
		}
		s.flowOff.Store(false)
		s.log.Info("memory below the watermark: resuming publishers", "stored_bytes", used, "heap_growth_bytes", heap)
	default:
		return false
	}
	return true
}

// flowBlocked reports whether publishers are paused: the memory alarm or
// the disk alarm is on.
func (s *Server) flowBlocked() bool { return s.flowOff.Load() || s.diskAlarm.Load() }

// sendFlow tells every open connection FLOW(active) when the memory and
// disk alarms together changed it. Tick goroutine.
func (s *Server) sendFlow(conns []*conn) {
	off := s.flowBlocked()
	if off != s.flowSent {
		s.flowSent = off
		for _, c := range conns {
			if c.state.Load() == stOpen {
				c.send(0, &wire.Flow{Active: !off})
			}
		}
	}
	s.notifyChanged()
}
