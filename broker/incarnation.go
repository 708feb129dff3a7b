package broker

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// A node's incarnation is the start of its life in ms (Broker.seqBase is
// it << 20): the shards' proposal seqs, forwarded publishes' enqueuer
// incarnations and link ids count from it, and the hello and a home's
// queues carry it, so that each must be above everything the node's
// earlier lives used. A start time read from the wall clock is not when
// the clock went back across a restart (NTP stepping it after a reboot),
// so a node with a data directory keeps, in DataDir/incarnation, a bound
// on what its lives used, and starts from max(now, bound+1).
//
// What a life uses grows with its run time (each counter takes, at most,
// the 2^16 or 2^20 numbers of a ms per ms of run time, as it did when
// only the clock set the start), so the bound moves on while the node
// runs: the file is written at open with the start plus
// incarnationReserveMs, every incarnationRenewEvery with the start plus
// the time run plus incarnationReserveMs, and at a clean stop with the
// start plus the time run. A crash leaves the last renewal's, still above
// what the life used; the next start is then at most incarnationReserveMs
// ahead of the clock.
//
// The file is one line, "warren-incarnation 1 <bound ms> <crc32 hex>\n"
// (the checksum, IEEE, covers what precedes it), replaced whole: written
// to incarnation.tmp, synced, renamed over it, the directory synced. A
// file that does not read as one is an error naming it, never a start
// from the clock (which could be below the earlier life's).
const (
	incarnationFile       = "incarnation"
	incarnationMagic      = "warren-incarnation 1 "
	incarnationReserveMs  = 30_000
	incarnationRenewEvery = 10 * time.Second
	// incarnationMaxMs keeps ms << 20 within 64 bits (2^44 ms: 2527).
	incarnationMaxMs = 1<<44 - 1
)

// Incarnation is a node's incarnation, kept in its data directory
// (OpenIncarnation; Config.Incarnation).
type Incarnation struct {
	path    string
	startMs int64
	existed bool      // the file was there at ReadIncarnation
	opened  time.Time // monotonic: the time run is measured from here (Begin)

	mu      sync.Mutex
	written int64 // the bound in the file
}

// OpenIncarnation is ReadIncarnation and then Begin.
func OpenIncarnation(dir string, nowMs int64) (*Incarnation, error) {
	inc, err := ReadIncarnation(dir, nowMs)
	if err == nil {
		err = inc.Begin()
	}
	if err != nil {
		return nil, err
	}
	return inc, nil
}

// ReadIncarnation reads dir's incarnation file and chooses this life's
// start, max(nowMs, the bound in the file + 1) (nowMs without a file: a
// new data directory, or one of a build before the file). It writes
// nothing: a start refused after it (a bad file here, or damage in the
// node's log) leaves the data directory as it found it. Begin writes the
// new bound.
func ReadIncarnation(dir string, nowMs int64) (*Incarnation, error) {
	path := filepath.Join(dir, incarnationFile)
	start := nowMs
	raw, err := os.ReadFile(path)
	existed := err == nil
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("broker: reading the node's incarnation: %w", err)
	default:
		last, err := parseIncarnation(raw)
		if err != nil {
			return nil, fmt.Errorf("broker: %s: %w (it bounds what this node's earlier lives used; if it is lost, "+
				"remove it only once the clock is past the earlier lives' end: its last change, as its mtime says, plus 30 s)", path, err)
		}
		start = max(start, last+1)
	}
	if start <= 0 || start > incarnationMaxMs-incarnationReserveMs {
		return nil, fmt.Errorf("broker: %s: the node's incarnation would be %d ms, outside (0, %d)", path, start, incarnationMaxMs-incarnationReserveMs)
	}
	return &Incarnation{path: path, startMs: start, existed: existed}, nil
}

// Begin writes the new bound (the start plus incarnationReserveMs) before
// the broker serves anything under this incarnation, so that a crash
// cannot let the next life reuse it. On a full disk (ENOSPC), where the
// file cannot be replaced by a new one, it is overwritten in place (a
// line of a few dozen bytes in the block the file already has); a data
// directory with no file yet then starts without one, as an earlier build
// did, and the renewals try again.
func (inc *Incarnation) Begin() error {
	inc.opened = time.Now()
	inc.mu.Lock()
	defer inc.mu.Unlock()
	err := inc.writeLocked(inc.startMs + incarnationReserveMs)
	if err != nil && !inc.existed && errors.Is(err, syscall.ENOSPC) {
		return nil
	}
	return err
}

// StartMs is this life's start (ms).
func (inc *Incarnation) StartMs() int64 { return inc.startMs }

// Bound is the bound the file holds now.
func (inc *Incarnation) Bound() int64 {
	inc.mu.Lock()
	defer inc.mu.Unlock()
	return inc.written
}

