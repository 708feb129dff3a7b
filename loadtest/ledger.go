package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// A Ledger records, across runs against the same broker (and its
// restarts), which messages each producer had confirmed and which were
// consumed: `--ledger FILE` appends a run's producers to it, and
// `--verify FILE` consumes the queues and reports every confirmed message
// that never came back. Sequence numbers are written as ranges
// ("1-5000,5002-9000"), so a file stays small whatever the run's length.
type Ledger struct {
	Exchange  string           `json:"exchange"`
	Queues    []string         `json:"queues"`
	Producers []LedgerProducer `json:"producers"` // by producer id, over all runs
	// Duplicates counts the messages the runs so far received more than
	// once within a run.
	Duplicates int64 `json:"duplicates"`
}

// LedgerProducer is one producer of one run.
type LedgerProducer struct {
	Confirmed string `json:"confirmed"` // sequence numbers confirmed by the broker
	Received  string `json:"received"`  // sequence numbers consumed (by any run so far)
}

// ReadLedger reads a ledger file.
func ReadLedger(path string) (*Ledger, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("loadtest: ledger: %w", err)
	}
	var l Ledger
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("loadtest: ledger %s: %w", path, err)
	}
	return &l, nil
}

func (l *Ledger) write(path string) error {
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("loadtest: ledger: %w", err)
	}
	return os.Rename(tmp, path)
}

// openLedger reads the ledger at path, or starts one for t when there is
// none; a ledger of other queues is an error.
func openLedger(path string, t *topo) (*Ledger, error) {
	l, err := ReadLedger(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Ledger{Exchange: t.exchange, Queues: t.queues}, nil
	}
	if err != nil {
		return nil, err
	}
	if l.Exchange != t.exchange || strings.Join(l.Queues, ",") != strings.Join(t.queues, ",") {
		return nil, fmt.Errorf("loadtest: ledger %s is for exchange %s and %d queues, this run uses %s and %d: use another file or the same scenario", path, l.Exchange, len(l.Queues), t.exchange, len(t.queues))
	}
	return l, nil
}

// record merges what tr saw into l: new producers (ids from base) are
// appended, and the earlier ones get this run's receptions.
func (l *Ledger) record(tr *tracker, base int) error {
	for pi, p := range tr.prod {
		hi := p.published.Load()
		recv := func(s uint64) bool { return p.st.get(s)&recvMask != 0 }
		if pi < base {
			old, err := parseRanges(l.Producers[pi].Received)
			if err != nil {
				return fmt.Errorf("loadtest: ledger producer %d: %w", pi, err)
			}
			conf, err := parseRanges(l.Producers[pi].Confirmed)
			if err != nil {
				return fmt.Errorf("loadtest: ledger producer %d: %w", pi, err)
			}
			hi = max(conf.top(), old.top())
			l.Producers[pi].Received = formatRanges(hi, func(s uint64) bool { return recv(s) || old.has(s) })
			continue
		}
		l.Producers = append(l.Producers, LedgerProducer{
			Confirmed: formatRanges(hi, func(s uint64) bool { return p.st.get(s)&stAcked != 0 }),
			Received:  formatRanges(hi, recv),
		})
	}
	return nil
}

type ranges [][2]uint64

func (r ranges) has(s uint64) bool {
	i := sort.Search(len(r), func(i int) bool { return r[i][1] >= s }) // ascending, disjoint
	return i < len(r) && r[i][0] <= s
}

func (r ranges) top() uint64 {
	if len(r) == 0 {
		return 0
	}
	return r[len(r)-1][1]
}

// formatRanges writes the s in 1..hi with in(s) as "a-b,c,d-e".
func formatRanges(hi uint64, in func(uint64) bool) string {
	var b strings.Builder
	for s := uint64(1); s <= hi; s++ {
		if !in(s) {
			continue
		}
		e := s
		for e+1 <= hi && in(e+1) {
			e++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(s, 10))
		if e > s {
			b.WriteByte('-')
			b.WriteString(strconv.FormatUint(e, 10))
		}
		s = e
	}
	return b.String()
}

func parseRanges(s string) (ranges, error) {
	var r ranges
	if s == "" {
		return r, nil
	}
	for _, part := range strings.Split(s, ",") {
		a, b, isRange := strings.Cut(part, "-")
		lo, err := strconv.ParseUint(a, 10, 64)
		hi := lo
		if err == nil && isRange {
			hi, err = strconv.ParseUint(b, 10, 64)
		}
		if err != nil || lo == 0 || hi < lo || (len(r) > 0 && lo <= r.top()) {
			return nil, fmt.Errorf("bad range %q: want ascending N or N-M from 1", part)
		}
		r = append(r, [2]uint64{lo, hi})
	}
	return r, nil
}

