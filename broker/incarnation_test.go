package broker

import (
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warren-mq/warren/internal/syncbuf"
)

// OpenIncarnation starts from max(now, the file's bound + 1); the bound
// covers what a life that crashed ran up to its last renewal plus the
// reserve, and what a life that stopped ran.
func TestIncarnationBound(t *testing.T) {
	dir := t.TempDir()
	const now = 1_764_690_000_000
	inc, err := OpenIncarnation(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	if inc.StartMs() != now || inc.Bound() != now+incarnationReserveMs {
		t.Fatalf("a new directory: start %d bound %d", inc.StartMs(), inc.Bound())
	}
	if err := inc.renew(50_000, incarnationReserveMs); err != nil {
		t.Fatal(err)
	}
	if err := inc.renew(40_000, incarnationReserveMs); err != nil { // never lower while running
		t.Fatal(err)
	}
	if inc.Bound() != now+50_000+incarnationReserveMs {
		t.Fatalf("renewed: bound %d", inc.Bound())
	}
	// A torn write of the temporary file (a crash before the rename)
	// changes nothing.
	if err := os.WriteFile(filepath.Join(dir, "incarnation.tmp"), []byte("warren-inc"), 0o640); err != nil {
		t.Fatal(err)
	}

	// It crashed; the clock went back a day.
	inc, err = OpenIncarnation(dir, now-86_400_000)
	if err != nil {
		t.Fatal(err)
	}
	crashed := int64(now) + 50_000 + incarnationReserveMs + 1
	if inc.StartMs() != crashed {
		t.Fatalf("after a crash with the clock back: start %d, want %d", inc.StartMs(), crashed)
	}
	// It stops cleanly after 20 s: the bound comes down to what it ran.
	if err := inc.renew(20_000, 0); err != nil {
		t.Fatal(err)
	}
	inc, err = OpenIncarnation(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	if inc.StartMs() != crashed+20_000+1 {
		t.Fatalf("after a stop with the clock back: start %d, want %d", inc.StartMs(), crashed+20_001)
	}
	// The clock ahead of the bound wins.
	inc, err = OpenIncarnation(dir, now+3_600_000)
	if err != nil {
		t.Fatal(err)
	}
	if inc.StartMs() != now+3_600_000 {
		t.Fatalf("the clock ahead: start %d", inc.StartMs())
	}
}

// A file that does not read as an incarnation is an error naming it, and
// stays as found.
func TestIncarnationBadFile(t *testing.T) {
	good := string(appendIncarnation(nil, 1_764_690_000_000))
	for _, bad := range []string{
		"",
		"\n",
		strings.TrimSuffix(good, "\n"),         // torn
		strings.Replace(good, "176", "076", 1), // a digit changed
		"warren-incarnation 2 1764690000000 0\n",
		"warren-incarnation 1 -5 " + strings.Fields(string(appendIncarnation(nil, -5)))[3] + "\n",
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, "incarnation")
		if err := os.WriteFile(path, []byte(bad), 0o640); err != nil {
			t.Fatal(err)
		}
		_, err := OpenIncarnation(dir, 1_764_690_000_000)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("%q: %v", bad, err)
		}
		if raw, _ := os.ReadFile(path); string(raw) != bad {
			t.Fatalf("%q: the file was changed to %q", bad, raw)
		}
	}
	if b, err := parseIncarnation([]byte(good)); err != nil || b != 1_764_690_000_000 {
		t.Fatalf("good file: %d %v", b, err)
	}
}

