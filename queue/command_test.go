package queue

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// randomCommandValue returns a command of kind k with every field drawn
// from its whole range (not necessarily one a machine would accept).
func randomCommandValue(r *rand.Rand, k CommandKind) Command {
	now := int64(r.Uint64())
	switch k {
	case KindEnqueue:
		c := &Enqueue{NowMs: now}
		n := r.IntN(6)
		if n > 0 || r.IntN(2) == 0 {
			c.Msgs = make([]Message, n)
		}
		for i := range c.Msgs {
			c.Msgs[i] = Message{ID: r.Uint64(), Size: r.Uint32(), Priority: uint8(r.Uint32()),
				ExpirationMs: r.Uint32(), HasExpiration: r.IntN(2) == 0, DedupKey: r.Uint64()}
		}
		if r.IntN(2) == 0 {
			c.Bodies = make([][]byte, n)
			for i := range c.Bodies {
				c.Bodies[i] = make([]byte, r.IntN(40))
				for j := range c.Bodies[i] {
					c.Bodies[i][j] = byte(r.Uint32())
				}
			}
		}
		return c
	case KindSettle:
		return &Settle{NowMs: now, Consumer: ConsumerID(r.Uint64()), Op: wire.SettleOp(r.Uint32()),
			First: r.Uint64(), Last: r.Uint64(), ArgMs: r.Uint32()}
	case KindSubscribe:
		return &Subscribe{NowMs: now, Spec: ConsumerSpec{ID: ConsumerID(r.Uint64()), Owner: OwnerID(r.Uint64()),
			Prefetch: r.Uint32(), PrefetchBytes: r.Uint32(), Priority: int16(r.Uint32()),
			AutoAck: r.IntN(2) == 0, Exclusive: r.IntN(2) == 0, TimeoutMs: int64(r.Uint64()), Get: r.IntN(2) == 0}}
	case KindCancel:
		return &Cancel{NowMs: now, Consumer: ConsumerID(r.Uint64()), Requeue: r.IntN(2) == 0}
	case KindDown:
		return &Down{NowMs: now, Owner: OwnerID(r.Uint64())}
	case KindTick:
		return &Tick{NowMs: now}
	case KindPurge:
		return &Purge{NowMs: now}
	case KindSettleDeadLetter:
		return &SettleDeadLetter{NowMs: now, ID: r.Uint64()}
	}
	panic("no kind " + k.String())
}

var allKinds = []CommandKind{KindEnqueue, KindSettle, KindSubscribe, KindCancel, KindDown, KindTick, KindPurge, KindSettleDeadLetter}

