package amqp

// Fuzz targets for the AMQP front's decoders that need no connection:
// field tables (parseTable, and appendWarrenEntries, the publish path's
// transcoder), content headers (parseHeader, with appendHeader's way back)
// and queue arguments (queueArgs). The seeds run as plain tests in go test;
// make fuzz runs each for $(FUZZTIME).

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/wire"
)

// heapAllocs is the bytes the runtime has allocated so far (all
// goroutines; the fuzz worker runs one input at a time). ReadMemStats
// flushes the per-P caches; runtime/metrics counts a cached span's bytes
// at its refill, hundreds of KiB off.
func heapAllocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// allocBound is what decoding n input bytes may allocate: a constant
// factor of the input, never a declared length it does not contain. The
// factor is generous (an array of one-byte null values becomes a
// wire.Value of 96 bytes per input byte, doubled by append's growth): a
// length of 2^32-1 in a short input is what it is there to catch.
func allocBound(n int) uint64 { return 512*uint64(n) + 64<<10 }

// checkAllocs runs f and fails if it allocated more than allocBound(n)
// twice running (once could be another goroutine's; a declared length
// is allocated every time).
func checkAllocs(t *testing.T, n int, what string, f func()) {
	t.Helper()
	before := heapAllocs()
	f()
	got := heapAllocs() - before
	if got <= allocBound(n) {
		return
	}
	before = heapAllocs()
	f()
	if again := heapAllocs() - before; again > allocBound(n) {
		t.Fatalf("%s of %d input bytes allocated %d bytes, then %d (bound %d)", what, n, got, again, allocBound(n))
	}
}

// checkErr fails unless err is an AMQP error with a reply code and text.
func checkErr(t *testing.T, err error) *amqpError {
	t.Helper()
	ae, ok := err.(*amqpError)
	if !ok || ae == nil {
		t.Fatalf("error %T %v is not an AMQP error", err, err)
	}
	if ae.code < 300 || ae.code > 599 || replyName(ae.code) == "INTERNAL_ERROR" && ae.code != internalError || ae.text == "" {
		t.Fatalf("AMQP error %d %q: want a known reply code and its text", ae.code, ae.text)
	}
	if !strings.HasPrefix(ae.text, replyName(ae.code)+" - ") {
		t.Fatalf("AMQP error %d %q does not begin with its name %s", ae.code, ae.text, replyName(ae.code))
	}
	return ae
}

// sameValue compares two decoded values; floats by their bits (NaN is
// itself), an empty slice as nil.
func sameVal(a, b *wire.Value) bool {
	if a.Kind != b.Kind || a.Int != b.Int || math.Float64bits(a.Float) != math.Float64bits(b.Float) ||
		!bytes.Equal(a.Bytes, b.Bytes) || len(a.Array) != len(b.Array) || !sameTable(a.Table, b.Table) {
		return false
	}
	for i := range a.Array {
		if !sameVal(&a.Array[i], &b.Array[i]) {
			return false
		}
	}
	return true
}

func sameTable(a, b wire.Table) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !sameVal(&a[i].Value, &b[i].Value) {
			return false
		}
	}
	return true
}

// Hand-written AMQP field values, every type the spec has (putValue
// writes only the usual one of each kind).
func fv(tag byte, payload ...byte) []byte { return append([]byte{tag}, payload...) }

func fentry(key string, value []byte) []byte {
	return append(append([]byte{byte(len(key))}, key...), value...)
}

func flong(tag byte, body []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{tag}, uint32(len(body))), body...)
}

