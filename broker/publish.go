package broker

import (
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/wire"
)

// PublishBatch tracks one PUBLISH frame until every shard it was split
// across has taken its part; the last part done hands it to its Sink
// (Confirm). Ch, FirstSeq and Start are the publisher's, carried as data.
type PublishBatch struct {
	Sink     Sink // told when every part is done
	Ch       uint16
	FirstSeq uint64
	Codes    []uint32 // per message: 0 ack, else the nack code (written atomically)
	Pending  atomic.Int32
	Start    time.Time // when the loop read the frame, for the confirm latency
	// Ended, if set, is set by the publisher once the channel the batch
	// was published on has ended (before it submits CmdReleaseEnded, or
	// the connection's Down): from then on its confirm is not held back
	// by a queue's backlog (Config.QueueSoftLimit), since the channel's
	// end waits for it. nil: held as long as the backlog lasts.
	Ended *atomic.Bool
}

// ended reports whether the batch's channel has ended (Ended).
func (b *PublishBatch) ended() bool { return b.Ended != nil && b.Ended.Load() }

// Nack records message i's refusal.
func (b *PublishBatch) Nack(i int, code wire.Code) { atomic.StoreUint32(&b.Codes[i], uint32(code)) }

// PartDone is called once per shard part (and once by the publisher itself).
func (b *PublishBatch) PartDone() {
	if b.Pending.Add(-1) == 0 {
		b.Sink.Confirm(b)
	}
}
