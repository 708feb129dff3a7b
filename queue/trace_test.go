package queue

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/warren-mq/warren/wire"
)

// traceEnv runs one golden trace file: a script of commands, each printing
// the effects it caused and the queue's counts. Regenerate the expected
// output with: go test ./queue -run TestTraces -rewrite
type traceEnv struct {
	m      *Machine
	now    int64
	nextID uint64
	// model of where every published message is, for the invariant check
	where map[uint64]string
	tags  map[ConsumerID][]uint64 // delivered tags, for random settlements
}

func TestTraces(t *testing.T) {
	datadriven.Walk(t, "testdata/traces", func(t *testing.T, path string) {
		env := &traceEnv{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out, err := env.run(d)
			if errors.Is(err, errBadTrace) {
				// Never written into the expected output by -rewrite.
				t.Fatalf("%s: %v", d.Pos, err)
			}
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			if env.m != nil {
				if err := env.m.checkInvariants(); err != nil {
					t.Fatalf("%s: invariant broken after %q: %v", d.Pos, d.Cmd, err)
				}
				if err := env.checkAccounting(); err != nil {
					t.Fatalf("%s: accounting broken after %q: %v", d.Pos, d.Cmd, err)
				}
			}
			return out
		})
	})
}

func argInt(d *datadriven.TestData, key string, def int64) int64 {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			if len(a.Vals) == 0 {
				return 1
			}
			v, err := strconv.ParseInt(a.Vals[0], 10, 64)
			if err != nil {
				panic(fmt.Sprintf("%s: bad %s=%s", d.Pos, key, a.Vals[0]))
			}
			return v
		}
	}
	return def
}

func argStr(d *datadriven.TestData, key, def string) string {
	for _, a := range d.CmdArgs {
		if a.Key == key && len(a.Vals) > 0 {
			return a.Vals[0]
		}
	}
	return def
}

// errBadTrace marks a trace line the runner cannot read (unknown command
// or key): the trace is wrong, not the machine.
var errBadTrace = errors.New("bad trace line")

// traceKeys are the keys each command reads; any other key is an error,
// so a misspelt one never passes as its default. Every command takes at=.
var traceKeys = map[string][]string{
	"new": {"max-priority", "strict", "starvation", "max-length", "max-bytes", "ttl", "dlx", "delivery-limit",
		"retry-initial", "retry-mult", "retry-max", "consumer-timeout", "single-active", "auto-delete", "expires",
		"dedup", "overflow"},
	"enqueue": {"n", "size", "p", "key", "ttl"},
	"sub":     {"c", "owner", "prefetch", "prefetch-bytes", "prio", "auto-ack", "exclusive", "get"},
	"cancel":  {"c", "requeue"},
	"down":    {"owner"},
	"ack":     {"c", "tag", "upto", "from"},
	"requeue": {"c", "tag", "upto", "from"},
	"reject":  {"c", "tag", "upto", "from"},
	"extend":  {"c", "tag", "upto", "from", "lease"},
	"tick":    {},
	"purge":   {},
}

func checkTraceKeys(d *datadriven.TestData) error {
	keys, ok := traceKeys[d.Cmd]
	if !ok {
		return fmt.Errorf("%w: unknown command %q", errBadTrace, d.Cmd)
	}
	for _, a := range d.CmdArgs {
		if a.Key != "at" && !slices.Contains(keys, a.Key) {
			return fmt.Errorf("%w: %s: unknown key %q (this command takes at, %s)", errBadTrace, d.Cmd, a.Key, strings.Join(keys, ", "))
		}
	}
	return nil
}

