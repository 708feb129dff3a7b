package replication

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// randomCommand returns one random queue command of any kind.
func randomCommand(r *rand.Rand) queue.Command {
	now := r.Int64N(1 << 40)
	switch r.IntN(7) {
	case 0:
		n := r.IntN(5)
		c := &queue.Enqueue{NowMs: now}
		for range n {
			c.Msgs = append(c.Msgs, queue.Message{Size: uint32(r.IntN(2000)), Priority: uint8(r.IntN(10)),
				ExpirationMs: uint32(r.IntN(1000)), HasExpiration: r.IntN(2) == 0, DedupKey: r.Uint64()})
		}
		if r.IntN(2) == 0 {
			c.Bodies = make([][]byte, n)
			for i := range c.Bodies {
				c.Bodies[i] = make([]byte, r.IntN(40))
				for j := range c.Bodies[i] {
					c.Bodies[i][j] = byte(r.IntN(256))
				}
			}
		}
		return c
	case 1:
		return &queue.Settle{NowMs: now, Consumer: queue.ConsumerID(r.Uint64()), Op: wire.SettleOp(1 + r.IntN(4)), First: r.Uint64N(100), Last: r.Uint64N(1000), ArgMs: r.Uint32()}
	case 2:
		return &queue.Subscribe{NowMs: now, Spec: queue.ConsumerSpec{ID: queue.ConsumerID(r.Uint64()), Owner: queue.OwnerID(r.Uint64()),
			Prefetch: r.Uint32(), PrefetchBytes: r.Uint32(), Priority: int16(r.IntN(100) - 50), AutoAck: r.IntN(2) == 0, Exclusive: r.IntN(2) == 0, TimeoutMs: r.Int64N(1e6)}}
	case 3:
		return &queue.Cancel{NowMs: now, Consumer: queue.ConsumerID(r.Uint64()), Requeue: r.IntN(2) == 0}
	case 4:
		return &queue.Down{NowMs: now, Owner: queue.OwnerID(r.Uint64())}
	case 5:
		return &queue.Tick{NowMs: now}
	}
	return &queue.Purge{NowMs: now}
}

func encodeCmds(cmds []queue.Command) []byte {
	var b []byte
	for _, c := range cmds {
		b = queue.AppendCommand(b, c)
		b = append(b, '|')
	}
	return b
}

// TestEntryRoundTrip: random entries decode to the header and commands
// they were built from, and re-encode to the same bytes; every command
// frame is 8-byte aligned.
func TestEntryRoundTrip(t *testing.T) {
	var enc EntryEncoder
	for seed := uint64(0); seed < 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 1))
		h := EntryHeader{NowMs: r.Int64(), Proposer: r.Uint64(), Seq: r.Uint64()}
		var cmds []queue.Command
		for i := r.IntN(6); i > 0; i-- {
			cmds = append(cmds, randomCommand(r))
		}
		enc.Reset()
		for _, c := range cmds {
			if err := enc.Add(c); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
		b := enc.Finish(h)
		if len(b)%8 != 0 || len(b) != enc.Len() {
			t.Fatalf("seed %d: entry of %d bytes (Len %d), not 8-byte aligned", seed, len(b), enc.Len())
		}
		e, err := DecodeEntry(b)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if e.Header != h {
			t.Fatalf("seed %d: header %+v, want %+v", seed, e.Header, h)
		}
		if !bytes.Equal(encodeCmds(e.Commands), encodeCmds(cmds)) {
			t.Fatalf("seed %d: commands differ after the round trip", seed)
		}
		again, err := AppendEntry(nil, e.Header, e.Commands...)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("seed %d: re-encoding differs (%v)", seed, err)
		}
		// The allocation-free decoder sees the same commands.
		var d EntryDecoder
		if _, _, err := d.Check(b); err != nil {
			t.Fatal(err)
		}
		var got []queue.Command
		d.Each(b, func(i int, c queue.Command) error {
			dc, _ := queue.DecodeCommand(queue.AppendCommand(nil, c))
			got = append(got, dc)
			return nil
		})
		if !bytes.Equal(encodeCmds(got), encodeCmds(cmds)) {
			t.Fatalf("seed %d: EntryDecoder.Each sees other commands", seed)
		}
	}
}

