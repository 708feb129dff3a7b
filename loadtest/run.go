package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"
)

// ErrLoss is returned (wrapped) when a confirmed message was never consumed.
var ErrLoss = errors.New("loadtest: confirmed messages were lost")

// ErrRateNotHeld is returned (wrapped) when a scenario's min_rate was not
// reached.
var ErrRateNotHeld = errors.New("loadtest: the required rate was not held")

// Run executes one load test, printing a progress line per second and the
// final report to out. The report is returned even when err reports a
// loss or a missed rate.
func Run(ctx context.Context, cfg Config, out io.Writer) (*Report, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	var d driver
	switch cfg.Driver {
	case "warren":
		d = &warrenDriver{url: cfg.URL}
	case "amqp":
		d = &amqpDriver{url: cfg.URL}
	default:
		return nil, errNoDriver
	}
	defer d.close()
	return run(ctx, &cfg, d, out, 0)
}

func run(ctx context.Context, cfg *Config, d driver, out io.Writer, dropNth int64) (*Report, error) {
	t := newTopo(cfg)
	var ledger *Ledger
	base := 0 // the first producer id of this run: after the ledger's
	if cfg.Ledger != "" {
		if cfg.copies() != 1 {
			return nil, fmt.Errorf("loadtest: --ledger counts one copy of each message: use a direct or topic exchange, not fanout")
		}
		var err error
		if ledger, err = openLedger(cfg.Ledger, t); err != nil {
			return nil, err
		}
		base = len(ledger.Producers)
	}
	if err := d.setup(ctx, cfg, t); err != nil {
		return nil, fmt.Errorf("loadtest: setup: %w", err)
	}
	nCons := cfg.Queues * cfg.Consumers
	if cfg.PublishOnly {
		nCons = 0
	}
	tr := newTracker(base+cfg.Producers, nCons, cfg.copies(), cfg.ConfirmWindow)
	tr.dropNth = dropNth
	tr.base = base
	if cfg.Live != nil {
		cfg.Live.t.Store(tr)
	}

	for i := 0; i < nCons; i++ {
		ci := i
		last := make([]uint64, base+cfg.Producers)
		if _, err := d.consumer(ctx, cfg, t.queues[i%cfg.Queues], func(body []byte) {
			tr.consumedMsg(ci, body, time.Now().UnixNano(), last)
		}); err != nil {
			return nil, fmt.Errorf("loadtest: consumer: %w", err)
		}
	}
	prods := make([]producer, cfg.Producers)
	for i := range prods {
		pi := base + i
		p, err := d.producer(ctx, cfg, func(first, last uint64, ok bool) {
			tr.confirmed(pi, first, last, ok, time.Now().UnixNano())
		})
		if err != nil {
			return nil, fmt.Errorf("loadtest: producer: %w", err)
		}
		prods[i] = p
	}

	start := time.Now()
	meter := cpuMeter{pid: cfg.BrokerPID}
	startCPU := meter.sample()
	measureFrom := start.Add(cfg.Warmup)
	var stop atomic.Bool
	// The producers publish under pubCtx, which ends with the publishing
	// phase: a producer blocked on a full confirm window (a queue past its
	// soft limit holds confirms until consumers drain it) must not outlive
	// the phase.
	pubCtx, endPub := context.WithCancel(ctx)
	defer endPub()
	var wg sync.WaitGroup
	errs := make(chan error, cfg.Producers)
	perProducer := int64(0)
	if cfg.Count > 0 {
		perProducer = (cfg.Count + int64(cfg.Producers) - 1) / int64(cfg.Producers)
	}
	for i, p := range prods {
		i += base
		wg.Add(1)
		go func(pi int, p producer) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(pi), 42))
			ps := tr.prod[pi]
			body := make([]byte, cfg.sizeHi)
			var rate float64
			if cfg.Rate > 0 {
				rate = float64(cfg.Rate) / float64(cfg.Producers)
			}
			pstart := time.Now()
			for seq := uint64(1); !stop.Load() && (perProducer == 0 || int64(seq) <= perProducer); seq++ {
				if rate > 0 {
					// Pace: message seq is due at pstart + seq/rate.
					if wait := time.Until(pstart.Add(time.Duration(float64(seq) / rate * float64(time.Second)))); wait > 0 {
						time.Sleep(wait)
					}
				}
				qi := (int(seq) + pi) % cfg.Queues
				b := body[:cfg.size(r)]
				now := time.Now().UnixNano()
				putHeader(b, uint32(pi), seq, now)
				ps.sent(seq, now)
				if err := p.publish(pubCtx, t.exchange, t.keys[qi], b, cfg.priority(r), cfg.Persistent); err != nil {
					if stop.Load() && pubCtx.Err() != nil {
						// The phase ended while this one waited for
						// the window: it was never sent.
						ps.published.Store(seq - 1)
						return
					}
					errs <- fmt.Errorf("loadtest: producer %d: %w", pi, err)
					return
				}
			}
		}(i, p)
	}

	// Progress, once a second, until the publishing phase ends.
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	var warmPub, warmCons int64
	var warmCPU cpuTimes
	warmed := cfg.Warmup == 0
	prof := profiler{w: cfg.CPUProfile, out: out}
	defer prof.stop()
	if warmed {
		tr.setActive(true)
		warmCPU = meter.sample()
		prof.start()
	}
	var lastPub, lastCons int64
	lastAt := start
	var series []Second
	pubDone := make(chan struct{})
	go func() { wg.Wait(); close(pubDone) }()
	end := start.Add(cfg.Warmup + cfg.Duration)
	endTimer := time.NewTimer(time.Until(end))
	if cfg.Count > 0 {
		endTimer.Stop()
	}
	var runErr error
	connLost := false  // a ledger run's producer lost the broker
	stopCh := cfg.Stop // nil blocks forever
