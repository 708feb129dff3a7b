package loadtest

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"time"
)

// RawNetResult is the round trip of a loopback TCP echo at a fixed rate:
// what the machine's network stack and scheduler add to a request and its
// answer before any broker does anything (the floor under a publish's
// confirm latency, which is at least one such round trip).
type RawNetResult struct {
	Rate, Size, N       int
	P50, P99, P999, Max time.Duration
	Elapsed             time.Duration
}

func (r RawNetResult) String() string {
	return fmt.Sprintf("loopback TCP echo, %d-byte messages at %d/s: %d round trips in %.2fs, p50 %v p99 %v p99.9 %v max %v",
		r.Size, r.Rate, r.N, r.Elapsed.Seconds(), r.P50, r.P99, r.P999, r.Max)
}

// RawNet measures n round trips of size-byte messages over a loopback TCP
// connection, sent at rate per second by one goroutine and echoed by
// another, each message carrying its send time: the same shape as a
// publisher at a fixed rate and its confirms, without a broker.
func RawNet(rate, size, n int) (RawNetResult, error) {
	if rate <= 0 || size < 8 || n <= 0 {
		return RawNetResult{}, fmt.Errorf("loadtest: rawnet: rate %d, size %d, count %d: want a positive rate and count and at least 8 bytes", rate, size, n)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return RawNetResult{}, fmt.Errorf("loadtest: rawnet: %w", err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return RawNetResult{}, fmt.Errorf("loadtest: rawnet: %w", err)
	}
	defer c.Close()
	rtt := make([]time.Duration, 0, n)
	read := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range n {
			if _, err := io.ReadFull(c, buf); err != nil {
				read <- err
				return
			}
			rtt = append(rtt, time.Duration(time.Now().UnixNano()-int64(binary.LittleEndian.Uint64(buf))))
		}
		read <- nil
	}()
	buf := make([]byte, size)
	every := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * every)); d > 0 {
			time.Sleep(d) // pacing the sender, as a fixed-rate publisher does
		}
		binary.LittleEndian.PutUint64(buf, uint64(time.Now().UnixNano()))
		if _, err := c.Write(buf); err != nil {
			return RawNetResult{}, fmt.Errorf("loadtest: rawnet: %w", err)
		}
	}
	if err := <-read; err != nil {
		return RawNetResult{}, fmt.Errorf("loadtest: rawnet: %w", err)
	}
	el := time.Since(start)
	slices.Sort(rtt)
	q := func(p float64) time.Duration { return rtt[int(p*float64(len(rtt)-1))] }
	return RawNetResult{Rate: rate, Size: size, N: n, P50: q(0.5), P99: q(0.99), P999: q(0.999), Max: rtt[len(rtt)-1], Elapsed: el}, nil
}