// TestEntryRefusesBadBytes: each kind of damage is refused with an error
// that names it, never a panic.
func TestEntryRefusesBadBytes(t *testing.T) {
	good, err := AppendEntry(nil, EntryHeader{NowMs: 5}, &queue.Tick{NowMs: 5}, &queue.Down{NowMs: 5, Owner: 3})
	if err != nil {
		t.Fatal(err)
	}
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := []struct {
		name string
		b    []byte
		want error
		text string
	}{
		{"short", good[:10], ErrMalformedEntry, "shorter than the 32-byte header"},
		{"version", mut(func(b []byte) []byte { b[0] = 3; return b }), ErrEntryVersion, "upgrade this node"},
		{"flags", mut(func(b []byte) []byte { b[1] = 1; return b }), ErrMalformedEntry, "flags"},
		{"reserved", mut(func(b []byte) []byte { b[5] = 1; return b }), ErrMalformedEntry, "reserved header"},
		{"ncmd high", mut(func(b []byte) []byte { b[2] = 3; return b }), ErrMalformedEntry, "truncated frame"},
		{"ncmd low", mut(func(b []byte) []byte { b[2] = 1; return b }), ErrMalformedEntry, "trailing bytes"},
		{"frame kind", mut(func(b []byte) []byte { b[32] = 7; return b }), ErrMalformedEntry, "does not match"},
		{"reserved kind", mut(func(b []byte) []byte { b[32] = 10; return b }), ErrMalformedEntry, "reserved for a log command"},
		{"frame reserved", mut(func(b []byte) []byte { b[33] = 1; return b }), ErrMalformedEntry, "reserved frame"},
		{"frame len", mut(func(b []byte) []byte { b[36] = 200; return b }), ErrMalformedEntry, "48 left"},
		{"pad", mut(func(b []byte) []byte { b[32+8+10] = 1; return b }), ErrMalformedEntry, "pad bytes"},
		{"command", mut(func(b []byte) []byte { b[32+8] = 9; return b }), queue.ErrCommandVersion, "command 0"},
		{"trailing", append(append([]byte(nil), good...), 0, 0, 0, 0, 0, 0, 0, 0), ErrMalformedEntry, "trailing"},
	}
	for _, c := range cases {
		_, err := DecodeEntry(c.b)
		if !errors.Is(err, c.want) || !bytes.Contains([]byte(err.Error()), []byte(c.text)) {
			t.Errorf("%s: got %v, want %v mentioning %q", c.name, err, c.want, c.text)
		}
	}
}

// TestEntryEncoderCaps: the message cap is exact (ids are index<<16|slot),
// a full encoder adds nothing, and one Enqueue larger than any entry is
// refused as such.
func TestEntryEncoderCaps(t *testing.T) {
	var enc EntryEncoder
	big := &queue.Enqueue{Msgs: make([]queue.Message, MaxEntryMessages-1)}
	if err := enc.Add(big); err != nil {
		t.Fatal(err)
	}
	before := enc.Len()
	if err := enc.Add(&queue.Enqueue{Msgs: make([]queue.Message, 2)}); !errors.Is(err, ErrEntryFull) {
		t.Fatalf("past the message cap: %v", err)
	}
	if enc.Len() != before || enc.Commands() != 1 {
		t.Fatal("a refused command was partly added")
	}
	if err := enc.Add(&queue.Enqueue{Msgs: make([]queue.Message, 1)}); err != nil {
		t.Fatalf("up to the cap: %v", err)
	}
	if enc.Messages() != MaxEntryMessages {
		t.Fatalf("%d messages", enc.Messages())
	}
	if _, _, err := new(EntryDecoder).Check(enc.Finish(EntryHeader{})); err != nil {
		t.Fatalf("an entry at the cap: %v", err)
	}
	enc.Reset()
	if err := enc.Add(&queue.Enqueue{Msgs: make([]queue.Message, MaxEntryMessages+1)}); !errors.Is(err, ErrCommandTooLarge) {
		t.Fatalf("an Enqueue past the cap: %v", err)
	}
	// Byte cap: a second command past 4 MiB is refused; a first one is not.
	enc.Reset()
	huge := &queue.Enqueue{Msgs: make([]queue.Message, 1), Bodies: [][]byte{make([]byte, MaxEntryBytes)}}
	if err := enc.Add(huge); err != nil {
		t.Fatalf("one large command alone: %v", err)
	}
	if err := enc.Add(&queue.Tick{}); !errors.Is(err, ErrEntryFull) {
		t.Fatalf("past the byte cap: %v", err)
	}
}

