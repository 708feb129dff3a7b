package queue

import "fmt"

// checkInvariants verifies the machine's internal consistency. Tests call
// it after every command and Restore on what it read; it is O(state), so
// never on the hot path.
func (m *Machine) checkInvariants() error {
	if n := len(m.levels); m.runFloor < 0 || m.runFloor > n || m.runCount < 0 || m.runCount > m.cfg.StarvationLimit ||
		m.lastLevel < -1 || m.lastLevel >= n || m.cursor < 0 || m.cursor >= n {
		return fmt.Errorf("priority valve state out of range: floor %d count %d last %d cursor %d (%d levels, K %d)",
			m.runFloor, m.runCount, m.lastLevel, m.cursor, n, m.cfg.StarvationLimit)
	}
	var ready, bytes int64
	for l := range m.levels {
		r := &m.levels[l]
		bit := m.nonEmpty[l>>6]&(1<<(l&63)) != 0
		if bit != (r.len() > 0) {
			return fmt.Errorf("level %d: bitmap says %v, ring has %d", l, bit, r.len())
		}
		var lastFresh uint64
		for i := 0; i < r.len(); i++ {
			e := r.at(i)
			if _, gone := m.dead[e.id]; gone {
				continue
			}
			// FIFO within a level: messages never delivered keep their
			// publish order (ids increase with it).
			if e.deliveries == 0 {
				if e.id <= lastFresh {
					return fmt.Errorf("level %d: message %d after %d breaks FIFO", l, e.id, lastFresh)
				}
				lastFresh = e.id
			}
			if int(e.prio) != l {
				return fmt.Errorf("message %d of priority %d in level %d", e.id, e.prio, l)
			}
			ready++
			bytes += int64(e.size)
		}
	}
	if ready != m.readyCount || bytes != m.readyBytes {
		return fmt.Errorf("ready count %d/%d bytes %d/%d (counted/kept)", ready, m.readyCount, bytes, m.readyBytes)
	}
	// Length limits are enforced on publish only (see Enqueue), so they
	// are checked by the traces, not here.
	unacked, active, gets := 0, 0, 0
	for _, c := range m.consumers {
		unacked += c.live
		if !c.cancelled {
			active++
			if c.Get {
				gets++
			}
		}
	}
	if unacked != m.unacked || active != m.active || gets != m.gets {
		return fmt.Errorf("unacked %d/%d, active consumers %d/%d, gets %d/%d (counted/kept)", unacked, m.unacked, active, m.active, gets, m.gets)
	}
	for _, c := range m.consumers {
		live, liveBytes := 0, uint64(0)
		var last uint64
		for i := c.head; i < len(c.out); i++ {
			if c.out[i].tag <= last {
				return fmt.Errorf("consumer %d: tags out of order", c.ID)
			}
			last = c.out[i].tag
			if !c.out[i].settled {
				live++
				liveBytes += uint64(c.out[i].e.size)
			}
		}
		if liveBytes != c.liveBytes {
			return fmt.Errorf("consumer %d: %d live bytes, counted %d", c.ID, liveBytes, c.liveBytes)
		}
		if live != c.live {
			return fmt.Errorf("consumer %d: %d live, counted %d", c.ID, live, c.live)
		}
		if !c.AutoAck && c.Prefetch > 0 && uint32(c.live) > c.Prefetch {
			return fmt.Errorf("consumer %d: %d unacked over prefetch %d", c.ID, c.live, c.Prefetch)
		}
		if c.cancelled && c.live == 0 {
			return fmt.Errorf("consumer %d: cancelled and drained but still listed", c.ID)
		}
	}
	if len(m.held) > 0 && !(m.cfg.HoldDeadLetters && m.cfg.DeadLetter) {
		return fmt.Errorf("%d held dead letters in a queue that holds none", len(m.held))
	}
	var heldBytes int64
	for _, h := range m.held {
		heldBytes += int64(h.size)
	}
	if heldBytes != m.heldBytes {
		return fmt.Errorf("held dead letters' bytes %d/%d (counted/kept)", heldBytes, m.heldBytes)
	}
	return nil
}
