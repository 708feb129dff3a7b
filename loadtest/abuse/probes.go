package abuse

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/wire"
)

// sockState is what a hand-driven socket has seen so far.
type sockState struct {
	endedNs  atomic.Int64 // from the socket's start; 0: still open
	loggedIn atomic.Bool  // OPEN_OK arrived
	mu       sync.Mutex
	reason   string // the CLOSE frame's, if one came
}

func (s *sockState) ended() time.Duration { return time.Duration(s.endedNs.Load()) }

// closeReason is the reason of the CLOSE the broker sent, or says there
// was none (a socket closed before the preamble gets no frame).
func (s *sockState) closeReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason == "" {
		return "(no CLOSE: reset or EOF)"
	}
	return s.reason
}

// watch reads nc until the broker closes it (or it is closed here), keeping
// what it sees in the returned state.
func watch(nc net.Conn, start time.Time) *sockState {
	st := &sockState{}
	go func() {
		hdr := make([]byte, wire.HeaderSize)
		for {
			f, err := readFrame(nc, hdr, true)
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					st.endedNs.Store(max(int64(time.Since(start)), 1))
				}
				return
			}
			switch f.typ {
			case wire.TypeOpenOK:
				st.loggedIn.Store(true)
			case wire.TypeClose:
				r, _ := f.closeReason()
				st.mu.Lock()
				st.reason = r
				st.mu.Unlock()
				_, _ = nc.Write(wire.AppendFrame(nil, 0, &wire.CloseOK{}))
			}
		}
	}()
	return st
}

// durStats summarises durations.
func durStats(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return fmt.Sprintf("min %.1f s, max %.1f s", ds[0].Seconds(), ds[len(ds)-1].Seconds())
}

// The RSS a probe that stays under the watermark may add to the baseline.
func allowance(n int64) func(Sizes) int64 { return func(Sizes) int64 { return n } }

// A few hundred sockets or a storm of short connections: 64 MiB, far
// above what they need; more is a leak.
var socketsAllowance = allowance(64 * MiB)