loop:
	for {
		select {
		case <-ctx.Done():
			stop.Store(true)
			runErr = ctx.Err()
			break loop
		case err := <-errs:
			stop.Store(true)
			if ledger != nil {
				// The broker went away (a kill test): the phase ends
				// here, and what was confirmed is in the ledger.
				connLost = true
				fmt.Fprintf(out, "%v: the publishing phase ends here\n", err)
				break loop
			}
			runErr = err
			break loop
		case <-pubDone:
			break loop
		case <-endTimer.C:
			stop.Store(true)
			endPub()
		case <-stopCh:
			stopCh = nil
			stop.Store(true)
			endPub()
		case now := <-ticker.C:
			// Consumed first: every message consumed by then was
			// published by the time of totals, so the backlog
			// (published, not yet consumed) is not negative. It was
			// confirmed minus consumed, which went negative whenever
			// deliveries ran ahead of their confirms.
			cons := tr.consumed.Load()
			pub, _, _ := tr.totals()
			if !warmed && now.After(measureFrom) {
				warmed = true
				warmPub, warmCons = pub, cons
				warmCPU = meter.sample()
				prof.start()
				tr.setActive(true)
			}
			p := interval(tr, now.Sub(start), now.Sub(lastAt), pub-lastPub, cons-lastCons)
			series = append(series, p)
			fmt.Fprintf(out, "%6.1fs  publish %9.0f/s  consume %9.0f/s  confirm p50 %7.2fms p99 %7.2fms  backlog %d\n",
				p.T, p.PublishRate, p.ConsumeRate, p.ConfirmP50, p.ConfirmP99, max(0, pub*int64(cfg.copies())-cons))
			lastPub, lastCons, lastAt = pub, cons, now
		}
	}
	stop.Store(true)
	endPub()
	<-pubDone
	// The loop may have ended on pubDone while a producer's error was
	// pending too (select picks at random among ready cases): a ledger
	// run whose broker went away must still end as a lost connection.
	if !connLost && runErr == nil && ledger != nil {
		select {
		case err := <-errs:
			connLost = true
			fmt.Fprintf(out, "%v: the publishing phase ends here\n", err)
		default:
		}
	}
	pubEnd := time.Now()
	if pubEnd.Sub(lastAt) >= 100*time.Millisecond { // the last partial second
		pub, _, _ := tr.totals()
		series = append(series, interval(tr, pubEnd.Sub(start), pubEnd.Sub(lastAt), pub-lastPub, tr.consumed.Load()-lastCons))
	}
	pubAtEnd, _, _ := tr.totals()
	if !warmed { // shorter than the warmup: measure everything
		warmPub, warmCons = 0, 0
		measureFrom = start
		warmCPU = startCPU
		prof.start()
		tr.setActive(true)
	}
	wctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	for _, p := range prods {
		// A publish-only run expects confirms held by full queues: what
		// is unconfirmed at the deadline is reported as in flight.
		if err := p.wait(wctx); err != nil && runErr == nil && !connLost && !(cfg.PublishOnly && wctx.Err() != nil) {
			runErr = fmt.Errorf("loadtest: waiting for confirms: %w", err)
		}
	}
	cancel()
	// Drain: wait until every confirmed copy is consumed, or until nothing
	// moves for the drain timeout. Only this run's own messages count
	// towards want: with a ledger, the queues may hold a backlog of earlier
	// runs' messages ahead of them.
	_, acked, _ := tr.totals()
	want := acked * int64(cfg.copies())
	lastMove, lastSeen := time.Now(), tr.consumed.Load()
	for !connLost && nCons > 0 && tr.own.Load() < want && time.Since(lastMove) < cfg.DrainTimeout && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
		if c := tr.consumed.Load(); c != lastSeen {
			lastMove, lastSeen = time.Now(), c
		}
	}
	consEnd := time.Now()
	endCPU := meter.sample()
	prof.stop()
	consumed := tr.consumed.Load() - warmCons
	rep := tr.report(cfg, pubEnd.Sub(measureFrom), consEnd.Sub(measureFrom), pubAtEnd-warmPub, consumed)
	rep.ClientCPU = perMessage(warmCPU.client, endCPU.client, consumed)
	rep.WarmupS, rep.Series = cfg.Warmup.Seconds(), series
	if nCons == 0 || ledger != nil {
		// Publish-only: nothing was meant to be consumed, so nothing
		// unconsumed is lost; the queues keep it (for --verify, with a
		// ledger). A ledger run's drain ends short of its messages only
		// when the broker went away, nothing moved for the drain timeout
		// or it was interrupted: whether any of what it did not consume
		// was lost is --verify's to say, after a restart.
		rep.Left, rep.Lost = rep.Lost, 0
	}
	if warmCPU.brokerOK && endCPU.brokerOK {
		rep.BrokerCPU = perMessage(warmCPU.broker, endCPU.broker, consumed)
	}
	if cfg.BrokerPID > 0 {
		if rss, _, err := ProcRSS(cfg.BrokerPID); err == nil {
			rep.BrokerRSS = rss
		}
	}
	rep.print(out)
	if ledger != nil {
		// The consumers stop before the ledger takes what was received:
		// one still running would ack messages the ledger does not hold
		// as received, and --verify, which cannot get them back, would
		// report them lost. What they were handed and had not acked goes
		// back to the queues (for --verify, as duplicates at worst).
		d.close()
		if err := ledger.record(tr, base); err != nil {
			return rep, err
		}
		ledger.Duplicates += tr.dups.Load()
		if err := ledger.write(cfg.Ledger); err != nil {
			return rep, err
		}
		fmt.Fprintf(out, "ledger: %d confirmed from producers %d-%d, added to %s (check with --verify)\n", rep.Confirmed, base, base+cfg.Producers-1, cfg.Ledger)
		if rep.Left > 0 {
			fmt.Fprintf(out, "ledger: the %d messages left in the queues are for --verify %s to consume and check\n", rep.Left, cfg.Ledger)
		}
		if runErr == nil || errors.Is(runErr, context.Canceled) {
			return rep, nil // the loss verdict is --verify's
		}
		return rep, runErr
	}
	switch {
	case runErr != nil:
		return rep, runErr
	case rep.Lost > 0:
		return rep, fmt.Errorf("%w: %d of %d", ErrLoss, rep.Lost, rep.Confirmed)
	case cfg.MinRate > 0 && (rep.PublishRate < cfg.MinRate || rep.ConsumeRate < cfg.MinRate):
		return rep, fmt.Errorf("%w: published %.0f/s and consumed %.0f/s, needed %.0f/s", ErrRateNotHeld, rep.PublishRate, rep.ConsumeRate, cfg.MinRate)
	}
	return rep, nil
}