func (env *traceEnv) run(d *datadriven.TestData) (string, error) {
	if err := checkTraceKeys(d); err != nil {
		return "", err
	}
	if at := argInt(d, "at", -1); at >= 0 {
		env.now = at
	}
	var effs []Effect
	var err error
	switch d.Cmd {
	case "new":
		cfg := Config{
			MaxPriority:          uint8(argInt(d, "max-priority", 0)),
			StrictPriority:       d.HasArg("strict"),
			StarvationLimit:      int(argInt(d, "starvation", 0)),
			MaxLength:            argInt(d, "max-length", 0),
			MaxLengthBytes:       argInt(d, "max-bytes", 0),
			MessageTTLMs:         argInt(d, "ttl", 0),
			DeadLetter:           d.HasArg("dlx"),
			DeliveryLimit:        uint32(argInt(d, "delivery-limit", 0)),
			RetryInitialMs:       argInt(d, "retry-initial", 0),
			RetryMultiplierMilli: uint32(argInt(d, "retry-mult", 1) * 1000),
			RetryMaxMs:           argInt(d, "retry-max", 0),
			ConsumerTimeout:      argInt(d, "consumer-timeout", 0),
			SingleActive:         d.HasArg("single-active"),
			AutoDelete:           d.HasArg("auto-delete"),
			ExpiresMs:            argInt(d, "expires", 0),
			DedupWindowMs:        argInt(d, "dedup", 0),
		}
		switch argStr(d, "overflow", "drop-head") {
		case "reject-publish":
			cfg.Overflow = wire.RejectPublish
		case "reject-publish-dlx":
			cfg.Overflow = wire.RejectPublishDLX
		case "dead-letter":
			cfg.Overflow = wire.OverflowDeadLetter
		}
		env.m = New(cfg, env.now)
		env.where = map[uint64]string{}
		return "ok\n", nil
	case "enqueue":
		n := int(argInt(d, "n", 1))
		var msgs []Message
		for i := 0; i < n; i++ {
			env.nextID++
			msg := Message{ID: env.nextID, Size: uint32(argInt(d, "size", 10)), Priority: uint8(argInt(d, "p", 0))}
			msg.DedupKey = uint64(argInt(d, "key", 0))
			if ttl := argInt(d, "ttl", -1); ttl >= 0 {
				msg.ExpirationMs, msg.HasExpiration = uint32(ttl), true
			}
			msgs = append(msgs, msg)
			env.where[env.nextID] = "queue"
		}
		effs = env.m.Enqueue(env.now, msgs)
	case "sub":
		effs, err = env.m.Subscribe(env.now, ConsumerSpec{
			ID: ConsumerID(argInt(d, "c", 1)), Owner: OwnerID(argInt(d, "owner", 1)),
			Prefetch: uint32(argInt(d, "prefetch", 0)), PrefetchBytes: uint32(argInt(d, "prefetch-bytes", 0)),
			Priority: int16(argInt(d, "prio", 0)),
			AutoAck:  d.HasArg("auto-ack"), Exclusive: d.HasArg("exclusive"), Get: d.HasArg("get"),
		})
	case "cancel":
		effs, err = env.m.Cancel(env.now, ConsumerID(argInt(d, "c", 1)), d.HasArg("requeue"))
	case "down":
		effs = env.m.Down(env.now, OwnerID(argInt(d, "owner", 1)))
	case "ack", "requeue", "reject", "extend":
		op := map[string]wire.SettleOp{"ack": wire.SettleAck, "requeue": wire.SettleRequeue, "reject": wire.SettleReject, "extend": wire.SettleExtend}[d.Cmd]
		last := uint64(argInt(d, "tag", 0))
		first := last
		if d.HasArg("upto") {
			first, last = 0, uint64(argInt(d, "upto", 0))
		}
		if d.HasArg("from") {
			first = uint64(argInt(d, "from", 0))
		}
		effs, err = env.m.Settle(env.now, ConsumerID(argInt(d, "c", 1)), op, first, last, uint32(argInt(d, "lease", 0)))
	case "tick":
		effs = env.m.Tick(env.now)
	case "purge":
		var n int64
		n, effs = env.m.Purge(env.now)
		defer func() {}()
		_ = n
	default:
		panic("queue: BUG: traceKeys lists a command run does not handle: " + d.Cmd)
	}
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, e := range effs {
		env.account(e)
		b.WriteString(formatEffect(e))
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "ready=%d unacked=%d parked=%d consumers=%d\n", env.m.Ready(), env.m.Unacked(), env.m.Parked(), env.m.Consumers())
	return b.String(), nil
}

