package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// metaProposal is one entry's worth of this node's commands, from seq
// first on, and the term it was last proposed in (0: to propose, again
// once known lost). gone marks the commands whose request gave up
// (Abandon; nil: none): never proposed again, and dropped with the
// entry once it is known lost.
type metaProposal struct {
	first uint64
	cmds  [][]byte
	term  uint64
	gone  []bool
	// untagged: proposed as a version 2 entry (a member could not read
	// version 3: MetaConfig.TagTerms), which names no term: it is never
	// known lost, so never proposed again; once an entry of a later term
	// is applied here its outcome is unknown (resolved).
	untagged bool
}

// seqRun is the seqs from first up to (not including) end.
type seqRun struct{ first, end uint64 }

// live is how many of p's commands no request gave up on.
func (p *metaProposal) live() int {
	n := len(p.cmds)
	for _, g := range p.gone {
		if g {
			n--
		}
	}
	return n
}

// liveRuns splits p into proposals of its commands no request gave up
// on, each a run of consecutive seqs, to propose (term 0).
func (p *metaProposal) liveRuns() []metaProposal {
	var out []metaProposal
	for i := 0; i < len(p.cmds); {
		if p.gone != nil && p.gone[i] {
			i++
			continue
		}
		j := i
		for j < len(p.cmds) && (p.gone == nil || !p.gone[j]) {
			j++
		}
		out = append(out, metaProposal{first: p.first + uint64(i), cmds: p.cmds[i:j:j]})
		i = j
	}
	return out
}

// proposeLost proposes, in seq order, this node's collected commands
// not proposed yet or known lost (term 0), each entry tagged with term,
// raft's current term here (a leader is known). One raft refuses (a
// transfer, or the leader just went) waits for the next round.
//
// Why proposing a lost one again cannot apply it twice: an entry counts
// only if committed in the term it names (driveMulti), and it is known
// lost only once this node applied an entry of a later term: that
// entry's leader had committed it, so its log up to it is every node's
// for good, and the entry was not in it (this node applies in log order:
// it would have applied it first); after it, a log holds only entries of
// that term or later, where the old tag does not count. Raft may still
// append the old proposal (a forwarded MsgProp carries no term, and a
// node forwards it on to the leader it knows): applied as nothing.
func (g *MetaGroup) proposeLost(term uint64) {
	asked, tag := false, false
	for i := range g.inflight {
		p := &g.inflight[i]
		if p.term != 0 {
			continue
		}
		if !asked {
			asked, tag = true, g.tagTerms()
		}
		v := byte(metaEntryVersionTerm)
		if !tag {
			v = metaEntryVersionOrigin
		}
		data := []byte{metaEntryMagic, v, 0, 0}
		data = binary.LittleEndian.AppendUint32(data, uint32(len(p.cmds)))
		data = binary.LittleEndian.AppendUint64(data, g.cfg.NodeID)
		data = binary.LittleEndian.AppendUint64(data, g.epoch)
		data = binary.LittleEndian.AppendUint64(data, p.first)
		if tag {
			data = binary.LittleEndian.AppendUint64(data, term)
		}
		for _, c := range p.cmds {
			data = binary.LittleEndian.AppendUint32(data, uint32(len(c)))
			data = append(data, c...)
		}
		if err := g.rn.Propose(data); err != nil {
			g.cfg.Logger.Debug("replication: metadata group: proposal held for the next round", "commands", len(p.cmds), "err", err)
			return
		}
		p.term, p.untagged = term, !tag
	}
}

// tagTerms: whether every member reads version 3 entries (TagTerms).
func (g *MetaGroup) tagTerms() bool {
	if g.cfg.TagTerms == nil {
		return true
	}
	nodes := make([]uint64, 0, len(g.conf.Voters)+len(g.conf.Learners))
	nodes = append(append(nodes, g.conf.Voters...), g.conf.Learners...)
	return g.cfg.TagTerms(nodes)
}

