package abuse

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/warren-mq/warren/loadtest"
)

// PairRate is the well-behaved pair's rate: one producer and one consumer,
// persistent 128-byte messages with confirms, as `warren-loadtest --rate
// 2000` runs them.
const PairRate = 2000

// pair is the well-behaved publisher/consumer pair run beside a probe.
type pair struct {
	live  loadtest.Live
	stop  chan struct{}
	done  chan struct{}
	rep   *loadtest.Report
	err   error
	mu    sync.Mutex
	watch struct {
		on          bool
		lastConsume time.Time
		lastCount   int64
		maxGap      time.Duration
	}
	quit   chan struct{}
	cancel context.CancelFunc
}

// startPair starts the pair and returns once its first message has been
// consumed (or fails after 10 s).
func startPair(ctx context.Context, url string, transient bool) (*pair, error) {
	p := &pair{stop: make(chan struct{}), done: make(chan struct{}), quit: make(chan struct{})}
	ctx, p.cancel = context.WithCancel(ctx)
	cfg := loadtest.Config{
		URL: url, Producers: 1, Consumers: 1, Queues: 1, Size: "128", Persistent: !transient, Rate: PairRate,
		Duration: 24 * time.Hour, DrainTimeout: 15 * time.Second, Stop: p.stop, Live: &p.live,
		Scenario: "abuse-pair",
	}
	var progress io.Writer = io.Discard
	if os.Getenv("WARREN_ABUSE_PAIR_LOG") != "" { // the pair's per-second lines, for a look at when it suffered
		progress = os.Stderr
	}
	go func() {
		defer close(p.done)
		p.rep, p.err = loadtest.Run(ctx, cfg, progress)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, _, c := p.live.Totals(); c > 0 {
			break
		}
		select {
		case <-p.done:
			p.cancel()
			return nil, fmt.Errorf("abuse: the pair ended at start: %v", p.err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			close(p.stop)
			p.cancel()
			<-p.done
			return nil, fmt.Errorf("abuse: the pair consumed nothing in 10 s (%v)", p.err)
		}
	}
	go p.watcher()
	return p, nil
}

// watcher samples the consumed count every 10 ms and, while watching is
// on, keeps the longest time without a delivery.
func (p *pair) watcher() {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return
		case now := <-t.C:
			_, _, c := p.live.Totals()
			p.mu.Lock()
			w := &p.watch
			if c != w.lastCount {
				w.lastCount, w.lastConsume = c, now
			} else if w.on {
				if g := now.Sub(w.lastConsume); g > w.maxGap {
					w.maxGap = g
				}
			}
			p.mu.Unlock()
		}
	}
}

// watchGaps starts (on) or ends (off) the window in which the longest gap
// between deliveries is measured.
func (p *pair) watchGaps(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.watch.on, p.watch.maxGap, p.watch.lastConsume = true, 0, time.Now()
		return
	}
	p.watch.on = false
}

func (p *pair) maxGap() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.watch.maxGap
}

// resumeTime waits until the pair has both a new confirm and a new delivery
// after now, and returns how long that took (or limit when it did not).
func (p *pair) resumeTime(limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	_, conf0, cons0 := p.live.Totals()
	for time.Since(start) < limit {
		_, conf, cons := p.live.Totals()
		if conf > conf0 && cons > cons0 {
			return time.Since(start), true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return limit, false
}

// finishLimit is how long the pair may take to wind down once stopped: its
// drain timeout and some. A pair still running then is stuck (a publish
// waiting for confirms that never come) and is cancelled.
const finishLimit = 45 * time.Second

// finish stops publishing, waits for the drain and returns the report.
func (p *pair) finish() (*loadtest.Report, error) {
	close(p.stop)
	defer close(p.quit)
	defer p.cancel()
	select {
	case <-p.done:
		return p.rep, p.err
	case <-time.After(finishLimit):
	}
	pub, conf, cons := p.live.Totals()
	p.cancel()
	<-p.done
	return p.rep, fmt.Errorf("abuse: the pair was stuck %v after it was told to stop (published %d, confirmed %d, consumed %d): the broker stopped confirming or delivering to it",
		finishLimit, pub, conf, cons)
}
