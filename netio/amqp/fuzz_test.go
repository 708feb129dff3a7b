package amqp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/amqp"
)

// A client session's frames, written by hand: the seeds of FuzzConn.
func mframe(ch, class, id uint16, args ...[]byte) []byte {
	p := binary.BigEndian.AppendUint16(nil, class)
	p = binary.BigEndian.AppendUint16(p, id)
	for _, a := range args {
		p = append(p, a...)
	}
	return rawFrame(1, ch, p)
}

func rawFrame(typ byte, ch uint16, p []byte) []byte {
	b := binary.BigEndian.AppendUint16([]byte{typ}, ch)
	b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
	return append(append(b, p...), 0xCE)
}

func sstr(s string) []byte   { return append([]byte{byte(len(s))}, s...) }
func u16b(v uint16) []byte   { return binary.BigEndian.AppendUint16(nil, v) }
func u64b(v uint64) []byte   { return binary.BigEndian.AppendUint64(nil, v) }
func ftable(e []byte) []byte { return append(binary.BigEndian.AppendUint32(nil, uint32(len(e))), e...) }

// contentFrames is a basic.publish's header (content type, headers,
// delivery mode 2, priority, message id, timestamp) and body.
func contentFrames(ch uint16, body string, headers []byte) []byte {
	h := u16b(60)
	h = append(h, 0, 0)
	h = append(h, u64b(uint64(len(body)))...)
	h = append(h, u16b(1<<15|1<<13|1<<12|1<<11|1<<7|1<<6)...)
	h = append(h, sstr("text/plain")...)
	h = append(h, ftable(headers)...)
	h = append(h, 2, 5)
	h = append(h, sstr("m1")...)
	h = append(h, u64b(1700000000)...)
	out := rawFrame(2, ch, h)
	if body != "" {
		out = append(out, rawFrame(3, ch, []byte(body))...)
	}
	return out
}

func connSeeds() [][]byte {
	cat := func(fs ...[]byte) []byte {
		var b []byte
		for _, f := range fs {
			b = append(b, f...)
		}
		return b
	}
	hdrs := cat(sstr("h"), []byte{'S'}, ftable([]byte("v")),
		sstr("n"), []byte{'I', 0, 0, 0, 7},
		sstr("x-death"), []byte{'A'}, ftable(cat([]byte{'F'}, ftable(cat(sstr("count"), []byte{'l'}, u64b(1))))))
	open := mframe(1, 20, 10, sstr(""))
	session := cat(open,
		mframe(1, 40, 10, u16b(0), sstr("fx"), sstr("direct"), []byte{0}, ftable(nil)),
		mframe(1, 50, 10, u16b(0), sstr("fq"), []byte{0}, ftable(cat(sstr("x-max-length"), []byte{'I', 0, 0, 0, 100}))),
		mframe(1, 50, 20, u16b(0), sstr("fq"), sstr("fx"), sstr("k"), []byte{0}, ftable(nil)),
		mframe(1, 85, 10, []byte{0}),
		mframe(1, 60, 40, u16b(0), sstr("fx"), sstr("k"), []byte{0}),
		contentFrames(1, "hello", hdrs),
		mframe(1, 60, 10, []byte{0, 0, 0, 0}, u16b(10), []byte{0}),
		mframe(1, 60, 20, u16b(0), sstr("fq"), sstr("ct"), []byte{0}, ftable(nil)),
		mframe(1, 60, 80, u64b(1), []byte{0}),
		mframe(1, 60, 30, sstr("ct"), []byte{0}),
		mframe(1, 20, 40, u16b(200), sstr("bye"), u16b(0), u16b(0)),
	)
	get := cat(open,
		mframe(1, 50, 10, u16b(0), sstr(""), []byte{1 << 3}, ftable(nil)),
		mframe(1, 60, 40, u16b(0), sstr(""), sstr("fq"), []byte{0}),
		contentFrames(1, "", nil),
		mframe(1, 60, 70, u16b(0), sstr("fq"), []byte{0}),
		mframe(1, 60, 120, u64b(1), []byte{3}),
		mframe(1, 60, 70, u16b(0), sstr("fq"), []byte{1}),
		mframe(1, 60, 90, u64b(2), []byte{0}),
		mframe(1, 60, 110, []byte{1}),
		mframe(1, 50, 30, u16b(0), sstr("fq"), []byte{0}),
	)
	tx := cat(open,
		mframe(1, 90, 10),
		mframe(1, 60, 40, u16b(0), sstr(""), sstr("fq"), []byte{1}),
		contentFrames(1, "t", nil),
		mframe(1, 90, 20),
		mframe(1, 90, 30),
		mframe(1, 40, 30, u16b(0), sstr("fx"), sstr("amq.fanout"), sstr(""), []byte{0}, ftable(nil)),
		mframe(1, 40, 40, u16b(0), sstr("fx"), sstr("amq.fanout"), sstr(""), []byte{0}, ftable(nil)),
		mframe(1, 50, 50, u16b(0), sstr("fq"), sstr("fx"), sstr("k"), ftable(nil)),
		mframe(1, 20, 20, []byte{1}),
	)
	return [][]byte{
		session,
		get,
		tx,
		cat(open, mframe(1, 60, 40, u16b(0), sstr(""), sstr("fq"), []byte{0}), rawFrame(2, 1, cat(u16b(60), u16b(0), u64b(16<<20), u16b(0)))),
		cat(open, mframe(2, 20, 10, sstr(""))),
		rawFrame(1, 1, nil),
		rawFrame(8, 0, nil),
		rawFrame(3, 0, []byte("x")),
		{1, 0, 1, 0xff, 0xff, 0xff, 0xff},
	}
}