// resolved drops this node's proposal whose first seq is first (applied),
// marks those an entry of a later term than theirs proved lost (to
// propose again: proposeLost; only their commands no request gave up
// on), and tells the waiters. An untagged one (version 2) not applied
// before such an entry is dropped with its outcome unknown (Done told
// ErrMetaOutcomeUnknown): it may have been lost, or its entry may still
// be appended late (a forwarded proposal carries no term), then applied
// as any entry (Done told its result then), and nothing tells the two
// apart; so it is not proposed again, and it does not stay in flight
// (unresolved) for the life of the process either.
func (g *MetaGroup) resolved(first uint64) {
	lost := false
	for i := 0; i < len(g.inflight); i++ {
		p := &g.inflight[i]
		if first != 0 && p.first == first {
			g.inflight = slices.Delete(g.inflight, i, i+1)
			i--
			continue
		}
		if p.term != 0 && p.term < g.commitTerm && p.untagged {
			g.cfg.Logger.Info("metadata group: a change proposed in an earlier term, in the format older builds read, was not applied before the next term's: its outcome is unknown",
				"term", p.term, "committed term", g.commitTerm, "commands", len(p.cmds), "given up", len(p.cmds)-p.live())
			if g.cfg.Done != nil {
				g.cfg.Lock.Lock()
				for j := range p.cmds {
					if p.gone == nil || !p.gone[j] {
						g.cfg.Done(p.first+uint64(j), ErrMetaOutcomeUnknown)
					}
				}
				g.cfg.Lock.Unlock()
			}
			g.inflight = slices.Delete(g.inflight, i, i+1)
			i--
			continue
		}
		if p.term != 0 && p.term < g.commitTerm && !p.untagged {
			live := p.liveRuns()
			g.cfg.Logger.Info("metadata group: a change proposed in an earlier term was lost with its leader; proposing it again",
				"term", p.term, "committed term", g.commitTerm, "commands", len(p.cmds), "given up", len(p.cmds)-p.live())
			g.inflight = slices.Replace(g.inflight, i, i+1, live...)
			i += len(live) - 1
			lost = lost || len(live) > 0
		}
	}
	if lost {
		g.Kick()
	}
	g.publishOpen()
}

// giveUp marks the commands of seqs as given up (Abandon): one not
// proposed yet never will be; one proposed may still commit under its
// tag (then it is applied, as any entry), but it is never proposed
// again. An entry all of whose commands were given up is forgotten.
func (g *MetaGroup) giveUp(seqs []uint64) {
	for _, seq := range seqs {
		i := slices.IndexFunc(g.inflight, func(p metaProposal) bool { return seq >= p.first && seq < p.first+uint64(len(p.cmds)) })
		if i < 0 {
			continue // resolved already, or never collected
		}
		p := &g.inflight[i]
		if p.gone == nil {
			p.gone = make([]bool, len(p.cmds))
		}
		p.gone[seq-p.first] = true
		switch {
		case p.live() == 0:
			g.inflight = slices.Delete(g.inflight, i, i+1)
		case p.term == 0:
			g.inflight = slices.Replace(g.inflight, i, i+1, p.liveRuns()...)
		}
	}
}

// publishOpen tells Wait which collected seqs are not resolved yet.
func (g *MetaGroup) publishOpen() {
	next := g.openNext[:0]
	for _, p := range g.inflight {
		next = append(next, seqRun{p.first, p.first + uint64(len(p.cmds))})
	}
	g.mu.Lock()
	if g.collected != g.durable || !slices.Equal(next, g.open) {
		g.durable = g.collected
		g.open, g.openNext = next, g.open
		close(g.changed)
		g.changed = make(chan struct{})
	} else {
		g.openNext = next
	}
	g.mu.Unlock()
}