// On a full disk (the new file's write fails with ENOSPC) the bound is
// written over the file in place, also over a shorter line an earlier
// build wrote; with no file yet the start goes on without one (as an
// earlier build did) and writes none.
func TestIncarnationFullDisk(t *testing.T) {
	const now = 1_764_690_000_000
	writeNew = func(string, []byte) error {
		return &os.PathError{Op: "write", Path: "incarnation.tmp", Err: syscall.ENOSPC}
	}
	defer func() { writeNew = func(path string, p []byte) error { return writeSynced(path, p, os.O_TRUNC) } }()

	dir := t.TempDir()
	path := filepath.Join(dir, "incarnation")
	// An earlier build's line: unpadded, shorter than this build's.
	short := []byte(incarnationMagic + "1764690000000")
	short = strconv.AppendUint(append(short, ' '), uint64(crc32.ChecksumIEEE(short)), 16)
	short = append(short, '\n')
	if b, err := parseIncarnation(short); err != nil || b != now {
		t.Fatalf("an earlier build's line: %d %v", b, err)
	}
	if err := os.WriteFile(path, short, 0o640); err != nil {
		t.Fatal(err)
	}
	inc, err := OpenIncarnation(dir, now-1000)
	if err != nil {
		t.Fatalf("a full disk: %v", err)
	}
	if inc.StartMs() != now+1 {
		t.Fatalf("start %d, want %d", inc.StartMs(), now+1)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := parseIncarnation(raw); err != nil || b != now+1+incarnationReserveMs {
		t.Fatalf("the file after an in-place write: %q: %d %v", raw, b, err)
	}
	if _, err := os.Stat(path + ".tmp"); err == nil {
		t.Fatal("incarnation.tmp left behind")
	}

	empty := t.TempDir()
	inc, err = OpenIncarnation(empty, now)
	if err != nil || inc.StartMs() != now {
		t.Fatalf("a full disk, no file yet: %v", err)
	}
	if _, err := os.Stat(filepath.Join(empty, "incarnation")); err == nil {
		t.Fatal("a file was written on a full disk")
	}
}

// The renewal loop: each tick moves the bound on to the start plus the
// time run plus the reserve, never back while running; a renewal that
// fails is logged, leaves the bound written before, and the next tick
// writes it; the stop writes the start plus the time run.
func TestIncarnationRenewal(t *testing.T) {
	dir := t.TempDir()
	const now = 1_764_690_000_000
	inc, err := OpenIncarnation(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	var ranMs atomic.Int64
	var logged syncbuf.Buffer // the second tick of renewAt may log while the test reads
	log := slog.New(slog.NewTextHandler(&logged, nil))
	tick, stop, done := make(chan time.Time), make(chan struct{}), make(chan struct{})
	go renewIncarnation(inc, log, tick, ranMs.Load, stop, done)
	// renewAt delivers a tick at ran and then one more at the same time
	// (a no-op renewal): once the second is taken, the first's renewal is
	// over.
	renewAt := func(ran int64) {
		ranMs.Store(ran)
		tick <- time.Time{}
		tick <- time.Time{}
	}
	onDisk := func() int64 {
		t.Helper()
		raw, err := os.ReadFile(filepath.Join(dir, incarnationFile))
		if err != nil {
			t.Fatal(err)
		}
		b, err := parseIncarnation(raw)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	renewAt(25_000)
	if got, want := onDisk(), int64(now+25_000+incarnationReserveMs); got != want {
		t.Fatalf("after a tick at 25 s: bound %d on disk, want %d", got, want)
	}
	renewAt(20_000) // a running life's bound never comes down
	if got, want := onDisk(), int64(now+25_000+incarnationReserveMs); got != want {
		t.Fatalf("after a tick at 20 s: bound %d on disk, want %d (unchanged)", got, want)
	}

	// The file cannot be replaced (a directory in its place, with
	// something in it): the renewal is logged, the bound stays.
	path := filepath.Join(dir, incarnationFile)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(path, "x"), 0o750); err != nil {
		t.Fatal(err)
	}
	renewAt(35_000)
	if !strings.Contains(logged.String(), "the node's incarnation was not renewed") {
		t.Fatalf("a failed renewal was not logged; the log: %q", logged.String())
	}
	if inc.Bound() != now+25_000+incarnationReserveMs {
		t.Fatalf("after a failed renewal the bound reads %d", inc.Bound())
	}
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	renewAt(45_000) // the next tick writes it
	if got, want := onDisk(), int64(now+45_000+incarnationReserveMs); got != want {
		t.Fatalf("the tick after the failure: bound %d on disk, want %d", got, want)
	}

	ranMs.Store(50_000)
	close(stop)
	<-done
	if got, want := onDisk(), int64(now+50_000); got != want {
		t.Fatalf("after the stop at 50 s: bound %d on disk, want %d", got, want)
	}
}