// fuzzAddr starts a broker for a fuzz target (frame-max 131072, and cfg's
// other settings): its AMQP address.
func fuzzAddr(f *testing.F, cfg amqp.Config) string {
	cfg.FrameMax = 131072
	_, l, _ := startWith(f, netio.Config{}, cfg)
	return l.Addr().String()
}

// FuzzConn feeds a broker's AMQP listener a client's bytes after a valid
// handshake (written by the target: start-ok, tune-ok with frame-max
// 131072 and no heartbeats, open), then the input, completed to a whole
// frame, then a connection.close. It reads the broker's frames until it
// closes the socket, answering a connection.close with close-ok: the
// 10 s deadline on the socket catches a broker that hangs, and is no
// wait. The broker must not panic (that ends the process); every
// connection.close and channel.close carries a reply code with its text,
// and never internal_error; and a fresh client can still connect,
// declare, publish and get a message (checked every 16 inputs, and at
// the first). With WARREN_FUZZ_COUNT=FILE the worker writes the inputs it
// has run to FILE (go test -fuzz's execs count lags behind).
func FuzzConn(f *testing.F) {
	for _, s := range connSeeds() {
		f.Add(s)
	}
	addr := fuzzAddr(f, amqp.Config{})
	url := "amqp://guest:guest@" + addr + "/"
	n := 0
	f.Fuzz(func(t *testing.T, data []byte) {
		runInput(t, addr, url, completeFrames(data, 131072), &n)
	})
}

// FuzzConnFrames is FuzzConn with the frames' lengths and frame-end
// octets kept right, so that mutations reach the methods' arguments more
// often than the framing: the input is a run of records, each frame type
// u8, channel u16, payload length u16 (big-endian) and the payload; a
// record cut short ends the run. Its broker holds a connection's
// publishes at 2 unconfirmed (the default is 10000), so that the hold
// and the scan for a close behind it are fuzzed too.
func FuzzConnFrames(f *testing.F) {
	for _, s := range connSeeds() {
		f.Add(frameRecords(s))
	}
	addr := fuzzAddr(f, amqp.Config{MaxUnconfirmed: 2})
	url := "amqp://guest:guest@" + addr + "/"
	n := 0
	f.Fuzz(func(t *testing.T, data []byte) {
		var in []byte
		for len(data) >= 5 {
			size := int(binary.BigEndian.Uint16(data[3:]))
			if len(data)-5 < size {
				break
			}
			in = append(in, rawFrame(data[0], binary.BigEndian.Uint16(data[1:]), data[5:5+size])...)
			data = data[5+size:]
		}
		runInput(t, addr, url, in, &n)
	})
}

// frameRecords turns whole frames into FuzzConnFrames' records.
func frameRecords(frames []byte) []byte {
	var out []byte
	for len(frames) >= 8 {
		size := int(binary.BigEndian.Uint32(frames[3:]))
		if size > 0xffff || len(frames) < size+8 {
			break
		}
		out = append(out, frames[:3]...)
		out = binary.BigEndian.AppendUint16(out, uint16(size))
		out = append(out, frames[7:7+size]...)
		frames = frames[size+8:]
	}
	return out
}

