package netio

// A channel of a connection: its state and delivery tags, its open, and
// its close, whose ending frame is held until the shards have paid what
// they owe it (channels.go lists the open channels for the admin API).

import (
	"sync/atomic"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

type channel struct {
	id        uint16
	nextSeq   uint64                  // loop-owned: the next publish sequence number
	consumers map[string]*consumerRef // active consumers by tag (mu)
	all       []*consumerRef          // its consumers until the channel closes, those their queues let go of dropped now and then (onSubscribe) (mu)
	closed    bool                    // (mu)
	nextTag   uint64                  // last delivery tag given (mu)
	tagBase   uint64                  // tag of tags[head] (mu)
	tags      []tagEntry              // (mu)
	head      int
	ctagSeq   int
	// owed counts what shards still owe this channel: CONFIRMs of its
	// publish batches and answers to its requests (passive declare,
	// delete, purge). While it is not 0 the channel keeps its id, and the
	// frame that ends it (CHANNEL_CLOSE_OK to the client's close, or the
	// broker's own CHANNEL_CLOSE) waits in endFrame, so nothing of this
	// channel can arrive after it, on a channel the client reopened with
	// the same id (PROTOCOL.md §6). A confirm a queue's backlog holds
	// back is not waited for: once the channel has ended (ended, set with
	// closed) its shards confirm it at once (CmdReleaseEnded), its
	// messages being in their queues (§8.2).
	owed      atomic.Int32
	ended     atomic.Bool // PublishBatch.Ended of the channel's batches
	endFrame  wire.Body   // (mu) the held end, sent when owed reaches 0
	endForget bool        // (mu) endFrame answers the client's close: drop the id once it is sent
}

const (
	tagLive uint8 = iota
	tagSettled
	tagExpired
	tagAuto
)

type tagEntry struct {
	c     *consumerRef
	qtag  uint64
	state uint8
}

func newChannel(id uint16) *channel {
	return &channel{id: id, nextSeq: 1, tagBase: 1} // consumers: made at the first
}

func (ch *channel) pushTag(e tagEntry) { ch.tags = append(ch.tags, e) }

func (ch *channel) tagAt(t uint64) *tagEntry {
	if t < ch.tagBase || t-ch.tagBase >= uint64(len(ch.tags)-ch.head) {
		return nil
	}
	return &ch.tags[ch.head+int(t-ch.tagBase)]
}

// compact drops settled entries from the front.
func (ch *channel) compact() {
	for ch.head < len(ch.tags) && ch.tags[ch.head].state != tagLive {
		ch.tags[ch.head] = tagEntry{}
		ch.head++
		ch.tagBase++
	}
	if ch.head == len(ch.tags) {
		ch.tags, ch.head = ch.tags[:0], 0
	} else if ch.head > 1024 && ch.head > len(ch.tags)/2 {
		n := copy(ch.tags, ch.tags[ch.head:])
		ch.tags, ch.head = ch.tags[:n], 0
	}
}

func (c *conn) onChannelOpen(f wire.Frame) error {
	body, err := wire.Decode(f, c.maxFrame, nil)
	if err != nil {
		return err
	}
	if f.Channel > c.maxChannels {
		return &wire.Error{Code: wire.ChannelError, Reason: "channel id over the negotiated maximum"}
	}
	c.mu.Lock()
	if _, ok := c.channels[f.Channel]; ok {
		c.mu.Unlock()
		return &wire.Error{Code: wire.ChannelError, Reason: "channel already open"}
	}
	c.channels[f.Channel] = newChannel(f.Channel)
	c.mu.Unlock()
	c.srv.metrics.channels.Add(1)
	c.send(f.Channel, &wire.OKReply{Req: body.(*wire.ChannelOpen).Req})
	return nil
}

// closeChannel closes a channel from the broker's side with an error.
func (c *conn) closeChannel(id uint16, code wire.Code, reason string) {
	c.mu.Lock()
	ch := c.channels[id]
	c.mu.Unlock()
	if ch == nil {
		return
	}
	c.closeChannelNow(ch)
	c.mu.Lock()
	c.endChannelLocked(ch, &wire.ChannelClose{Code: code, Reason: reason}, false)
	c.mu.Unlock()
}

// endChannelLocked sends the frame that ends a closed channel (forget: it
// answers the client's CHANNEL_CLOSE, so the id is free once it is sent),
// or holds it until the shards have paid what they owe the channel
// (paidLocked). c.mu must be held.
func (c *conn) endChannelLocked(ch *channel, end wire.Body, forget bool) {
	if ch.owed.Load() > 0 {
		ch.endFrame, ch.endForget = end, forget
		return
	}
	if forget && c.channels[ch.id] == ch {
		delete(c.channels, ch.id)
	}
	if !c.closed {
		c.out = wire.AppendFrame(c.out, ch.id, end)
		c.flushLocked()
	}
}

// paidLocked counts one answer owed to channel id as sent (a CONFIRM, a
// request's reply), and sends the channel's held end once nothing more is
// owed. The id still names the channel that was owed: it is not freed
// while anything is. c.mu must be held.
func (c *conn) paidLocked(id uint16) {
	ch := c.channels[id]
	if ch == nil || ch.owed.Add(-1) > 0 || ch.endFrame == nil {
		return
	}
	end, forget := ch.endFrame, ch.endForget
	ch.endFrame = nil
	c.endChannelLocked(ch, end, forget)
}

// closeChannelNow marks a channel closed, returns what its consumers
// held, and has the shards confirm its batches that queues over their
// soft limit hold back: the frame that ends the channel waits for them.
func (c *conn) closeChannelNow(ch *channel) {
	c.mu.Lock()
	if ch.closed {
		c.mu.Unlock()
		return
	}
	ch.closed = true
	ch.ended.Store(true) // before the release: a part held after it is not held
	all := ch.all
	ch.all, ch.consumers, ch.tags, ch.head = nil, nil, nil, 0
	c.mu.Unlock()
	c.srv.metrics.channels.Add(-1)
	if ch.owed.Load() > 0 {
		c.srv.Submit(broker.Command{Kind: broker.CmdReleaseEnded})
	}
	for _, cr := range all {
		cr := cr
		c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: cr.q, Consumer: cr.id, Requeue: true})
	}
}
