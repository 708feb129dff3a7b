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
	opened  time.Time // monotonic: the time run is measured from here

	mu      sync.Mutex
	written int64 // the bound in the file
}

// OpenIncarnation reads dir's incarnation file, chooses this life's start,
// max(nowMs, the bound in the file + 1) (nowMs without a file: a new data
// directory, or one of a build before the file), and writes the new bound
// before returning, so that the broker serves nothing under an
// incarnation that a crash could let the next life reuse.
func OpenIncarnation(dir string, nowMs int64) (*Incarnation, error) {
	path := filepath.Join(dir, incarnationFile)
	start := nowMs
	raw, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("broker: reading the node's incarnation: %w", err)
	default:
		last, err := parseIncarnation(raw)
		if err != nil {
			return nil, fmt.Errorf("broker: %s: %w (it bounds what this node's earlier lives used; if it is lost, "+
				"remove it only once the clock is past the earlier lives' end)", path, err)
		}
		start = max(start, last+1)
	}
	if start <= 0 || start > incarnationMaxMs-incarnationReserveMs {
		return nil, fmt.Errorf("broker: %s: the node's incarnation would be %d ms, outside (0, %d)", path, start, incarnationMaxMs-incarnationReserveMs)
	}
	inc := &Incarnation{path: path, startMs: start, opened: time.Now()}
	if err := inc.write(start + incarnationReserveMs); err != nil {
		return nil, err
	}
	return inc, nil
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

func (inc *Incarnation) write(bound int64) error {
	inc.mu.Lock()
	defer inc.mu.Unlock()
	return inc.writeLocked(bound)
}

func (inc *Incarnation) writeLocked(bound int64) error {
	tmp := inc.path + ".tmp"
	err := writeSynced(tmp, appendIncarnation(nil, bound))
	if err == nil {
		err = os.Rename(tmp, inc.path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(inc.path))
	}
	if err != nil {
		return fmt.Errorf("broker: writing the node's incarnation: %w", err)
	}
	inc.written = bound
	return nil
}

func appendIncarnation(p []byte, bound int64) []byte {
	p = strconv.AppendInt(append(p, incarnationMagic...), bound, 10)
	sum := crc32.ChecksumIEEE(p)
	p = strconv.AppendUint(append(p, ' '), uint64(sum), 16)
	return append(p, '\n')
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

func writeSynced(path string, p []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, err = f.Write(p)
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

// keepIncarnation renews the bound while the broker runs, until stop is
// closed; then writes what was run.
func keepIncarnation(inc *Incarnation, log *slog.Logger, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(incarnationRenewEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := inc.renew(inc.ran(), incarnationReserveMs); err != nil {
				// The bound written before still holds for a while
				// (incarnationReserveMs past the last renewal).
				log.Error("the node's incarnation was not renewed", "err", err)
			}
		case <-stop:
			if err := inc.renew(inc.ran(), 0); err != nil {
				log.Error("the node's incarnation was not written at stop", "err", err)
			}
			return
		}
	}
}
