package cluster

// Forwarded work (design §6.3): the broker's own messages between nodes
// (a publish forwarded to a queue's leader, its confirm coming back), as
// opaque payloads in frames of kind kindFwd on the peer's data connection
// (not in front of raft messages, which have the control connection). The
// transport neither reads nor orders them against raft messages.

// SendForward queues payload for peer to; it reports false when it was
// dropped (unknown peer, over the frame limit, the peer's queue full):
// the sender answers its client at once. It never blocks. payload is
// the transport's from the call on.
func (t *Transport) SendForward(to uint64, payload []byte) bool {
	p := t.peer(to) // under pmu: SetPeers replaces the map on a membership change
	if p == nil || len(payload)+1 > t.cfg.MaxFrameBytes {
		t.dropped.Add(1)
		return false
	}
	p.mu.Lock()
	if len(p.pending)+p.fwdBytes+len(payload) > t.cfg.MaxQueueBytes {
		p.mu.Unlock()
		p.dropped.Add(1)
		t.dropped.Add(1)
		return false
	}
	p.fwds = append(p.fwds, payload)
	p.fwdBytes += len(payload)
	p.mu.Unlock()
	select {
	case p.dat.wake <- struct{}{}:
	default:
	}
	return true
}