// metaOrigin is the origin of an entry with one (versions 2 and 3): its
// node, that node's incarnation, the seq of its first command, and
// (version 3) the term it was proposed in; zeros for version 1, a zero
// term for version 2.
func metaOrigin(b []byte) (node, epoch, seq, term uint64) {
	if len(b) < metaOriginHeader || (b[1] != metaEntryVersionOrigin && b[1] != metaEntryVersionTerm) {
		return 0, 0, 0, 0
	}
	if b[1] == metaEntryVersionTerm && len(b) >= metaTermHeader {
		term = binary.LittleEndian.Uint64(b[32:])
	}
	return binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint64(b[16:]), binary.LittleEndian.Uint64(b[24:]), term
}

// eachMetaCommand calls fn with each command of an entry (views).
func eachMetaCommand(b []byte, fn func([]byte) error) error {
	if len(b) < 8 || b[0] != metaEntryMagic {
		return errors.New("not a metadata entry")
	}
	if b[1] != metaEntryVersion && b[1] != metaEntryVersionOrigin && b[1] != metaEntryVersionTerm {
		return fmt.Errorf("metadata entry version %d: this build reads %d to %d (a newer Warren wrote it: upgrade)", b[1], metaEntryVersion, metaEntryVersionTerm)
	}
	if b[2]|b[3] != 0 {
		return errors.New("metadata entry: reserved bytes are not zero")
	}
	n := binary.LittleEndian.Uint32(b[4:])
	if b[1] == metaEntryVersionOrigin {
		if len(b) < metaOriginHeader {
			return errors.New("metadata entry: its origin is cut short")
		}
		b = b[metaOriginHeader:]
	} else if b[1] == metaEntryVersionTerm {
		if len(b) < metaTermHeader {
			return errors.New("metadata entry: its origin is cut short")
		}
		b = b[metaTermHeader:]
	} else {
		b = b[8:]
	}
	for range n {
		if len(b) < 4 || uint64(binary.LittleEndian.Uint32(b)) > uint64(len(b)-4) {
			return errors.New("metadata entry: a command runs past its end")
		}
		l := binary.LittleEndian.Uint32(b)
		if err := fn(b[4 : 4+l]); err != nil {
			return err
		}
		b = b[4+l:]
	}
	if len(b) != 0 {
		return fmt.Errorf("metadata entry: %d trailing bytes", len(b))
	}
	return nil
}

// Wait returns once the command of seq is committed (durable; one voter:
// so is every one before it; several voters: applied here, or its fate
// told unknown, whatever became of the commands before it), or with the
// error that stopped the group, or ctx's. A caller whose ctx ran out
// calls Abandon(seq) (several voters), or the command may be proposed
// again after a change of leader, and applied late.
func (g *MetaGroup) Wait(ctx context.Context, seq uint64) error {
	kicked := false
	for {
		g.mu.Lock()
		done := g.durable >= seq
		if g.multi && done {
			_, found := slices.BinarySearchFunc(g.open, seq, func(r seqRun, s uint64) int {
				switch {
				case r.end <= s:
					return -1
				case r.first > s:
					return 1
				}
				return 0
			})
			done = !found
		}
		failed, ch := g.failed, g.changed
		g.mu.Unlock()
		if done {
			return nil
		}
		if failed != nil {
			return failed
		}
		if !kicked {
			kicked = true
			g.Kick()
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Abandon gives up on the command of seq (several voters; one voter: no
// effect): its request was answered without its result (Wait's ctx ran
// out). It is never proposed again, so never applied late, after a
// change of leader, when its requester has moved on; if its entry was
// appended by the leader of its term, it may still commit under its tag
// and is then applied, once, as any entry (Done is told, as of any
// command of this node's). Safe for concurrent use.
func (g *MetaGroup) Abandon(seq uint64) {
	if !g.multi {
		return
	}
	g.inMu.Lock()
	g.gaveUp = append(g.gaveUp, seq)
	g.inMu.Unlock()
	g.Kick()
}
