package segment

import (
	"bufio"
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func readAllFS(t *testing.T, fsys FS, name string) []byte {
	t.Helper()
	f, err := fsys.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	return b
}

// TestPowerLossFSCrash: an unsynced write is read back while the process
// lives and is gone after a simulated power cut (a new PowerLossFS on the
// same directory, the old one abandoned); a synced one is not. Creations
// and removals not made durable by SyncDir are undone.
func TestPowerLossFSCrash(t *testing.T) {
	dir := t.TempDir()
	p := NewPowerLossFS()
	if err := p.MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, "a")
	f, err := p.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("synced."), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := p.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("UNSYNCED"), 7); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("S"), 0); err != nil { // an unsynced overwrite
		t.Fatal(err)
	}
	if got := readAllFS(t, p, name); string(got) != "Synced.UNSYNCED" {
		t.Fatalf("live read %q, want the unsynced writes too", got)
	}
	if disk, _ := os.ReadFile(name); string(disk) != "synced." {
		t.Fatalf("on disk before any sync: %q, want only the synced write", disk)
	}
	// A file made durable in the directory, then removed without SyncDir;
	// one created and synced but never made durable in the directory.
	kept := filepath.Join(dir, "kept")
	k, _ := p.Open(kept)
	_, _ = k.WriteAt([]byte("k"), 0)
	_ = k.Sync()
	_ = k.Close()
	if err := p.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	if err := p.Remove(kept); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(dir, "fresh")
	n, _ := p.Open(fresh)
	_, _ = n.WriteAt([]byte("n"), 0)
	_ = n.Sync()
	if names, _ := p.List(dir); strings.Join(names, ",") != "a,fresh" {
		t.Fatalf("List before the crash: %v, want a,fresh", names)
	}

	// The power cut: nothing is flushed or closed.
	q := NewPowerLossFS()
	names, err := q.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, ",") != "a,kept" {
		t.Fatalf("after the crash: %v, want a,kept (fresh was never made durable in the directory, kept's removal neither)", names)
	}
	if got := readAllFS(t, q, name); string(got) != "synced." {
		t.Fatalf("after the crash: %q, want the synced write only", got)
	}
	// A synced write survives, and SyncDir makes a removal durable.
	g, _ := q.Open(name)
	_, _ = g.WriteAt([]byte("+more"), 7)
	_ = g.Sync()
	_ = q.Remove(kept)
	_ = q.SyncDir(dir)
	r := NewPowerLossFS()
	if got := readAllFS(t, r, name); string(got) != "synced.+more" {
		t.Fatalf("after a second crash: %q, want synced.+more", got)
	}
	if names, _ := r.List(dir); strings.Join(names, ",") != "a" {
		t.Fatalf("after a second crash: %v, want a", names)
	}
}

// TestPowerLossChild is the child of TestPowerLossKill9: with the
// power-loss mode on, it writes a synced and an unsynced part of a file,
// creates a file it syncs but never makes durable in its directory, then
// runs killChild (acknowledged appends to a Log on OSFS, which the mode
// turns into the PowerLossFS) until killed.
func TestPowerLossChild(t *testing.T) {
	dir := os.Getenv("SEGMENT_POWERLOSS_CHILD")
	if dir == "" {
		t.Skip("the child of TestPowerLossKill9")
	}
	p := UsePowerLoss()
	raw := filepath.Join(dir, "raw")
	if err := p.MkdirAll(raw); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(raw, "orphan")); err == nil {
		t.Fatal("the previous child's orphan survived its directory's first use")
	}
	f, err := p.Open(filepath.Join(raw, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if size, _ := f.Size(); size == 0 {
		_, _ = f.WriteAt([]byte("synced"), 0)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		_ = p.SyncDir(raw)
	}
	_, _ = f.WriteAt([]byte("-unsynced"), 6)
	o, _ := p.Open(filepath.Join(raw, "orphan"))
	_, _ = o.WriteAt([]byte("o"), 0)
	if err := o.Sync(); err != nil {
		t.Fatal(err)
	}
	killChild(filepath.Join(dir, "log"))
}

// TestPowerLossKill9: a child process in the power-loss mode is killed
// with SIGKILL; its unsynced write is gone from the disk, its synced one
// is not, and every append the Log acknowledged (each synced) is there,
// intact, while the Log rotates, moves and deletes files underneath.
func TestPowerLossKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(3, 4))
	acked := map[uint64]uint64{}
	for round := 0; round < 3; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPowerLossChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "SEGMENT_POWERLOSS_CHILD="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		killAfter := 200 + r.IntN(1500)
		sc := bufio.NewScanner(out)
		n := 0
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 || f[0] != "ack" {
				t.Fatalf("child: %q %s", sc.Text(), stderr.String())
			}
			g, _ := strconv.ParseUint(f[1], 10, 64)
			i, _ := strconv.ParseUint(f[2], 10, 64)
			acked[g] = max(acked[g], i)
			if n++; n == killAfter {
				_ = cmd.Process.Signal(syscall.SIGKILL)
				break
			}
		}
		_ = cmd.Wait()
		if n < killAfter {
			t.Fatalf("round %d: child ended after %d acks: %s", round, n, stderr.String())
		}
		raw := filepath.Join(dir, "raw")
		if b, err := os.ReadFile(filepath.Join(raw, "f")); err != nil || string(b) != "synced" {
			t.Fatalf("round %d: after kill -9 the file holds %q (%v), want only its synced write", round, b, err)
		}
		if _, err := os.Stat(filepath.Join(raw, "orphan")); err != nil {
			t.Fatalf("round %d: the orphan should be on disk until the directory's next use: %v", round, err)
		}
		// Recovery, itself in the power-loss mode (the leftovers of
		// files never made durable in the directory go first).
		l, err := Open(NewPowerLossFS(), filepath.Join(dir, "log"), killOpts)
		if err != nil {
			t.Fatalf("round %d: recovery: %v", round, err)
		}
		for g, last := range acked {
			if l.LastIndex(g) < last {
				t.Fatalf("round %d: group %d has %d entries, %d were acknowledged", round, g, l.LastIndex(g), last)
			}
			es, err := l.Entries(g, l.FirstIndex(g), l.LastIndex(g)+1)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range es {
				if !bytes.Equal(e.Data, payload(g, e.Index)) {
					t.Fatalf("round %d: group %d entry %d corrupted", round, g, e.Index)
				}
			}
			acked[g] = l.LastIndex(g)
		}
		t.Logf("round %d: killed after %d acks, %+v", round, n, l.Stats())
		l.Close()
	}
}

// TestTestSizes: UseTestSizes fills in the file sizes an Open leaves
// unset, and only those; UsePowerLoss swaps OSFS and nothing else.
func TestTestSizes(t *testing.T) {
	defer testSizes.Store(nil)
	UseTestSizes(1<<20, 0)
	if _, o := testHooks(OSFS{}, Options{}); o.WALSize != 1<<20 || o.SegmentSize != 0 {
		t.Fatalf("unset sizes: %+v", o)
	}
	if _, o := testHooks(OSFS{}, Options{WALSize: 5, SegmentSize: 7}); o.WALSize != 5 || o.SegmentSize != 7 {
		t.Fatalf("sizes the caller chose were changed: %+v", o)
	}
	m := NewMemFS()
	if f, _ := testHooks(m, Options{}); f != FS(m) {
		t.Fatal("a MemFS was swapped")
	}
}
