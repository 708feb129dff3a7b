package abuse

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/internal/freeport"
)

// BrokerConfig is how the suite starts each warrend.
type BrokerConfig struct {
	// Bin is the warrend binary.
	Bin string
	// WatermarkBytes is the memory high-watermark the broker is started
	// with (memory_high_watermark_bytes in its config file; 0: its default).
	WatermarkBytes int64
	// Config holds further settings written into the broker's JSON config
	// file (the keys of warrend's config file, e.g. "max_connections").
	Config map[string]any
	// StderrTail keeps this many bytes of the broker's log for the report.
	StderrTail int
}

// Broker is one warrend child process with its own data directory and ports.
type Broker struct {
	cmd      *exec.Cmd
	dir      string
	Addr     string // native protocol host:port
	HTTPAddr string
	// AppUser / AppPassword is a bcrypt user (cost 10, warrend's default)
	// in the broker's config, for probes that need a real password check.
	AppUser, AppPassword string

	exited chan struct{}
	err    error // the process's exit, once exited is closed
	logMu  sync.Mutex
	log    []byte
	tail   int
}

// freePort is a loopback port nothing listens on now, outside the
// kernel's ephemeral range (freeport): one freed by a 127.0.0.1:0
// listener could be taken by warrend's own such listeners or any dial
// before warrend listens on it. Another process may still take it in the
// window; Start retries.
func freePort() (int, error) {
	a, err := freeport.Addr()
	if err != nil {
		return 0, err
	}
	_, p, err := net.SplitHostPort(a)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// hashPassword runs "warrend hash-password" so the suite needs no bcrypt of
// its own and the hash is exactly what the broker produces.
func hashPassword(ctx context.Context, bin, password string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, "hash-password")
	cmd.Stdin = strings.NewReader(password + "\n")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("abuse: %s hash-password: %w", bin, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// StartBroker starts warrend in a fresh temporary directory and returns once
// a client can complete a handshake with it.
func StartBroker(ctx context.Context, bc BrokerConfig) (*Broker, error) {
	dir, err := os.MkdirTemp("", "warren-abuse-")
	if err != nil {
		return nil, err
	}
	const appUser, appPassword = "app", "app-secret-password"
	hash, err := hashPassword(ctx, bc.Bin, appPassword)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	cfg := map[string]any{}
	for k, v := range bc.Config {
		cfg[k] = v
	}
	cfg["users"] = []map[string]any{{"name": appUser, "password_hash": hash}}
	if bc.WatermarkBytes > 0 {
		cfg["memory_high_watermark_bytes"] = bc.WatermarkBytes
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		b, err := startOnce(ctx, bc, dir, cfg)
		if err == nil {
			b.AppUser, b.AppPassword = appUser, appPassword
			return b, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

func startOnce(ctx context.Context, bc BrokerConfig, dir string, cfg map[string]any) (*Broker, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	hport, err := freePort()
	if err != nil {
		return nil, err
	}
	js, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "warrend.json")
	if err := os.WriteFile(cfgPath, js, 0o600); err != nil {
		return nil, err
	}
	b := &Broker{
		dir: dir, Addr: "127.0.0.1:" + strconv.Itoa(port), HTTPAddr: "127.0.0.1:" + strconv.Itoa(hport),
		exited: make(chan struct{}), tail: max(bc.StderrTail, 8<<10),
	}
	b.cmd = exec.Command(bc.Bin, "--listen", b.Addr, "--http", b.HTTPAddr, "--data", filepath.Join(dir, "data"),
		"--config", cfgPath, "--log-level", "warn",
		"--disk-free-limit", "-1") // the suite measures hostile clients, not the host's free disk space
	b.cmd.Stdout = b
	b.cmd.Stderr = b
	if err := b.cmd.Start(); err != nil {
		return nil, fmt.Errorf("abuse: start %s: %w", bc.Bin, err)
	}
	go func() { b.err = b.cmd.Wait(); close(b.exited) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-b.exited:
			return nil, fmt.Errorf("abuse: warrend exited at start (%v): %s", b.err, b.Log())
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := client.Dial(cctx, b.URL())
		cancel()
		if err == nil {
			c.Close()
			return b, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			b.kill()
			return nil, fmt.Errorf("abuse: warrend did not answer on %s: %v; log: %s", b.Addr, err, b.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Write keeps the tail of the broker's output (io.Writer for the child's
// stdout and stderr).
func (b *Broker) Write(p []byte) (int, error) {
	b.logMu.Lock()
	b.log = append(b.log, p...)
	if len(b.log) > 2*b.tail {
		b.log = append(b.log[:0], b.log[len(b.log)-b.tail:]...)
	}
	b.logMu.Unlock()
	return len(p), nil
}

// Log returns the tail of the broker's output.
func (b *Broker) Log() string {
	b.logMu.Lock()
	defer b.logMu.Unlock()
	l := b.log
	if len(l) > b.tail {
		l = l[len(l)-b.tail:]
	}
	return string(bytes.TrimSpace(l))
}

// URL is the guest URL of the broker.
func (b *Broker) URL() string { return "warren://guest:guest@" + b.Addr }

// PID is the broker's process id.
func (b *Broker) PID() int { return b.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (b *Broker) Exited() (bool, error) {
	select {
	case <-b.exited:
		return true, b.err
	default:
		return false, nil
	}
}

// Memory is a reading of the broker's /proc/PID/status.
type Memory struct {
	RSS, HWM int64 // bytes
}

// ReadMemory reads VmRSS and VmHWM (the peak RSS since start, or since the
// last ResetPeak).
func (b *Broker) ReadMemory() (Memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", b.PID()))
	if err != nil {
		return Memory{}, err
	}
	defer f.Close()
	var m Memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.HWM
		default:
			continue
		}
		fields := strings.Fields(v) // "123456 kB"
		if len(fields) == 2 && fields[1] == "kB" {
			n, _ := strconv.ParseInt(fields[0], 10, 64)
			*dst = n << 10
		}
	}
	return m, sc.Err()
}

// ResetPeak resets VmHWM to the current RSS (/proc/PID/clear_refs, "5"), so
// the next reading's peak belongs to what ran since. It is best effort: a
// kernel that refuses leaves the peak since start, which is never lower.
func (b *Broker) ResetPeak() error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", b.PID()), []byte("5"), 0)
}

// CPUSeconds is the user+system CPU time the broker has used.
func (b *Broker) CPUSeconds() (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", b.PID()))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, errors.New("abuse: unreadable /proc stat")
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("abuse: short /proc stat")
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return float64(ut+st) / 100, nil // USER_HZ is 100 on Linux
}

// Answers reports whether the broker is alive and serving: the process
// runs and a new client completes a handshake, declares a queue and gets a
// publish confirmed within timeout.
func (b *Broker) Answers(ctx context.Context, timeout time.Duration) error {
	if done, err := b.Exited(); done {
		return fmt.Errorf("warrend exited: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := client.Dial(ctx, b.URL())
	if err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	defer c.Close()
	ch, err := c.Channel(ctx)
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	if _, err := ch.DeclareQueue(ctx, "abuse.alive", client.QueueOptions{Args: nil}); err != nil {
		return fmt.Errorf("declare: %w", err)
	}
	if err := ch.Publish(ctx, "", client.Message{RoutingKey: "abuse.alive", Body: []byte("ok")}); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	if _, err := ch.PurgeQueue(ctx, "abuse.alive"); err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	return nil
}

// QueueDepth is the number of messages in queue (a passive declare).
func (b *Broker) QueueDepth(ctx context.Context, queue string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, b.URL())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	ch, err := c.Channel(ctx)
	if err != nil {
		return 0, err
	}
	info, err := ch.DeclareQueue(ctx, queue, client.QueueOptions{Passive: true})
	return info.Messages, err
}

// Gauges are a few of the broker's own figures from /metrics.
type Gauges struct {
	StoredBytes int64 // warren_stored_message_bytes: what the watermark counts
	HeapInuse   int64 // go_memstats_heap_inuse_bytes
}

// ReadGauges scrapes /metrics.
func (b *Broker) ReadGauges(ctx context.Context) (Gauges, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.HTTPAddr+"/metrics", nil)
	if err != nil {
		return Gauges{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Gauges{}, err
	}
	defer resp.Body.Close()
	var g Gauges
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var dst *int64
		switch name {
		case "warren_stored_message_bytes":
			dst = &g.StoredBytes
		case "go_memstats_heap_inuse_bytes":
			dst = &g.HeapInuse
		default:
			continue
		}
		f, _ := strconv.ParseFloat(val, 64)
		*dst = int64(f)
	}
	return g, sc.Err()
}

// Stop ends the broker (SIGTERM, then SIGKILL after a grace period) and
// removes its directory.
func (b *Broker) Stop() {
	if b == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		b.kill()
	}
	os.RemoveAll(b.dir)
}

func (b *Broker) kill() {
	_ = b.cmd.Process.Kill()
	<-b.exited
}