// Live reads a run's running totals from another goroutine (Config.Live),
// for a caller that watches the run as it goes: the abuse suite measures
// the longest time without a delivery from it.
type Live struct{ t atomic.Pointer[tracker] }

// Totals returns the messages published, confirmed and consumed so far;
// zeros until the run has set up.
func (l *Live) Totals() (published, confirmed, consumed int64) {
	t := l.t.Load()
	if t == nil {
		return 0, 0, 0
	}
	published, confirmed, _ = t.totals()
	return published, confirmed, t.consumed.Load()
}

// maxE2EIntervalSources bounds the consumers whose deliveries give an
// interval's publish→deliver percentiles: merging a recorder's histogram
// takes about 0.2 ms, so with 1,000 consumers all of them would cost the
// load generator a fifth of a core. The consumers of a scenario are
// alike, so 16 of them are a fair sample; the run's summary percentiles
// are over every delivery.
const maxE2EIntervalSources = 16

// interval makes a progress point: the rates over the interval of length
// dt ending at t, and the latency of what was confirmed and delivered in
// it (the recorders' interval histograms, which it starts anew). Once a
// second, on the progress goroutine: nothing per message.
func interval(tr *tracker, t, dt time.Duration, published, consumed int64) Second {
	ch, eh := tr.confirmIv, tr.e2eIv
	ch.Reset()
	eh.Reset()
	for _, r := range tr.confirm {
		r.mergeInterval(ch)
	}
	for _, r := range tr.e2e[:min(len(tr.e2e), maxE2EIntervalSources)] {
		r.mergeInterval(eh)
	}
	secs := dt.Seconds()
	return Second{T: t.Seconds(), PublishRate: float64(published) / secs, ConsumeRate: float64(consumed) / secs,
		Confirms: ch.TotalCount(), ConfirmP50: ms(ch.ValueAtQuantile(50)), ConfirmP99: ms(ch.ValueAtQuantile(99)),
		Deliveries: eh.TotalCount(), E2EP50: ms(eh.ValueAtQuantile(50)), E2EP99: ms(eh.ValueAtQuantile(99))}
}

func ms(us int64) float64 { return float64(us) / 1000 }

// profiler writes a CPU profile of the load generator over the measured
// window, what ClientCPU counts (Config.CPUProfile).
type profiler struct {
	w   io.Writer
	out io.Writer
	on  bool
}

func (p *profiler) start() {
	if p.w == nil || p.on {
		return
	}
	if err := pprof.StartCPUProfile(p.w); err != nil {
		fmt.Fprintf(p.out, "no CPU profile: %v\n", err)
		p.w = nil
		return
	}
	p.on = true
}

func (p *profiler) stop() {
	if p.on {
		pprof.StopCPUProfile()
		p.on = false
	}
}