// sameCommand compares two commands field by field; an Enqueue's Msgs
// compare equal when nil and empty (the encoding does not tell them apart),
// its Bodies do not (it does).
func sameCommand(a, b Command) bool {
	ea, ok1 := a.(*Enqueue)
	eb, ok2 := b.(*Enqueue)
	if ok1 && ok2 {
		if ea.NowMs != eb.NowMs || len(ea.Msgs) != len(eb.Msgs) || (ea.Bodies == nil) != (eb.Bodies == nil) || len(ea.Bodies) != len(eb.Bodies) {
			return false
		}
		for i := range ea.Msgs {
			if ea.Msgs[i] != eb.Msgs[i] {
				return false
			}
		}
		for i := range ea.Bodies {
			if !bytes.Equal(ea.Bodies[i], eb.Bodies[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

// TestCommandRoundTrip: every kind, with random values over each field's
// whole range, decodes (owned and view) to the value encoded, and
// re-encodes to the same bytes.
func TestCommandRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var d Decoder
	var buf []byte
	for i := 0; i < 3000; i++ {
		k := allKinds[i%len(allKinds)]
		cmd := randomCommandValue(r, k)
		buf = AppendCommand(buf[:0], cmd)
		if buf[0] != CommandVersion || CommandKind(buf[1]) != k {
			t.Fatalf("%s: header % x", k, buf[:2])
		}
		owned, err := DecodeCommand(buf)
		if err != nil {
			t.Fatalf("%s %+v: %v", k, cmd, err)
		}
		view, err := d.Decode(buf)
		if err != nil {
			t.Fatalf("%s %+v: Decoder: %v", k, cmd, err)
		}
		for _, got := range []Command{owned, view} {
			if !sameCommand(cmd, got) {
				t.Fatalf("%s: encoded %+v, decoded %+v", k, cmd, got)
			}
			if got.Kind() != k || got.TimeMs() != cmd.TimeMs() {
				t.Fatalf("%s: kind %s time %d", k, got.Kind(), got.TimeMs())
			}
			if again := AppendCommand(nil, got); !bytes.Equal(again, buf) {
				t.Fatalf("%s: re-encoded\n% x\nwant\n% x", k, again, buf)
			}
		}
		// The owned copy shares nothing with the input.
		if e, ok := owned.(*Enqueue); ok && len(e.Bodies) > 0 {
			want := AppendCommand(nil, owned)
			for j := range buf {
				buf[j] ^= 0xff
			}
			if got := AppendCommand(nil, owned); !bytes.Equal(got, want) {
				t.Fatalf("DecodeCommand's Enqueue changed when its input was overwritten")
			}
		}
	}
}

// TestCommandEncodingGolden pins the bytes of one command of each kind:
// the layout is a format (logs written today are read by later builds),
// so a change here is a new CommandVersion, never an edit of this test.
func TestCommandEncodingGolden(t *testing.T) {
	cases := []struct {
		cmd  Command
		want string
	}{
		{&Enqueue{NowMs: 0x0102030405060708, Msgs: []Message{{ID: 9, Size: 3, Priority: 4, ExpirationMs: 500, HasExpiration: true, DedupKey: 0xaabb}}, Bodies: [][]byte{[]byte("abc")}},
			"01 01 0807060504030201" + " 01 01000000" +
				" 0900000000000000 03000000 f4010000 bbaa000000000000 04 01 0000" +
				" 03000000 616263"},
		{&Enqueue{NowMs: 1, Msgs: []Message{{ID: 2, Size: 5}}},
			"01 01 0100000000000000 00 01000000 0200000000000000 05000000 00000000 0000000000000000 00 00 0000"},
		{&Settle{NowMs: 2, Consumer: 7, Op: wire.SettleRequeue, First: 10, Last: 12, ArgMs: 300},
			"01 02 0200000000000000 0700000000000000 02 0a00000000000000 0c00000000000000 2c010000"},
		{&Subscribe{NowMs: 3, Spec: ConsumerSpec{ID: 5, Owner: 6, Prefetch: 100, PrefetchBytes: 4096, Priority: -2, AutoAck: true, Exclusive: true, TimeoutMs: 30000}},
			"01 03 0300000000000000 0500000000000000 0600000000000000 64000000 00100000 feff 03 3075000000000000"},
		{&Subscribe{NowMs: 3, Spec: ConsumerSpec{ID: 5, Owner: 6, Prefetch: 1, Get: true}},
			"01 03 0300000000000000 0500000000000000 0600000000000000 01000000 00000000 0000 04 0000000000000000"},
		{&Cancel{NowMs: 4, Consumer: 5, Requeue: true}, "01 04 0400000000000000 0500000000000000 01"},
		{&Down{NowMs: -1, Owner: 9}, "01 05 ffffffffffffffff 0900000000000000"},
		{&Tick{NowMs: 1000}, "01 06 e803000000000000"},
		{&Purge{NowMs: 1000}, "01 07 e803000000000000"},
		{&SettleDeadLetter{NowMs: 1000, ID: 0x10002}, "01 0b e803000000000000 0200010000000000"},
	}
	for _, c := range cases {
		want, err := hex.DecodeString(string(bytes.ReplaceAll([]byte(c.want), []byte(" "), nil)))
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendCommand(nil, c.cmd); !bytes.Equal(got, want) {
			t.Errorf("%s: encoded\n% x\nwant\n% x", c.cmd.Kind(), got, want)
		}
		if got, err := DecodeCommand(want); err != nil || !sameCommand(got, c.cmd) {
			t.Errorf("%s: decoded %+v, %v", c.cmd.Kind(), got, err)
		}
	}
}

// TestDecodeCommandRefusesBadInput: truncations, trailing bytes, unknown
// versions, kinds and flags, and counts larger than the input are errors
// (never panics), and a huge count allocates nothing before it is refused.
func TestDecodeCommandRefusesBadInput(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var d Decoder
	decodeBoth := func(b []byte) (error, error) {
		_, err1 := DecodeCommand(b)
		_, err2 := d.Decode(b)
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("DecodeCommand and Decoder disagree on % x: %v / %v", b, err1, err2)
		}
		return err1, err2
	}
	for i := 0; i < 700; i++ {
		cmd := randomCommandValue(r, allKinds[i%len(allKinds)])
		enc := AppendCommand(nil, cmd)
		for n := 0; n < len(enc); n++ {
			if err, _ := decodeBoth(enc[:n]); !errors.Is(err, ErrMalformedCommand) {
				t.Fatalf("%s cut to %d of %d bytes: %v", cmd.Kind(), n, len(enc), err)
			}
		}
		if err, _ := decodeBoth(append(enc[:len(enc):len(enc)], 0)); !errors.Is(err, ErrMalformedCommand) {
			t.Fatalf("%s with a trailing byte: %v", cmd.Kind(), err)
		}
		// Random damage: an error, or a command that re-encodes to the
		// damaged bytes exactly (the encoding is canonical).
		bad := bytes.Clone(enc)
		for range 1 + r.IntN(3) {
			bad[r.IntN(len(bad))] = byte(r.Uint32())
		}
		if got, err := DecodeCommand(bad); err == nil && !bytes.Equal(AppendCommand(nil, got), bad) {
			t.Fatalf("% x decoded to %+v, which encodes differently", bad, got)
		}
		decodeBoth(bad)
	}
	for _, c := range []struct {
		hex  string
		want error
	}{
		{"02 06 0000000000000000", ErrCommandVersion},
		{"00 06 0000000000000000", ErrCommandVersion},
		{"01 00 0000000000000000", ErrMalformedCommand},
		{"01 08 0000000000000000", ErrMalformedCommand},
		{"01 ff 0000000000000000", ErrMalformedCommand},
		{"01 04 0000000000000000 0500000000000000 02", ErrMalformedCommand},                     // requeue not 0/1
		{"01 01 0000000000000000 02 00000000", ErrMalformedCommand},                             // unknown enqueue flag
		{"01 01 0000000000000000 00 ffffffff", ErrMalformedCommand},                             // 4 G messages in 15 bytes
		{"01 01 0000000000000000 01 01000000" + msgHex("00") + "ffffffff", ErrMalformedCommand}, // body longer than the rest
		{"01 01 0000000000000000 00 01000000" + msgHex("02"), ErrMalformedCommand},              // unknown message flag
		{"01 01 0000000000000000 00 01000000 0000000000000000 00000000 00000000 0000000000000000 00 00 0100", ErrMalformedCommand},
		{"01 03 0000000000000000 0500000000000000 0600000000000000 64000000 00100000 feff 08 3075000000000000", ErrMalformedCommand}, // unknown subscribe flag
		{"", ErrMalformedCommand},
	} {
		b, err := hex.DecodeString(string(bytes.ReplaceAll([]byte(c.hex), []byte(" "), nil)))
		if err != nil {
			t.Fatal(err)
		}
		err1, err2 := decodeBoth(b)
		if !errors.Is(err1, c.want) || !errors.Is(err2, c.want) {
			t.Errorf("% x: %v / %v, want %v", b, err1, err2, c.want)
		}
	}
	// A count is checked against the input before anything is allocated.
	huge, _ := hex.DecodeString("0101" + "0000000000000000" + "01" + "ffffffff")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		if _, err := DecodeCommand(huge); err == nil {
			t.Fatal("decoded a count of 2^32-1 from 15 bytes")
		}
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Fatalf("refusing a huge count 10 times allocated %d bytes", grew)
	}
}

// msgHex is a hex message record with the given flag byte.
func msgHex(flags string) string {
	return "0000000000000000 00000000 00000000 0000000000000000 00 " + flags + " 0000"
}

func TestApplyUnknownCommand(t *testing.T) {
	m := New(Config{}, 0)
	if _, err := m.Apply(nil); !errors.Is(err, ErrUnknownCommand) {
		t.Fatalf("Apply(nil): %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("AppendCommand of an Enqueue with 1 body for 2 messages did not panic")
		}
	}()
	AppendCommand(nil, &Enqueue{Msgs: make([]Message, 2), Bodies: [][]byte{nil}})
}

// cmdGen draws command sequences a queue would see, tracking what the
// machine handed out so settles name real tags most of the time.
type cmdGen struct {
	now    int64
	nextID uint64
	tags   map[ConsumerID][]uint64
}

func (g *cmdGen) next(r *rand.Rand) Command {
	g.now += int64(r.IntN(40))
	c := ConsumerID(1 + r.IntN(3))
	switch op := r.IntN(22); {
	case op < 6:
		e := &Enqueue{NowMs: g.now}
		for i := r.IntN(5); i >= 0; i-- {
			g.nextID++
			m := Message{ID: g.nextID, Size: uint32(r.IntN(100)), Priority: uint8(r.IntN(6)), DedupKey: uint64(r.IntN(30))}
			if r.IntN(4) == 0 {
				m.ExpirationMs, m.HasExpiration = uint32(r.IntN(300)), true
			}
			e.Msgs = append(e.Msgs, m)
		}
		if r.IntN(2) == 0 {
			for range e.Msgs {
				e.Bodies = append(e.Bodies, []byte("body"))
			}
		}
		return e
	case op < 8:
		return &Subscribe{NowMs: g.now, Spec: ConsumerSpec{ID: c, Owner: OwnerID(c % 2), Prefetch: uint32(r.IntN(4)),
			PrefetchBytes: uint32(r.IntN(3) * 60), Priority: int16(r.IntN(2)), AutoAck: r.IntN(6) == 0,
			Exclusive: r.IntN(10) == 0, TimeoutMs: int64(r.IntN(3) * r.IntN(200)), Get: r.IntN(5) == 0}}
	case op < 9:
		return &Cancel{NowMs: g.now, Consumer: c, Requeue: r.IntN(2) == 0}
	case op < 16:
		s := &Settle{NowMs: g.now, Consumer: c, Op: wire.SettleOp(1 + r.IntN(4)), ArgMs: uint32(r.IntN(100))}
		if ts := g.tags[c]; len(ts) > 0 && r.IntN(8) != 0 {
			s.Last = ts[r.IntN(len(ts))]
			s.First = s.Last - uint64(r.IntN(3))
			if r.IntN(3) == 0 {
				s.First = 0
			}
		} else {
			s.First, s.Last = uint64(r.IntN(5)), uint64(r.IntN(5))
		}
		if r.IntN(30) == 0 {
			s.Op = wire.SettleOp(r.IntN(8)) // sometimes not an op at all
		}
		return s
	case op < 17:
		return &Down{NowMs: g.now, Owner: OwnerID(r.IntN(2))}
	case op < 18:
		return &Purge{NowMs: g.now}
	case op < 19:
		return &SettleDeadLetter{NowMs: g.now, ID: uint64(r.IntN(int(g.nextID) + 1))}
	default:
		return &Tick{NowMs: g.now}
	}
}

func (g *cmdGen) saw(effs []Effect) {
	for _, e := range effs {
		if e.Kind == Deliver {
			g.tags[e.Consumer] = append(g.tags[e.Consumer], e.Tag)
		}
	}
}

// applyByMethod is the reference: each command applied by calling its
// Machine method directly, as callers did before commands existed.
func applyByMethod(m *Machine, cmd Command) ([]Effect, error) {
	switch c := cmd.(type) {
	case *Enqueue:
		return m.Enqueue(c.NowMs, c.Msgs), nil
	case *Settle:
		return m.Settle(c.NowMs, c.Consumer, c.Op, c.First, c.Last, c.ArgMs)
	case *Subscribe:
		return m.Subscribe(c.NowMs, c.Spec)
	case *Cancel:
		return m.Cancel(c.NowMs, c.Consumer, c.Requeue)
	case *Down:
		return m.Down(c.NowMs, c.Owner), nil
	case *Tick:
		return m.Tick(c.NowMs), nil
	case *SettleDeadLetter:
		return m.SettleDeadLetter(c.NowMs, c.ID), nil
	case *Purge:
		n, effs := m.Purge(c.NowMs)
		removes := 0
		for _, e := range effs {
			if e.Kind == Remove {
				removes++
			}
		}
		if int64(removes) != n {
			panic(fmt.Sprintf("purge removed %d but emitted %d Remove effects", n, removes))
		}
		return effs, nil
	}
	panic("unknown command")
}

// TestApplyThroughCodecIsDeterministic is the property durable queues rely
// on: a random command sequence applied to one machine by direct method
// calls, and to a twin by encode → decode → Apply, gives the same effects
// and errors at every step and the same Snapshot bytes after every step.
// Failing seeds are printed.
func TestApplyThroughCodecIsDeterministic(t *testing.T) {
	seeds, steps := uint64(150), 250
	if testing.Short() || raceEnabled {
		seeds = 40
	}
	var d Decoder
	var buf []byte
	for seed := uint64(0); seed < seeds; seed++ {
		r := rand.New(rand.NewPCG(seed, 12))
		direct := randomMachine(r).m
		logged, err := Restore(direct.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		g := &cmdGen{tags: map[ConsumerID][]uint64{}}
		for step := 0; step < steps; step++ {
			cmd := g.next(r)
			want, werr := applyByMethod(direct, cmd)
			want = append([]Effect(nil), want...)
			buf = AppendCommand(buf[:0], cmd)
			dec, err := d.Decode(buf)
			if err != nil {
				t.Fatalf("seed %d step %d: decode %+v: %v", seed, step, cmd, err)
			}
			got, gerr := logged.Apply(dec)
			if werr != gerr {
				t.Fatalf("seed %d step %d: %s: error %v by method, %v through the codec", seed, step, cmd.Kind(), werr, gerr)
			}
			if !slices.Equal(want, got) {
				t.Fatalf("seed %d step %d: %s: effects differ\nby method:   %+v\nthrough log: %+v", seed, step, cmd.Kind(), want, got)
			}
			g.saw(want)
			if a, b := direct.Snapshot(), logged.Snapshot(); !bytes.Equal(a, b) {
				t.Fatalf("seed %d step %d: %s: snapshots differ", seed, step, cmd.Kind())
			}
		}
	}
}

// TestCommandCodecAllocatesNothing: encoding into a reused buffer, decoding
// with a Decoder, and applying a steady publish/ack cycle through the codec
// allocate nothing (the hot path of a durable queue's apply loop).
func TestCommandCodecAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	m := New(Config{}, 0)
	if _, err := m.Subscribe(0, ConsumerSpec{ID: 1, Prefetch: 1000}); err != nil {
		t.Fatal(err)
	}
	msgs := make([]Message, 64)
	bodies := make([][]byte, 64)
	for i := range bodies {
		bodies[i] = make([]byte, 128)
	}
	var d Decoder
	buf := make([]byte, 0, 64<<10)
	var id, last uint64
	cycle := func() {
		for i := range msgs {
			id++
			msgs[i] = Message{ID: id, Size: 128}
		}
		buf = AppendCommand(buf[:0], &Enqueue{NowMs: 1, Msgs: msgs, Bodies: bodies})
		cmd, err := d.Decode(buf)
		if err != nil {
			t.Fatal(err)
		}
		effs, _ := m.Apply(cmd)
		for _, e := range effs {
			if e.Kind == Deliver {
				last = e.Tag
			}
		}
		buf = AppendCommand(buf[:0], &Settle{NowMs: 1, Consumer: 1, Op: wire.SettleAck, Last: last})
		if cmd, err = d.Decode(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Apply(cmd); err != nil {
			t.Fatal(err)
		}
		buf = AppendCommand(buf[:0], &Tick{NowMs: 2})
		if cmd, err = d.Decode(buf); err != nil {
			t.Fatal(err)
		}
		m.Apply(cmd)
	}
	cycle() // grow the buffers
	if n := testing.AllocsPerRun(100, cycle); n != 0 {
		t.Fatalf("%.1f allocations per enqueue/settle/tick cycle through the codec, want 0", n)
	}
}

// FuzzDecodeCommand feeds arbitrary bytes to both decoders: neither may
// panic, they must agree, and whatever decodes must re-encode to exactly
// the input (one encoding per command). Seeded with one command of each
// kind; run with
//
//	go test -run '^$' -fuzz=FuzzDecodeCommand -fuzztime=60s ./queue
func FuzzDecodeCommand(f *testing.F) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, k := range allKinds {
		f.Add(AppendCommand(nil, randomCommandValue(r, k)))
	}
	f.Add(AppendCommand(nil, &Enqueue{NowMs: 1, Msgs: []Message{{ID: 1, Size: 3}, {ID: 2}}, Bodies: [][]byte{[]byte("abc"), nil}}))
	f.Add([]byte{})
	f.Add([]byte{CommandVersion, byte(KindEnqueue), 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff})
	var d Decoder
	f.Fuzz(func(t *testing.T, data []byte) {
		owned, err1 := DecodeCommand(data)
		view, err2 := d.Decode(data)
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("DecodeCommand: %v; Decoder: %v", err1, err2)
		}
		if err1 != nil {
			if !errors.Is(err1, ErrMalformedCommand) && !errors.Is(err1, ErrCommandVersion) {
				t.Fatalf("error %v wraps neither ErrMalformedCommand nor ErrCommandVersion", err1)
			}
			return
		}
		if !sameCommand(owned, view) {
			t.Fatalf("DecodeCommand %+v, Decoder %+v", owned, view)
		}
		if again := AppendCommand(nil, owned); !bytes.Equal(again, data) {
			t.Fatalf("decoded %+v re-encodes to\n% x\nnot\n% x", owned, again, data)
		}
	})
}

// BenchmarkCommandCodec: encoding into a reused buffer and decoding with a
// Decoder, per command (-benchmem: both must show 0 allocs/op).
func BenchmarkCommandCodec(b *testing.B) {
	msgs := make([]Message, 64)
	bodies := make([][]byte, 64)
	for i := range msgs {
		msgs[i] = Message{ID: uint64(i + 1), Size: 1024, Priority: 1}
		bodies[i] = make([]byte, 1024)
	}
	cmds := []struct {
		name string
		cmd  Command
	}{
		{"settle", &Settle{NowMs: 1, Consumer: 3, Op: wire.SettleAck, First: 100, Last: 164}},
		{"tick", &Tick{NowMs: 1}},
		{"enqueue64", &Enqueue{NowMs: 1, Msgs: msgs}},
		{"enqueue64+bodies1KiB", &Enqueue{NowMs: 1, Msgs: msgs, Bodies: bodies}},
	}
	for _, c := range cmds {
		enc := AppendCommand(nil, c.cmd)
		b.Run("encode/"+c.name, func(b *testing.B) {
			buf := make([]byte, 0, len(enc))
			b.SetBytes(int64(len(enc)))
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendCommand(buf[:0], c.cmd)
			}
		})
		b.Run("decode/"+c.name, func(b *testing.B) {
			var d Decoder
			b.SetBytes(int64(len(enc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.Decode(enc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// bodiesSource is a BodySource over bodies kept as slices; short appends
// one byte less for message 0 (a broken source).
type bodiesSource struct {
	bodies [][]byte
	short  bool
}

func (s *bodiesSource) BodyLen(i int) int { return len(s.bodies[i]) }
func (s *bodiesSource) AppendBody(dst []byte, i int) []byte {
	b := s.bodies[i]
	if s.short && i == 0 {
		b = b[:len(b)-1]
	}
	return append(dst, b...)
}

// TestAppendEnqueueFromSource: an Enqueue whose bodies a BodySource
// writes encodes to the very bytes AppendCommand writes for the same
// Enqueue with its Bodies (random ones, empty bodies and no messages
// included), decodes back to them, allocates nothing into a buffer with
// room, and a source that appends other than it said panics.
func TestAppendEnqueueFromSource(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 9))
	for range 500 {
		n := r.IntN(8)
		c := &Enqueue{NowMs: int64(r.Uint64()), Msgs: make([]Message, n), Bodies: make([][]byte, n)}
		for i := range n {
			c.Msgs[i] = Message{ID: r.Uint64(), Size: r.Uint32(), Priority: uint8(r.Uint32()), ExpirationMs: r.Uint32(), HasExpiration: r.IntN(2) == 0, DedupKey: r.Uint64()}
			c.Bodies[i] = make([]byte, r.IntN(300))
			for j := range c.Bodies[i] {
				c.Bodies[i][j] = byte(r.Uint32())
			}
		}
		want := AppendCommand([]byte("pre"), c)
		got := AppendEnqueue([]byte("pre"), c.NowMs, c.Msgs, &bodiesSource{bodies: c.Bodies})
		if !bytes.Equal(got, want) {
			t.Fatalf("%d messages: from a source\n%x\nwith Bodies\n%x", n, got, want)
		}
		back, err := DecodeCommand(got[3:])
		if err != nil {
			t.Fatal(err)
		}
		if e := back.(*Enqueue); !slices.EqualFunc(e.Bodies, c.Bodies, bytes.Equal) || !slices.Equal(e.Msgs, c.Msgs) {
			t.Fatalf("decoded %+v, want %+v", e, c)
		}
	}
	msgs := make([]Message, 16)
	src := &bodiesSource{bodies: make([][]byte, 16)}
	for i := range src.bodies {
		src.bodies[i] = make([]byte, 1024)
	}
	buf := make([]byte, 0, 64<<10)
	if a := testing.AllocsPerRun(50, func() { buf = AppendEnqueue(buf[:0], 1, msgs, src) }); a != 0 && !raceEnabled {
		t.Fatalf("%v allocations per AppendEnqueue", a)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a source that appended fewer bytes than BodyLen did not panic")
		}
	}()
	src.short = true
	AppendEnqueue(nil, 1, msgs, src)
}