// TestEntryEncodeDecodeAllocatesNothing: building (Add, AddEnqueue) and
// decoding an entry with a reused encoder and decoder allocates nothing
// (the hot path).
func TestEntryEncodeDecodeAllocatesNothing(t *testing.T) {
	var enc EntryEncoder
	var dec EntryDecoder
	msgs := make([]queue.Message, 64)
	bodies := make([][]byte, 64)
	for i := range bodies {
		bodies[i] = make([]byte, 100)
	}
	src := sliceBodies(bodies)
	run := func() {
		enc.Reset()
		enq := queue.Enqueue{NowMs: 1, Msgs: msgs, Bodies: bodies}
		st := queue.Settle{NowMs: 1, Consumer: 1, Op: wire.SettleAck, First: 1, Last: 5}
		_ = enc.Add(&enq)
		_ = enc.Add(&st)
		_ = enc.AddEnqueue(1, msgs, &src)
		b := enc.Finish(EntryHeader{NowMs: 1})
		if _, _, err := dec.Check(b); err != nil {
			t.Fatal(err)
		}
		_ = dec.Each(b, func(int, queue.Command) error { return nil })
	}
	run()
	if a := testing.AllocsPerRun(100, run); a != 0 {
		t.Fatalf("%v allocations per entry", a)
	}
}

// TestRaftEntryMarkers: raft's conf changes get their marker and come back
// with their type; an empty entry stays empty; a normal entry that starts
// with a marker byte is refused rather than misread.
func TestRaftEntryMarkers(t *testing.T) {
	ours, _ := AppendEntry(nil, EntryHeader{}, &queue.Tick{})
	for _, e := range []raftpb.Entry{
		{Index: 3, Term: 2, Type: raftpb.EntryNormal},
		{Index: 4, Term: 2, Type: raftpb.EntryNormal, Data: ours},
		{Index: 5, Term: 2, Type: raftpb.EntryConfChange, Data: []byte{8, 1, 16, 2}},
		{Index: 6, Term: 3, Type: raftpb.EntryConfChangeV2},
		{Index: 7, Term: 3, Type: raftpb.EntryConfChangeV2, Data: []byte{0xC1, 0xC2}},
	} {
		d, err := raftData(&e)
		if err != nil {
			t.Fatal(err)
		}
		if e.Type == raftpb.EntryNormal && len(e.Data) > 0 && &d[0] != &e.Data[0] {
			t.Fatal("a normal entry's data was copied")
		}
		back, err := raftEntry(e.Index, e.Term, d)
		if err != nil {
			t.Fatal(err)
		}
		if back.Type != e.Type || back.Index != e.Index || back.Term != e.Term || !bytes.Equal(back.Data, e.Data) {
			t.Fatalf("%+v came back as %+v", e, back)
		}
	}
	if _, err := raftData(&raftpb.Entry{Index: 9, Data: []byte{0xC1}}); !errors.Is(err, ErrMalformedEntry) {
		t.Fatalf("normal entry starting with a marker: %v", err)
	}
	if _, err := raftEntry(9, 1, []byte{0xC7}); !errors.Is(err, ErrMalformedEntry) {
		t.Fatalf("unknown marker: %v", err)
	}
}