func formatEffect(e Effect) string {
	switch e.Kind {
	case Deliver:
		return fmt.Sprintf("deliver c%d tag=%d msg=%d dc=%d fc=%d", e.Consumer, e.Tag, e.Msg, e.DeliveryCount, e.FailedCount)
	case Remove:
		return fmt.Sprintf("remove msg=%d", e.Msg)
	case DeadLetter, Drop:
		return fmt.Sprintf("%s msg=%d reason=%v", e.Kind, e.Msg, e.Reason)
	case RejectPublish:
		return fmt.Sprintf("reject-publish msg=%d", e.Msg)
	case LeaseExpired:
		return fmt.Sprintf("lease-expired c%d tag=%d", e.Consumer, e.Tag)
	case Timer:
		return fmt.Sprintf("timer at=%d", e.At)
	case DeleteQueue:
		return "delete-queue"
	case Duplicate:
		return fmt.Sprintf("duplicate msg=%d", e.Msg)
	}
	return "?"
}

// account moves the model's record of each message as effects report it:
// every published message is in exactly one place.
func (env *traceEnv) account(e Effect) {
	switch e.Kind {
	case Deliver:
		env.where[e.Msg] = "unacked"
	case Remove:
		env.where[e.Msg] = "settled"
	case DeadLetter:
		env.where[e.Msg] = "dead-lettered"
	case Drop:
		env.where[e.Msg] = "dropped"
	case RejectPublish:
		env.where[e.Msg] = "rejected"
	case Duplicate:
		env.where[e.Msg] = "duplicate"
	}
}

// checkAccounting: the machine's counts agree with where the effects say
// each message is. Messages marked unacked that came back are in the queue
// (ready or parked) again, so compare totals: held = ready+parked+unacked.
func (env *traceEnv) checkAccounting() error {
	held, dead := 0, 0
	for _, w := range env.where {
		if w == "queue" || w == "unacked" {
			held++
		}
		if w == "dead-lettered" {
			dead++
		}
	}
	// Held dead letters are those dead-lettered and not yet settled
	// (a settle's Remove marks them settled).
	if n, _ := env.m.HeldDeadLetters(); env.m.cfg.HoldDeadLetters && n != dead || !env.m.cfg.HoldDeadLetters && n != 0 {
		return fmt.Errorf("machine holds %d dead letters; effects account for %d (hold %v)", n, dead, env.m.cfg.HoldDeadLetters)
	}
	got := int(env.m.Ready()) + env.m.Parked() + env.m.Unacked()
	if got != held {
		return fmt.Errorf("machine holds %d messages (ready %d, parked %d, unacked %d); effects account for %d",
			got, env.m.Ready(), env.m.Parked(), env.m.Unacked(), held)
	}
	return nil
}

func TestPeekChangesNothing(t *testing.T) {
	m := New(Config{MaxPriority: 3}, 0)
	m.Enqueue(0, []Message{{ID: 1, Priority: 0}, {ID: 2, Priority: 3}, {ID: 3, Priority: 0}})
	before := m.Snapshot()
	got := m.Peek(10)
	if len(got) != 3 || got[0].ID != 2 || got[1].ID != 1 || got[2].ID != 3 {
		t.Fatalf("peek order %+v", got)
	}
	if len(m.Peek(1)) != 1 {
		t.Fatal("peek ignores n")
	}
	if string(m.Snapshot()) != string(before) {
		t.Fatal("peek changed the state")
	}
}

// TestTraceRejectsUnknownKeys: a misspelt key in a trace is an error, not
// a default silently taken (a trace that says prio=3 where the command
// reads p= would test priority 0 and still pass).
func TestTraceRejectsUnknownKeys(t *testing.T) {
	for _, line := range []*datadriven.TestData{
		{Cmd: "new", CmdArgs: []datadriven.CmdArg{{Key: "max-prio", Vals: []string{"3"}}}},
		{Cmd: "enqueue", CmdArgs: []datadriven.CmdArg{{Key: "prio", Vals: []string{"3"}}}},
		{Cmd: "ack", CmdArgs: []datadriven.CmdArg{{Key: "c", Vals: []string{"1"}}, {Key: "last", Vals: []string{"5"}}}},
		{Cmd: "tick", CmdArgs: []datadriven.CmdArg{{Key: "now", Vals: []string{"5"}}}},
	} {
		env := &traceEnv{}
		if _, err := env.run(&datadriven.TestData{Cmd: "new"}); err != nil {
			t.Fatal(err)
		}
		line.Pos = "test"
		if _, err := env.run(line); err == nil || !strings.Contains(err.Error(), "unknown key") {
			t.Errorf("%s %v: err %v, want an unknown key error", line.Cmd, line.CmdArgs, err)
		}
	}
}