// renew moves the bound on to the start plus ranMs plus reserveMs, when
// that is above the file's (a stop passes 0: nothing is used after it, and
// the bound may come down to what was run).
func (inc *Incarnation) renew(ranMs, reserveMs int64) error {
	inc.mu.Lock()
	defer inc.mu.Unlock()
	b := inc.startMs + max(ranMs, 0) + reserveMs
	if b > incarnationMaxMs {
		b = incarnationMaxMs
	}
	if b == inc.written || (reserveMs > 0 && b < inc.written) {
		return nil
	}
	return inc.writeLocked(b)
}

// ran is the time run since the open (monotonic), in ms.
func (inc *Incarnation) ran() int64 { return time.Since(inc.opened).Milliseconds() }

func (inc *Incarnation) writeLocked(bound int64) error {
	line := appendIncarnation(nil, bound)
	tmp := inc.path + ".tmp"
	err := writeNew(tmp, line)
	if err == nil {
		err = os.Rename(tmp, inc.path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(inc.path))
	}
	if err != nil && errors.Is(err, syscall.ENOSPC) {
		// A full disk: overwrite the file in place (no new block), not
		// creating it (no file: ENOSPC stays the answer).
		_ = os.Remove(tmp)
		if ierr := writeSynced(inc.path, line, 0); ierr == nil {
			err = nil
		} else if !errors.Is(ierr, fs.ErrNotExist) {
			err = fmt.Errorf("%w (in place: %w)", err, ierr)
		}
	}
	if err != nil {
		return fmt.Errorf("broker: writing the node's incarnation: %w", err)
	}
	inc.written = bound
	return nil
}

// appendIncarnation appends the file's line for bound, of one length
// whatever the bound (19 digits, 8 hex: 50 bytes, the longest an earlier
// build's unpadded line could be), so a line written in place covers the
// one before it.
func appendIncarnation(p []byte, bound int64) []byte {
	p = fmt.Appendf(p, "%s%019d", incarnationMagic, bound)
	sum := crc32.ChecksumIEEE(p)
	return fmt.Appendf(p, " %08x\n", sum)
}

func parseIncarnation(raw []byte) (int64, error) {
	if len(raw) == 0 {
		return 0, errors.New("empty")
	}
	line, ok := bytes.CutSuffix(raw, []byte("\n"))
	sp := bytes.LastIndexByte(line, ' ')
	if !ok || sp < 0 || !bytes.HasPrefix(line, []byte(incarnationMagic)) {
		return 0, fmt.Errorf("not an incarnation file (%q)", trimmed(raw))
	}
	sum, err := strconv.ParseUint(string(line[sp+1:]), 16, 32)
	if err != nil || uint32(sum) != crc32.ChecksumIEEE(line[:sp]) {
		return 0, fmt.Errorf("checksum does not match (%q)", trimmed(raw))
	}
	b, err := strconv.ParseInt(string(line[len(incarnationMagic):sp]), 10, 64)
	if err != nil || b <= 0 || b > incarnationMaxMs {
		return 0, fmt.Errorf("bad bound (%q)", trimmed(raw))
	}
	return b, nil
}

func trimmed(raw []byte) []byte {
	if len(raw) > 64 {
		return raw[:64]
	}
	return raw
}

// writeNew writes a new file (a variable: tests make it fail as a full
// disk does).
var writeNew = func(path string, p []byte) error { return writeSynced(path, p, os.O_TRUNC) }

// writeSynced writes p at the start of path and syncs it: with O_TRUNC a
// new file (created if need be), with 0 over an existing one in place, p
// as long as what it replaces or longer (appendIncarnation's lines are
// all as long as the longest an earlier build wrote).
func writeSynced(path string, p []byte, flag int) error {
	if flag&os.O_TRUNC != 0 {
		flag |= os.O_CREATE
	}
	f, err := os.OpenFile(path, os.O_WRONLY|flag, 0o640)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(p, 0)
	if err == nil && flag&os.O_TRUNC == 0 {
		err = f.Truncate(int64(len(p))) // an older, shorter line's file grows; never a longer one
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// keepIncarnation renews the bound every incarnationRenewEvery while the
// broker runs, until stop is closed; then writes what was run.
func keepIncarnation(inc *Incarnation, log *slog.Logger, stop <-chan struct{}, done chan<- struct{}) {
	t := time.NewTicker(incarnationRenewEvery)
	defer t.Stop()
	renewIncarnation(inc, log, t.C, inc.ran, stop, done)
}

// renewIncarnation is keepIncarnation's loop, with its clock as inputs:
// each tick renews the bound to the start plus ran() plus the reserve; a
// failed renewal is logged and the next tick tries again (the bound
// written before still holds for incarnationReserveMs past the last
// renewal); stop writes the start plus ran().
func renewIncarnation(inc *Incarnation, log *slog.Logger, tick <-chan time.Time, ran func() int64, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case <-tick:
			if err := inc.renew(ran(), incarnationReserveMs); err != nil {
				log.Error("the node's incarnation was not renewed", "err", err)
			}
		case <-stop:
			if err := inc.renew(ran(), 0); err != nil {
				log.Error("the node's incarnation was not written at stop", "err", err)
			}
			return
		}
	}
}