// FuzzDecodeEntry: no input panics the decoder; whatever decodes
// re-encodes to the same bytes (one encoding per entry), and the two
// decoders agree on what is an entry. The seed corpus runs in go test.
func FuzzDecodeEntry(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 3))
	for i := 0; i < 20; i++ {
		var cmds []queue.Command
		for j := r.IntN(4); j > 0; j-- {
			cmds = append(cmds, randomCommand(r))
		}
		b, _ := AppendEntry(nil, EntryHeader{NowMs: int64(i), Proposer: uint64(i) << 48, Seq: uint64(i)}, cmds...)
		f.Add(b)
		if len(b) > 40 {
			f.Add(b[:len(b)-3])
			c := append([]byte(nil), b...)
			c[38] ^= 0xff
			f.Add(c)
		}
	}
	var enc EntryEncoder
	_ = enc.AddFrom(Origin{Enqueuer: 1<<48 | 2, Incarnation: 3, QSeq: 4}, &queue.Enqueue{Msgs: []queue.Message{{Size: 1}}, Bodies: [][]byte{{'x'}}})
	_ = enc.Add(&queue.Tick{NowMs: 5})
	_ = enc.AddEnqueuerDown(1<<48|2, 3)
	f.Add(bytes.Clone(enc.Finish(EntryHeader{NowMs: 6})))
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add(make([]byte, 32))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeEntry(b)
		var d EntryDecoder
		_, _, cerr := d.Check(b)
		if (err == nil) != (cerr == nil) {
			t.Fatalf("DecodeEntry says %v, Check says %v", err, cerr)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformedEntry) && !errors.Is(err, ErrEntryVersion) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		again, err := reencode(e)
		if err != nil {
			// Only the caps can refuse what decoded (a decoded entry is
			// within them, so this is a bug).
			t.Fatalf("re-encoding: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", b, again)
		}
	})
}

// reencode encodes a decoded entry again, its enqueuer frames included.
func reencode(e *Entry) ([]byte, error) {
	var enc EntryEncoder
	for i, c := range e.Commands {
		f := e.Frames[i]
		var err error
		switch {
		case f.Down:
			err = enc.AddEnqueuerDown(f.Origin.Enqueuer, f.Origin.Incarnation)
		case f.From:
			err = enc.AddFrom(f.Origin, c.(*queue.Enqueue))
		default:
			err = enc.Add(c)
		}
		if err != nil {
			return nil, err
		}
	}
	return bytes.Clone(enc.Finish(e.Header)), nil
}

// sliceBodies is a queue.BodySource over bodies kept as slices.
type sliceBodies [][]byte

func (s *sliceBodies) BodyLen(i int) int                   { return len((*s)[i]) }
func (s *sliceBodies) AppendBody(dst []byte, i int) []byte { return append(dst, (*s)[i]...) }