// seedTables are field tables' entries (without the table's length).
func seedTables() [][]byte {
	all := bytes.Join([][]byte{
		fentry("t", fv('t', 1)),
		fentry("b", fv('b', 0x80)),
		fentry("B", fv('B', 0xff)),
		fentry("s", fv('s', 0x80, 0)),
		fentry("u", fv('u', 0xff, 0xff)),
		fentry("I", fv('I', 0x80, 0, 0, 0)),
		fentry("i", fv('i', 0xff, 0xff, 0xff, 0xff)),
		fentry("l", fv('l', 0x80, 0, 0, 0, 0, 0, 0, 1)),
		fentry("L", fv('L', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)),
		fentry("f", fv('f', 0x3f, 0xc0, 0, 0)),
		fentry("d", fv('d', 0x7f, 0xf8, 0, 0, 0, 0, 0, 1)),
		fentry("D", fv('D', 2, 0, 0, 0x30, 0x39)),
		fentry("S", flong('S', []byte("text"))),
		fentry("x", flong('x', []byte{0, 1, 2})),
		fentry("T", fv('T', 0, 0, 0, 0, 0x65, 0x53, 0xf1, 0x00)),
		fentry("V", fv('V')),
		fentry("F", flong('F', fentry("in", flong('S', []byte("v"))))),
		fentry("A", flong('A', bytes.Join([][]byte{fv('b', 1), flong('S', []byte("a")), flong('A', fv('V')), flong('F', nil)}, nil))),
	}, nil)
	deep := fentry("k", fv('V'))
	for range maxTableDepth + 1 {
		deep = fentry("n", flong('F', deep))
	}
	return [][]byte{
		nil,
		all,
		deep,
		fentry("x-death", flong('A', flong('F', bytes.Join([][]byte{
			fentry("count", fv('l', 0, 0, 0, 0, 0, 0, 0, 2)),
			fentry("queue", flong('S', []byte("q"))),
			fentry("routing-keys", flong('A', flong('S', []byte("k")))),
		}, nil)))),
		fentry("x-delivery-count", fv('l', 0, 0, 0, 0, 0, 0, 0, 3)),
		// Lengths past the end, and the largest a u32 can say.
		fentry("S", fv('S', 0xff, 0xff, 0xff, 0xff, 'a')),
		fentry("x", fv('x', 0, 0, 1, 0)),
		fentry("F", fv('F', 0xff, 0xff, 0xff, 0xff)),
		fentry("A", fv('A', 0xff, 0xff, 0xff, 0xff, 'V')),
		{0xff, 'k'},
		fentry("?", fv('Z')),
	}
}

// FuzzParseTable: a field table never panics the decoder, allocates only
// in proportion to its bytes, fails with syntax_error, and what decodes
// encodes (putTable) to a table that decodes to the same value. Warren's
// transcoder of publish headers (appendWarrenEntries) takes and refuses
// the same tables, and its output is a valid Warren table.
func FuzzParseTable(f *testing.F) {
	for _, s := range seedTables() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var tab wire.Table
		var err error
		checkAllocs(t, len(data), "parseTable", func() { tab, err = parseTable(data, 0) })
		var dst, sig []byte
		var werr error
		checkAllocs(t, len(data), "appendWarrenEntries", func() { sig = nil; dst, werr = appendWarrenEntries(nil, data, 0, &sig) })
		if (err == nil) != (werr == nil) {
			t.Fatalf("parseTable: %v; appendWarrenEntries: %v", err, werr)
		}
		if err != nil {
			if ae := checkErr(t, err); ae.code != syntaxError || !ae.conn {
				t.Fatalf("parseTable refused with %d (conn %v), want connection error syntax_error", ae.code, ae.conn)
			}
			checkErr(t, werr)
			return
		}
		// The transcoded table is a valid Warren table with the same
		// values (AMQP's widths are in sig, not in the table), unless it
		// nests deeper than Warren's tables may (wire.MaxTableDepth, less
		// than AMQP's maxTableDepth): ParseProperties refuses those, and
		// a publish with them gets precondition_failed.
		wt, derr := wire.DecodeTable(dst)
		if derr != nil && !strings.Contains(derr.Error(), "nesting too deep") {
			t.Fatalf("appendWarrenEntries wrote an invalid Warren table: %v", derr)
		}
		if derr == nil && !sameTable(wt, tab) {
			t.Fatalf("appendWarrenEntries decodes to\n%v\nparseTable to\n%v", wt, tab)
		}
		enc := putTable(nil, tab)
		if n := binary.BigEndian.Uint32(enc); int(n) != len(enc)-4 {
			t.Fatalf("putTable's length %d, wrote %d", n, len(enc)-4)
		}
		again, err := parseTable(enc[4:], 0)
		if err != nil {
			t.Fatalf("putTable's encoding of %v does not decode: %v", tab, err)
		}
		if !sameTable(tab, again) {
			t.Fatalf("round trip differs:\n%v\n%v", tab, again)
		}
	})
}