// VerifyReport is what a --verify run found.
type VerifyReport struct {
	Confirmed  int64 // confirmed messages in the ledger
	Lost       int64 // confirmed and never received, by any run
	Duplicates int64 // received more than once, over all runs
	Consumed   int64 // received by the verify run
	Unknown    int64 // received and never confirmed (published, unconfirmed when the broker went away)
	LostRanges []string
}

// Verify consumes the queues of the ledger at cfg.Verify until every
// confirmed message not yet received has come, or until nothing arrives
// for quiet, then reports the confirmed messages that never came back. It
// returns an error wrapping ErrLoss when there are any.
func Verify(ctx context.Context, cfg Config, quiet time.Duration, out io.Writer) (*VerifyReport, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	l, err := ReadLedger(cfg.Verify)
	if err != nil {
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
	if quiet <= 0 {
		quiet = 5 * time.Second
	}
	tr := newTracker(len(l.Producers), len(l.Queues), 1, 1)
	rep := &VerifyReport{}
	outstanding := int64(0)
	for pi, p := range l.Producers {
		conf, err := parseRanges(p.Confirmed)
		if err != nil {
			return nil, fmt.Errorf("loadtest: ledger producer %d confirmed: %w", pi, err)
		}
		recv, err := parseRanges(p.Received)
		if err != nil {
			return nil, fmt.Errorf("loadtest: ledger producer %d received: %w", pi, err)
		}
		ps := tr.prod[pi]
		for _, x := range conf {
			for s := x[0]; s <= x[1]; s++ {
				ps.st.or(s, stAcked)
			}
			rep.Confirmed += int64(x[1] - x[0] + 1)
		}
		for _, x := range recv {
			for s := x[0]; s <= x[1]; s++ {
				ps.st.received(s)
			}
		}
		ps.published.Store(max(conf.top(), recv.top()))
	}
	outstanding = tr.lost()
	fmt.Fprintf(out, "verify: %d confirmed in %s, %d not yet received; consuming %d queues\n", rep.Confirmed, cfg.Verify, outstanding, len(l.Queues))
	t := &topo{exchange: l.Exchange, queues: l.Queues}
	for i, q := range t.queues {
		ci := i
		last := make([]uint64, len(l.Producers))
		if _, err := d.consumer(ctx, &cfg, q, func(body []byte) {
			tr.consumedMsg(ci, body, time.Now().UnixNano(), last)
			// Raise the producer's top to what came, so the counts below
			// see messages published after its last confirm.
			if pid, seq, _, ok := readHeader(body); ok && int(pid) < len(tr.prod) {
				top := &tr.prod[pid].published
				for old := top.Load(); seq > old && !top.CompareAndSwap(old, seq); old = top.Load() {
				}
			}
		}); err != nil {
			return nil, fmt.Errorf("loadtest: verify: consuming %s: %w", q, err)
		}
	}
	// Until nothing moves for quiet, or everything confirmed has come and
	// nothing more arrives for a short while (the rest of the queue: what
	// was published and not confirmed at a kill).
	lastMove, lastSeen := time.Now(), tr.consumed.Load()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for ctx.Err() == nil {
		<-poll.C
		if c := tr.consumed.Load(); c != lastSeen {
			lastMove, lastSeen = time.Now(), c
			continue
		}
		idle := time.Since(lastMove)
		if idle >= quiet || (idle >= min(quiet, 250*time.Millisecond) && tr.lost() == 0) {
			break
		}
	}
	rep.Consumed = tr.consumed.Load()
	rep.Duplicates = l.Duplicates + tr.dups.Load()
	for pi, p := range tr.prod {
		top := p.published.Load()
		for s := uint64(1); s <= top; s++ {
			v := p.st.get(s)
			if v&stAcked != 0 && v&recvMask == 0 {
				rep.Lost++
			}
			if v&stAcked == 0 && v&recvMask != 0 {
				rep.Unknown++
			}
		}
		if r := formatRanges(top, func(s uint64) bool { v := p.st.get(s); return v&stAcked != 0 && v&recvMask == 0 }); r != "" {
			rep.LostRanges = append(rep.LostRanges, fmt.Sprintf("producer %d: %s", pi, r))
		}
	}
	fmt.Fprintf(out, "verify: consumed %d; %d received were never confirmed (in flight when the broker went away)\n", rep.Consumed, rep.Unknown)
	fmt.Fprintf(out, "verify: confirmed %d  lost %d  duplicates %d\n", rep.Confirmed, rep.Lost, rep.Duplicates)
	for _, r := range rep.LostRanges {
		fmt.Fprintf(out, "  lost %s\n", r)
	}
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	if rep.Lost > 0 {
		return rep, fmt.Errorf("%w: %d of %d (ledger %s)", ErrLoss, rep.Lost, rep.Confirmed, cfg.Verify)
	}
	return rep, nil
}