// TestAddEnqueueSameBytes: an Enqueue added with its bodies written by a
// BodySource (AddEnqueue, AddEnqueueFrom: one copy of each body) makes the
// very entry that Add and AddFrom make of the same Enqueue with Bodies,
// among random other commands; so entries written either way, by this
// build or an earlier one, are one format (no version change). The caps
// hold alike: a message cap refused, the encoder unchanged.
func TestAddEnqueueSameBytes(t *testing.T) {
	var a, b EntryEncoder
	for seed := uint64(0); seed < 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 2))
		h := EntryHeader{NowMs: r.Int64(), Proposer: r.Uint64(), Seq: r.Uint64()}
		a.Reset()
		b.Reset()
		for i := r.IntN(6); i > 0; i-- {
			c := randomCommand(r)
			enq, ok := c.(*queue.Enqueue)
			if !ok || enq.Bodies == nil {
				if a.Add(c) != nil || b.Add(c) != nil {
					t.Fatal("Add refused a command")
				}
				continue
			}
			src := sliceBodies(enq.Bodies)
			var ea, eb error
			if r.IntN(2) == 0 {
				o := Origin{Enqueuer: r.Uint64(), Incarnation: r.Uint64(), QSeq: r.Uint64()}
				ea, eb = a.AddFrom(o, enq), b.AddEnqueueFrom(o, enq.NowMs, enq.Msgs, &src)
			} else {
				ea, eb = a.Add(enq), b.AddEnqueue(enq.NowMs, enq.Msgs, &src)
			}
			if ea != nil || eb != nil {
				t.Fatalf("seed %d: %v, %v", seed, ea, eb)
			}
		}
		wa, wb := a.Finish(h), b.Finish(h)
		if !bytes.Equal(wa, wb) {
			t.Fatalf("seed %d: AddEnqueue's entry differs from Add's\n%x\n%x", seed, wb, wa)
		}
		if _, err := DecodeEntry(wb); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	b.Reset()
	many := make(sliceBodies, MaxEntryMessages+1)
	if err := b.AddEnqueue(0, make([]queue.Message, MaxEntryMessages+1), &many); !errors.Is(err, ErrCommandTooLarge) {
		t.Fatalf("an Enqueue past the cap: %v", err)
	}
	if err := b.AddEnqueue(0, make([]queue.Message, MaxEntryMessages-1), &many); err != nil {
		t.Fatal(err)
	}
	before := b.Len()
	if err := b.AddEnqueue(0, make([]queue.Message, 2), &many); !errors.Is(err, ErrEntryFull) || b.Len() != before || b.Commands() != 1 {
		t.Fatalf("past the message cap: %v, %d bytes (was %d)", err, b.Len(), before)
	}
}

// TestEntryCommandByteBound: an Enqueue whose entry alone would be larger
// than the log takes (segment.MaxEntry) is ErrCommandTooLarge, by Add and
// by AddEnqueue (with and without a publish-from frame's prefix), so the
// caller refuses it rather than a write failing and the node stopping;
// one at MaxCommandBytes exactly makes an entry the log takes.
func TestEntryCommandByteBound(t *testing.T) {
	var enc EntryEncoder
	at := MaxCommandBytes - (15 + 28 + 4) // the body that makes the command MaxCommandBytes
	for _, n := range []int{at, at + 1} {
		body := make([]byte, n)
		enc.Reset()
		err := enc.Add(&queue.Enqueue{Msgs: make([]queue.Message, 1), Bodies: [][]byte{body}})
		enc.Reset()
		src := sliceBodies([][]byte{body})
		err2 := enc.AddEnqueue(0, make([]queue.Message, 1), &src)
		if n == at {
			if err != nil || err2 != nil {
				t.Fatalf("a command of MaxCommandBytes: %v, %v", err, err2)
			}
			if e := enc.Finish(EntryHeader{}); len(e) > segment.MaxEntry {
				t.Fatalf("an entry of %d bytes, over segment.MaxEntry %d", len(e), segment.MaxEntry)
			}
			continue
		}
		if !errors.Is(err, ErrCommandTooLarge) || !errors.Is(err2, ErrCommandTooLarge) {
			t.Fatalf("a command one byte over MaxCommandBytes: %v, %v", err, err2)
		}
	}
}

// TestPublishFromBytes: PublishFromBytes is the length AddEnqueueFrom
// holds against MaxCommandBytes (a forwarding node nacks a message over
// it rather than send what its leader must refuse).
func TestPublishFromBytes(t *testing.T) {
	var enc EntryEncoder
	at := MaxCommandBytes - PublishFromBytes(1, 0) // the body that makes the command MaxCommandBytes
	for _, n := range []int{at, at + 1} {
		enc.Reset()
		src := sliceBodies([][]byte{make([]byte, n)})
		err := enc.AddEnqueueFrom(Origin{Enqueuer: 1, Incarnation: 1, QSeq: 1}, 0, make([]queue.Message, 1), &src)
		if over := PublishFromBytes(1, n) > MaxCommandBytes; over != errors.Is(err, ErrCommandTooLarge) || !over && err != nil {
			t.Fatalf("a publish-from of %d bytes by PublishFromBytes (bound %d): %v", PublishFromBytes(1, n), MaxCommandBytes, err)
		}
	}
}