// seedHeaders are content header payloads from the property flags on
// (parseHeader's input: flags, then the values).
func seedHeaders() [][]byte {
	str := func(s string) []byte { return append([]byte{byte(len(s))}, s...) }
	table := func(entries []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(entries))), entries...)
	}
	all := binary.BigEndian.AppendUint16(nil, 0xfffc)
	all = append(all, str("text/plain")...)
	all = append(all, str("gzip")...)
	all = append(all, table(seedTables()[1])...)
	all = append(all, 2, 7)
	all = append(all, str("corr")...)
	all = append(all, str("reply")...)
	all = append(all, str("60000")...)
	all = append(all, str("mid")...)
	all = binary.BigEndian.AppendUint64(all, 1700000000)
	all = append(all, str("type")...)
	all = append(all, str("guest")...)
	all = append(all, str("app")...)
	all = append(all, str("cluster")...)
	hdrs := binary.BigEndian.AppendUint16(nil, flHeaders|flDeliveryMode)
	hdrs = append(hdrs, table(seedTables()[3])...)
	hdrs = append(hdrs, 1)
	seeds := [][]byte{
		{0, 0},
		all,
		hdrs,
		append(binary.BigEndian.AppendUint16(nil, flReplyTo), str(replyQueue)...),
		append(binary.BigEndian.AppendUint16(nil, flExpiration), str("-1")...),
		append(binary.BigEndian.AppendUint16(nil, flHeaders), table(seedTables()[2])...),
		append(binary.BigEndian.AppendUint16(nil, flHeaders), 0xff, 0xff, 0xff, 0xff),
		{0, 1},
		{0xff, 0xff},
	}
	for _, s := range seedTables() {
		seeds = append(seeds, append(binary.BigEndian.AppendUint16(nil, flHeaders), table(s)...))
	}
	return seeds
}

