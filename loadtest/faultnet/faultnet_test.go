package faultnet

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes every connection and reports what it received.
func echoServer(t *testing.T) (string, <-chan []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan []byte, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 1024)
				for {
					n, err := c.Read(b)
					if n > 0 {
						got <- append([]byte(nil), b[:n]...)
						if _, err := c.Write(b[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), got
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func readN(t *testing.T, c net.Conn, n int, within time.Duration) (string, error) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(within))
	b := make([]byte, n)
	_, err := io.ReadFull(c, b)
	return string(b), err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

const quiet = 150 * time.Millisecond // how long "nothing arrives" is watched

func TestForwardsBothWays(t *testing.T) {
	target, got := echoServer(t)
	p, err := Listen("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dial(t, p)
	_, _ = c.Write([]byte("hello"))
	if s, err := readN(t, c, 5, 5*time.Second); err != nil || s != "hello" {
		t.Fatalf("echo %q %v", s, err)
	}
	if b := <-got; string(b) != "hello" {
		t.Fatalf("target got %q", b)
	}
}

// TestPartitionOneWay: a forward cut keeps the bytes from the target
// until healed; a backward cut lets them reach it but holds the reply.
// Nothing is lost or reordered.
func TestPartitionOneWay(t *testing.T) {
	target, got := echoServer(t)
	p, err := Listen("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dial(t, p)
	p.Partition(Forward)
	_, _ = c.Write([]byte("abc"))
	select {
	case b := <-got:
		t.Fatalf("target got %q through a forward partition", b)
	case <-time.After(quiet):
	}
	p.Heal()
	if s, err := readN(t, c, 3, 5*time.Second); err != nil || s != "abc" {
		t.Fatalf("after heal: %q %v", s, err)
	}
	<-got

	p.Partition(Backward)
	_, _ = c.Write([]byte("xyz"))
	select {
	case b := <-got:
		if string(b) != "xyz" {
			t.Fatalf("target got %q", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a backward partition stopped the forward bytes")
	}
	if _, err := readN(t, c, 3, quiet); !isTimeout(err) {
		t.Fatalf("reply came through a backward partition: %v", err)
	}
	p.Heal()
	if s, err := readN(t, c, 3, 5*time.Second); err != nil || s != "xyz" {
		t.Fatalf("after heal: %q %v", s, err)
	}
}

func TestDelay(t *testing.T) {
	target, _ := echoServer(t)
	p, err := Listen("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dial(t, p)
	p.SetDelay(100*time.Millisecond, 50*time.Millisecond)
	start := time.Now()
	for i := 0; i < 5; i++ {
		_, _ = c.Write([]byte{byte('0' + i)})
	}
	if s, err := readN(t, c, 5, 10*time.Second); err != nil || s != "01234" {
		t.Fatalf("delayed echo %q %v (order must be kept)", s, err)
	}
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Fatalf("round trip %v with 100 ms each way", el)
	}
}

func TestResetAndDrop(t *testing.T) {
	target, _ := echoServer(t)
	p, err := Listen("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dial(t, p)
	_, _ = c.Write([]byte("x"))
	if _, err := readN(t, c, 1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Reset()
	if _, err := readN(t, c, 1, 5*time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after Reset: %v, want a connection reset", err)
	}
	d := dial(t, p)
	_, _ = d.Write([]byte("y"))
	if _, err := readN(t, d, 1, 5*time.Second); err != nil {
		t.Fatalf("a new connection after Reset: %v", err)
	}
	p.Drop()
	if _, err := readN(t, d, 1, 5*time.Second); err != io.EOF {
		t.Fatalf("after Drop: %v, want EOF", err)
	}
}

// TestNetCut: Cut(1, 2) stalls what node 1 sends to node 2 on both links
// between them (node 1's connections to 2 and node 2's to 1) and nothing
// else; Isolate cuts every link of a node.
func TestNetCut(t *testing.T) {
	a1, got1 := echoServer(t)
	a2, got2 := echoServer(t)
	a3, _ := echoServer(t)
	n, err := NewNet(map[int]string{1: a1, 2: a2, 3: a3})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	c12 := dial(t, n.Link(1, 2)) // node 1's connection to node 2
	c21 := dial(t, n.Link(2, 1)) // node 2's connection to node 1
	c13 := dial(t, n.Link(1, 3))
	n.Cut(1, 2)
	_, _ = c12.Write([]byte("a"))
	select {
	case <-got2:
		t.Fatal("bytes from 1 reached 2 through the cut")
	case <-time.After(quiet):
	}
	_, _ = c21.Write([]byte("b")) // 2 → 1 flows; the echo (1 → 2) is held
	if b := <-got1; string(b) != "b" {
		t.Fatalf("node 1 got %q", b)
	}
	if _, err := readN(t, c21, 1, quiet); !isTimeout(err) {
		t.Fatalf("node 1's reply reached node 2 through the cut: %v", err)
	}
	_, _ = c13.Write([]byte("c"))
	if s, err := readN(t, c13, 1, 5*time.Second); err != nil || s != "c" {
		t.Fatalf("1 → 3 is not cut: %q %v", s, err)
	}
	n.Heal()
	if s, err := readN(t, c12, 1, 5*time.Second); err != nil || s != "a" {
		t.Fatalf("after heal 1→2: %q %v", s, err)
	}
	if s, err := readN(t, c21, 1, 5*time.Second); err != nil || s != "b" {
		t.Fatalf("after heal 2→1: %q %v", s, err)
	}
	n.Isolate(3)
	_, _ = c13.Write([]byte("d"))
	if _, err := readN(t, c13, 1, quiet); !isTimeout(err) {
		t.Fatalf("isolated node 3 answered: %v", err)
	}
	n.Heal()
	if s, err := readN(t, c13, 1, 5*time.Second); err != nil || s != "d" {
		t.Fatalf("after heal: %q %v", s, err)
	}
}