// runInput writes in on a fresh open connection, then connection.close,
// reads until the broker closes, and every 16 inputs checks that a client
// still gets its work done.
func runInput(t *testing.T, addr, url string, in []byte, n *int) {
	nc := rawConn(t, addr)
	in = append(in, mframe(0, 10, 50, u16b(200), sstr("done"), u16b(0), u16b(0))...)
	werr := make(chan error, 1)
	go func() {
		_, err := nc.Write(in)
		werr <- err
	}()
	began := time.Now()
	readUntilClosed(t, nc)
	took := time.Since(began)
	if err := <-werr; err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("writing the input: %v", err)
	}
	if *n%16 == 0 {
		healthy(t, url, *n)
	}
	*n++
	if tr := os.Getenv("WARREN_FUZZ_COUNT"); tr != "" {
		_ = os.WriteFile(tr, []byte(strconv.Itoa(*n)), 0o644) // the inputs this worker ran
		if took > 500*time.Millisecond {                      // and the slow ones
			fh, _ := os.OpenFile(tr+".slow", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			_, _ = fmt.Fprintf(fh, "%v %q\n", took, in)
			_ = fh.Close()
		}
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// completeFrames is data with its last frame made whole (zeros: its
// frame-end octet is wrong, which the broker refuses), so that a
// connection.close after it is read as a frame of its own. A frame over
// frame-max ends the connection where it is.
func completeFrames(data []byte, frameMax int) []byte {
	out := append([]byte(nil), data...)
	off := 0
	for off < len(out) {
		if len(out)-off < 7 {
			out = append(out, make([]byte, 7-(len(out)-off))...)
		}
		size := int(binary.BigEndian.Uint32(out[off+3:])) + 8
		if size > frameMax {
			return out
		}
		if len(out)-off < size {
			out = append(out, make([]byte, size-(len(out)-off))...)
		}
		off += size
	}
	return out
}

// readUntilClosed reads frames until the broker closes the connection,
// checking each close it sends.
func readUntilClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	_ = nc.SetDeadline(time.Now().Add(deadline))
	for {
		var h [7]byte
		if _, err := io.ReadFull(nc, h[:]); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the broker neither closed nor answered within %v", deadline)
			}
			return // closed (EOF or reset)
		}
		size := binary.BigEndian.Uint32(h[3:])
		if size > 131072-8 {
			t.Fatalf("the broker sent a frame of %d bytes, over frame-max", size+8)
		}
		p := make([]byte, size+1)
		if _, err := io.ReadFull(nc, p); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the broker stopped within a frame for %v", deadline)
			}
			return
		}
		if p[size] != 0xCE {
			t.Fatalf("the broker sent a frame ending 0x%x", p[size])
		}
		p = p[:size]
		if h[0] != 1 || len(p) < 4 {
			continue
		}
		class, id := binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:])
		ch := binary.BigEndian.Uint16(h[1:])
		if (class == 10 && id == 50) || (class == 20 && id == 40) {
			args := p[4:]
			if len(args) < 3 || len(args) < 3+int(args[2])+4 {
				t.Fatalf("close %d.%d malformed: % x", class, id, args)
			}
			code, text := binary.BigEndian.Uint16(args), string(args[3:3+int(args[2])])
			if code < 300 || code == 541 || text == "" {
				t.Fatalf("%d.%d with reply code %d %q", class, id, code, text)
			}
			if class == 10 {
				_, _ = nc.Write(mframe(0, 10, 51))
			} else {
				_, _ = nc.Write(mframe(ch, 20, 41))
			}
		}
	}
}

// healthy checks that a well-behaved client still gets its work done
// within the deadline (amqp091's calls have none of their own: a broker
// that stopped answering would hang the target).
func healthy(t *testing.T, url string, n int) {
	t.Helper()
	failed := make(chan string, 1)
	go func() { failed <- checkHealthy(url, n) }()
	select {
	case why := <-failed:
		if why != "" {
			t.Fatal("after the input, " + why)
		}
	case <-time.After(2 * deadline):
		t.Fatalf("after the input, a client's connect, declare, publish and get took over %v", 2*deadline)
	}
}

func checkHealthy(url string, n int) string {
	c, err := amqp091.DialConfig(url, amqp091.Config{Dial: amqp091.DefaultDial(deadline)})
	if err != nil {
		return fmt.Sprintf("a client cannot connect: %v", err)
	}
	defer c.CloseDeadline(time.Now().Add(deadline))
	ch, err := c.Channel()
	if err != nil {
		return fmt.Sprintf("a client cannot open a channel: %v", err)
	}
	q, err := ch.QueueDeclare("health-"+strconv.Itoa(n), false, true, true, false, nil)
	if err != nil {
		return fmt.Sprintf("a client cannot declare: %v", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Sprintf("a client cannot select confirms: %v", err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q.Name, false, false, amqp091.Publishing{Body: []byte("ok")})
	if err != nil {
		return fmt.Sprintf("a client cannot publish: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		return fmt.Sprintf("a publish is not confirmed: %v %v", ok, err)
	}
	d, ok, err := ch.Get(q.Name, true)
	if err != nil || !ok || string(d.Body) != "ok" {
		return fmt.Sprintf("a client's get: %q %v %v, want the message it published", d.Body, ok, err)
	}
	return ""
}