// FuzzParseHeader: a content header never panics parseHeader, allocates
// in proportion to its bytes, fails with an AMQP error, and what it takes
// is a valid Warren property block that the header a consumer gets
// (appendHeader) carries back unchanged: parsing that header again gives
// the same block, persistence and priority. The message's death history,
// written as x-death, replaces any x-death header the publisher sent.
func FuzzParseHeader(f *testing.F) {
	for _, s := range seedHeaders() {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, direct bool) {
		replyName := ""
		if direct {
			replyName = replyPrefix + "fuzz"
		}
		var in inbound
		var sc pubScratch
		var ae *amqpError
		checkAllocs(t, len(data), "parseHeader", func() { in, sc = inbound{}, pubScratch{}; ae = parseHeader(&reader{b: data}, &in, &sc, replyName) })
		if ae != nil {
			checkErr(t, ae)
			return
		}
		var p wire.Properties
		if err := wire.ParseProperties(in.props, &p); err != nil {
			t.Fatalf("parseHeader's block does not parse: %v", err)
		}
		props := append([]byte(nil), in.props...)
		m := broker.NewStoredMsg(nil, nil, props, nil, in.flags, in.priority)
		frame := appendHeader(nil, 1, m, 1)
		// Type, channel, size; class, weight, body size; then what
		// parseHeader reads; the frame end.
		if len(frame) < 7+12+1 || frame[len(frame)-1] != frameEnd || int(binary.BigEndian.Uint32(frame[3:])) != len(frame)-8 {
			t.Fatalf("appendHeader wrote a malformed frame % x", frame)
		}
		var in2 inbound
		var sc2 pubScratch
		if ae := parseHeader(&reader{b: frame[7+12 : len(frame)-1]}, &in2, &sc2, replyName); ae != nil {
			t.Fatalf("the delivered header of % x does not parse: %v", data, ae)
		}
		if !bytes.Equal(in2.props, props) || in2.flags != in.flags || in2.priority != in.priority {
			t.Fatalf("round trip differs:\n% x flags %v priority %d\n% x flags %v priority %d", props, in.flags, in.priority, in2.props, in2.flags, in2.priority)
		}
		// With a death history, x-death and the x-first-death-* headers
		// are Warren's, once each, whatever the publisher sent.
		if !p.Has(wire.PropDeaths) {
			p.Deaths = wire.AppendDeaths(nil, []wire.Death{{Queue: "dq", Reason: wire.ReasonExpired, Count: 1, Exchange: "dx", RoutingKeys: []string{"k"}}})
			p.Set(wire.PropDeaths)
			block := wire.AppendProperties(nil, &p)
			if len(block)-2 > wire.MaxPropertiesLen {
				return
			}
			m = broker.NewStoredMsg(nil, nil, block[2:], nil, in.flags, in.priority)
			frame = appendHeader(nil, 1, m, 3)
			hr := &reader{b: frame[7+12 : len(frame)-1]}
			fl := hr.u16()
			for _, f := range []uint16{flContentType, flContentEncoding} {
				if fl&f != 0 {
					hr.shortstr()
				}
			}
			if fl&flHeaders == 0 {
				t.Fatal("a message with deaths delivered without headers")
			}
			tab := hr.table()
			if hr.err != nil {
				t.Fatalf("the delivered headers do not parse: %v", hr.err)
			}
			seen := map[string]int{}
			for _, f := range tab {
				seen[f.Key]++
			}
			for _, k := range []string{"x-death", "x-first-death-queue", "x-first-death-reason", "x-first-death-exchange", "x-delivery-count"} {
				if seen[k] != 1 {
					t.Fatalf("%s delivered %d times in %v", k, seen[k], tab)
				}
			}
			if v, _ := tab.Get("x-delivery-count"); v.Kind != wire.KindInt || v.Int != 2 {
				t.Fatalf("x-delivery-count %v, want 2", v)
			}
			if v, _ := tab.Get("x-first-death-queue"); string(v.Bytes) != "dq" {
				t.Fatalf("x-first-death-queue %v, want dq", v)
			}
		}
	})
}

// FuzzQueueArgs: a queue.declare's arguments never panic queueArgs; a
// refusal is a channel error precondition_failed naming the argument, and
// what it takes is Warren's queue arguments, which wire.ParseQueueArgs
// takes, in Warren's order.
func FuzzQueueArgs(f *testing.F) {
	seed := func(entries ...[]byte) { f.Add(bytes.Join(entries, nil)) }
	i32 := func(v int32) []byte { return binary.BigEndian.AppendUint32([]byte{'I'}, uint32(v)) }
	for _, m := range queueArgMap {
		seed(fentry(m.amqp, i32(1000)))
		seed(fentry(m.amqp, flong('S', []byte("x"))))
	}
	seed(fentry("x-queue-type", flong('S', []byte("quorum"))), fentry("x-max-length", i32(10)), fentry("x-overflow", flong('S', []byte("reject-publish"))))
	seed(fentry("x-queue-type", flong('S', []byte("classic"))), fentry("x-message-ttl", i32(-1)))
	seed(fentry("x-max-priority", fv('B', 255)), fentry("x-max-priority", fv('b', 1)))
	seed(fentry("x-dead-letter-exchange", flong('S', []byte("dlx"))), fentry("x-dead-letter-routing-key", flong('x', []byte("k"))))
	seed(fentry("x-single-active-consumer", fv('t', 1)), fentry("x-delivery-limit", fv('l', 0, 0, 0, 0, 0, 0, 0, 5)))
	seed(fentry("x-queue-mode", flong('S', []byte("lazy"))))
	seed(fentry("x-expires", fv('d', 0x40, 0x8f, 0x40, 0, 0, 0, 0, 0)))
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := parseTable(data, 0)
		if err != nil {
			return
		}
		out, quorum, ae := queueArgs(tab, "queue 'q' in vhost '/'")
		if ae != nil {
			checkErr(t, ae)
			if ae.code != preconditionFailed || ae.conn {
				t.Fatalf("queueArgs refused with %d (conn %v), want channel error precondition_failed", ae.code, ae.conn)
			}
			return
		}
		if _, err := wire.ParseQueueArgs(out); err != nil {
			t.Fatalf("queueArgs took %v as %v, which Warren refuses: %v", tab, out, err)
		}
		if v, ok := out.Get("replicas"); quorum != (ok && v.Int == quorumReplicas) {
			t.Fatalf("quorum %v with %v", quorum, out)
		}
		last := -1
		for _, f := range out {
			at := -1
			for i, d := range wire.QueueArgDescs() {
				if d.Key == f.Key {
					at = i
				}
			}
			if at < last {
				t.Fatalf("queue arguments %v out of Warren's order", out)
			}
			last = at
		}
	})
}

// FuzzMethods feeds frames straight to a connection's handler (conn.handle,
// as the event loop and its off-loop runs call it), without a socket: one
// broker, a fresh open connection per input, the input a run of records
// as FuzzConnFrames reads them (frame type u8, channel u16, payload
// length u16, payload), handled until the first error. Every error is the
// client's (errClientClosed) or an AMQP error with a reply code, its name
// and never internal_error; every channel.close the connection writes
// carries one too; and no input takes over 10 s (a hang panics, naming
// it). Once done the connection closes, as when its socket goes.
func FuzzMethods(f *testing.F) {
	seeds := [][]byte{
		rec(frameMethod, 1, method2(classChannel, 10, []byte{0})),
	}
	open := seeds[0]
	qdecl := rec(frameMethod, 1, method2(classQueue, 10, []byte{0, 0, 2, 'm', 'q', 0, 0, 0, 0, 0}))
	pub := rec(frameMethod, 1, method2(classBasic, 40, []byte{0, 0, 0, 2, 'm', 'q', 0}))
	hdr := binary.BigEndian.AppendUint16(nil, classBasic)
	hdr = append(hdr, 0, 0)
	hdr = binary.BigEndian.AppendUint64(hdr, 2)
	hdr = append(hdr, seedHeaders()[1]...)
	content := append(rec(frameHeader, 1, hdr), rec(frameBody, 1, []byte("hi"))...)
	seeds = append(seeds,
		bytes.Join([][]byte{open, qdecl, pub, content,
			rec(frameMethod, 1, method2(classBasic, 70, []byte{0, 0, 2, 'm', 'q', 0})),
			rec(frameMethod, 1, method2(classBasic, 80, append(binary.BigEndian.AppendUint64(nil, 1), 0))),
			rec(frameMethod, 1, method2(classBasic, 20, []byte{0, 0, 2, 'm', 'q', 1, 'c', 0, 0, 0, 0, 0})),
			rec(frameMethod, 1, method2(classBasic, 30, []byte{1, 'c', 0})),
			rec(frameMethod, 1, method2(classQueue, 40, []byte{0, 0, 2, 'm', 'q', 0})),
		}, nil),
		bytes.Join([][]byte{open, rec(frameMethod, 1, method2(classConfirm, 10, []byte{0})), qdecl, pub, content, pub, content, pub, content}, nil),
		bytes.Join([][]byte{open, rec(frameMethod, 1, method2(classTx, 10, nil)), qdecl, pub, content,
			rec(frameMethod, 1, method2(classTx, 20, nil)), rec(frameMethod, 1, method2(classTx, 30, nil))}, nil),
		bytes.Join([][]byte{open, rec(frameMethod, 1, method2(classExchange, 10, []byte{0, 0, 2, 'm', 'x', 6, 'f', 'a', 'n', 'o', 'u', 't', 0, 0, 0, 0, 0})),
			qdecl, rec(frameMethod, 1, method2(classQueue, 20, []byte{0, 0, 2, 'm', 'q', 2, 'm', 'x', 0, 0, 0, 0, 0, 0}))}, nil),
		bytes.Join([][]byte{open, rec(frameMethod, 1, method2(classChannel, 40, []byte{0, 200, 0, 0, 0, 0, 0}))}, nil),
	)
	for _, s := range seeds {
		f.Add(s)
	}
	srv, err := netio.Start(netio.Config{Addr: "127.0.0.1:0", Shards: 2, EventLoops: 1})
	if err != nil {
		f.Fatal(err)
	}
	l, err := Listen(srv, Config{Addr: "127.0.0.1:0", MaxUnconfirmed: 4})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close()
		_ = srv.Close(ctx)
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := append([]byte(nil), data...)
		hung := time.AfterFunc(10*time.Second, func() { panic(fmt.Sprintf("FuzzMethods: input %q hung", in)) })
		defer hung.Stop()
		c := newConn(l, netip.MustParseAddrPort("127.0.0.1:1"))
		c.user, c.channelMax = "guest", 2047
		c.opened.Store(true)
		c.state.Store(stOpen)
		defer c.OnClose(nil, nil)
		for len(data) >= 5 {
			size := int(binary.BigEndian.Uint16(data[3:]))
			if len(data)-5 < size {
				break
			}
			typ, ch, p := data[0], binary.BigEndian.Uint16(data[1:]), data[5:5+size]
			data = data[5+size:]
			err := c.handle(typ, ch, p)
			if err == nil {
				continue
			}
			if !errors.Is(err, errClientClosed) {
				if ae := checkErr(t, err); ae.code == internalError {
					t.Fatalf("internal_error: %s", ae.text)
				}
			}
			break
		}
		c.mu.Lock()
		out := append([]byte(nil), c.out...)
		c.mu.Unlock()
		for len(out) > 0 {
			if len(out) < 8 {
				t.Fatalf("a frame cut short: % x", out)
			}
			n := int(binary.BigEndian.Uint32(out[3:]))
			if len(out) < n+8 || out[n+7] != frameEnd {
				t.Fatalf("a malformed frame: % x", out[:min(len(out), 64)])
			}
			p := out[7 : 7+n]
			if out[0] == frameMethod && n >= 4 && binary.BigEndian.Uint16(p) == classChannel && binary.BigEndian.Uint16(p[2:]) == 40 {
				r := reader{b: p[4:]}
				code, text := r.u16(), r.shortstr()
				checkErr(t, &amqpError{code: code, text: text})
				if code == internalError {
					t.Fatalf("channel.close internal_error: %s", text)
				}
			}
			out = out[n+8:]
		}
	})
}

// rec is one of FuzzMethods' records.
func rec(typ byte, ch uint16, p []byte) []byte {
	b := binary.BigEndian.AppendUint16([]byte{typ}, ch)
	b = binary.BigEndian.AppendUint16(b, uint16(len(p)))
	return append(b, p...)
}

func method2(class, id uint16, args []byte) []byte {
	p := binary.BigEndian.AppendUint16(nil, class)
	p = binary.BigEndian.AppendUint16(p, id)
	return append(p, args...)
}
